/* Runs the decoder fuzz entry over every file of a corpus folder as a normal test. A file named
 * ok-*, codec-* or integrity-* must give NB_OK, NB_ERR_CODEC or NB_ERR_INTEGRITY; any other file
 * (for example a crash-* input the fuzzer found) must simply not crash. Every file is also
 * decoded with its checksum recomputed, and drives the encoder, as the fuzz target does. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fuzz_decode.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  DIR* d = opendir(argv[1]);
  if (!d) {
    perror(argv[1]);
    return 1;
  }
  int failures = 0, files = 0, rejected = 0;
  struct dirent* e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
    FILE* f = fopen(path, "rb");
    if (!f) {
      perror(path);
      failures++;
      continue;
    }
    uint8_t* buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
      if (len == cap) {
        cap = cap ? 2 * cap : 4096;
        buf = realloc(buf, cap);
      }
      got = fread(buf + len, 1, cap - len, f);
      len += got;
    } while (got > 0);
    fclose(f);
    nb_status_t st = nb_fuzz_decode(buf, len);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", nb_error_last());
    nb_fuzz_decode_resealed(buf, len);
    nb_fuzz_encode(buf, len);
    free(buf);
    files++;
    rejected += st != NB_OK;
    const char* name = e->d_name;
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
      failures++;
    }
  }
  closedir(d);
  printf("%d corpus files, %d rejected, %d failures\n", files, rejected, failures);
  if (rejected < 20) {
    fprintf(stderr, "FAIL: the corpus must hold at least 20 bad frames\n");
    return 1;
  }
  return failures ? 1 : 0;
}
