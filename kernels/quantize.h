/* Value quantization for the update codec: int8, 4-bit and 2-bit with one absmax scale per block,
 * fp16 and bf16 (round to nearest even, saturating at the largest finite value), and the inverse
 * of each. Every scale is capped so that the largest code times the scale is finite.
 * CPU reference here and in quantize.c; the CUDA versions in quantize.cu use the same scalar
 * conversions below, so both sides produce identical bits. Not a general tensor-cast library. */
#ifndef NB_KERNELS_QUANTIZE_H
#define NB_KERNELS_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include "common/status.h"
#include "kernels/host_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fp32 -> fp16, round to nearest even. Finite values beyond the fp16 range saturate to
 * +-65504; infinities stay infinite and NaN stays NaN. */
NB_HD uint16_t nb_f32_to_f16(float f) {
  uint32_t x = nb_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u); /* inf */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7bffu); /* would round to inf: saturate */
  if (ax < 0x38800000u) {                                   /* fp16 subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;            /* below half the smallest step */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - (ax >> 23); /* 14..24 */
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

/* fp16 -> fp32 (exact). */
NB_HD float nb_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = ((uint32_t)h >> 10) & 0x1fu,
           m = (uint32_t)h & 0x3ffu, bits;
  if (e == 0) {
    float f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
    return sign ? -f : f;
  }
  if (e == 31)
    bits = sign | 0x7f800000u | (m << 13);
  else
    bits = sign | ((e + 112u) << 23) | (m << 13);
  return nb_bits_f32(bits);
}

/* fp32 -> bf16, round to nearest even; finite overflow saturates to +-max finite bf16. */
NB_HD uint16_t nb_f32_to_bf16(float f) {
  uint32_t x = nb_f32_bits(f);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  if (ax == 0x7f800000u) return (uint16_t)(x >> 16);
  uint32_t r = x + 0x7fffu + ((x >> 16) & 1u);
  uint16_t h = (uint16_t)(r >> 16);
  if ((h & 0x7f80u) == 0x7f80u) h = (uint16_t)(((x >> 16) & 0x8000u) | 0x7f7fu);
  return h;
}

/* bf16 -> fp32 (exact). */
NB_HD float nb_bf16_to_f32(uint16_t h) {
  return nb_bits_f32((uint32_t)h << 16);
}

/* Running absmax that keeps a NaN once one is seen (so non-finite blocks are detected). */
NB_HD float nb_absmax_merge(float m, float a) {
  if (m != m) return m;
  return (a > m || a != a) ? a : m;
}

/* Largest codes of the block types: int8 [-127, 127], 4-bit [-7, 7], 2-bit {-1.5, -0.5, 0.5, 1.5}.
 */
#define NB_QUANT_INT8_MAX 127.0f
#define NB_QUANT_INT4_MAX 7.0f
#define NB_QUANT_INT2_MAX 1.5f

/* The largest scale s for which max_code * s is finite in fp32 (round to nearest). A block's
 * scale is min(absmax / max_code, this), so every decoded value code * scale is finite (absmax
 * near FLT_MAX would otherwise give a scale whose top code rounds to infinity). Decoders accept
 * scales in [0, this] only. */
NB_HD float nb_quant_scale_max(float max_code) {
  float s = 3.40282346638528859812e+38f / max_code;
  while (!(s * max_code <= 3.40282346638528859812e+38f)) s = nextafterf(s, 0.0f);
  return s;
}

/* One int8 value: q = rint(x / scale) clamped to [-127, 127]; 0 when scale is 0. */
NB_HD int8_t nb_quant_int8(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
#if defined(__CUDA_ARCH__)
  float q = rintf(x / scale);
#else
  /* round half to even without a libm call: |x / scale| <= 127 (+ rounding), far below 2^22,
   * so adding and removing 1.5 * 2^23 rounds exactly like rintf in the default rounding mode */
  float q = (x / scale + 12582912.0f) - 12582912.0f;
#endif
  if (q > 127.0f) q = 127.0f;
  if (q < -127.0f) q = -127.0f;
  return (int8_t)q;
}

/* One 4-bit value: q = rint(x / scale) clamped to [-7, 7] (the code -8 is never produced and is
 * invalid on the wire), returned as its two's-complement nibble; 0 when scale is 0. */
NB_HD uint8_t nb_quant_int4(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
#if defined(__CUDA_ARCH__)
  float q = rintf(x / scale);
#else
  float q = (x / scale + 12582912.0f) - 12582912.0f; /* rint, see nb_quant_int8 */
#endif
  if (q > 7.0f) q = 7.0f;
  if (q < -7.0f) q = -7.0f;
  return (uint8_t)((int)q & 0xf);
}
/* The code of a 4-bit nibble (sign-extended): -8..7. */
NB_HD int nb_int4_code(unsigned nibble) {
  return (int)((nibble & 0xfu) ^ 8u) - 8;
}

/* One 2-bit value: the nearest of the levels (c - 1.5) * scale, c = 0..3, i.e. -1.5, -0.5, 0.5,
 * 1.5 times the scale (no zero level: a kept top-k value is never near zero relative to its
 * block). Ties (x / scale exactly +-1) go away from zero; x = 0 gives c = 2 (+0.5 * scale, which
 * is 0 when the scale is 0, as for an all-zero block). */
NB_HD uint8_t nb_quant_int2(float x, float scale) {
  if (!(scale > 0.0f)) return 2;
  float y = x / scale; /* branch-free: signs of kept values are random */
  return (uint8_t)((y > -1.0f) + (y >= 0.0f) + (y >= 1.0f));
}
/* The level of a 2-bit code, in units of the scale. */
NB_HD float nb_int2_level(unsigned c) {
  return (float)(c & 3u) - 1.5f;
}

/* ---- CPU reference (always built). Pointers are borrowed; thread-safe on disjoint data. ---- */

/* Quantizes x[0..n) to int8 with one scale per `block` consecutive values:
 * scale = min(absmax / 127, nb_quant_scale_max(127)), q = rint(x / scale) clamped to [-127, 127].
 * scales has ceil(n / block) entries.
 * NB_ERR_INVALID when block is 0 or a block holds a non-finite value (the message names it). */
nb_status_t nb_quantize_int8_block(const float* x, size_t n, uint32_t block, int8_t* q,
                                   float* scales);
/* x[i] = q[i] * scales[i / block]. */
void nb_dequantize_int8_block(const int8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x);
/* 4-bit: scale = min(absmax / 7, nb_quant_scale_max(7)), codes by nb_quant_int4, packed two per
 * byte (value i in byte i / 2, low nibble first); q has ceil(n / 2) bytes, the unused high nibble
 * of an odd n is 0. Statuses as the int8 version. */
nb_status_t nb_quantize_int4_block(const float* x, size_t n, uint32_t block, uint8_t* q,
                                   float* scales);
/* x[i] = code(i) * scales[i / block]. */
void nb_dequantize_int4_block(const uint8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x);
/* 2-bit: scale = min(absmax / 1.5, nb_quant_scale_max(1.5)), codes by nb_quant_int2, packed four
 * per byte (value i in bits 2 * (i % 4) of byte i / 4); q has ceil(n / 4) bytes, unused bits 0.
 * Statuses as the int8 version. */
nb_status_t nb_quantize_int2_block(const float* x, size_t n, uint32_t block, uint8_t* q,
                                   float* scales);
/* x[i] = nb_int2_level(code(i)) * scales[i / block]. */
void nb_dequantize_int2_block(const uint8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x);
/* Element-wise conversions (see the scalar functions above). */
void nb_quantize_fp16(const float* x, size_t n, uint16_t* h);
void nb_dequantize_fp16(const uint16_t* h, size_t n, float* x);
void nb_quantize_bf16(const float* x, size_t n, uint16_t* h);
void nb_dequantize_bf16(const uint16_t* h, size_t n, float* x);

/* ---- CUDA versions: device pointers, `stream` is a cudaStream_t (NULL = default stream).
 * Asynchronous; errors of the launch are returned as NB_ERR_CUDA. Without CUDA in the build
 * they return NB_ERR_UNSUPPORTED. Identical bits to the CPU reference (4-bit and 2-bit have no
 * CUDA version yet: the codec quantizes the k kept values on the host). The int8 version cannot
 * report non-finite blocks; it writes a NaN scale for them. ---- */
nb_status_t nb_quantize_int8_block_cuda(const float* d_x, size_t n, uint32_t block, int8_t* d_q,
                                        float* d_scales, void* stream);
nb_status_t nb_dequantize_int8_block_cuda(const int8_t* d_q, const float* d_scales, size_t n,
                                          uint32_t block, float* d_x, void* stream);
nb_status_t nb_quantize_fp16_cuda(const float* d_x, size_t n, uint16_t* d_h, void* stream);
nb_status_t nb_dequantize_fp16_cuda(const uint16_t* d_h, size_t n, float* d_x, void* stream);
nb_status_t nb_quantize_bf16_cuda(const float* d_x, size_t n, uint16_t* d_h, void* stream);
nb_status_t nb_dequantize_bf16_cuda(const uint16_t* d_h, size_t n, float* d_x, void* stream);

#ifdef __cplusplus
}
#endif
#endif
