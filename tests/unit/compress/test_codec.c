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

static nb_codec_t* make_codec(nb_values_t v, int level, uint32_t block, int threads) {
  nb_codec_config_t cfg;
  nb_codec_config_default(&cfg);
  cfg.values = v;
  cfg.zstd_level = level;
  cfg.block_size = block;
  cfg.threads = threads;
  nb_codec_t* c = NULL;
  assert_int_equal(nb_codec_create(&cfg, &c), NB_OK);
  return c;
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
  assert_null(c);
  nb_codec_destroy(NULL);

  nb_values_t v;
  assert_int_equal(nb_values_parse("bf16", &v), NB_OK);
  assert_int_equal(v, NB_VALUES_BF16);
  assert_int_equal(nb_values_parse("int4", &v), NB_ERR_INVALID);
  assert_int_equal(nb_codec_k_for_density(1000, 0.01), 10);
  assert_int_equal(nb_codec_k_for_density(1000, 2.0), 1000);
  assert_int_equal(nb_codec_k_for_density(1000, -1.0), 0);

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
      cmocka_unit_test(test_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
