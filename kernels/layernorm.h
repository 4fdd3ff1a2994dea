/* LayerNorm over the last dimension, forward and backward (llm.c layout: mean and reciprocal
 * standard deviation are kept for the backward), and the same fused with the residual add that
 * precedes it in a pre-LN transformer. Not RMSNorm. */
#ifndef NB_KERNELS_LAYERNORM_H
#define NB_KERNELS_LAYERNORM_H

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_LAYERNORM_EPS 1e-5f

/* out (N, C) = (inp - mean) * rstd * weight + bias; mean (N), rstd (N) written. All borrowed. */
void nb_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                          const float* weight, const float* bias, int N, int C);

/* res (N, C) = a + b, then out = LayerNorm(res) as nb_layernorm_forward, one pass per row (the
 * row is summed while it is written): the same bits as the add followed by the LayerNorm. */
void nb_residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                   const float* b, const float* weight, const float* bias, int N,
                                   int C);

/* Accumulating: dinp (N, C) +=, dweight (C) +=, dbias (C) +=. dweight/dbias may be NULL. */
void nb_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, const float* mean,
                           const float* rstd, int N, int C);

/* CUDA versions on device pointers; NB_ERR_UNSUPPORTED without CUDA, NB_ERR_CUDA on failure. */
nb_status_t nb_layernorm_forward_cuda(float* d_out, float* d_mean, float* d_rstd,
                                      const float* d_inp, const float* d_weight,
                                      const float* d_bias, int N, int C, void* stream);
nb_status_t nb_layernorm_backward_cuda(float* d_dinp, float* d_dweight, float* d_dbias,
                                       const float* d_dout, const float* d_inp,
                                       const float* d_weight, const float* d_mean,
                                       const float* d_rstd, int N, int C, void* stream);

#ifdef __cplusplus
}
#endif
#endif
