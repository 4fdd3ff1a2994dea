/* CPU reference of value quantization (see quantize.h). Plain loops: the codec calls these on
 * the k kept values only, so clarity wins over SIMD here. */
#include "kernels/quantize.h"

#include <math.h>

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

nb_status_t nb_quantize_int8_block(const float* x, size_t n, uint32_t block, int8_t* q,
                                   float* scales) {
  NB_CHECK(nb__block_scales(x, n, block, NB_QUANT_INT8_MAX, scales, "int8"));
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    for (size_t i = b0; i < b1; i++) q[i] = nb_quant_int8(x[i], scales[bi]);
  }
  return NB_OK;
}

/* 4-bit and 2-bit differ only by the width: `bits` per code, 8 / bits codes a byte, value i in
 * bits bits * (i % per) of byte i / per (low bits first). Called with a constant width. */
static inline nb_status_t nb__quantize_packed(const float* x, size_t n, uint32_t block,
                                              unsigned bits, uint8_t* q, float* scales) {
  const int four = bits == 4;
  NB_CHECK(nb__block_scales(x, n, block, four ? NB_QUANT_INT4_MAX : NB_QUANT_INT2_MAX, scales,
                            four ? "4-bit" : "2-bit"));
  const size_t per = 8 / bits;
  memset(q, 0, n / per + (n % per != 0));
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    float s = scales[bi];
    for (size_t i = b0; i < b1; i++) {
      uint8_t c = four ? nb_quant_int4(x[i], s) : nb_quant_int2(x[i], s);
      q[i / per] |= (uint8_t)(c << (bits * (i % per)));
    }
  }
  return NB_OK;
}

static inline void nb__dequantize_packed(const uint8_t* q, const float* scales, size_t n,
                                         uint32_t block, unsigned bits, float* x) {
  const size_t per = 8 / bits;
  for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
    size_t b1 = n - b0 < block ? n : b0 + block;
    for (size_t i = b0; i < b1; i++) {
      unsigned c = q[i / per] >> (bits * (i % per));
      x[i] = (bits == 4 ? (float)nb_int4_code(c) : nb_int2_level(c)) * scales[bi];
    }
  }
}

nb_status_t nb_quantize_int4_block(const float* x, size_t n, uint32_t block, uint8_t* q,
                                   float* scales) {
  return nb__quantize_packed(x, n, block, 4, q, scales);
}

void nb_dequantize_int4_block(const uint8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x) {
  nb__dequantize_packed(q, scales, n, block, 4, x);
}

nb_status_t nb_quantize_int2_block(const float* x, size_t n, uint32_t block, uint8_t* q,
                                   float* scales) {
  return nb__quantize_packed(x, n, block, 2, q, scales);
}

void nb_dequantize_int2_block(const uint8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x) {
  nb__dequantize_packed(q, scales, n, block, 2, x);
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
