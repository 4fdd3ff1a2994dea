/* Unit tests of the compression kernels' CPU references: fp16/bf16/int8 quantization against
 * independent references, error feedback, and exact top-k against a full-sort oracle (ties,
 * zeros, k = 0 and k = n, both the small and the sampled path). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static uint64_t rng_state = 12345;
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static float rnd_float(void) { /* wide range of magnitudes, both signs */
  double m = (double)(rng() >> 11) * 0x1.0p-53;
  int e = (int)(rng() % 60) - 40;
  return (float)((rng() & 1 ? -1 : 1) * ldexp(m, e));
}

/* Every fp16 value survives f16 -> f32 -> f16; f32 -> f16 matches the compiler's conversion. */
static void test_fp16(void** state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = nb_f16_to_f32((uint16_t)h);
    if (isnan(f)) {
      assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff));
      assert_true(isnan(nb_f16_to_f32(nb_f32_to_f16(f))));
      continue;
    }
    if (nb_f32_to_f16(f) != h) fail_msg("fp16 0x%04x -> %g -> 0x%04x", h, f, nb_f32_to_f16(f));
  }
  assert_int_equal(nb_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(nb_f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(nb_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(nb_f32_to_f16(1e9f), 0x7bff);  /* saturates */
  assert_int_equal(nb_f32_to_f16(-1e9f), 0xfbff); /* saturates */
  assert_int_equal(nb_f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(nb_f32_to_f16(0x1.0p-25f), 0); /* tie to even: 0 */
  assert_int_equal(nb_f32_to_f16(0x1.8p-25f), 1); /* above the tie: smallest subnormal */
  assert_int_equal(nb_f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00); /* tie to even */
  assert_int_equal(nb_f32_to_f16(1.0f + 0x1.8p-10f), 0x3c02); /* tie, odd -> up */
#if defined(__FLT16_MAX__)
  for (int i = 0; i < 200000; i++) {
    float f = rnd_float();
    if (fabsf(f) >= 65520.0f) continue; /* the compiler rounds these to inf; we saturate */
    _Float16 r = (_Float16)f;
    uint16_t want;
    memcpy(&want, &r, 2);
    if (nb_f32_to_f16(f) != want)
      fail_msg("fp16(%a) = 0x%04x, compiler says 0x%04x", f, nb_f32_to_f16(f), want);
  }
#endif
}

/* bf16: exhaustive round trip, ties to even, saturation; nearest by brute force on randoms. */
static void test_bf16(void** state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = nb_bf16_to_f32((uint16_t)h);
    if (isnan(f)) continue;
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f) == 0) { /* inf */
      assert_int_equal(nb_f32_to_bf16(f), h);
      continue;
    }
    assert_int_equal(nb_f32_to_bf16(f), h);
  }
  assert_int_equal(nb_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(nb_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80); /* tie, even stays */
  assert_int_equal(nb_f32_to_bf16(1.0f + 0x1.8p-7f), 0x3f82); /* tie, odd -> up */
  assert_int_equal(nb_f32_to_bf16(3.4028235e38f), 0x7f7f);    /* saturates */
  for (int i = 0; i < 200000; i++) {
    float f = rnd_float();
    uint16_t h = nb_f32_to_bf16(f);
    double d = fabs((double)nb_bf16_to_f32(h) - (double)f);
    double dn = fabs((double)nb_bf16_to_f32((uint16_t)(h + 1)) - (double)f);
    double dp = fabs((double)nb_bf16_to_f32((uint16_t)(h - 1)) - (double)f);
    if (d > dn || d > dp) fail_msg("bf16(%a) = 0x%04x is not the nearest", f, h);
  }
}

static void test_int8_block(void** state) {
  (void)state;
  enum { N = 1000, B = 64 };
  float x[N], y[N], scales[(N + B - 1) / B];
  int8_t q[N];
  for (int i = 0; i < N; i++) x[i] = rnd_float();
  x[5] = 0.0f;
  for (int i = 128; i < 192; i++) x[i] = 0.0f; /* an all-zero block: scale 0, q 0 */
  assert_int_equal(nb_quantize_int8_block(x, N, B, q, scales), NB_OK);
  nb_dequantize_int8_block(q, scales, N, B, y);
  for (int b = 0; b * B < N; b++) {
    float amax = 0;
    for (int i = b * B; i < N && i < (b + 1) * B; i++) amax = fmaxf(amax, fabsf(x[i]));
    assert_true(scales[b] == amax / 127.0f);
    for (int i = b * B; i < N && i < (b + 1) * B; i++) {
      assert_true(q[i] >= -127 && q[i] <= 127);
      assert_true(y[i] == (float)q[i] * scales[b]);
      if (fabsf(y[i] - x[i]) > 0.5f * scales[b] * (1 + 1e-6f))
        fail_msg("int8 error at %d: %g vs %g (scale %g)", i, y[i], x[i], scales[b]);
    }
    if (amax > 0) {
      int has127 = 0;
      for (int i = b * B; i < N && i < (b + 1) * B; i++) has127 |= abs(q[i]) == 127;
      if (!has127) fail_msg("block %d: no |q| = 127 (amax %a scale %a)", b, amax, scales[b]);
    }
  }
  assert_int_equal(scales[2], 0.0f);
  /* the scalar rounding equals rintf (round half to even), ties included */
  for (int i = 0; i < 1000000; i++) {
    float sc = fabsf(rnd_float()) + 1e-30f,
          v = sc * (float)((int64_t)(rng() % 25401) - 12700) / 100;
    if (i % 4 == 0) v = sc * ((float)(int)(rng() % 255) - 127.0f + 0.5f); /* near ties */
    float r = rintf(v / sc);
    int want = r > 127 ? 127 : r < -127 ? -127 : (int)r;
    if (nb_quant_int8(v, sc) != want)
      fail_msg("nb_quant_int8(%a, %a) = %d, rintf gives %d", v, sc, nb_quant_int8(v, sc), want);
  }
  x[300] = NAN;
  assert_int_equal(nb_quantize_int8_block(x, N, B, q, scales), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "block 4"));
  x[300] = INFINITY;
  assert_int_equal(nb_quantize_int8_block(x, N, B, q, scales), NB_ERR_INVALID);
  assert_int_equal(nb_quantize_int8_block(x, N, 0, q, scales), NB_ERR_INVALID);
}

static void test_error_feedback(void** state) {
  (void)state;
  float r[6] = {1, 2, 3, 4, 5, 6};
  const float u[6] = {0.5f, -2, 0, 1, 1, -6};
  nb_ef_accumulate(r, u, 6);
  const float want[6] = {1.5f, 0, 3, 5, 6, 0};
  for (int i = 0; i < 6; i++) assert_true(r[i] == want[i]);
  const uint32_t idx[2] = {2, 4};
  const float sent[2] = {3, 5.5f};
  nb_ef_subtract_sent(r, idx, sent, 2);
  assert_true(r[2] == 0.0f && r[4] == 0.5f && r[3] == 5.0f);
}

/* ---- top-k against a full-sort oracle ---- */
static const float* oracle_x;
static int cmp_rank(const void* a, const void* b) {
  uint32_t i = *(const uint32_t*)a, j = *(const uint32_t*)b;
  uint32_t ki = nb_topk_key(oracle_x[i]), kj = nb_topk_key(oracle_x[j]);
  if (ki != kj) return ki > kj ? -1 : 1;
  return i < j ? -1 : (i > j);
}
static int cmp_u32(const void* a, const void* b) {
  uint32_t x = *(const uint32_t*)a, y = *(const uint32_t*)b;
  return (x > y) - (x < y);
}
static void check_topk(const float* x, size_t n, size_t k) {
  uint32_t* all = malloc(n * sizeof *all);
  uint32_t* got = malloc((k ? k : 1) * sizeof *got);
  assert_non_null(all);
  assert_non_null(got);
  for (size_t i = 0; i < n; i++) all[i] = (uint32_t)i;
  oracle_x = x;
  qsort(all, n, sizeof *all, cmp_rank);
  qsort(all, k, sizeof *all, cmp_u32);
  assert_int_equal(nb_topk(x, n, k, got), NB_OK);
  for (size_t j = 0; j < k; j++)
    if (got[j] != all[j])
      fail_msg("top-k n=%zu k=%zu: position %zu is %u, oracle %u", n, k, j, got[j], all[j]);
  free(all);
  free(got);
}

static void test_topk(void** state) {
  (void)state;
  const size_t ns[] = {1, 2, 17, 1000, 16384, 16385, 100000, 300007};
  for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
    size_t n = ns[a];
    float* x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (int dist = 0; dist < 3; dist++) {
      for (size_t i = 0; i < n; i++) {
        if (dist == 0)
          x[i] = rnd_float(); /* all distinct */
        else if (dist == 1)
          x[i] = (float)((int)(rng() % 11) - 5); /* heavy ties, zeros */
        else
          x[i] = (rng() % 100 == 0) ? rnd_float() : 0.0f; /* mostly zero */
      }
      const double dens[] = {0.0, 0.001, 0.01, 0.1, 0.5, 1.0};
      for (size_t d = 0; d < sizeof dens / sizeof dens[0]; d++)
        check_topk(x, n, (size_t)(dens[d] * (double)n));
      check_topk(x, n, n > 1 ? n - 1 : 1);
    }
    free(x);
  }
}

static void test_kth_largest(void** state) {
  (void)state;
  enum { M = 5000 };
  uint64_t a[M], b[M];
  for (int i = 0; i < M; i++) a[i] = i % 3 == 0 ? 42 : rng();
  for (size_t k = 1; k <= M; k += 499) {
    memcpy(b, a, sizeof a);
    uint64_t v = nb_topk_kth_largest(b, M, k);
    size_t gt = 0, ge = 0;
    for (int i = 0; i < M; i++) {
      gt += a[i] > v;
      ge += a[i] >= v;
    }
    assert_true(gt < k && ge >= k);
  }
}

static void test_cuda_stubs(void** state) {
  (void)state;
  if (nb_device_built_with_cuda()) skip();
  assert_int_equal(nb_topk_cuda(NULL, 0, 0, NULL, NULL), NB_ERR_UNSUPPORTED);
  assert_int_equal(nb_ef_accumulate_cuda(NULL, NULL, 0, NULL), NB_ERR_UNSUPPORTED);
  assert_int_equal(nb_quantize_fp16_cuda(NULL, 0, NULL, NULL), NB_ERR_UNSUPPORTED);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp16),       cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_int8_block), cmocka_unit_test(test_error_feedback),
      cmocka_unit_test(test_topk),       cmocka_unit_test(test_kth_largest),
      cmocka_unit_test(test_cuda_stubs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
