/* CPU GELU (tanh form): the portable loops (the reference) and AVX2 / AVX-512 versions of the
 * same function with a vector exp, plus the bias-fused passes the training step uses. No lookup
 * tables. */
#include "kernels/gelu.h"

#include <math.h>
#include <string.h>

#include "kernels/vec_exp.h"

#define NB__GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define NB__GELU_A 0.044715f

/* tanh through one expf: glibc's tanhf (via expm1f) dominated the training step's profile.
 * Saturates cleanly (exp overflow gives -1, underflow gives 1); absolute error ~1e-7. */
static inline float nb__tanh(float u) {
  return 2.0f / (1.0f + expf(-2.0f * u)) - 1.0f;
}

static inline float nb__gelu1(float x) {
  return 0.5f * x * (1.0f + nb__tanh(NB__GELU_K * (x + NB__GELU_A * x * x * x)));
}

static inline float nb__gelu_grad1(float x) {
  float u = NB__GELU_K * (x + NB__GELU_A * x * x * x);
  float t = nb__tanh(u);
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * NB__GELU_K * (1.0f + 3.0f * NB__GELU_A * x * x);
}

#ifdef NB__VEC_X86
/* 0.5 x (1 + tanh u) = x s with s = 1 / (1 + exp(-2u)); gelu' = s + 2 x s (1 - s) u'. */
#define NB__GELU_VEC(W, T, P, TGT, EXP)                                                        \
  TGT static inline T nb__gelu_##W(T x, T* grad) {                                             \
    T x2 = P##_mul_ps(x, x);                                                                   \
    T u = P##_mul_ps(P##_set1_ps(NB__GELU_K),                                                  \
                     P##_fmadd_ps(P##_mul_ps(x2, x), P##_set1_ps(NB__GELU_A), x));             \
    T one = P##_set1_ps(1.0f);                                                                 \
    T s = P##_div_ps(one, P##_add_ps(one, EXP(P##_mul_ps(P##_set1_ps(-2.0f), u))));            \
    if (grad) {                                                                                \
      T du = P##_mul_ps(P##_set1_ps(NB__GELU_K),                                               \
                        P##_fmadd_ps(P##_set1_ps(3.0f * NB__GELU_A), x2, one));                \
      T ss = P##_mul_ps(s, P##_sub_ps(one, s));                                                \
      *grad = P##_fmadd_ps(P##_mul_ps(P##_set1_ps(2.0f), x), P##_mul_ps(ss, du), s);           \
    }                                                                                          \
    return P##_mul_ps(x, s);                                                                   \
  }                                                                                            \
  TGT static void nb__gelu_fwd_##W(float* out, const float* inp, size_t n) {                   \
    size_t i = 0;                                                                              \
    for (; i + sizeof(T) / 4 <= n; i += sizeof(T) / 4)                                         \
      P##_storeu_ps(out + i, nb__gelu_##W(P##_loadu_ps(inp + i), NULL));                       \
    for (; i < n; i++) out[i] = nb__gelu1(inp[i]);                                             \
  }                                                                                            \
  TGT static void nb__gelu_bwd_##W(float* dinp, const float* inp, const float* dout, size_t n, \
                                   int acc) {                                                  \
    size_t i = 0;                                                                              \
    for (; i + sizeof(T) / 4 <= n; i += sizeof(T) / 4) {                                       \
      T g;                                                                                     \
      nb__gelu_##W(P##_loadu_ps(inp + i), &g);                                                 \
      T d = P##_mul_ps(g, P##_loadu_ps(dout + i));                                             \
      P##_storeu_ps(dinp + i, acc ? P##_add_ps(P##_loadu_ps(dinp + i), d) : d);                \
    }                                                                                          \
    for (; i < n; i++) {                                                                       \
      float d = nb__gelu_grad1(inp[i]) * dout[i];                                              \
      dinp[i] = acc ? dinp[i] + d : d;                                                         \
    }                                                                                          \
  }                                                                                            \
  TGT static void nb__add_##W(float* y, const float* x, size_t n) {                            \
    size_t i = 0;                                                                              \
    for (; i + sizeof(T) / 4 <= n; i += sizeof(T) / 4)                                         \
      P##_storeu_ps(y + i, P##_add_ps(P##_loadu_ps(y + i), P##_loadu_ps(x + i)));              \
    for (; i < n; i++) y[i] += x[i];                                                           \
  }

NB__GELU_VEC(avx2, __m256, _mm256, __attribute__((target("avx2,fma"))), nb__exp_avx2)
NB__GELU_VEC(avx512, __m512, _mm512, __attribute__((target("avx512f"))), nb__exp_avx512)
#endif

static void nb__gelu_fwd_portable(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = nb__gelu1(inp[i]);
}
static void nb__gelu_bwd_portable(float* dinp, const float* inp, const float* dout, size_t n,
                                  int acc) {
  for (size_t i = 0; i < n; i++) {
    float d = nb__gelu_grad1(inp[i]) * dout[i];
    dinp[i] = acc ? dinp[i] + d : d;
  }
}
static void nb__add_portable(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

typedef struct {
  void (*fwd)(float*, const float*, size_t);
  void (*bwd)(float*, const float*, const float*, size_t, int);
  void (*add)(float*, const float*, size_t);
} nb__gelu_ops_t;

static nb__gelu_ops_t nb__gelu_ops(nb_cpu_path_t path) {
  switch (nb_cpu_path_resolve(path)) {
#ifdef NB__VEC_X86
    case NB_CPU_PATH_AVX512:
      return (nb__gelu_ops_t){nb__gelu_fwd_avx512, nb__gelu_bwd_avx512, nb__add_avx512};
    case NB_CPU_PATH_AVX2:
      return (nb__gelu_ops_t){nb__gelu_fwd_avx2, nb__gelu_bwd_avx2, nb__add_avx2};
#endif
    default:
      return (nb__gelu_ops_t){nb__gelu_fwd_portable, nb__gelu_bwd_portable, nb__add_portable};
  }
}

void nb_gelu_forward_path(float* out, const float* inp, size_t n, nb_cpu_path_t path) {
  nb__gelu_ops(path).fwd(out, inp, n);
}

void nb_gelu_backward_path(float* dinp, const float* inp, const float* dout, size_t n,
                           nb_cpu_path_t path) {
  nb__gelu_ops(path).bwd(dinp, inp, dout, n, 1);
}

void nb_gelu_forward(float* out, const float* inp, size_t n) {
  nb_gelu_forward_path(out, inp, n, NB_CPU_PATH_AUTO);
}

void nb_gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  nb_gelu_backward_path(dinp, inp, dout, n, NB_CPU_PATH_AUTO);
}

void nb_gelu_bias_forward(float* out, float* pre, const float* bias, int rows, int cols,
                          nb_cpu_path_t path) {
  nb__gelu_ops_t ops = nb__gelu_ops(path);
  for (int r = 0; r < rows; r++) {
    float* p = pre + (size_t)r * cols;
    if (bias) ops.add(p, bias, (size_t)cols);
    ops.fwd(out + (size_t)r * cols, p, (size_t)cols);
  }
}

void nb_gelu_bias_backward(float* dpre, float* dbias, const float* pre, const float* dout, int rows,
                           int cols, nb_cpu_path_t path) {
  nb__gelu_ops_t ops = nb__gelu_ops(path);
  if (dbias) memset(dbias, 0, (size_t)cols * sizeof(float));
  for (int r = 0; r < rows; r++) {
    size_t o = (size_t)r * cols;
    ops.bwd(dpre + o, pre + o, dout + o, (size_t)cols, 0);
    if (dbias) ops.add(dbias, dpre + o, (size_t)cols);
  }
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_gelu_forward_cuda(float* d_out, const float* d_inp, size_t n, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "gelu: built without CUDA");
}
nb_status_t nb_gelu_backward_cuda(float* d_dinp, const float* d_inp, const float* d_dout, size_t n,
                                  void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "gelu: built without CUDA");
}
#endif
