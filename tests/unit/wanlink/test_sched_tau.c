/* Unit tests of inter/sched with overlap steps (tau): the transfer must fit under the tau inner
 * steps after which the update lands, not the whole round; at the density floor the update is
 * let land later (a larger tau, reason floor_later) before the round is lengthened; without
 * overlap, or with tau >= H, the decision is the whole round's as before. And nb_sched_pick, the
 * choice of a codec point from a quality table: the least loss at the landing each point needs
 * among those that fit the round, then the fewest bytes with a longer round. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "common/common.h"
#include "inter/sched.h"

static nb_sched_config_t cfg(void) {
  nb_sched_config_t c;
  nb_sched_config_default(&c);
  c.density_floor = 0.001;
  c.density_ceiling = 1;
  c.initial_density = 0.01;
  c.overlap = 1;
  c.headroom = 0.9;
  c.rtts_per_round = 0;
  c.header_bytes = 0;
  c.max_steps_factor = 8;
  c.hysteresis = 0;
  return c;
}

/* 1e6 params of 8+8 bits (2 MB dense), 1 MB/s, 100 ms per step, H 40 (a 4 s round) */
static nb_sched_input_t input(uint32_t tau) {
  nb_sched_input_t in;
  memset(&in, 0, sizeof in);
  in.goodput_Bps = 1e6;
  in.step_compute_s = 0.1;
  in.steps = 40;
  in.n_params = 1000000;
  in.bits_per_value = 8;
  in.bits_per_index = 8;
  in.fanout = 1;
  in.hide_steps = tau;
  return in;
}

/* tau 4: 0.4 s of compute hides 0.36 s of transfer = 0.18 of the 2 MB dense frame */
static void test_tau_budget(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(4);
  nb_sched_decision_t d;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FIT);
  assert_true(fabs(d.density - 0.18) < 1e-9);
  assert_true(fabs(d.budget_s - 0.36) < 1e-9);
  assert_int_equal(d.hide_steps, 4);
  assert_int_equal(d.steps, 40);
  assert_true(d.transfer_s <= d.budget_s + 1e-12);
  /* the whole round (tau 0, or tau >= H, or no overlap) carries 3.6 s: dense fits */
  uint32_t whole[] = {0, 40, 100};
  for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++) {
    in = input(whole[i]);
    assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
    assert_int_equal(d.reason, NB_SCHED_CEILING);
    assert_int_equal(d.hide_steps, 0);
    assert_true(fabs(d.budget_s - 3.6) < 1e-9);
  }
  c.overlap = 0;
  c.fraction = 0.5;
  in = input(4);
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.hide_steps, 0);
  assert_true(fabs(d.budget_s - 2.0) < 1e-9);
}

/* A long link: two round trips of 0.2 s would eat more than tau 4's 0.36 s. They do not take the
 * data's share: the density still fills 0.36 s of transfer (0.18), and the update lands after
 * ceil((0.4 + 0.36) / 0.09) = 9 steps instead of 4. */
static void test_tau_latency(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  c.rtts_per_round = 2;
  nb_sched_input_t in = input(4);
  in.rtt_s = 0.2;
  nb_sched_decision_t d;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FIT);
  assert_true(fabs(d.density - 0.18) < 1e-9);
  assert_int_equal(d.hide_steps, 9);
  assert_true(d.transfer_s <= d.budget_s + 1e-12);
  in.rtt_s = 2.0; /* 4 s of round trips: the update lands at the round's end */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.hide_steps, 0);
}

/* At the floor: a 100x thinner link (10 kB/s) carries the 0.001-density frame (2 kB) in 0.2 s,
 * more than tau 1 hides (0.09 s): the update lands after 3 steps instead (0.27 s); thinner still,
 * when even the round's last step is too early, the round is lengthened as without tau. */
static void test_floor_later_then_lengthen(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(1);
  in.goodput_Bps = 1e4;
  nb_sched_decision_t d;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LATER);
  assert_true(d.density == c.density_floor);
  assert_int_equal(d.hide_steps, 3);
  assert_int_equal(d.steps, 40);
  assert_true(d.transfer_s <= d.budget_s + 1e-12);
  assert_string_equal(nb_sched_reason_name(d.reason), "floor_later");
  in.goodput_Bps = 400; /* 2 kB take 5 s: more than the 4 s round */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LENGTHEN);
  assert_int_equal(d.hide_steps, 0);
  assert_true(d.steps > 40);
  assert_true(d.transfer_s <= d.budget_s + 1e-12);
}

/* A measured exchange (observed_*) overrides the link's model for frames no larger than the
 * one measured: the floor frame that "takes 5 s" at the measured goodput (a thin link whose
 * shaper passed it in a burst) took 0.25 s, so the update lands after 3 steps instead of the
 * round being lengthened; a frame larger than the one measured gains nothing. At a fit, a
 * density as large as the measured frame's (0.01, 20 kB in 0.3 s) fits tau 4's 0.36 s though
 * the model says 0.0018, and never more than that. Bad observations are refused. */
static void test_observed_exchange(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(1);
  in.goodput_Bps = 400;
  in.observed_s = 0.25;
  in.observed_bytes = 2000;
  nb_sched_decision_t d;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LATER);
  assert_int_equal(d.hide_steps, 3);
  assert_int_equal(d.steps, 40);
  assert_true(fabs(d.transfer_s - 0.25) < 1e-12);
  in.observed_bytes = 1999; /* smaller than the floor's frame: the model again */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LENGTHEN);
  assert_true(d.steps > 40);
  in = input(4);
  in.goodput_Bps = 1e4;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FIT);
  assert_true(fabs(d.density - 0.0018) < 1e-9);
  in.observed_s = 0.3;
  in.observed_bytes = 20000;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.reason, NB_SCHED_FIT);
  assert_true(fabs(d.density - 0.01) < 1e-9);
  assert_int_equal(d.hide_steps, 4);
  in.observed_s = 0.5; /* longer than tau's 0.36 s: the model's fit */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_true(fabs(d.density - 0.0018) < 1e-9);
  in.observed_s = NAN;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_ERR_INVALID);
  in.observed_s = 0.1;
  in.observed_bytes = -1;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_ERR_INVALID);
}

/* Wall-time rounds: tau counts only while tau steps end inside the round's budget. */
static void test_tau_wall_rounds(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(4);
  in.round_s = 2.0;
  nb_sched_decision_t d;
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.hide_steps, 4);
  assert_true(fabs(d.budget_s - 0.36) < 1e-9);
  in.round_s = 0.3; /* 4 steps of 0.1 s end after the round: the whole round hides it */
  assert_int_equal(nb_sched_decide(&c, &in, NULL, &d), NB_OK);
  assert_int_equal(d.hide_steps, 0);
  assert_true(fabs(d.budget_s - 0.27) < 1e-9);
}

/* A table like the one bench pareto measures: 1 MB dense int8, 264 kB top-10 % int8, 60 kB
 * top-3 % 4-bit, 26 kB top-1.5 % 2-bit (1e6 params, bits as the worker passes them). */
static const nb_sched_point_t g_points[] = {
    {"dense-int8", 1.0, 8.125, 0, 0.010, 0.1, 0.75, 0.030},
    {"top10-int8", 0.10, 8.125, 13, 0.020, 0.1, 0.75, 0.050},
    {"top3-4bit", 0.03, 4.125, 12, 0.030, 0.1, 0.75, 0.045},
    {"top1.5-2bit", 0.015, 2.125, 12, 0.050, 0.1, 0.75, 0.060},
};
#define N_POINTS (sizeof g_points / sizeof g_points[0])

static void test_pick(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(4); /* tau 4: 0.36 s of transfer hide under a 4 s round */
  nb_sched_decision_t d;
  size_t at = 99;
  in.goodput_Bps = 1e8; /* 2 MB in 0.02 s: dense int8, the table's best */
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 0);
  assert_int_equal(d.reason, NB_SCHED_CEILING);
  assert_true(d.density == 1.0);
  /* 0.36 s carry 72 kB: 4-bit (60 kB) is the best that fits under tau; top-10 % (264 kB)
   * would land after 15 of 40 steps, at a cost of 0.02 + 0.03 x 0.275 / 0.65 = 0.0327 > 0.03 */
  in.goodput_Bps = 2e5;
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 2);
  assert_int_equal(d.reason, NB_SCHED_FIT);
  assert_true(d.transfer_s <= d.budget_s + 1e-12);
  assert_int_equal(d.hide_steps, 4);
  /* 20 kB/s: nothing fits under tau; landing later, 2-bit (26 kB) needs 15 steps (cost 0.0542)
   * and 4-bit (60 kB) 34 of the 40 (0.0473): the lesser, 4-bit, lands after 34 */
  in.goodput_Bps = 2e4;
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 2);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LATER);
  assert_int_equal(d.hide_steps, 34);
  assert_true(d.transfer_s <= d.budget_s + 1e-12);
  in.goodput_Bps = 1e3; /* even 2-bit (26 kB, 26 s) needs more than the round: fewest bytes */
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 3);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LENGTHEN);
  assert_true(d.steps > 40);
  in.goodput_Bps = 0; /* no estimate yet: fewest bytes */
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 3);
  assert_int_equal(d.reason, NB_SCHED_NO_ESTIMATE);
}

/* Hold: a better point that would fill more than (1 - hysteresis) of its budget does not replace
 * the previous one while that still fits; with room to spare it does. */
static void test_pick_hold(void** state) {
  (void)state;
  nb_sched_config_t c = cfg();
  c.hysteresis = 0.1;
  nb_sched_input_t in = input(4);
  nb_sched_decision_t prev, d;
  size_t at;
  in.goodput_Bps = 6.1e4 / 0.36 / 0.95; /* 4-bit's 61 kB (with the sent scales) fill 95 % */
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, NULL, 0, &prev, &at), NB_OK);
  assert_int_equal(at, 2);
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, &prev, 3, &d, &at), NB_OK);
  assert_int_equal(at, 3);
  assert_int_equal(d.reason, NB_SCHED_HOLD);
  /* 1.5x: 4-bit would fill 63 % of tau's budget, and top-10 % lands after 11 of 40 steps at
   * a cost of 0.0281, below 4-bit's 0.03; 11 steps are far from the round's end: it is taken */
  in.goodput_Bps *= 1.5;
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, &d, 3, &d, &at), NB_OK);
  assert_int_equal(at, 1);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LATER);
  assert_int_equal(d.hide_steps, 11);
  /* 70 kB/s: top-10 % would need 42 steps (past the round); 4-bit lands after 10 (cost
   * 0.0335), 2-bit after 5 (0.0504): 4-bit, far from the round's end, replaces 2-bit */
  in.goodput_Bps = 7.0e4;
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, &d, 3, &d, &at), NB_OK);
  assert_int_equal(at, 2);
  assert_int_equal(d.hide_steps, 10);
  /* 4-bit landing after 37 of 40 (within 10 % of the end) does not replace the 2-bit point */
  in.goodput_Bps = 60469.0 / (37 * 0.09) * 1.001;
  assert_int_equal(nb_sched_pick(&c, &in, g_points, N_POINTS, &d, 3, &d, &at), NB_OK);
  assert_int_equal(at, 3);
  assert_int_equal(d.reason, NB_SCHED_HOLD);
  nb_sched_point_t bad[] = {{"nan-cost", 0.5, 8, 8, NAN, 0, 0, 0}};
  assert_int_equal(nb_sched_pick(&c, &in, bad, 1, NULL, 0, &d, &at), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "nan-cost"));
  assert_int_equal(nb_sched_pick(&c, &in, g_points, 0, NULL, 0, &d, &at), NB_ERR_INVALID);
}

/* A point's cost at its landing: measured at land and land_late, linear between and beyond (to
 * the round's end), flat before land and without a late measurement. A point that would land
 * late loses to a cheaper one that lands early when its staleness costs more than the bytes buy. */
static void test_pick_late(void** state) {
  (void)state;
  nb_sched_point_t pts[] = {
      {"top10-stale", 0.10, 8.125, 13, 0.010, 0.125, 0.75, 0.060}, /* staleness hurts it */
      {"top3-steady", 0.03, 4.125, 12, 0.029, 0.125, 0.75, 0.035},
  };
  assert_true(fabs(nb_sched_point_cost(&pts[0], 0.0) - 0.010) < 1e-12);
  assert_true(fabs(nb_sched_point_cost(&pts[0], 0.125) - 0.010) < 1e-12);
  assert_true(fabs(nb_sched_point_cost(&pts[0], 0.4375) - 0.035) < 1e-12);
  assert_true(fabs(nb_sched_point_cost(&pts[0], 0.75) - 0.060) < 1e-12);
  assert_true(fabs(nb_sched_point_cost(&pts[0], 1.0) - 0.080) < 1e-12);
  assert_true(fabs(nb_sched_point_cost(&pts[0], 7.0) - 0.080) < 1e-12); /* the round's end */
  nb_sched_point_t flat = pts[1];
  flat.land_late = 0;
  assert_true(nb_sched_point_cost(&flat, 0.9) == 0.029);
  nb_sched_config_t c = cfg();
  nb_sched_input_t in = input(4);
  nb_sched_decision_t d;
  size_t at = 99;
  /* 2e5 B/s: top-10 % (264 kB, 1.32 s) lands after 15 of 40 steps (0.375: cost 0.030), top-3 %
   * (60.5 kB) fits tau 4 (0.029) */
  in.goodput_Bps = 2e5;
  assert_int_equal(nb_sched_pick(&c, &in, pts, 2, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 1);
  /* 1e5 B/s: top-10 % lands after 30 (0.75: 0.060), top-3 % after 7 (0.175: 0.0295) */
  in.goodput_Bps = 1e5;
  assert_int_equal(nb_sched_pick(&c, &in, pts, 2, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 1);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LATER);
  assert_int_equal(d.hide_steps, 7);
  /* 4e5 B/s: top-10 % lands after 8 (0.2: 0.016) and wins over top-3 % at tau 4 (0.029) */
  in.goodput_Bps = 4e5;
  assert_int_equal(nb_sched_pick(&c, &in, pts, 2, NULL, 0, &d, &at), NB_OK);
  assert_int_equal(at, 0);
  assert_int_equal(d.reason, NB_SCHED_FLOOR_LATER);
  assert_int_equal(d.hide_steps, 8);
  pts[0].land_late = 1.5; /* out of [0, 1] */
  assert_int_equal(nb_sched_pick(&c, &in, pts, 2, NULL, 0, &d, &at), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "top10-stale"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tau_budget),
      cmocka_unit_test(test_tau_latency),
      cmocka_unit_test(test_floor_later_then_lengthen),
      cmocka_unit_test(test_observed_exchange),
      cmocka_unit_test(test_tau_wall_rounds),
      cmocka_unit_test(test_pick),
      cmocka_unit_test(test_pick_hold),
      cmocka_unit_test(test_pick_late),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
