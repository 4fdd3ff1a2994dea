/* Encoding: the fused multithreaded error-feedback + candidate pass, exact top-k among the
 * candidates, quantization, residual correction, index coding, zstd and framing. Dense frames
 * too. Decoding is in decode.c. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <zstd_errors.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "common/common.h"
#include "compress/codec_internal.h"
#include "kernels/error_feedback.h"
#include "kernels/quantize.h"
#include "kernels/topk.h"

/* Sample: 4096 cache lines of 16 consecutive values, enough for a threshold within a few % at
 * density 0.01 while touching few pages. Below kNoSample values everything is a candidate. */
#define NB__SAMPLE_RUNS 4096
#define NB__SAMPLE_RUN 16
#define NB__NO_SAMPLE (1u << 17)

typedef struct {
  float* res;
  const float* upd;
  size_t b, e;
  uint32_t t;
  int accumulate; /* 1: res += upd first; 0: only collect from res (or upd when res is NULL) */
  uint64_t* buf;  /* packed key/index of each candidate */
  float* vbuf;    /* its value (residual after the update), so nothing is gathered later */
  size_t cap, cnt;
} nb__pass_t;

/* Candidates of src[j0, j1) with key >= t (scalar tail and the slow path of a hit). */
static inline size_t nb__collect(const float* src, size_t j0, size_t j1, uint32_t t, uint64_t* buf,
                                 float* vbuf, size_t cap, size_t cnt) {
  if (cap - (cnt < cap ? cnt : cap) >= j1 - j0) { /* room for all: branch-free compaction */
    for (size_t j = j0; j < j1; j++) {
      uint32_t key = nb_topk_key(src[j]);
      buf[cnt] = nb_topk_pack(key, (uint32_t)j);
      vbuf[cnt] = src[j];
      cnt += key >= t;
    }
    return cnt;
  }
  for (size_t j = j0; j < j1; j++) {
    uint32_t key = nb_topk_key(src[j]);
    if (key >= t) {
      if (cnt < cap) {
        buf[cnt] = nb_topk_pack(key, (uint32_t)j);
        vbuf[cnt] = src[j];
      }
      cnt++;
    }
  }
  return cnt;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NB__HAVE_AVX2_PATH 1
/* The same step on 16 values with AVX2, chosen at run time (the baseline build is SSE2). */
__attribute__((target("avx2"))) static size_t nb__pass_avx2(float* res, const float* upd,
                                                            const float* src, int acc, size_t* pj,
                                                            size_t e, uint32_t t, uint64_t* buf,
                                                            float* vbuf, size_t cap, size_t cnt) {
  const __m256i tm1 = _mm256_set1_epi32((int32_t)t - 1), abs = _mm256_set1_epi32(0x7fffffff);
  size_t j = *pj;
  for (; j + 16 <= e; j += 16) {
    __m256 a, b;
    if (acc) {
      a = _mm256_add_ps(_mm256_loadu_ps(res + j), _mm256_loadu_ps(upd + j));
      b = _mm256_add_ps(_mm256_loadu_ps(res + j + 8), _mm256_loadu_ps(upd + j + 8));
      _mm256_storeu_ps(res + j, a);
      _mm256_storeu_ps(res + j + 8, b);
    } else {
      a = _mm256_loadu_ps(src + j);
      b = _mm256_loadu_ps(src + j + 8);
    }
    __m256i ka = _mm256_and_si256(_mm256_castps_si256(a), abs);
    __m256i kb = _mm256_and_si256(_mm256_castps_si256(b), abs);
    __m256i hit = _mm256_or_si256(_mm256_cmpgt_epi32(ka, tm1), _mm256_cmpgt_epi32(kb, tm1));
    if (!_mm256_testz_si256(hit, hit)) cnt = nb__collect(src, j, j + 16, t, buf, vbuf, cap, cnt);
  }
  *pj = j;
  return cnt;
}
#endif

static void* nb__pass_run(void* arg) {
  nb__pass_t* p = (nb__pass_t*)arg;
  const uint32_t t = p->t;
  const size_t cap = p->cap;
  uint64_t* buf = p->buf;
  float* vbuf = p->vbuf;
  size_t cnt = 0, j = p->b;
  float* res = p->res;
  const float* upd = p->upd;
  const float* src = res ? res : upd;
  const int acc = p->accumulate && res;
#ifdef NB__HAVE_AVX2_PATH
  if (__builtin_cpu_supports("avx2"))
    cnt = nb__pass_avx2(res, upd, src, acc, &j, p->e, t, buf, vbuf, cap, cnt);
#endif
#ifdef __SSE2__
  /* 8 values per step: (add,) mask the sign, compare with t - 1 as signed int32 (keys are
   * < 2^31), and take the scalar path only when one of the 8 is a candidate (~10% of steps at
   * density 0.01). Memory-bound on two cores. */
  const __m128i tm1 = _mm_set1_epi32((int32_t)t - 1), abs = _mm_set1_epi32(0x7fffffff);
  for (; j + 8 <= p->e; j += 8) {
    __m128 a, b;
    if (acc) {
      a = _mm_add_ps(_mm_loadu_ps(res + j), _mm_loadu_ps(upd + j));
      b = _mm_add_ps(_mm_loadu_ps(res + j + 4), _mm_loadu_ps(upd + j + 4));
      _mm_storeu_ps(res + j, a);
      _mm_storeu_ps(res + j + 4, b);
    } else {
      a = _mm_loadu_ps(src + j);
      b = _mm_loadu_ps(src + j + 4);
    }
    __m128i ka = _mm_and_si128(_mm_castps_si128(a), abs);
    __m128i kb = _mm_and_si128(_mm_castps_si128(b), abs);
    __m128i hit = _mm_or_si128(_mm_cmpgt_epi32(ka, tm1), _mm_cmpgt_epi32(kb, tm1));
    if (_mm_movemask_epi8(hit)) cnt = nb__collect(src, j, j + 8, t, buf, vbuf, cap, cnt);
  }
#endif
  if (acc)
    for (size_t i = j; i < p->e; i++) res[i] += upd[i];
  cnt = nb__collect(src, j, p->e, t, buf, vbuf, cap, cnt);
  p->cnt = cnt;
  return NULL;
}

static uint64_t nb__splitmix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static nb_status_t nb__grow_candidates(nb_codec_t* c, int i, size_t want) {
  if (want <= c->cand_cap[i] && c->cand[i]) return NB_OK;
  size_t cap = c->cand_cap[i], vcap = cap;
  NB_CHECK(nb__codec_grow((void**)&c->cand[i], &cap, want, 8, "codec candidates"));
  NB_CHECK(nb__codec_grow((void**)&c->cval[i], &vcap, want, 4, "codec candidate values"));
  c->cand_cap[i] = cap < vcap ? cap : vcap;
  return NB_OK;
}

/* Runs the pass over [0, n) on `threads` threads; thread 0 is the caller. */
/* Runs fn on args[0..threads) (each `stride` bytes), on threads 1.. and the caller. */
static void nb__parallel(void* (*fn)(void*), void* args, size_t stride, int threads) {
  pthread_t tid[NB__CODEC_MAX_THREADS];
  int started = 0;
  for (int t = 1; t < threads; t++) {
    if (pthread_create(&tid[t], NULL, fn, (char*)args + (size_t)t * stride) != 0) break;
    started = t;
  }
  /* parts whose thread could not start run here: the work is complete either way */
  for (int t = started + 1; t < threads; t++) fn((char*)args + (size_t)t * stride);
  fn(args);
  for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
}

static nb_status_t nb__pass(nb__pass_t* ps, int threads) {
  nb__parallel(nb__pass_run, ps, sizeof *ps, threads);
  return NB_OK;
}

/* Bytes of d as an LEB128 varint (1 to 5), as nb__put_varints writes it. */
static inline size_t nb__varint_len(uint32_t d) {
  return 1 + (d >= (1u << 7)) + (d >= (1u << 14)) + (d >= (1u << 21)) + (d >= (1u << 28));
}

/* Writes the varint index section; returns its size. */
static size_t nb__put_varints(uint8_t* o, const uint32_t* idx, size_t k) {
  uint8_t* p = o;
  uint32_t prev = 0;
  for (size_t j = 0; j < k; j++) {
    uint32_t d = idx[j] - prev;
    prev = idx[j];
    while (d >= 0x80) {
      *p++ = (uint8_t)(d | 0x80);
      d >>= 7;
    }
    *p++ = (uint8_t)d;
  }
  return (size_t)(p - o);
}

/* Quantizes vals[0..k) into the value (and scale) section and replaces vals by what the receiver
 * will decode. */
static nb_status_t nb__quantize(const nb_codec_config_t* c, float* vals, size_t k, uint8_t* scales,
                                uint8_t* values) {
  switch (c->values) {
    case NB_VALUES_FP32:
      memcpy(values, vals, k * 4);
      break;
    case NB_VALUES_FP16:
      for (size_t j = 0; j < k; j++) {
        uint16_t h = nb_f32_to_f16(vals[j]);
        memcpy(values + 2 * j, &h, 2);
        vals[j] = nb_f16_to_f32(h);
      }
      break;
    case NB_VALUES_BF16:
      for (size_t j = 0; j < k; j++) {
        uint16_t h = nb_f32_to_bf16(vals[j]);
        memcpy(values + 2 * j, &h, 2);
        vals[j] = nb_bf16_to_f32(h);
      }
      break;
    case NB_VALUES_INT8:
      /* scales sits at offset 0 of an aligned buffer, so it is float-aligned */
      NB_CHECK(nb_quantize_int8_block(vals, k, c->block_size, (int8_t*)values, (float*)scales));
      nb_dequantize_int8_block((const int8_t*)values, (const float*)scales, k, c->block_size, vals);
      break;
    case NB_VALUES_INT4:
      NB_CHECK(nb_quantize_int4_block(vals, k, c->block_size, values, (float*)scales));
      nb_dequantize_int4_block(values, (const float*)scales, k, c->block_size, vals);
      break;
    case NB_VALUES_INT2:
      NB_CHECK(nb_quantize_int2_block(vals, k, c->block_size, values, (float*)scales));
      nb_dequantize_int2_block(values, (const float*)scales, k, c->block_size, vals);
      break;
  }
  return NB_OK;
}

/* ---- chunked top-k: every chunk selects its own exact top-kc, independently of the others ---- */

typedef struct {
  nb_codec_t* c;
  float* res;
  const float* upd;
  size_t n, c0, c1; /* chunks [c0, c1) */
  uint32_t chunk, kc, t;
  size_t bad;      /* output position of the first non-finite kept value, or SIZE_MAX */
  uint32_t* ghist; /* gaps of the winners' offsets within their chunk: counts of 0 .. gmax */
  uint32_t gmax;
  size_t unsorted; /* output position of the first winner not above its predecessor, or SIZE_MAX */
} nb__cjob_t;

/* Pass of one chunk: (res += upd,) then the indices and values of src[b, e) with key >= t into
 * ibuf/vbuf (each with room for e - b + 8), in index order; returns the count. */
static size_t nb__chunk_pass_scalar(float* res, const float* upd, const float* src, int acc,
                                    size_t b, size_t e, uint32_t t, uint32_t* ibuf, float* vbuf) {
  size_t cnt = 0;
  for (size_t j = b; j < e; j++) {
    float v = acc ? (res[j] += upd[j]) : src[j];
    ibuf[cnt] = (uint32_t)j;
    vbuf[cnt] = v;
    cnt += nb_topk_key(v) >= t;
  }
  return cnt;
}

#ifdef NB__HAVE_AVX2_PATH
/* For each 8-bit mask, the positions of its set bits (then zeros): the permutation that packs
 * the selected lanes to the front. */
static uint64_t nb__compact_lut[256];
static pthread_once_t nb__compact_once = PTHREAD_ONCE_INIT;
static void nb__compact_init(void) {
  for (unsigned m = 0; m < 256; m++) {
    uint64_t v = 0;
    unsigned o = 0;
    for (unsigned l = 0; l < 8; l++)
      if (m >> l & 1) v |= (uint64_t)l << (8 * o++);
    nb__compact_lut[m] = v;
  }
}

/* The same with AVX2: 8 values per step, the hits packed to the front by a permutation and
 * stored unconditionally (so the buffers need 8 slots of slack), no per-value branch. */
__attribute__((target("avx2"))) static size_t nb__chunk_pass_avx2(float* res, const float* upd,
                                                                  const float* src, int acc,
                                                                  size_t b, size_t e, uint32_t t,
                                                                  uint32_t* ibuf, float* vbuf) {
  const __m256i tm1 = _mm256_set1_epi32((int32_t)t - 1), absm = _mm256_set1_epi32(0x7fffffff);
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i iv = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                _mm256_set1_epi32((int32_t)(uint32_t)b));
  size_t cnt = 0, j = b;
  for (; j + 8 <= e; j += 8, iv = _mm256_add_epi32(iv, eight)) {
    __m256 a;
    if (acc) {
      a = _mm256_add_ps(_mm256_loadu_ps(res + j), _mm256_loadu_ps(upd + j));
      _mm256_storeu_ps(res + j, a);
    } else {
      a = _mm256_loadu_ps(src + j);
    }
    __m256i hit = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(a), absm), tm1);
    unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(hit));
    /* unconditional: a hit in a group is a coin flip at these densities, a branch on it would
     * mispredict often; a group without hits stores lanes that the next group overwrites */
    __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)&nb__compact_lut[mask]));
    _mm256_storeu_ps(vbuf + cnt, _mm256_permutevar8x32_ps(a, perm));
    _mm256_storeu_si256((__m256i*)(ibuf + cnt), _mm256_permutevar8x32_epi32(iv, perm));
    cnt += (size_t)__builtin_popcount(mask);
  }
  return cnt + nb__chunk_pass_scalar(res, upd, src, acc, j, e, t, ibuf + cnt, vbuf + cnt);
}
#endif

static size_t nb__chunk_pass(float* res, const float* upd, int acc, size_t b, size_t e, uint32_t t,
                             uint32_t* ibuf, float* vbuf) {
  const float* src = res ? res : upd;
  acc = acc && res;
#ifdef NB__HAVE_AVX2_PATH
  if (__builtin_cpu_supports("avx2"))
    return nb__chunk_pass_avx2(res, upd, src, acc, b, e, t, ibuf, vbuf);
#endif
  return nb__chunk_pass_scalar(res, upd, src, acc, b, e, t, ibuf, vbuf);
}

/* The kk-th largest (1 <= kk < m) of the packed candidates w[0..m), exact: a 256-bucket
 * histogram of their keys between min and max finds the bucket that holds it, and only that
 * bucket's candidates (a handful) are quickselected. tmp: room for m. */
static uint64_t nb__select_small(const uint64_t* w, size_t m, size_t kk, uint64_t* tmp) {
  uint32_t lo = UINT32_MAX, hi = 0;
  for (size_t j = 0; j < m; j++) {
    uint32_t key = (uint32_t)(w[j] >> 32);
    lo = key < lo ? key : lo;
    hi = key > hi ? key : hi;
  }
  unsigned shift = 0;
  while (((hi - lo) >> shift) > 255) shift++;
  uint32_t hist[256];
  memset(hist, 0, sizeof hist);
  for (size_t j = 0; j < m; j++) hist[((uint32_t)(w[j] >> 32) - lo) >> shift]++;
  size_t above = 0;
  uint32_t bk = (hi - lo) >> shift;
  for (; bk > 0 && above + hist[bk] < kk; bk--) above += hist[bk];
  size_t cb = 0;
  for (size_t j = 0; j < m; j++)
    if ((((uint32_t)(w[j] >> 32) - lo) >> shift) == bk) tmp[cb++] = w[j];
  return nb_topk_kth_largest(tmp, cb, kk - above);
}

/* Chunk [b, b + len): accumulate, then the exact top-kk by (|x|, lower index) into idx/vals in
 * index order. One fused pass collects the values at or above a key threshold *t carried over
 * from the previous chunk; the exact kk-th is selected among those few candidates. A
 * threshold that keeps fewer than kk (the vector's scale dropped) is retried at 0 (every value
 * of the chunk: the histogram select handles that too). The threshold only changes the speed: the
 * winners are exact whatever it is, so the bytes stay deterministic. Scratch (cand/cval of this
 * thread): 2 len + 16 entries each, cidx len + 8. */
static size_t nb__chunk_select(const nb__cjob_t* jb, size_t b, size_t len, size_t kk, uint32_t* t,
                               uint32_t* idx, float* vals) {
  nb_codec_t* c = jb->c;
  if (kk == 0) { /* nothing to send from this chunk: accumulate only */
    if (jb->res && jb->upd)
      for (size_t j = b; j < b + len; j++) jb->res[j] += jb->upd[j];
    return SIZE_MAX;
  }
  uint64_t* w = c->cand[jb->t];    /* [0, len + 8): packed candidates in index order */
  uint64_t* sel = w + len + 8;     /* [len + 8, 2 len + 16): scratch of the selection */
  uint32_t* ibuf = c->cidx[jb->t]; /* len + 8: the pass's indices, before packing */
  float* wv = c->cval[jb->t];
  size_t m = nb__chunk_pass(jb->res, jb->upd, 1, b, b + len, *t, ibuf, wv);
  if (m < kk) /* too few (the scale dropped): every value of the chunk, at most 2 passes */
    m = nb__chunk_pass(jb->res, jb->upd, 0, b, b + len, 0, ibuf, wv);
  for (size_t j = 0; j < m; j++) w[j] = nb_topk_pack(nb_topk_key(wv[j]), ibuf[j]);
  size_t o = 0, bad = SIZE_MAX;
  uint64_t kth = 0;
  if (m > kk) kth = nb__select_small(w, m, kk, sel);
  for (size_t j = 0; j < m; j++)
    if (w[j] >= kth) {
      if (bad == SIZE_MAX && (w[j] >> 32) >= 0x7f800000u) bad = o;
      idx[o] = nb_topk_unpack_index(w[j]);
      vals[o++] = wv[j];
    }
  /* next chunk: a threshold 0.85 times this one's kk-th magnitude, so that a chunk of the same
   * scale keeps about 1.5 kk candidates (heavy-tailed values) and very rarely fewer than kk */
  uint32_t kkey = (uint32_t)(kth >> 32);
  if (kkey >= 0x7f800000u) {
    *t = 0x7f000000u;
  } else {
    float f;
    memcpy(&f, &kkey, 4);
    *t = nb_topk_key(0.85f * f);
  }
  return bad;
}

static void* nb__chunked_run(void* arg) {
  nb__cjob_t* jb = (nb__cjob_t*)arg;
  nb_codec_t* c = jb->c;
  uint32_t t = 0;
  jb->bad = jb->unsorted = SIZE_MAX;
  jb->gmax = 0;
  memset(jb->ghist, 0, (jb->chunk < jb->n ? jb->chunk : jb->n) * sizeof *jb->ghist);
  for (size_t ch = jb->c0; ch < jb->c1; ch++) {
    size_t b = ch * jb->chunk, len = jb->n - b < jb->chunk ? jb->n - b : jb->chunk;
    size_t kk = len == jb->chunk ? jb->kc : (size_t)((uint64_t)jb->kc * len / jb->chunk);
    size_t o = ch * jb->kc; /* every chunk before this one is whole */
    size_t bad = nb__chunk_select(jb, b, len, kk, &t, c->idx + o, c->vals + o);
    if (bad != SIZE_MAX && jb->bad == SIZE_MAX) jb->bad = o + bad;
    /* the gaps the Rice section will code (first: the offset; then offset - previous - 1),
     * while the winners are in cache; the section must list them in the order of the values */
    const uint32_t* ix = c->idx + o;
    uint32_t next = 0, gmax = jb->gmax;
    for (size_t j = 0; j < kk; j++) {
      uint32_t off = ix[j] - (uint32_t)b;
      if (off < next || off >= len) {
        if (jb->unsorted == SIZE_MAX) jb->unsorted = o + j;
        break;
      }
      uint32_t g = off - next;
      jb->ghist[g]++;
      gmax = g > gmax ? g : gmax;
      next = off + 1;
    }
    jb->gmax = gmax;
  }
  return NULL;
}

typedef struct {
  nb_codec_t* c;
  float* residual;
  size_t k, group, sb, g0, g1; /* values [g0, min(g1, k)) */
  nb_status_t st;
  char msg[160];
} nb__qjob_t;

/* Quantizes a run of groups into the sections and takes what is sent out of the residual. */
static void* nb__quant_run(void* arg) {
  nb__qjob_t* q = (nb__qjob_t*)arg;
  nb_codec_t* c = q->c;
  unsigned bits = nb__values_bits(c->cfg.values);
  size_t end = q->g1 < q->k ? q->g1 : q->k;
  q->st = NB_OK;
  for (size_t g0 = q->g0; g0 < end; g0 += q->group) {
    size_t g1 = end - g0 < q->group ? end : g0 + q->group;
    size_t sc = nb__values_blocked(c->cfg.values) ? g0 / c->cfg.block_size : 0;
    q->st = nb__quantize(&c->cfg, c->vals + g0, g1 - g0, c->raw + 4 * sc,
                         c->raw + q->sb + g0 * bits / 8);
    if (q->st != NB_OK) {
      snprintf(q->msg, sizeof q->msg, "%s", nb_error_last());
      return NULL;
    }
    if (q->residual) {
      for (size_t j = g0; j < g1; j++) {
        if (j + 32 < end) __builtin_prefetch(&q->residual[c->idx[j + 32]], 1);
        q->residual[c->idx[j]] -= c->vals[j];
      }
    }
  }
  return NULL;
}

/* zstd (or store) codec->raw[0..raw) behind the header and write the header. */
static nb_status_t nb__finish(nb_codec_t* c, nb_frame_info_t* h, size_t raw, uint8_t* out,
                              size_t cap, size_t* len) {
  if (cap < NB_FRAME_HEADER_BYTES)
    return nb_error(NB_ERR_INVALID, "codec: output buffer of %zu bytes; a frame needs at least %d",
                    cap, NB_FRAME_HEADER_BYTES);
  size_t room = cap - NB_FRAME_HEADER_BYTES, pb = 0;
  int compressed = 0;
  if (c->cfg.zstd_level > 0 && raw > 0) {
    ZSTD_CCtx_reset(c->cctx, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, c->cfg.zstd_level);
    ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1);
    size_t z = ZSTD_compress2(c->cctx, out + NB_FRAME_HEADER_BYTES, room, c->raw, raw);
    if (ZSTD_isError(z) && ZSTD_getErrorCode(z) != ZSTD_error_dstSize_tooSmall)
      return nb_error(NB_ERR_CODEC, "codec: zstd compression failed: %s", ZSTD_getErrorName(z));
    if (!ZSTD_isError(z) && z < raw) {
      compressed = 1;
      pb = z;
    }
  }
  if (!compressed) {
    if (raw > room)
      return nb_error(NB_ERR_INVALID, "codec: output buffer of %zu bytes is too small; %zu needed",
                      cap, NB_FRAME_HEADER_BYTES + raw);
    memcpy(out + NB_FRAME_HEADER_BYTES, c->raw, raw);
    pb = raw;
  }
  h->flags |= compressed ? NB_FRAME_FLAG_ZSTD : 0;
  h->zstd_level = compressed ? c->cfg.zstd_level : 0;
  h->payload_bytes = pb;
  nb__write_header(out, h);
  *len = NB_FRAME_HEADER_BYTES + pb;
  return NB_OK;
}

/* ---- chunked Rice index section (NB_INDEX_CHUNKED_RICE) ---- */

/* Values sent by chunk `ch` (the counting rule of nb__chunked_k). */
static inline size_t nb__chunk_count(size_t n, uint32_t chunk, uint32_t kc, size_t ch) {
  size_t len = n - ch * chunk < chunk ? n - ch * chunk : chunk;
  return len == chunk ? kc : (size_t)((uint64_t)kc * len / chunk);
}

/* The Rice parameter of a chunked section of k gaps whose counts are hist[0..gmax] (the sum of
 * the selection threads' histograms; left holding suffix counts): the r in
 * [0, log2(C) - 1] with the fewest bits, the smaller on a tie, counted exactly:
 * bits(r) = k (1 + r) + sum over gaps of (g >> r), and sum (g >> r) = sum over m >= 1 of
 * #{g >= m 2^r}, so every r costs gmax / 2^r steps. *bytes: the section's size. */
static unsigned nb__rice_choose(uint32_t* hist, uint32_t gmax, size_t k, uint32_t chunk,
                                size_t* bytes) {
  const unsigned bits = (unsigned)__builtin_ctz(chunk);
  uint64_t above = 0;
  for (uint32_t g = gmax + 1; g-- > 0;) hist[g] = (uint32_t)(above += hist[g]);
  unsigned best = 0;
  uint64_t best_bits = UINT64_MAX;
  for (unsigned r = 0; r < bits; r++) {
    uint64_t b = (uint64_t)k * (1 + r);
    for (uint64_t x = (uint64_t)1 << r; x <= gmax; x += (uint64_t)1 << r) b += hist[x];
    if (b < best_bits) best_bits = b, best = r;
  }
  *bytes = NB__RICE_HEAD + (size_t)((best_bits + 7) / 8);
  return best;
}

/* Appends the low `nb` (<= 32) bits of v to the LSB-first stream at *q (*have < 8 bits pending
 * before and after). Stores 8 bytes unconditionally, so the buffer needs 8 bytes of slack. */
static inline void nb__bits_put(uint8_t** q, uint64_t* acc, unsigned* have, uint64_t v,
                                unsigned nb) {
  *acc |= v << *have;
  *have += nb;
  nb__put64(*q, *acc);
  *q += *have >> 3;
  *acc >>= *have & ~7u;
  *have &= 7;
}

/* Writes the codes of the winners of chunks [c0, c1) (ascending within each chunk, checked by
 * the selection) with parameter r, after `lead` zero bits, at dst; returns the bytes written
 * (ceil((lead + bits) / 8)). Stores up to 8 bytes past them. */
static size_t nb__put_rice_part(uint8_t* dst, const uint32_t* idx, size_t n, uint32_t chunk,
                                uint32_t kc, unsigned r, size_t c0, size_t c1, unsigned lead) {
  uint8_t* q = dst;
  uint64_t acc = 0;
  unsigned have = lead;
  const uint32_t mask = chunk - 1, rmask = (1u << r) - 1;
  for (size_t ch = c0, j = c0 * kc; ch < c1; ch++) { /* every chunk before c0 is whole */
    uint32_t next = 0;
    for (size_t e = j + nb__chunk_count(n, chunk, kc, ch); j < e; j++) {
      uint32_t off = idx[j] & mask, g = off - next, qn = g >> r;
      next = off + 1;
      uint64_t low = (uint64_t)(g & rmask) << 1; /* the zero-bit, then the low r bits */
      if (qn + 1 + r <= 32) {
        nb__bits_put(&q, &acc, &have, ((1ull << qn) - 1) | low << qn, qn + 1 + r);
        continue;
      }
      for (; qn > 0;) {
        unsigned m = qn < 32 ? qn : 32;
        nb__bits_put(&q, &acc, &have, (1ull << m) - 1, m);
        qn -= m;
      }
      nb__bits_put(&q, &acc, &have, low, r + 1);
    }
  }
  if (have) *q++ = (uint8_t)acc;
  return (size_t)(q - dst);
}

typedef struct {
  const uint32_t* idx;
  size_t n, c0, c1, bytes;
  uint32_t chunk, kc;
  unsigned r, lead;
  uint8_t* dst;
} nb__rjob_t;

static void* nb__rice_run(void* arg) {
  nb__rjob_t* w = (nb__rjob_t*)arg;
  w->bytes = nb__put_rice_part(w->dst, w->idx, w->n, w->chunk, w->kc, w->r, w->c0, w->c1, w->lead);
  return NULL;
}

/* Writes the chunked Rice section of c->idx with parameter r: the head, then the stream in
 * c->rice_parts parts on as many threads (part t: the chunks selection thread t had, from bit
 * c->rice_start[t]). Part 0 goes in place, the others into their own buffers (so no two threads
 * store into the same bytes) that are then copied behind it, the byte they share ORed. Needs 8
 * bytes of slack after the section; returns its size. */
static nb_status_t nb__put_rice(nb_codec_t* c, uint8_t* o, size_t n, uint32_t chunk, uint32_t kc,
                                unsigned r, size_t* bytes) {
  nb__put32(o, chunk);
  nb__put32(o + 4, kc);
  o[8] = (uint8_t)r, o[9] = o[10] = o[11] = 0;
  uint8_t* s = o + NB__RICE_HEAD;
  int parts = c->rice_parts;
  size_t nch = n / chunk + (n % chunk != 0);
  nb__rjob_t w[NB__CODEC_MAX_THREADS];
  for (int t = 0; t < parts; t++) {
    uint64_t b0 = c->rice_start[t], b1 = c->rice_start[t + 1];
    if (t > 0)
      NB_CHECK(nb__codec_grow((void**)&c->rbuf[t], &c->rbuf_cap[t],
                              (size_t)((b1 - b0 + 7) / 8) + 16, 1, "codec Rice part"));
    w[t] = (nb__rjob_t){.idx = c->idx,
                        .n = n,
                        .c0 = nch * (size_t)t / (size_t)parts,
                        .c1 = nch * (size_t)(t + 1) / (size_t)parts,
                        .chunk = chunk,
                        .kc = kc,
                        .r = r,
                        .lead = (unsigned)(b0 % 8),
                        .dst = t ? c->rbuf[t] : s};
  }
  nb__parallel(nb__rice_run, w, sizeof w[0], parts);
  for (int t = 1; t < parts; t++) { /* in order: part t - 1's last byte is complete first */
    size_t at = (size_t)(c->rice_start[t] / 8);
    if (w[t].bytes == 0) continue;
    if (c->rice_start[t] % 8)
      s[at] |= w[t].dst[0];
    else
      s[at] = w[t].dst[0];
    memcpy(s + at + 1, w[t].dst + 1, w[t].bytes - 1);
  }
  *bytes = NB__RICE_HEAD + (size_t)((c->rice_start[parts] + 7) / 8);
  return NB_OK;
}

/* Step 4 of a sparse encode, shared by global and chunked top-k: sections
 * [scales][values][indices] from codec->idx/vals[0..k), residual correction, zstd, frame.
 * chunk != 0: chunked top-k with kc per chunk, coded NB_INDEX_CHUNKED_RICE with parameter
 * rice (>= 0) or NB_INDEX_CHUNKED (rice < 0) in `chunked` bytes when that fits the bound (see
 * nb_codec_config_t). */
static nb_status_t nb__emit_sparse(nb_codec_t* c, float* residual, size_t n, size_t k,
                                   size_t varint, uint32_t chunk, uint32_t kc, int rice,
                                   size_t chunked, uint64_t round, uint32_t sender, uint8_t* out,
                                   size_t cap, size_t* len, int threads, int64_t t_start,
                                   int64_t t_pass, int64_t t_select, size_t m, int scans) {
  /* 4. sections [scales][values][indices]; values are gathered, quantized and taken out of the
   * residual a group at a time so each residual line is touched once */
  size_t nbl = (size_t)nb__scale_blocks(c->cfg.values, k, c->cfg.block_size);
  size_t sb = 4 * nbl, vb = (size_t)nb__value_bytes(c->cfg.values, k);
  size_t bitmap = n / 8 + (n % 8 != 0);
  unsigned cbits = chunk ? (unsigned)__builtin_ctz(chunk) : 0;
  if (!chunk) chunked = SIZE_MAX;
  int use_chunked = k > 0 && chunked <= 5 * k && chunked <= bitmap;
  int use_bitmap = !use_chunked && bitmap < varint;
  size_t ib = use_chunked ? chunked : use_bitmap ? bitmap : varint;
  /* + 8: the Rice writer stores 8 bytes at a time up to the section's last byte */
  NB_CHECK(nb__codec_grow((void**)&c->raw, &c->raw_cap, sb + vb + ib + 8, 1, "codec sections"));
  /* groups are whole scale blocks and whole bytes of packed values (a multiple of 4 values);
   * threads take contiguous runs of groups */
  size_t unit = !nb__values_blocked(c->cfg.values)   ? 1
                : nb__values_bits(c->cfg.values) < 8 ? 4 * (size_t)c->cfg.block_size
                                                     : c->cfg.block_size;
  size_t group = unit * ((1023 + unit) / unit);
  size_t ngroups = (k + group - 1) / group;
  int qthreads = k >= 65536 ? threads : 1;
  nb__qjob_t qj[NB__CODEC_MAX_THREADS];
  for (int i = 0; i < qthreads; i++)
    qj[i] = (nb__qjob_t){.c = c,
                         .residual = residual,
                         .k = k,
                         .group = group,
                         .sb = sb,
                         .g0 = ngroups * (size_t)i / (size_t)qthreads * group,
                         .g1 = ngroups * (size_t)(i + 1) / (size_t)qthreads * group};
  nb__parallel(nb__quant_run, qj, sizeof qj[0], qthreads);
  for (int i = 0; i < qthreads; i++)
    if (qj[i].st != NB_OK) return nb_error(qj[i].st, "codec: quantization failed: %s", qj[i].msg);
  uint8_t* ip = c->raw + sb + vb;
  if (use_chunked && rice >= 0) {
    size_t wrote = 0;
    NB_CHECK(nb__put_rice(c, ip, n, chunk, kc, (unsigned)rice, &wrote));
    if (wrote != ib)
      return nb_error(NB_ERR_INTERNAL, "codec: Rice section of %zu bytes, %zu planned", wrote, ib);
  } else if (use_chunked) {
    nb__put32(ip, chunk);
    nb__put32(ip + 4, kc);
    uint8_t* q = ip + NB__CHUNKED_HEAD;
    uint64_t acc = 0;
    unsigned have = 0;
    const uint32_t mask = chunk - 1;
    for (size_t j = 0; j < k; j++) {
      acc |= (uint64_t)(c->idx[j] & mask) << have;
      have += cbits;
      while (have >= 8) {
        *q++ = (uint8_t)acc;
        acc >>= 8;
        have -= 8;
      }
    }
    if (have) *q++ = (uint8_t)acc;
  } else if (use_bitmap) {
    memset(ip, 0, bitmap);
    for (size_t j = 0; j < k; j++) ip[c->idx[j] >> 3] |= (uint8_t)(1u << (c->idx[j] & 7));
  } else {
    nb__put_varints(ip, c->idx, k);
  }

  int64_t t_quant = nb_now_ns();
  nb_frame_info_t h = {.flags = NB_FRAME_FLAG_SPARSE,
                       .values = c->cfg.values,
                       .index_coding = use_chunked && rice >= 0 ? NB_INDEX_CHUNKED_RICE
                                       : use_chunked            ? NB_INDEX_CHUNKED
                                       : use_bitmap             ? NB_INDEX_BITMAP
                                                                : NB_INDEX_DELTA_VARINT,
                       .n = n,
                       .k = k,
                       .round = round,
                       .sender = sender,
                       .block_size = nb__values_blocked(c->cfg.values) ? c->cfg.block_size : 0,
                       .scale_bytes = sb,
                       .value_bytes = vb,
                       .index_bytes = ib};
  nb_status_t st = nb__finish(c, &h, sb + vb + ib, out, cap, len);
  NB_TRACE(CODEC,
           "encode n=%zu k=%zu chunk=%u: %zu candidates over %d scan(s); sample+pass %.2f ms, "
           "select %.2f "
           "ms, quantize+index %.2f ms, zstd+frame %.2f ms, %zu bytes",
           n, k, chunk, m, scans, (t_pass - t_start) / 1e6, (t_select - t_pass) / 1e6,
           (t_quant - t_select) / 1e6, (nb_now_ns() - t_quant) / 1e6, *len);
  return st;
}

/* Chunked top-k (cfg.topk_chunk): kc = floor(k * C / n) per whole chunk; the chunks are split
 * evenly over the threads, each writes its chunks' winners at their fixed output positions. */
static nb_status_t nb__encode_chunked(nb_codec_t* c, const float* update, float* residual, size_t n,
                                      size_t k, int threads, uint64_t round, uint32_t sender,
                                      uint8_t* out, size_t cap, size_t* len) {
  int64_t t_start = nb_now_ns();
  uint32_t chunk = c->cfg.topk_chunk;
  uint32_t kc = n ? (uint32_t)((uint64_t)k * chunk / n) : 0;
  if (kc > chunk) kc = chunk;
  size_t kt = (size_t)nb__chunked_k(n, chunk, kc), nch = n / chunk + (n % chunk != 0);
  NB_CHECK(nb__codec_grow((void**)&c->idx, &c->idx_cap, kt ? kt : 1, 4, "codec indices"));
  NB_CHECK(nb__codec_grow((void**)&c->vals, &c->vals_cap, kt ? kt : 1, 4, "codec values"));
  if ((size_t)threads > nch) threads = nch ? (int)nch : 1;
  nb__cjob_t jb[NB__CODEC_MAX_THREADS];
  for (int i = 0; i < threads; i++) {
    size_t clen = chunk < n ? chunk : (n ? n : 1);
    NB_CHECK(nb__grow_candidates(c, i, 2 * clen + 16));
    NB_CHECK(
        nb__codec_grow((void**)&c->cidx[i], &c->cidx_cap[i], clen + 8, 4, "codec chunk indices"));
    NB_CHECK(nb__codec_grow((void**)&c->ghist[i], &c->ghist_cap[i], clen, 4, "codec gap counts"));
    jb[i] = (nb__cjob_t){.c = c,
                         .res = residual,
                         .upd = update,
                         .n = n,
                         .c0 = nch * (size_t)i / (size_t)threads,
                         .c1 = nch * (size_t)(i + 1) / (size_t)threads,
                         .chunk = chunk,
                         .kc = kc,
                         .t = (uint32_t)i,
                         .ghist = c->ghist[i]};
  }
#ifdef NB__HAVE_AVX2_PATH
  pthread_once(&nb__compact_once, nb__compact_init);
#endif
  nb__parallel(nb__chunked_run, jb, sizeof jb[0], threads);
  int64_t t_pass = nb_now_ns();
  size_t bad = SIZE_MAX;
  for (int i = 0; i < threads && bad == SIZE_MAX; i++) bad = jb[i].bad;
  if (bad != SIZE_MAX)
    return nb_error(NB_ERR_INVALID, "codec: the %s holds a non-finite value at index %u",
                    residual ? "residual (after adding the update)" : "update", c->idx[bad]);
  for (int i = 0; i < threads; i++)
    if (jb[i].unsorted != SIZE_MAX)
      return nb_error(NB_ERR_INTERNAL,
                      "codec: chunked top-k winner %zu is not above the one before",
                      jb[i].unsorted);
  /* the smaller of the Rice and the plain chunked section (Rice practically always: about
   * log2(C / kc) + 1.5 bits per index instead of log2(C)); plain on a tie */
  size_t chunked = (size_t)nb__chunked_index_bytes(kt, (unsigned)__builtin_ctz(chunk)), rb = 0;
  int rice = -1;
  if (kt > 0) { /* the threads' gap counts summed into c->hist (theirs are needed below) */
    uint32_t gmax = 0;
    for (int i = 0; i < threads; i++) gmax = jb[i].gmax > gmax ? jb[i].gmax : gmax;
    NB_CHECK(nb__codec_grow((void**)&c->hist, &c->hist_cap, (size_t)gmax + 1, 4, "codec gaps"));
    memset(c->hist, 0, ((size_t)gmax + 1) * sizeof *c->hist);
    for (int i = 0; i < threads; i++)
      for (uint32_t g = 0; g <= jb[i].gmax; g++) c->hist[g] += jb[i].ghist[g];
    unsigned r = nb__rice_choose(c->hist, gmax, kt, chunk, &rb);
    if (rb < chunked) { /* where each thread's part of the stream starts */
      rice = (int)r, chunked = rb;
      uint64_t at = 0;
      for (int i = 0; i < threads; i++) {
        c->rice_start[i] = at;
        for (uint32_t g = 0; g <= jb[i].gmax; g++)
          at += (uint64_t)jb[i].ghist[g] * ((g >> r) + 1 + r);
      }
      c->rice_start[threads] = at;
      c->rice_parts = threads;
    }
  }
  /* the varint size matters only when the chunked section does not fit (see nb__emit_sparse) */
  size_t varint = 0, bitmap = n / 8 + (n % 8 != 0);
  int need_varint = !(kt > 0 && chunked <= 5 * kt && chunked <= bitmap);
  uint32_t prev = 0;
  for (size_t j = 0; need_varint && j < kt; j++) {
    uint32_t d = c->idx[j] - prev;
    prev = c->idx[j];
    varint += nb__varint_len(d);
  }
  return nb__emit_sparse(c, residual, n, kt, varint, chunk, kc, rice, chunked, round, sender, out,
                         cap, len, threads, t_start, t_pass, nb_now_ns(), kt, 1);
}

nb_status_t nb_codec_encode_sparse(nb_codec_t* codec, const float* update, float* residual,
                                   size_t n, double density, uint64_t round, uint32_t sender,
                                   void* out, size_t cap, size_t* len) {
  if (!(density >= 0.0 && density <= 1.0))
    return nb_error(NB_ERR_INVALID, "codec: density %g outside [0, 1]", density);
  return nb_codec_encode_sparse_k(codec, update, residual, n, nb_codec_k_for_density(n, density),
                                  round, sender, out, cap, len);
}

/* Step 1 of the top-k path: a threshold key from a sample of residual + update (computed the
 * same way as the pass). *s is the sample's size; without a sample (*s = 0) the threshold is 0
 * and every value is a candidate. */
static nb_status_t nb__sample_threshold(nb_codec_t* c, const float* update, const float* residual,
                                        size_t n, size_t k, double fraction, uint32_t* t,
                                        size_t* s) {
  *t = 0;
  *s = 0;
  if (!(n >= NB__NO_SAMPLE && k > 0 && k < n)) return NB_OK;
  size_t runs = n / (64 * NB__SAMPLE_RUN); /* about n/64 samples, at most 4096 runs */
  if (runs > NB__SAMPLE_RUNS) runs = NB__SAMPLE_RUNS;
  *s = runs * NB__SAMPLE_RUN;
  NB_CHECK(nb__codec_grow((void**)&c->sample, &c->sample_cap, *s, 8, "codec sample"));
  uint64_t seed = 0x6e6562756c61ull ^ n;
  size_t lines = n / NB__SAMPLE_RUN, j = 0;
  for (size_t r = 0; r < runs; r++) {
    size_t b = (size_t)(nb__splitmix(&seed) % lines) * NB__SAMPLE_RUN;
    for (size_t q = 0; q < NB__SAMPLE_RUN; q++, j++) {
      float v = residual ? residual[b + q] + update[b + q] : update[b + q];
      c->sample[j] = nb_topk_pack(nb_topk_key(v), (uint32_t)j);
    }
  }
  *t = nb_topk_sample_threshold(c->sample, *s, fraction);
  return NB_OK;
}

/* Step 2: the fused pass (residual += update, collect candidates with key >= t), scanned again
 * (without accumulating) until the threads hold at least k candidates and no buffer overflowed.
 * *scans counts the passes. */
static nb_status_t nb__pass_until_k(nb_codec_t* c, nb__pass_t* ps, int threads, const float* update,
                                    float* residual, size_t n, size_t k, uint32_t t,
                                    double fraction, size_t s, int* scans) {
  size_t chunk = threads > 1 ? ((n / (size_t)threads + 1023) & ~(size_t)1023) : n;
  for (int i = 0; i < threads; i++) {
    size_t b = (size_t)i * chunk, e = i == threads - 1 ? n : b + chunk;
    if (b > n) b = n;
    if (e > n) e = n;
    size_t want = t == 0 ? e - b : 2 * k / (size_t)threads + 4096;
    if (want > e - b) want = e - b;
    NB_CHECK(nb__grow_candidates(c, i, want ? want : 1));
    ps[i] = (nb__pass_t){.res = residual,
                         .upd = update,
                         .b = b,
                         .e = e,
                         .t = t,
                         .accumulate = 1,
                         .buf = c->cand[i],
                         .vbuf = c->cval[i],
                         .cap = c->cand_cap[i]};
  }
  NB_CHECK(nb__pass(ps, threads));
  for (;;) {
    size_t total = 0;
    int overflow = 0;
    for (int i = 0; i < threads; i++) {
      total += ps[i].cnt;
      overflow |= ps[i].cnt > ps[i].cap;
    }
    if (total >= k && !overflow) break;
    if (total < k) { /* the sample put the threshold too high: lower it, scan again */
      uint32_t t_old = t;
      do { /* a lower threshold than the one that failed, or everything */
        fraction *= 4.0;
        t = fraction >= 1.0 || s == 0 ? 0 : nb_topk_sample_threshold(c->sample, s, fraction);
      } while (t >= t_old && t != 0);
      NB_INFO(CODEC, "top-k: %zu candidates for k = %zu; rescanning at threshold key 0x%08x", total,
              k, t);
    }
    for (int i = 0; i < threads; i++) {
      /* a buffer that overflowed grows to the exact count it saw; the next scan then fits */
      if (total >= k && ps[i].cnt > ps[i].cap) NB_CHECK(nb__grow_candidates(c, i, ps[i].cnt));
      ps[i].buf = c->cand[i];
      ps[i].vbuf = c->cval[i];
      ps[i].cap = c->cand_cap[i];
      ps[i].t = t;
      ps[i].accumulate = 0;
    }
    NB_CHECK(nb__pass(ps, threads));
    (*scans)++;
  }
  return NB_OK;
}

/* Step 3: the k-th largest packed key among the m candidates (0 when all are kept). A histogram
 * of the top 16 key bits finds the bucket that holds the k-th; only that bucket's few candidates
 * are quickselected. */
static nb_status_t nb__select_kth(nb_codec_t* c, const nb__pass_t* ps, int threads, size_t k,
                                  size_t m, uint64_t* kth) {
  *kth = 0;
  if (k > 0 && k < m && m < (1u << 18)) { /* few candidates: quickselect them all */
    NB_CHECK(nb__codec_grow((void**)&c->work, &c->work_cap, m, 8, "codec selection"));
    size_t w = 0;
    for (int i = 0; i < threads; i++) {
      memcpy(c->work + w, ps[i].buf, ps[i].cnt * 8);
      w += ps[i].cnt;
    }
    *kth = nb_topk_kth_largest(c->work, m, k);
  } else if (k > 0 && k < m) {
    NB_CHECK(nb__codec_grow((void**)&c->hist, &c->hist_cap, 65536, 4, "codec histogram"));
    uint32_t* hist = c->hist;
    memset(hist, 0, 65536 * sizeof *hist);
    for (int i = 0; i < threads; i++)
      for (size_t j = 0; j < ps[i].cnt; j++) hist[ps[i].buf[j] >> 47]++;
    size_t above = 0;
    int bucket = 65535;
    for (; bucket > 0; bucket--) {
      if (above + hist[bucket] >= k) break;
      above += hist[bucket];
    }
    size_t nbk = hist[bucket], w = 0;
    NB_CHECK(nb__codec_grow((void**)&c->work, &c->work_cap, nbk, 8, "codec selection"));
    for (int i = 0; i < threads; i++)
      for (size_t j = 0; j < ps[i].cnt; j++)
        if ((int)(ps[i].buf[j] >> 47) == bucket) c->work[w++] = ps[i].buf[j];
    *kth = nb_topk_kth_largest(c->work, nbk, k - above);
  }
  return NB_OK;
}

/* The winners (keys >= kth) into c->idx / c->vals in index order; the same loop sizes the
 * varint index section and spots the first non-finite value (NaN and infinity rank first, so
 * any would be kept). */
static nb_status_t nb__keep_winners(nb_codec_t* c, const nb__pass_t* ps, int threads, size_t k,
                                    uint64_t kth, const float* residual, size_t* varint) {
  size_t o = 0, bad = SIZE_MAX;
  uint32_t prev = 0;
  *varint = 0;
  if (k > 0) {
    for (int i = 0; i < threads; i++) {
      const uint64_t* cb = ps[i].buf;
      const float* cv = ps[i].vbuf;
      for (size_t j = 0; j < ps[i].cnt; j++)
        if (cb[j] >= kth) {
          uint32_t ix = nb_topk_unpack_index(cb[j]), d = ix - prev;
          prev = ix;
          *varint += nb__varint_len(d);
          if (bad == SIZE_MAX && (cb[j] >> 32) >= 0x7f800000u) bad = o;
          c->idx[o] = ix;
          c->vals[o++] = cv[j];
        }
    }
  }
  if (o != k) return nb_error(NB_ERR_INTERNAL, "codec: top-k kept %zu of %zu", o, k);
  if (bad != SIZE_MAX)
    return nb_error(NB_ERR_INVALID, "codec: the %s holds a non-finite value at index %u",
                    residual ? "residual (after adding the update)" : "update", c->idx[bad]);
  return NB_OK;
}

nb_status_t nb_codec_encode_sparse_k(nb_codec_t* c, const float* update, float* residual, size_t n,
                                     size_t k, uint64_t round, uint32_t sender, void* out_,
                                     size_t cap, size_t* len) {
  uint8_t* out = (uint8_t*)out_;
  if (!c || (!update && n) || !out || !len)
    return nb_error(NB_ERR_INVALID, "codec: encode_sparse with a NULL argument");
  if (n > UINT32_MAX) return nb_error(NB_ERR_INVALID, "codec: n (%zu) > 2^32-1", n);
  if (k > n) k = n;
  *len = 0;
  /* the stored (uncompressed) frame always fits in this; checked before the residual changes */
  size_t need = NB_FRAME_HEADER_BYTES +
                4 * (size_t)nb__scale_blocks(c->cfg.values, k, c->cfg.block_size) +
                (size_t)nb__value_bytes(c->cfg.values, k) +
                (k ? (5 * k < n / 8 + (n % 8 != 0) ? 5 * k : n / 8 + (n % 8 != 0)) : 0);
  if (cap < need)
    return nb_error(NB_ERR_INVALID,
                    "codec: output buffer of %zu bytes is too small; %zu needed (k = %zu of n = "
                    "%zu, see nb_codec_frame_bound)",
                    cap, need, k, n);
  int threads = c->cfg.threads;
  if (n < (1u << 20)) threads = 1; /* thread start-up would dominate */
  if (c->cfg.topk_chunk)
    return nb__encode_chunked(c, update, residual, n, k, threads, round, sender, out, cap, len);

  int64_t t_start = nb_now_ns(), t_pass, t_select;
  int scans = 1;
  uint32_t t;
  double fraction = n ? 1.05 * (double)k / (double)n : 1.0;
  size_t s;
  NB_CHECK(nb__sample_threshold(c, update, residual, n, k, fraction, &t, &s));
  nb__pass_t ps[NB__CODEC_MAX_THREADS];
  NB_CHECK(nb__pass_until_k(c, ps, threads, update, residual, n, k, t, fraction, s, &scans));
  t_pass = nb_now_ns();

  size_t m = 0;
  for (int i = 0; i < threads; i++) m += ps[i].cnt;
  NB_CHECK(nb__codec_grow((void**)&c->idx, &c->idx_cap, k ? k : 1, 4, "codec indices"));
  NB_CHECK(nb__codec_grow((void**)&c->vals, &c->vals_cap, k ? k : 1, 4, "codec values"));
  uint64_t kth;
  NB_CHECK(nb__select_kth(c, ps, threads, k, m, &kth));
  size_t varint;
  NB_CHECK(nb__keep_winners(c, ps, threads, k, kth, residual, &varint));
  t_select = nb_now_ns();

  return nb__emit_sparse(c, residual, n, k, varint, 0, 0, -1, 0, round, sender, out, cap, len,
                         threads, t_start, t_pass, t_select, m, scans);
}

nb_status_t nb_codec_encode_dense(nb_codec_t* c, const float* x, size_t n, uint64_t round,
                                  uint32_t sender, void* out, size_t cap, size_t* len) {
  if (!c || (!x && n) || !out || !len)
    return nb_error(NB_ERR_INVALID, "codec: encode_dense with a NULL argument");
  if (n > UINT32_MAX) return nb_error(NB_ERR_INVALID, "codec: n (%zu) > 2^32-1", n);
  *len = 0;
  size_t nbl = (size_t)nb__scale_blocks(c->cfg.values, n, c->cfg.block_size);
  size_t sb = 4 * nbl, vb = (size_t)nb__value_bytes(c->cfg.values, n);
  NB_CHECK(nb__codec_grow((void**)&c->raw, &c->raw_cap, sb + vb + 8, 1, "codec sections"));
  uint8_t *scales = c->raw, *values = c->raw + sb;
  if (!nb__values_blocked(c->cfg.values)) /* block quantization reports non-finite blocks */
    for (size_t i = 0; i < n; i++)
      if (!isfinite(x[i]))
        return nb_error(NB_ERR_INVALID, "codec: dense input holds a non-finite value at index %zu",
                        i);
  switch (c->cfg.values) {
    case NB_VALUES_FP32:
      memcpy(values, x, n * 4);
      break;
    case NB_VALUES_FP16:
      nb_quantize_fp16(x, n, (uint16_t*)values);
      break;
    case NB_VALUES_BF16:
      nb_quantize_bf16(x, n, (uint16_t*)values);
      break;
    case NB_VALUES_INT8:
      NB_CHECK(nb_quantize_int8_block(x, n, c->cfg.block_size, (int8_t*)values, (float*)scales));
      break;
    case NB_VALUES_INT4:
      NB_CHECK(nb_quantize_int4_block(x, n, c->cfg.block_size, values, (float*)scales));
      break;
    case NB_VALUES_INT2:
      NB_CHECK(nb_quantize_int2_block(x, n, c->cfg.block_size, values, (float*)scales));
      break;
  }
  nb_frame_info_t h = {.flags = 0,
                       .values = c->cfg.values,
                       .index_coding = NB_INDEX_NONE,
                       .n = n,
                       .k = n,
                       .round = round,
                       .sender = sender,
                       .block_size = nb__values_blocked(c->cfg.values) ? c->cfg.block_size : 0,
                       .scale_bytes = sb,
                       .value_bytes = vb};
  return nb__finish(c, &h, sb + vb, out, cap, len);
}
