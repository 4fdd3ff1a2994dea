/* The session state file's fuzz entry as a normal test: a real state (one round, saved), the
 * damage a file can take with its checksums right or wrong (each with the status and message it
 * must get), then deterministic random mutations of it. Every load must end in NB_OK or a clear
 * refusal that changed nothing (fuzz_state.c checks that and aborts otherwise).
 *   state_replay            the test
 *   state_replay --seed D   writes the valid state to D/seed.bin (a corpus for the libFuzzer
 *                           target: build-fuzz/tests/fuzz/fuzz_state work D) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "fuzz_state.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

static uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}
static void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* theta_global's hash (header offset 32) and the file's trailing checksum made right again */
static void reseal(uint8_t* b, size_t len) {
  uint64_t n = get64(b + 8);
  if (len >= 64 + 4 * n) put64(b + 32, XXH3_64bits(b + 64, 4 * n));
  if (len >= 8) put64(b + len - 8, XXH3_64bits(b, len - 8));
}

static int g_fail;
static void expect(const char* name, const uint8_t* b, size_t len, nb_status_t want,
                   const char* says) {
  nb_status_t st = nb_fuzz_state(b, len);
  const char* msg = nb_error_last();
  if (st != want || (says && !strstr(msg, says))) {
    fprintf(stderr, "FAIL %s: %s (%s), want %s with \"%s\"\n", name, nb_status_name(st), msg,
            nb_status_name(want), says ? says : "");
    g_fail++;
  } else {
    printf("ok %s: %s%s%s\n", name, nb_status_name(st), st ? ": " : "", st ? msg : "");
  }
}

int main(int argc, char** argv) {
  uint8_t* seed = NULL;
  size_t len = 0;
  nb_fuzz_state_seed(&seed, &len);
  if (argc == 3 && !strcmp(argv[1], "--seed")) {
    char p[4096];
    snprintf(p, sizeof p, "%s/seed.bin", argv[2]);
    FILE* f = fopen(p, "wb");
    if (!f || fwrite(seed, 1, len, f) != len || fclose(f) != 0) return 1;
    free(seed);
    return 0;
  }
  const uint64_t n = get64(seed + 8); /* 12 + 5 floats */
  const size_t theta = 64, mom = 64 + 4 * n, res = 64 + 8 * n;
  uint8_t* b = malloc(len + 64);
  if (!b) return 1;
  expect("the saved state", seed, len, NB_OK, NULL);
  memcpy(b, seed, len);
  expect("truncated", b, len - 13, NB_ERR_INVALID, "not a round state");
  memcpy(b, seed, len);
  b[theta + 5] ^= 0x10;
  put64(b + len - 8, XXH3_64bits(b, len - 8)); /* only the trailing checksum right */
  expect("theta_global changed under its hash", b, len, NB_ERR_INTEGRITY, "hash mismatch");
  static const struct {
    const char* name;
    size_t at;
    uint32_t bits;
    const char* says;
  } nf[] = {
      {"NaN in theta_global", 0, 0x7fc00000u, "theta_global holds a non-finite value"},
      {"infinity in the momentum", 1, 0x7f800000u, "the outer momentum holds a non-finite"},
      {"-infinity in the residual", 2, 0xff800000u, "the residual holds a non-finite"},
  };
  for (size_t i = 0; i < sizeof nf / sizeof nf[0]; i++) {
    memcpy(b, seed, len);
    size_t at = (nf[i].at == 0 ? theta : nf[i].at == 1 ? mom : res) + 4 * 7;
    memcpy(b + at, &nf[i].bits, 4);
    reseal(b, len);
    expect(nf[i].name, b, len, NB_ERR_INVALID, nf[i].says);
  }
  memcpy(b, seed, len);
  b[4] = 9; /* the version */
  reseal(b, len);
  expect("another version", b, len, NB_ERR_INVALID, "not a round state");
  memcpy(b, seed, len);
  b[res + 4 * n + 20] ^= 0x04; /* the table's tensor count (magic, version, index, clusters,
                                  flags, then the count) */
  reseal(b, len);
  expect("the table's tensor count", b, len, NB_ERR_INVALID, "malformed tensor");
  memcpy(b, seed, len);
  b[res + 4 * n + 12] ^= 0x01; /* the table's cluster count: a state of another job */
  reseal(b, len);
  expect("the table's cluster count", b, len, NB_ERR_CONFIG, "is cluster 0 of 0's");
  expect("empty", b, 0, NB_ERR_INVALID, NULL);

  /* random damage, the checksums made right in most cases (the parser behind them is reached) */
  int counts[64] = {0};
  const int iters = 3000;
  for (int it = 0; it < iters; it++) {
    size_t m = len;
    memcpy(b, seed, len);
    int edits = 1 + (int)(rnd() % 4);
    for (int e = 0; e < edits; e++) {
      switch (rnd() % 5) {
        case 0:
          b[rnd() % m] ^= (uint8_t)(1u << (rnd() % 8));
          break;
        case 1:
          b[rnd() % m] = (uint8_t)rnd();
          break;
        case 2:
          m = 1 + rnd() % m;
          break;  /* truncated */
        case 3: { /* extended, within the buffer */
          size_t more = rnd() % 64;
          if (m + more <= len + 64) m += more;
          break;
        }
        default: { /* a float of the body: huge, tiny, NaN, infinity or random bits */
          static const uint32_t v[] = {0x7f7fffffu, 0x00000001u, 0x7fc00001u, 0x7f800000u};
          uint32_t x = rnd() % 2 ? v[rnd() % 4] : (uint32_t)rnd();
          size_t at = 64 + 4 * (rnd() % (3 * n));
          if (at + 4 <= m) memcpy(b + at, &x, 4);
        }
      }
    }
    if (rnd() % 4) reseal(b, m);
    nb_status_t st = nb_fuzz_state(b, m);
    counts[st < 64 ? st : 63]++;
  }
  printf("%d mutations: %d loaded, %d NB_ERR_INVALID, %d NB_ERR_CONFIG, %d NB_ERR_INTEGRITY\n",
         iters, counts[NB_OK], counts[NB_ERR_INVALID], counts[NB_ERR_CONFIG],
         counts[NB_ERR_INTEGRITY]);
  if (!counts[NB_OK] || !counts[NB_ERR_INVALID] || !counts[NB_ERR_INTEGRITY]) {
    fprintf(stderr, "FAIL: the mutations did not reach every outcome\n");
    g_fail++;
  }
  free(b);
  free(seed);
  return g_fail ? 1 : 0;
}
