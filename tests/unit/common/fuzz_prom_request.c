/* Fuzz target for the /metrics listener's request parser (common/prom.c,
 * nb__prom_request_status): any bytes give 200, 400, 404 or 405, a 200 only for a head that
 * starts "GET /metrics" followed by a space or '?', never a crash. Built as a replay driver over
 * prom-corpus/ in every build (each file's name starts with the status it must get, and 4000
 * deterministic mutations of each are checked against the invariants), and as a libFuzzer
 * target with -DNB_FUZZ=ON and clang. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/prom.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int st = nb__prom_request_status((const char*)data, size);
  if (st != 200 && st != 400 && st != 404 && st != 405) {
    fprintf(stderr, "status %d\n", st);
    abort();
  }
  if (st == 200 &&
      (size < 13 || memcmp(data, "GET /metrics", 12) || (data[12] != ' ' && data[12] != '?'))) {
    fprintf(stderr, "200 for a head that is not GET /metrics\n");
    abort();
  }
  if (st != 400 && memchr(data, 0, size)) {
    fprintf(stderr, "a head with a NUL not refused\n");
    abort();
  }
  return 0;
}

#ifndef NB_FUZZ_LIBFUZZER
static uint64_t nb__rng = 0x9e3779b97f4a7c15ull;

static uint64_t nb__next(void) { /* xorshift64*: the same mutations on every run */
  nb__rng ^= nb__rng >> 12;
  nb__rng ^= nb__rng << 25;
  nb__rng ^= nb__rng >> 27;
  return nb__rng * 2685821657736338717ull;
}

int main(int argc, char** argv) {
  int n = 0, mutated = 0;
  for (int i = 1; i < argc; i++) {
    DIR* d = opendir(argv[i]);
    if (!d) {
      fprintf(stderr, "cannot open %s\n", argv[i]);
      return 1;
    }
    struct dirent* e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
      FILE* f = fopen(p, "rb");
      if (!f) continue;
      static uint8_t buf[NB_PROM_MAX_REQUEST + 64];
      size_t len = fread(buf, 1, sizeof buf, f);
      fclose(f);
      int want = atoi(e->d_name), got = nb__prom_request_status((const char*)buf, len);
      if (want != got) {
        fprintf(stderr, "%s: status %d, expected %d\n", e->d_name, got, want);
        closedir(d);
        return 1;
      }
      printf("%-24s %d\n", e->d_name, got);
      LLVMFuzzerTestOneInput(buf, len);
      /* mutations: flip, insert, delete, truncate */
      static uint8_t m[sizeof buf + 8];
      for (int k = 0; k < 4000; k++) {
        size_t ml = len;
        memcpy(m, buf, len);
        int edits = 1 + (int)(nb__next() % 4);
        for (int j = 0; j < edits; j++) {
          size_t at = ml ? (size_t)(nb__next() % ml) : 0;
          switch (nb__next() % 4) {
            case 0:
              if (ml) m[at] ^= (uint8_t)(1u << (nb__next() % 8));
              break;
            case 1:
              if (ml < sizeof m - 1) {
                memmove(m + at + 1, m + at, ml - at);
                m[at] = (uint8_t)nb__next();
                ml++;
              }
              break;
            case 2:
              if (ml) {
                memmove(m + at, m + at + 1, ml - at - 1);
                ml--;
              }
              break;
            default:
              ml = at;
          }
        }
        LLVMFuzzerTestOneInput(m, ml);
        mutated++;
      }
      n++;
    }
    closedir(d);
  }
  printf("replayed %d requests, %d mutations\n", n, mutated);
  return n ? 0 : 1;
}
#endif
