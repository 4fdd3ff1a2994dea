/* libFuzzer target for the codec's strict decoder: any bytes must give a status, never a crash,
 * an out-of-bounds access or a non-finite accumulated value. The same bytes also drive the
 * encoder (every value type, global and chunked top-k with every chunk size, dense): any finite
 * input must encode, decode to finite values and leave a finite residual. Built with -DNB_FUZZ=ON
 * and clang; the checked-in corpus also runs as a normal test (corpus_main.c). */
#include "fuzz_decode.h"

#include <float.h>
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

void nb_fuzz_encode(const uint8_t* data, size_t size) {
  if (size < 8) return;
  static const nb_values_t types[] = {NB_VALUES_FP32, NB_VALUES_FP16, NB_VALUES_BF16,
                                      NB_VALUES_INT8, NB_VALUES_INT4, NB_VALUES_INT2};
  nb_codec_config_t cfg;
  nb_codec_config_default(&cfg);
  cfg.values = types[data[0] % 6];
  /* 0 (global), or chunks of 16 .. 65536: chunked frames are coded Rice, plain chunked, varint
   * or bitmap, whichever the encoder finds smallest */
  cfg.topk_chunk = data[1] % 14 == 0 ? 0 : 1u << (3 + data[1] % 14);
  cfg.block_size = 1 + data[3] % 64;
  cfg.zstd_level = data[2] & 1;
  cfg.threads = 1;
  double density = (double)(data[2] >> 1) / 127.0;
  size_t n = (size - 4) / 4;
  if (n > (1u << 16)) n = 1u << 16;
  nb_codec_t* c = NULL;
  if (nb_codec_create(&cfg, &c) != NB_OK) __builtin_trap();
  float *x = malloc((n ? n : 1) * 4), *res = calloc(n ? n : 1, 4), *out = calloc(n ? n : 1, 4);
  size_t cap = nb_codec_frame_bound(n, n, cfg.values, cfg.block_size), len = 0;
  uint8_t* frame = malloc(cap);
  if (!x || !res || !out || !frame) goto done;
  memcpy(x, data + 4, n * 4);
  for (size_t i = 0; i < n; i++) /* finite inputs only, +-FLT_MAX and subnormals included */
    if (isnan(x[i]))
      x[i] = 0.0f;
    else if (isinf(x[i]))
      x[i] = x[i] > 0 ? FLT_MAX : -FLT_MAX;
  nb_status_t st = data[0] & 0x80
                       ? nb_codec_encode_dense(c, x, n, 1, 2, frame, cap, &len)
                       : nb_codec_encode_sparse(c, x, res, n, density, 1, 2, frame, cap, &len);
  if (st != NB_OK) __builtin_trap(); /* a finite input always encodes */
  if (nb_codec_decode_accumulate(c, frame, len, 1.0f, out, n, NULL) != NB_OK) __builtin_trap();
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(out[i]) || !isfinite(res[i])) __builtin_trap();
    if (!(data[0] & 0x80)) { /* sent + residual == input up to one rounding */
      double err = fabs((double)out[i] + (double)res[i] - (double)x[i]);
      if (err > 0x1.0p-24 * (fabs((double)x[i]) + fabs((double)out[i]))) __builtin_trap();
    }
  }
done:
  free(x), free(res), free(out), free(frame);
  nb_codec_destroy(c);
}

#ifdef NB_FUZZ_MAIN
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nb_fuzz_decode(data, size);
  nb_fuzz_decode_resealed(data, size);
  nb_fuzz_encode(data, size);
  return 0;
}
#endif
