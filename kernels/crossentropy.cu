// CUDA softmax cross-entropy: one block per row (shared-memory reductions for max and sum).
// The KL / distillation kernels stay CPU-only for now.
#include <math.h>

#include "kernels/crossentropy.h"
#include "kernels/cuda_check.h"

__global__ static void nb__ce_fwd(float* losses, float* probs, const float* logits, const int* tgt,
                                  int N, int V) {
  __shared__ float red[256];
  int row = blockIdx.x, tid = threadIdx.x;
  const float* x = logits + (size_t)row * V;
  float* p = probs + (size_t)row * V;
  float mx = -INFINITY;
  for (int j = tid; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
  red[tid] = mx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  float sum = 0.0f;
  for (int j = tid; j < V; j += blockDim.x) {
    float e = expf(x[j] - mx);
    p[j] = e;
    sum += e;
  }
  red[tid] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    __syncthreads();
  }
  float inv = 1.0f / red[0];
  for (int j = tid; j < V; j += blockDim.x) p[j] *= inv;
  __syncthreads();
  if (tid == 0) {
    int t = tgt[row];
    losses[row] = t < 0 ? 0.0f : -logf(fmaxf(p[t], 1e-30f));
  }
}

__global__ static void nb__ce_bwd(float* dlogits, const float* probs, const int* tgt, float dloss,
                                  int N, int V) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * V) return;
  int row = (int)(i / V), j = (int)(i % V);
  int t = tgt[row];
  if (t < 0) return;
  dlogits[i] += dloss * (probs[i] - (j == t ? 1.0f : 0.0f));
}

extern "C" nb_status_t nb_crossentropy_forward_cuda(float* d_losses, float* d_probs,
                                                    const float* d_logits, const int* d_targets,
                                                    int N, int V, void* stream) {
  if (N == 0) return NB_OK;
  nb__ce_fwd<<<N, 256, 0, (cudaStream_t)stream>>>(d_losses, d_probs, d_logits, d_targets, N, V);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}

extern "C" nb_status_t nb_crossentropy_backward_cuda(float* d_dlogits, const float* d_probs,
                                                     const int* d_targets, float dloss, int N,
                                                     int V, void* stream) {
  size_t n = (size_t)N * V;
  if (n == 0) return NB_OK;
  nb__ce_bwd<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_dlogits, d_probs,
                                                                            d_targets, dloss, N, V);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}
