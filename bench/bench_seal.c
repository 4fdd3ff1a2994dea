/* `nebula bench seal`: throughput of sealing and opening frame chunks (AES-256-GCM through
 * security/seal.h, one context, one thread) against memcpy of the same bytes in the same run.
 * It measures the crypto path only: no network, no framing, no compression. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "security/seal.h"

#define NB__SEAL_REPS_MAX 64

int nb_bench_seal_main(int argc, char** argv) {
  long mib = 128, chunk_kib = 1024, reps = 5;
  int json = 0;
  const nb_opt_t opts[] = {
      NB_OPTION("mib", NB_OPT_LONG, &mib, "M", "MiB sealed and opened (default 128)", .min = 1,
                .max = 16384),
      NB_OPTION("chunk-kib", NB_OPT_LONG, &chunk_kib, "K", "chunk size in KiB (default 1024)",
                .min = 1, .max = 1 << 20),
      NB_OPTION("reps", NB_OPT_LONG, &reps, "R", "repetitions, the median is shown (default 5)",
                .min = 1, .max = NB__SEAL_REPS_MAX),
      NB_OPTION("json", NB_OPT_FLAG, &json, NULL, "print one JSON object"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula bench seal",
      .synopsis = "usage: nebula bench seal [--mib M] [--chunk-kib K] [--reps R] [--json]",
      .about =
          "Seals and opens M MiB in chunks of K KiB with AES-256-GCM, R times, and compares\n"
          "the median GB/s with memcpy of the same bytes.",
      .opts = opts,
  };
  int prc = nb_opts_parse(&spec, argc, argv);
  if (prc != NB_OPTS_RUN) return prc;
  size_t bytes = (size_t)mib << 20, chunk = (size_t)chunk_kib << 10;
  if (chunk > bytes) chunk = bytes;
  size_t nchunks = (bytes + chunk - 1) / chunk;
  uint8_t *src = NULL, *dst = NULL, *back = NULL;
  nb_seal_ctx_t *a = NULL, *b = NULL;
  int rc = 1;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  static const char hdr[] = "NBF1 bench frame header 0123456789";
  nb_status_t st = nb_aligned_alloc((void**)&src, bytes, 1, "bench source");
  if (st == NB_OK)
    st = nb_aligned_alloc((void**)&dst, bytes + nchunks * NB_SEAL_TAG_BYTES, 1, "bench sealed");
  if (st == NB_OK) st = nb_aligned_alloc((void**)&back, bytes, 1, "bench opened");
  if (st == NB_OK) st = nb_seal_secret_generate(secret);
  nb_seal_opts_t o = {.replay_rounds = (uint32_t)reps + 1};
  if (st == NB_OK) st = nb_seal_ctx_create(secret, "bench", "dc-a", "dc-b", &o, &a);
  if (st == NB_OK) st = nb_seal_ctx_create(secret, "bench", "dc-b", "dc-a", &o, &b);
  if (st != NB_OK) {
    fprintf(stderr, "nebula bench seal: %s: %s\n", nb_status_name(st), nb_error_last());
    goto done;
  }
  for (size_t i = 0; i < bytes; i++) src[i] = (uint8_t)(i * 2654435761u >> 13);
  memset(dst, 0, bytes + nchunks * NB_SEAL_TAG_BYTES); /* fault every page in before timing */
  memset(back, 0, bytes);

  double t_cpy[NB__SEAL_REPS_MAX], t_seal[NB__SEAL_REPS_MAX], t_open[NB__SEAL_REPS_MAX];
  for (long r = 0; r < reps; r++) {
    int64_t t0 = nb_now_ns();
    memcpy(back, src, bytes);
    int64_t t1 = nb_now_ns();
    size_t off = 0, ooff = 0;
    for (size_t c = 0; c < nchunks; c++) {
      size_t n = bytes - off < chunk ? bytes - off : chunk, ol = 0;
      st = nb_seal_chunk(a, (uint64_t)r, c, hdr, sizeof hdr, src + off, n, dst + ooff, &ol);
      if (st != NB_OK) break;
      off += n;
      ooff += ol;
    }
    int64_t t2 = nb_now_ns();
    off = ooff = 0;
    for (size_t c = 0; st == NB_OK && c < nchunks; c++) {
      size_t n = bytes - off < chunk ? bytes - off : chunk, ol = 0;
      st = nb_open_chunk(b, (uint64_t)r, c, hdr, sizeof hdr, dst + ooff, n + NB_SEAL_TAG_BYTES,
                         back + off, &ol);
      off += n;
      ooff += n + NB_SEAL_TAG_BYTES;
    }
    int64_t t3 = nb_now_ns();
    if (st != NB_OK) {
      fprintf(stderr, "nebula bench seal: %s: %s\n", nb_status_name(st), nb_error_last());
      goto done;
    }
    t_cpy[r] = (double)(t1 - t0) * 1e-9;
    t_seal[r] = (double)(t2 - t1) * 1e-9;
    t_open[r] = (double)(t3 - t2) * 1e-9;
  }
  if (memcmp(back, src, bytes) != 0) {
    fprintf(stderr, "nebula bench seal: opened bytes differ from the original\n");
    goto done;
  }
  double gb = (double)bytes * 1e-9;
  double cpy = gb / nb_bench_median(t_cpy, (size_t)reps);
  double seal = gb / nb_bench_median(t_seal, (size_t)reps);
  double open = gb / nb_bench_median(t_open, (size_t)reps);
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_int(&j, "mib", mib);
    nb_json_int(&j, "chunk_kib", (long long)(chunk >> 10));
    nb_json_int(&j, "reps", reps);
    nb_json_num(&j, "memcpy_gbps", cpy);
    nb_json_num(&j, "seal_gbps", seal);
    nb_json_num(&j, "open_gbps", open);
    nb_json_num(&j, "seal_vs_memcpy", seal / cpy);
    nb_json_num(&j, "open_vs_memcpy", open / cpy);
    nb_json_end(&j);
  } else {
    printf("seal: %ld MiB in %zu KiB chunks (AES-256-GCM, 1 thread), median of %ld runs\n", mib,
           chunk >> 10, reps);
    printf("  memcpy  %7.2f GB/s\n", cpy);
    printf("  seal    %7.2f GB/s  (%.2fx memcpy)\n", seal, seal / cpy);
    printf("  open    %7.2f GB/s  (%.2fx memcpy)\n", open, open / cpy);
  }
  rc = 0;
done:
  nb_seal_ctx_destroy(a);
  nb_seal_ctx_destroy(b);
  nb_free(src);
  nb_free(dst);
  nb_free(back);
  return rc;
}
