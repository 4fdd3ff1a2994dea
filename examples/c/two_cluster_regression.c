/* two_cluster_regression: a user's own model trained across clusters with libnebula. Each cluster
 * runs this program: a linear regression y = W x + b (W 4x16, b 4) fitted by plain minibatch SGD
 * to a data shard of its own, and every H steps one nebula outer round that makes W and b the
 * clusters' common theta_global. Written only against <nebula.h>: nothing of nebula's trainer.
 *
 * The session comes from the NEBULA_* environment (docs/api.md, "The environment"), as a
 * launcher sets it; options the environment leaves unset get this example's defaults below.
 *
 *   two_cluster_regression [--rounds N] [--peer-timeout SECONDS]
 *
 * Prints one line per round (the loss of theta_global on this cluster's shard) and a final line
 * with theta_global's hash, the same on every cluster. Exit status: 0 done, 1 a nebula error
 * (its message on stderr), 2 bad usage. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nebula.h>

#define D_IN 16
#define D_OUT 4
#define N_SHARD 512 /* samples of this cluster's own */
#define BATCH 32
#define SGD_LR 0.05f

/* The model: the buffers nebula syncs (registered, borrowed by the session until close). */
static float W[D_OUT * D_IN]; /* (D_OUT, D_IN) */
static float B[D_OUT];        /* (D_OUT) */

/* This cluster's shard and the map that generated it (the same on every cluster). */
static float X[N_SHARD][D_IN], Y[N_SHARD][D_OUT];
static double W_TRUE[D_OUT][D_IN], B_TRUE[D_OUT];

/* xorshift64: the same numbers on every machine, unlike rand(). */
static uint64_t rng_next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static double rng_unit(uint64_t* s) { /* [-1, 1) */
  return (double)(rng_next(s) >> 11) / (double)(1ull << 52) - 1.0;
}

/* The generating map is fixed; each cluster's inputs have a scale and offset of their own (its
 * own data, never sent), with a little noise on the targets. */
static void make_data(uint32_t cluster) {
  uint64_t truth = 0x9e3779b97f4a7c15ull, own = 0x2545f4914f6cdd1dull + 7919ull * cluster;
  for (int i = 0; i < D_OUT; i++) {
    B_TRUE[i] = 0.5 * rng_unit(&truth);
    for (int j = 0; j < D_IN; j++) W_TRUE[i][j] = 0.5 * rng_unit(&truth);
  }
  double scale = 1.0 + 0.5 * cluster, shift = cluster % 2 ? -0.3 : 0.3;
  for (int n = 0; n < N_SHARD; n++) {
    for (int j = 0; j < D_IN; j++) X[n][j] = (float)(scale * rng_unit(&own) + shift);
    for (int i = 0; i < D_OUT; i++) {
      double v = B_TRUE[i];
      for (int j = 0; j < D_IN; j++) v += W_TRUE[i][j] * X[n][j];
      Y[n][i] = (float)(v + 0.01 * rng_unit(&own));
    }
  }
  /* a start of our own; the session replaces it with cluster 0's at start */
  for (int i = 0; i < D_OUT * D_IN; i++) W[i] = (float)(0.1 * rng_unit(&own));
  for (int i = 0; i < D_OUT; i++) B[i] = 0;
}

/* Mean squared error of (W, B) over the whole shard, in double. */
static double shard_loss(void) {
  double sum = 0;
  for (int n = 0; n < N_SHARD; n++)
    for (int i = 0; i < D_OUT; i++) {
      double e = B[i] - Y[n][i];
      for (int j = 0; j < D_IN; j++) e += (double)W[i * D_IN + j] * X[n][j];
      sum += e * e;
    }
  return sum / (N_SHARD * D_OUT);
}

/* The largest |theta - theta_true| over every weight: how close the fit is to the generator. */
static double max_error(void) {
  double m = 0;
  for (int i = 0; i < D_OUT; i++) {
    double e = B[i] - B_TRUE[i];
    if (e < 0) e = -e;
    if (e > m) m = e;
    for (int j = 0; j < D_IN; j++) {
      e = W[i * D_IN + j] - W_TRUE[i][j];
      if (e < 0) e = -e;
      if (e > m) m = e;
    }
  }
  return m;
}

/* One SGD step of the mean squared error on the batch that starts at sample `at`. */
static void sgd_step(int at) {
  float gw[D_OUT * D_IN] = {0}, gb[D_OUT] = {0};
  for (int k = 0; k < BATCH; k++) {
    int n = (at + k) % N_SHARD;
    for (int i = 0; i < D_OUT; i++) {
      float e = B[i] - Y[n][i];
      for (int j = 0; j < D_IN; j++) e += W[i * D_IN + j] * X[n][j];
      float g = 2.0f * e / (BATCH * D_OUT);
      gb[i] += g;
      for (int j = 0; j < D_IN; j++) gw[i * D_IN + j] += g * X[n][j];
    }
  }
  for (int i = 0; i < D_OUT * D_IN; i++) W[i] -= SGD_LR * gw[i];
  for (int i = 0; i < D_OUT; i++) B[i] -= SGD_LR * gb[i];
}

/* A whole decimal number in [lo, hi], or -1 with a message naming the option. */
static long parse_long(const char* opt, const char* text, long lo, long hi) {
  char* end;
  errno = 0;
  long v = text ? strtol(text, &end, 10) : 0;
  if (!text || !*text || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "two_cluster_regression: %s needs an integer in [%ld, %ld], got '%s'\n", opt,
            lo, hi, text ? text : "");
    return -1;
  }
  return v;
}

static int usage(void) {
  fprintf(stderr,
          "usage: two_cluster_regression [--rounds N] [--peer-timeout SECONDS]\n"
          "  the session comes from NEBULA_JOB_ID, NEBULA_CLUSTER_ID, NEBULA_CLUSTER_INDEX,\n"
          "  NEBULA_N_CLUSTERS, NEBULA_LISTEN, NEBULA_PEERS, NEBULA_PKI_DIR and\n"
          "  NEBULA_JOB_SECRET_FILE (examples/c/README.md)\n");
  return 2;
}

static int fail(const char* what) {
  fprintf(stderr, "two_cluster_regression: %s: %s\n", what, nb_error_last());
  return 1;
}

int main(int argc, char** argv) {
  long rounds = 15, peer_timeout = 30;
  for (int a = 1; a < argc; a++) {
    if (!strcmp(argv[a], "--rounds")) {
      if ((rounds = parse_long("--rounds", a + 1 < argc ? argv[++a] : NULL, 1, 100000)) < 0)
        return 2;
    } else if (!strcmp(argv[a], "--peer-timeout")) {
      if ((peer_timeout = parse_long("--peer-timeout", a + 1 < argc ? argv[++a] : NULL, 1, 86400)) <
          0)
        return 2;
    } else if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
      usage();
      return 0;
    } else {
      fprintf(stderr, "two_cluster_regression: unknown option '%s'\n", argv[a]);
      return usage();
    }
  }

  nb_session_options_t o;
  if (nb_session_options_from_env(&o) != NB_OK) return fail("environment");
  if (!o.job_id) {
    nb_session_options_free(&o);
    fprintf(stderr,
            "two_cluster_regression: NEBULA_JOB_ID is not set: run it under a launcher "
            "that describes the session, or through run_two_clusters.sh\n");
    return usage();
  }
  /* this example's defaults where the environment says nothing: a short round and a quarter
   * of the update per round suit a model of 68 weights (nebula's are for large models) */
  if (!getenv("NEBULA_INNER_STEPS")) o.inner_steps = 20;
  if (!getenv("NEBULA_DENSITY")) o.density = 0.25;
  if (!getenv("NEBULA_OUTER_LR")) o.outer_lr = 0.8f;
  if (!getenv("NEBULA_OUTER_MOMENTUM")) o.outer_momentum = 0.5f;
  /* the other cluster may be started this much later (two terminals, a slow launcher) */
  o.peer_timeout_s = (double)peer_timeout;
  long h = o.inner_steps;
  uint32_t me = o.cluster_index;
  char id[128];
  snprintf(id, sizeof id, "%s", o.cluster_id ? o.cluster_id : "?");

  nb_session_t* s = NULL;
  nb_status_t st = nb_session_open(&o, &s);
  uint32_t n_clusters = o.n_clusters;
  nb_session_options_free(&o); /* the session copied what it keeps */
  if (st != NB_OK) return fail("open");

  make_data(me);
  int64_t wshape[2] = {D_OUT, D_IN}, bshape[1] = {D_OUT};
  if (nb_session_register(s, "w", W, wshape, 2) != NB_OK ||
      nb_session_register(s, "b", B, bshape, 1) != NB_OK) {
    nb_session_close(s);
    return fail("register");
  }
  /* W and B hold cluster 0's values once start returns, on every cluster */
  if (nb_session_start(s) != NB_OK) {
    nb_session_close(s);
    return fail("start");
  }
  printf("cluster %s (%u of %u): %dx%d linear model, %d samples of its own, H=%ld, %ld rounds\n",
         id, me, n_clusters, D_OUT, D_IN, N_SHARD, h, rounds);
  printf("start    loss %.6f  max|theta-true| %.4f\n", shard_loss(), max_error());

  int at = 0;
  uint64_t sent = 0;
  for (long r = 0; r < rounds; r++) {
    for (long k = 0; k < h; k++, at = (at + BATCH) % N_SHARD) sgd_step(at);
    nb_session_round_t info;
    if (nb_session_round(s, (uint64_t)(h * BATCH), &info) != NB_OK) {
      nb_session_close(s);
      return fail("round");
    }
    sent += info.bytes_sent;
    /* W and B now hold theta_global */
    printf("round %3llu  loss %.6f  max|theta-true| %.4f  sent %llu B  theta %016llx\n",
           (unsigned long long)info.round, shard_loss(), max_error(),
           (unsigned long long)info.bytes_sent, (unsigned long long)info.global_hash);
    fflush(stdout);
  }
  /* a last hash-only exchange: the final round's result is compared across clusters too */
  if (nb_session_finish(s) != NB_OK) {
    nb_session_close(s);
    return fail("finish");
  }
  printf("final    loss %.6f  max|theta-true| %.4f  sent %llu B  theta_global %016llx\n",
         shard_loss(), max_error(), (unsigned long long)sent,
         (unsigned long long)nb_session_global_hash(s));
  nb_session_close(s);
  return 0;
}
