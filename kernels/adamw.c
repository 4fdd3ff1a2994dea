/* CPU reference AdamW: one pass over the flat vectors, fixed order, so the same inputs give the
 * same bits. */
#include "kernels/adamw.h"

#include <math.h>

void nb_adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, long t) {
  float bc1 = 1.0f - powf(beta1, (float)t);
  float bc2 = 1.0f - powf(beta2, (float)t);
  for (size_t i = 0; i < n; i++) {
    float g = grads[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
  }
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_adamw_update_cuda(float* d_params, const float* d_grads, float* d_m, float* d_v,
                                 size_t n, float lr, float beta1, float beta2, float eps,
                                 float weight_decay, long t, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "adamw: built without CUDA");
}
#endif
