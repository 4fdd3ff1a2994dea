/* tests/lib/corpus_walk: see corpus_walk.h. */
#include "tests/lib/corpus_walk.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The whole file at path into *buf (malloc'd, grown), *len; 0, or -1 (printed). */
static int nb__cw_read(const char* path, uint8_t** buf, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  size_t cap = 0, got;
  *buf = NULL;
  *len = 0;
  do {
    if (*len == cap) {
      cap = cap ? 2 * cap : 4096;
      uint8_t* b = realloc(*buf, cap);
      if (!b) {
        free(*buf);
        fclose(f);
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
      }
      *buf = b;
    }
    got = fread(*buf + *len, 1, cap - *len, f);
    *len += got;
  } while (got > 0);
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    fprintf(stderr, "%s: read error\n", path);
    free(*buf);
    return -1;
  }
  return 0;
}

static int nb__cw_one(const char* path, const char* name, nb_corpus_fn fn, void* ctx, int* files) {
  uint8_t* buf;
  size_t len;
  if (nb__cw_read(path, &buf, &len) != 0) return -1;
  int r = fn(ctx, name, buf, len);
  free(buf);
  if (files) (*files)++;
  return r;
}

static int nb__cw_visible(const struct dirent* e) {
  return e->d_name[0] != '.';
}

int nb_corpus_walk(const char* const* paths, int n, nb_corpus_fn fn, void* ctx, int* files) {
  int failures = 0;
  if (files) *files = 0;
  for (int i = 0; i < n; i++) {
    struct stat sb;
    if (stat(paths[i], &sb) != 0) {
      perror(paths[i]);
      return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
      int r = nb__cw_one(paths[i], paths[i], fn, ctx, files);
      if (r < 0) return -1;
      failures += r;
      continue;
    }
    struct dirent** list = NULL;
    int m = scandir(paths[i], &list, nb__cw_visible, alphasort);
    if (m < 0) {
      perror(paths[i]);
      return -1;
    }
    int r = 0;
    for (int j = 0; j < m; j++) {
      if (r >= 0) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", paths[i], list[j]->d_name);
        r = nb__cw_one(p, list[j]->d_name, fn, ctx, files);
        if (r > 0) failures += r;
      }
      free(list[j]);
    }
    free(list);
    if (r < 0) return -1;
  }
  return failures;
}
