/* CPU reference GELU (tanh form). Plain loops; no lookup tables. */
#include "kernels/gelu.h"

#include <math.h>

#define NB__GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through one expf: glibc's tanhf (via expm1f) dominated the training step's profile.
 * Saturates cleanly (exp overflow gives -1, underflow gives 1); absolute error ~1e-7. */
static inline float nb__tanh(float u) {
  return 2.0f / (1.0f + expf(-2.0f * u)) - 1.0f;
}

void nb_gelu_forward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + nb__tanh(NB__GELU_K * (x + 0.044715f * x * x * x)));
  }
}

void nb_gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = NB__GELU_K * (x + 0.044715f * x * x * x);
    float t = nb__tanh(u);
    float sech2 = 1.0f - t * t;
    float g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * NB__GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += g * dout[i];
  }
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_gelu_forward_cuda(float* d_out, const float* d_inp, size_t n, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "gelu: built without CUDA");
}
nb_status_t nb_gelu_backward_cuda(float* d_dinp, const float* d_inp, const float* d_dout, size_t n,
                                  void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "gelu: built without CUDA");
}
#endif
