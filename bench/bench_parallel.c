/* `nebula bench parallel`: one cluster's training step under the layouts of model parallelism
 * at 2 and 4 ranks: data parallel (every rank the whole model), tensor parallel (every layer
 * split over the ranks, train/model.h), pipeline parallel (the layers in stages, the replica's
 * rows in --micro micro-batches through the 1F1B schedule, train/pipeline.h), both (two stages
 * of two shards) and grids of data with either, each as ratios to data parallelism at the same
 * rank count: tokens/s of the same global batch, per-rank memory (parameters, gradients and
 * AdamW moments held; the process's peak resident set), and one gather of the logical
 * parameters against one step. Each layout is a child `mpirun -np N nebula bench parallel
 * --child-tp TP --child-pp PP` on synthetic tokens; its rank 0 prints one JSON line. On a CPU
 * with fewer cores than ranks the ranks share the cores (oversubscribed): the ratios then show
 * what a layout costs, not what it gains. Not a test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "intra/intra.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/pipeline.h"
#include "train/rng.h"

#define NB__PAR_SYNOPSIS                                                                         \
  "nebula bench parallel [--layers L] [--dim D] [--heads H] [--ctx T] [--batch B] [--micro M]\n" \
  "                      [--steps N] [--json]\n"                                                 \
  "  defaults: 4 layers, width 256, 4 heads, context 128, global batch 8, pipelines in 4\n"      \
  "  micro-batches, 5 timed steps; each layout in its own mpirun (OPENBLAS_NUM_THREADS=1,\n"     \
  "  NB_TRAIN_THREADS=1 per rank). --child-tp and --child-pp are internal: one rank of a\n"      \
  "  layout, under mpirun"

typedef struct {
  int layers, dim, heads, ctx, batch, micro, steps, child_tp, child_pp, json;
} nb__par_opts_t;

static nb_status_t nb__par_sum(void* ctx, float* buf, size_t n) {
  return nb_comm_allreduce(ctx, buf, buf, n, NB_COMM_FP32, NB_COMM_SUM);
}

static nb_status_t nb__par_sendrecv(void* ctx, const float* send, int to, float* recv, int from,
                                    size_t n) {
  return nb_comm_sendrecv(ctx, send, n, to, recv, n, from, NB_COMM_FP32);
}

/* ---- one rank of a layout ------------------------------------------------------------------ */

typedef struct {
  nb_comm_t *world, *tp, *dp;
  /* tensor and pipeline together: the stage's shards, and the shard's stages */
  nb_comm_t *stage, *pipe;
  nb_model_t* m;
  nb_adamw_t* opt;
  int *tok, *tgt;
} nb__par_rank_t;

static void nb__par_rank_free(nb__par_rank_t* r) {
  nb_adamw_destroy(r->opt);
  nb_model_destroy(r->m);
  nb_comm_destroy(r->dp);
  nb_comm_destroy(r->pipe);
  nb_comm_destroy(r->stage);
  nb_comm_destroy(r->tp);
  nb_comm_destroy(r->world);
  free(r->tok);
  free(r->tgt);
}

/* One step: the replica's batch (the same tokens on every rank of a replica), forward, backward,
 * the gradient averaged over the replicas, clipped by the whole gradient's norm, AdamW. */
static nb_status_t nb__par_step(nb__par_rank_t* r, const nb__par_opts_t* o, int tp, int pp,
                                int rows, uint64_t seed) {
  nb_rng_t g;
  nb_rng_seed(&g, seed);
  size_t bt = (size_t)rows * (size_t)o->ctx;
  for (size_t i = 0; i < bt; i++) {
    r->tok[i] = (int)(nb_rng_u64(&g) % 256u);
    r->tgt[i] = (int)(nb_rng_u64(&g) % 256u);
  }
  if (pp > 1) { /* the replica's rows in micro-batches through the stages */
    nb_pipeline_t pipe = {nb__par_sendrecv, nb__par_sum, r->pipe ? r->pipe : r->tp};
    NB_CHECK(
        nb_pipeline_step(r->m, &pipe, r->tok, r->tgt, o->micro, rows / o->micro, o->ctx, NULL));
  } else {
    nb_model_zero_grad(r->m);
    float loss = 0;
    NB_CHECK(nb_model_forward(r->m, r->tok, r->tgt, rows, o->ctx, &loss));
    NB_CHECK(nb_model_backward(r->m));
  }
  size_t n;
  float* grads = nb_model_grads(r->m, &n);
  if (r->dp) NB_CHECK(nb_comm_allreduce(r->dp, grads, grads, n, NB_COMM_FP32, NB_COMM_AVG));
  double norm = 0;
  if (tp > 1 || pp > 1)
    NB_CHECK(nb_model_tp_norm(r->m, grads, &norm));
  else
    norm = nb_grad_norm(grads, n);
  return nb_adamw_step_norm(r->opt, nb_model_params(r->m, NULL), grads, nb_model_decay_mask(r->m),
                            norm);
}

static int nb__par_child(const nb__par_opts_t* o) {
  nb__par_rank_t r = {0};
  nb_status_t st = nb_comm_create(NULL, &r.world);
  int rank = st == NB_OK ? nb_comm_rank(r.world) : 0,
      size = st == NB_OK ? nb_comm_size(r.world) : 1;
  int tp = o->child_tp, pp = o->child_pp > 1 ? o->child_pp : 1, w = tp * pp, dp = size / w;
  if (st == NB_OK && (size % w != 0 || o->batch % dp != 0))
    st = nb_error(NB_ERR_CONFIG,
                  "%d ranks at tensor %d x pipeline %d: %d replicas must divide the ranks and "
                  "the batch %d",
                  size, tp, pp, dp, o->batch);
  int mp_rank = rank % w, dp_rank = rank / w;
  /* r.tp: the replica's ranks (the shards of a tensor-parallel one, or a pipeline's stages) */
  if (st == NB_OK && w > 1) st = nb_comm_split(r.world, dp_rank, mp_rank, &r.tp);
  if (st == NB_OK && dp > 1) st = nb_comm_split(r.world, mp_rank, dp_rank, &r.dp);
  nb_model_config_t cfg = nb_model_config_make(o->layers, o->dim, o->heads, o->ctx);
  nb_model_tp_t tpc = {mp_rank, tp, nb__par_sum, r.tp};
  nb_model_pp_t ppc = {mp_rank, pp, nb__par_sum, r.tp};
  if (st == NB_OK && tp > 1 && pp > 1) { /* replica rank = stage * tp + shard */
    int stage = mp_rank / tp, shard = mp_rank % tp;
    st = nb_comm_split(r.tp, stage, shard, &r.stage);
    if (st == NB_OK) st = nb_comm_split(r.tp, shard, stage, &r.pipe);
    tpc = (nb_model_tp_t){shard, tp, nb__par_sum, r.stage};
    ppc = (nb_model_pp_t){stage, pp, nb__par_sum, r.pipe};
  }
  if (st == NB_OK)
    st = nb_model_create_mp(&cfg, 1, tp > 1 ? &tpc : NULL, pp > 1 ? &ppc : NULL, &r.m);
  nb_adamw_config_t oc = nb_adamw_config_default();
  oc.total_steps = o->steps + 1;
  if (st == NB_OK) st = nb_adamw_create(&oc, nb_model_num_params(r.m), &r.opt);
  int rows = o->batch / dp;
  if (st == NB_OK && pp > 1 && rows % o->micro != 0)
    st = nb_error(NB_ERR_CONFIG, "a replica's %d rows do not split into %d micro-batches", rows,
                  o->micro);
  size_t bt = (size_t)rows * (size_t)o->ctx;
  if (st == NB_OK && (!(r.tok = malloc(bt * sizeof(int))) || !(r.tgt = malloc(bt * sizeof(int)))))
    st = nb_error(NB_ERR_NOMEM, "batch");
  /* one warm-up step (first touch of the activations), then the timed ones */
  double t0 = 0;
  for (int s = 0; st == NB_OK && s <= o->steps; s++) {
    if (s == 1) {
      st = nb_comm_barrier(r.world);
      t0 = nb_now_s();
    }
    if (st == NB_OK)
      st = nb__par_step(&r, o, tp, pp, rows,
                        0x9e3779b97f4a7c15ull * (uint64_t)(s + 1) + (uint64_t)dp_rank);
  }
  /* seconds of the steps, KiB resident, bytes of state, seconds of one gather of the logical
   * parameters (what the worker's replica does once per outer round): the slowest rank's */
  float stats[4] = {0, 0, 0, 0};
  if (st == NB_OK) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    stats[0] = (float)(nb_now_s() - t0);
    stats[1] = (float)ru.ru_maxrss;
    stats[2] = (float)(nb_model_num_params(r.m) * 4 * sizeof(float)); /* params, grads, m, v */
    float* logical = NULL;
    st = nb_alloc((void**)&logical, nb_model_num_logical_params(r.m), sizeof(float), "gather");
    double best = 1e30;
    for (int k = 0; st == NB_OK && k < 3; k++) {
      double g0 = nb_now_s();
      st = nb_model_tp_gather(r.m, nb_model_params(r.m, NULL), logical);
      best = fmin(best, nb_now_s() - g0);
    }
    nb_free(logical);
    stats[3] = (float)best;
  }
  float* all = NULL; /* every rank's figures, then the largest of each */
  if (st == NB_OK) st = nb_alloc((void**)&all, (size_t)size * 4, sizeof(float), "figures");
  if (st == NB_OK) st = nb_comm_allgather(r.world, stats, all, 4, NB_COMM_FP32);
  for (int i = 0; st == NB_OK && i < size * 4; i++)
    if (all[i] > stats[i % 4]) stats[i % 4] = all[i];
  nb_free(all);
  if (st != NB_OK) {
    fprintf(stderr, "nebula bench parallel: rank %d: %s\n", rank, nb_error_last());
    nb__par_rank_free(&r);
    nb_comm_abort(NULL, 1);
  }
  if (rank == 0) {
    json_t* j = json_object();
    json_object_set_new(j, "ranks", json_integer(size));
    json_object_set_new(j, "data", json_integer(dp));
    json_object_set_new(j, "tensor", json_integer(tp));
    json_object_set_new(j, "pipeline", json_integer(pp));
    json_object_set_new(j, "tokens_per_s",
                        nb_bench_json_real((double)o->batch * o->ctx * o->steps / stats[0]));
    json_object_set_new(j, "state_mib_per_rank", nb_bench_json_real(stats[2] / 1048576.0));
    json_object_set_new(j, "max_rss_mib", nb_bench_json_real(stats[1] / 1024.0));
    /* the outer sync's gather against one inner step (a round has H of them) */
    json_object_set_new(j, "gather_ms", nb_bench_json_real(w > 1 ? stats[3] * 1e3 : 0));
    json_object_set_new(j, "gather_vs_step",
                        nb_bench_json_real(w > 1 ? stats[3] / (stats[0] / o->steps) : 0));
    nb_bench_json_print(stdout, j);
  }
  nb__par_rank_free(&r);
  nb_intra_finalize();
  return 0;
}

/* ---- the parent: every layout in its own mpirun ---------------------------------------------- */

static json_t* nb__par_run(const nb__par_opts_t* o, int n, int tp, int pp) {
  char exe[1024];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) return NULL;
  exe[k] = 0;
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader "
           "--mca mpi_yield_when_idle 1 -np %d '%s' bench parallel --child-tp %d --child-pp %d "
           "--layers %d --dim %d --heads %d --ctx %d --batch %d --micro %d --steps %d",
           n, exe, tp, pp, o->layers, o->dim, o->heads, o->ctx, o->batch, o->micro, o->steps);
  FILE* p = popen(cmd, "r");
  if (!p) return NULL;
  char line[4096];
  json_t* got = NULL;
  while (fgets(line, sizeof line, p)) {
    json_t* j = line[0] == '{' ? json_loads(line, 0, NULL) : NULL;
    if (j) {
      json_decref(got);
      got = j;
    }
  }
  if (pclose(p) != 0) {
    json_decref(got);
    return NULL;
  }
  return got;
}

static double nb__par_num(json_t* o, const char* key) {
  json_t* v = o ? json_object_get(o, key) : NULL;
  return v && json_is_number(v) ? json_number_value(v) : NAN;
}

int nb_bench_parallel_main(int argc, char** argv) {
  nb__par_opts_t o = {4, 256, 4, 128, 8, 4, 5, 0, 0, 0};
  const nb_bench_int_flag_t flags[] = {
      {"--layers", &o.layers}, {"--dim", &o.dim},           {"--heads", &o.heads},
      {"--ctx", &o.ctx},       {"--batch", &o.batch},       {"--micro", &o.micro},
      {"--steps", &o.steps},   {"--child-tp", &o.child_tp}, {"--child-pp", &o.child_pp}};
  int rc = nb_bench_parse_int_flags("nebula bench parallel", NB__PAR_SYNOPSIS, argc, argv, flags,
                                    (int)(sizeof flags / sizeof flags[0]), &o.json);
  if (rc != NB_OPTS_RUN) return rc;
  nb_model_config_t cfg = nb_model_config_make(o.layers, o.dim, o.heads, o.ctx);
  if (nb_model_config_check(&cfg) != NB_OK) {
    fprintf(stderr, "nebula bench parallel: %s\n", nb_error_last());
    return 2;
  }
  if (o.child_tp > 0) return nb__par_child(&o);

  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv("NB_TRAIN_THREADS", "1", 1);
  /* ranks, tensor, pipeline */
  static const int layouts[][3] = {{2, 1, 1}, {2, 2, 1}, {2, 1, 2}, {4, 1, 1}, {4, 2, 1},
                                   {4, 1, 2}, {4, 4, 1}, {4, 1, 4}, {4, 2, 2}};
  json_t* rows = json_array();
  double dp_tok = NAN, dp_mem = NAN, dp_rss = NAN;
  if (!o.json)
    printf("%-6s %-5s %-7s %-9s %12s %9s %12s %8s %11s %8s %12s\n", "ranks", "data", "tensor",
           "pipeline", "tokens/s", "vs_data", "state_MiB", "vs_data", "max_rss_MiB", "vs_data",
           "gather/step");
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
    int n = layouts[i][0], tp = layouts[i][1], pp = layouts[i][2], dp = n / (tp * pp);
    if (o.heads % tp != 0 || o.layers % pp != 0 || o.batch % dp != 0 ||
        (pp > 1 && (o.batch / dp) % o.micro != 0))
      continue; /* a layout this shape does not split into */
    json_t* r = nb__par_run(&o, n, tp, pp);
    double tok = nb__par_num(r, "tokens_per_s"), mem = nb__par_num(r, "state_mib_per_rank"),
           rss = nb__par_num(r, "max_rss_mib");
    if (tp == 1 && pp == 1) dp_tok = tok, dp_mem = mem, dp_rss = rss;
    json_t* row = r ? r : json_object();
    if (!r) {
      json_object_set_new(row, "ranks", json_integer(n));
      json_object_set_new(row, "tensor", json_integer(tp));
      json_object_set_new(row, "pipeline", json_integer(pp));
      json_object_set_new(row, "error", json_string("the mpirun of this layout failed"));
    }
    json_object_set_new(row, "tokens_vs_data", nb_bench_json_real(tok / dp_tok));
    json_object_set_new(row, "state_vs_data", nb_bench_json_real(mem / dp_mem));
    json_object_set_new(row, "rss_vs_data", nb_bench_json_real(rss / dp_rss));
    json_object_set_new(row, "oversubscribed", json_boolean(n > cores));
    if (!o.json)
      printf("%-6d %-5d %-7d %-9d %12.0f %9.2f %12.2f %8.2f %11.1f %8.2f %12.3f%s\n", n, dp, tp, pp,
             tok, tok / dp_tok, mem, mem / dp_mem, rss, rss / dp_rss,
             nb__par_num(r, "gather_vs_step"),
             r ? (n > cores ? "  (oversubscribed)" : "") : "  (failed)");
    json_array_append_new(rows, row);
  }
  if (o.json) {
    json_t* j = json_object();
    json_object_set_new(j, "bench", json_string("parallel"));
    json_object_set_new(j, "layers", json_integer(o.layers));
    json_object_set_new(j, "dim", json_integer(o.dim));
    json_object_set_new(j, "heads", json_integer(o.heads));
    json_object_set_new(j, "ctx", json_integer(o.ctx));
    json_object_set_new(j, "batch", json_integer(o.batch));
    json_object_set_new(j, "micro", json_integer(o.micro));
    json_object_set_new(j, "cores", json_integer(cores));
    json_object_set_new(j, "runs", rows);
    nb_bench_json_print(stdout, j);
  } else {
    json_decref(rows);
    printf(
        "same global batch of %d x %d tokens in every layout (pipelines: %d micro-batches); "
        "%ld cores: with more ranks than cores the ratios show what a layout costs, not its "
        "speed-up\n",
        o.batch, o.ctx, o.micro, cores);
  }
  return 0;
}
