/* `nebula bench decode`: greedy decoding speed with the K/V cache against the full-recompute
 * reference in the same run (alternating, medians), and whether both emit the same tokens; then
 * B prompts decoded as one batch against the same B decoded one after another. A fresh model and
 * random prompts: a speed measurement, not a quality one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "train/model.h"
#include "train/model_internal.h"
#include "train/rng.h"

#define NB__DECODE_USAGE                                                                   \
  "usage: nebula bench decode [--layers L] [--dim D] [--heads H] [--ctx T] [--prompt P]\n" \
  "                           [--new N] [--batch B] [--reps R] [--json]\n"                 \
  "  defaults: 4 layers, width 256, heads D/64, context 128, prompt 48 tokens, 80 new\n"   \
  "  tokens (no stop token), batch 8, 3 timed repetitions of each path"

int nb_bench_decode_main(int argc, char** argv) {
  int L = 4, D = 256, H = 0, T = 128, P = 48, N = 80, NB = 8, reps = 3, json = 0;
  const nb_bench_int_flag_t flags[] = {{"--layers", &L}, {"--dim", &D},    {"--heads", &H},
                                       {"--ctx", &T},    {"--prompt", &P}, {"--new", &N},
                                       {"--batch", &NB}, {"--reps", &reps}};
  int parsed = nb_bench_parse_int_flags("nebula bench decode", NB__DECODE_USAGE, argc, argv, flags,
                                        8, &json);
  if (parsed != NB_OPTS_RUN) return parsed;
  if (H == 0) H = D >= 64 ? D / 64 : 1;
  if (reps > 15) reps = 15;
  if (NB > 64) NB = 64;
  nb_model_config_t cfg = nb_model_config_make(L, D, H, T);
  nb_model_t* m = NULL;
  int *prompt = NULL, *a = NULL, *b = NULL, *bp = NULL, *bo = NULL, *bn = NULL, *bl = NULL;
  int *bmax = NULL, **bps = NULL, **bos = NULL;
  int rc = 1;
  if (nb_model_create(&cfg, 1, &m) != NB_OK || NB_ALLOC(prompt, (size_t)P, "prompt") != NB_OK ||
      NB_ALLOC(a, (size_t)N, "tokens") != NB_OK || NB_ALLOC(b, (size_t)N, "tokens") != NB_OK ||
      NB_ALLOC(bp, (size_t)NB * P, "prompts") != NB_OK ||
      NB_ALLOC(bo, (size_t)NB * N, "outputs") != NB_OK || NB_ALLOC(bn, NB, "counts") != NB_OK ||
      NB_ALLOC(bl, NB, "lengths") != NB_OK || NB_ALLOC(bmax, NB, "limits") != NB_OK ||
      NB_ALLOC(bps, NB, "prompt table") != NB_OK || NB_ALLOC(bos, NB, "output table") != NB_OK) {
    fprintf(stderr, "nebula bench decode: %s\n", nb_error_last());
    goto done;
  }
  nb_rng_t r;
  nb_rng_seed(&r, 7);
  for (int i = 0; i < P; i++) prompt[i] = (int)nb_rng_below(&r, 256);
  prompt[P - 1] = NB_TOKEN_SEP;
  for (int k = 0; k < NB; k++) {
    for (int i = 0; i < P; i++) bp[k * P + i] = (int)nb_rng_below(&r, 256);
    bp[k * P + P - 1] = NB_TOKEN_SEP;
    bps[k] = bp + (size_t)k * P;
    bos[k] = bo + (size_t)k * N;
    bl[k] = P;
    bmax[k] = N;
  }
  /* the two paths alternate so both see the same machine load; round -1 warms up */
  double tc[16], tf[16];
  int na = 0, nf = 0, same = 1;
  for (int k = -1; k < reps; k++) {
    double t0 = nb_now_s();
    if (nb__model_generate(m, prompt, P, N, -1, 1, a, &na, NULL) != NB_OK) goto fail;
    double t1 = nb_now_s();
    if (nb__model_generate(m, prompt, P, N, -1, 0, b, &nf, NULL) != NB_OK) goto fail;
    double t2 = nb_now_s();
    same &= na == nf && memcmp(a, b, sizeof(int) * (size_t)na) == 0;
    if (k >= 0) {
      tc[k] = t1 - t0;
      tf[k] = t2 - t1;
    }
  }
  /* B prompts: one batch vs one after another (both cached), alternating */
  double tb[16], ts[16];
  for (int k = -1; k < reps; k++) {
    double t0 = nb_now_s();
    if (nb_model_generate_greedy_batch(m, NB, (const int* const*)bps, bl, bmax, -1, bos, bn) !=
        NB_OK)
      goto fail;
    double t1 = nb_now_s();
    for (int q = 0; q < NB; q++) {
      if (nb_model_generate_greedy(m, bps[q], P, N, -1, b, &nf) != NB_OK) goto fail;
      same &= nf == bn[q] && memcmp(b, bos[q], sizeof(int) * (size_t)nf) == 0;
    }
    double t2 = nb_now_s();
    if (k >= 0) {
      tb[k] = t1 - t0;
      ts[k] = t2 - t1;
    }
  }
  double batch_tps = (double)NB * N / nb_bench_median(tb, (size_t)reps);
  double seq_tps = (double)NB * N / nb_bench_median(ts, (size_t)reps);
  double cached_s = nb_bench_median(tc, (size_t)reps), full_s = nb_bench_median(tf, (size_t)reps);
  double cached_tps = na / cached_s, full_tps = nf / full_s;
  double speedup = cached_tps / full_tps;
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_str(&j, "bench", "decode");
    nb_json_int(&j, "layers", L);
    nb_json_int(&j, "dim", D);
    nb_json_int(&j, "heads", H);
    nb_json_int(&j, "ctx", T);
    nb_json_int(&j, "prompt", P);
    nb_json_int(&j, "new_tokens", na);
    nb_json_num(&j, "cached_s", cached_s);
    nb_json_num(&j, "full_s", full_s);
    nb_json_num(&j, "cached_tokens_per_s", cached_tps);
    nb_json_num(&j, "full_tokens_per_s", full_tps);
    nb_json_num(&j, "speedup", speedup);
    nb_json_int(&j, "batch", NB);
    nb_json_num(&j, "batch_tokens_per_s", batch_tps);
    nb_json_num(&j, "sequential_tokens_per_s", seq_tps);
    nb_json_num(&j, "batch_speedup", batch_tps / seq_tps);
    nb_json_int(&j, "same_tokens", same);
    nb_json_end(&j);
  } else {
    printf("greedy decode: %d layers, width %d, %d heads, context %d, prompt %d, %d new tokens\n",
           L, D, H, T, P, na);
    printf("  K/V cache     %8.1f ms  %8.1f tokens/s\n", cached_s * 1e3, cached_tps);
    printf("  full recompute %7.1f ms  %8.1f tokens/s (same run)\n", full_s * 1e3, full_tps);
    printf("  speedup %.1fx\n", speedup);
    printf(
        "  %d prompts: batched %.1f tokens/s, one after another %.1f tokens/s (both cached), "
        "%.2fx\n",
        NB, batch_tps, seq_tps, batch_tps / seq_tps);
    printf("  tokens %s\n", same ? "identical" : "DIFFER");
  }
  rc = same ? 0 : 1;
  goto done;
fail:
  fprintf(stderr, "nebula bench decode: %s\n", nb_error_last());
done:
  nb_free(prompt);
  nb_free(a);
  nb_free(b);
  nb_free(bp);
  nb_free(bo);
  nb_free(bn);
  nb_free(bl);
  nb_free(bmax);
  nb_free(bps);
  nb_free(bos);
  nb_model_destroy(m);
  return rc;
}
