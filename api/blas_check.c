/* api/blas_check: nb_blas_check (include/nebula.h) over kernels/blas, and the warning that
 * nb_session_open prints once per process. Not here: re-executing (only the nebula command can,
 * cli/nebula_main.c), choosing a BLAS. */
#include <nebula.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/blas_check.h"
#include "common/common.h"
#include "kernels/blas.h"

nb_status_t nb_blas_check(nb_blas_report_t* out) {
  if (!out) return nb_error(NB_ERR_INVALID, "blas check: NULL report");
  memset(out, 0, sizeof *out);
  nb_blas_info_t b;
  nb_blas_detect(&b);
  out->generic = b.generic;
  snprintf(out->core, sizeof out->core, "%s", b.core);
  snprintf(out->suggested, sizeof out->suggested, "%s", b.best);
  nb_blas_describe(&b, out->text, sizeof out->text);
  return NB_OK;
}

static pthread_once_t nb__blas_warn_once = PTHREAD_ONCE_INIT;

static void nb__blas_warn(void) {
  nb_blas_report_t r;
  if (nb_blas_check(&r) != NB_OK) return;
  if (r.generic)
    NB_WARN("%s", r.text);
  else
    NB_INFO(INIT, "%s", r.text);
}

void nb__api_blas_warn_once(void) {
  pthread_once(&nb__blas_warn_once, nb__blas_warn);
}
