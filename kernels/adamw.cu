// CUDA AdamW, one thread per parameter; same formula and operation order as adamw.c.
#include "kernels/adamw.h"
#include "kernels/cuda_check.h"

__global__ static void nb__adamw(float* p, const float* g, float* m, float* v, size_t n, float lr,
                                 float b1, float b2, float eps, float wd, float bc1, float bc2) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gi = g[i];
  float mi = b1 * m[i] + (1.0f - b1) * gi;
  float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i]);
}

extern "C" nb_status_t nb_adamw_update_cuda(float* d_params, const float* d_grads, float* d_m,
                                            float* d_v, size_t n, float lr, float beta1,
                                            float beta2, float eps, float weight_decay, long t,
                                            void* stream) {
  if (n == 0) return NB_OK;
  float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
  nb__adamw<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
      d_params, d_grads, d_m, d_v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}
