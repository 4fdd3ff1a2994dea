/* Unit tests of train/metrics: chrF and BLEU on tiny cases computed by hand (the derivation is in
 * each comment), the 13a tokenizer on tricky punctuation, and bad input. The comparison with
 * sacreBLEU itself on real pairs is compare_sacrebleu.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "train/metrics.h"

static double chrf1(const char* hyp, const char* ref) {
  double s = -1.0;
  const char* h[1] = {hyp};
  const char* r[1] = {ref};
  assert_int_equal(nb_metrics_chrf_corpus(h, r, 1, &s), NB_OK);
  return s;
}

static nb_bleu_result_t bleu1(const char* hyp, const char* ref, nb_bleu_smooth_t sm) {
  nb_bleu_stats_t st;
  memset(&st, 0, sizeof(st));
  assert_int_equal(nb_metrics_bleu_add(&st, hyp, ref), NB_OK);
  nb_bleu_result_t r;
  nb_metrics_bleu_score(&st, sm, &r);
  return r;
}

static void test_chrf_identical_and_disjoint(void** state) {
  (void)state;
  assert_true(fabs(chrf1("The cat sat.", "The cat sat.") - 100.0) < 1e-9);
  assert_true(fabs(chrf1("abc", "xyz") - 0.0) < 1e-12);
  /* whitespace is removed before counting: "a b c" and "abc" are the same string */
  assert_true(fabs(chrf1("a b  c", "abc") - 100.0) < 1e-9);
  /* multi-byte code points are characters: 日本 vs 日本 */
  assert_true(fabs(chrf1("日本", "日本") - 100.0) < 1e-9);
  /* "ä" (U+00E4) and "a" are different characters */
  assert_true(fabs(chrf1("\xc3\xa4", "a")) < 1e-12);
}

/* hyp "ab", ref "abc".
 * n=1: hyp {a,b}=2, ref {a,b,c}=3, match 2 -> P=1, R=2/3.
 * n=2: hyp {ab}=1, ref {ab,bc}=2, match 1 -> P=1, R=1/2.
 * n>=3: the hypothesis has no n-grams, so the order is not effective.
 * avgP = 1, avgR = (2/3 + 1/2)/2 = 7/12; F2 = 5*P*R/(4P+R) = (35/12)/(55/12) = 7/11. */
static void test_chrf_hand_computed(void** state) {
  (void)state;
  double s = chrf1("ab", "abc");
  assert_true(fabs(s - 100.0 * 7.0 / 11.0) < 1e-9);
  /* statistics sum over the corpus before the F-score: two pairs "ab"/"abc" and "abc"/"abc".
   * n=1: hyp 5, ref 6, match 5; n=2: hyp 3, ref 4, match 3; n=3: hyp 1, ref 2, match 1; n>=4 none.
   * avgP = 1; avgR = (5/6 + 3/4 + 1/2)/3 = 25/36; F2 = 5*(25/36)/(4 + 25/36) = 125/169. */
  nb_chrf_stats_t st;
  memset(&st, 0, sizeof(st));
  assert_int_equal(nb_metrics_chrf_add(&st, "ab", "abc"), NB_OK);
  assert_int_equal(nb_metrics_chrf_add(&st, "abc", "abc"), NB_OK);
  assert_int_equal(st.hyp[0], 5);
  assert_int_equal(st.match[2], 1);
  assert_int_equal(st.ref[2], 2);
  assert_true(fabs(nb_metrics_chrf_score(&st) - 100.0 * 125.0 / 169.0) < 1e-9);
  /* repeated n-grams are clipped: hyp "aaa" vs ref "a": n=1 hyp 3, ref 1, match 1 -> P=1/3,
   * R=1; n>=2 ref has none. F2 = 5*(1/3)*1/(4/3 + 1) = (5/3)/(7/3) = 5/7. */
  assert_true(fabs(chrf1("aaa", "a") - 100.0 * 5.0 / 7.0) < 1e-9);
}

/* hyp "the cat sat on the mat", ref "the cat sat on a mat" (6 tokens each, bp = 1).
 * 1-grams 5/6 (the x2 clipped to 1), 2-grams 3/5, 3-grams 2/4, 4-grams 1/3.
 * BLEU = 100 * (5/6 * 3/5 * 1/2 * 1/3)^(1/4) = 100 * (1/12)^(1/4). */
static void test_bleu_hand_computed(void** state) {
  (void)state;
  nb_bleu_result_t r = bleu1("the cat sat on the mat", "the cat sat on a mat", NB_BLEU_SMOOTH_EXP);
  assert_true(fabs(r.bp - 1.0) < 1e-12);
  assert_true(fabs(r.precisions[0] - 100.0 * 5.0 / 6.0) < 1e-9);
  assert_true(fabs(r.precisions[3] - 100.0 / 3.0) < 1e-9);
  assert_true(fabs(r.score - 100.0 * pow(1.0 / 12.0, 0.25)) < 1e-9);
  r = bleu1("the cat sat on the mat", "the cat sat on the mat", NB_BLEU_SMOOTH_EXP);
  assert_true(fabs(r.score - 100.0) < 1e-9);
}

/* hyp "a b c d", ref "a b c e": precisions 3/4, 2/3, 1/2, 0/1.
 * exp: the zero becomes 100/(2*1) = 50 -> 100*(0.75 * 0.6667 * 0.5 * 0.5)^(1/4) = (12.5e6)^(1/4).
 * floor: 100*0.1/1 = 10 -> (2.5e6)^(1/4). none: the zero precision makes the score 0. */
static void test_bleu_smoothing(void** state) {
  (void)state;
  nb_bleu_result_t r = bleu1("a b c d", "a b c e", NB_BLEU_SMOOTH_EXP);
  assert_true(fabs(r.precisions[3] - 50.0) < 1e-9);
  assert_true(fabs(r.score - pow(12.5e6, 0.25)) < 1e-9);
  r = bleu1("a b c d", "a b c e", NB_BLEU_SMOOTH_FLOOR);
  assert_true(fabs(r.score - pow(2.5e6, 0.25)) < 1e-9);
  r = bleu1("a b c d", "a b c e", NB_BLEU_SMOOTH_NONE);
  assert_true(r.score < 1e-9);
}

/* hyp "the cat" (2 tokens), ref "the cat sat on the mat" (6): bp = exp(1 - 6/2) = e^-2; there are
 * no hypothesis 3-grams, so sacreBLEU stops there, leaving precisions 3 and 4 at 0: score 0. */
static void test_bleu_brevity(void** state) {
  (void)state;
  nb_bleu_result_t r = bleu1("the cat", "the cat sat on the mat", NB_BLEU_SMOOTH_EXP);
  assert_true(fabs(r.bp - exp(-2.0)) < 1e-12);
  assert_true(fabs(r.precisions[1] - 100.0) < 1e-9);
  assert_true(r.score < 1e-9);
  assert_int_equal(r.sys_len, 2);
  assert_int_equal(r.ref_len, 6);
  /* empty hypothesis: bp 0, score 0, no crash */
  r = bleu1("", "the cat", NB_BLEU_SMOOTH_EXP);
  assert_true(r.score == 0.0 && r.bp == 0.0);
  assert_true(fabs(chrf1("", "the cat")) < 1e-12);
}

static void tok_is(const char* in, const char* want) {
  char* out = NULL;
  assert_int_equal(nb_metrics_tokenize_13a(in, &out), NB_OK);
  assert_string_equal(out, want);
  nb_free(out);
}

/* Expected strings follow the 13a rules by hand: punctuation other than ' , - . is split off;
 * . and , are split unless between digits; '-' after a digit is split; entities decoded first. */
static void test_tokenize_13a(void** state) {
  (void)state;
  tok_is("Hello, world! It's 3.5 km-long (really).",
         "Hello , world ! It's 3.5 km-long ( really ) .");
  tok_is("a.. b,c 1,000 2-3 x-y &amp;lt; \"q\"  ", "a . . b , c 1,000 2 - 3 x-y < \" q \"");
  tok_is(
      "Gr\xc3\xb6\xc3\x9f"
      "e: 10%; \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x80\x82 end.\xc2\xa0 ",
      "Gr\xc3\xb6\xc3\x9f"
      "e : 10 % ; \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x80\x82 end .");
  tok_is("", "");
  tok_is("   ", "");
}

static void test_bad_input(void** state) {
  (void)state;
  nb_chrf_stats_t st;
  memset(&st, 0, sizeof(st));
  assert_int_equal(nb_metrics_chrf_add(&st, "ok", "\xff\xfe"), NB_ERR_INVALID);
  assert_int_equal(st.ref[0], 0);                                                   /* unchanged */
  assert_int_equal(nb_metrics_chrf_add(&st, "\xc3", "ok"), NB_ERR_INVALID);         /* truncated */
  assert_int_equal(nb_metrics_chrf_add(&st, "\xed\xa0\x80", "ok"), NB_ERR_INVALID); /* surrogate */
  assert_int_equal(nb_metrics_chrf_add(&st, "\xc0\xaf", "ok"), NB_ERR_INVALID);     /* overlong */
  assert_int_equal(nb_metrics_chrf_add(NULL, "a", "b"), NB_ERR_INVALID);
  nb_bleu_stats_t b;
  memset(&b, 0, sizeof(b));
  assert_int_equal(nb_metrics_bleu_add(&b, "ok", "\xe6\x97"), NB_ERR_INVALID);
  assert_int_equal(b.sys_len, 0);
  char* out = NULL;
  assert_int_equal(nb_metrics_tokenize_13a(NULL, &out), NB_ERR_INVALID);
  double s = 1.0;
  assert_int_equal(nb_metrics_chrf_corpus(NULL, NULL, 0, &s), NB_OK);
  assert_true(s == 0.0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chrf_identical_and_disjoint),
      cmocka_unit_test(test_chrf_hand_computed),
      cmocka_unit_test(test_bleu_hand_computed),
      cmocka_unit_test(test_bleu_smoothing),
      cmocka_unit_test(test_bleu_brevity),
      cmocka_unit_test(test_tokenize_13a),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
