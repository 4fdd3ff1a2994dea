/* CPU reference of value quantization (see quantize.h). Plain loops: the codec calls these on
 * the k kept values only, so clarity wins over SIMD here. */
#include "kernels/quantize.h"

#include <math.h>

nb_status_t nb_quantize_int8_block(const float* x, size_t n, uint32_t block, int8_t* q,
                                   float* scales) {
  if (block == 0) return nb_error(NB_ERR_INVALID, "int8 quantization: block size is 0");
  const float smax = nb_quant_scale_max(NB_QUANT_INT8_MAX);
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    float amax = 0.0f;
    for (size_t i = b0; i < b1; i++) amax = nb_absmax_merge(amax, fabsf(x[i]));
    if (!isfinite(amax))
      return nb_error(NB_ERR_INVALID, "int8 quantization: non-finite value in block %zu", bi);
    float scale = amax / 127.0f;
    if (scale > smax) scale = smax;
    scales[bi] = scale;
    for (size_t i = b0; i < b1; i++) q[i] = nb_quant_int8(x[i], scale);
  }
  return NB_OK;
}

/* The scales of x[0..n) per block of a code range (capped, see nb_quant_scale_max). */
static nb_status_t nb__block_scales(const float* x, size_t n, uint32_t block, float max_code,
                                    float* scales, const char* what) {
  if (block == 0) return nb_error(NB_ERR_INVALID, "%s quantization: block size is 0", what);
  const float smax = nb_quant_scale_max(max_code);
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    float amax = 0.0f;
    for (size_t i = b0; i < b1; i++) amax = nb_absmax_merge(amax, fabsf(x[i]));
    if (!isfinite(amax))
      return nb_error(NB_ERR_INVALID, "%s quantization: non-finite value in block %zu", what, bi);
    float scale = amax / max_code;
    scales[bi] = scale > smax ? smax : scale;
  }
  return NB_OK;
}

nb_status_t nb_quantize_int4_block(const float* x, size_t n, uint32_t block, uint8_t* q,
                                   float* scales) {
  NB_CHECK(nb__block_scales(x, n, block, NB_QUANT_INT4_MAX, scales, "4-bit"));
  memset(q, 0, n / 2 + (n & 1));
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    float s = scales[bi];
    for (size_t i = b0; i < b1; i++)
      q[i >> 1] |= (uint8_t)(nb_quant_int4(x[i], s) << (4 * (i & 1)));
  }
  return NB_OK;
}

void nb_dequantize_int4_block(const uint8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x) {
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    for (size_t i = b0; i < b1; i++)
      x[i] = (float)nb_int4_code(q[i >> 1] >> (4 * (i & 1))) * scales[bi];
  }
}

nb_status_t nb_quantize_int2_block(const float* x, size_t n, uint32_t block, uint8_t* q,
                                   float* scales) {
  NB_CHECK(nb__block_scales(x, n, block, NB_QUANT_INT2_MAX, scales, "2-bit"));
  memset(q, 0, n / 4 + ((n & 3) != 0));
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    float s = scales[bi];
    for (size_t i = b0; i < b1; i++)
      q[i >> 2] |= (uint8_t)(nb_quant_int2(x[i], s) << (2 * (i & 3)));
  }
  return NB_OK;
}

void nb_dequantize_int2_block(const uint8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x) {
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    for (size_t i = b0; i < b1; i++) x[i] = nb_int2_level(q[i >> 2] >> (2 * (i & 3))) * scales[bi];
  }
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
