/* Unit tests of common/: status text, error detail, parameters, allocation, clocks (the real one
 * against itself, the virtual one exactly), checksums. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

NB_PARAM_INT(TestLevel, "NB_TEST_LEVEL", 3, 1, 19, "a test parameter")
NB_PARAM_DOUBLE(TestRatio, "NB_TEST_RATIO", 0.5, 0.0, 1.0, "a test ratio")
NB_PARAM_STRING(TestName, "NB_TEST_NAME", "alpha", "a test string")

static void test_status_names(void** state) {
  (void)state;
  assert_string_equal(nb_status_name(NB_OK), "NB_OK");
  assert_string_equal(nb_status_name(NB_ERR_CODEC), "NB_ERR_CODEC");
  assert_string_equal(nb_status_name((nb_status_t)9999), "NB_ERR_UNKNOWN");
  for (int s = 0; s < NB_STATUS_COUNT_; s++) {
    assert_non_null(nb_status_str((nb_status_t)s));
    assert_true(strncmp(nb_status_name((nb_status_t)s), "NB_", 3) == 0);
  }
}

static nb_status_t fails_with_detail(unsigned k, unsigned n) {
  if (k > n) return nb_error(NB_ERR_CODEC, "k (%u) > n (%u)", k, n);
  return NB_OK;
}

static nb_status_t propagates(void) {
  NB_CHECK(fails_with_detail(5, 3));
  return NB_OK;
}

static void test_error_detail(void** state) {
  (void)state;
  nb_error_clear();
  assert_string_equal(nb_error_last(), "");
  assert_int_equal(propagates(), NB_ERR_CODEC);
  assert_string_equal(nb_error_last(), "k (5) > n (3)");
  assert_int_equal(nb_error_wrap(NB_ERR_CODEC, "frame %d", 7), NB_ERR_CODEC);
  assert_string_equal(nb_error_last(), "frame 7: k (5) > n (3)");
  errno = ENOENT;
  assert_int_equal(NB_ERRNO("open x"), NB_ERR_SYSTEM);
  assert_non_null(strstr(nb_error_last(), "open x"));
}

static void test_params(void** state) {
  (void)state;
  unsetenv("NB_TEST_LEVEL");
  nb_param_reset_all();
  assert_int_equal(nb_param_TestLevel(), 3);
  setenv("NB_TEST_LEVEL", "7", 1);
  assert_int_equal(nb_param_TestLevel(), 3); /* read once */
  nb_param_reset_all();
  assert_int_equal(nb_param_TestLevel(), 7);
  setenv("NB_TEST_LEVEL", "99", 1); /* out of bounds: default, with a warning */
  nb_param_reset_all();
  assert_int_equal(nb_param_TestLevel(), 3);
  setenv("NB_TEST_LEVEL", "7x", 1); /* garbage: default */
  nb_param_reset_all();
  assert_int_equal(nb_param_TestLevel(), 3);
  setenv("NB_TEST_RATIO", "0.25", 1);
  setenv("NB_TEST_NAME", "beta", 1);
  nb_param_reset_all();
  assert_true(nb_param_TestRatio() == 0.25);
  assert_string_equal(nb_param_TestName(), "beta");
  unsetenv("NB_TEST_LEVEL");
  unsetenv("NB_TEST_RATIO");
  unsetenv("NB_TEST_NAME");
}

static void count_param(const nb_param_t* p, void* ctx) {
  if (strncmp(p->env, "NB_TEST_", 8) == 0) (*(int*)ctx)++;
}

static void test_param_registry(void** state) {
  (void)state;
  int n = 0;
  nb_param_foreach(count_param, &n);
  assert_int_equal(n, 3);
}

static void test_alloc(void** state) {
  (void)state;
  float* v = NULL;
  assert_int_equal(nb_aligned_alloc((void**)&v, 1000, sizeof(float), "v"), NB_OK);
  assert_int_equal(((uintptr_t)v) % NB_ALIGN, 0);
  nb_free(v);
  void* p = (void*)1;
  assert_int_equal(nb_alloc(&p, SIZE_MAX / 2, 4, "huge"), NB_ERR_NOMEM);
  assert_null(p);
  assert_non_null(strstr(nb_error_last(), "huge"));
  int* z = NULL;
  assert_int_equal(NB_CALLOC(z, 16, "z"), NB_OK);
  for (int i = 0; i < 16; i++) assert_int_equal(z[i], 0);
  assert_int_equal(nb_realloc((void**)&z, 32, sizeof(int), "z"), NB_OK);
  nb_free(z);
  nb_free(NULL);
}

/* The real clock, judged against itself only: it never goes back, and a sleep or a sleep_until
 * ends no earlier than asked (load can only make them later, so this cannot flake). */
static void test_clock(void** state) {
  (void)state;
  int64_t prev = nb_now_ns();
  for (int i = 0; i < 1000; i++) {
    int64_t t = nb_now_ns();
    assert_true(t >= prev);
    prev = t;
  }
  int64_t a = nb_now_ns();
  nb_sleep_ns(2000000);
  assert_true(nb_now_ns() - a >= 2000000);
  const nb_clock_t* rc = nb_clock_real();
  int64_t until = rc->now_ns(rc->ctx) + 1000000;
  rc->sleep_until(rc->ctx, until);
  assert_true(nb_now_ns() >= until);
  rc->sleep_until(rc->ctx, 0); /* in the past: returns */
  assert_true(nb_wall_ns() > 1600000000LL * 1000000000LL);
}

typedef struct {
  nb_vclock_t* vc;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int flag;
  int64_t deadline;
  int64_t woke_at;
  int use_cv;
} vc_waiter_t;

static void* vc_waiter(void* arg) {
  vc_waiter_t* w = arg;
  const nb_clock_t* c = nb_vclock_clock(w->vc);
  if (w->use_cv) {
    pthread_mutex_lock(&w->mu);
    while (!w->flag && c->now_ns(c->ctx) < w->deadline)
      c->wait_until(c->ctx, &w->cv, &w->mu, w->deadline);
    pthread_mutex_unlock(&w->mu);
  } else {
    c->sleep_until(c->ctx, w->deadline);
  }
  w->woke_at = c->now_ns(c->ctx);
  return NULL;
}

static void vc_waiter_init(vc_waiter_t* w, nb_vclock_t* vc, int64_t deadline, int use_cv) {
  memset(w, 0, sizeof *w);
  w->vc = vc;
  w->deadline = deadline;
  w->use_cv = use_cv;
  assert_int_equal(pthread_mutex_init(&w->mu, NULL), 0);
  assert_int_equal(nb_clock_cond_init(&w->cv), 0);
}

static void vc_waiter_fini(vc_waiter_t* w) {
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

#define HANG_MS 30000 /* real-time bound on a thread reaching its wait: only a hang reaches it */

/* The virtual clock: auto_advance jumps to each wait's deadline; manual time moves only by
 * advance, which releases exactly the waits it reaches; a signal ends a wait_until early. */
static void test_vclock(void** state) {
  (void)state;
  nb_vclock_t* vc = NULL;
  assert_int_equal(nb_vclock_create(5, 1, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_vclock_create(5, 1, &vc), NB_OK);
  const nb_clock_t* c = nb_vclock_clock(vc);
  assert_int_equal(c->now_ns(c->ctx), 5);
  c->sleep_until(c->ctx, 100);
  assert_int_equal(nb_vclock_now(vc), 100);
  c->sleep_until(c->ctx, 50); /* in the past: no jump back, no wait */
  assert_int_equal(nb_vclock_now(vc), 100);
  assert_int_equal(nb_vclock_waits(vc), 1);
  vc_waiter_t w;
  vc_waiter_init(&w, vc, 200, 1);
  pthread_mutex_lock(&w.mu);
  c->wait_until(c->ctx, &w.cv, &w.mu, 200);
  pthread_mutex_unlock(&w.mu);
  assert_int_equal(nb_vclock_now(vc), 200);
  assert_int_equal(nb_vclock_waits(vc), 2);
  vc_waiter_fini(&w);
  nb_vclock_advance(vc, -7); /* ignored */
  assert_int_equal(nb_vclock_now(vc), 200);
  nb_vclock_destroy(vc);

  assert_int_equal(nb_vclock_create(0, 0, &vc), NB_OK);
  /* nobody waits: the wait for a waiter gives up (real-time bound, 10 ms) */
  assert_int_equal(nb_vclock_wait_waits(vc, 1, 10), NB_ERR_TIMEOUT);
  assert_int_equal(nb_vclock_next_deadline(vc), -1);
  for (int use_cv = 0; use_cv < 2; use_cv++) {
    uint64_t n = nb_vclock_waits(vc);
    int64_t t = nb_vclock_now(vc);
    vc_waiter_init(&w, vc, t + 1000, use_cv);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, vc_waiter, &w), 0);
    assert_int_equal(nb_vclock_wait_waits(vc, n + 1, HANG_MS), NB_OK);
    assert_int_equal(nb_vclock_next_deadline(vc), t + 1000);
    nb_vclock_advance(vc, 999);
    assert_int_equal(nb_vclock_wait_waits(vc, n + 1, HANG_MS), NB_OK); /* not reached: waits */
    assert_int_equal(nb_vclock_next_deadline(vc), t + 1000);
    nb_vclock_advance(vc, 1);
    pthread_join(th, NULL);
    assert_int_equal(w.woke_at, t + 1000);
    assert_int_equal(nb_vclock_next_deadline(vc), -1);
    vc_waiter_fini(&w);
  }
  /* a signal ends wait_until before its deadline, and the clock does not move */
  int64_t t = nb_vclock_now(vc);
  uint64_t n = nb_vclock_waits(vc);
  vc_waiter_init(&w, vc, t + 1000000000000LL, 1);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, vc_waiter, &w), 0);
  assert_int_equal(nb_vclock_wait_waits(vc, n + 1, HANG_MS), NB_OK);
  pthread_mutex_lock(&w.mu);
  w.flag = 1;
  pthread_cond_signal(&w.cv);
  pthread_mutex_unlock(&w.mu);
  pthread_join(th, NULL);
  assert_int_equal(w.woke_at, t);
  vc_waiter_fini(&w);
  nb_vclock_destroy(vc);
  nb_vclock_destroy(NULL);
}

static void test_checksums(void** state) {
  (void)state;
  /* Known answers: CRC-32 of "123456789" is 0xCBF43926; XXH3-64 of "" with seed 0 is
   * 0x2D06800538D394C2 (from the xxHash specification's test vectors). */
  assert_int_equal(nb_crc32(0, "123456789", 9), 0xCBF43926u);
  assert_true(nb_xxh3_64("", 0, 0) == 0x2D06800538D394C2ull);
  char buf[1000];
  for (int i = 0; i < 1000; i++) buf[i] = (char)(i * 7);
  nb_xxh3_state_t* s = nb_xxh3_create(42);
  assert_non_null(s);
  nb_xxh3_update(s, buf, 300);
  nb_xxh3_update(s, buf + 300, 700);
  assert_true(nb_xxh3_digest(s) == nb_xxh3_64(buf, 1000, 42));
  nb_xxh3_destroy(s);
  assert_true(nb_xxh3_64(buf, 1000, 1) != nb_xxh3_64(buf, 1000, 2));
}

static void test_log_levels(void** state) {
  (void)state;
  setenv("NB_DEBUG", "INFO", 1);
  setenv("NB_DEBUG_SUBSYS", "CODEC,WIRE", 1);
  nb_log_reload();
  assert_true(nb_log_enabled(NB_LOG_INFO, NB_SUB_CODEC));
  assert_false(nb_log_enabled(NB_LOG_INFO, NB_SUB_TRAIN));
  assert_false(nb_log_enabled(NB_LOG_TRACE, NB_SUB_CODEC));
  setenv("NB_DEBUG_SUBSYS", "^CODEC", 1);
  nb_log_reload();
  assert_false(nb_log_enabled(NB_LOG_INFO, NB_SUB_CODEC));
  assert_true(nb_log_enabled(NB_LOG_INFO, NB_SUB_TRAIN));
  setenv("NB_DEBUG", "NONE", 1);
  nb_log_reload();
  assert_false(nb_log_enabled(NB_LOG_WARN, NB_SUB_ALL));
  unsetenv("NB_DEBUG");
  unsetenv("NB_DEBUG_SUBSYS");
  nb_log_reload();
  assert_true(nb_log_enabled(NB_LOG_WARN, NB_SUB_ALL));
  assert_false(nb_log_enabled(NB_LOG_INFO, NB_SUB_ALL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_names), cmocka_unit_test(test_error_detail),
      cmocka_unit_test(test_params),       cmocka_unit_test(test_param_registry),
      cmocka_unit_test(test_alloc),        cmocka_unit_test(test_clock),
      cmocka_unit_test(test_vclock),       cmocka_unit_test(test_checksums),
      cmocka_unit_test(test_log_levels),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
