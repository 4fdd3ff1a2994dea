/* The translation quality of a training run for its summary: chrF and BLEU of the base model
 * (before fine-tuning) and of the final model on the first sentences of each pair's test split.
 * It is not a metric (train/metrics.h) nor a decoder (train/translate.h): it only runs both
 * models over the same pairs and shapes the summary's "translation" object. */
#ifndef NB_JOBS_TRANSLATION_EVAL_H
#define NB_JOBS_TRANSLATION_EVAL_H

#include <jansson.h>
#include <stddef.h>

#include "common/status.h"
#include "train/model.h"
#include "train/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scores every pair source of tc (data_kind NB_TRAIN_DATA_PAIRS; sources with a dev_path
 * "<...>.dev.tsv", whose test split "<...>.test.tsv" is read) on its first `sentences` pairs by
 * greedy decoding, with the base model and with final_model:
 *   {"en-de": {"sentences": N, "base": {"chrf": c, "bleu": b}, "final": {"chrf": c, "bleu": b},
 *              "seconds": s}, ...}
 * The base model is tc->init_checkpoint when set, else a model initialised from tc->model and
 * tc->seed (what the trainer started from). tc: borrowed. final_model: borrowed; used for
 * decoding (its logits are overwritten) but not changed otherwise. *out: a new JSON object the
 * caller releases with json_decref. Returns NB_ERR_INVALID (not a pairs config, sentences 0,
 * NULL arguments), NB_ERR_IO (a test split or the base checkpoint cannot be read), NB_ERR_NOMEM.
 * Not thread-safe for the same final_model. */
nb_status_t nb_translation_eval(const nb_train_config_t* tc, nb_model_t* final_model,
                                size_t sentences, json_t** out);

#ifdef __cplusplus
}
#endif
#endif
