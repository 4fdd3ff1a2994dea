/* Greedy decoding with the K/V cache against the full-recompute reference: same tokens, logits
 * within 1e-4 of the row's largest magnitude, over several sizes, seeds and prompt lengths (up to
 * and past the context), with LoRA adapters unmerged and merged; batched decoding gives each
 * sequence's reference tokens. Not a speed test (see `nebula bench decode`). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "train/lora.h"
#include "train/model.h"
#include "train/model_internal.h"
#include "train/rng.h"

/* A fresh model's logits are nearly flat and greedy decoding repeats one byte; scaling the
 * weights makes the distributions peaked so the decoded sequences vary. */
static nb_model_t* make_model(int L, int C, int NH, int ctx, uint64_t seed, float gain) {
  nb_model_config_t cfg = nb_model_config_make(L, C, NH, ctx);
  nb_model_t* m = NULL;
  assert_int_equal(nb_model_create(&cfg, seed, &m), NB_OK);
  size_t n;
  float* p = nb_model_params(m, &n);
  for (size_t i = 0; i < n; i++) p[i] *= gain;
  return m;
}

static void random_prompt(uint64_t seed, int n, int* out) {
  nb_rng_t r;
  nb_rng_seed(&r, seed);
  for (int i = 0; i < n; i++) out[i] = (int)nb_rng_below(&r, 256);
  out[n - 1] = NB_TOKEN_SEP;
}

typedef struct {
  double worst_rel; /* largest |cached - reference| / max |reference row| */
  int tokens;       /* tokens compared */
  int distinct;     /* distinct token values seen */
} cmp_stats_t;

/* Decodes prompt with both paths and asserts the same tokens and close logits. */
static void compare_paths(nb_model_t* m, const int* prompt, int n_prompt, int max_new, int stop,
                          cmp_stats_t* s) {
  int* a = malloc(sizeof(int) * (size_t)(max_new + 1));
  int* b = malloc(sizeof(int) * (size_t)(max_new + 1));
  float* la = malloc(sizeof(float) * (size_t)(max_new + 1) * NB_VOCAB);
  float* lb = malloc(sizeof(float) * (size_t)(max_new + 1) * NB_VOCAB);
  int na = -1, nb = -1;
  assert_int_equal(nb__model_generate(m, prompt, n_prompt, max_new, stop, 1, a, &na, la), NB_OK);
  assert_int_equal(nb__model_generate(m, prompt, n_prompt, max_new, stop, 0, b, &nb, lb), NB_OK);
  assert_int_equal(na, nb);
  assert_memory_equal(a, b, sizeof(int) * (size_t)na);
  static int seen[NB_VOCAB];
  for (int k = 0; k < na; k++) {
    const float *ra = la + (size_t)k * NB_VOCAB, *rb = lb + (size_t)k * NB_VOCAB;
    double mx = 0, diff = 0;
    for (int j = 0; j < NB_VOCAB; j++) {
      if (fabs(rb[j]) > mx) mx = fabs(rb[j]);
      if (fabs(ra[j] - rb[j]) > diff) diff = fabs(ra[j] - rb[j]);
    }
    double rel = diff / (mx > 0 ? mx : 1);
    if (rel > 1e-4)
      fail_msg("prompt length %d, token %d: logits differ by %.3e of the row's max %.3e", n_prompt,
               k, diff, mx);
    if (rel > s->worst_rel) s->worst_rel = rel;
    if (!seen[a[k]]++) s->distinct++;
  }
  s->tokens += na;
  /* the public entry point is the cached path */
  int n_pub = -1;
  assert_int_equal(nb_model_generate_greedy(m, prompt, n_prompt, max_new, stop, b, &n_pub), NB_OK);
  assert_int_equal(n_pub, na);
  assert_memory_equal(a, b, sizeof(int) * (size_t)na);
  free(a), free(b), free(la), free(lb);
}

/* Prompts of length 1, short, near and at the context, and longer than it; max_new runs past
 * ctx so the sliding window is exercised after the cache. */
static void sweep(nb_model_t* m, uint64_t seed, cmp_stats_t* s) {
  int ctx = nb_model_get_config(m)->ctx;
  int lens[] = {1, 2, 5, ctx / 2, ctx - 2, ctx - 1, ctx, ctx + 3};
  int* prompt = malloc(sizeof(int) * (size_t)(ctx + 3));
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    random_prompt(seed * 100 + i, lens[i], prompt);
    compare_paths(m, prompt, lens[i], ctx + 4, -1, s);
  }
  free(prompt);
}

static void test_cached_equals_reference(void** state) {
  (void)state;
  struct {
    int L, C, NH, ctx;
  } sizes[] = {{1, 16, 2, 8}, {2, 32, 4, 24}, {3, 64, 4, 40}};
  cmp_stats_t s = {0};
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
    for (uint64_t seed = 1; seed <= 3; seed++) {
      nb_model_t* m = make_model(sizes[z].L, sizes[z].C, sizes[z].NH, sizes[z].ctx, seed, 3.0f);
      sweep(m, seed, &s);
      nb_model_destroy(m);
    }
  printf("  %d tokens equal, %d distinct values, worst logit diff %.2e of the row max\n", s.tokens,
         s.distinct, s.worst_rel);
  assert_true(s.distinct >= 20); /* the sequences are not one repeated byte */
}

static void test_cached_lora(void** state) {
  (void)state;
  nb_model_t* m = make_model(2, 32, 4, 24, 7, 3.0f);
  nb_lora_config_t lc = {4, 8.0f,
                         (1u << NB_SITE_QKV) | (1u << NB_SITE_ATTN_PROJ) | (1u << NB_SITE_FC) |
                             (1u << NB_SITE_FC_PROJ)};
  nb_lora_t* lo;
  assert_int_equal(nb_lora_create(m, &lc, 5, &lo), NB_OK);
  size_t ln;
  float* lp = nb_lora_params(lo, &ln);
  nb_rng_t r;
  nb_rng_seed(&r, 77);
  for (size_t i = 0; i < ln; i++) lp[i] = (float)(0.1 * nb_rng_normal(&r)); /* B != 0 */

  int prompt[20], ctx = 24, unmerged[40], merged[40], base[40], n1, n2, n3;
  random_prompt(9, 12, prompt);
  cmp_stats_t s = {0};
  sweep(m, 11, &s); /* adapters unmerged: the one-position path applies them too */
  assert_int_equal(nb_model_generate_greedy(m, prompt, 12, ctx, -1, unmerged, &n1), NB_OK);

  /* the adapters change the output: the same base without them decodes otherwise */
  nb_model_t* plain = make_model(2, 32, 4, 24, 7, 3.0f);
  assert_int_equal(nb_model_generate_greedy(plain, prompt, 12, ctx, -1, base, &n3), NB_OK);
  assert_memory_not_equal(unmerged, base, sizeof(int) * (size_t)n1);
  nb_model_destroy(plain);

  assert_int_equal(nb_lora_merge(lo), NB_OK);
  sweep(m, 12, &s); /* merged */
  assert_int_equal(nb_model_generate_greedy(m, prompt, 12, ctx, -1, merged, &n2), NB_OK);
  assert_int_equal(n1, n2);
  assert_memory_equal(unmerged, merged, sizeof(int) * (size_t)n1);
  printf("  LoRA: %d tokens equal, worst logit diff %.2e of the row max\n", s.tokens, s.worst_rel);
  nb_lora_destroy(lo);
  nb_model_destroy(m);
}

static void test_cache_state_and_errors(void** state) {
  (void)state;
  nb_model_t* m = make_model(2, 32, 4, 16, 3, 3.0f);
  int pa[6], pb[10], a1[20], a2[20], b1[20], n = 0, n2 = 0;
  random_prompt(1, 6, pa);
  random_prompt(2, 10, pb);
  /* a call leaves no state behind: A, B, A gives A twice */
  assert_int_equal(nb_model_generate_greedy(m, pa, 6, 20, -1, a1, &n), NB_OK);
  assert_int_equal(nb_model_generate_greedy(m, pb, 10, 20, -1, b1, &n2), NB_OK);
  assert_int_equal(nb_model_generate_greedy(m, pa, 6, 20, -1, a2, &n2), NB_OK);
  assert_int_equal(n, 20);
  assert_memory_equal(a1, a2, sizeof a1);
  /* stop token: stops right after emitting it */
  assert_int_equal(nb_model_generate_greedy(m, pa, 6, 20, a1[3], a2, &n2), NB_OK);
  int first = 0;
  while (a1[first] != a1[3]) first++;
  assert_int_equal(n2, first + 1);
  cmp_stats_t s = {0};
  compare_paths(m, pa, 6, 20, a1[3], &s);
  /* max_new 0, bad prompt tokens, bad sizes */
  assert_int_equal(nb_model_generate_greedy(m, pa, 6, 0, -1, a2, &n2), NB_OK);
  assert_int_equal(n2, 0);
  int bad[3] = {1, NB_VOCAB, 2};
  assert_int_equal(nb_model_generate_greedy(m, bad, 3, 4, -1, a2, &n2), NB_ERR_INVALID);
  assert_int_equal(nb__model_generate(m, bad, 3, 4, -1, 0, a2, &n2, NULL), NB_ERR_INVALID);
  bad[1] = -1;
  assert_int_equal(nb_model_generate_greedy(m, bad, 3, 4, -1, a2, &n2), NB_ERR_INVALID);
  assert_int_equal(nb_model_generate_greedy(m, pa, 0, 4, -1, a2, &n2), NB_ERR_INVALID);
  assert_int_equal(nb_model_generate_greedy(m, pa, 6, -1, -1, a2, &n2), NB_ERR_INVALID);
  /* after an error the model still decodes the same */
  assert_int_equal(nb_model_generate_greedy(m, pa, 6, 20, -1, a2, &n2), NB_OK);
  assert_memory_equal(a1, a2, sizeof a1);
  nb_model_destroy(m);
}

/* B sequences of different prompt lengths (1 to past ctx) and limits, decoded together, give
 * each one's reference tokens; with a stop token, and with LoRA adapters attached. */
static void check_batch(nb_model_t* m, int B, int stop, uint64_t seed) {
  int ctx = nb_model_get_config(m)->ctx;
  int lens[8] = {1, ctx, 7, ctx + 2, ctx / 2, 3, ctx - 1, 12};
  int limits[8] = {ctx + 3, 5, 0, 9, ctx, 1, ctx + 1, 20};
  int *prompts[8], *outs[8], n_prompt[8], max_new[8], n_out[8];
  int ref[128], n_ref;
  for (int b = 0; b < B; b++) {
    n_prompt[b] = lens[b % 8];
    max_new[b] = limits[b % 8];
    prompts[b] = malloc(sizeof(int) * (size_t)n_prompt[b]);
    outs[b] = malloc(sizeof(int) * (size_t)(max_new[b] + 1));
    random_prompt(seed + (uint64_t)b, n_prompt[b], prompts[b]);
  }
  assert_int_equal(nb_model_generate_greedy_batch(m, B, (const int* const*)prompts, n_prompt,
                                                  max_new, stop, outs, n_out),
                   NB_OK);
  for (int b = 0; b < B; b++) {
    assert_int_equal(
        nb__model_generate(m, prompts[b], n_prompt[b], max_new[b], stop, 0, ref, &n_ref, NULL),
        NB_OK);
    assert_int_equal(n_out[b], n_ref);
    assert_memory_equal(outs[b], ref, sizeof(int) * (size_t)n_ref);
    free(prompts[b]), free(outs[b]);
  }
}

static void test_batch(void** state) {
  (void)state;
  nb_model_t* m = make_model(2, 32, 4, 24, 21, 3.0f);
  check_batch(m, 8, -1, 100);
  check_batch(m, 3, -1, 200); /* fewer sequences than the caches hold */
  check_batch(m, 1, -1, 300);
  int probe[4], n = 0, p0[2] = {'a', NB_TOKEN_SEP};
  assert_int_equal(nb_model_generate_greedy(m, p0, 2, 4, -1, probe, &n), NB_OK);
  check_batch(m, 8, probe[1], 100); /* a stop token some sequences emit */
  nb_lora_config_t lc = {2, 4.0f, (1u << NB_SITE_QKV) | (1u << NB_SITE_FC_PROJ)};
  nb_lora_t* lo;
  assert_int_equal(nb_lora_create(m, &lc, 5, &lo), NB_OK);
  size_t ln;
  float* lp = nb_lora_params(lo, &ln);
  nb_rng_t r;
  nb_rng_seed(&r, 78);
  for (size_t i = 0; i < ln; i++) lp[i] = (float)(0.1 * nb_rng_normal(&r));
  check_batch(m, 8, -1, 400);
  /* validation names the sequence */
  int good[3] = {1, 2, 3}, bad[3] = {1, -4, 3}, o1[4], o2[4], *outs[2] = {o1, o2}, nb[2];
  const int* prompts[2] = {good, bad};
  int np[2] = {3, 3}, mx[2] = {4, 4};
  assert_int_equal(nb_model_generate_greedy_batch(m, 2, prompts, np, mx, -1, outs, nb),
                   NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "sequence 1"));
  np[1] = 0;
  prompts[1] = good;
  assert_int_equal(nb_model_generate_greedy_batch(m, 2, prompts, np, mx, -1, outs, nb),
                   NB_ERR_INVALID);
  assert_int_equal(nb_model_generate_greedy_batch(m, 0, prompts, np, mx, -1, outs, nb),
                   NB_ERR_INVALID);
  nb_lora_destroy(lo);
  nb_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cached_equals_reference),
      cmocka_unit_test(test_cached_lora),
      cmocka_unit_test(test_cache_state_and_errors),
      cmocka_unit_test(test_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
