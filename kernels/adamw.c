/* CPU AdamW: one pass over the flat vectors, fixed order, so the same inputs give the same bits;
 * the AVX2 and AVX-512 loops do the portable loop's operations in its order (the same bits). */
#include "kernels/adamw.h"

#include <math.h>

#include "kernels/vec_exp.h"

/* The update's constants, computed once per call. */
typedef struct {
  float b1, omb1, b2, omb2, bc1, bc2, lr, eps, wd;
} nb__adamw_k_t;

static void nb__adamw_portable(float* params, const float* grads, float* m, float* v, size_t n,
                               const nb__adamw_k_t* k) {
  for (size_t i = 0; i < n; i++) {
    float g = grads[i];
    float mi = k->b1 * m[i] + k->omb1 * g;
    float vi = k->b2 * v[i] + k->omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / k->bc1, vhat = vi / k->bc2;
    params[i] -= k->lr * (mhat / (sqrtf(vhat) + k->eps) + k->wd * params[i]);
  }
}

#ifdef NB__VEC_X86
/* The same operations in the same order, without fused multiply-adds, so every path gives the
 * portable loop's bits (division and square root are exact in IEEE arithmetic). */
#define NB__ADAMW_VEC(W, T, P, TGT)                                                               \
  TGT static void nb__adamw_##W(float* params, const float* grads, float* m, float* v, size_t n,  \
                                const nb__adamw_k_t* k) {                                         \
    const size_t w = sizeof(T) / 4;                                                               \
    T b1 = P##_set1_ps(k->b1), omb1 = P##_set1_ps(k->omb1), b2 = P##_set1_ps(k->b2);              \
    T omb2 = P##_set1_ps(k->omb2), bc1 = P##_set1_ps(k->bc1), bc2 = P##_set1_ps(k->bc2);          \
    T lr = P##_set1_ps(k->lr), eps = P##_set1_ps(k->eps), wd = P##_set1_ps(k->wd);                \
    size_t i = 0;                                                                                 \
    for (; i + w <= n; i += w) {                                                                  \
      T g = P##_loadu_ps(grads + i), p = P##_loadu_ps(params + i);                                \
      T mi = P##_add_ps(P##_mul_ps(b1, P##_loadu_ps(m + i)), P##_mul_ps(omb1, g));                \
      T vi = P##_add_ps(P##_mul_ps(b2, P##_loadu_ps(v + i)), P##_mul_ps(P##_mul_ps(omb2, g), g)); \
      P##_storeu_ps(m + i, mi);                                                                   \
      P##_storeu_ps(v + i, vi);                                                                   \
      T mhat = P##_div_ps(mi, bc1), vhat = P##_div_ps(vi, bc2);                                   \
      T step =                                                                                    \
          P##_add_ps(P##_div_ps(mhat, P##_add_ps(P##_sqrt_ps(vhat), eps)), P##_mul_ps(wd, p));    \
      P##_storeu_ps(params + i, P##_sub_ps(p, P##_mul_ps(lr, step)));                             \
    }                                                                                             \
    nb__adamw_portable(params + i, grads + i, m + i, v + i, n - i, k);                            \
  }
NB__ADAMW_VEC(avx2, __m256, _mm256, __attribute__((target("avx2,fma"))))
NB__ADAMW_VEC(avx512, __m512, _mm512, __attribute__((target("avx512f"))))
#endif

void nb_adamw_update_path(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                          float beta1, float beta2, float eps, float weight_decay, long t,
                          nb_cpu_path_t path) {
  nb__adamw_k_t k = {beta1,
                     1.0f - beta1,
                     beta2,
                     1.0f - beta2,
                     1.0f - powf(beta1, (float)t),
                     1.0f - powf(beta2, (float)t),
                     lr,
                     eps,
                     weight_decay};
  switch (nb_cpu_path_resolve(path)) {
#ifdef NB__VEC_X86
    case NB_CPU_PATH_AVX512:
      nb__adamw_avx512(params, grads, m, v, n, &k);
      return;
    case NB_CPU_PATH_AVX2:
      nb__adamw_avx2(params, grads, m, v, n, &k);
      return;
#endif
    default:
      nb__adamw_portable(params, grads, m, v, n, &k);
  }
}

void nb_adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, long t) {
  nb_adamw_update_path(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                       NB_CPU_PATH_AUTO);
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_adamw_update_cuda(float* d_params, const float* d_grads, float* d_m, float* d_v,
                                 size_t n, float lr, float beta1, float beta2, float eps,
                                 float weight_decay, long t, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "adamw: built without CUDA");
}
#endif
