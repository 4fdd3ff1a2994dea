/* Fault-tolerant rounds through the public session API (<nebula.h> and libnebula.so only, as a
 * user's program): a cluster that dies costs the others rounds, not their session (the rounds
 * report applied 0 and go on); a restarted cluster rejoins the running job with `rejoin`,
 * pulling the global state from a live peer, and both end on one theta_global. Also the
 * refusals: fault tolerance with the norm bound, rejoin without fault tolerance, clusters that
 * disagree on fault tolerance. The same with overlapped rounds (round_begin, TAU steps,
 * round_end), the restarted cluster then with blocking ones beside them. Each cluster's model is a
 * vector pulled towards its own target (a quadratic loss), trained by plain gradient steps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <nebula.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "session_pair.h"

#define DIM 64
#define H 5
#define TAU 2          /* overlapped rounds: steps between round_begin and round_end */
#define PHASE1 3       /* rounds both clusters run before west dies */
#define TARGET 7       /* rounds applied at which both stop */
#define MAX_SECONDS 60 /* a bound on each loop: a hang is a failure, not a stuck test */

static const uint8_t secret[32] = {9,  8,  7,  6,  5,  4,  3,  2,  1,  10, 11, 12, 13, 14, 15, 16,
                                   17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

typedef struct {
  int index;
  float x[DIM];
  float target[DIM];
  nb_session_t* s;
  int stop_at; /* run rounds until this many were applied (commits) */
  int finish;  /* then call nb_session_finish */
  int overlap; /* 1: rounds as round_begin, TAU steps, round_end; 2: no step between */
  /* results, shared with the main thread under mu */
  nb_status_t st;
  char msg[512];
  int rounds, skipped, pulled, min_alive;
  nb_session_round_t last;
} side_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void side_init(side_t* sd, int index) {
  memset(sd, 0, sizeof *sd);
  sd->index = index;
  sd->min_alive = 99;
  for (int i = 0; i < DIM; i++) {
    sd->x[i] = (float)(0.01 * (i % 7) * (index + 1));
    sd->target[i] = (float)(index ? 1.0 + 0.01 * i : -1.0 + 0.02 * i);
  }
}

/* k gradient steps; each takes 2 ms, as a real model's step takes time (a round alone with a
 * dead peer returns at once: without it the survivor would race through its rounds). */
static void side_steps(side_t* sd, int steps) {
  for (int k = 0; k < steps; k++) {
    for (int i = 0; i < DIM; i++) sd->x[i] -= 0.2f * (sd->x[i] - sd->target[i]);
    usleep(2000);
  }
}

static nb_status_t side_open(side_t* sd, const char* job, int ft, int rejoin, const char* listen) {
  nb_session_options_t o;
  pair_options(&o, job, sd->index, secret);
  o.inner_steps = H;
  o.outer_lr = 0.8f;
  o.outer_momentum = 0.5f;
  o.density = 0.5;
  o.values = "int8";
  o.peer_timeout_s = 1;
  if (listen) o.listen = listen;
  o.fault_tolerant = ft;
  o.rejoin = rejoin;
  o.round_deadline_s = 2;
  o.final_wait_s = 20;
  o.rejoin_timeout_s = 30;
  o.update_norm_bound = 0; /* fault tolerance needs it off; the same on every side */
  nb_status_t st = nb_session_open(&o, &sd->s);
  if (st != NB_OK) return st;
  int64_t shape[1] = {DIM};
  return nb_session_register(sd->s, "x", sd->x, shape, 1);
}

static void side_fail(side_t* sd, nb_status_t st) {
  pthread_mutex_lock(&mu);
  sd->st = st;
  snprintf(sd->msg, sizeof sd->msg, "%s", nb_error_last());
  pthread_mutex_unlock(&mu);
}

/* Rounds until stop_at were applied (for at most MAX_SECONDS), then finish when asked. */
static void* side_main(void* arg) {
  side_t* sd = arg;
  time_t until = time(NULL) + MAX_SECONDS;
  while (time(NULL) < until) {
    nb_session_round_t rec;
    nb_status_t st;
    if (sd->overlap) { /* H - tau steps, the round sent, tau more while it is in flight */
      int tau = sd->overlap == 1 ? TAU : 0;
      side_steps(sd, H - tau);
      st = nb_session_round_begin(sd->s, H);
      if (st == NB_OK) {
        side_steps(sd, tau);
        st = nb_session_round_end(sd->s, &rec);
      }
    } else {
      side_steps(sd, H);
      st = nb_session_round(sd->s, H, &rec);
    }
    if (st != NB_OK) {
      side_fail(sd, st);
      return NULL;
    }
    pthread_mutex_lock(&mu);
    sd->last = rec;
    sd->rounds++;
    sd->skipped += !rec.applied;
    sd->pulled += rec.pulled;
    if ((int)rec.peers_alive < sd->min_alive) sd->min_alive = (int)rec.peers_alive;
    pthread_mutex_unlock(&mu);
    if (rec.commits >= (uint64_t)sd->stop_at) break;
  }
  if (sd->finish) {
    nb_status_t st = nb_session_finish(sd->s);
    if (st != NB_OK) side_fail(sd, st);
  }
  return NULL;
}

static void* start_main(void* arg) {
  side_t* sd = arg;
  nb_status_t st = nb_session_start(sd->s);
  if (st != NB_OK) side_fail(sd, st);
  return NULL;
}

static void run_both(side_t* a, side_t* b, void* (*fn)(void*)) {
  pthread_t th[2];
  assert_int_equal(pthread_create(&th[0], NULL, fn, a), 0);
  assert_int_equal(pthread_create(&th[1], NULL, fn, b), 0);
  pthread_join(th[0], NULL);
  pthread_join(th[1], NULL);
}

static side_t sides[3]; /* east, west, west restarted */

/* East (fault-tolerant) and west (fault-tolerant when west_ft) of job `job` opened, connected
 * and started, each on its own thread; the outcome in sides[0].st and sides[1].st. */
static void start_pair(const char* job, int west_ft) {
  side_t *east = &sides[0], *west = &sides[1];
  side_init(east, 0);
  side_init(west, 1);
  assert_int_equal(side_open(east, job, 1, 0, NULL), NB_OK);
  assert_int_equal(side_open(west, job, west_ft, 0, NULL), NB_OK);
  assert_int_equal(pair_connect(east->s, west->s), NB_OK);
  run_both(east, west, start_main);
}

/* Two clusters apply PHASE1 rounds, west dies, east's rounds are skipped, west restarts and
 * rejoins; both reach TARGET applied rounds on one theta_global. overlap: east's and the first
 * west's rounds overlapped (the restarted west's blocking). */
static void dead_and_rejoin(int overlap) {
  side_t *east = &sides[0], *west = &sides[1], *again = &sides[2];
  side_init(east, 0);
  side_init(west, 1);
  side_init(again, 1);
  east->overlap = west->overlap = overlap;
  assert_int_equal(side_open(east, "api-ft", 1, 0, NULL), NB_OK);
  assert_int_equal(side_open(west, "api-ft", 1, 0, NULL), NB_OK);
  int west_port = nb_session_port(west->s);
  assert_int_equal(pair_connect(east->s, west->s), NB_OK);
  run_both(east, west, start_main);
  if (east->st || west->st) fail_msg("start: %s / %s", east->msg, west->msg);

  /* phase 1: both train, every round applied on both */
  east->stop_at = west->stop_at = PHASE1;
  run_both(east, west, side_main);
  if (east->st || west->st) fail_msg("phase 1: %s / %s", east->msg, west->msg);
  for (int c = 0; c < 2; c++) {
    side_t* sd = &sides[c];
    assert_int_equal(sd->rounds, PHASE1);
    assert_int_equal(sd->skipped, 0);
    assert_int_equal(sd->last.commits, PHASE1);
    assert_int_equal(sd->last.peers_ok, 1);
  }
  assert_int_equal(east->last.global_hash, west->last.global_hash);

  /* west dies; east trains on: its rounds are skipped, not errors */
  nb_session_close(west->s);
  west->s = NULL;
  east->stop_at = TARGET;
  east->finish = 1;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, side_main, east), 0);
  for (int i = 0; i < 600; i++) { /* until east skipped two rounds (or failed), at most 60 s */
    pthread_mutex_lock(&mu);
    int done = east->skipped >= 2 || east->st != NB_OK;
    pthread_mutex_unlock(&mu);
    if (done) break;
    usleep(100000);
  }
  pthread_mutex_lock(&mu);
  int skipped_alone = east->skipped;
  pthread_mutex_unlock(&mu);
  if (east->st != NB_OK) fail_msg("east while west is dead: %s", east->msg);
  assert_true(skipped_alone >= 2);

  /* west restarts on its address and rejoins the running job */
  char listen[32], peer[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", west_port);
  assert_int_equal(side_open(again, "api-ft", 1, 1, listen), NB_OK);
  snprintf(peer, sizeof peer, "east=127.0.0.1:%d", nb_session_port(east->s));
  assert_int_equal(nb_session_add_peer(again->s, peer), NB_OK);
  nb_status_t st = nb_session_start(again->s);
  if (st != NB_OK) fail_msg("rejoin: %s", nb_error_last());
  /* its buffers hold the pulled theta_global: PHASE1 rounds applied, not its own start */
  float g[DIM];
  assert_int_equal(nb_session_read_global(again->s, "x", g, DIM), NB_OK);
  assert_memory_equal(g, again->x, sizeof g);
  again->stop_at = TARGET;
  again->finish = 1;
  pthread_t th2;
  assert_int_equal(pthread_create(&th2, NULL, side_main, again), 0);
  pthread_join(th, NULL);
  pthread_join(th2, NULL);
  print_message(
      "east: %d rounds, %d skipped, min peers alive %d; west again: %d rounds, %d "
      "skipped, %d pulls; commits %llu / %llu\n",
      east->rounds, east->skipped, east->min_alive, again->rounds, again->skipped, again->pulled,
      (unsigned long long)east->last.commits, (unsigned long long)again->last.commits);
  if (east->st || again->st) fail_msg("after the rejoin: %s / %s", east->msg, again->msg);
  assert_true(east->min_alive == 0); /* it saw west dead */
  assert_true(east->last.commits >= TARGET);
  assert_true(again->last.commits >= TARGET);
  /* one theta_global on both, and their buffers hold it after finish */
  assert_int_equal(nb_session_global_hash(east->s), nb_session_global_hash(again->s));
  assert_memory_equal(east->x, again->x, sizeof east->x);
  nb_session_close(east->s);
  nb_session_close(again->s);
}

static void test_dead_and_rejoin(void** state) {
  (void)state;
  dead_and_rejoin(0);
}

static void test_dead_and_rejoin_overlapped(void** state) {
  (void)state;
  dead_and_rejoin(1);
}

/* Overlapped fault-tolerant rounds with no step between begin and end are the blocking rounds
 * bit for bit (the same wire, the same outcome), and calls out of order are refused. */
static void test_overlapped_equals_blocking(void** state) {
  (void)state;
  uint64_t hash[2] = {0};
  float x[2][DIM];
  for (int mode = 0; mode < 2; mode++) {
    side_t *east = &sides[0], *west = &sides[1];
    start_pair(mode ? "api-ft-ov" : "api-ft-bl", 1);
    if (east->st || west->st) fail_msg("start: %s / %s", east->msg, west->msg);
    if (mode) { /* out of order: an end without a begin */
      nb_session_round_t r;
      assert_int_equal(nb_session_round_end(east->s, &r), NB_ERR_INVALID);
    }
    east->stop_at = west->stop_at = 4;
    east->finish = west->finish = 1;
    east->overlap = west->overlap = mode ? 2 : 0;
    run_both(east, west, side_main);
    if (east->st || west->st) fail_msg("mode %d: %s / %s", mode, east->msg, west->msg);
    assert_int_equal(east->rounds, 4);
    assert_int_equal(east->skipped, 0);
    assert_int_equal(nb_session_global_hash(east->s), nb_session_global_hash(west->s));
    hash[mode] = nb_session_global_hash(east->s);
    memcpy(x[mode], east->x, sizeof x[mode]);
    nb_session_close(east->s);
    nb_session_close(west->s);
  }
  assert_int_equal(hash[0], hash[1]);
  assert_memory_equal(x[0], x[1], sizeof x[0]);
}

/* An eager start (round_begin moved the buffers to the predicted landing) whose round is then
 * skipped (the peer is gone) puts the buffers back: their values at begin plus what was trained
 * since, so that the next Delta carries the skipped round as without the eager start. */
static void test_eager_skipped(void** state) {
  (void)state;
  side_t *east = &sides[0], *west = &sides[1];
  start_pair("api-ft-eager", 1);
  if (east->st || west->st) fail_msg("start: %s / %s", east->msg, west->msg);
  nb_session_close(west->s);
  west->s = NULL;
  for (int r = 0; r < 2; r++) {
    float before[DIM], trained[DIM];
    side_steps(east, H);
    memcpy(before, east->x, sizeof before);
    assert_int_equal(nb_session_round_begin(east->s, H), NB_OK);
    assert_int_equal(nb_session_begin_moved(east->s), 1); /* density 0.5: a sparse frame */
    assert_memory_not_equal(east->x, before, sizeof before);
    for (int i = 0; i < DIM; i++) {
      trained[i] = 0.001f * (float)(i + 1);
      east->x[i] += trained[i];
    }
    nb_session_round_t rec;
    assert_int_equal(nb_session_round_end(east->s, &rec), NB_OK);
    assert_int_equal(rec.applied, 0);
    for (int i = 0; i < DIM; i++)
      assert_true(fabsf(east->x[i] - (before[i] + trained[i])) <= 1e-5f);
  }
  nb_session_close(east->s);
}

static void test_refusals(void** state) {
  (void)state;
  side_t* sd = &sides[0];
  side_init(sd, 0);
  nb_session_options_t o;
  pair_options(&o, "api-ft-bad", 0, secret);
  o.fault_tolerant = 1; /* with the default norm bound */
  nb_session_t* s = NULL;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "update_norm_bound 0"));
  pair_options(&o, "api-ft-bad", 0, secret);
  o.rejoin = 1;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "rejoin needs fault_tolerant"));
  pair_options(&o, "api-ft-bad", 0, secret);
  o.fault_tolerant = 1;
  o.update_norm_bound = 0;
  o.round_deadline_s = 0;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "round_deadline_s"));
  assert_null(s);

  /* clusters that disagree on fault tolerance: both refuse at start, naming it */
  start_pair("api-ft-mixed", 0);
  for (int c = 0; c < 2; c++) {
    print_message("cluster %d: %s\n", c, sides[c].msg);
    assert_int_equal(sides[c].st, NB_ERR_CONFIG);
    assert_non_null(strstr(sides[c].msg, "fault_tolerant is"));
    nb_session_close(sides[c].s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_dead_and_rejoin),
      cmocka_unit_test(test_overlapped_equals_blocking),
      cmocka_unit_test(test_dead_and_rejoin_overlapped),
      cmocka_unit_test(test_eager_skipped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
