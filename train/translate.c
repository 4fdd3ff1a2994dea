/* Greedy translation and its chrF/BLEU scoring. Evaluation code: simple and deterministic rather
 * than fast (no KV cache, no batching). */
#include "train/translate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/metrics.h"

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static size_t nb__utf8_seq(const unsigned char* p, size_t n) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else
    return 0;
  if (n < len) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return len;
}

nb_status_t nb_utf8_sanitize(const unsigned char* bytes, size_t len, char** out) {
  char* s = NULL;
  NB_CHECK(nb_alloc((void**)&s, len * 3 + 1, 1, "utf-8 text"));
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t k = nb__utf8_seq(bytes + i, len - i);
    if (k == 0) {
      memcpy(s + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i++;
    } else {
      if (!(k == 1 && bytes[i] == 0)) memcpy(s + o, bytes + i, k), o += k;
      i += k;
    }
  }
  s[o] = '\0';
  *out = s;
  return NB_OK;
}

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
