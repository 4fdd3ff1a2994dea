/* train/leader_metrics.h: a leader's endpoint on 127.0.0.1:0 read by a socket client before any
 * round (info, NaN held-out bpb), after two rounds and an evaluation (every figure where it
 * belongs, counters as totals), and its refusals (a bad address, a port in use). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "train/leader_metrics.h"

static char* scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr*)&sa, sizeof sa), 0);
  const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_int_equal(send(fd, req, sizeof req - 1, 0), (ssize_t)(sizeof req - 1));
  size_t cap = 1 << 16, n = 0;
  char* b = malloc(cap);
  assert_non_null(b);
  for (ssize_t r; n + 1 < cap && (r = recv(fd, b + n, cap - 1 - n, 0)) > 0;) n += (size_t)r;
  b[n] = 0;
  close(fd);
  assert_non_null(strstr(b, "HTTP/1.1 200 OK\r\n"));
  return b;
}

static double sample(const char* text, const char* series) {
  size_t n = strlen(series);
  for (const char* l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, series, n) && l[n] == ' ') return strtod(l + n + 1, NULL);
  fail_msg("no sample %s in\n%s", series, text);
  return 0;
}

static void test_rounds(void** state) {
  (void)state;
  nb_prom_t* p = NULL;
  assert_int_equal(nb_leader_metrics_start("127.0.0.1:0", "tiny \"job\"", "dc-a", &p), NB_OK);
  int port = nb_prom_port(p);
  assert_true(port > 0);
  char* t = scrape(port);
  assert_true(sample(t, "nebula_leader_info{job_name=\"tiny \\\"job\\\"\",cluster=\"dc-a\"}") == 1);
  assert_true(isnan(sample(t, "nebula_leader_eval_bpb")));
  assert_true(sample(t, "nebula_leader_round") == 0);
  assert_non_null(strstr(t, "# TYPE nebula_leader_wan_sent_bytes_total counter\n"));
  assert_non_null(strstr(t, "# TYPE nebula_leader_loss gauge\n"));
  free(t);

  nb_leader_figures_t f = {.round = 1,
                           .rounds = 8,
                           .step = 4,
                           .max_steps = 32,
                           .loss = 3.5,
                           .density = 0.01,
                           .wan_sent = 1000,
                           .wan_received = 900,
                           .goodput_Bps = 12.5e6,
                           .rtt_s = 0.05,
                           .peers = 2,
                           .peers_alive = 2,
                           .applied = 1,
                           .compute_s = 1.25,
                           .exchange_s = 0.5};
  nb_leader_metrics_round(p, &f);
  f.round = 2, f.step = 8, f.loss = 3.25, f.wan_sent = 2500, f.wan_received = 2000;
  f.peers_alive = 1, f.skipped = 1, f.late = 1, f.density = 0.02;
  nb_leader_metrics_round(p, &f);
  nb_leader_metrics_eval(p, 2, 2.75);
  nb_leader_metrics_round(NULL, &f); /* off: nothing */
  nb_leader_metrics_eval(NULL, 2, 1);
  t = scrape(port);
  struct {
    const char* s;
    double v;
  } want[] = {
      {"nebula_leader_round", 2},
      {"nebula_leader_rounds", 8},
      {"nebula_leader_step", 8},
      {"nebula_leader_max_steps", 32},
      {"nebula_leader_loss", 3.25},
      {"nebula_leader_eval_bpb", 2.75},
      {"nebula_leader_eval_round", 2},
      {"nebula_leader_wan_sent_bytes_total", 2500},
      {"nebula_leader_wan_received_bytes_total", 2000},
      {"nebula_leader_goodput_bytes_per_second", 12.5e6},
      {"nebula_leader_rtt_seconds", 0.05},
      {"nebula_leader_density", 0.02},
      {"nebula_leader_peers", 2},
      {"nebula_leader_peers_alive", 1},
      {"nebula_leader_rounds_applied_total", 1},
      {"nebula_leader_rounds_skipped_total", 1},
      {"nebula_leader_rounds_late_total", 1},
      {"nebula_leader_compute_seconds_total", 1.25},
      {"nebula_leader_exchange_seconds_total", 0.5},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    if (sample(t, want[i].s) != want[i].v)
      fail_msg("%s = %.17g, want %.17g", want[i].s, sample(t, want[i].s), want[i].v);
  free(t);
  nb_prom_destroy(p);
}

static void test_refusals(void** state) {
  (void)state;
  nb_prom_t* p = NULL;
  assert_int_equal(nb_leader_metrics_start("localhost", "j", "dc-a", &p), NB_ERR_INVALID);
  assert_null(p);
  assert_non_null(strstr(nb_error_last(), "expected HOST:PORT"));
  assert_int_equal(nb_leader_metrics_start(NULL, "j", "dc-a", &p), NB_ERR_INVALID);
  assert_int_equal(nb_leader_metrics_start(":0", "j", "dc-a", &p), NB_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", nb_prom_port(p));
  nb_prom_t* q = NULL;
  assert_int_equal(nb_leader_metrics_start(addr, "j", "dc-b", &q), NB_ERR_UNAVAILABLE);
  assert_null(q);
  nb_prom_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounds),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
