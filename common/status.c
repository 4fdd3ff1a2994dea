/* Status names, descriptions and the thread-local error detail slot. */
#include "common/status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
  const char* name;
  const char* text;
} nb__status_table[NB_STATUS_COUNT_] = {
    [NB_OK] = {"NB_OK", "success"},
    [NB_ERR_INVALID] = {"NB_ERR_INVALID", "invalid argument"},
    [NB_ERR_SYSTEM] = {"NB_ERR_SYSTEM", "system call failed"},
    [NB_ERR_NOMEM] = {"NB_ERR_NOMEM", "out of memory"},
    [NB_ERR_CUDA] = {"NB_ERR_CUDA", "CUDA error"},
    [NB_ERR_NCCL] = {"NB_ERR_NCCL", "NCCL error"},
    [NB_ERR_MPI] = {"NB_ERR_MPI", "MPI error"},
    [NB_ERR_RPC] = {"NB_ERR_RPC", "RPC failure"},
    [NB_ERR_CRYPTO] = {"NB_ERR_CRYPTO", "cryptographic library error"},
    [NB_ERR_INTEGRITY] = {"NB_ERR_INTEGRITY", "integrity check failed"},
    [NB_ERR_CODEC] = {"NB_ERR_CODEC", "malformed encoded data"},
    [NB_ERR_TIMEOUT] = {"NB_ERR_TIMEOUT", "deadline exceeded"},
    [NB_ERR_REMOTE] = {"NB_ERR_REMOTE", "remote peer reported an error"},
    [NB_ERR_UNSUPPORTED] = {"NB_ERR_UNSUPPORTED", "not supported in this build or on this machine"},
    [NB_ERR_NOT_FOUND] = {"NB_ERR_NOT_FOUND", "not found"},
    [NB_ERR_EXISTS] = {"NB_ERR_EXISTS", "already exists"},
    [NB_ERR_PERMISSION] = {"NB_ERR_PERMISSION", "permission denied"},
    [NB_ERR_CONFIG] = {"NB_ERR_CONFIG", "invalid configuration"},
    [NB_ERR_IO] = {"NB_ERR_IO", "I/O error"},
    [NB_ERR_CANCELLED] = {"NB_ERR_CANCELLED", "cancelled"},
    [NB_ERR_UNAVAILABLE] = {"NB_ERR_UNAVAILABLE", "unavailable"},
    [NB_ERR_INTERNAL] = {"NB_ERR_INTERNAL", "internal error (a bug in nebula)"},
};

const char* nb_status_name(nb_status_t st) {
  if ((unsigned)st >= NB_STATUS_COUNT_) return "NB_ERR_UNKNOWN";
  return nb__status_table[st].name;
}

const char* nb_status_str(nb_status_t st) {
  if ((unsigned)st >= NB_STATUS_COUNT_) return "unknown status";
  return nb__status_table[st].text;
}

#define NB__ERRMSG_MAX 512
static _Thread_local char nb__errmsg[NB__ERRMSG_MAX];

nb_status_t nb_error(nb_status_t st, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(nb__errmsg, sizeof nb__errmsg, fmt, ap);
  va_end(ap);
  return st;
}

nb_status_t nb_error_wrap(nb_status_t st, const char* fmt, ...) {
  char ctx[NB__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof ctx, fmt, ap);
  va_end(ap);
  char joined[2 * NB__ERRMSG_MAX + 8];
  if (nb__errmsg[0])
    snprintf(joined, sizeof joined, "%s: %s", ctx, nb__errmsg);
  else
    snprintf(joined, sizeof joined, "%s", ctx);
  size_t len = strnlen(joined, NB__ERRMSG_MAX - 1); /* truncate to the slot */
  memcpy(nb__errmsg, joined, len);
  nb__errmsg[len] = '\0';
  return st;
}

const char* nb_error_last(void) {
  return nb__errmsg;
}

void nb_error_clear(void) {
  nb__errmsg[0] = '\0';
}

nb_status_t nb__error_errno(const char* file, int line, const char* what) {
  int e = errno;
  nb_status_t st = e == ENOMEM ? NB_ERR_NOMEM : NB_ERR_SYSTEM;
  char buf[128];
  const char* s = strerror_r(e, buf, sizeof buf); /* GNU variant */
  (void)file;
  (void)line;
  return nb_error(st, "%s: %s (errno %d)", what, s, e);
}
