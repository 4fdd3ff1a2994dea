/* security/tls: gRPC mTLS credentials from PEM files and peer identities from certificates
 * (OpenSSL's C API for parsing and checking). It never creates keys or certificates and never
 * decides policy beyond "is this peer the cluster/user we expect". */
#include "security/tls.h"

#include <ctype.h>
#include <errno.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <openssl/conf.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "security/openssl_init.h"

/* gRPC 1.51 hands its cipher list (GRPC_SSL_CIPHER_SUITES, AES-128-GCM first) only to
 * SSL_CTX_set_cipher_list, which governs TLS 1.2; TLS 1.3 connections get OpenSSL's default
 * order, AES-256-GCM first. AES-128-GCM costs about 11 % less CPU per byte of the whole loopback
 * transfer here (docs/link.md), and the payload is sealed with AES-256-GCM underneath anyway. */
NB_PARAM_STRING(TlsCiphersuites, "NB_TLS13_CIPHERSUITES",
                "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256",
                "TLS 1.3 cipher suites of gRPC's TLS, in preference order ('default': OpenSSL's)")

struct nb_tls {
  _Atomic int refs; /* nb_tls_create's reference + one per holder (nb_tls_source_get) */
  char* ca_pem;
  char* cert_pem;
  char* key_pem;
  nb_tls_peer_t self;
  nb_tls_cert_info_t info;
};

#define NB_TLS_MAX_PEM (1u << 20) /* a PEM file larger than 1 MiB is not a certificate */
#define NB_TLS_PATH_SHOWN 400     /* longest part of a path an error message quotes */

/* OpenSSL error queue → NB_ERR_CRYPTO with the first queued reason. */
static nb_status_t nb__tls_ossl_error(const char* what) {
  unsigned long e = ERR_get_error();
  char buf[256] = "no OpenSSL detail";
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return nb_error(NB_ERR_CRYPTO, "%s: %s", what, buf);
}

static nb_status_t nb__tls_read_file(const char* path, const char* what, char** out) {
  *out = NULL;
  if (path == NULL || path[0] == '\0') return nb_error(NB_ERR_INVALID, "no %s path given", what);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return nb_error(NB_ERR_IO, "%s '%s': %s", what, path, strerror(errno));
  nb_status_t st = NB_OK;
  char* buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      size_t ncap = cap ? cap * 2 : 8192;
      if (ncap > NB_TLS_MAX_PEM + 4096) {
        st = nb_error(NB_ERR_IO, "%s '%s' is larger than %u bytes", what, path, NB_TLS_MAX_PEM);
        goto fail;
      }
      NB_CHECK_GOTO(nb_realloc((void**)&buf, ncap, 1, what), st, fail);
      cap = ncap;
    }
    size_t n = fread(buf + len, 1, cap - len - 1, f);
    len += n;
    if (n == 0) break;
  }
  if (ferror(f)) {
    st = nb_error(NB_ERR_IO, "reading %s '%s' failed", what, path);
    goto fail;
  }
  if (len == 0) {
    st = nb_error(NB_ERR_IO, "%s '%s' is empty", what, path);
    goto fail;
  }
  buf[len] = '\0';
  fclose(f);
  *out = buf;
  return NB_OK;
fail:
  fclose(f);
  nb_free(buf);
  return st;
}

static X509* nb__tls_pem_x509(const char* pem, size_t len) {
  BIO* bio = BIO_new_mem_buf(pem, (int)len);
  if (bio == NULL) return NULL;
  X509* x = PEM_read_bio_X509(bio, NULL, NULL, NULL);
  BIO_free(bio);
  return x;
}

/* Cluster ids and user names: 1..127 of [A-Za-z0-9._-], not starting with '.' or '-'. */
static int nb__tls_name_ok(const char* s, size_t n) {
  if (n == 0 || n >= NB_TLS_ID_MAX || s[0] == '.' || s[0] == '-') return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!isalnum(c) && c != '.' && c != '_' && c != '-') return 0;
  }
  return 1;
}

static nb_status_t nb__tls_peer_from_x509(X509* x, nb_tls_peer_t* out) {
  memset(out, 0, sizeof *out);
  nb_status_t st = NB_OK;

  X509_NAME* subj = X509_get_subject_name(x);
  int idx = subj ? X509_NAME_get_index_by_NID(subj, NID_commonName, -1) : -1;
  if (idx >= 0) {
    unsigned char* utf8 = NULL;
    int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, idx)));
    if (n > 0 && (size_t)n < sizeof out->common_name && memchr(utf8, '\0', (size_t)n) == NULL)
      memcpy(out->common_name, utf8, (size_t)n);
    OPENSSL_free(utf8);
  }

  GENERAL_NAMES* sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
  int found = 0;
  for (int i = 0; sans != NULL && i < sk_GENERAL_NAME_num(sans); i++) {
    const GENERAL_NAME* gn = sk_GENERAL_NAME_value(sans, i);
    if (gn->type != GEN_URI) continue;
    const char* uri = (const char*)ASN1_STRING_get0_data(gn->d.uniformResourceIdentifier);
    size_t ulen = (size_t)ASN1_STRING_length(gn->d.uniformResourceIdentifier);
    static const char kc[] = "nebula://cluster/", ku[] = "nebula://user/";
    nb_tls_peer_kind_t kind = NB_TLS_PEER_NONE;
    size_t plen = 0;
    if (ulen >= sizeof kc - 1 && memcmp(uri, kc, sizeof kc - 1) == 0) {
      kind = NB_TLS_PEER_CLUSTER;
      plen = sizeof kc - 1;
    } else if (ulen >= sizeof ku - 1 && memcmp(uri, ku, sizeof ku - 1) == 0) {
      kind = NB_TLS_PEER_USER;
      plen = sizeof ku - 1;
    } else if (ulen >= 9 && memcmp(uri, "nebula://", 9) == 0) {
      st = nb_error(NB_ERR_CRYPTO, "certificate has an unknown nebula identity URI");
      goto done;
    } else {
      continue; /* foreign URIs (SPIFFE and the like) are not ours to judge */
    }
    if (!nb__tls_name_ok(uri + plen, ulen - plen)) {
      st = nb_error(NB_ERR_CRYPTO, "certificate identity URI has an invalid name");
      goto done;
    }
    if (found) {
      st = nb_error(NB_ERR_CRYPTO, "certificate states more than one nebula identity");
      goto done;
    }
    found = 1;
    out->kind = kind;
    memcpy(out->name, uri + plen, ulen - plen);
    out->name[ulen - plen] = '\0';
  }
  /* No nebula URI, no identity: a CA-signed certificate with only a CN (made by hand, or for
   * another service of the same CA) speaks for nobody here (docs/security.md, "Identity"). */
  if (!found)
    st = nb_error(
        NB_ERR_CRYPTO,
        "certificate (CN '%s') states no nebula identity: it has no "
        "nebula://cluster/ID or nebula://user/NAME URI SAN, and a CN alone names no "
        "one; issue it with 'nebula certs issue --cluster ID' or '--user NAME' "
        "(docs/security.md, Identity)",
        nb__tls_name_ok(out->common_name, strlen(out->common_name)) ? out->common_name : "?");
done:
  GENERAL_NAMES_free(sans);
  if (st != NB_OK) memset(out, 0, sizeof *out);
  return st;
}

nb_status_t nb_tls_peer_from_pem(const char* pem, size_t len, nb_tls_peer_t* out) {
  if (pem == NULL || out == NULL || len == 0 || len > NB_TLS_MAX_PEM)
    return nb_error(NB_ERR_INVALID, "nb_tls_peer_from_pem: no certificate given");
  X509* x = nb__tls_pem_x509(pem, len);
  if (x == NULL) return nb__tls_ossl_error("parsing peer certificate");
  nb_status_t st = nb__tls_peer_from_x509(x, out);
  X509_free(x);
  return st;
}

/* Subject (RFC 2253), notAfter (UTC, ISO 8601) and serial (hex) of a certificate, for logs. */
static void nb__tls_describe(X509* x, nb_tls_cert_info_t* info) {
  memset(info, 0, sizeof *info);
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio != NULL && X509_NAME_print_ex(bio, X509_get_subject_name(x), 0, XN_FLAG_RFC2253) >= 0) {
    int n = BIO_read(bio, info->subject, (int)sizeof info->subject - 1);
    info->subject[n > 0 ? n : 0] = '\0';
  }
  BIO_free(bio);
  struct tm tm;
  if (ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm) == 1)
    strftime(info->not_after, sizeof info->not_after, "%Y-%m-%dT%H:%M:%SZ", &tm);
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
  char* hex = bn ? BN_bn2hex(bn) : NULL;
  if (hex) snprintf(info->serial, sizeof info->serial, "%s", hex);
  OPENSSL_free(hex);
  BN_free(bn);
  ERR_clear_error();
}

/* Checks key ↔ certificate and certificate ← CA, so that a misconfigured endpoint fails at start
 * with a clear message instead of with an opaque handshake error later. */
static nb_status_t nb__tls_check_material(nb_tls_t* t, const nb_tls_files_t* files) {
  nb_status_t st = NB_OK;
  X509* leaf = NULL;
  EVP_PKEY* key = NULL;
  X509_STORE* store = NULL;
  X509_STORE_CTX* ctx = NULL;
  STACK_OF(X509)* chain = NULL;
  BIO* bio = NULL;

  char what[2 * NB_TLS_PATH_SHOWN + 64];
  leaf = nb__tls_pem_x509(t->cert_pem, strlen(t->cert_pem));
  if (leaf == NULL) {
    snprintf(what, sizeof what, "certificate '%.*s' does not parse as PEM", NB_TLS_PATH_SHOWN,
             files->cert_path);
    st = nb__tls_ossl_error(what);
    goto fail;
  }
  bio = BIO_new_mem_buf(t->key_pem, -1);
  key = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
  BIO_free(bio);
  bio = NULL;
  if (key == NULL) {
    snprintf(what, sizeof what, "private key '%.*s' does not parse as PEM", NB_TLS_PATH_SHOWN,
             files->key_path);
    st = nb__tls_ossl_error(what);
    goto fail;
  }
  if (X509_check_private_key(leaf, key) != 1) {
    snprintf(what, sizeof what, "private key '%.*s' does not match certificate '%.*s'",
             NB_TLS_PATH_SHOWN, files->key_path, NB_TLS_PATH_SHOWN, files->cert_path);
    st = nb__tls_ossl_error(what);
    goto fail;
  }

  store = X509_STORE_new();
  chain = sk_X509_new_null();
  if (store == NULL || chain == NULL) {
    st = nb_error(NB_ERR_NOMEM, "X509 store");
    goto fail;
  }
  bio = BIO_new_mem_buf(t->ca_pem, -1);
  int ncas = 0;
  for (X509* ca; bio && (ca = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL; X509_free(ca)) {
    if (X509_STORE_add_cert(store, ca) == 1) ncas++;
  }
  ERR_clear_error(); /* the loop ends on "no start line" */
  BIO_free(bio);
  bio = NULL;
  if (ncas == 0) {
    st = nb_error(NB_ERR_CRYPTO, "CA file '%s' holds no certificate", files->ca_path);
    goto fail;
  }
  /* Intermediates that follow the leaf in the certificate file. */
  bio = BIO_new_mem_buf(t->cert_pem, -1);
  X509* skip = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
  X509_free(skip);
  for (X509* im; bio && (im = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL;)
    sk_X509_push(chain, im);
  ERR_clear_error();
  ctx = X509_STORE_CTX_new();
  if (ctx == NULL || X509_STORE_CTX_init(ctx, store, leaf, chain) != 1) {
    st = nb__tls_ossl_error("X509 verify context");
    goto fail;
  }
  if (X509_verify_cert(ctx) != 1) {
    int err = X509_STORE_CTX_get_error(ctx);
    st = nb_error(NB_ERR_CRYPTO, "certificate '%s' does not verify against CA '%s': %s",
                  files->cert_path, files->ca_path, X509_verify_cert_error_string(err));
    goto fail;
  }
  NB_CHECK_GOTO(nb__tls_peer_from_x509(leaf, &t->self), st, fail);
  nb__tls_describe(leaf, &t->info);
fail:
  BIO_free(bio);
  X509_STORE_CTX_free(ctx);
  sk_X509_pop_free(chain, X509_free);
  X509_STORE_free(store);
  EVP_PKEY_free(key);
  X509_free(leaf);
  return st;
}

nb_status_t nb_tls_create(const nb_tls_files_t* files, nb_tls_t** out) {
  if (out == NULL || files == NULL) return nb_error(NB_ERR_INVALID, "nb_tls_create: NULL argument");
  *out = NULL;
  nb_openssl_init();
  nb_status_t st = NB_OK;
  nb_tls_t* t = NULL;
  NB_CHECK(nb_calloc((void**)&t, 1, sizeof *t, "tls"));
  atomic_init(&t->refs, 1);
  NB_CHECK_GOTO(nb__tls_read_file(files->ca_path, "CA certificate", &t->ca_pem), st, fail);
  NB_CHECK_GOTO(nb__tls_read_file(files->cert_path, "certificate", &t->cert_pem), st, fail);
  NB_CHECK_GOTO(nb__tls_read_file(files->key_path, "private key", &t->key_pem), st, fail);
  NB_CHECK_GOTO(nb__tls_check_material(t, files), st, fail);
  NB_INFO(SEC, "tls: loaded %s '%s' (CA %s)", t->self.kind == NB_TLS_PEER_USER ? "user" : "cluster",
          t->self.name, files->ca_path);
  *out = t;
  return NB_OK;
fail:
  nb_tls_destroy(t);
  return st;
}

void nb_tls_destroy(nb_tls_t* tls) {
  if (tls == NULL || atomic_fetch_sub(&tls->refs, 1) != 1) return;
  if (tls->key_pem) OPENSSL_cleanse(tls->key_pem, strlen(tls->key_pem));
  nb_free(tls->key_pem);
  nb_free(tls->cert_pem);
  nb_free(tls->ca_pem);
  nb_free(tls);
}

const nb_tls_peer_t* nb_tls_self(const nb_tls_t* tls) {
  return tls ? &tls->self : NULL;
}

const nb_tls_cert_info_t* nb_tls_cert_info(const nb_tls_t* tls) {
  return tls ? &tls->info : NULL;
}

/* ------------------------------------------------------- TLS 1.3 cipher suites */

static pthread_once_t nb__tls_policy_once = PTHREAD_ONCE_INIT;
static nb_status_t nb__tls_policy_st = NB_OK;
static char nb__tls_policy_err[256];
static char nb__tls_policy_suites[256];

/* The suites must be known to OpenSSL (checked on a scratch SSL_CTX) and plain names only, since
 * they are pasted into a configuration text. */
static nb_status_t nb__tls_check_suites(const char* suites) {
  size_t n = strlen(suites);
  if (n == 0 || n >= sizeof nb__tls_policy_suites)
    return nb_error(NB_ERR_CONFIG, "NB_TLS13_CIPHERSUITES: empty or longer than %zu characters",
                    sizeof nb__tls_policy_suites - 1);
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)suites[i]) && suites[i] != '_' && suites[i] != ':')
      return nb_error(NB_ERR_CONFIG,
                      "NB_TLS13_CIPHERSUITES '%s': only TLS 1.3 suite names separated by ':'",
                      suites);
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == NULL) return nb__tls_ossl_error("SSL_CTX_new");
  int ok = SSL_CTX_set_ciphersuites(ctx, suites);
  SSL_CTX_free(ctx);
  if (ok != 1) {
    ERR_clear_error();
    return nb_error(NB_ERR_CONFIG,
                    "NB_TLS13_CIPHERSUITES '%s' is not a list of TLS 1.3 suites OpenSSL knows "
                    "(e.g. TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384)",
                    suites);
  }
  return NB_OK;
}

/* gRPC does not expose its SSL_CTX, so the order is set the one way OpenSSL applies settings to
 * every SSL_CTX a process creates: its "system_default" ssl_conf section, loaded on top of the
 * system configuration (which is loaded first, so that it cannot override ours later). The
 * section replaces a system_default section of the system configuration, if it has one; gRPC
 * sets the protocol versions and the TLS 1.2 list itself. ServerPreference makes our servers
 * choose by this order whatever the client prefers. */
static nb_status_t nb__tls_policy_load(const char* suites) {
  NB_CHECK(nb__tls_check_suites(suites));
  if (OPENSSL_init_ssl(OPENSSL_INIT_LOAD_CONFIG, NULL) != 1)
    return nb__tls_ossl_error("OpenSSL initialisation");
  char text[1024];
  snprintf(text, sizeof text,
           "nebula_tls = nb_tls_init\n"
           "[nb_tls_init]\nssl_conf = nb_tls_ssl\n"
           "[nb_tls_ssl]\nsystem_default = nb_tls_default\n"
           "[nb_tls_default]\nCiphersuites = %s\nOptions = ServerPreference\n",
           suites);
  nb_status_t st = NB_OK;
  CONF* conf = NCONF_new(NULL);
  BIO* bio = BIO_new_mem_buf(text, -1);
  long eline = 0;
  if (conf == NULL || bio == NULL || NCONF_load_bio(conf, bio, &eline) <= 0)
    st = nb__tls_ossl_error("building the TLS 1.3 cipher configuration");
  else if (CONF_modules_load(conf, "nebula_tls", 0) <= 0)
    st = nb__tls_ossl_error("applying the TLS 1.3 cipher configuration");
  BIO_free(bio);
  NCONF_free(conf);
  return st;
}

static void nb__tls_policy_init(void) {
  const char* suites = nb_param_TlsCiphersuites();
  if (strcmp(suites, "default") == 0) {
    snprintf(nb__tls_policy_suites, sizeof nb__tls_policy_suites, "%s",
             OSSL_default_ciphersuites());
    return;
  }
  nb__tls_policy_st = nb__tls_policy_load(suites);
  if (nb__tls_policy_st != NB_OK) {
    snprintf(nb__tls_policy_err, sizeof nb__tls_policy_err, "%s", nb_error_last());
    return;
  }
  snprintf(nb__tls_policy_suites, sizeof nb__tls_policy_suites, "%s", suites);
  NB_INFO(SEC, "tls: TLS 1.3 cipher suites %s (server preference)", suites);
}

nb_status_t nb_tls_apply_cipher_policy(void) {
  pthread_once(&nb__tls_policy_once, nb__tls_policy_init);
  if (nb__tls_policy_st != NB_OK) return nb_error(nb__tls_policy_st, "%s", nb__tls_policy_err);
  return NB_OK;
}

const char* nb_tls_ciphersuites(void) {
  pthread_once(&nb__tls_policy_once, nb__tls_policy_init);
  return nb__tls_policy_st == NB_OK ? nb__tls_policy_suites : NULL;
}

/* ------------------------------------------------------------- credentials */

nb_status_t nb_tls_server_credentials(const nb_tls_t* tls, grpc_server_credentials** out) {
  if (tls == NULL || out == NULL)
    return nb_error(NB_ERR_INVALID, "nb_tls_server_credentials: NULL argument");
  NB_CHECK(nb_tls_apply_cipher_policy());
  grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key_pem, .cert_chain = tls->cert_pem};
  *out = grpc_ssl_server_credentials_create_ex(
      tls->ca_pem, &pair, 1, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY, NULL);
  if (*out == NULL) return nb_error(NB_ERR_RPC, "gRPC refused the server TLS credentials");
  return NB_OK;
}

/* ------------------------------------------------------ reloadable material */

/* What one server's credentials have been handed: gRPC gives its fetcher no destructor, so
 * these live on the source's list until the source goes. */
typedef struct nb__tls_fetch {
  nb_tls_source_t* src;
  unsigned long served; /* the source generation gRPC has; 0: none yet */
  struct nb__tls_fetch* next;
} nb__tls_fetch_t;

struct nb_tls_source {
  pthread_mutex_t mu; /* cur, gen, fetch */
  nb_tls_t* cur;
  unsigned long gen; /* bumped by every nb_tls_source_set; starts at 1 */
  nb__tls_fetch_t* fetch;
};

nb_status_t nb_tls_source_create(nb_tls_t* tls, nb_tls_source_t** out) {
  if (tls == NULL || out == NULL)
    return nb_error(NB_ERR_INVALID, "nb_tls_source_create: NULL argument");
  *out = NULL;
  nb_tls_source_t* s = NULL;
  NB_CHECK(nb_calloc((void**)&s, 1, sizeof *s, "tls source"));
  pthread_mutex_init(&s->mu, NULL);
  s->cur = tls;
  s->gen = 1;
  *out = s;
  return NB_OK;
}

void nb_tls_source_destroy(nb_tls_source_t* src) {
  if (src == NULL) return;
  for (nb__tls_fetch_t *f = src->fetch, *n; f != NULL; f = n) {
    n = f->next;
    nb_free(f);
  }
  nb_tls_destroy(src->cur);
  pthread_mutex_destroy(&src->mu);
  nb_free(src);
}

nb_tls_t* nb_tls_source_get(nb_tls_source_t* src) {
  if (src == NULL) return NULL;
  pthread_mutex_lock(&src->mu);
  nb_tls_t* t = src->cur;
  atomic_fetch_add(&t->refs, 1);
  pthread_mutex_unlock(&src->mu);
  return t;
}

void nb_tls_source_set(nb_tls_source_t* src, nb_tls_t* tls) {
  if (src == NULL || tls == NULL) return;
  pthread_mutex_lock(&src->mu);
  nb_tls_t* old = src->cur;
  src->cur = tls;
  src->gen++;
  pthread_mutex_unlock(&src->mu);
  nb_tls_destroy(old); /* freed once the last holder lets go */
}

/* gRPC calls this as each TLS handshake of the server begins (and once when the port is
 * added): new material since the last call becomes a new certificate config, which gRPC
 * copies and destroys; connections already established keep theirs. */
static grpc_ssl_certificate_config_reload_status nb__tls_fetch_cb(
    void* user, grpc_ssl_server_certificate_config** config) {
  nb__tls_fetch_t* f = user;
  nb_tls_source_t* src = f->src;
  grpc_ssl_certificate_config_reload_status rs = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  pthread_mutex_lock(&src->mu);
  if (f->served != src->gen) {
    nb_tls_t* t = src->cur;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = t->key_pem, .cert_chain = t->cert_pem};
    *config = grpc_ssl_server_certificate_config_create(t->ca_pem, &pair, 1);
    if (*config != NULL) {
      f->served = src->gen;
      rs = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
    } else {
      rs = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL; /* gRPC goes on with what it has */
    }
  }
  pthread_mutex_unlock(&src->mu);
  return rs;
}

nb_status_t nb_tls_source_server_credentials(nb_tls_source_t* src, grpc_server_credentials** out) {
  if (src == NULL || out == NULL)
    return nb_error(NB_ERR_INVALID, "nb_tls_source_server_credentials: NULL argument");
  *out = NULL;
  NB_CHECK(nb_tls_apply_cipher_policy());
  nb__tls_fetch_t* f = NULL;
  NB_CHECK(nb_calloc((void**)&f, 1, sizeof *f, "tls fetcher"));
  f->src = src;
  grpc_ssl_server_credentials_options* o =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY, nb__tls_fetch_cb, f);
  if (o != NULL) *out = grpc_ssl_server_credentials_create_with_options(o); /* takes o */
  if (*out == NULL) {
    nb_free(f);
    return nb_error(NB_ERR_RPC, "gRPC refused the reloadable server TLS credentials");
  }
  pthread_mutex_lock(&src->mu);
  f->next = src->fetch;
  src->fetch = f;
  pthread_mutex_unlock(&src->mu);
  return NB_OK;
}

/* Runs inside the TLS handshake on the client: the server's leaf certificate (already verified
 * against the CA by gRPC) must name the expected cluster. Non-zero refuses the connection. */
static int nb__tls_verify_server(const char* target, const char* peer_pem, void* user) {
  const char* expected = user;
  nb_tls_peer_t peer;
  if (peer_pem == NULL || nb_tls_peer_from_pem(peer_pem, strlen(peer_pem), &peer) != NB_OK) {
    NB_WARN(
        "tls: server %s presented a certificate without a usable identity: %s; check that "
        "it was issued by 'nebula certs issue --cluster'",
        target ? target : "?", nb_error_last());
    return 1;
  }
  if (nb_tls_peer_check_cluster(&peer, expected) != NB_OK) {
    NB_WARN("tls: server %s refused: %s", target ? target : "?", nb_error_last());
    return 1;
  }
  return 0;
}

static void nb__tls_free_str(void* p) {
  free(p);
}

nb_status_t nb_tls_channel_credentials(const nb_tls_t* tls, const char* expected_cluster,
                                       grpc_channel_credentials** out) {
  if (tls == NULL || out == NULL)
    return nb_error(NB_ERR_INVALID, "nb_tls_channel_credentials: NULL argument");
  *out = NULL;
  NB_CHECK(nb_tls_apply_cipher_policy());
  grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key_pem, .cert_chain = tls->cert_pem};
  grpc_ssl_verify_peer_options vopt = {0};
  if (expected_cluster != NULL) {
    if (!nb__tls_name_ok(expected_cluster, strlen(expected_cluster)))
      return nb_error(NB_ERR_INVALID, "expected cluster id '%s' is not a valid id",
                      expected_cluster);
    char* copy = strdup(expected_cluster); /* freed by gRPC through verify_peer_destruct */
    if (copy == NULL) return nb_error(NB_ERR_NOMEM, "expected cluster id");
    vopt.verify_peer_callback = nb__tls_verify_server;
    vopt.verify_peer_callback_userdata = copy;
    vopt.verify_peer_destruct = nb__tls_free_str;
  }
  *out = grpc_ssl_credentials_create_ex(tls->ca_pem, &pair, expected_cluster ? &vopt : NULL, NULL);
  if (*out == NULL) {
    if (expected_cluster != NULL) free(vopt.verify_peer_callback_userdata);
    return nb_error(NB_ERR_RPC, "gRPC refused the channel TLS credentials");
  }
  return NB_OK;
}

nb_status_t nb_tls_peer_from_call(struct grpc_call* call, nb_tls_peer_t* out) {
  if (call == NULL || out == NULL)
    return nb_error(NB_ERR_INVALID, "nb_tls_peer_from_call: NULL argument");
  memset(out, 0, sizeof *out);
  grpc_auth_context* ctx = grpc_call_auth_context(call);
  if (ctx == NULL) return nb_error(NB_ERR_PERMISSION, "call has no security context (plaintext)");
  nb_status_t st = NB_OK;
  const grpc_auth_property* pem = NULL;
  if (grpc_auth_context_peer_is_authenticated(ctx)) {
    grpc_auth_property_iterator it =
        grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_PEM_CERT_PROPERTY_NAME);
    pem = grpc_auth_property_iterator_next(&it);
  }
  if (pem == NULL || pem->value == NULL || pem->value_length == 0)
    st = nb_error(NB_ERR_PERMISSION, "peer presented no verified certificate");
  else
    st = nb_tls_peer_from_pem(pem->value, pem->value_length, out);
  grpc_auth_context_release(ctx);
  return st;
}

nb_status_t nb_tls_peer_check_cluster(const nb_tls_peer_t* peer, const char* cluster_id) {
  if (peer == NULL || cluster_id == NULL)
    return nb_error(NB_ERR_INVALID, "nb_tls_peer_check_cluster: NULL argument");
  if (peer->kind != NB_TLS_PEER_CLUSTER)
    return nb_error(NB_ERR_PERMISSION, "peer '%s' is %s, expected cluster '%s'", peer->name,
                    peer->kind == NB_TLS_PEER_USER ? "a user" : "not identified", cluster_id);
  if (strcmp(peer->name, cluster_id) != 0)
    return nb_error(NB_ERR_PERMISSION, "peer is cluster '%s', expected cluster '%s'", peer->name,
                    cluster_id);
  if (peer->common_name[0] != '\0' && strcmp(peer->common_name, peer->name) != 0)
    return nb_error(NB_ERR_PERMISSION, "peer certificate CN '%s' disagrees with its cluster '%s'",
                    peer->common_name, peer->name);
  return NB_OK;
}

nb_status_t nb_tls_peer_check_user(const nb_tls_peer_t* peer, const char* user) {
  if (peer == NULL || user == NULL)
    return nb_error(NB_ERR_INVALID, "nb_tls_peer_check_user: NULL argument");
  if (peer->kind != NB_TLS_PEER_USER || strcmp(peer->name, user) != 0)
    return nb_error(NB_ERR_PERMISSION, "peer is %s '%s', expected user '%s'",
                    peer->kind == NB_TLS_PEER_USER ? "user" : "cluster", peer->name, user);
  return NB_OK;
}
