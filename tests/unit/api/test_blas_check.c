/* nb_blas_check and nb_session_open's BLAS warning through libnebula.so and <nebula.h>, in a
 * program that runs OpenBLAS itself (as a caller's model does), with OpenBLAS's choice simulated
 * as its generic Prescott kernel (NB_DEBUG_BLAS_CORENAME): the verdict, the type it names, and
 * exactly one warning line however many sessions open. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cblas.h>
#include <nebula.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_log[] = "/tmp/nb_test_blas_check_XXXXXX";

/* 1 when /proc/cpuinfo's flags list both avx2 and fma: a CPU that has a better kernel. */
static int cpu_has_avx2(void) {
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (!f) return 0;
  char line[8192];
  int avx2 = 0, fma = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "flags", 5) != 0) continue;
    for (char* t = strtok(line, " \t\n"); t; t = strtok(NULL, " \t\n")) {
      avx2 |= !strcmp(t, "avx2");
      fma |= !strcmp(t, "fma");
    }
    break;
  }
  fclose(f);
  return avx2 && fma;
}

static void test_check(void** state) {
  (void)state;
  assert_int_equal(nb_blas_check(NULL), NB_ERR_INVALID);
  nb_blas_report_t r;
  assert_int_equal(nb_blas_check(&r), NB_OK);
  assert_string_equal(r.core, "Prescott");
  assert_non_null(strstr(r.text, "Prescott"));
  if (!cpu_has_avx2()) {
    assert_int_equal(r.generic, 0);
    return;
  }
  assert_int_equal(r.generic, 1);
  assert_true(r.suggested[0] != '\0');
  char want[64];
  snprintf(want, sizeof want, "OPENBLAS_CORETYPE=%s", r.suggested);
  if (!strstr(r.text, want)) fail_msg("text '%s' does not name %s", r.text, want);
}

static int count_lines(const char* path, const char* what) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

static void test_session_warns_once(void** state) {
  (void)state;
  for (int i = 0; i < 3; i++) {
    nb_session_options_t o;
    nb_session_options_default(&o);
    o.job_id = "api-blas";
    o.cluster_id = "solo";
    o.insecure = o.unsealed = 1;
    nb_session_t* s = NULL;
    assert_int_equal(nb_session_open(&o, &s), NB_OK);
    nb_session_close(s);
  }
  int warned = count_lines(g_log, "generic Prescott kernel");
  assert_int_equal(warned, cpu_has_avx2() ? 1 : 0);
  if (warned) assert_int_equal(count_lines(g_log, "WARN"), 1);
}

int main(void) {
  /* the caller's own use of OpenBLAS, which makes it a library this program needs */
  float a = 2.0f, b = 3.0f, c = 0.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
  if (c != 6.0f) return 1;
  int fd = mkstemp(g_log);
  if (fd < 0) return 1;
  close(fd);
  /* before libnebula's first call: its parameters and logger read the environment once */
  setenv("NB_DEBUG_FILE", g_log, 1);
  setenv("NB_DEBUG_BLAS_CORENAME", "Prescott", 1);
  unsetenv("OPENBLAS_CORETYPE");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check),
      cmocka_unit_test(test_session_warns_once),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(g_log);
  return rc;
}
