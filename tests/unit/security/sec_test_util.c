/* Helpers shared by the security unit tests (scratch folders, shell, files). Test code only. */
#include "sec_test_util.h"

#include <dirent.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char* sec_tmpdir(void) {
  static char bufs[8][512];
  static int next;
  char* b = bufs[next++ % 8];
  const char* t = getenv("TMPDIR");
  snprintf(b, 512, "%s/nb_sec_test_XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(b)) return NULL;
  return b;
}

static int rm_one(const char* p, const struct stat* sb, int flag, struct FTW* f) {
  (void)sb, (void)flag, (void)f;
  return remove(p);
}

void sec_rmtree(const char* dir) {
  if (dir) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int sec_sh(const char* fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[4200];
  snprintf(full, sizeof full, "(%s) >/dev/null 2>&1", cmd);
  int rc = system(full);
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

int sec_have_openssl(void) {
  return sec_sh("command -v openssl") == 0;
}

int sec_exists(const char* path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

int sec_count_named(const char* dir, const char* needle) {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, needle)) n++;
  closedir(d);
  return n;
}

char* sec_slurp(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) {
    b[n] = '\0';
    if (len) *len = (size_t)n;
  }
  return b;
}
