/* `nebula bench train`: training-step throughput of the CPU transformer (forward, backward,
 * AdamW) against a square cblas_sgemm measured in the same run, so the ratio says how close the
 * whole step gets to the machine's matrix-multiply rate. Not a convergence benchmark. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/rng.h"

#define NB__TRAIN_USAGE                                                                  \
  "usage: nebula bench train [--layers L] [--dim D] [--heads H] [--ctx T] [--batch B]\n" \
  "                          [--steps N] [--json]\n"                                     \
  "  defaults: 4 layers, width 256, heads D/64, context 256, batch 4, 5 timed steps"

/* Seconds for one n x n x n sgemm on a, b -> c. */
static double nb__sgemm_once(int n, const float* a, const float* b, float* c) {
  double t0 = nb_now_s();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  return nb_now_s() - t0;
}

int nb_bench_train_main(int argc, char** argv) {
  int L = 4, D = 256, H = 0, T = 256, B = 4, steps = 5, json = 0;
  const nb_bench_int_flag_t flags[] = {{"--layers", &L}, {"--dim", &D},   {"--heads", &H},
                                       {"--ctx", &T},    {"--batch", &B}, {"--steps", &steps}};
  int parsed =
      nb_bench_parse_int_flags("nebula bench train", NB__TRAIN_USAGE, argc, argv, flags, 6, &json);
  if (parsed != NB_OPTS_RUN) return parsed;
  if (H == 0) H = D >= 64 ? D / 64 : 1;
  if (steps > 15) steps = 15;
  nb_model_config_t cfg = nb_model_config_make(L, D, H, T);
  nb_model_t* m = NULL;
  nb_adamw_t* opt = NULL;
  int *tok = NULL, *tgt = NULL;
  float *sa = NULL, *sb = NULL, *sc = NULL;
  int sn = 4 * D < 256 ? 256 : (4 * D > 2048 ? 2048 : 4 * D);
  size_t snn = (size_t)sn * sn;
  int rc = 1;
  if (nb_model_create(&cfg, 1, &m) != NB_OK) {
    fprintf(stderr, "nebula bench train: %s\n", nb_error_last());
    return 2;
  }
  size_t n;
  float* p = nb_model_params(m, &n);
  nb_adamw_config_t oc = nb_adamw_config_default();
  if (nb_adamw_create(&oc, n, &opt) != NB_OK || NB_ALLOC(tok, (size_t)B * T, "tokens") != NB_OK ||
      NB_ALLOC(tgt, (size_t)B * T, "targets") != NB_OK ||
      nb_aligned_alloc((void**)&sa, snn, sizeof(float), "sgemm a") != NB_OK ||
      nb_aligned_alloc((void**)&sb, snn, sizeof(float), "sgemm b") != NB_OK ||
      nb_aligned_alloc((void**)&sc, snn, sizeof(float), "sgemm c") != NB_OK) {
    fprintf(stderr, "nebula bench train: %s\n", nb_error_last());
    goto done;
  }
  nb_rng_t r;
  nb_rng_seed(&r, 7);
  for (int i = 0; i < B * T; i++) {
    tok[i] = (int)nb_rng_below(&r, 256);
    tgt[i] = (int)nb_rng_below(&r, 256);
  }
  for (size_t i = 0; i < snn; i++) {
    sa[i] = (float)nb_rng_uniform(&r) - 0.5f;
    sb[i] = (float)nb_rng_uniform(&r) - 0.5f;
    sc[i] = 0.0f;
  }
  /* training steps and sgemm calls alternate, so both see the same machine load */
  double t[16], fwd[16], ts[16];
  for (int k = -1; k < steps; k++) { /* round -1 warms up (first touch of every buffer) */
    double tsg = nb__sgemm_once(sn, sa, sb, sc);
    double t0 = nb_now_s();
    float loss;
    if (nb_model_forward(m, tok, tgt, B, T, &loss) != NB_OK) goto fail;
    double t1 = nb_now_s();
    nb_model_zero_grad(m);
    if (nb_model_backward(m) != NB_OK ||
        nb_adamw_step(opt, p, nb_model_grads(m, NULL), nb_model_decay_mask(m), NULL) != NB_OK)
      goto fail;
    if (k >= 0) {
      t[k] = nb_now_s() - t0;
      fwd[k] = t1 - t0;
      ts[k] = tsg;
    }
  }
  double step_s = nb_bench_median(t, (size_t)steps), fwd_s = nb_bench_median(fwd, (size_t)steps);
  double tokens_per_s = (double)B * T / step_s;
  double model_gflops = nb_model_flops_per_token(m, T) * tokens_per_s / 1e9;
  double sgemm = 2.0 * sn * (double)sn * sn / nb_bench_median(ts, (size_t)steps) / 1e9;
  double ratio = sgemm > 0 ? model_gflops / sgemm : 0.0;
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_str(&j, "bench", "train");
    nb_json_int(&j, "layers", L);
    nb_json_int(&j, "dim", D);
    nb_json_int(&j, "heads", H);
    nb_json_int(&j, "ctx", T);
    nb_json_int(&j, "batch", B);
    nb_json_int(&j, "params", (long long)n);
    nb_json_num(&j, "step_s", step_s);
    nb_json_num(&j, "forward_s", fwd_s);
    nb_json_num(&j, "tokens_per_s", tokens_per_s);
    nb_json_num(&j, "model_gflops", model_gflops);
    nb_json_int(&j, "sgemm_n", sn);
    nb_json_num(&j, "sgemm_gflops", sgemm);
    nb_json_num(&j, "vs_sgemm", ratio);
    nb_json_end(&j);
  } else {
    printf("train step: %d layers, width %d, %d heads, context %d, batch %d, %zu parameters\n", L,
           D, H, T, B, n);
    printf("  step %.1f ms (forward %.1f ms), %.0f tokens/s\n", step_s * 1e3, fwd_s * 1e3,
           tokens_per_s);
    printf("  model %.2f GFLOP/s (6*params + attention per token)\n", model_gflops);
    printf("  sgemm %dx%dx%d %.2f GFLOP/s (same run)\n", sn, sn, sn, sgemm);
    printf("  vs_sgemm %.2f\n", ratio);
  }
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "nebula bench train: %s\n", nb_error_last());
done:
  nb_free(tok);
  nb_free(tgt);
  nb_free(sa);
  nb_free(sb);
  nb_free(sc);
  nb_adamw_destroy(opt);
  nb_model_destroy(m);
  return rc;
}
