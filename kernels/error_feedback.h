/* Error feedback for compressed updates: the residual keeps what was not sent. Each round
 * residual += update, the codec sends a compressed part of the residual, then
 * residual -= what was actually sent (the dequantized values at the kept indices). CPU reference
 * in error_feedback.c, CUDA in error_feedback.cu. The codec's fused multithreaded pass
 * (compress/) does the first step together with candidate collection; these are the reference. */
#ifndef NB_KERNELS_ERROR_FEEDBACK_H
#define NB_KERNELS_ERROR_FEEDBACK_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* residual[i] += update[i] for i < n. Borrowed pointers; thread-safe on disjoint data. */
void nb_ef_accumulate(float* residual, const float* update, size_t n);

/* residual[idx[j]] -= sent[j] for j < k. idx must be < the residual's length (not checked). */
void nb_ef_subtract_sent(float* residual, const uint32_t* idx, const float* sent, size_t k);

/* CUDA versions on device pointers; `stream` is a cudaStream_t (NULL = default). Asynchronous.
 * NB_ERR_CUDA on a launch error, NB_ERR_UNSUPPORTED when built without CUDA. idx must hold
 * distinct indices (as top-k produces) so the scatter has no races. */
nb_status_t nb_ef_accumulate_cuda(float* d_residual, const float* d_update, size_t n, void* stream);
nb_status_t nb_ef_subtract_sent_cuda(float* d_residual, const uint32_t* d_idx, const float* d_sent,
                                     size_t k, void* stream);

#ifdef __cplusplus
}
#endif
#endif
