/* Pipeline parallelism of the built-in model (train/model.h, train/pipeline.h) under mpirun: 2
 * ranks are two stages of a 4-layer model, 4 ranks four stages (one layer each, so the middle
 * stages are exercised) and then two stages of two tensor-parallel shards each (tensor and
 * pipeline together: ranks 0, 1 the first stage's shards, 2, 3 the second's; the pipeline runs
 * between ranks of the same shard). Every rank also builds the whole model of the same seed and
 * trains it with the same gradient accumulation over the same 4 micro-batches, and checks its stage
 * against it: the stage holds the reference's values, the first step's gathered gradients agree
 * to fp32 rounding, 20 AdamW steps (1F1B each) follow the reference's loss trajectory, a
 * pipelined forward gives the reference's loss. It prints the per-rank parameter + optimizer
 * memory against the whole model's. The arguments are the texts to train on. Not a benchmark. */
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

#include "common/common.h"
#include "intra/intra.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/pipeline.h"

/* The stages add the replicated tensors' gradients in another order than the whole model (the
 * embedding's and the output head's shares of wte meet after the micro-batches, not within
 * each), so gradients agree to fp32 rounding; 20 steps keep the loss within 1e-4. */
#define TOL_GRAD 1e-4
#define TOL_TRAJ 1e-4
#define STEPS 20
#define MICRO 4
#define MB 2 /* sequences per micro-batch */

static int g_rank, g_size;
static nb_comm_t* g_comm;
static uint8_t* g_text;
static size_t g_text_len;

static void agree(int ok, const char* what) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) fail_msg("%s failed on some rank (this rank: %s)", what, ok ? "ok" : "FAILED");
}

static nb_status_t pp_allreduce(void* ctx, float* buf, size_t n) {
  return nb_comm_allreduce(ctx, buf, buf, n, NB_COMM_FP32, NB_COMM_SUM);
}

static nb_status_t pp_sendrecv(void* ctx, const float* send, int to, float* recv, int from,
                               size_t n) {
  return nb_comm_sendrecv(ctx, send, n, to, recv, n, from, NB_COMM_FP32);
}

static nb_pipeline_t g_pipe = {pp_sendrecv, pp_allreduce, NULL};
/* The layout under test: g_tp shards per stage (1, or 2 at 4 ranks), g_size / g_tp stages; the
 * communicators of this rank's stage (its shards) and of its shard's pipeline. */
static int g_tp = 1;
static nb_comm_t *g_stage_comm, *g_pipe_comm;

static nb_model_config_t test_cfg(void) {
  return nb_model_config_make(4, 64, 4, 32);
}

/* Batch b of step s: B windows of T + 1 bytes of the corpus (sequence index = the replica's
 * rows, so replica d takes rows [d*B, (d+1)*B) of the reference's batch). */
static void batch(int step, int row0, int rows, int T, int* tok, int* tgt) {
  for (int r = 0; r < rows; r++) {
    size_t at = ((size_t)(step * 97 + (row0 + r) * 131) * (size_t)(T + 1)) % (g_text_len - T - 1);
    for (int t = 0; t < T; t++) {
      tok[r * T + t] = g_text[at + t];
      tgt[r * T + t] = g_text[at + t + 1];
    }
  }
}

static double max_abs(const float* a, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
  return m;
}

static double max_diff(const float* a, const float* b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

static nb_model_t* make_stage(const nb_model_config_t* cfg, uint64_t seed) {
  nb_model_t* m = NULL;
  nb_status_t st;
  if (g_tp == 1) {
    nb_model_pp_t pp = {g_rank, g_size, pp_allreduce, g_comm};
    g_pipe.ctx = g_comm;
    st = nb_model_create_pp(cfg, seed, &pp, &m);
  } else {
    nb_model_tp_t tp = {g_rank % g_tp, g_tp, pp_allreduce, g_stage_comm};
    nb_model_pp_t pp = {g_rank / g_tp, g_size / g_tp, pp_allreduce, g_pipe_comm};
    g_pipe.ctx = g_pipe_comm;
    st = nb_model_create_mp(cfg, seed, &tp, &pp, &m);
  }
  if (st != NB_OK) fprintf(stderr, "rank %d: %s\n", g_rank, nb_error_last());
  return m;
}

static int stages(void) {
  return g_size / g_tp;
}

/* The reference: the whole model, the same micro-batches accumulated and averaged. */
static nb_status_t ref_grads(nb_model_t* ref, const int* tok, const int* tgt, int T, double* loss) {
  nb_model_zero_grad(ref);
  double sum = 0;
  for (int k = 0; k < MICRO; k++) {
    float l = 0;
    size_t off = (size_t)k * MB * T;
    NB_CHECK(nb_model_forward(ref, tok + off, tgt + off, MB, T, &l));
    NB_CHECK(nb_model_backward(ref));
    sum += l;
  }
  size_t n;
  float* g = nb_model_grads(ref, &n);
  for (size_t i = 0; i < n; i++) g[i] *= 1.0f / MICRO;
  *loss = sum / MICRO;
  return NB_OK;
}

static void test_pp_matches_reference(void** state) {
  (void)state;
  nb_model_config_t cfg = test_cfg();
  nb_model_t *ref = NULL, *m = make_stage(&cfg, 7);
  assert_int_equal(nb_model_create(&cfg, 7, &ref), NB_OK);
  agree(m != NULL, "nb_model_create_pp");
  size_t nl, nr;
  float* p = nb_model_params(m, &nl);
  float* pr = nb_model_params(ref, &nr);
  assert_int_equal(nb_model_num_logical_params(m), nr);
  assert_int_equal(nb_model_pp_stages(m), stages());
  assert_int_equal(nb_model_tp_size(m), g_tp);
  assert_int_equal(nb_model_group_size(m), g_size);
  assert_true(nb_model_is_sharded(m));
  float* logical = malloc(nr * sizeof(float));
  assert_non_null(logical);
  assert_int_equal(nb_model_tp_gather(m, p, logical), NB_OK);
  agree(memcmp(logical, pr, nr * sizeof(float)) == 0, "the stages hold the whole model's bits");

  int T = cfg.ctx;
  size_t bt = (size_t)MICRO * MB * T;
  int *tok = malloc(bt * sizeof(int)), *tgt = malloc(bt * sizeof(int));
  assert_non_null(tok);
  assert_non_null(tgt);
  batch(0, 0, MICRO * MB, T, tok, tgt);
  double loss_ref = 0, loss = 0;
  assert_int_equal(ref_grads(ref, tok, tgt, T, &loss_ref), NB_OK);
  agree(nb_pipeline_step(m, &g_pipe, tok, tgt, MICRO, MB, T, &loss) == NB_OK, "1F1B step");
  float* g = nb_model_grads(m, &nl);
  float* gr = nb_model_grads(ref, &nr);
  assert_int_equal(nb_model_tp_gather(m, g, logical), NB_OK);
  double dg = max_diff(logical, gr, nr) / max_abs(gr, nr), dl = fabs(loss - loss_ref) / loss_ref;
  double norm, norm_ref = nb_grad_norm(gr, nr);
  assert_int_equal(nb_model_tp_norm(m, g, &norm), NB_OK);
  double dn = fabs(norm - norm_ref) / norm_ref;
  /* an evaluation's forward through the stages */
  double eloss = 0, eref = 0;
  int scored = 0;
  float lr = 0;
  agree(nb_pipeline_forward(m, &g_pipe, tok, tgt, MB, T, &eloss, &scored) == NB_OK,
        "pipelined forward");
  assert_int_equal(nb_model_forward(ref, tok, tgt, MB, T, &lr), NB_OK);
  eref = lr;
  double de = fabs(eloss - eref) / eref;
  if (g_rank == 0)
    printf(
        "pp=%d tp=%d, %d micro-batches: loss %.7f vs %.7f (rel %.2e), grads max rel %.2e, norm "
        "rel %.2e, pipelined forward rel %.2e\n",
        stages(), g_tp, MICRO, loss, loss_ref, dl, dg, dn, de);
  agree(dl <= 1e-6 && dg <= TOL_GRAD && dn <= TOL_GRAD, "first step within fp32 tolerance");
  agree(de <= 1e-6 && scored == MB * T, "pipelined forward's loss");
  free(tok);
  free(tgt);
  free(logical);
  nb_model_destroy(m);
  nb_model_destroy(ref);
}

static void test_pp_trajectory(void** state) {
  (void)state;
  nb_model_config_t cfg = test_cfg();
  nb_model_t *ref = NULL, *m = make_stage(&cfg, 11);
  assert_int_equal(nb_model_create(&cfg, 11, &ref), NB_OK);
  agree(m != NULL, "nb_model_create_pp");
  size_t nl, nr;
  float* p = nb_model_params(m, &nl);
  float* g = nb_model_grads(m, &nl);
  float* pr = nb_model_params(ref, &nr);
  float* gr = nb_model_grads(ref, &nr);
  nb_adamw_config_t oc = nb_adamw_config_default();
  oc.lr = 3e-3f;
  oc.warmup_steps = 2;
  oc.total_steps = STEPS;
  oc.grad_clip = 0.5f;
  nb_adamw_t *opt = NULL, *opt_ref = NULL;
  assert_int_equal(nb_adamw_create(&oc, nl, &opt), NB_OK);
  assert_int_equal(nb_adamw_create(&oc, nr, &opt_ref), NB_OK);
  int T = cfg.ctx;
  size_t bt = (size_t)MICRO * MB * T;
  int *tok = malloc(bt * sizeof(int)), *tgt = malloc(bt * sizeof(int));
  assert_non_null(tok);
  assert_non_null(tgt);
  double worst = 0, first = 0, last = 0;
  int ok = 1, clipped = 0;
  for (int s = 0; s < STEPS && ok; s++) {
    batch(s, 0, MICRO * MB, T, tok, tgt);
    double loss_ref = 0, loss = 0, norm_ref = 0, norm = 0;
    ok = ok && ref_grads(ref, tok, tgt, T, &loss_ref) == NB_OK;
    ok = ok && nb_adamw_step(opt_ref, pr, gr, nb_model_decay_mask(ref), &norm_ref) == NB_OK;
    ok = ok && nb_pipeline_step(m, &g_pipe, tok, tgt, MICRO, MB, T, &loss) == NB_OK;
    ok = ok && nb_model_tp_norm(m, g, &norm) == NB_OK;
    ok = ok && nb_adamw_step_norm(opt, p, g, nb_model_decay_mask(m), norm) == NB_OK;
    if (norm_ref > oc.grad_clip) clipped++;
    worst = fmax(worst, fabs(loss - loss_ref) / loss_ref);
    if (s == 0) first = loss_ref;
    last = loss_ref;
  }
  agree(ok, "20 steps");
  float* logical = malloc(nr * sizeof(float));
  assert_non_null(logical);
  assert_int_equal(nb_model_tp_gather(m, p, logical), NB_OK);
  double dp = max_diff(logical, pr, nr) / max_abs(pr, nr);
  if (g_rank == 0)
    printf(
        "pp=%d tp=%d: %d steps of %d micro-batches (%d clipped), loss %.4f -> %.4f, worst loss "
        "rel diff %.2e, final params max rel diff %.2e\n",
        stages(), g_tp, STEPS, MICRO, clipped, first, last, worst, dp);
  agree(worst <= TOL_TRAJ, "loss trajectory within tolerance");
  agree(clipped > 0 && last < first, "clipping exercised and loss decreasing");
  size_t nopt;
  (void)nb_adamw_state(opt, &nopt);
  double mem = (double)(2 * nl + nopt) * sizeof(float), mem_ref = (double)(4 * nr) * sizeof(float);
  double worst_mem = mem;
  MPI_Allreduce(MPI_IN_PLACE, &worst_mem, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf(
        "pp=%d tp=%d per-rank params+grads+adamw (largest): %.0f KiB vs %.0f KiB whole "
        "(ratio %.3f)\n",
        stages(), g_tp, worst_mem / 1024, mem_ref / 1024, worst_mem / mem_ref);
  agree(worst_mem / mem_ref < 0.6 + 0.5 / g_size, "per-rank memory about 1/ranks");
  free(logical);
  free(tok);
  free(tgt);
  nb_adamw_destroy(opt);
  nb_adamw_destroy(opt_ref);
  nb_model_destroy(m);
  nb_model_destroy(ref);
}

/* Tensor and pipeline together (4 ranks): the same two checks on two stages of two shards. */
static void test_tp_pp_matches_reference(void** state) {
  if (g_size != 4) skip();
  g_tp = 2;
  test_pp_matches_reference(state);
  g_tp = 1;
}
static void test_tp_pp_trajectory(void** state) {
  if (g_size != 4) skip();
  g_tp = 2;
  test_pp_trajectory(state);
  g_tp = 1;
}

static void test_pp_bad_layout(void** state) {
  (void)state;
  nb_model_config_t cfg = nb_model_config_make(3, 64, 4, 32); /* 3 layers */
  nb_model_pp_t pp = {g_rank, 2, pp_allreduce, g_comm};
  nb_model_t* m = NULL;
  int ok = nb_model_create_pp(&cfg, 1, &pp, &m) == NB_ERR_INVALID && m == NULL &&
           strstr(nb_error_last(), "n_layer") != NULL;
  cfg = test_cfg();
  nb_model_pp_t bad = {5, 2, pp_allreduce, g_comm};
  ok = ok && nb_model_create_pp(&cfg, 1, &bad, &m) == NB_ERR_INVALID &&
       strstr(nb_error_last(), "stage") != NULL;
  nb_model_pp_t noar = {0, 2, NULL, NULL};
  ok = ok && nb_model_create_pp(&cfg, 1, &noar, &m) == NB_ERR_INVALID &&
       strstr(nb_error_last(), "allreduce") != NULL;
  agree(ok, "bad layouts refused");
  m = make_stage(&cfg, 3);
  agree(m != NULL, "nb_model_create_pp");
  int tok[32] = {0}, tgt[32] = {0};
  float loss;
  ok = nb_model_forward(m, tok, tgt, 1, 32, &loss) == NB_ERR_UNSUPPORTED &&
       nb_model_backward(m) == NB_ERR_UNSUPPORTED;
  int prompt[2] = {'a', 'b'}, out[4], n_out = 0;
  ok = ok && nb_model_generate_greedy(m, prompt, 2, 4, -1, out, &n_out) == NB_ERR_UNSUPPORTED;
  agree(ok, "a stage alone refuses forward, backward and decoding");
  nb_model_destroy(m);
}

/* The texts named on the command line, one after another. */
static uint8_t* read_all(char** paths, int n, size_t* len) {
  uint8_t* b = NULL;
  *len = 0;
  for (int i = 0; i < n; i++) {
    FILE* f = fopen(paths[i], "rb");
    if (!f) goto fail;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t* nb = k > 0 ? realloc(b, *len + (size_t)k) : NULL;
    if (!nb || fread(nb + *len, 1, (size_t)k, f) != (size_t)k) {
      b = nb ? nb : b;
      fclose(f);
      goto fail;
    }
    fclose(f);
    b = nb;
    *len += (size_t)k;
  }
  return b;
fail:
  free(b);
  *len = 0;
  return NULL;
}

int main(int argc, char** argv) {
  if (nb_intra_init(&argc, &argv) != NB_OK) return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (argc < 2 || (g_size != 2 && g_size != 4)) {
    if (g_rank == 0) fprintf(stderr, "usage: mpirun -np 2|4 %s TEXT...\n", argv[0]);
    nb_intra_finalize();
    return 2;
  }
  g_text = read_all(argv + 1, argc - 1, &g_text_len);
  if (!g_text || g_text_len < 4096) {
    fprintf(stderr, "cannot read the corpus (%s ...) or it is under 4 KiB\n", argv[1]);
    nb_comm_abort(NULL, 1);
  }
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.device = NB_COMM_DEVICE_CPU;
  if (nb_comm_create(&cfg, &g_comm) != NB_OK) nb_comm_abort(NULL, 1);
  g_pipe.ctx = g_comm;
  if (g_size == 4 && (nb_comm_split(g_comm, g_rank / 2, g_rank % 2, &g_stage_comm) != NB_OK ||
                      nb_comm_split(g_comm, g_rank % 2, g_rank / 2, &g_pipe_comm) != NB_OK))
    nb_comm_abort(NULL, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pp_matches_reference),    cmocka_unit_test(test_pp_trajectory),
      cmocka_unit_test(test_tp_pp_matches_reference), cmocka_unit_test(test_tp_pp_trajectory),
      cmocka_unit_test(test_pp_bad_layout),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  nb_comm_destroy(g_pipe_comm);
  nb_comm_destroy(g_stage_comm);
  nb_comm_destroy(g_comm);
  free(g_text);
  nb_intra_finalize();
  return rc;
}
