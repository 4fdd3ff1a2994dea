/* inter/exchange's Pull over loopback with mTLS and sealing: the global state a leader
 * publishes comes back byte-identical in several chunks (and the newest one after a second
 * publish); before any publish the pull is refused UNAVAILABLE; a cluster that is not a peer
 * is refused PERMISSION; a puller holding another job secret gets INTEGRITY (the chunks do not
 * open); a peer already past a round is given up on at once, naming its newest round. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "certs.h"
#include "common/common.h"
#include "inter/exchange.h"

#define JOB "job-pull"
static char g_dir[256];
static const char* const g_ids[] = {"dc-a", "dc-b", "dc-c"};
static uint8_t g_secret[NB_SEAL_SECRET_BYTES];

static nb_exchange_t* make_exchange(const char* self, nb_tls_t* tls, const uint8_t* secret) {
  nb_exchange_config_t c = {
      .job_id = JOB, .self = self, .listen = "127.0.0.1:0", .tls = tls, .job_secret = secret};
  nb_exchange_t* ex = NULL;
  if (nb_exchange_create(&c, &ex) != NB_OK) fprintf(stderr, "%s: %s\n", self, nb_error_last());
  assert_non_null(ex);
  return ex;
}

static void add_peer(nb_exchange_t* ex, const char* peer, nb_exchange_t* other) {
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", nb_exchange_port(other));
  assert_int_equal(nb_exchange_add_peer(ex, peer, target), NB_OK);
}

static uint8_t* pattern(size_t len, uint8_t seed) {
  uint8_t* p = malloc(len);
  assert_non_null(p);
  for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(i * 131 + seed + (i >> 12));
  return p;
}

static void test_pull(void** state) {
  (void)state;
  nb_tls_t* tls[3];
  for (int i = 0; i < 3; i++) assert_non_null(tls[i] = nb_test_tls_load(g_dir, g_ids[i]));
  uint8_t other_secret[NB_SEAL_SECRET_BYTES];
  memset(other_secret, 0x33, sizeof other_secret);
  nb_exchange_t* a = make_exchange("dc-a", tls[0], g_secret);
  nb_exchange_t* b = make_exchange("dc-b", tls[1], g_secret);
  nb_exchange_t* c = make_exchange("dc-c", tls[2], g_secret);
  add_peer(a, "dc-b", b); /* dc-a knows dc-b only */
  add_peer(b, "dc-a", a);
  add_peer(c, "dc-a", a);
  uint8_t* got = NULL;
  size_t len = 0;
  uint64_t round = 0;

  /* nothing published yet */
  assert_int_equal(nb_exchange_pull(b, 0, 5000, &got, &len, &round), NB_ERR_UNAVAILABLE);
  assert_null(got);

  /* three chunks and a bit, byte-identical */
  size_t n1 = (3u << 20) + 17;
  uint8_t* s1 = pattern(n1, 1);
  assert_int_equal(nb_exchange_publish_state(a, 12, s1, n1), NB_OK);
  assert_int_equal(nb_exchange_pull(b, 0, 5000, &got, &len, &round), NB_OK);
  assert_int_equal(len, n1);
  assert_int_equal(round, 12);
  assert_memory_equal(got, s1, n1);
  nb_free(got);

  /* a newer state replaces it */
  size_t n2 = 1000;
  uint8_t* s2 = pattern(n2, 2);
  assert_int_equal(nb_exchange_publish_state(a, 13, s2, n2), NB_OK);
  assert_int_equal(nb_exchange_pull(b, 0, 5000, &got, &len, &round), NB_OK);
  assert_int_equal(len, n2);
  assert_int_equal(round, 13);
  assert_memory_equal(got, s2, n2);
  nb_free(got);
  got = NULL;

  /* dc-c is not a peer of dc-a: refused before any state moves */
  nb_status_t st = nb_exchange_pull(c, 0, 5000, &got, &len, &round);
  assert_int_equal(st, NB_ERR_PERMISSION);
  assert_null(got);

  /* another job secret: the chunks do not open */
  nb_exchange_t* b2 = make_exchange("dc-b", tls[1], other_secret);
  add_peer(b2, "dc-a", a);
  st = nb_exchange_pull(b2, 0, 5000, &got, &len, &round);
  assert_int_equal(st, NB_ERR_INTEGRITY);
  assert_null(got);
  nb_exchange_destroy(b2);

  nb_exchange_destroy(c);
  nb_exchange_destroy(b);
  nb_exchange_destroy(a);
  free(s1);
  free(s2);
  for (int i = 0; i < 3; i++) nb_tls_destroy(tls[i]);
}

/* A peer that already sent a later round will not send this one: the round gives up on it at
 * once (NB_ERR_TIMEOUT, long before the deadline) and reports its newest round. */
static void test_peer_ahead(void** state) {
  (void)state;
  nb_tls_t* tls[2];
  for (int i = 0; i < 2; i++) assert_non_null(tls[i] = nb_test_tls_load(g_dir, g_ids[i]));
  nb_exchange_t* a = make_exchange("dc-a", tls[0], g_secret);
  nb_exchange_t* b = make_exchange("dc-b", tls[1], g_secret);
  add_peer(a, "dc-b", b);
  add_peer(b, "dc-a", a);
  uint8_t frame[100];
  memset(frame, 7, sizeof frame);
  nb_exchange_result_t ra[1], rb[1];
  memset(ra, 0, sizeof ra);
  memset(rb, 0, sizeof rb);
  /* dc-b is at round 9: its frame reaches dc-a, dc-a's frame of 9 is never sent, so dc-b's
   * round ends at its deadline */
  assert_int_equal(nb_exchange_round(b, 9, frame, sizeof frame, nb_now_ns() + 1500000000LL, rb),
                   NB_ERR_TIMEOUT);
  nb_exchange_results_release(rb, 1);
  /* dc-a, still at round 7, gives up on dc-b at once: for being behind it, not at the
   * deadline (a minute away) */
  int64_t deadline = nb_now_ns() + 60000000000LL;
  nb_status_t st = nb_exchange_round(a, 7, frame, sizeof frame, deadline, ra);
  assert_int_equal(st, NB_ERR_TIMEOUT);
  assert_int_equal(ra[0].status, NB_ERR_TIMEOUT);
  assert_int_equal(ra[0].newest, 9);
  assert_non_null(strstr(ra[0].detail, "already at round 9"));
  assert_null(strstr(ra[0].detail, "missed the deadline"));
  assert_true(nb_now_ns() < deadline);
  nb_exchange_results_release(ra, 1);
  nb_exchange_destroy(b);
  nb_exchange_destroy(a);
  for (int i = 0; i < 2; i++) nb_tls_destroy(tls[i]);
}

static int setup(void** state) {
  (void)state;
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb-pull-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) return -1;
  if (nb_test_certs_make(g_dir, g_ids, 3) != 0) return -1;
  return nb_seal_secret_generate(g_secret) == NB_OK ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  nb_test_certs_remove(g_dir, g_ids, 3);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pull),
      cmocka_unit_test(test_peer_ahead),
  };
  return cmocka_run_group_tests_name("exchange_pull", tests, setup, teardown);
}
