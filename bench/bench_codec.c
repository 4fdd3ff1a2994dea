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
#include "common/opts.h"
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

typedef struct {
  size_t n;
  double density;
  int json, runs;
  const char* input;
  nb_codec_config_t cfg;
} nb__bopts_t;

static const char* nb__bench_cmd = "nebula bench codec";
static const char* nb__bench_synopsis =
    "usage: nebula bench codec [--n N] [--density D]\n"
    "                          [--values int8|4bit|2bit|fp16|bf16|fp32] [--block B]\n"
    "                          [--topk-chunk C] [--zstd-level L] [--threads T] [--runs R]\n"
    "                          [--input FILE.f32] [--json]";
static const char* nb__bench_about =
    "Encodes (error feedback + exact top-k + quantize + index coding + zstd + frame) and\n"
    "decodes a heavy-tailed vector, median of R runs against a memcpy of the same buffer;\n"
    "prints the wire size, the index section and the speeds. Asserts nothing.";

/* Parses the flags into o (defaults first). Returns -1 to go on, else the exit code (0 after
 * --help, 2 after one line naming the bad option or value). */
static int nb__bench_parse(int argc, char** argv, nb__bopts_t* o) {
  o->n = 64u << 20;
  o->density = 0.01;
  o->json = 0;
  o->runs = 7;
  o->input = NULL;
  nb_codec_config_default(&o->cfg);
  double n = (double)o->n;
  int block = (int)o->cfg.block_size, chunk = (int)o->cfg.topk_chunk, level = o->cfg.zstd_level;
  int threads = o->cfg.threads, runs = o->runs;
  const char* values = NULL;
  const nb_opt_t flags[] = {
      NB_OPTION("n", NB_OPT_DOUBLE, &n, "N", "coordinates, 1 .. 2^32-1 (default 64M)", .min = 1),
      NB_OPTION("density", NB_OPT_DOUBLE, &o->density, "D", "fraction sent, 0 .. 1 (default 0.01)",
                .min = 0, .max = 1),
      NB_OPTION("values", NB_OPT_STR, &values, "TYPE",
                "int8|4bit|2bit|fp16|bf16|fp32 (default int8)"),
      NB_OPTION("block", NB_OPT_INT, &block, "B", "values per scale of int8/4bit/2bit", .min = 1,
                .max = 65536),
      NB_OPTION("topk-chunk", NB_OPT_INT, &chunk, "C",
                "chunked top-k (a power of two >= 16; 0 = global top-k),\nas NB_CODEC_TOPK_CHUNK",
                .min = 0, .max = 65536),
      NB_OPTION("zstd-level", NB_OPT_INT, &level, "L", "0 .. 19 (0 = no zstd)", .min = 0,
                .max = 19),
      NB_OPTION("threads", NB_OPT_INT, &threads, "T", "encode threads, 1 .. 64", .min = 1,
                .max = 64),
      NB_OPTION("runs", NB_OPT_INT, &runs, "R", "timed runs (median), 1 .. 1000 (default 7)",
                .min = 1, .max = 1000),
      NB_OPTION("input", NB_OPT_STR, &o->input, "FILE.f32",
                "a raw little-endian fp32 vector (for example a real\npseudo-gradient) instead of "
                "the synthetic heavy-tailed one;\nn is then its length"),
      NB_OPTION("json", NB_OPT_FLAG, &o->json, NULL, "one JSON object on stdout"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {.cmd = nb__bench_cmd,
                              .synopsis = nb__bench_synopsis,
                              .about = nb__bench_about,
                              .opts = flags};
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (values && nb_values_parse(values, &o->cfg.values) != NB_OK)
    return nb_opts_usage_error(&spec, "--values needs int8, 4bit, 2bit, fp16, bf16 or fp32");
  if (n > 4294967295.0 || n != floor(n))
    return nb_opts_usage_error(&spec, "--n needs a whole number in 1 .. 2^32-1");
  o->n = (size_t)n;
  o->cfg.block_size = (uint32_t)block;
  o->cfg.topk_chunk = (uint32_t)chunk;
  o->cfg.zstd_level = (int)level;
  o->cfg.threads = (int)threads;
  o->runs = (int)runs;
  return -1;
}

/* Opens a raw fp32 file and sets *n to its length; NULL (after one line) when unusable. */
static FILE* nb__bench_open(const char* input, size_t* n) {
  FILE* in = fopen(input, "rb");
  long bytes = -1;
  if (in && fseek(in, 0, SEEK_END) == 0) bytes = ftell(in);
  if (!in || bytes <= 0 || bytes % 4 || fseek(in, 0, SEEK_SET) != 0) {
    fprintf(stderr, "nebula bench codec: cannot use '%s' (need a non-empty raw fp32 file)\n",
            input);
    if (in) fclose(in);
    return NULL;
  }
  *n = (size_t)bytes / 4;
  return in;
}

/* Buffers and timings of one benchmark. */
typedef struct {
  float *upd, *res, *out;
  uint8_t *frame, *first;
  size_t cap, len0;
  double *t_enc, *t_dec, *t_cpy;
  int same;
} nb__bstate_t;

/* One warm-up round, then the timed runs: memcpy, encode, decode-accumulate. Returns 0 or 1. */
static int nb__bench_rounds(nb_codec_t* codec, const nb__bopts_t* o, nb__bstate_t* b) {
  size_t n = o->n, len = 0;
  b->same = 1;
  memset(b->frame, 0, b->cap);
  for (int r = -1; r < o->runs; r++) {
    memset(b->res, 0, n * sizeof(float));
    double t0 = nb_now_s();
    memcpy(b->out, b->upd, n * sizeof(float));
    double t1 = nb_now_s();
    nb_status_t st =
        nb_codec_encode_sparse(codec, b->upd, b->res, n, o->density, 1, 7, b->frame, b->cap, &len);
    double t2 = nb_now_s();
    if (st != NB_OK) {
      fprintf(stderr, "nebula bench codec: encode: %s\n", nb_error_last());
      return 1;
    }
    st = nb_codec_decode_accumulate(codec, b->frame, len, 1.0f, b->out, n, NULL);
    double t3 = nb_now_s();
    if (st != NB_OK) {
      fprintf(stderr, "nebula bench codec: decode: %s\n", nb_error_last());
      return 1;
    }
    if (r < 0) {
      memcpy(b->first, b->frame, len);
      b->len0 = len;
      continue;
    }
    b->same &= len == b->len0 && memcmp(b->first, b->frame, len) == 0;
    b->t_cpy[r] = t1 - t0;
    b->t_enc[r] = t2 - t1;
    b->t_dec[r] = t3 - t2;
  }
  return 0;
}

/* Plain zstd of the fp32 buffer at the same level, streamed through a small output buffer.
 * Returns 0 and the size in *zbytes, or 1. */
static int nb__bench_zstd(const float* upd, size_t n, int level, size_t* zbytes) {
  ZSTD_CCtx* z = ZSTD_createCCtx();
  size_t ocap = 1u << 20;
  void* obuf = malloc(ocap);
  *zbytes = 0;
  if (!z || !obuf) {
    ZSTD_freeCCtx(z);
    free(obuf);
    fprintf(stderr, "nebula bench codec: out of memory for zstd\n");
    return 1;
  }
  ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, level ? level : 3);
  ZSTD_inBuffer zin = {upd, n * sizeof(float), 0};
  size_t left;
  do {
    ZSTD_outBuffer ob = {obuf, ocap, 0};
    left = ZSTD_compressStream2(z, &ob, &zin, ZSTD_e_end);
    if (ZSTD_isError(left)) break;
    *zbytes += ob.pos;
  } while (left != 0);
  ZSTD_freeCCtx(z);
  free(obuf);
  return 0;
}

static const char* nb__index_name(nb_index_coding_t c) {
  switch (c) {
    case NB_INDEX_CHUNKED_RICE:
      return "chunked Rice";
    case NB_INDEX_CHUNKED:
      return "chunked";
    case NB_INDEX_BITMAP:
      return "bitmap";
    default:
      return "delta-varint";
  }
}

/* Prints the results (one JSON object, or the text report). */
static void nb__bench_report(const nb__bopts_t* o, const nb__bstate_t* b, size_t zbytes) {
  const nb_codec_config_t* cfg = &o->cfg;
  size_t n = o->n, k = nb_codec_k_for_density(n, o->density), len0 = b->len0;
  int runs = o->runs;
  double bytes = (double)n * sizeof(float);
  double enc = nb_bench_median(b->t_enc, (size_t)runs),
         dec = nb_bench_median(b->t_dec, (size_t)runs),
         cpy = nb_bench_median(b->t_cpy, (size_t)runs);
  double enc_gbps = bytes / enc / 1e9, dec_gbps = bytes / dec / 1e9, cpy_gbps = bytes / cpy / 1e9;
  double bpp = 8.0 * (double)len0 / (double)n, zbpp = 8.0 * (double)zbytes / (double)n;
  if (o->json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_int(&j, "n", (long long)n);
    nb_json_num(&j, "density", o->density);
    nb_json_str(&j, "values", nb_values_name(cfg->values));
    nb_json_int(&j, "wire_bytes", (long long)len0);
    nb_json_num(&j, "bits_per_param", bpp);
    nb_json_num(&j, "encode_gbps", enc_gbps);
    nb_json_num(&j, "decode_gbps", dec_gbps);
    nb_json_num(&j, "memcpy_gbps", cpy_gbps);
    nb_json_num(&j, "encode_vs_memcpy", enc_gbps / cpy_gbps);
    nb_json_num(&j, "zstd_dense_bits_per_param", zbpp);
    nb_json_end(&j);
    return;
  }
  nb_frame_info_t fi;
  int have_info = nb_codec_frame_info(b->first, len0, NULL, &fi) == NB_OK;
  char chunk_text[48] = "global";
  if (cfg->topk_chunk)
    snprintf(chunk_text, sizeof chunk_text, "chunked (C = %u, %u per chunk)", cfg->topk_chunk,
             (unsigned)((uint64_t)k * cfg->topk_chunk / n));
  printf(
      "codec: n = %zu, density %g (k = %zu), %s values (block %u), %s top-k, zstd level %d, "
      "%d threads, median of %d runs\n",
      n, o->density, k, nb_values_name(cfg->values), cfg->block_size, chunk_text, cfg->zstd_level,
      cfg->threads, runs);
  printf("  wire bytes            %zu (header %d), %s index coding, k sent %llu\n", len0,
         NB_FRAME_HEADER_BYTES, have_info ? nb__index_name(fi.index_coding) : "?",
         have_info ? (unsigned long long)fi.k : 0ull);
  printf("  bits per parameter    %.4f   (plain zstd of fp32: %.3f, fp32: 32)\n", bpp, zbpp);
  if (have_info && fi.k > 0) {
    printf("  index section         %llu bytes (raw): %.4f bits per parameter, %.3f per index\n",
           (unsigned long long)fi.index_bytes, 8.0 * (double)fi.index_bytes / (double)n,
           8.0 * (double)fi.index_bytes / (double)fi.k);
    if (cfg->topk_chunk) { /* what the log2(C)-bit offsets of index coding 3 would take */
      double plain = 8.0 + ceil((double)fi.k * __builtin_ctz(cfg->topk_chunk) / 8.0);
      printf("  plain chunked index   %.0f bytes: %.4f bits per parameter, %.3f per index\n", plain,
             8.0 * plain / (double)n, 8.0 * plain / (double)fi.k);
    }
  }
  printf("  compression ratio     %.1fx vs fp32, %.1fx vs plain zstd\n", 32.0 / bpp, zbpp / bpp);
  printf("  encode                %.2f GB/s  (%.1f ms)\n", enc_gbps, enc * 1e3);
  printf("  decode-accumulate     %.2f GB/s  (%.1f ms)\n", dec_gbps, dec * 1e3);
  printf("  memcpy (baseline)     %.2f GB/s  (%.1f ms)\n", cpy_gbps, cpy * 1e3);
  printf("  encode vs memcpy      %.3f\n", enc_gbps / cpy_gbps);
  printf("  deterministic bytes   %s\n", b->same ? "yes (every run identical)" : "NO");
}

int nb_bench_codec_main(int argc, char** argv) {
  nb__bopts_t o;
  int rc = nb__bench_parse(argc, argv, &o);
  if (rc >= 0) return rc;
  FILE* in = NULL;
  if (o.input && !(in = nb__bench_open(o.input, &o.n))) return 1;
  rc = 1;
  nb_codec_t* codec = NULL;
  size_t n = o.n, k = nb_codec_k_for_density(n, o.density), zbytes = 0;
  nb__bstate_t b = {.upd = nb__big(n), .res = nb__big(n), .out = nb__big(n)};
  b.cap = nb_codec_frame_bound(n, k, o.cfg.values, o.cfg.block_size);
  b.frame = malloc(b.cap), b.first = malloc(b.cap);
  b.t_enc = calloc((size_t)o.runs, sizeof(double));
  b.t_dec = calloc((size_t)o.runs, sizeof(double));
  b.t_cpy = calloc((size_t)o.runs, sizeof(double));
  if (!b.upd || !b.res || !b.out || !b.frame || !b.first || !b.t_enc || !b.t_dec || !b.t_cpy) {
    fprintf(stderr, "nebula bench codec: out of memory for n = %zu\n", n);
    goto done;
  }
  if (nb_codec_create(&o.cfg, &codec) != NB_OK) {
    fprintf(stderr, "nebula bench codec: %s\n", nb_error_last());
    goto done;
  }
  if (in) {
    size_t got = fread(b.upd, sizeof(float), n, in);
    fclose(in);
    in = NULL;
    if (got != n) {
      fprintf(stderr, "nebula bench codec: short read from '%s'\n", o.input);
      goto done;
    }
  } else {
    nb__fill(b.upd, n, 42);
  }
  if (nb__bench_rounds(codec, &o, &b) || nb__bench_zstd(b.upd, n, o.cfg.zstd_level, &zbytes))
    goto done;
  nb__bench_report(&o, &b, zbytes);
  rc = b.same ? 0 : 1;
done:
  if (in) fclose(in);
  nb_codec_destroy(codec);
  free(b.upd), free(b.res), free(b.out), free(b.frame), free(b.first);
  free(b.t_enc), free(b.t_dec), free(b.t_cpy);
  return rc;
}
