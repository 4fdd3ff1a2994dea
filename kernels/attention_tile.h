/* The tile helpers of the blocked attention kernel, written once and compiled once per vector
 * path: attention_blocked.c includes this file with the vector type, its width and its
 * operations defined (portable scalar, AVX2, AVX-512). Not a header to include anywhere else.
 *
 * The includer defines: NB__TGT (function attribute), NB__FN(name) (suffixed name), vf, VW,
 * V_LOAD, V_STORE, V_SET1, V_ZERO, V_ADD, V_SUB, V_MUL, V_FMA(a, b, c) = a * b + c, V_MAX,
 * V_HMAX, V_HSUM, V_EXP, and the register blocking NB__RB (rows) x NB__SV (vectors); this file
 * undefines them all at its end, ready for the next path. */

/* One block of rb rows x sv vectors of c (+)= a * b, over the whole depth K. With constant rb and
 * sv (it is always inlined) the accumulators live in registers. */
static inline __attribute__((always_inline)) NB__TGT void NB__FN(block)(float* c, int ldc,
                                                                        const float* a, int sar,
                                                                        int sak, const float* b,
                                                                        int ldb, int K, int acc,
                                                                        int rb, int sv) {
  vf s[NB__RB][NB__SV];
#pragma GCC unroll 8
  for (int i = 0; i < rb; i++)
#pragma GCC unroll 8
    for (int v = 0; v < sv; v++) s[i][v] = acc ? V_LOAD(c + i * ldc + v * VW) : V_ZERO();
  for (int k = 0; k < K; k++) {
    const float* bk = b + (size_t)k * ldb;
    vf x[NB__SV];
#pragma GCC unroll 8
    for (int v = 0; v < sv; v++) x[v] = V_LOAD(bk + v * VW);
#pragma GCC unroll 8
    for (int i = 0; i < rb; i++) {
      vf w = V_SET1(a[i * sar + k * sak]);
#pragma GCC unroll 8
      for (int v = 0; v < sv; v++) s[i][v] = V_FMA(w, x[v], s[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < rb; i++)
#pragma GCC unroll 8
    for (int v = 0; v < sv; v++) V_STORE(c + i * ldc + v * VW, s[i][v]);
}

/* rb rows of c across all N columns: strips of NB__SV vectors, then single vectors. */
static inline __attribute__((always_inline)) NB__TGT void NB__FN(rows)(float* c, int ldc,
                                                                       const float* a, int sar,
                                                                       int sak, const float* b,
                                                                       int ldb, int K, int N,
                                                                       int acc, int rb) {
  int n = 0;
  for (; n + NB__SV * VW <= N; n += NB__SV * VW)
    NB__FN(block)(c + n, ldc, a, sar, sak, b + n, ldb, K, acc, rb, NB__SV);
  for (; n < N; n += VW) NB__FN(block)(c + n, ldc, a, sar, sak, b + n, ldb, K, acc, rb, 1);
}

/* c (M x N, row stride ldc) = a * b, or += with acc. Element (r, k) of a is a[r * sar + k * sak]
 * (sar = 1 reads a transposed); b is K x N with row stride ldb. N is a multiple of VW. */
static NB__TGT void NB__FN(gemm)(float* c, int ldc, const float* a, int sar, int sak,
                                 const float* b, int ldb, int M, int K, int N, int acc) {
  int r = 0;
  for (; r + NB__RB <= M; r += NB__RB) {
    float* cr = c + (size_t)r * ldc;
    NB__FN(rows)(cr, ldc, a + (size_t)r * sar, sar, sak, b, ldb, K, N, acc, NB__RB);
  }
  for (; r < M; r++)
    NB__FN(rows)(c + (size_t)r * ldc, ldc, a + (size_t)r * sar, sar, sak, b, ldb, K, N, acc, 1);
}

/* Largest of s[0, n); n a multiple of VW. */
static NB__TGT float NB__FN(row_max)(const float* s, int n) {
  vf m = V_LOAD(s);
  for (int i = VW; i < n; i += VW) m = V_MAX(m, V_LOAD(s + i));
  return V_HMAX(m);
}

/* s = exp(s - sub) in place over [0, n); returns the sum. exp(-inf) is 0. */
static NB__TGT float NB__FN(exp_sum)(float* s, int n, float sub) {
  vf vs = V_SET1(sub), sum = V_ZERO();
  for (int i = 0; i < n; i += VW) {
    vf e = V_EXP(V_SUB(V_LOAD(s + i), vs));
    V_STORE(s + i, e);
    sum = V_ADD(sum, e);
  }
  return V_HSUM(sum);
}

static NB__TGT void NB__FN(scale)(float* y, int n, float f) {
  vf vf_ = V_SET1(f);
  for (int i = 0; i < n; i += VW) V_STORE(y + i, V_MUL(V_LOAD(y + i), vf_));
}

/* One row of the backward: p = exp(s - lse) in place of the scores s, ds = p * (dp - D) in place
 * of dp = dout V^T. */
static NB__TGT void NB__FN(softmax_bwd)(float* s, float* dp, int n, float lse, float D) {
  vf vl = V_SET1(lse), vd = V_SET1(D);
  for (int i = 0; i < n; i += VW) {
    vf p = V_EXP(V_SUB(V_LOAD(s + i), vl));
    V_STORE(s + i, p);
    V_STORE(dp + i, V_MUL(p, V_SUB(V_LOAD(dp + i), vd)));
  }
}

/* y[0, n) = x[0, n) * f; any n. */
static NB__TGT void NB__FN(copy_scaled)(float* y, const float* x, int n, float f) {
  vf vf_ = V_SET1(f);
  int i = 0;
  for (; i + VW <= n; i += VW) V_STORE(y + i, V_MUL(V_LOAD(x + i), vf_));
  for (; i < n; i++) y[i] = x[i] * f;
}

/* y[0, n) += x[0, n) * f; any n. */
static NB__TGT void NB__FN(add_scaled)(float* y, const float* x, int n, float f) {
  vf vf_ = V_SET1(f);
  int i = 0;
  for (; i + VW <= n; i += VW) V_STORE(y + i, V_FMA(V_LOAD(x + i), vf_, V_LOAD(y + i)));
  for (; i < n; i++) y[i] += x[i] * f;
}

/* The sum of x[i] * y[i] over [0, n); any n. */
static NB__TGT float NB__FN(dot)(const float* x, const float* y, int n) {
  vf acc = V_ZERO();
  int i = 0;
  for (; i + VW <= n; i += VW) acc = V_FMA(V_LOAD(x + i), V_LOAD(y + i), acc);
  float r = V_HSUM(acc);
  for (; i < n; i++) r += x[i] * y[i];
  return r;
}

static const nb__att_ops_t NB__FN(ops) = {
    NB__FN(gemm),        NB__FN(row_max),     NB__FN(exp_sum),    NB__FN(scale),
    NB__FN(softmax_bwd), NB__FN(copy_scaled), NB__FN(add_scaled), NB__FN(dot)};

#undef NB__TGT
#undef NB__FN
#undef vf
#undef VW
#undef V_LOAD
#undef V_STORE
#undef V_SET1
#undef V_ZERO
#undef V_ADD
#undef V_SUB
#undef V_MUL
#undef V_FMA
#undef V_MAX
#undef V_HMAX
#undef V_HSUM
#undef V_EXP
#undef NB__RB
#undef NB__SV
