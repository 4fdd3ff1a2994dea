/* Checkpoints in the safetensors format (8-byte little-endian header length, JSON header with
 * dtype / shape / data_offsets per tensor and a string-to-string __metadata__, raw tensor bytes),
 * so PyTorch, numpy and other tools read them. F32 tensors only; no sharding, no mmap. */
#ifndef NB_TRAIN_CHECKPOINT_H
#define NB_TRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "train/lora.h"
#include "train/model.h"
#include "train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest JSON header accepted (the reference implementation's limit is 100 MB too). */
#define NB_CKPT_MAX_HEADER (100u * 1000u * 1000u)

/* One tensor to write (borrowed). ndim in [0, 4]. */
typedef struct {
  const char* name;
  int ndim;
  int64_t shape[4];
  const float* data;
} nb_ckpt_tensor_t;

/* Writes the tensors, in order and back to back, with metadata (meta: n_meta key/value pairs as
 * a flat array {k0, v0, k1, v1, ...}) plus "format": "nebula-ckpt-1" and "sha256": the SHA-256
 * (hex) of the whole data section. Written to a temporary file in the same directory, fsynced,
 * then renamed over path (and the directory fsynced): a crash leaves the old file or the new one.
 * NB_ERR_INVALID (bad names/shapes, duplicate names, reserved metadata keys), NB_ERR_IO,
 * NB_ERR_CRYPTO, NB_ERR_NOMEM. Thread-safe (no shared state). */
nb_status_t nb_checkpoint_write(const char* path, const nb_ckpt_tensor_t* tensors, size_t n,
                                const char* const* meta, size_t n_meta);

/* A parsed and fully validated checkpoint held in memory. */
typedef struct nb_ckpt nb_ckpt_t;

/* Reads and validates path: header length (>= 2, within the file, <= NB_CKPT_MAX_HEADER), JSON
 * syntax, a top-level object, every tensor entry (dtype F32, shape of non-negative integers,
 * data_offsets [begin, end] with end - begin = 4 * numel, in bounds, non-overlapping and
 * covering the data section without gaps), the metadata (string values), the SHA-256 of the
 * data section against __metadata__.sha256, and every value (a NaN or an infinity in any tensor
 * refuses the file). NB_ERR_IO (unreadable), NB_ERR_INVALID (malformed or a non-finite value;
 * the message names the file, the tensor and the rule), NB_ERR_INTEGRITY (checksum missing or
 * mismatched), NB_ERR_NOMEM. *out owned by the caller. */
nb_status_t nb_checkpoint_open(const char* path, nb_ckpt_t** out);
/* Same over a memory image (copied); `what` names it in messages. The fuzz entry point. */
nb_status_t nb_checkpoint_parse(const void* buf, size_t len, const char* what, nb_ckpt_t** out);
void nb_checkpoint_close(nb_ckpt_t* c); /* NULL ok */

/* Metadata value for key, or NULL. Borrowed from c. */
const char* nb_checkpoint_meta(const nb_ckpt_t* c, const char* key);
size_t nb_checkpoint_num_tensors(const nb_ckpt_t* c);
/* Tensor i: name, ndim, shape (4 entries), raw little-endian F32 bytes (possibly unaligned) and
 * their length. Borrowed from c. NB_ERR_INVALID when i is out of range. */
nb_status_t nb_checkpoint_tensor(const nb_ckpt_t* c, size_t i, const char** name, int* ndim,
                                 int64_t shape[4], const void** data, size_t* nbytes);

/* Model checkpoints: every tensor of the model's table, metadata with the config (n_layer,
 * n_embd, n_head, ctx, vocab) and step. */
nb_status_t nb_checkpoint_save(const char* path, const nb_model_t* m, long step);
/* Loads into an existing model: the config in the file must equal m's, and the tensor set must
 * match the model's exactly (missing, unexpected or differently shaped tensors are named).
 * *step (nullable) receives the step. On error m is unchanged. */
nb_status_t nb_checkpoint_load_into(const char* path, nb_model_t* m, long* step);
/* Creates a model from the file's config and loads it. *out owned by the caller. */
nb_status_t nb_checkpoint_load(const char* path, nb_model_t** out, long* step);

/* Adapter checkpoints: the LoRA tensors only (metadata lora_rank, lora_alpha, step). */
nb_status_t nb_checkpoint_save_lora(const char* path, const nb_lora_t* l, long step);
nb_status_t nb_checkpoint_load_lora_into(const char* path, nb_lora_t* l, long* step);

/* Optimizer state for resuming: AdamW first and second moments of every model tensor, named
 * "adam.m.<tensor>" / "adam.v.<tensor>", metadata "step" = nb_adamw_steps(opt). opt must have been
 * created for nb_model_num_params(m) parameters. Loading restores moments and step counter. */
nb_status_t nb_checkpoint_save_optim(const char* path, const nb_model_t* m, nb_adamw_t* opt);
nb_status_t nb_checkpoint_load_optim_into(const char* path, const nb_model_t* m, nb_adamw_t* opt);

#ifdef __cplusplus
}
#endif
#endif
