/* Runs the decoder fuzz entry over every file of a corpus folder as a normal test. A file named
 * ok-*, codec-* or integrity-* must give NB_OK, NB_ERR_CODEC or NB_ERR_INTEGRITY; any other file
 * (for example a crash-* input the fuzzer found) must simply not crash. Every file is also
 * decoded with its checksum recomputed, and drives the encoder, as the fuzz target does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tests/lib/corpus_walk.h"
#include "fuzz_decode.h"

typedef struct {
  int rejected;
} nb__corpus_t;

static int replay(void* ctx, const char* name, const uint8_t* data, size_t len) {
  nb__corpus_t* c = ctx;
  nb_status_t st = nb_fuzz_decode(data, len);
  char msg[600];
  snprintf(msg, sizeof msg, "%s", nb_error_last());
  nb_fuzz_decode_resealed(data, len);
  nb_fuzz_encode(data, len);
  c->rejected += st != NB_OK;
  int has_want = 1;
  nb_status_t want = NB_OK;
  if (strncmp(name, "ok-", 3) == 0)
    want = NB_OK;
  else if (strncmp(name, "codec-", 6) == 0)
    want = NB_ERR_CODEC;
  else if (strncmp(name, "integrity-", 10) == 0)
    want = NB_ERR_INTEGRITY;
  else
    has_want = 0;
  if (has_want && st != want) {
    fprintf(stderr, "FAIL %s: %s (%s), want %s\n", name, nb_status_name(st), msg,
            nb_status_name(want));
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  nb__corpus_t c = {0};
  int files = 0;
  int failures = nb_corpus_walk((const char* const*)argv + 1, 1, replay, &c, &files);
  if (failures < 0) return 1;
  printf("%d corpus files, %d rejected, %d failures\n", files, c.rejected, failures);
  if (c.rejected < 20) {
    fprintf(stderr, "FAIL: the corpus must hold at least 20 bad frames\n");
    return 1;
  }
  return failures ? 1 : 0;
}
