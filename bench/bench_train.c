/* `nebula bench train`: training-step throughput of the CPU transformer (forward, backward,
 * AdamW) against the best square cblas_sgemm rate of this machine (each OpenBLAS core type it can
 * run, measured in a child process in the same run) and against PyTorch training the same model
 * with the same threads (bench/torch_train.py, when torch is importable). Not a convergence
 * benchmark. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "kernels/blas.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/parallel.h"
#include "train/rng.h"

#ifndef NB_BENCH_TORCH_SCRIPT
#define NB_BENCH_TORCH_SCRIPT "bench/torch_train.py"
#endif
#define NB__BEST_SGEMM_N 1024

#define NB__TRAIN_USAGE                                                                    \
  "usage: nebula bench train [--layers L] [--dim D] [--heads H] [--ctx T] [--batch B]\n"   \
  "                          [--steps N] [--torch SCRIPT|none] [--json]\n"                 \
  "  defaults: 4 layers, width 256, heads D/64, context 256, batch 4, 5 timed steps;\n"    \
  "  threads: NB_TRAIN_THREADS, the step's one thread count (its pool runs the products\n" \
  "  too); PyTorch and the best-sgemm reference run with as many"

/* PyTorch training the same model in a child (bench/torch_train.py --serve), one step on
 * request, so that its steps alternate with ours and both see the same machine load. */
typedef struct {
  pid_t pid;       /* 0: none */
  FILE *in, *out;  /* its stdin and stdout */
  const char* why; /* why there is no figure (set when pid is 0 or a step failed) */
  char* line;      /* getline's buffer */
  double sgemm;    /* PyTorch's own n = 1024 sgemm GFLOP/s, from its ready line */
  size_t line_cap;
} nb__torch_t;

/* Waits for the child and says why it failed from its exit status. */
static void nb__torch_stop(nb__torch_t* t) {
  if (t->in) fclose(t->in); /* the script's stdin ends: it exits */
  t->in = NULL;
  if (t->out) {
    while (getline(&t->line, &t->line_cap, t->out) > 0) {
    }
    fclose(t->out);
  }
  t->out = NULL;
  if (t->pid > 0) {
    int status = 0;
    while (waitpid(t->pid, &status, 0) < 0 && errno == EINTR) {
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (!t->why && rc != 0)
      t->why = rc == 4     ? "PyTorch is not importable"
               : rc == 3   ? "the PyTorch model's parameter count differs from nebula's"
               : rc == 127 ? "python3 not found"
                           : "bench/torch_train.py failed";
  }
  t->pid = 0;
  free(t->line);
  t->line = NULL;
}

/* One line of the child's JSON; NULL (and the child stopped) at its end or on junk. */
static json_t* nb__torch_read(nb__torch_t* t) {
  json_t* o = NULL;
  if (getline(&t->line, &t->line_cap, t->out) > 0) o = json_loads(t->line, 0, NULL);
  if (!o) {
    nb__torch_stop(t);
    if (!t->why) t->why = "bench/torch_train.py stopped answering";
  }
  return o;
}

static void nb__torch_start(nb__torch_t* t, const char* script, int L, int D, int H, int T, int B,
                            int threads, size_t params) {
  memset(t, 0, sizeof *t);
  if (access(script, R_OK) != 0) {
    t->why = "bench/torch_train.py not found (--torch SCRIPT)";
    return;
  }
  char a[7][24];
  snprintf(a[0], sizeof a[0], "%d", L);
  snprintf(a[1], sizeof a[1], "%d", D);
  snprintf(a[2], sizeof a[2], "%d", H);
  snprintf(a[3], sizeof a[3], "%d", T);
  snprintf(a[4], sizeof a[4], "%d", B);
  snprintf(a[5], sizeof a[5], "%d", threads);
  snprintf(a[6], sizeof a[6], "%zu", params);
  int in[2], out[2];
  if (pipe(in) != 0) {
    t->why = "pipe failed";
    return;
  }
  if (pipe(out) != 0) {
    close(in[0]);
    close(in[1]);
    t->why = "pipe failed";
    return;
  }
  signal(SIGPIPE, SIG_IGN); /* a child that died makes our write fail, not kill us */
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    setenv("OMP_NUM_THREADS", a[5], 1);
    const char* av[] = {"python3",   script, "--layers",  a[0], "--width", a[1],
                        "--heads",   a[2],   "--context", a[3], "--batch", a[4],
                        "--threads", a[5],   "--params",  a[6], "--serve", NULL};
    execvp("python3", (char* const*)av);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  if (pid < 0) {
    close(in[1]);
    close(out[0]);
    t->why = "fork failed";
    return;
  }
  t->pid = pid;
  t->in = fdopen(in[1], "w");
  t->out = fdopen(out[0], "r");
  if (!t->in || !t->out) {
    if (!t->in) close(in[1]);
    if (!t->out) close(out[0]);
    t->why = "fdopen failed";
    nb__torch_stop(t);
    return;
  }
  json_t* ready = nb__torch_read(t); /* after its import and warm-up steps */
  t->sgemm = ready ? json_number_value(json_object_get(ready, "sgemm_gflops")) : 0.0;
  if (ready && !json_is_true(json_object_get(ready, "ready"))) {
    t->why = "bench/torch_train.py did not say ready";
    nb__torch_stop(t);
  }
  json_decref(ready);
}

/* Seconds of one PyTorch step; 0 when there is no child (any more). */
static double nb__torch_step(nb__torch_t* t) {
  if (!t->pid) return 0.0;
  if (fputs("1\n", t->in) < 0 || fflush(t->in) != 0) {
    t->why = "bench/torch_train.py stopped answering";
    nb__torch_stop(t);
    return 0.0;
  }
  json_t* o = nb__torch_read(t);
  double s = o ? json_number_value(json_array_get(json_object_get(o, "step_s"), 0)) : 0.0;
  json_decref(o);
  return s;
}

/* A pause before each timed piece. The three contenders share the machine's cores in turn, and
 * each leaves threads busy-waiting after its work: OpenBLAS's for about 2^28 cycles (its
 * THREAD_TIMEOUT), PyTorch's OpenMP threads for their spin count. Timed right after another's,
 * a piece shared the cores with them (measured on a 2-core Xeon: our step 4-5 % slower, the
 * n = 1024 sgemm at 180 GFLOP/s against 300 in a process of its own). */
static void nb__quiet(void) {
  struct timespec d = {0, 150 * 1000 * 1000};
  while (nanosleep(&d, &d) != 0 && errno == EINTR) {
  }
}

/* Seconds for one n x n x n sgemm on a, b -> c. */
static double nb__sgemm_once(int n, const float* a, const float* b, float* c) {
  double t0 = nb_now_s();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  return nb_now_s() - t0;
}

/* What one run measured, for nb__train_report. */
typedef struct {
  int L, D, H, T, B, sn, threads;
  size_t params;
  double step_s, fwd_s, tokens_per_s, model_gflops, sgemm, ratio, best_sgemm, mfu, torch_tps,
      vs_torch, torch_sgemm;
  const char *best_core, *why; /* why: of a missing vs_torch */
  const nb_blas_info_t* bi;
} nb__train_result_t;

/* Prints the run as one JSON object (cands, the sgemm candidates, stolen) or as text. */
static void nb__train_report(const nb__train_result_t* r, json_t* cands, int json) {
  if (!json) {
    json_decref(cands);
    printf("train step: %d layers, width %d, %d heads, context %d, batch %d, %zu parameters\n",
           r->L, r->D, r->H, r->T, r->B, r->params);
    printf("  step %.1f ms (forward %.1f ms), %.0f tokens/s\n", r->step_s * 1e3, r->fwd_s * 1e3,
           r->tokens_per_s);
    printf("  model %.2f GFLOP/s (6*params + attention per token)\n", r->model_gflops);
    printf("  sgemm %dx%dx%d %.2f GFLOP/s (same run)\n", r->sn, r->sn, r->sn, r->sgemm);
    printf("  vs_sgemm %.2f\n", r->ratio);
    printf("  OpenBLAS kernel %s, %d threads; best sgemm %d: %.1f GFLOP/s (%s)\n",
           r->bi->core[0] ? r->bi->core : "?", r->threads, NB__BEST_SGEMM_N, r->best_sgemm,
           r->best_core[0] ? r->best_core : "none ran");
    printf("  mfu_vs_best_sgemm %.2f\n", r->mfu);
    if (r->torch_tps > 0)
      printf("  torch %.0f tokens/s, vs_torch %.2f (torch's own sgemm %d: %.1f GFLOP/s)\n",
             r->torch_tps, r->vs_torch, NB__BEST_SGEMM_N, r->torch_sgemm);
    else
      printf("  vs_torch: none (%s)\n", r->why);
    return;
  }
  nb_json_obj_t j;
  nb_json_begin(&j, stdout);
  nb_json_str(&j, "bench", "train");
  nb_json_int(&j, "layers", r->L);
  nb_json_int(&j, "dim", r->D);
  nb_json_int(&j, "heads", r->H);
  nb_json_int(&j, "ctx", r->T);
  nb_json_int(&j, "batch", r->B);
  nb_json_int(&j, "params", (long long)r->params);
  nb_json_num(&j, "step_s", r->step_s);
  nb_json_num(&j, "forward_s", r->fwd_s);
  nb_json_num(&j, "tokens_per_s", r->tokens_per_s);
  nb_json_num(&j, "model_gflops", r->model_gflops);
  nb_json_int(&j, "sgemm_n", r->sn);
  nb_json_num(&j, "sgemm_gflops", r->sgemm);
  nb_json_num(&j, "vs_sgemm", r->ratio);
  nb_json_int(&j, "threads", r->threads);
  nb_json_int(&j, "pool_threads", nb_parallel_threads());
  nb_json_str(&j, "blas_core", r->bi->core);
  nb_json_int(&j, "blas_generic", r->bi->generic);
  nb_json_str(&j, "flops_per_token", "6*params + 12*layers*dim*ctx");
  nb_json_int(&j, "best_sgemm_n", NB__BEST_SGEMM_N);
  nb_json_num(&j, "best_sgemm_gflops", r->best_sgemm > 0 ? r->best_sgemm : NAN);
  nb_json_str(&j, "best_sgemm_core", r->best_core);
  json_object_set_new(j.o, "sgemm_candidates", cands ? cands : json_array());
  nb_json_num(&j, "mfu_vs_best_sgemm", r->mfu);
  nb_json_num(&j, "torch_tokens_per_s", r->torch_tps > 0 ? r->torch_tps : NAN);
  nb_json_num(&j, "vs_torch", r->vs_torch);
  nb_json_num(&j, "torch_sgemm_gflops", r->torch_sgemm > 0 ? r->torch_sgemm : NAN);
  if (!(r->torch_tps > 0)) nb_json_str(&j, "vs_torch_reason", r->why);
  nb_json_end(&j);
}

int nb_bench_train_main(int argc, char** argv) {
  int L = 4, D = 256, H = 0, T = 256, B = 4, steps = 5, json = 0;
  const char* torch = NB_BENCH_TORCH_SCRIPT;
  const nb_opt_t opts[] = {
      NB_OPTION("layers", NB_OPT_INT, &L, "L", "transformer blocks", .min = 1),
      NB_OPTION("dim", NB_OPT_INT, &D, "D", "width", .min = 1),
      NB_OPTION("heads", NB_OPT_INT, &H, "H", "attention heads (default D/64)", .min = 1),
      NB_OPTION("ctx", NB_OPT_INT, &T, "T", "context (sequence length)", .min = 1),
      NB_OPTION("batch", NB_OPT_INT, &B, "B", "sequences per step", .min = 1),
      NB_OPTION("steps", NB_OPT_INT, &steps, "N", "timed steps (at most 15)", .min = 1),
      NB_OPTION("torch", NB_OPT_STR, &torch, "SCRIPT",
                "bench/torch_train.py for vs_torch, or none (default: this source tree's)"),
      NB_OPTION("json", NB_OPT_FLAG, &json, NULL, "print one JSON object"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula bench train", .synopsis = NB__TRAIN_USAGE, .opts = opts};
  int parsed = nb_opts_parse(&spec, argc, argv);
  if (parsed != NB_OPTS_RUN) return parsed;
  if (H == 0) H = D >= 64 ? D / 64 : 1;
  if (steps > 15) steps = 15;
  nb_model_config_t cfg = nb_model_config_make(L, D, H, T);
  nb_model_t* m = NULL;
  nb_adamw_t* opt = NULL;
  int *tok = NULL, *tgt = NULL;
  float *sa = NULL, *sb = NULL, *sc = NULL;
  json_t* cands = NULL; /* the sgemm rate of each core type */
  nb__torch_t tq = {.why = "--torch none"};
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
  /* the best rate first, each core type in its own process, before the model's buffers exist */
  /* the step's threads (its pool runs the products too): PyTorch and the reference get as many */
  int threads = nb_parallel_threads();
  nb_blas_info_t bi;
  nb_blas_detect(&bi);
  double best_sgemm = 0.0;
  const char* best_core = "";
  cands = nb_bench_sgemm_candidates(NB__BEST_SGEMM_N, threads, &best_sgemm, &best_core);
  if (strcmp(torch, "none") != 0) nb__torch_start(&tq, torch, L, D, H, T, B, threads, n);
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
  /* training steps, sgemm calls and PyTorch's steps alternate, so all see the same load; each
   * starts after a quiet gap (nb__quiet) */
  double t[16], fwd[16], ts[16], tt[16];
  int torch_steps = 0;
  for (int k = -1; k < steps; k++) { /* round -1 warms up (first touch of every buffer) */
    nb__quiet();
    double tsg = nb__sgemm_once(sn, sa, sb, sc);
    nb__quiet();
    double t0 = nb_now_s();
    float loss;
    if (nb_model_forward(m, tok, tgt, B, T, &loss) != NB_OK) goto fail;
    double t1 = nb_now_s();
    nb_model_zero_grad(m);
    if (nb_model_backward(m) != NB_OK ||
        nb_adamw_step(opt, p, nb_model_grads(m, NULL), nb_model_decay_mask(m), NULL) != NB_OK)
      goto fail;
    double t2 = nb_now_s();
    if (tq.pid > 0) nb__quiet();
    double tts = nb__torch_step(&tq);
    if (k >= 0) {
      t[k] = t2 - t0;
      fwd[k] = t1 - t0;
      ts[k] = tsg;
      if (tts > 0) tt[torch_steps++] = tts;
    }
  }
  double step_s = nb_bench_median(t, (size_t)steps), fwd_s = nb_bench_median(fwd, (size_t)steps);
  double tokens_per_s = (double)B * T / step_s;
  double model_gflops = nb_model_flops_per_token(m, T) * tokens_per_s / 1e9;
  double sgemm = 2.0 * sn * (double)sn * sn / nb_bench_median(ts, (size_t)steps) / 1e9;
  double ratio = sgemm > 0 ? model_gflops / sgemm : 0.0;
  double mfu = best_sgemm > 0 ? model_gflops / best_sgemm : NAN;
  nb__torch_stop(&tq);
  const char* why = tq.why ? tq.why : "";
  double torch_tps = torch_steps == steps ? (double)B * T / nb_bench_median(tt, (size_t)steps) : 0;
  if (torch_steps != steps && !tq.why) why = "a PyTorch step failed";
  double vs_torch = torch_tps > 0 ? tokens_per_s / torch_tps : NAN;
  nb__train_result_t res = {.L = L,
                            .D = D,
                            .H = H,
                            .T = T,
                            .B = B,
                            .sn = sn,
                            .threads = threads,
                            .params = n,
                            .step_s = step_s,
                            .fwd_s = fwd_s,
                            .tokens_per_s = tokens_per_s,
                            .model_gflops = model_gflops,
                            .sgemm = sgemm,
                            .ratio = ratio,
                            .best_sgemm = best_sgemm,
                            .mfu = mfu,
                            .torch_tps = torch_tps,
                            .vs_torch = vs_torch,
                            .best_core = best_core,
                            .why = why,
                            .bi = &bi,
                            .torch_sgemm = tq.sgemm};
  nb__train_report(&res, cands, json);
  cands = NULL;
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
  json_decref(cands);
  nb__torch_stop(&tq);
  nb_adamw_destroy(opt);
  nb_model_destroy(m);
  return rc;
}
