/* inter/exchange over loopback with mTLS and sealing: a 3-cluster round in one process (every
 * leader gets both peers' frames byte-identical), a round whose peer never sends ends at the
 * deadline, and a peer process killed with SIGKILL is reported NB_ERR_UNAVAILABLE, naming it,
 * long before the round's deadline; the child is reaped, so no process is left behind. Verdicts
 * rest on statuses, counts and order, not on how fast this machine is. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "certs.h"
#include "common/common.h"
#include "inter/exchange.h"

#define JOB "job-ex"
static char g_dir[256];
static const char* const g_ids[] = {"dc-a", "dc-b", "dc-c"};
static uint8_t g_secret[NB_SEAL_SECRET_BYTES];

static uint8_t* make_frame(size_t len, uint32_t seed) {
  uint8_t* f = malloc(len);
  if (!f) abort();
  uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed * 0x100000001b3ull);
  for (size_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f[i] = (uint8_t)x;
  }
  return f;
}

static size_t frame_len(int cluster, uint64_t round) {
  return ((size_t)(cluster + 1) << 20) + 1000 * (size_t)cluster + (size_t)round;
}

static nb_exchange_t* make_exchange(const char* self, nb_tls_t* tls) {
  nb_exchange_config_t c = {.job_id = JOB,
                            .self = self,
                            .listen = "127.0.0.1:0",
                            .tls = tls,
                            .allow_insecure = tls == NULL,
                            .job_secret = g_secret,
                            .streams = 2,
                            .chunk_bytes = 256 << 10};
  nb_exchange_t* ex = NULL;
  if (nb_exchange_create(&c, &ex) != NB_OK) {
    fprintf(stderr, "exchange %s: %s\n", self, nb_error_last());
    return NULL;
  }
  return ex;
}

typedef struct {
  nb_exchange_t* ex;
  int me;
  uint64_t round;
  int64_t deadline_ns;
  nb_status_t st;
  nb_exchange_result_t res[2];
} leader_t;

static void* leader(void* arg) {
  leader_t* l = arg;
  size_t len = frame_len(l->me, l->round);
  uint8_t* f = make_frame(len, (uint32_t)(l->me * 1000 + l->round));
  l->st = nb_exchange_round(l->ex, l->round, f, len, l->deadline_ns, l->res);
  free(f);
  return NULL;
}

/* The three clusters' exchanges, no peers added yet; target: each one's address. */
/* plaintext: no TLS (tls[i] NULL), as the tests' and benchmarks' plaintext jobs run */
static void open_three(nb_tls_t* tls[3], nb_exchange_t* ex[3], char target[3][64], int plaintext) {
  for (int i = 0; i < 3; i++) {
    tls[i] = plaintext ? NULL : nb_test_tls_load(g_dir, g_ids[i]);
    assert_true(plaintext || tls[i]);
    ex[i] = make_exchange(g_ids[i], tls[i]);
    assert_non_null(ex[i]);
    snprintf(target[i], sizeof target[i], "127.0.0.1:%d", nb_exchange_port(ex[i]));
  }
}

static void test_three_clusters(void** state) {
  nb_tls_t* tls[3];
  nb_exchange_t* ex[3];
  char target[3][64];
  open_three(tls, ex, target, 0);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      if (i != j) assert_int_equal(nb_exchange_add_peer(ex[i], g_ids[j], target[j]), NB_OK);
  assert_int_equal(nb_exchange_add_peer(ex[0], "dc-b", target[1]), NB_ERR_EXISTS);
  double round_s = 0; /* the slowest of rounds 1 and 2, measured here */
  for (uint64_t round = 1; round <= 2; round++) {
    int64_t r0 = nb_now_ns();
    leader_t l[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
      l[i] = (leader_t){
          .ex = ex[i], .me = i, .round = round, .deadline_ns = nb_now_ns() + 30000000000LL};
      assert_int_equal(pthread_create(&th[i], NULL, leader, &l[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    if ((nb_now_ns() - r0) * 1e-9 > round_s) round_s = (nb_now_ns() - r0) * 1e-9;
    for (int i = 0; i < 3; i++) {
      if (l[i].st != NB_OK)
        fail_msg("%s round %llu: %s / %s", g_ids[i], (unsigned long long)round, l[i].res[0].detail,
                 l[i].res[1].detail);
      for (int k = 0; k < 2; k++) {
        nb_exchange_result_t* r = &l[i].res[k];
        int j = -1;
        for (int c = 0; c < 3; c++)
          if (strcmp(r->peer, g_ids[c]) == 0) j = c;
        assert_true(j >= 0 && j != i);
        assert_int_equal(r->status, NB_OK);
        size_t len = frame_len(j, round);
        assert_int_equal(r->len, len);
        uint8_t* want = make_frame(len, (uint32_t)(j * 1000 + round));
        assert_memory_equal(r->frame, want, len);
        free(want);
        assert_int_equal(r->send.bytes, frame_len(i, round));
      }
      nb_exchange_results_release(l[i].res, 2);
    }
  }
  /* every link's estimator saw the transfers and the heartbeats */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(nb_exchange_peer_count(ex[i]), 2);
    for (size_t k = 0; k < 2; k++) {
      nb_estimate_t e;
      nb_estimator_get(nb_link_estimator(nb_exchange_link(ex[i], k)), &e);
      assert_int_equal(e.transfer_samples - e.probe_samples, 2);
      assert_true(e.rtt_samples >= 1 && e.rtt_s > 0);
      assert_true(nb_exchange_peer_alive(ex[i], k));
    }
  }
  /* round 3 where dc-c does not take part: a and b finish with each other and report dc-c's
   * frame as missing at the deadline (it is alive: TIMEOUT, not UNAVAILABLE). The deadline
   * leaves a and b four times what a round took here, and at least 1.5 s. */
  leader_t l[2];
  pthread_t th[2];
  double budget = 4 * round_s > 1.5 ? 4 * round_s : 1.5;
  int64_t deadline = nb_now_ns() + (int64_t)(budget * 1e9);
  for (int i = 0; i < 2; i++) {
    l[i] = (leader_t){.ex = ex[i], .me = i, .round = 3, .deadline_ns = deadline};
    assert_int_equal(pthread_create(&th[i], NULL, leader, &l[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  assert_true(nb_now_ns() >= deadline); /* they waited for dc-c until the deadline */
  for (int i = 0; i < 2; i++) {
    assert_int_equal(l[i].st, NB_ERR_TIMEOUT);
    for (int k = 0; k < 2; k++) {
      nb_exchange_result_t* r = &l[i].res[k];
      if (strcmp(r->peer, "dc-c") == 0) {
        assert_int_equal(r->status, NB_ERR_TIMEOUT);
        assert_non_null(strstr(r->detail, "dc-c"));
      } else {
        assert_int_equal(r->status, NB_OK);
      }
    }
    nb_exchange_results_release(l[i].res, 2);
  }
  for (int i = 0; i < 3; i++) {
    nb_exchange_destroy(ex[i]);
    nb_tls_destroy(tls[i]);
  }
}

/* The child: cluster dc-b in its own process, exchanging rounds with dc-a until killed. */
static int peer_main(const char* dir, const char* parent_port) {
  nb_tls_t* tls = nb_test_tls_load(dir, "dc-b");
  if (!tls) return 1;
  nb_exchange_t* ex = make_exchange("dc-b", tls);
  if (!ex) return 1;
  printf("%d\n", nb_exchange_port(ex));
  fflush(stdout);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%s", parent_port);
  if (nb_exchange_add_peer(ex, "dc-a", target) != NB_OK) return 1;
  for (uint64_t round = 1; round < 100; round++) {
    size_t len = frame_len(1, round);
    uint8_t* f = make_frame(len, (uint32_t)(1000 + round));
    nb_exchange_result_t r[1];
    nb_status_t st = nb_exchange_round(ex, round, f, len, nb_now_ns() + 30000000000LL, r);
    nb_exchange_results_release(r, 1);
    free(f);
    if (st != NB_OK) break;
  }
  nb_exchange_destroy(ex);
  nb_tls_destroy(tls);
  return 0;
}

static void test_peer_killed(void** state) {
  memset(g_secret, 0x5a, sizeof g_secret);
  nb_tls_t* tls = nb_test_tls_load(g_dir, "dc-a");
  assert_non_null(tls);
  nb_exchange_t* ex = make_exchange("dc-a", tls);
  assert_non_null(ex);
  char port[16];
  snprintf(port, sizeof port, "%d", nb_exchange_port(ex));
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl("/proc/self/exe", "test_exchange", "--peer", g_dir, port, (char*)NULL);
    _exit(127);
  }
  close(fds[1]);
  char line[32] = {0};
  FILE* in = fdopen(fds[0], "r");
  assert_non_null(in);
  assert_non_null(fgets(line, sizeof line, in));
  fclose(in);
  int child_port = atoi(line);
  assert_true(child_port > 0);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", child_port);
  assert_int_equal(nb_exchange_add_peer(ex, "dc-b", target), NB_OK);
  /* round 1 with the live child */
  size_t len = frame_len(0, 1);
  uint8_t* f = make_frame(len, 1);
  nb_exchange_result_t r[1];
  nb_status_t st = nb_exchange_round(ex, 1, f, len, nb_now_ns() + 30000000000LL, r);
  if (st != NB_OK) fail_msg("round 1: %s", r[0].detail);
  uint8_t* want = make_frame(frame_len(1, 1), 1001);
  assert_int_equal(r[0].len, frame_len(1, 1));
  assert_memory_equal(r[0].frame, want, r[0].len);
  free(want);
  nb_exchange_results_release(r, 1);
  free(f);
  /* kill -9 the peer; round 2 must report it dead (UNAVAILABLE), not wait for its deadline
   * (TIMEOUT), which is ten times the dead timeout derived now plus 20 s away */
  nb_exchange_liveness_t lv;
  assert_int_equal(nb_exchange_peer_liveness(ex, 0, &lv), NB_OK);
  assert_true(lv.dead_ms >= lv.floor_ms);
  assert_int_equal(kill(pid, SIGKILL), 0);
  int64_t t0 = nb_now_ns();
  len = frame_len(0, 2);
  f = make_frame(len, 2);
  int64_t deadline = nb_now_ns() + 10 * lv.dead_ms * 1000000LL + 20000000000LL;
  st = nb_exchange_round(ex, 2, f, len, deadline, r);
  printf("peer killed: reported after %.2f s (dead timeout %lld ms): %s\n",
         (nb_now_ns() - t0) * 1e-9, (long long)lv.dead_ms, r[0].detail);
  assert_int_equal(st, NB_ERR_UNAVAILABLE);
  assert_int_equal(r[0].status, NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(r[0].detail, "dc-b"));
  assert_non_null(strstr(nb_error_last(), "dc-b"));
  assert_false(nb_exchange_peer_alive(ex, 0));
  assert_int_equal(nb_exchange_peer_liveness(ex, 0, &lv), NB_OK);
  assert_true(lv.dead);
  assert_true(lv.silent_ms >= lv.floor_ms); /* not declared before its time */
  nb_exchange_results_release(r, 1);
  /* the next round fails at once for the dead peer: nothing is sent to it */
  assert_int_equal(nb_exchange_round(ex, 3, f, len, nb_now_ns() + 30000000000LL, r),
                   NB_ERR_UNAVAILABLE);
  assert_int_equal(r[0].send_status, NB_ERR_UNAVAILABLE);
  assert_int_equal(r[0].send.chunks, 0);
  assert_non_null(strstr(r[0].detail, "is not answering"));
  nb_exchange_results_release(r, 1);
  free(f);
  int wst = 0;
  assert_int_equal(waitpid(pid, &wst, 0), pid); /* reaped: nothing left behind */
  assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
  nb_exchange_destroy(ex);
  nb_tls_destroy(tls);
}

static void sleep_ms(int ms) {
  struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&d, &d) != 0) {
  }
}

/* A peer's frame that arrives before our side has added that peer (its process started first:
 * our server answers from nb_exchange_create on) waits for nb_exchange_add_peer instead of being
 * refused; a cluster of the job that never becomes a peer is still refused. With mutual TLS
 * (the exchange's authorisation waits for the certificate's cluster) and over plaintext (the
 * receiver waits for the sender it is told). */
static void peer_added_late(int plaintext) {
  nb_tls_t* tls[3];
  nb_exchange_t* ex[3];
  char target[3][64];
  open_three(tls, ex, target, plaintext);
  /* dc-a knows dc-b and sends at once; dc-b adds dc-a 300 ms later */
  assert_int_equal(nb_exchange_add_peer(ex[0], g_ids[1], target[1]), NB_OK);
  leader_t l[2];
  pthread_t th;
  l[0] = (leader_t){.ex = ex[0], .me = 0, .round = 1, .deadline_ns = nb_now_ns() + 30000000000LL};
  assert_int_equal(pthread_create(&th, NULL, leader, &l[0]), 0);
  sleep_ms(300);
  assert_int_equal(nb_exchange_add_peer(ex[1], g_ids[0], target[0]), NB_OK);
  l[1] = (leader_t){.ex = ex[1], .me = 1, .round = 1, .deadline_ns = nb_now_ns() + 30000000000LL};
  leader(&l[1]);
  pthread_join(th, NULL);
  for (int i = 0; i < 2; i++) {
    if (l[i].st != NB_OK) fail_msg("%s: %s", g_ids[i], l[i].res[0].detail);
    assert_int_equal(l[i].res[0].status, NB_OK);
    assert_int_equal(l[i].res[0].len, frame_len(1 - i, 1));
    nb_exchange_results_release(l[i].res, 1);
  }
  /* dc-c knows dc-b, but dc-b never adds dc-c: refused, after the wait */
  assert_int_equal(nb_exchange_add_peer(ex[2], g_ids[1], target[1]), NB_OK);
  leader_t c = {.ex = ex[2], .me = 2, .round = 1, .deadline_ns = nb_now_ns() + 3000000000LL};
  leader(&c);
  printf("dc-c to dc-b, never its peer: send %s, round %s (%s)\n",
         nb_status_name(c.res[0].send_status), nb_status_name(c.res[0].status), c.res[0].detail);
  assert_int_not_equal(c.res[0].status, NB_OK);
  assert_int_equal(c.res[0].send_status, NB_ERR_PERMISSION);
  nb_exchange_results_release(c.res, 1);
  for (int i = 0; i < 3; i++) {
    nb_exchange_destroy(ex[i]);
    nb_tls_destroy(tls[i]);
  }
}

static void test_peer_added_late(void** state) {
  (void)state;
  peer_added_late(0);
}

static void test_peer_added_late_plaintext(void** state) {
  (void)state;
  peer_added_late(1);
}

/* Early rounds (a fault-tolerant round's update, then its vote), on both sides: dc-a's round 2
 * returns once dc-b's frame is in, its 4 MiB frame still on its way (dc-a's link capped at
 * 8 MiB/s, chunks of 64 KiB), and its round 3 starts at once: that small frame overtakes the big
 * one at dc-b, whose round 2 must still wait for dc-a's frame of round 2 (a peer's frame of
 * round + 1 does not make it past an early round) and get all of it. dc-a's round 3 reports the
 * bytes of its round-2 send (the sends earlier early rounds left running), and destroying dc-a's
 * exchange right after its round 3 returned still delivers its round-3 frame. */
typedef struct {
  nb_exchange_t* ex;
  nb_status_t st[2];
  nb_exchange_result_t res[2];
} early_peer_t;

static void* early_peer(void* arg) {
  early_peer_t* b = arg;
  for (int k = 0; k < 2; k++) {
    uint8_t f[64];
    memset(f, 0xb0 + k, sizeof f);
    b->st[k] = nb_exchange_round_early(b->ex, 2 + (uint64_t)k, f, sizeof f,
                                       nb_now_ns() + 60000000000LL, &b->res[k]);
  }
  return NULL;
}

static void test_early_rounds(void** state) {
  (void)state;
  nb_tls_t* tls[2];
  nb_exchange_t* ex[2];
  char target[2][64];
  for (int i = 0; i < 2; i++) {
    tls[i] = nb_test_tls_load(g_dir, g_ids[i]);
    assert_non_null(tls[i]);
    nb_exchange_config_t c = {.job_id = JOB,
                              .self = g_ids[i],
                              .listen = "127.0.0.1:0",
                              .tls = tls[i],
                              .job_secret = g_secret,
                              .streams = 2,
                              .chunk_bytes = 64 << 10,
                              .rate_cap_Bps = i == 0 ? 8.0 * (1 << 20) : 0};
    assert_int_equal(nb_exchange_create(&c, &ex[i]), NB_OK);
    snprintf(target[i], sizeof target[i], "127.0.0.1:%d", nb_exchange_port(ex[i]));
  }
  assert_int_equal(nb_exchange_add_peer(ex[0], g_ids[1], target[1]), NB_OK);
  assert_int_equal(nb_exchange_add_peer(ex[1], g_ids[0], target[0]), NB_OK);
  early_peer_t b = {.ex = ex[1]};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, early_peer, &b), 0);
  size_t big = (size_t)4 << 20;
  uint8_t* f2 = make_frame(big, 2);
  uint8_t f3[32];
  memset(f3, 0xa3, sizeof f3);
  nb_exchange_result_t r2[1], r3[1];
  int64_t deadline = nb_now_ns() + 60000000000LL;
  assert_int_equal(nb_exchange_round_early(ex[0], 2, f2, big, deadline, r2), NB_OK);
  assert_int_equal(r2[0].len, 64);
  assert_int_equal(r2[0].send.bytes, 0); /* nothing earlier; its own send is still running */
  assert_int_equal(nb_exchange_round_early(ex[0], 3, f3, sizeof f3, deadline, r3), NB_OK);
  assert_int_equal(r3[0].len, 64);
  assert_int_equal(r3[0].send_status, NB_OK);
  assert_int_equal(r3[0].send.bytes, big); /* round 2's send, finished before dc-b's round 3 */
  nb_exchange_destroy(ex[0]);
  pthread_join(th, NULL);
  for (int k = 0; k < 2; k++)
    if (b.st[k] != NB_OK) fail_msg("dc-b round %d: %s", 2 + k, b.res[k].detail);
  assert_int_equal(b.res[0].len, big);
  assert_memory_equal(b.res[0].frame, f2, big);
  assert_int_equal(b.res[1].len, sizeof f3);
  assert_memory_equal(b.res[1].frame, f3, sizeof f3);
  nb_exchange_results_release(b.res, 2);
  nb_exchange_results_release(r2, 1);
  nb_exchange_results_release(r3, 1);
  free(f2);
  nb_exchange_destroy(ex[1]);
  for (int i = 0; i < 2; i++) nb_tls_destroy(tls[i]);
}

static int setup(void** state) {
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb-exchange-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) return -1;
  if (nb_test_certs_make(g_dir, g_ids, 3) != 0) return -1;
  return nb_seal_secret_generate(g_secret) == NB_OK ? 0 : -1;
}

static int teardown(void** state) {
  nb_test_certs_remove(g_dir, g_ids, 3);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "--peer") == 0) {
    /* the job secret is fixed for the child and the parent alike in this mode */
    memset(g_secret, 0x5a, sizeof g_secret);
    return peer_main(argv[2], argv[3]);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_three_clusters),  cmocka_unit_test(test_peer_killed),
      cmocka_unit_test(test_peer_added_late), cmocka_unit_test(test_peer_added_late_plaintext),
      cmocka_unit_test(test_early_rounds),
  };
  return cmocka_run_group_tests_name("exchange", tests, setup, teardown);
}
