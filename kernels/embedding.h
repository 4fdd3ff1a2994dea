/* Token + learned position embedding lookup and its (scatter-add) backward. Not a general
 * gather: tokens index rows of wte, positions 0..T-1 index rows of wpe. */
#ifndef NB_KERNELS_EMBEDDING_H
#define NB_KERNELS_EMBEDDING_H

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (B, T, C) = wte[tokens[b, t]] + wpe[t]. tokens must be in [0, V) (caller validates). */
void nb_embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                          int T, int C);

/* Accumulating: dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += dout[b, t]. Either may be NULL. */
void nb_embedding_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B,
                           int T, int C);

/* CUDA versions (backward uses atomics: not bit-reproducible on the GPU). */
nb_status_t nb_embedding_forward_cuda(float* d_out, const int* d_tokens, const float* d_wte,
                                      const float* d_wpe, int B, int T, int C, void* stream);
nb_status_t nb_embedding_backward_cuda(float* d_dwte, float* d_dwpe, const float* d_dout,
                                       const int* d_tokens, int B, int T, int C, void* stream);

#ifdef __cplusplus
}
#endif
#endif
