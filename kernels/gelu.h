/* GELU, tanh approximation (as in GPT-2), forward and backward. Not the erf form. */
#ifndef NB_KERNELS_GELU_H
#define NB_KERNELS_GELU_H

#include <stddef.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out may alias inp. */
void nb_gelu_forward(float* out, const float* inp, size_t n);
/* Accumulating: dinp[i] += gelu'(inp[i]) * dout[i]. */
void nb_gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

/* CUDA versions; NB_ERR_UNSUPPORTED without CUDA, NB_ERR_CUDA on failure. */
nb_status_t nb_gelu_forward_cuda(float* d_out, const float* d_inp, size_t n, void* stream);
nb_status_t nb_gelu_backward_cuda(float* d_dinp, const float* d_inp, const float* d_dout, size_t n,
                                  void* stream);

#ifdef __cplusplus
}
#endif
#endif
