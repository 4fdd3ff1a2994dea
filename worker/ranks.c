/* worker/ranks: the leader/follower protocol of a cluster's ranks and their data x tensor x
 * pipeline grid (worker/ranks.h). */
#include "worker/ranks.h"

#include <string.h>

#include "common/common.h"
#include "train/model.h"

/* What the leader announces: {steps, command} as two floats, broadcast over every rank. */
/* STEPS: take the leader's parameters, then run steps; MORE: run steps straight on */
enum { NB__RK_STOP = 0, NB__RK_STEPS = 1, NB__RK_EVAL = 2, NB__RK_CHECKPOINT = 3, NB__RK_MORE = 4 };

static nb_status_t nb__rk_tp_allreduce(void* ctx, float* buf, size_t n) {
  return nb_comm_allreduce(ctx, buf, buf, n, NB_COMM_FP32, NB_COMM_SUM);
}

/* The activations of a pipeline between the stages (ranks of the replica). */
static nb_status_t nb__rk_sendrecv(void* ctx, const float* send, int to, float* recv, int from,
                                   size_t n) {
  return nb_comm_sendrecv(ctx, send, n, to, recv, n, from, NB_COMM_FP32);
}

/* The gradient of every step averaged over the ranks that hold the same shard. */
static nb_status_t nb__rk_grad_hook(void* ctx, float* grads, size_t n) {
  return nb_comm_allreduce(ctx, grads, grads, n, NB_COMM_FP32, NB_COMM_AVG);
}

nb_status_t nb_wk_ranks_grid(nb_wk_ranks_t* r, nb_comm_t* world, int tp, int pp) {
  memset(r, 0, sizeof *r);
  r->world = world;
  r->size = world ? nb_comm_size(world) : 1;
  r->rank = world ? nb_comm_rank(world) : 0;
  r->tp = tp > 1 ? tp : 1;
  r->pp = pp > 1 ? pp : 1;
  r->mp = r->tp * r->pp;
  if (r->size % r->mp != 0)
    return nb_error(NB_ERR_CONFIG,
                    "%d ranks do not divide into replicas of %d (start a multiple of "
                    "parallel.tensor x parallel.pipeline ranks)",
                    r->size, r->mp);
  r->mp_rank = r->rank % r->mp;
  r->dp_rank = r->rank / r->mp;
  r->dp = r->size / r->mp;
  if (r->mp > 1) { /* replicas of consecutive ranks; across them, the ranks of one shard */
    NB_CHECK(nb_comm_split(world, r->dp_rank, r->mp_rank, &r->mp_comm));
    if (r->dp > 1) NB_CHECK(nb_comm_split(world, r->mp_rank, r->dp_rank, &r->dp_comm));
  }
  if (r->tp > 1 && r->pp > 1) { /* replica rank = stage * tp + shard */
    int stage = r->mp_rank / r->tp, shard = r->mp_rank % r->tp;
    NB_CHECK(nb_comm_split(r->mp_comm, stage, shard, &r->stage_comm));
    NB_CHECK(nb_comm_split(r->mp_comm, shard, stage, &r->pipe_comm));
  }
  return NB_OK;
}

void nb_wk_ranks_train_config(nb_wk_ranks_t* r, nb_train_config_t* tc, int data_rank_base) {
  tc->data_rank = data_rank_base + r->dp_rank;
  if (r->tp > 1 && r->pp > 1) {
    int stage = r->mp_rank / r->tp, shard = r->mp_rank % r->tp;
    tc->tp = (nb_model_tp_t){shard, r->tp, nb__rk_tp_allreduce, r->stage_comm};
    tc->pp = (nb_model_pp_t){stage, r->pp, nb__rk_tp_allreduce, r->pipe_comm};
    tc->pipe = (nb_pipeline_t){nb__rk_sendrecv, nb__rk_tp_allreduce, r->pipe_comm};
  } else if (r->tp > 1) {
    tc->tp = (nb_model_tp_t){r->mp_rank, r->mp, nb__rk_tp_allreduce, r->mp_comm};
  } else if (r->pp > 1) {
    tc->pp = (nb_model_pp_t){r->mp_rank, r->pp, nb__rk_tp_allreduce, r->mp_comm};
    tc->pipe = (nb_pipeline_t){nb__rk_sendrecv, nb__rk_tp_allreduce, r->mp_comm};
  }
  if (r->dp > 1) {
    tc->grad_hook = nb__rk_grad_hook;
    tc->grad_hook_ctx = r->mp > 1 ? r->dp_comm : r->world;
  }
}

nb_status_t nb_wk_ranks_attach(nb_wk_ranks_t* r, nb_trainer_t* t) {
  r->t = t;
  if (r->mp <= 1) return NB_OK;
  r->n_logical = nb_trainer_logical_params(t);
  NB_CHECK(nb_alloc((void**)&r->logical, r->n_logical, sizeof(float), "logical parameters"));
  return nb_trainer_tp_gather(t, r->logical);
}

static nb_status_t nb__rk_lead(nb_wk_ranks_t* r, long steps, int cmd) {
  float ctl[2] = {(float)steps, (float)cmd};
  return r->world ? nb_comm_broadcast(r->world, ctl, ctl, 2, NB_COMM_FP32, 0) : NB_OK;
}

/* Every rank takes the leader's parameters before a run of inner steps: its trainer buffer, or
 * (tensor parallelism) the logical one and its shard of it. */
static nb_status_t nb__rk_share(nb_wk_ranks_t* r) {
  if (r->mp <= 1) {
    size_t n;
    float* p = nb_trainer_sync_params(r->t, &n);
    return nb_comm_broadcast(r->world, p, p, n, NB_COMM_FP32, 0);
  }
  NB_CHECK(nb_comm_broadcast(r->world, r->logical, r->logical, r->n_logical, NB_COMM_FP32, 0));
  nb_trainer_tp_scatter(r->t, r->logical);
  return NB_OK;
}

/* The leader's replica takes the logical parameters (an evaluation or a checkpoint after the
 * outer step wrote them). */
static nb_status_t nb__rk_share_replica(nb_wk_ranks_t* r) {
  NB_CHECK(nb_comm_broadcast(r->mp_comm, r->logical, r->logical, r->n_logical, NB_COMM_FP32, 0));
  nb_trainer_tp_scatter(r->t, r->logical);
  return NB_OK;
}

/* After a run of inner steps the leader's replica gathers the logical parameters. */
static nb_status_t nb__rk_gather(nb_wk_ranks_t* r) {
  return r->mp > 1 && r->dp_rank == 0 ? nb_trainer_tp_gather(r->t, r->logical) : NB_OK;
}

/* ---- the leader's hybrid -------------------------------------------------------------------- */

static nb_status_t nb__rk_steps_hook(void* ctx, long k) {
  nb_wk_ranks_t* r = ctx;
  /* k < 0: more steps straight after a run (the hybrid's early landing): every rank already
   * holds the parameters it goes on from */
  if (k < 0) return nb__rk_lead(r, -k, NB__RK_MORE);
  NB_CHECK(nb__rk_lead(r, k, NB__RK_STEPS));
  return nb__rk_share(r);
}

static float* nb__rk_params(void* ctx, size_t* n) {
  nb_wk_ranks_t* r = ctx;
  if (n) *n = r->n_logical;
  return r->logical;
}

static uint64_t nb__rk_samples(void* ctx) {
  return nb_trainer_samples(((nb_wk_ranks_t*)ctx)->t);
}

static nb_status_t nb__rk_steps(void* ctx, long k, double* loss_mean) {
  nb_wk_ranks_t* r = ctx;
  NB_CHECK(nb_trainer_steps(r->t, k, loss_mean));
  return nb__rk_gather(r);
}

static nb_status_t nb__rk_steps_budget(void* ctx, long k_max, double seconds, long* k_done,
                                       double* loss_mean) {
  nb_wk_ranks_t* r = ctx;
  NB_CHECK(nb_trainer_steps_budget(r->t, k_max, seconds, k_done, loss_mean));
  return nb__rk_gather(r);
}

static uint64_t nb__rk_step_samples(void* ctx) {
  const nb_train_config_t* tc = nb_trainer_config(((nb_wk_ranks_t*)ctx)->t);
  return (uint64_t)tc->batch_size * (uint64_t)(tc->micro_batches > 0 ? tc->micro_batches : 1);
}

void nb_wk_ranks_local(nb_wk_ranks_t* r, nb_hybrid_config_t* hc, nb_hybrid_local_t* out) {
  if (r->world) {
    hc->steps_hook = nb__rk_steps_hook;
    hc->hook_ctx = r;
  }
  hc->samples_scale = (uint32_t)r->dp; /* every replica trains on its own batches */
  if (r->mp <= 1) {
    nb_hybrid_trainer_local(r->t, out);
    return;
  }
  *out = (nb_hybrid_local_t){.ctx = r,
                             .params = nb__rk_params,
                             .samples = nb__rk_samples,
                             .steps = nb__rk_steps,
                             .steps_budget = nb__rk_steps_budget,
                             .step_samples = nb__rk_step_samples};
}

/* ---- evaluation, checkpoints, the model ------------------------------------------------------ */

nb_status_t nb_wk_ranks_eval(nb_wk_ranks_t* r, nb_train_eval_t* out) {
  if (r->mp > 1) {
    NB_CHECK(nb__rk_lead(r, 0, NB__RK_EVAL));
    NB_CHECK(nb__rk_share_replica(r));
  }
  return nb_trainer_eval(r->t, out);
}

nb_status_t nb_wk_ranks_checkpoint(nb_wk_ranks_t* r) {
  if (r->mp > 1) {
    NB_CHECK(nb__rk_lead(r, 0, NB__RK_CHECKPOINT));
    NB_CHECK(nb__rk_share_replica(r));
  }
  return nb_trainer_checkpoint(r->t);
}

nb_status_t nb_wk_ranks_model(nb_wk_ranks_t* r, nb_model_t** m, int* owned) {
  *owned = 0;
  if (r->mp <= 1) {
    *m = nb_trainer_model(r->t);
    return NB_OK;
  }
  const nb_train_config_t* tc = nb_trainer_config(r->t);
  NB_CHECK(nb_model_create(&tc->model, tc->seed, m));
  size_t n;
  memcpy(nb_model_params(*m, &n), r->logical, r->n_logical * sizeof(float));
  *owned = 1;
  return NB_OK;
}

nb_status_t nb_wk_ranks_stop(nb_wk_ranks_t* r) {
  return nb__rk_lead(r, 0, NB__RK_STOP);
}

/* ---- the other ranks ---------------------------------------------------------------------------
 */

nb_status_t nb_wk_ranks_follow(nb_wk_ranks_t* r) {
  for (;;) {
    float ctl[2] = {0, 0};
    NB_CHECK(nb_comm_broadcast(r->world, ctl, ctl, 2, NB_COMM_FP32, 0));
    int cmd = (int)ctl[1];
    if (cmd == NB__RK_STOP) return NB_OK;
    if (cmd == NB__RK_STEPS || cmd == NB__RK_MORE) {
      if (cmd == NB__RK_STEPS) NB_CHECK(nb__rk_share(r));
      NB_CHECK(nb_trainer_steps(r->t, (long)ctl[0], NULL));
      NB_CHECK(nb__rk_gather(r));
      continue;
    }
    if (cmd != NB__RK_EVAL && cmd != NB__RK_CHECKPOINT)
      return nb_error(NB_ERR_INTERNAL, "rank %d: unknown command %d from the leader", r->rank, cmd);
    if (r->mp <= 1 || r->dp_rank != 0) continue; /* the leader's replica only */
    NB_CHECK(nb__rk_share_replica(r));
    if (cmd == NB__RK_EVAL) {
      nb_train_eval_t ev;
      NB_CHECK(nb_trainer_eval(r->t, &ev));
    } else {
      NB_CHECK(nb_trainer_checkpoint(r->t));
    }
  }
}

void nb_wk_ranks_release(nb_wk_ranks_t* r) {
  nb_comm_destroy(r->pipe_comm);
  nb_comm_destroy(r->stage_comm);
  r->pipe_comm = r->stage_comm = NULL;
  nb_comm_destroy(r->dp_comm);
  nb_comm_destroy(r->mp_comm);
  nb_free(r->logical);
  r->dp_comm = r->mp_comm = NULL;
  r->logical = NULL;
}
