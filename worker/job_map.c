/* The one mapping from a job descriptor's settings to the configs of the layers below it: the
 * trainer's (train/trainer.h), the round's (train/hybrid.h) and the scheduler's (inter/sched.h).
 * Used by `nebula worker` and `nebula train`. Not here: validation (jobs/descriptor.c). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "worker/worker.h"

#define NB__CP(dst, ...) (snprintf((dst), sizeof(dst), __VA_ARGS__) >= (int)sizeof(dst))

static nb_values_t nb__map_values(nb_job_values_t v) {
  switch (v) {
    case NB_JOB_VALUES_FP32:
      return NB_VALUES_FP32;
    case NB_JOB_VALUES_FP16:
      return NB_VALUES_FP16;
    case NB_JOB_VALUES_BF16:
      return NB_VALUES_BF16;
    case NB_JOB_VALUES_INT4:
      return NB_VALUES_INT4;
    case NB_JOB_VALUES_INT2:
      return NB_VALUES_INT2;
    default:
      return NB_VALUES_INT8;
  }
}

nb_status_t nb_train_config_from_job(const nb_job_config_t* job, int ci, const char* data_dir,
                                     nb_train_config_t* c) {
  if (!job || !c || ci < 0 || ci >= job->n_clusters)
    return nb_error(NB_ERR_CONFIG, "job has no cluster #%d", ci);
  const nb_job_cluster_t* cl = &job->clusters[ci];
  const nb_job_training_t* tr = &job->training;
  nb_train_config_defaults(c);
  c->model = nb_model_config_make(job->model.layers, job->model.width, job->model.heads,
                                  job->model.context);
  c->seed = tr->seed;
  c->batch_size = tr->batch_size;
  c->micro_batches = cl->workers;
  c->slowdown = cl->slowdown;
  c->max_steps = tr->max_steps;
  c->max_seconds = tr->max_seconds;
  c->optim.lr = (float)tr->optimizer.lr;
  c->optim.beta1 = (float)tr->optimizer.beta1;
  c->optim.beta2 = (float)tr->optimizer.beta2;
  c->optim.eps = (float)tr->optimizer.eps;
  c->optim.weight_decay = (float)tr->optimizer.weight_decay;
  c->optim.grad_clip = (float)tr->optimizer.grad_clip;
  c->optim.warmup_steps = tr->optimizer.warmup_steps;
  c->optim.total_steps = tr->max_steps;
  c->optim.min_lr_frac =
      tr->optimizer.schedule == NB_JOB_LR_CONSTANT ? 1.0f : (float)tr->optimizer.min_lr_ratio;
  if (job->model.base_checkpoint[0] && NB__CP(c->init_checkpoint, "%s", job->model.base_checkpoint))
    return nb_error(NB_ERR_CONFIG, "model.base.checkpoint: path too long");
  if (tr->lora.enabled) {
    c->lora_enabled = 1;
    c->lora.rank = tr->lora.rank;
    c->lora.alpha = (float)tr->lora.alpha;
    c->lora.sites = 0;
    if (tr->lora.targets & NB_JOB_LORA_QKV) c->lora.sites |= 1u << NB_SITE_QKV;
    if (tr->lora.targets & NB_JOB_LORA_ATTN_OUT) c->lora.sites |= 1u << NB_SITE_ATTN_PROJ;
    if (tr->lora.targets & NB_JOB_LORA_MLP_UP) c->lora.sites |= 1u << NB_SITE_FC;
    if (tr->lora.targets & NB_JOB_LORA_MLP_DOWN) c->lora.sites |= 1u << NB_SITE_FC_PROJ;
  }
  if (tr->distill.enabled) {
    const char* teacher =
        strcmp(tr->distill.teacher, "base") == 0 ? job->model.base_checkpoint : tr->distill.teacher;
    if (!teacher[0])
      return nb_error(NB_ERR_CONFIG, "distillation: teacher \"base\" needs model.base");
    if (NB__CP(c->teacher_checkpoint, "%s", teacher))
      return nb_error(NB_ERR_CONFIG, "distillation.teacher: path too long");
    c->distill_alpha = (float)tr->distill.alpha;
    c->distill_temp = (float)tr->distill.temperature;
  }

  char dir[NB_TRAIN_PATH_MAX];
  const char* tier = cl->data_tier == NB_JOB_DATA_FULL ? "full" : "quick";
  if (data_dir && data_dir[0])
    snprintf(dir, sizeof dir, "%s", data_dir);
  else if (cl->data_dir[0])
    snprintf(dir, sizeof dir, "%s", cl->data_dir);
  else
    snprintf(dir, sizeof dir, "data/%s", tier);
  if (job->task == NB_JOB_TASK_PRETRAIN) {
    c->data_kind = NB_TRAIN_DATA_MONO;
    if (cl->n_languages < 1)
      return nb_error(NB_ERR_CONFIG, "cluster %s: pretraining needs data.languages", cl->id);
    c->n_sources = cl->n_languages;
    for (int i = 0; i < cl->n_languages; i++) {
      nb_train_source_t* s = &c->sources[i];
      snprintf(s->label, sizeof s->label, "%s", cl->languages[i]);
      if (NB__CP(s->path, "%s/mono/%s.txt", dir, cl->languages[i]))
        return nb_error(NB_ERR_CONFIG, "data dir path too long: %s", dir);
    }
  } else {
    c->data_kind = NB_TRAIN_DATA_PAIRS;
    if (cl->n_pairs < 1)
      return nb_error(NB_ERR_CONFIG, "cluster %s: translation needs data.pairs", cl->id);
    c->n_sources = cl->n_pairs;
    for (int i = 0; i < cl->n_pairs; i++) {
      nb_train_source_t* s = &c->sources[i];
      const char *src = cl->pair_src[i], *tgt = cl->pair_tgt[i], *x;
      if (strcmp(src, "en") == 0) {
        x = tgt;
        s->swap = 0;
      } else if (strcmp(tgt, "en") == 0) {
        x = src;
        s->swap = 1;
      } else {
        return nb_error(NB_ERR_CONFIG,
                        "cluster %s: pair %s-%s: the data pipeline builds English pairs only "
                        "(en-X or X-en)",
                        cl->id, src, tgt);
      }
      snprintf(s->label, sizeof s->label, "%s-%s", src, tgt);
      if (NB__CP(s->path, "%s/pairs/en-%s.train.tsv", dir, x) ||
          NB__CP(s->dev_path, "%s/pairs/en-%s.dev.tsv", dir, x))
        return nb_error(NB_ERR_CONFIG, "data dir path too long: %s", dir);
    }
  }
  long round = job->sync.inner_steps > 0 ? job->sync.inner_steps : NB_HYBRID_INNER_STEPS_DEFAULT;
  c->eval_every = tr->eval_every_rounds > 0 ? tr->eval_every_rounds * round : 0;
  c->eval_batches = tr->eval_batches;
  c->checkpoint_every = job->checkpoint.every_rounds > 0 ? job->checkpoint.every_rounds * round : 0;
  c->checkpoint_keep = job->checkpoint.keep;
  return NB_OK;
}

void nb_hybrid_config_from_job(const nb_job_config_t* job, uint32_t index, nb_hybrid_config_t* hc) {
  nb_hybrid_config_defaults(hc);
  hc->cluster_index = index;
  hc->n_clusters = (uint32_t)job->n_clusters;
  hc->inner_steps =
      job->sync.inner_steps > 0 ? job->sync.inner_steps : NB_HYBRID_INNER_STEPS_DEFAULT;
  hc->round_seconds = job->sync.round_seconds;
  hc->outer_lr = (float)job->sync.outer_lr;
  hc->outer_momentum = (float)job->sync.outer_momentum;
  hc->density = job->compression.density_initial;
  hc->error_feedback = job->compression.error_feedback;
  hc->ef_decay = (float)job->compression.error_feedback_decay;
  hc->topk_chunk = (uint32_t)job->compression.topk_chunk;
  hc->values = nb__map_values(job->compression.values);
  hc->zstd_level = job->compression.zstd_level;
  hc->mode = job->sync.mode == NB_JOB_SYNC_STEP    ? NB_HYBRID_STEP
             : job->sync.mode == NB_JOB_SYNC_DENSE ? NB_HYBRID_DENSE
                                                   : NB_HYBRID_OUTER;
  hc->overlap = job->sync.overlap && hc->mode == NB_HYBRID_OUTER;
  hc->overlap_steps = job->sync.overlap_steps;
  /* the adaptive scheduler's tau is its estimate of the exchange's time (and depends on the
   * link's timing anyway): the update lands as soon as it is in, tau at the latest */
  hc->land_early = hc->overlap && job->compression.adaptive;
  hc->eager = job->sync.eager;
}

void nb_sched_config_from_job(const nb_job_config_t* job, nb_sched_config_t* sc) {
  nb_sched_config_default(sc);
  sc->density_floor = job->compression.density_min;
  sc->density_ceiling = job->compression.density_max;
  sc->initial_density = job->compression.density_initial;
  sc->overlap = job->sync.overlap;
  if (job->compression.budget_fraction > 0 && job->compression.budget_fraction <= 1)
    sc->fraction = job->compression.budget_fraction;
}

nb_status_t nb_train_config_data_dir(const nb_train_config_t* c, char* out, size_t cap) {
  if (c->n_sources < 1) return nb_error(NB_ERR_CONFIG, "no data source");
  char dir[NB_TRAIN_PATH_MAX];
  if (NB__CP(dir, "%s", c->sources[0].path)) return nb_error(NB_ERR_CONFIG, "data path too long");
  for (int up = 0; up < 2; up++) { /* DIR/mono/en.txt, DIR/pairs/en-de.train.tsv */
    char* slash = strrchr(dir, '/');
    if (!slash) {
      snprintf(dir, sizeof dir, ".");
      break;
    }
    *slash = 0;
    if (!dir[0]) snprintf(dir, sizeof dir, "/");
  }
  char real[PATH_MAX];
  const char* d = realpath(dir, real) ? real : dir;
  if ((size_t)snprintf(out, cap, "%s", d) >= cap)
    return nb_error(NB_ERR_CONFIG, "data path too long");
  return NB_OK;
}
