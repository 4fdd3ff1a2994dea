/* Greedy translation and its chrF/BLEU scoring. Evaluation code: simple and deterministic rather
 * than fast (no KV cache, no batching). */
#include "train/translate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/metrics.h"

nb_status_t nb_translate_greedy(nb_model_t* m, const char* src, int max_new, char** out) {
  if (!m || !src || !out || max_new < 1)
    return nb_error(NB_ERR_INVALID, "nb_translate_greedy: bad arguments");
  *out = NULL;
  const nb_model_config_t* cfg = nb_model_get_config(m);
  size_t n_src = strlen(src), cap = (size_t)(cfg->ctx / 2 > 1 ? cfg->ctx / 2 : 1);
  if (n_src > cap) n_src = cap;
  nb_status_t st = NB_OK;
  int *prompt = NULL, *gen = NULL;
  unsigned char* bytes = NULL;
  NB_CHECK_GOTO(nb_alloc((void**)&prompt, n_src + 1, sizeof(int), "prompt"), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&gen, (size_t)max_new, sizeof(int), "tokens"), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&bytes, (size_t)max_new + 1, 1, "bytes"), st, fail);
  for (size_t i = 0; i < n_src; i++) prompt[i] = (unsigned char)src[i];
  prompt[n_src] = NB_TOKEN_SEP;
  int n_gen = 0;
  NB_CHECK_GOTO(
      nb_model_generate_greedy(m, prompt, (int)n_src + 1, max_new, NB_TOKEN_EOS, gen, &n_gen), st,
      fail);
  size_t nb = 0;
  for (int i = 0; i < n_gen; i++)
    if (gen[i] < 256) bytes[nb++] = (unsigned char)gen[i];
  st = nb_utf8_sanitize(bytes, nb, out);
fail:
  nb_free(prompt);
  nb_free(gen);
  nb_free(bytes);
  return st;
}

nb_status_t nb_translate_eval_tsv(nb_model_t* m, const char* tsv_path, int swap, size_t limit,
                                  nb_translate_score_t* out) {
  if (!m || !tsv_path || !out || limit == 0)
    return nb_error(NB_ERR_INVALID, "nb_translate_eval_tsv: bad arguments");
  memset(out, 0, sizeof *out);
  FILE* f = fopen(tsv_path, "r");
  if (!f) return nb_error(NB_ERR_IO, "cannot read %s: %s", tsv_path, strerror(errno));
  nb_status_t st = NB_OK;
  nb_chrf_stats_t chrf;
  nb_bleu_stats_t bleu;
  memset(&chrf, 0, sizeof chrf);
  memset(&bleu, 0, sizeof bleu);
  char* line = NULL;
  size_t line_cap = 0;
  double t0 = nb_now_s();
  const nb_model_config_t* cfg = nb_model_get_config(m);
  while (out->sentences < limit && getline(&line, &line_cap, f) > 0) {
    line[strcspn(line, "\r\n")] = '\0';
    char* tab = strchr(line, '\t');
    if (!tab || strchr(tab + 1, '\t')) continue;
    *tab = '\0';
    const char* src = swap ? tab + 1 : line;
    const char* ref = swap ? line : tab + 1;
    int max_new = (int)(2 * strlen(src) + 16);
    if (max_new > cfg->ctx) max_new = cfg->ctx;
    char* hyp = NULL;
    NB_CHECK_GOTO(nb_translate_greedy(m, src, max_new, &hyp), st, done);
    st = nb_metrics_chrf_add(&chrf, hyp, ref);
    if (st == NB_OK) st = nb_metrics_bleu_add(&bleu, hyp, ref);
    nb_free(hyp);
    if (st == NB_ERR_INVALID) { /* a reference that is not UTF-8: skip the pair */
      st = NB_OK;
      continue;
    }
    if (st != NB_OK) goto done;
    out->sentences++;
  }
  if (out->sentences == 0) {
    st = nb_error(NB_ERR_INVALID, "%s: no translation pair found", tsv_path);
    goto done;
  }
  out->chrf = nb_metrics_chrf_score(&chrf);
  nb_bleu_result_t br;
  nb_metrics_bleu_score(&bleu, NB_BLEU_SMOOTH_EXP, &br);
  out->bleu = br.score;
  out->seconds = nb_now_s() - t0;
done:
  free(line);
  fclose(f);
  return st;
}
