/* Element-pair sums of 2-byte floats for the MPI backend's user-defined ops:
 * fp16 with the F16C conversion instructions, bf16 with AVX2 integer rounding, each when the CPU
 * has them, and the portable conversions otherwise. Both paths of each give the same bits. */
#include "intra/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define NB__HAVE_X86 1
#endif

/* One pair, portable. A NaN sum is the canonical quiet NaN: which payload an addition of NaNs
 * carries depends on operand order in hardware, so none is carried (IEEE leaves it open). */
static inline uint16_t nb__add_f16(uint16_t a, uint16_t b) {
  float s = nb__f16_to_f32(a) + nb__f16_to_f32(b);
  return s != s ? NB__F16_QNAN : nb__f32_to_f16(s);
}

static inline uint16_t nb__add_bf16(uint16_t a, uint16_t b) {
  float s = nb__bf16_to_f32(a) + nb__bf16_to_f32(b);
  return s != s ? NB__BF16_QNAN : nb__f32_to_bf16(s);
}

#ifdef NB__HAVE_X86
__attribute__((target("avx,f16c"))) static void nb__sum_f16_f16c(const uint16_t* a, uint16_t* b,
                                                                 size_t n) {
  const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)); /* → 0x7e00 */
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + i)));
    __m256 sum = _mm256_add_ps(x, y);
    sum = _mm256_blendv_ps(sum, qnan, _mm256_cmp_ps(sum, sum, _CMP_UNORD_Q));
    __m128i r = _mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i*)(b + i), r);
  }
  for (; i < n; i++) b[i] = nb__add_f16(a[i], b[i]);
}

/* bf16 → fp32 is a shift; fp32 → bf16 is the same integer rounding as nb__f32_to_bf16, NaN
 * quieted the same way, so the bits match the portable loop. */
__attribute__((target("avx2"))) static void nb__sum_bf16_avx2(const uint16_t* a, uint16_t* b,
                                                              size_t n) {
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i qnan = _mm256_set1_epi32(NB__BF16_QNAN);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i xa =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(a + i))), 16);
    __m256i xb =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(b + i))), 16);
    __m256 sum = _mm256_add_ps(_mm256_castsi256_ps(xa), _mm256_castsi256_ps(xb));
    __m256i u = _mm256_castps_si256(sum);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(sum, sum, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, qnan, nan);
    /* 8 x 32-bit (each < 0x10000) → 8 x 16-bit: pack within lanes, then order the lanes */
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i*)(b + i), _mm256_castsi256_si128(p));
  }
  for (; i < n; i++) b[i] = nb__add_bf16(a[i], b[i]);
}
#endif

#ifdef NB__HAVE_X86
/* CPUID.1:ECX.F16C; clang before 16 does not know "f16c" in __builtin_cpu_supports. */
static int nb__cpu_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

void nb__sum_f16(const uint16_t* a, uint16_t* b, size_t n, int hw) {
#ifdef NB__HAVE_X86
  if (hw && __builtin_cpu_supports("avx") && nb__cpu_f16c()) {
    nb__sum_f16_f16c(a, b, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) b[i] = nb__add_f16(a[i], b[i]);
}

void nb__sum_bf16(const uint16_t* a, uint16_t* b, size_t n, int hw) {
#ifdef NB__HAVE_X86
  if (hw && __builtin_cpu_supports("avx2")) {
    nb__sum_bf16_avx2(a, b, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) b[i] = nb__add_bf16(a[i], b[i]);
}
