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

typedef struct {
  size_t n;
  double density;
  int json, runs;
  const char* input;
  nb_codec_config_t cfg;
} nb__bopts_t;

/* The flags, parsed by a table with cli/opts.h's conventions (--opt value and --opt=value, one
 * line naming a bad option or value, --help from the table). Not cli/opts.h itself: bench/ sits
 * below cli/ and may not include it (tests/layering/check_includes.py). */
typedef enum { NB__F_FLAG, NB__F_STR, NB__F_LONG, NB__F_NUM } nb__fkind_t;
typedef struct {
  const char* name; /* without the dashes; NULL ends a table */
  nb__fkind_t kind;
  void* dst; /* int (flag), const char* (str), long, double */
  const char* meta;
  double min, max;  /* LONG and NUM: the accepted range */
  const char* help; /* '\n' starts a continuation line */
} nb__flag_t;

static const char* nb__bench_cmd = "nebula bench codec";
static const char* nb__bench_synopsis =
    "usage: nebula bench codec [--n N] [--density D]\n"
    "                          [--values int8|4bit|2bit|fp16|bf16|fp32] [--block B]\n"
    "                          [--topk-chunk C] [--zstd-level L] [--threads T] [--runs R]\n"
    "                          [--input FILE.f32] [--json]\n\n"
    "Encodes (error feedback + exact top-k + quantize + index coding + zstd + frame) and\n"
    "decodes a heavy-tailed vector, median of R runs against a memcpy of the same buffer;\n"
    "prints the wire size, the index section and the speeds. Asserts nothing.\n";

static void nb__flags_help(const nb__flag_t* t) {
  printf("%s\n", nb__bench_synopsis);
  for (; t->name; t++) {
    char head[64];
    snprintf(head, sizeof head, "--%s%s%s", t->name, t->meta ? " " : "", t->meta ? t->meta : "");
    printf("  %-18s ", head);
    for (const char* p = t->help; *p; p++) {
      putchar(*p);
      if (*p == '\n') printf("  %-18s ", "");
    }
    putchar('\n');
  }
}

/* Stores one value; 0, or 2 after the error line. */
static int nb__flag_set(const nb__flag_t* o, const char* v) {
  char* end = NULL;
  if (o->kind == NB__F_STR) {
    *(const char**)o->dst = v;
  } else if (o->kind == NB__F_LONG) {
    long x = strtol(v, &end, 10);
    if (end == v || *end || !((double)x >= o->min && (double)x <= o->max)) {
      fprintf(stderr, "%s: --%s needs an integer in %.0f..%.0f, got '%s'\n", nb__bench_cmd, o->name,
              o->min, o->max, v);
      return 2;
    }
    *(long*)o->dst = x;
  } else {
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= o->min && x <= o->max)) {
      fprintf(stderr, "%s: --%s needs a number in %g..%g, got '%s'\n", nb__bench_cmd, o->name,
              o->min, o->max, v);
      return 2;
    }
    *(double*)o->dst = x;
  }
  return 0;
}

/* Parses argv[1..) into the table. Returns -1 to go on, 0 after --help, 2 after one line. */
static int nb__flags_parse(const nb__flag_t* t, int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      nb__flags_help(t);
      return 0;
    }
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", nb__bench_cmd, a);
      return 2;
    }
    const char* eq = strchr(a + 2, '=');
    size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    const nb__flag_t* o = t;
    while (o->name && !(strlen(o->name) == len && strncmp(o->name, a + 2, len) == 0)) o++;
    if (!o->name) {
      fprintf(stderr, "%s: unknown option '%s' (see --help)\n", nb__bench_cmd, a);
      return 2;
    }
    if (o->kind == NB__F_FLAG) {
      if (eq) {
        fprintf(stderr, "%s: --%s takes no value (got '%s')\n", nb__bench_cmd, o->name, a);
        return 2;
      }
      *(int*)o->dst = 1;
      continue;
    }
    if (!eq && i + 1 >= argc) {
      fprintf(stderr, "%s: --%s needs a value (%s)\n", nb__bench_cmd, o->name, o->meta);
      return 2;
    }
    if (nb__flag_set(o, eq ? eq + 1 : argv[++i])) return 2;
  }
  return -1;
}

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
  long block = o->cfg.block_size, chunk = o->cfg.topk_chunk, level = o->cfg.zstd_level;
  long threads = o->cfg.threads, runs = o->runs;
  const char* values = NULL;
  const nb__flag_t flags[] = {
      {"n", NB__F_NUM, &n, "N", 1, 4294967295.0, "coordinates, 1 .. 2^32-1 (default 64M)"},
      {"density", NB__F_NUM, &o->density, "D", 0, 1, "fraction sent, 0 .. 1 (default 0.01)"},
      {"values", NB__F_STR, &values, "TYPE", 0, 0, "int8|4bit|2bit|fp16|bf16|fp32 (default int8)"},
      {"block", NB__F_LONG, &block, "B", 1, 65536, "values per scale of int8/4bit/2bit"},
      {"topk-chunk", NB__F_LONG, &chunk, "C", 0, 65536,
       "chunked top-k (a power of two >= 16; 0 = global top-k),\nas NB_CODEC_TOPK_CHUNK"},
      {"zstd-level", NB__F_LONG, &level, "L", 0, 19, "0 .. 19 (0 = no zstd)"},
      {"threads", NB__F_LONG, &threads, "T", 1, 64, "encode threads, 1 .. 64"},
      {"runs", NB__F_LONG, &runs, "R", 1, 1000, "timed runs (median), 1 .. 1000 (default 7)"},
      {"input", NB__F_STR, &o->input, "FILE.f32", 0, 0,
       "a raw little-endian fp32 vector (for example a real\npseudo-gradient) instead of the "
       "synthetic heavy-tailed one;\nn is then its length"},
      {"json", NB__F_FLAG, &o->json, NULL, 0, 0, "one JSON object on stdout"},
      {NULL, NB__F_FLAG, NULL, NULL, 0, 0, NULL},
  };
  int rc = nb__flags_parse(flags, argc, argv);
  if (rc >= 0) return rc;
  if (values && nb_values_parse(values, &o->cfg.values) != NB_OK) {
    fprintf(stderr, "%s: --values needs int8, 4bit, 2bit, fp16, bf16 or fp32, got '%s'\n",
            nb__bench_cmd, values);
    return 2;
  }
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
