/* Adaptive density through the public API (nebula.h `adaptive`, docs/api.md "Adaptive
 * density"): two clusters on loopback, each moving its copy of one tensor by its own random step
 * per round; int8 values, error feedback.
 *   - capped: rate_mbit 4 per peer and 40 ms of the caller's "compute" between blocking rounds,
 *     256 Ki floats. A dense int8 frame (about 256 KiB) would take half a second at the cap, so
 *     the density falls from its initial 0.5 to what fits a tenth of the compute: below 0.05 from
 *     the second round on (the cap stands in for the link until it is measured), "fit" (or
 *     "floor_max_steps"), the last frame a tenth of the first's or less;
 *   - uncapped, overlapped rounds with 60 ms between round_begin and round_end, 128 Ki floats
 *     from density 0.5: a dense frame crosses loopback in well under the 54 ms it may fill, so
 *     the density rises to density_max, "ceiling";
 *   - adaptive off: "fixed", the density as given, no codec point;
 *   - values "auto" (whole codec points, api/codec_points.h) on the capped link with decaying
 *     error feedback: a sparse 2-bit point every round, each frame under a twentieth of a dense
 *     int8 one; uncapped and overlapped (512 Ki floats, 100 ms between begin and end):
 *     "dense-int8" at the ceiling;
 *   - bad settings refused naming the field.
 * Idle-link probes run every 100 ms (NB_LINK_PROBE_MS). Every round: both clusters hold the same
 * theta_global (their densities differ from round to
 * round: a frame says its own). The margins are orders of magnitude, so load does not decide. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "session_pair.h"

#define ROUNDS 6

typedef struct {
  int index, overlap, adaptive;
  size_t n;
  double rate_mbit, density, compute_s, ef_decay;
  const char* values; /* NULL: int8 */
  float* x;
  nb_session_t* s;
  nb_status_t st;
  char msg[512];
  nb_session_round_t r[ROUNDS];
} side_t;

static const uint8_t secret[32] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6,
                                   7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2};

static void sleep_s(double s) {
  struct timespec d = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&d, &d) != 0) {
  }
}

/* The caller's "training": a fixed random step of its own for every element. */
static void train(side_t* sd, uint64_t* seed) {
  for (size_t i = 0; i < sd->n; i++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    sd->x[i] += (float)((double)(*seed >> 40) / (double)(1ull << 24) - 0.5) * 1e-3f;
  }
  sleep_s(sd->compute_s);
}

static void side_open(side_t* sd, const char* job) {
  nb_session_options_t o;
  pair_options(&o, job, sd->index, secret);
  o.inner_steps = 10;
  o.density = sd->density;
  o.values = sd->values ? sd->values : "int8";
  if (sd->ef_decay > 0) o.error_feedback_decay = sd->ef_decay;
  o.adaptive = sd->adaptive;
  o.rate_mbit = sd->rate_mbit;
  assert_int_equal(nb_session_open(&o, &sd->s), NB_OK);
  sd->x = calloc(sd->n, sizeof(float));
  assert_non_null(sd->x);
  int64_t shape[1] = {(int64_t)sd->n};
  assert_int_equal(nb_session_register(sd->s, "x", sd->x, shape, 1), NB_OK);
}

static void* side_main(void* arg) {
  side_t* sd = arg;
  uint64_t seed = 77 + 1000003ull * (uint64_t)sd->index;
  nb_status_t st = nb_session_start(sd->s);
  for (int k = 0; st == NB_OK && k < ROUNDS; k++) {
    if (!sd->overlap) {
      train(sd, &seed);
      st = nb_session_round(sd->s, 10, &sd->r[k]);
    } else {
      st = nb_session_round_begin(sd->s, 10);
      if (st == NB_OK) train(sd, &seed); /* the steps the exchange hides under */
      if (st == NB_OK) st = nb_session_round_end(sd->s, &sd->r[k]);
    }
  }
  if (st == NB_OK) st = nb_session_finish(sd->s);
  sd->st = st;
  if (st != NB_OK) snprintf(sd->msg, sizeof sd->msg, "%s", nb_error_last());
  return NULL;
}

/* Both clusters as proto says (their index set here), run to the end; the hashes agree. */
static void run(side_t* sd, side_t proto, const char* job) {
  for (int c = 0; c < 2; c++) {
    sd[c] = proto;
    sd[c].index = c;
  }
  for (int c = 0; c < 2; c++) side_open(&sd[c], job);
  assert_int_equal(pair_connect(sd[0].s, sd[1].s), NB_OK);
  pthread_t th[2];
  for (int c = 0; c < 2; c++) assert_int_equal(pthread_create(&th[c], NULL, side_main, &sd[c]), 0);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++) {
    if (sd[c].st != NB_OK) fail_msg("cluster %d: %s", c, sd[c].msg);
    for (int k = 0; k < ROUNDS; k++) {
      const nb_session_round_t* r = &sd[c].r[k];
      printf("  %s round %d: density %.4f msg %llu B, goodput %.0f B/s -> next %.4f (%s%s%s)\n",
             c ? "west" : "east", k, r->density, (unsigned long long)r->msg_bytes, r->goodput_Bps,
             r->next_density, r->sched, r->point ? ", point " : "", r->point ? r->point : "");
    }
  }
  for (int k = 0; k < ROUNDS; k++) assert_true(sd[0].r[k].global_hash == sd[1].r[k].global_hash);
}

static void sides_close(side_t* sd) {
  for (int c = 0; c < 2; c++) {
    nb_session_close(sd[c].s);
    free(sd[c].x);
  }
}

static void test_capped_link(void** state) {
  (void)state;
  side_t sd[2];
  run(sd,
      (side_t){.adaptive = 1, .n = 256 * 1024, .rate_mbit = 4, .density = 0.5, .compute_s = 0.04},
      "adaptive-capped");
  for (int c = 0; c < 2; c++) {
    const nb_session_round_t* r = sd[c].r;
    assert_true(r[0].density == 0.5);
    for (int k = 1; k < ROUNDS; k++) {
      assert_true(r[k].density < 0.05);
      assert_true(strcmp(r[k].sched, "fit") == 0 || strcmp(r[k].sched, "floor_max_steps") == 0 ||
                  strcmp(r[k].sched, "hold") == 0);
    }
    assert_true(r[ROUNDS - 1].msg_bytes * 10 <= r[0].msg_bytes);
  }
  sides_close(sd);
}

static void test_fast_link_overlapped(void** state) {
  (void)state;
  side_t sd[2];
  run(sd, (side_t){.overlap = 1, .adaptive = 1, .n = 128 * 1024, .density = 0.5, .compute_s = 0.06},
      "adaptive-fast");
  for (int c = 0; c < 2; c++) {
    const nb_session_round_t* last = &sd[c].r[ROUNDS - 1];
    assert_true(last->density == 1.0);
    assert_string_equal(last->sched, "ceiling");
  }
  sides_close(sd);
}

static void test_fixed(void** state) {
  (void)state;
  side_t sd[2];
  run(sd, (side_t){.n = 4096, .density = 0.25, .compute_s = 0.001}, "adaptive-off");
  for (int c = 0; c < 2; c++)
    for (int k = 0; k < ROUNDS; k++) {
      assert_true(sd[c].r[k].density == 0.25 && sd[c].r[k].next_density == 0.25);
      assert_string_equal(sd[c].r[k].sched, "fixed");
      assert_null(sd[c].r[k].point);
    }
  sides_close(sd);
}

/* values "auto" on the capped link: the scheduler may only pick sparse 2-bit points (a dense
 * int8 frame of 256 Ki floats is 256 KiB, half a second at the cap); its H 8 table (the nearest
 * to our H 10) starts at the point of fewest bytes. */
static void test_auto_capped(void** state) {
  (void)state;
  side_t sd[2];
  run(sd,
      (side_t){.adaptive = 1,
               .values = "auto",
               .ef_decay = 0.85,
               .n = 256 * 1024,
               .rate_mbit = 4,
               .density = 0.5,
               .compute_s = 0.04},
      "auto-capped");
  for (int c = 0; c < 2; c++)
    for (int k = 0; k < ROUNDS; k++) {
      const nb_session_round_t* r = &sd[c].r[k];
      assert_non_null(r->point);
      assert_true(strncmp(r->point, "top", 3) == 0 && strstr(r->point, "-2bit"));
      assert_true(r->density < 0.05 && r->next_density < 0.05);
      assert_true(r->msg_bytes * 20 < 256 * 1024);
    }
  sides_close(sd);
}

/* values "auto" on an uncapped loopback link with overlapped rounds: the best point fits. 512 Ki
 * floats, so that even the first point's frame (about 6 KB) is long enough to time the link. */
static void test_auto_fast_overlapped(void** state) {
  (void)state;
  side_t sd[2];
  run(sd,
      (side_t){.overlap = 1,
               .adaptive = 1,
               .values = "auto",
               .n = 512 * 1024,
               .density = 0.5,
               .compute_s = 0.1},
      "auto-fast");
  for (int c = 0; c < 2; c++) {
    const nb_session_round_t* last = &sd[c].r[ROUNDS - 1];
    assert_string_equal(last->point, "dense-int8");
    assert_true(last->next_density == 1.0);
    assert_string_equal(last->sched, "ceiling");
  }
  sides_close(sd);
}

static void refused(void (*set)(nb_session_options_t*), const char* needle) {
  nb_session_options_t o;
  pair_options(&o, "adaptive-bad", 0, secret);
  set(&o);
  nb_session_t* s = NULL;
  nb_status_t st = nb_session_open(&o, &s);
  if (st != NB_ERR_CONFIG || !strstr(nb_error_last(), needle))
    fail_msg("expected NB_ERR_CONFIG naming %s, got %d: %s", needle, st, nb_error_last());
  assert_null(s);
}
static void bad_adaptive(nb_session_options_t* o) {
  o->adaptive = 2;
}
static void bad_min(nb_session_options_t* o) {
  o->adaptive = 1;
  o->density_min = 0.5;
  o->density_max = 0.1;
}
static void bad_max(nb_session_options_t* o) {
  o->density_max = 0;
}
static void bad_rate(nb_session_options_t* o) {
  o->rate_mbit = -1;
}

static void bad_auto(nb_session_options_t* o) {
  o->values = "auto"; /* without adaptive */
}
static void bad_decay(nb_session_options_t* o) {
  o->error_feedback_decay = 0;
}

static void test_bad_settings(void** state) {
  (void)state;
  refused(bad_auto, "auto");
  refused(bad_decay, "error_feedback_decay");
  refused(bad_adaptive, "adaptive");
  refused(bad_min, "density_min");
  refused(bad_max, "density_max");
  refused(bad_rate, "rate_mbit");
}

int main(void) {
  /* idle-link probes every 100 ms, not 2 s: the tests' rounds last a fraction of a second, and
   * a cluster whose frames are all too small to time a link learns its rate from them */
  setenv("NB_LINK_PROBE_MS", "100", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_settings), cmocka_unit_test(test_fixed),
      cmocka_unit_test(test_capped_link),  cmocka_unit_test(test_fast_link_overlapped),
      cmocka_unit_test(test_auto_capped),  cmocka_unit_test(test_auto_fast_overlapped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
