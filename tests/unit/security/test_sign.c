/* Unit tests of security/sign: descriptor signatures valid, tampered, by the wrong user, by a
 * cluster or a foreign/expired certificate; checked against the openssl CLI; strict base64. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "sec_test_util.h"
#include "security/security.h"

static EVP_PKEY *ca_key, *alice_key, *bob_key, *dc_key;
static X509 *ca, *alice, *bob, *dc;

static void issue(nb_pki_kind_t kind, const char* name, EVP_PKEY** k, X509** c) {
  nb_pki_issue_opts_t o = {.kind = kind, .name = name};
  if (nb_pki_cert_issue(ca_key, ca, &o, k, c) != NB_OK) fail_msg("issue: %s", nb_error_last());
}

static int setup(void** state) {
  (void)state;
  if (nb_pki_ca_create(NULL, 0, &ca_key, &ca) != NB_OK) return -1;
  issue(NB_PKI_USER, "alice", &alice_key, &alice);
  issue(NB_PKI_USER, "bob", &bob_key, &bob);
  issue(NB_PKI_CLUSTER, "dc-a", &dc_key, &dc);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  EVP_PKEY_free(ca_key);
  EVP_PKEY_free(alice_key);
  EVP_PKEY_free(bob_key);
  EVP_PKEY_free(dc_key);
  X509_free(ca);
  X509_free(alice);
  X509_free(bob);
  X509_free(dc);
  return 0;
}

static const char desc[] =
    "{\"apiVersion\": \"nebula/v1\", \"name\": \"pretrain\", \"clusters\": [\"dc-a\", \"dc-b\"]}";

static void test_valid(void** state) {
  (void)state;
  uint8_t* sig = NULL;
  size_t n = 0;
  assert_int_equal(nb_sign_data(alice_key, desc, strlen(desc), &sig, &n), NB_OK);
  assert_true(n > 8 && n <= 72);
  nb_pki_identity_t who;
  assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, n, "alice", &who), NB_OK);
  assert_int_equal(who.kind, NB_PKI_USER);
  assert_string_equal(who.name, "alice");
  assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, n, NULL, NULL), NB_OK);
  nb_free(sig);
  /* empty data is signable too */
  assert_int_equal(nb_sign_data(alice_key, NULL, 0, &sig, &n), NB_OK);
  assert_int_equal(nb_sign_verify(alice, ca, NULL, 0, sig, n, "alice", NULL), NB_OK);
  nb_free(sig);
}

static void test_tampered(void** state) {
  (void)state;
  uint8_t* sig = NULL;
  size_t n = 0;
  assert_int_equal(nb_sign_data(alice_key, desc, strlen(desc), &sig, &n), NB_OK);
  char copy[sizeof desc];
  memcpy(copy, desc, sizeof desc);
  copy[30] ^= 0x01;
  nb_pki_identity_t who = {.kind = NB_PKI_USER, .name = "stale"};
  assert_int_equal(nb_sign_verify(alice, ca, copy, strlen(copy), sig, n, "alice", &who),
                   NB_ERR_INTEGRITY);
  assert_int_equal(who.kind, NB_PKI_NONE);
  assert_non_null(strstr(nb_error_last(), "alice"));
  assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc) - 1, sig, n, NULL, NULL),
                   NB_ERR_INTEGRITY);
  for (size_t i = 0; i < n; i += 7) {
    sig[i] ^= 0x04;
    assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, n, NULL, NULL),
                     NB_ERR_INTEGRITY);
    sig[i] ^= 0x04;
  }
  assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, n - 1, NULL, NULL),
                   NB_ERR_INTEGRITY);
  assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, 0, NULL, NULL),
                   NB_ERR_INTEGRITY);
  assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, n, NULL, NULL), NB_OK);
  nb_free(sig);
}

static void test_wrong_signer(void** state) {
  (void)state;
  uint8_t* sig = NULL;
  size_t n = 0;
  assert_int_equal(nb_sign_data(bob_key, desc, strlen(desc), &sig, &n), NB_OK);
  /* bob's signature presented with alice's certificate */
  assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, n, "alice", NULL),
                   NB_ERR_INTEGRITY);
  /* bob's certificate, but the submitter claims to be alice */
  assert_int_equal(nb_sign_verify(bob, ca, desc, strlen(desc), sig, n, "alice", NULL),
                   NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "bob"));
  assert_int_equal(nb_sign_verify(bob, ca, desc, strlen(desc), sig, n, "bob", NULL), NB_OK);
  nb_free(sig);
  /* a cluster key is not a user */
  assert_int_equal(nb_sign_data(dc_key, desc, strlen(desc), &sig, &n), NB_OK);
  assert_int_equal(nb_sign_verify(dc, ca, desc, strlen(desc), sig, n, NULL, NULL),
                   NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "not a user"));
  nb_free(sig);
}

static void test_untrusted_certs(void** state) {
  (void)state;
  /* a user "alice" from another CA signs: her certificate is not ours */
  EVP_PKEY *k2, *ek, *mk;
  X509 *c2, *ec, *mc;
  assert_int_equal(nb_pki_ca_create(NULL, 0, &k2, &c2), NB_OK);
  nb_pki_issue_opts_t o = {.kind = NB_PKI_USER, .name = "alice"};
  assert_int_equal(nb_pki_cert_issue(k2, c2, &o, &mk, &mc), NB_OK);
  uint8_t* sig = NULL;
  size_t n = 0;
  assert_int_equal(nb_sign_data(mk, desc, strlen(desc), &sig, &n), NB_OK);
  assert_int_equal(nb_sign_verify(mc, ca, desc, strlen(desc), sig, n, "alice", NULL),
                   NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "not trusted"));
  nb_free(sig);
  /* an expired user certificate */
  int64_t now = (int64_t)time(NULL);
  o = (nb_pki_issue_opts_t){
      .kind = NB_PKI_USER, .name = "carol", .not_before = now - 7200, .not_after = now - 3600};
  assert_int_equal(nb_pki_cert_issue(ca_key, ca, &o, &ek, &ec), NB_OK);
  assert_int_equal(nb_sign_data(ek, desc, strlen(desc), &sig, &n), NB_OK);
  assert_int_equal(nb_sign_verify(ec, ca, desc, strlen(desc), sig, n, "carol", NULL),
                   NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "expired"));
  nb_free(sig);
  /* not an EC key */
  EVP_PKEY* ed = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  assert_non_null(ed);
  assert_int_equal(nb_sign_data(ed, desc, 3, &sig, &n), NB_ERR_INVALID);
  EVP_PKEY_free(ed);
  EVP_PKEY_free(k2);
  EVP_PKEY_free(ek);
  EVP_PKEY_free(mk);
  X509_free(c2);
  X509_free(ec);
  X509_free(mc);
}

static void test_b64_forms(void** state) {
  (void)state;
  char* sig = NULL;
  assert_int_equal(nb_sign_data_b64(alice_key, desc, strlen(desc), &sig), NB_OK);
  char* pem = NULL;
  assert_int_equal(nb_pki_cert_to_pem(alice, &pem), NB_OK);
  nb_pki_identity_t who;
  assert_int_equal(nb_sign_verify_b64(pem, 0, ca, desc, strlen(desc), sig, "alice", &who), NB_OK);
  assert_string_equal(who.name, "alice");
  assert_int_equal(nb_sign_verify_b64("junk", 0, ca, desc, strlen(desc), sig, NULL, NULL),
                   NB_ERR_INVALID);
  assert_int_equal(nb_sign_verify_b64(pem, 0, ca, desc, strlen(desc), "!!!!", NULL, NULL),
                   NB_ERR_INVALID);
  sig[4] = sig[4] == 'A' ? 'B' : 'A';
  assert_int_equal(nb_sign_verify_b64(pem, 0, ca, desc, strlen(desc), sig, NULL, NULL),
                   NB_ERR_INTEGRITY);
  nb_free(sig);
  nb_free(pem);
}

static void test_b64(void** state) {
  (void)state;
  static const char* vec[][2] = {{"", ""},
                                 {"f", "Zg=="},
                                 {"fo", "Zm8="},
                                 {"foo", "Zm9v"},
                                 {"foob", "Zm9vYg=="},
                                 {"fooba", "Zm9vYmE="},
                                 {"foobar", "Zm9vYmFy"}};
  for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
    char* e = NULL;
    assert_int_equal(nb_b64_encode(vec[i][0], strlen(vec[i][0]), &e), NB_OK);
    assert_string_equal(e, vec[i][1]);
    uint8_t* d = NULL;
    size_t n = 99;
    assert_int_equal(nb_b64_decode(e, strlen(e), &d, &n), NB_OK);
    assert_int_equal(n, strlen(vec[i][0]));
    assert_memory_equal(d, vec[i][0], n);
    nb_free(e);
    nb_free(d);
  }
  uint8_t bin[256];
  for (int i = 0; i < 256; i++) bin[i] = (uint8_t)(255 - i);
  for (size_t len = 0; len < 40; len++) {
    char* e = NULL;
    uint8_t* d = NULL;
    size_t n = 0;
    assert_int_equal(nb_b64_encode(bin + len, len * 5, &e), NB_OK);
    assert_int_equal(nb_b64_decode(e, 0, &d, &n), NB_OK);
    assert_int_equal(n, len * 5);
    assert_memory_equal(d, bin + len, n);
    nb_free(e);
    nb_free(d);
  }
  static const char* bad[] = {"Zg=",  "Zg",   "Z===",     "Zm9v\n", "Zm 9",
                              "Zm9*", "=Zm9", "Zg==Zg==", "Zm=v"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint8_t* d = (uint8_t*)1;
    size_t n = 7;
    assert_int_equal(nb_b64_decode(bad[i], strlen(bad[i]), &d, &n), NB_ERR_INVALID);
    assert_null(d);
  }
}

/* The openssl program verifies our signature on its own: ECDSA P-256 / SHA-256, DER. */
static void test_openssl_cli_reference(void** state) {
  (void)state;
  if (!sec_have_openssl()) {
    print_message("openssl program not found: reference check skipped\n");
    skip();
  }
  const char* d = sec_tmpdir();
  char p[700];
  uint8_t* sig = NULL;
  size_t n = 0;
  assert_int_equal(nb_sign_data(alice_key, desc, strlen(desc), &sig, &n), NB_OK);
  snprintf(p, sizeof p, "%s/desc.json", d);
  FILE* f = fopen(p, "wb");
  fwrite(desc, 1, strlen(desc), f);
  fclose(f);
  snprintf(p, sizeof p, "%s/sig.der", d);
  f = fopen(p, "wb");
  fwrite(sig, 1, n, f);
  fclose(f);
  snprintf(p, sizeof p, "%s/alice.crt", d);
  assert_int_equal(nb_pki_cert_write(p, alice, 0), NB_OK);
  const char* cmd =
      "cd '%s' && openssl x509 -in alice.crt -noout -pubkey > pub.pem && "
      "openssl dgst -sha256 -verify pub.pem -signature sig.der %s";
  assert_int_equal(sec_sh(cmd, d, "desc.json"), 0);
  assert_int_equal(sec_sh("cd '%s' && printf x >> desc.json", d), 0);
  assert_int_not_equal(sec_sh(cmd, d, "desc.json"), 0);
  nb_free(sig);
  sec_rmtree(d);
}

/* Random text as base64 and as signatures: clean errors, never a crash. */
static void test_garbage_sigs(void** state) {
  (void)state;
  static const char alpha[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=!\n";
  uint64_t x = 0x2545F4914F6CDD1Dull;
  char text[200];
  uint8_t sig[120];
  for (int it = 0; it < 500; it++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t len = 1 + x % (sizeof text - 1);
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      text[i] = alpha[x % (sizeof alpha - 1)];
    }
    text[len] = '\0';
    uint8_t* d = NULL;
    size_t n = 0;
    nb_status_t st = nb_b64_decode(text, len, &d, &n);
    assert_true(st == NB_OK || st == NB_ERR_INVALID);
    nb_free(d);
    size_t sl = x % sizeof sig;
    for (size_t i = 0; i < sl; i++) sig[i] = (uint8_t)(x >> (i % 56));
    if (sl > 2) sig[0] = 0x30, sig[1] = (uint8_t)(sl - 2); /* DER-looking */
    assert_int_equal(nb_sign_verify(alice, ca, desc, strlen(desc), sig, sl, NULL, NULL),
                     NB_ERR_INTEGRITY);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid),
      cmocka_unit_test(test_tampered),
      cmocka_unit_test(test_wrong_signer),
      cmocka_unit_test(test_untrusted_certs),
      cmocka_unit_test(test_b64_forms),
      cmocka_unit_test(test_b64),
      cmocka_unit_test(test_openssl_cli_reference),
      cmocka_unit_test(test_garbage_sigs),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
