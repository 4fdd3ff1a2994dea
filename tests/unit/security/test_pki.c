/* Unit tests of security/pki: CA + issue + verify round trips (with the openssl CLI as an
 * independent reference), foreign and expired certificates, identities, key file modes and
 * all-or-nothing writes, and the `nebula certs` command. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/common.h"
#include "sec_test_util.h"
#include "security/security.h"

static EVP_PKEY* ca_key;
static X509* ca_cert;

static int setup_ca(void** state) {
  (void)state;
  return nb_pki_ca_create("test CA", 0, &ca_key, &ca_cert) == NB_OK ? 0 : -1;
}

static int teardown_ca(void** state) {
  (void)state;
  EVP_PKEY_free(ca_key);
  X509_free(ca_cert);
  return 0;
}

static void issue(nb_pki_kind_t kind, const char* name, EVP_PKEY** k, X509** c) {
  static const char* sans[] = {"127.0.0.1", "localhost", "IP:::1", "DNS:gw.example"};
  nb_pki_issue_opts_t o = {.kind = kind, .name = name};
  if (kind == NB_PKI_CLUSTER) {
    o.sans = sans;
    o.n_sans = 4;
  }
  nb_status_t st = nb_pki_cert_issue(ca_key, ca_cert, &o, k, c);
  if (st != NB_OK) fail_msg("issue %s: %s", name, nb_error_last());
}

static void test_names(void** state) {
  (void)state;
  assert_int_equal(nb_pki_name_check("dc-a", "x"), NB_OK);
  assert_int_equal(nb_pki_name_check("eu.west_1", "x"), NB_OK);
  assert_int_equal(nb_pki_name_check("", "x"), NB_ERR_INVALID);
  assert_int_equal(nb_pki_name_check(NULL, "x"), NB_ERR_INVALID);
  assert_int_equal(nb_pki_name_check("-dash", "x"), NB_ERR_INVALID);
  assert_int_equal(nb_pki_name_check("a/b", "x"), NB_ERR_INVALID);
  assert_int_equal(nb_pki_name_check("a,DNS:evil", "cluster id"), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "cluster id"));
  char longname[80];
  memset(longname, 'a', sizeof longname);
  longname[64] = '\0';
  assert_int_equal(nb_pki_name_check(longname, "x"), NB_ERR_INVALID);
  longname[63] = '\0';
  assert_int_equal(nb_pki_name_check(longname, "x"), NB_OK);

  nb_pki_identity_t id;
  assert_int_equal(nb_pki_identity_parse_uri("nebula://cluster/dc-a", &id), NB_OK);
  assert_int_equal(id.kind, NB_PKI_CLUSTER);
  assert_string_equal(id.name, "dc-a");
  assert_int_equal(nb_pki_identity_parse_uri("nebula://user/alice", &id), NB_OK);
  assert_int_equal(id.kind, NB_PKI_USER);
  char buf[96];
  assert_int_equal(nb_pki_identity_uri(&id, buf, sizeof buf), NB_OK);
  assert_string_equal(buf, "nebula://user/alice");
  assert_int_equal(nb_pki_identity_parse_uri("nebula://robot/x", &id), NB_ERR_INVALID);
  assert_int_equal(nb_pki_identity_parse_uri("https://cluster/x", &id), NB_ERR_INVALID);
  assert_int_equal(nb_pki_identity_parse_uri("nebula://cluster/", &id), NB_ERR_INVALID);
  assert_int_equal(nb_pki_identity_parse_uri("nebula://cluster/a/b", &id), NB_ERR_INVALID);
}

static void test_issue_verify_roundtrip(void** state) {
  (void)state;
  EVP_PKEY *ck, *uk;
  X509 *cc, *uc;
  issue(NB_PKI_CLUSTER, "dc-a", &ck, &cc);
  issue(NB_PKI_USER, "alice", &uk, &uc);
  assert_int_equal(nb_pki_key_matches(ck, cc), NB_OK);
  assert_int_equal(nb_pki_key_matches(uk, cc), NB_ERR_INVALID);

  nb_pki_identity_t dca = {.kind = NB_PKI_CLUSTER, .name = "dc-a"};
  nb_pki_identity_t dcb = {.kind = NB_PKI_CLUSTER, .name = "dc-b"};
  nb_pki_identity_t alice = {.kind = NB_PKI_USER, .name = "alice"};
  /* a cluster cert is both a TLS server and a TLS client */
  assert_int_equal(nb_pki_cert_verify(cc, ca_cert, NB_PKI_USAGE_SERVER, &dca), NB_OK);
  assert_int_equal(nb_pki_cert_verify(cc, ca_cert, NB_PKI_USAGE_CLIENT, &dca), NB_OK);
  /* the identity the job expects is checked */
  assert_int_equal(nb_pki_cert_verify(cc, ca_cert, NB_PKI_USAGE_SERVER, &dcb), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "dc-b"));
  /* a user cert is a client only */
  assert_int_equal(nb_pki_cert_verify(uc, ca_cert, NB_PKI_USAGE_CLIENT, &alice), NB_OK);
  assert_int_equal(nb_pki_cert_verify(uc, ca_cert, NB_PKI_USAGE_SERVER, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "purpose"));
  assert_int_equal(nb_pki_cert_verify(uc, ca_cert, NB_PKI_USAGE_CLIENT, &dca), NB_ERR_PERMISSION);
  /* the CA verifies itself but has no identity */
  assert_int_equal(nb_pki_cert_verify(ca_cert, ca_cert, NB_PKI_USAGE_ANY, NULL), NB_OK);
  assert_int_equal(nb_pki_cert_verify(ca_cert, ca_cert, NB_PKI_USAGE_ANY, &dca), NB_ERR_PERMISSION);

  /* identities from X509 and from PEM text (what gRPC's auth context gives) */
  nb_pki_identity_t id;
  assert_int_equal(nb_pki_identity_from_cert(cc, &id), NB_OK);
  assert_int_equal(id.kind, NB_PKI_CLUSTER);
  assert_string_equal(id.name, "dc-a");
  char* pem = NULL;
  assert_int_equal(nb_pki_cert_to_pem(uc, &pem), NB_OK);
  assert_int_equal(nb_pki_identity_from_pem(pem, 0, &id), NB_OK);
  assert_int_equal(id.kind, NB_PKI_USER);
  assert_string_equal(id.name, "alice");
  assert_int_equal(nb_pki_identity_from_pem(pem, strlen(pem), &id), NB_OK);
  assert_int_equal(nb_pki_identity_check_pem(pem, 0, &alice), NB_OK);
  assert_int_equal(nb_pki_identity_check_pem(pem, 0, &dca), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "peer is user 'alice', expected cluster 'dc-a'"));
  assert_int_equal(nb_pki_identity_check_pem("junk", 0, &alice), NB_ERR_PERMISSION);
  assert_int_equal(nb_pki_identity_from_pem("-----BEGIN CERTIFICATE-----\ngarbage\n", 0, &id),
                   NB_ERR_INVALID);
  assert_int_equal(id.kind, NB_PKI_NONE);
  assert_int_equal(nb_pki_identity_from_pem("", 0, &id), NB_ERR_INVALID);
  assert_int_equal(nb_pki_identity_from_cert(ca_cert, &id), NB_ERR_NOT_FOUND);
  nb_free(pem);

  /* description: what `nebula certs show` prints */
  char* text = NULL;
  assert_int_equal(nb_pki_cert_describe(cc, &text), NB_OK);
  assert_non_null(strstr(text, "URI:nebula://cluster/dc-a"));
  assert_non_null(strstr(text, "IP:127.0.0.1"));
  assert_non_null(strstr(text, "IP:::1"));
  assert_non_null(strstr(text, "DNS:localhost"));
  assert_non_null(strstr(text, "serverAuth, clientAuth"));
  assert_non_null(strstr(text, "identity:    cluster dc-a"));
  assert_non_null(strstr(text, "sha256:"));
  nb_free(text);

  EVP_PKEY_free(ck);
  EVP_PKEY_free(uk);
  X509_free(cc);
  X509_free(uc);
}

static void test_bad_issue_input(void** state) {
  (void)state;
  EVP_PKEY* k = (EVP_PKEY*)1;
  X509* c = (X509*)1;
  const char* bad_san[] = {"not a host!"};
  nb_pki_issue_opts_t o = {.kind = NB_PKI_CLUSTER, .name = "dc-a", .sans = bad_san, .n_sans = 1};
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_ERR_INVALID);
  assert_null(k);
  assert_null(c);
  const char* bad_ip[] = {"IP:300.1.1.1"};
  o.sans = bad_ip;
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_ERR_INVALID);
  o = (nb_pki_issue_opts_t){.kind = NB_PKI_USER, .name = "bob", .sans = bad_ip, .n_sans = 1};
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_ERR_INVALID);
  o = (nb_pki_issue_opts_t){.kind = NB_PKI_NONE, .name = "bob"};
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_ERR_INVALID);
  o = (nb_pki_issue_opts_t){.kind = NB_PKI_USER, .name = "bad name"};
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_ERR_INVALID);
}

static void test_foreign_ca_rejected(void** state) {
  (void)state;
  EVP_PKEY *k2, *ck;
  X509 *c2, *cc;
  assert_int_equal(nb_pki_ca_create("other CA", 0, &k2, &c2), NB_OK);
  nb_pki_issue_opts_t o = {.kind = NB_PKI_CLUSTER, .name = "dc-a"};
  assert_int_equal(nb_pki_cert_issue(k2, c2, &o, &ck, &cc), NB_OK);
  /* right name, right usage, wrong CA */
  nb_pki_identity_t dca = {.kind = NB_PKI_CLUSTER, .name = "dc-a"};
  assert_int_equal(nb_pki_cert_verify(cc, ca_cert, NB_PKI_USAGE_SERVER, &dca), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "not trusted"));
  assert_int_equal(nb_pki_cert_verify(cc, c2, NB_PKI_USAGE_SERVER, &dca), NB_OK);
  /* another CA with the same name is still another CA */
  EVP_PKEY* k3;
  X509* c3;
  assert_int_equal(nb_pki_ca_create("test CA", 0, &k3, &c3), NB_OK);
  assert_int_equal(nb_pki_cert_verify(cc, c3, NB_PKI_USAGE_SERVER, NULL), NB_ERR_PERMISSION);
  EVP_PKEY_free(k2);
  EVP_PKEY_free(k3);
  EVP_PKEY_free(ck);
  X509_free(c2);
  X509_free(c3);
  X509_free(cc);
}

static void test_validity(void** state) {
  (void)state;
  int64_t now = (int64_t)time(NULL);
  EVP_PKEY* k;
  X509* c;
  nb_pki_issue_opts_t o = {
      .kind = NB_PKI_USER, .name = "old", .not_before = now - 10 * 86400, .not_after = now - 86400};
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_OK);
  assert_int_equal(nb_pki_cert_verify(c, ca_cert, NB_PKI_USAGE_CLIENT, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "expired"));
  EVP_PKEY_free(k);
  X509_free(c);
  o.not_before = now + 86400;
  o.not_after = now + 10 * 86400;
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_OK);
  assert_int_equal(nb_pki_cert_verify(c, ca_cert, NB_PKI_USAGE_CLIENT, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "not yet valid"));
  EVP_PKEY_free(k);
  X509_free(c);
  o.not_after = o.not_before - 1;
  assert_int_equal(nb_pki_cert_issue(ca_key, ca_cert, &o, &k, &c), NB_ERR_INVALID);
}

static mode_t mode_of(const char* p) {
  struct stat sb;
  assert_int_equal(stat(p, &sb), 0);
  return sb.st_mode & 07777;
}

static void test_dir_files_and_modes(void** state) {
  (void)state;
  const char* d = sec_tmpdir();
  assert_non_null(d);
  char pki[600], p[700], p2[700];
  snprintf(pki, sizeof pki, "%s/pki", d);
  mode_t old = umask(0); /* a permissive umask must not loosen key files */
  assert_int_equal(nb_pki_dir_init(pki, NULL, 0, 0), NB_OK);
  snprintf(p, sizeof p, "%s/ca.key", pki);
  assert_int_equal(mode_of(p), 0600);
  snprintf(p, sizeof p, "%s/ca.crt", pki);
  assert_int_equal(mode_of(p), 0644);
  assert_int_equal(mode_of(pki), 0700);

  /* never overwrite an existing CA without force */
  snprintf(p, sizeof p, "%s/ca.key", pki);
  char* before = sec_slurp(p, NULL);
  assert_int_equal(nb_pki_dir_init(pki, NULL, 0, 0), NB_ERR_EXISTS);
  assert_non_null(strstr(nb_error_last(), "ca.key"));
  char* after = sec_slurp(p, NULL);
  assert_string_equal(before, after);
  free(after);
  assert_int_equal(nb_pki_dir_init(pki, NULL, 0, 1), NB_OK);
  after = sec_slurp(p, NULL);
  assert_string_not_equal(before, after);
  assert_int_equal(mode_of(p), 0600);
  free(before);
  free(after);

  nb_pki_issue_opts_t o = {.kind = NB_PKI_CLUSTER, .name = "dc-a"};
  assert_int_equal(nb_pki_dir_issue(pki, &o, 0), NB_OK);
  assert_int_equal(nb_pki_path(pki, NB_PKI_CLUSTER, "dc-a", "key", p, sizeof p), NB_OK);
  assert_int_equal(mode_of(p), 0600);
  assert_int_equal(nb_pki_path(pki, NB_PKI_CLUSTER, "dc-a", "crt", p2, sizeof p2), NB_OK);
  assert_int_equal(mode_of(p2), 0644);
  EVP_PKEY* k;
  X509 *c, *ca;
  assert_int_equal(nb_pki_key_load(p, &k), NB_OK);
  assert_int_equal(nb_pki_cert_load(p2, &c), NB_OK);
  assert_int_equal(nb_pki_key_matches(k, c), NB_OK);
  snprintf(p, sizeof p, "%s/ca.crt", pki);
  assert_int_equal(nb_pki_cert_load(p, &ca), NB_OK);
  assert_int_equal(nb_pki_cert_verify(c, ca, NB_PKI_USAGE_SERVER, NULL), NB_OK);
  EVP_PKEY_free(k);
  X509_free(c);
  X509_free(ca);
  assert_int_equal(nb_pki_dir_issue(pki, &o, 0), NB_ERR_EXISTS);
  assert_int_equal(nb_pki_dir_issue(pki, &o, 1), NB_OK);

  /* all or nothing: an existing certificate blocks the pair, and no key is left behind */
  snprintf(p, sizeof p, "%s/clusters/dc-b.crt", pki);
  FILE* f = fopen(p, "w");
  fputs("placeholder\n", f);
  fclose(f);
  o.name = "dc-b";
  assert_int_equal(nb_pki_dir_issue(pki, &o, 0), NB_ERR_EXISTS);
  snprintf(p, sizeof p, "%s/clusters/dc-b.key", pki);
  assert_false(sec_exists(p));
  /* a bad SAN fails before anything is written */
  const char* bad[] = {"bad host!"};
  o = (nb_pki_issue_opts_t){.kind = NB_PKI_CLUSTER, .name = "dc-c", .sans = bad, .n_sans = 1};
  assert_int_equal(nb_pki_dir_issue(pki, &o, 0), NB_ERR_INVALID);
  snprintf(p, sizeof p, "%s/clusters/dc-c.key", pki);
  assert_false(sec_exists(p));
  snprintf(p, sizeof p, "%s/clusters", pki);
  assert_int_equal(sec_count_named(p, ".tmp."), 0);
  assert_int_equal(sec_count_named(pki, ".tmp."), 0);
  /* a key write into a missing folder leaves nothing and says so */
  snprintf(p, sizeof p, "%s/nope/x.key", pki);
  EVP_PKEY* kk = EVP_EC_gen("P-256");
  assert_int_equal(nb_pki_key_write(p, kk, 0), NB_ERR_NOT_FOUND);
  snprintf(p, sizeof p, "%s/solo.key", pki);
  assert_int_equal(nb_pki_key_write(p, kk, 0), NB_OK);
  assert_int_equal(mode_of(p), 0600);
  assert_int_equal(nb_pki_key_write(p, kk, 0), NB_ERR_EXISTS);
  EVP_PKEY_free(kk);
  umask(old);
  sec_rmtree(d);
}

static void test_dir_bad_inputs(void** state) {
  (void)state;
  const char* d = sec_tmpdir();
  char p[700];
  nb_pki_issue_opts_t o = {.kind = NB_PKI_USER, .name = "alice"};
  /* no CA at all */
  assert_int_equal(nb_pki_dir_issue(d, &o, 0), NB_ERR_NOT_FOUND);
  assert_non_null(strstr(nb_error_last(), "ca.crt"));
  /* garbage CA certificate */
  snprintf(p, sizeof p, "%s/ca.crt", d);
  FILE* f = fopen(p, "w");
  fputs("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n", f);
  fclose(f);
  snprintf(p, sizeof p, "%s/ca.key", d);
  f = fopen(p, "w");
  fputs("junk\n", f);
  fclose(f);
  assert_int_equal(nb_pki_dir_issue(d, &o, 0), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "not a PEM certificate"));
  X509* x = NULL;
  assert_int_equal(nb_pki_cert_load(p, &x), NB_ERR_INVALID); /* a key file is not a cert */
  EVP_PKEY* k = NULL;
  assert_int_equal(nb_pki_key_load(p, &k), NB_ERR_INVALID);
  snprintf(p, sizeof p, "%s/missing.crt", d);
  assert_int_equal(nb_pki_cert_load(p, &x), NB_ERR_NOT_FOUND);
  /* a CA whose key belongs to another CA */
  char d2[600];
  snprintf(d2, sizeof d2, "%s/a", d);
  assert_int_equal(nb_pki_dir_init(d2, NULL, 0, 0), NB_OK);
  char d3[600];
  snprintf(d3, sizeof d3, "%s/b", d);
  assert_int_equal(nb_pki_dir_init(d3, NULL, 0, 0), NB_OK);
  assert_int_equal(sec_sh("cp '%s/ca.key' '%s/ca.key'", d3, d2), 0);
  assert_int_equal(nb_pki_dir_issue(d2, &o, 0), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "is not the key of"));
  snprintf(p, sizeof p, "%s/users/alice.key", d2);
  assert_false(sec_exists(p));
  sec_rmtree(d);
}

/* The openssl program is an independent judge of what we produced. */
static void test_openssl_cli_reference(void** state) {
  (void)state;
  if (!sec_have_openssl()) {
    print_message("openssl program not found: reference check skipped\n");
    skip();
  }
  const char* d = sec_tmpdir();
  char pki[600], other[600];
  snprintf(pki, sizeof pki, "%s/pki", d);
  snprintf(other, sizeof other, "%s/other", d);
  assert_int_equal(nb_pki_dir_init(pki, NULL, 0, 0), NB_OK);
  assert_int_equal(nb_pki_dir_init(other, NULL, 0, 0), NB_OK);
  const char* sans[] = {"169.254.10.1"};
  nb_pki_issue_opts_t o = {.kind = NB_PKI_CLUSTER, .name = "dc-a", .sans = sans, .n_sans = 1};
  assert_int_equal(nb_pki_dir_issue(pki, &o, 0), NB_OK);
  assert_int_equal(nb_pki_dir_issue(other, &o, 0), NB_OK);
  o = (nb_pki_issue_opts_t){.kind = NB_PKI_USER, .name = "alice"};
  assert_int_equal(nb_pki_dir_issue(pki, &o, 0), NB_OK);
  const char* v = "openssl verify -x509_strict -CAfile '%s/ca.crt' -purpose %s '%s/%s'";
  assert_int_equal(sec_sh(v, pki, "sslserver", pki, "clusters/dc-a.crt"), 0);
  assert_int_equal(sec_sh(v, pki, "sslclient", pki, "clusters/dc-a.crt"), 0);
  assert_int_equal(sec_sh(v, pki, "sslclient", pki, "users/alice.crt"), 0);
  assert_int_not_equal(sec_sh(v, pki, "sslserver", pki, "users/alice.crt"), 0);
  assert_int_not_equal(sec_sh(v, pki, "sslserver", other, "clusters/dc-a.crt"), 0);
  /* the CA as openssl sees it, and the key pairs */
  assert_int_equal(
      sec_sh("openssl x509 -in '%s/ca.crt' -noout -text | grep -A1 'Basic Constraints: "
             "critical' | grep -q 'CA:TRUE'",
             pki),
      0);
  assert_int_equal(sec_sh("openssl x509 -in '%s/ca.crt' -noout -text | grep -A1 'Key Usage: "
                          "critical' | grep -q 'Certificate Sign'",
                          pki),
                   0);
  assert_int_equal(sec_sh("openssl x509 -in '%s/clusters/dc-a.crt' -noout -ext subjectAltName | "
                          "grep -q 'URI:nebula://cluster/dc-a'",
                          pki),
                   0);
  assert_int_equal(sec_sh("openssl x509 -in '%s/clusters/dc-a.crt' -noout -ext subjectAltName | "
                          "grep -q 'IP Address:169.254.10.1'",
                          pki),
                   0);
  assert_int_equal(sec_sh("openssl pkey -in '%s/clusters/dc-a.key' -noout -check", pki), 0);
  assert_int_equal(sec_sh("test \"$(openssl x509 -in '%1$s/clusters/dc-a.crt' -noout -pubkey)\" = "
                          "\"$(openssl pkey -in '%1$s/clusters/dc-a.key' -pubout)\"",
                          pki),
                   0);
  sec_rmtree(d);
}

static void test_certs_cli(void** state) {
  (void)state;
  const char* d = sec_tmpdir();
  char pki[600], crt[700];
  snprintf(pki, sizeof pki, "%s/pki", d);
  snprintf(crt, sizeof crt, "%s/clusters/dc-a.crt", pki);
  /* a failed init (a CN longer than 64 bytes) leaves no folder behind */
  char* bad_cn[] = {"certs", "init",
                    "--dir", pki,
                    "--cn",  "a-common-name-that-is-far-too-long-for-a-certificate-authority-cn-x",
                    NULL};
  assert_int_equal(nb_certs_main(6, bad_cn), 1);
  assert_int_equal(access(pki, F_OK), -1);
  char* init[] = {"certs", "init", "--dir", pki, NULL};
  assert_int_equal(nb_certs_main(4, init), 0);
  assert_int_equal(nb_certs_main(4, init), 1); /* exists */
  char* issue_c[] = {"certs", "issue", "--dir",     pki, "--cluster",
                     "dc-a",  "--san", "127.0.0.1", NULL};
  assert_int_equal(nb_certs_main(8, issue_c), 0);
  char* issue_u[] = {"certs", "issue", "--dir", pki, "--user", "alice", NULL};
  assert_int_equal(nb_certs_main(6, issue_u), 0);
  char* both[] = {"certs", "issue", "--dir", pki, "--user", "a", "--cluster", "b", NULL};
  assert_int_equal(nb_certs_main(8, both), 2);
  char* bogus[] = {"certs", "frobnicate", NULL};
  assert_int_equal(nb_certs_main(2, bogus), 2);
  char* badopt[] = {"certs", "init", "--dri", pki, NULL};
  assert_int_equal(nb_certs_main(4, badopt), 2);
  char* ver[] = {"certs", "verify",  "--dir",  pki, "--cluster",
                 "dc-a",  "--usage", "server", crt, NULL};
  assert_int_equal(nb_certs_main(9, ver), 0);
  char* ver_wrong[] = {"certs", "verify", "--dir", pki, "--cluster", "dc-b", crt, NULL};
  assert_int_equal(nb_certs_main(7, ver_wrong), 1);
  /* signed by this CA with CN=alice and no subjectAltName: a good chain, but no nebula identity,
   * so verify refuses it as every gateway does (docs/security.md, Identity) */
  assert_int_equal(
      sec_sh("cd '%1$s' && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 "
             "-out cn.key 2>/dev/null && openssl req -new -key cn.key -subj /O=nebula/CN=alice "
             "-out cn.csr 2>/dev/null && printf 'basicConstraints=critical,CA:FALSE\n"
             "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' > cn.ext && "
             "openssl x509 -req -in cn.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
             "-sha256 -extfile cn.ext -out cn.crt 2>/dev/null",
             pki),
      0);
  char cn_crt[700];
  snprintf(cn_crt, sizeof cn_crt, "%s/cn.crt", pki);
  char* ver_cn[] = {"certs", "verify", "--dir", pki, "--usage", "client", cn_crt, NULL};
  assert_int_equal(nb_certs_main(7, ver_cn), 1);
  assert_non_null(strstr(nb_error_last(), "no subjectAltName, so no nebula identity"));
  char* ver_cn_user[] = {"certs", "verify", "--dir", pki, "--user", "alice", cn_crt, NULL};
  assert_int_equal(nb_certs_main(7, ver_cn_user), 1);
  char* missing[] = {"certs", "show", "/nonexistent/x.crt", NULL};
  assert_int_equal(nb_certs_main(3, missing), 1);
  /* show, captured through a pipe to a file */
  char out[700];
  snprintf(out, sizeof out, "%s/show.txt", d);
  fflush(stdout);
  int saved = dup(1);
  FILE* f = fopen(out, "w");
  dup2(fileno(f), 1);
  char* show[] = {"certs", "show", crt, NULL};
  int rc = nb_certs_main(3, show);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  fclose(f);
  assert_int_equal(rc, 0);
  char* text = sec_slurp(out, NULL);
  assert_non_null(text);
  assert_non_null(strstr(text, "identity:    cluster dc-a"));
  assert_non_null(strstr(text, "IP:127.0.0.1"));
  free(text);
  sec_rmtree(d);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Mutated certificates and random text: never a crash, never a mutated certificate accepted. */
static void test_garbage_certs(void** state) {
  (void)state;
  EVP_PKEY* k;
  X509* c;
  issue(NB_PKI_CLUSTER, "dc-a", &k, &c);
  unsigned char* der = NULL;
  int n = i2d_X509(c, &der);
  assert_true(n > 100);
  unsigned char* m = malloc((size_t)n);
  int parsed = 0;
  for (int it = 0; it < 400; it++) {
    memcpy(m, der, (size_t)n);
    int flips = 1 + (int)(rng() % 4);
    for (int f = 0; f < flips; f++) m[rng() % (uint64_t)n] ^= (unsigned char)(1 + rng() % 255);
    const unsigned char* p = m;
    X509* x = d2i_X509(NULL, &p, n);
    if (!x) continue;
    parsed++;
    nb_pki_identity_t id;
    (void)nb_pki_identity_from_cert(x, &id);
    char* text = NULL;
    if (nb_pki_cert_describe(x, &text) == NB_OK) nb_free(text);
    if (memcmp(m, der, (size_t)n) != 0)
      assert_int_not_equal(nb_pki_cert_verify(x, ca_cert, NB_PKI_USAGE_ANY, NULL), NB_OK);
    X509_free(x);
  }
  print_message("%d of 400 mutated certificates parsed; none verified\n", parsed);
  char junk[600];
  for (int it = 0; it < 300; it++) {
    size_t len = rng() % sizeof junk;
    for (size_t i = 0; i < len; i++) junk[i] = (char)(rng() % 256);
    if (it % 3 == 0 && len > 40) memcpy(junk, "-----BEGIN CERTIFICATE-----\n", 28);
    nb_pki_identity_t id;
    assert_int_not_equal(nb_pki_identity_from_pem(junk, len ? len : 1, &id), NB_OK);
  }
  free(m);
  OPENSSL_free(der);
  EVP_PKEY_free(k);
  X509_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),           cmocka_unit_test(test_issue_verify_roundtrip),
      cmocka_unit_test(test_bad_issue_input), cmocka_unit_test(test_foreign_ca_rejected),
      cmocka_unit_test(test_validity),        cmocka_unit_test(test_dir_files_and_modes),
      cmocka_unit_test(test_dir_bad_inputs),  cmocka_unit_test(test_openssl_cli_reference),
      cmocka_unit_test(test_certs_cli),       cmocka_unit_test(test_garbage_certs),
  };
  return cmocka_run_group_tests(tests, setup_ca, teardown_ca);
}
