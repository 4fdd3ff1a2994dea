/* main() of the `nebula` binary: the OpenBLAS kernel check (below), then nb_cli_main, where
 * everything else lives. A program that links libnebula itself gets nb_blas_check instead. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/common.h"
#include "kernels/blas.h"

/* Set in the environment of the copy that nebula re-executes (and so of everything it starts):
 * the check has been done, never re-execute again. "measure": a benchmark's child that runs a
 * core type on purpose (bench/bench_sgemm.c), not even checked. Internal: not a knob. */
#define NB__BLAS_GUARD "NB__BLAS_CHECKED"

/* OpenBLAS picks its kernel once, when it loads: OPENBLAS_CORETYPE, else its own detection,
 * which falls back to its generic SSE3 kernel ("Prescott") on CPUs newer than it knows, at a
 * fifth of their matrix-multiply rate. When that happened on a CPU with AVX2 or AVX-512 and the
 * user did not choose a core type, run this program again, once, with the best core type set:
 * the same argv and environment plus OPENBLAS_CORETYPE and the guard. Returns only when no
 * re-execution happened (it is not needed, not possible, or execv failed). */
static void nb__blas_reexec(char** argv) {
  nb_blas_info_t b;
  char line[512];
  const char* guard = getenv(NB__BLAS_GUARD);
  if (guard && !strcmp(guard, "measure")) return; /* a benchmark's child, on a type on purpose */
  nb_blas_detect(&b);
  if (guard) { /* the re-executed copy, or a process that a copy started */
    if (b.generic && b.user_coretype[0])
      NB_WARN(
          "%s (nebula re-executed itself with OPENBLAS_CORETYPE=%s; this OpenBLAS did not "
          "take it)",
          nb_blas_describe(&b, line, sizeof line), b.user_coretype);
    else if (b.generic) /* the guard without a type: inherited from elsewhere */
      NB_WARN("%s", nb_blas_describe(&b, line, sizeof line));
    else
      NB_INFO(INIT, "blas: OpenBLAS kernel %s (OPENBLAS_CORETYPE=%s)", b.core, b.user_coretype);
    return;
  }
  if (!b.generic) return;
  if (b.user_coretype[0]) { /* the user's own choice (an older kernel on purpose): said, not warned
                             */
    NB_INFO(INIT, "%s", nb_blas_describe(&b, line, sizeof line));
    return;
  }
  if (!b.dynamic || !b.best[0]) { /* nothing to do about it */
    NB_WARN("%s", nb_blas_describe(&b, line, sizeof line));
    return;
  }
  NB_INFO(INIT,
          "blas: OpenBLAS chose its generic %s kernel on a CPU that runs %s: re-executing with "
          "OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE yourself to choose another)",
          b.core, b.best, b.best);
  if (setenv("OPENBLAS_CORETYPE", b.best, 1) != 0 || setenv(NB__BLAS_GUARD, "1", 1) != 0) {
    NB_WARN("%s (could not set it for a re-execution: %s)", nb_blas_describe(&b, line, sizeof line),
            strerror(errno));
  } else {
    execv("/proc/self/exe", argv);
    int e = errno;
    NB_WARN("%s (re-executing nebula with it failed: %s; carrying on with the generic kernel)",
            nb_blas_describe(&b, line, sizeof line), strerror(e));
  }
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(NB__BLAS_GUARD);
}

int main(int argc, char** argv) {
  /* a log format that is not known stops every command before its first line */
  if (nb_log_check_env() != NB_OK) {
    fprintf(stderr, "nebula: %s\n", nb_error_last());
    return NB_EXIT_USAGE;
  }
  nb__blas_reexec(argv);
  return nb_cli_main(argc, argv);
}
