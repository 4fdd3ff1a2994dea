/* Pipeline parallelism: one training step of a pipeline stage (train/model.h,
 * nb_model_create_pp) over M micro-batches with the 1F1B schedule (PipeDream-flush, as Megatron
 * runs it without interleaving): stage s of S first runs S - s - 1 forwards, then alternates one
 * forward and one backward, then finishes the remaining backwards, so that at most S - s
 * micro-batches are in flight on it (its activation slots). Activations go forward and their
 * gradients back through the caller's point-to-point function; where two neighbours both send,
 * one call sends and receives at once, so blocking transfers do not deadlock. Knows nothing of
 * MPI: the worker and the tests pass intra's nb_comm_sendrecv. */
#ifndef NB_TRAIN_PIPELINE_H
#define NB_TRAIN_PIPELINE_H

#include <stddef.h>

#include "common/status.h"
#include "train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  /* Sends n floats of `send` to stage `to` and receives n floats into `recv` from stage `from`,
   * at once; -1 leaves a side out (then its buffer is NULL). Blocking. */
  nb_status_t (*sendrecv)(void* ctx, const float* send, int to, float* recv, int from, size_t n);
  /* In-place sum of n floats over the stages (every stage the same bits): the loss. */
  nb_model_allreduce_fn allreduce;
  void* ctx;
} nb_pipeline_t;

/* One step's gradients on every stage of m's pipeline, each stage calling it with the same
 * micro-batches: tokens and targets (M, B, T) (every stage reads them: the first embeds the
 * tokens, the last scores the targets). The gradients are zeroed first, accumulated over the M
 * micro-batches and averaged (1/M), as a single model's gradient accumulation is, and the
 * replicated tensors' gradients are summed over the stages (nb_model_pp_reduce_grads). *loss
 * (nullable) receives the mean of the micro-batches' losses on every stage. The optimizer step is
 * the caller's (with the stages' norm, nb_model_tp_norm). NB_ERR_INVALID (M < 1, NULL arguments),
 * the model's and the transfers' errors. */
nb_status_t nb_pipeline_step(nb_model_t* m, const nb_pipeline_t* p, const int* tokens,
                             const int* targets, int M, int B, int T, double* loss);

/* The forward of one batch through every stage (an evaluation): the mean loss on every stage. */
nb_status_t nb_pipeline_forward(nb_model_t* m, const nb_pipeline_t* p, const int* tokens,
                                const int* targets, int B, int T, double* loss, int* scored);

/* nb_model_bits_per_byte through the stages: held-out bits per byte of text, on every stage. */
nb_status_t nb_pipeline_bits_per_byte(nb_model_t* m, const nb_pipeline_t* p, const uint8_t* text,
                                      size_t len, int B, int T, double* bpb, size_t* n_scored);

#ifdef __cplusplus
}
#endif
#endif
