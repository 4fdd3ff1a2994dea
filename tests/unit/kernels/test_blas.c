/* Tests of kernels/blas against the real OpenBLAS and this CPU: detection (the CPU's features
 * against /proc/cpuinfo), the verdict with NB_DEBUG_BLAS_CORENAME=Prescott, the core-type tables;
 * and, given the nebula binary, that it re-executes itself exactly once with the best
 * OPENBLAS_CORETYPE and leaves a user's OPENBLAS_CORETYPE alone. Not a speed test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "kernels/blas.h"

extern char* openblas_get_corename(void);

static const char* g_nebula; /* argv[1]: the nebula binary, or NULL (those tests skip) */

/* 1 when the "flags" line of /proc/cpuinfo lists flag (an independent reading of the CPU). */
static int cpuinfo_has(const char* flag) {
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (!f) return -1;
  char line[8192];
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "flags", 5) != 0) continue;
    char* colon = strchr(line, ':');
    for (char* t = strtok(colon ? colon + 1 : line, " \t\n"); t; t = strtok(NULL, " \t\n"))
      if (!strcmp(t, flag)) found = 1;
    break;
  }
  fclose(f);
  return found;
}

static void set_env(const char* name, const char* value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
  nb_param_reset_all();
}

/* What this process's OpenBLAS and CPU are, read as the module reads them. */
static void test_detect_here(void** state) {
  (void)state;
  set_env("NB_DEBUG_BLAS_CORENAME", NULL);
  nb_blas_info_t b;
  nb_blas_detect(&b);
  assert_string_equal(b.core, openblas_get_corename());
  assert_true(strncmp(b.config, "OpenBLAS", 8) == 0);
#if defined(__x86_64__)
  assert_int_not_equal(b.core_isa, NB_BLAS_ISA_UNKNOWN);
  const struct {
    const char* flag;
    int have;
  } f[] = {{"avx2", b.cpu.avx2},         {"fma", b.cpu.fma},
           {"avx512f", b.cpu.avx512f},   {"avx512bw", b.cpu.avx512bw},
           {"avx512vl", b.cpu.avx512vl}, {"avx512_bf16", b.cpu.avx512bf16}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    int want = cpuinfo_has(f[i].flag);
    if (want < 0) skip();
    if (want != f[i].have) fail_msg("%s: cpuinfo %d, detected %d", f[i].flag, want, f[i].have);
  }
  nb_blas_isa_t isa;
  assert_string_equal(b.best, nb_blas_best_coretype(&b.cpu, &isa));
  assert_int_equal(b.cpu_isa, isa);
  if (b.cpu.avx2 && b.cpu.fma) assert_true(b.cpu_isa >= NB_BLAS_ISA_AVX2 && b.best[0]);
#endif
  assert_int_equal(b.generic, b.core_isa != NB_BLAS_ISA_UNKNOWN && b.core_isa < NB_BLAS_ISA_AVX2 &&
                                  b.cpu_isa >= NB_BLAS_ISA_AVX2);
  char line[512];
  assert_non_null(strstr(nb_blas_describe(&b, line, sizeof line), b.core));
}

/* The stand-in core name makes any CPU look like one where OpenBLAS fell back to Prescott. */
static void test_prescott_verdict(void** state) {
  (void)state;
  set_env("OPENBLAS_CORETYPE", NULL);
  set_env("NB_DEBUG_BLAS_CORENAME", "Prescott");
  nb_blas_info_t b;
  nb_blas_detect(&b);
  assert_string_equal(b.core, "Prescott");
  assert_int_equal(b.core_isa, NB_BLAS_ISA_SSE);
  char line[512], want[64];
  nb_blas_describe(&b, line, sizeof line);
  if (b.cpu_isa < NB_BLAS_ISA_AVX2) {
    assert_int_equal(b.generic, 0); /* nothing better to run here */
  } else {
    assert_int_equal(b.generic, 1);
    assert_true(nb_blas_core_isa(b.best) >= NB_BLAS_ISA_AVX2);
    assert_int_equal(nb_blas_core_isa(b.best), b.cpu_isa);
    snprintf(want, sizeof want, "OPENBLAS_CORETYPE=%s", b.best);
    if (!strstr(line, want) || !strstr(line, "generic Prescott"))
      fail_msg("describe: '%s' does not name %s", line, want);
  }
  /* with OPENBLAS_CORETYPE set, OpenBLAS did not detect: the real name is read */
  set_env("OPENBLAS_CORETYPE", "Haswell");
  nb_blas_detect(&b);
  assert_string_equal(b.core, openblas_get_corename());
  assert_string_equal(b.user_coretype, "Haswell");
  set_env("OPENBLAS_CORETYPE", NULL);
  set_env("NB_DEBUG_BLAS_CORENAME", NULL);
}

static void test_core_names(void** state) {
  (void)state;
  assert_int_equal(nb_blas_core_isa("Prescott"), NB_BLAS_ISA_SSE);
  assert_int_equal(nb_blas_core_isa("NEHALEM"), NB_BLAS_ISA_SSE);
  assert_int_equal(nb_blas_core_isa("Sandybridge"), NB_BLAS_ISA_AVX);
  assert_int_equal(nb_blas_core_isa("haswell"), NB_BLAS_ISA_AVX2);
  assert_int_equal(nb_blas_core_isa("Zen"), NB_BLAS_ISA_AVX2);
  assert_int_equal(nb_blas_core_isa("SkylakeX"), NB_BLAS_ISA_AVX512);
  assert_int_equal(nb_blas_core_isa("Cooperlake"), NB_BLAS_ISA_AVX512_BF16);
  assert_int_equal(nb_blas_core_isa("ARMV8"), NB_BLAS_ISA_UNKNOWN);
  assert_int_equal(nb_blas_core_isa(""), NB_BLAS_ISA_UNKNOWN);
  assert_int_equal(nb_blas_core_isa(NULL), NB_BLAS_ISA_UNKNOWN);
}

/* The best type and the candidates of made-up CPUs: never a type the CPU cannot run. */
static void test_best_and_candidates(void** state) {
  (void)state;
  nb_blas_cpu_t bf16 = {.avx = 1,
                        .avx2 = 1,
                        .fma = 1,
                        .avx512f = 1,
                        .avx512bw = 1,
                        .avx512vl = 1,
                        .avx512dq = 1,
                        .avx512cd = 1,
                        .avx512bf16 = 1};
  nb_blas_cpu_t skx = bf16, no_bw = bf16, zen = bf16, avx = {.avx = 1}, none = {0};
  skx.avx512bf16 = 0;
  no_bw.avx512bw = 0;
  zen.avx512f = 0;
  zen.amd = 1;
  nb_blas_isa_t isa;
  assert_string_equal(nb_blas_best_coretype(&bf16, &isa), "Cooperlake");
  assert_int_equal(isa, NB_BLAS_ISA_AVX512_BF16);
  assert_string_equal(nb_blas_best_coretype(&skx, &isa), "SkylakeX");
  assert_string_equal(nb_blas_best_coretype(&no_bw, &isa), "Haswell");
  assert_int_equal(isa, NB_BLAS_ISA_AVX2);
  assert_string_equal(nb_blas_best_coretype(&zen, NULL), "Zen");
  assert_string_equal(nb_blas_best_coretype(&avx, &isa), "");
  assert_int_equal(isa, NB_BLAS_ISA_AVX);
  assert_string_equal(nb_blas_best_coretype(&none, NULL), "");
  const struct {
    const nb_blas_cpu_t* cpu;
    int n;
  } c[] = {{&bf16, 5}, {&skx, 4}, {&no_bw, 3}, {&zen, 3}, {&avx, 1}, {&none, 1}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    const char* t[8];
    nb_blas_isa_t level;
    nb_blas_best_coretype(c[i].cpu, &level);
    int n = nb_blas_candidates(c[i].cpu, t, 8);
    assert_int_equal(n, c[i].n);
    assert_string_equal(t[0], "Prescott");
    for (int k = 0; k < n; k++)
      if (nb_blas_core_isa(t[k]) > level) fail_msg("cpu %zu: candidate %s beyond it", i, t[k]);
    assert_int_equal(nb_blas_candidates(c[i].cpu, t, 1), 1);
  }
}

static void test_describe(void** state) {
  (void)state;
  nb_blas_info_t b;
  memset(&b, 0, sizeof b);
  b.cpu_isa = NB_BLAS_ISA_AVX2;
  char line[512];
  assert_non_null(strstr(nb_blas_describe(&b, line, sizeof line), "not OpenBLAS"));
  snprintf(b.core, sizeof b.core, "Prescott");
  snprintf(b.best, sizeof b.best, "Haswell");
  b.core_isa = NB_BLAS_ISA_SSE;
  b.generic = 1;
  assert_non_null(strstr(nb_blas_describe(&b, line, sizeof line), "not a DYNAMIC_ARCH build"));
  b.dynamic = 1;
  assert_non_null(strstr(nb_blas_describe(&b, line, sizeof line), "set OPENBLAS_CORETYPE=Haswell"));
  snprintf(b.user_coretype, sizeof b.user_coretype, "Prescott");
  assert_non_null(strstr(nb_blas_describe(&b, line, sizeof line), "as OPENBLAS_CORETYPE=Prescott"));
  char small[8];
  assert_int_equal(strlen(nb_blas_describe(&b, small, sizeof small)), sizeof small - 1);
}

/* ---- the nebula binary ------------------------------------------------------------------- */

typedef struct {
  int rc;
  char out[8192], err[16384];
} run_t;

static void slurp(const char* path, char* buf, size_t cap) {
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
  buf[n] = '\0';
  if (f) fclose(f);
}

/* Runs `nebula bench sgemm --n 64 --reps 1 --json` with the given environment changes (NAME=V
 * sets, NAME= with nothing after unsets), stdout and stderr into r; kills it after 60 s. */
static void run_nebula(run_t* r, const char* const* env) {
  char out[] = "/tmp/nb_test_blas_out_XXXXXX", err[] = "/tmp/nb_test_blas_err_XXXXXX";
  int fo = mkstemp(out), fe = mkstemp(err);
  assert_true(fo >= 0 && fe >= 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fo, 1);
    dup2(fe, 2);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("NB__BLAS_CHECKED");
    setenv("NB_DEBUG", "INFO", 1);
    setenv("NB_DEBUG_SUBSYS", "INIT", 1);
    for (int i = 0; env[i]; i++) {
      char kv[256];
      snprintf(kv, sizeof kv, "%s", env[i]);
      char* eq = strchr(kv, '=');
      *eq = '\0';
      if (eq[1])
        setenv(kv, eq + 1, 1);
      else
        unsetenv(kv);
    }
    execl(g_nebula, "nebula", "bench", "sgemm", "--n", "64", "--reps", "1", "--json", (char*)NULL);
    _exit(127);
  }
  int status = 0;
  for (int waited = 0;; waited++) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (waited > 6000) { /* 60 s: a loop of re-executions, or a hang */
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  slurp(out, r->out, sizeof r->out);
  slurp(err, r->err, sizeof r->err);
  close(fo);
  close(fe);
  unlink(out);
  unlink(err);
  if (r->rc != 0) fail_msg("nebula exit %d: %s %s", r->rc, r->out, r->err);
}

static int count(const char* s, const char* what) {
  int n = 0;
  for (const char* p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

/* The JSON field as `"key": "value"` (jansson's spacing). */
static int has_field(const run_t* r, const char* key, const char* value) {
  char want[128];
  snprintf(want, sizeof want, "\"%s\": \"%s\"", key, value);
  return strstr(r->out, want) != NULL;
}

static void best_here(char* best, size_t cap, nb_blas_isa_t* level) {
  nb_blas_info_t b;
  nb_blas_detect(&b);
  snprintf(best, cap, "%s", b.best);
  *level = b.cpu_isa;
}

/* A simulated Prescott: the program runs again once, and the copy has the best core type. */
static void test_reexec_once(void** state) {
  (void)state;
  if (!g_nebula) skip();
  char best[32];
  nb_blas_isa_t level;
  best_here(best, sizeof best, &level);
  run_t r;
  const char* env[] = {"NB_DEBUG_BLAS_CORENAME=Prescott", NULL};
  run_nebula(&r, env);
  if (level < NB_BLAS_ISA_AVX2) { /* nothing better: no re-execution */
    assert_int_equal(count(r.err, "re-executing"), 0);
    return;
  }
  if (count(r.err, "re-executing with OPENBLAS_CORETYPE=") != 1 ||
      !has_field(&r, "openblas_coretype", best) || !has_field(&r, "core", best))
    fail_msg("want one re-execution with %s; stdout %s stderr %s", best, r.out, r.err);
  assert_int_equal(count(r.err, "blas: OpenBLAS kernel "), 1); /* the copy's own line, once */
  assert_int_equal(count(r.out, "\"bench\": \"sgemm\""), 1);
  assert_int_equal(count(r.err, "WARN"), 0);
}

/* OPENBLAS_CORETYPE from the user: no re-execution, that type runs; a generic one is the user's
 * choice: said at INFO (naming the type this CPU would run best), never a warning on every
 * command's stderr. */
static void test_user_coretype(void** state) {
  (void)state;
  if (!g_nebula) skip();
  char best[32], want[64];
  nb_blas_isa_t level;
  best_here(best, sizeof best, &level);
  if (level < NB_BLAS_ISA_AVX2) skip(); /* Haswell would not run here */
  run_t r;
  const char* haswell[] = {"NB_DEBUG_BLAS_CORENAME=Prescott", "OPENBLAS_CORETYPE=Haswell", NULL};
  run_nebula(&r, haswell);
  assert_int_equal(count(r.err, "re-executing"), 0);
  if (!has_field(&r, "core", "Haswell") || !has_field(&r, "openblas_coretype", "Haswell"))
    fail_msg("OPENBLAS_CORETYPE=Haswell: %s %s", r.out, r.err);
  const char* prescott[] = {"OPENBLAS_CORETYPE=Prescott", NULL};
  run_nebula(&r, prescott);
  assert_int_equal(count(r.err, "re-executing"), 0);
  if (!has_field(&r, "core", "Prescott") || count(r.err, "WARN") != 0)
    fail_msg("OPENBLAS_CORETYPE=Prescott: want Prescott and no warning: %s %s", r.out, r.err);
  const char* prescott_info[] = {"OPENBLAS_CORETYPE=Prescott", "NB_DEBUG=INFO", NULL};
  run_nebula(&r, prescott_info);
  snprintf(want, sizeof want, "OPENBLAS_CORETYPE=%s", best);
  if (!has_field(&r, "core", "Prescott") || count(r.err, "in the environment asks") != 1 ||
      !strstr(r.err, want))
    fail_msg("OPENBLAS_CORETYPE=Prescott, NB_DEBUG=INFO: want one line naming %s: %s %s", want,
             r.out, r.err);
}

/* The guard already set (a process the re-executed copy started): it never re-executes. */
static void test_guard(void** state) {
  (void)state;
  if (!g_nebula) skip();
  char best[32];
  nb_blas_isa_t level;
  best_here(best, sizeof best, &level);
  if (level < NB_BLAS_ISA_AVX2) skip();
  run_t r;
  const char* env[] = {"NB_DEBUG_BLAS_CORENAME=Prescott", "NB__BLAS_CHECKED=1", NULL};
  run_nebula(&r, env);
  assert_int_equal(count(r.err, "re-executing"), 0);
  if (count(r.err, "WARN") != 1 || !has_field(&r, "openblas_coretype", ""))
    fail_msg("guard set: want no re-execution and one warning: %s %s", r.out, r.err);
}

int main(int argc, char** argv) {
  g_nebula = argc > 1 ? argv[1] : NULL;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect_here),   cmocka_unit_test(test_prescott_verdict),
      cmocka_unit_test(test_core_names),    cmocka_unit_test(test_best_and_candidates),
      cmocka_unit_test(test_describe),      cmocka_unit_test(test_reexec_once),
      cmocka_unit_test(test_user_coretype), cmocka_unit_test(test_guard),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
