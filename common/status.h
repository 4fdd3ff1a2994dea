/* nebula status codes and error propagation. One enum for the whole project; a thread-local
 * message carries the detail of the most recent error (what was wrong, where). This is not an
 * exception mechanism: functions return nb_status_t and callers decide. */
#ifndef NB_COMMON_STATUS_H
#define NB_COMMON_STATUS_H

#include <stddef.h>

/* The enum, nb_status_name, nb_status_str and nb_error_last belong to the public API as well:
 * include/nebula.h is their one definition (it includes nothing of the tree, since it is
 * installed alone). The values are append-only: they are part of the API, logs and exit codes. */
#include "include/nebula.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a formatted detail message for `st` in this thread's error slot and returns `st`, so
 * that `return nb_error(NB_ERR_CODEC, "k %u > n %u", k, n);` reads naturally. The message is
 * truncated at 512 bytes. Thread-safe (the slot is thread-local). nb_error_last() reads it back
 * ("" when none), valid until the next nb_error() on this thread. */
nb_status_t nb_error(nb_status_t st, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

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
