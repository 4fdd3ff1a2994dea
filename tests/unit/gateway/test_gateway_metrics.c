/* The gateway's Prometheus metrics (metrics.listen): the config checks, the figures a scrape of
 * GET /metrics shows after real submits over mutual TLS (accepted, refused by the ACL, by a bad
 * signature, by an unreachable peer), and Debian's own prometheus server scraping the gateway on
 * loopback every second, together with a cluster leader's endpoint (train/leader_metrics.c, built
 * in here: it stands on common/ only), read back through its HTTP query API. The last test skips
 * when no `prometheus` binary is installed (scripts/setup.sh installs it). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "gateway/gateway.h"
#include "inter/rpc.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/tls.h"
#include "tests/lib/gw_testlib.h"
#include "train/leader_metrics.h"

static char g_dir[256];
static nb_gateway_config_t g_cfg;

static const char* g_base_cfg =
    "{\"cluster_id\": \"dc-a\", \"listen\": \"%s\",\n"
    " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"dc-a.crt\", \"key\": \"dc-a.key\"},\n"
    " \"peers\": {\"dc-b\": \"127.0.0.1:%d\"}, \"launcher\": \"local\",\n"
    " \"command\": [\"/bin/sh\", \"-c\", \"exit 0\"],\n"
    " \"resources\": {\"slots\": 4}, \"work_dir\": \"work\", \"federation_timeout_ms\": 2000,\n"
    " \"acl\": [{\"user\": \"alice\", \"clusters\": [\"dc-a\", \"dc-b\"], \"max_workers\": 1}],\n"
    " \"poll_ms\": 20%s}";

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_gwm");
  const char* clusters[] = {"dc-a"};
  const char* users[] = {"alice", "mallory"};
  gwt_make_pki(g_dir, clusters, 1, users, 2, NULL, NULL);
  char cfg[4096];
  snprintf(cfg, sizeof cfg, g_base_cfg, "127.0.0.1:0", gwt_free_port(),
           ", \"metrics\": {\"listen\": \"127.0.0.1:0\"}");
  gwt_parse_config(g_dir, cfg, &g_cfg);
  assert_string_equal(g_cfg.metrics_listen, "127.0.0.1:0");
  return 0;
}

static int teardown(void** state) {
  (void)state;
  gwt_reap();
  gwt_remove_dir(g_dir);
  return 0;
}

static const char* doc_one =
    "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": \"%s\"},"
    " \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"workers\": 1, \"data\": {\"languages\": "
    "[\"en\"]}}]}}";
static const char* doc_two =
    "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": \"%s\"},"
    " \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"workers\": 1, \"data\": {\"languages\": "
    "[\"en\"]}}, {\"id\": \"dc-b\", \"workers\": 1, \"data\": {\"languages\": [\"en\"]}}]}}";

/* Submits doc signed by signer (tamper: flip a byte after signing); the job id into id. */
static nb_status_t submit(int port, const char* signer, const char* doc, int tamper, char* id,
                          size_t cap) {
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, signer, port, &tls);
  nb_status_t st = gwt_submit_id(cli, g_dir, signer, doc, tamper, 20000, id, cap);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  return st;
}

/* GET path from 127.0.0.1:port over plain HTTP; the body (caller frees), *status the code. */
static char* http_get(int port, const char* path, int* status) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  *status = 0;
  if (connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0) {
    close(fd);
    return NULL;
  }
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char req[2048];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
  assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
  size_t cap = 1 << 16, len = 0;
  char* b = malloc(cap);
  for (;;) {
    if (len + 1 == cap) b = realloc(b, cap *= 2);
    ssize_t r = recv(fd, b + len, cap - 1 - len, 0);
    if (r <= 0) break;
    len += (size_t)r;
  }
  b[len] = 0;
  close(fd);
  char* body = strstr(b, "\r\n\r\n");
  if (strncmp(b, "HTTP/1.", 7) || !body) {
    free(b);
    return NULL;
  }
  *status = atoi(b + 9);
  char* out = strdup(body + 4);
  free(b);
  return out;
}

/* The value of the exposition line `series VALUE`, -1 when absent. */
static double sample(const char* text, const char* series) {
  size_t n = strlen(series);
  for (const char* l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, series, n) && l[n] == ' ') return strtod(l + n + 1, NULL);
  return -1;
}

/* g_cfg with a work_dir of its own: each test starts from an empty job store. */
static nb_gateway_config_t cfg_in(const char* sub) {
  nb_gateway_config_t c = g_cfg;
  snprintf(c.work_dir, sizeof c.work_dir, "%s/%s", g_dir, sub);
  c.store_path[0] = 0;
  return c;
}

static char* scrape(nb_gateway_t* gw) {
  int status = 0;
  char* t = http_get(nb_gateway_metrics_port(gw), "/metrics", &status);
  assert_non_null(t);
  assert_int_equal(status, 200);
  return t;
}

static void wait_jobs(nb_gateway_t* gw, const char* series, double want) {
  for (int i = 0; i < 1000; i++) {
    char* t = scrape(gw);
    double v = sample(t, series);
    free(t);
    if (v == want) return;
    nb_sleep_ns(20000000);
  }
  fail_msg("%s never reached %g", series, want);
}

static void test_config(void** state) {
  (void)state;
  struct {
    const char* metrics;
    const char* expect;
    const char* listen; /* NULL: 127.0.0.1:0 */
  } bad[] = {
      {", \"metrics\": {\"listen\": 9464}", "metrics.listen: expected a string", NULL},
      {", \"metrics\": {\"listen\": \"9464\"}", "metrics.listen", NULL},
      {", \"metrics\": {\"listen\": \"127.0.0.1:99999\"}", "metrics.listen", NULL},
      {", \"metrics\": {\"listen\": \"unix:/tmp/m.sock\"}", "not a unix: socket", NULL},
      {", \"metrics\": {\"listen\": \"127.0.0.1:7070\"}", "the Gateway service's own address",
       "127.0.0.1:7070"},
      {", \"metrics\": {\"port\": 1}", "metrics.port: unknown key", NULL},
      {", \"metrics\": \"127.0.0.1:9464\"", "metrics: expected an object", NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char cfg[4096];
    snprintf(cfg, sizeof cfg, g_base_cfg, bad[i].listen ? bad[i].listen : "127.0.0.1:0", 7999,
             bad[i].metrics);
    nb_gateway_config_t c;
    nb_gateway_config_defaults(&c);
    assert_int_equal(nb_gateway_config_parse(cfg, strlen(cfg), g_dir, &c), NB_ERR_CONFIG);
    if (!strstr(nb_error_last(), bad[i].expect))
      fail_msg("case %zu: '%s' does not name '%s'", i, nb_error_last(), bad[i].expect);
  }
  /* absent: off */
  char cfg[4096];
  snprintf(cfg, sizeof cfg, g_base_cfg, "127.0.0.1:0", 7999, "");
  nb_gateway_config_t c;
  nb_gateway_config_defaults(&c);
  assert_int_equal(nb_gateway_config_parse(cfg, strlen(cfg), g_dir, &c), NB_OK);
  assert_string_equal(c.metrics_listen, "");
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&c, &gw), NB_OK);
  assert_int_equal(nb_gateway_metrics_port(gw), 0);
  nb_gateway_destroy(gw);
  /* an address in use: the gateway does not start, and says which setting */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  assert_int_equal(bind(fd, (struct sockaddr*)&sa, sizeof sa), 0);
  assert_int_equal(listen(fd, 1), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr*)&sa, &sl), 0);
  snprintf(c.metrics_listen, sizeof c.metrics_listen, "127.0.0.1:%d", ntohs(sa.sin_port));
  gw = NULL;
  assert_int_equal(nb_gateway_create(&c, &gw), NB_ERR_UNAVAILABLE);
  assert_null(gw);
  assert_non_null(strstr(nb_error_last(), "metrics.listen"));
  close(fd);
  /* --help lists it */
  char* help = NULL;
  size_t hl = 0;
  FILE* m = open_memstream(&help, &hl);
  nb_gateway_config_help(m);
  fclose(m);
  assert_non_null(strstr(help, "metrics.listen"));
  free(help);
}

/* The submits of the scrape tests: one accepted (runs and succeeds), one refused by the ACL,
 * one with a bad signature, one naming a peer that is down, one whose descriptor is invalid. */
static void submit_mix(nb_gateway_t* gw) {
  int port = nb_gateway_port(gw);
  char doc[1024], id[128];
  snprintf(doc, sizeof doc, doc_one, "ok");
  assert_int_equal(submit(port, "alice", doc, 0, id, sizeof id), NB_OK);
  assert_int_equal(submit(port, "mallory", doc, 0, NULL, 0), NB_ERR_PERMISSION);
  assert_int_equal(submit(port, "alice", doc, 1, NULL, 0), NB_ERR_PERMISSION);
  snprintf(doc, sizeof doc, doc_two, "fed");
  assert_int_not_equal(submit(port, "alice", doc, 0, NULL, 0), NB_OK);
  snprintf(doc, sizeof doc, doc_one, "Not A Name!");
  assert_int_equal(submit(port, "alice", doc, 0, NULL, 0), NB_ERR_INVALID);
}

static void test_scrape(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  nb_gateway_config_t c = cfg_in("work-scrape");
  assert_int_equal(nb_gateway_create(&c, &gw), NB_OK);
  assert_true(nb_gateway_metrics_port(gw) > 0);
  char* t = scrape(gw);
  assert_non_null(strstr(t, "# TYPE nebula_gateway_submissions_total counter\n"));
  assert_non_null(strstr(t, "# TYPE nebula_gateway_jobs gauge\n"));
  assert_true(
      sample(t, "nebula_gateway_info{cluster=\"dc-a\",version=\"" NB_VERSION_STRING "\"}") == 1);
  assert_true(sample(t, "nebula_gateway_submissions_total") == 0);
  assert_true(sample(t, "nebula_gateway_jobs{state=\"running\"}") == 0);
  assert_true(sample(t, "nebula_gateway_slots") == 4);
  assert_true(sample(t, "nebula_gateway_artifact_bytes_total{direction=\"in\"}") == 0);
  assert_true(sample(t, "nebula_gateway_artifact_bytes_total{direction=\"out\"}") == 0);
  free(t);
  int status = 0;
  t = http_get(nb_gateway_metrics_port(gw), "/", &status);
  assert_int_equal(status, 404);
  free(t);

  submit_mix(gw);
  wait_jobs(gw, "nebula_gateway_jobs{state=\"succeeded\"}", 1);
  t = scrape(gw);
  assert_true(sample(t, "nebula_gateway_submissions_total") == 5);
  assert_true(sample(t, "nebula_gateway_refusals_total{reason=\"descriptor\"}") == 1);
  assert_true(sample(t, "nebula_gateway_refusals_total{reason=\"acl\"}") == 1);
  assert_true(sample(t, "nebula_gateway_refusals_total{reason=\"signature\"}") == 1);
  assert_true(sample(t, "nebula_gateway_refusals_total{reason=\"federation\"}") == 1);
  assert_true(sample(t, "nebula_gateway_refusals_total{reason=\"slots\"}") == -1); /* none */
  /* the federated job failed here when its Propose could not reach dc-b */
  assert_true(sample(t, "nebula_gateway_jobs{state=\"failed\"}") == 1);
  assert_true(sample(t,
                     "nebula_gateway_federation_calls_total{method=\"Propose\","
                     "outcome=\"unavailable\"}") >= 1);
  assert_true(sample(t, "nebula_gateway_active_jobs") == 0);
  assert_true(sample(t, "nebula_gateway_slots_used") == 0);
  free(t);
  nb_gateway_destroy(gw);
}

/* ---- Debian's prometheus server scraping the gateway ---- */

static int find_prometheus(char* path, size_t cap) {
  const char* env = getenv("NB_PROMETHEUS");
  if (env && *env) {
    snprintf(path, cap, "%s", env);
    return access(path, X_OK) == 0;
  }
  const char* pathv = getenv("PATH");
  char dirs[4096];
  snprintf(dirs, sizeof dirs, "%s:/usr/bin:/usr/sbin", pathv ? pathv : "");
  for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    snprintf(path, cap, "%s/prometheus", d);
    if (access(path, X_OK) == 0) return 1;
  }
  return 0;
}

/* The value of the first sample of an instant query, -1 when there is none (yet). */
static double prom_query(int port, const char* query) {
  char path[1024] = "/api/v1/query?query=";
  size_t o = strlen(path);
  for (const unsigned char* c = (const unsigned char*)query; *c && o + 4 < sizeof path; c++) {
    if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
        *c == '_')
      path[o++] = (char)*c;
    else
      o += (size_t)snprintf(path + o, sizeof path - o, "%%%02X", *c);
  }
  path[o] = 0;
  int status = 0;
  char* body = http_get(port, path, &status);
  if (!body || status != 200) {
    free(body);
    return -1;
  }
  json_error_t je;
  json_t* root = json_loads(body, 0, &je);
  free(body);
  double v = -1;
  json_t* res = json_object_get(json_object_get(root, "data"), "result");
  json_t* val = json_object_get(json_array_get(res, 0), "value");
  const char* s = json_string_value(json_array_get(val, 1));
  if (s) v = strtod(s, NULL);
  json_decref(root);
  return v;
}

static void test_prometheus(void** state) {
  (void)state;
  char bin[1024];
  if (!find_prometheus(bin, sizeof bin)) {
    fprintf(stderr, "no prometheus binary (apt install prometheus, or NB_PROMETHEUS): skipped\n");
    skip();
  }
  nb_gateway_t* gw = NULL;
  nb_gateway_config_t c = cfg_in("work-prometheus");
  assert_int_equal(nb_gateway_create(&c, &gw), NB_OK);
  /* a leader after two rounds and an evaluation; its job name needs escaping */
  nb_prom_t* leader = NULL;
  assert_int_equal(nb_leader_metrics_start("127.0.0.1:0", "tiny \"job\"\\x", "dc-a", &leader),
                   NB_OK);
  nb_leader_figures_t fig = {.round = 2,
                             .rounds = 8,
                             .step = 8,
                             .max_steps = 32,
                             .loss = 3.25,
                             .density = 0.02,
                             .wan_sent = 2500,
                             .wan_received = 2000,
                             .peers = 2,
                             .peers_alive = 1,
                             .applied = 1,
                             .skipped = 1};
  nb_leader_metrics_round(leader, &fig);
  nb_leader_metrics_eval(leader, 2, 2.75);
  char dir[512], yml[600], tsdb[600], log[600];
  snprintf(dir, sizeof dir, "%s/prometheus", g_dir);
  assert_int_equal(mkdir(dir, 0700), 0);
  snprintf(yml, sizeof yml, "%s/prometheus.yml", dir);
  snprintf(tsdb, sizeof tsdb, "%s/tsdb", dir);
  snprintf(log, sizeof log, "%s/prometheus.log", dir);
  FILE* f = fopen(yml, "w");
  assert_non_null(f);
  fprintf(f,
          "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
          "scrape_configs:\n  - job_name: nebula-gateway\n    static_configs:\n"
          "      - targets: ['127.0.0.1:%d']\n"
          "  - job_name: nebula-leader\n    static_configs:\n"
          "      - targets: ['127.0.0.1:%d']\n",
          nb_gateway_metrics_port(gw), nb_prom_port(leader));
  fclose(f);
  int pport = gwt_free_port();
  char listen_arg[64], cfg_arg[700], tsdb_arg[700];
  snprintf(listen_arg, sizeof listen_arg, "--web.listen-address=127.0.0.1:%d", pport);
  snprintf(cfg_arg, sizeof cfg_arg, "--config.file=%s", yml);
  snprintf(tsdb_arg, sizeof tsdb_arg, "--storage.tsdb.path=%s", tsdb);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    FILE* lf = freopen(log, "w", stderr);
    (void)lf;
    dup2(2, 1);
    execl(bin, bin, cfg_arg, tsdb_arg, listen_arg, "--log.level=warn", (char*)NULL);
    _exit(127);
  }
  submit_mix(gw);
  wait_jobs(gw, "nebula_gateway_jobs{state=\"succeeded\"}", 1);
  /* what prometheus has scraped, once it has: a generous deadline, no timing asserted */
  struct {
    const char* q;
    double want;
    double got;
  } want[] = {
      {"up{job=\"nebula-gateway\"}", 1, -1},
      {"nebula_gateway_submissions_total{job=\"nebula-gateway\"}", 5, -1},
      {"nebula_gateway_refusals_total{reason=\"acl\"}", 1, -1},
      {"nebula_gateway_refusals_total{reason=\"signature\"}", 1, -1},
      {"nebula_gateway_jobs{state=\"succeeded\"}", 1, -1},
      {"nebula_gateway_info{cluster=\"dc-a\"}", 1, -1},
      {"sum(nebula_gateway_federation_calls_total{method=\"Propose\"}) > 0", -2, -1},
      {"up{job=\"nebula-leader\"}", 1, -1},
      {"nebula_leader_info{job_name=\"tiny \\\"job\\\"\\\\x\",cluster=\"dc-a\"}", 1, -1},
      {"nebula_leader_round", 2, -1},
      {"nebula_leader_wan_sent_bytes_total", 2500, -1},
      {"nebula_leader_wan_received_bytes_total", 2000, -1},
      {"nebula_leader_eval_bpb", 2.75, -1},
      {"nebula_leader_peers - nebula_leader_peers_alive", 1, -1},
      {"nebula_leader_rounds_skipped_total", 1, -1},
  };
  size_t nw = sizeof want / sizeof *want, ok = 0;
  double deadline = nb_now_s() + 90;
  int exited = 0;
  while (ok < nw && nb_now_s() < deadline) {
    int wst;
    if (waitpid(pid, &wst, WNOHANG) == pid) {
      exited = 1;
      break;
    }
    ok = 0;
    for (size_t i = 0; i < nw; i++) {
      want[i].got = prom_query(pport, want[i].q);
      ok += want[i].want == -2 ? want[i].got > 0 : want[i].got == want[i].want;
    }
    if (ok < nw) nb_sleep_ns(250000000);
  }
  if (!exited) {
    kill(pid, SIGTERM);
    int wst, gone = 0;
    for (int i = 0; i < 200 && !gone; i++) {
      gone = waitpid(pid, &wst, WNOHANG) == pid;
      if (!gone) nb_sleep_ns(50000000);
    }
    if (!gone) {
      kill(pid, SIGKILL);
      waitpid(pid, &wst, 0);
    }
  }
  nb_gateway_destroy(gw);
  nb_prom_destroy(leader);
  if (ok < nw) {
    for (size_t i = 0; i < nw; i++)
      fprintf(stderr, "  %s = %g (want %g)\n", want[i].q, want[i].got, want[i].want);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "tail -n 20 '%s' >&2", log);
    if (system(cmd)) {
    }
    fail_msg("prometheus %s the expected values", exited ? "exited before reading" : "never read");
  }
  fprintf(stderr, "prometheus scraped the gateway: %zu queries matched\n", nw);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_scrape),
      cmocka_unit_test(test_prometheus),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
