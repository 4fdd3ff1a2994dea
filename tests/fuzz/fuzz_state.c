/* Fuzz target for the session's state file (nb_session_load, through libnebula's public header
 * only): any bytes as the file, as given and with the trailing checksum recomputed (so that the
 * parser behind it is reached), are loaded or refused with a clear status, and a refusal changes
 * nothing. Never a crash. Built as a libFuzzer target with -DNB_FUZZ=ON (clang); the replay test
 * (state_replay.c) runs the same entry over a corpus and deterministic mutations. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "fuzz_state.h"

static nb_session_t* g_s;
static float g_w[12];
static uint16_t g_h[5];
static char g_dir[64], g_path[128];

static void nb__fz_fail(const char* what) {
  fprintf(stderr, "fuzz_state: %s (%s)\n", what, nb_error_last());
  abort();
}

static void nb__fz_cleanup(void) {
  nb_session_close(g_s);
  g_s = NULL;
  unlink(g_path);
  rmdir(g_dir);
}

static void nb__fz_init(void) {
  if (g_s) return;
  snprintf(g_dir, sizeof g_dir, "/tmp/nb_fuzz_state_XXXXXX");
  if (!mkdtemp(g_dir)) nb__fz_fail("mkdtemp");
  snprintf(g_path, sizeof g_path, "%s/state.bin", g_dir);
  atexit(nb__fz_cleanup);
  nb_session_options_t o;
  nb_session_options_default(&o);
  o.job_id = "fuzz-state";
  o.cluster_id = "solo";
  o.insecure = o.unsealed = 1;
  if (nb_session_open(&o, &g_s) != NB_OK) nb__fz_fail("open");
  int64_t s34[2] = {3, 4}, s5[1] = {5};
  for (int i = 0; i < 12; i++) g_w[i] = 0.25f * (float)i;
  for (int i = 0; i < 5; i++) g_h[i] = (uint16_t)(0x3f80 + i); /* 1.0, 1.0078, ... */
  if (nb_session_register(g_s, "w", g_w, s34, 2) != NB_OK ||
      nb_session_register_dtype(g_s, "h", g_h, NB_DTYPE_BF16, s5, 1) != NB_OK ||
      nb_session_start(g_s) != NB_OK)
    nb__fz_fail("register/start");
}

static nb_status_t nb__fz_load(const uint8_t* bytes, size_t len) {
  FILE* f = fopen(g_path, "wb");
  if (!f || (len && fwrite(bytes, 1, len, f) != len) || fclose(f) != 0) nb__fz_fail("write");
  float w0[12];
  uint16_t h0[5];
  memcpy(w0, g_w, sizeof w0);
  memcpy(h0, g_h, sizeof h0);
  uint64_t hash0 = nb_session_global_hash(g_s);
  nb_status_t st = nb_session_load(g_s, g_path);
  if (st != NB_OK && st != NB_ERR_INVALID && st != NB_ERR_CONFIG && st != NB_ERR_INTEGRITY)
    nb__fz_fail("unexpected status");
  if (st != NB_OK) {
    if (nb_session_global_hash(g_s) != hash0 || memcmp(w0, g_w, sizeof w0) ||
        memcmp(h0, g_h, sizeof h0))
      nb__fz_fail("a refused load changed the session");
    if (!nb_error_last()[0]) nb__fz_fail("a refusal without a message");
    return st;
  }
  for (int i = 0; i < 12; i++)
    if (!isfinite(g_w[i])) nb__fz_fail("a loaded state left a non-finite fp32 value");
  for (int i = 0; i < 5; i++)
    if ((g_h[i] & 0x7f80) == 0x7f80) nb__fz_fail("a loaded state left a non-finite bf16 value");
  return st;
}

nb_status_t nb_fuzz_state(const uint8_t* bytes, size_t len) {
  nb__fz_init();
  nb__fz_load(bytes, len);
  if (len < 8) return nb__fz_load(bytes, len);
  uint8_t* copy = malloc(len);
  if (!copy) nb__fz_fail("malloc");
  memcpy(copy, bytes, len);
  uint64_t sum = XXH3_64bits(copy, len - 8);
  for (int i = 0; i < 8; i++) copy[len - 8 + (size_t)i] = (uint8_t)(sum >> (8 * i));
  nb_status_t st = nb__fz_load(copy, len);
  free(copy);
  return st;
}

void nb_fuzz_state_seed(uint8_t** out, size_t* len) {
  nb__fz_init();
  g_w[5] += 1.0f; /* a round with some progress, so momentum and theta_global are not trivial */
  if (nb_session_round(g_s, 4, NULL) != NB_OK || nb_session_save(g_s, g_path) != NB_OK)
    nb__fz_fail("seed round/save");
  FILE* f = fopen(g_path, "rb");
  if (!f) nb__fz_fail("seed read");
  static uint8_t buf[1 << 16];
  *len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  *out = malloc(*len);
  if (!*out) nb__fz_fail("malloc");
  memcpy(*out, buf, *len);
}

#ifdef NB_FUZZ_MAIN
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nb_fuzz_state(data, size);
  return 0;
}
#endif
