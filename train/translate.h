/* Translation with a byte-level model: greedy decoding of "source SEP" prompts (the model's K/V
 * cache, batches of sentences when scoring a file) and corpus scoring with chrF and BLEU
 * (train/metrics.h). Evaluation only: not a beam search, not a serving path. */
#ifndef NB_TRAIN_TRANSLATE_H
#define NB_TRAIN_TRANSLATE_H

#include <stddef.h>

#include "common/common.h"
#include "train/metrics.h" /* nb_utf8_sanitize */
#include "train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Greedy translation of one source segment. The prompt is the source bytes (truncated to half
 * the model's context) followed by SEP; decoding stops at EOS or after max_new tokens. Special
 * tokens other than EOS are dropped, and the bytes are made valid UTF-8 (each invalid byte becomes
 * U+FFFD, as Python's errors='replace'). *out is a new NUL-terminated string the caller frees
 * with nb_free. Returns NB_OK, NB_ERR_INVALID (NULL argument, max_new < 1), NB_ERR_NOMEM. */
nb_status_t nb_translate_greedy(nb_model_t* m, const char* src, int max_new, char** out);

typedef struct {
  size_t sentences; /* pairs translated */
  double chrf;      /* corpus chrF, 0..100 */
  double bleu;      /* corpus BLEU (13a, sacreBLEU defaults), 0..100 */
  double seconds;   /* wall time of the decoding */
} nb_translate_score_t;

/* Translates the first `limit` pairs of a TSV file ("english<TAB>other" lines; with swap the
 * other language is the source) and scores them against the references. Lines without exactly
 * one TAB are skipped. Sentences are decoded in batches (nb_model_generate_greedy_batch) with
 * the same result as nb_translate_greedy on each, one after another. Deterministic. Returns NB_OK, NB_ERR_IO (unreadable file), NB_ERR_INVALID
 * (no pair found, bad arguments), NB_ERR_NOMEM. Not thread-safe for the same model. */
nb_status_t nb_translate_eval_tsv(nb_model_t* m, const char* tsv_path, int swap, size_t limit,
                                  nb_translate_score_t* out);

#ifdef __cplusplus
}
#endif
#endif
