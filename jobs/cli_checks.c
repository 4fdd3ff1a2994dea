/* Checks of what a user typed, made before it is used: a descriptor file's kind and size, a
 * HOST:PORT address (jobs/cli_checks.h). Here, below the commands and the gateway that both
 * call them; they print nothing. */
#include "jobs/cli_checks.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "jobs/descriptor.h"

nb_status_t nb_cli_descriptor_precheck(const char* path) {
  struct stat sb;
  if (!path) return NB_OK;
  /* a file error is the file's, in the words of the system ("cannot open F: No such file or
   * directory"), not a descriptor error at the JSON path "$" */
  if (stat(path, &sb) != 0) return nb_error(NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  if (S_ISDIR(sb.st_mode))
    return nb_error(NB_ERR_CONFIG, "%s is a folder, not a descriptor file", path);
  if (S_ISREG(sb.st_mode) && sb.st_size > (off_t)NB_DESCRIPTOR_MAX_BYTES)
    return nb_error(NB_ERR_CONFIG,
                    "%s is %lld bytes, larger than the descriptor limit of %u bytes (1 MiB)", path,
                    (long long)sb.st_size, NB_DESCRIPTOR_MAX_BYTES);
  FILE* f = fopen(path, "rb");
  if (!f) return nb_error(NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  fclose(f);
  return NB_OK;
}

nb_status_t nb_cli_addr_check(const char* addr, int allow_zero, const char* what) {
  if (!addr || !*addr)
    return nb_error(NB_ERR_CONFIG, "%s: empty address (expected HOST:PORT)", what);
  if (!strncmp(addr, "unix:", 5) || !strncmp(addr, "unix-abstract:", 14)) return NB_OK;
  const char* colon = strrchr(addr, ':');
  const char* close = strrchr(addr, ']');
  if (!colon || colon == addr || (close && close > colon))
    return nb_error(NB_ERR_CONFIG, "%s: '%s' has no port (expected HOST:PORT)", what, addr);
  const char* p = colon + 1;
  long port = 0;
  size_t nd = 0;
  for (; p[nd]; nd++) {
    if (p[nd] < '0' || p[nd] > '9' || nd >= 5) {
      port = -1;
      break;
    }
    port = port * 10 + (p[nd] - '0');
  }
  if (nd == 0 || port < (allow_zero ? 0 : 1) || port > 65535)
    return nb_error(NB_ERR_CONFIG, "%s: port '%s' of '%s' is not a port number in %d..65535", what,
                    p, addr, allow_zero ? 0 : 1);
  return NB_OK;
}
