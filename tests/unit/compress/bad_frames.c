/* The defective-frame corpus (see bad_frames.h). Base frames come from the real encoder; each
 * defect is one change, with the checksum recomputed (by the formula of docs/wire-format.md)
 * whenever the defect must be caught by something other than the checksum. */
#include "bad_frames.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compress/compress.h"

enum { HDR = NB_FRAME_HEADER_BYTES };

typedef struct {
  uint8_t* b;
  size_t len;
} buf_t;

static void put32(uint8_t* p, uint32_t v) {
  memcpy(p, &v, 4);
}
static void put64(uint8_t* p, uint64_t v) {
  memcpy(p, &v, 8);
}
static uint64_t get64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

uint64_t nb_test_frame_n(const uint8_t* f, size_t len) {
  return len >= 24 ? get64(f + 16) : 0;
}

/* checksum = XXH3-64(payload, seed = XXH3-64(header bytes 0..79, seed 0)) */
static void reseal(uint8_t* f, size_t len) {
  uint64_t pb = get64(f + 72);
  if (HDR + pb > len) pb = len - HDR;
  uint64_t seed = nb_xxh3_64(f, 80, 0);
  put64(f + 80, nb_xxh3_64(f + HDR, (size_t)pb, seed));
}

static void putf(uint8_t* p, float f) {
  memcpy(p, &f, 4);
}
/* The largest scale whose top code is finite (as nb_quant_scale_max, recomputed here). */
static float scale_max(float code) {
  float s = FLT_MAX / code;
  while (!(s * code <= FLT_MAX)) s = nextafterf(s, 0.0f);
  return s;
}
/* Section offsets of a stored frame, from its header. */
static size_t values_at(const uint8_t* f) {
  return HDR + (size_t)get64(f + 48);
}
static size_t index_at(const uint8_t* f) {
  return values_at(f) + (size_t)get64(f + 56);
}
/* Sets offset j (of `bits` bits) of a chunked index section starting at `ix`. */
static void set_offset(uint8_t* ix, size_t j, unsigned bits, uint32_t off) {
  for (unsigned b = 0; b < bits; b++) {
    size_t bit = j * bits + b;
    uint8_t* q = ix + 8 + bit / 8;
    if (off >> b & 1)
      *q |= (uint8_t)(1u << (bit % 8));
    else
      *q &= (uint8_t) ~(1u << (bit % 8));
  }
}

/* ---- chunked Rice sections (index coding 4), read and written here from the wire format's
 * words, so that frames with chosen gaps, parameters and lengths can be built ---- */

typedef struct {
  uint32_t chunk, kc;
  unsigned r;
  size_t k;
  uint32_t* gaps; /* malloc'd, k entries: chunk by chunk, first offset then offset - prev - 1 */
} rice_t;

/* Reads the (valid) Rice section at sec of a frame for n coordinates. */
static rice_t rice_read(const uint8_t* sec, size_t n) {
  rice_t rc;
  memcpy(&rc.chunk, sec, 4);
  memcpy(&rc.kc, sec + 4, 4);
  rc.r = sec[8];
  rc.k = 0;
  for (size_t b = 0; b < n; b += rc.chunk)
    rc.k += n - b >= rc.chunk ? rc.kc : (size_t)rc.kc * (n - b) / rc.chunk;
  rc.gaps = malloc((rc.k + 1) * sizeof *rc.gaps);
  size_t bit = 0;
  for (size_t j = 0; j < rc.k; j++) {
    uint32_t q = 0, low = 0;
    while (sec[12 + bit / 8] >> (bit % 8) & 1) q++, bit++;
    bit++;
    for (unsigned i = 0; i < rc.r; i++, bit++)
      low |= (uint32_t)(sec[12 + bit / 8] >> (bit % 8) & 1) << i;
    rc.gaps[j] = q << rc.r | low;
  }
  return rc;
}

/* Writes a Rice section (head and stream, zero padding); returns its bytes, *bits the stream's
 * length in bits. sec must have room. */
static size_t rice_write(uint8_t* sec, const rice_t* rc, size_t* bits) {
  memcpy(sec, &rc->chunk, 4);
  memcpy(sec + 4, &rc->kc, 4);
  sec[8] = (uint8_t)rc->r, sec[9] = sec[10] = sec[11] = 0;
  size_t bit = 0;
  for (size_t j = 0; j < rc->k; j++) {
    uint32_t g = rc->gaps[j];
    for (uint32_t q = g >> rc->r; q > 0; q--, bit++)
      sec[12 + bit / 8] |= (uint8_t)(1u << (bit % 8));
    bit++; /* the zero-bit (sec starts zeroed) */
    for (unsigned i = 0; i < rc->r; i++, bit++)
      if (g >> i & 1) sec[12 + bit / 8] |= (uint8_t)(1u << (bit % 8));
  }
  if (bits) *bits = bit;
  return 12 + (bit + 7) / 8;
}

static buf_t encode_chunked(nb_values_t v, int level, int dense, size_t n, double density,
                            int spiky, uint32_t chunk) {
  nb_codec_config_t cfg;
  nb_codec_config_default(&cfg);
  cfg.values = v;
  cfg.zstd_level = level;
  cfg.block_size = 16;
  cfg.threads = 1;
  cfg.topk_chunk = chunk;
  nb_codec_t* c = NULL;
  buf_t out = {0};
  if (nb_codec_create(&cfg, &c) != NB_OK) return out;
  float* x = malloc(n * sizeof *x);
  size_t cap = nb_codec_frame_bound(n, n, v, 16);
  out.b = malloc(cap);
  for (size_t i = 0; i < n; i++) /* spiky: the top values sit at multiples of 20 */
    x[i] = spiky ? (i % 20 == 0 ? 1.0f + (float)i : 1e-3f * (float)(i % 7))
                 : sinf((float)i) * (1.0f + (float)(i % 13));
  nb_status_t st = dense
                       ? nb_codec_encode_dense(c, x, n, 3, 1, out.b, cap, &out.len)
                       : nb_codec_encode_sparse(c, x, NULL, n, density, 3, 1, out.b, cap, &out.len);
  if (st != NB_OK) out.len = 0;
  free(x);
  nb_codec_destroy(c);
  return out;
}

static buf_t encode(nb_values_t v, int level, int dense, size_t n, double density, int spiky) {
  return encode_chunked(v, level, dense, n, density, spiky, 0);
}

typedef struct {
  nb_test_frame_t* v;
  size_t n, cap;
} list_t;

/* A stored sparse frame with base's scales and values and a new index section of ib bytes
 * (index coding `coding`), sealed. */
static buf_t with_index(const buf_t* base, uint8_t coding, const uint8_t* sec, size_t ib) {
  size_t at = index_at(base->b);
  buf_t o = {calloc(at + ib + 1, 1), at + ib};
  memcpy(o.b, base->b, at);
  memcpy(o.b + at, sec, ib);
  o.b[13] = coding;
  put64(o.b + 64, ib);
  put64(o.b + 72, at + ib - HDR);
  reseal(o.b, o.len);
  return o;
}

/* base (a stored Rice frame) with its gaps re-coded as rc says. */
static buf_t rice_frame(const buf_t* base, const rice_t* rc) {
  uint8_t* sec = calloc(12 + 4 * rc->k + 64, 1);
  size_t ib = rice_write(sec, rc, NULL);
  buf_t o = with_index(base, 4, sec, ib);
  free(sec);
  return o;
}

/* base (a stored Rice frame for n coordinates) re-coded as the plain chunked section
 * (index coding 3) that the encoder wrote before the Rice coding existed. */
static buf_t rice_to_plain(const buf_t* base, size_t n) {
  rice_t rc = rice_read(base->b + index_at(base->b), n);
  unsigned bits = 0;
  while ((1u << bits) < rc.chunk) bits++;
  uint8_t* sec = calloc(8 + (rc.k * bits + 7) / 8 + 1, 1);
  memcpy(sec, &rc.chunk, 4);
  memcpy(sec + 4, &rc.kc, 4);
  size_t j = 0;
  for (size_t b = 0; b < n; b += rc.chunk) {
    size_t cnt = n - b >= rc.chunk ? rc.kc : (size_t)rc.kc * (n - b) / rc.chunk;
    uint32_t next = 0;
    for (size_t e = j + cnt; j < e; j++) {
      uint32_t off = next + rc.gaps[j];
      next = off + 1;
      set_offset(sec, j, bits, off);
    }
  }
  buf_t o = with_index(base, 3, sec, 8 + (rc.k * bits + 7) / 8);
  free(sec);
  free(rc.gaps);
  return o;
}

static uint8_t* add(list_t* l, const char* name, const buf_t* base, size_t len, nb_status_t want,
                    const char* needle) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
  }
  nb_test_frame_t* f = &l->v[l->n++];
  snprintf(f->name, sizeof f->name, "%s", name);
  f->len = len;
  f->bytes = calloc(len + 1, 1);
  memcpy(f->bytes, base->b, len < base->len ? len : base->len);
  f->want = want;
  f->needle = needle;
  return f->bytes;
}

size_t nb_test_frames_build(nb_test_frame_t** out) {
  list_t l = {0};
  /* A: sparse int8 zstd; B: the same stored (sections visible); D: bitmap stored, n % 8 != 0;
   * E: sparse fp16 stored; F: dense fp16 zstd; G: dense fp32 stored */
  buf_t A = encode(NB_VALUES_INT8, 1, 0, 1000, 0.05, 1);
  buf_t B = encode(NB_VALUES_INT8, 0, 0, 1000, 0.05, 1);
  buf_t D = encode(NB_VALUES_INT8, 0, 0, 1003, 0.5, 0);
  buf_t E = encode(NB_VALUES_FP16, 0, 0, 1000, 0.05, 1);
  buf_t F = encode(NB_VALUES_FP16, 3, 1, 5000, 1.0, 0);
  buf_t G = encode(NB_VALUES_FP32, 0, 1, 100, 1.0, 0);
  const nb_status_t C = NB_ERR_CODEC, I = NB_ERR_INTEGRITY;
  /* B's layout: k = 50, block 16 -> 4 scales (16 bytes), 50 values, 50 one-byte varints */
  const size_t sb = 16, vb = 50, ib0 = HDR + sb + vb;
  uint8_t* p;

  add(&l, "ok-sparse-int8-zstd", &A, A.len, NB_OK, NULL);
  add(&l, "ok-sparse-int8-stored", &B, B.len, NB_OK, NULL);
  add(&l, "ok-sparse-bitmap", &D, D.len, NB_OK, NULL);
  add(&l, "ok-sparse-fp16", &E, E.len, NB_OK, NULL);
  add(&l, "ok-dense-fp16-zstd", &F, F.len, NB_OK, NULL);
  add(&l, "ok-dense-fp32", &G, G.len, NB_OK, NULL);

  /* truncation at every section boundary */
  add(&l, "truncated-empty", &B, 0, C, "truncated");
  add(&l, "truncated-in-header", &B, 40, C, "truncated");
  add(&l, "truncated-header-only", &B, HDR, C, "truncated");
  add(&l, "truncated-after-scales", &B, HDR + sb, C, "truncated");
  add(&l, "truncated-after-values", &B, ib0, C, "truncated");
  add(&l, "truncated-last-byte", &B, B.len - 1, C, "truncated");
  add(&l, "truncated-zstd", &A, A.len - 1, C, "truncated");
  add(&l, "truncated-dense-zstd", &F, F.len - 7, C, "truncated");
  add(&l, "trailing-byte", &B, B.len + 1, C, "trailing");

  /* each header field out of range */
  p = add(&l, "magic", &B, B.len, C, "magic");
  p[0] = 'X';
  p = add(&l, "version", &B, B.len, C, "version");
  p[4] = 2;
  p = add(&l, "header-size", &B, B.len, C, "header size");
  p[6] = 64;
  p = add(&l, "flags-unknown", &B, B.len, C, "flag bits");
  p[8] |= 0x10;
  p = add(&l, "value-type", &B, B.len, C, "value type");
  p[12] = 9;
  p = add(&l, "index-coding-sparse", &B, B.len, C, "index coding");
  p[13] = 5;
  p = add(&l, "index-coding-dense", &G, G.len, C, "index coding");
  p[13] = 1;
  p = add(&l, "zstd-level-stored", &B, B.len, C, "zstd level");
  p[14] = 5;
  p = add(&l, "zstd-level-zero", &A, A.len, C, "zstd level");
  p[14] = 0;
  p = add(&l, "reserved", &B, B.len, C, "reserved");
  p[15] = 1;
  p = add(&l, "n-over-limit", &B, B.len, C, "exceeds the limit");
  put64(p + 16, 1ull << 40);
  p = add(&l, "k-greater-than-n", &B, B.len, C, "k (");
  put64(p + 24, 1001);
  p = add(&l, "dense-k-not-n", &G, G.len, C, "dense frame");
  put64(p + 24, 99);
  p = add(&l, "block-zero", &B, B.len, C, "block size");
  put32(p + 44, 0);
  p = add(&l, "block-huge", &B, B.len, C, "block size");
  put32(p + 44, 1u << 20);
  p = add(&l, "block-on-fp16", &E, E.len, C, "block size");
  put32(p + 44, 16);
  p = add(&l, "scale-bytes", &B, B.len, C, "scale section");
  put64(p + 48, 20);
  p = add(&l, "value-bytes", &B, B.len, C, "value section");
  put64(p + 56, 49);
  p = add(&l, "index-bytes-over-5k", &B, B.len, C, "index section");
  put64(p + 64, 251);
  p = add(&l, "index-bytes-under-k", &B, B.len, C, "index section");
  put64(p + 64, 49);
  p = add(&l, "bitmap-bytes", &D, D.len, C, "bitmap index section is");
  put64(p + 64, 125);
  p = add(&l, "stored-payload-size", &B, B.len, C, "stored payload");
  put64(p + 72, get64(p + 72) + 1);
  p = add(&l, "zstd-payload-larger", &A, A.len, C, "truncated");
  put64(p + 72, get64(p + 72) + 1);
  p = add(&l, "payload-absurd", &A, A.len, C, "larger than any compression");
  put64(p + 72, 1ull << 30);

  /* bit flips caught by the checksum */
  p = add(&l, "flip-checksum", &A, A.len, I, "checksum");
  p[80] ^= 1;
  p = add(&l, "flip-payload-zstd", &A, A.len, I, "checksum");
  p[HDR + 10] ^= 0x20;
  p = add(&l, "flip-payload-stored", &B, B.len, I, "checksum");
  p[B.len - 3] ^= 0x01;
  p = add(&l, "flip-round", &B, B.len, I, "checksum");
  p[33] ^= 0x80;
  p = add(&l, "flip-sender", &B, B.len, I, "checksum");
  p[40] ^= 0x04;

  /* well-sealed frames with bad contents */
  p = add(&l, "indices-repeat", &B, B.len, C, "strictly increasing");
  p[ib0 + 5] = 0, reseal(p, B.len);
  p = add(&l, "index-beyond-n", &B, B.len, C, "not below n");
  p[B.len - 1] = 127, reseal(p, B.len);
  p = add(&l, "varint-noncanonical", &B, B.len, C, "not canonical");
  p[ib0 + 3] = 0x94, p[ib0 + 4] = 0x00, reseal(p, B.len);
  p = add(&l, "varint-too-long", &B, B.len, C, "longer than 5 bytes");
  memset(p + ib0 + 2, 0x81, 5), reseal(p, B.len);
  p = add(&l, "varint-cut", &B, B.len, C, "ends inside varint");
  p[B.len - 1] = 0x81, reseal(p, B.len);
  p = add(&l, "varint-unused-bytes", &B, B.len + 1, C, "unused bytes");
  put64(p + 64, 51), put64(p + 72, get64(p + 72) + 1), reseal(p, B.len + 1);
  p = add(&l, "scale-nan", &B, B.len, C, "scale 1");
  put32(p + HDR + 4, 0x7fc00000u), reseal(p, B.len);
  p = add(&l, "scale-negative", &B, B.len, C, "scale 2");
  put32(p + HDR + 8, 0xbf800000u), reseal(p, B.len);
  p = add(&l, "scale-overflows", &B, B.len, C, "scale 3");
  put32(p + HDR + 12, 0x7f000000u), reseal(p, B.len);
  p = add(&l, "int8-minus-128", &B, B.len, C, "-128");
  p[HDR + sb + 7] = 0x80, reseal(p, B.len);
  p = add(&l, "fp16-infinite", &E, E.len, C, "not finite");
  p[HDR] = 0x00, p[HDR + 1] = 0x7c, reseal(p, E.len);
  p = add(&l, "fp32-nan-dense", &G, G.len, C, "not finite");
  put32(p + HDR + 4 * 17, 0x7fc00001u), reseal(p, G.len);
  /* D's bitmap is the last ceil(1003/8) = 126 bytes; bits 1003..1007 must be zero */
  p = add(&l, "bitmap-beyond-n", &D, D.len, C, "beyond n");
  p[D.len - 1] |= 0x80, reseal(p, D.len);
  p = add(&l, "bitmap-count", &D, D.len, C, "bitmap index section holds");
  p[D.len - 126] ^= 0x01, reseal(p, D.len);
  p = add(&l, "zstd-magic", &A, A.len, C, "not a zstd frame");
  p[HDR] ^= 0xff, reseal(p, A.len);
  p = add(&l, "zstd-dense-magic", &F, F.len, C, "not a zstd frame");
  p[HDR + 1] ^= 0x55, reseal(p, F.len);

  /* sub-int8 values. H: sparse 4bit stored (k = 50: 25 value bytes); J: sparse 2bit stored
   * (13 value bytes, the last holds 2 values and 4 zero padding bits); K: dense 4bit stored,
   * n = 101 (51 bytes, a zero padding nibble); L: dense 2bit stored, n = 103 (26 bytes, 2
   * padding bits); O: dense 4bit zstd. P: sparse bf16 stored, Q: sparse fp32 stored. */
  buf_t H = encode(NB_VALUES_INT4, 0, 0, 1000, 0.05, 1);
  buf_t J = encode(NB_VALUES_INT2, 0, 0, 1000, 0.05, 1);
  buf_t K = encode(NB_VALUES_INT4, 0, 1, 101, 1.0, 0);
  buf_t L = encode(NB_VALUES_INT2, 0, 1, 103, 1.0, 0);
  buf_t O = encode(NB_VALUES_INT4, 3, 1, 5000, 1.0, 0);
  buf_t P = encode(NB_VALUES_BF16, 0, 0, 1000, 0.05, 1);
  buf_t Q = encode(NB_VALUES_FP32, 0, 0, 1000, 0.05, 1);
  /* chunked top-k. R: 2bit stored, n = 1000, chunks of 64, k = 100 -> 6 per whole chunk (15 of
   * them) and floor(6 * 40 / 64) = 3 in the last of 40: k = 93 offsets, coded Rice by the
   * encoder. M: the same frame with the plain chunked section (index coding 3) that encoders
   * wrote before Rice: 93 offsets of 6 bits = 70 bytes (2 padding bits) after the 8-byte section
   * head. N: int8 zstd, n = 5000, chunks of 256 (Rice inside zstd). */
  buf_t R = encode_chunked(NB_VALUES_INT2, 0, 0, 1000, 0.1, 0, 64);
  buf_t M = rice_to_plain(&R, 1000);
  buf_t N = encode_chunked(NB_VALUES_INT8, 1, 0, 5000, 0.03, 0, 256);
  add(&l, "ok-sparse-4bit", &H, H.len, NB_OK, NULL);
  add(&l, "ok-sparse-2bit", &J, J.len, NB_OK, NULL);
  add(&l, "ok-dense-4bit-odd", &K, K.len, NB_OK, NULL);
  add(&l, "ok-dense-2bit-odd", &L, L.len, NB_OK, NULL);
  add(&l, "ok-dense-4bit-zstd", &O, O.len, NB_OK, NULL);
  add(&l, "ok-sparse-bf16", &P, P.len, NB_OK, NULL);
  add(&l, "ok-sparse-fp32", &Q, Q.len, NB_OK, NULL);
  add(&l, "ok-chunked-2bit", &M, M.len, NB_OK, NULL);
  add(&l, "ok-chunked-int8-zstd", &N, N.len, NB_OK, NULL);

  /* scales at and beyond the finite bound: 127 * (FLT_MAX / 127.0f) rounds to infinity, so that
   * scale (which the old bound accepted) must be refused; the bound itself decodes finitely */
  p = add(&l, "int8-scale-flt-max-127", &B, B.len, C, "int8 scale 2");
  putf(p + HDR + 8, FLT_MAX / 127.0f), reseal(p, B.len);
  p = add(&l, "ok-int8-scale-at-bound", &B, B.len, NB_OK, NULL);
  putf(p + HDR, scale_max(127.0f)), reseal(p, B.len);
  p = add(&l, "4bit-scale-overflows", &H, H.len, C, "4bit scale 1");
  putf(p + HDR + 4, nextafterf(scale_max(7.0f), INFINITY)), reseal(p, H.len);
  p = add(&l, "ok-4bit-scale-at-bound", &H, H.len, NB_OK, NULL);
  putf(p + HDR + 4, scale_max(7.0f)), reseal(p, H.len);
  p = add(&l, "2bit-scale-inf", &J, J.len, C, "2bit scale 0");
  put32(p + HDR, 0x7f800000u), reseal(p, J.len);
  p = add(&l, "2bit-scale-overflows", &J, J.len, C, "2bit scale 3");
  putf(p + HDR + 12, nextafterf(scale_max(1.5f), INFINITY)), reseal(p, J.len);
  p = add(&l, "2bit-scale-negative", &J, J.len, C, "2bit scale 1");
  putf(p + HDR + 4, -1.0f), reseal(p, J.len);
  p = add(&l, "4bit-dense-scale-nan", &K, K.len, C, "4bit scale 6");
  put32(p + HDR + 24, 0x7fc00000u), reseal(p, K.len);
  p = add(&l, "2bit-dense-scale-inf", &L, L.len, C, "2bit scale 2");
  put32(p + HDR + 8, 0xff800000u), reseal(p, L.len);
  /* non-finite fp payload values */
  p = add(&l, "bf16-inf-sparse", &P, P.len, C, "bf16 value 4 is not finite");
  p[values_at(p) + 8] = 0x80, p[values_at(p) + 9] = 0x7f, reseal(p, P.len);
  p = add(&l, "fp32-inf-sparse", &Q, Q.len, C, "fp32 value 7 is not finite");
  put32(p + values_at(p) + 28, 0xff800000u), reseal(p, Q.len);
  p = add(&l, "fp16-nan-sparse", &E, E.len, C, "fp16 value 3 is not finite");
  p[values_at(p) + 6] = 0x01, p[values_at(p) + 7] = 0x7e, reseal(p, E.len);

  /* packed values: invalid code, padding bits, section sizes, block size */
  p = add(&l, "4bit-minus-8", &H, H.len, C, "4bit value 7 is -8");
  p[values_at(p) + 3] = (uint8_t)((p[values_at(p) + 3] & 0x0f) | 0x80), reseal(p, H.len);
  p = add(&l, "4bit-dense-minus-8", &K, K.len, C, "4bit value 20 is -8");
  p[values_at(p) + 10] = (uint8_t)((p[values_at(p) + 10] & 0xf0) | 0x08), reseal(p, K.len);
  p = add(&l, "4bit-dense-padding", &K, K.len, C, "padding bits");
  p[K.len - 1] |= 0x10, reseal(p, K.len);
  p = add(&l, "2bit-padding", &J, J.len, C, "padding bits");
  p[index_at(p) - 1] |= 0x40, reseal(p, J.len);
  p = add(&l, "2bit-dense-padding", &L, L.len, C, "padding bits");
  p[L.len - 1] |= 0x80, reseal(p, L.len);
  p = add(&l, "4bit-value-bytes", &H, H.len, C, "value section");
  put64(p + 56, 50);
  p = add(&l, "2bit-value-bytes", &L, L.len, C, "value section");
  put64(p + 56, 25);
  p = add(&l, "2bit-block-zero", &J, J.len, C, "block size");
  put32(p + 44, 0);
  p = add(&l, "4bit-scale-bytes", &K, K.len, C, "scale section");
  put64(p + 48, 24);

  /* chunked index sections (M: the section starts at index_at) */
  p = add(&l, "chunked-on-dense", &L, L.len, C, "index coding");
  p[13] = 3;
  p = add(&l, "chunk-not-power-of-two", &M, M.len, C, "not a power of two");
  put32(p + index_at(p), 48), reseal(p, M.len);
  p = add(&l, "chunk-too-small", &M, M.len, C, "not a power of two");
  put32(p + index_at(p), 8), reseal(p, M.len);
  p = add(&l, "chunk-too-large", &M, M.len, C, "not a power of two");
  put32(p + index_at(p), 1u << 17), reseal(p, M.len);
  p = add(&l, "chunk-k-zero", &M, M.len, C, "values per chunk");
  put32(p + index_at(p) + 4, 0), reseal(p, M.len);
  p = add(&l, "chunk-k-above-chunk", &M, M.len, C, "values per chunk");
  put32(p + index_at(p) + 4, 65), reseal(p, M.len);
  p = add(&l, "chunk-k-mismatch", &M, M.len, C, "makes k");
  put32(p + index_at(p) + 4, 7), reseal(p, M.len);
  p = add(&l, "chunk-size-mismatch", &M, M.len, C, "expected");
  put32(p + index_at(p), 128), put32(p + index_at(p) + 4, 12), reseal(p, M.len);
  p = add(&l, "chunk-index-bytes-under-8", &M, M.len, C, "chunked index section is 7");
  put64(p + 64, 7);
  p = add(&l, "chunk-index-bytes-over-2k", &M, M.len, C, "chunked index section is");
  put64(p + 64, 8 + 2 * 93 + 1);
  p = add(&l, "chunk-unused-byte", &M, M.len + 1, C, "chunked index section is 79");
  put64(p + 64, 79), put64(p + 72, get64(p + 72) + 1), reseal(p, M.len + 1);
  p = add(&l, "chunk-offsets-repeat", &M, M.len, C, "not strictly increasing");
  set_offset(p + index_at(p), 13, 6, 0), set_offset(p + index_at(p), 12, 6, 0), reseal(p, M.len);
  p = add(&l, "chunk-offset-beyond-n", &M, M.len, C, "not below n");
  set_offset(p + index_at(p), 92, 6, 63), reseal(p, M.len);
  p = add(&l, "chunk-padding", &M, M.len, C, "padding bits");
  p[M.len - 1] |= 0x80, reseal(p, M.len);
  p = add(&l, "flip-chunked-payload", &N, N.len, I, "checksum");
  p[HDR + 12] ^= 0x08;

  /* chunked Rice sections (R: the section starts at index_at; its gaps are in rr) */
  add(&l, "ok-chunked-rice-2bit", &R, R.len, NB_OK, NULL);
  rice_t rr = rice_read(R.b + index_at(R.b), 1000);
  size_t rix = index_at(R.b), rib = R.len - rix;
  buf_t X;
  p = add(&l, "rice-on-dense", &L, L.len, C, "index coding");
  p[13] = 4;
  p = add(&l, "rice-chunk-not-power-of-two", &R, R.len, C, "not a power of two");
  put32(p + rix, 48), reseal(p, R.len);
  p = add(&l, "rice-chunk-too-small", &R, R.len, C, "not a power of two");
  put32(p + rix, 8), reseal(p, R.len);
  p = add(&l, "rice-chunk-too-large", &R, R.len, C, "not a power of two");
  put32(p + rix, 1u << 17), reseal(p, R.len);
  p = add(&l, "rice-k-zero", &R, R.len, C, "values per chunk");
  put32(p + rix + 4, 0), reseal(p, R.len);
  p = add(&l, "rice-k-above-chunk", &R, R.len, C, "values per chunk");
  put32(p + rix + 4, 65), reseal(p, R.len);
  p = add(&l, "rice-k-mismatch", &R, R.len, C, "makes k");
  put32(p + rix + 4, 7), reseal(p, R.len);
  p = add(&l, "rice-param-too-large", &R, R.len, C, "Rice parameter 6");
  p[rix + 8] = 6, reseal(p, R.len);
  p = add(&l, "rice-head-padding", &R, R.len, C, "padding bytes");
  p[rix + 10] = 1, reseal(p, R.len);
  p = add(&l, "rice-index-bytes-under-12", &R, R.len, C, "Rice index section is 11");
  put64(p + 64, 11);
  p = add(&l, "rice-index-bytes-over-2k", &R, R.len, C, "Rice index section is");
  put64(p + 64, 12 + 2 * 93 + 1);
  /* the stream: all ones (the first unary run passes what chunk 0 allows), cut inside a long
   * unary run (r = 0), a zero byte after the padding, a set padding bit */
  p = add(&l, "rice-unary-too-long", &R, R.len, C, "unary run of offset 0 is longer");
  memset(p + rix + 12, 0xff, rib - 12), reseal(p, R.len);
  rr.r = 0;
  X = rice_frame(&R, &rr);
  p = add(&l, "rice-stream-cut", &X, X.len - 1, C, "ends inside offset 92");
  put64(p + 64, get64(p + 64) - 1), put64(p + 72, get64(p + 72) - 1), reseal(p, X.len - 1);
  free(X.b);
  rr.r = R.b[rix + 8];
  p = add(&l, "rice-unused-byte", &R, R.len + 1, C, "1 unused bytes");
  put64(p + 64, rib + 1), put64(p + 72, get64(p + 72) + 1), reseal(p, R.len + 1);
  {
    size_t bits = 0;
    uint8_t* sec = calloc(12 + 4 * rr.k + 64, 1);
    for (rr.r = 1; rr.r < 6; rr.r++) { /* a parameter that leaves padding bits */
      memset(sec, 0, 12 + 4 * rr.k + 64);
      if (rice_write(sec, &rr, &bits) && bits % 8 != 0) break;
    }
    X = rice_frame(&R, &rr);
    p = add(&l, "rice-padding", &X, X.len, C, "padding bits after the last offset");
    p[X.len - 1] |= 0x80, reseal(p, X.len);
    free(X.b), free(sec);
    rr.r = R.b[rix + 8];
  }
  /* an offset at or past its chunk's length with a unary run within bounds: the first gap
   * whose largest low bits reach past the chunk gets them */
  {
    rice_t bad = rr;
    bad.gaps = malloc(rr.k * sizeof *bad.gaps);
    memcpy(bad.gaps, rr.gaps, rr.k * sizeof *bad.gaps);
    size_t j = 0, found = 0;
    for (size_t b = 0; b < 1000 && !found; b += 64) {
      size_t cl = 1000 - b < 64 ? 1000 - b : 64, cnt = cl == 64 ? 6 : 6 * cl / 64, next = 0;
      for (size_t e = j + cnt; j < e && !found; j++) {
        uint32_t gmax = (uint32_t)(((cl - 1 - next) >> rr.r) << rr.r | ((1u << rr.r) - 1));
        if (next + gmax >= cl)
          bad.gaps[j] = gmax, found = 1;
        else
          next += bad.gaps[j] + 1;
      }
    }
    X = rice_frame(&R, &bad);
    p = add(&l, "rice-offset-beyond-chunk", &X, X.len, C, "not below its length");
    free(X.b), free(bad.gaps);
  }
  free(rr.gaps);

  free(A.b), free(B.b), free(D.b), free(E.b), free(F.b), free(G.b);
  free(H.b), free(J.b), free(K.b), free(L.b), free(M.b), free(N.b), free(O.b), free(P.b), free(Q.b);
  free(R.b);
  *out = l.v;
  return l.n;
}

void nb_test_frames_free(nb_test_frame_t* f, size_t count) {
  for (size_t i = 0; i < count; i++) free(f[i].bytes);
  free(f);
}
