/* Internal to intra/: 2-byte float conversions (inline, for the reduction loops) and the
 * element-pair sums behind the MPI user-defined ops. Rounding is to nearest even everywhere;
 * the F16C path gives the same bits as the portable one. Not a general half-float library. */
#ifndef NB_INTRA_HALF_H
#define NB_INTRA_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* binary32 → binary16 (after F. Giesen's float_to_half_fast3_rtne). NaN keeps its sign and the
 * top of its payload and is quieted, as the F16C instruction does. */
static inline uint16_t nb__f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= (127u + 16u) << 23) { /* >= 65536 (rounds to Inf), Inf or NaN */
    o = u > 0x7f800000u ? (uint16_t)(0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00;
  } else if (u < 113u << 23) { /* subnormal half or zero: align with a magic add */
    const uint32_t magic_u = 126u << 23;
    float fm, fv;
    memcpy(&fm, &magic_u, 4);
    memcpy(&fv, &u, 4);
    fv += fm;
    memcpy(&u, &fv, 4);
    o = (uint16_t)(u - magic_u);
  } else {
    uint32_t mant_odd = (u >> 13) & 1u;
    u += ((uint32_t)(15 - 127) << 23) + 0xfffu; /* rebias exponent, rounding bias part 1 */
    u += mant_odd;                              /* ties to even */
    o = (uint16_t)(u >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
}

static inline float nb__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  if (exp == 0) { /* zero or subnormal: exact in binary32 */
    float f = (float)mant * 0x1p-24f;
    memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t nb__f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t qnan = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? qnan : r); /* select: vectorizes */
}

static inline float nb__bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#define NB__F16_QNAN 0x7e00u /* the canonical quiet NaN a NaN sum gives */
#define NB__BF16_QNAN 0x7fc0u

/* b[i] = round(a[i] + b[i]) for n element pairs, the sum taken in binary32 (a NaN sum gives the
 * canonical quiet NaN). hw = 0 forces the
 * portable path (tests compare the two); hw = 1 uses F16C / AVX2 when the CPU has them. */
void nb__sum_f16(const uint16_t* a, uint16_t* b, size_t n, int hw);
void nb__sum_bf16(const uint16_t* a, uint16_t* b, size_t n, int hw);

#endif
