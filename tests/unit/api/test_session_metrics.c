/* The session's leader metrics (metrics_listen; docs/operations.md): two clusters over loopback,
 * east serving on 127.0.0.1:0, read with a plain socket client after each of two rounds (round,
 * step, WAN bytes both ways, density, peers, rounds applied, the caller's loss, the info line);
 * none without the option; a malformed address and a taken port refused by nb_session_open;
 * NEBULA_METRICS_LISTEN through nb_session_options_from_env. Through <nebula.h> only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <nebula.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "session_pair.h"

#define N 64
#define H 5
#define ROUNDS 2

typedef struct {
  int index;
  float theta[N];
  nb_session_t* s;
  nb_session_round_t rounds[ROUNDS];
  uint64_t sent; /* bytes_sent over the rounds */
  int rounds_done;
  int at_round;       /* the round east waits before (1-based): the main thread scrapes */
  pthread_mutex_t mu; /* east's pause between rounds, so that the main thread reads round 1 */
  pthread_cond_t cv;
  int go, paused;
  nb_status_t st;
  char msg[512];
} side_t;

/* GET /metrics from 127.0.0.1:port with a plain socket; the body (after the head) into buf. */
static int scrape(int port, char* buf, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr*)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
    close(fd);
    return -1;
  }
  static char raw[1 << 16];
  size_t n = 0;
  ssize_t k;
  while (n + 1 < sizeof raw && (k = read(fd, raw + n, sizeof raw - 1 - n)) > 0) n += (size_t)k;
  close(fd);
  raw[n] = 0;
  if (strncmp(raw, "HTTP/1.1 200 ", 13) != 0) return -1;
  const char* body = strstr(raw, "\r\n\r\n");
  if (!body) return -1;
  snprintf(buf, cap, "%s", body + 4);
  return 0;
}

/* The value of the exposition line "SERIES VALUE"; NAN when there is none. */
static double sample(const char* text, const char* series) {
  size_t len = strlen(series);
  for (const char* p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (!strncmp(p, series, len) && p[len] == ' ') return strtod(p + len + 1, NULL);
  return 0.0 / 0.0;
}

static void side_fail(side_t* sd, nb_status_t st) {
  sd->st = st;
  snprintf(sd->msg, sizeof sd->msg, "%s", nb_error_last());
}

/* Each round: a step of the cluster's own (every entry moved by its own amount), the caller's
 * loss, the round. East waits before round at_round until the main thread lets it go. */
static void* side_main(void* arg) {
  side_t* sd = arg;
  nb_status_t st = nb_session_start(sd->s);
  if (st != NB_OK) {
    side_fail(sd, st);
    return NULL;
  }
  for (int r = 1; r <= ROUNDS; r++) {
    if (r == sd->at_round) {
      pthread_mutex_lock(&sd->mu);
      sd->paused = 1;
      pthread_cond_broadcast(&sd->cv);
      while (!sd->go) pthread_cond_wait(&sd->cv, &sd->mu);
      pthread_mutex_unlock(&sd->mu);
    }
    for (int i = 0; i < N; i++) sd->theta[i] += 0.01f * (float)(i + 1) * (float)(sd->index + 1);
    st = nb_session_set_loss(sd->s, 3.0 - 0.5 * r);
    if (st == NB_OK) st = nb_session_round(sd->s, 8, &sd->rounds[r - 1]);
    if (st != NB_OK) {
      side_fail(sd, st);
      return NULL;
    }
    sd->sent += sd->rounds[r - 1].bytes_sent;
    sd->rounds_done = r;
  }
  st = nb_session_finish(sd->s);
  if (st != NB_OK) side_fail(sd, st);
  return NULL;
}

static void side_open(side_t* sd, int index, const uint8_t* secret, const char* metrics) {
  memset(sd, 0, sizeof *sd);
  sd->index = index;
  pthread_mutex_init(&sd->mu, NULL);
  pthread_cond_init(&sd->cv, NULL);
  for (int i = 0; i < N; i++) sd->theta[i] = 0.1f * (float)i;
  nb_session_options_t o;
  pair_options(&o, "metrics-job", index, secret);
  o.inner_steps = H;
  o.density = 0.25;
  o.metrics_listen = metrics;
  assert_int_equal(nb_session_open(&o, &sd->s), NB_OK);
  int64_t shape[1] = {N};
  assert_int_equal(nb_session_register(sd->s, "theta", sd->theta, shape, 1), NB_OK);
}

static void test_two_clusters_serve(void** state) {
  (void)state;
  static side_t sd[2];
  uint8_t secret[32];
  for (int i = 0; i < 32; i++) secret[i] = (uint8_t)(7 * i + 1);
  side_open(&sd[0], 0, secret, "127.0.0.1:0");
  side_open(&sd[1], 1, secret, NULL);
  assert_int_equal(nb_session_metrics_port(sd[1].s), -1); /* not asked for: none */
  int port = nb_session_metrics_port(sd[0].s);
  assert_true(port > 0);
  assert_int_equal(pair_connect(sd[0].s, sd[1].s), NB_OK);
  static char text[1 << 16];
  /* before any round: the info line, no round yet, held-out bpb NaN (the session has none) */
  assert_int_equal(scrape(port, text, sizeof text), 0);
  assert_non_null(
      strstr(text, "nebula_leader_info{job_name=\"metrics-job\",cluster=\"east\"} 1\n"));
  assert_true(sample(text, "nebula_leader_round") == 0);
  assert_non_null(strstr(text, "nebula_leader_eval_bpb NaN\n"));

  sd[0].at_round = 2; /* east stops before round 2: the figures of round 1 stand still */
  pthread_t th[2];
  for (int c = 0; c < 2; c++) assert_int_equal(pthread_create(&th[c], NULL, side_main, &sd[c]), 0);
  pthread_mutex_lock(&sd[0].mu);
  while (!sd[0].paused && sd[0].st == NB_OK) pthread_cond_wait(&sd[0].cv, &sd[0].mu);
  pthread_mutex_unlock(&sd[0].mu);
  int ok1 = sd[0].st == NB_OK && scrape(port, text, sizeof text) == 0;
  double r1 = ok1 ? sample(text, "nebula_leader_round") : -1;
  double s1 = ok1 ? sample(text, "nebula_leader_wan_sent_bytes_total") : -1;
  double l1 = ok1 ? sample(text, "nebula_leader_loss") : -1;
  pthread_mutex_lock(&sd[0].mu);
  sd[0].go = 1;
  pthread_cond_broadcast(&sd[0].cv);
  pthread_mutex_unlock(&sd[0].mu);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++)
    if (sd[c].st != NB_OK) fail_msg("cluster %d: %s", c, sd[c].msg);
  assert_true(ok1);
  assert_true(r1 == 1);
  assert_true(s1 == (double)sd[0].rounds[0].bytes_sent);
  assert_true(l1 == 2.5);

  /* after both rounds */
  assert_int_equal(scrape(port, text, sizeof text), 0);
  const nb_session_round_t* last = &sd[0].rounds[ROUNDS - 1];
  assert_true(sample(text, "nebula_leader_round") == ROUNDS);
  assert_true(sample(text, "nebula_leader_step") == ROUNDS * H);
  assert_true(sample(text, "nebula_leader_rounds_applied_total") == ROUNDS);
  assert_true(sample(text, "nebula_leader_rounds_skipped_total") == 0);
  assert_true(sample(text, "nebula_leader_rounds_late_total") == 0);
  assert_true(sample(text, "nebula_leader_peers") == 1);
  assert_true(sample(text, "nebula_leader_peers_alive") == 1);
  assert_true(sample(text, "nebula_leader_loss") == 2.0);
  assert_true(sample(text, "nebula_leader_density") == last->density);
  assert_true(sd[0].sent > 0);
  assert_true(sample(text, "nebula_leader_wan_sent_bytes_total") == (double)sd[0].sent);
  /* what east received is what west sent */
  assert_true(sample(text, "nebula_leader_wan_received_bytes_total") == (double)sd[1].sent);
  assert_true(sample(text, "nebula_leader_goodput_bytes_per_second") == last->goodput_Bps);
  assert_true(sample(text, "nebula_leader_rtt_seconds") == last->rtt_s);
  assert_true(sample(text, "nebula_leader_exchange_seconds_total") >= 0);
  for (int c = 0; c < 2; c++) {
    nb_session_close(sd[c].s);
    pthread_mutex_destroy(&sd[c].mu);
    pthread_cond_destroy(&sd[c].cv);
  }
  /* closed: nothing listens there any more */
  assert_int_not_equal(scrape(port, text, sizeof text), 0);
}

static void test_refused(void** state) {
  (void)state;
  nb_session_options_t o;
  pair_options(&o, "metrics-job", 0, NULL);
  o.n_clusters = 1;
  o.unsealed = 1;
  o.job_secret = NULL;
  nb_session_t* s = NULL;
  o.metrics_listen = "localhost"; /* no port */
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_INVALID);
  assert_null(s);
  assert_non_null(strstr(nb_error_last(), "metrics_listen"));
  /* a port that another endpoint holds */
  o.metrics_listen = "127.0.0.1:0";
  nb_session_t* first = NULL;
  assert_int_equal(nb_session_open(&o, &first), NB_OK);
  char taken[32];
  snprintf(taken, sizeof taken, "127.0.0.1:%d", nb_session_metrics_port(first));
  o.metrics_listen = taken;
  assert_int_equal(nb_session_open(&o, &s), NB_ERR_UNAVAILABLE);
  assert_null(s);
  assert_non_null(strstr(nb_error_last(), taken));
  /* a one-cluster session serves too: its round shows there, with no peers */
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  assert_int_equal(nb_session_register(first, "x", x, shape, 1), NB_OK);
  assert_int_equal(nb_session_start(first), NB_OK);
  assert_int_equal(nb_session_round(first, 1, NULL), NB_OK);
  static char text[1 << 16];
  assert_int_equal(scrape(nb_session_metrics_port(first), text, sizeof text), 0);
  assert_true(sample(text, "nebula_leader_round") == 1);
  assert_true(sample(text, "nebula_leader_peers") == 0);
  nb_session_close(first);
  assert_int_equal(nb_session_metrics_port(NULL), -1);
}

static void test_from_env(void** state) {
  (void)state;
  setenv("NEBULA_METRICS_LISTEN", "127.0.0.1:9465", 1);
  nb_session_options_t o;
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_string_equal(o.metrics_listen, "127.0.0.1:9465");
  nb_session_options_free(&o);
  assert_null(o.metrics_listen);
  unsetenv("NEBULA_METRICS_LISTEN");
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_null(o.metrics_listen); /* the default: none */
  nb_session_options_free(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_clusters_serve),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_from_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
