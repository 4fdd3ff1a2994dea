/* Strict decoding: every size, index, scale and value is checked before the caller's buffer is
 * touched, then out += w * decoded. Sparse payloads are decompressed whole (O(k) scratch); dense
 * payloads are streamed through a fixed chunk twice (check, then apply), never materialized. */
#include <float.h>
#include <math.h>

#include "common/common.h"
#include "compress/codec_internal.h"
#include "kernels/quantize.h"

#define NB__BAD(...) nb_error(NB_ERR_CODEC, "bad frame: " __VA_ARGS__)

static nb_status_t nb__decode_varints(const uint8_t* p, size_t ib, uint64_t n, uint64_t k,
                                      uint32_t* idx) {
  size_t pos = 0;
  uint64_t prev = 0;
  for (uint64_t j = 0; j < k; j++) {
    uint64_t v = 0;
    unsigned len = 0;
    uint8_t b;
    for (;;) {
      if (pos >= ib)
        return NB__BAD("index section ends inside varint %llu of %llu", (unsigned long long)j,
                       (unsigned long long)k);
      b = p[pos++];
      v |= (uint64_t)(b & 0x7f) << (7 * len);
      len++;
      if (!(b & 0x80)) break;
      if (len == 5)
        return NB__BAD("varint %llu of the index section is longer than 5 bytes",
                       (unsigned long long)j);
    }
    if (len > 1 && b == 0)
      return NB__BAD("varint %llu of the index section is not canonical (trailing zero byte)",
                     (unsigned long long)j);
    if (v > UINT32_MAX)
      return NB__BAD("varint %llu of the index section exceeds 32 bits", (unsigned long long)j);
    if (j > 0 && v == 0)
      return NB__BAD("indices not strictly increasing: index %llu repeats %llu",
                     (unsigned long long)j, (unsigned long long)prev);
    uint64_t cur = j == 0 ? v : prev + v;
    if (cur >= n)
      return NB__BAD("index %llu is %llu, not below n = %llu", (unsigned long long)j,
                     (unsigned long long)cur, (unsigned long long)n);
    idx[j] = (uint32_t)cur;
    prev = cur;
  }
  if (pos != ib)
    return NB__BAD("%zu unused bytes at the end of the varint index section", ib - pos);
  return NB_OK;
}

static nb_status_t nb__decode_bitmap(const uint8_t* p, size_t ib, uint64_t n, uint64_t k,
                                     uint32_t* idx) {
  if (n % 8 && (p[ib - 1] >> (n % 8)))
    return NB__BAD("bitmap index section has bits set at or beyond n = %llu",
                   (unsigned long long)n);
  uint64_t cnt = 0;
  for (size_t i = 0; i < ib; i++) {
    unsigned b = p[i];
    while (b) {
      if (cnt == k)
        return NB__BAD("bitmap index section holds more than k = %llu indices",
                       (unsigned long long)k);
      idx[cnt++] = (uint32_t)(8 * i + (unsigned)__builtin_ctz(b));
      b &= b - 1;
    }
  }
  if (cnt != k)
    return NB__BAD("bitmap index section holds %llu indices, the header says k = %llu",
                   (unsigned long long)cnt, (unsigned long long)k);
  return NB_OK;
}

/* The head of a chunked index section (what: "chunked" or "chunked Rice"): the chunk size is a
 * power of two in [NB_FRAME_MIN_CHUNK, NB_FRAME_MAX_CHUNK] and holds 1 to chunk values. */
static nb_status_t nb__check_chunks(const char* what, uint32_t chunk, uint32_t kc) {
  if (chunk < NB_FRAME_MIN_CHUNK || chunk > NB_FRAME_MAX_CHUNK || (chunk & (chunk - 1)))
    return NB__BAD("%s index section: chunk size %u is not a power of two in [%u, %u]", what, chunk,
                   NB_FRAME_MIN_CHUNK, NB_FRAME_MAX_CHUNK);
  if (kc < 1 || kc > chunk)
    return NB__BAD("%s index section: %u values per chunk, outside [1, chunk size %u]", what, kc,
                   chunk);
  return NB_OK;
}

/* kc per chunk of chunk over n makes the header's k. */
static nb_status_t nb__check_chunked_k(const char* what, uint64_t n, uint64_t k, uint32_t chunk,
                                       uint32_t kc) {
  uint64_t want_k = nb__chunked_k(n, chunk, kc);
  if (want_k != k)
    return NB__BAD(
        "%s index section: %u per chunk of %u over n = %llu makes k = %llu, the header says k = "
        "%llu",
        what, kc, chunk, (unsigned long long)n, (unsigned long long)want_k, (unsigned long long)k);
  return NB_OK;
}

/* Chunked index section: u32 chunk size (a power of two), u32 k per chunk, then the offsets of
 * all k indices within their chunks, log2(chunk) bits each, LSB first, zero padding. */
static nb_status_t nb__decode_chunked(const uint8_t* p, size_t ib, uint64_t n, uint64_t k,
                                      uint32_t* idx) {
  uint32_t chunk = nb__get32(p), kc = nb__get32(p + 4);
  NB_CHECK(nb__check_chunks("chunked", chunk, kc));
  NB_CHECK(nb__check_chunked_k("chunked", n, k, chunk, kc));
  unsigned bits = (unsigned)__builtin_ctz(chunk);
  uint64_t want_ib = nb__chunked_index_bytes(k, bits);
  if (ib != want_ib)
    return NB__BAD(
        "chunked index section is %zu bytes, expected %llu (k = %llu offsets of %u "
        "bits)",
        ib, (unsigned long long)want_ib, (unsigned long long)k, bits);
  const uint8_t* q = p + NB__CHUNKED_HEAD;
  uint64_t acc = 0, pos = 0;
  unsigned have = 0;
  uint32_t mask = chunk - 1, prev = 0;
  for (uint64_t j = 0; j < k; j++) {
    while (have < bits) {
      acc |= (uint64_t)q[pos++] << have;
      have += 8;
    }
    uint32_t off = (uint32_t)acc & mask;
    acc >>= bits;
    have -= bits;
    uint64_t c = j / kc, first = j % kc == 0;
    if (!first && off <= prev)
      return NB__BAD(
          "chunked index section: offsets of chunk %llu not strictly increasing "
          "(index %llu)",
          (unsigned long long)c, (unsigned long long)j);
    uint64_t ix = c * chunk + off;
    if (ix >= n)
      return NB__BAD("chunked index section: index %llu is %llu, not below n = %llu",
                     (unsigned long long)j, (unsigned long long)ix, (unsigned long long)n);
    idx[j] = (uint32_t)ix;
    prev = off;
  }
  if (acc != 0 || (pos < ib - NB__CHUNKED_HEAD && q[pos] != 0))
    return NB__BAD("chunked index section: padding bits after the last offset are not 0");
  return NB_OK;
}

/* Chunked Rice index section (NB_INDEX_CHUNKED_RICE): u32 chunk size, u32 k per chunk, u8 r,
 * 3 zero bytes, then chunk by chunk the gaps of its ascending offsets (first: the offset; then
 * offset - previous - 1) as (gap >> r) one-bits, a zero-bit, the low r bits; one LSB-first bit
 * stream, zero padding to the section's end. Gaps are >= 0, so offsets rise strictly by
 * construction; each unary run is bounded by the room left in its chunk before it is read on,
 * and the bit reader never loads past the section. */
static nb_status_t nb__decode_rice(const uint8_t* p, size_t ib, uint64_t n, uint64_t k,
                                   uint32_t* idx) {
  uint32_t chunk = nb__get32(p), kc = nb__get32(p + 4);
  unsigned r = p[8];
  NB_CHECK(nb__check_chunks("chunked Rice", chunk, kc));
  unsigned bits = (unsigned)__builtin_ctz(chunk);
  if (r >= bits)
    return NB__BAD("chunked Rice index section: Rice parameter %u, outside [0, log2(%u) - 1 = %u]",
                   r, chunk, bits - 1);
  if (p[9] | p[10] | p[11])
    return NB__BAD("chunked Rice index section: padding bytes 9..11 are not 0");
  NB_CHECK(nb__check_chunked_k("chunked Rice", n, k, chunk, kc));
  const uint8_t* q = p + NB__RICE_HEAD;
  const size_t nb = ib - NB__RICE_HEAD;
  const uint32_t rmask = (1u << r) - 1;
  uint64_t acc = 0; /* the next `have` bits of the stream, LSB first; above them 0 or the bits
                       of the bytes from q[pos] on */
  unsigned have = 0;
  size_t pos = 0; /* bytes of q loaded into acc */
  uint64_t j = 0;
  for (uint64_t b = 0; j < k; b += chunk) {
    uint64_t len = n - b < chunk ? n - b : chunk;
    uint64_t cnt = len == chunk ? kc : (uint64_t)kc * len / chunk;
    uint64_t next = 0; /* the smallest offset the next gap can give */
    for (uint64_t e = j + cnt; j < e; j++) {
      if (next >= len) /* only after an earlier gap of this chunk too large for the rest */
        return NB__BAD(
            "chunked Rice index section: offset %llu of chunk %llu has no room left below its "
            "length %llu",
            (unsigned long long)j, (unsigned long long)(b / chunk), (unsigned long long)len);
      /* (gap >> r) <= (len - 1 - next) >> r, or the offset leaves the chunk */
      uint64_t qmax = (len - 1 - next) >> r, qn = 0, off;
      if (have <= 48 && pos + 8 <= nb) { /* the common case: the whole code in 56+ bits */
        uint64_t w;
        memcpy(&w, q + pos, 8);
        acc |= w << have;
        pos += (63 - have) >> 3;
        have |= 56;
      }
      uint64_t ones = ~acc;
      unsigned t0 = ones ? (unsigned)__builtin_ctzll(ones) : 64;
      if (t0 + 1 + r <= have && t0 <= qmax) {
        off = next + ((uint64_t)t0 << r) + ((acc >> (t0 + 1)) & rmask);
        acc >>= t0 + 1 + r;
        have -= t0 + 1 + r;
        goto have_offset;
      }
      for (;;) {
        if (have <= 48 && pos + 8 <= nb) { /* 8 bytes at once; bits above `have` are those of
                                             q[pos..], which later loads OR in again */
          uint64_t w;
          memcpy(&w, q + pos, 8);
          acc |= w << have;
          pos += (63 - have) >> 3;
          have |= 56;
        }
        while (have <= 48 && pos < nb) {
          acc |= (uint64_t)q[pos++] << have;
          have += 8;
        }
        if (have == 0)
          return NB__BAD("chunked Rice index section ends inside offset %llu of %llu",
                         (unsigned long long)j, (unsigned long long)k);
        uint64_t zeros = ~acc & (have == 64 ? ~0ull : (1ull << have) - 1);
        unsigned t = zeros ? (unsigned)__builtin_ctzll(zeros) : have;
        qn += t;
        if (qn > qmax)
          return NB__BAD(
              "chunked Rice index section: unary run of offset %llu is longer than chunk %llu "
              "allows (%llu ones, at most %llu)",
              (unsigned long long)j, (unsigned long long)(b / chunk), (unsigned long long)qn,
              (unsigned long long)qmax);
        if (t < have) { /* the run ends here: drop it and its zero-bit */
          acc >>= t + 1;
          have -= t + 1;
          break;
        }
        acc = 0;
        have = 0;
      }
      while (have < r && pos < nb) {
        acc |= (uint64_t)q[pos++] << have;
        have += 8;
      }
      if (have < r)
        return NB__BAD("chunked Rice index section ends inside offset %llu of %llu",
                       (unsigned long long)j, (unsigned long long)k);
      off = next + (qn << r) + (acc & rmask);
      acc >>= r;
      have -= r;
    have_offset:
      if (off >= len)
        return NB__BAD(
            "chunked Rice index section: offset %llu of chunk %llu is %llu, not below its "
            "length %llu",
            (unsigned long long)j, (unsigned long long)(b / chunk), (unsigned long long)off,
            (unsigned long long)len);
      idx[j] = (uint32_t)(b + off);
      next = off + 1;
    }
  }
  if (have >= 8 || pos < nb)
    return NB__BAD("chunked Rice index section: %zu unused bytes after the last offset",
                   nb - pos + have / 8);
  if (acc != 0)
    return NB__BAD("chunked Rice index section: padding bits after the last offset are not 0");
  return NB_OK;
}

static nb_status_t nb__check_scales(nb_values_t t, const uint8_t* s, uint64_t count,
                                    uint64_t first) {
  if (count == 0) return NB_OK; /* also every type without scales */
  /* the encoder caps its scales the same way, so max_code * scale is always finite */
  float code = nb__values_max_code(t), smax = nb_quant_scale_max(code);
  for (uint64_t j = 0; j < count; j++) {
    float v;
    memcpy(&v, s + 4 * j, 4);
    if (!(v >= 0.0f && v <= smax))
      return NB__BAD("%s scale %llu is %.9g (must be in [0, %.9g], so that %g * scale is finite)",
                     nb_values_name(t), (unsigned long long)(first + j), (double)v, (double)smax,
                     (double)code);
  }
  return NB_OK;
}

/* Checks `count` values starting at value position `first` (for packed types a multiple of the
 * values per byte, v pointing at its byte); k is the frame's value count, so that the padding
 * bits after the last value can be checked. */
static nb_status_t nb__check_values(nb_values_t t, const uint8_t* v, uint64_t count, uint64_t first,
                                    uint64_t k) {
  uint64_t bad = count;
  switch (t) {
    case NB_VALUES_INT4:
    case NB_VALUES_INT2: {
      unsigned bits = t == NB_VALUES_INT4 ? 4 : 2, per = 8 / bits;
      if (t == NB_VALUES_INT4)
        for (uint64_t j = 0; j < count && bad == count; j++)
          if (((v[j / 2] >> (4 * (j & 1))) & 0xf) == 8) bad = j;
      if (bad < count)
        return NB__BAD("4bit value %llu is -8 (the range is [-7, 7])",
                       (unsigned long long)(first + bad));
      if (first + count == k && k % per && (v[count / per] >> (bits * (k % per))) != 0)
        return NB__BAD("%s value section: padding bits after value %llu are not 0",
                       nb_values_name(t), (unsigned long long)(k - 1));
      return NB_OK;
    }
    case NB_VALUES_INT8:
      for (uint64_t j = 0; j < count && bad == count; j++)
        if ((int8_t)v[j] == -128) bad = j;
      if (bad < count)
        return NB__BAD("int8 value %llu is -128 (the range is [-127, 127])",
                       (unsigned long long)(first + bad));
      return NB_OK;
    case NB_VALUES_FP16:
    case NB_VALUES_BF16: {
      uint16_t mask = t == NB_VALUES_FP16 ? 0x7c00 : 0x7f80;
      for (uint64_t j = 0; j < count && bad == count; j++)
        if ((nb__get16(v + 2 * j) & mask) == mask) bad = j;
      break;
    }
    case NB_VALUES_FP32:
      for (uint64_t j = 0; j < count && bad == count; j++)
        if ((nb__get32(v + 4 * j) & 0x7f800000u) == 0x7f800000u) bad = j;
      break;
  }
  if (bad < count)
    return NB__BAD("%s value %llu is not finite", nb_values_name(t),
                   (unsigned long long)(first + bad));
  return NB_OK;
}

static inline float nb__value(nb_values_t t, const uint8_t* v, uint64_t j, const float* scales,
                              uint32_t block) {
  switch (t) {
    case NB_VALUES_INT8:
      return (float)(int8_t)v[j] * scales[j / block];
    case NB_VALUES_INT4:
      return (float)nb_int4_code(v[j >> 1] >> (4 * (j & 1))) * scales[j / block];
    case NB_VALUES_INT2:
      return nb_int2_level(v[j >> 2] >> (2 * (j & 3))) * scales[j / block];
    case NB_VALUES_FP16:
      return nb_f16_to_f32(nb__get16(v + 2 * j));
    case NB_VALUES_BF16:
      return nb_bf16_to_f32(nb__get16(v + 2 * j));
    case NB_VALUES_FP32: {
      float f;
      memcpy(&f, v + 4 * j, 4);
      return f;
    }
  }
  return 0.0f;
}

/* Applies `count` values starting at position `first` (idx = NULL: dense positions). */
static void nb__apply(const nb_frame_info_t* h, const uint8_t* v, uint64_t count, uint64_t first,
                      const uint32_t* idx, const float* scales, float w, float* out) {
  nb_values_t t = h->values;
  uint32_t block = h->block_size ? h->block_size : 1;
  if (idx) { /* sparse: the whole payload at once (first == 0); block by block, no division */
    const uint32_t* ix = idx + first;
    if (!nb__values_blocked(t)) {
      for (uint64_t j = 0; j < count; j++) out[ix[j]] += w * nb__value(t, v, j, scales, block);
      return;
    }
    for (uint64_t b0 = 0, bi = 0; b0 < count; b0 += block, bi++) {
      uint64_t b1 = count - b0 < block ? count : b0 + block;
      float s = scales[bi];
      if (t == NB_VALUES_INT8)
        for (uint64_t j = b0; j < b1; j++) out[ix[j]] += w * ((float)(int8_t)v[j] * s);
      else if (t == NB_VALUES_INT4)
        for (uint64_t j = b0; j < b1; j++)
          out[ix[j]] += w * ((float)nb_int4_code(v[j >> 1] >> (4 * (j & 1))) * s);
      else
        for (uint64_t j = b0; j < b1; j++)
          out[ix[j]] += w * (nb_int2_level(v[j >> 2] >> (2 * (j & 3))) * s);
    }
    return;
  }
  float* o = out + first;
  if (t == NB_VALUES_INT8) {
    for (uint64_t j = 0; j < count; j++)
      o[j] += w * ((float)(int8_t)v[j] * scales[(first + j) / block]);
  } else if (t == NB_VALUES_INT4) { /* first is even: v[0] holds values first, first + 1 */
    for (uint64_t j = 0; j < count; j++)
      o[j] += w * ((float)nb_int4_code(v[j >> 1] >> (4 * (j & 1))) * scales[(first + j) / block]);
  } else if (t == NB_VALUES_INT2) { /* first is a multiple of 4 */
    for (uint64_t j = 0; j < count; j++)
      o[j] += w * (nb_int2_level(v[j >> 2] >> (2 * (j & 3))) * scales[(first + j) / block]);
  } else {
    for (uint64_t j = 0; j < count; j++) o[j] += w * nb__value(t, v, j, scales, block);
  }
}

static nb_status_t nb__check_zstd_payload(const uint8_t* p, uint64_t pb, uint64_t raw) {
  unsigned long long cs = ZSTD_getFrameContentSize(p, (size_t)pb);
  if (cs == ZSTD_CONTENTSIZE_ERROR) return NB__BAD("the payload is not a zstd frame");
  if (cs == ZSTD_CONTENTSIZE_UNKNOWN)
    return NB__BAD("the zstd payload does not declare its decompressed size");
  if (cs != raw)
    return NB__BAD("the zstd payload holds %llu bytes, the sections total %llu", cs,
                   (unsigned long long)raw);
  size_t fs = ZSTD_findFrameCompressedSize(p, (size_t)pb);
  if (ZSTD_isError(fs))
    return NB__BAD("zstd payload is truncated or corrupt (%s)", ZSTD_getErrorName(fs));
  if (fs != pb)
    return NB__BAD("%llu bytes after the zstd frame inside the payload",
                   (unsigned long long)(pb - fs));
  return NB_OK;
}

/* ---- dense frames: the payload is streamed in pieces of whole 4-byte words ---- */

typedef struct {
  const nb_frame_info_t* h;
  float* scales;
  uint64_t off;
  int apply;
  float w;
  float* out;
} nb__dense_t;

static nb_status_t nb__dense_consume(nb__dense_t* d, const uint8_t* p, size_t len) {
  const nb_frame_info_t* h = d->h;
  unsigned bits = nb__values_bits(h->values);
  while (len > 0) {
    if (d->off < h->scale_bytes) {
      size_t take =
          (size_t)(h->scale_bytes - d->off) < len ? (size_t)(h->scale_bytes - d->off) : len;
      if (!d->apply) NB_CHECK(nb__check_scales(h->values, p, take / 4, d->off / 4));
      memcpy((uint8_t*)d->scales + d->off, p, take);
      d->off += take;
      p += take;
      len -= take;
      continue;
    }
    /* pieces are whole bytes (whole values for the wider types): first stays aligned */
    uint64_t first = (d->off - h->scale_bytes) * 8 / bits, count = (uint64_t)len * 8 / bits;
    if (count > h->k - first) count = h->k - first; /* padding of the last packed byte */
    if (d->apply)
      nb__apply(h, p, count, first, NULL, d->scales, d->w, d->out);
    else
      NB_CHECK(nb__check_values(h->values, p, count, first, h->k));
    d->off += len;
    len = 0;
  }
  return NB_OK;
}

static nb_status_t nb__dense_stream(nb_codec_t* c, const uint8_t* payload, nb__dense_t* d) {
  const nb_frame_info_t* h = d->h;
  uint64_t raw = h->scale_bytes + h->value_bytes;
  d->off = 0;
  if (!(h->flags & NB_FRAME_FLAG_ZSTD)) return nb__dense_consume(d, payload, (size_t)raw);
  ZSTD_DCtx_reset(c->dctx, ZSTD_reset_session_only);
  ZSTD_inBuffer in = {payload, (size_t)h->payload_bytes, 0};
  size_t fill = 0;
  for (;;) {
    ZSTD_outBuffer ob = {c->chunk, NB__CHUNK, fill};
    size_t r = ZSTD_decompressStream(c->dctx, &ob, &in);
    if (ZSTD_isError(r)) return NB__BAD("zstd payload: %s", ZSTD_getErrorName(r));
    if (d->off + ob.pos > raw)
      return NB__BAD("the zstd payload decompresses past the %llu bytes declared",
                     (unsigned long long)raw);
    size_t whole = r == 0 ? ob.pos : (ob.pos & ~(size_t)3);
    NB_CHECK(nb__dense_consume(d, c->chunk, whole));
    fill = ob.pos - whole;
    memmove(c->chunk, c->chunk + whole, fill);
    if (r == 0) break;
    if (in.pos == in.size && ob.pos < ob.size) return NB__BAD("the zstd payload is truncated");
  }
  if (in.pos != in.size) return NB__BAD("bytes after the zstd frame inside the payload");
  if (d->off != raw)
    return NB__BAD("the zstd payload holds %llu bytes, the sections total %llu",
                   (unsigned long long)d->off, (unsigned long long)raw);
  return NB_OK;
}

static nb_status_t nb__decode(nb_codec_t* c, const uint8_t* f, size_t len, float w, float* out,
                              size_t n, const nb_codec_limits_t* limits) {
  nb_frame_info_t h;
  NB_CHECK(nb_codec_frame_info(f, len, limits, &h));
  if (h.n != n)
    return nb_error(NB_ERR_INVALID, "decode: the frame is for n = %llu, the destination has %zu",
                    (unsigned long long)h.n, n);
  const uint8_t* payload = f + NB_FRAME_HEADER_BYTES;
  uint64_t raw = h.scale_bytes + h.value_bytes + h.index_bytes;
  int zstd = (h.flags & NB_FRAME_FLAG_ZSTD) != 0;
  if (zstd) NB_CHECK(nb__check_zstd_payload(payload, h.payload_bytes, raw));

  if (!(h.flags & NB_FRAME_FLAG_SPARSE)) {
    size_t nbl = (size_t)(h.scale_bytes / 4);
    NB_CHECK(
        nb__codec_grow((void**)&c->dscales, &c->dscales_cap, nbl ? nbl : 1, 4, "decode scales"));
    nb__dense_t d = {.h = &h, .scales = c->dscales, .apply = 0, .w = w, .out = out};
    NB_CHECK(nb__dense_stream(c, payload, &d));
    d.apply = 1;
    return nb__dense_stream(c, payload, &d);
  }

  const uint8_t* base = payload;
  if (zstd) {
    NB_CHECK(nb__codec_grow((void**)&c->draw, &c->draw_cap, (size_t)raw, 1, "decode sections"));
    size_t got =
        ZSTD_decompressDCtx(c->dctx, c->draw, (size_t)raw, payload, (size_t)h.payload_bytes);
    if (ZSTD_isError(got)) return NB__BAD("zstd payload: %s", ZSTD_getErrorName(got));
    if (got != raw)
      return NB__BAD("the zstd payload holds %zu bytes, the sections total %llu", got,
                     (unsigned long long)raw);
    base = c->draw;
  }
  const uint8_t *scales = base, *values = base + h.scale_bytes, *index = values + h.value_bytes;
  NB_CHECK(
      nb__codec_grow((void**)&c->didx, &c->didx_cap, h.k ? (size_t)h.k : 1, 4, "decode indices"));
  if (h.index_coding == NB_INDEX_BITMAP)
    NB_CHECK(nb__decode_bitmap(index, (size_t)h.index_bytes, h.n, h.k, c->didx));
  else if (h.index_coding == NB_INDEX_CHUNKED)
    NB_CHECK(nb__decode_chunked(index, (size_t)h.index_bytes, h.n, h.k, c->didx));
  else if (h.index_coding == NB_INDEX_CHUNKED_RICE)
    NB_CHECK(nb__decode_rice(index, (size_t)h.index_bytes, h.n, h.k, c->didx));
  else
    NB_CHECK(nb__decode_varints(index, (size_t)h.index_bytes, h.n, h.k, c->didx));
  size_t nbl = (size_t)(h.scale_bytes / 4);
  NB_CHECK(nb__check_scales(h.values, scales, nbl, 0));
  NB_CHECK(nb__check_values(h.values, values, h.k, 0, h.k));
  NB_CHECK(nb__codec_grow((void**)&c->dscales, &c->dscales_cap, nbl ? nbl : 1, 4, "decode scales"));
  memcpy(c->dscales, scales, nbl * 4);
  nb__apply(&h, values, h.k, 0, c->didx, c->dscales, w, out);
  return NB_OK;
}

nb_status_t nb_codec_decode_accumulate(nb_codec_t* codec, const void* frame, size_t len, float w,
                                       float* out, size_t n, const nb_codec_limits_t* limits) {
  if (!frame || (!out && n))
    return nb_error(NB_ERR_INVALID, "decode: frame or destination is NULL");
  if (!isfinite(w)) return nb_error(NB_ERR_INVALID, "decode: weight %g is not finite", (double)w);
  if (codec) return nb__decode(codec, (const uint8_t*)frame, len, w, out, n, limits);
  nb_codec_t* tmp = NULL;
  NB_CHECK(nb_codec_create(NULL, &tmp));
  nb_status_t st = nb__decode(tmp, (const uint8_t*)frame, len, w, out, n, limits);
  nb_codec_destroy(tmp);
  return st;
}
