/* The standard gRPC health service (grpc.health.v1.Health) of the gateway: Check and Watch for
 * "" (the gateway as a whole) and for the services it serves, SERVING while it runs and
 * NOT_SERVING from nb_gateway_drain on; and its client, `nebula gateway --check`. It is no
 * readiness of jobs or peers: a gateway whose peers are down still serves its own API. */
#include "gateway/gateway_internal.h"

#include <string.h>

#include "common/common.h"
#include "grpc/health/v1/health.pb-c.h"
#include "jobs/cli_checks.h"

#define NB__HEALTH_POLL_NS 50000000LL /* how often a Watch looks at the status */

/* The services a health request may name, besides "". */
static const char* const nb__health_services[] = {NB_GATEWAY_HEALTH_SERVICE, "nebula.v1.Federation",
                                                  "nebula.v1.Artifacts", "grpc.health.v1.Health"};

static Grpc__Health__V1__HealthCheckResponse__ServingStatus nb__health_status(nb_gateway_t* gw,
                                                                              const char* svc) {
  int known = !svc[0];
  for (size_t i = 0; !known && i < sizeof nb__health_services / sizeof nb__health_services[0]; i++)
    known = !strcmp(svc, nb__health_services[i]);
  if (!known) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
  return gw->draining ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
}

static nb_status_t nb__health_send(nb_rpc_call_t* call,
                                   Grpc__Health__V1__HealthCheckResponse__ServingStatus st) {
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = st;
  return nb_rpc_call_send_pb(call, &r.base);
}

static nb_status_t nb__health_request(nb_rpc_call_t* call, char* svc, size_t cap) {
  ProtobufCMessage* m = NULL;
  int end = 0;
  NB_CHECK(nb_rpc_call_recv_pb(call, &grpc__health__v1__health_check_request__descriptor, &m, &end,
                               NB_RPC_INFINITE));
  if (!m) return nb_error(NB_ERR_INVALID, "health: no request");
  const char* s = ((Grpc__Health__V1__HealthCheckRequest*)m)->service;
  int n = snprintf(svc, cap, "%s", s ? s : "");
  protobuf_c_message_free_unpacked(m, NULL);
  if (n < 0 || (size_t)n >= cap)
    return nb_error(NB_ERR_INVALID, "health: service: longer than %zu bytes", cap - 1);
  return NB_OK;
}

/* Check: the status now; a service this gateway does not serve is NOT_FOUND (the spec's). Any
 * certificate of the federation CA may ask (the TLS layer refused the others), outside the
 * per-identity limit: a probe must not be refused because a user holds many calls. */
static nb_status_t nb__health_check(nb_rpc_call_t* call, void* user) {
  nb_gateway_t* gw = user;
  char svc[256];
  NB_CHECK(nb__health_request(call, svc, sizeof svc));
  Grpc__Health__V1__HealthCheckResponse__ServingStatus st = nb__health_status(gw, svc);
  if (st == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN)
    return nb_error(NB_ERR_NOT_FOUND, "health: unknown service '%s' (known: \"\", %s)", svc,
                    NB_GATEWAY_HEALTH_SERVICE);
  return nb__health_send(call, st);
}

/* Watch: the status now (SERVICE_UNKNOWN for an unknown service, the call staying open as the
 * spec says), then every change until the client goes or the server stops. While a watcher has
 * not yet been sent NOT_SERVING, nb_gateway_destroy waits a moment for it (gw->watch_serving). */
static nb_status_t nb__health_watch(nb_rpc_call_t* call, nb_gateway_t* gw, const void* spec) {
  char svc[256];
  NB_CHECK(nb__health_request(call, svc, sizeof svc));
  Grpc__Health__V1__HealthCheckResponse__ServingStatus last = nb__health_status(gw, svc), now;
  int counted = last == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  if (counted) gw->watch_serving++;
  nb_status_t s = nb__health_send(call, last);
  while (s == NB_OK && !nb_rpc_call_cancelled(call)) {
    nb_sleep_ns(NB__HEALTH_POLL_NS);
    now = nb__health_status(gw, svc);
    if (now == last) continue;
    s = nb__health_send(call, now);
    last = now;
    if (counted && now != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
      gw->watch_serving--;
      counted = 0;
    }
  }
  if (counted) gw->watch_serving--;
  return s == NB_ERR_CANCELLED ? NB_OK : s;
}

static const nb__gw_method_t nb__health_watch_method = {
    "/grpc.health.v1.Health/Watch", NB_RPC_SERVER_STREAMING, nb__health_watch, NULL};

nb_status_t nb__gw_health_add(nb_gateway_t* gw) {
  NB_CHECK(nb_rpc_server_add_method(gw->srv, "/grpc.health.v1.Health/Check", NB_RPC_UNARY,
                                    nb__health_check, gw));
  /* a Watch holds a handler thread for as long as it lasts: under the per-identity limit */
  gw->hand_watch.gw = gw;
  gw->hand_watch.m = &nb__health_watch_method;
  return nb_rpc_server_add_method(gw->srv, nb__health_watch_method.path,
                                  nb__health_watch_method.kind, nb__gw_limited, &gw->hand_watch);
}

void nb_gateway_drain(nb_gateway_t* gw) {
  if (gw) gw->draining = 1;
}

/* The address a probe on this host dials for listen: a wildcard or empty host becomes
 * loopback of its family. */
static nb_status_t nb__health_target(const char* listen, char* out, size_t cap) {
  if (!strncmp(listen, "unix:", 5) || !strncmp(listen, "unix-abstract:", 14)) {
    snprintf(out, cap, "%s", listen);
    return NB_OK;
  }
  const char* colon = strrchr(listen, ':');
  if (!colon) return nb_error(NB_ERR_CONFIG, "config: listen: '%s' has no port", listen);
  if (!strcmp(colon + 1, "0"))
    return nb_error(NB_ERR_CONFIG,
                    "config: listen: '%s' has port 0 (a free one, known only to the running "
                    "gateway): give the address to check with --address HOST:PORT",
                    listen);
  size_t hl = (size_t)(colon - listen);
  const char* host = hl ? listen : "";
  if (!hl || (hl == 7 && !strncmp(host, "0.0.0.0", 7)))
    snprintf(out, cap, "127.0.0.1%s", colon);
  else if ((hl == 4 && !strncmp(host, "[::]", 4)) || (hl == 2 && !strncmp(host, "::", 2)))
    snprintf(out, cap, "[::1]%s", colon);
  else
    snprintf(out, cap, "%s", listen);
  return NB_OK;
}

const char* nb_gateway_health_name(int status) {
  switch (status) {
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING:
      return "SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING:
      return "NOT_SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN:
      return "SERVICE_UNKNOWN";
    default:
      return "UNKNOWN";
  }
}

nb_status_t nb_gateway_health_check(const nb_gateway_config_t* cfg, const char* address,
                                    const char* service, int64_t timeout_ms, int* status,
                                    char* target, size_t target_cap) {
  if (!cfg || !status || !target || !target_cap)
    return nb_error(NB_ERR_INVALID, "health check: NULL argument");
  *status = 0;
  if (address && *address) {
    NB_CHECK(nb_cli_addr_check(address, 0, "--address"));
    snprintf(target, target_cap, "%s", address);
  } else {
    NB_CHECK(nb__health_target(cfg->listen, target, target_cap));
  }
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = NULL;
  ProtobufCMessage* resp = NULL;
  nb_status_t s = NB_OK;
  nb_tls_files_t files = {cfg->tls_ca, cfg->tls_cert, cfg->tls_key};
  NB_CHECK_GOTO(nb_tls_create(&files, &tls), s, done);
  /* the gateway's certificate names its cluster id as DNS:ID whatever its other SANs: check
   * that name, and that the server is this cluster, whichever address is dialled */
  nb_rpc_client_opts_t co = {0};
  co.tls = tls;
  co.expected_cluster = cfg->cluster_id;
  co.server_name = cfg->cluster_id;
  co.keepalive_ms = -1;
  NB_CHECK_GOTO(nb_rpc_client_create(target, &co, &cli), s, done);
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char*)(service ? service : "");
  s = nb_rpc_unary_pb(cli, "/grpc.health.v1.Health/Check", &req.base,
                      &grpc__health__v1__health_check_response__descriptor, &resp, timeout_ms, 0);
  if (s == NB_OK) *status = (int)((Grpc__Health__V1__HealthCheckResponse*)resp)->status;
done:
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  return s;
}
