/* Sealing of frame chunks between two clusters: AES-256-GCM (OpenSSL EVP) with keys derived per
 * job and per direction by HKDF-SHA256 from a job secret, deterministic nonces from
 * (sender, round, chunk), the caller's frame header as associated data, and a replay window.
 * It is not a transport and not a frame format: the caller carries round, chunk and header.
 *
 * Key schedule (docs/security.md has the full picture). For the direction S -> R:
 *   okm  = HKDF-SHA256(ikm = job secret (32 bytes), salt = "nebula/v1 job " || job_id,
 *                      info = "nebula/v1 seal" 0x00 S 0x00 R 0x00 epoch(S) as 4 bytes big-endian,
 *                      L = 36)
 *   key  = okm[0..31]   (AES-256-GCM key of S -> R)
 *   tag  = okm[32..35]  (the sender field of every nonce of S -> R)
 * Nonce (96 bits) = sender field (4 bytes) || round (4 bytes, BE) || chunk (4 bytes, BE).
 * A key belongs to one (job, sender, receiver, sender epoch), and within it a nonce is unique
 * for each (round, chunk): values that do not fit 32 bits are refused, never wrapped. A sender
 * must not seal the same (round, chunk) twice with different bytes under one epoch: a sender
 * process that restarts and may redo a round starts a new epoch (nb_seal_opts_t.local_epoch),
 * which the receiver adopts with nb_seal_set_peer_epoch(). */
#ifndef NB_SECURITY_SEAL_H
#define NB_SECURITY_SEAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_SEAL_SECRET_BYTES 32
#define NB_SEAL_NONCE_BYTES 12
#define NB_SEAL_TAG_BYTES 16
/* Largest round / chunk index a nonce can carry. */
#define NB_SEAL_MAX_ROUND UINT32_MAX
#define NB_SEAL_MAX_CHUNK UINT32_MAX
/* Largest plaintext of one chunk (GCM's limit is 2^36 - 32 bytes; we stay well below). */
#define NB_SEAL_MAX_CHUNK_BYTES ((size_t)1 << 34)

typedef struct nb_seal_ctx nb_seal_ctx_t;

/* Options of a sealing context. Zero-initialise; every field has a default. */
typedef struct {
  uint32_t local_epoch;   /* incarnation of this side as a sender (default 0) */
  uint32_t peer_epoch;    /* incarnation expected of the peer at first (default 0) */
  uint32_t replay_rounds; /* rounds kept in the replay window; 0 = NB_SEAL_REPLAY_ROUNDS */
} nb_seal_opts_t;

/* Fills `secret` with NB_SEAL_SECRET_BYTES random bytes (RAND_bytes). NB_ERR_CRYPTO if the
 * random generator fails. Thread-safe. */
nb_status_t nb_seal_secret_generate(uint8_t secret[NB_SEAL_SECRET_BYTES]);

/* Creates the context of one ordered pair of clusters in one job: it seals what local_cluster
 * sends to peer_cluster and opens what peer_cluster sends to local_cluster, each direction with
 * its own key.
 *   job_secret:    NB_SEAL_SECRET_BYTES, borrowed (copied; the copy is cleansed on destroy).
 *   job_id:        1..255 bytes, borrowed.
 *   local_cluster, peer_cluster: cluster ids (nb_pki_name_check rules), different, borrowed.
 *   opts:          may be NULL.
 * Returns NB_OK and *out (destroy with nb_seal_ctx_destroy); NB_ERR_INVALID for bad arguments
 * (the message names which); NB_ERR_CRYPTO if OpenSSL fails; NB_ERR_NOMEM. */
nb_status_t nb_seal_ctx_create(const uint8_t job_secret[NB_SEAL_SECRET_BYTES], const char* job_id,
                               const char* local_cluster, const char* peer_cluster,
                               const nb_seal_opts_t* opts, nb_seal_ctx_t** out);

/* Cleanses every key and secret of the context and frees it. NULL is accepted. The context must
 * not be in use by another thread. */
void nb_seal_ctx_destroy(nb_seal_ctx_t* ctx);

/* Seals chunk `chunk` of round `round` from local to peer.
 *   aad, aad_len:  the frame header, authenticated but not encrypted (borrowed; NULL iff 0).
 *   plain, len:    the plaintext (borrowed; len may be 0).
 *   out:           receives ciphertext (len bytes) followed by the 16-byte tag; it must have room
 *                  for len + NB_SEAL_TAG_BYTES bytes. out == plain (in place) is allowed; other
 *                  overlaps are not.
 *   out_len:       set to len + NB_SEAL_TAG_BYTES.
 * Returns NB_OK; NB_ERR_INVALID when round > NB_SEAL_MAX_ROUND, chunk > NB_SEAL_MAX_CHUNK or
 * chunk >= NB_SEAL_MAX_CHUNKS, or len > NB_SEAL_MAX_CHUNK_BYTES (nothing is sealed); NB_ERR_CRYPTO.
 * Thread-safe (sealing calls of one context are serialised). */
nb_status_t nb_seal_chunk(nb_seal_ctx_t* ctx, uint64_t round, uint64_t chunk, const void* aad,
                          size_t aad_len, const void* plain, size_t len, void* out,
                          size_t* out_len);

/* Opens chunk `chunk` of round `round` sent by the peer to local: checks the tag over the
 * ciphertext and `aad`, then the replay window, then records the chunk as accepted.
 *   sealed, sealed_len: ciphertext || tag as produced by nb_seal_chunk (borrowed).
 *   out:           receives sealed_len - NB_SEAL_TAG_BYTES bytes of plaintext; out == sealed is
 *                  allowed. On any error its contents are unspecified (zeroed when the tag fails)
 *                  and must not be used.
 *   out_len:       set to the plaintext length.
 * Returns NB_OK;
 *   NB_ERR_INTEGRITY: the tag does not verify (tampered ciphertext, tag or header, wrong key or
 *                     direction, other job, truncated input). Logged with NB_WARN naming round,
 *                     chunk and peer; never payload or key bytes. Never retry this silently.
 *   NB_ERR_EXISTS:    authentic but replayed: already accepted, or older than the replay
 *                     window. A retransmission after a lost acknowledgement also lands here:
 *                     acknowledge it and drop it.
 *   NB_ERR_INVALID:   round/chunk out of range (see nb_seal_chunk), NULL arguments.
 * Thread-safe (opening calls of one context are serialised). */
nb_status_t nb_open_chunk(nb_seal_ctx_t* ctx, uint64_t round, uint64_t chunk, const void* aad,
                          size_t aad_len, const void* sealed, size_t sealed_len, void* out,
                          size_t* out_len);

/* The peer restarted as a sender with a new epoch (which it announced in band): derive its new
 * key and clear the replay window. Epochs only move forward: epoch <= the current peer epoch
 * gives NB_ERR_INVALID (so an attacker cannot roll a receiver back to an old key). Thread-safe. */
nb_status_t nb_seal_set_peer_epoch(nb_seal_ctx_t* ctx, uint32_t epoch);

/* Our sending epoch (fixed at create) and the peer's current one (0 for ctx NULL). The peer's is
 * read under the context's lock. */
uint32_t nb_seal_local_epoch(const nb_seal_ctx_t* ctx);
uint32_t nb_seal_peer_epoch(nb_seal_ctx_t* ctx);

/* The nonce that nb_seal_chunk (sending != 0) or nb_open_chunk (sending == 0) uses for
 * (round, chunk), for tests and documentation. Same range checks as nb_seal_chunk. */
nb_status_t nb_seal_nonce(const nb_seal_ctx_t* ctx, int sending, uint64_t round, uint64_t chunk,
                          uint8_t nonce[NB_SEAL_NONCE_BYTES]);

#ifdef __cplusplus
}
#endif
#endif
