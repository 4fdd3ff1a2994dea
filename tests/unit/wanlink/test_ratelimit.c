/* Unit tests of inter/ratelimit in virtual time (common/clock.h nb_vclock_t): exact waits for the
 * rate (one and two threads), the burst, FIFO order of waiters, a rate change reaching a sleeping
 * waiter (raised and lowered), deadlines, cancellation, and bad arguments; and the real clock's
 * wait path by outcome only. No verdict here reads the wall clock. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "inter/ratelimit.h"

#define MS 1000000LL
#define T0 (1000 * MS) /* virtual clocks start here */
/* Real-time bound on waiting for a thread to reach its sleep: only a hang reaches it. */
#define HANG_MS 30000
/* The byte counters are doubles and each wake is rounded up to a whole nanosecond, so a virtual
 * wait can end a few nanoseconds after the exact quotient. */
#define ROUND_NS 4

static void assert_ns(int64_t got, int64_t want) {
  if (llabs(got - want) > ROUND_NS)
    fail_msg("virtual time %lld ns, want %lld ns", (long long)got, (long long)want);
}

/* Moves a manual clock to the earliest sleeper's wake-up (asserted to the nanosecond before). */
static void advance_to_next(nb_vclock_t* vc) {
  int64_t d = nb_vclock_next_deadline(vc);
  assert_true(d >= nb_vclock_now(vc));
  nb_vclock_advance(vc, d - nb_vclock_now(vc));
}

static nb_vclock_t* vclock(int auto_advance) {
  nb_vclock_t* vc = NULL;
  assert_int_equal(nb_vclock_create(T0, auto_advance, &vc), NB_OK);
  return vc;
}

static nb_ratelimit_t* limiter(double rate, double burst, nb_vclock_t* vc) {
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create_clock(rate, burst, nb_vclock_clock(vc), &rl), NB_OK);
  return rl;
}

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

/* Bytes beyond the burst take exactly (bytes - burst) / rate of clock time, however many threads
 * share the limiter; every acquire past the burst sleeps. */
static void check_rate(int nthreads) {
  const double rate = 4e6, burst = 64 * 1024;
  const size_t chunk = 16 * 1024;
  const int per_thread = 146 / nthreads; /* ~2.4 MB in all: 0.58 s of virtual time */
  nb_vclock_t* vc = vclock(1);
  nb_ratelimit_t* rl = limiter(rate, burst, vc);
  sender_t s[2];
  pthread_t th[2];
  for (int i = 0; i < nthreads; ++i) {
    s[i] = (sender_t){.rl = rl, .chunk = chunk, .n = per_thread};
    assert_int_equal(pthread_create(&th[i], NULL, sender, &s[i]), 0);
  }
  for (int i = 0; i < nthreads; ++i) {
    pthread_join(th[i], NULL);
    assert_int_equal(s[i].st, NB_OK);
  }
  int64_t dt = nb_vclock_now(vc) - T0;
  double total = (double)chunk * per_thread * nthreads;
  int64_t expect = (int64_t)ceil((total - burst) / rate * 1e9);
  printf("ratelimit %d thread(s): %.0f bytes in %.9f s of clock time (exact: %.9f s)\n", nthreads,
         total, (double)dt * 1e-9, (double)expect * 1e-9);
  assert_ns(dt, expect);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_int_equal(st.bytes, (uint64_t)total);
  assert_int_equal(st.acquires, (uint64_t)(per_thread * nthreads));
  assert_int_equal(st.waits, st.acquires - 4); /* the first 4 chunks are the burst */
  assert_true(fabs(st.wait_s - (double)dt * 1e-9) < 1e-6);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

static void test_rate_one_thread(void** state) {
  (void)state;
  check_rate(1);
}

static void test_rate_two_threads(void** state) {
  (void)state;
  check_rate(2);
}

static void test_burst_then_wait(void** state) {
  (void)state;
  nb_vclock_t* vc = vclock(1);
  nb_ratelimit_t* rl = limiter(1e6, 100000, vc);
  /* The bucket starts full: 100 kB pass without a wait, the next 50 kB take 50 ms. */
  assert_int_equal(nb_ratelimit_acquire(rl, 100000), NB_OK);
  assert_int_equal(nb_vclock_waits(vc), 0);
  assert_int_equal(nb_vclock_now(vc), T0);
  assert_int_equal(nb_ratelimit_acquire(rl, 50000), NB_OK);
  assert_ns(nb_vclock_now(vc) - T0, 50 * MS);
  /* idle time refills the bucket up to the burst, not beyond */
  nb_vclock_advance(vc, 10000 * MS);
  uint64_t w = nb_vclock_waits(vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 100000), NB_OK);
  assert_int_equal(nb_vclock_waits(vc), w);
  int64_t t1 = nb_vclock_now(vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK);
  assert_ns(nb_vclock_now(vc) - t1, 1 * MS);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

typedef struct {
  nb_ratelimit_t* rl;
  nb_vclock_t* vc;
  size_t bytes;
  int64_t deadline_ns; /* -1: nb_ratelimit_acquire */
  nb_status_t st;
  int64_t took_ns; /* clock time */
} waiter_t;

static void* waiter(void* arg) {
  waiter_t* w = arg;
  int64_t t0 = nb_vclock_now(w->vc);
  w->st = w->deadline_ns < 0 ? nb_ratelimit_acquire(w->rl, w->bytes)
                             : nb_ratelimit_acquire_until(w->rl, w->bytes, w->deadline_ns);
  w->took_ns = nb_vclock_now(w->vc) - t0;
  return NULL;
}

static void start_waiter(waiter_t* w, pthread_t* th, uint64_t waits_after) {
  assert_int_equal(pthread_create(th, NULL, waiter, w), 0);
  assert_int_equal(nb_vclock_wait_waits(w->vc, waits_after, HANG_MS), NB_OK);
}

static void test_fifo(void** state) {
  (void)state;
  nb_vclock_t* vc = vclock(0);
  nb_ratelimit_t* rl = limiter(1e6, 1000, vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK); /* empty the bucket */
  waiter_t a = {.rl = rl, .vc = vc, .bytes = 10000, .deadline_ns = -1};
  waiter_t b = {.rl = rl, .vc = vc, .bytes = 5000, .deadline_ns = -1};
  pthread_t ta, tb;
  start_waiter(&a, &ta, 1);
  start_waiter(&b, &tb, 2);
  /* b arrived second: it waits for a's 10 kB and then its own 5 kB */
  assert_ns(nb_vclock_next_deadline(vc), T0 + 10 * MS);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1), 0); /* no overtaking either */
  advance_to_next(vc);
  pthread_join(ta, NULL);
  assert_int_equal(a.st, NB_OK);
  assert_ns(a.took_ns, 10 * MS);
  assert_int_equal(nb_vclock_wait_waits(vc, 2, HANG_MS), NB_OK); /* b still asleep */
  assert_ns(nb_vclock_next_deadline(vc), T0 + 15 * MS);
  advance_to_next(vc);
  pthread_join(tb, NULL);
  assert_int_equal(b.st, NB_OK);
  assert_ns(b.took_ns, 15 * MS);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_int_equal(st.bytes, 16000);
  assert_int_equal(st.waits, 2);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

static void test_rate_change_wakes_waiter(void** state) {
  (void)state;
  nb_vclock_t* vc = vclock(0);
  nb_ratelimit_t* rl = limiter(100e3, 1000, vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK); /* empty the bucket */
  waiter_t w = {.rl = rl, .vc = vc, .bytes = 300000, .deadline_ns = -1};
  pthread_t th;
  start_waiter(&w, &th, 1);
  assert_ns(nb_vclock_next_deadline(vc), T0 + 3000 * MS); /* 3 s at 100 kB/s */
  /* At 0.1 s (10 kB paid) the rate goes to 10 MB/s: the sleeping waiter wakes and pays the
   * other 290 kB at the new rate, 29 ms. */
  nb_vclock_advance(vc, 100 * MS);
  assert_int_equal(nb_ratelimit_set_rate(rl, 10e6, 0), NB_OK);
  assert_int_equal(nb_vclock_wait_waits(vc, 2, HANG_MS), NB_OK);
  assert_ns(nb_vclock_next_deadline(vc), T0 + 129 * MS);
  advance_to_next(vc);
  pthread_join(th, NULL);
  assert_int_equal(w.st, NB_OK);
  assert_ns(w.took_ns, 129 * MS);
  printf(
      "waiter for 300 kB: %.3f s of clock time after a raise from 100 kB/s to 10 MB/s at "
      "0.1 s\n",
      (double)w.took_ns * 1e-9);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_true(st.rate_Bps == 10e6);
  assert_true(st.burst_bytes == 1000); /* burst 0 keeps the burst */
  nb_ratelimit_destroy(rl);

  /* Lowering the rate slows a sleeping waiter down: 20 kB at 1 MB/s would be 20 ms, at 50 kB/s
   * it is 400 ms, and the old wake-up time passes without it. */
  rl = limiter(1e6, 1000, vc);
  int64_t t1 = nb_vclock_now(vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK);
  waiter_t w2 = {.rl = rl, .vc = vc, .bytes = 20000, .deadline_ns = -1};
  uint64_t n = nb_vclock_waits(vc);
  start_waiter(&w2, &th, n + 1);
  assert_ns(nb_vclock_next_deadline(vc), t1 + 20 * MS);
  assert_int_equal(nb_ratelimit_set_rate(rl, 50e3, 0), NB_OK);
  assert_int_equal(nb_vclock_wait_waits(vc, n + 2, HANG_MS), NB_OK);
  assert_ns(nb_vclock_next_deadline(vc), t1 + 400 * MS);
  nb_vclock_advance(vc, 20 * MS);
  assert_int_equal(nb_vclock_wait_waits(vc, n + 2, HANG_MS), NB_OK); /* still asleep */
  assert_ns(nb_vclock_next_deadline(vc), t1 + 400 * MS);
  advance_to_next(vc);
  pthread_join(th, NULL);
  assert_int_equal(w2.st, NB_OK);
  assert_ns(w2.took_ns, 400 * MS);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

static void test_unlimited_and_switch(void** state) {
  (void)state;
  nb_vclock_t* vc = vclock(1);
  nb_ratelimit_t* rl = limiter(0, 0, vc);
  for (int i = 0; i < 1000; ++i) assert_int_equal(nb_ratelimit_acquire(rl, 1 << 20), NB_OK);
  assert_int_equal(nb_ratelimit_try_acquire(rl, (size_t)1 << 40), 1);
  assert_int_equal(nb_vclock_waits(vc), 0); /* unlimited: nothing ever waits */
  assert_int_equal(nb_vclock_now(vc), T0);
  /* Limited from now on: the default burst (16 KiB here: 10 ms at 1 MB/s is less) passes, then
   * it paces. */
  assert_int_equal(nb_ratelimit_set_rate(rl, 1e6, 0), NB_OK);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_true(st.burst_bytes == 16384);
  assert_int_equal(nb_ratelimit_acquire(rl, 16384 + 50000), NB_OK);
  assert_ns(nb_vclock_now(vc) - T0, 50 * MS);
  /* and back to unlimited: no wait again */
  assert_int_equal(nb_ratelimit_set_rate(rl, 0, 0), NB_OK);
  uint64_t w = nb_vclock_waits(vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 100u << 20), NB_OK);
  assert_int_equal(nb_vclock_waits(vc), w);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

static void test_try_acquire(void** state) {
  (void)state;
  nb_vclock_t* vc = vclock(0);
  nb_ratelimit_t* rl = limiter(1000, 10000, vc);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 8000), 1);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 8000), 0); /* exactly 2000 left */
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1500), 1);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 501), 0);
  nb_vclock_advance(vc, 1 * MS); /* one more byte at 1000 B/s */
  assert_int_equal(nb_ratelimit_try_acquire(rl, 501), 1);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1), 0);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_int_equal(st.bytes, 10001);
  assert_int_equal(st.acquires, 3);
  assert_int_equal(st.waits, 0);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

static void test_deadline(void** state) {
  (void)state;
  nb_vclock_t* vc = vclock(1);
  nb_ratelimit_t* rl = limiter(10e3, 1000, vc);
  /* 100 kB at 10 kB/s cannot make a 50 ms deadline: refused at once, nothing reserved. */
  assert_int_equal(nb_ratelimit_acquire_until(rl, 100000, T0 + 50 * MS), NB_ERR_TIMEOUT);
  assert_int_equal(nb_vclock_waits(vc), 0);
  assert_int_equal(nb_vclock_now(vc), T0);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 900), 1); /* the bucket is still full */
  /* A feasible one passes: 400 bytes missing at 10 kB/s, 40 ms of a 1 s deadline. */
  assert_int_equal(nb_ratelimit_acquire_until(rl, 500, T0 + 1000 * MS), NB_OK);
  assert_ns(nb_vclock_now(vc) - T0, 40 * MS);
  /* one that ends exactly at its deadline is feasible */
  int64_t t1 = nb_vclock_now(vc);
  assert_int_equal(nb_ratelimit_acquire_until(rl, 100, t1 + 10 * MS + ROUND_NS), NB_OK);
  assert_int_equal(nb_ratelimit_acquire_until(rl, 1, -5), NB_ERR_INVALID);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);

  /* The rate drops while a caller waits: its deadline ends the wait with NB_ERR_TIMEOUT, and the
   * reservation stays consumed. */
  vc = vclock(0);
  rl = limiter(10e3, 1000, vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK); /* empty the bucket */
  waiter_t w = {.rl = rl, .vc = vc, .bytes = 2000, .deadline_ns = T0 + 500 * MS};
  pthread_t th;
  start_waiter(&w, &th, 1);
  assert_ns(nb_vclock_next_deadline(vc), T0 + 200 * MS);
  assert_int_equal(nb_ratelimit_set_rate(rl, 1000, 0), NB_OK); /* 2 s now: past the deadline */
  assert_int_equal(nb_vclock_wait_waits(vc, 2, HANG_MS), NB_OK);
  assert_int_equal(nb_vclock_next_deadline(vc), T0 + 500 * MS);
  nb_vclock_advance(vc, 500 * MS);
  pthread_join(th, NULL);
  assert_int_equal(w.st, NB_ERR_TIMEOUT);
  assert_int_equal(w.took_ns, 500 * MS);
  /* 500 of its 2000 bytes are paid at 0.5 s: the next byte is free 1.5 s later, not before */
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1), 0);
  nb_vclock_advance(vc, 1500 * MS);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1), 0);
  nb_vclock_advance(vc, 1 * MS);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1), 1);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_int_equal(st.bytes, 1001); /* the timed-out bytes are not counted as granted */
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

static void test_cancel(void** state) {
  (void)state;
  nb_vclock_t* vc = vclock(0);
  nb_ratelimit_t* rl = limiter(1000, 1000, vc);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK);
  waiter_t w = {.rl = rl, .vc = vc, .bytes = 1000000, .deadline_ns = -1};
  pthread_t th;
  start_waiter(&w, &th, 1);
  assert_ns(nb_vclock_next_deadline(vc), T0 + 1000000 * MS); /* 1000 s */
  nb_ratelimit_cancel(rl);
  pthread_join(th, NULL);
  assert_int_equal(w.st, NB_ERR_CANCELLED);
  assert_int_equal(w.took_ns, 0); /* the cancel ended it, not the clock */
  assert_int_equal(nb_vclock_next_deadline(vc), -1);
  assert_int_equal(nb_ratelimit_acquire(rl, 1), NB_ERR_CANCELLED);
  assert_int_equal(nb_ratelimit_acquire_until(rl, 1, T0 + 1), NB_ERR_CANCELLED);
  assert_int_equal(nb_ratelimit_try_acquire(rl, 1), 0);
  nb_ratelimit_destroy(rl);
  nb_vclock_destroy(vc);
}

/* The default clock: the same paths on CLOCK_MONOTONIC, judged by outcome only. */
static void* real_waiter(void* arg) {
  waiter_t* w = arg;
  w->st = nb_ratelimit_acquire(w->rl, w->bytes);
  return NULL;
}

static void test_real_clock(void** state) {
  (void)state;
  nb_ratelimit_t* rl = NULL;
  assert_int_equal(nb_ratelimit_create(1e6, 1000, &rl), NB_OK);
  assert_int_equal(nb_ratelimit_acquire(rl, 1000), NB_OK);
  /* more than the bucket can ever hold at once: this one must sleep (about 2 ms) */
  assert_int_equal(nb_ratelimit_acquire(rl, 2000), NB_OK);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_int_equal(st.waits, 1);
  assert_int_equal(st.bytes, 3000);
  assert_true(st.wait_s > 0.0);
  /* a waiter for 1000 s is released by a cancel, whether it is asleep yet or not */
  waiter_t w = {.rl = rl, .bytes = 1000000000};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, real_waiter, &w), 0);
  nb_ratelimit_cancel(rl);
  pthread_join(th, NULL);
  assert_int_equal(w.st, NB_ERR_CANCELLED);
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
  nb_clock_t half = *nb_clock_real();
  half.wait_until = NULL;
  assert_int_equal(nb_ratelimit_create_clock(1e6, 0, &half, &rl), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "clock"));
  assert_null(rl);
  assert_int_equal(nb_ratelimit_create(1e6, 0, &rl), NB_OK);
  assert_int_equal(nb_ratelimit_set_rate(rl, NAN, 0), NB_ERR_INVALID);
  assert_int_equal(nb_ratelimit_set_rate(NULL, 1, 0), NB_ERR_INVALID);
  assert_int_equal(nb_ratelimit_acquire(NULL, 1), NB_ERR_INVALID);
  nb_ratelimit_stats_t st;
  nb_ratelimit_stats(rl, &st);
  assert_true(st.rate_Bps == 1e6); /* unchanged by the refused call */
  nb_ratelimit_destroy(rl);
  nb_ratelimit_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rate_one_thread),
      cmocka_unit_test(test_rate_two_threads),
      cmocka_unit_test(test_burst_then_wait),
      cmocka_unit_test(test_fifo),
      cmocka_unit_test(test_rate_change_wakes_waiter),
      cmocka_unit_test(test_unlimited_and_switch),
      cmocka_unit_test(test_try_acquire),
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_real_clock),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
