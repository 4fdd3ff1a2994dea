/* CPU reference for the dense layer: every product goes through cblas_sgemm; only the bias
 * broadcast and its column sums are plain loops. No blocking of our own: OpenBLAS does that. */
#include "kernels/matmul.h"

#include <cblas.h>
#include <string.h>

void nb_matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC) {
  float beta = 0.0f;
  if (bias) {
    for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof(float));
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out,
              OC);
}

void nb_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC) {
  if (dinp) nb_matmul_backward_input(dinp, dout, weight, N, C, OC, 1);
  nb_matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC, 1);
}

void nb_matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                              int OC, int accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
              accumulate ? 1.0f : 0.0f, dinp, C);
}

/* db[o] += dout[i][o] over the rows, in row order (restrict: a loop the compiler vectorises). */
static void nb__bias_sums(float* restrict db, const float* restrict dout, int N, int OC) {
  for (int i = 0; i < N; i++) {
    const float* restrict row = dout + (size_t)i * OC;
    for (int o = 0; o < OC; o++) db[o] += row[o];
  }
}

void nb_matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               int N, int C, int OC, int accumulate) {
  if (dweight)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                accumulate ? 1.0f : 0.0f, dweight, C);
  if (dbias) {
    if (!accumulate) memset(dbias, 0, (size_t)OC * sizeof(float));
    nb__bias_sums(dbias, dout, N, OC);
  }
}

/* Weak, so that a build against another CBLAS still links (then no thread control). */
extern void openblas_set_num_threads(int n) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));

int nb_matmul_cpu_threads(int n) {
  if (!openblas_set_num_threads || !openblas_get_num_threads || n < 1) return 0;
  int before = openblas_get_num_threads();
  if (before != n) openblas_set_num_threads(n);
  return before > 0 ? before : 0;
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_matmul_forward_cuda(float* d_out, const float* d_inp, const float* d_weight,
                                   const float* d_bias, int N, int C, int OC, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "matmul: built without CUDA");
}
nb_status_t nb_matmul_backward_cuda(float* d_dinp, float* d_dweight, float* d_dbias,
                                    const float* d_dout, const float* d_inp, const float* d_weight,
                                    int N, int C, int OC, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "matmul: built without CUDA");
}
#endif
