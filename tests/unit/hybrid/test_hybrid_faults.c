/* Tests of train/hybrid's fault-tolerant rounds: two clusters in one process (tiny model,
 * committed corpus) exchange through an in-process mailbox that can drop one message. A round
 * whose update or vote was lost counts on both clusters or on none, the replicas stay
 * bit-identical, a held round lands late, and export/import carries the global state. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/common.h"
#include "train/hybrid.h"
#include "train/trainer.h"
#include "tests/unit/hybrid/tiny_trainer.h"

static const char* g_data;

#define ROUNDS 6
#define MAX_POSTS 64

/* One message posted by a cluster under an exchange id (data NULL: it was dropped on the way;
 * the receiver gives up on it at once instead of waiting for a deadline, so the tests do not
 * depend on timing). */
typedef struct {
  int from;
  uint64_t xround;
  uint8_t* data;
  size_t len;
  int taken;
} post_t;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  post_t posts[MAX_POSTS];
  int n;
  int drop_from;        /* the message of this cluster ... */
  uint64_t drop_xround; /* ... under this exchange id never arrives (0 = none) */
  uint64_t newest[2];
  int down[2]; /* the cluster is dead: the others give up on it at once (its heartbeat) */
} mailbox_t;

typedef struct {
  mailbox_t* mb;
  int me;
  nb_hybrid_t* h;
  nb_trainer_t* t;
  nb_status_t st;
  long steps_seen; /* inner steps announced through the steps hook */
  int hook_misuse; /* hook calls with k < 0 at a round's start */
  nb_hybrid_round_t rec[ROUNDS];
  uint64_t hash[ROUNDS];
  int local_is_global[ROUNDS];
} side_t;

static nb_status_t ft_exchange(void* ctx, uint64_t xround, const void* msg, size_t len,
                               nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent,
                               uint64_t* ahead, uint32_t* alive) {
  side_t* s = ctx;
  mailbox_t* mb = s->mb;
  assert_int_equal(n_peers, 1);
  pthread_mutex_lock(&mb->mu);
  if (xround > mb->newest[s->me]) mb->newest[s->me] = xround;
  if (mb->n >= MAX_POSTS) {
    pthread_mutex_unlock(&mb->mu);
    return nb_error(NB_ERR_INTERNAL, "test mailbox full");
  }
  post_t* p = &mb->posts[mb->n++];
  p->from = s->me;
  p->xround = xround;
  p->data = NULL;
  p->len = len;
  p->taken = 0;
  if (!(s->me == mb->drop_from && xround == mb->drop_xround)) {
    p->data = malloc(len);
    memcpy(p->data, msg, len);
  }
  pthread_cond_broadcast(&mb->cv);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 30; /* a deadline only a hung test reaches */
  peers[0].data = NULL;
  peers[0].len = 0;
  int other = 1 - s->me;
  for (;;) {
    post_t* found = NULL;
    for (int i = 0; i < mb->n; i++)
      if (mb->posts[i].from == other && mb->posts[i].xround == xround && !mb->posts[i].taken)
        found = &mb->posts[i];
    if (found && !found->data) break;                                         /* dropped */
    if (!found && (mb->down[other] || mb->newest[other] > xround + 1)) break; /* dead, ahead */
    if (found) {
      found->taken = 1;
      assert_int_equal(nb_alloc((void**)&peers[0].data, found->len, 1, "msg"), NB_OK);
      memcpy(peers[0].data, found->data, found->len);
      peers[0].len = found->len;
      break;
    }
    if (pthread_cond_timedwait(&mb->cv, &mb->mu, &until) != 0) break;
  }
  uint64_t newest = mb->newest[other];
  int up = !mb->down[other];
  pthread_mutex_unlock(&mb->mu);
  if (sent) *sent = len;
  if (ahead) *ahead = newest > xround + 1 ? newest : 0;
  if (alive) *alive = (uint32_t)up;
  return NB_OK;
}

/* 1: every cluster trains like cluster 0 (same data, batch and order) and the outer step is
 * plain averaging: then theta_global after a round is every cluster's theta_local, whichever
 * rounds were skipped, if no progress is lost or counted twice. */
static int g_twins;

static nb_trainer_t* make_trainer(int c) {
  if (g_twins) c = 0;
  nb_train_config_t cfg;
  tiny_trainer_config(&cfg, g_data, c);
  cfg.batch_size = 2 + 2 * c;
  nb_trainer_t* t = NULL;
  nb_status_t st = nb_trainer_create(&cfg, &t);
  if (st != NB_OK) fprintf(stderr, "trainer: %s\n", nb_error_last());
  assert_int_equal(st, NB_OK);
  return t;
}

static void* side_main(void* arg) {
  side_t* s = arg;
  for (int r = 0; r < ROUNDS && s->st == NB_OK; r++) {
    s->st = nb_hybrid_round(s->h, &s->rec[r]);
    s->hash[r] = nb_hybrid_global_hash(s->h);
    size_t n;
    float* g = nb_hybrid_global(s->h, &n);
    s->local_is_global[r] = memcmp(g, nb_trainer_sync_params(s->t, NULL), n * sizeof(float)) == 0;
  }
  if (s->st == NB_OK) s->st = nb_hybrid_finish(s->h);
  if (s->st != NB_OK) fprintf(stderr, "cluster %d: %s\n", s->me, nb_error_last());
  return NULL;
}

/* How run_pair configures the clusters: overlap (tau = overlap_steps, H = inner steps), plain
 * (no fault tolerance: the same mailbox through the plain exchange), dense fp32 frames. The
 * defaults are the rounds without overlap of the first tests. */
typedef struct {
  int overlap, plain, dense;
  long tau, h;
  int land_early; /* with the gate hook below */
} opts_t;
static opts_t g_opt = {0, 0, 0, 0, 2, 0};

/* The plain exchange over the same mailbox (runs without drops). */
static nb_status_t plain_exchange(void* ctx, uint64_t round, const void* msg, size_t len,
                                  nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent) {
  nb_status_t st = ft_exchange(ctx, round, msg, len, peers, n_peers, sent, NULL, NULL);
  if (st == NB_OK && !peers[0].data) return nb_error(NB_ERR_UNAVAILABLE, "test: no message");
  return st;
}

/* The early landing's gate: the third inner step of a round, run on its own (the update in
 * flight has not landed yet), waits until that update's exchange is over, so that it lands
 * after step 3 at the latest. */
#define GATE_STEP 3
static nb_status_t gate_hook(void* ctx, long k) {
  side_t* s = ctx;
  long pos = s->steps_seen % g_opt.h;
  /* k < 0: a step straight after the last (the buffer unchanged): never a round's first */
  if (k < 0 && pos == 0) s->hook_misuse++;
  if (pos == GATE_STEP - 1 && (k == 1 || k == -1))
    while (!nb_hybrid_exchange_done(s->h)) usleep(1000);
  s->steps_seen += k < 0 ? -k : k;
  return NB_OK;
}

static void config_side(side_t* s, nb_hybrid_config_t* hc) {
  nb_hybrid_config_defaults(hc);
  hc->inner_steps = g_opt.h;
  hc->density = 0.05;
  if (g_opt.dense) {
    hc->density = 1.0;
    hc->values = NB_VALUES_FP32;
  }
  if (g_twins) {
    hc->outer_lr = 1.0f;
    hc->outer_momentum = 0.0f;
  }
  hc->overlap = g_opt.overlap;
  hc->overlap_steps = g_opt.tau;
  hc->land_early = g_opt.land_early;
  if (g_opt.land_early) {
    hc->steps_hook = gate_hook;
    hc->hook_ctx = s;
  }
  hc->cluster_index = (uint32_t)s->me;
  hc->n_clusters = 2;
  if (g_opt.plain)
    hc->exchange = plain_exchange;
  else
    hc->ft_exchange = ft_exchange;
  hc->exchange_ctx = s;
}

/* Runs ROUNDS fault-tolerant rounds on two threads, dropping (drop_from, drop_xround). */
static void run_pair(side_t side[2], mailbox_t* mb, int drop_from, uint64_t drop_xround) {
  memset(mb, 0, sizeof *mb);
  pthread_mutex_init(&mb->mu, NULL);
  pthread_cond_init(&mb->cv, NULL);
  mb->drop_from = drop_from;
  mb->drop_xround = drop_xround;
  for (int c = 0; c < 2; c++) {
    memset(&side[c], 0, sizeof side[c]);
    side[c].mb = mb;
    side[c].me = c;
    side[c].t = make_trainer(c);
    nb_hybrid_config_t hc;
    config_side(&side[c], &hc);
    assert_int_equal(nb_hybrid_create(&hc, side[c].t, &side[c].h), NB_OK);
  }
  pthread_t th[2];
  for (int c = 0; c < 2; c++) pthread_create(&th[c], NULL, side_main, &side[c]);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
}

static void free_pair(side_t side[2], mailbox_t* mb) {
  for (int c = 0; c < 2; c++) {
    nb_hybrid_destroy(side[c].h);
    nb_trainer_destroy(side[c].t);
  }
  for (int i = 0; i < mb->n; i++) free(mb->posts[i].data);
  pthread_cond_destroy(&mb->cv);
  pthread_mutex_destroy(&mb->mu);
}

/* Exchange ids: the update of round r is 2r + 2, its vote 2r + 3. */
static uint64_t update_id(int r) {
  return 2 * (uint64_t)r + 2;
}
static uint64_t vote_id(int r) {
  return 2 * (uint64_t)r + 3;
}

static void test_no_fault_every_round_applied(void** state) {
  (void)state;
  mailbox_t mb;
  side_t side[2];
  run_pair(side, &mb, -1, 0);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(side[c].st, NB_OK);
    for (int r = 0; r < ROUNDS; r++) {
      assert_int_equal(side[c].rec[r].applied, 1);
      assert_int_equal(side[c].rec[r].peers_ok, 1);
      assert_true(side[c].local_is_global[r]);
    }
    assert_int_equal(nb_hybrid_commits(side[c].h), ROUNDS);
  }
  assert_memory_equal(side[0].hash, side[1].hash, sizeof side[0].hash);
  assert_int_not_equal(side[0].hash[0], side[0].hash[ROUNDS - 1]);
  free_pair(side, &mb);
}

/* Cluster 1's update of round 2 never reaches cluster 0: cluster 1 has both updates, cluster 0
 * does not, so cluster 0 votes no and the round counts on neither. Both keep training from
 * their theta_local (which then differs from theta_global), and round 3 applies again. */
static void test_dropped_update_skips_round_everywhere(void** state) {
  (void)state;
  mailbox_t mb;
  side_t side[2];
  run_pair(side, &mb, 1, update_id(2));
  for (int c = 0; c < 2; c++) {
    assert_int_equal(side[c].st, NB_OK);
    assert_int_equal(side[c].rec[2].applied, 0);
    assert_false(side[c].local_is_global[2]);
    assert_int_equal(side[c].rec[1].applied, 1);
    assert_int_equal(side[c].rec[3].applied, 1);
    assert_true(side[c].local_is_global[3]);
    assert_int_equal(nb_hybrid_commits(side[c].h), ROUNDS - 1);
  }
  assert_int_equal(side[0].rec[2].peers_ok, 0);
  assert_int_equal(side[1].rec[2].peers_ok, 1);
  /* round 3's updates carry the progress of rounds 2 and 3, and weigh the samples of both */
  uint64_t both = 0;
  for (int c = 0; c < 2; c++) both += side[c].rec[2].samples + side[c].rec[3].samples;
  assert_int_equal(side[0].rec[3].samples_all, both);
  assert_int_equal(side[1].rec[3].samples_all, both);
  /* theta_global did not move in the skipped round, on either cluster */
  assert_int_equal(side[0].hash[2], side[0].hash[1]);
  assert_memory_equal(side[0].hash, side[1].hash, sizeof side[0].hash);
  free_pair(side, &mb);
}

/* Cluster 0's vote of round 2 is lost: cluster 0 (both yes) applies round 2, cluster 1 holds
 * it. In round 3 cluster 1 sees that cluster 0 applied one more round and lands the held round
 * (caught_up); round 3 itself counts on neither (the updates were made on different
 * theta_global), and from round 4 on both apply again with identical hashes. */
static void test_lost_vote_lands_late(void** state) {
  (void)state;
  mailbox_t mb;
  side_t side[2];
  run_pair(side, &mb, 0, vote_id(2));
  for (int c = 0; c < 2; c++) assert_int_equal(side[c].st, NB_OK);
  assert_int_equal(side[0].rec[2].applied, 1);
  assert_int_equal(side[1].rec[2].applied, 0);
  assert_int_not_equal(side[0].hash[2], side[1].hash[2]); /* one round apart for a moment */
  assert_int_equal(side[1].rec[3].caught_up, 1);
  assert_int_equal(side[0].rec[3].applied, 0);
  assert_int_equal(side[1].rec[3].applied, 0);
  for (int r = 3; r < ROUNDS; r++) assert_int_equal(side[0].hash[r], side[1].hash[r]);
  assert_int_equal(side[0].rec[4].applied, 1);
  assert_int_equal(side[1].rec[4].applied, 1);
  assert_int_equal(nb_hybrid_commits(side[0].h), nb_hybrid_commits(side[1].h));
  assert_int_equal(nb_hybrid_commits(side[0].h), ROUNDS - 1);
  free_pair(side, &mb);
}

/* The rejoin state: cluster 1 adopts cluster 0's export (hash, rounds applied, next round);
 * a flipped byte or a short buffer is refused and leaves the hybrid alone. */
static void test_export_import(void** state) {
  (void)state;
  mailbox_t mb;
  side_t side[2];
  run_pair(side, &mb, -1, 0);
  uint8_t* b = NULL;
  size_t len = 0;
  assert_int_equal(nb_hybrid_export(side[0].h, &b, &len), NB_OK);
  /* make cluster 1 different first */
  size_t n;
  float* g1 = nb_hybrid_global(side[1].h, &n);
  g1[0] += 1.0f;
  uint64_t before = nb_hybrid_global_hash(side[1].h);
  b[100] ^= 1;
  assert_int_equal(nb_hybrid_import(side[1].h, b, len, 2), NB_ERR_INTEGRITY);
  b[100] ^= 1;
  assert_int_equal(nb_hybrid_import(side[1].h, b, len - 1, 2), NB_ERR_INVALID);
  assert_int_equal(nb_hybrid_global_hash(side[1].h), before);
  assert_int_equal(nb_hybrid_import(side[1].h, b, len, 2), NB_OK);
  assert_int_equal(nb_hybrid_global_hash(side[1].h), nb_hybrid_global_hash(side[0].h));
  assert_int_equal(nb_hybrid_commits(side[1].h), nb_hybrid_commits(side[0].h));
  assert_int_equal(nb_hybrid_rounds(side[1].h), nb_hybrid_rounds(side[0].h) + 2);
  assert_memory_equal(nb_trainer_sync_params(side[1].t, NULL), nb_hybrid_global(side[0].h, NULL),
                      n * sizeof(float));
  nb_free(b);
  free_pair(side, &mb);
}

/* A rejoin in process: cluster 1 runs 2 rounds and "dies" (its hybrid and trainer are
 * destroyed); cluster 0 goes on with its rounds skipped. Cluster 1 comes back with a fresh
 * trainer, imports cluster 0's published state with skip 2, and both run to round RJ_ROUNDS:
 * cluster 0 jumps to cluster 1's round, from then on every round is applied on both, and they
 * end (finish) with the same theta_global and the same rounds applied. */
#define RJ_ROUNDS 9

typedef struct {
  pthread_mutex_t mu;
  uint8_t* state;
  size_t len;
  int skipped;  /* cluster 0's skipped rounds so far */
  int rejoined; /* cluster 1 is back (cluster 0 waits for it after two skipped rounds, as a
                   slower survivor would, so that the run does not end without it) */
} board_t;

typedef struct {
  side_t side;
  board_t* board;
  int jumps, applied_after, skipped;
  uint64_t rejoined_at;
} rside_t;

static void publish(board_t* b, nb_hybrid_t* h) {
  uint8_t* s = NULL;
  size_t len = 0;
  assert_int_equal(nb_hybrid_export(h, &s, &len), NB_OK);
  pthread_mutex_lock(&b->mu);
  free(b->state);
  b->state = malloc(len);
  memcpy(b->state, s, len);
  b->len = len;
  pthread_mutex_unlock(&b->mu);
  nb_free(s);
}

static nb_hybrid_t* make_ft(side_t* s) {
  nb_hybrid_config_t hc;
  config_side(s, &hc); /* g_opt: without overlap unless the test sets it */
  nb_hybrid_t* h = NULL;
  assert_int_equal(nb_hybrid_create(&hc, s->t, &h), NB_OK);
  return h;
}

static void* rside_main(void* arg) {
  rside_t* r = arg;
  side_t* s = &r->side;
  if (s->me == 1) {
    for (int i = 0; i < 2 && s->st == NB_OK; i++) s->st = nb_hybrid_round(s->h, &s->rec[0]);
    pthread_mutex_lock(&s->mb->mu);
    s->mb->down[1] = 1;
    pthread_cond_broadcast(&s->mb->cv);
    pthread_mutex_unlock(&s->mb->mu);
    nb_hybrid_destroy(s->h);
    nb_trainer_destroy(s->t);
    /* down until cluster 0 skipped two rounds */
    for (;;) {
      pthread_mutex_lock(&r->board->mu);
      int sk = r->board->skipped;
      pthread_mutex_unlock(&r->board->mu);
      if (sk >= 2) break;
      nb_sleep_ns(20000000);
    }
    s->t = make_trainer(1);
    s->h = make_ft(s);
    pthread_mutex_lock(&r->board->mu);
    s->st = nb_hybrid_import(s->h, r->board->state, r->board->len, 2);
    pthread_mutex_unlock(&r->board->mu);
    r->rejoined_at = nb_hybrid_rounds(s->h);
    pthread_mutex_lock(&s->mb->mu);
    s->mb->down[1] = 0;
    pthread_cond_broadcast(&s->mb->cv);
    pthread_mutex_unlock(&s->mb->mu);
    pthread_mutex_lock(&r->board->mu);
    r->board->rejoined = 1;
    pthread_mutex_unlock(&r->board->mu);
  }
  /* with overlap a round reports the previous round's update: two more rounds to see two */
  uint64_t until = RJ_ROUNDS + (g_opt.overlap ? 2 : 0);
  while (s->st == NB_OK && nb_hybrid_rounds(s->h) < until) {
    nb_hybrid_round_t rec;
    uint64_t at = nb_hybrid_rounds(s->h);
    s->st = nb_hybrid_round(s->h, &rec);
    if (s->st != NB_OK) break;
    if (rec.next_round > at + 1) r->jumps++;
    if (rec.landed && !rec.applied) r->skipped++;
    if (rec.applied && at >= 4) r->applied_after++;
    if (s->me == 0) {
      publish(r->board, s->h);
      pthread_mutex_lock(&r->board->mu);
      r->board->skipped = r->skipped;
      pthread_mutex_unlock(&r->board->mu);
      for (;;) {
        pthread_mutex_lock(&r->board->mu);
        int wait = r->skipped >= 2 && !r->board->rejoined;
        pthread_mutex_unlock(&r->board->mu);
        if (!wait) break;
        nb_sleep_ns(10000000);
      }
    }
  }
  if (s->st == NB_OK) s->st = nb_hybrid_finish(s->h);
  if (s->st != NB_OK) fprintf(stderr, "cluster %d: %s\n", s->me, nb_error_last());
  return NULL;
}

static void run_rejoin(void) {
  mailbox_t mb;
  memset(&mb, 0, sizeof mb);
  pthread_mutex_init(&mb.mu, NULL);
  pthread_cond_init(&mb.cv, NULL);
  mb.drop_from = -1;
  board_t board;
  memset(&board, 0, sizeof board);
  pthread_mutex_init(&board.mu, NULL);
  rside_t rs[2];
  for (int c = 0; c < 2; c++) {
    memset(&rs[c], 0, sizeof rs[c]);
    rs[c].board = &board;
    rs[c].side.mb = &mb;
    rs[c].side.me = c;
    rs[c].side.t = make_trainer(c);
    rs[c].side.h = make_ft(&rs[c].side);
  }
  publish(&board, rs[0].side.h);
  pthread_t th[2];
  for (int c = 0; c < 2; c++) pthread_create(&th[c], NULL, rside_main, &rs[c]);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++) assert_int_equal(rs[c].side.st, NB_OK);
  assert_true(rs[0].skipped >= 2);    /* alone: rounds skipped, training went on */
  assert_true(rs[1].rejoined_at > 4); /* the served round + 2 */
  assert_int_equal(rs[0].jumps, 1);   /* cluster 0 met cluster 1 at its round */
  assert_true(rs[1].applied_after >= 2);
  assert_int_equal(nb_hybrid_global_hash(rs[0].side.h), nb_hybrid_global_hash(rs[1].side.h));
  assert_int_equal(nb_hybrid_commits(rs[0].side.h), nb_hybrid_commits(rs[1].side.h));
  for (int c = 0; c < 2; c++) {
    nb_hybrid_destroy(rs[c].side.h);
    nb_trainer_destroy(rs[c].side.t);
  }
  for (int i = 0; i < mb.n; i++) free(mb.posts[i].data);
  free(board.state);
  pthread_mutex_destroy(&board.mu);
  pthread_cond_destroy(&mb.cv);
  pthread_mutex_destroy(&mb.mu);
}

static void test_rejoin_in_process(void** state) {
  (void)state;
  run_rejoin();
}

/* The same with overlap (tau 1 of H 3): the survivor publishes its state with its round's
 * exchange in flight, the rejoined cluster meets it, and both end equal. */
static void test_rejoin_in_process_overlap(void** state) {
  (void)state;
  g_opt = (opts_t){1, 0, 0, 1, 3, 0};
  run_rejoin();
  g_opt = (opts_t){0, 0, 0, 0, 2, 0};
}

/* ------------------------------------------------------------ with overlap */

static float* copy_global(nb_hybrid_t* h, size_t* n) {
  const float* g = nb_hybrid_global(h, n);
  float* out = malloc(*n * sizeof(float));
  memcpy(out, g, *n * sizeof(float));
  return out;
}

/* Without a fault, fault-tolerant rounds with overlap give the bits of rounds with overlap and no
 * fault tolerance when the update lands inside the next round (tau 1 of H 3), every round
 * applied and both replicas equal after every round; landing at the round's end (tau >= H) the
 * decision comes before the next message instead of after it: the same to float rounding. */
static void test_overlap_commit_path_equals_plain(void** state) {
  (void)state;
  mailbox_t mb;
  side_t ft[2], plain[2];
  for (int end = 0; end < 2; end++) {
    g_opt = (opts_t){1, 0, end, end ? 3 : 1, 3, 0};
    run_pair(ft, &mb, -1, 0);
    for (int c = 0; c < 2; c++) {
      assert_int_equal(ft[c].st, NB_OK);
      assert_int_equal(ft[c].rec[0].landed, 0);
      for (int r = 1; r < ROUNDS; r++) {
        assert_int_equal(ft[c].rec[r].landed, 1);
        assert_int_equal(ft[c].rec[r].applied, 1);
        assert_int_equal(ft[c].rec[r].peers_ok, 1);
        assert_int_equal(ft[c].rec[r].commits, (uint64_t)r);
      }
      assert_int_equal(nb_hybrid_commits(ft[c].h), ROUNDS);
    }
    assert_memory_equal(ft[0].hash, ft[1].hash, sizeof ft[0].hash);
    size_t n;
    float* g_ft = copy_global(ft[0].h, &n);
    /* after finish the trainer holds theta_global */
    assert_memory_equal(g_ft, nb_trainer_sync_params(ft[0].t, NULL), n * sizeof(float));
    free_pair(ft, &mb);
    g_opt.plain = 1;
    run_pair(plain, &mb, -1, 0);
    assert_int_equal(plain[0].st, NB_OK);
    assert_int_equal(plain[1].st, NB_OK);
    float* g_plain = copy_global(plain[0].h, &n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)g_ft[i] - g_plain[i]));
    fprintf(stderr, "overlap, tau %ld of H 3: fault-tolerant vs plain: max |diff| %.3g\n",
            g_opt.tau, worst);
    if (!end) {
      assert_memory_equal(g_ft, g_plain, n * sizeof(float));
      assert_memory_equal(ft[0].hash, plain[0].hash, sizeof ft[0].hash);
    } else {
      assert_true(worst < 1e-5);
    }
    free(g_ft);
    free(g_plain);
    free_pair(plain, &mb);
  }
  g_opt = (opts_t){0, 0, 0, 0, 2, 0};
}

/* With overlap, cluster 1's update of round 2 never reaches cluster 0: the decision, taken in
 * round 3 (tau 1 of H 3), skips it on both; theta_global stays, both keep their progress, and
 * round 3's update, applied in round 4, carries rounds 2 and 3 with the samples of both. */
static void test_overlap_dropped_update_skips_everywhere(void** state) {
  (void)state;
  for (int end = 0; end < 2; end++) {
    mailbox_t mb;
    side_t side[2];
    g_opt = (opts_t){1, 0, 0, end ? 3 : 1, 3, 0};
    run_pair(side, &mb, 1, update_id(2));
    for (int c = 0; c < 2; c++) {
      assert_int_equal(side[c].st, NB_OK);
      assert_int_equal(side[c].rec[2].applied, 1); /* round 1's update */
      assert_int_equal(side[c].rec[3].landed, 1);
      assert_int_equal(side[c].rec[3].applied, 0); /* round 2's: skipped */
      assert_false(side[c].local_is_global[3]);
      assert_int_equal(side[c].rec[4].applied, 1); /* round 3's, carrying round 2's progress */
      assert_int_equal(side[c].rec[5].applied, 1);
      assert_int_equal(nb_hybrid_commits(side[c].h), ROUNDS - 1);
      assert_int_equal(side[c].hash[3], side[c].hash[2]); /* theta_global did not move */
    }
    assert_int_equal(side[0].rec[3].peers_ok, 0);
    assert_int_equal(side[1].rec[3].peers_ok, 1);
    uint64_t both = 0;
    for (int c = 0; c < 2; c++) both += side[c].rec[2].samples + side[c].rec[3].samples;
    assert_int_equal(side[0].rec[4].samples_all, both);
    assert_int_equal(side[1].rec[4].samples_all, both);
    assert_memory_equal(side[0].hash, side[1].hash, sizeof side[0].hash);
    assert_int_equal(nb_hybrid_global_hash(side[0].h), nb_hybrid_global_hash(side[1].h));
    free_pair(side, &mb);
  }
  g_opt = (opts_t){0, 0, 0, 0, 2, 0};
}

/* With overlap, cluster 0's vote of round 2 is lost: cluster 0 applies round 2 (decided in round
 * 3), cluster 1 holds it; round 3's updates are on different versions, so its decision (in
 * round 4) skips it on both, and cluster 1 lands the held round there (caught_up). From then on
 * the hashes agree and both apply every round. */
static void test_overlap_lost_vote_lands_late(void** state) {
  (void)state;
  mailbox_t mb;
  side_t side[2];
  g_opt = (opts_t){1, 0, 0, 1, 3, 0};
  run_pair(side, &mb, 0, vote_id(2));
  for (int c = 0; c < 2; c++) assert_int_equal(side[c].st, NB_OK);
  assert_int_equal(side[0].rec[3].applied, 1);
  assert_int_equal(side[1].rec[3].applied, 0);
  assert_int_not_equal(side[0].hash[3], side[1].hash[3]);
  assert_int_equal(side[1].rec[4].caught_up, 1);
  assert_int_equal(side[0].rec[4].applied, 0);
  assert_int_equal(side[1].rec[4].applied, 0);
  for (int r = 4; r < ROUNDS; r++) assert_int_equal(side[0].hash[r], side[1].hash[r]);
  assert_int_equal(side[0].rec[5].applied, 1);
  assert_int_equal(side[1].rec[5].applied, 1);
  assert_int_equal(nb_hybrid_commits(side[0].h), nb_hybrid_commits(side[1].h));
  assert_int_equal(nb_hybrid_commits(side[0].h), ROUNDS - 1);
  assert_int_equal(nb_hybrid_global_hash(side[0].h), nb_hybrid_global_hash(side[1].h));
  free_pair(side, &mb);
  g_opt = (opts_t){0, 0, 0, 0, 2, 0};
}

/* Nothing lost, nothing counted twice: two clusters that train identically, dense fp32 frames,
 * plain averaging. Without a fault theta_global follows their common theta_local; a skipped
 * round (a dropped update) or a held one landed late (a lost vote) must end at the same place,
 * to float rounding, not one round's progress away from it. */
static void test_overlap_skip_keeps_progress(void** state) {
  (void)state;
  g_twins = 1;
  float* g[3] = {NULL, NULL, NULL};
  size_t n = 0;
  float* g0 = NULL;
  for (int tau = 1; tau <= 3; tau += 2) {
    for (int v = 0; v < 3; v++) {
      mailbox_t mb;
      side_t side[2];
      g_opt = (opts_t){1, 0, 1, tau, 3, 0};
      if (v == 0) run_pair(side, &mb, -1, 0);
      if (v == 1) run_pair(side, &mb, 1, update_id(2));
      if (v == 2) run_pair(side, &mb, 0, vote_id(2));
      for (int c = 0; c < 2; c++) assert_int_equal(side[c].st, NB_OK);
      assert_int_equal(nb_hybrid_global_hash(side[0].h), nb_hybrid_global_hash(side[1].h));
      assert_int_equal(nb_hybrid_commits(side[0].h), v == 0 ? ROUNDS : ROUNDS - 1);
      if (v == 1) assert_int_equal(side[0].rec[3].applied, 0);
      if (v == 2) assert_int_equal(side[1].rec[4].caught_up, 1);
      if (!g0) {
        nb_trainer_t* t = make_trainer(0);
        nb_hybrid_global(side[0].h, &n);
        g0 = malloc(n * sizeof(float));
        memcpy(g0, nb_trainer_sync_params(t, NULL), n * sizeof(float));
        nb_trainer_destroy(t);
      }
      g[v] = copy_global(side[0].h, &n);
      free_pair(side, &mb);
    }
    double moved = 0, lost = 0, late = 0;
    for (size_t i = 0; i < n; i++) {
      moved = fmax(moved, fabs((double)g[0][i] - g0[i]));
      lost = fmax(lost, fabs((double)g[1][i] - g[0][i]));
      late = fmax(late, fabs((double)g[2][i] - g[0][i]));
    }
    fprintf(stderr, "twins, tau %d: moved %.3g; dropped update %.3g, lost vote %.3g from it\n", tau,
            moved, lost, late);
    assert_true(moved > 1e-3);
    assert_true(lost < 1e-5);
    assert_true(late < 1e-5);
    for (int v = 0; v < 3; v++) free(g[v]);
  }
  free(g0);
  g_twins = 0;
  g_opt = (opts_t){0, 0, 0, 0, 2, 0};
}

/* Checkpoints with overlap: after round CK the update in flight is drained (nothing in flight,
 * nb_hybrid_save works); a run that is stopped there (hybrid destroyed; the trainer, whose own
 * checkpoint is not this test's, is kept) and resumed from the saved state ends with the bits of
 * the run that went on. Plain and fault-tolerant rounds. */
#define CK 2

typedef struct {
  side_t side;
  int stop; /* destroy the hybrid after the checkpoint and load the state into a new one */
  char path[160];
  uint64_t final_hash;
} ckside_t;

static void* ckside_main(void* arg) {
  ckside_t* k = arg;
  side_t* s = &k->side;
  for (int r = 0; r < ROUNDS && s->st == NB_OK; r++) {
    s->st = nb_hybrid_round(s->h, &s->rec[r]);
    if (s->st != NB_OK || r != CK) continue;
    nb_hybrid_round_t d;
    s->st = nb_hybrid_drain(s->h, &d);
    if (s->st == NB_OK && (!d.landed || !d.applied)) s->st = NB_ERR_INTERNAL;
    if (s->st == NB_OK) s->st = nb_hybrid_save(s->h, k->path);
    if (s->st == NB_OK && k->stop) {
      nb_hybrid_destroy(s->h);
      s->h = NULL;
      nb_hybrid_config_t hc;
      config_side(s, &hc);
      s->st = nb_hybrid_create(&hc, s->t, &s->h);
      if (s->st == NB_OK) s->st = nb_hybrid_load(s->h, k->path);
      if (s->st == NB_OK && nb_hybrid_rounds(s->h) != CK + 1) s->st = NB_ERR_INTERNAL;
    }
  }
  if (s->st == NB_OK) s->st = nb_hybrid_finish(s->h);
  if (s->st != NB_OK) fprintf(stderr, "cluster %d: %s\n", s->me, nb_error_last());
  k->final_hash = s->h ? nb_hybrid_global_hash(s->h) : 0;
  return NULL;
}

static uint64_t run_ck(int plain, int stop, const char* dir) {
  mailbox_t mb;
  memset(&mb, 0, sizeof mb);
  pthread_mutex_init(&mb.mu, NULL);
  pthread_cond_init(&mb.cv, NULL);
  mb.drop_from = -1;
  g_opt = (opts_t){1, plain, 0, 1, 3, 0};
  ckside_t ks[2];
  for (int c = 0; c < 2; c++) {
    memset(&ks[c], 0, sizeof ks[c]);
    ks[c].stop = stop;
    snprintf(ks[c].path, sizeof ks[c].path, "%s/state-%d.bin", dir, c);
    ks[c].side.mb = &mb;
    ks[c].side.me = c;
    ks[c].side.t = make_trainer(c);
    nb_hybrid_config_t hc;
    config_side(&ks[c].side, &hc);
    assert_int_equal(nb_hybrid_create(&hc, ks[c].side.t, &ks[c].side.h), NB_OK);
  }
  pthread_t th[2];
  for (int c = 0; c < 2; c++) pthread_create(&th[c], NULL, ckside_main, &ks[c]);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++) assert_int_equal(ks[c].side.st, NB_OK);
  assert_int_equal(ks[0].final_hash, ks[1].final_hash);
  for (int c = 0; c < 2; c++) {
    nb_hybrid_destroy(ks[c].side.h);
    nb_trainer_destroy(ks[c].side.t);
    unlink(ks[c].path);
  }
  for (int i = 0; i < mb.n; i++) free(mb.posts[i].data);
  pthread_cond_destroy(&mb.cv);
  pthread_mutex_destroy(&mb.mu);
  g_opt = (opts_t){0, 0, 0, 0, 2, 0};
  return ks[0].final_hash;
}

/* Early landing (what the adaptive scheduler's runs use): with land_early the update in flight
 * lands at the first inner-step boundary after its exchange (and vote) is over, tau being the
 * latest; without, after tau exactly. H 8, tau 6, the exchange over by step 3 (the gate): every
 * landing after step 3 or before, on both clusters, plain and fault-tolerant; every round
 * applied and the replicas equal either way. */
static void test_land_early(void** state) {
  (void)state;
  for (int plain = 0; plain < 2; plain++)
    for (int early = 0; early < 2; early++) {
      g_opt = (opts_t){1, plain, 0, 6, 8, early};
      mailbox_t mb;
      side_t side[2];
      run_pair(side, &mb, -1, 0);
      for (int c = 0; c < 2; c++) {
        assert_int_equal(side[c].st, NB_OK);
        assert_int_equal(side[c].rec[0].landed_step, -1); /* nothing in flight yet */
        for (int r = 1; r < ROUNDS; r++) {
          if (early)
            assert_in_range(side[c].rec[r].landed_step, 0, GATE_STEP);
          else
            assert_int_equal(side[c].rec[r].landed_step, 6);
          if (!plain) assert_int_equal(side[c].rec[r].applied, 1);
        }
        assert_int_equal(side[c].hook_misuse, 0);
      }
      assert_memory_equal(side[0].hash, side[1].hash, sizeof side[0].hash);
      free_pair(side, &mb);
    }
  g_opt = (opts_t){0, 0, 0, 0, 2, 0};
}

static void test_overlap_checkpoint_resume(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_hybrid_ck.XXXXXX";
  assert_non_null(mkdtemp(dir));
  for (int plain = 0; plain < 2; plain++) {
    uint64_t went_on = run_ck(plain, 0, dir), resumed = run_ck(plain, 1, dir);
    fprintf(stderr, "%s overlap: went on %016llx, resumed %016llx\n",
            plain ? "plain" : "fault-tolerant", (unsigned long long)went_on,
            (unsigned long long)resumed);
    assert_int_equal(went_on, resumed);
  }
  rmdir(dir);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
    return 2;
  }
  g_data = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_fault_every_round_applied),
      cmocka_unit_test(test_dropped_update_skips_round_everywhere),
      cmocka_unit_test(test_lost_vote_lands_late),
      cmocka_unit_test(test_export_import),
      cmocka_unit_test(test_rejoin_in_process),
      cmocka_unit_test(test_overlap_commit_path_equals_plain),
      cmocka_unit_test(test_land_early),
      cmocka_unit_test(test_overlap_dropped_update_skips_everywhere),
      cmocka_unit_test(test_overlap_lost_vote_lands_late),
      cmocka_unit_test(test_overlap_skip_keeps_progress),
      cmocka_unit_test(test_rejoin_in_process_overlap),
      cmocka_unit_test(test_overlap_checkpoint_resume),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
