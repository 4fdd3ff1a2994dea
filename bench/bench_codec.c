/* `nebula bench codec`: the update codec on a realistic heavy-tailed vector. Encode (error
 * feedback + exact top-k + quantize + index coding + zstd + frame) and decode-and-accumulate are
 * timed on warm buffers (median of several runs) against a memcpy of the same buffer in the same
 * run; the wire size counts every byte of the frame. It measures; it asserts nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zstd.h>

#include "bench/bench.h"
#include "common/common.h"
#include "compress/compress.h"

static uint64_t nb__rng(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Large buffers: 2 MiB aligned and advised as huge pages, first-touched here (untimed). */
static float* nb__big(size_t n) {
  size_t bytes = (n * sizeof(float) + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
  void* p = NULL;
  if (posix_memalign(&p, 2u << 20, bytes ? bytes : 4) != 0) return NULL;
  madvise(p, bytes, MADV_HUGEPAGE);
  memset(p, 0, bytes);
  return (float*)p;
}

/* A heavy-tailed pseudo-update: per-"tensor" segments with log-normal scales, and within each a
 * symmetric Weibull(shape 2/3) magnitude (heavier tail than Laplace), like pseudo-gradients. */
static void nb__fill(float* x, size_t n, uint64_t seed) {
  enum { Q = 4096 };
  static float table[Q];
  for (int i = 0; i < Q; i++) table[i] = (float)pow(-log((i + 0.5) / Q), 1.5);
  uint64_t s = seed;
  size_t seg = 1u << 20;
  for (size_t b = 0; b < n; b += seg) {
    double u1 = (nb__rng(&s) >> 11) * 0x1.0p-53 + 1e-12, u2 = (nb__rng(&s) >> 11) * 0x1.0p-53;
    float scale = (float)(1e-3 * exp(0.8 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2)));
    size_t e = n - b < seg ? n : b + seg;
    for (size_t i = b; i < e; i++) {
      uint64_t r = nb__rng(&s);
      float v = table[r >> 52] * (1.0f + (float)((r >> 20) & 0xffff) * (1.0f / 65536.0f / 64.0f));
      x[i] = (r & 1) ? -scale * v : scale * v;
    }
  }
}

static void nb__usage(void) {
  fprintf(stderr,
          "usage: nebula bench codec [--n N] [--density D]\n"
          "                          [--values int8|4bit|2bit|fp16|bf16|fp32] [--block B]\n"
          "                          [--topk-chunk C] [--zstd-level L] [--threads T] [--runs R]\n"
          "                          [--input FILE.f32] [--json]\n"
          "  --block sets the values per scale of int8/4bit/2bit; --topk-chunk C selects chunked\n"
          "  top-k (a power of two >= 16; 0 = global top-k), as NB_CODEC_TOPK_CHUNK.\n"
          "  --input reads a raw little-endian fp32 vector (for example a real pseudo-gradient)\n"
          "  instead of the synthetic heavy-tailed one; n is then its length.\n");
}

int nb_bench_codec_main(int argc, char** argv) {
  size_t n = 64u << 20;
  double density = 0.01;
  int json = 0, runs = 7;
  const char* input = NULL;
  nb_codec_config_t cfg;
  nb_codec_config_default(&cfg);
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--json") == 0) {
      json = 1;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      nb__usage();
      return 0;
    }
    if (!v) {
      fprintf(stderr, "nebula bench codec: %s needs a value\n", a);
      nb__usage();
      return 2;
    }
    char* end = NULL;
    if (strcmp(a, "--n") == 0) {
      double d = strtod(v, &end);
      if (*end || !(d >= 1 && d <= 4294967295.0)) goto bad;
      n = (size_t)d;
    } else if (strcmp(a, "--density") == 0) {
      density = strtod(v, &end);
      if (*end || !(density >= 0 && density <= 1)) goto bad;
    } else if (strcmp(a, "--values") == 0) {
      if (nb_values_parse(v, &cfg.values) != NB_OK) goto bad;
    } else if (strcmp(a, "--block") == 0) {
      long b = strtol(v, &end, 10);
      if (*end || b < 1 || b > 65536) goto bad;
      cfg.block_size = (uint32_t)b;
    } else if (strcmp(a, "--topk-chunk") == 0) {
      long cc = strtol(v, &end, 10);
      if (*end || cc < 0 || cc > 65536) goto bad;
      cfg.topk_chunk = (uint32_t)cc;
    } else if (strcmp(a, "--zstd-level") == 0) {
      long l = strtol(v, &end, 10);
      if (*end || l < 0 || l > 19) goto bad;
      cfg.zstd_level = (int)l;
    } else if (strcmp(a, "--threads") == 0) {
      long t = strtol(v, &end, 10);
      if (*end || t < 1 || t > 64) goto bad;
      cfg.threads = (int)t;
    } else if (strcmp(a, "--input") == 0) {
      input = v;
    } else if (strcmp(a, "--runs") == 0) {
      long r = strtol(v, &end, 10);
      if (*end || r < 1 || r > 1000) goto bad;
      runs = (int)r;
    } else {
      fprintf(stderr, "nebula bench codec: unknown option '%s'\n", a);
      nb__usage();
      return 2;
    }
    i++;
    continue;
  bad:
    fprintf(stderr, "nebula bench codec: invalid value '%s' for %s\n", v, a);
    nb__usage();
    return 2;
  }

  int rc = 1;
  FILE* in = NULL;
  if (input) {
    in = fopen(input, "rb");
    long bytes = -1;
    if (in && fseek(in, 0, SEEK_END) == 0) bytes = ftell(in);
    if (!in || bytes <= 0 || bytes % 4 || fseek(in, 0, SEEK_SET) != 0) {
      fprintf(stderr, "nebula bench codec: cannot use '%s' (need a non-empty raw fp32 file)\n",
              input);
      if (in) fclose(in);
      return 1;
    }
    n = (size_t)bytes / 4;
  }
  nb_codec_t* codec = NULL;
  float *upd = nb__big(n), *res = nb__big(n), *out = nb__big(n);
  size_t k = nb_codec_k_for_density(n, density);
  size_t cap = nb_codec_frame_bound(n, k, cfg.values, cfg.block_size), len = 0, len0 = 0;
  uint8_t *frame = malloc(cap), *first = malloc(cap);
  double *t_enc = calloc((size_t)runs, sizeof(double)),
         *t_dec = calloc((size_t)runs, sizeof(double)),
         *t_cpy = calloc((size_t)runs, sizeof(double));
  if (!upd || !res || !out || !frame || !first || !t_enc || !t_dec || !t_cpy) {
    fprintf(stderr, "nebula bench codec: out of memory for n = %zu\n", n);
    goto done;
  }
  nb_status_t st = nb_codec_create(&cfg, &codec);
  if (st != NB_OK) {
    fprintf(stderr, "nebula bench codec: %s\n", nb_error_last());
    goto done;
  }
  if (in) {
    size_t got = fread(upd, sizeof(float), n, in);
    fclose(in);
    in = NULL;
    if (got != n) {
      fprintf(stderr, "nebula bench codec: short read from '%s'\n", input);
      goto done;
    }
  } else {
    nb__fill(upd, n, 42);
  }
  memset(frame, 0, cap);
  int same = 1;
  /* one warm-up round each, then the timed runs */
  for (int r = -1; r < runs; r++) {
    memset(res, 0, n * sizeof(float));
    double t0 = nb_now_s();
    memcpy(out, upd, n * sizeof(float));
    double t1 = nb_now_s();
    st = nb_codec_encode_sparse(codec, upd, res, n, density, 1, 7, frame, cap, &len);
    double t2 = nb_now_s();
    if (st != NB_OK) {
      fprintf(stderr, "nebula bench codec: encode: %s\n", nb_error_last());
      goto done;
    }
    st = nb_codec_decode_accumulate(codec, frame, len, 1.0f, out, n, NULL);
    double t3 = nb_now_s();
    if (st != NB_OK) {
      fprintf(stderr, "nebula bench codec: decode: %s\n", nb_error_last());
      goto done;
    }
    if (r < 0) {
      memcpy(first, frame, len);
      len0 = len;
      continue;
    }
    same &= len == len0 && memcmp(first, frame, len) == 0;
    t_cpy[r] = t1 - t0;
    t_enc[r] = t2 - t1;
    t_dec[r] = t3 - t2;
  }
  /* plain zstd of the fp32 buffer at the same level, streamed through a small output buffer */
  size_t zbytes = 0;
  {
    ZSTD_CCtx* z = ZSTD_createCCtx();
    size_t ocap = 1u << 20;
    void* obuf = malloc(ocap);
    if (!z || !obuf) {
      ZSTD_freeCCtx(z);
      free(obuf);
      fprintf(stderr, "nebula bench codec: out of memory for zstd\n");
      goto done;
    }
    ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, cfg.zstd_level ? cfg.zstd_level : 3);
    ZSTD_inBuffer zin = {upd, n * sizeof(float), 0};
    size_t left;
    do {
      ZSTD_outBuffer ob = {obuf, ocap, 0};
      left = ZSTD_compressStream2(z, &ob, &zin, ZSTD_e_end);
      if (ZSTD_isError(left)) break;
      zbytes += ob.pos;
    } while (left != 0);
    ZSTD_freeCCtx(z);
    free(obuf);
  }
  double bytes = (double)n * sizeof(float);
  double enc = nb_bench_median(t_enc, (size_t)runs), dec = nb_bench_median(t_dec, (size_t)runs),
         cpy = nb_bench_median(t_cpy, (size_t)runs);
  double enc_gbps = bytes / enc / 1e9, dec_gbps = bytes / dec / 1e9, cpy_gbps = bytes / cpy / 1e9;
  double bpp = 8.0 * (double)len0 / (double)n, zbpp = 8.0 * (double)zbytes / (double)n;
  nb_frame_info_t fi;
  const char* index_text = "?";
  uint64_t sent_k = 0;
  if (nb_codec_frame_info(first, len0, NULL, &fi) == NB_OK) {
    sent_k = fi.k;
    index_text = fi.index_coding == NB_INDEX_CHUNKED  ? "chunked"
                 : fi.index_coding == NB_INDEX_BITMAP ? "bitmap"
                                                      : "delta-varint";
  }
  char chunk_text[48] = "global";
  if (cfg.topk_chunk)
    snprintf(chunk_text, sizeof chunk_text, "chunked (C = %u, %u per chunk)", cfg.topk_chunk,
             (unsigned)((uint64_t)k * cfg.topk_chunk / n));
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_int(&j, "n", (long long)n);
    nb_json_num(&j, "density", density);
    nb_json_str(&j, "values", nb_values_name(cfg.values));
    nb_json_int(&j, "wire_bytes", (long long)len0);
    nb_json_num(&j, "bits_per_param", bpp);
    nb_json_num(&j, "encode_gbps", enc_gbps);
    nb_json_num(&j, "decode_gbps", dec_gbps);
    nb_json_num(&j, "memcpy_gbps", cpy_gbps);
    nb_json_num(&j, "encode_vs_memcpy", enc_gbps / cpy_gbps);
    nb_json_num(&j, "zstd_dense_bits_per_param", zbpp);
    nb_json_end(&j);
  } else {
    printf(
        "codec: n = %zu, density %g (k = %zu), %s values (block %u), %s top-k, zstd level %d, "
        "%d threads, median of %d runs\n",
        n, density, k, nb_values_name(cfg.values), cfg.block_size, chunk_text, cfg.zstd_level,
        cfg.threads, runs);
    printf("  wire bytes            %zu (header %d), %s index coding, k sent %llu\n", len0,
           NB_FRAME_HEADER_BYTES, index_text, (unsigned long long)sent_k);
    printf("  bits per parameter    %.4f   (plain zstd of fp32: %.3f, fp32: 32)\n", bpp, zbpp);
    printf("  compression ratio     %.1fx vs fp32, %.1fx vs plain zstd\n", 32.0 / bpp, zbpp / bpp);
    printf("  encode                %.2f GB/s  (%.1f ms)\n", enc_gbps, enc * 1e3);
    printf("  decode-accumulate     %.2f GB/s  (%.1f ms)\n", dec_gbps, dec * 1e3);
    printf("  memcpy (baseline)     %.2f GB/s  (%.1f ms)\n", cpy_gbps, cpy * 1e3);
    printf("  encode vs memcpy      %.3f\n", enc_gbps / cpy_gbps);
    printf("  deterministic bytes   %s\n", same ? "yes (every run identical)" : "NO");
  }
  rc = same ? 0 : 1;
done:
  if (in) fclose(in);
  nb_codec_destroy(codec);
  free(upd);
  free(res);
  free(out);
  free(frame);
  free(first);
  free(t_enc);
  free(t_dec);
  free(t_cpy);
  return rc;
}
