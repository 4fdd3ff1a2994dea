// CUDA error-feedback update (see error_feedback.h): grid-stride element-wise kernels, same
// float operations as the CPU reference so results are bit-identical.
#include "kernels/cuda_check.h"
#include "kernels/error_feedback.h"

namespace {
__global__ void nb__ef_acc_kernel(float* r, const float* u, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    r[i] += u[i];
}
__global__ void nb__ef_sub_kernel(float* r, const uint32_t* idx, const float* s, size_t k) {
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < k;
       j += (size_t)gridDim.x * blockDim.x)
    r[idx[j]] -= s[j];
}
unsigned nb__ef_grid(size_t n) {
  size_t g = (n + 255) / 256;
  if (g > 65535 * 8) g = 65535 * 8;
  return g ? (unsigned)g : 1u;
}
}  // namespace

extern "C" nb_status_t nb_ef_accumulate_cuda(float* d_residual, const float* d_update, size_t n,
                                             void* stream) {
  if (n == 0) return NB_OK;
  nb__ef_acc_kernel<<<nb__ef_grid(n), 256, 0, (cudaStream_t)stream>>>(d_residual, d_update, n);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}

extern "C" nb_status_t nb_ef_subtract_sent_cuda(float* d_residual, const uint32_t* d_idx,
                                                const float* d_sent, size_t k, void* stream) {
  if (k == 0) return NB_OK;
  nb__ef_sub_kernel<<<nb__ef_grid(k), 256, 0, (cudaStream_t)stream>>>(d_residual, d_idx, d_sent, k);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}
