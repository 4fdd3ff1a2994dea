/* Certificate rotation without a restart: a real `nebula gateway` process on 127.0.0.1 is sent
 * SIGHUP after its tls.cert / tls.key were replaced. A good pair from the same CA is served to
 * the next TLS connection (its serial read off the handshake), a connection opened before goes
 * on working, and the gateway's next Federation connection to its peer presents it (the peer
 * is a TLS listener of the test's that records the client certificate); a broken pair, a
 * missing key and an expired certificate are refused with a logged error naming the file, and
 * the previous pair goes on serving. Not here: the checks of nb_tls_create itself
 * (tests/unit/tls). Usage: test_gateway_certreload NEBULA_BINARY */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "grpc/health/v1/health.pb-c.h"
#include "inter/rpc.h"
#include "security/pki.h"
#include "tests/lib/gw_testlib.h"

static const char* g_nebula; /* the binary under test (argv[1]) */
static char g_dir[256];
static EVP_PKEY* g_ca_key;
static X509* g_ca;
static pid_t g_pid; /* the gateway process; 0 once stopped */
static int g_port;

/* The stand-in for peer dc-b: a TLS listener with dc-b's certificate that completes each
 * handshake, records the serial of the client certificate and hangs up. */
static struct {
  int fd, port;
  pthread_t thr;
  int started;
  _Atomic int stop;
  pthread_mutex_t mu;
  int n;               /* handshakes recorded */
  char serial[64][64]; /* the client certificate of each (the first 64) */
} g_peer = {.fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

/* The whole of a (small) file as a string, "" when it cannot be read; the caller frees it. */
static char* slurp(const char* path) {
  FILE* f = fopen(path, "rb");
  char* buf = calloc(1, 1 << 20);
  assert_non_null(buf);
  if (f) {
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = 0;
    fclose(f);
  }
  return buf;
}

/* How often needle occurs in the gateway's log (its stderr). */
static int log_count(const char* needle) {
  char p[512];
  snprintf(p, sizeof p, "%s/gw.err", g_dir);
  char* s = slurp(p);
  int n = 0;
  for (const char* q = s; (q = strstr(q, needle)) != NULL; q += strlen(needle)) n++;
  free(s);
  return n;
}

/* The last line of the gateway's log that holds needle (into out). */
static void log_line(const char* needle, char* out, size_t cap) {
  char p[512];
  snprintf(p, sizeof p, "%s/gw.err", g_dir);
  char* s = slurp(p);
  const char *hit = NULL, *q = s;
  while ((q = strstr(q, needle)) != NULL) hit = q++;
  out[0] = 0;
  if (hit) {
    const char* b = hit;
    while (b > s && b[-1] != '\n') b--;
    const char* e = strchr(hit, '\n');
    size_t n = e ? (size_t)(e - b) : strlen(b);
    if (n >= cap) n = cap - 1;
    memcpy(out, b, n);
    out[n] = 0;
  }
  free(s);
}

/* Polls the log every 20 ms until needle occurs `want` times; the bound only keeps a broken
 * gateway from hanging the test (the verdict is what the log says). */
static void wait_log(const char* needle, int want) {
  for (int i = 0; i < 1500 && log_count(needle) < want; i++) nb_sleep_ns(20000000);
  if (log_count(needle) < want) {
    char p[512];
    snprintf(p, sizeof p, "%s/gw.err", g_dir);
    char* s = slurp(p);
    fail_msg("'%s' logged %d times, expected %d; the gateway's log:\n%s", needle, log_count(needle),
             want, s);
    free(s);
  }
}

static void serial_hex(X509* x, char* out, size_t cap) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
  char* hex = bn ? BN_bn2hex(bn) : NULL;
  assert_non_null(hex);
  snprintf(out, cap, "%s", hex);
  OPENSSL_free(hex);
  BN_free(bn);
}

/* The serial of the certificate dir/<name>.crt. */
static void file_serial(const char* name, char* out, size_t cap) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s.crt", g_dir, name);
  X509* x = NULL;
  assert_int_equal(nb_pki_cert_load(p, &x), NB_OK);
  serial_hex(x, out, cap);
  X509_free(x);
}

/* Opens a new TCP connection to the gateway, completes a TLS handshake as user alice (the CA
 * verifies the server) and writes the serial of the certificate the gateway presented. */
static void served_serial(char* out, size_t cap) {
  char ca[512], crt[512], key[512];
  snprintf(ca, sizeof ca, "%s/ca.crt", g_dir);
  snprintf(crt, sizeof crt, "%s/alice.crt", g_dir);
  snprintf(key, sizeof key, "%s/alice.key", g_dir);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  assert_non_null(ctx);
  assert_int_equal(SSL_CTX_load_verify_locations(ctx, ca, NULL), 1);
  assert_int_equal(SSL_CTX_use_certificate_chain_file(ctx, crt), 1);
  assert_int_equal(SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  static const unsigned char alpn[] = {2, 'h', '2'};
  assert_int_equal(SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn), 0);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr*)&sa, sizeof sa), 0);
  SSL* ssl = SSL_new(ctx);
  assert_non_null(ssl);
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) != 1) {
    char e[256];
    ERR_error_string_n(ERR_get_error(), e, sizeof e);
    fail_msg("TLS handshake with the gateway failed: %s", e);
  }
  assert_int_equal(SSL_get_verify_result(ssl), X509_V_OK);
  X509* peer = SSL_get1_peer_certificate(ssl);
  assert_non_null(peer);
  serial_hex(peer, out, cap);
  X509_free(peer);
  SSL_shutdown(ssl);
  SSL_free(ssl);
  close(fd);
  SSL_CTX_free(ctx);
}

/* One grpc.health.v1 Check of the gateway as a whole through cli: SERVING expected. */
static void assert_serving(nb_rpc_client_t* cli) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char*)"";
  ProtobufCMessage* resp = NULL;
  nb_status_t s =
      nb_rpc_unary_pb(cli, "/grpc.health.v1.Health/Check", &req.base,
                      &grpc__health__v1__health_check_response__descriptor, &resp, 10000, 0);
  if (s != NB_OK) fail_msg("health Check: %s", nb_error_last());
  assert_int_equal(((Grpc__Health__V1__HealthCheckResponse*)resp)->status,
                   GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  protobuf_c_message_free_unpacked(resp, NULL);
}

/* A fresh client (its own connection) as alice: Check answers SERVING. */
static void assert_serving_fresh(void) {
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, "alice", g_port, &tls);
  assert_serving(cli);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* A dc-a certificate from the test CA (SAN IP:127.0.0.1) written as dir/<name>.{key,crt};
 * not_after != 0: valid from not_before to not_after (Unix seconds). */
static void issue_dca(const char* name, int64_t not_before, int64_t not_after) {
  const char* sans[] = {"IP:127.0.0.1"};
  nb_pki_issue_opts_t o = {.kind = NB_PKI_CLUSTER,
                           .name = "dc-a",
                           .sans = sans,
                           .n_sans = 1,
                           .not_before = not_before,
                           .not_after = not_after};
  EVP_PKEY* k = NULL;
  X509* c = NULL;
  assert_int_equal(nb_pki_cert_issue(g_ca_key, g_ca, &o, &k, &c), NB_OK);
  gwt_write_pair(g_dir, k, c, name);
}

/* Puts dir/<src> in the place of dir/<dst> (rename: the gateway never reads half a file). */
static void install(const char* src, const char* dst) {
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/%s", g_dir, src);
  snprintf(b, sizeof b, "%s/%s", g_dir, dst);
  if (rename(a, b) != 0) fail_msg("rename %s %s: %s", a, b, strerror(errno));
}

static void copy_file(const char* src, const char* dst) {
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/%s", g_dir, src);
  snprintf(b, sizeof b, "%s/%s", g_dir, dst);
  char* s = slurp(a);
  assert_true(strlen(s) > 0);
  FILE* f = fopen(b, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(s, 1, strlen(s), f), strlen(s));
  assert_int_equal(fclose(f), 0);
  free(s);
}

static int peer_alpn(SSL* ssl, const unsigned char** out, unsigned char* outlen,
                     const unsigned char* in, unsigned int inlen, void* arg) {
  (void)ssl;
  (void)arg;
  static const unsigned char h2[] = {2, 'h', '2'};
  return SSL_select_next_proto((unsigned char**)out, outlen, h2, sizeof h2, in, inlen) ==
                 OPENSSL_NPN_NEGOTIATED
             ? SSL_TLSEXT_ERR_OK
             : SSL_TLSEXT_ERR_NOACK;
}

static void* peer_main(void* arg) {
  SSL_CTX* ctx = arg;
  while (!g_peer.stop) {
    struct pollfd pf = {.fd = g_peer.fd, .events = POLLIN};
    if (poll(&pf, 1, 50) <= 0) continue;
    int c = accept4(g_peer.fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) continue;
    struct timeval tv = {.tv_sec = 2}; /* a stalled handshake does not hold the listener */
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, c);
    if (SSL_accept(ssl) == 1) {
      X509* x = SSL_get1_peer_certificate(ssl);
      if (x) {
        char hex[64];
        BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
        char* h = bn ? BN_bn2hex(bn) : NULL;
        snprintf(hex, sizeof hex, "%s", h ? h : "?");
        OPENSSL_free(h);
        BN_free(bn);
        X509_free(x);
        pthread_mutex_lock(&g_peer.mu);
        if (g_peer.n < 64) snprintf(g_peer.serial[g_peer.n], sizeof g_peer.serial[0], "%s", hex);
        g_peer.n++;
        pthread_mutex_unlock(&g_peer.mu);
      }
    }
    ERR_clear_error();
    SSL_free(ssl);
    close(c);
  }
  SSL_CTX_free(ctx);
  return NULL;
}

static void start_peer(void) {
  char ca[512], crt[512], key[512];
  snprintf(ca, sizeof ca, "%s/ca.crt", g_dir);
  snprintf(crt, sizeof crt, "%s/dc-b.crt", g_dir);
  snprintf(key, sizeof key, "%s/dc-b.key", g_dir);
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  assert_non_null(ctx);
  assert_int_equal(SSL_CTX_use_certificate_chain_file(ctx, crt), 1);
  assert_int_equal(SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM), 1);
  assert_int_equal(SSL_CTX_load_verify_locations(ctx, ca, NULL), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  SSL_CTX_set_alpn_select_cb(ctx, peer_alpn, NULL);
  g_peer.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(g_peer.fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  assert_int_equal(bind(g_peer.fd, (struct sockaddr*)&sa, sizeof sa), 0);
  assert_int_equal(listen(g_peer.fd, 16), 0);
  assert_int_equal(getsockname(g_peer.fd, (struct sockaddr*)&sa, &sl), 0);
  g_peer.port = ntohs(sa.sin_port);
  g_peer.stop = 0;
  g_peer.n = 0;
  assert_int_equal(pthread_create(&g_peer.thr, NULL, peer_main, ctx), 0);
  g_peer.started = 1;
}

static void stop_peer(void) {
  if (g_peer.started) {
    g_peer.stop = 1;
    pthread_join(g_peer.thr, NULL);
    g_peer.started = 0;
  }
  if (g_peer.fd >= 0) close(g_peer.fd);
  g_peer.fd = -1;
}

static int peer_handshakes(void) {
  pthread_mutex_lock(&g_peer.mu);
  int n = g_peer.n;
  pthread_mutex_unlock(&g_peer.mu);
  return n;
}

/* Submits a job naming dc-a and dc-b as alice: the gateway proposes it to dc-b (the stand-in
 * answers no gRPC, so the submit fails), which opens a Federation connection. Waits until the
 * stand-in has recorded more than `before` handshakes and returns the serial the last one
 * presented. */
static void federation_serial(int before, char* out, size_t cap) {
  static int k;
  char doc[1024];
  snprintf(doc, sizeof doc,
           "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": "
           "{\"name\": \"fed%d\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"workers\": 1, "
           "\"data\": {\"languages\": [\"en\"]}}, {\"id\": \"dc-b\", \"workers\": 1, "
           "\"data\": {\"languages\": [\"en\"]}}]}}",
           k++);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, "alice", g_port, &tls);
  nb_status_t st = gwt_submit(cli, g_dir, "alice", doc, 0, 20000, NULL);
  assert_int_not_equal(st, NB_OK); /* dc-b speaks no gRPC */
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  for (int i = 0; i < 500 && peer_handshakes() <= before; i++) nb_sleep_ns(20000000);
  pthread_mutex_lock(&g_peer.mu);
  int n = g_peer.n;
  if (n > before) snprintf(out, cap, "%s", g_peer.serial[(n < 64 ? n : 64) - 1]);
  pthread_mutex_unlock(&g_peer.mu);
  if (n <= before) fail_msg("the gateway made no Federation connection to dc-b");
}

static void stop_gateway(int expect_clean) {
  if (g_pid <= 0) return;
  kill(g_pid, SIGTERM);
  int status = 0;
  pid_t r = 0;
  for (int i = 0; i < 1000 && (r = waitpid(g_pid, &status, WNOHANG)) == 0; i++)
    nb_sleep_ns(10000000);
  if (r == 0) { /* it did not stop: no process of ours outlives the test */
    kill(g_pid, SIGKILL);
    waitpid(g_pid, &status, 0);
  }
  g_pid = 0;
  if (expect_clean && (r == 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    char p[512];
    snprintf(p, sizeof p, "%s/gw.err", g_dir);
    char* log = slurp(p);
    fail_msg("the gateway did not exit cleanly on SIGTERM (%s %d); its log:\n%s",
             r == 0              ? "killed"
             : WIFEXITED(status) ? "exit"
                                 : "signal",
             r == 0              ? 9
             : WIFEXITED(status) ? WEXITSTATUS(status)
                                 : WTERMSIG(status),
             log);
  }
}

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_gwcr");
  const char* clusters[] = {"dc-a", "dc-b"};
  const char* users[] = {"alice"};
  gwt_make_pki(g_dir, clusters, 2, users, 1, &g_ca_key, &g_ca);
  start_peer();
  char p[512];
  snprintf(p, sizeof p, "%s/gw.json", g_dir);
  FILE* f = fopen(p, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"cluster_id\": \"dc-a\", \"listen\": \"127.0.0.1:0\",\n"
          " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"dc-a.crt\", \"key\": \"dc-a.key\"},\n"
          " \"peers\": {\"dc-b\": \"127.0.0.1:%d\"}, \"acl\": [{\"user\": \"alice\"}],\n"
          " \"federation_timeout_ms\": 2000,\n"
          " \"command\": [\"/bin/true\"], \"work_dir\": \"work\"}\n",
          g_peer.port);
  assert_int_equal(fclose(f), 0);

  char out[512], err[512];
  snprintf(out, sizeof out, "%s/gw.out", g_dir);
  snprintf(err, sizeof err, "%s/gw.err", g_dir);
  g_pid = fork();
  assert_true(g_pid >= 0);
  if (g_pid == 0) {
    /* the gateway's own log defaults (INFO for JOB), whatever the test runs under */
    unsetenv("NB_DEBUG");
    unsetenv("NB_DEBUG_SUBSYS");
    unsetenv("NB_DEBUG_FILE");
    unsetenv("NB_LOG_FORMAT");
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(126);
    execl(g_nebula, "nebula", "gateway", "--config", p, (char*)NULL);
    _exit(127);
  }
  /* "listening on 127.0.0.1:0 port N" once it serves */
  g_port = 0;
  for (int i = 0; i < 1500 && g_port == 0; i++) {
    char* s = slurp(out);
    const char* q = strstr(s, " port ");
    if (q && strchr(q, '\n')) g_port = atoi(q + 6);
    free(s);
    if (g_port == 0) {
      int status;
      if (waitpid(g_pid, &status, WNOHANG) == g_pid) {
        g_pid = 0;
        char* log = slurp(err);
        fail_msg("the gateway exited before serving:\n%s", log);
      }
      nb_sleep_ns(20000000);
    }
  }
  assert_true(g_port > 0);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  stop_gateway(0);
  stop_peer();
  EVP_PKEY_free(g_ca_key);
  X509_free(g_ca);
  g_ca_key = NULL;
  g_ca = NULL;
  gwt_reap();
  gwt_remove_dir(g_dir);
  return 0;
}

static void test_rotate(void** state) {
  (void)state;
  char first[128], second[128], served[128], line[4096];
  file_serial("dc-a", first, sizeof first);
  served_serial(served, sizeof served);
  assert_string_equal(served, first);
  /* a connection opened before the rotation, used across it */
  nb_tls_t* old_tls = NULL;
  nb_rpc_client_t* old_cli = gwt_client(g_dir, "alice", g_port, &old_tls);
  assert_serving(old_cli);

  /* a new pair from the same CA: the next connection gets it */
  issue_dca("next", 0, 0);
  file_serial("next", second, sizeof second);
  assert_string_not_equal(second, first);
  install("next.key", "dc-a.key");
  install("next.crt", "dc-a.crt");
  assert_int_equal(kill(g_pid, SIGHUP), 0);
  wait_log("certificates reloaded", 1);
  log_line("certificates reloaded", line, sizeof line);
  assert_non_null(strstr(line, second));
  assert_non_null(strstr(line, "CN=dc-a"));
  assert_non_null(strstr(line, "notAfter 20"));
  served_serial(served, sizeof served);
  assert_string_equal(served, second);
  assert_serving(old_cli);
  assert_serving_fresh();
  assert_int_equal(log_count("certificate reload failed"), 0);

  /* a broken pair: the certificate of a third dc-a pair with dc-b's key */
  issue_dca("third", 0, 0);
  copy_file("dc-b.key", "broken.key");
  install("broken.key", "dc-a.key");
  install("third.crt", "dc-a.crt");
  assert_int_equal(kill(g_pid, SIGHUP), 0);
  wait_log("certificate reload failed", 1);
  log_line("certificate reload failed", line, sizeof line);
  assert_non_null(strstr(line, "dc-a.key"));
  assert_non_null(strstr(line, "does not match certificate"));
  assert_non_null(strstr(line, second)); /* the serial still served */
  served_serial(served, sizeof served);
  assert_string_equal(served, second);
  assert_serving_fresh();
  assert_serving(old_cli);

  /* the key missing */
  char p[512];
  snprintf(p, sizeof p, "%s/dc-a.key", g_dir);
  assert_int_equal(unlink(p), 0);
  assert_int_equal(kill(g_pid, SIGHUP), 0);
  wait_log("certificate reload failed", 2);
  log_line("certificate reload failed", line, sizeof line);
  assert_non_null(strstr(line, "dc-a.key"));
  assert_non_null(strstr(line, "No such file"));
  served_serial(served, sizeof served);
  assert_string_equal(served, second);

  /* an expired certificate with its own key */
  int64_t now = (int64_t)time(NULL);
  issue_dca("expired", now - 2 * 86400, now - 86400);
  install("expired.key", "dc-a.key");
  install("expired.crt", "dc-a.crt");
  assert_int_equal(kill(g_pid, SIGHUP), 0);
  wait_log("certificate reload failed", 3);
  log_line("certificate reload failed", line, sizeof line);
  assert_non_null(strstr(line, "dc-a.crt"));
  assert_non_null(strstr(line, "expired"));
  served_serial(served, sizeof served);
  assert_string_equal(served, second);
  assert_serving_fresh();
  assert_int_equal(log_count("certificates reloaded"), 1);

  nb_rpc_client_destroy(old_cli);
  nb_tls_destroy(old_tls);
  stop_gateway(1); /* SIGTERM: exit status 0 */
}

/* The Federation channel to the peer presents the pair loaded last: the connection made after
 * a reload carries the new certificate, and after a refused reload still the good one. */
static void test_rotate_federation(void** state) {
  (void)state;
  char first[128], second[128], got[128];
  file_serial("dc-a", first, sizeof first);
  federation_serial(0, got, sizeof got);
  assert_string_equal(got, first);

  issue_dca("next", 0, 0);
  file_serial("next", second, sizeof second);
  install("next.key", "dc-a.key");
  install("next.crt", "dc-a.crt");
  assert_int_equal(kill(g_pid, SIGHUP), 0);
  wait_log("certificates reloaded", 1);
  int n = peer_handshakes();
  federation_serial(n, got, sizeof got);
  assert_string_equal(got, second);

  copy_file("dc-b.key", "broken.key"); /* refused: the channels stay as they are */
  install("broken.key", "dc-a.key");
  assert_int_equal(kill(g_pid, SIGHUP), 0);
  wait_log("certificate reload failed", 1);
  n = peer_handshakes();
  federation_serial(n, got, sizeof got);
  assert_string_equal(got, second);
  stop_gateway(1);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NEBULA_BINARY\n", argv[0]);
    return 2;
  }
  g_nebula = argv[1];
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_rotate, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rotate_federation, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
