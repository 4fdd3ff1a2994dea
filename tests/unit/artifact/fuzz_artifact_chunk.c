/* libFuzzer target for the receiving side of an artifact transfer: any bytes given as the next
 * ArtifactChunk message of a Fetch call must be refused with NB_ERR_INTEGRITY (or accepted as the
 * genuine chunk); never a crash, never plaintext outside the object. Built with -DNB_FUZZ=ON and
 * clang; without it, main() replays a corpus folder (ok-* files must be accepted, integrity-*
 * refused, any other file must not crash) and `--write-seed DIR` writes the genuine chunk and a
 * few damaged ones. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gateway/artifact_internal.h"

#define NB__FZ_SHA "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
#define NB__FZ_SIZE 300u
static const uint8_t nb__fz_secret[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                          12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                          23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static nb_status_t nb__fz_one(const uint8_t* data, size_t size) {
  nb__artifact_rx_t rx;
  memset(&rx, 0, sizeof rx);
  rx.secret = nb__fz_secret;
  rx.job_id = "fuzz-job";
  rx.self = "dc-b";
  snprintf(rx.sha256, sizeof rx.sha256, "%s", NB__FZ_SHA);
  rx.size = NB__FZ_SIZE;
  const uint8_t* plain = NULL;
  size_t pl = 0;
  uint64_t at = 0;
  nb_status_t st = nb__artifact_rx_chunk(&rx, data, size, &plain, &pl, &at);
  if (st == NB_OK && (at != 0 || pl > NB__FZ_SIZE || rx.off != pl || !plain)) abort();
  if (st != NB_OK && st != NB_ERR_INTEGRITY && st != NB_ERR_NOMEM) abort();
  nb__artifact_rx_clear(&rx);
  return st;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nb__fz_one(data, size);
  return 0;
}

#ifndef NB_FUZZ_LIBFUZZER
#include "tests/lib/corpus_walk.h"

static int nb__fz_write(const char* dir, const char* name, const uint8_t* b, size_t n) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE* f = fopen(p, "wb");
  if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) return 1;
  return 0;
}

/* The genuine first chunk (all 300 bytes) of a transfer with a fixed transfer id, and variants. */
static int nb__fz_seed(const char* dir) {
  uint8_t tid[NB__ARTIFACT_TID_BYTES], buf[NB__FZ_SIZE + NB_SEAL_TAG_BYTES], m[1024], b[1024];
  memset(tid, 0x42, sizeof tid);
  for (unsigned i = 0; i < NB__FZ_SIZE; i++) buf[i] = (uint8_t)i;
  nb_seal_ctx_t* tx = NULL;
  size_t ml = 0;
  if (nb__artifact_seal_ctx(nb__fz_secret, "fuzz-job", tid, "dc-b", 1, &tx) != NB_OK ||
      nb__artifact_chunk_pack(tx, tid, NB__FZ_SHA, NB__FZ_SIZE, 0, 0, buf, NB__FZ_SIZE, m, sizeof m,
                              &ml) != NB_OK) {
    fprintf(stderr, "seed: %s\n", nb_error_last());
    return 1;
  }
  nb_seal_ctx_destroy(tx);
  int rc = nb__fz_write(dir, "ok-genuine.chunk", m, ml);
  memcpy(b, m, ml);
  b[ml - 1] ^= 1;
  rc |= nb__fz_write(dir, "integrity-tag-flipped.chunk", b, ml);
  memcpy(b, m, ml);
  b[5] ^= 0x20; /* inside the header (the associated data) */
  rc |= nb__fz_write(dir, "integrity-header-flipped.chunk", b, ml);
  rc |= nb__fz_write(dir, "integrity-truncated.chunk", m, ml - 17);
  rc |= nb__fz_write(dir, "integrity-empty.chunk", m, 0);
  b[0] = 0xff, b[1] = 0xff, b[2] = 0xff;
  rc |= nb__fz_write(dir, "integrity-garbage.chunk", b, 3);
  return rc;
}

/* ok-* files must be accepted, integrity-* ones refused as such, any other must not crash */
static int nb__fz_replay(void* ctx, const char* name, const uint8_t* buf, size_t n) {
  (void)ctx;
  nb_status_t st = nb__fz_one(buf, n);
  nb_status_t want = !strncmp(name, "ok-", 3)           ? NB_OK
                     : !strncmp(name, "integrity-", 10) ? NB_ERR_INTEGRITY
                                                        : st;
  if (st != want) {
    fprintf(stderr, "%s: %s, expected %s\n", name, nb_status_name(st), nb_status_name(want));
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--write-seed") == 0) return nb__fz_seed(argv[2]);
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR | --write-seed DIR\n", argv[0]);
    return 2;
  }
  int files = 0;
  int failures = nb_corpus_walk((const char* const*)argv + 1, 1, nb__fz_replay, NULL, &files);
  printf("%d corpus files, %d failures\n", files, failures);
  return failures || files == 0 ? 1 : 0;
}
#endif
