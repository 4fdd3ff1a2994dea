/* The training loop with tensor and pipeline parallelism (train/trainer.h, cfg.tp and cfg.pp)
 * under mpirun -np 2: the two ranks are one TP=2 group, or two pipeline stages (PP=2, 4
 * micro-batches per step through the 1F1B schedule); under -np 4, both together (two stages of
 * two tensor-parallel shards: TP2 x PP2). Every rank also runs the unsharded trainer
 * of the same config (the same gradient accumulation), so each checks against it: 20 steps follow
 * the TP=1 / PP=1 loss trajectory, a TP=2 or PP=2 checkpoint resumes at TP=1 and a TP=1
 * checkpoint at TP=2 and PP=2 (each then follows the uninterrupted run), and bad settings are
 * refused naming the field. The argument is the folder of the trainer tests' data
 * (its mono folder). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "intra/intra.h"
#include "train/trainer.h"

/* The shard sums its products in another order than the unsharded model (partial sums over
 * heads and hidden units, then the allreduce): losses agree to fp32 rounding amplified by the
 * steps, well inside 1e-4 relative over 20 AdamW steps. */
#define TOL_LOSS 1e-4
#define STEPS 20
#define HALF 10

static int g_rank, g_size;
static nb_comm_t* g_comm;
static const char* g_data;
static char g_dir[256]; /* a scratch folder made by rank 0, the same on every rank */

static void agree(int ok, const char* what) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) fail_msg("%s failed on some rank (this rank: %s)", what, ok ? "ok" : "FAILED");
}

static nb_status_t tp_allreduce(void* ctx, float* buf, size_t n) {
  return nb_comm_allreduce(ctx, buf, buf, n, NB_COMM_FP32, NB_COMM_SUM);
}

static nb_status_t pp_sendrecv(void* ctx, const float* send, int to, float* recv, int from,
                               size_t n) {
  return nb_comm_sendrecv(ctx, send, n, to, recv, n, from, NB_COMM_FP32);
}

/* The layouts of a run: 1 = one process, TP2 = tensor parallel, PP2 = two pipeline stages,
 * TP2PP2 = both (4 ranks: ranks 0, 1 the first stage's shards, 2, 3 the second's). */
enum { ONE = 1, TP2 = 2, PP2 = -2, TP2PP2 = 4 };
static nb_comm_t *g_stage_comm,
    *g_pipe_comm; /* 4 ranks: this stage's shards, this shard's stages */

typedef struct {
  double loss[STEPS + 1];
} losses_t;

static int record(void* ctx, const nb_train_progress_t* p) {
  losses_t* l = ctx;
  if (p->event == NB_TRAIN_EVENT_STEP && p->step >= 1 && p->step <= STEPS)
    l->loss[p->step] = p->loss;
  return 0;
}

/* A small config on the test corpus in one of the layouts. */
static void config(nb_train_config_t* c, int tp, losses_t* l, const char* ckpt, int resume,
                   long steps) {
  nb_train_config_defaults(c);
  c->model = nb_model_config_make(2, 64, 4, 32);
  c->seed = 7;
  c->batch_size = 2;
  c->micro_batches = 4;
  c->max_steps = steps;
  c->optim.lr = 3e-3f;
  c->optim.warmup_steps = 2;
  c->optim.total_steps = STEPS;
  c->optim.grad_clip = 1.0f;
  c->eval_every = 0;
  c->eval_batches = 1;
  c->n_sources = 2;
  snprintf(c->sources[0].label, NB_TRAIN_LABEL_MAX, "en");
  snprintf(c->sources[0].path, NB_TRAIN_PATH_MAX, "%s/mono/en.txt", g_data);
  snprintf(c->sources[1].label, NB_TRAIN_LABEL_MAX, "de");
  snprintf(c->sources[1].path, NB_TRAIN_PATH_MAX, "%s/mono/de.txt", g_data);
  c->progress = record;
  c->progress_ctx = l;
  if (ckpt) snprintf(c->checkpoint_dir, NB_TRAIN_PATH_MAX, "%s", ckpt);
  c->checkpoint_keep = 0;
  c->resume = resume;
  if (tp == TP2) c->tp = (nb_model_tp_t){g_rank, 2, tp_allreduce, g_comm};
  if (tp == PP2) {
    c->pp = (nb_model_pp_t){g_rank, 2, tp_allreduce, g_comm};
    c->pipe = (nb_pipeline_t){pp_sendrecv, tp_allreduce, g_comm};
  }
  if (tp == TP2PP2) {
    c->tp = (nb_model_tp_t){g_rank % 2, 2, tp_allreduce, g_stage_comm};
    c->pp = (nb_model_pp_t){g_rank / 2, 2, tp_allreduce, g_pipe_comm};
    c->pipe = (nb_pipeline_t){pp_sendrecv, tp_allreduce, g_pipe_comm};
  }
}

static const char* layout_name(int tp) {
  return tp == TP2 ? "tp=2" : tp == PP2 ? "pp=2" : tp == TP2PP2 ? "tp=2 x pp=2" : "tp=1";
}

static int run(int tp, losses_t* l, const char* ckpt, int resume, long steps, float** logical,
               size_t* n) {
  nb_train_config_t c;
  config(&c, tp, l, ckpt, resume, steps);
  nb_trainer_t* t = NULL;
  nb_train_eval_t ev;
  if (nb_trainer_create(&c, &t) != NB_OK || nb_trainer_run(t, &ev) != NB_OK) {
    fprintf(stderr, "rank %d, %s: %s\n", g_rank, layout_name(tp), nb_error_last());
    nb_trainer_destroy(t);
    return 0;
  }
  int ok = 1;
  if (logical) {
    *n = nb_trainer_logical_params(t);
    *logical = malloc(*n * sizeof(float));
    ok = *logical && nb_trainer_tp_gather(t, *logical) == NB_OK;
  }
  nb_trainer_destroy(t);
  return ok;
}

static int same_losses(const losses_t* a, const losses_t* b, long from, long to, const char* what) {
  double worst = 0;
  for (long s = from; s <= to; s++) {
    double r = fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]);
    if (r > worst) worst = r;
  }
  if (g_rank == 0)
    printf("%s: steps %ld-%ld, loss %.5f -> %.5f, worst rel diff %.2e\n", what, from, to,
           b->loss[from], b->loss[to], worst);
  return worst <= TOL_LOSS;
}

/* A resumed run reports only the steps after its checkpoint. */
static int resumed(const losses_t* l) {
  for (long s = 1; s <= HALF; s++)
    if (l->loss[s] != 0) return 0;
  return l->loss[HALF + 1] != 0;
}

static void trajectory(int layout) {
  losses_t ref = {0}, tp = {0};
  float *pr = NULL, *pt = NULL;
  size_t nr = 0, nt = 0;
  char what[64];
  snprintf(what, sizeof what, "%s vs tp=1", layout_name(layout));
  int ok = run(ONE, &ref, NULL, 0, STEPS, &pr, &nr);
  ok = ok && run(layout, &tp, NULL, 0, STEPS, &pt, &nt);
  ok = ok && nr == nt && same_losses(&tp, &ref, 1, STEPS, what);
  double worst = 0, scale = 0;
  for (size_t i = 0; ok && i < nr; i++) {
    double d = fabs((double)pt[i] - pr[i]);
    if (d > worst) worst = d;
    if (fabs(pr[i]) > scale) scale = fabs(pr[i]);
  }
  if (g_rank == 0) printf("final parameters: max abs diff %.2e (max |p| %.3f)\n", worst, scale);
  ok = ok && worst <= 1e-3 * scale;
  free(pr);
  free(pt);
  agree(ok, what);
}

/* The tests of 2 ranks skip under 4, and the reverse. */
#define NB_RANKS(n)            \
  do {                         \
    (void)state;               \
    if (g_size != (n)) skip(); \
  } while (0)

static void test_tp_trainer_trajectory(void** state) {
  NB_RANKS(2);
  trajectory(TP2);
}

static void test_tp_pp_trainer_trajectory(void** state) {
  NB_RANKS(4);
  trajectory(TP2PP2);
}

static void test_pp_trainer_trajectory(void** state) {
  NB_RANKS(2);
  trajectory(PP2);
}

/* Resharding: the first half at one degree, the checkpoint, the second half at the other; the
 * second half follows the uninterrupted TP=1 run. */
/* Resharding: the first half in one layout, the checkpoint, the second half in another; the
 * second half follows the uninterrupted TP=1 run. `layout` is TP2 or PP2; tag names its
 * folders. */
static int reshard(int layout, const char* tag) {
  losses_t ref = {0}, a = {0}, b = {0}, c = {0}, d = {0};
  char d_mp[300], d_one[300], mine[300], what[96];
  snprintf(d_mp, sizeof d_mp, "%s/from-%s", g_dir, tag);       /* written by the group's rank 0 */
  snprintf(d_one, sizeof d_one, "%s/from-one-%s", g_dir, tag); /* written by rank 0 alone */
  snprintf(mine, sizeof mine, "%s/%s-one-rank%d", g_dir, tag, g_rank); /* TP=1 runs of each rank */
  int ok = run(ONE, &ref, NULL, 0, STEPS, NULL, NULL);
  /* the layout for the first half, then each rank alone at TP=1 from a copy of that checkpoint */
  ok = ok && run(layout, &a, d_mp, 0, HALF, NULL, NULL);
  MPI_Barrier(MPI_COMM_WORLD);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", d_mp, mine);
  ok = ok && system(cmd) == 0;
  ok = ok && run(ONE, &b, mine, 1, STEPS, NULL, NULL);
  snprintf(what, sizeof what, "%s checkpoint resumed at tp=1", layout_name(layout));
  ok = ok && resumed(&b) && same_losses(&b, &ref, HALF + 1, STEPS, what);
  /* the reverse: rank 0 alone at TP=1, then both in the layout */
  if (g_rank == 0) ok = ok && run(ONE, &c, d_one, 0, HALF, NULL, NULL);
  MPI_Barrier(MPI_COMM_WORLD);
  ok = ok && run(layout, &d, d_one, 1, STEPS, NULL, NULL);
  snprintf(what, sizeof what, "tp=1 checkpoint resumed at %s", layout_name(layout));
  ok = ok && resumed(&d) && same_losses(&d, &ref, HALF + 1, STEPS, what);
  return ok;
}

static void test_tp_checkpoint_reshards(void** state) {
  NB_RANKS(2);
  agree(reshard(TP2, "tp2"), "checkpoint resharding (tensor)");
}

static void test_pp_checkpoint_reshards(void** state) {
  NB_RANKS(2);
  agree(reshard(PP2, "pp2"), "checkpoint resharding (pipeline)");
}

static void test_tp_pp_checkpoint_reshards(void** state) {
  NB_RANKS(4);
  agree(reshard(TP2PP2, "tp2pp2"), "checkpoint resharding (tensor x pipeline)");
}

/* A TP=2 checkpoint resumed as two pipeline stages. */
static void test_tp_checkpoint_to_pp(void** state) {
  NB_RANKS(2);
  losses_t ref = {0}, a = {0}, b = {0};
  char dir[300];
  snprintf(dir, sizeof dir, "%s/tp-to-pp", g_dir);
  int ok = run(ONE, &ref, NULL, 0, STEPS, NULL, NULL);
  ok = ok && run(TP2, &a, dir, 0, HALF, NULL, NULL);
  ok = ok && run(PP2, &b, dir, 1, STEPS, NULL, NULL);
  ok = ok && resumed(&b) && same_losses(&b, &ref, HALF + 1, STEPS, "tp=2 checkpoint at pp=2");
  agree(ok, "a tensor-parallel checkpoint resumed by a pipeline");
}

static void expect_refused(nb_train_config_t* c, const char* needle) {
  nb_trainer_t* t = NULL;
  nb_status_t st = nb_trainer_create(c, &t);
  int ok = st == NB_ERR_CONFIG && strstr(nb_error_last(), needle) != NULL;
  if (!ok)
    fprintf(stderr, "expected a refusal naming %s, got %d: %s\n", needle, st, nb_error_last());
  nb_trainer_destroy(t);
  assert_true(ok);
}

static void test_tp_trainer_bad_config(void** state) {
  NB_RANKS(2);
  losses_t l;
  nb_train_config_t c;
  config(&c, TP2, &l, NULL, 0, 1);
  c.model = nb_model_config_make(2, 60, 3, 32);
  expect_refused(&c, "n_head");
  config(&c, TP2, &l, NULL, 0, 1);
  c.lora_enabled = 1;
  expect_refused(&c, "LoRA");
  config(&c, TP2, &l, NULL, 0, 1);
  c.tp.rank = 2;
  expect_refused(&c, "tp.rank");
  config(&c, TP2, &l, NULL, 0, 1);
  c.tp.allreduce = NULL;
  expect_refused(&c, "tp.allreduce");
  config(&c, PP2, &l, NULL, 0, 1);
  c.model = nb_model_config_make(3, 64, 4, 32);
  expect_refused(&c, "n_layer");
  config(&c, PP2, &l, NULL, 0, 1);
  c.pipe.sendrecv = NULL;
  expect_refused(&c, "pipe.sendrecv");
  config(&c, PP2, &l, NULL, 0, 1);
  c.tp = (nb_model_tp_t){g_rank, 2, tp_allreduce, g_comm};
  c.lora_enabled = 1;
  expect_refused(&c, "LoRA");
}

int main(int argc, char** argv) {
  if (nb_intra_init(&argc, &argv) != NB_OK) return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (argc < 2 || (g_size != 2 && g_size != 4)) {
    if (g_rank == 0) fprintf(stderr, "usage: mpirun -np 2|4 %s DATA_DIR\n", argv[0]);
    nb_intra_finalize();
    return 2;
  }
  g_data = argv[1];
  if (g_rank == 0) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nb-trainer-tp-XXXXXX");
    if (!mkdtemp(g_dir)) g_dir[0] = 0;
  }
  MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (!g_dir[0]) nb_comm_abort(NULL, 1);
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.device = NB_COMM_DEVICE_CPU;
  if (nb_comm_create(&cfg, &g_comm) != NB_OK) nb_comm_abort(NULL, 1);
  if (g_size == 4 && (nb_comm_split(g_comm, g_rank / 2, g_rank % 2, &g_stage_comm) != NB_OK ||
                      nb_comm_split(g_comm, g_rank % 2, g_rank / 2, &g_pipe_comm) != NB_OK))
    nb_comm_abort(NULL, 1);

  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tp_trainer_trajectory),
      cmocka_unit_test(test_tp_checkpoint_reshards),
      cmocka_unit_test(test_pp_trainer_trajectory),
      cmocka_unit_test(test_pp_checkpoint_reshards),
      cmocka_unit_test(test_tp_checkpoint_to_pp),
      cmocka_unit_test(test_tp_trainer_bad_config),
      cmocka_unit_test(test_tp_pp_trainer_trajectory),
      cmocka_unit_test(test_tp_pp_checkpoint_reshards),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  }
  nb_comm_destroy(g_pipe_comm);
  nb_comm_destroy(g_stage_comm);
  nb_comm_destroy(g_comm);
  nb_intra_finalize();
  return rc;
}
