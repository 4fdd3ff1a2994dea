/* libFuzzer target for the codec's strict decoder: any bytes must give a status, never a crash,
 * an out-of-bounds access or a non-finite accumulated value. Built with -DNB_FUZZ=ON and clang;
 * the checked-in corpus also runs as a normal test (corpus_main.c). */
#include "fuzz_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/checksum.h"
#include "compress/compress.h"

nb_status_t nb_fuzz_decode(const uint8_t* data, size_t size) {
  static nb_codec_t* codec; /* reused scratch: the fuzzer calls us from one thread */
  if (!codec && nb_codec_create(NULL, &codec) != NB_OK) return NB_ERR_NOMEM;
  nb_codec_limits_t lim = {
      .max_n = 1u << 20, .max_frame_bytes = 1u << 24, .max_raw_bytes = 1u << 24};
  nb_frame_info_t info;
  nb_status_t st_info = nb_codec_frame_info(data, size, &lim, &info);
  uint64_t n = 0;
  if (size >= 24) memcpy(&n, data + 16, 8);
  if (n > lim.max_n) n = 0;
  float* out = calloc(n ? (size_t)n : 1, sizeof *out);
  if (!out) return NB_ERR_NOMEM;
  nb_status_t st = nb_codec_decode_accumulate(codec, data, size, 0.5f, out, (size_t)n, &lim);
  if (st == NB_OK) {
    if (st_info != NB_OK) __builtin_trap(); /* decode accepted what the header check refused */
    for (uint64_t i = 0; i < n; i++)
      if (!isfinite(out[i])) __builtin_trap();
  }
  free(out);
  return st;
}

void nb_fuzz_decode_resealed(const uint8_t* data, size_t size) {
  if (size < NB_FRAME_HEADER_BYTES) return;
  uint8_t* copy = malloc(size);
  if (!copy) return;
  memcpy(copy, data, size);
  uint64_t pb;
  memcpy(&pb, copy + 72, 8);
  if (pb > size - NB_FRAME_HEADER_BYTES) pb = size - NB_FRAME_HEADER_BYTES;
  uint64_t sum = nb_xxh3_64(copy + NB_FRAME_HEADER_BYTES, (size_t)pb, nb_xxh3_64(copy, 80, 0));
  memcpy(copy + 80, &sum, 8);
  nb_fuzz_decode(copy, size);
  free(copy);
}

#ifdef NB_FUZZ_MAIN
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nb_fuzz_decode(data, size);
  nb_fuzz_decode_resealed(data, size);
  return 0;
}
#endif
