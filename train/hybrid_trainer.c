/* train/hybrid_trainer: nebula's own trainer as the hybrid's local model (nb_hybrid_create). It
 * only maps the interface onto the trainer; the round logic is all in hybrid.c, the same for a
 * caller's own inner loop. */
#include "train/hybrid.h"
#include "train/trainer.h"

static float* nb__ht_params(void* ctx, size_t* n) {
  return nb_trainer_sync_params(ctx, n);
}

static uint64_t nb__ht_samples(void* ctx) {
  return nb_trainer_samples(ctx);
}

static nb_status_t nb__ht_steps(void* ctx, long k, double* loss_mean) {
  return nb_trainer_steps(ctx, k, loss_mean);
}

static nb_status_t nb__ht_steps_budget(void* ctx, long k_max, double seconds, long* k_done,
                                       double* loss_mean) {
  return nb_trainer_steps_budget(ctx, k_max, seconds, k_done, loss_mean);
}

/* One optimizer step trains on batch_size sequences per micro-batch. */
static uint64_t nb__ht_step_samples(void* ctx) {
  const nb_train_config_t* tc = nb_trainer_config(ctx);
  return (uint64_t)tc->batch_size * (uint64_t)(tc->micro_batches > 0 ? tc->micro_batches : 1);
}

void nb_hybrid_trainer_local(nb_trainer_t* t, nb_hybrid_local_t* out) {
  *out = (nb_hybrid_local_t){.ctx = t,
                             .params = nb__ht_params,
                             .samples = nb__ht_samples,
                             .steps = nb__ht_steps,
                             .steps_budget = nb__ht_steps_budget,
                             .step_samples = nb__ht_step_samples};
}

nb_status_t nb_hybrid_create(const nb_hybrid_config_t* cfg, nb_trainer_t* t, nb_hybrid_t** out) {
  if (!cfg || !t || !out) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  nb_hybrid_local_t local;
  nb_hybrid_trainer_local(t, &local);
  return nb_hybrid_create_local(cfg, &local, out);
}
