/* CPU reference LayerNorm: two passes per row (mean, then variance of the centred values) for
 * accuracy; statistics accumulated in double. */
#include "kernels/layernorm.h"

#include <math.h>

/* One row normalised, its mean m (sum of x already taken, divided here) and rstd written. */
static void nb__ln_row(float* y, float* mean, float* rstd, const float* x, double m,
                       const float* weight, const float* bias, int C) {
  m /= C;
  double v = 0.0;
  for (int c = 0; c < C; c++) {
    double d = x[c] - m;
    v += d * d;
  }
  v /= C;
  float s = (float)(1.0 / sqrt(v + NB_LAYERNORM_EPS));
  float mf = (float)m;
  for (int c = 0; c < C; c++) y[c] = (x[c] - mf) * s * weight[c] + bias[c];
  *mean = mf;
  *rstd = s;
}

void nb_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                          const float* weight, const float* bias, int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* x = inp + (size_t)i * C;
    double m = 0.0;
    for (int c = 0; c < C; c++) m += x[c];
    nb__ln_row(out + (size_t)i * C, mean + i, rstd + i, x, m, weight, bias, C);
  }
}

void nb_residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                   const float* b, const float* weight, const float* bias, int N,
                                   int C) {
  for (int i = 0; i < N; i++) {
    const float* xa = a + (size_t)i * C;
    const float* xb = b + (size_t)i * C;
    float* x = res + (size_t)i * C;
    double m = 0.0;
    for (int c = 0; c < C; c++) {
      x[c] = xa[c] + xb[c];
      m += x[c];
    }
    nb__ln_row(out + (size_t)i * C, mean + i, rstd + i, x, m, weight, bias, C);
  }
}

void nb_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, const float* mean,
                           const float* rstd, int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* dy = dout + (size_t)i * C;
    const float* x = inp + (size_t)i * C;
    float* dx = dinp + (size_t)i * C;
    float m = mean[i], s = rstd[i];
    /* dnorm = dy * w; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) */
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      float dn = weight[c] * dy[c];
      dnorm_mean += dn;
      dnorm_norm_mean += (double)dn * norm;
    }
    float a = (float)(dnorm_mean / C), b = (float)(dnorm_norm_mean / C);
    for (int c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      float dn = weight[c] * dy[c];
      if (dbias) dbias[c] += dy[c];
      if (dweight) dweight[c] += norm * dy[c];
      dx[c] += s * (dn - a - norm * b);
    }
  }
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_layernorm_forward_cuda(float* d_out, float* d_mean, float* d_rstd,
                                      const float* d_inp, const float* d_weight,
                                      const float* d_bias, int N, int C, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "layernorm: built without CUDA");
}
nb_status_t nb_layernorm_backward_cuda(float* d_dinp, float* d_dweight, float* d_dbias,
                                       const float* d_dout, const float* d_inp,
                                       const float* d_weight, const float* d_mean,
                                       const float* d_rstd, int N, int C, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "layernorm: built without CUDA");
}
#endif
