/* Helpers shared by the security unit tests: a scratch folder that is removed afterwards, shell
 * commands for the openssl CLI reference, file checks. Test code only. */
#ifndef NB_TESTS_SEC_TEST_UTIL_H
#define NB_TESTS_SEC_TEST_UTIL_H

#include <stddef.h>

/* Creates a fresh scratch folder under $TMPDIR (or /tmp) and returns its path (static storage
 * per call; at most 8 live). */
const char* sec_tmpdir(void);
/* Removes a folder tree. */
void sec_rmtree(const char* dir);
/* 1 when the openssl program is on PATH. */
int sec_have_openssl(void);
/* Runs a shell command (formatted), output discarded; returns its exit status (or -1). */
int sec_sh(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 when the path exists. */
int sec_exists(const char* path);
/* Number of entries in dir whose name contains `needle`. */
int sec_count_named(const char* dir, const char* needle);
/* Reads a whole file into a NUL-terminated buffer (caller frees with free); NULL on error. */
char* sec_slurp(const char* path, size_t* len);

#endif
