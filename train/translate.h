/* Translation with a byte-level model: greedy decoding of "<2xx>source SEP" prompts (a
 * target-language tag, the model's K/V cache, batches of sentences when scoring a file) and corpus
 * scoring with chrF and BLEU (train/metrics.h). Evaluation only: not a beam search, not serving. */
#ifndef NB_TRAIN_TRANSLATE_H
#define NB_TRAIN_TRANSLATE_H

#include <stddef.h>

#include "common/common.h"
#include "train/metrics.h" /* nb_utf8_sanitize */
#include "train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest language code, and the longest tag "<2" code ">" (without the NUL). */
#define NB_TRANSLATE_LANG_MAX 15
#define NB_TRANSLATE_TAG_MAX (NB_TRANSLATE_LANG_MAX + 3)

/* Target-language tags (multilingual NMT, Johnson et al. 2017): every translation sequence, in
 * training (train/trainer.c) and in the decoding prompt, is
 *     "<2" tgt ">" source SEP target EOS
 * with the tag as plain bytes, so one model trained on several pairs knows which language to
 * produce. The target language of a data source comes from its label "src-tgt" (the direction
 * of translation: "de-en" is read swapped from the en-de files), in one place:
 * nb_translate_pair_target. */

/* Writes the target language of the pair label "src-tgt" (e.g. "en-de" -> "de") into out (cap
 * bytes, NUL-terminated). Both codes must be 1..NB_TRANSLATE_LANG_MAX letters, digits or '_',
 * separated by exactly one '-'. Returns NB_OK, NB_ERR_INVALID naming the label. Thread-safe. */
nb_status_t nb_translate_pair_target(const char* label, char* out, size_t cap);

/* Writes the tag "<2" tgt_lang ">" into out (cap bytes, NUL-terminated; NB_TRANSLATE_TAG_MAX + 1
 * always suffices). tgt_lang: 1..NB_TRANSLATE_LANG_MAX letters, digits or '_'. Returns NB_OK,
 * NB_ERR_INVALID (bad code, cap too small). Thread-safe. */
nb_status_t nb_translate_tag(const char* tgt_lang, char* out, size_t cap);

/* The decoding prompt: the tag of tgt_lang, the source bytes truncated to half the model's
 * context (the tag is always kept whole), then SEP. *prompt is a new array of *n tokens the
 * caller frees with nb_free. Returns NB_OK, NB_ERR_INVALID (bad argument or code),
 * NB_ERR_NOMEM. Thread-safe. */
nb_status_t nb_translate_prompt(const nb_model_config_t* cfg, const char* tgt_lang, const char* src,
                                int** prompt, int* n);

/* Greedy translation of one source segment into tgt_lang (a language code, e.g. "de"). The
 * prompt is nb_translate_prompt's; decoding stops at EOS or after max_new tokens. Special
 * tokens other than EOS are dropped, and the bytes are made valid UTF-8 (each invalid byte becomes
 * U+FFFD, as Python's errors='replace'). *out is a new NUL-terminated string the caller frees
 * with nb_free. Returns NB_OK, NB_ERR_INVALID (NULL argument, bad tgt_lang, max_new < 1),
 * NB_ERR_NOMEM. Not thread-safe for the same model. */
nb_status_t nb_translate_greedy(nb_model_t* m, const char* tgt_lang, const char* src, int max_new,
                                char** out);

typedef struct {
  size_t sentences; /* pairs translated */
  double chrf;      /* corpus chrF, 0..100 */
  double bleu;      /* corpus BLEU (13a, sacreBLEU defaults), 0..100 */
  double seconds;   /* wall time of the decoding */
} nb_translate_score_t;

/* Translates the first `limit` pairs of a TSV file ("english<TAB>other" lines; with swap the
 * other language is the source) into tgt_lang (the reference side's language code, e.g. "de",
 * or "en" with swap; nb_translate_pair_target of the pair's label) and scores them against the
 * references. Lines without exactly
 * one TAB are skipped. Sentences are decoded in batches (nb_model_generate_greedy_batch) with
 * the same result as nb_translate_greedy on each, one after another. Deterministic. Returns NB_OK,
 * NB_ERR_IO (unreadable file), NB_ERR_INVALID (no pair found, bad arguments), NB_ERR_NOMEM. Not
 * thread-safe for the same model. */
nb_status_t nb_translate_eval_tsv(nb_model_t* m, const char* tsv_path, int swap,
                                  const char* tgt_lang, size_t limit, nb_translate_score_t* out);

#ifdef __cplusplus
}
#endif
#endif
