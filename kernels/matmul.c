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
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  nb_matmul_backward_weight_rows(dweight, dbias, dout, inp, N, C, OC, 0, OC);
}

void nb_matmul_backward_weight_rows(float* dweight, float* dbias, const float* dout,
                                    const float* inp, int N, int C, int OC, int o0, int o1) {
  if (o1 <= o0) return;
  if (dweight)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N, 1.0f, dout + o0, OC, inp, C,
                1.0f, dweight + (size_t)o0 * C, C);
  if (dbias) {
    for (int i = 0; i < N; i++) {
      const float* row = dout + (size_t)i * OC;
      for (int o = o0; o < o1; o++) dbias[o] += row[o];
    }
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
