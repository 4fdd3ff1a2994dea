/* Internals of gateway/artifact.c shared with its tests and fuzz target: one chunk of a Fetch call
 * as the server seals and packs it, and as the receiver checks and opens it. Not a public API:
 * nothing outside gateway/artifact.c and tests/unit/artifact uses it. */
#ifndef NB_GATEWAY_ARTIFACT_INTERNAL_H
#define NB_GATEWAY_ARTIFACT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "gateway/artifact.h"
#include "security/seal.h"

#define NB__ARTIFACT_TID_BYTES 16 /* transfer id: 16 random bytes per Fetch call */
#define NB__ARTIFACT_HDR_MAX 256  /* bound of a packed ArtifactChunkHeader */

/* The sealing context of one Fetch call (docs/artifacts.md): direction "nebula.artifacts" ->
 * receiver of the job label "artifact/<hex tid>/<job_id>". sending: the server's side. */
nb_status_t nb__artifact_seal_ctx(const uint8_t secret[32], const char* job_id,
                                  const uint8_t tid[NB__ARTIFACT_TID_BYTES], const char* receiver,
                                  int sending, nb_seal_ctx_t** out);

/* Seals buf[0..len) in place (buf has room for len + NB_SEAL_TAG_BYTES) as chunk `index` at
 * `offset` of object sha256 (size bytes) and packs the ArtifactChunk message into out
 * (cap >= len + NB_SEAL_TAG_BYTES + NB__ARTIFACT_HDR_MAX + 16). Returns NB_ERR_INVALID (does not
 * fit), the sealing errors. */
nb_status_t nb__artifact_chunk_pack(nb_seal_ctx_t* seal, const uint8_t tid[NB__ARTIFACT_TID_BYTES],
                                    const char* sha256, uint64_t size, uint64_t offset,
                                    uint64_t index, uint8_t* buf, size_t len, uint8_t* out,
                                    size_t cap, size_t* out_len);

/* The receiving side of one Fetch call. Set the first block, zero the rest; clear when done. */
typedef struct {
  const uint8_t* secret; /* the job's 32-byte secret (borrowed) */
  const char* job_id;    /* borrowed */
  const char* self;      /* our cluster id: the receiver (borrowed) */
  char sha256[NB_ARTIFACT_HASH_HEX];
  uint64_t size; /* the object's size */
  uint64_t off;  /* where the next chunk must start; advanced by each accepted chunk */
  /* state */
  uint64_t index;
  uint8_t tid[NB__ARTIFACT_TID_BYTES];
  nb_seal_ctx_t* seal;
  uint8_t* plain;
  size_t cap;
} nb__artifact_rx_t;

/* Checks one received ArtifactChunk message (msg, len: untrusted bytes) against rx (object,
 * offset, index, transfer id), opens it, and on NB_OK points *plain at its *plen plaintext bytes
 * (valid until the next call or clear) that belong at *at; rx->off and rx->index advance.
 * Returns NB_ERR_INTEGRITY for anything that is not the next authentic chunk (undecodable,
 * another object, offset, index or transfer, bad tag, replay), NB_ERR_NOMEM. */
nb_status_t nb__artifact_rx_chunk(nb__artifact_rx_t* rx, const uint8_t* msg, size_t len,
                                  const uint8_t** plain, size_t* plen, uint64_t* at);

/* Frees rx's context and buffer (cleansed) and resets its state; NULL ok. */
void nb__artifact_rx_clear(nb__artifact_rx_t* rx);

#endif
