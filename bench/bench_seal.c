/* `nebula bench seal`: throughput of sealing and opening frame chunks (AES-256-GCM through
 * security/seal.h, one context, one thread) against memcpy of the same bytes in the same run.
 * It measures the crypto path only: no network, no framing, no compression. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/common.h"
#include "security/seal.h"

#define NB__SEAL_REPS_MAX 64

static void nb__seal_usage(FILE* f) {
  fprintf(f,
          "usage: nebula bench seal [--mib M] [--chunk-kib K] [--reps R] [--json]\n"
          "  Seals and opens M MiB (default 128) in chunks of K KiB (default 1024) with\n"
          "  AES-256-GCM, R times (default 5), and compares the median GB/s with memcpy.\n");
}

static int nb__parse_pos(const char* opt, const char* s, long lo, long hi, long* out) {
  char* end = NULL;
  long v = strtol(s ? s : "", &end, 10);
  if (!s || !*s || *end || v < lo || v > hi) {
    fprintf(stderr, "nebula bench seal: %s takes an integer in %ld..%ld\n", opt, lo, hi);
    return 0;
  }
  *out = v;
  return 1;
}

int nb_bench_seal_main(int argc, char** argv) {
  long mib = 128, chunk_kib = 1024, reps = 5;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "--json"))
      json = 1;
    else if (!strcmp(a, "--mib") && nb__parse_pos(a, argv[i + 1], 1, 16384, &mib))
      i++;
    else if (!strcmp(a, "--chunk-kib") && nb__parse_pos(a, argv[i + 1], 1, 1 << 20, &chunk_kib))
      i++;
    else if (!strcmp(a, "--reps") && nb__parse_pos(a, argv[i + 1], 1, NB__SEAL_REPS_MAX, &reps))
      i++;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      nb__seal_usage(stdout);
      return 0;
    } else {
      nb__seal_usage(stderr);
      return 2;
    }
  }
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
