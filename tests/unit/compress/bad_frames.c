/* The defective-frame corpus (see bad_frames.h). Base frames come from the real encoder; each
 * defect is one change, with the checksum recomputed (by the formula of docs/wire-format.md)
 * whenever the defect must be caught by something other than the checksum. */
#include "bad_frames.h"

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

static buf_t encode(nb_values_t v, int level, int dense, size_t n, double density, int spiky) {
  nb_codec_config_t cfg;
  nb_codec_config_default(&cfg);
  cfg.values = v;
  cfg.zstd_level = level;
  cfg.block_size = 16;
  cfg.threads = 1;
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

typedef struct {
  nb_test_frame_t* v;
  size_t n, cap;
} list_t;

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
  p[13] = 4;
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

  free(A.b), free(B.b), free(D.b), free(E.b), free(F.b), free(G.b);
  *out = l.v;
  return l.n;
}

void nb_test_frames_free(nb_test_frame_t* f, size_t count) {
  for (size_t i = 0; i < count; i++) free(f[i].bytes);
  free(f);
}
