/* Op tests: every kernels/ op's forward against a double-precision reference, and every backward
 * against finite differences of that reference (central differences in double). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "kernels/kernels.h"
#include "tests/unit/ops/nb_ref.h"
#include "train/rng.h"

typedef double (*loss_fn)(void* ctx);

static void fd_grad(loss_fn f, void* ctx, double* x, size_t n, double* g) {
  for (size_t i = 0; i < n; i++) {
    double save = x[i], h = 1e-6 * (fabs(save) > 1.0 ? fabs(save) : 1.0);
    x[i] = save + h;
    double lp = f(ctx);
    x[i] = save - h;
    double lm = f(ctx);
    x[i] = save;
    g[i] = (lp - lm) / (2 * h);
  }
}

static nb_rng_t rng;
static float* rand_f(size_t n, double sd) {
  float* p = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = (float)(sd * nb_rng_normal(&rng));
  return p;
}
static double* to_d(const float* p, size_t n) {
  double* d = malloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) d[i] = p[i];
  return d;
}
static float* zeros(size_t n) {
  return calloc(n, sizeof(float));
}
/* Every vector path of the CPU kernels (kernels/cpu_path.h); a test skips, by name, the ones
 * this CPU lacks. */
static const nb_cpu_path_t cpu_paths[] = {NB_CPU_PATH_PORTABLE, NB_CPU_PATH_AVX2,
                                          NB_CPU_PATH_AVX512};
static const char* const cpu_path_names[] = {"portable", "avx2", "avx512"};

static double dot_d(const double* a, const double* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* ---- matmul ---- */
typedef struct {
  double *inp, *w, *b, *lw, *out;
  int N, C, OC;
} mm_ctx;
static double mm_loss(void* p) {
  mm_ctx* c = p;
  ref_matmul(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
  return dot_d(c->out, c->lw, (size_t)c->N * c->OC);
}

static void test_matmul(void** state) {
  int N = 6, C = 7, OC = 5;
  float *inp = rand_f(N * C, 1), *w = rand_f(OC * C, 0.5), *b = rand_f(OC, 0.5);
  float *lw = rand_f(N * OC, 1), *out = zeros(N * OC);
  mm_ctx c = {to_d(inp, N * C),
              to_d(w, OC * C),
              to_d(b, OC),
              to_d(lw, N * OC),
              malloc(sizeof(double) * N * OC),
              N,
              C,
              OC};
  nb_matmul_forward(out, inp, w, b, N, C, OC);
  mm_loss(&c);
  assert_true(ref_compare("matmul forward", out, c.out, N * OC, 1e-6, 1e-5));
  float *dinp = zeros(N * C), *dw = zeros(OC * C), *db = zeros(OC);
  nb_matmul_backward(dinp, dw, db, lw, inp, w, N, C, OC);
  double* g = malloc(sizeof(double) * N * C * 2);
  fd_grad(mm_loss, &c, c.inp, N * C, g);
  assert_true(ref_compare("matmul dinp", dinp, g, N * C, 1e-5, 1e-4));
  fd_grad(mm_loss, &c, c.w, OC * C, g);
  assert_true(ref_compare("matmul dweight", dw, g, OC * C, 1e-5, 1e-4));
  fd_grad(mm_loss, &c, c.b, OC, g);
  assert_true(ref_compare("matmul dbias", db, g, OC, 1e-5, 1e-4));
  /* accumulation: a second backward doubles the gradient */
  nb_matmul_backward(dinp, NULL, NULL, lw, inp, w, N, C, OC);
  fd_grad(mm_loss, &c, c.inp, N * C, g);
  for (int i = 0; i < N * C; i++) g[i] *= 2;
  assert_true(ref_compare("matmul dinp accumulates", dinp, g, N * C, 1e-5, 1e-4));
  free(inp), free(w), free(b), free(lw), free(out), free(dinp), free(dw), free(db), free(g);
  free(c.inp), free(c.w), free(c.b), free(c.lw), free(c.out);
}

/* The backward's halves, as the model runs them over its pool: dinp written over NaN (nothing
 * read from it) by ranges of rows equals the accumulating backward from zero; dweight and dbias
 * from partial products over uneven ranges of N (the first accumulating, the rest written over
 * NaN, summed in order) equal the whole backward's to rounding. The BLAS thread control sets and
 * gives back the count before. */
static void test_matmul_weight_rows(void** state) {
  int N = 37, C = 19, OC = 23;
  float *inp = rand_f(N * C, 1), *lw = rand_f(N * OC, 1), *w = rand_f(OC * C, 0.5);
  float *dw = rand_f(OC * C, 0.1), *db = rand_f(OC, 0.1);
  float *dw2 = malloc(sizeof(float) * OC * C), *db2 = malloc(sizeof(float) * OC);
  float *dinp = calloc((size_t)N * C, sizeof(float)), *dinp2 = malloc(sizeof(float) * N * C);
  float *pw = malloc(sizeof(float) * 3 * OC * C), *pb = malloc(sizeof(float) * 3 * OC);
  memcpy(dw2, dw, sizeof(float) * OC * C);
  memcpy(db2, db, sizeof(float) * OC);
  for (int i = 0; i < N * C; i++) dinp2[i] = NAN;
  for (int i = 0; i < 3 * OC * C; i++) pw[i] = NAN;
  for (int i = 0; i < 3 * OC; i++) pb[i] = NAN;
  nb_matmul_backward(dinp, dw, db, lw, inp, w, N, C, OC);
  const int cut[] = {0, 1, 9, 30, N};
  for (int i = 0; i < 4; i++) {
    int r0 = cut[i], n = cut[i + 1] - cut[i];
    nb_matmul_backward_input(dinp2 + r0 * C, lw + r0 * OC, w, n, C, OC, 0);
    nb_matmul_backward_weight(i ? pw + (i - 1) * OC * C : dw2, i ? pb + (i - 1) * OC : db2,
                              lw + r0 * OC, inp + r0 * C, n, C, OC, i == 0);
  }
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < OC * C; i++) dw2[i] += pw[k * OC * C + i];
    for (int i = 0; i < OC; i++) db2[i] += pb[k * OC + i];
  }
  for (int i = 0; i < N * C; i++)
    assert_true(fabsf(dinp[i] - dinp2[i]) <= 1e-5f * (1 + fabsf(dinp[i])));
  for (int i = 0; i < OC * C; i++) assert_true(fabsf(dw[i] - dw2[i]) <= 1e-5f * (1 + fabsf(dw[i])));
  for (int i = 0; i < OC; i++) assert_true(fabsf(db[i] - db2[i]) <= 1e-5f * (1 + fabsf(db[i])));
  free(dinp), free(dinp2), free(pw), free(pb);
  int before = nb_matmul_cpu_threads(1);
  assert_true(before >= 0);
  if (before > 0) { /* OpenBLAS: the count was set, and restores */
    assert_int_equal(nb_matmul_cpu_threads(before), 1);
    assert_int_equal(nb_matmul_cpu_threads(before), before);
  }
  assert_int_equal(nb_matmul_cpu_threads(0), 0); /* nothing set */
  free(inp), free(lw), free(w), free(dw), free(db), free(dw2), free(db2);
}

/* ---- layernorm ---- */
typedef struct {
  double *inp, *w, *b, *lw, *out;
  int N, C;
} ln_ctx;
static double ln_loss(void* p) {
  ln_ctx* c = p;
  ref_layernorm(c->out, c->inp, c->w, c->b, c->N, c->C);
  return dot_d(c->out, c->lw, (size_t)c->N * c->C);
}

static void test_layernorm(void** state) {
  int N = 5, C = 12;
  float *inp = rand_f(N * C, 2), *w = rand_f(C, 1), *b = rand_f(C, 1), *lw = rand_f(N * C, 1);
  float *out = zeros(N * C), mean[5], rstd[5];
  ln_ctx c = {to_d(inp, N * C),
              to_d(w, C),
              to_d(b, C),
              to_d(lw, N * C),
              malloc(sizeof(double) * N * C),
              N,
              C};
  nb_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  ln_loss(&c);
  assert_true(ref_compare("layernorm forward", out, c.out, N * C, 1e-6, 1e-5));
  float *dinp = zeros(N * C), *dw = zeros(C), *db = zeros(C);
  nb_layernorm_backward(dinp, dw, db, lw, inp, w, mean, rstd, N, C);
  double* g = malloc(sizeof(double) * N * C);
  fd_grad(ln_loss, &c, c.inp, N * C, g);
  assert_true(ref_compare("layernorm dinp", dinp, g, N * C, 1e-4, 1e-3));
  fd_grad(ln_loss, &c, c.w, C, g);
  assert_true(ref_compare("layernorm dweight", dw, g, C, 1e-5, 1e-4));
  fd_grad(ln_loss, &c, c.b, C, g);
  assert_true(ref_compare("layernorm dbias", db, g, C, 1e-5, 1e-4));
  free(inp), free(w), free(b), free(lw), free(out), free(dinp), free(dw), free(db), free(g);
  free(c.inp), free(c.w), free(c.b), free(c.lw), free(c.out);
}

/* The residual add fused with the LayerNorm: the same bits as the add, then the LayerNorm. */
static void test_residual_layernorm(void** state) {
  (void)state;
  int N = 7, C = 96;
  float *x = rand_f(N * C, 5), *y = rand_f(N * C, 6), *w = rand_f(C, 7), *b = rand_f(C, 8);
  float *res = zeros(N * C), *out = zeros(N * C), *res2 = zeros(N * C), *out2 = zeros(N * C);
  float mean[7], rstd[7], mean2[7], rstd2[7];
  nb_residual_layernorm_forward(res, out, mean, rstd, x, y, w, b, N, C);
  for (int i = 0; i < N * C; i++) res2[i] = x[i] + y[i];
  nb_layernorm_forward(out2, mean2, rstd2, res2, w, b, N, C);
  assert_memory_equal(res, res2, sizeof(float) * N * C);
  assert_memory_equal(out, out2, sizeof(float) * N * C);
  assert_memory_equal(mean, mean2, sizeof mean);
  assert_memory_equal(rstd, rstd2, sizeof rstd);
  free(x), free(y), free(w), free(b), free(res), free(out), free(res2), free(out2);
}

/* ---- gelu ---- */
typedef struct {
  double *inp, *lw, *out;
  size_t n;
} ge_ctx;
static double ge_loss(void* p) {
  ge_ctx* c = p;
  ref_gelu(c->out, c->inp, c->n);
  return dot_d(c->out, c->lw, c->n);
}

static void test_gelu(void** state) {
  size_t n = 64;
  float *inp = rand_f(n, 2.5), *lw = rand_f(n, 1), *out = zeros(n), *dinp = zeros(n);
  ge_ctx c = {to_d(inp, n), to_d(lw, n), malloc(sizeof(double) * n), n};
  nb_gelu_forward(out, inp, n);
  ge_loss(&c);
  assert_true(ref_compare("gelu forward", out, c.out, n, 1e-6, 1e-5));
  nb_gelu_backward(dinp, inp, lw, n);
  double* g = malloc(sizeof(double) * n);
  fd_grad(ge_loss, &c, c.inp, n, g);
  assert_true(ref_compare("gelu dinp", dinp, g, n, 1e-5, 1e-4));
  free(inp), free(lw), free(out), free(dinp), free(g), free(c.inp), free(c.lw), free(c.out);
}

/* gelu'(x) of the tanh form, in double. */
static double ref_gelu_grad(double x) {
  double k = 0.7978845608028654, u = k * (x + 0.044715 * x * x * x), t = tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

/* Every vector path, including the tails past the last whole vector and inputs where exp
 * saturates (|x| up to 60), alone and fused with the bias: forward against ref_gelu, backward
 * against the analytic derivative, the bias gradient against column sums in double. */
static void test_gelu_paths(void** state) {
  int rows = 7, cols = 45;
  size_t n = (size_t)rows * cols;
  float *inp = rand_f(n, 3), *dy = rand_f(n, 1), *bias = rand_f((size_t)cols, 0.5);
  inp[0] = 60.0f, inp[1] = -60.0f, inp[2] = 12.0f, inp[3] = -12.0f, inp[4] = 0.0f;
  double *ref = malloc(sizeof(double) * n), *gref = malloc(sizeof(double) * n);
  double *pd = malloc(sizeof(double) * n), *dbref = calloc((size_t)cols, sizeof(double));
  float *out = zeros(n), *din = malloc(sizeof(float) * n), *pre = malloc(sizeof(float) * n);
  float *dbias = malloc(sizeof(float) * cols), *gpre = malloc(sizeof(float) * n);
  for (size_t p = 0; p < sizeof cpu_paths / sizeof cpu_paths[0]; p++) {
    if (!nb_cpu_path_supported(cpu_paths[p])) {
      printf("  %s: not on this CPU, skipped\n", cpu_path_names[p]);
      continue;
    }
    char what[64];
    double* x = to_d(inp, n);
    ref_gelu(ref, x, n);
    nb_gelu_forward_path(out, inp, n, cpu_paths[p]);
    snprintf(what, sizeof what, "%s gelu forward", cpu_path_names[p]);
    assert_true(ref_compare(what, out, ref, n, 1e-6, 1e-5));
    /* accumulating: start from 1 */
    for (size_t i = 0; i < n; i++) din[i] = 1.0f, gref[i] = 1.0 + ref_gelu_grad(x[i]) * dy[i];
    nb_gelu_backward_path(din, inp, dy, n, cpu_paths[p]);
    snprintf(what, sizeof what, "%s gelu dinp", cpu_path_names[p]);
    assert_true(ref_compare(what, din, gref, n, 1e-6, 1e-5));
    free(x);

    memcpy(pre, inp, sizeof(float) * n);
    nb_gelu_bias_forward(out, pre, bias, rows, cols, cpu_paths[p]);
    for (size_t i = 0; i < n; i++) {
      assert_true(pre[i] == inp[i] + bias[i % cols]);
      pd[i] = pre[i];
    }
    ref_gelu(ref, pd, n);
    snprintf(what, sizeof what, "%s bias+gelu forward", cpu_path_names[p]);
    assert_true(ref_compare(what, out, ref, n, 1e-6, 1e-5));
    for (int c = 0; c < cols; c++) dbref[c] = 0;
    for (size_t i = 0; i < n; i++) {
      gpre[i] = -7.0f; /* written, not accumulated */
      gref[i] = ref_gelu_grad(pd[i]) * dy[i];
      dbref[i % cols] += gref[i];
    }
    nb_gelu_bias_backward(gpre, dbias, pre, dy, rows, cols, cpu_paths[p]);
    snprintf(what, sizeof what, "%s bias+gelu dpre", cpu_path_names[p]);
    assert_true(ref_compare(what, gpre, gref, n, 1e-6, 1e-5));
    snprintf(what, sizeof what, "%s bias+gelu dbias", cpu_path_names[p]);
    assert_true(ref_compare(what, dbias, dbref, (size_t)cols, 1e-6, 1e-5));
  }
  free(inp), free(dy), free(bias), free(ref), free(gref), free(pd), free(dbref);
  free(out), free(din), free(pre), free(dbias), free(gpre);
}

/* ---- attention ---- */
typedef struct {
  double *qkv, *lw, *out;
  int B, T, C, NH;
} at_ctx;
static double at_loss(void* p) {
  at_ctx* c = p;
  ref_attention(c->out, c->qkv, c->B, c->T, c->C, c->NH);
  return dot_d(c->out, c->lw, (size_t)c->B * c->T * c->C);
}

static void test_attention(void** state) {
  int B = 2, T = 7, C = 12, NH = 3;
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
  float *qkv = rand_f(nq, 1), *lw = rand_f(no, 1), *out = zeros(no);
  float *att = zeros((size_t)B * NH * T * T), *dqkv = zeros(nq), *scratch = zeros((size_t)T * T);
  at_ctx c = {to_d(qkv, nq), to_d(lw, no), malloc(sizeof(double) * no), B, T, C, NH};
  nb_attention_forward(out, att, qkv, B, T, C, NH);
  at_loss(&c);
  assert_true(ref_compare("attention forward", out, c.out, no, 1e-6, 1e-5));
  /* causality: probabilities above the diagonal are exactly zero, rows sum to one */
  for (int r = 0; r < B * NH * T; r++) {
    int i = r % T;
    double s = 0;
    for (int j = 0; j < T; j++) {
      if (j > i) assert_true(att[(size_t)r * T + j] == 0.0f);
      s += att[(size_t)r * T + j];
    }
    assert_true(fabs(s - 1.0) < 1e-5);
  }
  nb_attention_backward(dqkv, scratch, lw, qkv, att, B, T, C, NH);
  double* g = malloc(sizeof(double) * nq);
  fd_grad(at_loss, &c, c.qkv, nq, g);
  assert_true(ref_compare("attention dqkv", dqkv, g, nq, 1e-4, 1e-3));
  free(qkv), free(lw), free(out), free(att), free(dqkv), free(scratch), free(g);
  free(c.qkv), free(c.lw), free(c.out);
}

/* Long sequences cross the kernel's query-block boundary (64): forward in full, the backward on a
 * seeded sample of 400 elements of qkv. */
static void test_attention_blocks(void** state) {
  int B = 1, T = 150, C = 8, NH = 2;
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
  float *qkv = rand_f(nq, 1), *lw = rand_f(no, 1), *out = zeros(no);
  float *att = zeros((size_t)B * NH * T * T), *dqkv = zeros(nq), *scratch = zeros((size_t)T * T);
  at_ctx c = {to_d(qkv, nq), to_d(lw, no), malloc(sizeof(double) * no), B, T, C, NH};
  nb_attention_forward(out, att, qkv, B, T, C, NH);
  at_loss(&c);
  assert_true(ref_compare("attention T=150 forward", out, c.out, no, 1e-6, 1e-5));
  nb_attention_backward(dqkv, scratch, lw, qkv, att, B, T, C, NH);
  enum { S = 400 };
  float got[S];
  double ref[S];
  for (int s = 0; s < S; s++) {
    size_t i = (size_t)nb_rng_below(&rng, nq);
    double save = c.qkv[i], h = 1e-6;
    c.qkv[i] = save + h;
    double lp = at_loss(&c);
    c.qkv[i] = save - h;
    double lm = at_loss(&c);
    c.qkv[i] = save;
    ref[s] = (lp - lm) / (2 * h);
    got[s] = dqkv[i];
  }
  assert_true(ref_compare("attention T=150 dqkv (sample)", got, ref, S, 1e-4, 1e-3));
  free(qkv), free(lw), free(out), free(att), free(dqkv), free(scratch);
  free(c.qkv), free(c.lw), free(c.out);
}

/* ---- blocked attention ---- */

/* The double reference's analytic backward against finite differences of its forward, so that
 * the blocked kernel can be checked against it at shapes finite differences cannot reach. */
static void test_attention_ref_backward(void** state) {
  int B = 2, T = 6, C = 8, NH = 2;
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
  float *qkv = rand_f(nq, 1), *lw = rand_f(no, 1);
  at_ctx c = {to_d(qkv, nq), to_d(lw, no), malloc(sizeof(double) * no), B, T, C, NH};
  double *g = malloc(sizeof(double) * nq), *ga = malloc(sizeof(double) * nq);
  float* gaf = malloc(sizeof(float) * nq);
  fd_grad(at_loss, &c, c.qkv, nq, g);
  ref_attention_backward(ga, NULL, c.lw, c.qkv, B, T, C, NH);
  for (size_t i = 0; i < nq; i++) gaf[i] = (float)ga[i];
  assert_true(ref_compare("ref attention backward vs fd", gaf, g, nq, 1e-6, 1e-5));
  free(qkv), free(lw), free(g), free(ga), free(gaf), free(c.qkv), free(c.lw), free(c.out);
}

/* One shape on one path: out and lse against the double forward, the accumulated dqkv against
 * the double backward. The (batch, head) range is split in two calls, as the model's threads do. */
static int check_blocked(int B, int T, int C, int NH, nb_cpu_path_t path, const char* pname) {
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
  float *qkv = rand_f(nq, 1.5), *dy = rand_f(no, 1), *base = rand_f(nq, 1);
  float *out = zeros(no), *lse = zeros(nl), *dqkv = malloc(sizeof(float) * nq);
  memcpy(dqkv, base, sizeof(float) * nq);
  /* NaN-filled scratch: nothing may depend on what the buffer held before */
  size_t ns = nb_attention_blocked_scratch(T, C, NH);
  float* scratch = malloc(sizeof(float) * ns);
  for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
  double *qd = to_d(qkv, nq), *dyd = to_d(dy, no), *outd = malloc(sizeof(double) * no);
  double *gd = malloc(sizeof(double) * nq), *lsed = malloc(sizeof(double) * nl);
  ref_attention(outd, qd, B, T, C, NH);
  ref_attention_backward(gd, lsed, dyd, qd, B, T, C, NH);
  for (size_t i = 0; i < nq; i++) gd[i] += base[i];
  int BH = B * NH, mid = BH / 2;
  nb_attention_blocked_forward(out, lse, qkv, B, T, C, NH, 0, mid, scratch, path);
  nb_attention_blocked_forward(out, lse, qkv, B, T, C, NH, mid, BH, scratch, path);
  nb_attention_blocked_backward(dqkv, dy, out, lse, qkv, B, T, C, NH, mid, BH, scratch, path, 1);
  nb_attention_blocked_backward(dqkv, dy, out, lse, qkv, B, T, C, NH, 0, mid, scratch, path, 1);
  /* written, not accumulated: over a NaN-filled buffer, the gradient alone */
  float* dw = malloc(sizeof(float) * nq);
  for (size_t i = 0; i < nq; i++) dw[i] = NAN;
  nb_attention_blocked_backward(dw, dy, out, lse, qkv, B, T, C, NH, 0, mid, scratch, path, 0);
  nb_attention_blocked_backward(dw, dy, out, lse, qkv, B, T, C, NH, mid, BH, scratch, path, 0);
  for (size_t i = 0; i < nq; i++) dw[i] += base[i];
  char what[4][64];
  snprintf(what[0], sizeof what[0], "%s B%d T%d C%d NH%d out", pname, B, T, C, NH);
  snprintf(what[1], sizeof what[1], "%s lse", pname);
  snprintf(what[2], sizeof what[2], "%s dqkv", pname);
  int ok = ref_compare(what[0], out, outd, no, 2e-6, 2e-5);
  ok &= ref_compare(what[1], lse, lsed, nl, 2e-6, 2e-5);
  ok &= ref_compare(what[2], dqkv, gd, nq, 2e-5, 2e-4);
  snprintf(what[3], sizeof what[3], "%s dqkv written", pname);
  ok &= ref_compare(what[3], dw, gd, nq, 2e-5, 2e-4);
  free(dw);
  free(qkv), free(dy), free(base), free(out), free(lse), free(dqkv), free(scratch);
  free(qd), free(dyd), free(outd), free(gd), free(lsed);
  return ok;
}

/* Shapes: T = 1, T inside one block, on a block edge and past it (the query block meets a
 * partial diagonal block), head sizes under, at and off the vector widths. Every vector path the
 * CPU has; the ones it lacks are named and skipped. */
static void test_attention_blocked(void** state) {
  static const int shapes[][4] = {{1, 1, 8, 2},    {2, 7, 12, 3},   {1, 64, 128, 2},
                                  {2, 150, 48, 3}, {1, 129, 40, 1}, {1, 200, 192, 3}};
  for (size_t p = 0; p < sizeof cpu_paths / sizeof cpu_paths[0]; p++) {
    if (!nb_cpu_path_supported(cpu_paths[p])) {
      printf("  %s: not on this CPU, skipped\n", cpu_path_names[p]);
      continue;
    }
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      assert_true(check_blocked(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                                cpu_paths[p], cpu_path_names[p]));
  }
  printf("  auto resolves to %s\n", nb_cpu_path_name(NB_CPU_PATH_AUTO));
}

/* Large scores: the online softmax's running max keeps exp in range where a naive one overflows. */
static void test_attention_blocked_large_scores(void** state) {
  for (size_t p = 0; p < sizeof cpu_paths / sizeof cpu_paths[0]; p++)
    if (nb_cpu_path_supported(cpu_paths[p])) {
      int B = 1, T = 100, C = 16, NH = 1;
      size_t nq = (size_t)B * T * 3 * C;
      float* qkv = rand_f(nq, 12.0); /* scores of order 12^2 * 4 = 576 */
      float *out = zeros((size_t)T * C), *lse = zeros(T);
      float* scratch = malloc(sizeof(float) * nb_attention_blocked_scratch(T, C, NH));
      double *qd = to_d(qkv, nq), *outd = malloc(sizeof(double) * T * C);
      ref_attention(outd, qd, B, T, C, NH);
      nb_attention_blocked_forward(out, lse, qkv, B, T, C, NH, 0, 1, scratch, cpu_paths[p]);
      assert_true(ref_compare(cpu_path_names[p], out, outd, (size_t)T * C, 1e-4, 1e-3));
      free(qkv), free(out), free(lse), free(scratch), free(qd), free(outd);
    }
}

/* ---- cross-entropy and KL ---- */
typedef struct {
  double *logits, *teacher;
  const int* targets;
  int N, V;
  double T;
} ce_ctx;
static double ce_loss(void* p) {
  ce_ctx* c = p;
  return ref_crossentropy(c->logits, c->targets, c->N, c->V);
}
static double kl_loss(void* p) {
  ce_ctx* c = p;
  return ref_kl(c->logits, c->teacher, c->targets, c->N, c->V, c->T);
}

static void test_crossentropy(void** state) {
  int N = 5, V = 11;
  int targets[5] = {3, -1, 0, 10, 7};
  float *logits = rand_f(N * V, 2), *probs = zeros(N * V), losses[5], *dl = zeros(N * V);
  ce_ctx c = {to_d(logits, N * V), NULL, targets, N, V, 1.0};
  int count = nb_crossentropy_forward(losses, probs, logits, targets, N, V);
  assert_int_equal(count, 4);
  assert_true(losses[1] == 0.0f);
  double s = 0;
  for (int i = 0; i < N; i++) s += losses[i];
  double ref = ce_loss(&c);
  printf("  cross-entropy mean %.7f ref %.7f\n", s / count, ref);
  assert_true(fabs(s / count - ref) < 1e-5);
  nb_crossentropy_backward(dl, probs, targets, 1.0f / count, N, V);
  double* g = malloc(sizeof(double) * N * V);
  fd_grad(ce_loss, &c, c.logits, N * V, g);
  assert_true(ref_compare("cross-entropy dlogits", dl, g, N * V, 1e-5, 1e-4));
  for (int j = 0; j < V; j++) assert_true(dl[V + j] == 0.0f); /* ignored row */

  /* KL(teacher || student) at temperature 2 */
  float *teacher = rand_f(N * V, 2), *ps = zeros(N * V), *pt = zeros(N * V), kl[5];
  float* dk = zeros(N * V);
  c.teacher = to_d(teacher, N * V);
  c.T = 2.0;
  nb_kldiv_forward(kl, ps, pt, logits, teacher, targets, N, V, 2.0f);
  s = 0;
  for (int i = 0; i < N; i++) s += kl[i];
  ref = kl_loss(&c);
  printf("  KL sum %.7f ref %.7f\n", s, ref);
  assert_true(fabs(s - ref) < 1e-5 * (1 + fabs(ref)));
  nb_kldiv_backward(dk, ps, pt, targets, 1.0f, N, V, 2.0f);
  fd_grad(kl_loss, &c, c.logits, N * V, g);
  assert_true(ref_compare("KL dstudent", dk, g, N * V, 1e-5, 1e-4));
  /* KL of a distribution with itself is zero */
  nb_kldiv_forward(kl, ps, pt, logits, logits, NULL, N, V, 2.0f);
  for (int i = 0; i < N; i++) assert_true(fabsf(kl[i]) < 1e-5f);
  free(logits), free(probs), free(dl), free(g), free(c.logits), free(teacher), free(ps), free(pt);
  free(dk), free(c.teacher);
}

/* ---- embedding ---- */
typedef struct {
  double *wte, *wpe, *lw, *out;
  const int* tok;
  int B, T, C;
} em_ctx;
static double em_loss(void* p) {
  em_ctx* c = p;
  ref_embedding(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
  return dot_d(c->out, c->lw, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void** state) {
  int B = 2, T = 4, C = 6, V = 9;
  int tok[8] = {1, 8, 1, 0, 5, 5, 5, 2}; /* repeats: scatter-add must accumulate */
  size_t no = (size_t)B * T * C;
  float *wte = rand_f(V * C, 1), *wpe = rand_f(T * C, 1), *lw = rand_f(no, 1), *out = zeros(no);
  float *dwte = zeros(V * C), *dwpe = zeros(T * C);
  em_ctx c = {
      to_d(wte, V * C), to_d(wpe, T * C), to_d(lw, no), malloc(sizeof(double) * no), tok, B, T, C};
  nb_embedding_forward(out, tok, wte, wpe, B, T, C);
  em_loss(&c);
  assert_true(ref_compare("embedding forward", out, c.out, no, 1e-7, 1e-6));
  nb_embedding_backward(dwte, dwpe, lw, tok, B, T, C);
  double* g = malloc(sizeof(double) * V * C);
  fd_grad(em_loss, &c, c.wte, V * C, g);
  assert_true(ref_compare("embedding dwte", dwte, g, V * C, 1e-5, 1e-4));
  fd_grad(em_loss, &c, c.wpe, T * C, g);
  assert_true(ref_compare("embedding dwpe", dwpe, g, T * C, 1e-5, 1e-4));
  free(wte), free(wpe), free(lw), free(out), free(dwte), free(dwpe), free(g);
  free(c.wte), free(c.wpe), free(c.lw), free(c.out);
}

/* ---- AdamW: three steps against the formula in double ---- */
static void test_adamw(void** state) {
  size_t n = 33;
  float *p = rand_f(n, 1), *m = zeros(n), *v = zeros(n);
  double *pd = to_d(p, n), *md = calloc(n, sizeof(double)), *vd = calloc(n, sizeof(double));
  double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, lr = 1e-2;
  for (long t = 1; t <= 3; t++) {
    float* g = rand_f(n, 1);
    nb_adamw_update(p, g, m, v, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, t);
    for (size_t i = 0; i < n; i++) {
      md[i] = b1 * md[i] + (1 - b1) * g[i];
      vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
      double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
      pd[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pd[i]);
    }
    free(g);
  }
  assert_true(ref_compare("adamw params after 3 steps", p, pd, n, 1e-6, 1e-5));
  free(p), free(m), free(v), free(pd), free(md), free(vd);
}

/* Every vector path of AdamW gives the portable loop's bits (odd n: the tail too). */
static void test_adamw_paths(void** state) {
  size_t n = 1000 + 37;
  float* p0 = rand_f(n, 1);
  nb_cpu_path_t paths[2] = {NB_CPU_PATH_AVX2, NB_CPU_PATH_AVX512};
  for (int k = 0; k < 2; k++) {
    if (!nb_cpu_path_supported(paths[k])) continue;
    float *pa = malloc(n * sizeof(float)), *pb = malloc(n * sizeof(float));
    float *ma = zeros(n), *va = zeros(n), *mb = zeros(n), *vb = zeros(n);
    memcpy(pa, p0, n * sizeof(float));
    memcpy(pb, p0, n * sizeof(float));
    for (long t = 1; t <= 3; t++) {
      float* g = rand_f(n, 1);
      nb_adamw_update_path(pa, g, ma, va, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                           NB_CPU_PATH_PORTABLE);
      nb_adamw_update_path(pb, g, mb, vb, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, paths[k]);
      free(g);
    }
    assert_memory_equal(pa, pb, n * sizeof(float));
    assert_memory_equal(ma, mb, n * sizeof(float));
    assert_memory_equal(va, vb, n * sizeof(float));
    free(pa), free(pb), free(ma), free(va), free(mb), free(vb);
  }
  free(p0);
}

int main(void) {
  nb_rng_seed(&rng, 1234);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_matmul_weight_rows),
      cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_residual_layernorm),
      cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_gelu_paths),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_attention_blocks),
      cmocka_unit_test(test_attention_ref_backward),
      cmocka_unit_test(test_attention_blocked),
      cmocka_unit_test(test_attention_blocked_large_scores),
      cmocka_unit_test(test_crossentropy),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_adamw_paths),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
