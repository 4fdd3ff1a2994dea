/* Target-language tags, greedy translation and its chrF/BLEU scoring. Evaluation code:
 * deterministic, decoding with the model's K/V cache and several sentences per batch; not a beam
 * search, not a serving path. */
#include "train/translate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/metrics.h"

/* Sentences decoded together by nb_translate_eval_tsv, and the most their K/V caches may take
 * (2 * L * ctx * C floats each): a batch reads the weights once per token for all of them. */
#define NB__TRANSLATE_BATCH 16
#define NB__TRANSLATE_CACHE_BYTES ((size_t)64 << 20)

static int nb__lang_ok(const char* x, size_t n) {
  if (n < 1 || n > NB_TRANSLATE_LANG_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = x[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '_'))
      return 0;
  }
  return 1;
}

nb_status_t nb_translate_pair_target(const char* label, char* out, size_t cap) {
  if (!label || !out || cap == 0)
    return nb_error(NB_ERR_INVALID, "nb_translate_pair_target: bad arguments");
  const char* dash = strchr(label, '-');
  if (!dash || !nb__lang_ok(label, (size_t)(dash - label)) ||
      !nb__lang_ok(dash + 1, strlen(dash + 1)))
    return nb_error(NB_ERR_INVALID,
                    "pair label '%s' is not \"src-tgt\" (two language codes of 1..%d letters, "
                    "digits or '_', e.g. \"en-de\")",
                    label, NB_TRANSLATE_LANG_MAX);
  if (strlen(dash + 1) + 1 > cap)
    return nb_error(NB_ERR_INVALID, "pair label '%s': target language longer than %zu bytes", label,
                    cap - 1);
  memcpy(out, dash + 1, strlen(dash + 1) + 1);
  return NB_OK;
}

nb_status_t nb_translate_tag(const char* tgt_lang, char* out, size_t cap) {
  if (!tgt_lang || !out) return nb_error(NB_ERR_INVALID, "nb_translate_tag: bad arguments");
  size_t n = strlen(tgt_lang);
  if (!nb__lang_ok(tgt_lang, n))
    return nb_error(NB_ERR_INVALID,
                    "target language '%s' is not a language code (1..%d letters, digits or '_')",
                    tgt_lang, NB_TRANSLATE_LANG_MAX);
  if (n + 4 > cap)
    return nb_error(NB_ERR_INVALID, "nb_translate_tag: %zu bytes are too few for '<2%s>'", cap,
                    tgt_lang);
  snprintf(out, cap, "<2%s>", tgt_lang);
  return NB_OK;
}

nb_status_t nb_translate_prompt(const nb_model_config_t* cfg, const char* tgt_lang, const char* src,
                                int** prompt, int* n) {
  if (!cfg || !src || !prompt || !n)
    return nb_error(NB_ERR_INVALID, "nb_translate_prompt: bad arguments");
  char tag[NB_TRANSLATE_TAG_MAX + 1];
  NB_CHECK(nb_translate_tag(tgt_lang, tag, sizeof tag));
  size_t n_tag = strlen(tag);
  size_t n_src = strlen(src), cap = (size_t)(cfg->ctx / 2 > 1 ? cfg->ctx / 2 : 1);
  if (n_src > cap) n_src = cap;
  NB_CHECK(nb_alloc((void**)prompt, n_tag + n_src + 1, sizeof(int), "prompt"));
  for (size_t i = 0; i < n_tag; i++) (*prompt)[i] = (unsigned char)tag[i];
  for (size_t i = 0; i < n_src; i++) (*prompt)[n_tag + i] = (unsigned char)src[i];
  (*prompt)[n_tag + n_src] = NB_TOKEN_SEP;
  *n = (int)(n_tag + n_src) + 1;
  return NB_OK;
}

/* Decoded tokens to text: special tokens dropped, bytes made valid UTF-8. */
static nb_status_t nb__translate_text(const int* gen, int n_gen, char** out) {
  unsigned char* bytes = NULL;
  NB_CHECK(nb_alloc((void**)&bytes, (size_t)n_gen + 1, 1, "bytes"));
  size_t nb = 0;
  for (int i = 0; i < n_gen; i++)
    if (gen[i] < 256) bytes[nb++] = (unsigned char)gen[i];
  nb_status_t st = nb_utf8_sanitize(bytes, nb, out);
  nb_free(bytes);
  return st;
}

nb_status_t nb_translate_greedy(nb_model_t* m, const char* tgt_lang, const char* src, int max_new,
                                char** out) {
  if (!m || !tgt_lang || !src || !out || max_new < 1)
    return nb_error(NB_ERR_INVALID, "nb_translate_greedy: bad arguments");
  *out = NULL;
  nb_status_t st = NB_OK;
  int *prompt = NULL, *gen = NULL, n_prompt = 0, n_gen = 0;
  NB_CHECK_GOTO(nb_translate_prompt(nb_model_get_config(m), tgt_lang, src, &prompt, &n_prompt), st,
                fail);
  NB_CHECK_GOTO(nb_alloc((void**)&gen, (size_t)max_new, sizeof(int), "tokens"), st, fail);
  NB_CHECK_GOTO(nb_model_generate_greedy(m, prompt, n_prompt, max_new, NB_TOKEN_EOS, gen, &n_gen),
                st, fail);
  st = nb__translate_text(gen, n_gen, out);
fail:
  nb_free(prompt);
  nb_free(gen);
  return st;
}

/* Translates n sources together (same tokens as nb_translate_greedy on each); hyps[i] receive
 * new strings (NULL on error; the caller frees them either way). */
static nb_status_t nb__translate_batch(nb_model_t* m, const char* tgt_lang, char* const* srcs,
                                       const int* max_new, int n, char** hyps) {
  nb_status_t st = NB_OK;
  int *prompts[NB__TRANSLATE_BATCH] = {0}, *gens[NB__TRANSLATE_BATCH] = {0};
  int n_prompt[NB__TRANSLATE_BATCH], n_gen[NB__TRANSLATE_BATCH];
  for (int i = 0; i < n; i++) hyps[i] = NULL;
  for (int i = 0; i < n; i++) {
    NB_CHECK_GOTO(
        nb_translate_prompt(nb_model_get_config(m), tgt_lang, srcs[i], &prompts[i], &n_prompt[i]),
        st, done);
    NB_CHECK_GOTO(nb_alloc((void**)&gens[i], (size_t)max_new[i], sizeof(int), "tokens"), st, done);
  }
  NB_CHECK_GOTO(nb_model_generate_greedy_batch(m, n, (const int* const*)prompts, n_prompt, max_new,
                                               NB_TOKEN_EOS, gens, n_gen),
                st, done);
  for (int i = 0; i < n; i++)
    NB_CHECK_GOTO(nb__translate_text(gens[i], n_gen[i], &hyps[i]), st, done);
done:
  for (int i = 0; i < n; i++) {
    nb_free(prompts[i]);
    nb_free(gens[i]);
  }
  return st;
}

nb_status_t nb_translate_eval_tsv(nb_model_t* m, const char* tsv_path, int swap,
                                  const char* tgt_lang, size_t limit, nb_translate_score_t* out) {
  if (!m || !tsv_path || !tgt_lang || !out || limit == 0)
    return nb_error(NB_ERR_INVALID, "nb_translate_eval_tsv: bad arguments");
  char tag[NB_TRANSLATE_TAG_MAX + 1];
  NB_CHECK(nb_translate_tag(tgt_lang, tag, sizeof tag)); /* a bad code before any decoding */
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
  size_t per_seq =
      2 * sizeof(float) * (size_t)cfg->n_layer * (size_t)cfg->ctx * (size_t)cfg->n_embd;
  int batch = NB__TRANSLATE_BATCH;
  while (batch > 1 && (size_t)batch * per_seq > NB__TRANSLATE_CACHE_BYTES) batch /= 2;
  char *srcs[NB__TRANSLATE_BATCH] = {0}, *refs[NB__TRANSLATE_BATCH] = {0};
  char* hyps[NB__TRANSLATE_BATCH] = {0};
  int max_new[NB__TRANSLATE_BATCH], n = 0, eof = 0;
  while (!eof && out->sentences < limit) {
    /* read at most the pairs still wanted; a pair skipped below makes the next batch read on, so
     * the scored pairs are those of translating one line after another */
    for (n = 0; n < batch && (size_t)n < limit - out->sentences;) {
      if (getline(&line, &line_cap, f) <= 0) {
        eof = 1;
        break;
      }
      line[strcspn(line, "\r\n")] = '\0';
      char* tab = strchr(line, '\t');
      if (!tab || strchr(tab + 1, '\t')) continue;
      *tab = '\0';
      const char* src = swap ? tab + 1 : line;
      const char* ref = swap ? line : tab + 1;
      max_new[n] = (int)(2 * strlen(src) + 16);
      if (max_new[n] > cfg->ctx) max_new[n] = cfg->ctx;
      srcs[n] = strdup(src);
      refs[n] = strdup(ref);
      n++;
      if (!srcs[n - 1] || !refs[n - 1]) {
        st = nb_error(NB_ERR_NOMEM, "translation eval: out of memory");
        goto done;
      }
    }
    if (n == 0) break;
    NB_CHECK_GOTO(nb__translate_batch(m, tgt_lang, srcs, max_new, n, hyps), st, done);
    for (int i = 0; i < n; i++) {
      st = nb_metrics_chrf_add(&chrf, hyps[i], refs[i]);
      if (st == NB_OK) st = nb_metrics_bleu_add(&bleu, hyps[i], refs[i]);
      if (st == NB_ERR_INVALID) { /* a reference that is not UTF-8: skip the pair */
        st = NB_OK;
        continue;
      }
      if (st != NB_OK) goto done;
      out->sentences++;
    }
    for (int i = 0; i < n; i++) {
      free(srcs[i]), free(refs[i]), nb_free(hyps[i]);
      srcs[i] = refs[i] = hyps[i] = NULL;
    }
    n = 0;
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
  for (int i = 0; i < n; i++) free(srcs[i]), free(refs[i]), nb_free(hyps[i]);
  free(line);
  fclose(f);
  return st;
}
