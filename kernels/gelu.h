/* GELU, tanh approximation (as in GPT-2), forward and backward, alone or fused with the bias of
 * the layer before it. Not the erf form. */
#ifndef NB_KERNELS_GELU_H
#define NB_KERNELS_GELU_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/cpu_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out may alias inp. */
void nb_gelu_forward(float* out, const float* inp, size_t n);
/* Accumulating: dinp[i] += gelu'(inp[i]) * dout[i]. */
void nb_gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

/* The same on a chosen vector path (kernels/cpu_path.h; the two above run AUTO). The vector paths
 * compute x * sigmoid(2u), the same function as 0.5 x (1 + tanh u), with their own exp. */
void nb_gelu_forward_path(float* out, const float* inp, size_t n, nb_cpu_path_t path);
void nb_gelu_backward_path(float* dinp, const float* inp, const float* dout, size_t n,
                           nb_cpu_path_t path);

/* Bias and GELU in one pass over a (rows, cols) block: pre += bias (per column), then
 * out = GELU(pre). pre (in/out) and out must not alias; all borrowed. */
void nb_gelu_bias_forward(float* out, float* pre, const float* bias, int rows, int cols,
                          nb_cpu_path_t path);

/* Its backward in one pass: dpre = gelu'(pre) * dout (written, not accumulated), and, when dbias
 * is not NULL, dbias[c] = the sum of dpre[., c] over these rows (written), so that callers
 * splitting the rows add the partial sums in a fixed order. */
void nb_gelu_bias_backward(float* dpre, float* dbias, const float* pre, const float* dout, int rows,
                           int cols, nb_cpu_path_t path);

/* CUDA versions; NB_ERR_UNSUPPORTED without CUDA, NB_ERR_CUDA on failure. */
nb_status_t nb_gelu_forward_cuda(float* d_out, const float* d_inp, size_t n, void* stream);
nb_status_t nb_gelu_backward_cuda(float* d_dinp, const float* d_inp, const float* d_dout, size_t n,
                                  void* stream);

#ifdef __cplusplus
}
#endif
#endif
