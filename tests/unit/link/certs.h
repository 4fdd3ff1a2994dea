/* Test helper: a federation CA and cluster certificates (SAN IP 127.0.0.1 and the link-local
 * addresses of deploy/wan) made with security/pki in a temporary directory, and their nb_tls_t.
 * Header-only so that each test binary builds it with its own flags. */
#ifndef NB_TESTS_LINK_CERTS_H
#define NB_TESTS_LINK_CERTS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "security/pki.h"
#include "security/tls.h"

/* Issues <dir>/<id>.crt/.key for each id and writes <dir>/ca.crt. Returns 0 on success. */
static inline int nb_test_certs_make(const char* dir, const char* const* ids, size_t n) {
  EVP_PKEY* ca_key = NULL;
  X509* ca = NULL;
  char path[512];
  if (nb_pki_ca_create("nebula test CA", 2, &ca_key, &ca) != NB_OK) return -1;
  snprintf(path, sizeof path, "%s/ca.crt", dir);
  int rc = nb_pki_cert_write(path, ca, 1) == NB_OK ? 0 : -1;
  static const char* const sans[] = {"IP:127.0.0.1", "IP:169.254.100.1", "IP:169.254.100.2",
                                     "DNS:localhost"};
  for (size_t i = 0; rc == 0 && i < n; i++) {
    nb_pki_issue_opts_t o = {
        .kind = NB_PKI_CLUSTER, .name = ids[i], .sans = sans, .n_sans = 4, .days = 2};
    EVP_PKEY* k = NULL;
    X509* c = NULL;
    if (nb_pki_cert_issue(ca_key, ca, &o, &k, &c) != NB_OK) rc = -1;
    snprintf(path, sizeof path, "%s/%s.key", dir, ids[i]);
    if (rc == 0 && nb_pki_key_write(path, k, 1) != NB_OK) rc = -1;
    snprintf(path, sizeof path, "%s/%s.crt", dir, ids[i]);
    if (rc == 0 && nb_pki_cert_write(path, c, 1) != NB_OK) rc = -1;
    EVP_PKEY_free(k);
    X509_free(c);
  }
  EVP_PKEY_free(ca_key);
  X509_free(ca);
  return rc;
}

/* Loads <dir>/<id>.{crt,key} with <dir>/ca.crt. */
static inline nb_tls_t* nb_test_tls_load(const char* dir, const char* id) {
  char ca[512], crt[512], key[512];
  snprintf(ca, sizeof ca, "%s/ca.crt", dir);
  snprintf(crt, sizeof crt, "%s/%s.crt", dir, id);
  snprintf(key, sizeof key, "%s/%s.key", dir, id);
  nb_tls_files_t f = {.ca_path = ca, .cert_path = crt, .key_path = key};
  nb_tls_t* t = NULL;
  if (nb_tls_create(&f, &t) != NB_OK) {
    fprintf(stderr, "tls %s: %s\n", id, nb_error_last());
    return NULL;
  }
  return t;
}

/* Removes the files made by nb_test_certs_make and the directory. */
static inline void nb_test_certs_remove(const char* dir, const char* const* ids, size_t n) {
  char path[512];
  for (size_t i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s.crt", dir, ids[i]);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s.key", dir, ids[i]);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/ca.crt", dir);
  unlink(path);
  rmdir(dir);
}

#endif
