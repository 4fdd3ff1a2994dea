/* Fuzz target for the checkpoint loader (nb_checkpoint_parse). Built with clang
 * -fsanitize=fuzzer,address -DNB_LIBFUZZER it is a libFuzzer target; otherwise main() is a
 * deterministic smoke run for CI: every file given on the command line, then thousands of seeded
 * mutations (byte flips, truncations, header-length edits, JSON splices) of a valid checkpoint.
 * The loader must accept or reject each input with a status, never crash or leak. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "train/checkpoint.h"
#include "train/model.h"
#include "train/rng.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nb_ckpt_t* c = NULL;
  if (nb_checkpoint_parse(data, size, "fuzz", &c) == NB_OK) {
    for (size_t i = 0; i < nb_checkpoint_num_tensors(c); i++) {
      const void* p;
      size_t nb;
      if (nb_checkpoint_tensor(c, i, NULL, NULL, NULL, &p, &nb) == NB_OK && nb >= 4) {
        volatile uint8_t x = ((const uint8_t*)p)[nb - 1]; /* touch the last byte */
        (void)x;
      }
    }
    nb_checkpoint_close(c);
  }
  return 0;
}

#ifndef NB_LIBFUZZER
static const char* const splices[] = {"{",      "}",       "[",    "]",
                                      "\"",     ":",       ",",    "-1",
                                      "1e308",  "\"F16\"", "null", "99999999999999999999",
                                      "\\u0000"};

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    FILE* f = fopen(argv[i], "rb");
    if (!f) continue;
    uint8_t* b = malloc(1 << 20);
    size_t n = fread(b, 1, 1 << 20, f);
    fclose(f);
    LLVMFuzzerTestOneInput(b, n);
    free(b);
  }
  /* a valid seed checkpoint */
  char dir[256], path[300];
  snprintf(dir, sizeof dir, "%s/nb_fuzz_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/seed.safetensors", dir);
  nb_model_config_t cfg = nb_model_config_make(1, 4, 1, 4);
  nb_model_t* m;
  if (nb_model_create(&cfg, 1, &m) != NB_OK || nb_checkpoint_save(path, m, 1) != NB_OK) return 1;
  /* bad seeds that must be refused: a checksummed checkpoint with a NaN, one with an Inf */
  for (int k = 0; k < 2; k++) {
    float* w = nb_model_params(m, NULL);
    float keep = w[k * 7];
    w[k * 7] = k ? -1.0f / 0.0f : 0.0f / 0.0f;
    int saved = nb_checkpoint_save(path, m, 1) == NB_OK;
    w[k * 7] = keep;
    nb_ckpt_t* c = NULL;
    if (!saved || nb_checkpoint_open(path, &c) != NB_ERR_INVALID ||
        !strstr(nb_error_last(), "non-finite")) {
      fprintf(stderr, "fuzz_checkpoint: a checkpoint with a %s weight was not refused\n",
              k ? "-Inf" : "NaN");
      nb_checkpoint_close(c);
      return 1;
    }
  }
  if (nb_checkpoint_save(path, m, 1) != NB_OK) return 1;
  nb_model_destroy(m);
  FILE* f = fopen(path, "rb");
  uint8_t* seed = malloc(1 << 16);
  size_t len = fread(seed, 1, 1 << 16, f);
  fclose(f);
  unlink(path);
  rmdir(dir);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)seed[i] << (8 * i);
  uint8_t* b = malloc(len + 64);
  nb_rng_t r;
  nb_rng_seed(&r, 2024);
  int accepted = 0, iters = 4000;
  for (int it = 0; it < iters; it++) {
    memcpy(b, seed, len);
    size_t n = len;
    int kind = (int)nb_rng_below(&r, 4);
    if (kind == 0) { /* flip bytes, mostly in the header */
      int k = 1 + (int)nb_rng_below(&r, 4);
      for (int j = 0; j < k; j++)
        b[nb_rng_below(&r, 8 + hl)] ^= (uint8_t)(1u << nb_rng_below(&r, 8));
    } else if (kind == 1) {
      n = (size_t)nb_rng_below(&r, len);
    } else if (kind == 2) {
      uint64_t v = nb_rng_below(&r, 2) ? hl + nb_rng_below(&r, 64) - 32 : nb_rng_u64(&r);
      for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    } else {
      const char* s = splices[nb_rng_below(&r, sizeof splices / sizeof *splices)];
      size_t at = 8 + (size_t)nb_rng_below(&r, hl), sl = strlen(s);
      if (at + sl <= 8 + hl) memcpy(b + at, s, sl);
    }
    nb_ckpt_t* c = NULL;
    if (nb_checkpoint_parse(b, n, "mutant", &c) == NB_OK) {
      accepted++;
      nb_checkpoint_close(c);
    }
  }
  printf("checkpoint fuzz smoke: %d mutants, %d still valid (e.g. whitespace or no-op edits)\n",
         iters, accepted);
  free(seed);
  free(b);
  return accepted < iters ? 0 : 1; /* the mutations must have been rejected at least sometimes */
}
#endif
