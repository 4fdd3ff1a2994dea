/* One AdamW update over a flat parameter vector (decoupled weight decay, bias-corrected moments).
 * Not the schedule or clipping: those live in train/optim. */
#ifndef NB_KERNELS_ADAMW_H
#define NB_KERNELS_ADAMW_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/cpu_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For i < n: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd * p). t >= 1 is the step count.
 * params, m, v updated in place; grads borrowed. */
void nb_adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, long t);

/* The same on the vector path asked for (nb_adamw_update takes AUTO); every path gives the same
 * bits. */
void nb_adamw_update_path(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                          float beta1, float beta2, float eps, float weight_decay, long t,
                          nb_cpu_path_t path);

/* CUDA version on device pointers; NB_ERR_UNSUPPORTED without CUDA, NB_ERR_CUDA on failure. */
nb_status_t nb_adamw_update_cuda(float* d_params, const float* d_grads, float* d_m, float* d_v,
                                 size_t n, float lr, float beta1, float beta2, float eps,
                                 float weight_decay, long t, void* stream);

#ifdef __cplusplus
}
#endif
#endif
