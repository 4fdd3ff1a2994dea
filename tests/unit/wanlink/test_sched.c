/* Unit tests of inter/sched: the density follows the link (halved link -> about half the
 * density), the round lengthens at the floor and stops at the longest round, the ceiling, overlap
 * off vs on, hysteresis only upwards, the estimator feeding the scheduler through a rate change,
 * the log line, and rejected inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "inter/estimator.h"
#include "inter/sched.h"

static void expect_invalid(const nb_sched_config_t* c, const nb_sched_input_t* in,
                           const char* word);

static nb_sched_config_t cfg(void) {
  nb_sched_config_t c;
  nb_sched_config_default(&c);
  c.density_floor = 1e-4;
  c.density_ceiling = 0.1;
  c.initial_density = 0.01;
  c.overlap = 1;
  c.headroom = 0.9;
  c.fraction = 0.1;
  c.rtts_per_round = 2;
  c.header_bytes = 4096;
  c.max_steps_factor = 8;
  c.hysteresis = 0.1;
  return c;
}

/* 100 Mbit/s, 50 ms RTT, 100 ms per step, 50 steps, 1e9 params, 16-bit values + 16-bit indices:
 * the budget is 4.5 s of a 5 s round, so about 0.0137 of the params fit. */
static nb_sched_input_t input(double mbit) {
  nb_sched_input_t in;
  memset(&in, 0, sizeof in);
  in.round = 7;
  in.goodput_Bps = mbit * 1e6 / 8;
  in.rtt_s = 0.05;
  in.step_compute_s = 0.1;
  in.steps = 50;
  in.n_params = 1000000000ull;
  in.bits_per_value = 16;
  in.bits_per_index = 16;
  in.fanout = 1;
  return in;
}

static void print(const nb_sched_decision_t* d) {
  char line[512];
  nb_sched_decision_format(d, line, sizeof line);
  printf("%s\n", line);
}

static void test_halved_link_halves_density(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(100);
  nb_sched_decision_t full, half;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &full), NB_OK);
  print(&full);
  assert_int_equal(full.reason, NB_SCHED_FIT);
  assert_int_equal(full.steps, 50);
  assert_true(full.transfer_s <= full.budget_s * (1 + 1e-9));
  assert_true(full.transfer_s >= full.budget_s * 0.999); /* it fills the budget */
  assert_true(fabs(full.budget_s - 4.5) < 1e-9);
  assert_true(full.density > 0.013 && full.density < 0.0140);
  assert_int_equal(full.k, (uint64_t)ceil(full.density * 1e9));

  in = input(50);
  assert_int_equal(nb_sched_decide(&c, &in, &full, &half), NB_OK);
  print(&half);
  assert_int_equal(half.reason, NB_SCHED_FIT);
  assert_true(half.density < full.density);
  double ratio = half.density / full.density;
  assert_true(ratio > 0.48 && ratio < 0.50); /* the fixed RTT cost makes it a bit under 1/2 */
  assert_true(half.transfer_s <= half.budget_s * (1 + 1e-9));
}

static void test_floor_lengthens_round(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_decision_t d1, d2, d3;
  /* At 0.5 Mbit/s even the floor (1e5 values x 4 bytes = 400 kB) needs ~6.5 s > 4.5 s. */
  nb_sched_input_t in = input(0.5);
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d1), NB_OK);
  print(&d1);
  assert_int_equal(d1.reason, NB_SCHED_FLOOR_LENGTHEN);
  assert_true(d1.density == c.density_floor);
  assert_true(d1.steps > 50 && d1.steps <= 400);
  assert_true(d1.transfer_s <= d1.budget_s * (1 + 1e-9)); /* the longer round covers it */
  assert_true(d1.density_fit < c.density_floor);
  /* A slower link needs a longer round still. */
  in = input(0.25);
  assert_int_equal(nb_sched_decide(&c, &in, &d1, &d2), NB_OK);
  print(&d2);
  assert_int_equal(d2.reason, NB_SCHED_FLOOR_LENGTHEN);
  assert_true(d2.steps > d1.steps);
  /* Beyond 8 x 50 steps the round stops growing and says so. */
  in = input(0.01);
  assert_int_equal(nb_sched_decide(&c, &in, &d2, &d3), NB_OK);
  print(&d3);
  assert_int_equal(d3.reason, NB_SCHED_FLOOR_MAX_STEPS);
  assert_int_equal(d3.steps, 400);
  assert_true(d3.transfer_s > d3.budget_s);
  /* When the link recovers, the round goes back to its base length. */
  in = input(100);
  nb_sched_decision_t d4;
  assert_int_equal(nb_sched_decide(&c, &in, &d3, &d4), NB_OK);
  assert_int_equal(d4.steps, 50);
  assert_int_equal(d4.reason, NB_SCHED_FIT);
}

static void test_ceiling_overlap_and_no_estimate(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_decision_t d, off;
  nb_sched_input_t in = input(100000); /* 100 Gbit/s: far more than needed */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_CEILING);
  assert_true(d.density == c.density_ceiling);
  assert_true(d.density_fit > c.density_ceiling);

  in = input(100);
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  c.overlap = 0; /* the transfer may only take 10% of the compute: lower density */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &off), NB_OK);
  assert_true(off.density < d.density / 8);
  assert_true(fabs(off.budget_s - 0.5) < 1e-9);
  assert_true(off.transfer_s <= off.budget_s * (1 + 1e-9));

  c = cfg();
  in = input(100);
  in.goodput_Bps = 0; /* nothing measured yet */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_NO_ESTIMATE);
  assert_true(d.density == c.initial_density);
  in = input(100);
  in.step_compute_s = 0;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_NO_ESTIMATE);
  assert_int_equal(d.steps, 50);
}

static void test_hysteresis_only_upwards(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_decision_t base, up_small, up_big, down;
  nb_sched_input_t in = input(100);
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &base), NB_OK);
  in = input(105); /* +5%: keep the previous density */
  assert_int_equal(nb_sched_decide(&c, &in, &base, &up_small), NB_OK);
  assert_int_equal(up_small.reason, NB_SCHED_HOLD);
  assert_true(up_small.density == base.density);
  in = input(130); /* +30%: follow */
  assert_int_equal(nb_sched_decide(&c, &in, &base, &up_big), NB_OK);
  assert_int_equal(up_big.reason, NB_SCHED_FIT);
  assert_true(up_big.density > base.density * 1.25);
  in = input(97); /* -3%: the old density would not fit any more, so follow down at once */
  assert_int_equal(nb_sched_decide(&c, &in, &base, &down), NB_OK);
  assert_int_equal(down.reason, NB_SCHED_FIT);
  assert_true(down.density < base.density);
}

/* The estimator feeds the scheduler: a link that halves mid-run gives about half the density
 * within a few transfers. */
static void test_follows_estimator_through_rate_change(void** state) {
  (void)state;
  nb_estimator_t* e = NULL;
  assert_int_equal(nb_estimator_create(NULL, &e), NB_OK);
  nb_sched_config_t c = cfg();
  nb_sched_decision_t prev, d;
  int have_prev = 0;
  double first = 0, last = 0;
  for (int round = 0; round < 16; ++round) {
    double rate = round < 8 ? 12.5e6 : 6.25e6; /* 100 -> 50 Mbit/s at round 8 */
    uint64_t bytes = 20u << 20;
    assert_int_equal(nb_estimator_add_transfer(e, bytes, (double)bytes / rate, 4), NB_OK);
    assert_int_equal(nb_estimator_add_rtt(e, 0.05), NB_OK);
    nb_estimate_t est;
    nb_estimator_get(e, &est);
    nb_sched_input_t in = input(0);
    nb_sched_input_from_estimate(&in, &est);
    in.round = (uint64_t)round;
    assert_int_equal(nb_sched_decide(&c, &in, have_prev ? &prev : NULL, &d), NB_OK);
    if (round == 7) first = d.density;
    if (round == 11) last = d.density; /* 4 transfers after the change */
    prev = d;
    have_prev = 1;
  }
  printf("density before %.5f, 4 transfers after halving %.5f\n", first, last);
  assert_true(last / first > 0.45 && last / first < 0.55);
  nb_estimator_destroy(e);
}

/* The situation of the namespace test (tests/integration/run/test_sched_netns.sh): 434k
 * parameters, int8 values, wall-time rounds of 0.8 s with 0.2 of it for the transfer, 50 ms RTT,
 * 8 Mbit/s halved to 4 after round 8. Frames are ~40 KiB, under the estimator's 64 KiB transfer
 * threshold, so transfers alone never give an estimate (the density would stay at its initial
 * value); one 256 KiB probe per round does, and 4 rounds
 * after the change the goodput and the density are about half of what they were. */
static void test_small_frames_follow_probes(void** state) {
  (void)state;
  for (int probes = 0; probes <= 1; probes++) {
    nb_estimator_t* e = NULL;
    assert_int_equal(nb_estimator_create(NULL, &e), NB_OK);
    nb_sched_config_t c = cfg();
    c.overlap = 0;
    c.fraction = 0.2;
    c.density_floor = 0.002;
    c.density_ceiling = 0.1;
    c.initial_density = 0.05;
    nb_sched_decision_t prev, d;
    int have_prev = 0;
    double g_before = 0, d_before = 0, g_after = 0, d_after = 0;
    for (int round = 1; round <= 12; ++round) {
      double rate = round <= 8 ? 1e6 : 0.5e6; /* bytes/s */
      double frame = have_prev ? 434048 * prev.density * (8.125 + 8) / 8 + 4096 : 40000;
      assert_true(frame < 65536);
      assert_int_equal(nb_estimator_add_transfer(e, (uint64_t)frame, 0.1 + frame / rate, 4), NB_OK);
      for (int i = 0; i < 3; i++) assert_int_equal(nb_estimator_add_rtt(e, 0.05), NB_OK);
      if (probes) assert_int_equal(nb_estimator_add_probe(e, 262144, 0.05 + 262144 / rate), NB_OK);
      nb_estimate_t est;
      nb_estimator_get(e, &est);
      nb_sched_input_t in;
      memset(&in, 0, sizeof in);
      nb_sched_input_from_estimate(&in, &est);
      in.round = (uint64_t)round;
      in.steps = 50;
      in.n_params = 434048;
      in.bits_per_value = 8.125;
      in.bits_per_index = 8;
      in.fanout = 1;
      in.round_s = 0.8;
      assert_int_equal(nb_sched_decide(&c, &in, have_prev ? &prev : NULL, &d), NB_OK);
      if (round == 8) g_before = in.goodput_Bps, d_before = d.density;
      if (round == 12) g_after = in.goodput_Bps, d_after = d.density;
      if (!probes) assert_int_equal(d.reason, NB_SCHED_NO_ESTIMATE);
      prev = d;
      have_prev = 1;
    }
    nb_estimator_destroy(e);
    if (!probes) continue;
    printf("small frames + probes: goodput %.2f -> %.2f Mbit/s, density %.4f -> %.4f\n",
           g_before * 8e-6, g_after * 8e-6, d_before, d_after);
    assert_true(g_before > 0.95e6 && g_before < 1.05e6);
    assert_true(g_after / g_before > 0.45 && g_after / g_before < 0.55);
    assert_true(d_before > 0.03 && d_before < 0.065);
    assert_true(d_after / d_before > 0.35 && d_after / d_before < 0.55);
  }
}

/* Wall-time rounds (heterogeneous clusters): the budget is a share of the round's wall time,
 * the step time is not needed, and at the floor the wall budget grows instead of the steps. */
static void test_wall_time_rounds(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_decision_t steps_mode, wall, wall_half, floor, maxed;
  nb_sched_input_t in = input(100);
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &steps_mode), NB_OK);
  in.round_s = 5.0; /* the same 5 s round, given as wall time */
  in.step_compute_s = 0;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &wall), NB_OK);
  assert_int_equal(wall.reason, NB_SCHED_FIT);
  assert_true(fabs(wall.density - steps_mode.density) < 1e-12);
  assert_true(fabs(wall.compute_s - 5.0) < 1e-12);
  in.goodput_Bps /= 2;
  assert_int_equal(nb_sched_decide(&c, &in, &wall, &wall_half), NB_OK);
  assert_true(wall_half.density < wall.density * 0.5);
  in = input(0.5);
  in.round_s = 5.0;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &floor), NB_OK);
  print(&floor);
  assert_int_equal(floor.reason, NB_SCHED_FLOOR_LENGTHEN);
  assert_true(floor.compute_s > 5.0 && floor.compute_s < 40.0);
  assert_true(fabs(floor.transfer_s - floor.budget_s) < 1e-9); /* exactly long enough */
  assert_int_equal(floor.steps, 50);                           /* passed through */
  in = input(0.01);
  in.round_s = 5.0;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &maxed), NB_OK);
  assert_int_equal(maxed.reason, NB_SCHED_FLOOR_MAX_STEPS);
  assert_true(fabs(maxed.compute_s - 40.0) < 1e-9);
  in = input(100);
  in.round_s = -1;
  expect_invalid(&c, &in, "round wall budget");
  in.round_s = NAN;
  expect_invalid(&c, &in, "round wall budget");
}

static void test_format_and_names(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(100);
  nb_sched_decision_t d;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  char line[512];
  int n = nb_sched_decision_format(&d, line, sizeof line);
  assert_true(n > 0 && (size_t)n < sizeof line);
  assert_null(strchr(line, '\n'));
  assert_non_null(strstr(line, "round=7 "));
  assert_non_null(strstr(line, "reason=fit "));
  assert_non_null(strstr(line, "goodput_mbit=100.000"));
  assert_non_null(strstr(line, "steps=50"));
  char tiny[8];
  assert_true(nb_sched_decision_format(&d, tiny, sizeof tiny) > 8);
  assert_true(strlen(tiny) == 7);
  assert_string_equal(nb_sched_reason_name(NB_SCHED_FLOOR_LENGTHEN), "floor_lengthen");
  assert_string_equal(nb_sched_reason_name((nb_sched_reason_t)99), "unknown");
}

static void expect_invalid(const nb_sched_config_t* c, const nb_sched_input_t* in,
                           const char* word) {
  nb_sched_decision_t d;
  memset(&d, 0x5a, sizeof d);
  assert_int_equal(nb_sched_decide(c, in, NULL, &d), NB_ERR_INVALID);
  if (!strstr(nb_error_last(), word)) fail_msg("'%s' does not name '%s'", nb_error_last(), word);
  assert_int_equal(d.k, 0x5a5a5a5a5a5a5a5aull); /* out untouched */
}

static void test_bad_inputs(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in;
  in = input(100);
  in.goodput_Bps = NAN;
  expect_invalid(&c, &in, "goodput");
  in = input(100);
  in.goodput_Bps = -1;
  expect_invalid(&c, &in, "goodput");
  in = input(100);
  in.rtt_s = -0.1;
  expect_invalid(&c, &in, "rtt");
  in = input(100);
  in.rtt_s = INFINITY;
  expect_invalid(&c, &in, "rtt");
  in = input(100);
  in.step_compute_s = -1;
  expect_invalid(&c, &in, "compute");
  in = input(100);
  in.steps = 0;
  expect_invalid(&c, &in, "steps");
  in = input(100);
  in.n_params = 0;
  expect_invalid(&c, &in, "parameters");
  in = input(100);
  in.bits_per_value = 0;
  expect_invalid(&c, &in, "bits per value");
  in = input(100);
  in.bits_per_value = 65;
  expect_invalid(&c, &in, "bits per value");
  in = input(100);
  in.bits_per_index = -1;
  expect_invalid(&c, &in, "bits per index");
  in = input(100);
  nb_sched_config_t b;
  b = cfg();
  b.density_floor = 0;
  expect_invalid(&b, &in, "density_floor");
  b = cfg();
  b.density_ceiling = 1.5;
  expect_invalid(&b, &in, "density_ceiling");
  b = cfg();
  b.density_floor = 0.2;
  expect_invalid(&b, &in, "density_ceiling");
  b = cfg();
  b.headroom = 0;
  expect_invalid(&b, &in, "headroom");
  b = cfg();
  b.fraction = NAN;
  expect_invalid(&b, &in, "fraction");
  b = cfg();
  b.hysteresis = 1.0;
  expect_invalid(&b, &in, "hysteresis");
  b = cfg();
  b.max_steps_factor = 0;
  expect_invalid(&b, &in, "max_steps_factor");
  b = cfg();
  b.rtts_per_round = -1;
  expect_invalid(&b, &in, "rtts_per_round");
  assert_int_equal(nb_sched_decide(NULL, &in, NULL, NULL), NB_ERR_INVALID);
  nb_sched_decision_t d;
  assert_int_equal(nb_sched_decide(&c, NULL, NULL, &d), NB_ERR_INVALID);
  nb_sched_config_default(&b);
  assert_int_equal(nb_sched_config_check(&b), NB_OK); /* defaults are valid */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_halved_link_halves_density),
      cmocka_unit_test(test_floor_lengthens_round),
      cmocka_unit_test(test_ceiling_overlap_and_no_estimate),
      cmocka_unit_test(test_hysteresis_only_upwards),
      cmocka_unit_test(test_follows_estimator_through_rate_change),
      cmocka_unit_test(test_small_frames_follow_probes),
      cmocka_unit_test(test_wall_time_rounds),
      cmocka_unit_test(test_format_and_names),
      cmocka_unit_test(test_bad_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
