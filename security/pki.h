/* The federation PKI: a CA (EC P-256), cluster and user certificates issued from it, loading,
 * verification (chain, validity, key usage) and the nebula identity carried in a certificate.
 * Built on OpenSSL 3's C API only. It is not a general CA: no CRLs, no intermediates, no OCSP. */
#ifndef NB_SECURITY_PKI_H
#define NB_SECURITY_PKI_H

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest cluster id or user name (bytes, without the terminating NUL). Names use only
 * [A-Za-z0-9._-], start with a letter or digit, and are at most this long. */
#define NB_PKI_NAME_MAX 63

/* Who a certificate speaks for. Encoded in a certificate as the URI SAN "nebula://cluster/ID"
 * or "nebula://user/NAME" (authoritative) and repeated as the subject CN. */
typedef enum {
  NB_PKI_NONE = 0,    /* no nebula identity (e.g. the CA, or a foreign certificate) */
  NB_PKI_CLUSTER = 1, /* a datacenter: TLS server and client (gateways, exchange leaders) */
  NB_PKI_USER = 2,    /* a person or robot: TLS client, signs job descriptors */
} nb_pki_kind_t;

typedef struct {
  nb_pki_kind_t kind;
  char name[NB_PKI_NAME_MAX + 1];
} nb_pki_identity_t;

/* What a verified certificate must be good for (checked through keyUsage + extendedKeyUsage). */
typedef enum {
  NB_PKI_USAGE_ANY = 0,    /* chain and validity only */
  NB_PKI_USAGE_SERVER = 1, /* TLS server (serverAuth) */
  NB_PKI_USAGE_CLIENT = 2, /* TLS client and descriptor signing (clientAuth) */
} nb_pki_usage_t;

/* Options of a certificate to issue. Zero-initialise and set what you need. */
typedef struct {
  nb_pki_kind_t kind;      /* NB_PKI_CLUSTER or NB_PKI_USER */
  const char* name;        /* cluster id or user name (see NB_PKI_NAME_MAX) */
  const char* const* sans; /* extra subjectAltNames: "IP", "DNS name", "IP:x" or "DNS:x" */
  size_t n_sans;           /* borrowed; only for clusters */
  int days;                /* validity; 0 = 825 */
  int64_t not_before;      /* optional absolute validity (Unix seconds) overriding days, for */
  int64_t not_after;       /* tests and short-lived certs; both 0 = [now - 5 min, now + days] */
} nb_pki_issue_opts_t;

/* ---- names and identities ---- */

/* NB_OK when `name` is a valid cluster id / user name, else NB_ERR_INVALID naming the problem
 * (`what` is used in the message, e.g. "cluster id"). */
nb_status_t nb_pki_name_check(const char* name, const char* what);

/* "cluster" / "user" / "none". Never NULL. */
const char* nb_pki_kind_name(nb_pki_kind_t kind);

/* Formats "nebula://cluster/ID" into buf (NB_ERR_INVALID if it does not fit or kind is NONE). */
nb_status_t nb_pki_identity_uri(const nb_pki_identity_t* id, char* buf, size_t cap);

/* Parses "nebula://cluster/ID" or "nebula://user/NAME". NB_ERR_INVALID otherwise. */
nb_status_t nb_pki_identity_parse_uri(const char* uri, nb_pki_identity_t* out);

/* The nebula identity of a certificate: from its single nebula:// URI SAN, cross-checked
 * against the subject CN. Does NOT verify the certificate (call nb_pki_cert_verify first, or
 * rely on the TLS handshake having done it). NB_ERR_NOT_FOUND when the certificate carries no
 * nebula identity; NB_ERR_INVALID when it carries several or they disagree. Thread-safe. */
nb_status_t nb_pki_identity_from_cert(X509* cert, nb_pki_identity_t* out);

/* Same from PEM text (as gRPC's auth context gives the peer's certificate, property
 * "x509_pem_cert"). len may be 0 for a NUL-terminated string. NB_ERR_INVALID for text that is
 * not a PEM certificate. Thread-safe. */
nb_status_t nb_pki_identity_from_pem(const char* pem, size_t len, nb_pki_identity_t* out);

/* For the TLS layer, after the handshake has verified the peer's chain: NB_OK when the PEM
 * certificate `pem` (len 0 = NUL-terminated) carries exactly the identity `expect`, else
 * NB_ERR_PERMISSION naming both identities (or why there is none). Thread-safe. */
nb_status_t nb_pki_identity_check_pem(const char* pem, size_t len, const nb_pki_identity_t* expect);

/* ---- in-memory creation ---- */

/* A new CA: EC P-256 key and self-signed certificate (basicConstraints CA:TRUE critical,
 * keyUsage keyCertSign+cRLSign critical, pathlen 0). common_name NULL = "nebula federation CA";
 * days 0 = 3650. On NB_OK the caller owns *key_out (EVP_PKEY_free) and *cert_out (X509_free). */
nb_status_t nb_pki_ca_create(const char* common_name, int days, EVP_PKEY** key_out,
                             X509** cert_out);

/* Issues a key pair and certificate signed by the CA (ca_key, ca_cert borrowed). A cluster cert
 * gets EKU serverAuth+clientAuth and SANs DNS:<id>, URI:nebula://cluster/<id> and opts->sans; a
 * user cert gets EKU clientAuth and URI:nebula://user/<name>. Both: CN=<name>, keyUsage
 * digitalSignature critical, CA:FALSE. NB_ERR_INVALID for a bad name or SAN. Caller owns the
 * outputs. */
nb_status_t nb_pki_cert_issue(EVP_PKEY* ca_key, X509* ca_cert, const nb_pki_issue_opts_t* opts,
                              EVP_PKEY** key_out, X509** cert_out);

/* ---- verification ---- */

/* Verifies `cert` against the single trusted root `ca` (both borrowed): signature chain, the
 * validity period at the current time, and `usage`; if `expect` is non-NULL, also that the
 * certificate's identity equals it. Returns NB_OK; NB_ERR_PERMISSION when the certificate is not
 * trusted (other CA, expired, not yet valid, wrong usage, bad signature) or is someone else (the
 * message names the reason and the subject); NB_ERR_INVALID for NULL arguments. Thread-safe. */
nb_status_t nb_pki_cert_verify(X509* cert, X509* ca, nb_pki_usage_t usage,
                               const nb_pki_identity_t* expect);

/* NB_OK when `key` is the private key of `cert`, else NB_ERR_INVALID. */
nb_status_t nb_pki_key_matches(EVP_PKEY* key, X509* cert);

/* ---- files ---- */

/* Loads a PEM certificate / private key. NB_ERR_NOT_FOUND (missing), NB_ERR_IO (unreadable),
 * NB_ERR_INVALID (not a PEM certificate / key: the message names the file). Caller owns *out.
 * A key file that group or others may read is loaded with an NB_WARN saying to chmod it 0600. */
nb_status_t nb_pki_cert_load(const char* path, X509** out);
nb_status_t nb_pki_key_load(const char* path, EVP_PKEY** out);
/* Parses PEM text (len 0 = NUL-terminated). Caller owns *out. */
nb_status_t nb_pki_cert_from_pem(const char* pem, size_t len, X509** out);
/* PEM text of a certificate, NUL-terminated; caller frees *out with nb_free. */
nb_status_t nb_pki_cert_to_pem(X509* cert, char** out);

/* Writes a private key (PKCS#8 PEM) / certificate (PEM) atomically: a temp file in the same
 * folder opened O_CREAT|O_EXCL with mode 0600 (0644 for certificates after writing), fsync,
 * rename, fsync of the folder. Without `overwrite`, an existing `path` gives NB_ERR_EXISTS and is
 * left alone. On any failure no partial file is left behind. */
nb_status_t nb_pki_key_write(const char* path, EVP_PKEY* key, int overwrite);
nb_status_t nb_pki_cert_write(const char* path, X509* cert, int overwrite);

/* The file layout of a PKI folder D: D/ca.key, D/ca.crt, D/clusters/<id>.{key,crt},
 * D/users/<name>.{key,crt}. Writes "<dir>/<...>.<ext>" (ext "key" or "crt") into buf; kind NONE
 * means the CA. NB_ERR_INVALID if it does not fit or the name is bad. */
nb_status_t nb_pki_path(const char* dir, nb_pki_kind_t kind, const char* name, const char* ext,
                        char* buf, size_t cap);

/* `nebula certs init`: creates D (0700 if missing) and the CA in it. An existing CA key or
 * certificate gives NB_ERR_EXISTS unless `force`. */
nb_status_t nb_pki_dir_init(const char* dir, const char* common_name, int days, int force);

/* `nebula certs issue`: loads D's CA, checks the key matches, issues, and writes the key and
 * certificate at nb_pki_path(). Existing files give NB_ERR_EXISTS unless `force`; on failure
 * neither file is left behind (nor a temp file). */
nb_status_t nb_pki_dir_issue(const char* dir, const nb_pki_issue_opts_t* opts, int force);

/* ---- inspection ---- */

/* SHA-256 fingerprint of the DER certificate as "AB:CD:..." (95 chars + NUL). */
nb_status_t nb_pki_fingerprint(X509* cert, char buf[96]);

/* Human-readable description (subject, issuer, validity, SANs, identity, key usages, whether it
 * is a CA, fingerprint), one "key: value" per line, NUL-terminated; caller frees *out with
 * nb_free. */
nb_status_t nb_pki_cert_describe(X509* cert, char** out);

/* Internal, shared with the rest of security/: records `st` with "what: <OpenSSL error queue>"
 * (and clears the queue). */
nb_status_t nb__ossl_error(nb_status_t st, const char* what);

#ifdef __cplusplus
}
#endif
#endif
