/* The public session API as a user's program sees it: only <nebula.h> and libnebula.so. Two
 * clusters, each a thread with a session over loopback and a small linear model of its own
 * (y = W x + b, W 16x16, b 16: 272 parameters) trained by plain SGD on its own data, sync through
 * sealed outer rounds. Also: a mismatched tensor table, a NaN in one cluster's buffers, a round
 * before start. Nothing of nebula's trainer is used. */
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
#include <unistd.h>

#include "session_pair.h"

#define DIM 16
#define N_DATA 256
#define BATCH 32
#define H 10
#define ROUNDS 8

/* One cluster: its model, its data (its own input distribution, the same true map), its
 * session. */
typedef struct {
  int index;
  float w[DIM * DIM]; /* (DIM, DIM) */
  float b[DIM];       /* (DIM) */
  float x[N_DATA][DIM], y[N_DATA][DIM];
  nb_session_t* s;
  int64_t b_len; /* the shape b is registered with (the mismatch test changes it) */
  int poison;    /* the round (1-based) before which this cluster puts a NaN into w */
  int blowup;    /* the round (1-based) before which this cluster adds 1e4 to every w */
  double bound;  /* update_norm_bound; 0: the default */
  int tau;       /* >= 0: overlapped rounds (begin, tau steps, end); -1: blocking */
  uint64_t hashes[ROUNDS];
  /* results */
  nb_status_t st;
  char msg[512];
  double loss0, loss1;
  int rounds_done;
  uint64_t hash_before_bad;
  float w_before_bad[DIM * DIM];
  nb_session_round_t last;
} side_t;

static uint64_t rng_next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static double rng_unit(uint64_t* s) { /* [-1, 1) */
  return (double)(rng_next(s) >> 11) / (double)(1ull << 52) - 1.0;
}

/* The true map is the same everywhere; each cluster's inputs have their own scale and offset
 * (its "own data"), and its initial W its own seed (theta then comes from cluster 0). */
static void side_init(side_t* sd, int index) {
  memset(sd, 0, sizeof *sd);
  sd->index = index;
  sd->tau = -1;
  sd->b_len = DIM;
  uint64_t truth = 0x9e3779b97f4a7c15ull, own = 1234567ull + 7919ull * (uint64_t)index;
  double wt[DIM][DIM], bt[DIM];
  for (int i = 0; i < DIM; i++) {
    bt[i] = 0.5 * rng_unit(&truth);
    for (int j = 0; j < DIM; j++) wt[i][j] = rng_unit(&truth) / 4;
  }
  for (int n = 0; n < N_DATA; n++)
    for (int j = 0; j < DIM; j++)
      sd->x[n][j] = (float)((1.0 + 0.5 * index) * rng_unit(&own) + 0.2 * index);
  for (int n = 0; n < N_DATA; n++)
    for (int i = 0; i < DIM; i++) {
      double v = bt[i];
      for (int j = 0; j < DIM; j++) v += wt[i][j] * sd->x[n][j];
      sd->y[n][i] = (float)(v + 0.01 * rng_unit(&own));
    }
  for (int i = 0; i < DIM * DIM; i++) sd->w[i] = (float)(0.1 * rng_unit(&own));
}

/* Mean squared error over the cluster's own data, in double. */
static double side_loss(const side_t* sd) {
  double sum = 0;
  for (int n = 0; n < N_DATA; n++)
    for (int i = 0; i < DIM; i++) {
      double p = sd->b[i];
      for (int j = 0; j < DIM; j++) p += (double)sd->w[i * DIM + j] * sd->x[n][j];
      double e = p - sd->y[n][i];
      sum += e * e;
    }
  return sum / (N_DATA * DIM);
}

/* k steps of minibatch SGD (batch BATCH, in data order from `at`). */
static void side_steps_k(side_t* sd, int* at, int steps) {
  const float lr = 0.05f;
  for (int k = 0; k < steps; k++) {
    float gw[DIM * DIM] = {0}, gb[DIM] = {0};
    for (int m = 0; m < BATCH; m++) {
      int n = (*at)++ % N_DATA;
      for (int i = 0; i < DIM; i++) {
        float p = sd->b[i];
        for (int j = 0; j < DIM; j++) p += sd->w[i * DIM + j] * sd->x[n][j];
        float e = 2.0f * (p - sd->y[n][i]) / (BATCH * DIM);
        gb[i] += e;
        for (int j = 0; j < DIM; j++) gw[i * DIM + j] += e * sd->x[n][j];
      }
    }
    for (int i = 0; i < DIM * DIM; i++) sd->w[i] -= lr * gw[i];
    for (int i = 0; i < DIM; i++) sd->b[i] -= lr * gb[i];
  }
}

static const uint8_t secret[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                   17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static void side_open(side_t* sd, const char* job) {
  nb_session_options_t o;
  pair_options(&o, job, sd->index, secret);
  o.inner_steps = H;
  o.outer_lr = 0.8f;
  o.outer_momentum = 0.5f;
  o.density = 0.25;
  o.values = "int8";
  if (sd->bound > 0) o.update_norm_bound = sd->bound;
  assert_int_equal(nb_session_open(&o, &sd->s), NB_OK);
  assert_true(nb_session_port(sd->s) > 0);
  int64_t wshape[2] = {DIM, DIM};
  assert_int_equal(nb_session_register(sd->s, "w", sd->w, wshape, 2), NB_OK);
  assert_int_equal(nb_session_register(sd->s, "b", sd->b, &sd->b_len, 1), NB_OK);
}

static void sides_connect(side_t* a, side_t* b) {
  assert_int_equal(pair_connect(a->s, b->s), NB_OK);
}

static void side_fail(side_t* sd, nb_status_t st) {
  sd->st = st;
  snprintf(sd->msg, sizeof sd->msg, "%s", nb_error_last());
}

static void* side_main(void* arg) {
  side_t* sd = arg;
  nb_status_t st = nb_session_start(sd->s);
  if (st != NB_OK) {
    side_fail(sd, st);
    return NULL;
  }
  sd->loss0 = side_loss(sd);
  int at = 0;
  for (int r = 1; r <= ROUNDS; r++) {
    side_steps_k(sd, &at, sd->tau > 0 && r > 1 ? H - sd->tau : H);
    if (sd->poison == r) sd->w[3] = NAN;
    if (sd->blowup == r)
      for (int i = 0; i < DIM * DIM; i++) sd->w[i] += 1e4f; /* finite, far beyond the others */
    if (sd->poison) { /* what "nothing applied" compares with */
      sd->hash_before_bad = nb_session_global_hash(sd->s);
      memcpy(sd->w_before_bad, sd->w, sizeof sd->w);
    }
    if (sd->tau < 0) {
      st = nb_session_round(sd->s, H * BATCH, &sd->last);
    } else { /* the update lands tau steps into the next round, which then runs H - tau more */
      st = nb_session_round_begin(sd->s, H * BATCH);
      if (st == NB_OK) side_steps_k(sd, &at, sd->tau);
      if (st == NB_OK) st = nb_session_round_end(sd->s, &sd->last);
    }
    if (st != NB_OK) {
      side_fail(sd, st);
      return NULL;
    }
    sd->hashes[r - 1] = sd->last.global_hash;
    sd->rounds_done = r;
  }
  st = nb_session_finish(sd->s);
  if (st != NB_OK) side_fail(sd, st);
  sd->loss1 = side_loss(sd);
  return NULL;
}

static void run_pair(side_t* sd) {
  pthread_t th[2];
  for (int c = 0; c < 2; c++) assert_int_equal(pthread_create(&th[c], NULL, side_main, &sd[c]), 0);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
}

static side_t sides[2];

static void* start_main(void* arg) {
  side_t* sd = arg;
  sd->st = nb_session_start(sd->s);
  return NULL;
}

static void test_two_clusters_train(void** state) {
  (void)state;
  side_t* sd = sides;
  for (int c = 0; c < 2; c++) side_init(&sd[c], c);
  float w0[DIM * DIM];
  memcpy(w0, sd[0].w, sizeof w0);
  assert_true(memcmp(sd[0].w, sd[1].w, sizeof w0) != 0);
  for (int c = 0; c < 2; c++) side_open(&sd[c], "api-train");
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd);
  for (int c = 0; c < 2; c++) {
    if (sd[c].st != NB_OK) fail_msg("cluster %d: %s", c, sd[c].msg);
    assert_int_equal(sd[c].rounds_done, ROUNDS);
    print_message("cluster %d: loss %.5f -> %.5f over %d rounds, %llu bytes sent last round\n", c,
                  sd[c].loss0, sd[c].loss1, ROUNDS, (unsigned long long)sd[c].last.bytes_sent);
    /* the loss on the cluster's own data falls well below where theta started */
    assert_true(sd[c].loss1 < 0.5 * sd[c].loss0);
    assert_int_equal(sd[c].last.round, ROUNDS - 1);
    assert_int_equal(sd[c].last.applied, 1);
    assert_int_equal(sd[c].last.samples_all, 2 * H * BATCH);
    assert_true(sd[c].last.bytes_sent > 0);
    assert_true(sd[c].last.msg_bytes < (DIM * DIM + DIM) * sizeof(float)); /* compressed */
    assert_true(sd[c].last.update_norm > 0 && isfinite(sd[c].last.update_norm));
    assert_true(sd[c].last.rtt_s >= 0 && sd[c].last.goodput_Bps >= 0);
  }
  /* bit-identical parameters and the same hash on both clusters */
  assert_memory_equal(sd[0].w, sd[1].w, sizeof sd[0].w);
  assert_memory_equal(sd[0].b, sd[1].b, sizeof sd[0].b);
  assert_int_equal(nb_session_global_hash(sd[0].s), nb_session_global_hash(sd[1].s));
  assert_int_equal(sd[0].last.global_hash, sd[1].last.global_hash);
  for (int c = 0; c < 2; c++) nb_session_close(sd[c].s);
}

/* theta_global comes from cluster 0's values: checked right after start. */
static void test_start_takes_cluster0_values(void** state) {
  (void)state;
  side_t* sd = sides;
  for (int c = 0; c < 2; c++) side_init(&sd[c], c);
  float w0[DIM * DIM];
  memcpy(w0, sd[0].w, sizeof w0);
  for (int c = 0; c < 2; c++) side_open(&sd[c], "api-start");
  sides_connect(&sd[0], &sd[1]);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, start_main, &sd[1]), 0);
  assert_int_equal(nb_session_start(sd[0].s), NB_OK);
  pthread_join(th, NULL);
  assert_int_equal(sd[1].st, NB_OK);
  assert_memory_equal(sd[1].w, w0, sizeof w0);
  assert_memory_equal(sd[0].w, w0, sizeof w0);
  assert_int_equal(nb_session_global_hash(sd[0].s), nb_session_global_hash(sd[1].s));
  assert_int_equal(nb_session_start(sd[0].s), NB_ERR_INVALID); /* twice */
  for (int c = 0; c < 2; c++) nb_session_close(sd[c].s);
}

static void test_table_mismatch(void** state) {
  (void)state;
  side_t* sd = sides;
  for (int c = 0; c < 2; c++) side_init(&sd[c], c);
  sd[1].b_len = DIM / 2; /* cluster 1 registers b with another shape */
  for (int c = 0; c < 2; c++) side_open(&sd[c], "api-mismatch");
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd);
  for (int c = 0; c < 2; c++) {
    print_message("cluster %d: %s\n", c, sd[c].msg);
    assert_int_equal(sd[c].st, NB_ERR_CONFIG);
    assert_non_null(strstr(sd[c].msg, "tensor 1 differs: 'b'"));
    assert_non_null(strstr(sd[c].msg, c == 0 ? "at cluster west" : "at cluster east"));
    assert_int_equal(nb_session_round(sd[c].s, 1, NULL), NB_ERR_INVALID);
    nb_session_close(sd[c].s);
  }
}

static void test_nan_refused(void** state) {
  (void)state;
  side_t* sd = sides;
  for (int c = 0; c < 2; c++) side_init(&sd[c], c);
  sd[1].poison = 3;
  sd[0].poison = -1; /* keeps its buffers before each round, to compare */
  for (int c = 0; c < 2; c++) side_open(&sd[c], "api-nan");
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd);
  for (int c = 0; c < 2; c++) {
    print_message("cluster %d: %s\n", c, sd[c].msg);
    assert_int_equal(sd[c].st, NB_ERR_INVALID);
    assert_int_equal(sd[c].rounds_done, 2);
    assert_non_null(strstr(sd[c].msg, "cluster 1 is not finite"));
    assert_non_null(strstr(sd[c].msg, "nothing applied"));
    /* nothing applied: theta_global as before the round, the buffers as the caller left them */
    assert_int_equal(nb_session_global_hash(sd[c].s), sd[c].hash_before_bad);
    assert_memory_equal(sd[c].w, sd[c].w_before_bad, sizeof sd[c].w);
    /* and the session refuses further rounds */
    assert_int_equal(nb_session_round(sd[c].s, 1, NULL), NB_ERR_INVALID);
  }
  assert_true(isnan(sd[1].w[3]));
  assert_int_equal(nb_session_global_hash(sd[0].s), nb_session_global_hash(sd[1].s));
  for (int c = 0; c < 2; c++) nb_session_close(sd[c].s);
}

/* A finite update far larger than the recent rounds' (a diverged or corrupted model): refused on
 * both clusters by the default bound, naming the cluster, nothing applied. */
static void test_norm_refused(void** state) {
  (void)state;
  side_t* sd = sides;
  for (int c = 0; c < 2; c++) side_init(&sd[c], c);
  sd[1].blowup = 6; /* after 5 applied rounds: past the bound's warm-up */
  sd[1].poison = -1;
  sd[0].poison = -1;
  for (int c = 0; c < 2; c++) side_open(&sd[c], "api-norm");
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd);
  for (int c = 0; c < 2; c++) {
    print_message("cluster %d: %s\n", c, sd[c].msg);
    assert_int_equal(sd[c].st, NB_ERR_INVALID);
    assert_int_equal(sd[c].rounds_done, 5);
    assert_true(sd[c].last.update_norm > 0);
    assert_non_null(strstr(sd[c].msg, "times the median"));
    assert_non_null(strstr(sd[c].msg, "cluster 1 sent the largest part"));
    assert_non_null(strstr(sd[c].msg, "nothing applied"));
    assert_int_equal(nb_session_global_hash(sd[c].s), sd[c].hash_before_bad);
    assert_int_equal(nb_session_round(sd[c].s, 1, NULL), NB_ERR_INVALID);
  }
  assert_memory_equal(sd[0].w, sd[0].w_before_bad, sizeof sd[0].w);
  assert_int_equal(nb_session_global_hash(sd[0].s), nb_session_global_hash(sd[1].s));
  for (int c = 0; c < 2; c++) nb_session_close(sd[c].s);

  /* the same blow-up with the bound off is applied (the session does as told) */
  for (int c = 0; c < 2; c++) side_init(&sd[c], c);
  sd[1].blowup = 6;
  for (int c = 0; c < 2; c++) {
    nb_session_options_t o;
    pair_options(&o, "api-norm-off", c, secret);
    o.inner_steps = H;
    o.outer_lr = 0.8f;
    o.outer_momentum = 0.5f;
    o.density = 0.25;
    o.update_norm_bound = 0;
    assert_int_equal(nb_session_open(&o, &sd[c].s), NB_OK);
    int64_t wshape[2] = {DIM, DIM};
    assert_int_equal(nb_session_register(sd[c].s, "w", sd[c].w, wshape, 2), NB_OK);
    assert_int_equal(nb_session_register(sd[c].s, "b", sd[c].b, &sd[c].b_len, 1), NB_OK);
  }
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(sd[c].st, NB_OK);
    assert_int_equal(sd[c].rounds_done, ROUNDS);
    nb_session_close(sd[c].s);
  }
}

/* Clusters with different bounds would refuse different rounds: start fails on both. */
static void test_norm_bound_differs(void** state) {
  (void)state;
  side_t* sd = sides;
  for (int c = 0; c < 2; c++) side_init(&sd[c], c);
  sd[1].bound = 50;
  for (int c = 0; c < 2; c++) side_open(&sd[c], "api-norm-differs");
  sides_connect(&sd[0], &sd[1]);
  pthread_t th[2];
  for (int c = 0; c < 2; c++) assert_int_equal(pthread_create(&th[c], NULL, start_main, &sd[c]), 0);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(sd[c].st, NB_ERR_CONFIG);
    nb_session_close(sd[c].s);
  }
  nb_session_options_t o;
  pair_options(&o, "api-norm-bad", 0, secret);
  nb_session_t* s = NULL;
  o.update_norm_bound = 0.5; /* below 1 would refuse every ordinary round */
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "update_norm_bound"));
  o.update_norm_bound = NAN;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  assert_null(s);
}

/* The overlapped round: with no step between begin and end it is the blocking round, bit for
 * bit; with tau steps between, the clusters still agree on every round and the model learns. */
static void test_overlap(void** state) {
  (void)state;
  static side_t ref[2];
  side_t* sd = sides;
  for (int c = 0; c < 2; c++) side_init(&ref[c], c), side_open(&ref[c], "api-ovl-ref");
  sides_connect(&ref[0], &ref[1]);
  run_pair(ref);
  for (int c = 0; c < 2; c++) side_init(&sd[c], c), sd[c].tau = 0, side_open(&sd[c], "api-ovl-0");
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(ref[c].st, NB_OK);
    assert_int_equal(sd[c].st, NB_OK);
    assert_memory_equal(sd[c].hashes, ref[c].hashes, sizeof ref[c].hashes);
    assert_memory_equal(sd[c].w, ref[c].w, sizeof ref[c].w);
    assert_true(sd[c].last.exchange_s >= 0 && sd[c].last.wait_s >= 0);
    nb_session_close(ref[c].s);
    nb_session_close(sd[c].s);
  }
  for (int c = 0; c < 2; c++) side_init(&sd[c], c), sd[c].tau = 3, side_open(&sd[c], "api-ovl-3");
  sides_connect(&sd[0], &sd[1]);
  run_pair(sd);
  for (int c = 0; c < 2; c++) {
    print_message("cluster %d, tau 3: loss %.5f -> %.5f\n", c, sd[c].loss0, sd[c].loss1);
    assert_int_equal(sd[c].st, NB_OK);
    assert_int_equal(sd[c].rounds_done, ROUNDS);
    assert_true(sd[c].loss1 < 0.5 * sd[c].loss0);
    assert_int_equal(sd[c].last.applied, 1);
  }
  assert_memory_equal(sd[0].hashes, sd[1].hashes, sizeof sd[0].hashes);
  /* the steps since the last begin are each cluster's own: theta_global is one, the buffers two */
  float g0[DIM * DIM], g1[DIM * DIM];
  assert_int_equal(nb_session_read_global(sd[0].s, "w", g0, DIM * DIM), NB_OK);
  assert_int_equal(nb_session_read_global(sd[1].s, "w", g1, DIM * DIM), NB_OK);
  assert_memory_equal(g0, g1, sizeof g0);
  assert_memory_not_equal(sd[0].w, sd[1].w, sizeof g0);
  for (int c = 0; c < 2; c++) nb_session_close(sd[c].s);
}

/* Calls out of order around an overlapped round are refused by name; close waits for one. */
static void test_overlap_misuse(void** state) {
  (void)state;
  nb_session_options_t o;
  solo_options(&o, "api-ovl-misuse");
  nb_session_t* s = NULL;
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  assert_int_equal(nb_session_register(s, "v", v, shape, 1), NB_OK);
  assert_int_equal(nb_session_round_begin(s, 1), NB_ERR_INVALID); /* before start */
  assert_int_equal(nb_session_start(s), NB_OK);
  assert_int_equal(nb_session_round_end(s, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "without nb_session_round_begin"));
  v[0] = 0;
  assert_int_equal(nb_session_round_begin(s, 4), NB_OK);
  v[1] = 5; /* trained on meanwhile: kept on top of theta_global */
  assert_int_equal(nb_session_round_begin(s, 4), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "in flight"));
  assert_int_equal(nb_session_round(s, 4, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_session_finish(s), NB_ERR_INVALID);
  nb_session_round_t r;
  assert_int_equal(nb_session_round_end(s, &r), NB_OK);
  assert_int_equal(r.round, 0);
  assert_int_equal(r.samples_all, 4);
  float g[4];
  assert_int_equal(nb_session_read_global(s, "v", g, 4), NB_OK);
  assert_true(v[1] == g[1] + 3); /* the 3 trained after begin, on top of theta_global */
  assert_int_equal(nb_session_round_begin(s, 4), NB_OK);
  nb_session_close(s); /* with a round in flight */
}

/* Eager start: with a sparse frame, round_begin moves the buffers to the round's predicted
 * landing. One cluster knows the whole update, so the prediction is the landing itself (to float
 * rounding), also once the momentum is not zero; eager 0, or a dense frame, leaves them. */
static void test_overlap_eager(void** state) {
  (void)state;
  for (int mode = 0; mode < 3; mode++) { /* eager sparse, eager 0 sparse, eager dense */
    nb_session_options_t o;
    solo_options(&o, "api-ovl-eager");
    o.values = "fp32";
    o.outer_lr = 0.8f;
    o.outer_momentum = 0.5f;
    o.density = mode == 2 ? 1.0 : 0.5;
    o.eager = mode != 1;
    nb_session_t* s = NULL;
    float v[8];
    for (int i = 0; i < 8; i++) v[i] = (float)i;
    int64_t shape[1] = {8};
    assert_int_equal(nb_session_open(&o, &s), NB_OK);
    assert_int_equal(nb_session_register(s, "v", v, shape, 1), NB_OK);
    assert_int_equal(nb_session_start(s), NB_OK);
    assert_int_equal(nb_session_begin_moved(s), 0);
    for (int r = 0; r < 3; r++) {
      float before[8], pred[8];
      for (int i = 0; i < 8; i++) v[i] -= 0.1f * (float)((i * 5 + r) % 8); /* "trained" */
      memcpy(before, v, sizeof v);
      assert_int_equal(nb_session_round_begin(s, 4), NB_OK);
      int moved = nb_session_begin_moved(s);
      memcpy(pred, v, sizeof v);
      nb_session_round_t rr;
      assert_int_equal(nb_session_round_end(s, &rr), NB_OK); /* no step in between */
      assert_int_equal(nb_session_begin_moved(s), 0);
      float g[8];
      assert_int_equal(nb_session_read_global(s, "v", g, 8), NB_OK);
      assert_memory_equal(v, g, sizeof g); /* as a blocking round */
      if (mode == 0) {
        assert_int_equal(moved, 1);
        assert_memory_not_equal(pred, before, sizeof pred);
        for (int i = 0; i < 8; i++) assert_true(fabsf(pred[i] - g[i]) <= 1e-5f);
      } else {
        assert_int_equal(moved, 0);
        assert_memory_equal(pred, before, sizeof pred);
      }
    }
    nb_session_close(s);
  }
}

/* topk_chunk: the same update at 3 % in 2-bit values, its indices chunked and Golomb-Rice coded,
 * is a smaller frame than with the top-k of the whole vector (delta varints). */
static void test_topk_chunk(void** state) {
  (void)state;
  enum { N = 1 << 16 };
  static float v[N];
  size_t bytes[2];
  for (int mode = 0; mode < 2; mode++) {
    nb_session_options_t o;
    solo_options(&o, "api-chunk");
    o.values = "2bit";
    o.density = 0.03;
    o.topk_chunk = mode ? 4096 : 0;
    nb_session_t* s = NULL;
    uint64_t rng = 42;
    for (int i = 0; i < N; i++) v[i] = 0;
    int64_t shape[1] = {N};
    assert_int_equal(nb_session_open(&o, &s), NB_OK);
    assert_int_equal(nb_session_register(s, "v", v, shape, 1), NB_OK);
    assert_int_equal(nb_session_start(s), NB_OK);
    for (int i = 0; i < N; i++) v[i] = (float)rng_unit(&rng);
    nb_session_round_t r;
    assert_int_equal(nb_session_round(s, 1, &r), NB_OK);
    bytes[mode] = r.msg_bytes;
    nb_session_close(s);
  }
  print_message("2-bit at 3 %% of %d: %zu bytes global top-k, %zu chunked\n", N, bytes[0],
                bytes[1]);
  assert_true(bytes[1] < bytes[0]);
}

/* The caller's loss of a round goes into that round's progress line, once; a loss that is not
 * finite is refused and nothing kept. */
static void test_loss_in_progress(void** state) {
  (void)state;
  char path[] = "/tmp/nb-api-progress-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  nb_session_options_t o;
  solo_options(&o, "api-loss");
  o.progress_file = path;
  nb_session_t* s = NULL;
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  assert_int_equal(nb_session_register(s, "v", v, shape, 1), NB_OK);
  assert_int_equal(nb_session_start(s), NB_OK);
  assert_int_equal(nb_session_set_loss(NULL, 1.0), NB_ERR_INVALID);
  assert_int_equal(nb_session_set_loss(s, NAN), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "finite"));
  assert_int_equal(nb_session_set_loss(s, INFINITY), NB_ERR_INVALID);
  assert_int_equal(nb_session_round(s, 4, NULL), NB_OK); /* no loss given: none in its line */
  assert_int_equal(nb_session_set_loss(s, 2.5), NB_OK);
  v[0] = 0;
  assert_int_equal(nb_session_round(s, 4, NULL), NB_OK);
  assert_int_equal(nb_session_round(s, 4, NULL), NB_OK); /* kept for one round only */
  nb_session_close(s);
  FILE* f = fopen(path, "r");
  assert_non_null(f);
  char line[3][1024];
  for (int i = 0; i < 3; i++) assert_non_null(fgets(line[i], sizeof line[i], f));
  fclose(f);
  unlink(path);
  assert_null(strstr(line[0], "\"loss\""));
  assert_non_null(strstr(line[1], "\"loss\": 2.5,"));
  assert_null(strstr(line[2], "\"loss\""));
}

static void test_round_before_start(void** state) {
  (void)state;
  nb_session_options_t o;
  solo_options(&o, "api-one");
  nb_session_t* s = NULL;
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  assert_int_equal(nb_session_round(s, 1, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "before start"));
  assert_int_equal(nb_session_start(s), NB_ERR_INVALID); /* no tensor */
  nb_session_close(s);

  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  assert_int_equal(nb_session_register(s, "v", v, shape, 1), NB_OK);
  assert_int_equal(nb_session_register(s, "v", v, shape, 1), NB_ERR_EXISTS);
  int64_t bad[1] = {0};
  assert_int_equal(nb_session_register(s, "z", v, bad, 1), NB_ERR_INVALID);
  assert_int_equal(nb_session_round(s, 1, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_session_start(s), NB_OK);
  assert_int_equal(nb_session_register(s, "late", v, shape, 1), NB_ERR_INVALID);
  /* one cluster: a round is the outer step on its own Delta */
  v[0] = 0;
  nb_session_round_t r;
  assert_int_equal(nb_session_round(s, 8, &r), NB_OK);
  assert_int_equal(r.round, 0);
  assert_int_equal(r.samples_all, 8);
  nb_session_close(s);
}

static void test_open_refuses(void** state) {
  (void)state;
  nb_session_options_t o;
  nb_session_options_default(&o);
  o.job_id = "api-refuse";
  o.cluster_id = "solo";
  nb_session_t* s = NULL;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG); /* neither pki_dir nor insecure */
  assert_null(s);
  o.insecure = 1;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG); /* neither secret nor unsealed */
  o.unsealed = 1;
  o.values = "int7";
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_INVALID);
  o.values = "int8";
  o.topk_chunk = 100; /* not a power of two */
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "topk_chunk 100"));
  o.topk_chunk = 8; /* below 16 */
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  o.topk_chunk = 0;
  o.cluster_index = 1;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_CONFIG);
  o.cluster_index = 0;
  o.job_id = NULL;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "job_id"));
  nb_session_close(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_refuses),
      cmocka_unit_test(test_round_before_start),
      cmocka_unit_test(test_start_takes_cluster0_values),
      cmocka_unit_test(test_two_clusters_train),
      cmocka_unit_test(test_table_mismatch),
      cmocka_unit_test(test_nan_refused),
      cmocka_unit_test(test_norm_refused),
      cmocka_unit_test(test_norm_bound_differs),
      cmocka_unit_test(test_overlap),
      cmocka_unit_test(test_overlap_misuse),
      cmocka_unit_test(test_overlap_eager),
      cmocka_unit_test(test_topk_chunk),
      cmocka_unit_test(test_loss_in_progress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
