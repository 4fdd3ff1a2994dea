/* The hybrid tests' cluster: a tiny model (1 layer, width 16) with the same seed everywhere (so
 * the same starting point), cluster c's own languages (en + de, or en + ru) from the trainer's
 * committed corpus under data, and its own data order. The caller sets the batch (and a
 * gradient hook) before nb_trainer_create. */
#ifndef NB_TESTS_HYBRID_TINY_TRAINER_H
#define NB_TESTS_HYBRID_TINY_TRAINER_H

#include <stdio.h>

#include "train/trainer.h"

static inline void tiny_trainer_config(nb_train_config_t* cfg, const char* data, int c) {
  nb_train_config_defaults(cfg);
  cfg->model = nb_model_config_make(1, 16, 2, 16);
  cfg->seed = 11;
  cfg->max_steps = 100;
  cfg->optim.lr = 3e-3f;
  cfg->optim.warmup_steps = 2;
  cfg->optim.total_steps = 100;
  cfg->heldout_permille = 150;
  cfg->eval_batches = 1;
  cfg->data_rank = c;
  const char* langs[2][2] = {{"en", "de"}, {"en", "ru"}};
  cfg->n_sources = 2;
  for (int i = 0; i < 2; i++) {
    snprintf(cfg->sources[i].label, sizeof cfg->sources[i].label, "%s", langs[c][i]);
    snprintf(cfg->sources[i].path, sizeof cfg->sources[i].path, "%s/mono/%s.txt", data,
             langs[c][i]);
  }
}

#endif
