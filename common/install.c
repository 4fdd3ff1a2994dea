/* See install.h. The relative paths from bin/ to share/ and libexec/ come from CMake's
 * GNUInstallDirs (NB_INSTALL_BIN_TO_DATA, NB_INSTALL_BIN_TO_LIBEXEC), so a prefix moved as a
 * whole keeps working. No search beyond the listed places. */
#include "common/install.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef NB_INSTALL_BIN_TO_DATA
#define NB_INSTALL_BIN_TO_DATA "../share"
#endif
#ifndef NB_INSTALL_BIN_TO_LIBEXEC
#define NB_INSTALL_BIN_TO_LIBEXEC "../libexec"
#endif

nb_status_t nb_install_self_dir(char* out, size_t cap) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return nb_error(NB_ERR_SYSTEM, "cannot read /proc/self/exe");
  exe[n] = 0;
  char* slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  if (snprintf(out, cap, "%s", exe) >= (int)cap)
    return nb_error(NB_ERR_INVALID, "the executable's path is too long");
  return NB_OK;
}

static void nb__tried(char* tried, size_t cap, const char* path) {
  if (!tried || !cap) return;
  size_t o = strlen(tried);
  if (o + 1 < cap) snprintf(tried + o, cap - o, "%s%s", o ? ", " : "", path);
}

/* The first of cands[0..n) whose file `name` passes access(mode), as that folder (file_too: the
 * file's path) into out. */
static nb_status_t nb__first(const char* const* cands, int n, const char* name, int mode,
                             int file_too, char* out, size_t cap, char* tried, size_t tried_cap) {
  for (int i = 0; i < n; i++) {
    char p[4400], real[4400];
    if (snprintf(p, sizeof p, "%s/%s", cands[i], name) >= (int)sizeof p) continue;
    nb__tried(tried, tried_cap, file_too ? p : cands[i]);
    if (access(p, mode) != 0) continue;
    const char* keep = file_too ? p : cands[i];
    if (!realpath(keep, real)) snprintf(real, sizeof real, "%s", keep);
    if (snprintf(out, cap, "%s", real) >= (int)cap) continue;
    return NB_OK;
  }
  return nb_error(NB_ERR_NOT_FOUND, "%s not found", name);
}

nb_status_t nb_install_wan_dir(char* out, size_t cap, char* tried, size_t tried_cap) {
  if (tried && tried_cap) tried[0] = 0;
  const char* env = getenv("NB_WAN_DIR");
  if (env && *env) {
    const char* c[] = {env};
    nb_status_t s = nb__first(c, 1, "wan-up.sh", R_OK, 0, out, cap, tried, tried_cap);
    if (s != NB_OK)
      return nb_error(NB_ERR_NOT_FOUND, "NB_WAN_DIR=%s holds no readable wan-up.sh", env);
    return NB_OK;
  }
  char dir[4096], c0[4200], c1[4200], c2[4200];
  NB_CHECK(nb_install_self_dir(dir, sizeof dir));
  snprintf(c0, sizeof c0, "%s/deploy/wan", dir);
  snprintf(c1, sizeof c1, "%s/%s/nebula/wan", dir, NB_INSTALL_BIN_TO_DATA);
  snprintf(c2, sizeof c2, "%s/../deploy/wan", dir);
  const char* c[] = {c0, c1, c2};
  return nb__first(c, 3, "wan-up.sh", R_OK, 0, out, cap, tried, tried_cap);
}

nb_status_t nb_install_delayline(const char* wan_dir, char* out, size_t cap, char* tried,
                                 size_t tried_cap) {
  if (tried && tried_cap) tried[0] = 0;
  const char* env = getenv("NB_DELAYLINE");
  if (env && *env) {
    nb__tried(tried, tried_cap, env);
    if (access(env, X_OK) != 0)
      return nb_error(NB_ERR_NOT_FOUND, "NB_DELAYLINE=%s is not executable", env);
    if (snprintf(out, cap, "%s", env) >= (int)cap)
      return nb_error(NB_ERR_INVALID, "NB_DELAYLINE is too long");
    return NB_OK;
  }
  char dir[4096], c0[4200], c1[4200], c2[4200];
  NB_CHECK(nb_install_self_dir(dir, sizeof dir));
  snprintf(c0, sizeof c0, "%s/deploy/wan", dir);
  snprintf(c1, sizeof c1, "%s/%s/nebula", dir, NB_INSTALL_BIN_TO_LIBEXEC);
  snprintf(c2, sizeof c2, "%s", wan_dir ? wan_dir : c0);
  const char* c[] = {c0, c1, c2};
  if (nb__first(c, 3, "nb-delayline", X_OK, 1, out, cap, tried, tried_cap) == NB_OK) return NB_OK;
  /* PATH last: a distribution's package may put it in /usr/bin */
  const char* path = getenv("PATH");
  char buf[8192];
  snprintf(buf, sizeof buf, "%s", path ? path : "");
  for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    const char* one[] = {d};
    if (*d && nb__first(one, 1, "nb-delayline", X_OK, 1, out, cap, NULL, 0) == NB_OK) return NB_OK;
  }
  nb__tried(tried, tried_cap, "nb-delayline on PATH");
  return nb_error(NB_ERR_NOT_FOUND, "nb-delayline not found");
}
