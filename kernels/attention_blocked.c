/* Blocked causal attention on the CPU, FlashAttention-2 style: per (batch, head) the heads' q, k
 * and v are packed once into padded tiles, query blocks meet key blocks with an online softmax,
 * and the backward recomputes the probabilities from the saved logsumexp. No BLAS: the tiles
 * are small and the caller runs (batch, head) ranges on its own threads. Not a CUDA kernel. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cpu_path.h"
#include "kernels/vec_exp.h"

/* Query rows and keys per block. Equal and aligned, so the only partly masked block of a query
 * block is its diagonal one and every block above it is skipped. */
#define NB__BR 64
#define NB__BC 64
/* Head dimension padded to a multiple of every path's vector width. */
#define NB__HPAD 16
/* Extra floats on each row of the transposed tiles: a row stride of tp floats is a power of two
 * for the usual contexts, and the hp rows a transposing write touches would share a few L1 sets. */
#define NB__TSKEW 16

typedef struct {
  void (*gemm)(float* c, int ldc, const float* a, int sar, int sak, const float* b, int ldb, int M,
               int K, int N, int acc);
  float (*row_max)(const float* s, int n);
  float (*exp_sum)(float* s, int n, float sub);
  void (*scale)(float* y, int n, float f);
  void (*softmax_bwd)(float* s, float* dp, int n, float lse, float D);
  void (*copy_scaled)(float* y, const float* x, int n, float f);
  void (*add_scaled)(float* y, const float* x, int n, float f);
  float (*dot)(const float* x, const float* y, int n);
} nb__att_ops_t;

#define NB__CAT2(a, b) a##_##b
#define NB__CAT(a, b) NB__CAT2(a, b)

/* ---- portable: scalar floats (the compiler may vectorise with the baseline ISA) */
#define NB__TGT
#define NB__FN(name) NB__CAT(nb__att_##name, portable)
typedef float nb__vf1_t;
#define vf nb__vf1_t
#define VW 1
#define V_LOAD(p) (*(p))
#define V_STORE(p, v) (*(p) = (v))
#define V_SET1(x) (x)
#define V_ZERO() 0.0f
#define V_ADD(a, b) ((a) + (b))
#define V_SUB(a, b) ((a) - (b))
#define V_MUL(a, b) ((a) * (b))
#define V_FMA(a, b, c) ((a) * (b) + (c))
#define V_MAX(a, b) ((a) > (b) ? (a) : (b))
#define V_HMAX(v) (v)
#define V_HSUM(v) (v)
#define V_EXP(x) expf(x)
#define NB__RB 2
#define NB__SV 4
#include "kernels/attention_tile.h"

#ifdef NB__VEC_X86
/* ---- AVX2 + FMA: 8 floats a vector */
__attribute__((target("avx2,fma"))) static inline float nb__hmax_avx2(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
__attribute__((target("avx2,fma"))) static inline float nb__hsum_avx2(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
#define NB__TGT __attribute__((target("avx2,fma")))
#define NB__FN(name) NB__CAT(nb__att_##name, avx2)
#define vf __m256
#define VW 8
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps((p), (v))
#define V_SET1(x) _mm256_set1_ps(x)
#define V_ZERO() _mm256_setzero_ps()
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_MAX(a, b) _mm256_max_ps((a), (b))
#define V_HMAX(v) nb__hmax_avx2(v)
#define V_HSUM(v) nb__hsum_avx2(v)
#define V_EXP(x) nb__exp_avx2(x)
#define NB__RB 2
#define NB__SV 4
#include "kernels/attention_tile.h"

/* ---- AVX-512F: 16 floats a vector */
#define NB__TGT __attribute__((target("avx512f")))
#define NB__FN(name) NB__CAT(nb__att_##name, avx512)
#define vf __m512
#define VW 16
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps((p), (v))
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_HMAX(v) _mm512_reduce_max_ps(v)
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_EXP(x) nb__exp_avx512(x)
#define NB__RB 4
#define NB__SV 4
#include "kernels/attention_tile.h"
#endif /* NB__VEC_X86 */

static const nb__att_ops_t* nb__att_ops(nb_cpu_path_t path) {
  switch (nb_cpu_path_resolve(path)) {
#ifdef NB__VEC_X86
    case NB_CPU_PATH_AVX512:
      return &nb__att_ops_avx512;
    case NB_CPU_PATH_AVX2:
      return &nb__att_ops_avx2;
#endif
    default:
      return &nb__att_ops_portable;
  }
}

static inline int nb__round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

/* dst (n rows of stride ld) = the first n columns of the T rows of src (stride ss), transposed.
 * Blocks of 16 rows, so each block's writes fill whole cache lines of dst. */
static void nb__att_transpose(float* dst, int ld, const float* src, size_t ss, int T, int n) {
  for (int t0 = 0; t0 < T; t0 += 16) {
    int t1 = t0 + 16 < T ? t0 + 16 : T;
    for (int d = 0; d < n; d++) {
      float* dr = dst + (size_t)d * ld;
      const float* sc = src + d;
      for (int t = t0; t < t1; t++) dr[t] = sc[(size_t)t * ss];
    }
  }
}

/* Scratch layout (floats), each piece starting on a 64-byte boundary; hp = padded head size,
 * tp = T padded to a key block. The forward uses the first four and s, m, l; the backward all. */
typedef struct {
  float* qs;  /* (tp, hp) q * scale */
  float* kt;  /* (hp, tp + NB__TSKEW) k transposed */
  float* v;   /* (tp, hp) v (forward) or dout (backward) */
  float* vt;  /* (hp, tp + NB__TSKEW) v transposed (backward) */
  float* k;   /* (tp, hp) k (backward) */
  float* dq;  /* (tp, hp) */
  float* dk;  /* (tp, hp) */
  float* dv;  /* (tp, hp) */
  float* o;   /* (BR, hp) output accumulator (forward) */
  float* s;   /* (BR, BC) scores, then probabilities */
  float* dp;  /* (BR, BC) dout V^T, then dS (backward) */
  float* row; /* (tp) forward: running max; backward: lse */
  float* aux; /* (tp) forward: running sum; backward: D */
} nb__att_ws_t;

static size_t nb__att_carve(float* base, int tp, int hp, nb__att_ws_t* w) {
  float* p = base ? (float*)(((uintptr_t)base + 63) & ~(uintptr_t)63) : NULL;
  size_t used = 16; /* alignment slack */
  size_t th = (size_t)tp * hp, tt = (size_t)(tp + NB__TSKEW) * hp;
  size_t sizes[13] = {th,
                      tt,
                      th,
                      tt,
                      th,
                      th,
                      th,
                      th,
                      (size_t)NB__BR * hp,
                      NB__BR * NB__BC,
                      NB__BR * NB__BC,
                      (size_t)tp,
                      (size_t)tp};
  float** dst[13] = {&w->qs, &w->kt, &w->v, &w->vt, &w->k,   &w->dq, &w->dk,
                     &w->dv, &w->o,  &w->s, &w->dp, &w->row, &w->aux};
  for (int i = 0; i < 13; i++) {
    size_t n = (sizes[i] + 15) / 16 * 16;
    if (p) {
      *dst[i] = p;
      p += n;
    }
    used += n;
  }
  return used;
}

size_t nb_attention_blocked_scratch(int T, int C, int NH) {
  nb__att_ws_t w;
  return nb__att_carve(NULL, nb__round_up(T, NB__BC), nb__round_up(C / NH, NB__HPAD), &w);
}

void nb_attention_blocked_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                                  int NH, int bh0, int bh1, float* scratch, nb_cpu_path_t path) {
  const nb__att_ops_t* ops = nb__att_ops(path);
  int hs = C / NH, hp = nb__round_up(hs, NB__HPAD), tp = nb__round_up(T, NB__BC), C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  nb__att_ws_t w;
  nb__att_carve(scratch, tp, hp, &w);
  int ldt = tp + NB__TSKEW;
  size_t th = (size_t)tp * hp, tt = (size_t)ldt * hp;
  int padded = tp != T || hp != hs;
  for (int bh = bh0; bh < bh1; bh++) {
    int b = bh / NH, h = bh % NH;
    const float* q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* o = out + (size_t)b * T * C + (size_t)h * hs;
    /* zero padding: rows past T and columns past hs contribute nothing to any product */
    if (padded) {
      memset(w.qs, 0, th * sizeof(float));
      memset(w.kt, 0, tt * sizeof(float));
      memset(w.v, 0, th * sizeof(float));
    }
    for (int t = 0; t < T; t++) {
      ops->copy_scaled(w.qs + (size_t)t * hp, q + (size_t)t * C3, hs, scale);
      memcpy(w.v + (size_t)t * hp, v + (size_t)t * C3, (size_t)hs * sizeof(float));
    }
    nb__att_transpose(w.kt, ldt, k, (size_t)C3, T, hs);
    for (int r0 = 0; r0 < T; r0 += NB__BR) {
      int nr = T - r0 < NB__BR ? T - r0 : NB__BR;
      float *m = w.row, *l = w.aux;
      memset(w.o, 0, (size_t)NB__BR * hp * sizeof(float));
      for (int r = 0; r < nr; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
      }
      for (int c0 = 0; c0 <= r0; c0 += NB__BC) {
        int diag = c0 == r0;
        ops->gemm(w.s, NB__BC, w.qs + (size_t)r0 * hp, hp, 1, w.kt + c0, ldt, nr, hp, NB__BC, 0);
        for (int r = 0; r < nr; r++) {
          float* sr = w.s + (size_t)r * NB__BC;
          if (diag)
            for (int c = r + 1; c < NB__BC; c++) sr[c] = -INFINITY;
          float mx = ops->row_max(sr, NB__BC);
          if (mx < m[r]) mx = m[r];
          float sum = ops->exp_sum(sr, NB__BC, mx);
          if (m[r] != -INFINITY) {
            float corr = expf(m[r] - mx);
            l[r] *= corr;
            if (corr != 1.0f) ops->scale(w.o + (size_t)r * hp, hp, corr);
          }
          l[r] += sum;
          m[r] = mx;
        }
        /* in the diagonal block keys past the last row are masked for every row */
        ops->gemm(w.o, hp, w.s, NB__BC, 1, w.v + (size_t)c0 * hp, hp, nr, diag ? nr : NB__BC, hp,
                  1);
      }
      for (int r = 0; r < nr; r++) {
        ops->copy_scaled(o + (size_t)(r0 + r) * C, w.o + (size_t)r * hp, hs, 1.0f / l[r]);
        lse[(size_t)bh * T + r0 + r] = m[r] + logf(l[r]);
      }
    }
  }
}

void nb_attention_blocked_backward(float* dqkv, const float* dout, const float* out,
                                   const float* lse, const float* qkv, int B, int T, int C, int NH,
                                   int bh0, int bh1, float* scratch, nb_cpu_path_t path,
                                   int accumulate) {
  const nb__att_ops_t* ops = nb__att_ops(path);
  int hs = C / NH, hp = nb__round_up(hs, NB__HPAD), tp = nb__round_up(T, NB__BC), C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  nb__att_ws_t w;
  nb__att_carve(scratch, tp, hp, &w);
  int ldt = tp + NB__TSKEW;
  size_t th = (size_t)tp * hp, tt = (size_t)ldt * hp;
  int padded = tp != T || hp != hs;
  float* dO = w.v;
  for (int bh = bh0; bh < bh1; bh++) {
    int b = bh / NH, h = bh % NH;
    size_t qo = (size_t)b * T * C3 + (size_t)h * hs, oo = (size_t)b * T * C + (size_t)h * hs;
    const float* q = qkv + qo;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + qo;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* dy = dout + oo;
    const float* y = out + oo;
    /* the packed inputs need zeros only where they are padded; the accumulators always */
    float* pieces[8] = {w.dq, w.dk, w.dv, w.qs, w.v, w.k, w.kt, w.vt};
    for (int i = 0; i < (padded ? 8 : 3); i++)
      memset(pieces[i], 0, (i < 6 ? th : tt) * sizeof(float));
    for (int t = 0; t < T; t++) {
      const float *dyr = dy + (size_t)t * C, *yr = y + (size_t)t * C;
      ops->copy_scaled(w.qs + (size_t)t * hp, q + (size_t)t * C3, hs, scale);
      memcpy(w.k + (size_t)t * hp, k + (size_t)t * C3, (size_t)hs * sizeof(float));
      memcpy(dO + (size_t)t * hp, dyr, (size_t)hs * sizeof(float));
      w.row[t] = lse[(size_t)bh * T + t];
      w.aux[t] = ops->dot(dyr, yr, hs);
    }
    nb__att_transpose(w.kt, ldt, w.k, (size_t)hp, T, hs);
    nb__att_transpose(w.vt, ldt, v, (size_t)C3, T, hs);
    for (int r0 = 0; r0 < T; r0 += NB__BR) {
      int nr = T - r0 < NB__BR ? T - r0 : NB__BR;
      const float* qs_i = w.qs + (size_t)r0 * hp;
      const float* dO_i = dO + (size_t)r0 * hp;
      for (int c0 = 0; c0 <= r0; c0 += NB__BC) {
        int diag = c0 == r0, nc = diag ? nr : NB__BC; /* keys any row of the block sees */
        ops->gemm(w.s, NB__BC, qs_i, hp, 1, w.kt + c0, ldt, nr, hp, NB__BC, 0);
        ops->gemm(w.dp, NB__BC, dO_i, hp, 1, w.vt + c0, ldt, nr, hp, NB__BC, 0);
        for (int r = 0; r < nr; r++) {
          float *sr = w.s + (size_t)r * NB__BC, *dr = w.dp + (size_t)r * NB__BC;
          ops->softmax_bwd(sr, dr, NB__BC, w.row[r0 + r], w.aux[r0 + r]);
          if (diag)
            for (int c = r + 1; c < NB__BC; c++) sr[c] = dr[c] = 0.0f;
        }
        /* dV_j += P^T dO_i, dK_j += dS^T (q_i * scale), dQ_i += dS K_j (scaled on write-back) */
        ops->gemm(w.dv + (size_t)c0 * hp, hp, w.s, 1, NB__BC, dO_i, hp, nc, nr, hp, 1);
        ops->gemm(w.dk + (size_t)c0 * hp, hp, w.dp, 1, NB__BC, qs_i, hp, nc, nr, hp, 1);
        ops->gemm(w.dq + (size_t)r0 * hp, hp, w.dp, NB__BC, 1, w.k + (size_t)c0 * hp, hp, nr, nc,
                  hp, 1);
      }
    }
    for (int t = 0; t < T; t++) {
      float *dqr = dq + (size_t)t * C3, *dkr = dk + (size_t)t * C3, *dvr = dv + (size_t)t * C3;
      const float *gq = w.dq + (size_t)t * hp, *gk = w.dk + (size_t)t * hp,
                  *gv = w.dv + (size_t)t * hp;
      if (accumulate) {
        ops->add_scaled(dqr, gq, hs, scale);
        ops->add_scaled(dkr, gk, hs, 1.0f);
        ops->add_scaled(dvr, gv, hs, 1.0f);
      } else {
        ops->copy_scaled(dqr, gq, hs, scale);
        memcpy(dkr, gk, (size_t)hs * sizeof(float));
        memcpy(dvr, gv, (size_t)hs * sizeof(float));
      }
    }
  }
}
