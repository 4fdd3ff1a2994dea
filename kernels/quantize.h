/* Value quantization for the update codec: int8 with one absmax scale per block, fp16 and bf16
 * (round to nearest even, saturating at the largest finite value), and the inverse of each.
 * CPU reference here and in quantize.c; the CUDA versions in quantize.cu use the same scalar
 * conversions below, so both sides produce identical bits. Not a general tensor-cast library. */
#ifndef NB_KERNELS_QUANTIZE_H
#define NB_KERNELS_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define NB_HD __host__ __device__ __forceinline__
#else
#define NB_HD static inline
#endif

/* fp32 -> fp16, round to nearest even. Finite values beyond the fp16 range saturate to
 * +-65504; infinities stay infinite and NaN stays NaN. */
NB_HD uint16_t nb_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
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
  float f;
  if (e == 0) {
    f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
    return sign ? -f : f;
  }
  if (e == 31)
    bits = sign | 0x7f800000u | (m << 13);
  else
    bits = sign | ((e + 112u) << 23) | (m << 13);
  memcpy(&f, &bits, 4);
  return f;
}

/* fp32 -> bf16, round to nearest even; finite overflow saturates to +-max finite bf16. */
NB_HD uint16_t nb_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
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
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Running absmax that keeps a NaN once one is seen (so non-finite blocks are detected). */
NB_HD float nb_absmax_merge(float m, float a) {
  if (m != m) return m;
  return (a > m || a != a) ? a : m;
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

/* ---- CPU reference (always built). Pointers are borrowed; thread-safe on disjoint data. ---- */

/* Quantizes x[0..n) to int8 with one scale per `block` consecutive values:
 * scale = absmax / 127, q = rint(x / scale). scales has ceil(n / block) entries.
 * NB_ERR_INVALID when block is 0 or a block holds a non-finite value (the message names it). */
nb_status_t nb_quantize_int8_block(const float* x, size_t n, uint32_t block, int8_t* q,
                                   float* scales);
/* x[i] = q[i] * scales[i / block]. */
void nb_dequantize_int8_block(const int8_t* q, const float* scales, size_t n, uint32_t block,
                              float* x);
/* Element-wise conversions (see the scalar functions above). */
void nb_quantize_fp16(const float* x, size_t n, uint16_t* h);
void nb_dequantize_fp16(const uint16_t* h, size_t n, float* x);
void nb_quantize_bf16(const float* x, size_t n, uint16_t* h);
void nb_dequantize_bf16(const uint16_t* h, size_t n, float* x);

/* ---- CUDA versions: device pointers, `stream` is a cudaStream_t (NULL = default stream).
 * Asynchronous; errors of the launch are returned as NB_ERR_CUDA. Without CUDA in the build
 * they return NB_ERR_UNSUPPORTED. Identical bits to the CPU reference. The int8 version cannot
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
