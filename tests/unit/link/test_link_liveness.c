/* inter/exchange liveness on thin links, over loopback with mTLS and sealing: the dead-timeout
 * rule; two leaders whose rounds fill a thin link (tests/unit/link/thinlink.h: one bottleneck
 * queue per direction, so heartbeats wait behind chunks) for several times the dead floor are
 * never declared dead and complete their rounds, and a leader destroyed during a transfer on
 * that link is reported dead; a peer process stopped (SIGSTOP: its sockets stay open, nothing
 * answers) during a transfer through a rate cap is reported dead before a deadline derived
 * from the timeout. Verdicts rest on statuses, counts and order, and on margins computed from
 * what the test configured or measured in the same run, never on how fast this machine is. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "certs.h"
#include "common/common.h"
#include "inter/exchange.h"
#include "thinlink.h"

#define JOB "job-live"
static char g_dir[256];
static const char* const g_ids[] = {"dc-a", "dc-b"};
static uint8_t g_secret[NB_SEAL_SECRET_BYTES];

/* The thin link: 128 kB/s each way with a 128 KiB queue (1 s of data, like tc tbf's limit);
 * frames of 512 KiB take 4 s at that rate, four times the dead floor of 1 s. */
#define THIN_RATE 128000.0
#define THIN_QUEUE (128u << 10)
#define THIN_FRAME ((size_t)512 << 10)
#define DEAD_FLOOR_MS 1000
#define STREAMS 2

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

static nb_exchange_t* make_exchange(const char* self, nb_tls_t* tls, double cap) {
  nb_exchange_config_t c = {.job_id = JOB,
                            .self = self,
                            .listen = "127.0.0.1:0",
                            .tls = tls,
                            .job_secret = g_secret,
                            .streams = STREAMS,
                            .rate_cap_Bps = cap,
                            .heartbeat_ms = 100,
                            .dead_ms = DEAD_FLOOR_MS};
  nb_exchange_t* ex = NULL;
  if (nb_exchange_create(&c, &ex) != NB_OK) {
    fprintf(stderr, "exchange %s: %s\n", self, nb_error_last());
    return NULL;
  }
  return ex;
}

/* The rule, with numbers: a fat link stays at the floor; a thin one gets RTTs plus chunk
 * times; an unknown rate adds no chunk term; queueing raises the RTT term. */
static void test_dead_rule(void** state) {
  (void)state;
  /* 100 Mbit/s, 50 ms, 4 streams of 1 MiB chunks: 200 + 671 ms, under the 2 s floor */
  assert_int_equal(nb__exchange_dead_ms(2000, 4, 2, 0.05, 12.5e6, (1 << 20) + 16, 4), 2000);
  /* 0.5 Mbit/s, 200 ms, 4 streams of 16 KiB: 800 + 2 x 4 x 16400 / 62500 s = 2899.2 ms */
  assert_int_equal(nb__exchange_dead_ms(2000, 4, 2, 0.2, 62500, 16400, 4), 2900);
  /* the same link with 1.5 s of queueing in the RTT */
  assert_int_equal(nb__exchange_dead_ms(2000, 4, 2, 1.5, 62500, 16400, 4), 8100);
  /* rate unknown: RTTs only */
  assert_int_equal(nb__exchange_dead_ms(2000, 4, 2, 0.2, 0, 16400, 4), 2000);
  assert_int_equal(nb__exchange_dead_ms(100, 4, 2, 0.2, 0, 16400, 4), 801);
  /* streams 0 counts as one; absurd inputs stay finite */
  assert_int_equal(nb__exchange_dead_ms(0, 0, 1, 0, 1000, 1000, 0), 1001);
  assert_true(nb__exchange_dead_ms(0, 4, 2, 1e300, 1, 1 << 20, 64) <= 3600000001LL);
  /* the Ping period: 250 ms on a fat link; at 0.06 Mbit/s (7500 B/s) 2 % is 150 B/s, one
   * 600-byte heartbeat every 4 s; unknown rate: the configured period; at most a minute */
  assert_int_equal(nb__exchange_hb_ms(250, 12.5e6, 2), 250);
  assert_int_equal(nb__exchange_hb_ms(250, 7500, 2), 4000);
  assert_int_equal(nb__exchange_hb_ms(250, 62500, 2), 480);
  assert_int_equal(nb__exchange_hb_ms(250, 0, 2), 250);
  assert_int_equal(nb__exchange_hb_ms(250, 1, 1), 60000);
}

typedef struct {
  nb_exchange_t* ex;
  uint64_t round;
  uint32_t seed;
  int64_t deadline_ns;
  nb_status_t st;
  nb_exchange_result_t res[1];
} leader_t;

static void* leader(void* arg) {
  leader_t* l = arg;
  uint8_t* f = make_frame(THIN_FRAME, l->seed);
  l->st = nb_exchange_round(l->ex, l->round, f, THIN_FRAME, l->deadline_ns, l->res);
  free(f);
  return NULL;
}

static void print_liveness(const char* who, nb_exchange_t* ex) {
  nb_exchange_liveness_t lv;
  assert_int_equal(nb_exchange_peer_liveness(ex, 0, &lv), NB_OK);
  printf(
      "%s: dead timeout %lld ms (floor %lld), rtt %.0f ms, rate %.0f B/s, chunk %zu, "
      "pings %llu ok / %llu failed\n",
      who, (long long)lv.dead_ms, (long long)lv.floor_ms, lv.rtt_s * 1e3, lv.rate_Bps,
      lv.chunk_bytes, (unsigned long long)lv.pings_ok, (unsigned long long)lv.pings_failed);
}

/* Both leaders fill the thin link with their frames in both directions for four times the dead
 * floor, twice (round 1 with the rate unknown, round 2 with it measured): no false death, both
 * rounds complete byte-identical. Then dc-b is destroyed while dc-a's round 3 is moving its
 * frame: dc-a reports it dead (UNAVAILABLE), not at the deadline (TIMEOUT). */
static void test_thin_link_saturated(void** state) {
  (void)state;
  nb_tls_t* tls[2];
  nb_exchange_t* ex[2];
  for (int i = 0; i < 2; i++) {
    assert_non_null(tls[i] = nb_test_tls_load(g_dir, g_ids[i]));
    assert_non_null(ex[i] = make_exchange(g_ids[i], tls[i], 0));
  }
  thinlink_t* tl =
      thinlink_create(nb_exchange_port(ex[0]), nb_exchange_port(ex[1]), THIN_RATE, THIN_QUEUE);
  assert_non_null(tl);
  char ta[64], tb[64];
  snprintf(tb, sizeof tb, "127.0.0.1:%d", thinlink_port(tl, 0)); /* dc-a -> dc-b */
  snprintf(ta, sizeof ta, "127.0.0.1:%d", thinlink_port(tl, 1)); /* dc-b -> dc-a */
  assert_int_equal(nb_exchange_add_peer(ex[0], "dc-b", tb), NB_OK);
  assert_int_equal(nb_exchange_add_peer(ex[1], "dc-a", ta), NB_OK);
  /* the link's time for one frame, from the configuration: the deadline leaves it 10 times */
  double frame_s = (double)THIN_FRAME / THIN_RATE;
  assert_true(frame_s * 1e3 >= 4 * DEAD_FLOOR_MS); /* a transfer outlasts the floor */
  for (uint64_t round = 1; round <= 2; round++) {
    uint64_t fwd0 = thinlink_forwarded(tl, 0), fwd1 = thinlink_forwarded(tl, 1);
    leader_t l[2];
    pthread_t th[2];
    size_t chunk_now[2]; /* what each side's send will cut, from its rate before the round */
    for (int i = 0; i < 2; i++) chunk_now[i] = nb_link_chunk_bytes(nb_exchange_link(ex[i], 0));
    int64_t deadline = nb_now_ns() + (int64_t)((10 * frame_s + 30) * 1e9);
    for (int i = 0; i < 2; i++) {
      l[i] = (leader_t){
          .ex = ex[i], .round = round, .seed = (uint32_t)(10 * round + i), .deadline_ns = deadline};
      assert_int_equal(pthread_create(&th[i], NULL, leader, &l[i]), 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
      if (l[i].st != NB_OK)
        fail_msg("%s round %llu: %s", g_ids[i], (unsigned long long)round, l[i].res[0].detail);
      nb_exchange_result_t* r = &l[i].res[0];
      assert_int_equal(r->status, NB_OK);
      assert_int_equal(r->len, THIN_FRAME);
      uint8_t* want = make_frame(THIN_FRAME, (uint32_t)(10 * round + (1 - i)));
      assert_memory_equal(r->frame, want, THIN_FRAME);
      free(want);
      /* round 1: the rate is unknown, the smallest chunk; round 2: cut from the rate that
       * round 1 measured */
      assert_int_equal(r->send.chunk_bytes, chunk_now[i]);
      if (round == 1) assert_int_equal(chunk_now[i], 16u << 10);
      if (round == 2) assert_true(chunk_now[i] > (16u << 10));
      nb_exchange_results_release(l[i].res, 1);
      assert_true(nb_exchange_peer_alive(ex[i], 0));
      nb_exchange_liveness_t lv;
      assert_int_equal(nb_exchange_peer_liveness(ex[i], 0, &lv), NB_OK);
      assert_false(lv.dead);
    }
    /* both frames crossed the thin link (sealed, framed: a little more than the frame) */
    assert_true(thinlink_forwarded(tl, 0) - fwd0 > THIN_FRAME);
    assert_true(thinlink_forwarded(tl, 1) - fwd1 > THIN_FRAME);
    print_liveness("dc-a after a saturated round", ex[0]);
  }
  /* the derived timeout on this link is at least the chunk term the configuration implies */
  nb_exchange_liveness_t lv;
  assert_int_equal(nb_exchange_peer_liveness(ex[0], 0, &lv), NB_OK);
  assert_true(lv.rate_Bps > 0 && lv.chunk_bytes >= (16u << 10));
  assert_true((double)lv.dead_ms >=
              2.0 * STREAMS * (double)(lv.chunk_bytes + NB_SEAL_TAG_BYTES) / lv.rate_Bps * 1e3);

  /* round 3: dc-a sends, dc-b is destroyed once its frame is on the way */
  leader_t l = {.ex = ex[0], .round = 3, .seed = 30};
  l.deadline_ns = nb_now_ns() + 10 * lv.dead_ms * 1000000LL + (int64_t)((10 * frame_s + 30) * 1e9);
  uint64_t fwd0 = thinlink_forwarded(tl, 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, leader, &l), 0);
  while (thinlink_forwarded(tl, 0) - fwd0 < THIN_FRAME / 4) nb_sleep_ns(1000000);
  nb_exchange_destroy(ex[1]);
  int64_t gone = nb_now_ns();
  pthread_join(th, NULL);
  printf("dc-b destroyed mid-transfer: reported after %.2f s: %s\n", (nb_now_ns() - gone) * 1e-9,
         l.res[0].detail);
  assert_int_equal(l.st, NB_ERR_UNAVAILABLE); /* dead, not the deadline's TIMEOUT */
  assert_int_equal(l.res[0].status, NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(l.res[0].detail, "dc-b"));
  assert_false(nb_exchange_peer_alive(ex[0], 0));
  assert_int_equal(nb_exchange_peer_liveness(ex[0], 0, &lv), NB_OK);
  assert_true(lv.dead && lv.silent_ms >= lv.floor_ms);
  nb_exchange_results_release(l.res, 1);
  nb_exchange_destroy(ex[0]);
  thinlink_destroy(tl);
  for (int i = 0; i < 2; i++) nb_tls_destroy(tls[i]);
}

/* The child: dc-b in its own process behind a rate cap, exchanging rounds until stopped. */
static int peer_main(const char* dir, const char* parent_port) {
  nb_tls_t* tls = nb_test_tls_load(dir, "dc-b");
  if (!tls) return 1;
  nb_exchange_t* ex = make_exchange("dc-b", tls, THIN_RATE);
  if (!ex) return 1;
  printf("%d\n", nb_exchange_port(ex));
  fflush(stdout);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%s", parent_port);
  if (nb_exchange_add_peer(ex, "dc-a", target) != NB_OK) return 1;
  for (uint64_t round = 1; round < 100; round++) {
    uint8_t* f = make_frame(THIN_FRAME, (uint32_t)(100 + round));
    nb_exchange_result_t r[1];
    nb_status_t st = nb_exchange_round(ex, round, f, THIN_FRAME, nb_now_ns() + 600000000000LL, r);
    nb_exchange_results_release(r, 1);
    free(f);
    if (st != NB_OK) break;
  }
  nb_exchange_destroy(ex);
  nb_tls_destroy(tls);
  return 0;
}

/* dc-b (a child process) and dc-a exchange through rate caps that make a round four times the
 * dead floor; during round 2, once dc-a has heard acks of its round-2 transfer, dc-b is
 * stopped with SIGSTOP: its connections stay open and nothing answers. dc-a reports it dead
 * (UNAVAILABLE) before a deadline of ten dead timeouts (as derived just before the stop) plus
 * ten frame times; the child is killed and reaped. */
static void test_peer_stopped_thin(void** state) {
  (void)state;
  nb_tls_t* tls = nb_test_tls_load(g_dir, "dc-a");
  assert_non_null(tls);
  nb_exchange_t* ex = make_exchange("dc-a", tls, THIN_RATE);
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
    execl("/proc/self/exe", "test_link_liveness", "--peer", g_dir, port, (char*)NULL);
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
  double frame_s = (double)THIN_FRAME / THIN_RATE;
  leader_t l = {.ex = ex, .round = 1, .seed = 1};
  l.deadline_ns = nb_now_ns() + (int64_t)((10 * frame_s + 30) * 1e9);
  leader(&l);
  if (l.st != NB_OK) fail_msg("round 1: %s", l.res[0].detail);
  uint8_t* want = make_frame(THIN_FRAME, 101);
  assert_int_equal(l.res[0].len, THIN_FRAME);
  assert_memory_equal(l.res[0].frame, want, THIN_FRAME);
  free(want);
  nb_exchange_results_release(l.res, 1);
  print_liveness("dc-a after round 1 through the cap", ex);

  /* round 2: stop dc-b once an ack of this transfer came back */
  nb_exchange_liveness_t lv;
  assert_int_equal(nb_exchange_peer_liveness(ex, 0, &lv), NB_OK);
  l = (leader_t){.ex = ex, .round = 2, .seed = 2};
  l.deadline_ns = nb_now_ns() + 10 * lv.dead_ms * 1000000LL + (int64_t)((10 * frame_s + 30) * 1e9);
  nb_link_t* link = nb_exchange_link(ex, 0);
  pthread_t th;
  int64_t t0 = nb_now_ns();
  assert_int_equal(pthread_create(&th, NULL, leader, &l), 0);
  for (;;) {
    nb_link_liveness_t ll;
    nb_link_liveness(link, &ll);
    if (ll.sending && ll.last_heard_ns > t0) break;
    nb_sleep_ns(1000000);
  }
  assert_int_equal(nb_exchange_peer_liveness(ex, 0, &lv), NB_OK);
  assert_int_equal(kill(pid, SIGSTOP), 0);
  int64_t stopped = nb_now_ns();
  pthread_join(th, NULL);
  printf("dc-b stopped mid-transfer: reported after %.2f s (dead timeout %lld ms then): %s\n",
         (nb_now_ns() - stopped) * 1e-9, (long long)lv.dead_ms, l.res[0].detail);
  assert_int_equal(l.st, NB_ERR_UNAVAILABLE); /* dead, not the deadline's TIMEOUT */
  assert_int_equal(l.res[0].status, NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(l.res[0].detail, "dc-b"));
  assert_false(nb_exchange_peer_alive(ex, 0));
  nb_exchange_liveness_t after;
  assert_int_equal(nb_exchange_peer_liveness(ex, 0, &after), NB_OK);
  assert_true(after.dead && after.silent_ms >= after.floor_ms);
  nb_exchange_results_release(l.res, 1);
  assert_int_equal(kill(pid, SIGKILL), 0);
  int wst = 0;
  assert_int_equal(waitpid(pid, &wst, 0), pid); /* reaped: nothing left behind */
  assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
  nb_exchange_destroy(ex);
  nb_tls_destroy(tls);
}

static int setup(void** state) {
  (void)state;
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb-live-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) return -1;
  return nb_test_certs_make(g_dir, g_ids, 2);
}

static int teardown(void** state) {
  (void)state;
  nb_test_certs_remove(g_dir, g_ids, 2);
  return 0;
}

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  memset(g_secret, 0x6b, sizeof g_secret); /* the child and the parent share it */
  if (argc == 4 && strcmp(argv[1], "--peer") == 0) return peer_main(argv[2], argv[3]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dead_rule),
      cmocka_unit_test(test_thin_link_saturated),
      cmocka_unit_test(test_peer_stopped_thin),
  };
  return cmocka_run_group_tests_name("liveness", tests, setup, teardown);
}
