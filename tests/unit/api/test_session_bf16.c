/* bf16 and fp16 tensors through libnebula.so and <nebula.h> only: two clusters (threads,
 * loopback), each with a 16-bit tensor "w" (bf16, then fp16) and an fp32 tensor "b", several rounds
 * of a deterministic update of their own. After every round both clusters hold the same buffers and
 * the same fp32 master (nb_session_read_global), and every bf16 element is the master rounded to
 * nearest even, checked against this file's own reference conversion (by distances in double, not
 * by bit tricks). An idle round moves nothing (the bf16 rounding of theta_global is not an update),
 * and a dtype that differs between the clusters is refused at start naming the tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <nebula.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "session_pair.h"

#define NW 96 /* w: (8, 12) bf16 */
#define NB 10 /* b: (10) fp32 */
#define ROUNDS 6

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bf16_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}
/* fp16 bits as a value, by the format's definition (finite values only) */
static float fp16_f32(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return (float)((h & 0x8000) ? -v : v);
}
/* The reference fp16 rounding of a finite x within the range: the largest positive fp16 not
 * above |x| (a binary search over the ordered positive encodings) and the next one, the nearer
 * in double, the even one on a tie. */
static uint16_t ref_fp16(float x) {
  double a = fabs((double)x);
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
    if ((double)fp16_f32(mid) <= a)
      lo = mid;
    else
      hi = (uint16_t)(mid - 1);
  }
  uint16_t up = (uint16_t)(lo + 1);
  double dl = a - (double)fp16_f32(lo), dh = (double)fp16_f32(up) - a;
  uint16_t r = dl < dh ? lo : dh < dl ? up : (lo & 1) ? up : lo;
  return (uint16_t)(r | (x < 0 ? 0x8000 : 0));
}

/* The reference: the two bf16 neighbours of a finite x (truncation toward zero, and one step
 * away from zero), the nearer one in double, the even one on a tie. */
static uint16_t ref_bf16(float x) {
  uint16_t lo = (uint16_t)(f32_bits(x) >> 16), hi = (uint16_t)(lo + 1);
  double dl = fabs((double)x - (double)bf16_f32(lo)), dh = fabs((double)bf16_f32(hi) - (double)x);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

/* The 16-bit type under test (bf16, then fp16): its value of bits h and its rounding of x. */
static nb_dtype_t g_half = NB_DTYPE_BF16;
static float half_f32(uint16_t h) {
  return g_half == NB_DTYPE_FP16 ? fp16_f32(h) : bf16_f32(h);
}
static uint16_t ref_half(float x) {
  return g_half == NB_DTYPE_FP16 ? ref_fp16(x) : ref_bf16(x);
}

typedef struct {
  int index;
  uint16_t w[NW]; /* (8, 12) bf16 or fp16 bits */
  float b[NB];
  nb_session_t* s;
  nb_dtype_t w_dtype; /* the mismatch test registers fp32 at one cluster */
  float w32[NW];      /* w's memory when registered as fp32 */
  nb_status_t st;
  char msg[512];
  int rounds_done, idle_ok, idle_checked;
  uint64_t hash[ROUNDS + 1];
  float master[ROUNDS][NW];
  uint16_t wbuf[ROUNDS][NW];
  float bbuf[ROUNDS][NB];
  long not_bf16; /* master elements that bf16 cannot hold: the rounding had work to do */
  int rounding_bad;
} side_t;

static const uint8_t secret[32] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6,
                                   7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2};

static void side_open(side_t* sd, const char* job) {
  for (int i = 0; i < NW; i++) {
    sd->w[i] = ref_half((float)(sin(0.37 * i + sd->index) * (1 + i % 7)));
    sd->w32[i] = half_f32(sd->w[i]);
  }
  for (int i = 0; i < NB; i++) sd->b[i] = (float)(0.1 * i - 0.3 * sd->index);
  nb_session_options_t o;
  pair_options(&o, job, sd->index, secret);
  o.outer_lr = 0.8f;
  o.outer_momentum = 0.0f; /* so that an idle round is a zero step */
  o.density = 1;           /* dense fp32 frames: lossless, no residual to carry */
  o.values = "fp32";
  assert_int_equal(nb_session_open(&o, &sd->s), NB_OK);
  int64_t ws[2] = {8, 12}, bs[1] = {NB};
  void* w = sd->w_dtype != NB_DTYPE_FP32 ? (void*)sd->w : (void*)sd->w32;
  assert_int_equal(nb_session_register_dtype(sd->s, "w", w, sd->w_dtype, ws, 2), NB_OK);
  assert_int_equal(nb_session_register(sd->s, "b", sd->b, bs, 1), NB_OK);
}

static void sides_connect(side_t* a, side_t* b) {
  assert_int_equal(pair_connect(a->s, b->s), NB_OK);
}

static nb_status_t side_fail(side_t* sd, nb_status_t st) {
  sd->st = st;
  snprintf(sd->msg, sizeof sd->msg, "%s", nb_error_last());
  return st;
}

/* The cluster's "training": a small update of its own to every element, w's in bf16 (what a
 * bf16 optimizer step leaves in the buffer). */
static void side_train(side_t* sd, int r) {
  for (int i = 0; i < NW; i++) {
    float v = half_f32(sd->w[i]);
    v += (float)(0.013 * cos(0.11 * i * (r + 1) + sd->index) * (1 + sd->index));
    sd->w[i] = ref_half(v);
  }
  for (int i = 0; i < NB; i++) sd->b[i] -= (float)(0.01 * (i + 1) * (sd->index + 1));
}

static void* side_main(void* arg) {
  side_t* sd = arg;
  nb_status_t st = nb_session_start(sd->s);
  if (st != NB_OK) return (void*)(intptr_t)side_fail(sd, st);
  sd->hash[0] = nb_session_global_hash(sd->s);
  for (int r = 0; r < ROUNDS; r++) {
    side_train(sd, r);
    st = nb_session_round(sd->s, 16, NULL);
    if (st != NB_OK) return (void*)(intptr_t)side_fail(sd, st);
    sd->hash[r + 1] = nb_session_global_hash(sd->s);
    st = nb_session_read_global(sd->s, "w", sd->master[r], NW);
    if (st != NB_OK) return (void*)(intptr_t)side_fail(sd, st);
    memcpy(sd->wbuf[r], sd->w, sizeof sd->w);
    memcpy(sd->bbuf[r], sd->b, sizeof sd->b);
    for (int i = 0; i < NW; i++) {
      if (half_f32(ref_half(sd->master[r][i])) != sd->master[r][i]) sd->not_bf16++;
      if (sd->w[i] != ref_half(sd->master[r][i])) sd->rounding_bad++;
    }
    sd->rounds_done = r + 1;
  }
  /* an idle round: neither cluster touched its buffers since the last one */
  uint64_t before = nb_session_global_hash(sd->s);
  uint16_t w[NW];
  memcpy(w, sd->w, sizeof w);
  st = nb_session_round(sd->s, 16, NULL);
  if (st != NB_OK) return (void*)(intptr_t)side_fail(sd, st);
  sd->idle_checked = 1;
  sd->idle_ok = nb_session_global_hash(sd->s) == before && !memcmp(w, sd->w, sizeof w);
  st = nb_session_finish(sd->s);
  if (st != NB_OK) side_fail(sd, st);
  return NULL;
}

static void run_pair(side_t* sd, void* (*fn)(void*)) {
  pthread_t th[2];
  for (int c = 0; c < 2; c++) assert_int_equal(pthread_create(&th[c], NULL, fn, &sd[c]), 0);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
}

static side_t sides[2];

static void half_and_fp32_rounds(nb_dtype_t half, const char* job) {
  g_half = half;
  side_t* sd = sides;
  memset(sd, 0, sizeof sides);
  for (int c = 0; c < 2; c++) {
    sd[c].index = c;
    sd[c].w_dtype = half;
    side_open(&sd[c], job);
  }
  uint16_t w0[NW];
  memcpy(w0, sd[0].w, sizeof w0);
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd, side_main);
  for (int c = 0; c < 2; c++) {
    if (sd[c].st != NB_OK) fail_msg("cluster %d: %s", c, sd[c].msg);
    assert_int_equal(sd[c].rounds_done, ROUNDS);
    print_message("cluster %d: %ld of %d master values needed rounding, %d rounded wrong\n", c,
                  sd[c].not_bf16, ROUNDS * NW, sd[c].rounding_bad);
    assert_int_equal(sd[c].rounding_bad, 0);
    assert_true(sd[c].not_bf16 > ROUNDS * NW / 2);
    assert_true(sd[c].idle_checked);
    assert_true(sd[c].idle_ok);
  }
  /* start took cluster 0's bf16 values exactly: the first hash is of them, in fp32 */
  assert_int_equal(sd[0].hash[0], sd[1].hash[0]);
  for (int r = 0; r < ROUNDS; r++) {
    assert_int_equal(sd[0].hash[r + 1], sd[1].hash[r + 1]);
    assert_true(sd[0].hash[r + 1] != sd[0].hash[r]); /* every round moved theta */
    assert_memory_equal(sd[0].master[r], sd[1].master[r], sizeof sd[0].master[r]);
    assert_memory_equal(sd[0].wbuf[r], sd[1].wbuf[r], sizeof sd[0].wbuf[r]);
    assert_memory_equal(sd[0].bbuf[r], sd[1].bbuf[r], sizeof sd[0].bbuf[r]);
  }
  /* the fp32 tensor's buffer is its part of theta_global itself */
  float bm[NB];
  assert_int_equal(nb_session_read_global(sd[0].s, "b", bm, NB), NB_OK);
  assert_memory_equal(bm, sd[0].b, sizeof bm);
  assert_int_equal(nb_session_read_global(sd[0].s, "b", bm, NB - 1), NB_ERR_INVALID);
  assert_int_equal(nb_session_read_global(sd[0].s, "nope", bm, NB), NB_ERR_NOT_FOUND);
  for (int c = 0; c < 2; c++) nb_session_close(sd[c].s);
}

static void test_bf16_and_fp32_rounds(void** state) {
  (void)state;
  half_and_fp32_rounds(NB_DTYPE_BF16, "api-bf16");
}

static void test_fp16_and_fp32_rounds(void** state) {
  (void)state;
  half_and_fp32_rounds(NB_DTYPE_FP16, "api-fp16");
}

/* The reference itself, on the cases that decide rounding, whose answers are known: exact,
 * halfway of both parities, just above and below half, a negative, a subnormal. */
static void test_reference_conversion(void** state) {
  (void)state;
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8: to 1 + 2^-6 */
  assert_int_equal(ref_bf16(1.0f), 0x3f80);
  assert_int_equal(ref_bf16(bits_f32(0x3f808000u)), 0x3f80);
  assert_int_equal(ref_bf16(bits_f32(0x3f818000u)), 0x3f82);
  assert_int_equal(ref_bf16(bits_f32(0x3f808001u)), 0x3f81);
  assert_int_equal(ref_bf16(bits_f32(0x3f807fffu)), 0x3f80);
  assert_int_equal(ref_bf16(bits_f32(0xbf818000u)), 0xbf82);
  assert_int_equal(ref_bf16(bits_f32(0x00018000u)), 0x0002); /* a subnormal halfway, to even */
  /* fp16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to even (1); 1 + 3 * 2^-11 up */
  assert_int_equal(ref_fp16(1.0f), 0x3c00);
  assert_int_equal(ref_fp16(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(ref_fp16(1.0f + 0x3p-11f), 0x3c02);
  assert_int_equal(ref_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  assert_int_equal(ref_fp16(-2.0f), 0xc000);
  assert_int_equal(ref_fp16(65504.0f), 0x7bff);
  assert_int_equal(ref_fp16(0x1p-24f), 0x0001); /* the smallest subnormal */
  assert_int_equal(ref_fp16(0x3p-25f), 0x0002); /* halfway between subnormals 1 and 2: even */
  assert_true(fp16_f32(0x3555) > 0.333f && fp16_f32(0x3555) < 0.3334f);
}

static void* start_only(void* arg) {
  side_t* sd = arg;
  nb_status_t st = nb_session_start(sd->s);
  if (st != NB_OK) side_fail(sd, st);
  return NULL;
}

/* The eager start on a 16-bit tensor (one cluster, a sparse frame): begin writes the predicted
 * landing rounded to the tensor's type and measures the progress from those values; end leaves
 * the rounding of theta_global's master plus that progress (the session's own float sums). */
static void test_eager_half(void** state) {
  (void)state;
  for (int t = 0; t < 2; t++) {
    g_half = t ? NB_DTYPE_FP16 : NB_DTYPE_BF16;
    nb_session_options_t o;
    solo_options(&o, "api-eager-half");
    o.values = "fp32";
    o.density = 0.5;
    o.outer_lr = 0.8f;
    o.outer_momentum = 0.5f;
    nb_session_t* s = NULL;
    uint16_t h[NW], moved[NW];
    for (int i = 0; i < NW; i++) h[i] = ref_half((float)(cos(0.21 * i) * (1 + i % 5)));
    int64_t shape[1] = {NW};
    assert_int_equal(nb_session_open(&o, &s), NB_OK);
    assert_int_equal(nb_session_register_dtype(s, "h", h, g_half, shape, 1), NB_OK);
    assert_int_equal(nb_session_start(s), NB_OK);
    for (int r = 0; r < 2; r++) {
      for (int i = 0; i < NW; i++) h[i] = ref_half(half_f32(h[i]) - 0.25f * (float)(i % 3));
      uint16_t before[NW];
      memcpy(before, h, sizeof h);
      assert_int_equal(nb_session_round_begin(s, 1), NB_OK);
      assert_int_equal(nb_session_begin_moved(s), 1);
      assert_memory_not_equal(h, before, sizeof h);
      memcpy(moved, h, sizeof h);
      uint16_t trained[NW];
      for (int i = 0; i < NW; i++) trained[i] = h[i] = ref_half(half_f32(h[i]) + 0.5f);
      assert_int_equal(nb_session_round_end(s, NULL), NB_OK);
      float g[NW];
      assert_int_equal(nb_session_read_global(s, "h", g, NW), NB_OK);
      for (int i = 0; i < NW; i++) {
        float progress = half_f32(trained[i]) - half_f32(moved[i]);
        assert_int_equal(h[i], ref_half(g[i] + progress));
      }
    }
    nb_session_close(s);
  }
}

static void test_dtype_mismatch(void** state) {
  (void)state;
  side_t* sd = sides;
  memset(sd, 0, sizeof sides);
  for (int c = 0; c < 2; c++) {
    sd[c].index = c;
    sd[c].w_dtype = c == 0 ? NB_DTYPE_BF16 : NB_DTYPE_FP32;
    g_half = NB_DTYPE_BF16;
    side_open(&sd[c], "api-bf16-mismatch");
  }
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd, start_only);
  for (int c = 0; c < 2; c++) {
    print_message("cluster %d: %s\n", c, sd[c].msg);
    assert_int_equal(sd[c].st, NB_ERR_CONFIG);
    assert_non_null(strstr(sd[c].msg, "tensor 0 'w' is"));
    assert_non_null(strstr(
        sd[c].msg, c == 0 ? "bf16 here, fp32 at cluster west" : "fp32 here, bf16 at cluster east"));
    nb_session_close(sd[c].s);
  }
  /* an unknown dtype is refused at register */
  nb_session_options_t o;
  solo_options(&o, "api-bf16-bad");
  nb_session_t* s = NULL;
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  uint16_t v[4] = {0};
  int64_t shape[1] = {4};
  assert_int_equal(nb_session_register_dtype(s, "v", v, (nb_dtype_t)7, shape, 1), NB_ERR_INVALID);
  assert_int_equal(nb_session_register_dtype(s, "v", v, NB_DTYPE_BF16, shape, 1), NB_OK);
  assert_int_equal(nb_session_read_global(s, "v", NULL, 4), NB_ERR_INVALID);
  nb_session_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_conversion), cmocka_unit_test(test_bf16_and_fp32_rounds),
      cmocka_unit_test(test_fp16_and_fp32_rounds), cmocka_unit_test(test_dtype_mismatch),
      cmocka_unit_test(test_eager_half),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
