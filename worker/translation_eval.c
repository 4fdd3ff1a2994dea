/* chrF/BLEU of the base and the final model for a run summary (worker/worker.h). It
 * decodes with train/translate and does not train, load data pipelines or write files. */
#include "worker/worker.h"

#include <string.h>

#include "common/common.h"
#include "train/checkpoint.h"
#include "train/translate.h"

static json_t* nb__score_json(const nb_translate_score_t* s) {
  json_t* o = json_object();
  json_object_set_new(o, "chrf", json_real(s->chrf));
  json_object_set_new(o, "bleu", json_real(s->bleu));
  return o;
}

nb_status_t nb_translation_eval(const nb_train_config_t* tc, nb_model_t* final_model,
                                size_t sentences, json_t** out) {
  if (!tc || !final_model || !out || sentences == 0)
    return nb_error(NB_ERR_INVALID, "translation eval: NULL argument or 0 sentences");
  *out = NULL;
  if (tc->data_kind != NB_TRAIN_DATA_PAIRS || tc->n_sources < 1)
    return nb_error(NB_ERR_INVALID, "translation eval: the run has no translation pairs");
  nb_model_t* base = NULL;
  long step = 0;
  nb_status_t st = tc->init_checkpoint[0] ? nb_checkpoint_load(tc->init_checkpoint, &base, &step)
                                          : nb_model_create(&tc->model, tc->seed, &base);
  if (st != NB_OK) return nb_error_wrap(st, "translation eval: base model");
  json_t* all = json_object();
  for (int i = 0; i < tc->n_sources && st == NB_OK; i++) {
    const nb_train_source_t* s = &tc->sources[i];
    char tsv[NB_TRAIN_PATH_MAX + 16];
    snprintf(tsv, sizeof tsv, "%s", s->dev_path);
    char* dot = strstr(tsv, ".dev.tsv");
    if (!dot) {
      st = nb_error(NB_ERR_INVALID, "translation eval: pair %s: dev split '%s' is not *.dev.tsv",
                    s->label, s->dev_path);
      break;
    }
    memcpy(dot, ".test.tsv", sizeof ".test.tsv");
    nb_translate_score_t b, f;
    double t0 = nb_now_s();
    char tgt[NB_TRANSLATE_LANG_MAX + 1]; /* the language the trainer tagged this pair with */
    st = nb_translate_pair_target(s->label, tgt, sizeof tgt);
    if (st == NB_OK) st = nb_translate_eval_tsv(base, tsv, s->swap, tgt, sentences, &b);
    if (st == NB_OK) st = nb_translate_eval_tsv(final_model, tsv, s->swap, tgt, sentences, &f);
    if (st != NB_OK) {
      st = nb_error_wrap(st, "translation eval of %s", s->label);
      break;
    }
    json_t* one = json_object();
    json_object_set_new(one, "sentences", json_integer((json_int_t)f.sentences));
    json_object_set_new(one, "base", nb__score_json(&b));
    json_object_set_new(one, "final", nb__score_json(&f));
    json_object_set_new(one, "seconds", json_real(nb_now_s() - t0));
    json_object_set_new(all, s->label, one);
    NB_INFO(TRAIN, "translation %s: chrF %.2f -> %.2f, BLEU %.2f -> %.2f (%zu sentences)", s->label,
            b.chrf, f.chrf, b.bleu, f.bleu, f.sentences);
  }
  nb_model_destroy(base);
  if (st != NB_OK) {
    json_decref(all);
    return st;
  }
  *out = all;
  return NB_OK;
}
