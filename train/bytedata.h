/* A tiny training-data source over one byte text file: random windows of T + 1 bytes from a
 * seeded stream (same seed → same batches). Not the multilingual pipeline and not a sharded
 * loader; the whole file is read into memory. */
#ifndef NB_TRAIN_BYTEDATA_H
#define NB_TRAIN_BYTEDATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_bytedata nb_bytedata_t;
/* Thread safety: one thread at a time per source (batches advance its random stream). */

/* Reads path whole. NB_ERR_IO (unreadable; message names the path), NB_ERR_INVALID (fewer than 2
 * bytes), NB_ERR_NOMEM. *out owned by the caller. */
nb_status_t nb_bytedata_open(const char* path, uint64_t seed, nb_bytedata_t** out);
/* Same over a copy of a memory buffer. */
nb_status_t nb_bytedata_from_memory(const void* data, size_t len, uint64_t seed,
                                    nb_bytedata_t** out);
void nb_bytedata_destroy(nb_bytedata_t* d); /* NULL ok */

size_t nb_bytedata_size(const nb_bytedata_t* d);

/* Fills tokens (B, T) with B random windows and targets (B, T) with the same windows shifted by
 * one byte. Windows shorter than T + 1 (file smaller than T + 1) are padded with NB_TOKEN_PAD
 * tokens and -1 targets. */
void nb_bytedata_batch(nb_bytedata_t* d, int B, int T, int* tokens, int* targets);

#ifdef __cplusplus
}
#endif
#endif
