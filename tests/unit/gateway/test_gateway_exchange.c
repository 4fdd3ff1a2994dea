/* Where a job's Exchange listens and what peers are told: two gateways peered on loopback, each
 * with exchange.port_range and exchange.advertise, run a two-cluster job whose worker_command
 * only writes the words it was given. Each cluster's {listen} is exchange_host with a port of
 * its own range, and the other cluster is named to it as its advertise host with the port of
 * that one's range; a range whose every port is taken refuses the submit naming the key. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "gateway/gateway.h"
#include "inter/rpc.h"
#include "tests/lib/gw_testlib.h"

#define RANGE 3

static char g_dir[256];
static int g_port[2];
static int g_lo[2]; /* each gateway's exchange.port_range is g_lo .. g_lo + RANGE - 1 */
static nb_gateway_config_t g_cfg[2];
static nb_gateway_t* g_gw[2];
static const char* g_ids[2] = {"dc-a", "dc-b"};
static const char* g_adv[2] = {"gw-a.example.test", "gw-b.example.test"};

/* RANGE consecutive loopback ports free now, holding none of avoid[0..n) (0s ignored). */
static int free_range(const int* avoid, int n) {
  for (int tries = 0; tries < 200; tries++) {
    int lo = gwt_free_port(), clash = 0;
    for (int i = 0; i < n; i++) clash |= avoid[i] >= lo && avoid[i] < lo + RANGE;
    if (lo + RANGE > 65535 || clash) continue;
    int ok = 1;
    for (int p = lo; p < lo + RANGE && ok; p++) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in a = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)p),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
      ok = bind(fd, (struct sockaddr*)&a, sizeof a) == 0;
      close(fd);
    }
    if (ok) return lo;
  }
  fail_msg("no %d consecutive free loopback ports", RANGE);
  return 0;
}

static void make_config(int i) {
  if (i == 0) { /* the ranges avoid the gateways' own ports, known now, and each other */
    int avoid[2 + RANGE] = {g_port[0], g_port[1]};
    g_lo[0] = free_range(avoid, 2);
    for (int k = 0; k < RANGE; k++) avoid[2 + k] = g_lo[0] + k;
    g_lo[1] = free_range(avoid, 2 + RANGE);
  }
  char cfg[4096];
  snprintf(cfg, sizeof cfg,
           "{\"cluster_id\": \"%s\", \"listen\": \"127.0.0.1:%d\",\n"
           " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"%s.crt\", \"key\": \"%s.key\"},\n"
           " \"peers\": {\"%s\": \"127.0.0.1:%d\"},\n"
           " \"command\": [\"/bin/true\"],\n"
           " \"worker_command\": [\"/bin/sh\", \"-c\", \"printf '%%s\\\\n' \\\"$@\\\" > words\",\n"
           "                     \"sh\", \"{listen}\", \"{peers}\"],\n"
           " \"exchange_host\": \"127.0.0.1\",\n"
           " \"exchange\": {\"port_range\": \"%d-%d\", \"advertise\": \"%s\"},\n"
           " \"resources\": {\"slots\": 4}, \"work_dir\": \"work-%s\",\n"
           " \"acl\": [{\"user\": \"alice\"}],\n"
           " \"federation_timeout_ms\": 5000, \"cancel_grace_ms\": 500, \"poll_ms\": 20}",
           g_ids[i], g_port[i], g_ids[i], g_ids[i], g_ids[1 - i], g_port[1 - i], g_lo[i],
           g_lo[i] + RANGE - 1, g_adv[i], g_ids[i]);
  gwt_parse_config(g_dir, cfg, &g_cfg[i]);
}

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_gwx");
  const char* clusters[] = {"dc-a", "dc-b"};
  const char* users[] = {"alice"};
  gwt_make_pki(g_dir, clusters, 2, users, 1, NULL, NULL);
  gwt_start_pair(g_port, g_cfg, g_gw, make_config);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  gwt_stop_pair(g_gw);
  gwt_reap();
  gwt_remove_dir(g_dir);
  return 0;
}

static const char* g_doc =
    "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
    "\"%s\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"workers\": 1, \"data\": "
    "{\"languages\": [\"en\"]}}, {\"id\": \"dc-b\", \"workers\": 1, \"data\": {\"languages\": "
    "[\"en\"]}}]}}";

/* The words cluster i's worker_command got: {listen}, then --peer ID=ADDR. */
static void read_words(int i, const char* id, char words[3][256]) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s/words", g_cfg[i].work_dir, id);
  FILE* f = fopen(p, "r");
  assert_non_null(f);
  for (int k = 0; k < 3; k++) {
    assert_non_null(fgets(words[k], 256, f));
    words[k][strcspn(words[k], "\n")] = 0;
  }
  fclose(f);
}

static int port_of(const char* addr) {
  const char* c = strrchr(addr, ':');
  assert_non_null(c);
  return atoi(c + 1);
}

static void run_job(nb_rpc_client_t* cli, const char* name, int ports[2]) {
  char doc[1024], id[128];
  snprintf(doc, sizeof doc, g_doc, name);
  assert_int_equal(gwt_submit_id(cli, g_dir, "alice", doc, 0, 30000, id, sizeof id), NB_OK);
  for (int i = 0; i < 2; i++) gwt_wait_state(&g_cfg[i], id, NB_JOB_SUCCEEDED, 30);
  char w[2][3][256];
  for (int i = 0; i < 2; i++) read_words(i, id, w[i]);
  for (int i = 0; i < 2; i++) {
    /* binds exchange_host with a port of its own range */
    assert_true(!strncmp(w[i][0], "127.0.0.1:", 10));
    ports[i] = port_of(w[i][0]);
    assert_in_range(ports[i], g_lo[i], g_lo[i] + RANGE - 1);
    /* is told the other's advertise host, with the port the other binds */
    assert_string_equal(w[i][1], "--peer");
    char want[256];
    snprintf(want, sizeof want, "%s=%s:", g_ids[1 - i], g_adv[1 - i]);
    assert_true(!strncmp(w[i][2], want, strlen(want)));
  }
  for (int i = 0; i < 2; i++) assert_int_equal(port_of(w[i][2]), ports[1 - i]);
}

/* Three jobs in a row: every port inside its cluster's range, the peers told the advertised
 * address; the round robin gives the next job the next port. */
static void test_ports_in_range_and_advertised(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, "alice", g_port[0], &tls);
  int first[2], second[2];
  run_job(cli, "xa", first);
  run_job(cli, "xb", second);
  for (int i = 0; i < 2; i++) assert_int_not_equal(first[i], second[i]);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* Every port of dc-a's range held by a listener: the submit is refused, the message naming
 * exchange.port_range; once they are closed the range serves again. */
static void test_range_exhausted(void** state) {
  (void)state;
  int fds[RANGE];
  for (int k = 0; k < RANGE; k++) {
    fds[k] = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fds[k], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)(g_lo[0] + k)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fds[k], (struct sockaddr*)&a, sizeof a), 0);
    assert_int_equal(listen(fds[k], 1), 0);
  }
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, "alice", g_port[0], &tls);
  char doc[1024], id[128] = "";
  snprintf(doc, sizeof doc, g_doc, "xfull");
  nb_status_t s = gwt_submit_id(cli, g_dir, "alice", doc, 0, 30000, id, sizeof id);
  assert_int_equal(s, NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(nb_error_last(), "exchange.port_range"));
  assert_non_null(strstr(nb_error_last(), "all 3 ports are taken"));
  for (int k = 0; k < RANGE; k++) close(fds[k]);
  int ports[2];
  run_job(cli, "xfree", ports);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* The keys are checked: bad values refused naming the key. */
static void test_config_refused(void** state) {
  (void)state;
  const char* base =
      "{\"cluster_id\": \"dc-a\", \"tls\": {\"ca\": \"a\", \"cert\": \"b\", "
      "\"key\": \"c\"}, %s}";
  const struct {
    const char* frag;
    const char* want;
  } bad[] = {
      {"\"exchange\": {\"port_range\": \"41000\"}", "exchange.port_range: '41000' is not"},
      {"\"exchange\": {\"port_range\": \"41099-41000\"}", "exchange.port_range: '41099-41000'"},
      {"\"exchange\": {\"port_range\": \"80-90\"}", "1024 <= LO <= HI <= 65535"},
      {"\"exchange\": {\"port_range\": \"41000-41x\"}", "exchange.port_range"},
      {"\"exchange\": {\"port_range\": 41000}", "exchange.port_range: expected a string"},
      {"\"exchange\": {\"advertise\": \"gw.example:41000\"}", "exchange.advertise"},
      {"\"exchange\": {\"advertise\": \"0.0.0.0\"}", "exchange.advertise: '0.0.0.0' is a wildcard"},
      {"\"exchange_host\": \"0.0.0.0\"", "exchange.advertise: required"},
      {"\"exchange_host\": \"a b\"", "exchange_host"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text, base, bad[i].frag);
    nb_gateway_config_t c;
    nb_gateway_config_defaults(&c);
    assert_int_equal(nb_gateway_config_parse(text, strlen(text), NULL, &c), NB_ERR_CONFIG);
    if (!strstr(nb_error_last(), bad[i].want))
      fail_msg("%s: '%s' lacks '%s'", bad[i].frag, nb_error_last(), bad[i].want);
  }
  char text[1024];
  snprintf(text, sizeof text, base,
           "\"exchange_host\": \"0.0.0.0\", \"exchange\": {\"port_range\": \"41000-41099\", "
           "\"advertise\": \"gw.example.org\"}");
  nb_gateway_config_t c;
  nb_gateway_config_defaults(&c);
  assert_int_equal(nb_gateway_config_parse(text, strlen(text), NULL, &c), NB_OK);
  assert_int_equal(c.exchange_port_lo, 41000);
  assert_int_equal(c.exchange_port_hi, 41099);
  assert_string_equal(c.exchange_advertise, "gw.example.org");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_refused),
      cmocka_unit_test(test_ports_in_range_and_advertised),
      cmocka_unit_test(test_range_exhausted),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
