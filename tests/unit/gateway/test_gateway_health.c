/* The gateway's grpc.health.v1.Health service over mutual TLS on 127.0.0.1, and its probe
 * (nb_gateway_health_check, what `nebula gateway --check` calls): SERVING for "" and the
 * gateway's services, NOT_FOUND / SERVICE_UNKNOWN for another name, NOT_SERVING once drained
 * (a Watch is told), and a clear error when nothing listens. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gateway/gateway.h"
#include "grpc/health/v1/health.pb-c.h"
#include "inter/rpc.h"
#include "tests/lib/gw_testlib.h"

static char g_dir[256];
static nb_gateway_config_t g_cfg;
static nb_gateway_t* g_gw;
static int g_port;

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_gwh");
  const char* clusters[] = {"dc-a", "dc-b"};
  const char* users[] = {"alice"};
  gwt_make_pki(g_dir, clusters, 2, users, 1, NULL, NULL);
  gwt_parse_config(
      g_dir,
      "{\"cluster_id\": \"dc-a\", \"listen\": \"127.0.0.1:0\",\n"
      " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"dc-a.crt\", \"key\": \"dc-a.key\"},\n"
      " \"command\": [\"/bin/true\"], \"work_dir\": \"work\"}",
      &g_cfg);
  assert_int_equal(nb_gateway_create(&g_cfg, &g_gw), NB_OK);
  g_port = nb_gateway_port(g_gw);
  assert_true(g_port > 0);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  nb_gateway_destroy(g_gw);
  gwt_reap();
  gwt_remove_dir(g_dir);
  return 0;
}

static nb_status_t check(nb_rpc_client_t* cli, const char* svc, int* status) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char*)svc;
  ProtobufCMessage* resp = NULL;
  nb_status_t s =
      nb_rpc_unary_pb(cli, "/grpc.health.v1.Health/Check", &req.base,
                      &grpc__health__v1__health_check_response__descriptor, &resp, 5000, 0);
  *status = s == NB_OK ? (int)((Grpc__Health__V1__HealthCheckResponse*)resp)->status : -1;
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return s;
}

static int watch_next(nb_rpc_stream_t* s) {
  ProtobufCMessage* m = NULL;
  int end = 0;
  nb_status_t st = nb_rpc_stream_recv_pb(s, &grpc__health__v1__health_check_response__descriptor,
                                         &m, &end, 5000);
  if (st != NB_OK || !m) return -1;
  int v = (int)((Grpc__Health__V1__HealthCheckResponse*)m)->status;
  protobuf_c_message_free_unpacked(m, NULL);
  return v;
}

static nb_rpc_stream_t* watch(nb_rpc_client_t* cli, const char* svc) {
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, "/grpc.health.v1.Health/Watch", 10000, 0, &s), NB_OK);
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char*)svc;
  assert_int_equal(nb_rpc_stream_send_pb(s, &req.base), NB_OK);
  assert_int_equal(nb_rpc_stream_close_send(s), NB_OK);
  return s;
}

/* A user's certificate and another cluster's may ask; "" and every service of the gateway are
 * SERVING, another name is NOT_FOUND naming it. */
static void test_check_serving(void** state) {
  (void)state;
  const char* who[] = {"alice", "dc-b"};
  for (int w = 0; w < 2; w++) {
    nb_tls_t* tls = NULL;
    nb_rpc_client_t* cli = gwt_client(g_dir, who[w], g_port, &tls);
    const char* known[] = {"", "nebula.v1.Gateway", "nebula.v1.Federation", "nebula.v1.Artifacts",
                           "grpc.health.v1.Health"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
      int st = -1;
      assert_int_equal(check(cli, known[i], &st), NB_OK);
      assert_int_equal(st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    }
    int st = -1;
    assert_int_equal(check(cli, "nebula.v1.Nope", &st), NB_ERR_NOT_FOUND);
    assert_non_null(strstr(nb_error_last(), "unknown service 'nebula.v1.Nope'"));
    nb_rpc_client_destroy(cli);
    nb_tls_destroy(tls);
  }
}

/* The probe with the config's own PKI: SERVING at the port, the address it dialled named. */
static void test_probe(void** state) {
  (void)state;
  char addr[64], target[512];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", g_port);
  int st = 0;
  assert_int_equal(nb_gateway_health_check(&g_cfg, addr, "", 5000, &st, target, sizeof target),
                   NB_OK);
  assert_int_equal(st, 1);
  assert_string_equal(nb_gateway_health_name(st), "SERVING");
  assert_string_equal(target, addr);
  assert_int_equal(
      nb_gateway_health_check(&g_cfg, addr, "no.such", 5000, &st, target, sizeof target),
      NB_ERR_NOT_FOUND);
  /* listen port 0 without an address: nothing to dial, said so */
  assert_int_equal(nb_gateway_health_check(&g_cfg, NULL, "", 5000, &st, target, sizeof target),
                   NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "--address"));
  /* listen "0.0.0.0:P" is dialled on loopback */
  nb_gateway_config_t c = g_cfg;
  snprintf(c.listen, sizeof c.listen, "0.0.0.0:%d", g_port);
  assert_int_equal(nb_gateway_health_check(&c, NULL, "", 5000, &st, target, sizeof target), NB_OK);
  assert_string_equal(target, addr);
  /* a certificate of another cluster than the config's: the server is not who it expects */
  snprintf(c.cluster_id, sizeof c.cluster_id, "dc-b");
  snprintf(c.tls_cert, sizeof c.tls_cert, "%s/dc-b.crt", g_dir);
  snprintf(c.tls_key, sizeof c.tls_key, "%s/dc-b.key", g_dir);
  assert_int_not_equal(nb_gateway_health_check(&c, addr, "", 5000, &st, target, sizeof target),
                       NB_OK);
  assert_int_not_equal(st, 1);
}

/* Nothing listening: UNAVAILABLE (or the deadline), never SERVING. */
static void test_probe_nothing_listening(void** state) {
  (void)state;
  char addr[64], target[512];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", gwt_free_port());
  int st = 7;
  nb_status_t s = nb_gateway_health_check(&g_cfg, addr, "", 3000, &st, target, sizeof target);
  assert_true(s == NB_ERR_UNAVAILABLE || s == NB_ERR_TIMEOUT);
  assert_int_equal(st, 0);
  assert_string_equal(target, addr);
  assert_int_equal(
      nb_gateway_health_check(&g_cfg, "localhost", "", 3000, &st, target, sizeof target),
      NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "--address"));
}

/* Watch: SERVING at once, SERVICE_UNKNOWN for an unknown name (the call stays open); after
 * nb_gateway_drain the watcher is told NOT_SERVING and Check answers it, while the gateway still
 * serves. Runs last: the gateway stays drained. */
static void test_watch_and_drain(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, "alice", g_port, &tls);
  nb_rpc_stream_t* w = watch(cli, "");
  nb_rpc_stream_t* u = watch(cli, "nebula.v1.Nope");
  assert_int_equal(watch_next(w), GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  assert_int_equal(watch_next(u),
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN);
  nb_gateway_drain(g_gw);
  assert_int_equal(watch_next(w),
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
  int st = -1;
  assert_int_equal(check(cli, "", &st), NB_OK);
  assert_int_equal(st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
  assert_int_equal(check(cli, "nebula.v1.Gateway", &st), NB_OK);
  assert_int_equal(st, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
  char addr[64], target[512];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", g_port);
  assert_int_equal(nb_gateway_health_check(&g_cfg, addr, "", 5000, &st, target, sizeof target),
                   NB_OK);
  assert_string_equal(nb_gateway_health_name(st), "NOT_SERVING");
  nb_rpc_stream_destroy(w);
  nb_rpc_stream_destroy(u);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check_serving),
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_probe_nothing_listening),
      cmocka_unit_test(test_watch_and_drain),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
