/* CPU reference of value quantization (see quantize.h). Plain loops: the codec calls these on
 * the k kept values only, so clarity wins over SIMD here. */
#include "kernels/quantize.h"

#include <math.h>

nb_status_t nb_quantize_int8_block(const float* x, size_t n, uint32_t block, int8_t* q,
                                   float* scales) {
  if (block == 0) return nb_error(NB_ERR_INVALID, "int8 quantization: block size is 0");
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    float amax = 0.0f;
    for (size_t i = b0; i < b1; i++) amax = nb_absmax_merge(amax, fabsf(x[i]));
    if (!isfinite(amax))
      return nb_error(NB_ERR_INVALID, "int8 quantization: non-finite value in block %zu", bi);
    float scale = amax / 127.0f;
    scales[bi] = scale;
    for (size_t i = b0; i < b1; i++) q[i] = nb_quant_int8(x[i], scale);
  }
  return NB_OK;
}

void nb_dequantize_int8_block(const int8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x) {
  for (size_t i = 0; i < n; i++) x[i] = (float)q[i] * scales[i / block];
}

void nb_quantize_fp16(const float* x, size_t n, uint16_t* h) {
  for (size_t i = 0; i < n; i++) h[i] = nb_f32_to_f16(x[i]);
}
void nb_dequantize_fp16(const uint16_t* h, size_t n, float* x) {
  for (size_t i = 0; i < n; i++) x[i] = nb_f16_to_f32(h[i]);
}
void nb_quantize_bf16(const float* x, size_t n, uint16_t* h) {
  for (size_t i = 0; i < n; i++) h[i] = nb_f32_to_bf16(x[i]);
}
void nb_dequantize_bf16(const uint16_t* h, size_t n, float* x) {
  for (size_t i = 0; i < n; i++) x[i] = nb_bf16_to_f32(h[i]);
}

#ifndef NB_HAVE_CUDA
#define NB__NOCUDA return nb_error(NB_ERR_UNSUPPORTED, "%s: built without CUDA", __func__)
nb_status_t nb_quantize_int8_block_cuda(const float* d_x, size_t n, uint32_t block, int8_t* d_q,
                                        float* d_scales, void* stream) {
  NB__NOCUDA;
}
nb_status_t nb_dequantize_int8_block_cuda(const int8_t* d_q, const float* d_scales, size_t n,
                                          uint32_t block, float* d_x, void* stream) {
  NB__NOCUDA;
}
nb_status_t nb_quantize_fp16_cuda(const float* d_x, size_t n, uint16_t* d_h, void* stream) {
  NB__NOCUDA;
}
nb_status_t nb_dequantize_fp16_cuda(const uint16_t* d_h, size_t n, float* d_x, void* stream) {
  NB__NOCUDA;
}
nb_status_t nb_quantize_bf16_cuda(const float* d_x, size_t n, uint16_t* d_h, void* stream) {
  NB__NOCUDA;
}
nb_status_t nb_dequantize_bf16_cuda(const uint16_t* d_h, size_t n, float* d_x, void* stream) {
  NB__NOCUDA;
}
#endif
