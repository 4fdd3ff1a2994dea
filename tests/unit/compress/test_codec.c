/* Unit tests of the codec: sparse round trips over many n, densities, value types and zstd
 * levels where the receiver must decode exactly what the sender quantized (checked against an
 * independent top-k + quantization through kernels/), the error-feedback invariant
 * sent + new residual == old residual + update (bit for bit), determinism across thread counts,
 * dense codecs, argument errors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compress/compress.h"
#include "kernels/kernels.h"

static uint64_t rng_state = 99;
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* heavy-tailed values in a range every value type can hold */
static float heavy(void) {
  double u = ((double)(rng() >> 11) + 0.5) * 0x1.0p-53;
  double v = 1e-3 * pow(-log(u), 2.0);
  return (float)(rng() & 1 ? -v : v);
}

static nb_codec_t* make_codec_chunked(nb_values_t v, int level, uint32_t block, int threads,
                                      uint32_t chunk) {
  nb_codec_config_t cfg;
  nb_codec_config_default(&cfg);
  cfg.values = v;
  cfg.zstd_level = level;
  cfg.block_size = block;
  cfg.threads = threads;
  cfg.topk_chunk = chunk;
  nb_codec_t* c = NULL;
  assert_int_equal(nb_codec_create(&cfg, &c), NB_OK);
  return c;
}
static nb_codec_t* make_codec(nb_values_t v, int level, uint32_t block, int threads) {
  return make_codec_chunked(v, level, block, threads, 0);
}

/* What the receiver must get for the kept values: the same quantization done by kernels/. */
static void reference_sent(nb_values_t v, uint32_t block, const float* vals, size_t k, float* deq) {
  if (k == 0) return;
  switch (v) {
    case NB_VALUES_FP32:
      memcpy(deq, vals, k * 4);
      break;
    case NB_VALUES_FP16:
      for (size_t j = 0; j < k; j++) deq[j] = nb_f16_to_f32(nb_f32_to_f16(vals[j]));
      break;
    case NB_VALUES_BF16:
      for (size_t j = 0; j < k; j++) deq[j] = nb_bf16_to_f32(nb_f32_to_bf16(vals[j]));
      break;
    case NB_VALUES_INT8: {
      int8_t* q = malloc(k);
      float* s = malloc((k / block + 1) * 4);
      assert_true(q && s);
      assert_int_equal(nb_quantize_int8_block(vals, k, block, q, s), NB_OK);
      nb_dequantize_int8_block(q, s, k, block, deq);
      free(q);
      free(s);
      break;
    }
    case NB_VALUES_INT4:
    case NB_VALUES_INT2: {
      uint8_t* q = malloc(k);
      float* s = malloc((k / block + 1) * 4);
      assert_true(q && s);
      if (v == NB_VALUES_INT4) {
        assert_int_equal(nb_quantize_int4_block(vals, k, block, q, s), NB_OK);
        nb_dequantize_int4_block(q, s, k, block, deq);
      } else {
        assert_int_equal(nb_quantize_int2_block(vals, k, block, q, s), NB_OK);
        nb_dequantize_int2_block(q, s, k, block, deq);
      }
      free(q);
      free(s);
      break;
    }
  }
}

static int blocked(nb_values_t v) {
  return v == NB_VALUES_INT8 || v == NB_VALUES_INT4 || v == NB_VALUES_INT2;
}

/* The error-feedback invariant sent + new residual == old residual + update (r). The residual is
 * fl(r - sent): exact (Sterbenz) whenever sent is within a factor 2 of r, which holds for fp32,
 * fp16, bf16 and int8; 4bit and 2bit can overshoot a value by more than that, so there it holds
 * up to the one rounding of that subtraction, checked in double: |sent + res - r| <=
 * 2^-24 (|r| + |sent|). */
static void ef_check(size_t i, float sent, float res, float r, nb_values_t v) {
  if (v != NB_VALUES_INT4 && v != NB_VALUES_INT2) {
    if (sent + res != r)
      fail_msg("EF invariant broken at %zu: sent %a + residual %a != %a", i, sent, res, r);
    return;
  }
  double err = fabs((double)sent + (double)res - (double)r);
  double tol = 0x1.0p-24 * (fabs((double)r) + fabs((double)sent));
  if (err > tol)
    fail_msg("%s EF invariant broken at %zu: sent %a + residual %a - %a = %g > %g",
             nb_values_name(v), i, sent, res, r, err, tol);
}

/* One round trip with every check. Returns the frame length. */
static size_t round_trip(size_t n, double density, nb_values_t v, int level, uint32_t block,
                         int threads) {
  float *upd = malloc(n * 4), *res = malloc(n * 4), *r = malloc(n * 4), *out = calloc(n, 4),
        *res2 = malloc(n * 4);
  size_t k = nb_codec_k_for_density(n, density);
  uint32_t* idx = malloc((k + 1) * 4);
  float *vals = malloc((k + 1) * 4), *deq = malloc((k + 1) * 4);
  size_t cap = nb_codec_frame_bound(n, k, v, block), len = 0, len2 = 0;
  uint8_t *frame = malloc(cap), *frame2 = malloc(cap);
  assert_true(upd && res && r && out && res2 && idx && vals && deq && frame && frame2);
  for (size_t i = 0; i < n; i++) {
    upd[i] = heavy();
    res[i] = 0.1f * heavy();
    r[i] = res[i] + upd[i];
  }
  memcpy(res2, res, n * 4);
  /* independent expectation: exact top-k of residual + update, quantized by kernels/ */
  assert_int_equal(nb_topk(r, n, k, idx), NB_OK);
  for (size_t j = 0; j < k; j++) vals[j] = r[idx[j]];
  reference_sent(v, block, vals, k, deq);

  nb_codec_t* c = make_codec(v, level, block, threads);
  nb_status_t st = nb_codec_encode_sparse(c, upd, res, n, density, 77, 5, frame, cap, &len);
  if (st != NB_OK) fail_msg("encode n=%zu d=%g: %s", n, density, nb_error_last());
  assert_true(len <= cap);
  nb_frame_info_t info;
  assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
  assert_int_equal(info.n, n);
  assert_int_equal(info.k, k);
  assert_int_equal(info.round, 77);
  assert_int_equal(info.sender, 5);
  assert_int_equal(info.values, v);
  assert_int_equal(info.frame_bytes, len);
  assert_true(info.flags & NB_FRAME_FLAG_SPARSE);
  assert_int_equal(info.block_size, blocked(v) ? block : 0);
  st = nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL);
  if (st != NB_OK) fail_msg("decode n=%zu d=%g: %s", n, density, nb_error_last());

  /* receiver == what the sender quantized; EF invariant bit for bit */
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    float sent = 0.0f;
    if (j < k && idx[j] == i) sent = deq[j++];
    if (out[i] != sent)
      fail_msg("n=%zu d=%g %s: decoded[%zu] = %a, sender quantized %a", n, density,
               nb_values_name(v), i, out[i], sent);
    ef_check(i, out[i], res[i], r[i], v);
  }

  /* determinism: another codec, another thread count, same bytes */
  nb_codec_t* c2 = make_codec(v, level, block, threads == 1 ? 3 : 1);
  assert_int_equal(nb_codec_encode_sparse(c2, upd, res2, n, density, 77, 5, frame2, cap, &len2),
                   NB_OK);
  assert_int_equal(len, len2);
  assert_memory_equal(frame, frame2, len);
  assert_memory_equal(res, res2, n * 4);
  nb_codec_destroy(c);
  nb_codec_destroy(c2);
  free(upd), free(res), free(r), free(out), free(res2), free(idx), free(vals), free(deq);
  free(frame), free(frame2);
  return len;
}

static void test_round_trips(void** state) {
  (void)state;
  const nb_values_t types[] = {NB_VALUES_INT8, NB_VALUES_FP16, NB_VALUES_BF16,
                               NB_VALUES_FP32, NB_VALUES_INT4, NB_VALUES_INT2};
  const size_t ns[] = {1, 10, 1000, 70001};
  const double dens[] = {0.0, 0.001, 0.01, 0.1, 0.6, 1.0};
  const int levels[] = {0, 1, 3};
  for (size_t a = 0; a < 4; a++)
    for (size_t t = 0; t < 6; t++)
      for (size_t d = 0; d < 6; d++)
        for (size_t l = 0; l < 3; l++) round_trip(ns[a], dens[d], types[t], levels[l], 64, 2);
  round_trip(5000, 0.05, NB_VALUES_INT8, 19, 1, 1);
  round_trip(5000, 0.05, NB_VALUES_INT8, 1, 65536, 1);
  round_trip(5000, 0.05, NB_VALUES_INT8, 1, 3, 1);
}

/* Large enough for the sampled threshold (n >= 2^17) and the threaded pass (n >= 2^20). */
static void test_round_trips_large(void** state) {
  (void)state;
  round_trip(200003, 0.01, NB_VALUES_INT8, 1, 256, 2);
  round_trip(200003, 0.3, NB_VALUES_BF16, 1, 256, 1);
  round_trip((1u << 20) + 5, 0.01, NB_VALUES_INT8, 1, 256, 2);
  round_trip((1u << 20) + 5, 0.001, NB_VALUES_FP16, 3, 256, 4);
}

/* Many ties at the threshold: candidates overflow their buffers and the pass rescans. */
static void test_ties_and_rescans(void** state) {
  (void)state;
  size_t n = (1u << 20) + 3, k = 30000;
  float *upd = malloc(n * 4), *res = calloc(n, 4), *out = calloc(n, 4);
  size_t cap = nb_codec_frame_bound(n, k, NB_VALUES_FP32, 256), len = 0;
  uint8_t* frame = malloc(cap);
  uint32_t* idx = malloc(k * 4);
  assert_true(upd && res && out && frame && idx);
  for (size_t i = 0; i < n; i++) upd[i] = (i % 3) ? 1.0f : -1.0f; /* all the same magnitude */
  nb_codec_t* c = make_codec(NB_VALUES_FP32, 1, 256, 2);
  assert_int_equal(nb_codec_encode_sparse_k(c, upd, res, n, k, 1, 1, frame, cap, &len), NB_OK);
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
  for (size_t i = 0; i < n; i++) { /* ties go to the lowest indices */
    float want = i < k ? upd[i] : 0.0f;
    if (out[i] != want) fail_msg("tie order: decoded[%zu] = %g, want %g", i, out[i], want);
  }
  /* mostly zeros: fewer nonzero values than k, so zeros fill the rest, lowest index first */
  memset(res, 0, n * 4);
  memset(out, 0, n * 4);
  for (size_t i = 0; i < n; i++) upd[i] = (i % 1000 == 7) ? 2.0f : 0.0f;
  assert_int_equal(nb_codec_encode_sparse_k(c, upd, res, n, k, 2, 1, frame, cap, &len), NB_OK);
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
  for (size_t i = 0; i < n; i++) assert_true(out[i] == upd[i]);
  nb_codec_destroy(c);
  free(upd), free(res), free(out), free(frame), free(idx);
}

/* The sample is fooled: the values it sees (the lines the encoder samples, recomputed here the
 * way encode.c draws them) are larger than everything else, so its threshold keeps fewer than k
 * candidates and the encoder must lower the threshold and rescan. Whatever the sampling does,
 * the result must be the exact top-k: the sampled lines, then the lowest indices. */
static uint64_t splitmix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static void test_sample_misses(void** state) {
  (void)state;
  size_t n = 1u << 20, k = 50000, runs = n / 1024, lines = n / 16;
  float *upd = malloc(n * 4), *out = calloc(n, 4);
  uint8_t* hit = calloc(n, 1);
  size_t cap = nb_codec_frame_bound(n, k, NB_VALUES_FP32, 256), len = 0;
  uint8_t* frame = malloc(cap);
  assert_true(upd && out && hit && frame);
  uint64_t seed = 0x6e6562756c61ull ^ n;
  for (size_t r = 0; r < runs; r++) {
    size_t b = (size_t)(splitmix(&seed) % lines) * 16;
    memset(hit + b, 1, 16);
  }
  size_t big = 0;
  for (size_t i = 0; i < n; i++) {
    upd[i] = hit[i] ? 2.0f : 1.0f;
    big += hit[i];
  }
  assert_true(big < k);
  nb_codec_t* c = make_codec(NB_VALUES_FP32, 1, 256, 2);
  assert_int_equal(nb_codec_encode_sparse_k(c, upd, NULL, n, k, 1, 1, frame, cap, &len), NB_OK);
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
  size_t small_left = k - big;
  for (size_t i = 0; i < n; i++) {
    float want = 0.0f;
    if (hit[i])
      want = 2.0f;
    else if (small_left)
      want = 1.0f, small_left--;
    if (out[i] != want) fail_msg("decoded[%zu] = %g, want %g", i, out[i], want);
  }
  nb_codec_destroy(c);
  free(upd), free(out), free(hit), free(frame);
}

/* Several rounds on one codec: the invariant holds each round, scratch is reused. */
static void test_error_feedback_rounds(void** state) {
  (void)state;
  size_t n = 50000;
  float *upd = malloc(n * 4), *res = calloc(n, 4), *before = malloc(n * 4), *out = malloc(n * 4);
  size_t cap = nb_codec_frame_bound(n, n, NB_VALUES_INT8, 256), len = 0;
  uint8_t* frame = malloc(cap);
  assert_true(upd && res && before && out && frame);
  nb_codec_t* c = make_codec(NB_VALUES_INT8, 1, 256, 2);
  double sent_norm = 0;
  for (int round = 0; round < 6; round++) {
    for (size_t i = 0; i < n; i++) {
      upd[i] = heavy();
      before[i] = res[i] + upd[i];
    }
    assert_int_equal(
        nb_codec_encode_sparse(c, upd, res, n, 0.02, (uint64_t)round, 3, frame, cap, &len), NB_OK);
    memset(out, 0, n * 4);
    assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
    for (size_t i = 0; i < n; i++) {
      assert_true(out[i] + res[i] == before[i]);
      sent_norm += fabs(out[i]);
    }
  }
  assert_true(sent_norm > 0);
  nb_codec_destroy(c);
  free(upd), free(res), free(before), free(out), free(frame);
}

/* Error feedback keeps the residual bounded: with the same update every round, what is not sent
 * now is sent later, so the residual does not grow with the number of rounds. */
static void test_error_feedback_bounded(void** state) {
  (void)state;
  size_t n = 20000, cap = nb_codec_frame_bound(n, n, NB_VALUES_INT8, 256), len = 0;
  float *upd = malloc(n * 4), *res = calloc(n, 4);
  uint8_t* frame = malloc(cap);
  assert_true(upd && res && frame);
  double un = 0;
  for (size_t i = 0; i < n; i++) {
    upd[i] = heavy();
    un += (double)upd[i] * upd[i];
  }
  nb_codec_t* c = make_codec(NB_VALUES_INT8, 1, 256, 1);
  double worst = 0;
  for (int round = 0; round < 200; round++) {
    assert_int_equal(
        nb_codec_encode_sparse(c, upd, res, n, 0.05, (uint64_t)round, 0, frame, cap, &len), NB_OK);
    double rn = 0;
    for (size_t i = 0; i < n; i++) rn += (double)res[i] * res[i];
    if (round >= 100 && rn > worst) worst = rn;
  }
  /* after 200 rounds the unsent part is a few updates' worth, not 200 */
  if (sqrt(worst) > 10.0 * sqrt(un))
    fail_msg("residual norm %g vs update norm %g after 200 rounds", sqrt(worst), sqrt(un));
  nb_codec_destroy(c);
  free(upd), free(res), free(frame);
}

static void test_index_coding_choice(void** state) {
  (void)state;
  size_t n = 100000, cap = nb_codec_frame_bound(n, n, NB_VALUES_INT8, 256), len = 0;
  float* upd = malloc(n * 4);
  uint8_t* frame = malloc(cap);
  assert_true(upd && frame);
  for (size_t i = 0; i < n; i++) upd[i] = heavy();
  nb_codec_t* c = make_codec(NB_VALUES_INT8, 0, 256, 1);
  nb_frame_info_t info;
  assert_int_equal(nb_codec_encode_sparse(c, upd, NULL, n, 0.01, 0, 0, frame, cap, &len), NB_OK);
  assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
  assert_int_equal(info.index_coding, NB_INDEX_DELTA_VARINT);
  assert_true(info.index_bytes < info.k * 2);
  assert_int_equal(nb_codec_encode_sparse(c, upd, NULL, n, 0.5, 0, 0, frame, cap, &len), NB_OK);
  assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
  assert_int_equal(info.index_coding, NB_INDEX_BITMAP);
  assert_int_equal(info.index_bytes, n / 8);
  nb_codec_destroy(c);
  free(upd), free(frame);
}

static void test_dense(void** state) {
  (void)state;
  const nb_values_t types[] = {NB_VALUES_INT8, NB_VALUES_FP16, NB_VALUES_BF16,
                               NB_VALUES_FP32, NB_VALUES_INT4, NB_VALUES_INT2};
  size_t n = 300007; /* more than one stream chunk of every type; odd, so packed bytes pad */
  float *x = malloc(n * 4), *out = malloc(n * 4), *want = malloc(n * 4), *deq = malloc(n * 4);
  assert_true(x && out && want && deq);
  for (size_t i = 0; i < n; i++) x[i] = heavy();
  for (int level = 0; level <= 3; level += 3)
    for (size_t t = 0; t < 6; t++) {
      nb_codec_t* c = make_codec(types[t], level, 128, 2);
      size_t cap = nb_codec_frame_bound(n, n, types[t], 128), len = 0;
      uint8_t* frame = malloc(cap);
      assert_non_null(frame);
      assert_int_equal(nb_codec_encode_dense(c, x, n, 9, 2, frame, cap, &len), NB_OK);
      nb_frame_info_t info;
      assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
      assert_int_equal(info.k, n);
      assert_int_equal(info.flags & NB_FRAME_FLAG_SPARSE, 0);
      reference_sent(types[t], 128, x, n, deq);
      for (size_t i = 0; i < n; i++) {
        out[i] = (float)i * 1e-3f;
        want[i] = out[i] + 0.5f * deq[i];
      }
      /* NULL codec: the call brings its own scratch */
      nb_status_t st = nb_codec_decode_accumulate(level ? NULL : c, frame, len, 0.5f, out, n, NULL);
      if (st != NB_OK) fail_msg("dense %s: %s", nb_values_name(types[t]), nb_error_last());
      assert_memory_equal(out, want, n * 4);
      nb_codec_destroy(c);
      free(frame);
    }
  free(x), free(out), free(want), free(deq);
}

/* ---- sub-int8 values: error bound against a double-precision reference ---- */

/* For each block of `block` consecutive values of x (the carried values, in order), the decoded
 * dec must be within half a quantization step of x: |dec - x| <= 0.5 * s with s = absmax / code
 * computed in double (plus a relative 2^-20 for the fp32 rounding of the scale and the
 * product). 2bit's step is 1 (levels -1.5..1.5), 4bit's 1 (codes -7..7). Also the largest value
 * of each block is reproduced within that rounding (absmax maps to the top code). */
static void check_block_error(nb_values_t v, uint32_t block, const float* x, const float* dec,
                              size_t k, const char* what) {
  double code = v == NB_VALUES_INT4 ? 7.0 : 1.5, worst = 0;
  size_t worst_i = 0;
  for (size_t b0 = 0; b0 < k; b0 += block) {
    size_t b1 = k - b0 < block ? k : b0 + block, top = b0;
    double amax = 0;
    for (size_t i = b0; i < b1; i++)
      if (fabs((double)x[i]) > amax) amax = fabs((double)x[i]), top = i;
    double s = amax / code, tol = 0.5 * s * (1 + 0x1.0p-20) + 1e-44;
    for (size_t i = b0; i < b1; i++) {
      double err = fabs((double)dec[i] - (double)x[i]);
      if (s > 0 && err / s > worst) worst = err / s, worst_i = i;
      if (err > tol)
        fail_msg("%s %s: value %zu = %a decoded %a, error %g > half a step %g", what,
                 nb_values_name(v), i, x[i], dec[i], err, 0.5 * s);
    }
    if (fabs((double)dec[top] - (double)x[top]) > amax * 0x1.0p-20)
      fail_msg("%s %s: block max %a (value %zu) decoded %a", what, nb_values_name(v), x[top], top,
               dec[top]);
  }
  print_message("%s %s block %u: worst error %.4f steps (value %zu)\n", what, nb_values_name(v),
                block, worst, worst_i);
}

static void test_lowbit_error_bound(void** state) {
  (void)state;
  const nb_values_t types[] = {NB_VALUES_INT4, NB_VALUES_INT2};
  const uint32_t blocks[] = {1, 3, 64, 256};
  size_t n = 20011;
  float *x = malloc(n * 4), *out = malloc(n * 4);
  assert_true(x && out);
  for (size_t i = 0; i < n; i++) x[i] = heavy();
  for (size_t i = 0; i < 64; i++) x[i] = 0.0f; /* an all-zero block decodes to zeros */
  for (size_t t = 0; t < 2; t++)
    for (size_t b = 0; b < 4; b++) {
      nb_codec_t* c = make_codec(types[t], 1, blocks[b], 1);
      size_t cap = nb_codec_frame_bound(n, n, types[t], blocks[b]), len = 0;
      uint8_t* frame = malloc(cap);
      assert_non_null(frame);
      assert_int_equal(nb_codec_encode_dense(c, x, n, 0, 0, frame, cap, &len), NB_OK);
      nb_frame_info_t info;
      assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
      assert_int_equal(info.value_bytes, types[t] == NB_VALUES_INT4 ? (n + 1) / 2 : (n + 3) / 4);
      assert_int_equal(info.scale_bytes, 4 * ((n + blocks[b] - 1) / blocks[b]));
      memset(out, 0, n * 4);
      assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
      check_block_error(types[t], blocks[b], x, out, n, "dense");
      if (blocks[b] == 64)
        for (size_t i = 0; i < 64; i++) assert_true(out[i] == 0.0f);
      nb_codec_destroy(c);
      free(frame);
    }
  free(x), free(out);
}

/* Sparse 4bit/2bit: the kept values (in index order) are within half a step of what the residual
 * held, blocks running over the kept values. */
static void test_lowbit_sparse_error_bound(void** state) {
  (void)state;
  const nb_values_t types[] = {NB_VALUES_INT4, NB_VALUES_INT2};
  size_t n = 100003;
  float *upd = malloc(n * 4), *res = calloc(n, 4), *out = calloc(n, 4);
  float *kept = malloc(n * 4), *dec = malloc(n * 4);
  assert_true(upd && res && out && kept && dec);
  for (size_t i = 0; i < n; i++) upd[i] = heavy();
  for (size_t t = 0; t < 2; t++)
    for (uint32_t chunk = 0; chunk <= 1024; chunk += 1024) {
      nb_codec_t* c = make_codec_chunked(types[t], 1, 64, 1, chunk);
      size_t cap = nb_codec_frame_bound(n, n, types[t], 64), len = 0;
      uint8_t* frame = malloc(cap);
      assert_non_null(frame);
      memset(res, 0, n * 4);
      memset(out, 0, n * 4);
      assert_int_equal(nb_codec_encode_sparse(c, upd, res, n, 0.03, 0, 0, frame, cap, &len), NB_OK);
      assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
      size_t k = 0;
      for (size_t i = 0; i < n; i++)
        if (res[i] != upd[i] || out[i] != 0.0f) { /* a kept value: res = upd - sent */
          kept[k] = upd[i];
          dec[k++] = out[i];
        }
      nb_frame_info_t info;
      assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
      assert_int_equal(k, info.k);
      check_block_error(types[t], 64, kept, dec, k, chunk ? "sparse chunked" : "sparse");
      nb_codec_destroy(c);
      free(frame);
    }
  free(upd), free(res), free(out), free(kept), free(dec);
}

/* ---- chunked top-k ---- */

/* An independent reader of a stored frame's chunked Rice section (bit by bit, as
 * docs/wire-format.md words it): checks its layout, that it lists exactly want[0..kt), that r
 * is the best parameter of all (for these smooth inputs the encoder's few candidates hold it)
 * and that the section is smaller than the plain chunked one. */
static void check_rice_section(const uint8_t* frame, size_t len, size_t n, const uint32_t* want,
                               size_t kt) {
  nb_frame_info_t info;
  assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
  assert_int_equal(info.index_coding, NB_INDEX_CHUNKED_RICE);
  assert_false(info.flags & NB_FRAME_FLAG_ZSTD);
  const uint8_t* p = frame + NB_FRAME_HEADER_BYTES + info.scale_bytes + info.value_bytes;
  size_t ib = (size_t)info.index_bytes;
  uint32_t chunk, kc;
  memcpy(&chunk, p, 4);
  memcpy(&kc, p + 4, 4);
  unsigned r = p[8], lg = 0;
  while ((1u << lg) < chunk) lg++;
  assert_true(r < lg);
  assert_true(p[9] == 0 && p[10] == 0 && p[11] == 0);
  size_t bit = 0, j = 0;
#define RICE_BIT() (assert_true(bit < 8 * (ib - 12)), (p[12 + bit / 8] >> (bit % 8)) & 1u)
  for (size_t b = 0; b < n; b += chunk) {
    size_t cl = n - b < chunk ? n - b : chunk, cnt = cl == chunk ? kc : kc * cl / chunk, next = 0;
    for (size_t e = j + cnt; j < e; j++) {
      size_t q = 0, low = 0;
      while (RICE_BIT()) q++, bit++;
      bit++;
      for (unsigned i = 0; i < r; i++, bit++) low |= (size_t)RICE_BIT() << i;
      size_t off = next + (q << r) + low;
      assert_true(off < cl);
      assert_true(j < kt);
      if (b + off != want[j]) fail_msg("rice index %zu: %zu, want %u", j, b + off, want[j]);
      next = off + 1;
    }
  }
#undef RICE_BIT
  assert_int_equal(j, kt);
  assert_int_equal(ib, 12 + (bit + 7) / 8);
  for (; bit < 8 * (ib - 12); bit++) assert_int_equal((p[12 + bit / 8] >> (bit % 8)) & 1u, 0);
  /* every parameter's exact cost: the chosen one is the cheapest */
  size_t best = SIZE_MAX, at_r = 0;
  for (unsigned rr = 0; rr < lg; rr++) {
    size_t bits = 0, prev = 0;
    for (size_t i = 0; i < kt; i++) {
      size_t b = want[i] / chunk * chunk, first = i == 0 || want[i - 1] < b;
      size_t g = first ? want[i] - b : want[i] - prev - 1;
      bits += (g >> rr) + 1 + rr;
      prev = want[i];
    }
    if (bits < best) best = bits;
    if (rr == r) at_r = bits;
  }
  if (at_r != best) fail_msg("rice r = %u costs %zu bits, the best r %zu", r, at_r, best);
  assert_true(ib < 8 + (kt * lg + 7) / 8);
}

/* One chunked round trip: the kept set is the exact top-kk of every chunk (checked with nb_topk
 * on each chunk), the decoded values are the kernels' quantization of them, the EF invariant
 * holds, and another thread count gives the same bytes and residual. want_coding < 0: any
 * coding. A stored Rice section is also read by check_rice_section. Returns the coding. */
static int chunked_round_trip_k(size_t n, uint32_t chunk, size_t k, nb_values_t v, int level,
                                int threads, int with_residual, int want_coding) {
  size_t kc = (size_t)((uint64_t)k * chunk / n), nch = (n + chunk - 1) / chunk;
  float *upd = malloc(n * 4), *res = malloc(n * 4), *r = malloc(n * 4), *out = calloc(n, 4),
        *res2 = malloc(n * 4), *vals = malloc(n * 4), *deq = malloc(n * 4);
  uint32_t* idx = malloc(n * 4);
  size_t cap = nb_codec_frame_bound(n, k, v, 64), len = 0, len2 = 0;
  uint8_t *frame = malloc(cap), *frame2 = malloc(cap);
  assert_true(upd && res && r && out && res2 && vals && deq && idx && frame && frame2);
  for (size_t i = 0; i < n; i++) {
    upd[i] = heavy();
    res[i] = with_residual ? 0.1f * heavy() : 0.0f;
    r[i] = res[i] + upd[i];
  }
  memcpy(res2, res, n * 4);
  size_t kt = 0;
  for (size_t ch = 0; ch < nch; ch++) {
    size_t b = ch * chunk, cl = n - b < chunk ? n - b : chunk;
    size_t kk = cl == chunk ? kc : kc * cl / chunk;
    assert_int_equal(nb_topk(r + b, cl, kk, idx + kt), NB_OK);
    for (size_t j = 0; j < kk; j++) idx[kt + j] += (uint32_t)b;
    kt += kk;
  }
  assert_true(kt <= k);
  for (size_t j = 0; j < kt; j++) vals[j] = r[idx[j]];
  reference_sent(v, 64, vals, kt, deq);

  nb_codec_t* c = make_codec_chunked(v, level, 64, threads, chunk);
  float* rp = with_residual ? res : NULL;
  nb_status_t st = nb_codec_encode_sparse_k(c, upd, rp, n, k, 4, 2, frame, cap, &len);
  if (st != NB_OK) fail_msg("chunked encode n=%zu C=%u: %s", n, chunk, nb_error_last());
  nb_frame_info_t info;
  assert_int_equal(nb_codec_frame_info(frame, len, NULL, &info), NB_OK);
  assert_int_equal(info.k, kt);
  if (want_coding >= 0 && (int)info.index_coding != want_coding)
    fail_msg("chunked n=%zu C=%u k=%zu %s: index coding %d, want %d", n, chunk, k,
             nb_values_name(v), (int)info.index_coding, want_coding);
  if (info.index_coding == NB_INDEX_CHUNKED_RICE && !(info.flags & NB_FRAME_FLAG_ZSTD))
    check_rice_section(frame, len, n, idx, kt);
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    float sent = 0.0f;
    if (j < kt && idx[j] == i) sent = deq[j++];
    if (out[i] != sent)
      fail_msg("chunked n=%zu C=%u %s: decoded[%zu] = %a, want %a", n, chunk, nb_values_name(v), i,
               out[i], sent);
    if (with_residual) ef_check(i, out[i], res[i], r[i], v);
  }
  nb_codec_t* c2 = make_codec_chunked(v, level, 64, threads == 1 ? 2 : 1, chunk);
  float* rp2 = with_residual ? res2 : NULL;
  assert_int_equal(nb_codec_encode_sparse_k(c2, upd, rp2, n, k, 4, 2, frame2, cap, &len2), NB_OK);
  assert_int_equal(len, len2);
  assert_memory_equal(frame, frame2, len);
  if (with_residual) assert_memory_equal(res, res2, n * 4);
  nb_codec_destroy(c);
  nb_codec_destroy(c2);
  free(upd), free(res), free(r), free(out), free(res2), free(vals), free(deq), free(idx);
  free(frame), free(frame2);
  return (int)info.index_coding;
}

static void chunked_round_trip(size_t n, uint32_t chunk, double density, nb_values_t v, int level,
                               int threads, int with_residual, nb_index_coding_t want_coding) {
  chunked_round_trip_k(n, chunk, nb_codec_k_for_density(n, density), v, level, threads,
                       with_residual, (int)want_coding);
}

static void test_chunked(void** state) {
  (void)state;
  const nb_values_t types[] = {NB_VALUES_INT2, NB_VALUES_INT4, NB_VALUES_INT8, NB_VALUES_FP16,
                               NB_VALUES_FP32};
  for (size_t t = 0; t < 5; t++) {
    chunked_round_trip(1000, 64, 0.1, types[t], 0, 1, 1, NB_INDEX_CHUNKED_RICE);
    chunked_round_trip(70001, 256, 0.015, types[t], 1, 1, 1, NB_INDEX_CHUNKED_RICE);
    chunked_round_trip(70001, 4096, 0.03, types[t], 3, 1, 0, NB_INDEX_CHUNKED_RICE);
  }
  /* tiny vectors: everything sent, coded as the smallest section */
  chunked_round_trip(1, 16, 1.0, NB_VALUES_INT2, 0, 1, 1, NB_INDEX_DELTA_VARINT);
  chunked_round_trip(17, 16, 1.0, NB_VALUES_INT4, 0, 1, 1, NB_INDEX_BITMAP);
  {
    nb_codec_t* c = make_codec_chunked(NB_VALUES_INT2, 1, 64, 2, 4096);
    uint8_t frame[256];
    size_t len = 0;
    assert_int_equal(nb_codec_encode_sparse(c, NULL, NULL, 0, 0.5, 0, 0, frame, sizeof frame, &len),
                     NB_OK);
    assert_int_equal(len, NB_FRAME_HEADER_BYTES);
    assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, NULL, 0, NULL), NB_OK);
    nb_codec_destroy(c);
  }
  /* a chunk larger than n: one (short) chunk */
  chunked_round_trip(3000, 4096, 0.05, NB_VALUES_INT2, 1, 1, 1, NB_INDEX_CHUNKED_RICE);
  /* 10%: Rice (gaps ~10: about 5 bits) beats 12-bit offsets, varint (one byte per gap) and the
   * bitmap (10 bits per index); Rice with r = 0 costs one bit per position up to a chunk's
   * last offset, so the bitmap wins only where that saves less than Rice's head: when
   * everything is sent */
  chunked_round_trip(70001, 4096, 0.10, NB_VALUES_INT8, 1, 1, 1, NB_INDEX_CHUNKED_RICE);
  chunked_round_trip(70001, 4096, 0.30, NB_VALUES_INT8, 1, 1, 1, NB_INDEX_CHUNKED_RICE);
  chunked_round_trip(70001, 4096, 1.0, NB_VALUES_INT8, 1, 1, 1, NB_INDEX_BITMAP);
  /* k too small for the section head: varint */
  chunked_round_trip(70001, 4096, 0.0001, NB_VALUES_INT8, 1, 1, 1, NB_INDEX_DELTA_VARINT);
  /* kc = floor(k C / n) = 0: nothing is sent, everything stays in the residual */
  chunked_round_trip(70001, 64, 0.001, NB_VALUES_INT2, 1, 1, 1, NB_INDEX_DELTA_VARINT);
  /* threaded (n >= 2^20), against one thread */
  chunked_round_trip((1u << 20) + 77, 4096, 0.015, NB_VALUES_INT2, 1, 2, 1, NB_INDEX_CHUNKED_RICE);
  chunked_round_trip((1u << 20) + 77, 1024, 0.03, NB_VALUES_INT4, 1, 4, 1, NB_INDEX_CHUNKED_RICE);
}

/* Chunked Rice index coding over every chunk size: kc per chunk at the densities chunked 2-bit
 * runs at (1.5, 3, 5 %), a short last chunk (n not a multiple of C), a single short chunk,
 * kc = 0, 1, C / 2 and C, every value type, stored and zstd. k is chosen so that
 * floor(k C / n) is exactly the kc wanted. Rice must win wherever a chunk keeps a few values
 * and the 12-byte head is small against the section (C >= 256 here); elsewhere the smallest
 * coding is whichever it is, and the round trip is checked all the same. */
static void test_chunked_rice(void** state) {
  (void)state;
  const uint32_t chunks[] = {16, 64, 256, 1024, 4096, 16384, 65536};
  const double dens[] = {0.015, 0.03, 0.05};
  for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
    uint32_t C = chunks[ci];
    size_t n = (size_t)(C <= 4096 ? 40 : 8) * C + C / 3 + 5;
    for (size_t di = 0; di < 3; di++) {
      size_t kc = (size_t)(dens[di] * C + 0.5);
      if (kc == 0) kc = 1;
      size_t k = (kc * n + C - 1) / C;
      assert_int_equal(k * C / n, kc);
      chunked_round_trip_k(n, C, k, NB_VALUES_INT2, 0, 1, 1, C >= 256 ? NB_INDEX_CHUNKED_RICE : -1);
    }
    chunked_round_trip_k(n, C, n / C / 2, NB_VALUES_INT2, 0, 1, 1,
                         NB_INDEX_DELTA_VARINT);                              /* kc 0 */
    chunked_round_trip_k(n, C, (n + C - 1) / C, NB_VALUES_INT4, 0, 1, 1, -1); /* kc = 1 */
    chunked_round_trip_k(n, C, n / 2 + 1, NB_VALUES_INT4, 0, 1, 1, -1);       /* kc = C / 2 */
    chunked_round_trip_k(n, C, n, NB_VALUES_INT8, 0, 1, 1, -1);               /* kc = C */
    if (C >= 4096) /* one short chunk: n < C */
      chunked_round_trip_k(C / 2 + 3, C, (C / 2 + 3) / 20, NB_VALUES_INT2, 0, 1, 1,
                           NB_INDEX_CHUNKED_RICE);
  }
  const nb_values_t types[] = {NB_VALUES_FP32, NB_VALUES_FP16, NB_VALUES_BF16,
                               NB_VALUES_INT8, NB_VALUES_INT4, NB_VALUES_INT2};
  for (size_t t = 0; t < 6; t++) {
    size_t n = 100 * 4096 + 1234, k = nb_codec_k_for_density(n, 0.03);
    chunked_round_trip_k(n, 4096, k, types[t], 0, 1, 1, NB_INDEX_CHUNKED_RICE);
    chunked_round_trip_k(n, 4096, k, types[t], 1, 1, 0, NB_INDEX_CHUNKED_RICE);
  }
  /* threaded (n >= 2^20) against one thread, a short last chunk included */
  chunked_round_trip((1u << 20) + 3 * 4096 + 77, 4096, 0.03, NB_VALUES_INT2, 0, 2, 1,
                     NB_INDEX_CHUNKED_RICE);
  chunked_round_trip((1u << 20) + 999, 65536, 0.015, NB_VALUES_INT4, 1, 1, 1,
                     NB_INDEX_CHUNKED_RICE);
}

/* Scale changes between chunks (the carried threshold is far off both ways) and ties. */
static void test_chunked_scales_and_ties(void** state) {
  (void)state;
  size_t n = 40000, chunk = 256, k = 4000; /* 25 per chunk */
  float *upd = malloc(n * 4), *out = calloc(n, 4);
  size_t cap = nb_codec_frame_bound(n, k, NB_VALUES_FP32, 64), len = 0;
  uint8_t* frame = malloc(cap);
  assert_true(upd && out && frame);
  for (size_t i = 0; i < n; i++) {
    size_t ch = i / chunk;
    float scale = ch % 3 == 0 ? 1e-6f : ch % 3 == 1 ? 1e3f : 1.0f;
    upd[i] = ch % 5 == 4 ? 1.0f : scale * heavy(); /* every fifth chunk: all ties */
  }
  nb_codec_t* c = make_codec_chunked(NB_VALUES_FP32, 0, 64, 1, (uint32_t)chunk);
  assert_int_equal(nb_codec_encode_sparse_k(c, upd, NULL, n, k, 0, 0, frame, cap, &len), NB_OK);
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
  uint32_t idx[25];
  for (size_t ch = 0; ch < n / chunk; ch++) {
    assert_int_equal(nb_topk(upd + ch * chunk, chunk, 25, idx), NB_OK);
    size_t j = 0;
    for (size_t i = 0; i < chunk; i++) {
      float want = (j < 25 && idx[j] == i) ? upd[ch * chunk + i] : 0.0f;
      j += j < 25 && idx[j] == i;
      if (out[ch * chunk + i] != want)
        fail_msg("chunk %zu: decoded[%zu] = %g, want %g", ch, ch * chunk + i, out[ch * chunk + i],
                 want);
    }
    if (ch % 5 == 4) /* ties: the lowest indices of the chunk */
      for (size_t i = 0; i < chunk; i++) assert_true((out[ch * chunk + i] != 0.0f) == (i < 25));
  }
  nb_codec_destroy(c);
  free(upd), free(out), free(frame);
}

/* ---- non-finite values can be neither produced nor accepted ---- */

static void assert_all_finite(const float* x, size_t n, const char* what) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) fail_msg("%s: value %zu is %g", what, i, x[i]);
}

static void test_scale_bound(void** state) {
  (void)state;
  const float codes[] = {NB_QUANT_INT8_MAX, NB_QUANT_INT4_MAX, NB_QUANT_INT2_MAX};
  for (int i = 0; i < 3; i++) {
    float s = nb_quant_scale_max(codes[i]);
    assert_true(isfinite(codes[i] * s));
    assert_false(isfinite(codes[i] * nextafterf(s, INFINITY)));
  }
  /* the red-team case: the old bound FLT_MAX / 127 is above the finite one */
  assert_false(isfinite(127.0f * (FLT_MAX / 127.0f)));
  assert_true(FLT_MAX / 127.0f > nb_quant_scale_max(127.0f));
}

/* Finite input holding +-FLT_MAX: every codec encodes it, every decoded value is finite, the
 * residual stays finite and keeps what was not sent. */
static void test_nonfinite_encode(void** state) {
  (void)state;
  const nb_values_t types[] = {NB_VALUES_INT8, NB_VALUES_INT4, NB_VALUES_INT2,
                               NB_VALUES_FP16, NB_VALUES_BF16, NB_VALUES_FP32};
  size_t n = 1000;
  float *x = malloc(n * 4), *res = malloc(n * 4), *out = malloc(n * 4), *r = malloc(n * 4);
  assert_true(x && res && out && r);
  for (size_t t = 0; t < 6; t++)
    for (uint32_t chunk = 0; chunk <= 64; chunk += 64) {
      for (size_t i = 0; i < n; i++) x[i] = heavy();
      x[3] = FLT_MAX, x[4] = -FLT_MAX, x[70] = -FLT_MAX, x[500] = nextafterf(FLT_MAX, 0);
      nb_codec_t* c = make_codec_chunked(types[t], 1, 16, 1, chunk);
      size_t cap = nb_codec_frame_bound(n, n, types[t], 16), len = 0;
      uint8_t* frame = malloc(cap);
      assert_non_null(frame);
      /* dense */
      assert_int_equal(nb_codec_encode_dense(c, x, n, 0, 0, frame, cap, &len), NB_OK);
      memset(out, 0, n * 4);
      nb_status_t st = nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL);
      if (st != NB_OK) fail_msg("dense %s: %s", nb_values_name(types[t]), nb_error_last());
      assert_all_finite(out, n, nb_values_name(types[t]));
      assert_true(out[3] > 0 && out[4] < 0);
      /* sparse with error feedback, the extremes in the residual */
      memset(res, 0, n * 4);
      memcpy(r, x, n * 4);
      assert_int_equal(nb_codec_encode_sparse(c, x, res, n, 0.1, 0, 0, frame, cap, &len), NB_OK);
      memset(out, 0, n * 4);
      assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL), NB_OK);
      assert_all_finite(out, n, "sparse decoded");
      assert_all_finite(res, n, "residual");
      for (size_t i = 0; i < n; i++) { /* sent + residual == r up to one rounding (double) */
        double err = fabs((double)out[i] + (double)res[i] - (double)r[i]);
        if (err > 0x1.0p-24 * (fabs((double)r[i]) + fabs((double)out[i])))
          fail_msg("%s: sent %a + residual %a != %a", nb_values_name(types[t]), out[i], res[i],
                   r[i]);
      }
      if (types[t] == NB_VALUES_FP32) assert_true(out[3] == FLT_MAX && res[3] == 0.0f);
      /* residual + update overflows: refused, naming the index, nothing sent */
      for (size_t i = 0; i < n; i++) res[i] = 0.0f;
      res[4] = -FLT_MAX;
      st = nb_codec_encode_sparse(c, x, res, n, 0.1, 0, 0, frame, cap, &len);
      assert_int_equal(st, NB_ERR_INVALID);
      assert_non_null(strstr(nb_error_last(), "non-finite value at index 4"));
      /* a non-finite input is refused by the dense encoder too */
      x[9] = INFINITY;
      assert_int_equal(nb_codec_encode_dense(c, x, n, 0, 0, frame, cap, &len), NB_ERR_INVALID);
      x[9] = NAN;
      memset(res, 0, n * 4);
      assert_int_equal(nb_codec_encode_sparse(c, x, res, n, 0.1, 0, 0, frame, cap, &len),
                       NB_ERR_INVALID);
      nb_codec_destroy(c);
      free(frame);
    }
  free(x), free(res), free(out), free(r);
}

/* The decoder side: a frame whose scale is one step past the finite bound is refused with
 * NB_ERR_CODEC, at the bound it decodes to finite values; for every block type. */
static void test_nonfinite_decode(void** state) {
  (void)state;
  const nb_values_t types[] = {NB_VALUES_INT8, NB_VALUES_INT4, NB_VALUES_INT2};
  const float codes[] = {127.0f, 7.0f, 1.5f};
  size_t n = 64;
  float x[64], out[64];
  for (size_t t = 0; t < 3; t++)
    for (int dense = 0; dense < 2; dense++) {
      for (size_t i = 0; i < n; i++) x[i] = (float)(i + 1);
      nb_codec_t* c = make_codec(types[t], 0, 16, 1);
      uint8_t frame[1024];
      size_t len = 0;
      nb_status_t st =
          dense ? nb_codec_encode_dense(c, x, n, 0, 0, frame, sizeof frame, &len)
                : nb_codec_encode_sparse(c, x, NULL, n, 0.5, 0, 0, frame, sizeof frame, &len);
      assert_int_equal(st, NB_OK);
      float smax = nb_quant_scale_max(codes[t]), bad = nextafterf(smax, INFINITY);
      float tries[] = {smax, bad, INFINITY, NAN, -1.0f, FLT_MAX / codes[t]};
      for (int j = 0; j < 6; j++) {
        memcpy(frame + NB_FRAME_HEADER_BYTES + 4, &tries[j], 4); /* scale 1 */
        uint64_t pb, sum;
        memcpy(&pb, frame + 72, 8);
        sum = nb_xxh3_64(frame + NB_FRAME_HEADER_BYTES, pb, nb_xxh3_64(frame, 80, 0));
        memcpy(frame + 80, &sum, 8);
        for (size_t i = 0; i < n; i++) out[i] = 1.0f;
        st = nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL);
        int ok = tries[j] == smax || (j == 5 && isfinite(codes[t] * tries[j]));
        if (ok) {
          if (st != NB_OK)
            fail_msg("%s scale %a: %s", nb_values_name(types[t]), tries[j], nb_error_last());
          assert_all_finite(out, n, "decoded at the bound");
        } else {
          if (st != NB_ERR_CODEC)
            fail_msg("%s scale %a accepted", nb_values_name(types[t]), tries[j]);
          assert_non_null(strstr(nb_error_last(), "scale 1"));
          for (size_t i = 0; i < n; i++) assert_true(out[i] == 1.0f);
        }
      }
      nb_codec_destroy(c);
    }
}

static void test_arguments(void** state) {
  (void)state;
  nb_codec_config_t cfg;
  nb_codec_config_default(&cfg);
  assert_int_equal(cfg.values, NB_VALUES_INT8);
  nb_codec_t* c = NULL;
  cfg.threads = 0;
  assert_int_equal(nb_codec_create(&cfg, &c), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "threads"));
  nb_codec_config_default(&cfg);
  cfg.block_size = 0;
  assert_int_equal(nb_codec_create(&cfg, &c), NB_ERR_INVALID);
  nb_codec_config_default(&cfg);
  cfg.zstd_level = 42;
  assert_int_equal(nb_codec_create(&cfg, &c), NB_ERR_INVALID);
  nb_codec_config_default(&cfg);
  cfg.values = (nb_values_t)9;
  assert_int_equal(nb_codec_create(&cfg, &c), NB_ERR_INVALID);
  const uint32_t bad_chunks[] = {1, 8, 100, 4097, 1u << 17};
  for (int i = 0; i < 5; i++) {
    nb_codec_config_default(&cfg);
    cfg.topk_chunk = bad_chunks[i];
    assert_int_equal(nb_codec_create(&cfg, &c), NB_ERR_INVALID);
    assert_non_null(strstr(nb_error_last(), "topk_chunk"));
  }
  nb_codec_config_default(&cfg);
  assert_int_equal(cfg.topk_chunk, 0); /* the default: global top-k, frames as before */
  assert_null(c);
  nb_codec_destroy(NULL);

  nb_values_t v;
  assert_int_equal(nb_values_parse("bf16", &v), NB_OK);
  assert_int_equal(v, NB_VALUES_BF16);
  assert_int_equal(nb_values_parse("int4", &v), NB_ERR_INVALID);
  assert_int_equal(nb_values_parse("2bit", &v), NB_OK);
  assert_int_equal(v, NB_VALUES_INT2);
  assert_int_equal(nb_values_parse("4BIT", &v), NB_OK);
  assert_int_equal(v, NB_VALUES_INT4);
  assert_string_equal(nb_values_name(NB_VALUES_INT2), "2bit");
  assert_int_equal(nb_codec_k_for_density(1000, 0.01), 10);
  assert_int_equal(nb_codec_k_for_density(1000, 2.0), 1000);
  assert_int_equal(nb_codec_k_for_density(1000, -1.0), 0);
  assert_int_equal(nb_codec_k_for_density(4, 0.01), 1); /* a small model still sends */
  assert_int_equal(nb_codec_k_for_density(0, 0.5), 0);

  c = make_codec(NB_VALUES_INT8, 1, 256, 2);
  float x[100], res[100] = {0};
  uint8_t frame[2048];
  size_t len;
  for (int i = 0; i < 100; i++) x[i] = (float)i;
  assert_int_equal(nb_codec_encode_sparse(c, x, res, 100, 1.5, 0, 0, frame, sizeof frame, &len),
                   NB_ERR_INVALID);
  assert_int_equal(nb_codec_encode_sparse(c, NULL, res, 100, 0.1, 0, 0, frame, sizeof frame, &len),
                   NB_ERR_INVALID);
  assert_int_equal(nb_codec_encode_sparse(c, x, res, 100, 0.5, 0, 0, frame, 90, &len),
                   NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "too small"));
  for (int i = 0; i < 100; i++) assert_true(res[i] == 0.0f); /* refused before any change */
  x[42] = NAN;
  assert_int_equal(nb_codec_encode_sparse(c, x, NULL, 100, 0.1, 0, 0, frame, sizeof frame, &len),
                   NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "index 42"));
  assert_int_equal(nb_codec_encode_dense(c, x, 100, 0, 0, frame, sizeof frame, &len),
                   NB_ERR_INVALID);
  x[42] = 1.0f;
  assert_int_equal(nb_codec_encode_sparse(c, x, NULL, 100, 0.1, 0, 0, frame, sizeof frame, &len),
                   NB_OK);
  float out[100] = {0};
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, out, 99, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "n = 100"));
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, NAN, out, 100, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_codec_decode_accumulate(c, NULL, len, 1.0f, out, 100, NULL), NB_ERR_INVALID);
  /* an empty vector is a valid (empty) frame both ways */
  assert_int_equal(nb_codec_encode_sparse(c, NULL, NULL, 0, 0.5, 0, 0, frame, sizeof frame, &len),
                   NB_OK);
  assert_int_equal(len, NB_FRAME_HEADER_BYTES);
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, NULL, 0, NULL), NB_OK);
  assert_int_equal(nb_codec_encode_dense(c, NULL, 0, 0, 0, frame, sizeof frame, &len), NB_OK);
  assert_int_equal(nb_codec_decode_accumulate(c, frame, len, 1.0f, NULL, 0, NULL), NB_OK);
  nb_codec_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_round_trips_large),
      cmocka_unit_test(test_ties_and_rescans),
      cmocka_unit_test(test_sample_misses),
      cmocka_unit_test(test_error_feedback_rounds),
      cmocka_unit_test(test_error_feedback_bounded),
      cmocka_unit_test(test_index_coding_choice),
      cmocka_unit_test(test_dense),
      cmocka_unit_test(test_lowbit_error_bound),
      cmocka_unit_test(test_lowbit_sparse_error_bound),
      cmocka_unit_test(test_chunked),
      cmocka_unit_test(test_chunked_rice),
      cmocka_unit_test(test_chunked_scales_and_ties),
      cmocka_unit_test(test_scale_bound),
      cmocka_unit_test(test_nonfinite_encode),
      cmocka_unit_test(test_nonfinite_decode),
      cmocka_unit_test(test_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
