/* Tests of train/translate: UTF-8 repair of decoded bytes, greedy decoding, and scoring a TSV
 * (batched decoding scores as one sentence after another). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/translate.h"

static void sanitize_is(const char* in, size_t len, const char* want) {
  char* out = NULL;
  assert_int_equal(nb_utf8_sanitize((const unsigned char*)in, len, &out), NB_OK);
  assert_string_equal(out, want);
  nb_free(out);
}

static void test_sanitize(void** state) {
  (void)state;
  sanitize_is("plain", 5, "plain");
  sanitize_is("gr\xC3\xBC\xC3\x9F", 6, "gr\xC3\xBC\xC3\x9F");             /* grüß */
  sanitize_is("\xE4\xB8\xAD\xE6\x96\x87", 6, "\xE4\xB8\xAD\xE6\x96\x87"); /* 中文 */
  sanitize_is(
      "a\xFF"
      "b",
      3,
      "a\xEF\xBF\xBD"
      "b");                                                               /* invalid byte */
  sanitize_is("\xC3", 1, "\xEF\xBF\xBD");                                 /* truncated */
  sanitize_is("\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD");                 /* overlong */
  sanitize_is("\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"); /* surrogate */
  sanitize_is("a\0b", 3, "ab");                                           /* NUL dropped */
  sanitize_is("", 0, "");
}

static nb_model_t* tiny_model(void) {
  nb_model_config_t cfg = nb_model_config_make(1, 32, 2, 64);
  nb_model_t* m = NULL;
  assert_int_equal(nb_model_create(&cfg, 7, &m), NB_OK);
  return m;
}

/* Tags: the pair label's target language, "<2xx>" bytes, and the prompt "tag source SEP" whose
 * source (not the tag) is truncated to half the context. */
static void test_tag_and_prompt(void** state) {
  (void)state;
  char lang[NB_TRANSLATE_LANG_MAX + 1], tag[NB_TRANSLATE_TAG_MAX + 1];
  assert_int_equal(nb_translate_pair_target("en-de", lang, sizeof lang), NB_OK);
  assert_string_equal(lang, "de");
  assert_int_equal(nb_translate_pair_target("ru-en", lang, sizeof lang), NB_OK);
  assert_string_equal(lang, "en");
  static const char* bad[] = {"en", "en-", "-de", "en-de-fr", "en-d e", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(nb_translate_pair_target(bad[i], lang, sizeof lang), NB_ERR_INVALID);
    assert_non_null(strstr(nb_error_last(), "src-tgt"));
  }
  assert_int_equal(nb_translate_pair_target("en-de", lang, 2), NB_ERR_INVALID);
  assert_int_equal(nb_translate_tag("zh", tag, sizeof tag), NB_OK);
  assert_string_equal(tag, "<2zh>");
  assert_int_equal(nb_translate_tag("zh", tag, 5), NB_ERR_INVALID); /* no room for the NUL */
  assert_int_equal(nb_translate_tag("", tag, sizeof tag), NB_ERR_INVALID);
  assert_int_equal(nb_translate_tag("abcdefghijklmnop", tag, sizeof tag), NB_ERR_INVALID);

  nb_model_config_t cfg = nb_model_config_make(1, 32, 2, 64);
  int* p = NULL;
  int n = 0;
  assert_int_equal(nb_translate_prompt(&cfg, "de", "Hi", &p, &n), NB_OK);
  int want[] = {'<', '2', 'd', 'e', '>', 'H', 'i', NB_TOKEN_SEP};
  assert_int_equal(n, 8);
  assert_memory_equal(p, want, sizeof want);
  nb_free(p);
  char longsrc[200];
  memset(longsrc, 'x', sizeof longsrc - 1);
  longsrc[sizeof longsrc - 1] = '\0';
  assert_int_equal(nb_translate_prompt(&cfg, "ru", longsrc, &p, &n), NB_OK);
  assert_int_equal(n, 5 + 32 + 1); /* whole tag, ctx / 2 source bytes, SEP */
  int tag_ru[] = {'<', '2', 'r', 'u', '>'};
  assert_memory_equal(p, tag_ru, sizeof tag_ru);
  assert_int_equal(p[5], 'x');
  assert_int_equal(p[n - 2], 'x');
  assert_int_equal(p[n - 1], NB_TOKEN_SEP);
  nb_free(p);
  assert_int_equal(nb_translate_prompt(&cfg, "r>u", "Hi", &p, &n), NB_ERR_INVALID);
}

static void test_greedy_deterministic(void** state) {
  (void)state;
  nb_model_t* m = tiny_model();
  char *a = NULL, *b = NULL;
  assert_int_equal(nb_translate_greedy(m, "de", "Hello world", 20, &a), NB_OK);
  assert_int_equal(nb_translate_greedy(m, "de", "Hello world", 20, &b), NB_OK);
  assert_string_equal(a, b);
  assert_true(strlen(a) <= 20 * 3); /* each byte at most one U+FFFD */
  nb_free(a);
  nb_free(b);
  /* a source longer than the context is truncated, not an error */
  char longsrc[300];
  memset(longsrc, 'x', sizeof longsrc - 1);
  longsrc[sizeof longsrc - 1] = '\0';
  assert_int_equal(nb_translate_greedy(m, "de", longsrc, 8, &a), NB_OK);
  nb_free(a);
  assert_int_equal(nb_translate_greedy(m, "de", "x", 0, &a), NB_ERR_INVALID);
  assert_int_equal(nb_translate_greedy(NULL, "de", "x", 4, &a), NB_ERR_INVALID);
  assert_int_equal(nb_translate_greedy(m, NULL, "x", 4, &a), NB_ERR_INVALID);
  assert_int_equal(nb_translate_greedy(m, "d<e", "x", 4, &a), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "d<e"));
  nb_model_destroy(m);
}

static void test_eval_tsv(void** state) {
  (void)state;
  char dir[] = "/tmp/nb-translate-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/pairs.tsv", dir);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs("The file was saved.\tDie Datei wurde gespeichert.\n", f);
  fputs("no tab on this line\n", f);
  fputs("Open the menu.\tÖffnen Sie das Menü.\n", f);
  fputs("Close it.\tSchließen Sie es.\n", f);
  fclose(f);
  nb_model_t* m = tiny_model();
  nb_translate_score_t s1, s2;
  assert_int_equal(nb_translate_eval_tsv(m, path, 0, "de", 2, &s1), NB_OK);
  assert_int_equal(s1.sentences, 2);
  assert_true(s1.chrf >= 0 && s1.chrf <= 100);
  assert_true(s1.bleu >= 0 && s1.bleu <= 100);
  assert_int_equal(nb_translate_eval_tsv(m, path, 1, "en", 10, &s2), NB_OK); /* de→en, all pairs */
  assert_int_equal(s2.sentences, 3);
  nb_translate_score_t s3;
  assert_int_equal(nb_translate_eval_tsv(m, path, 0, "de", 2, &s3), NB_OK);
  assert_true(s3.chrf == s1.chrf && s3.bleu == s1.bleu); /* deterministic */
  char missing[300];
  snprintf(missing, sizeof missing, "%s/none.tsv", dir);
  assert_int_equal(nb_translate_eval_tsv(m, missing, 0, "de", 2, &s1), NB_ERR_IO);
  f = fopen(path, "w");
  fputs("nothing here\n", f);
  fclose(f);
  assert_int_equal(nb_translate_eval_tsv(m, path, 0, "de", 2, &s1), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "no translation pair"));
  nb_model_destroy(m);
  unlink(path);
  rmdir(dir);
}

/* Scoring a file decodes its sentences in batches; the scores and the pairs scored are those of
 * translating one line after another with nb_translate_greedy, across several batches, a
 * skipped pair (reference not UTF-8) and a limit that falls inside a batch. */
static void test_eval_batches_equal_one_by_one(void** state) {
  (void)state;
  char dir[] = "/tmp/nb-translate-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/pairs.tsv", dir);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  static const char* words[] = {"file", "menu", "open", "save", "close", "the", "window", "a"};
  char src[64][96], ref[64][96];
  int n_pairs = 40;
  for (int i = 0; i < n_pairs; i++) {
    snprintf(src[i], sizeof src[i], "%s %s %d %s.", words[i % 8], words[(i * 3 + 1) % 8], i,
             words[(i * 5 + 2) % 8]);
    snprintf(ref[i], sizeof ref[i], "%s%s %d", i == 7 ? "\xFF" : "", words[(i * 7 + 3) % 8], i);
    fprintf(f, "%s\t%s\n", src[i], ref[i]);
  }
  fclose(f);
  nb_model_config_t cfg = nb_model_config_make(2, 32, 4, 64);
  nb_model_t* m = NULL;
  assert_int_equal(nb_model_create(&cfg, 5, &m), NB_OK);
  size_t np;
  float* p = nb_model_params(m, &np);
  for (size_t i = 0; i < np; i++) p[i] *= 3.0f; /* peaked outputs: sentences decode differently */
  size_t limits[] = {40, 23, 5};
  for (size_t li = 0; li < 3; li++) {
    nb_translate_score_t s;
    assert_int_equal(nb_translate_eval_tsv(m, path, 0, "fr", limits[li], &s), NB_OK);
    nb_chrf_stats_t chrf;
    nb_bleu_stats_t bleu;
    memset(&chrf, 0, sizeof chrf);
    memset(&bleu, 0, sizeof bleu);
    size_t scored = 0;
    for (int i = 0; i < n_pairs && scored < limits[li]; i++) {
      char* hyp = NULL;
      int max_new = (int)(2 * strlen(src[i]) + 16);
      assert_int_equal(nb_translate_greedy(m, "fr", src[i], max_new > 64 ? 64 : max_new, &hyp),
                       NB_OK);
      nb_status_t st = nb_metrics_chrf_add(&chrf, hyp, ref[i]);
      if (st == NB_OK) st = nb_metrics_bleu_add(&bleu, hyp, ref[i]);
      nb_free(hyp);
      if (st == NB_OK) scored++;
    }
    nb_bleu_result_t br;
    nb_metrics_bleu_score(&bleu, NB_BLEU_SMOOTH_EXP, &br);
    printf("  limit %zu: %zu pairs, chrF %.4f BLEU %.4f\n", limits[li], s.sentences, s.chrf,
           s.bleu);
    assert_int_equal(s.sentences, scored);
    assert_true(s.chrf == nb_metrics_chrf_score(&chrf));
    assert_true(s.bleu == br.score);
  }
  nb_model_destroy(m);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sanitize),
      cmocka_unit_test(test_tag_and_prompt),
      cmocka_unit_test(test_greedy_deterministic),
      cmocka_unit_test(test_eval_tsv),
      cmocka_unit_test(test_eval_batches_equal_one_by_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
