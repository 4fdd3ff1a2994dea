/* Replays files (or every file in folders) through the descriptor fuzz target without libFuzzer,
 * so the bad corpus and the examples run through the fuzz harness in every build. */
#include <stdint.h>
#include <stdio.h>

#include "tests/lib/corpus_walk.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int replay(void* ctx, const char* name, const uint8_t* data, size_t len) {
  (void)ctx;
  (void)name;
  LLVMFuzzerTestOneInput(data, len);
  return 0;
}

int main(int argc, char** argv) {
  int files = 0;
  int bad = nb_corpus_walk((const char* const*)argv + 1, argc - 1, replay, NULL, &files);
  printf("replayed %d inputs through the descriptor fuzz target\n", files);
  return bad || files == 0 ? 1 : 0;
}
