// CUDA versions of value quantization (see quantize.h). Same scalar conversions as the CPU
// reference, so results are bit-identical; one thread block per int8 scale block.
#include <math.h>

#include "kernels/cuda_check.h"
#include "kernels/quantize.h"

namespace {

__global__ void nb__q8_kernel(const float* x, size_t n, uint32_t block, int8_t* q, float* scales) {
  size_t b0 = (size_t)blockIdx.x * block;
  size_t b1 = n - b0 < block ? n : b0 + block;
  float amax = 0.0f;
  for (size_t i = b0 + threadIdx.x; i < b1; i += blockDim.x)
    amax = nb_absmax_merge(amax, fabsf(x[i]));
  __shared__ float red[256];
  red[threadIdx.x] = amax;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = nb_absmax_merge(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  float scale = red[0] / 127.0f, smax = nb_quant_scale_max(NB_QUANT_INT8_MAX);
  if (scale > smax) scale = smax; /* as the CPU reference: 127 * scale stays finite */
  if (!isfinite(red[0])) scale = nanf("");
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  for (size_t i = b0 + threadIdx.x; i < b1; i += blockDim.x) q[i] = nb_quant_int8(x[i], scale);
}

__global__ void nb__dq8_kernel(const int8_t* q, const float* scales, size_t n, uint32_t block,
                               float* x) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = (float)q[i] * scales[i / block];
}

template <int kind>
__global__ void nb__to16_kernel(const float* x, size_t n, uint16_t* h) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    h[i] = kind == 0 ? nb_f32_to_f16(x[i]) : nb_f32_to_bf16(x[i]);
}

template <int kind>
__global__ void nb__from16_kernel(const uint16_t* h, size_t n, float* x) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = kind == 0 ? nb_f16_to_f32(h[i]) : nb_bf16_to_f32(h[i]);
}

unsigned nb__grid(size_t n) {
  size_t g = (n + 255) / 256;
  if (g > 65535 * 8) g = 65535 * 8;
  return g ? (unsigned)g : 1u;
}

}  // namespace

extern "C" nb_status_t nb_quantize_int8_block_cuda(const float* d_x, size_t n, uint32_t block,
                                                   int8_t* d_q, float* d_scales, void* stream) {
  if (block == 0) return nb_error(NB_ERR_INVALID, "int8 quantization: block size is 0");
  if (n == 0) return NB_OK;
  size_t nb = (n + block - 1) / block;
  if (nb > 0x7fffffffu) return nb_error(NB_ERR_INVALID, "int8 quantization: too many blocks");
  nb__q8_kernel<<<(unsigned)nb, 256, 0, (cudaStream_t)stream>>>(d_x, n, block, d_q, d_scales);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}

extern "C" nb_status_t nb_dequantize_int8_block_cuda(const int8_t* d_q, const float* d_scales,
                                                     size_t n, uint32_t block, float* d_x,
                                                     void* stream) {
  if (block == 0) return nb_error(NB_ERR_INVALID, "int8 dequantization: block size is 0");
  if (n == 0) return NB_OK;
  nb__dq8_kernel<<<nb__grid(n), 256, 0, (cudaStream_t)stream>>>(d_q, d_scales, n, block, d_x);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}

#define NB__CONV(name, kern, kind, tin, tout)                                         \
  extern "C" nb_status_t name(const tin* d_in, size_t n, tout* d_out, void* stream) { \
    if (n == 0) return NB_OK;                                                         \
    kern<kind><<<nb__grid(n), 256, 0, (cudaStream_t)stream>>>(d_in, n, d_out);        \
    NB_CUDA_LAUNCH_CHECK();                                                           \
    return NB_OK;                                                                     \
  }
NB__CONV(nb_quantize_fp16_cuda, nb__to16_kernel, 0, float, uint16_t)
NB__CONV(nb_quantize_bf16_cuda, nb__to16_kernel, 1, float, uint16_t)
NB__CONV(nb_dequantize_fp16_cuda, nb__from16_kernel, 0, uint16_t, float)
NB__CONV(nb_dequantize_bf16_cuda, nb__from16_kernel, 1, uint16_t, float)
