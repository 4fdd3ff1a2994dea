/* Optimizers of the training runtime: the inner AdamW (warm-up + cosine schedule, global-norm
 * clipping, moments in one arena) and the outer Nesterov step of DiLoCo-style synchronisation.
 * Plain host code over flat fp32 buffers; not a parameter-group framework. */
#ifndef NB_TRAIN_OPTIM_H
#define NB_TRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  float lr;          /* peak learning rate */
  float min_lr_frac; /* cosine floor as a fraction of lr (e.g. 0.1) */
  long warmup_steps; /* linear warm-up from lr/warmup to lr over these steps */
  long total_steps;  /* cosine decay from warm-up end to total_steps; constant floor after */
  float beta1, beta2, eps;
  float weight_decay; /* decoupled; applied where the decay mask says so */
  float grad_clip;    /* global L2 norm bound; <= 0 disables clipping */
} nb_adamw_config_t;

/* lr 3e-4, floor 0.1, warm-up 100, total 10000, betas 0.9/0.95, eps 1e-8, wd 0.1, clip 1.0. */
nb_adamw_config_t nb_adamw_config_default(void);

/* Learning rate at step (0-based) under cfg's schedule. */
float nb_adamw_lr(const nb_adamw_config_t* cfg, long step);

typedef struct nb_adamw nb_adamw_t;
/* Thread safety: one thread at a time per optimizer; nb_adamw_lr and nb_outer_step are pure. */

/* State for n parameters: m and v in one zeroed arena of 2n floats. NB_ERR_INVALID (bad config),
 * NB_ERR_NOMEM. *out owned by the caller. */
nb_status_t nb_adamw_create(const nb_adamw_config_t* cfg, size_t n, nb_adamw_t** out);
void nb_adamw_destroy(nb_adamw_t* o); /* NULL ok */

/* The moment arena (2n floats: m then v), e.g. for checkpoints. Owned by o. */
float* nb_adamw_state(nb_adamw_t* o, size_t* n_floats);
/* Steps taken so far. */
long nb_adamw_steps(const nb_adamw_t* o);
/* Sets the step counter (resuming from a checkpoint). */
void nb_adamw_set_steps(nb_adamw_t* o, long steps);

/* Global L2 norm of g (accumulated in double, fixed order). */
double nb_grad_norm(const float* g, size_t n);

/* One step: scales grads in place when their global norm exceeds grad_clip, then AdamW with the
 * scheduled lr for the current step; decay_mask (n bytes, 1 = decay) may be NULL (decay all).
 * *grad_norm (nullable) receives the pre-clip norm. NB_ERR_INVALID when the norm is not finite
 * (the parameters are then left untouched and the step is not counted). Not thread-safe per o. */
nb_status_t nb_adamw_step(nb_adamw_t* o, float* params, float* grads, const uint8_t* decay_mask,
                          double* grad_norm);
/* The same step with the gradients' global norm given (a tensor-parallel shard's norm is the
 * group's, nb_model_tp_norm, not its own arena's). */
nb_status_t nb_adamw_step_norm(nb_adamw_t* o, float* params, float* grads,
                               const uint8_t* decay_mask, double norm);

/* Outer Nesterov step for DiLoCo-style sync on the host, identical bits everywhere:
 * momentum = mu * momentum + delta; theta_global -= lr * (delta + mu * momentum), where delta is
 * the pseudo-gradient theta_global - theta_local (averaged over clusters). All n floats; theta
 * and momentum updated in place. */
void nb_outer_step(float* theta_global, const float* delta, float* momentum, float lr, float mu,
                   size_t n);

#ifdef __cplusplus
}
#endif
#endif
