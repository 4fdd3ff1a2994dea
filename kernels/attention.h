/* Causal multi-head self-attention over a packed qkv tensor, forward and backward; the score
 * products go through cblas_sgemm per (batch, head). Not flash attention: the (T, T) softmax
 * matrix is materialised, which is fine at the contexts this runtime trains (<= 1024). */
#ifndef NB_KERNELS_ATTENTION_H
#define NB_KERNELS_ATTENTION_H

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* qkv (B, T, 3C) holds q | k | v, each split into NH heads of C/NH. Writes out (B, T, C) and
 * att (B, NH, T, T), the post-softmax probabilities (zero above the diagonal). Scale 1/sqrt(hs).
 * C must be divisible by NH. All borrowed. */
void nb_attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);

/* Accumulating: dqkv (B, T, 3C) += gradient. scratch holds T*T floats (overwritten; entries
 * above the diagonal are left undefined). */
void nb_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                           const float* att, int B, int T, int C, int NH);

/* CUDA versions (cuBLAS strided-batched products + softmax kernels); d_scratch holds
 * B*NH*T*T floats. NB_ERR_UNSUPPORTED without CUDA, NB_ERR_CUDA on failure. */
nb_status_t nb_attention_forward_cuda(float* d_out, float* d_att, const float* d_qkv, int B, int T,
                                      int C, int NH, void* stream);
nb_status_t nb_attention_backward_cuda(float* d_dqkv, float* d_scratch, const float* d_dout,
                                       const float* d_qkv, const float* d_att, int B, int T, int C,
                                       int NH, void* stream);

#ifdef __cplusplus
}
#endif
#endif
