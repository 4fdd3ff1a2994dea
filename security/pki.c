/* The federation PKI on OpenSSL 3's C API: CA creation, certificate issue, atomic key/cert files,
 * verification and the nebula identity of a certificate. It never shells out to the openssl
 * program and never logs key material. */
#include "security/pki.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#define NB__URI_PREFIX "nebula://"

nb_status_t nb__ossl_error(nb_status_t st, const char* what) {
  char msg[400];
  size_t n = 0;
  unsigned long e;
  msg[0] = '\0';
  while ((e = ERR_get_error()) != 0) {
    char one[160];
    ERR_error_string_n(e, one, sizeof one);
    int w = snprintf(msg + n, sizeof msg - n, "%s%s", n ? "; " : "", one);
    if (w < 0 || (size_t)w >= sizeof msg - n) {
      n = sizeof msg - 1;
      continue; /* keep draining the queue */
    }
    n += (size_t)w;
  }
  if (n == 0) return nb_error(st, "%s", what);
  return nb_error(st, "%s: %s", what, msg);
}

/* ---------------------------------------------------------------- names and identities */

nb_status_t nb_pki_name_check(const char* name, const char* what) {
  if (!what) what = "name";
  if (!name || !name[0]) return nb_error(NB_ERR_INVALID, "%s is empty", what);
  size_t n = strlen(name);
  if (n > NB_PKI_NAME_MAX)
    return nb_error(NB_ERR_INVALID, "%s is %zu bytes long (at most %d)", what, n, NB_PKI_NAME_MAX);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (i == 0 && !alnum)
      return nb_error(NB_ERR_INVALID, "%s '%.*s' must start with a letter or digit", what,
                      NB_PKI_NAME_MAX, name);
    if (!alnum && c != '.' && c != '_' && c != '-')
      return nb_error(
          NB_ERR_INVALID,
          "%s has a forbidden character (byte 0x%02x at %zu); allowed: A-Z a-z 0-9 . _ -", what, c,
          i);
  }
  return NB_OK;
}

const char* nb_pki_kind_name(nb_pki_kind_t kind) {
  switch (kind) {
    case NB_PKI_CLUSTER:
      return "cluster";
    case NB_PKI_USER:
      return "user";
    default:
      return "none";
  }
}

nb_status_t nb_pki_identity_uri(const nb_pki_identity_t* id, char* buf, size_t cap) {
  if (!id || !buf || (id->kind != NB_PKI_CLUSTER && id->kind != NB_PKI_USER))
    return nb_error(NB_ERR_INVALID, "identity has no kind");
  int w = snprintf(buf, cap, NB__URI_PREFIX "%s/%s", nb_pki_kind_name(id->kind), id->name);
  if (w < 0 || (size_t)w >= cap) return nb_error(NB_ERR_INVALID, "identity URI does not fit");
  return NB_OK;
}

static nb_status_t nb__identity_parse(const char* uri, size_t len, nb_pki_identity_t* out) {
  memset(out, 0, sizeof *out);
  size_t pl = strlen(NB__URI_PREFIX);
  if (len < pl || memcmp(uri, NB__URI_PREFIX, pl) != 0)
    return nb_error(NB_ERR_INVALID, "identity URI does not start with " NB__URI_PREFIX);
  const char* p = uri + pl;
  size_t rest = len - pl;
  size_t kl;
  if (rest > 8 && memcmp(p, "cluster/", 8) == 0) {
    out->kind = NB_PKI_CLUSTER;
    kl = 8;
  } else if (rest > 5 && memcmp(p, "user/", 5) == 0) {
    out->kind = NB_PKI_USER;
    kl = 5;
  } else {
    return nb_error(NB_ERR_INVALID,
                    "identity URI is neither nebula://cluster/ID nor nebula://user/NAME");
  }
  size_t nl = rest - kl;
  if (nl > NB_PKI_NAME_MAX || memchr(p + kl, '\0', nl)) {
    out->kind = NB_PKI_NONE;
    return nb_error(NB_ERR_INVALID, "identity URI has a bad name");
  }
  memcpy(out->name, p + kl, nl);
  out->name[nl] = '\0';
  nb_status_t st = nb_pki_name_check(out->name, "identity name");
  if (st != NB_OK) memset(out, 0, sizeof *out);
  return st;
}

nb_status_t nb_pki_identity_parse_uri(const char* uri, nb_pki_identity_t* out) {
  if (!uri || !out) return nb_error(NB_ERR_INVALID, "NULL argument");
  return nb__identity_parse(uri, strlen(uri), out);
}

nb_status_t nb_pki_identity_from_cert(X509* cert, nb_pki_identity_t* out) {
  if (!cert || !out) return nb_error(NB_ERR_INVALID, "NULL argument");
  memset(out, 0, sizeof *out);
  int crit = 0;
  GENERAL_NAMES* gens = X509_get_ext_d2i(cert, NID_subject_alt_name, &crit, NULL);
  if (!gens) {
    ERR_clear_error();
    if (crit == -2)
      return nb_error(NB_ERR_INVALID, "certificate has several subjectAltName extensions");
    return nb_error(NB_ERR_NOT_FOUND, "certificate has no subjectAltName, so no nebula identity");
  }
  nb_status_t st = NB_OK;
  int found = 0;
  for (int i = 0; i < sk_GENERAL_NAME_num(gens); i++) {
    const GENERAL_NAME* gn = sk_GENERAL_NAME_value(gens, i);
    if (gn->type != GEN_URI) continue;
    const char* s = (const char*)ASN1_STRING_get0_data(gn->d.uniformResourceIdentifier);
    int len = ASN1_STRING_length(gn->d.uniformResourceIdentifier);
    if (len < (int)strlen(NB__URI_PREFIX) || memcmp(s, NB__URI_PREFIX, strlen(NB__URI_PREFIX)))
      continue;
    if (found++) {
      st = nb_error(NB_ERR_INVALID, "certificate carries more than one nebula identity");
      goto done;
    }
    NB_CHECK_GOTO(nb__identity_parse(s, (size_t)len, out), st, done);
  }
  if (!found) {
    st = nb_error(NB_ERR_NOT_FOUND, "certificate has no nebula:// identity in its subjectAltName");
    goto done;
  }
  /* The CN repeats the name; a disagreement means the certificate was not made by nebula. */
  X509_NAME* subj = X509_get_subject_name(cert);
  int idx = X509_NAME_get_index_by_NID(subj, NID_commonName, -1);
  if (idx < 0) {
    st = nb_error(NB_ERR_INVALID, "certificate has a nebula identity but no subject CN");
    goto done;
  }
  ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, idx));
  size_t nl = strlen(out->name);
  if ((size_t)ASN1_STRING_length(cn) != nl || memcmp(ASN1_STRING_get0_data(cn), out->name, nl)) {
    st = nb_error(NB_ERR_INVALID, "certificate CN does not match its nebula identity '%s'",
                  out->name);
    goto done;
  }
done:
  GENERAL_NAMES_free(gens);
  if (st != NB_OK) memset(out, 0, sizeof *out);
  return st;
}

nb_status_t nb_pki_cert_from_pem(const char* pem, size_t len, X509** out) {
  if (!pem || !out) return nb_error(NB_ERR_INVALID, "NULL argument");
  *out = NULL;
  if (len == 0) len = strlen(pem);
  if (len > INT_MAX) return nb_error(NB_ERR_INVALID, "PEM text too large");
  BIO* bio = BIO_new_mem_buf(pem, (int)len);
  if (!bio) return nb__ossl_error(NB_ERR_NOMEM, "BIO_new_mem_buf");
  X509* x = PEM_read_bio_X509(bio, NULL, NULL, NULL);
  BIO_free(bio);
  if (!x) return nb__ossl_error(NB_ERR_INVALID, "not a PEM certificate");
  *out = x;
  return NB_OK;
}

nb_status_t nb_pki_identity_from_pem(const char* pem, size_t len, nb_pki_identity_t* out) {
  if (!out) return nb_error(NB_ERR_INVALID, "NULL argument");
  memset(out, 0, sizeof *out);
  X509* x = NULL;
  NB_CHECK(nb_pki_cert_from_pem(pem, len, &x));
  nb_status_t st = nb_pki_identity_from_cert(x, out);
  X509_free(x);
  return st;
}

nb_status_t nb_pki_identity_check_pem(const char* pem, size_t len,
                                      const nb_pki_identity_t* expect) {
  if (!expect) return nb_error(NB_ERR_INVALID, "NULL expected identity");
  nb_pki_identity_t got;
  nb_status_t st = nb_pki_identity_from_pem(pem, len, &got);
  if (st != NB_OK)
    return nb_error_wrap(NB_ERR_PERMISSION, "peer certificate (expected %s '%s')",
                         nb_pki_kind_name(expect->kind), expect->name);
  if (got.kind != expect->kind || strcmp(got.name, expect->name) != 0)
    return nb_error(NB_ERR_PERMISSION, "peer is %s '%s', expected %s '%s'",
                    nb_pki_kind_name(got.kind), got.name, nb_pki_kind_name(expect->kind),
                    expect->name);
  return NB_OK;
}

/* ---------------------------------------------------------------- creation */

static nb_status_t nb__keygen(EVP_PKEY** out) {
  *out = EVP_EC_gen("P-256");
  if (!*out) return nb__ossl_error(NB_ERR_CRYPTO, "generating an EC P-256 key");
  return NB_OK;
}

static nb_status_t nb__set_serial(X509* x) {
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) return nb__ossl_error(NB_ERR_CRYPTO, "RAND_bytes");
  b[0] &= 0x7f; /* positive */
  b[0] |= 0x01; /* and 16 bytes long, never zero */
  BIGNUM* bn = BN_bin2bn(b, sizeof b, NULL);
  nb_status_t st = NB_OK;
  if (!bn || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)))
    st = nb__ossl_error(NB_ERR_CRYPTO, "setting the serial number");
  BN_free(bn);
  return st;
}

static nb_status_t nb__set_validity(X509* x, int64_t nbf, int64_t naf) {
  if (naf <= nbf) return nb_error(NB_ERR_INVALID, "validity ends before it starts");
  if (!ASN1_TIME_set(X509_getm_notBefore(x), (time_t)nbf) ||
      !ASN1_TIME_set(X509_getm_notAfter(x), (time_t)naf))
    return nb__ossl_error(NB_ERR_CRYPTO, "setting the validity");
  return NB_OK;
}

static nb_status_t nb__set_cn(X509* x, const char* cn, int self_signed) {
  X509_NAME* name = X509_get_subject_name(x);
  if (!X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, (const unsigned char*)"nebula", -1, -1,
                                  0) ||
      !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char*)cn, -1, -1, 0))
    return nb__ossl_error(NB_ERR_CRYPTO, "setting the subject");
  if (self_signed && !X509_set_issuer_name(x, name))
    return nb__ossl_error(NB_ERR_CRYPTO, "setting the issuer");
  return NB_OK;
}

static nb_status_t nb__add_ext(X509* x, X509V3_CTX* ctx, int nid, const char* value) {
  X509_EXTENSION* ext = X509V3_EXT_nconf_nid(NULL, ctx, nid, value);
  if (!ext) return nb__ossl_error(NB_ERR_CRYPTO, "building a certificate extension");
  int ok = X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
  if (!ok) return nb__ossl_error(NB_ERR_CRYPTO, "adding a certificate extension");
  return NB_OK;
}

static nb_status_t nb__gen_push(GENERAL_NAMES* gens, int type, const char* s) {
  GENERAL_NAME* gn = GENERAL_NAME_new();
  if (!gn) return nb__ossl_error(NB_ERR_NOMEM, "GENERAL_NAME_new");
  if (type == GEN_IPADD) {
    ASN1_OCTET_STRING* ip = a2i_IPADDRESS(s);
    if (!ip) {
      GENERAL_NAME_free(gn);
      ERR_clear_error();
      return nb_error(NB_ERR_INVALID, "SAN '%s' is not an IP address", s);
    }
    GENERAL_NAME_set0_value(gn, GEN_IPADD, ip);
  } else {
    ASN1_IA5STRING* ia5 = ASN1_IA5STRING_new();
    if (!ia5 || !ASN1_STRING_set(ia5, s, (int)strlen(s))) {
      ASN1_IA5STRING_free(ia5);
      GENERAL_NAME_free(gn);
      return nb__ossl_error(NB_ERR_NOMEM, "ASN1_STRING_set");
    }
    GENERAL_NAME_set0_value(gn, type, ia5);
  }
  if (!sk_GENERAL_NAME_push(gens, gn)) {
    GENERAL_NAME_free(gn);
    return nb__ossl_error(NB_ERR_NOMEM, "sk_GENERAL_NAME_push");
  }
  return NB_OK;
}

static nb_status_t nb__dns_check(const char* s) {
  size_t n = strlen(s);
  if (n == 0 || n > 253)
    return nb_error(NB_ERR_INVALID, "SAN DNS name '%.64s' has a bad length", s);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '-' || c == '_' || (c == '.' && i > 0 && s[i - 1] != '.');
    if (!ok)
      return nb_error(NB_ERR_INVALID,
                      "SAN '%.64s' is neither an IP address nor a DNS name (byte 0x%02x at %zu)", s,
                      c, i);
  }
  return NB_OK;
}

/* "IP:x", "DNS:x", or bare: an IP address if it parses as one, else a DNS name. */
static nb_status_t nb__san_push(GENERAL_NAMES* gens, const char* san) {
  if (!san || !san[0]) return nb_error(NB_ERR_INVALID, "empty SAN");
  if (strncmp(san, "IP:", 3) == 0) return nb__gen_push(gens, GEN_IPADD, san + 3);
  if (strncmp(san, "DNS:", 4) == 0) {
    NB_CHECK(nb__dns_check(san + 4));
    return nb__gen_push(gens, GEN_DNS, san + 4);
  }
  unsigned char buf[16];
  if (inet_pton(AF_INET, san, buf) == 1 || inet_pton(AF_INET6, san, buf) == 1)
    return nb__gen_push(gens, GEN_IPADD, san);
  NB_CHECK(nb__dns_check(san));
  return nb__gen_push(gens, GEN_DNS, san);
}

static nb_status_t nb__sign(X509* x, EVP_PKEY* key) {
  if (X509_sign(x, key, EVP_sha256()) <= 0)
    return nb__ossl_error(NB_ERR_CRYPTO, "signing the certificate");
  return NB_OK;
}

nb_status_t nb_pki_ca_create(const char* common_name, int days, EVP_PKEY** key_out,
                             X509** cert_out) {
  if (!key_out || !cert_out) return nb_error(NB_ERR_INVALID, "NULL argument");
  *key_out = NULL;
  *cert_out = NULL;
  if (!common_name) common_name = "nebula federation CA";
  if (!common_name[0] || strlen(common_name) > 64)
    return nb_error(NB_ERR_INVALID, "CA common name must be 1..64 bytes");
  if (days == 0) days = 3650;
  if (days < 0 || days > 36500) return nb_error(NB_ERR_INVALID, "CA validity of %d days", days);
  nb_status_t st = NB_OK;
  EVP_PKEY* key = NULL;
  X509* x = X509_new();
  if (!x) return nb__ossl_error(NB_ERR_NOMEM, "X509_new");
  NB_CHECK_GOTO(nb__keygen(&key), st, fail);
  if (!X509_set_version(x, X509_VERSION_3) || !X509_set_pubkey(x, key)) {
    st = nb__ossl_error(NB_ERR_CRYPTO, "building the CA certificate");
    goto fail;
  }
  NB_CHECK_GOTO(nb__set_serial(x), st, fail);
  int64_t now = (int64_t)time(NULL);
  NB_CHECK_GOTO(nb__set_validity(x, now - 300, now + (int64_t)days * 86400), st, fail);
  NB_CHECK_GOTO(nb__set_cn(x, common_name, 1), st, fail);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"), st,
                fail);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign"), st, fail);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_subject_key_identifier, "hash"), st, fail);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always"), st, fail);
  NB_CHECK_GOTO(nb__sign(x, key), st, fail);
  *key_out = key;
  *cert_out = x;
  return NB_OK;
fail:
  EVP_PKEY_free(key);
  X509_free(x);
  return st;
}

nb_status_t nb_pki_cert_issue(EVP_PKEY* ca_key, X509* ca_cert, const nb_pki_issue_opts_t* opts,
                              EVP_PKEY** key_out, X509** cert_out) {
  if (!ca_key || !ca_cert || !opts || !key_out || !cert_out)
    return nb_error(NB_ERR_INVALID, "NULL argument");
  *key_out = NULL;
  *cert_out = NULL;
  if (opts->kind != NB_PKI_CLUSTER && opts->kind != NB_PKI_USER)
    return nb_error(NB_ERR_INVALID, "certificate kind must be cluster or user");
  NB_CHECK(
      nb_pki_name_check(opts->name, opts->kind == NB_PKI_CLUSTER ? "cluster id" : "user name"));
  if (opts->kind == NB_PKI_USER && opts->n_sans)
    return nb_error(NB_ERR_INVALID, "user certificates take no extra SANs");
  if (opts->n_sans && !opts->sans) return nb_error(NB_ERR_INVALID, "n_sans > 0 but sans is NULL");
  int days = opts->days ? opts->days : 825;
  if (days < 0 || days > 36500) return nb_error(NB_ERR_INVALID, "validity of %d days", days);
  int64_t now = (int64_t)time(NULL);
  int64_t nbf = now - 300, naf = now + (int64_t)days * 86400;
  if (opts->not_before || opts->not_after) {
    nbf = opts->not_before;
    naf = opts->not_after;
  }

  nb_status_t st = NB_OK;
  EVP_PKEY* key = NULL;
  GENERAL_NAMES* gens = NULL;
  X509* x = X509_new();
  if (!x) return nb__ossl_error(NB_ERR_NOMEM, "X509_new");
  /* SANs first: a bad SAN fails before any key is generated. */
  gens = sk_GENERAL_NAME_new_null();
  if (!gens) {
    st = nb__ossl_error(NB_ERR_NOMEM, "sk_GENERAL_NAME_new_null");
    goto fail;
  }
  nb_pki_identity_t id = {.kind = opts->kind};
  snprintf(id.name, sizeof id.name, "%s", opts->name);
  char uri[128];
  NB_CHECK_GOTO(nb_pki_identity_uri(&id, uri, sizeof uri), st, fail);
  if (opts->kind == NB_PKI_CLUSTER) {
    NB_CHECK_GOTO(nb__dns_check(opts->name), st, fail);
    NB_CHECK_GOTO(nb__gen_push(gens, GEN_DNS, opts->name), st, fail);
  }
  NB_CHECK_GOTO(nb__gen_push(gens, GEN_URI, uri), st, fail);
  for (size_t i = 0; i < opts->n_sans; i++)
    NB_CHECK_GOTO(nb__san_push(gens, opts->sans[i]), st, fail);

  NB_CHECK_GOTO(nb__keygen(&key), st, fail);
  if (!X509_set_version(x, X509_VERSION_3) || !X509_set_pubkey(x, key) ||
      !X509_set_issuer_name(x, X509_get_subject_name(ca_cert))) {
    st = nb__ossl_error(NB_ERR_CRYPTO, "building the certificate");
    goto fail;
  }
  NB_CHECK_GOTO(nb__set_serial(x), st, fail);
  NB_CHECK_GOTO(nb__set_validity(x, nbf, naf), st, fail);
  NB_CHECK_GOTO(nb__set_cn(x, opts->name, 0), st, fail);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, ca_cert, x, NULL, NULL, 0);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_basic_constraints, "critical,CA:FALSE"), st, fail);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_key_usage, "critical,digitalSignature"), st, fail);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_ext_key_usage,
                            opts->kind == NB_PKI_CLUSTER ? "serverAuth,clientAuth" : "clientAuth"),
                st, fail);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_subject_key_identifier, "hash"), st, fail);
  NB_CHECK_GOTO(nb__add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always"), st, fail);
  if (!X509_add1_ext_i2d(x, NID_subject_alt_name, gens, 0, X509V3_ADD_DEFAULT)) {
    st = nb__ossl_error(NB_ERR_CRYPTO, "adding subjectAltName");
    goto fail;
  }
  NB_CHECK_GOTO(nb__sign(x, ca_key), st, fail);
  GENERAL_NAMES_free(gens);
  *key_out = key;
  *cert_out = x;
  return NB_OK;
fail:
  GENERAL_NAMES_free(gens);
  EVP_PKEY_free(key);
  X509_free(x);
  return st;
}

/* ---------------------------------------------------------------- verification */

nb_status_t nb_pki_cert_verify(X509* cert, X509* ca, nb_pki_usage_t usage,
                               const nb_pki_identity_t* expect) {
  if (!cert || !ca) return nb_error(NB_ERR_INVALID, "NULL certificate");
  nb_status_t st = NB_OK;
  X509_STORE* store = X509_STORE_new();
  X509_STORE_CTX* sctx = X509_STORE_CTX_new();
  char subj[256];
  X509_NAME_oneline(X509_get_subject_name(cert), subj, sizeof subj);
  if (!store || !sctx || !X509_STORE_add_cert(store, ca) ||
      !X509_STORE_CTX_init(sctx, store, cert, NULL)) {
    st = nb__ossl_error(NB_ERR_CRYPTO, "setting up certificate verification");
    goto done;
  }
  X509_STORE_CTX_set_flags(sctx, X509_V_FLAG_X509_STRICT);
  if (usage == NB_PKI_USAGE_SERVER || usage == NB_PKI_USAGE_CLIENT) {
    int purpose = usage == NB_PKI_USAGE_SERVER ? X509_PURPOSE_SSL_SERVER : X509_PURPOSE_SSL_CLIENT;
    if (!X509_STORE_CTX_set_purpose(sctx, purpose)) {
      st = nb__ossl_error(NB_ERR_CRYPTO, "setting the verification purpose");
      goto done;
    }
  } else if (usage != NB_PKI_USAGE_ANY) {
    st = nb_error(NB_ERR_INVALID, "unknown usage %d", (int)usage);
    goto done;
  }
  if (X509_verify_cert(sctx) != 1) {
    int err = X509_STORE_CTX_get_error(sctx);
    ERR_clear_error();
    st = nb_error(NB_ERR_PERMISSION, "certificate '%s' not trusted: %s%s", subj,
                  X509_verify_cert_error_string(err),
                  err == X509_V_ERR_INVALID_PURPOSE
                      ? (usage == NB_PKI_USAGE_SERVER ? " (not a TLS server certificate)"
                                                      : " (not a TLS client certificate)")
                      : "");
    goto done;
  }
  if (expect) {
    nb_pki_identity_t got;
    st = nb_pki_identity_from_cert(cert, &got);
    if (st != NB_OK) {
      st = nb_error_wrap(NB_ERR_PERMISSION, "certificate '%s' has no usable identity", subj);
      goto done;
    }
    if (got.kind != expect->kind || strcmp(got.name, expect->name) != 0) {
      st = nb_error(NB_ERR_PERMISSION, "certificate is %s '%s', expected %s '%s'",
                    nb_pki_kind_name(got.kind), got.name, nb_pki_kind_name(expect->kind),
                    expect->name);
      goto done;
    }
  }
done:
  X509_STORE_CTX_free(sctx);
  X509_STORE_free(store);
  return st;
}

nb_status_t nb_pki_key_matches(EVP_PKEY* key, X509* cert) {
  if (!key || !cert) return nb_error(NB_ERR_INVALID, "NULL argument");
  if (X509_check_private_key(cert, key) != 1) {
    ERR_clear_error();
    return nb_error(NB_ERR_INVALID, "the private key does not belong to the certificate");
  }
  return NB_OK;
}

/* ---------------------------------------------------------------- files */

static nb_status_t nb__open_read(const char* path, FILE** out) {
  if (!path || !path[0]) return nb_error(NB_ERR_INVALID, "empty path");
  FILE* f = fopen(path, "r");
  if (!f) {
    if (errno == ENOENT) return nb_error(NB_ERR_NOT_FOUND, "%s: no such file", path);
    int e = errno;
    return nb_error(NB_ERR_IO, "%s: cannot open: %s", path, strerror(e));
  }
  *out = f;
  return NB_OK;
}

nb_status_t nb_pki_cert_load(const char* path, X509** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "NULL argument");
  *out = NULL;
  FILE* f = NULL;
  NB_CHECK(nb__open_read(path, &f));
  X509* x = PEM_read_X509(f, NULL, NULL, NULL);
  fclose(f);
  if (!x) {
    ERR_clear_error();
    return nb_error(NB_ERR_INVALID, "%s: not a PEM certificate", path);
  }
  *out = x;
  return NB_OK;
}

/* Never prompts for a pass phrase: nebula keys are not encrypted. */
static int nb__no_password(char* buf, int size, int rwflag, void* u) {
  (void)buf, (void)size, (void)rwflag, (void)u;
  return -1;
}

nb_status_t nb_pki_key_load(const char* path, EVP_PKEY** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "NULL argument");
  *out = NULL;
  FILE* f = NULL;
  NB_CHECK(nb__open_read(path, &f));
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077))
    NB_WARN("private key %s has mode %04o: others may read it; run chmod 600 on it", path,
            (unsigned)(sb.st_mode & 07777));
  EVP_PKEY* k = PEM_read_PrivateKey(f, NULL, nb__no_password, NULL);
  fclose(f);
  if (!k) {
    ERR_clear_error();
    return nb_error(NB_ERR_INVALID, "%s: not a PEM private key (or an encrypted one)", path);
  }
  *out = k;
  return NB_OK;
}

nb_status_t nb_pki_cert_to_pem(X509* cert, char** out) {
  if (!cert || !out) return nb_error(NB_ERR_INVALID, "NULL argument");
  *out = NULL;
  BIO* bio = BIO_new(BIO_s_mem());
  if (!bio || !PEM_write_bio_X509(bio, cert)) {
    BIO_free(bio);
    return nb__ossl_error(NB_ERR_CRYPTO, "writing PEM");
  }
  char* data;
  long n = BIO_get_mem_data(bio, &data);
  nb_status_t st = nb_alloc((void**)out, (size_t)n + 1, 1, "PEM text");
  if (st == NB_OK) {
    memcpy(*out, data, (size_t)n);
    (*out)[n] = '\0';
  }
  BIO_free(bio);
  return st;
}

/* A file written under a temporary name in its final folder, not yet renamed into place. */
typedef struct {
  char tmp[PATH_MAX];
  char path[PATH_MAX];
  int pending; /* tmp exists */
  int placed;  /* renamed to path by us */
} nb__staged_t;

static nb_status_t nb__fsync_dir_of(const char* path) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char* slash = strrchr(dir, '/');
  if (slash == dir)
    dir[1] = '\0';
  else if (slash)
    *slash = '\0';
  else
    snprintf(dir, sizeof dir, ".");
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return NB_ERRNO("opening the folder to fsync");
  int rc = fsync(fd);
  close(fd);
  if (rc != 0) return NB_ERRNO("fsync of the folder");
  return NB_OK;
}

static nb_status_t nb__stage(nb__staged_t* s, const char* path, const void* data, size_t len,
                             mode_t mode) {
  memset(s, 0, sizeof *s);
  if (strlen(path) >= sizeof s->path - 32) return nb_error(NB_ERR_INVALID, "path too long");
  snprintf(s->path, sizeof s->path, "%s", path);
  unsigned char r[6];
  if (RAND_bytes(r, sizeof r) != 1) return nb__ossl_error(NB_ERR_CRYPTO, "RAND_bytes");
  const char* slash = strrchr(path, '/');
  int dl = slash ? (int)(slash - path + 1) : 0;
  snprintf(s->tmp, sizeof s->tmp, "%.*s.%s.tmp.%02x%02x%02x%02x%02x%02x", dl, path,
           slash ? slash + 1 : path, r[0], r[1], r[2], r[3], r[4], r[5]);
  int fd = open(s->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    int e = errno;
    return nb_error(e == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "%s: cannot create: %s", s->tmp,
                    strerror(e));
  }
  s->pending = 1;
  nb_status_t st = NB_OK;
  const char* p = data;
  size_t left = len;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      st = nb_error(NB_ERR_IO, "%s: write failed: %s", s->tmp, w < 0 ? strerror(errno) : "short");
      break;
    }
    p += w;
    left -= (size_t)w;
  }
  if (st == NB_OK && mode != 0600 && fchmod(fd, mode) != 0) st = NB_ERRNO("fchmod");
  if (st == NB_OK && fsync(fd) != 0)
    st = nb_error(NB_ERR_IO, "%s: fsync: %s", s->tmp, strerror(errno));
  if (close(fd) != 0 && st == NB_OK)
    st = nb_error(NB_ERR_IO, "%s: close: %s", s->tmp, strerror(errno));
  if (st != NB_OK) {
    unlink(s->tmp);
    s->pending = 0;
  }
  return st;
}

static nb_status_t nb__place(nb__staged_t* s, int overwrite) {
  int rc;
  if (overwrite) {
    rc = rename(s->tmp, s->path);
  } else {
    rc = renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->path, RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) { /* file system without NOREPLACE */
      rc = link(s->tmp, s->path);
      if (rc == 0) unlink(s->tmp);
    }
  }
  if (rc != 0) {
    int e = errno;
    if (e == EEXIST) return nb_error(NB_ERR_EXISTS, "%s already exists", s->path);
    return nb_error(NB_ERR_IO, "%s: rename failed: %s", s->path, strerror(e));
  }
  s->pending = 0;
  s->placed = 1;
  return NB_OK;
}

static void nb__unstage(nb__staged_t* s) {
  if (s->pending) unlink(s->tmp);
  s->pending = 0;
}

/* Writes n files all-or-nothing (best effort across renames): stage all, then place all; on a
 * failure removes the temp files and any file this call placed (only when not overwriting). */
static nb_status_t nb__write_files(nb__staged_t* s, const char* const* paths,
                                   const void* const* data, const size_t* lens, const mode_t* modes,
                                   int n, int overwrite) {
  nb_status_t st = NB_OK;
  int staged = 0;
  if (!overwrite)
    for (int i = 0; i < n; i++)
      if (access(paths[i], F_OK) == 0)
        return nb_error(NB_ERR_EXISTS, "%s already exists (refusing to overwrite it)", paths[i]);
  for (; staged < n; staged++)
    NB_CHECK_GOTO(nb__stage(&s[staged], paths[staged], data[staged], lens[staged], modes[staged]),
                  st, fail);
  for (int i = 0; i < n; i++) NB_CHECK_GOTO(nb__place(&s[i], overwrite), st, fail);
  return nb__fsync_dir_of(paths[0]);
fail:
  for (int i = 0; i < staged; i++) {
    nb__unstage(&s[i]);
    if (s[i].placed && !overwrite) unlink(s[i].path);
  }
  return st;
}

/* PEM of a private key in a BIO whose memory is cleansed when freed. */
static nb_status_t nb__key_pem(EVP_PKEY* key, BIO** bio_out, const void** data, size_t* len) {
  BIO* bio = BIO_new(BIO_s_secmem());
  if (!bio || !PEM_write_bio_PrivateKey(bio, key, NULL, NULL, 0, NULL, NULL)) {
    BIO_free(bio);
    return nb__ossl_error(NB_ERR_CRYPTO, "encoding the private key");
  }
  char* p;
  long n = BIO_get_mem_data(bio, &p);
  *bio_out = bio;
  *data = p;
  *len = (size_t)n;
  return NB_OK;
}

static nb_status_t nb__cert_pem(X509* cert, BIO** bio_out, const void** data, size_t* len) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (!bio || !PEM_write_bio_X509(bio, cert)) {
    BIO_free(bio);
    return nb__ossl_error(NB_ERR_CRYPTO, "encoding the certificate");
  }
  char* p;
  long n = BIO_get_mem_data(bio, &p);
  *bio_out = bio;
  *data = p;
  *len = (size_t)n;
  return NB_OK;
}

static nb_status_t nb__write_pair(const char* key_path, EVP_PKEY* key, const char* crt_path,
                                  X509* cert, int overwrite) {
  BIO *kb = NULL, *cb = NULL;
  const void* data[2] = {NULL, NULL};
  size_t lens[2] = {0, 0};
  nb_status_t st = NB_OK;
  NB_CHECK_GOTO(nb__key_pem(key, &kb, &data[0], &lens[0]), st, done);
  NB_CHECK_GOTO(nb__cert_pem(cert, &cb, &data[1], &lens[1]), st, done);
  nb__staged_t s[2];
  const char* paths[2] = {key_path, crt_path};
  const mode_t modes[2] = {0600, 0644};
  st = nb__write_files(s, paths, data, lens, modes, 2, overwrite);
done:
  BIO_free(kb);
  BIO_free(cb);
  return st;
}

nb_status_t nb_pki_key_write(const char* path, EVP_PKEY* key, int overwrite) {
  if (!path || !key) return nb_error(NB_ERR_INVALID, "NULL argument");
  BIO* b = NULL;
  const void* data = NULL;
  size_t len = 0;
  NB_CHECK(nb__key_pem(key, &b, &data, &len));
  nb__staged_t s;
  const mode_t mode = 0600;
  nb_status_t st = nb__write_files(&s, &path, &data, &len, &mode, 1, overwrite);
  BIO_free(b);
  return st;
}

nb_status_t nb_pki_cert_write(const char* path, X509* cert, int overwrite) {
  if (!path || !cert) return nb_error(NB_ERR_INVALID, "NULL argument");
  BIO* b = NULL;
  const void* data = NULL;
  size_t len = 0;
  NB_CHECK(nb__cert_pem(cert, &b, &data, &len));
  nb__staged_t s;
  const mode_t mode = 0644;
  nb_status_t st = nb__write_files(&s, &path, &data, &len, &mode, 1, overwrite);
  BIO_free(b);
  return st;
}

nb_status_t nb_pki_path(const char* dir, nb_pki_kind_t kind, const char* name, const char* ext,
                        char* buf, size_t cap) {
  if (!dir || !dir[0] || !ext || !buf) return nb_error(NB_ERR_INVALID, "NULL argument");
  int w;
  if (kind == NB_PKI_NONE) {
    w = snprintf(buf, cap, "%s/ca.%s", dir, ext);
  } else {
    NB_CHECK(nb_pki_name_check(name, kind == NB_PKI_CLUSTER ? "cluster id" : "user name"));
    w = snprintf(buf, cap, "%s/%s/%s.%s", dir, kind == NB_PKI_CLUSTER ? "clusters" : "users", name,
                 ext);
  }
  if (w < 0 || (size_t)w >= cap) return nb_error(NB_ERR_INVALID, "path under '%s' too long", dir);
  return NB_OK;
}

static nb_status_t nb__mkdir(const char* dir) {
  if (mkdir(dir, 0700) == 0) return NB_OK;
  if (errno != EEXIST) {
    int e = errno;
    return nb_error(e == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "%s: cannot create folder: %s", dir,
                    strerror(e));
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return nb_error(NB_ERR_IO, "%s exists and is not a folder", dir);
  return NB_OK;
}

nb_status_t nb_pki_dir_init(const char* dir, const char* common_name, int days, int force) {
  if (!dir || !dir[0]) return nb_error(NB_ERR_INVALID, "no PKI folder given");
  char kp[PATH_MAX], cp[PATH_MAX];
  NB_CHECK(nb_pki_path(dir, NB_PKI_NONE, NULL, "key", kp, sizeof kp));
  NB_CHECK(nb_pki_path(dir, NB_PKI_NONE, NULL, "crt", cp, sizeof cp));
  if (!force)
    for (int i = 0; i < 2; i++)
      if (access(i ? cp : kp, F_OK) == 0)
        return nb_error(NB_ERR_EXISTS,
                        "%s already exists: refusing to overwrite the federation CA (--force "
                        "replaces it and invalidates every certificate it issued)",
                        i ? cp : kp);
  /* The CA is made in memory first (a bad name or validity fails here), and a folder this call
   * created is removed again when writing fails: a failed init leaves nothing behind. */
  EVP_PKEY* key = NULL;
  X509* cert = NULL;
  NB_CHECK(nb_pki_ca_create(common_name, days, &key, &cert));
  struct stat pre;
  int made = stat(dir, &pre) != 0 && errno == ENOENT;
  nb_status_t st = nb__mkdir(dir);
  if (st == NB_OK) st = nb__write_pair(kp, key, cp, cert, force);
  EVP_PKEY_free(key);
  X509_free(cert);
  if (st != NB_OK && made) {
    char why[512];
    snprintf(why, sizeof why, "%s", nb_error_last());
    unlink(kp);
    unlink(cp);
    rmdir(dir);
    nb_error(st, "%s", why);
  }
  if (st == NB_OK) NB_INFO(SEC, "created the federation CA in %s", dir);
  return st;
}

nb_status_t nb_pki_dir_issue(const char* dir, const nb_pki_issue_opts_t* opts, int force) {
  if (!dir || !dir[0] || !opts) return nb_error(NB_ERR_INVALID, "no PKI folder given");
  if (opts->kind != NB_PKI_CLUSTER && opts->kind != NB_PKI_USER)
    return nb_error(NB_ERR_INVALID, "certificate kind must be cluster or user");
  char kp[PATH_MAX], cp[PATH_MAX], sub[PATH_MAX], cakp[PATH_MAX], cacp[PATH_MAX];
  NB_CHECK(nb_pki_path(dir, opts->kind, opts->name, "key", kp, sizeof kp));
  NB_CHECK(nb_pki_path(dir, opts->kind, opts->name, "crt", cp, sizeof cp));
  NB_CHECK(nb_pki_path(dir, NB_PKI_NONE, NULL, "key", cakp, sizeof cakp));
  NB_CHECK(nb_pki_path(dir, NB_PKI_NONE, NULL, "crt", cacp, sizeof cacp));
  snprintf(sub, sizeof sub, "%s/%s", dir, opts->kind == NB_PKI_CLUSTER ? "clusters" : "users");
  if (!force)
    for (int i = 0; i < 2; i++)
      if (access(i ? cp : kp, F_OK) == 0)
        return nb_error(NB_ERR_EXISTS, "%s already exists (use --force to replace it)",
                        i ? cp : kp);
  nb_status_t st = NB_OK;
  EVP_PKEY *cakey = NULL, *key = NULL;
  X509 *cacert = NULL, *cert = NULL;
  NB_CHECK_GOTO(nb_pki_cert_load(cacp, &cacert), st, done);
  NB_CHECK_GOTO(nb_pki_key_load(cakp, &cakey), st, done);
  st = nb_pki_key_matches(cakey, cacert);
  if (st != NB_OK) {
    st = nb_error(NB_ERR_INVALID, "%s is not the key of %s", cakp, cacp);
    goto done;
  }
  if (X509_check_ca(cacert) <= 0) {
    st = nb_error(NB_ERR_INVALID, "%s is not a CA certificate", cacp);
    goto done;
  }
  NB_CHECK_GOTO(nb_pki_cert_issue(cakey, cacert, opts, &key, &cert), st, done);
  NB_CHECK_GOTO(nb__mkdir(sub), st, done);
  NB_CHECK_GOTO(nb__write_pair(kp, key, cp, cert, force), st, done);
  NB_INFO(SEC, "issued %s certificate '%s' in %s", nb_pki_kind_name(opts->kind), opts->name, dir);
done:
  EVP_PKEY_free(cakey);
  EVP_PKEY_free(key);
  X509_free(cacert);
  X509_free(cert);
  return st;
}

/* ---------------------------------------------------------------- inspection */

nb_status_t nb_pki_fingerprint(X509* cert, char buf[96]) {
  if (!cert || !buf) return nb_error(NB_ERR_INVALID, "NULL argument");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!X509_digest(cert, EVP_sha256(), md, &n) || n != 32)
    return nb__ossl_error(NB_ERR_CRYPTO, "fingerprint");
  for (unsigned i = 0; i < n; i++) snprintf(buf + 3 * i, 4, "%02X%s", md[i], i + 1 < n ? ":" : "");
  return NB_OK;
}

static void nb__print_time(BIO* b, const ASN1_TIME* t) {
  struct tm tm;
  if (ASN1_TIME_to_tm(t, &tm) == 1) {
    char s[64];
    strftime(s, sizeof s, "%Y-%m-%dT%H:%M:%SZ", &tm);
    BIO_puts(b, s);
  } else {
    BIO_puts(b, "(unreadable)");
  }
}

nb_status_t nb_pki_cert_describe(X509* cert, char** out) {
  if (!cert || !out) return nb_error(NB_ERR_INVALID, "NULL argument");
  *out = NULL;
  BIO* b = BIO_new(BIO_s_mem());
  if (!b) return nb__ossl_error(NB_ERR_NOMEM, "BIO_new");
  BIO_puts(b, "subject:     ");
  X509_NAME_print_ex(b, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
  BIO_puts(b, "\nissuer:      ");
  X509_NAME_print_ex(b, X509_get_issuer_name(cert), 0, XN_FLAG_RFC2253);
  BIO_puts(b, "\nserial:      ");
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), NULL);
  char* hex = bn ? BN_bn2hex(bn) : NULL;
  BIO_puts(b, hex ? hex : "?");
  OPENSSL_free(hex);
  BN_free(bn);
  BIO_puts(b, "\nnot before:  ");
  nb__print_time(b, X509_get0_notBefore(cert));
  BIO_puts(b, "\nnot after:   ");
  nb__print_time(b, X509_get0_notAfter(cert));
  int cmp = X509_cmp_current_time(X509_get0_notAfter(cert));
  int cmpb = X509_cmp_current_time(X509_get0_notBefore(cert));
  BIO_printf(b, "\nvalid now:   %s",
             cmp < 0    ? "no (expired)"
             : cmpb > 0 ? "no (not yet valid)"
                        : "yes");

  BIO_puts(b, "\nkey:         ");
  EVP_PKEY* pk = X509_get0_pubkey(cert);
  char group[64] = "";
  size_t gl = 0;
  if (pk && EVP_PKEY_get_group_name(pk, group, sizeof group, &gl) == 1)
    BIO_printf(b, "%s %s", EVP_PKEY_get0_type_name(pk), group);
  else if (pk)
    BIO_printf(b, "%s %d bits", EVP_PKEY_get0_type_name(pk), EVP_PKEY_get_bits(pk));
  ERR_clear_error();

  BIO_puts(b, "\nSANs:        ");
  GENERAL_NAMES* gens = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
  int nsan = 0;
  for (int i = 0; gens && i < sk_GENERAL_NAME_num(gens); i++) {
    const GENERAL_NAME* gn = sk_GENERAL_NAME_value(gens, i);
    const char* sep = nsan++ ? ", " : "";
    if (gn->type == GEN_DNS || gn->type == GEN_URI || gn->type == GEN_EMAIL) {
      const ASN1_IA5STRING* s = gn->d.ia5;
      BIO_printf(b, "%s%s:%.*s", sep,
                 gn->type == GEN_DNS   ? "DNS"
                 : gn->type == GEN_URI ? "URI"
                                       : "email",
                 ASN1_STRING_length(s), (const char*)ASN1_STRING_get0_data(s));
    } else if (gn->type == GEN_IPADD) {
      char ip[INET6_ADDRSTRLEN] = "?";
      int len = ASN1_STRING_length(gn->d.iPAddress);
      const unsigned char* d = ASN1_STRING_get0_data(gn->d.iPAddress);
      if (len == 4)
        inet_ntop(AF_INET, d, ip, sizeof ip);
      else if (len == 16)
        inet_ntop(AF_INET6, d, ip, sizeof ip);
      BIO_printf(b, "%sIP:%s", sep, ip);
    } else {
      BIO_printf(b, "%s(other type %d)", sep, gn->type);
    }
  }
  if (!nsan) BIO_puts(b, "(none)");
  GENERAL_NAMES_free(gens);
  ERR_clear_error();

  nb_pki_identity_t id;
  BIO_puts(b, "\nidentity:    ");
  if (nb_pki_identity_from_cert(cert, &id) == NB_OK)
    BIO_printf(b, "%s %s (nebula://%s/%s)", nb_pki_kind_name(id.kind), id.name,
               nb_pki_kind_name(id.kind), id.name);
  else
    BIO_printf(b, "none (%s)", nb_error_last());
  nb_error_clear();

  BIO_printf(b, "\nCA:          %s", X509_check_ca(cert) > 0 ? "yes" : "no");
  uint32_t ku = X509_get_key_usage(cert);
  BIO_puts(b, "\nkey usage:   ");
  if (ku == UINT32_MAX) {
    BIO_puts(b, "(unrestricted)");
  } else {
    static const struct {
      uint32_t bit;
      const char* name;
    } kus[] = {{KU_DIGITAL_SIGNATURE, "digitalSignature"},
               {KU_NON_REPUDIATION, "nonRepudiation"},
               {KU_KEY_ENCIPHERMENT, "keyEncipherment"},
               {KU_DATA_ENCIPHERMENT, "dataEncipherment"},
               {KU_KEY_AGREEMENT, "keyAgreement"},
               {KU_KEY_CERT_SIGN, "keyCertSign"},
               {KU_CRL_SIGN, "cRLSign"}};
    int n = 0;
    for (size_t i = 0; i < sizeof kus / sizeof kus[0]; i++)
      if (ku & kus[i].bit) BIO_printf(b, "%s%s", n++ ? ", " : "", kus[i].name);
    if (!n) BIO_puts(b, "(none)");
  }
  uint32_t xku = X509_get_extended_key_usage(cert);
  BIO_puts(b, "\next usage:   ");
  if (xku == UINT32_MAX) {
    BIO_puts(b, "(unrestricted)");
  } else {
    int n = 0;
    if (xku & XKU_SSL_SERVER) BIO_printf(b, "%sserverAuth", n++ ? ", " : "");
    if (xku & XKU_SSL_CLIENT) BIO_printf(b, "%sclientAuth", n++ ? ", " : "");
    if (xku & ~(uint32_t)(XKU_SSL_SERVER | XKU_SSL_CLIENT))
      BIO_printf(b, "%sother", n++ ? ", " : "");
    if (!n) BIO_puts(b, "(none)");
  }
  char fp[96];
  if (nb_pki_fingerprint(cert, fp) == NB_OK) BIO_printf(b, "\nsha256:      %s", fp);
  BIO_puts(b, "\n");

  char* data;
  long n = BIO_get_mem_data(b, &data);
  nb_status_t st = nb_alloc((void**)out, (size_t)n + 1, 1, "certificate description");
  if (st == NB_OK) {
    memcpy(*out, data, (size_t)n);
    (*out)[n] = '\0';
  }
  BIO_free(b);
  return st;
}
