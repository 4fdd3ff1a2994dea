/* AdamW driver (schedule, clipping, decay mask) over kernels/adamw, and the outer Nesterov step.
 * Sequential loops in fixed order: same inputs, same bits. */
#include "train/optim.h"

#include <math.h>
#include <string.h>

#include "common/common.h"
#include "kernels/adamw.h"
#include "train/parallel.h"

struct nb_adamw {
  nb_adamw_config_t cfg;
  size_t n;
  float* state; /* m (n) then v (n) */
  long t;
};

nb_adamw_config_t nb_adamw_config_default(void) {
  nb_adamw_config_t c = {3e-4f, 0.1f, 100, 10000, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  return c;
}

float nb_adamw_lr(const nb_adamw_config_t* c, long step) {
  if (c->warmup_steps > 0 && step < c->warmup_steps)
    return c->lr * (float)(step + 1) / (float)c->warmup_steps;
  float lo = c->lr * c->min_lr_frac;
  long span = c->total_steps - c->warmup_steps;
  if (span <= 0 || step >= c->total_steps) return lo;
  double frac = (double)(step - c->warmup_steps) / (double)span;
  return lo + (float)(0.5 * (1.0 + cos(M_PI * frac))) * (c->lr - lo);
}

nb_status_t nb_adamw_create(const nb_adamw_config_t* cfg, size_t n, nb_adamw_t** out) {
  *out = NULL;
  if (!cfg || !(cfg->lr > 0.0f) || !(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) ||
      !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f) || !(cfg->eps > 0.0f) ||
      !(cfg->weight_decay >= 0.0f) || cfg->warmup_steps < 0 || !(cfg->min_lr_frac >= 0.0f))
    return nb_error(NB_ERR_INVALID,
                    "adamw config: need lr > 0, betas in [0, 1), eps > 0, weight_decay >= 0, "
                    "warmup_steps >= 0, min_lr_frac >= 0");
  nb_adamw_t* o = NULL;
  NB_CHECK(nb_calloc((void**)&o, 1, sizeof *o, "adamw"));
  o->cfg = *cfg;
  o->n = n;
  nb_status_t st =
      nb_aligned_alloc((void**)&o->state, 2 * (n ? n : 1), sizeof(float), "adamw state");
  if (st != NB_OK) {
    nb_free(o);
    return st;
  }
  memset(o->state, 0, 2 * n * sizeof(float));
  *out = o;
  return NB_OK;
}

void nb_adamw_destroy(nb_adamw_t* o) {
  if (!o) return;
  nb_free(o->state);
  nb_free(o);
}

float* nb_adamw_state(nb_adamw_t* o, size_t* n_floats) {
  if (n_floats) *n_floats = 2 * o->n;
  return o->state;
}
long nb_adamw_steps(const nb_adamw_t* o) {
  return o->t;
}
void nb_adamw_set_steps(nb_adamw_t* o, long steps) {
  o->t = steps;
}

/* The norm's sum in a fixed number of chunks (each with eight running sums, added in a fixed
 * order), so it is the same bits whatever the thread count. */
#define NB__NORM_CHUNKS 16
typedef struct {
  const float* g;
  size_t n;
  double part[NB__NORM_CHUNKS];
} nb__norm_job_t;

static void nb__norm_chunk(void* ctx, size_t k) {
  nb__norm_job_t* j = ctx;
  size_t lo, hi;
  nb_parallel_range(j->n, NB__NORM_CHUNKS, k, &lo, &hi);
  const float* g = j->g;
  double a[8] = {0};
  size_t i = lo;
  for (; i + 8 <= hi; i += 8)
    for (int l = 0; l < 8; l++) a[l] += (double)g[i + l] * g[i + l];
  for (; i < hi; i++) a[0] += (double)g[i] * g[i];
  j->part[k] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

double nb_grad_norm(const float* g, size_t n) {
  nb__norm_job_t job = {.g = g, .n = n};
  if (n < 65536)
    for (size_t k = 0; k < NB__NORM_CHUNKS; k++) nb__norm_chunk(&job, k);
  else
    nb_parallel_for(NB__NORM_CHUNKS, nb__norm_chunk, &job);
  double s = 0.0;
  for (size_t k = 0; k < NB__NORM_CHUNKS; k++) s += job.part[k];
  return sqrt(s);
}

/* AdamW is elementwise, so splitting the arena into chunks changes no bits. */
#define NB__ADAMW_CHUNKS 16
typedef struct {
  nb_adamw_t* o;
  float* params;
  float* grads;
  const uint8_t* mask;
  float lr;
  float clip; /* the gradient's scale before the update, 1 = none */
  long t;
} nb__adamw_job_t;

static void nb__adamw_chunk(void* ctx, size_t k) {
  nb__adamw_job_t* j = ctx;
  const nb_adamw_config_t* c = &j->o->cfg;
  size_t n = j->o->n, lo, hi;
  nb_parallel_range(n, NB__ADAMW_CHUNKS, k, &lo, &hi);
  float *m = j->o->state, *v = j->o->state + n;
  if (j->clip != 1.0f)
    for (size_t i = lo; i < hi; i++) j->grads[i] *= j->clip;
  /* runs of equal mask value go to the kernel in one call */
  size_t i = lo;
  while (i < hi) {
    size_t e = hi;
    if (j->mask) {
      e = i + 1;
      while (e < hi && j->mask[e] == j->mask[i]) e++;
    }
    float wd = (!j->mask || j->mask[i]) ? c->weight_decay : 0.0f;
    nb_adamw_update(j->params + i, j->grads + i, m + i, v + i, e - i, j->lr, c->beta1, c->beta2,
                    c->eps, wd, j->t);
    i = e;
  }
}

nb_status_t nb_adamw_step(nb_adamw_t* o, float* params, float* grads, const uint8_t* decay_mask,
                          double* grad_norm) {
  double norm = nb_grad_norm(grads, o->n);
  if (grad_norm) *grad_norm = norm;
  return nb_adamw_step_norm(o, params, grads, decay_mask, norm);
}

nb_status_t nb_adamw_step_norm(nb_adamw_t* o, float* params, float* grads,
                               const uint8_t* decay_mask, double norm) {
  size_t n = o->n;
  if (!isfinite(norm))
    return nb_error(NB_ERR_INVALID, "adamw step %ld: gradient norm is not finite; step skipped",
                    o->t + 1);
  float clip = 1.0f; /* applied to each chunk's gradients before its update (the same bits) */
  if (o->cfg.grad_clip > 0.0f && norm > o->cfg.grad_clip) clip = (float)(o->cfg.grad_clip / norm);
  float lr = nb_adamw_lr(&o->cfg, o->t); /* the schedule is 0-based, the bias correction 1-based */
  o->t++;
  nb__adamw_job_t job = {o, params, grads, decay_mask, lr, clip, o->t};
  if (n < 65536)
    for (size_t i = 0; i < NB__ADAMW_CHUNKS; i++) nb__adamw_chunk(&job, i);
  else
    nb_parallel_for(NB__ADAMW_CHUNKS, nb__adamw_chunk, &job);
  return NB_OK;
}

void nb_outer_step(float* theta_global, const float* delta, float* momentum, float lr, float mu,
                   size_t n) {
  for (size_t i = 0; i < n; i++) {
    float mo = mu * momentum[i] + delta[i];
    momentum[i] = mo;
    theta_global[i] -= lr * (delta[i] + mu * mo);
  }
}
