/* api/adapt's nb_adapt_next, the scheduler of one cluster that `nebula worker` and the public
 * session share, without a link (ex NULL): the operator's cap stands for the link, so every
 * input is known. Checked: the round's figures reach the input (steps, compute, tau); the
 * hybrid's next message shrinks with a lower decided density, also without set_steps when the
 * decision asks for a longer round (which only set_steps passes on); a measured exchange is taken
 * only after NB_ADAPT_OBSERVED landings, as the slowest of them for the smallest of their frames
 * (the frame of the round before the landing, as the decisions sized them), and only with overlap;
 * a bad input leaves the last decision and the hybrid's density as they were. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "api/adapt.h"
#include "train/hybrid.h"

#define N 100000

static float g_params[N];
static uint64_t g_samples;

static float* params(void* ctx, size_t* n) {
  (void)ctx;
  if (n) *n = N;
  return g_params;
}
static uint64_t samples(void* ctx) {
  (void)ctx;
  return g_samples;
}

static nb_hybrid_t* make_hybrid(void) {
  memset(g_params, 0, sizeof g_params); /* theta_global 0: msg_len's noise is all Delta */
  nb_hybrid_config_t hc;
  nb_hybrid_config_defaults(&hc);
  hc.inner_steps = 16;
  hc.density = 0.05;
  nb_hybrid_local_t lm = {.params = params, .samples = samples};
  nb_hybrid_t* h = NULL;
  assert_int_equal(nb_hybrid_create_local(&hc, &lm, &h), NB_OK);
  return h;
}

static void init(nb_adapt_t* a, int overlap) {
  memset(a, 0, sizeof *a);
  nb_sched_config_default(&a->cfg);
  a->cfg.overlap = overlap;
  a->cfg.density_floor = 0.001;
  a->cfg.density_ceiling = 1;
  a->cfg.max_steps_factor = 4;
  a->cap_Bps = 1e6 / 8; /* 1 Mbit/s */
  a->hint_cap = 1;      /* 90 % of it until measured: the only estimate without a link */
}

static nb_adapt_round_t round_of(uint64_t r, double took) {
  nb_adapt_round_t ar = {.round = r,
                         .values = NB_VALUES_INT8,
                         .density = 0.05,
                         .n_params = N,
                         .steps = 16,
                         .step_compute_s = 0.05,
                         .hide_steps = 4,
                         .exchange_took_s = took,
                         .set_steps = 1};
  return ar;
}

/* The hybrid's message for the parameters moved off theta_global (a dense-ish Delta): its size
 * follows the density the hybrid holds. */
static size_t msg_len(nb_hybrid_t* h) {
  uint32_t x = 12345; /* noise (an LCG): a frame zstd cannot shrink, whose size is its k */
  for (size_t i = 0; i < N; i++) {
    x = x * 1664525u + 1013904223u;
    g_params[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
  }
  g_samples += 64; /* a round with samples: its Delta is sent */
  const uint8_t* msg;
  size_t len = 0;
  assert_int_equal(nb_hybrid_prepare(h, &msg, &len), NB_OK);
  return len;
}

static void test_decisions_reach_the_hybrid(void** state) {
  (void)state;
  nb_hybrid_t* h = make_hybrid();
  size_t before = msg_len(h); /* density 0.05 */
  nb_adapt_t a;
  init(&a, 1);
  a.cap_Bps = 0.1e6 / 8; /* 0.1 Mbit/s: 4 steps of 0.05 s hide about 2 kB, far below 5 % */
  nb_adapt_round_t ar = round_of(0, 0);
  nb_sched_input_t in;
  nb_sched_decision_t dec;
  assert_int_equal(nb_adapt_next(&a, NULL, h, &ar, &in, &dec), NB_OK);
  assert_int_equal(in.round, 1);
  assert_int_equal(in.steps, 16);
  assert_int_equal(in.hide_steps, 4);
  assert_true(fabs(in.step_compute_s - 0.05) < 1e-12);
  assert_true(fabs(in.goodput_Bps - 0.9 * 0.1e6 / 8) < 1e-6);
  assert_int_equal(in.n_params, N);
  assert_true(a.have_dec);
  assert_memory_equal(&a.dec, &dec, sizeof dec);
  /* the density fell, and the hybrid's next message with it */
  assert_true(dec.density < 0.02);
  assert_true(a.sent_bytes[1] > 0);
  size_t after = msg_len(h);
  assert_true(after < before / 2);
  nb_hybrid_destroy(h);
}

static void test_density_only_without_set_steps(void** state) {
  (void)state;
  nb_hybrid_t* h = make_hybrid();
  size_t before = msg_len(h);
  nb_adapt_t a;
  init(&a, 1);
  a.cap_Bps = 0.01e6 / 8; /* 0.01 Mbit/s: even the floor needs a longer round */
  nb_adapt_round_t ar = round_of(0, 0);
  ar.set_steps = 0;
  nb_sched_input_t in;
  nb_sched_decision_t dec;
  assert_int_equal(nb_adapt_next(&a, NULL, h, &ar, &in, &dec), NB_OK);
  assert_true(dec.steps > 16 || dec.hide_steps > 4); /* it asked for more time ... */
  size_t after = msg_len(h);
  assert_true(after < before / 2); /* ... the density was taken */
  nb_hybrid_destroy(h);
}

static void test_observed_after_three_landings(void** state) {
  (void)state;
  nb_hybrid_t* h = make_hybrid();
  nb_adapt_t a;
  init(&a, 1);
  nb_sched_input_t in;
  nb_sched_decision_t dec;
  double took[] = {0, 0.30, 0.45, 0.20, 0.25};
  double sized[5];
  for (uint64_t r = 0; r < 5; r++) {
    nb_adapt_round_t ar = round_of(r, took[r]);
    assert_int_equal(nb_adapt_next(&a, NULL, h, &ar, &in, &dec), NB_OK);
    sized[r] = dec.bytes; /* round r + 1's frame */
    if (r < 3) {          /* rounds 1 and 2 landed: two measurements, not yet three */
      assert_true(in.observed_s == 0);
    }
  }
  /* landings in rounds 2..4 (of the frames of rounds 1..3, sized by decisions 0..2): the
   * slowest time (0.45 s, round 2's), the smallest frame among those three */
  assert_true(fabs(in.observed_s - 0.45) < 1e-12);
  double smallest = fmin(sized[1], fmin(sized[2], sized[3]));
  assert_true(fabs(in.observed_bytes - smallest) < 1e-9);
  nb_hybrid_destroy(h);
}

static void test_no_observation_without_overlap(void** state) {
  (void)state;
  nb_hybrid_t* h = make_hybrid();
  nb_adapt_t a;
  init(&a, 0);
  nb_sched_input_t in;
  nb_sched_decision_t dec;
  for (uint64_t r = 0; r < 6; r++) {
    nb_adapt_round_t ar = round_of(r, 0.5);
    ar.hide_steps = 0;
    assert_int_equal(nb_adapt_next(&a, NULL, h, &ar, &in, &dec), NB_OK);
    assert_true(in.observed_s == 0);
  }
  assert_int_equal(a.n_obs, 0);
  nb_hybrid_destroy(h);
}

static void test_bad_input_changes_nothing(void** state) {
  (void)state;
  nb_hybrid_t* h = make_hybrid();
  nb_adapt_t a;
  init(&a, 1);
  nb_sched_input_t in;
  nb_sched_decision_t dec, first;
  nb_adapt_round_t ar = round_of(0, 0);
  assert_int_equal(nb_adapt_next(&a, NULL, h, &ar, &in, &first), NB_OK);
  ar = round_of(1, 0);
  ar.steps = 0; /* the scheduler refuses a round of no steps */
  assert_int_equal(nb_adapt_next(&a, NULL, h, &ar, &in, &dec), NB_ERR_INVALID);
  assert_memory_equal(&a.dec, &first, sizeof first);
  nb_hybrid_destroy(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decisions_reach_the_hybrid),
      cmocka_unit_test(test_density_only_without_set_steps),
      cmocka_unit_test(test_observed_after_three_landings),
      cmocka_unit_test(test_no_observation_without_overlap),
      cmocka_unit_test(test_bad_input_changes_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
