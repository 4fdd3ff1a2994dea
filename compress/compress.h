/* compress: the update codec. It turns an fp32 update (plus its error-feedback residual) into one
 * self-describing, checksummed frame for the WAN, and back: sparse frames (exact top-k of the
 * residual, or of each chunk of it; quantized values; delta+varint, bitmap, chunked or chunked
 * Golomb-Rice indices; zstd) and dense frames (fp32, fp16, bf16, and int8, 4bit, 2bit with one
 * scale per block). Decoding is strict and accumulates into the caller's buffer. The byte layout is
 * in docs/wire-format.md. Not here: sealing/encryption (security/) and transport (inter/); this
 * module never sees a socket or a key. */
/* Typical use, once per round (errors elided):
 *   nb_codec_t* codec;  nb_codec_create(NULL, &codec);          // once; holds warm scratch
 *   size_t cap = nb_codec_frame_bound(n, nb_codec_k_for_density(n, d), NB_VALUES_INT8, 256);
 *   nb_codec_encode_sparse(codec, delta, residual, n, d, round, my_id, buf, cap, &len);
 *   ... send buf[0..len), receive peers' frames ...
 *   for each peer frame f: nb_codec_decode_accumulate(codec, f, flen, w_peer, sum, n, NULL);
 */
#ifndef NB_COMPRESS_COMPRESS_H
#define NB_COMPRESS_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The zstd level of frames: the default (level 1: the sections are already dense, and level 3
 * made a 64M-parameter frame 0.5% larger and zstd 5x slower; docs/env-codec.md) and the range
 * the codec accepts (0 = sections stored uncompressed). NB_ZSTD_LEVEL, the descriptor's
 * compression.zstdLevel and the round's config take their default and bounds from here. */
#define NB_CODEC_ZSTD_LEVEL_DEFAULT 1
#define NB_CODEC_ZSTD_LEVEL_MIN 0
#define NB_CODEC_ZSTD_LEVEL_MAX 19

/* Value types on the wire (the header's value_type byte). */
typedef enum {
  NB_VALUES_FP32 = 1,
  NB_VALUES_FP16 = 2,
  NB_VALUES_BF16 = 3,
  NB_VALUES_INT8 = 4, /* int8 with one fp32 absmax scale per block of values */
  NB_VALUES_INT4 = 5, /* "4bit": codes -7..7 times one fp32 scale per block, two per byte */
  NB_VALUES_INT2 = 6, /* "2bit": levels {-1.5, -0.5, 0.5, 1.5} times one fp32 scale per block,
                         four per byte */
} nb_values_t;

/* Index coding of a sparse frame (the header's index_coding byte). */
typedef enum {
  NB_INDEX_NONE = 0,         /* dense frame: no index section */
  NB_INDEX_DELTA_VARINT = 1, /* first index, then gaps (>= 1), LEB128 varints */
  NB_INDEX_BITMAP = 2,       /* ceil(n/8) bytes, bit i = byte i/8, bit i%8 (LSB first) */
  NB_INDEX_CHUNKED = 3,      /* chunked top-k: u32 chunk size C, u32 k per chunk, then every
                                index's offset within its chunk in log2(C) bits, LSB first */
  NB_INDEX_CHUNKED_RICE = 4, /* chunked top-k, Golomb-Rice: u32 C, u32 k per chunk, u8 Rice
                                parameter r < log2(C), 3 zero bytes, then chunk by chunk the
                                gaps of its ascending offsets (the first offset, then offset -
                                previous - 1), each as (gap >> r) one-bits, a zero-bit and the
                                low r bits, one LSB-first bit stream with zero padding */
} nb_index_coding_t;

#define NB_FRAME_MAGIC 0x4643424eu /* bytes 'N' 'B' 'C' 'F' */
#define NB_FRAME_VERSION 1
#define NB_FRAME_HEADER_BYTES 88
#define NB_FRAME_FLAG_SPARSE 0x1u /* the frame carries k of n values plus an index section */
#define NB_FRAME_FLAG_ZSTD 0x2u   /* the payload is one zstd frame (else the sections as-is) */
#define NB_FRAME_MAX_BLOCK 65536u /* largest scale block (int8, 4bit, 2bit) */
#define NB_FRAME_MIN_CHUNK 16u    /* smallest chunk of chunked top-k (a power of two) */
#define NB_FRAME_MAX_CHUNK 65536u /* largest chunk of chunked top-k (a power of two) */

/* "fp32", "fp16", "bf16", "int8", "4bit", "2bit"; "?" for anything else. */
const char* nb_values_name(nb_values_t v);
/* Parses a name of nb_values_name. NB_ERR_INVALID naming the text when unknown. */
nb_status_t nb_values_parse(const char* name, nb_values_t* out);

/* Encoder settings. Fill with nb_codec_config_default, then override. */
typedef struct {
  nb_values_t values;  /* value type of sparse and dense frames (default int8) */
  int zstd_level;      /* 1..19, 0 = no zstd; default NB_ZSTD_LEVEL (NB_CODEC_ZSTD_LEVEL_DEFAULT) */
  uint32_t block_size; /* values per fp32 scale of int8, 4bit and 2bit, 1..65536; default
                          NB_CODEC_INT8_BLOCK (256) */
  int threads;         /* threads of the encode pass, 1..64; default NB_CODEC_THREADS (2) */
  /* Sparse selection. 0 (the default, NB_CODEC_TOPK_CHUNK): the exact top-k of the whole
   * vector. C (a power of two in [NB_FRAME_MIN_CHUNK, NB_FRAME_MAX_CHUNK]): chunked top-k —
   * the vector is cut into chunks of C coordinates and each whole chunk sends its own exact
   * top-kc, kc = floor(k * C / n) (a shorter last chunk of L coordinates: floor(kc * L / C)),
   * so a frame carries at most k values and the work is the same in every chunk. Indices are
   * then coded as the smaller of NB_INDEX_CHUNKED_RICE (about log2(C / kc) + 1.5 bits each;
   * practically always) and NB_INDEX_CHUNKED (log2(C) bits each) unless that section would be
   * larger than min(5k, ceil(n / 8)) bytes, in which case the smaller of varint and bitmap is
   * written as for global top-k (so nb_codec_frame_bound holds either way). Dense frames
   * ignore it. */
  uint32_t topk_chunk;
} nb_codec_config_t;

/* Decoder limits: frames beyond them are rejected before any allocation. */
typedef struct {
  uint64_t max_n;           /* largest n (default NB_CODEC_MAX_N, 2^31; never above 2^32-1) */
  uint64_t max_frame_bytes; /* largest whole frame (default NB_CODEC_MAX_FRAME_BYTES, 4 GiB) */
  uint64_t max_raw_bytes;   /* largest decompressed payload (default 9 GiB: dense fp32 of max_n) */
} nb_codec_limits_t;

/* What a frame header says (nb_codec_frame_info). */
typedef struct {
  uint32_t version, flags;
  nb_values_t values;
  nb_index_coding_t index_coding;
  int zstd_level; /* as recorded by the sender; 0 when the payload is not compressed */
  uint64_t n, k, round;
  uint32_t sender, block_size;
  uint64_t scale_bytes, value_bytes, index_bytes; /* raw section sizes */
  uint64_t payload_bytes, frame_bytes;            /* payload on the wire; header + payload */
  uint64_t checksum;
} nb_frame_info_t;

typedef struct nb_codec nb_codec_t;

/* Defaults from the environment parameters (see docs/env-codec.md). Thread-safe. */
void nb_codec_config_default(nb_codec_config_t* cfg);
void nb_codec_limits_default(nb_codec_limits_t* limits);

/* Creates a codec: the settings plus warm scratch buffers and zstd contexts, so that encoding and
 * decoding every round do not allocate once the buffers have grown. cfg is copied (NULL =
 * defaults). NB_ERR_INVALID for settings out of range (message names the field: values,
 * zstd_level, block_size, threads, topk_chunk not 0 or a power of two in [16, 65536]),
 * NB_ERR_NOMEM.
 * A codec is not thread-safe: use one per thread. */
nb_status_t nb_codec_create(const nb_codec_config_t* cfg, nb_codec_t** out);
/* Releases the codec and its buffers. NULL is accepted. */
void nb_codec_destroy(nb_codec_t* codec);
/* The codec's settings after defaults were applied. */
const nb_codec_config_t* nb_codec_config(const nb_codec_t* codec);

/* k for a density: round(density * n), clamped to [1, n] for density > 0 and n > 0 (a small
 * model at a low density still sends its largest value each round; 0 would never send it). */
size_t nb_codec_k_for_density(size_t n, double density);
/* An upper bound of the frame size for n values of which k are sent (k = n for dense frames),
 * for every value type, with global or chunked top-k (a chunked frame carries at most k values
 * and its index section is never larger than the bound's). An output buffer of this size never
 * fails with "buffer too small". Encoders check up front (before touching the residual) that the
 * buffer holds the frame uncompressed: header, scales, values and min(5k, ceil(n/8)) index
 * bytes. */
size_t nb_codec_frame_bound(size_t n, size_t k, nb_values_t values, uint32_t block_size);

/* Sparse encode with error feedback, one round:
 *   residual += update; pick the exact top-k of |residual| (k = nb_codec_k_for_density; ties to
 *   the lower index), or with cfg.topk_chunk the exact top-kc of every chunk (see
 *   nb_codec_config_t; the frame then carries k' <= k values); quantize those values;
 *   residual -= the dequantized values (what the receiver will decode, bit for bit, so the
 *   residual keeps the quantization error too); code indices (delta+varint or bitmap, whichever
 *   is smaller, or chunked / chunked Rice); zstd; write one frame of *len bytes into
 *   out[0..cap).
 * Every value a frame decodes to is finite: scales are capped (nb_quant_scale_max), fp16/bf16
 * saturate, and a non-finite residual value is refused (below).
 * update: n values, borrowed, read only. residual: n values, borrowed, updated in place; NULL
 * encodes the update itself without error feedback. round and sender go into the header.
 * Deterministic: the same inputs and settings give the same bytes, whatever the thread count.
 * Returns NB_ERR_INVALID for bad arguments (NULL, n > 2^32-1, density outside [0,1], cap too
 * small — the message gives the size needed, see nb_codec_frame_bound) or when the residual
 * holds a non-finite value, NB_ERR_NOMEM, NB_ERR_CODEC when zstd fails. After an error that
 * follows argument checking the residual has absorbed the update but nothing was subtracted:
 * the update is kept for the next round, not lost. Not thread-safe per codec; it runs its own
 * worker threads (NB_CODEC_THREADS; one below 2^20 values). */
nb_status_t nb_codec_encode_sparse(nb_codec_t* codec, const float* update, float* residual,
                                   size_t n, double density, uint64_t round, uint32_t sender,
                                   void* out, size_t cap, size_t* len);
/* Same with an explicit k (clamped to n). */
nb_status_t nb_codec_encode_sparse_k(nb_codec_t* codec, const float* update, float* residual,
                                     size_t n, size_t k, uint64_t round, uint32_t sender, void* out,
                                     size_t cap, size_t* len);

/* Dense encode of x[0..n) with the codec's value type (fp32 is exact; int8, 4bit and 2bit per
 * block with a capped scale so every decoded value is finite; fp16 and bf16 saturate at their
 * largest finite value). x is borrowed. Statuses as encode_sparse (NB_ERR_INVALID, naming the
 * index or block, when x holds a non-finite value). */
nb_status_t nb_codec_encode_dense(nb_codec_t* codec, const float* x, size_t n, uint64_t round,
                                  uint32_t sender, void* out, size_t cap, size_t* len);

/* Parses and checks a frame's header against `limits` (NULL = defaults), that len matches the
 * declared sizes and that the checksum matches, without decoding the payload. frame is
 * borrowed. NB_ERR_CODEC with a message naming the defect, NB_ERR_INTEGRITY on checksum
 * mismatch. Thread-safe. */
nb_status_t nb_codec_frame_info(const void* frame, size_t len, const nb_codec_limits_t* limits,
                                nb_frame_info_t* info);

/* Strict decode-and-accumulate: out[i] += w * decoded[i] for every value of the frame (only the
 * k sent indices for a sparse frame). Everything is validated before out is touched, so on error
 * out is unchanged: header fields and sizes, checksum, the zstd payload's exact size, index
 * order (strictly increasing, < n), canonical varints, bitmap population, chunked sections
 * (chunk size, k per chunk against k, Rice parameter and unary runs, offsets within their chunk
 * and increasing, exact section size, zero padding),
 * scales in [0, nb_quant_scale_max(max code)] so that every decoded value is finite, finite
 * fp16/bf16/fp32 values, the invalid codes (int8 -128, 4bit -8) and zero padding bits of packed
 * values. No dense temporaries: sparse frames use O(k) scratch, dense frames are streamed.
 * codec: borrowed scratch (NULL = allocate for this call). frame: borrowed. out: n floats,
 * borrowed, must be the frame's n (so scratch stays within a small multiple of out's size
 * whatever the header claims). limits: NULL = defaults.
 * Returns NB_ERR_CODEC naming the defect, NB_ERR_INTEGRITY on checksum mismatch, NB_ERR_INVALID
 * for bad arguments (NULL, n differs from the frame's, non-finite w), NB_ERR_NOMEM.
 * Thread-safe when each thread uses its own codec (or NULL). */
nb_status_t nb_codec_decode_accumulate(nb_codec_t* codec, const void* frame, size_t len, float w,
                                       float* out, size_t n, const nb_codec_limits_t* limits);

#ifdef __cplusplus
}
#endif
#endif
