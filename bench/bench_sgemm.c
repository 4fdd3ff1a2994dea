/* `nebula bench sgemm`: the square cblas_sgemm rate of the OpenBLAS kernel this process loaded,
 * and nb_bench_sgemm_candidates, which runs it once per OpenBLAS core type in a child process
 * (the type is fixed when OpenBLAS loads) to find this machine's best rate. Not a BLAS test. */
#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "kernels/blas.h"
#include "train/rng.h"

#define NB__SGEMM_USAGE                                     \
  "usage: nebula bench sgemm [--n N] [--reps R] [--json]\n" \
  "  defaults: n 1024, 3 timed repetitions after one warm-up; prints the best"

double nb_bench_sgemm_gflops(int n, int reps) {
  float *a = NULL, *b = NULL, *c = NULL;
  size_t nn = (size_t)n * n;
  double best = 0.0;
  if (nb_aligned_alloc((void**)&a, nn, sizeof(float), "sgemm a") != NB_OK ||
      nb_aligned_alloc((void**)&b, nn, sizeof(float), "sgemm b") != NB_OK ||
      nb_aligned_alloc((void**)&c, nn, sizeof(float), "sgemm c") != NB_OK)
    goto done;
  nb_rng_t r;
  nb_rng_seed(&r, 11);
  for (size_t i = 0; i < nn; i++) {
    a[i] = (float)nb_rng_uniform(&r) - 0.5f;
    b[i] = (float)nb_rng_uniform(&r) - 0.5f;
    c[i] = 0.0f;
  }
  for (int k = -1; k < reps; k++) { /* round -1 warms up (thread start, first touch) */
    double t0 = nb_now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double t = nb_now_s() - t0;
    double g = t > 0 ? 2.0 * n * (double)n * n / t / 1e9 : 0.0;
    if (k >= 0 && g > best) best = g;
  }
done:
  nb_free(a);
  nb_free(b);
  nb_free(c);
  return best;
}

int nb_bench_sgemm_main(int argc, char** argv) {
  int n = 1024, reps = 3, json = 0;
  const nb_bench_int_flag_t flags[] = {{"--n", &n}, {"--reps", &reps}};
  int parsed =
      nb_bench_parse_int_flags("nebula bench sgemm", NB__SGEMM_USAGE, argc, argv, flags, 2, &json);
  if (parsed != NB_OPTS_RUN) return parsed;
  if (n > 8192) n = 8192;
  if (reps > 50) reps = 50;
  nb_blas_info_t bi;
  nb_blas_detect(&bi);
  int threads = openblas_get_num_threads();
  double g = nb_bench_sgemm_gflops(n, reps);
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_str(&j, "bench", "sgemm");
    nb_json_int(&j, "n", n);
    nb_json_int(&j, "threads", threads);
    nb_json_str(&j, "core", bi.core);
    nb_json_str(&j, "openblas_coretype", bi.user_coretype);
    nb_json_int(&j, "generic", bi.generic);
    nb_json_str(&j, "best_coretype", bi.best);
    nb_json_num(&j, "gflops", g);
    nb_json_end(&j);
  } else {
    printf("sgemm %dx%dx%d, %d threads, OpenBLAS kernel %s: %.1f GFLOP/s (best of %d)\n", n, n, n,
           threads, bi.core[0] ? bi.core : "?", g, reps);
  }
  return g > 0 ? 0 : 1;
}

/* Runs `nebula bench sgemm --n N --json` with OPENBLAS_CORETYPE=type and reads its object. */
static json_t* nb__sgemm_child(const char* type, int n, int threads) {
  char exe[1024];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return NULL;
  exe[len] = '\0';
  int fd[2];
  if (pipe(fd) != 0) return NULL;
  char nt[16], th[16];
  snprintf(nt, sizeof nt, "%d", n);
  snprintf(th, sizeof th, "%d", threads);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return NULL;
  }
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    setenv("OPENBLAS_CORETYPE", type, 1);
    setenv("OPENBLAS_NUM_THREADS", th, 1);
    /* measure this type: no re-execution to another, no warning about it (cli/nebula_main.c) */
    setenv("NB__BLAS_CHECKED", "measure", 1);
    char* av[] = {"nebula", "bench", "sgemm", "--n", nt, "--json", NULL};
    execv(exe, av);
    _exit(127);
  }
  close(fd[1]);
  FILE* f = fdopen(fd[0], "r");
  json_t* o = NULL;
  if (f) {
    o = json_loadf(f, 0, NULL); /* to the end: the child's newline after the object too */
    fclose(f);
  } else {
    close(fd[0]);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    json_decref(o);
    return NULL;
  }
  return o;
}

json_t* nb_bench_sgemm_candidates(int n, int threads, double* best, const char** best_core) {
  nb_blas_info_t bi;
  nb_blas_detect(&bi);
  const char* types[8];
  char cores[8][32];
  double rate[8];
  int nt = nb_blas_candidates(&bi.cpu, types, 8);
  for (int i = 0; i < nt; i++) {
    rate[i] = 0.0;
    cores[i][0] = '\0';
  }
  /* two rounds, the types in turn, best of both: a burst of other load hits no type alone */
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < nt; i++) {
      json_t* o = nb__sgemm_child(types[i], n, threads);
      const char* core = o ? json_string_value(json_object_get(o, "core")) : NULL;
      double g = o ? json_number_value(json_object_get(o, "gflops")) : 0.0;
      if (core) snprintf(cores[i], sizeof cores[i], "%s", core);
      /* an OpenBLAS without that kernel runs its own choice instead: not this type's rate */
      if (core && !strcasecmp(core, types[i]) && g > rate[i]) rate[i] = g;
      json_decref(o);
    }
  json_t* arr = json_array();
  *best = 0.0;
  *best_core = "";
  if (nt == 0) { /* not x86: no core types to choose from, the loaded kernel is the best */
    *best = nb_bench_sgemm_gflops(n, 3);
    json_t* row = json_object();
    json_object_set_new(row, "coretype", json_string(""));
    json_object_set_new(row, "core", json_string(bi.core));
    json_object_set_new(row, "gflops", *best > 0 ? nb_bench_json_real(*best) : json_null());
    json_array_append_new(arr, row);
    return arr;
  }
  for (int i = 0; i < nt; i++) {
    json_t* row = json_object();
    json_object_set_new(row, "coretype", json_string(types[i]));
    json_object_set_new(row, "core", json_string(cores[i]));
    json_object_set_new(row, "gflops", rate[i] > 0 ? nb_bench_json_real(rate[i]) : json_null());
    json_array_append_new(arr, row);
    if (rate[i] > *best) {
      *best = rate[i];
      *best_core = types[i];
    }
  }
  return arr;
}
