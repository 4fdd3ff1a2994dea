/* Fuzz target for the /metrics listener's request parser (common/prom.c,
 * nb__prom_request_status): any bytes give 200, 400, 404 or 405, a 200 only for a head that
 * starts "GET /metrics" followed by a space or '?', never a crash. Built as a replay driver over
 * prom-corpus/ in every build (each file's name starts with the status it must get, and 4000
 * deterministic mutations of each are checked against the invariants), and as a libFuzzer
 * target with -DNB_FUZZ=ON and clang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/prom.h"
#include "tests/lib/corpus_walk.h"

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

/* A request whose file name starts with its expected status, then mutations of it. */
static int replay(void* ctx, const char* name, const uint8_t* data, size_t n_in) {
  int* mutated = ctx;
  static uint8_t buf[NB_PROM_MAX_REQUEST + 64];
  size_t len = n_in < sizeof buf ? n_in : sizeof buf; /* as a server reads at most */
  memcpy(buf, data, len);
  int want = atoi(name), got = nb__prom_request_status((const char*)buf, len);
  if (want != got) {
    fprintf(stderr, "%s: status %d, expected %d\n", name, got, want);
    return -1;
  }
  printf("%-24s %d\n", name, got);
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
    (*mutated)++;
  }
  return 0;
}

int main(int argc, char** argv) {
  int n = 0, mutated = 0;
  if (nb_corpus_walk((const char* const*)argv + 1, argc - 1, replay, &mutated, &n) != 0) return 1;
  printf("replayed %d requests, %d mutations\n", n, mutated);
  return n ? 0 : 1;
}
#endif
