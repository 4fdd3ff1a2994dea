/* Unit tests of inter/sched with overlap steps (tau): the transfer must fit under the tau inner
 * steps after which the update lands, not the whole round; at the density floor the update is
 * let land later (a larger tau, reason floor_later) before the round is lengthened; without
 * overlap, or with tau >= H, the decision is the whole round's as before. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tau_budget),
      cmocka_unit_test(test_floor_later_then_lengthen),
      cmocka_unit_test(test_tau_wall_rounds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
