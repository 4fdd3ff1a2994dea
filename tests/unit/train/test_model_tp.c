/* Tensor parallelism of the built-in model (train/model.h) under mpirun: 2 ranks are one TP=2
 * group, 4 ranks are DP2 x TP2 (ranks 2d and 2d+1 form the tensor-parallel group of data-parallel
 * replica d). Every rank also builds the size-1 model of the same seed and trains it on the
 * whole batch of all replicas, so each rank checks its group against the unsharded reference:
 * the shard holds the reference's values, the first loss and the gathered gradients agree to
 * fp32 rounding, and 20 AdamW steps with clipping follow the same loss trajectory. It also
 * prints the per-rank parameter + optimizer memory against the unsharded model's. The arguments
 * are the texts to train on. Not a benchmark. */
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

/* fp32 tolerances, relative to the reference's magnitude. The shard sums the same products in
 * another order (partial sums over heads and hidden units, then the allreduce), so losses and
 * gradients differ in the last bits; 20 AdamW steps amplify that where a gradient is near zero
 * (the update is about lr whatever its size) but the loss stays within 1e-4. */
#define TOL_LOSS0 1e-6
#define TOL_GRAD 1e-4
#define TOL_TRAJ 1e-4
#define STEPS 20

static int g_rank, g_size, g_tp_rank, g_dp_rank, g_dp;
static MPI_Comm g_tp_mpi, g_dp_mpi;
static nb_comm_t *g_tp, *g_dp_comm;
static uint8_t* g_text;
static size_t g_text_len;

static void agree(int ok, const char* what) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) fail_msg("%s failed on some rank (this rank: %s)", what, ok ? "ok" : "FAILED");
}

static nb_status_t tp_allreduce(void* ctx, float* buf, size_t n) {
  return nb_comm_allreduce(ctx, buf, buf, n, NB_COMM_FP32, NB_COMM_SUM);
}

static nb_model_config_t test_cfg(void) {
  return nb_model_config_make(2, 64, 4, 32);
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

static nb_model_t* make_shard(const nb_model_config_t* cfg, uint64_t seed) {
  nb_model_tp_t tp = {g_tp_rank, 2, tp_allreduce, g_tp};
  nb_model_t* m = NULL;
  nb_status_t st = nb_model_create_tp(cfg, seed, &tp, &m);
  if (st != NB_OK) fprintf(stderr, "rank %d: %s\n", g_rank, nb_error_last());
  return m;
}

/* The shard holds the reference's values; the first loss and the gathered gradients agree. */
static void test_tp_matches_reference(void** state) {
  (void)state;
  nb_model_config_t cfg = test_cfg();
  nb_model_t *ref = NULL, *m = make_shard(&cfg, 7);
  assert_int_equal(nb_model_create(&cfg, 7, &ref), NB_OK);
  agree(m != NULL, "nb_model_create_tp");
  size_t nl, nr;
  float* p = nb_model_params(m, &nl);
  float* pr = nb_model_params(ref, &nr);
  assert_int_equal(nb_model_num_logical_params(m), nr);
  assert_int_equal(nb_model_tp_size(m), 2);
  assert_int_equal(nb_model_tp_rank(m), g_tp_rank);

  float* logical = malloc(nr * sizeof(float));
  float* local = malloc(nl * sizeof(float));
  assert_non_null(logical);
  assert_non_null(local);
  assert_int_equal(nb_model_tp_gather(m, p, logical), NB_OK);
  int same = memcmp(logical, pr, nr * sizeof(float)) == 0;
  nb_model_tp_scatter(m, pr, local);
  same = same && memcmp(local, p, nl * sizeof(float)) == 0;
  agree(same, "shard holds the size-1 model's bits (gather and scatter)");

  /* the segments cover the local arena once, in order */
  size_t ns, at = 0, sharded = 0;
  const nb_model_segment_t* seg = nb_model_segments(m, &ns);
  int cover = 1;
  for (size_t i = 0; i < ns; i++) {
    cover = cover && seg[i].local == at && seg[i].logical + seg[i].len <= nr;
    at += seg[i].len;
    if (seg[i].sharded) sharded += seg[i].len;
  }
  agree(cover && at == nl && sharded > 0, "segments cover the shard");

  int B = 4, T = cfg.ctx, R = B * g_dp;
  int *tok = malloc(sizeof(int) * (size_t)(R * T)), *tgt = malloc(sizeof(int) * (size_t)(R * T));
  assert_non_null(tok);
  assert_non_null(tgt);
  batch(0, 0, R, T, tok, tgt);
  float loss_ref, loss;
  nb_model_zero_grad(ref);
  assert_int_equal(nb_model_forward(ref, tok, tgt, R, T, &loss_ref), NB_OK);
  assert_int_equal(nb_model_backward(ref), NB_OK);
  nb_model_zero_grad(m);
  int off = g_dp_rank * B * T;
  assert_int_equal(nb_model_forward(m, tok + off, tgt + off, B, T, &loss), NB_OK);
  assert_int_equal(nb_model_backward(m), NB_OK);
  float* g = nb_model_grads(m, &nl);
  if (g_dp > 1) {
    assert_int_equal(nb_comm_allreduce(g_dp_comm, g, g, nl, NB_COMM_FP32, NB_COMM_AVG), NB_OK);
    float l = loss;
    MPI_Allreduce(&l, &loss, 1, MPI_FLOAT, MPI_SUM, g_dp_mpi);
    loss /= (float)g_dp;
  }
  double dl = fabs((double)loss - loss_ref) / loss_ref;
  assert_int_equal(nb_model_tp_gather(m, g, logical), NB_OK);
  float* gr = nb_model_grads(ref, &nr);
  double dg = max_diff(logical, gr, nr) / max_abs(gr, nr);
  double norm_tp, norm_ref = nb_grad_norm(gr, nr);
  assert_int_equal(nb_model_tp_norm(m, g, &norm_tp), NB_OK);
  double dn = fabs(norm_tp - norm_ref) / norm_ref;
  if (g_rank == 0)
    printf("tp=2 dp=%d: loss %.7f vs %.7f (rel %.2e), grads max rel %.2e, norm rel %.2e\n", g_dp,
           loss, loss_ref, dl, dg, dn);
  agree(dl <= TOL_LOSS0, "first loss within fp32 tolerance");
  agree(dg <= TOL_GRAD, "gathered gradients within fp32 tolerance");
  agree(dn <= TOL_GRAD, "global gradient norm within fp32 tolerance");

  free(tok);
  free(tgt);
  free(local);
  free(logical);
  nb_model_destroy(m);
  nb_model_destroy(ref);
}

/* 20 AdamW steps with clipping (the shard clips by the group's norm) follow the reference. */
static void test_tp_trajectory(void** state) {
  (void)state;
  nb_model_config_t cfg = test_cfg();
  nb_model_t *ref = NULL, *m = make_shard(&cfg, 11);
  assert_int_equal(nb_model_create(&cfg, 11, &ref), NB_OK);
  agree(m != NULL, "nb_model_create_tp");
  size_t nl, nr;
  float* p = nb_model_params(m, &nl);
  float* g = nb_model_grads(m, &nl);
  float* pr = nb_model_params(ref, &nr);
  float* gr = nb_model_grads(ref, &nr);
  nb_adamw_config_t oc = nb_adamw_config_default();
  oc.lr = 3e-3f;
  oc.warmup_steps = 2;
  oc.total_steps = STEPS;
  oc.grad_clip = 0.5f; /* low enough that the first steps clip */
  nb_adamw_t *opt = NULL, *opt_ref = NULL;
  assert_int_equal(nb_adamw_create(&oc, nl, &opt), NB_OK);
  assert_int_equal(nb_adamw_create(&oc, nr, &opt_ref), NB_OK);

  int B = 4, T = cfg.ctx, R = B * g_dp;
  int *tok = malloc(sizeof(int) * (size_t)(R * T)), *tgt = malloc(sizeof(int) * (size_t)(R * T));
  assert_non_null(tok);
  assert_non_null(tgt);
  double worst = 0.0, first = 0.0, last = 0.0;
  int clipped = 0, ok = 1;
  for (int s = 0; s < STEPS && ok; s++) {
    batch(s, 0, R, T, tok, tgt);
    float loss_ref, loss;
    nb_model_zero_grad(ref);
    ok = ok && nb_model_forward(ref, tok, tgt, R, T, &loss_ref) == NB_OK;
    ok = ok && nb_model_backward(ref) == NB_OK;
    double norm_ref;
    ok = ok && nb_adamw_step(opt_ref, pr, gr, nb_model_decay_mask(ref), &norm_ref) == NB_OK;

    nb_model_zero_grad(m);
    int off = g_dp_rank * B * T;
    ok = ok && nb_model_forward(m, tok + off, tgt + off, B, T, &loss) == NB_OK;
    ok = ok && nb_model_backward(m) == NB_OK;
    if (g_dp > 1) {
      ok = ok && nb_comm_allreduce(g_dp_comm, g, g, nl, NB_COMM_FP32, NB_COMM_AVG) == NB_OK;
      float l = loss;
      MPI_Allreduce(&l, &loss, 1, MPI_FLOAT, MPI_SUM, g_dp_mpi);
      loss /= (float)g_dp;
    }
    double norm;
    ok = ok && nb_model_tp_norm(m, g, &norm) == NB_OK;
    ok = ok && nb_adamw_step_norm(opt, p, g, nb_model_decay_mask(m), norm) == NB_OK;
    if (norm_ref > oc.grad_clip) clipped++;
    double d = fabs((double)loss - loss_ref) / loss_ref;
    worst = fmax(worst, d);
    if (s == 0) first = loss_ref;
    last = loss_ref;
  }
  agree(ok, "20 steps");
  /* the replicas of a data-parallel grid still hold one model: rank 2d+t has the shard of
   * 2d'+t bit for bit */
  if (g_dp > 1) {
    float* other = malloc(nl * sizeof(float));
    assert_non_null(other);
    memcpy(other, p, nl * sizeof(float));
    MPI_Bcast(other, (int)nl, MPI_FLOAT, 0, g_dp_mpi);
    agree(memcmp(other, p, nl * sizeof(float)) == 0, "data-parallel replicas identical");
    free(other);
  }
  float* logical = malloc(nr * sizeof(float));
  assert_non_null(logical);
  assert_int_equal(nb_model_tp_gather(m, p, logical), NB_OK);
  double dp = max_diff(logical, pr, nr) / max_abs(pr, nr);
  if (g_rank == 0)
    printf(
        "tp=2 dp=%d: %d steps (%d clipped), loss %.4f -> %.4f, worst loss rel diff %.2e, "
        "final params max rel diff %.2e\n",
        g_dp, STEPS, clipped, first, last, worst, dp);
  agree(worst <= TOL_TRAJ, "loss trajectory within tolerance");
  agree(clipped > 0 && last < first, "clipping exercised and loss decreasing");

  /* per-rank parameter + optimizer memory: parameters, gradients and the two moments */
  size_t nopt;
  (void)nb_adamw_state(opt, &nopt);
  double mem = (double)(2 * nl + nopt) * sizeof(float), mem_ref = (double)(4 * nr) * sizeof(float);
  if (g_rank == 0)
    printf("tp=2 per-rank params+grads+adamw: %.0f KiB vs %.0f KiB unsharded (ratio %.3f)\n",
           mem / 1024, mem_ref / 1024, mem / mem_ref);
  agree(mem / mem_ref < 0.6, "per-rank memory about half");

  free(logical);
  free(tok);
  free(tgt);
  nb_adamw_destroy(opt);
  nb_adamw_destroy(opt_ref);
  nb_model_destroy(m);
  nb_model_destroy(ref);
}

/* Bad layouts are refused on every rank with the field named; nothing is created. */
static void test_tp_bad_layout(void** state) {
  (void)state;
  nb_model_config_t cfg = nb_model_config_make(2, 48, 3, 16); /* 3 heads over 2 ranks */
  nb_model_tp_t tp = {g_tp_rank, 2, tp_allreduce, g_tp};
  nb_model_t* m = (nb_model_t*)&tp;
  int ok = nb_model_create_tp(&cfg, 1, &tp, &m) == NB_ERR_INVALID && m == NULL &&
           strstr(nb_error_last(), "n_head") != NULL;
  agree(ok, "heads not divisible refused");
  cfg = test_cfg();
  nb_model_tp_t bad = {2, 2, tp_allreduce, g_tp};
  ok = nb_model_create_tp(&cfg, 1, &bad, &m) == NB_ERR_INVALID && m == NULL &&
       strstr(nb_error_last(), "rank") != NULL;
  nb_model_tp_t noar = {0, 2, NULL, NULL};
  ok = ok && nb_model_create_tp(&cfg, 1, &noar, &m) == NB_ERR_INVALID && m == NULL &&
       strstr(nb_error_last(), "allreduce") != NULL;
  agree(ok, "bad rank and missing allreduce refused");
  /* decoding needs the whole model */
  m = make_shard(&cfg, 3);
  agree(m != NULL, "nb_model_create_tp");
  int prompt[2] = {'a', 'b'}, out[4], n_out = 0;
  ok = nb_model_generate_greedy(m, prompt, 2, 4, -1, out, &n_out) == NB_ERR_UNSUPPORTED;
  agree(ok, "decoding a shard refused");
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
  g_tp_rank = g_rank % 2;
  g_dp_rank = g_rank / 2;
  g_dp = g_size / 2;
  MPI_Comm_split(MPI_COMM_WORLD, g_dp_rank, g_tp_rank, &g_tp_mpi);
  MPI_Comm_split(MPI_COMM_WORLD, g_tp_rank, g_dp_rank, &g_dp_mpi);
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.device = NB_COMM_DEVICE_CPU;
  cfg.mpi_comm = &g_tp_mpi;
  if (nb_comm_create(&cfg, &g_tp) != NB_OK) nb_comm_abort(NULL, 1);
  cfg.mpi_comm = &g_dp_mpi;
  if (nb_comm_create(&cfg, &g_dp_comm) != NB_OK) nb_comm_abort(NULL, 1);

  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tp_matches_reference),
      cmocka_unit_test(test_tp_trajectory),
      cmocka_unit_test(test_tp_bad_layout),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  nb_comm_destroy(g_dp_comm);
  nb_comm_destroy(g_tp);
  MPI_Comm_free(&g_dp_mpi);
  MPI_Comm_free(&g_tp_mpi);
  free(g_text);
  nb_intra_finalize();
  return rc;
}
