/* The codec object, its settings and environment parameters, and the frame header (write, parse
 * and check). Encoding is in encode.c, decoding in decode.c. */
#include <math.h>
#include <stdlib.h>
#include <strings.h>

#include "common/common.h"
#include "compress/codec_internal.h"
#include "kernels/quantize.h"

NB_PARAM_INT(ZstdLevel, "NB_ZSTD_LEVEL", NB_CODEC_ZSTD_LEVEL_DEFAULT, NB_CODEC_ZSTD_LEVEL_MIN,
             NB_CODEC_ZSTD_LEVEL_MAX,
             "zstd level of codec frames (0 = no zstd, sections stored as-is)")
NB_PARAM_INT(CodecThreads, "NB_CODEC_THREADS", 2, 1, 64, "threads of the sparse encode pass")
NB_PARAM_INT(CodecInt8Block, "NB_CODEC_INT8_BLOCK", 256, 1, 65536,
             "values per fp32 scale in int8, 4bit and 2bit frames")
NB_PARAM_INT(CodecTopkChunk, "NB_CODEC_TOPK_CHUNK", 0, 0, 65536,
             "chunked top-k: coordinates per chunk (a power of two >= 16); 0 = exact global top-k")
NB_PARAM_INT(CodecMaxN, "NB_CODEC_MAX_N", 2147483648, 0, 4294967295.0,
             "decode limit: largest n a frame may declare")
NB_PARAM_INT(CodecMaxFrameBytes, "NB_CODEC_MAX_FRAME_BYTES", 4294967296, 88, 1e18,
             "decode limit: largest frame in bytes")

const char* nb_values_name(nb_values_t v) {
  switch (v) {
    case NB_VALUES_FP32:
      return "fp32";
    case NB_VALUES_FP16:
      return "fp16";
    case NB_VALUES_BF16:
      return "bf16";
    case NB_VALUES_INT8:
      return "int8";
    case NB_VALUES_INT4:
      return "4bit";
    case NB_VALUES_INT2:
      return "2bit";
  }
  return "?";
}

nb_status_t nb_values_parse(const char* name, nb_values_t* out) {
  static const nb_values_t all[] = {NB_VALUES_FP32, NB_VALUES_FP16, NB_VALUES_BF16,
                                    NB_VALUES_INT8, NB_VALUES_INT4, NB_VALUES_INT2};
  for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
    if (strcasecmp(name, nb_values_name(all[i])) == 0) {
      *out = all[i];
      return NB_OK;
    }
  return nb_error(NB_ERR_INVALID,
                  "unknown value type '%s' (expected fp32, fp16, bf16, int8, 4bit or 2bit)",
                  name ? name : "(null)");
}

unsigned nb__values_bits(nb_values_t v) {
  switch (v) {
    case NB_VALUES_FP32:
      return 32;
    case NB_VALUES_FP16:
    case NB_VALUES_BF16:
      return 16;
    case NB_VALUES_INT8:
      return 8;
    case NB_VALUES_INT4:
      return 4;
    case NB_VALUES_INT2:
      return 2;
  }
  return 0;
}

uint64_t nb__value_bytes(nb_values_t v, uint64_t k) {
  return (k * nb__values_bits(v) + 7) / 8;
}

int nb__values_blocked(nb_values_t v) {
  return v == NB_VALUES_INT8 || v == NB_VALUES_INT4 || v == NB_VALUES_INT2;
}

float nb__values_max_code(nb_values_t v) {
  switch (v) {
    case NB_VALUES_INT8:
      return NB_QUANT_INT8_MAX;
    case NB_VALUES_INT4:
      return NB_QUANT_INT4_MAX;
    case NB_VALUES_INT2:
      return NB_QUANT_INT2_MAX;
    default:
      return 0.0f;
  }
}

uint64_t nb__scale_blocks(nb_values_t v, uint64_t k, uint32_t block) {
  if (!nb__values_blocked(v) || block == 0) return 0;
  return k / block + (k % block != 0);
}

uint64_t nb__chunked_k(uint64_t n, uint32_t chunk, uint32_t kc) {
  if (n == 0 || chunk == 0) return 0;
  uint64_t whole = n / chunk, last = n % chunk;
  return whole * kc + (uint64_t)kc * last / chunk;
}

void nb_codec_config_default(nb_codec_config_t* cfg) {
  cfg->values = NB_VALUES_INT8;
  cfg->zstd_level = (int)nb_param_ZstdLevel();
  cfg->block_size = (uint32_t)nb_param_CodecInt8Block();
  cfg->threads = (int)nb_param_CodecThreads();
  cfg->topk_chunk = (uint32_t)nb_param_CodecTopkChunk();
}

void nb_codec_limits_default(nb_codec_limits_t* limits) {
  limits->max_n = (uint64_t)nb_param_CodecMaxN();
  limits->max_frame_bytes = (uint64_t)nb_param_CodecMaxFrameBytes();
  limits->max_raw_bytes = 9ull << 30;
}

nb_status_t nb__codec_grow(void** p, size_t* cap, size_t want, size_t size, const char* what) {
  if (want <= *cap && *p) return NB_OK;
  size_t ncap = want + want / 8 + 64;
  void* q = NULL;
  NB_CHECK(nb_aligned_alloc(&q, ncap, size, what));
  nb_free(*p);
  *p = q;
  *cap = ncap;
  return NB_OK;
}

nb_status_t nb_codec_create(const nb_codec_config_t* cfg, nb_codec_t** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "nb_codec_create: out is NULL");
  *out = NULL;
  nb_codec_config_t c;
  if (cfg)
    c = *cfg;
  else
    nb_codec_config_default(&c);
  if (nb__values_bits(c.values) == 0)
    return nb_error(NB_ERR_INVALID, "codec config: unknown value type %d", (int)c.values);
  if (c.zstd_level < NB_CODEC_ZSTD_LEVEL_MIN || c.zstd_level > NB_CODEC_ZSTD_LEVEL_MAX)
    return nb_error(NB_ERR_INVALID, "codec config: zstd_level %d outside [%d, %d]", c.zstd_level,
                    NB_CODEC_ZSTD_LEVEL_MIN, NB_CODEC_ZSTD_LEVEL_MAX);
  if (c.block_size < 1 || c.block_size > NB_FRAME_MAX_BLOCK)
    return nb_error(NB_ERR_INVALID, "codec config: block_size %u outside [1, %u]", c.block_size,
                    NB_FRAME_MAX_BLOCK);
  if (c.topk_chunk != 0 &&
      (c.topk_chunk < NB_FRAME_MIN_CHUNK || c.topk_chunk > NB_FRAME_MAX_CHUNK ||
       (c.topk_chunk & (c.topk_chunk - 1)) != 0))
    return nb_error(NB_ERR_INVALID,
                    "codec config: topk_chunk %u is not 0 or a power of two in [%u, %u]",
                    c.topk_chunk, NB_FRAME_MIN_CHUNK, NB_FRAME_MAX_CHUNK);
  if (c.threads < 1 || c.threads > NB__CODEC_MAX_THREADS)
    return nb_error(NB_ERR_INVALID, "codec config: threads %d outside [1, %d]", c.threads,
                    NB__CODEC_MAX_THREADS);
  nb_codec_t* k = NULL;
  NB_CHECK(nb_calloc((void**)&k, 1, sizeof *k, "codec"));
  k->cfg = c;
  k->cctx = ZSTD_createCCtx();
  k->dctx = ZSTD_createDCtx();
  nb_status_t st = NB_OK;
  if (!k->cctx || !k->dctx) {
    st = nb_error(NB_ERR_NOMEM, "codec: cannot create zstd contexts");
    goto fail;
  }
  NB_CHECK_GOTO(nb_alloc((void**)&k->chunk, NB__CHUNK, 1, "codec stream chunk"), st, fail);
  *out = k;
  return NB_OK;
fail:
  nb_codec_destroy(k);
  return st;
}

void nb_codec_destroy(nb_codec_t* k) {
  if (!k) return;
  ZSTD_freeCCtx(k->cctx);
  ZSTD_freeDCtx(k->dctx);
  nb_free(k->sample);
  for (int t = 0; t < NB__CODEC_MAX_THREADS; t++) {
    nb_free(k->cand[t]);
    nb_free(k->cval[t]);
    nb_free(k->cidx[t]);
    nb_free(k->ghist[t]);
    nb_free(k->rbuf[t]);
  }
  nb_free(k->hist);
  nb_free(k->work);
  nb_free(k->idx);
  nb_free(k->vals);
  nb_free(k->raw);
  nb_free(k->didx);
  nb_free(k->draw);
  nb_free(k->dscales);
  nb_free(k->chunk);
  nb_free(k);
}

const nb_codec_config_t* nb_codec_config(const nb_codec_t* codec) {
  return &codec->cfg;
}

size_t nb_codec_k_for_density(size_t n, double density) {
  if (!(density > 0) || n == 0) return 0;
  if (density >= 1) return n;
  double k = floor(density * (double)n + 0.5);
  if (k < 1) k = 1;
  return k >= (double)n ? n : (size_t)k;
}

size_t nb_codec_frame_bound(size_t n, size_t k, nb_values_t values, uint32_t block_size) {
  if (k > n) k = n;
  size_t idx = 0; /* a sparse frame has an index section even when k == n */
  if (k > 0) {
    size_t varint = 5 * k, bitmap = n / 8 + (n % 8 != 0);
    idx = varint < bitmap ? varint : bitmap;
  }
  size_t raw = 4 * (size_t)nb__scale_blocks(values, k, block_size) +
               (size_t)nb__value_bytes(values, k) + idx;
  size_t zb = ZSTD_compressBound(raw);
  return NB_FRAME_HEADER_BYTES + (zb > raw ? zb : raw);
}

uint64_t nb__frame_checksum(const uint8_t* frame, size_t payload_bytes) {
  uint64_t seed = nb_xxh3_64(frame, NB__H_CHECKSUM, 0);
  return nb_xxh3_64(frame + NB_FRAME_HEADER_BYTES, payload_bytes, seed);
}

void nb__write_header(uint8_t* f, const nb_frame_info_t* h) {
  memset(f, 0, NB_FRAME_HEADER_BYTES);
  nb__put32(f + NB__H_MAGIC, NB_FRAME_MAGIC);
  nb__put16(f + NB__H_VERSION, NB_FRAME_VERSION);
  nb__put16(f + NB__H_HDRSIZE, NB_FRAME_HEADER_BYTES);
  nb__put32(f + NB__H_FLAGS, h->flags);
  f[NB__H_VALUES] = (uint8_t)h->values;
  f[NB__H_INDEX] = (uint8_t)h->index_coding;
  f[NB__H_LEVEL] = (uint8_t)h->zstd_level;
  nb__put64(f + NB__H_N, h->n);
  nb__put64(f + NB__H_K, h->k);
  nb__put64(f + NB__H_ROUND, h->round);
  nb__put32(f + NB__H_SENDER, h->sender);
  nb__put32(f + NB__H_BLOCK, h->block_size);
  nb__put64(f + NB__H_SCALE_BYTES, h->scale_bytes);
  nb__put64(f + NB__H_VALUE_BYTES, h->value_bytes);
  nb__put64(f + NB__H_INDEX_BYTES, h->index_bytes);
  nb__put64(f + NB__H_PAYLOAD_BYTES, h->payload_bytes);
  nb__put64(f + NB__H_CHECKSUM, nb__frame_checksum(f, (size_t)h->payload_bytes));
}

#define NB__BAD(...) nb_error(NB_ERR_CODEC, "bad frame: " __VA_ARGS__)

nb_status_t nb_codec_frame_info(const void* frame, size_t len, const nb_codec_limits_t* limits,
                                nb_frame_info_t* info) {
  if (!frame && len) return nb_error(NB_ERR_INVALID, "frame info: frame is NULL");
  if (!info) return nb_error(NB_ERR_INVALID, "frame info: info is NULL");
  nb_codec_limits_t lim;
  if (limits)
    lim = *limits;
  else
    nb_codec_limits_default(&lim);
  const uint8_t* f = (const uint8_t*)frame;
  memset(info, 0, sizeof *info);
  if (len < NB_FRAME_HEADER_BYTES)
    return NB__BAD("truncated: %zu bytes, the header alone needs %d", len, NB_FRAME_HEADER_BYTES);
  uint32_t magic = nb__get32(f + NB__H_MAGIC);
  if (magic != NB_FRAME_MAGIC)
    return NB__BAD("wrong magic 0x%08x (expected 0x%08x, \"NBCF\")", magic, NB_FRAME_MAGIC);
  info->version = nb__get16(f + NB__H_VERSION);
  if (info->version != NB_FRAME_VERSION)
    return NB__BAD("unsupported format version %u (this build reads version %d)", info->version,
                   NB_FRAME_VERSION);
  uint16_t hs = nb__get16(f + NB__H_HDRSIZE);
  if (hs != NB_FRAME_HEADER_BYTES)
    return NB__BAD("header size field is %u (version 1 headers are %d bytes)", hs,
                   NB_FRAME_HEADER_BYTES);
  info->flags = nb__get32(f + NB__H_FLAGS);
  if (info->flags & ~(NB_FRAME_FLAG_SPARSE | NB_FRAME_FLAG_ZSTD))
    return NB__BAD("unknown flag bits 0x%x",
                   info->flags & ~(NB_FRAME_FLAG_SPARSE | NB_FRAME_FLAG_ZSTD));
  info->values = (nb_values_t)f[NB__H_VALUES];
  if (nb__values_bits(info->values) == 0) return NB__BAD("unknown value type %u", f[NB__H_VALUES]);
  info->index_coding = (nb_index_coding_t)f[NB__H_INDEX];
  info->zstd_level = (int8_t)f[NB__H_LEVEL];
  if (f[NB__H_RESERVED] != 0)
    return NB__BAD("reserved byte 15 is 0x%02x (must be 0)", f[NB__H_RESERVED]);
  int zstd = (info->flags & NB_FRAME_FLAG_ZSTD) != 0, sparse = (info->flags & NB_FRAME_FLAG_SPARSE);
  if (zstd ? (info->zstd_level < 1 || info->zstd_level > 22) : info->zstd_level != 0)
    return NB__BAD("zstd level %d invalid for a %s payload", info->zstd_level,
                   zstd ? "zstd" : "stored");
  info->n = nb__get64(f + NB__H_N);
  info->k = nb__get64(f + NB__H_K);
  info->round = nb__get64(f + NB__H_ROUND);
  info->sender = nb__get32(f + NB__H_SENDER);
  info->block_size = nb__get32(f + NB__H_BLOCK);
  info->scale_bytes = nb__get64(f + NB__H_SCALE_BYTES);
  info->value_bytes = nb__get64(f + NB__H_VALUE_BYTES);
  info->index_bytes = nb__get64(f + NB__H_INDEX_BYTES);
  info->payload_bytes = nb__get64(f + NB__H_PAYLOAD_BYTES);
  info->checksum = nb__get64(f + NB__H_CHECKSUM);
  uint64_t n = info->n, k = info->k, max_n = lim.max_n < UINT32_MAX ? lim.max_n : UINT32_MAX;
  if (n > max_n)
    return NB__BAD("n = %llu exceeds the limit %llu (NB_CODEC_MAX_N)", (unsigned long long)n,
                   (unsigned long long)max_n);
  if (k > n) return NB__BAD("k (%llu) > n (%llu)", (unsigned long long)k, (unsigned long long)n);
  if (sparse) {
    if (info->index_coding != NB_INDEX_DELTA_VARINT && info->index_coding != NB_INDEX_BITMAP &&
        info->index_coding != NB_INDEX_CHUNKED && info->index_coding != NB_INDEX_CHUNKED_RICE)
      return NB__BAD("index coding %u is not valid for a sparse frame", f[NB__H_INDEX]);
  } else {
    if (info->index_coding != NB_INDEX_NONE)
      return NB__BAD("index coding %u set on a dense frame (must be 0)", f[NB__H_INDEX]);
    if (k != n)
      return NB__BAD("dense frame with k (%llu) != n (%llu)", (unsigned long long)k,
                     (unsigned long long)n);
  }
  if (nb__values_blocked(info->values)) {
    if (info->block_size < 1 || info->block_size > NB_FRAME_MAX_BLOCK)
      return NB__BAD("%s scale block size %u outside [1, %u]", nb_values_name(info->values),
                     info->block_size, NB_FRAME_MAX_BLOCK);
  } else if (info->block_size != 0) {
    return NB__BAD("block size %u set for %s values (must be 0)", info->block_size,
                   nb_values_name(info->values));
  }
  uint64_t want_scales = 4 * nb__scale_blocks(info->values, k, info->block_size);
  if (info->scale_bytes != want_scales)
    return NB__BAD("scale section is %llu bytes, expected %llu",
                   (unsigned long long)info->scale_bytes, (unsigned long long)want_scales);
  uint64_t want_values = nb__value_bytes(info->values, k);
  if (info->value_bytes != want_values)
    return NB__BAD("value section is %llu bytes, expected %llu (k = %llu %s values)",
                   (unsigned long long)info->value_bytes, (unsigned long long)want_values,
                   (unsigned long long)k, nb_values_name(info->values));
  uint64_t ib = info->index_bytes;
  if (!sparse) {
    if (ib != 0)
      return NB__BAD("index section of %llu bytes in a dense frame", (unsigned long long)ib);
  } else if (info->index_coding == NB_INDEX_BITMAP) {
    if (ib != n / 8 + (n % 8 != 0))
      return NB__BAD("bitmap index section is %llu bytes, expected %llu for n = %llu",
                     (unsigned long long)ib, (unsigned long long)(n / 8 + (n % 8 != 0)),
                     (unsigned long long)n);
  } else if (info->index_coding == NB_INDEX_CHUNKED) {
    /* the exact size depends on the chunk size inside the section; here only its range */
    if (ib < NB__CHUNKED_HEAD || ib > NB__CHUNKED_HEAD + 2 * k)
      return NB__BAD("chunked index section is %llu bytes, outside [8, 8 + 2k] = [8, %llu]",
                     (unsigned long long)ib, (unsigned long long)(NB__CHUNKED_HEAD + 2 * k));
  } else if (info->index_coding == NB_INDEX_CHUNKED_RICE) {
    /* the exact size follows from the bit stream; an encoder writes this coding only when it is
     * smaller than the plain chunked section (<= 8 + 2k), so 12 + 2k bounds every valid one */
    if (ib < NB__RICE_HEAD || ib > NB__RICE_HEAD + 2 * k)
      return NB__BAD("chunked Rice index section is %llu bytes, outside [12, 12 + 2k] = [12, %llu]",
                     (unsigned long long)ib, (unsigned long long)(NB__RICE_HEAD + 2 * k));
  } else if (ib < k || ib > 5 * k) {
    return NB__BAD("varint index section is %llu bytes, outside [k, 5k] = [%llu, %llu]",
                   (unsigned long long)ib, (unsigned long long)k, (unsigned long long)(5 * k));
  }
  uint64_t raw = info->scale_bytes + info->value_bytes + ib;
  if (raw > lim.max_raw_bytes)
    return NB__BAD("sections total %llu bytes, above the limit %llu", (unsigned long long)raw,
                   (unsigned long long)lim.max_raw_bytes);
  uint64_t pb = info->payload_bytes;
  if (!zstd && pb != raw)
    return NB__BAD("stored payload is %llu bytes but its sections total %llu",
                   (unsigned long long)pb, (unsigned long long)raw);
  if (pb > lim.max_frame_bytes - NB_FRAME_HEADER_BYTES)
    return NB__BAD("payload of %llu bytes exceeds the frame limit %llu (NB_CODEC_MAX_FRAME_BYTES)",
                   (unsigned long long)pb, (unsigned long long)lim.max_frame_bytes);
  if (zstd && pb > ZSTD_compressBound((size_t)raw))
    return NB__BAD("zstd payload of %llu bytes is larger than any compression of %llu bytes",
                   (unsigned long long)pb, (unsigned long long)raw);
  uint64_t have = len - NB_FRAME_HEADER_BYTES;
  if (have < pb)
    return NB__BAD("truncated: the header declares a %llu-byte payload, %llu bytes present",
                   (unsigned long long)pb, (unsigned long long)have);
  if (have > pb)
    return NB__BAD("%llu trailing bytes after the %llu-byte payload",
                   (unsigned long long)(have - pb), (unsigned long long)pb);
  info->frame_bytes = NB_FRAME_HEADER_BYTES + pb;
  uint64_t sum = nb__frame_checksum(f, (size_t)pb);
  if (sum != info->checksum)
    return nb_error(NB_ERR_INTEGRITY,
                    "bad frame: checksum mismatch (header 0x%016llx, computed 0x%016llx)",
                    (unsigned long long)info->checksum, (unsigned long long)sum);
  return NB_OK;
}
