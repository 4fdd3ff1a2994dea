/* Unit tests of inter/ratelimit: rate accuracy over a short run (one and two threads), a rate
 * change reaching a sleeping waiter, deadlines, cancellation, and bad arguments. Timing checks use
 * tolerances wide enough for a loaded 2-core machine, but each can fail if pacing is wrong. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "inter/ratelimit.h"

typedef struct {
  nb_ratelimit_t* rl;
  size_t chunk;
  int n;
  nb_status_t st;
} sender_t;

static void* sender(void* arg) {
  sender_t* s = arg;
  s->st = NB_OK;
  for (int i = 0; i < s->n && s->st == NB_OK; ++i) s->st = nb_ratelimit_acquire(s->rl, s->chunk);
  return NULL;
}

/* Bytes beyond the burst must take (bytes - burst) / rate seconds. */
static void check_rate(int nthreads) {
  const double rate = 4e6, burst = 64 * 1024;
  const size_t chunk = 16 * 1024;
  const int per_thread = (int)(2.4e6 / chunk / nthreads); /* ~2.4 MB in all: ~0.6 s */
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(rate, burst, &rl), NB_OK);
  sender_t s[2];
  pthread_t th[2];
  double t0 = nb_now_s();
  for (int i = 0; i < nthreads; ++i) {
    s[i] = (sender_t){.rl = rl, .chunk = chunk, .n = per_thread};
    assert_int_equal(pthread_create(&th[i], NULL, sender, &s[i]), 0);
  }
  for (int i = 0; i < nthreads; ++i) {
    pthread_join(th[i], NULL);
    assert_int_equal(s[i].st, NB_OK);
  }
  double dt = nb_now_s() - t0;
  double total = (double)chunk * per_thread * nthreads;
  double expect = (total - burst) / rate;
  double measured = (total - burst) / dt;
  printf("ratelimit %d thread(s): %.0f bytes in %.3f s (expected %.3f s), %.3f MB/s of 4.000\n",
         nthreads, total, dt, expect, measured / 1e6);
  assert_true(dt >= expect * 0.97); /* never faster than the rate */
  assert_true(dt <= expect * 1.25); /* and not much slower */
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_int_equal(st.bytes, (uint64_t)total);
  assert_true(st.waits > 0);
  nb_ratelimit_destroy(rl);
}

static void test_rate_accuracy_one_thread(void** state) {
  (void)state;
  check_rate(1);
}

static void test_rate_accuracy_two_threads(void** state) {
  (void)state;
  check_rate(2);
}

static void test_burst_then_wait(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(1e6, 100000, &rl), NB_OK);
  /* The bucket starts full: 100 kB pass at once, the next 50 kB take ~50 ms. */
  double t0 = nb_now_s();
  assert_int_equal(nb_ratelimit_acquire(rl, 100000), NB_OK);
  assert_true(nb_now_s() - t0 < 0.02);
  assert_int_equal(nb_ratelimit_acquire(rl, 50000), NB_OK);
  double dt = nb_now_s() - t0;
  assert_true(dt >= 0.048);
  assert_true(dt < 0.2);
  nb_ratelimit_destroy(rl);
}

typedef struct {
  nb_ratelimit_t* rl;
  size_t bytes;
  nb_status_t st;
  double took;
} waiter_t;

static void* waiter(void* arg) {
  waiter_t* w = arg;
  double t0 = nb_now_s();
  w->st = nb_ratelimit_acquire(w->rl, w->bytes);
  w->took = nb_now_s() - t0;
  return NULL;
}

static void test_rate_change_wakes_waiter(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(100e3, 1000, &rl), NB_OK);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK); /* empty the bucket */
  waiter_t w = {.rl = rl, .bytes = 300000};                /* 3 s at 100 kB/s */
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiter, &w), 0);
  nb_sleep_ns(100 * 1000000LL);
  assert_int_equal(nb_ratelimit_set_rate(rl, 10e6, 0), NB_OK);
  pthread_join(th, NULL);
  assert_int_equal(w.st, NB_OK);
  printf("waiter for 300 kB: %.3f s after a raise from 100 kB/s to 10 MB/s at 0.1 s\n", w.took);
  assert_true(w.took < 0.6);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_true(fabs(st.rate_Bps - 10e6) < 1.0);
  assert_true(fabs(st.burst_bytes - 1000) < 1e-9); /* burst 0 keeps the burst */

  /* Lowering the rate slows a waiter down: 20 kB at 1 MB/s would be 20 ms, at 50 kB/s it is
   * ~0.4 s. */
  nb_ratelimit_t* rl2 = NULL;
  assert_int_equal(nb_ratelimit_create(1e6, 1000, &rl2), NB_OK);
  assert_int_equal(nb_ratelimit_acquire(rl2, 1000), NB_OK);
  assert_int_equal(nb_ratelimit_set_rate(rl2, 50e3, 0), NB_OK);
  waiter_t w2 = {.rl = rl2, .bytes = 20000};
  assert_int_equal(pthread_create(&th, NULL, waiter, &w2), 0);
  pthread_join(th, NULL);
  assert_int_equal(w2.st, NB_OK);
  assert_true(w2.took > 0.3);
  nb_ratelimit_destroy(rl2);
  nb_ratelimit_destroy(rl);
}

static void test_unlimited_and_switch(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(0, 0, &rl), NB_OK);
  double t0 = nb_now_s();
  for (int i = 0; i < 1000; ++i) assert_int_equal(nb_ratelimit_acquire(rl, 1 << 20), NB_OK);
  assert_true(nb_now_s() - t0 < 0.1);
  assert_int_equal(nb_ratelimit_try_acquire(rl, (size_t)1 << 40), 1);
  /* Limited from now on: the default burst (64 KiB here) passes, then it paces. */
  assert_int_equal(nb_ratelimit_set_rate(rl, 1e6, 0), NB_OK);
  t0 = nb_now_s();
  assert_int_equal(nb_ratelimit_acquire(rl, 65536 + 50000), NB_OK);
  double dt = nb_now_s() - t0;
  assert_true(dt >= 0.045 && dt < 0.3);
  nb_ratelimit_destroy(rl);
}

static void test_try_acquire(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(1000, 10000, &rl), NB_OK);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 8000), 1);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 8000), 0); /* only ~2000 left */
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1500), 1);
  nb_ratelimit_destroy(rl);
}

static void test_deadline(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(10e3, 1000, &rl), NB_OK);
  double t0 = nb_now_s();
  /* 100 kB at 10 kB/s cannot make a 50 ms deadline: refused at once, nothing reserved. */
  assert_int_equal(nb_ratelimit_acquire_until(rl, 100000, nb_now_ns() + 50 * 1000000LL),
                   NB_ERR_TIMEOUT);
  assert_true(nb_now_s() - t0 < 0.03);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 900), 1); /* the bucket is still full */
  /* A feasible one passes. */
  assert_int_equal(nb_ratelimit_acquire_until(rl, 500, nb_now_ns() + 1000000000LL), NB_OK);
  assert_int_equal(nb_ratelimit_acquire_until(rl, 1, -5), NB_ERR_INVALID);
  nb_ratelimit_destroy(rl);
}

static void test_cancel(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(1000, 1000, &rl), NB_OK);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK);
  waiter_t w = {.rl = rl, .bytes = 1000000}; /* 1000 s */
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiter, &w), 0);
  nb_sleep_ns(50 * 1000000LL);
  nb_ratelimit_cancel(rl);
  pthread_join(th, NULL);
  assert_int_equal(w.st, NB_ERR_CANCELLED);
  assert_true(w.took < 1.0);
  assert_int_equal(nb_ratelimit_acquire(rl, 1), NB_ERR_CANCELLED);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1), 0);
  nb_ratelimit_destroy(rl);
}

static void test_bad_arguments(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(-1, 0, &rl), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "rate"));
  assert_null(rl);
  assert_int_equal(nb_ratelimit_create(NAN, 0, &rl), NB_ERR_INVALID);
  assert_int_equal(nb_ratelimit_create(INFINITY, 0, &rl), NB_ERR_INVALID);
  assert_int_equal(nb_ratelimit_create(1e6, -5, &rl), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "burst"));
  assert_int_equal(nb_ratelimit_create(1e6, 0, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_ratelimit_create(1e6, 0, &rl), NB_OK);
  assert_int_equal(nb_ratelimit_set_rate(rl, NAN, 0), NB_ERR_INVALID);
  assert_int_equal(nb_ratelimit_set_rate(NULL, 1, 0), NB_ERR_INVALID);
  assert_int_equal(nb_ratelimit_acquire(NULL, 1), NB_ERR_INVALID);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_true(fabs(st.rate_Bps - 1e6) < 1e-9); /* unchanged by the refused call */
  nb_ratelimit_destroy(rl);
  nb_ratelimit_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rate_accuracy_one_thread),
      cmocka_unit_test(test_rate_accuracy_two_threads),
      cmocka_unit_test(test_burst_then_wait),
      cmocka_unit_test(test_rate_change_wakes_waiter),
      cmocka_unit_test(test_unlimited_and_switch),
      cmocka_unit_test(test_try_acquire),
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
