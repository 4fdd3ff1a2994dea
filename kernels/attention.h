/* Causal multi-head self-attention over a packed qkv tensor, forward and backward, two ways:
 * the reference (cblas_sgemm per (batch, head), the (T, T) softmax matrix materialised; the CUDA
 * kernels are checked against it) and the blocked kernel the training step uses (online softmax,
 * no (T, T) buffer, probabilities recomputed in the backward). */
#ifndef NB_KERNELS_ATTENTION_H
#define NB_KERNELS_ATTENTION_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/cpu_path.h"

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

/* ---- blocked causal attention (FlashAttention-2 style, attention_blocked.c). Query blocks meet
 * key blocks with a running max and sum per row; fully masked blocks are skipped. The forward
 * keeps only the logsumexp of each score row; the backward recomputes the probabilities block by
 * block from q, k and those statistics, with D = rowsum(dout * out). */

/* path: which vector code runs (kernels/cpu_path.h); NB_CPU_PATH_AUTO in production. */

/* Floats of scratch one caller of the blocked kernels needs for sequences of up to T positions
 * (both directions; the buffer is overwritten, alignment is handled inside). */
size_t nb_attention_blocked_scratch(int T, int C, int NH);

/* Forward over the (batch, head) pairs bh in [bh0, bh1) of bh = b * NH + h: writes those heads'
 * columns of out (B, T, C) and lse (B, NH, T), the logsumexp of each row's scaled scores. Calls
 * on disjoint ranges may run concurrently, each with its own scratch. All borrowed. */
void nb_attention_blocked_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                                  int NH, int bh0, int bh1, float* scratch, nb_cpu_path_t path);

/* Backward over the same ranges: dqkv (B, T, 3C) += gradient (accumulate 1) or = gradient
 * (accumulate 0: nothing of those columns is read first), from dout (B, T, C), the forward's out
 * and lse, and qkv. Disjoint ranges touch disjoint columns of dqkv. */
void nb_attention_blocked_backward(float* dqkv, const float* dout, const float* out,
                                   const float* lse, const float* qkv, int B, int T, int C, int NH,
                                   int bh0, int bh1, float* scratch, nb_cpu_path_t path,
                                   int accumulate);

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
