/* Internals shared by the codec's files: the codec object, scratch growth, header byte layout.
 * Not a public header. */
#ifndef NB_COMPRESS_CODEC_INTERNAL_H
#define NB_COMPRESS_CODEC_INTERNAL_H

#include <string.h>
#include <zstd.h>

#include "compress/compress.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the codec writes little-endian frames with memcpy; add byte swaps for this target"
#endif

#define NB__CODEC_MAX_THREADS 64

struct nb_codec {
  nb_codec_config_t cfg;
  ZSTD_CCtx* cctx;
  ZSTD_DCtx* dctx;
  /* encoder scratch */
  uint64_t* sample;
  size_t sample_cap;
  uint64_t* cand[NB__CODEC_MAX_THREADS];
  float* cval[NB__CODEC_MAX_THREADS];
  size_t cand_cap[NB__CODEC_MAX_THREADS];
  uint32_t* cidx[NB__CODEC_MAX_THREADS]; /* chunked top-k: candidate indices of a chunk */
  size_t cidx_cap[NB__CODEC_MAX_THREADS];
  uint32_t* ghist[NB__CODEC_MAX_THREADS]; /* chunked top-k: histogram of the offset gaps */
  size_t ghist_cap[NB__CODEC_MAX_THREADS];
  uint8_t* rbuf[NB__CODEC_MAX_THREADS]; /* chunked Rice: the bits of part t >= 1 */
  size_t rbuf_cap[NB__CODEC_MAX_THREADS];
  /* chunked Rice: part t (the chunks of selection thread t) starts at bit rice_start[t] of the
   * stream; rice_start[rice_parts] is the stream's length */
  uint64_t rice_start[NB__CODEC_MAX_THREADS + 1];
  int rice_parts;
  uint32_t* hist;
  size_t hist_cap;
  uint64_t* work;
  size_t work_cap;
  uint32_t* idx;
  size_t idx_cap;
  float* vals;
  size_t vals_cap;
  uint8_t* raw;
  size_t raw_cap;
  /* decoder scratch */
  uint32_t* didx;
  size_t didx_cap;
  uint8_t* draw;
  size_t draw_cap;
  float* dscales;
  size_t dscales_cap;
  uint8_t* chunk; /* NB__CHUNK bytes for streamed dense payloads */
};

#define NB__CHUNK (1u << 17)
/* A chunked index section starts with u32 chunk_size, u32 k_per_chunk. */
#define NB__CHUNKED_HEAD 8u
/* A chunked Rice section starts with u32 chunk_size, u32 k_per_chunk, u8 r, 3 zero bytes. */
#define NB__RICE_HEAD 12u

/* Grows *p to hold at least `want` elements of `size` bytes (no copy of old contents). */
nb_status_t nb__codec_grow(void** p, size_t* cap, size_t want, size_t size, const char* what);

/* Header offsets (docs/wire-format.md). */
enum {
  NB__H_MAGIC = 0,
  NB__H_VERSION = 4,
  NB__H_HDRSIZE = 6,
  NB__H_FLAGS = 8,
  NB__H_VALUES = 12,
  NB__H_INDEX = 13,
  NB__H_LEVEL = 14,
  NB__H_RESERVED = 15,
  NB__H_N = 16,
  NB__H_K = 24,
  NB__H_ROUND = 32,
  NB__H_SENDER = 40,
  NB__H_BLOCK = 44,
  NB__H_SCALE_BYTES = 48,
  NB__H_VALUE_BYTES = 56,
  NB__H_INDEX_BYTES = 64,
  NB__H_PAYLOAD_BYTES = 72,
  NB__H_CHECKSUM = 80,
};

static inline void nb__put16(uint8_t* p, uint16_t v) {
  memcpy(p, &v, 2);
}
static inline void nb__put32(uint8_t* p, uint32_t v) {
  memcpy(p, &v, 4);
}
static inline void nb__put64(uint8_t* p, uint64_t v) {
  memcpy(p, &v, 8);
}
static inline uint16_t nb__get16(const uint8_t* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline uint32_t nb__get32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t nb__get64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* Bits per value on the wire (32, 16, 8, 4 or 2); 0 for an unknown type. */
unsigned nb__values_bits(nb_values_t v);
/* Bytes of the value section for k values: ceil(k * bits / 8) (sub-byte types are packed). */
uint64_t nb__value_bytes(nb_values_t v, uint64_t k);
/* 1 for the types with one fp32 scale per block (int8, 4-bit, 2-bit). */
int nb__values_blocked(nb_values_t v);
/* The largest |code| of a blocked type (127, 7, 1.5); 0 for the others. */
float nb__values_max_code(nb_values_t v);
/* Number of scale blocks for k values (0 for types without scales). */
uint64_t nb__scale_blocks(nb_values_t v, uint64_t k, uint32_t block);
/* Chunked top-k (index coding 3): values sent by chunk c of n (ceil(n / chunk) chunks, all of
 * `chunk` coordinates except possibly the last, of len <= chunk): kc for a whole chunk,
 * floor(kc * len / chunk) for a shorter last one. Returns the total (<= n). */
uint64_t nb__chunked_k(uint64_t n, uint32_t chunk, uint32_t kc);
/* Bytes of a chunked index section for k values with chunks of 2^bits coordinates. */
static inline uint64_t nb__chunked_index_bytes(uint64_t k, unsigned bits) {
  return NB__CHUNKED_HEAD + (k * bits + 7) / 8;
}
/* Checksum of a frame: XXH3-64 of the payload seeded with XXH3-64 of header bytes [0, 80). */
uint64_t nb__frame_checksum(const uint8_t* frame, size_t payload_bytes);
/* Writes the header (checksum included) in front of a payload already at frame + 88. */
void nb__write_header(uint8_t* frame, const nb_frame_info_t* h);

#endif
