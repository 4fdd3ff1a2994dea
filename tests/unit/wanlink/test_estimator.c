/* Unit tests of inter/estimator: smoothing of noisy goodput, following a halved (and a doubled)
 * link within a few samples while ignoring a single outlier, small transfers feeding RTT only,
 * RTT smoothing and windowed minimum, bandwidth probes (RTT taken off their time), an estimate
 * going stale (in virtual time), and bad inputs. Samples are synthetic and deterministic. */
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

#define MB 1e6

static nb_estimator_t* make(void) {
  nb_estimator_config_t c;
  nb_estimator_config_default(&c);
  c.alpha = 0.3;
  c.change_samples = 3;
  c.change_ratio = 0.25;
  c.min_bytes = 65536;
  c.rtt_window = 8;
  nb_estimator_t* e = NULL;
  assert_int_equal(nb_estimator_create(&c, &e), NB_OK);
  return e;
}

/* A transfer of `bytes` at `rate` bytes/s with a deterministic +-5% wobble. */
static void feed(nb_estimator_t* e, double rate, int i) {
  const uint64_t bytes = 8u << 20;
  double wobble = 1.0 + 0.05 * ((i % 3) - 1);
  assert_int_equal(nb_estimator_add_transfer(e, bytes, (double)bytes / (rate * wobble), 4), NB_OK);
}

static double rel(double a, double b) {
  return fabs(a - b) / b;
}

static void test_steady_and_halved(void** state) {
  (void)state;
  nb_estimator_t* e = make();
  nb_estimate_t s;
  for (int i = 0; i < 10; ++i) feed(e, 12.5 * MB, i);
  nb_estimator_get(e, &s);
  printf("steady 12.5 MB/s: estimate %.3f MB/s\n", s.goodput_Bps / MB);
  assert_true(rel(s.goodput_Bps, 12.5 * MB) < 0.05);
  assert_int_equal(s.transfer_samples, 10);
  assert_int_equal(s.streams, 4);

  /* One slow outlier moves it by about alpha x the gap, not to the outlier. */
  feed(e, 6.25 * MB, 1);
  nb_estimator_get(e, &s);
  assert_true(s.goodput_Bps > 9.5 * MB);

  /* The link halves: within 3 samples the estimate is within 10% of the new rate. */
  int followed_at = -1;
  for (int i = 0; i < 6; ++i) {
    feed(e, 6.25 * MB, i);
    nb_estimator_get(e, &s);
    printf("after %d samples at 6.25 MB/s: estimate %.3f MB/s\n", i + 1, s.goodput_Bps / MB);
    if (followed_at < 0 && rel(s.goodput_Bps, 6.25 * MB) < 0.10) followed_at = i + 1;
  }
  assert_true(followed_at >= 1 && followed_at <= 3);
  assert_true(rel(s.goodput_Bps, 6.25 * MB) < 0.05);
  assert_true(s.restarts >= 1);

  /* And it doubles back. */
  followed_at = -1;
  for (int i = 0; i < 6; ++i) {
    feed(e, 12.5 * MB, i);
    nb_estimator_get(e, &s);
    if (followed_at < 0 && rel(s.goodput_Bps, 12.5 * MB) < 0.10) followed_at = i + 1;
  }
  assert_true(followed_at >= 1 && followed_at <= 3);
  nb_estimator_destroy(e);
}

static void test_small_transfers_and_streams(void** state) {
  (void)state;
  nb_estimator_t* e = make();
  nb_estimate_t s;
  /* 1 KiB in 50 ms is latency, not a 20 kB/s link: it must not count as goodput. */
  assert_int_equal(nb_estimator_add_transfer(e, 1024, 0.05, 1), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(s.goodput_Bps == 0.0);
  assert_int_equal(s.transfer_samples, 0);
  assert_int_equal(s.bytes_total, 1024);
  assert_true(nb_estimator_predict_s(e, 1000) < 0.0);

  for (int i = 0; i < 5; ++i)
    assert_int_equal(nb_estimator_add_transfer(e, 10 * 1000 * 1000, 1.0, 1), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(rel(s.goodput_Bps, 10 * MB) < 1e-9);
  /* Four streams carry more: the average restarts at the first sample with the new count. */
  assert_int_equal(nb_estimator_add_transfer(e, 10 * 1000 * 1000, 0.4, 4), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(rel(s.goodput_Bps, 25 * MB) < 1e-9);
  assert_int_equal(s.streams, 4);
  assert_int_equal(nb_estimator_add_rtt(e, 0.05), NB_OK);
  double p = nb_estimator_predict_s(e, 25 * 1000 * 1000);
  assert_true(fabs(p - 1.05) < 1e-6);
  nb_estimator_destroy(e);
}

static void test_rtt(void** state) {
  (void)state;
  nb_estimator_t* e = make(); /* window of 8 */
  nb_estimate_t s;
  for (int i = 0; i < 10; ++i) assert_int_equal(nb_estimator_add_rtt(e, 0.050), NB_OK);
  assert_int_equal(nb_estimator_add_rtt(e, 0.020), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(fabs(s.rtt_min_s - 0.020) < 1e-12);
  assert_true(s.rtt_s > 0.045 && s.rtt_s < 0.050); /* smoothed: one sample moves it by 1/8 */
  assert_true(fabs(s.rtt_last_s - 0.020) < 1e-12);
  /* The path gets longer: after a full window the old minimum is forgotten. */
  for (int i = 0; i < 8; ++i) assert_int_equal(nb_estimator_add_rtt(e, 0.200), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(fabs(s.rtt_min_s - 0.200) < 1e-12);
  assert_int_equal(s.rtt_samples, 19);
  nb_estimator_destroy(e);
}

static void test_bad_inputs(void** state) {
  (void)state;
  nb_estimator_t* e = make();
  assert_int_equal(nb_estimator_add_transfer(e, 0, 1.0, 1), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_transfer(e, 100, 0.0, 1), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_transfer(e, 100, -1.0, 1), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_transfer(e, 100, NAN, 1), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_transfer(e, 100, INFINITY, 1), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_transfer(e, 100, 1.0, 0), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "streams"));
  assert_int_equal(nb_estimator_add_rtt(e, 0.0), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_rtt(e, NAN), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_rtt(NULL, 0.1), NB_ERR_INVALID);
  nb_estimate_t s;
  nb_estimator_get(e, &s);
  assert_int_equal(s.transfer_samples + s.rtt_samples + s.bytes_total, 0); /* nothing counted */
  nb_estimator_destroy(e);

  nb_estimator_config_t c;
  nb_estimator_config_default(&c);
  nb_estimator_t* e2 = NULL;
  c.alpha = 0.0;
  assert_int_equal(nb_estimator_create(&c, &e2), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "alpha"));
  nb_estimator_config_default(&c);
  c.change_ratio = 1.5;
  assert_int_equal(nb_estimator_create(&c, &e2), NB_ERR_INVALID);
  nb_estimator_config_default(&c);
  c.rtt_window = 0;
  assert_int_equal(nb_estimator_create(&c, &e2), NB_ERR_INVALID);
  nb_estimator_config_default(&c);
  c.change_samples = 0;
  assert_int_equal(nb_estimator_create(&c, &e2), NB_ERR_INVALID);
  assert_null(e2);
  assert_int_equal(nb_estimator_create(NULL, &e2), NB_OK); /* defaults are valid */
  nb_estimator_destroy(e2);
  nb_estimator_destroy(NULL);
}

/* Probes: the minimum RTT is taken off their time, so a probe smaller than a bandwidth-delay
 * product still measures the rate; they bypass min_bytes, keep the stream count, follow a halved
 * link like transfers do, and cannot claim more than 20x their raw rate. */
static void test_probes(void** state) {
  (void)state;
  nb_estimator_t* e = make();
  /* no RTT yet: the whole time counts */
  assert_int_equal(nb_estimator_add_probe(e, 100000, 0.2), NB_OK);
  nb_estimate_t est;
  nb_estimator_get(e, &est);
  assert_true(fabs(est.goodput_Bps - 500000) < 1);
  assert_int_equal(est.probe_samples, 1);
  nb_estimator_destroy(e);

  e = make();
  for (int i = 0; i < 4; i++) assert_int_equal(nb_estimator_add_rtt(e, 0.05), NB_OK);
  assert_int_equal(nb_estimator_add_transfer(e, 8 * MB, 1.0, 4), NB_OK); /* 8 MB/s, 4 streams */
  /* 262144 bytes at 1 MB/s after a 50 ms round trip: 1 MB/s, not 262144 / 0.312 */
  for (int i = 0; i < 5; i++)
    assert_int_equal(nb_estimator_add_probe(e, 262144, 0.05 + 0.262144), NB_OK);
  nb_estimator_get(e, &est);
  printf("after probes at 1 MB/s: %.0f B/s, last %.0f, %llu restarts\n", est.goodput_Bps,
         est.goodput_last_Bps, (unsigned long long)est.restarts);
  assert_true(fabs(est.goodput_last_Bps - 1e6) < 1);
  assert_true(fabs(est.goodput_Bps - 1e6) < 0.05e6); /* the change detector restarted it */
  assert_int_equal(est.streams, 4);                  /* a probe is not a stream-count change */
  assert_int_equal(est.probe_samples, 5);
  /* the link halves: three probes later the estimate is half */
  for (int i = 0; i < 3; i++)
    assert_int_equal(nb_estimator_add_probe(e, 262144, 0.05 + 0.524288), NB_OK);
  nb_estimator_get(e, &est);
  assert_true(fabs(est.goodput_Bps - 0.5e6) < 0.01e6);
  /* a probe faster than the RTT floor: at most 20x its raw rate */
  assert_int_equal(nb_estimator_add_probe(e, 10000, 0.04), NB_OK);
  nb_estimator_get(e, &est);
  assert_true(est.goodput_last_Bps <= 10000 / 0.04 * 20 + 1);
  /* bad inputs */
  assert_int_equal(nb_estimator_add_probe(e, 0, 1.0), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_probe(e, 10, 0.0), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_probe(e, 10, NAN), NB_ERR_INVALID);
  assert_int_equal(nb_estimator_add_probe(NULL, 10, 1.0), NB_ERR_INVALID);
  nb_estimator_destroy(e);
}

/* stale_s on the estimator's clock: a goodput sample after more than stale_s without one restarts
 * the average instead of moving it by alpha; RTT samples do not keep the estimate fresh. */
static void test_stale(void** state) {
  (void)state;
  nb_vclock_t* vc = NULL;
  assert_int_equal(nb_vclock_create(1000000000LL, 0, &vc), NB_OK); /* starts at 1 s */
  nb_estimator_config_t c;
  nb_estimator_config_default(&c);
  c.alpha = 0.5;
  c.change_samples = 3;
  c.stale_s = 120.0;
  nb_estimator_t* e = NULL;
  assert_int_equal(nb_estimator_create_clock(&c, nb_vclock_clock(vc), &e), NB_OK);
  nb_estimate_t s;
  for (int i = 0; i < 3; i++)
    assert_int_equal(nb_estimator_add_transfer(e, 10 * 1000 * 1000, 1.0, 1), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(s.goodput_Bps == 10 * MB);
  assert_true(fabs(s.updated_s - 1.0) < 1e-9);
  assert_int_equal(s.restarts, 0);

  /* 119 s later the estimate is still fresh: one slow sample moves it halfway */
  nb_vclock_advance(vc, 119 * 1000000000LL);
  assert_int_equal(nb_estimator_add_transfer(e, 5 * 1000 * 1000, 1.0, 1), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(s.goodput_Bps == 7.5 * MB);
  assert_int_equal(s.restarts, 0);
  assert_true(fabs(s.updated_s - 120.0) < 1e-9);

  /* 121 s without a goodput sample (an RTT in between does not count): the next one restarts */
  nb_vclock_advance(vc, 100 * 1000000000LL);
  assert_int_equal(nb_estimator_add_rtt(e, 0.05), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(fabs(s.updated_s - 220.0) < 1e-9);
  nb_vclock_advance(vc, 21 * 1000000000LL);
  assert_int_equal(nb_estimator_add_transfer(e, 5 * 1000 * 1000, 1.0, 1), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(s.goodput_Bps == 5 * MB);
  assert_int_equal(s.restarts, 1);
  assert_true(fabs(s.updated_s - 241.0) < 1e-9);
  nb_estimator_destroy(e);

  /* stale_s 0: never stale */
  c.stale_s = 0.0;
  assert_int_equal(nb_estimator_create_clock(&c, nb_vclock_clock(vc), &e), NB_OK);
  assert_int_equal(nb_estimator_add_transfer(e, 10 * 1000 * 1000, 1.0, 1), NB_OK);
  nb_vclock_advance(vc, 100000 * 1000000000LL);
  assert_int_equal(nb_estimator_add_transfer(e, 5 * 1000 * 1000, 1.0, 1), NB_OK);
  nb_estimator_get(e, &s);
  assert_true(s.goodput_Bps == 7.5 * MB);
  assert_int_equal(s.restarts, 0);
  nb_estimator_destroy(e);

  nb_clock_t none = {0};
  assert_int_equal(nb_estimator_create_clock(&c, &none, &e), NB_ERR_INVALID);
  assert_null(e);
  nb_vclock_destroy(vc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_steady_and_halved),
      cmocka_unit_test(test_small_transfers_and_streams),
      cmocka_unit_test(test_rtt),
      cmocka_unit_test(test_probes),
      cmocka_unit_test(test_stale),
      cmocka_unit_test(test_bad_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
