/* Translation metrics: chrF and BLEU with sacreBLEU's standard definitions (sacrebleu 2.4.x).
 * chrF: character n-grams of order 1..6 over Unicode code points, whitespace removed, beta 2,
 * no lowercasing, statistics summed over the corpus and averaged over effective orders exactly as
 * sacreBLEU's CHRF(char_order=6, word_order=0, beta=2, eps_smoothing=False).
 * BLEU: sacreBLEU's BLEU(tokenize='13a', lowercase=False, max_ngram_order=4,
 * effective_order=False) with its brevity penalty; the smoothing is a parameter whose default is
 * sacreBLEU's default, 'exp' (it only matters when an n-gram order has no match at all).
 * One reference per segment. Not chrF++ (word n-grams) and not the 'zh'/'intl' tokenizers.
 * Segments are UTF-8; invalid UTF-8 is rejected with NB_ERR_INVALID. */
#ifndef NB_TRAIN_METRICS_H
#define NB_TRAIN_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define NB_CHRF_ORDER 6
#define NB_CHRF_BETA 2.0
#define NB_BLEU_ORDER 4

/* Sufficient statistics of chrF, summed over segments (zero-initialise before the first add). */
typedef struct nb_chrf_stats {
  int64_t hyp[NB_CHRF_ORDER];   /* hypothesis character n-grams of order n+1 */
  int64_t ref[NB_CHRF_ORDER];   /* reference character n-grams of order n+1 */
  int64_t match[NB_CHRF_ORDER]; /* clipped matches (multiset intersection) */
} nb_chrf_stats_t;

/* Sufficient statistics of BLEU, summed over segments (zero-initialise before the first add). */
typedef struct nb_bleu_stats {
  int64_t sys_len;                /* hypothesis tokens */
  int64_t ref_len;                /* reference tokens */
  int64_t correct[NB_BLEU_ORDER]; /* clipped n-gram matches of order n+1 */
  int64_t total[NB_BLEU_ORDER];   /* hypothesis n-grams of order n+1 */
} nb_bleu_stats_t;

typedef enum nb_bleu_smooth {
  NB_BLEU_SMOOTH_EXP = 0, /* sacreBLEU default ('exp', mteval-v13a method 3) */
  NB_BLEU_SMOOTH_NONE,    /* 'none' */
  NB_BLEU_SMOOTH_FLOOR,   /* 'floor' with value 0.1 */
} nb_bleu_smooth_t;

/* Detailed BLEU result, as sacreBLEU's BLEUScore. */
typedef struct nb_bleu_result {
  double score;                     /* 0..100 */
  double bp;                        /* brevity penalty */
  double precisions[NB_BLEU_ORDER]; /* percent, after smoothing */
  int64_t sys_len, ref_len;
} nb_bleu_result_t;

/* Adds the chrF statistics of one (hypothesis, reference) pair to *acc.
 * hyp, ref: borrowed NUL-terminated UTF-8. Returns NB_OK, NB_ERR_INVALID (NULL argument or invalid
 * UTF-8; *acc unchanged), NB_ERR_NOMEM. Thread-safe for distinct acc. */
nb_status_t nb_metrics_chrf_add(nb_chrf_stats_t* acc, const char* hyp, const char* ref);

/* chrF (0..100) from summed statistics, sacreBLEU's corpus-level formula. Pure. */
double nb_metrics_chrf_score(const nb_chrf_stats_t* stats);

/* Corpus chrF of n pairs: hyps[i] scored against refs[i] (borrowed). *out_score 0..100.
 * Returns NB_OK, NB_ERR_INVALID, NB_ERR_NOMEM. */
nb_status_t nb_metrics_chrf_corpus(const char* const* hyps, const char* const* refs, size_t n,
                                   double* out_score);

/* sacreBLEU's 13a tokenization of one segment (after its rstrip), as a newly allocated
 * NUL-terminated string whose tokens are separated by single spaces; the caller frees *out with
 * nb_free. Returns NB_OK, NB_ERR_INVALID (NULL, invalid UTF-8), NB_ERR_NOMEM. */
nb_status_t nb_metrics_tokenize_13a(const char* text, char** out);

/* Adds the BLEU statistics of one (hypothesis, reference) pair (13a-tokenized internally).
 * Returns NB_OK, NB_ERR_INVALID (*acc unchanged), NB_ERR_NOMEM. Thread-safe for distinct acc. */
nb_status_t nb_metrics_bleu_add(nb_bleu_stats_t* acc, const char* hyp, const char* ref);

/* BLEU from summed statistics with the given smoothing; fills *out (all fields). Pure. */
void nb_metrics_bleu_score(const nb_bleu_stats_t* stats, nb_bleu_smooth_t smooth,
                           nb_bleu_result_t* out);

/* Corpus BLEU of n pairs with sacreBLEU's defaults (13a, exp smoothing). *out filled on NB_OK.
 * Returns NB_OK, NB_ERR_INVALID, NB_ERR_NOMEM. */
nb_status_t nb_metrics_bleu_corpus(const char* const* hyps, const char* const* refs, size_t n,
                                   nb_bleu_result_t* out);

/* Makes len bytes valid UTF-8 into a new NUL-terminated string: each byte that does not start a
 * valid sequence becomes U+FFFD (as Python's errors='replace' for these cases), NUL bytes are
 * dropped. *out is freed by the caller with nb_free. Returns NB_OK, NB_ERR_NOMEM. Pure. */
nb_status_t nb_utf8_sanitize(const unsigned char* bytes, size_t len, char** out);

#endif /* NB_TRAIN_METRICS_H */
