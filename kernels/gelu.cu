// CUDA GELU (tanh form), one thread per element.
#include "kernels/cuda_check.h"
#include "kernels/gelu.h"

#define NB__GELU_K 0.7978845608028654f

__global__ static void nb__gelu_fwd(float* out, const float* inp, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(NB__GELU_K * (x + 0.044715f * x * x * x)));
}

__global__ static void nb__gelu_bwd(float* dinp, const float* inp, const float* dout, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = inp[i];
  float t = tanhf(NB__GELU_K * (x + 0.044715f * x * x * x));
  float g = 0.5f * (1.0f + t) +
            0.5f * x * (1.0f - t * t) * NB__GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] += g * dout[i];
}

extern "C" nb_status_t nb_gelu_forward_cuda(float* d_out, const float* d_inp, size_t n,
                                            void* stream) {
  if (n == 0) return NB_OK;
  nb__gelu_fwd<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_out, d_inp, n);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}

extern "C" nb_status_t nb_gelu_backward_cuda(float* d_dinp, const float* d_inp, const float* d_dout,
                                             size_t n, void* stream) {
  if (n == 0) return NB_OK;
  nb__gelu_bwd<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_dinp, d_inp, d_dout,
                                                                              n);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}
