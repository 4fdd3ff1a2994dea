/* The certificates of security/pki in real TLS handshakes (OpenSSL's libssl, in memory over a
 * BIO pair, mutual authentication, TLS 1.3): valid pairs succeed with the right identities, and
 * a missing client certificate, a foreign CA, a user certificate as a server and a wrong host
 * name each fail. Independent of gRPC; the gRPC credentials have their own tests. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <string.h>

#include "common/common.h"
#include "security/security.h"

typedef struct {
  EVP_PKEY* key;
  X509* cert;
} cred_t;

static cred_t ca, other_ca, dca, dcb, alice, foreign_dcb;

static cred_t mk(cred_t* issuer, nb_pki_kind_t kind, const char* name) {
  static const char* sans[] = {"127.0.0.1", "::1", "localhost"};
  cred_t c = {0};
  nb_pki_issue_opts_t o = {.kind = kind, .name = name};
  if (kind == NB_PKI_CLUSTER) {
    o.sans = sans;
    o.n_sans = 3;
  }
  if (nb_pki_cert_issue(issuer->key, issuer->cert, &o, &c.key, &c.cert) != NB_OK)
    fail_msg("issue: %s", nb_error_last());
  return c;
}

static int setup(void** state) {
  (void)state;
  if (nb_pki_ca_create(NULL, 0, &ca.key, &ca.cert) != NB_OK) return -1;
  if (nb_pki_ca_create(NULL, 0, &other_ca.key, &other_ca.cert) != NB_OK) return -1;
  dca = mk(&ca, NB_PKI_CLUSTER, "dc-a");
  dcb = mk(&ca, NB_PKI_CLUSTER, "dc-b");
  alice = mk(&ca, NB_PKI_USER, "alice");
  foreign_dcb = mk(&other_ca, NB_PKI_CLUSTER, "dc-b");
  return 0;
}

static int teardown(void** state) {
  (void)state;
  cred_t* all[] = {&ca, &other_ca, &dca, &dcb, &alice, &foreign_dcb};
  for (size_t i = 0; i < 6; i++) {
    EVP_PKEY_free(all[i]->key);
    X509_free(all[i]->cert);
  }
  return 0;
}

static SSL_CTX* ctx_for(int server, const cred_t* me, X509* trust) {
  SSL_CTX* x = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  assert_non_null(x);
  SSL_CTX_set_min_proto_version(x, TLS1_3_VERSION);
  if (me) {
    assert_int_equal(SSL_CTX_use_certificate(x, me->cert), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(x, me->key), 1);
  }
  assert_int_equal(X509_STORE_add_cert(SSL_CTX_get_cert_store(x), trust), 1);
  SSL_CTX_set_verify(x, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), NULL);
  /* the purpose each side requires of the other, as gRPC's TLS does */
  SSL_CTX_set_purpose(x, server ? X509_PURPOSE_SSL_CLIENT : X509_PURPOSE_SSL_SERVER);
  return x;
}

typedef struct {
  int ok;
  nb_pki_identity_t server_saw, client_saw;
} result_t;

/* Runs a handshake and one byte of application data each way (in TLS 1.3 the server's verdict on
 * the client certificate reaches the client only then). */
static result_t handshake(const cred_t* server, const cred_t* client, const char* host,
                          const char* ip) {
  result_t r = {0};
  SSL_CTX* sx = ctx_for(1, server, ca.cert);
  SSL_CTX* cx = ctx_for(0, client, ca.cert);
  SSL* s = SSL_new(sx);
  SSL* c = SSL_new(cx);
  BIO *bc, *bs;
  assert_int_equal(BIO_new_bio_pair(&bc, 0, &bs, 0), 1);
  SSL_set_bio(c, bc, bc);
  SSL_set_bio(s, bs, bs);
  if (host) assert_int_equal(SSL_set1_host(c, host), 1);
  if (ip) assert_int_equal(X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c), ip), 1);
  SSL_set_connect_state(c);
  SSL_set_accept_state(s);
  int cdone = 0, sdone = 0, failed = 0;
  for (int i = 0; i < 50 && !(cdone && sdone) && !failed; i++) {
    if (!cdone) {
      int rc = SSL_do_handshake(c);
      int e = SSL_get_error(c, rc);
      if (rc == 1)
        cdone = 1;
      else if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
        failed = 1;
    }
    if (!sdone) {
      int rc = SSL_do_handshake(s);
      int e = SSL_get_error(s, rc);
      if (rc == 1)
        sdone = 1;
      else if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
        failed = 1;
    }
  }
  char b = 0;
  if (!failed && cdone && sdone && SSL_write(c, "x", 1) == 1 && SSL_read(s, &b, 1) == 1 &&
      SSL_write(s, "y", 1) == 1 && SSL_read(c, &b, 1) == 1 && b == 'y' &&
      SSL_get_verify_result(s) == X509_V_OK && SSL_get_verify_result(c) == X509_V_OK) {
    r.ok = 1;
    X509* ps = SSL_get0_peer_certificate(s);
    X509* pc = SSL_get0_peer_certificate(c);
    if (ps) nb_pki_identity_from_cert(ps, &r.server_saw);
    if (pc) nb_pki_identity_from_cert(pc, &r.client_saw);
  }
  ERR_clear_error();
  SSL_free(s);
  SSL_free(c);
  SSL_CTX_free(sx);
  SSL_CTX_free(cx);
  return r;
}

static void test_valid_pairs(void** state) {
  (void)state;
  result_t r = handshake(&dca, &dcb, "dc-a", NULL);
  assert_true(r.ok);
  assert_int_equal(r.server_saw.kind, NB_PKI_CLUSTER);
  assert_string_equal(r.server_saw.name, "dc-b");
  assert_int_equal(r.client_saw.kind, NB_PKI_CLUSTER);
  assert_string_equal(r.client_saw.name, "dc-a");
  r = handshake(&dca, &dcb, NULL, "127.0.0.1");
  assert_true(r.ok);
  r = handshake(&dca, &dcb, "localhost", "::1");
  assert_true(r.ok);
  r = handshake(&dca, &alice, "dc-a", NULL);
  assert_true(r.ok);
  assert_int_equal(r.server_saw.kind, NB_PKI_USER);
  assert_string_equal(r.server_saw.name, "alice");
}

static void test_refused(void** state) {
  (void)state;
  assert_false(handshake(&dca, NULL, "dc-a", NULL).ok);         /* no client certificate */
  assert_false(handshake(&dca, &foreign_dcb, "dc-a", NULL).ok); /* client from another CA */
  assert_false(handshake(&foreign_dcb, &dca, "dc-b", NULL).ok); /* server from another CA */
  assert_false(handshake(&alice, &dcb, NULL, NULL).ok);         /* a user is no server */
  assert_false(handshake(&dca, &dcb, "dc-b", NULL).ok);         /* wrong host name */
  assert_false(handshake(&dca, &dcb, NULL, "169.254.1.1").ok);  /* IP not in the SANs */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_pairs),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
