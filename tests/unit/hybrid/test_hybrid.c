/* Tests of train/hybrid: two clusters in one process (tiny model, committed corpus) checked
 * against a hand-computed outer step, kept bit-identical over many rounds, a corrupted replica
 * caught by the hash check, and the callback path with two threads. argv[1] = data folder. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/common.h"
#include "train/hybrid.h"
#include "train/trainer.h"
#include "tests/unit/hybrid/tiny_trainer.h"

static const char* g_data;

/* Cluster c: same model and seed (so the same starting point), its own languages, batch and
 * data order. */
static nb_status_t grad_hook(void* ctx, float* g, size_t n) {
  return nb_hybrid_gradient(*(nb_hybrid_t**)ctx, g, n);
}

static nb_trainer_t* make_trainer_hooked(int c, int batch, nb_hybrid_t** hook_target) {
  nb_train_config_t cfg;
  tiny_trainer_config(&cfg, g_data, c);
  if (hook_target) {
    cfg.grad_hook = grad_hook;
    cfg.grad_hook_ctx = hook_target;
  }
  cfg.batch_size = batch;
  nb_trainer_t* t = NULL;
  nb_status_t st = nb_trainer_create(&cfg, &t);
  if (st != NB_OK) fprintf(stderr, "trainer: %s\n", nb_error_last());
  assert_int_equal(st, NB_OK);
  return t;
}

static nb_trainer_t* make_trainer(int c, int batch) {
  return make_trainer_hooked(c, batch, NULL);
}

typedef struct {
  nb_trainer_t* t[2];
  nb_hybrid_t* h[2];
} pair_t;

static void make_pair(pair_t* p, const nb_hybrid_config_t* base, int batch0, int batch1) {
  int batch[2] = {batch0, batch1};
  for (int c = 0; c < 2; c++) {
    p->t[c] = make_trainer(c, batch[c]);
    nb_hybrid_config_t hc = *base;
    hc.cluster_index = (uint32_t)c;
    hc.n_clusters = 2;
    assert_int_equal(nb_hybrid_create(&hc, p->t[c], &p->h[c]), NB_OK);
  }
}

static void free_pair(pair_t* p) {
  for (int c = 0; c < 2; c++) {
    nb_hybrid_destroy(p->h[c]);
    nb_trainer_destroy(p->t[c]);
  }
}

/* prepare on both, copy the messages, apply on both with both. */
static nb_status_t lockstep(pair_t* p, nb_hybrid_round_t rec[2], uint8_t* copies[2]) {
  nb_hybrid_msg_t m[2];
  for (int c = 0; c < 2; c++) {
    const uint8_t* msg;
    size_t len;
    nb_status_t st = nb_hybrid_prepare(p->h[c], &msg, &len);
    if (st != NB_OK) return st;
    copies[c] = malloc(len);
    memcpy(copies[c], msg, len);
    m[c].data = copies[c];
    m[c].len = len;
  }
  nb_hybrid_msg_t rev[2] = {m[1], m[0]}; /* order of arrival must not matter */
  nb_status_t st = nb_hybrid_apply(p->h[0], m, 2, &rec[0]);
  if (st == NB_OK) st = nb_hybrid_apply(p->h[1], rev, 2, &rec[1]);
  return st;
}

static void base_config(nb_hybrid_config_t* hc) {
  nb_hybrid_config_defaults(hc);
  hc->inner_steps = 3;
}

/* Dense fp32 frames are exact, so theta_global must equal the outer Nesterov step computed here
 * from the two clusters' theta_local, with weights 2:6 from the batch sizes. */
static void test_outer_step_equals_hand_computed(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.density = 1.0;
  hc.values = NB_VALUES_FP32;
  pair_t p;
  make_pair(&p, &hc, 2, 6);
  size_t n;
  nb_hybrid_global(p.h[0], &n);
  float *g = malloc(n * 4), *mom = calloc(n, 4), *l0 = malloc(n * 4), *l1 = malloc(n * 4),
        *sum = malloc(n * 4);
  memcpy(g, nb_hybrid_global(p.h[0], NULL), n * 4);
  assert_memory_equal(g, nb_hybrid_global(p.h[1], NULL), n * 4);
  for (int r = 0; r < 3; r++) {
    nb_hybrid_msg_t m[2];
    for (int c = 0; c < 2; c++) {
      const uint8_t* msg;
      size_t len;
      assert_int_equal(nb_hybrid_prepare(p.h[c], &msg, &len), NB_OK);
      m[c].data = malloc(len);
      memcpy(m[c].data, msg, len);
      m[c].len = len;
    }
    memcpy(l0, nb_trainer_sync_params(p.t[0], NULL), n * 4);
    memcpy(l1, nb_trainer_sync_params(p.t[1], NULL), n * 4);
    nb_hybrid_round_t rec[2];
    assert_int_equal(nb_hybrid_apply(p.h[0], m, 2, &rec[0]), NB_OK);
    assert_int_equal(nb_hybrid_apply(p.h[1], m, 2, &rec[1]), NB_OK);
    free(m[0].data);
    free(m[1].data);
    assert_int_equal(rec[0].samples, 2 * 3);
    assert_int_equal(rec[1].samples, 6 * 3);
    assert_int_equal(rec[0].samples_all, 24);
    /* by hand: weights 0.25 / 0.75, sum in cluster order, then Nesterov */
    const float w0 = 0.25f, w1 = 0.75f, lr = hc.outer_lr, mu = hc.outer_momentum;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
      float s = 0.0f;
      s += w0 * (g[i] - l0[i]);
      s += w1 * (g[i] - l1[i]);
      sum[i] = s;
      float mo = mu * mom[i] + s;
      mom[i] = mo;
      g[i] -= lr * (s + mu * mo);
    }
    const float* got = nb_hybrid_global(p.h[0], NULL);
    for (size_t i = 0; i < n; i++) {
      double d = fabs((double)got[i] - (double)g[i]);
      if (d > worst) worst = d, at = i;
    }
    if (worst > 1e-6)
      fprintf(stderr, "round %d: worst |diff| %.3g at %zu (got %.9g want %.9g)\n", r, worst, at,
              got[at], g[at]);
    assert_true(worst <= 1e-6);
    /* both replicas, and the trainers' buffers, hold theta_global */
    assert_memory_equal(got, nb_hybrid_global(p.h[1], NULL), n * 4);
    assert_memory_equal(got, nb_trainer_sync_params(p.t[0], NULL), n * 4);
    assert_memory_equal(got, nb_trainer_sync_params(p.t[1], NULL), n * 4);
    assert_true(rec[0].global_hash == rec[1].global_hash);
    /* the step moved theta_global */
    double norm = 0;
    for (size_t i = 0; i < n; i++) norm += (double)sum[i] * sum[i];
    assert_true(norm > 0);
  }
  free(g), free(mom), free(l0), free(l1), free(sum);
  free_pair(&p);
}

/* Plain averaging (outer lr 1, momentum 0, dense fp32): theta_global becomes the sample-weighted
 * mean of the theta_local. */
static void test_averaging_weights_by_samples(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.density = 1.0;
  hc.values = NB_VALUES_FP32;
  hc.outer_lr = 1.0f;
  hc.outer_momentum = 0.0f;
  pair_t p;
  make_pair(&p, &hc, 1, 3);
  size_t n;
  nb_hybrid_global(p.h[0], &n);
  nb_hybrid_msg_t m[2];
  for (int c = 0; c < 2; c++) {
    const uint8_t* msg;
    size_t len;
    assert_int_equal(nb_hybrid_prepare(p.h[c], &msg, &len), NB_OK);
    m[c].data = malloc(len);
    memcpy(m[c].data, msg, len);
    m[c].len = len;
  }
  float *l0 = malloc(n * 4), *l1 = malloc(n * 4);
  memcpy(l0, nb_trainer_sync_params(p.t[0], NULL), n * 4);
  memcpy(l1, nb_trainer_sync_params(p.t[1], NULL), n * 4);
  assert_int_equal(nb_hybrid_apply(p.h[0], m, 2, NULL), NB_OK);
  const float* g = nb_hybrid_global(p.h[0], NULL);
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double want = 0.25 * l0[i] + 0.75 * l1[i];
    double d = fabs(g[i] - want);
    if (d > worst) worst = d;
  }
  fprintf(stderr, "weighted mean: worst |diff| %.3g\n", worst);
  assert_true(worst < 1e-5);
  free(m[0].data), free(m[1].data), free(l0), free(l1);
  free_pair(&p);
}

/* Sparse int8 frames with error feedback: every round both replicas are bit-identical, and
 * training goes on (theta_global moves). */
static void test_replicas_bit_identical(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.inner_steps = 2;
  hc.density = 0.05;
  hc.values = NB_VALUES_INT8;
  pair_t p;
  make_pair(&p, &hc, 2, 3);
  size_t n;
  nb_hybrid_global(p.h[0], &n);
  float* g0 = malloc(n * 4);
  memcpy(g0, nb_hybrid_global(p.h[0], NULL), n * 4);
  for (int r = 0; r < 12; r++) {
    if (r == 6) { /* the scheduler may change one cluster's density and round length */
      assert_int_equal(nb_hybrid_set_density(p.h[1], 0.3), NB_OK);
      assert_int_equal(nb_hybrid_set_inner_steps(p.h[0], 3), NB_OK);
      assert_int_equal(nb_hybrid_set_density(p.h[0], 0), NB_ERR_CONFIG);
    }
    nb_hybrid_round_t rec[2];
    uint8_t* cp[2];
    assert_int_equal(lockstep(&p, rec, cp), NB_OK);
    free(cp[0]), free(cp[1]);
    assert_memory_equal(nb_hybrid_global(p.h[0], NULL), nb_hybrid_global(p.h[1], NULL), n * 4);
    assert_true(rec[0].global_hash == rec[1].global_hash);
    assert_true(rec[0].global_hash == nb_hybrid_global_hash(p.h[0]));
    assert_true(isfinite(rec[0].loss) && rec[0].loss > 0);
    assert_int_equal(rec[0].round, (uint64_t)r);
    assert_int_equal(rec[0].steps, r < 6 ? 2 : 3);
    if (r >= 6) assert_true(rec[1].msg_bytes > rec[0].msg_bytes);
    /* a sparse frame is much smaller than the dense buffer */
    assert_true(rec[0].msg_bytes < n * 4 / 4);
  }
  assert_int_equal(nb_hybrid_rounds(p.h[0]), 12);
  assert_memory_not_equal(g0, nb_hybrid_global(p.h[0], NULL), n * 4);
  free(g0);
  free_pair(&p);
}

/* Error feedback loses nothing: after sparse rounds the residual holds progress that
 * theta_global lacks; a dense round sends it, so that with lr 1, momentum 0 and exact (fp32)
 * values theta_global is theta_0 minus the weighted sum of every round's Delta of every cluster. */
static void test_dense_round_flushes_residual(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.inner_steps = 2;
  hc.density = 0.02;
  hc.values = NB_VALUES_FP32;
  hc.outer_lr = 1.0f;
  hc.outer_momentum = 0.0f;
  pair_t p;
  make_pair(&p, &hc, 1, 3);
  size_t n;
  nb_hybrid_global(p.h[0], &n);
  const double w[2] = {0.25, 0.75};
  double* want = malloc(n * sizeof(double)); /* theta_0 - sum of all weighted Deltas */
  for (size_t i = 0; i < n; i++) want[i] = nb_hybrid_global(p.h[0], NULL)[i];
  double gap_sparse = 0, gap_flushed = 0;
  for (int r = 0; r < 5; r++) {
    if (r == 4)
      for (int c = 0; c < 2; c++) assert_int_equal(nb_hybrid_set_density(p.h[c], 1.0), NB_OK);
    nb_hybrid_msg_t m[2];
    for (int c = 0; c < 2; c++) {
      const float* g = nb_hybrid_global(p.h[c], NULL);
      const uint8_t* msg;
      size_t len;
      assert_int_equal(nb_hybrid_prepare(p.h[c], &msg, &len), NB_OK);
      const float* l = nb_trainer_sync_params(p.t[c], NULL);
      for (size_t i = 0; i < n; i++) want[i] -= w[c] * ((double)g[i] - (double)l[i]);
      m[c].data = malloc(len);
      memcpy(m[c].data, msg, len);
      m[c].len = len;
    }
    for (int c = 0; c < 2; c++) assert_int_equal(nb_hybrid_apply(p.h[c], m, 2, NULL), NB_OK);
    free(m[0].data), free(m[1].data);
    assert_memory_equal(nb_hybrid_global(p.h[0], NULL), nb_hybrid_global(p.h[1], NULL), n * 4);
    const float* g = nb_hybrid_global(p.h[0], NULL);
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(g[i] - want[i]));
    if (r == 3) gap_sparse = worst;
    if (r == 4) gap_flushed = worst;
  }
  fprintf(stderr, "held back after sparse rounds %.3g, after the dense round %.3g\n", gap_sparse,
          gap_flushed);
  assert_true(gap_sparse > 1e-4);
  assert_true(gap_flushed < 1e-5);
  assert_true(gap_flushed * 100 < gap_sparse);
  /* the residual is empty now: another dense round sends only that round's progress */
  free(want);
  free_pair(&p);
}

/* A replica changed between rounds is reported by the next round on both sides, and theta_global
 * is left as it was. */
/* SparseLoCo's decaying error feedback (cfg.ef_decay, e <- beta e + Delta): with beta so small
 * that beta e is below half an ulp of every Delta, each round's frame is exactly the frame
 * without error feedback (top-k of Delta alone), while beta 1 (the default) carries what the
 * previous round did not send and so changes the second round's frame. fp32 values: the frames
 * hold the selected values exactly. */
static nb_status_t ft_never_called(void* ctx, uint64_t xround, const void* msg, size_t len,
                                   nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* bytes_sent,
                                   uint64_t* ahead, uint32_t* alive) {
  (void)ctx, (void)xround, (void)msg, (void)len, (void)peers, (void)n_peers, (void)bytes_sent;
  (void)ahead, (void)alive;
  return NB_ERR_INTERNAL;
}

static void test_error_feedback_decay(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.density = 0.05;
  hc.values = NB_VALUES_FP32;
  hc.outer_lr = 1.0f;
  hc.outer_momentum = 0.0f;
  nb_hybrid_config_t off = hc, tiny = hc, full = hc;
  off.error_feedback = 0;
  tiny.ef_decay = 1e-30f;
  full.ef_decay = 1.0f;
  pair_t p[3];
  make_pair(&p[0], &off, 4, 4);
  make_pair(&p[1], &tiny, 4, 4);
  make_pair(&p[2], &full, 4, 4);
  for (int r = 0; r < 3; r++) {
    uint8_t* copies[3][2];
    nb_hybrid_round_t rec[2];
    size_t len[3][2];
    for (int v = 0; v < 3; v++) {
      assert_int_equal(lockstep(&p[v], rec, copies[v]), NB_OK);
      for (int c = 0; c < 2; c++) len[v][c] = (size_t)rec[c].msg_bytes;
    }
    for (int c = 0; c < 2; c++) {
      assert_int_equal(len[1][c], len[0][c]);
      assert_memory_equal(copies[1][c], copies[0][c], len[0][c]);
      if (r == 0) assert_memory_equal(copies[2][c], copies[0][c], len[0][c]);
      if (r == 1)
        assert_true(len[2][c] != len[0][c] || memcmp(copies[2][c], copies[0][c], len[0][c]) != 0);
    }
    for (int v = 0; v < 3; v++) free(copies[v][0]), free(copies[v][1]);
  }
  for (int v = 0; v < 3; v++) free_pair(&p[v]);
  nb_hybrid_config_t bad = hc;
  bad.ef_decay = 1.5f;
  nb_trainer_t* t = make_trainer(0, 4);
  nb_hybrid_t* h = NULL;
  bad.n_clusters = 2;
  assert_int_equal(nb_hybrid_create(&bad, t, &h), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "ef_decay"));
  /* the update norm bound: >= 1 or off, and never with fault-tolerant rounds */
  bad = hc;
  bad.norm_bound = 0.5;
  assert_int_equal(nb_hybrid_create(&bad, t, &h), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "norm_bound"));
  bad.norm_bound = 100;
  bad.ft_exchange = ft_never_called;
  assert_int_equal(nb_hybrid_create(&bad, t, &h), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "fault-tolerant"));
  assert_null(h);
  nb_trainer_destroy(t);
}

static void test_corrupted_replica_detected(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.density = 0.05;
  pair_t p;
  make_pair(&p, &hc, 2, 2);
  nb_hybrid_round_t rec[2];
  uint8_t* cp[2];
  assert_int_equal(lockstep(&p, rec, cp), NB_OK);
  free(cp[0]), free(cp[1]);
  size_t n;
  float* g1 = nb_hybrid_global(p.h[1], &n);
  uint32_t bits;
  memcpy(&bits, &g1[n / 2], 4);
  bits ^= 1u; /* one ulp */
  memcpy(&g1[n / 2], &bits, 4);
  uint64_t before = nb_hybrid_global_hash(p.h[0]);
  nb_status_t st = lockstep(&p, rec, cp);
  free(cp[0]), free(cp[1]);
  assert_int_equal(st, NB_ERR_INTEGRITY);
  assert_non_null(strstr(nb_error_last(), "diverged"));
  assert_true(nb_hybrid_global_hash(p.h[0]) == before);
  free_pair(&p);
}

/* Malformed messages are refused with a clear status and leave theta_global alone. */
static void test_bad_messages(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.inner_steps = 1;
  pair_t p;
  make_pair(&p, &hc, 1, 1);
  nb_hybrid_msg_t m[2];
  uint8_t* cp[2];
  for (int c = 0; c < 2; c++) {
    const uint8_t* msg;
    size_t len;
    assert_int_equal(nb_hybrid_prepare(p.h[c], &msg, &len), NB_OK);
    cp[c] = malloc(len);
    memcpy(cp[c], msg, len);
    m[c].data = cp[c];
    m[c].len = len;
  }
  uint64_t before = nb_hybrid_global_hash(p.h[0]);
  nb_hybrid_msg_t bad[2] = {m[0], {cp[1], 10}};
  assert_int_equal(nb_hybrid_apply(p.h[0], bad, 2, NULL), NB_ERR_CODEC);
  bad[1] = m[1];
  bad[1].len -= 1;
  assert_int_equal(nb_hybrid_apply(p.h[0], bad, 2, NULL), NB_ERR_CODEC);
  nb_hybrid_msg_t twice[2] = {m[0], m[0]};
  assert_int_equal(nb_hybrid_apply(p.h[0], twice, 2, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_hybrid_apply(p.h[0], m, 1, NULL), NB_ERR_INVALID);
  cp[1][NB_HYBRID_MSG_HEADER_BYTES + 100] ^= 0x40; /* inside the codec frame */
  nb_status_t st = nb_hybrid_apply(p.h[0], m, 2, NULL);
  assert_true(st == NB_ERR_INTEGRITY || st == NB_ERR_CODEC);
  assert_true(nb_hybrid_global_hash(p.h[0]) == before);
  assert_int_equal(nb_hybrid_rounds(p.h[0]), 0);
  free(cp[0]), free(cp[1]);

  nb_hybrid_config_t badc = hc;
  badc.density = 0;
  nb_hybrid_t* h = NULL;
  assert_int_equal(nb_hybrid_create(&badc, p.t[0], &h), NB_ERR_CONFIG);
  badc = hc;
  badc.cluster_index = 2;
  badc.n_clusters = 2;
  assert_int_equal(nb_hybrid_create(&badc, p.t[0], &h), NB_ERR_CONFIG);
  assert_null(h);
  free_pair(&p);
}

/* ---- the callback path: two threads and an in-process rendezvous ---- */
typedef struct {
  pthread_barrier_t bar;
  uint8_t* slot[2];
  size_t len[2];
} mailbox_t;

typedef struct {
  mailbox_t* mb;
  int me;
  nb_hybrid_t* h;
  nb_status_t st;
  uint64_t hashes[6];
  uint64_t bytes;
} side_t;

static nb_status_t mb_exchange(void* ctx, uint64_t round, const void* msg, size_t len,
                               nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent) {
  (void)round;
  side_t* s = ctx;
  mailbox_t* mb = s->mb;
  if (n_peers != 1) return NB_ERR_INVALID;
  mb->slot[s->me] = malloc(len);
  memcpy(mb->slot[s->me], msg, len);
  mb->len[s->me] = len;
  pthread_barrier_wait(&mb->bar);
  int o = 1 - s->me;
  if (nb_alloc((void**)&peers[0].data, mb->len[o], 1, "peer msg") != NB_OK) return NB_ERR_NOMEM;
  memcpy(peers[0].data, mb->slot[o], mb->len[o]);
  peers[0].len = mb->len[o];
  *sent = len;
  pthread_barrier_wait(&mb->bar);
  free(mb->slot[s->me]);
  return NB_OK;
}

static void* side_main(void* arg) {
  side_t* s = arg;
  for (int r = 0; r < 6 && s->st == NB_OK; r++) {
    nb_hybrid_round_t rec;
    s->st = nb_hybrid_round(s->h, &rec);
    s->hashes[r] = rec.global_hash;
    if (s->st == NB_OK && rec.bytes_sent != rec.msg_bytes) s->st = NB_ERR_INTERNAL;
  }
  if (s->st == NB_OK) s->st = nb_hybrid_finish(s->h);
  return NULL;
}

static void* side_main_steps(void* arg) {
  side_t* s = arg;
  for (int r = 0; r < 2 && s->st == NB_OK; r++) {
    nb_hybrid_round_t rec;
    s->st = nb_hybrid_round(s->h, &rec);
    s->hashes[r] = rec.global_hash;
    s->bytes += rec.msg_bytes;
    if (s->st == NB_OK && rec.steps != 3) s->st = NB_ERR_INTERNAL;
  }
  if (s->st == NB_OK) s->st = nb_hybrid_finish(s->h);
  if (s->st != NB_OK) fprintf(stderr, "cluster %d: %s\n", s->me, nb_error_last());
  return NULL;
}

/* Two clusters exchanging through the mailbox, each on its own thread. */
typedef struct {
  mailbox_t mb;
  side_t side[2];
  nb_trainer_t* t[2];
} tpair_t;

/* cfg: what both share (index, count and exchange are set here); hooked: trainers whose
 * gradient goes through the hybrid (step and dense modes); batch of cluster c: batch0 + c *
 * batch_step. */
static void tpair_make(tpair_t* p, const nb_hybrid_config_t* cfg, int hooked, int batch0,
                       int batch_step) {
  memset(p, 0, sizeof *p);
  pthread_barrier_init(&p->mb.bar, NULL, 2);
  for (int c = 0; c < 2; c++) {
    side_t* sd = &p->side[c];
    sd->mb = &p->mb;
    sd->me = c;
    p->t[c] = make_trainer_hooked(c, batch0 + c * batch_step, hooked ? &sd->h : NULL);
    nb_hybrid_config_t hc = *cfg;
    hc.cluster_index = (uint32_t)c;
    hc.n_clusters = 2;
    hc.exchange = mb_exchange;
    hc.exchange_ctx = sd;
    assert_int_equal(nb_hybrid_create(&hc, p->t[c], &sd->h), NB_OK);
  }
}

/* Runs fn on both sides; both must succeed with the same hashes. */
static void tpair_run(tpair_t* p, void* (*fn)(void*)) {
  pthread_t th[2];
  for (int c = 0; c < 2; c++) pthread_create(&th[c], NULL, fn, &p->side[c]);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  assert_int_equal(p->side[0].st, NB_OK);
  assert_int_equal(p->side[1].st, NB_OK);
  assert_memory_equal(p->side[0].hashes, p->side[1].hashes, sizeof p->side[0].hashes);
}

static void tpair_free(tpair_t* p) {
  for (int c = 0; c < 2; c++) {
    nb_hybrid_destroy(p->side[c].h);
    nb_trainer_destroy(p->t[c]);
  }
  pthread_barrier_destroy(&p->mb.bar);
}

static void test_round_through_callback(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.inner_steps = 2;
  hc.density = 0.02;
  tpair_t p;
  tpair_make(&p, &hc, 0, 2, 0);
  tpair_run(&p, side_main);
  tpair_free(&p);
}

/* Overlap: round r's exchange runs during round r+1, so theta_global is unchanged after the
 * first round and moves from the second on; both sides stay identical, and finish applies the
 * last exchange. */
typedef struct {
  side_t side;
  uint64_t init_hash;
  int unchanged_after_0, changed_after_1;
} oside_t;

static void* oside_main(void* arg) {
  oside_t* o = arg;
  side_t* s = &o->side;
  for (int r = 0; r < 5 && s->st == NB_OK; r++) {
    nb_hybrid_round_t rec;
    s->st = nb_hybrid_round(s->h, &rec);
    s->hashes[r] = nb_hybrid_global_hash(s->h);
    if (r == 0) o->unchanged_after_0 = s->hashes[0] == o->init_hash;
    if (r == 1) o->changed_after_1 = s->hashes[1] != o->init_hash;
  }
  if (s->st == NB_OK) s->st = nb_hybrid_finish(s->h);
  if (s->st != NB_OK) fprintf(stderr, "cluster %d: %s\n", s->me, nb_error_last());
  s->hashes[5] = nb_hybrid_global_hash(s->h);
  return NULL;
}

static void test_overlap_lands_one_round_late(void** state) {
  (void)state;
  mailbox_t mb;
  memset(&mb, 0, sizeof mb);
  pthread_barrier_init(&mb.bar, NULL, 2);
  oside_t os[2];
  nb_trainer_t* t[2];
  for (int c = 0; c < 2; c++) {
    memset(&os[c], 0, sizeof os[c]);
    os[c].side.mb = &mb;
    os[c].side.me = c;
    t[c] = make_trainer(c, 2);
    nb_hybrid_config_t hc;
    base_config(&hc);
    hc.inner_steps = 2;
    hc.density = 0.05;
    hc.overlap = 1;
    hc.cluster_index = (uint32_t)c;
    hc.n_clusters = 2;
    hc.exchange = mb_exchange;
    hc.exchange_ctx = &os[c].side;
    assert_int_equal(nb_hybrid_create(&hc, t[c], &os[c].side.h), NB_OK);
    os[c].init_hash = nb_hybrid_global_hash(os[c].side.h);
    /* apply is refused with overlap */
    assert_int_equal(nb_hybrid_apply(os[c].side.h, NULL, 0, NULL), NB_ERR_INVALID);
  }
  pthread_t th[2];
  for (int c = 0; c < 2; c++) pthread_create(&th[c], NULL, oside_main, &os[c]);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(os[c].side.st, NB_OK);
    assert_true(os[c].unchanged_after_0);
    assert_true(os[c].changed_after_1);
    /* after finish the trainer holds theta_global */
    size_t n;
    const float* g = nb_hybrid_global(os[c].side.h, &n);
    assert_memory_equal(g, nb_trainer_sync_params(t[c], NULL), n * 4);
  }
  assert_memory_equal(os[0].side.hashes, os[1].side.hashes, sizeof os[0].side.hashes);
  assert_true(os[0].side.hashes[5] != os[0].side.hashes[4]); /* the last update landed */
  for (int c = 0; c < 2; c++) {
    nb_hybrid_destroy(os[c].side.h);
    nb_trainer_destroy(t[c]);
  }
  pthread_barrier_destroy(&mb.bar);
}

/* overlap_steps (tau): round r's update lands after tau inner steps of round r+1, the round's
 * progress so far kept on top. tau 0 lands it before any step: the same trajectory as rounds
 * without overlap, to float rounding; tau >= H is one round late; tau in between is neither.
 * Both clusters hold the same theta_global after every round in every case. */
static double g_tau_round_s; /* > 0: wall-time rounds of this many seconds */

static void* tside_main(void* arg) {
  side_t* s = arg;
  for (int r = 0; r < 5 && s->st == NB_OK; r++) {
    nb_hybrid_round_t rec;
    s->st = nb_hybrid_round(s->h, &rec);
    s->hashes[r] = nb_hybrid_global_hash(s->h);
    if (s->st == NB_OK && (rec.steps < 1 || (g_tau_round_s == 0 && rec.steps != 4)))
      s->st = NB_ERR_INTERNAL;
  }
  if (s->st == NB_OK) s->st = nb_hybrid_finish(s->h);
  if (s->st != NB_OK) fprintf(stderr, "cluster %d: %s\n", s->me, nb_error_last());
  s->hashes[5] = nb_hybrid_global_hash(s->h);
  return NULL;
}

/* Runs two clusters for 5 rounds of H 4 (dense fp32 frames, plain averaging); *out receives
 * cluster 0's final theta_global (malloc'd). */
static size_t run_tau(int overlap, long tau, float** out) {
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.inner_steps = 4;
  hc.density = 1.0;
  hc.values = NB_VALUES_FP32;
  hc.outer_lr = 1.0f;
  hc.outer_momentum = 0.0f;
  hc.overlap = overlap;
  hc.overlap_steps = tau;
  if (g_tau_round_s > 0) {
    hc.inner_steps = 50;
    hc.round_seconds = g_tau_round_s;
  }
  tpair_t p;
  tpair_make(&p, &hc, 0, 2, 0);
  tpair_run(&p, tside_main);
  size_t n;
  const float* g = nb_hybrid_global(p.side[0].h, &n);
  /* after finish the trainer holds theta_global */
  assert_memory_equal(g, nb_trainer_sync_params(p.t[0], NULL), n * sizeof(float));
  *out = malloc(n * sizeof(float));
  memcpy(*out, g, n * sizeof(float));
  tpair_free(&p);
  return n;
}

static double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
  return m;
}

static void test_overlap_steps(void** state) {
  (void)state;
  float *sync, *t0, *t1, *t2, *late;
  size_t n = run_tau(0, 0, &sync);
  assert_int_equal(run_tau(1, 0, &t0), n);
  assert_int_equal(run_tau(1, 1, &t1), n);
  assert_int_equal(run_tau(1, 2, &t2), n);
  assert_int_equal(run_tau(1, 4, &late), n);
  double d_sync = max_abs_diff(t0, sync, n), d_late = max_abs_diff(late, sync, n);
  double d_12 = max_abs_diff(t1, t2, n), d_2late = max_abs_diff(t2, late, n);
  fprintf(stderr, "max |diff|: tau0-sync %.3g, late-sync %.3g, tau1-tau2 %.3g, tau2-late %.3g\n",
          d_sync, d_late, d_12, d_2late);
  assert_true(d_sync < 1e-5);
  assert_true(d_late > 100 * d_sync + 1e-4);
  assert_true(d_12 > 1e-5);
  assert_true(d_2late > 1e-5);
  /* the overlapped runs are no further from the synchronous one the earlier they land */
  assert_true(max_abs_diff(t2, sync, n) <= d_late);
  free(sync);
  free(t0);
  free(t1);
  free(t2);
  free(late);
}

/* Eager overlap (sync.eager): a sparse round starts from the predicted landing instead of
 * theta_global - own. Landing before any step (tau 0) leaves nothing of the prediction (the
 * round's progress since is 0), so eager and plain give the same bits; landing after 2 of 4
 * steps they differ, and both clusters agree on every round's theta_global either way. */
static size_t run_eager(int eager, long tau, float** out) {
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.inner_steps = 4;
  hc.density = 0.1;
  hc.outer_lr = 1.0f;
  hc.outer_momentum = 0.5f;
  hc.overlap = 1;
  hc.overlap_steps = tau;
  hc.eager = eager;
  tpair_t p;
  tpair_make(&p, &hc, 0, 2, 0);
  tpair_run(&p, tside_main); /* both sides: the same hashes after every round */
  size_t n;
  const float* g = nb_hybrid_global(p.side[0].h, &n);
  *out = malloc(n * sizeof(float));
  memcpy(*out, g, n * sizeof(float));
  tpair_free(&p);
  return n;
}

static void test_overlap_eager(void** state) {
  (void)state;
  float *e0, *p0, *e2, *p2;
  size_t n = run_eager(1, 0, &e0);
  assert_int_equal(run_eager(0, 0, &p0), n);
  assert_int_equal(run_eager(1, 2, &e2), n);
  assert_int_equal(run_eager(0, 2, &p2), n);
  double d0 = max_abs_diff(e0, p0, n), d2 = max_abs_diff(e2, p2, n);
  fprintf(stderr, "max |eager - plain|: tau 0 %.3g, tau 2 %.3g\n", d0, d2);
  assert_true(d0 < 1e-5);
  assert_true(d2 > 100 * d0 + 1e-4);
  free(e0);
  free(p0);
  free(e2);
  free(p2);
}

/* Wall-time rounds with overlap: the update lands after tau steps while the budget lasts (or at
 * the round's end when it does not); the replicas stay identical either way. */
static void test_overlap_steps_timed_rounds(void** state) {
  (void)state;
  float *a, *b;
  g_tau_round_s = 0.02;
  size_t n = run_tau(1, 1, &a);
  g_tau_round_s = 1e-6; /* the budget ends within the first step: lands at the round's end */
  assert_int_equal(run_tau(1, 1, &b), n);
  g_tau_round_s = 0;
  for (size_t i = 0; i < n; i++) assert_true(isfinite(a[i]) && isfinite(b[i]));
  free(a);
  free(b);
}

/* A negative tau is a configuration error. */
static void test_overlap_steps_refused(void** state) {
  (void)state;
  nb_trainer_t* t = make_trainer(0, 2);
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.overlap = 1;
  hc.overlap_steps = -1;
  nb_hybrid_t* h = NULL;
  assert_int_equal(nb_hybrid_create(&hc, t, &h), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "overlap_steps"));
  nb_trainer_destroy(t);
}

/* step and dense modes: every step exchanges the gradient; both clusters apply the same
 * weighted gradient, so the parameters stay bit-identical without an outer step. */
static void run_step_mode(nb_hybrid_mode_t mode) {
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.mode = mode;
  hc.inner_steps = 3;
  hc.density = 0.05;
  tpair_t p;
  tpair_make(&p, &hc, 1, 2, 1);
  size_t n;
  nb_hybrid_global(p.side[0].h, &n);
  tpair_run(&p, side_main_steps);
  assert_memory_equal(nb_trainer_sync_params(p.t[0], NULL), nb_trainer_sync_params(p.t[1], NULL),
                      n * 4);
  assert_true(p.side[0].hashes[0] != p.side[0].hashes[1]);
  /* per step: a dense fp32 frame, or a sparse one much smaller */
  uint64_t per_step = p.side[0].bytes / (2 * 3);
  if (mode == NB_HYBRID_DENSE)
    assert_true(per_step >= n * 4);
  else
    assert_true(per_step < n * 4 / 4);
  tpair_free(&p);
}

static void test_step_mode(void** state) {
  (void)state;
  run_step_mode(NB_HYBRID_STEP);
}

static void test_dense_mode(void** state) {
  (void)state;
  run_step_mode(NB_HYBRID_DENSE);
}

/* The round state survives a save and load; bad files are refused without touching it. */
static void test_save_load(void** state) {
  (void)state;
  nb_hybrid_config_t hc;
  base_config(&hc);
  hc.inner_steps = 2;
  hc.density = 0.05;
  pair_t p;
  make_pair(&p, &hc, 2, 2);
  nb_hybrid_round_t rec[2];
  uint8_t* cp[2];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(lockstep(&p, rec, cp), NB_OK);
    free(cp[0]), free(cp[1]);
  }
  char dir[] = "/tmp/nb_hybrid_state.XXXXXX", path[128], bad[160];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/state.bin", dir);
  assert_int_equal(nb_hybrid_save(p.h[0], path), NB_OK);
  uint64_t saved = nb_hybrid_global_hash(p.h[0]);
  /* another round moves it; loading brings back theta_global and the round counter */
  assert_int_equal(lockstep(&p, rec, cp), NB_OK);
  free(cp[0]), free(cp[1]);
  assert_true(nb_hybrid_global_hash(p.h[0]) != saved);
  assert_int_equal(nb_hybrid_load(p.h[0], path), NB_OK);
  assert_true(nb_hybrid_global_hash(p.h[0]) == saved);
  assert_int_equal(nb_hybrid_rounds(p.h[0]), 2);
  size_t n;
  const float* g = nb_hybrid_global(p.h[0], &n);
  assert_memory_equal(g, nb_trainer_sync_params(p.t[0], NULL), n * 4);
  /* a flipped byte, a truncated file, a missing file */
  FILE* f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 100, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 100, SEEK_SET);
  fputc(c ^ 1, f);
  fclose(f);
  assert_int_equal(nb_hybrid_load(p.h[0], path), NB_ERR_INTEGRITY);
  assert_int_equal(truncate(path, 1000), 0);
  assert_int_equal(nb_hybrid_load(p.h[0], path), NB_ERR_INVALID);
  snprintf(bad, sizeof bad, "%s/none.bin", dir);
  assert_int_equal(nb_hybrid_load(p.h[0], bad), NB_ERR_NOT_FOUND);
  assert_true(nb_hybrid_global_hash(p.h[0]) == saved);
  unlink(path);
  rmdir(dir);
  free_pair(&p);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
    return 2;
  }
  g_data = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outer_step_equals_hand_computed),
      cmocka_unit_test(test_averaging_weights_by_samples),
      cmocka_unit_test(test_replicas_bit_identical),
      cmocka_unit_test(test_dense_round_flushes_residual),
      cmocka_unit_test(test_error_feedback_decay),
      cmocka_unit_test(test_corrupted_replica_detected),
      cmocka_unit_test(test_bad_messages),
      cmocka_unit_test(test_round_through_callback),
      cmocka_unit_test(test_overlap_lands_one_round_late),
      cmocka_unit_test(test_overlap_steps),
      cmocka_unit_test(test_overlap_eager),
      cmocka_unit_test(test_overlap_steps_timed_rounds),
      cmocka_unit_test(test_overlap_steps_refused),
      cmocka_unit_test(test_save_load),
      cmocka_unit_test(test_step_mode),
      cmocka_unit_test(test_dense_mode),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
