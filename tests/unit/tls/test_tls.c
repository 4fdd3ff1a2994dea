/* Unit tests of security/tls and of inter/rpc over mutual TLS: loading PEM material, peer
 * identities, and the mTLS matrix (valid; no client cert; foreign CA; plaintext; wrong cluster;
 * a user where a cluster is expected; the client refusing a server of the wrong cluster); the
 * negotiated TLS version and cipher suite as seen on the wire and by a foreign client.
 * Certificates come from gen_certs.sh (openssl CLI) in a temporary directory. */
#include <arpa/inet.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "nebula/v1/exchange.pb-c.h"
#include "security/tls.h"

#define M_PING "/nebula.v1.Exchange/Ping"

static const char* g_gen_script;
static char g_dir[256];
static nb_rpc_server_t* g_srv;
static nb_tls_t* g_srv_tls;
static char g_target[64];
static atomic_int g_handled;

static char* path(const char* name) {
  static char buf[8][512];
  static int i;
  char* p = buf[i++ % 8];
  snprintf(p, 512, "%s/%s", g_dir, name);
  return p;
}

static char* slurp(const char* name) {
  FILE* f = fopen(path(name), "rb");
  assert_non_null(f);
  char* b = calloc(1, 1 << 16);
  size_t n = fread(b, 1, (1 << 16) - 1, f);
  fclose(f);
  b[n] = '\0';
  return b;
}

static nb_tls_t* load(const char* ca, const char* cert, const char* key) {
  nb_tls_files_t f = {.ca_path = path(ca), .cert_path = path(cert), .key_path = path(key)};
  nb_tls_t* t = NULL;
  assert_int_equal(nb_tls_create(&f, &t), NB_OK);
  return t;
}

/* The job on this server expects its peer to be cluster dc-b. */
static nb_status_t authorize(const nb_tls_peer_t* peer, const char* method, void* user) {
  return nb_tls_peer_check_cluster(peer, (const char*)user);
}

static nb_status_t h_ping(nb_rpc_call_t* call, void* user) {
  atomic_fetch_add(&g_handled, 1);
  ProtobufCMessage* in = NULL;
  int end;
  NB_CHECK(
      nb_rpc_call_recv_pb(call, &nebula__v1__ping_request__descriptor, &in, &end, NB_RPC_INFINITE));
  if (end) return nb_error(NB_ERR_INVALID, "no ping");
  Nebula__V1__PingRequest* req = (Nebula__V1__PingRequest*)in;
  Nebula__V1__PingReply rep = NEBULA__V1__PING_REPLY__INIT;
  rep.seq = req->seq;
  rep.responder = (char*)nb_rpc_call_peer(call)->name; /* echo who the server saw */
  nb_status_t st = nb_rpc_call_send_pb(call, &rep.base);
  protobuf_c_message_free_unpacked(in, NULL);
  return st;
}

static int setup(void** state) {
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb_tls_test.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(g_dir) == NULL) return -1;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "sh '%s' '%s'", g_gen_script, g_dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "certificate fixture failed: %s\n", cmd);
    return -1;
  }
  grpc_init(); /* for the raw-gRPC clients below */
  g_srv_tls = load("ca.pem", "server.pem", "server.key");
  nb_rpc_server_opts_t o = {.listen = "127.0.0.1:0",
                            .tls = g_srv_tls,
                            .authorize = authorize,
                            .authorize_user = (void*)"dc-b"};
  if (nb_rpc_server_create(&o, &g_srv) != NB_OK) return -1;
  nb_rpc_server_add_method(g_srv, M_PING, NB_RPC_UNARY, h_ping, NULL);
  if (nb_rpc_server_start(g_srv) != NB_OK) return -1;
  snprintf(g_target, sizeof g_target, "127.0.0.1:%d", nb_rpc_server_port(g_srv));
  return 0;
}

static int teardown(void** state) {
  nb_rpc_server_destroy(g_srv);
  nb_tls_destroy(g_srv_tls);
  grpc_shutdown_blocking();
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Ping through the wrapper with the given client identity, to target. */
static nb_status_t ping_to(const char* target, const nb_tls_t* tls, const char* expect_server,
                           char* who, size_t wholen) {
  nb_rpc_client_opts_t o = {
      .tls = tls, .allow_insecure = tls == NULL, .expected_cluster = expect_server};
  nb_rpc_client_t* cli = NULL;
  NB_CHECK(nb_rpc_client_create(target, &o, &cli));
  Nebula__V1__PingRequest req = NEBULA__V1__PING_REQUEST__INIT;
  req.seq = 5;
  ProtobufCMessage* out = NULL;
  nb_status_t st =
      nb_rpc_unary_pb(cli, M_PING, &req.base, &nebula__v1__ping_reply__descriptor, &out, 5000, 0);
  if (st == NB_OK) {
    Nebula__V1__PingReply* rep = (Nebula__V1__PingReply*)out;
    if (who) snprintf(who, wholen, "%s", rep->responder);
    if (rep->seq != 5) st = NB_ERR_INTERNAL;
    protobuf_c_message_free_unpacked(out, NULL);
  }
  char keep[512];
  snprintf(keep, sizeof keep, "%s", nb_error_last());
  nb_rpc_client_destroy(cli);
  if (st != NB_OK) {
    nb_error(st, "%s", keep);
    fprintf(stderr, "  (ping: %s: %s)\n", nb_status_name(st), keep);
  }
  return st;
}

static nb_status_t ping_as(const nb_tls_t* tls, const char* expect_server, char* who,
                           size_t wholen) {
  return ping_to(g_target, tls, expect_server, who, wholen);
}

/* A unary call with hand-made gRPC credentials (for clients the wrapper will not build). Returns
 * the gRPC status code. */
static int raw_ping(grpc_channel_credentials* creds) {
  grpc_channel* ch = grpc_channel_create(g_target, creds, NULL);
  grpc_completion_queue* cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice method = grpc_slice_from_static_string(M_PING);
  gpr_timespec dl =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(5000, GPR_TIMESPAN));
  grpc_call* call = grpc_channel_create_call(ch, NULL, 0, cq, method, NULL, dl, NULL);
  grpc_slice s = grpc_slice_from_static_buffer("\x08\x05", 2); /* seq = 5 */
  grpc_byte_buffer* req = grpc_raw_byte_buffer_create(&s, 1);
  grpc_byte_buffer* resp = NULL;
  grpc_metadata_array md, tmd;
  grpc_metadata_array_init(&md);
  grpc_metadata_array_init(&tmd);
  grpc_status_code code = GRPC_STATUS_UNKNOWN;
  grpc_slice details;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = req;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &resp;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.status = &code;
  ops[5].data.recv_status_on_client.status_details = &details;
  ops[5].data.recv_status_on_client.trailing_metadata = &tmd;
  assert_int_equal(grpc_call_start_batch(call, ops, 6, (void*)1, NULL), GRPC_CALL_OK);
  grpc_event ev =
      grpc_completion_queue_pluck(cq, (void*)1, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  assert_int_equal(ev.type, GRPC_OP_COMPLETE);
  if (code != GRPC_STATUS_OK)
    fprintf(stderr, "  (raw ping: code %d: %.*s)\n", (int)code, (int)GRPC_SLICE_LENGTH(details),
            (const char*)GRPC_SLICE_START_PTR(details));
  if (resp) grpc_byte_buffer_destroy(resp);
  grpc_byte_buffer_destroy(req);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&md);
  grpc_metadata_array_destroy(&tmd);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  grpc_channel_destroy(ch);
  grpc_channel_credentials_release(creds);
  return (int)code;
}

static void test_load_material(void** state) {
  nb_tls_t* t = load("ca.pem", "client.pem", "client.key");
  assert_int_equal(nb_tls_self(t)->kind, NB_TLS_PEER_CLUSTER);
  assert_string_equal(nb_tls_self(t)->name, "dc-b");
  nb_tls_destroy(t);
  nb_tls_destroy(NULL);

  nb_tls_files_t f = {
      .ca_path = path("ca.pem"), .cert_path = path("client.pem"), .key_path = path("nope.key")};
  assert_int_equal(nb_tls_create(&f, &t), NB_ERR_IO);
  assert_non_null(strstr(nb_error_last(), "nope.key"));
  f.key_path = path("server.key"); /* another endpoint's key */
  assert_int_equal(nb_tls_create(&f, &t), NB_ERR_CRYPTO);
  assert_non_null(strstr(nb_error_last(), "does not match"));
  f.cert_path = path("foreign.pem"); /* issued by another CA */
  f.key_path = path("foreign.key");
  assert_int_equal(nb_tls_create(&f, &t), NB_ERR_CRYPTO);
  assert_non_null(strstr(nb_error_last(), "does not verify"));
  f.cert_path = path("ca.key"); /* not a certificate */
  assert_int_equal(nb_tls_create(&f, &t), NB_ERR_CRYPTO);
  f.cert_path = NULL;
  assert_int_equal(nb_tls_create(&f, &t), NB_ERR_INVALID);
  assert_null(t);
}

static void test_peer_identities(void** state) {
  nb_tls_peer_t p;
  char* pem = slurp("user.pem");
  assert_int_equal(nb_tls_peer_from_pem(pem, strlen(pem), &p), NB_OK);
  assert_int_equal(p.kind, NB_TLS_PEER_USER);
  assert_string_equal(p.name, "alice");
  assert_int_equal(nb_tls_peer_check_user(&p, "alice"), NB_OK);
  assert_int_equal(nb_tls_peer_check_user(&p, "bob"), NB_ERR_PERMISSION);
  assert_int_equal(nb_tls_peer_check_cluster(&p, "alice"), NB_ERR_PERMISSION);
  free(pem);

  pem = slurp("wrong.pem");
  assert_int_equal(nb_tls_peer_from_pem(pem, strlen(pem), &p), NB_OK);
  assert_int_equal(p.kind, NB_TLS_PEER_CLUSTER);
  assert_string_equal(p.name, "dc-x");
  assert_string_equal(p.common_name, "dc-x");
  assert_int_equal(nb_tls_peer_check_cluster(&p, "dc-x"), NB_OK);
  assert_int_equal(nb_tls_peer_check_cluster(&p, "dc-b"), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "expected cluster 'dc-b'"));
  /* a CN that disagrees with the URI SAN is refused */
  snprintf(p.common_name, sizeof p.common_name, "dc-y");
  assert_int_equal(nb_tls_peer_check_cluster(&p, "dc-x"), NB_ERR_PERMISSION);
  free(pem);

  assert_int_equal(nb_tls_peer_from_pem("garbage", 7, &p), NB_ERR_CRYPTO);
  assert_int_equal(nb_tls_peer_from_pem(NULL, 0, &p), NB_ERR_INVALID);
}

static void test_mtls_valid(void** state) {
  int before = atomic_load(&g_handled);
  nb_tls_t* t = load("ca.pem", "client.pem", "client.key");
  char who[64] = "";
  /* without and with a check of the server's identity */
  assert_int_equal(ping_as(t, NULL, who, sizeof who), NB_OK);
  assert_string_equal(who, "dc-b"); /* the server saw our certificate's identity */
  assert_int_equal(ping_as(t, "dc-a", who, sizeof who), NB_OK);
  nb_tls_destroy(t);
  assert_int_equal(atomic_load(&g_handled), before + 2);
}

static void test_mtls_no_client_cert(void** state) {
  int before = atomic_load(&g_handled);
  char* ca = slurp("ca.pem");
  int code = raw_ping(grpc_ssl_credentials_create_ex(ca, NULL, NULL, NULL));
  assert_int_not_equal(code, GRPC_STATUS_OK);
  assert_int_equal(code, GRPC_STATUS_UNAVAILABLE);
  free(ca);
  assert_int_equal(atomic_load(&g_handled), before);
}

static void test_mtls_foreign_ca(void** state) {
  int before = atomic_load(&g_handled);
  /* trusts the real CA for the server, presents a certificate from another CA */
  char *ca = slurp("ca.pem"), *cert = slurp("foreign.pem"), *key = slurp("foreign.key");
  grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
  int code = raw_ping(grpc_ssl_credentials_create_ex(ca, &pair, NULL, NULL));
  assert_int_equal(code, GRPC_STATUS_UNAVAILABLE);
  free(ca);
  free(cert);
  free(key);
  /* and the wrapper refuses a server from another CA */
  nb_tls_files_t f = {.ca_path = path("other-ca.pem"),
                      .cert_path = path("foreign.pem"),
                      .key_path = path("foreign.key")};
  nb_tls_t* t = NULL;
  assert_int_equal(nb_tls_create(&f, &t), NB_OK);
  assert_int_equal(ping_as(t, NULL, NULL, 0), NB_ERR_PERMISSION); /* not a transient error */
  assert_non_null(strstr(nb_error_last(), "certificate verify failed"));
  nb_tls_destroy(t);
  assert_int_equal(atomic_load(&g_handled), before);
}

static void test_mtls_plaintext(void** state) {
  int before = atomic_load(&g_handled);
  nb_status_t st = ping_as(NULL, NULL, NULL, 0);
  assert_true(st == NB_ERR_UNAVAILABLE || st == NB_ERR_PERMISSION);
  assert_int_equal(atomic_load(&g_handled), before);
}

static void test_mtls_wrong_identity(void** state) {
  int before = atomic_load(&g_handled);
  nb_tls_t* t = load("ca.pem", "wrong.pem", "wrong.key"); /* valid cert, cluster dc-x */
  assert_int_equal(ping_as(t, NULL, NULL, 0), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "PERMISSION_DENIED"));
  assert_non_null(strstr(nb_error_last(), "expected cluster 'dc-b'"));
  nb_tls_destroy(t);
  t = load("ca.pem", "user.pem", "user.key"); /* a user where a cluster is expected */
  assert_int_equal(ping_as(t, NULL, NULL, 0), NB_ERR_PERMISSION);
  nb_tls_destroy(t);
  assert_int_equal(atomic_load(&g_handled), before); /* refused before the handler */
}

/* A certificate the federation CA signed with CN=alice and no subjectAltName: no nebula
 * identity, so neither a cluster by its CN nor a user (docs/security.md, Identity). */
static void test_mtls_cn_only(void** state) {
  int before = atomic_load(&g_handled);
  nb_tls_peer_t p;
  char* pem = slurp("cnonly.pem");
  assert_int_equal(nb_tls_peer_from_pem(pem, strlen(pem), &p), NB_ERR_CRYPTO);
  assert_non_null(strstr(nb_error_last(), "certificate (CN 'alice') states no nebula identity"));
  assert_non_null(strstr(nb_error_last(), "nebula://user/NAME"));
  assert_int_equal(p.kind, NB_TLS_PEER_NONE);
  assert_string_equal(p.name, "");
  /* an endpoint does not start with it as its own certificate */
  nb_tls_files_t f = {
      .ca_path = path("ca.pem"), .cert_path = path("cnonly.pem"), .key_path = path("cnonly.key")};
  nb_tls_t* t = NULL;
  assert_int_equal(nb_tls_create(&f, &t), NB_ERR_CRYPTO);
  assert_non_null(strstr(nb_error_last(), "states no nebula identity"));
  assert_null(t);
  /* and a server refuses its calls before any handler runs */
  char *ca = slurp("ca.pem"), *key = slurp("cnonly.key");
  grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = pem};
  assert_int_equal(raw_ping(grpc_ssl_credentials_create_ex(ca, &pair, NULL, NULL)),
                   GRPC_STATUS_PERMISSION_DENIED);
  free(ca);
  free(key);
  free(pem);
  assert_int_equal(atomic_load(&g_handled), before);
}

static void test_client_checks_server(void** state) {
  int before = atomic_load(&g_handled);
  nb_tls_t* t = load("ca.pem", "client.pem", "client.key");
  /* the server is dc-a; a client that expects dc-z refuses it during the handshake */
  assert_int_equal(ping_as(t, "dc-z", NULL, 0), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "Verify peer"));
  nb_rpc_client_opts_t o = {.tls = t, .expected_cluster = "bad id!"};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(g_target, &o, &cli), NB_ERR_INVALID);
  nb_tls_destroy(t);
  assert_int_equal(atomic_load(&g_handled), before);
}

static void test_tls_garbage_then_good(void** state) {
  int port = atoi(strrchr(g_target, ':') + 1);
  for (int k = 0; k < 2; k++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr*)&a, sizeof a), 0);
    /* junk, then a TLS record header claiming a huge handshake */
    const char* junk =
        k == 0 ? "\x16\x03\x01\xff\xff\x01\x00\xff\xfcjunkjunkjunk" : "hello?\r\n\r\n";
    ssize_t w = send(fd, junk, strlen(junk), MSG_NOSIGNAL);
    (void)w;
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[256];
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    close(fd);
  }
  nb_tls_t* t = load("ca.pem", "client.pem", "client.key");
  assert_int_equal(ping_as(t, "dc-a", NULL, 0), NB_OK);
  nb_tls_destroy(t);
}

/* ------------------------------------------------ negotiated version and suite */

/* A one-connection TCP relay in front of the server that keeps the first bytes the server
 * sends: the ServerHello, which is not encrypted, names the chosen version and suite. */
typedef struct {
  int lfd;
  uint8_t from_server[4096];
  size_t n;
} relay_t;

static void* relay_main(void* arg) {
  relay_t* r = arg;
  int c = accept(r->lfd, NULL, NULL);
  if (c < 0) return NULL;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)atoi(strrchr(g_target, ':') + 1)),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(s, (struct sockaddr*)&a, sizeof a) == 0) {
    struct pollfd p[2] = {{.fd = c, .events = POLLIN}, {.fd = s, .events = POLLIN}};
    char buf[16384];
    for (;;) {
      if (poll(p, 2, 5000) <= 0) break;
      int k = (p[0].revents & (POLLIN | POLLHUP | POLLERR)) ? 0 : 1;
      ssize_t n = recv(p[k].fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      if (k == 1 && r->n < sizeof r->from_server) {
        size_t keep =
            (size_t)n < sizeof r->from_server - r->n ? (size_t)n : sizeof r->from_server - r->n;
        memcpy(r->from_server + r->n, buf, keep);
        r->n += keep;
      }
      if (send(p[1 - k].fd, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
    }
  }
  close(s);
  close(c);
  return NULL;
}

/* From the first TLS record: the ServerHello's cipher suite and the version its
 * supported_versions extension selects (0x0304 = TLS 1.3; 0 when absent, i.e. TLS 1.2). */
static void parse_server_hello(const uint8_t* b, size_t n, unsigned* suite, unsigned* version) {
  *suite = *version = 0;
  assert_true(n >= 5 + 4 + 2 + 32 + 1);
  assert_int_equal(b[0], 0x16); /* handshake record */
  size_t rec = ((size_t)b[3] << 8) | b[4];
  assert_true(n >= 5 + rec);
  const uint8_t* h = b + 5;
  assert_int_equal(h[0], 0x02); /* ServerHello */
  size_t p = 4 + 2 + 32;
  size_t sid = h[p];
  p += 1 + sid;
  assert_true(p + 2 + 1 + 2 <= rec);
  *suite = ((unsigned)h[p] << 8) | h[p + 1];
  p += 2 + 1;
  size_t ext_end = p + 2 + (((size_t)h[p] << 8) | h[p + 1]);
  p += 2;
  assert_true(ext_end <= rec);
  while (p + 4 <= ext_end) {
    unsigned type = ((unsigned)h[p] << 8) | h[p + 1];
    size_t len = ((size_t)h[p + 2] << 8) | h[p + 3];
    if (type == 0x002b && len == 2) *version = ((unsigned)h[p + 4] << 8) | h[p + 5];
    p += 4 + len;
  }
}

static void test_tls13_aes128_on_the_wire(void** state) {
  relay_t r = {.n = 0};
  r.lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  assert_int_equal(bind(r.lfd, (struct sockaddr*)&a, sizeof a), 0);
  assert_int_equal(listen(r.lfd, 1), 0);
  assert_int_equal(getsockname(r.lfd, (struct sockaddr*)&a, &al), 0);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", ntohs(a.sin_port));
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, relay_main, &r), 0);
  nb_tls_t* t = load("ca.pem", "client.pem", "client.key");
  char who[64] = "";
  assert_int_equal(ping_to(target, t, "dc-a", who, sizeof who), NB_OK);
  assert_string_equal(who, "dc-b"); /* the relay carried a real mTLS call */
  nb_tls_destroy(t);                /* the client's channel is gone: the relay sees EOF */
  pthread_join(th, NULL);
  close(r.lfd);
  unsigned suite, version;
  parse_server_hello(r.from_server, r.n, &suite, &version);
  assert_int_equal(version, 0x0304); /* TLS 1.3 */
  assert_int_equal(suite, 0x1301);   /* TLS_AES_128_GCM_SHA256 */
  const char* suites = nb_tls_ciphersuites();
  assert_non_null(suites);
  assert_string_equal(suites,
                      "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
}

/* A foreign client (the openssl CLI) that prefers AES-256-GCM still gets AES-128-GCM: the
 * server chooses by its own order. And one that offers only AES-256-GCM is still served. */
static void s_client_suite(const char* offer, char* out, size_t cap) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "openssl s_client -connect '%s' -brief -alpn h2 -tls1_3 -ciphersuites %s "
           "-CAfile '%s' -cert '%s' -key '%s' </dev/null 2>&1",
           g_target, offer, path("ca.pem"), path("client.pem"), path("client.key"));
  FILE* p = popen(cmd, "r");
  assert_non_null(p);
  char line[512];
  out[0] = '\0';
  while (fgets(line, sizeof line, p))
    if (strncmp(line, "Ciphersuite: ", 13) == 0) snprintf(out, cap, "%.*s", 100, line + 13);
  pclose(p);
  out[strcspn(out, "\r\n")] = '\0';
}

static void test_server_prefers_aes128(void** state) {
  char got[128];
  s_client_suite("TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256", got, sizeof got);
  assert_string_equal(got, "TLS_AES_128_GCM_SHA256");
  s_client_suite("TLS_AES_256_GCM_SHA384", got, sizeof got);
  assert_string_equal(got, "TLS_AES_256_GCM_SHA384");
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/gen_certs.sh\n", argv[0]);
    return 2;
  }
  g_gen_script = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_material),
      cmocka_unit_test(test_peer_identities),
      cmocka_unit_test(test_mtls_valid),
      cmocka_unit_test(test_mtls_no_client_cert),
      cmocka_unit_test(test_mtls_foreign_ca),
      cmocka_unit_test(test_mtls_plaintext),
      cmocka_unit_test(test_mtls_wrong_identity),
      cmocka_unit_test(test_mtls_cn_only),
      cmocka_unit_test(test_client_checks_server),
      cmocka_unit_test(test_tls_garbage_then_good),
      cmocka_unit_test(test_tls13_aes128_on_the_wire),
      cmocka_unit_test(test_server_prefers_aes128),
  };
  return cmocka_run_group_tests_name("tls", tests, setup, teardown);
}
