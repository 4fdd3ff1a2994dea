/* nebula status codes and error propagation. One enum for the whole project; a thread-local
 * message carries the detail of the most recent error (what was wrong, where). This is not an
 * exception mechanism: functions return nb_status_t and callers decide. */
#ifndef NB_COMMON_STATUS_H
#define NB_COMMON_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Append-only: values are part of logs and exit codes. The public header include/nebula.h
 * carries the same enum under the same guard (tests/unit/api checks that the two agree). */
#ifndef NB_STATUS_T_DEFINED
#define NB_STATUS_T_DEFINED
typedef enum {
  NB_OK = 0,
  NB_ERR_INVALID = 1,      /* invalid argument or malformed input from the caller */
  NB_ERR_SYSTEM = 2,       /* an OS call failed (errno in the message) */
  NB_ERR_NOMEM = 3,        /* allocation failed */
  NB_ERR_CUDA = 4,         /* CUDA runtime or driver error */
  NB_ERR_NCCL = 5,         /* NCCL error */
  NB_ERR_MPI = 6,          /* MPI error */
  NB_ERR_RPC = 7,          /* gRPC transport or call failure */
  NB_ERR_CRYPTO = 8,       /* OpenSSL failure (not an integrity failure) */
  NB_ERR_INTEGRITY = 9,    /* bad tag, bad checksum, hash mismatch: never retried silently */
  NB_ERR_CODEC = 10,       /* a frame or encoded buffer is malformed */
  NB_ERR_TIMEOUT = 11,     /* a deadline passed */
  NB_ERR_REMOTE = 12,      /* the peer reported an error */
  NB_ERR_UNSUPPORTED = 13, /* not built in or not available on this machine */
  NB_ERR_NOT_FOUND = 14,   /* a named thing does not exist */
  NB_ERR_EXISTS = 15,      /* a thing that must not exist does */
  NB_ERR_PERMISSION = 16,  /* authenticated but not allowed */
  NB_ERR_CONFIG = 17,      /* a configuration or descriptor is invalid */
  NB_ERR_IO = 18,          /* a file is unreadable, truncated or could not be written */
  NB_ERR_CANCELLED = 19,   /* the operation was cancelled */
  NB_ERR_UNAVAILABLE = 20, /* a peer or resource is not reachable now (may be transient) */
  NB_ERR_INTERNAL = 21,    /* an invariant of nebula itself was broken: a bug */
  NB_STATUS_COUNT_
} nb_status_t;
#endif

/* Short constant name of a status ("NB_ERR_CODEC"); never NULL. Thread-safe. */
const char* nb_status_name(nb_status_t st);
/* One-line description of a status ("malformed encoded data"); never NULL. Thread-safe. */
const char* nb_status_str(nb_status_t st);

/* Records a formatted detail message for `st` in this thread's error slot and returns `st`, so
 * that `return nb_error(NB_ERR_CODEC, "k %u > n %u", k, n);` reads naturally. The message is
 * truncated at 512 bytes. Thread-safe (the slot is thread-local). */
nb_status_t nb_error(nb_status_t st, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* The detail of the last error recorded by this thread, or "" when none. Valid until the next
 * nb_error() on this thread. */
const char* nb_error_last(void);
/* Clears this thread's error slot. */
void nb_error_clear(void);

/* Adds context in front of the current message: "reading x: <previous>". Returns `st`. */
nb_status_t nb_error_wrap(nb_status_t st, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define NB_CHECK(call)                  \
  do {                                  \
    nb_status_t nb__st = (call);        \
    if (nb__st != NB_OK) return nb__st; \
  } while (0)

#define NB_CHECK_GOTO(call, st, label) \
  do {                                 \
    (st) = (call);                     \
    if ((st) != NB_OK) goto label;     \
  } while (0)

/* errno → status, with the failing call named in the message. */
#define NB_ERRNO(what) nb__error_errno(__FILE__, __LINE__, (what))
nb_status_t nb__error_errno(const char* file, int line, const char* what);

#ifdef __cplusplus
}
#endif
#endif
