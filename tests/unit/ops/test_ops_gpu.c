/* CUDA kernels against the CPU references: each op run on both with the same inputs; results
 * must agree within 1e-4 of the reference's largest magnitude (1e-3 for the attention backward,
 * whose sums run in a different order). Exits 77 (skip) without a device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "train/rng.h"

static nb_rng_t rng;

static float* rnd(size_t n, double sd) {
  float* p = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = (float)(sd * nb_rng_normal(&rng));
  return p;
}
static void* up(const void* h, size_t bytes) {
  void* d = NULL;
  assert_int_equal(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess);
  if (bytes) assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
static float* down(const float* d, size_t n) {
  float* h = malloc(n * sizeof(float));
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
static float* dz(size_t n) {
  float* z = calloc(n, sizeof(float));
  float* d = up(z, n * sizeof(float));
  free(z);
  return d;
}
/* Compares device buffer d with host reference h; prints the worst element. */
static void cmp(const char* what, const float* d, const float* h, size_t n, double tol) {
  float* g = down(d, n);
  double mx = 0, worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(h[i]));
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)g[i] - h[i]);
    if (!(e <= worst)) worst = e, wi = i;
  }
  printf("  %-24s n=%-7zu max|ref|=%.3e worst [%zu] gpu %.7e cpu %.7e\n", what, n, mx, wi, g[wi],
         h[wi]);
  assert_true(worst <= tol * (mx > 1e-30 ? mx : 1.0));
  free(g);
}

static void test_matmul_gpu(void** s) {
  int N = 64, C = 48, OC = 80;
  float *x = rnd(N * C, 1), *w = rnd(OC * C, 0.3), *b = rnd(OC, 0.3), *dy = rnd(N * OC, 1);
  float *y = calloc(N * OC, 4), *dx = calloc(N * C, 4), *dw = calloc(OC * C, 4),
        *db = calloc(OC, 4);
  nb_matmul_forward(y, x, w, b, N, C, OC);
  nb_matmul_backward(dx, dw, db, dy, x, w, N, C, OC);
  float *d_x = up(x, N * C * 4), *d_w = up(w, OC * C * 4), *d_b = up(b, OC * 4),
        *d_dy = up(dy, N * OC * 4);
  float *d_y = dz(N * OC), *d_dx = dz(N * C), *d_dw = dz(OC * C), *d_db = dz(OC);
  assert_int_equal(nb_matmul_forward_cuda(d_y, d_x, d_w, d_b, N, C, OC, NULL), NB_OK);
  assert_int_equal(nb_matmul_backward_cuda(d_dx, d_dw, d_db, d_dy, d_x, d_w, N, C, OC, NULL),
                   NB_OK);
  cmp("matmul forward", d_y, y, N * OC, 1e-4);
  cmp("matmul dinp", d_dx, dx, N * C, 1e-4);
  cmp("matmul dweight", d_dw, dw, OC * C, 1e-4);
  cmp("matmul dbias", d_db, db, OC, 1e-4);
  cudaFree(d_x), cudaFree(d_w), cudaFree(d_b), cudaFree(d_dy), cudaFree(d_y), cudaFree(d_dx);
  cudaFree(d_dw), cudaFree(d_db);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
}

static void test_layernorm_gelu_gpu(void** s) {
  int N = 50, C = 96;
  float *x = rnd(N * C, 2), *w = rnd(C, 1), *b = rnd(C, 1), *dy = rnd(N * C, 1);
  float *y = calloc(N * C, 4), *mean = calloc(N, 4), *rstd = calloc(N, 4);
  float *dx = calloc(N * C, 4), *dw = calloc(C, 4), *db = calloc(C, 4);
  nb_layernorm_forward(y, mean, rstd, x, w, b, N, C);
  nb_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
  float *d_x = up(x, N * C * 4), *d_w = up(w, C * 4), *d_b = up(b, C * 4),
        *d_dy = up(dy, N * C * 4);
  float *d_y = dz(N * C), *d_m = dz(N), *d_r = dz(N), *d_dx = dz(N * C), *d_dw = dz(C),
        *d_db = dz(C);
  assert_int_equal(nb_layernorm_forward_cuda(d_y, d_m, d_r, d_x, d_w, d_b, N, C, NULL), NB_OK);
  assert_int_equal(
      nb_layernorm_backward_cuda(d_dx, d_dw, d_db, d_dy, d_x, d_w, d_m, d_r, N, C, NULL), NB_OK);
  cmp("layernorm forward", d_y, y, N * C, 1e-4);
  cmp("layernorm rstd", d_r, rstd, N, 1e-4);
  cmp("layernorm dinp", d_dx, dx, N * C, 1e-4);
  cmp("layernorm dweight", d_dw, dw, C, 1e-4);
  cmp("layernorm dbias", d_db, db, C, 1e-4);
  /* gelu on the same buffers */
  float *g = calloc(N * C, 4), *dg = calloc(N * C, 4);
  nb_gelu_forward(g, x, (size_t)N * C);
  nb_gelu_backward(dg, x, dy, (size_t)N * C);
  float *d_g = dz(N * C), *d_dg = dz(N * C);
  assert_int_equal(nb_gelu_forward_cuda(d_g, d_x, (size_t)N * C, NULL), NB_OK);
  assert_int_equal(nb_gelu_backward_cuda(d_dg, d_x, d_dy, (size_t)N * C, NULL), NB_OK);
  cmp("gelu forward", d_g, g, N * C, 1e-5);
  cmp("gelu backward", d_dg, dg, N * C, 1e-5);
  cudaFree(d_x), cudaFree(d_w), cudaFree(d_b), cudaFree(d_dy), cudaFree(d_y), cudaFree(d_m);
  cudaFree(d_r), cudaFree(d_dx), cudaFree(d_dw), cudaFree(d_db), cudaFree(d_g), cudaFree(d_dg);
  free(x), free(w), free(b), free(dy), free(y), free(mean), free(rstd), free(dx), free(dw),
      free(db);
  free(g), free(dg);
}

static void test_attention_gpu(void** s) {
  int B = 2, T = 33, C = 64, NH = 4;
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
  float *qkv = rnd(nq, 1), *dy = rnd(no, 1), *y = calloc(no, 4), *att = calloc(na, 4);
  float *dqkv = calloc(nq, 4), *scratch = calloc((size_t)T * T, 4);
  nb_attention_forward(y, att, qkv, B, T, C, NH);
  nb_attention_backward(dqkv, scratch, dy, qkv, att, B, T, C, NH);
  float *d_qkv = up(qkv, nq * 4), *d_dy = up(dy, no * 4), *d_y = dz(no), *d_att = dz(na);
  float *d_dqkv = dz(nq), *d_s = dz(na);
  assert_int_equal(nb_attention_forward_cuda(d_y, d_att, d_qkv, B, T, C, NH, NULL), NB_OK);
  assert_int_equal(nb_attention_backward_cuda(d_dqkv, d_s, d_dy, d_qkv, d_att, B, T, C, NH, NULL),
                   NB_OK);
  cmp("attention forward", d_y, y, no, 1e-4);
  cmp("attention probabilities", d_att, att, na, 1e-4);
  cmp("attention dqkv", d_dqkv, dqkv, nq, 1e-3);
  cudaFree(d_qkv), cudaFree(d_dy), cudaFree(d_y), cudaFree(d_att), cudaFree(d_dqkv), cudaFree(d_s);
  free(qkv), free(dy), free(y), free(att), free(dqkv), free(scratch);
}

static void test_ce_embedding_adamw_gpu(void** s) {
  int N = 16, V = 259;
  int tgt[16];
  for (int i = 0; i < N; i++) tgt[i] = i == 3 ? -1 : (int)nb_rng_below(&rng, V);
  float *lg = rnd(N * V, 2), *pr = calloc(N * V, 4), *ls = calloc(N, 4), *dl = calloc(N * V, 4);
  nb_crossentropy_forward(ls, pr, lg, tgt, N, V);
  nb_crossentropy_backward(dl, pr, tgt, 0.25f, N, V);
  float *d_lg = up(lg, N * V * 4), *d_pr = dz(N * V), *d_ls = dz(N), *d_dl = dz(N * V);
  int* d_t = up(tgt, sizeof tgt);
  assert_int_equal(nb_crossentropy_forward_cuda(d_ls, d_pr, d_lg, d_t, N, V, NULL), NB_OK);
  assert_int_equal(nb_crossentropy_backward_cuda(d_dl, d_pr, d_t, 0.25f, N, V, NULL), NB_OK);
  cmp("crossentropy losses", d_ls, ls, N, 1e-5);
  cmp("crossentropy dlogits", d_dl, dl, N * V, 1e-5);

  int B = 2, T = 5, C = 24, Vs = 11;
  int tok[10] = {1, 1, 4, 10, 0, 3, 1, 7, 7, 2};
  float *wte = rnd(Vs * C, 1), *wpe = rnd(T * C, 1), *dy = rnd(B * T * C, 1);
  float *e = calloc(B * T * C, 4), *dwte = calloc(Vs * C, 4), *dwpe = calloc(T * C, 4);
  nb_embedding_forward(e, tok, wte, wpe, B, T, C);
  nb_embedding_backward(dwte, dwpe, dy, tok, B, T, C);
  float *d_wte = up(wte, Vs * C * 4), *d_wpe = up(wpe, T * C * 4), *d_dy = up(dy, B * T * C * 4);
  float *d_e = dz(B * T * C), *d_dwte = dz(Vs * C), *d_dwpe = dz(T * C);
  int* d_tok = up(tok, sizeof tok);
  assert_int_equal(nb_embedding_forward_cuda(d_e, d_tok, d_wte, d_wpe, B, T, C, NULL), NB_OK);
  assert_int_equal(nb_embedding_backward_cuda(d_dwte, d_dwpe, d_dy, d_tok, B, T, C, NULL), NB_OK);
  cmp("embedding forward", d_e, e, B * T * C, 1e-6);
  cmp("embedding dwte", d_dwte, dwte, Vs * C, 1e-5);
  cmp("embedding dwpe", d_dwpe, dwpe, T * C, 1e-5);

  size_t n = 1000;
  float *p = rnd(n, 1), *g = rnd(n, 1), *m = calloc(n, 4), *v = calloc(n, 4);
  float *d_p = up(p, n * 4), *d_g = up(g, n * 4), *d_m = dz(n), *d_v = dz(n);
  for (long t = 1; t <= 3; t++) {
    nb_adamw_update(p, g, m, v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    assert_int_equal(
        nb_adamw_update_cuda(d_p, d_g, d_m, d_v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, NULL),
        NB_OK);
  }
  cmp("adamw params", d_p, p, n, 1e-5);
  cmp("adamw second moment", d_v, v, n, 1e-5);
  cudaFree(d_lg), cudaFree(d_pr), cudaFree(d_ls), cudaFree(d_dl), cudaFree(d_t), cudaFree(d_wte);
  cudaFree(d_wpe), cudaFree(d_dy), cudaFree(d_e), cudaFree(d_dwte), cudaFree(d_dwpe),
      cudaFree(d_tok);
  cudaFree(d_p), cudaFree(d_g), cudaFree(d_m), cudaFree(d_v);
  free(lg), free(pr), free(ls), free(dl), free(wte), free(wpe), free(dy), free(e), free(dwte);
  free(dwpe), free(p), free(g), free(m), free(v);
}

int main(void) {
  if (nb_device_count() == 0) {
    printf("no CUDA device: skipped\n");
    return NB_TEST_SKIP_CODE;
  }
  nb_rng_seed(&rng, 77);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul_gpu),
      cmocka_unit_test(test_layernorm_gelu_gpu),
      cmocka_unit_test(test_attention_gpu),
      cmocka_unit_test(test_ce_embedding_adamw_gpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
