/* security/tls: gRPC mutual-TLS credentials from the federation's PEM files, and the peer
 * identity read from a verified certificate (cluster or user). It does not create certificates
 * (security/pki does) and does not run servers or channels (inter/rpc does).
 *
 * Identities: a cluster certificate carries the URI SAN "nebula://cluster/<id>" (and CN=<id>);
 * a user certificate carries "nebula://user/<name>". The nebula:// URI SAN is the identity; a
 * certificate without one has no identity and is refused, whatever its CN says (the rule is
 * stated once in docs/security.md, "Identity"). */
#ifndef NB_SECURITY_TLS_H
#define NB_SECURITY_TLS_H

#include <stddef.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gRPC's own handle types (grpc/grpc.h, grpc/grpc_security.h); forward-declared here so that
 * including this header does not pull gRPC in. */
struct grpc_call;
struct grpc_server_credentials;
struct grpc_channel_credentials;

#define NB_TLS_ID_MAX 128 /* longest cluster id or user name, including the NUL */

/* PEM file paths of one endpoint. All borrowed; read by each nb_tls_create. */
typedef struct {
  const char* ca_path;   /* the federation CA certificate(s); required */
  const char* cert_path; /* this endpoint's certificate (chain), leaf first; required */
  const char* key_path;  /* this endpoint's private key; required */
} nb_tls_files_t;

/* Loaded PEM material of one endpoint. Immutable after creation: thread-safe to share. */
typedef struct nb_tls nb_tls_t;

/* The endpoint's own certificate as logs show it (no key material). */
typedef struct {
  char subject[256];  /* RFC 2253 ("CN=dc-a,O=nebula"); "" if it cannot be printed */
  char not_after[32]; /* "2027-12-03T10:00:00Z" (UTC) */
  char serial[80];    /* upper-case hex */
} nb_tls_cert_info_t;

/* Reloadable material: the nb_tls_t an endpoint uses now, replaced as a whole (certificate
 * rotation without a restart). Thread-safe. */
typedef struct nb_tls_source nb_tls_source_t;

typedef enum {
  NB_TLS_PEER_NONE = 0,    /* no verified certificate (plaintext or not TLS) */
  NB_TLS_PEER_CLUSTER = 1, /* nebula://cluster/<id> */
  NB_TLS_PEER_USER = 2,    /* nebula://user/<name> */
} nb_tls_peer_kind_t;

/* The identity of a peer as its verified certificate states it. */
typedef struct {
  nb_tls_peer_kind_t kind;
  char name[NB_TLS_ID_MAX];        /* cluster id or user name; "" with kind NONE */
  char common_name[NB_TLS_ID_MAX]; /* subject CN, "" when absent */
} nb_tls_peer_t;

/* Reads and checks the three PEM files: the CA and the certificate parse, the key parses and
 * matches the certificate, the certificate is signed by the CA and currently valid (not
 * expired, not before its notBefore). Each message names the file (or files) at fault.
 * files: borrowed. out: set on NB_OK; release with nb_tls_destroy.
 * Returns NB_ERR_INVALID (NULL or missing path), NB_ERR_IO (unreadable file), NB_ERR_CRYPTO
 * (a file does not parse, key/certificate mismatch, certificate not from that CA or expired),
 * NB_ERR_NOMEM. */
nb_status_t nb_tls_create(const nb_tls_files_t* files, nb_tls_t** out);

/* Releases tls (NULL ok): nb_tls_create's reference or one from nb_tls_source_get; the
 * material is freed with the last. Credentials made from it stay valid (gRPC copies the PEM). */
void nb_tls_destroy(nb_tls_t* tls);

/* The identity in this endpoint's own certificate. */
const nb_tls_peer_t* nb_tls_self(const nb_tls_t* tls);

/* Subject, notAfter and serial of this endpoint's own certificate (the leaf). */
const nb_tls_cert_info_t* nb_tls_cert_info(const nb_tls_t* tls);

/* A source serving tls until nb_tls_source_set replaces it. tls: taken over on NB_OK (on
 * failure it stays the caller's). out: release with nb_tls_source_destroy.
 * Returns NB_ERR_INVALID, NB_ERR_NOMEM. */
nb_status_t nb_tls_source_create(nb_tls_t* tls, nb_tls_source_t** out);

/* Releases the source's material and its credentials' bookkeeping (NULL ok). Every server made
 * with nb_tls_source_server_credentials must be destroyed first. */
void nb_tls_source_destroy(nb_tls_source_t* src);

/* The material in use now, with a reference of the caller's own (release it with
 * nb_tls_destroy): a replacement meanwhile does not free it. Thread-safe. */
nb_tls_t* nb_tls_source_get(nb_tls_source_t* src);

/* Makes tls (taken over; checked already, by nb_tls_create) the material in use: servers with
 * nb_tls_source_server_credentials present it from their next TLS handshake on, connections
 * already open keep theirs; nb_tls_source_get returns it. The previous material is released
 * once no holder uses it. Thread-safe. */
void nb_tls_source_set(nb_tls_source_t* src, nb_tls_t* tls);

/* Makes TLS 1.3 connections of this process negotiate the suites of NB_TLS13_CIPHERSUITES
 * (default TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256), in that
 * order of preference, servers included ("default": leave OpenSSL's order, AES-256-GCM first).
 * gRPC 1.51 applies its own cipher list to TLS 1.2 only. Process-wide and applied once (OpenSSL's
 * "system_default" ssl_conf section, which replaces such a section of the system's OpenSSL
 * configuration); the credential functions below call it. Returns NB_ERR_CONFIG (an unknown or
 * malformed suite list), NB_ERR_CRYPTO. Thread-safe. */
nb_status_t nb_tls_apply_cipher_policy(void);

/* The TLS 1.3 suites in effect ("TLS_AES_128_GCM_SHA256:..."), applying the policy first; NULL
 * when it failed. With "default", OpenSSL's built-in list (which a system_default section of the
 * system's OpenSSL configuration may override). Static storage. Thread-safe. */
const char* nb_tls_ciphersuites(void);

/* Server credentials that require a client certificate and verify it against the CA
 * (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY): plaintext clients, clients
 * without a certificate and clients with a certificate from another CA fail the handshake.
 * Which identity may call what is decided per call (nb_tls_peer_from_call + the checks below).
 * Requires grpc_init() to be in effect (inter/rpc does that). out: caller releases with
 * grpc_server_credentials_release. Returns NB_ERR_INVALID, NB_ERR_RPC, NB_ERR_CONFIG (see
 * nb_tls_apply_cipher_policy). Thread-safe. */
nb_status_t nb_tls_server_credentials(const nb_tls_t* tls, struct grpc_server_credentials** out);

/* nb_tls_server_credentials that follow src: gRPC asks src at the start of each TLS handshake
 * (grpc_ssl_server_credentials_create_options_using_config_fetcher) and takes up material
 * set since. src must outlive every server using these credentials. out: caller releases
 * with grpc_server_credentials_release. Returns NB_ERR_INVALID, NB_ERR_NOMEM, NB_ERR_RPC,
 * NB_ERR_CONFIG. Thread-safe. */
nb_status_t nb_tls_source_server_credentials(nb_tls_source_t* src,
                                             struct grpc_server_credentials** out);

/* Channel credentials that present this endpoint's certificate, verify the server against the
 * CA (and its host name or IP against the target), and, when expected_cluster is not NULL,
 * also refuse a server whose certificate is not that cluster's. expected_cluster: copied.
 * out: caller releases with grpc_channel_credentials_release. Returns NB_ERR_INVALID,
 * NB_ERR_RPC, NB_ERR_CONFIG (see nb_tls_apply_cipher_policy). Requires grpc_init() in effect.
 * Thread-safe. */
nb_status_t nb_tls_channel_credentials(const nb_tls_t* tls, const char* expected_cluster,
                                       struct grpc_channel_credentials** out);

/* The peer identity of a server-side call, from its auth context (the verified leaf certificate
 * as PEM). out: filled on NB_OK. Returns NB_ERR_PERMISSION when the call is not authenticated
 * by a certificate (kind NONE is then also written to out), NB_ERR_CRYPTO when the certificate
 * cannot be read or states an ambiguous identity. Thread-safe. */
nb_status_t nb_tls_peer_from_call(struct grpc_call* call, nb_tls_peer_t* out);

/* The identity stated by a PEM certificate (leaf first; only the first certificate is read).
 * It does not verify the certificate: use it on certificates a TLS handshake verified.
 * Returns NB_ERR_INVALID, NB_ERR_CRYPTO (unparsable, no nebula identity URI -- a CN alone is
 * not one --, several nebula identities, a nebula URI with an empty or over-long name or bad
 * characters). */
nb_status_t nb_tls_peer_from_pem(const char* pem, size_t len, nb_tls_peer_t* out);

/* NB_OK when peer is the cluster `cluster_id`; otherwise NB_ERR_PERMISSION with a message that
 * names both identities. A cluster certificate whose CN disagrees with its URI SAN is refused. */
nb_status_t nb_tls_peer_check_cluster(const nb_tls_peer_t* peer, const char* cluster_id);

/* NB_OK when peer is the user `user` (NB_ERR_PERMISSION otherwise). */
nb_status_t nb_tls_peer_check_user(const nb_tls_peer_t* peer, const char* user);

#ifdef __cplusplus
}
#endif
#endif
