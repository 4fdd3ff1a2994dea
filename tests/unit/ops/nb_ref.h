/* Double-precision reference forwards of the model ops, for the finite-difference gradient checks
 * (tests only). Deliberately naive loops: clarity over speed, no BLAS. */
#ifndef NB_TESTS_REF_H
#define NB_TESTS_REF_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static void ref_matmul(double* out, const double* inp, const double* w, const double* b, int N,
                       int C, int OC) {
  for (int i = 0; i < N; i++)
    for (int o = 0; o < OC; o++) {
      double s = b ? b[o] : 0.0;
      for (int c = 0; c < C; c++) s += inp[(size_t)i * C + c] * w[(size_t)o * C + c];
      out[(size_t)i * OC + o] = s;
    }
}

static void ref_layernorm(double* out, const double* inp, const double* w, const double* b, int N,
                          int C) {
  for (int i = 0; i < N; i++) {
    const double* x = inp + (size_t)i * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    double s = 1.0 / sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (x[c] - m) * s * w[c] + b[c];
  }
}

static void ref_gelu(double* out, const double* inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double x = inp[i];
    out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  }
}

static void ref_attention(double* out, const double* qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  double scale = 1.0 / sqrt((double)hs), p[1024];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const double* q = qkv + ((size_t)b * T + i) * 3 * C + h * hs;
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; j++) {
          const double* k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
          double s = 0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          p[j] = s * scale;
          if (p[j] > mx) mx = p[j];
        }
        for (int j = 0; j <= i; j++) {
          p[j] = exp(p[j] - mx);
          sum += p[j];
        }
        double* o = out + ((size_t)b * T + i) * C + h * hs;
        for (int d = 0; d < hs; d++) {
          double s = 0;
          for (int j = 0; j <= i; j++)
            s += p[j] / sum * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + d];
          o[d] = s;
        }
      }
}

/* The analytic gradient of ref_attention in double, overwriting dqkv (B, T, 3C), and the logsumexp
 * of each row's scaled scores into lse (B, NH, T) when not NULL. Checked against finite
 * differences of ref_attention in test_ops, then used for shapes too large for them. */
static inline void ref_attention_backward(double* dqkv, double* lse, const double* dout,
                                          const double* qkv, int B, int T, int C, int NH) {
  int hs = C / NH, C3 = 3 * C;
  double scale = 1.0 / sqrt((double)hs), p[1024], dp[1024];
  memset(dqkv, 0, sizeof(double) * (size_t)B * T * C3);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const double* row = qkv + (size_t)b * T * C3 + h * hs;
        const double* q = row + (size_t)i * C3;
        const double* dy = dout + ((size_t)b * T + i) * C + h * hs;
        double mx = -1e300, sum = 0, pdp = 0;
        for (int j = 0; j <= i; j++) {
          double s = 0;
          for (int d = 0; d < hs; d++) s += q[d] * row[(size_t)j * C3 + C + d];
          p[j] = s * scale;
          if (p[j] > mx) mx = p[j];
        }
        for (int j = 0; j <= i; j++) {
          p[j] = exp(p[j] - mx);
          sum += p[j];
        }
        if (lse) lse[((size_t)b * NH + h) * T + i] = mx + log(sum);
        for (int j = 0; j <= i; j++) {
          p[j] /= sum;
          double s = 0;
          for (int d = 0; d < hs; d++) s += dy[d] * row[(size_t)j * C3 + 2 * C + d];
          dp[j] = s;
          pdp += p[j] * s;
        }
        double* dq = dqkv + (size_t)b * T * C3 + (size_t)i * C3 + h * hs;
        for (int j = 0; j <= i; j++) {
          double ds = p[j] * (dp[j] - pdp) * scale;
          double* dk = dqkv + (size_t)b * T * C3 + (size_t)j * C3 + C + h * hs;
          const double* k = row + (size_t)j * C3 + C;
          for (int d = 0; d < hs; d++) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
            dk[C + d] += p[j] * dy[d]; /* dv */
          }
        }
      }
}

static void ref_softmax(double* p, const double* x, int V, double temp) {
  double mx = x[0], sum = 0;
  for (int j = 1; j < V; j++)
    if (x[j] > mx) mx = x[j];
  for (int j = 0; j < V; j++) {
    p[j] = exp((x[j] - mx) / temp);
    sum += p[j];
  }
  for (int j = 0; j < V; j++) p[j] /= sum;
}

/* Mean cross-entropy over rows with target >= 0 (0 if none). */
static double ref_crossentropy(const double* logits, const int* targets, int N, int V) {
  double p[512], s = 0;
  int count = 0;
  for (int i = 0; i < N; i++) {
    if (targets[i] < 0) continue;
    ref_softmax(p, logits + (size_t)i * V, V, 1.0);
    s -= log(p[targets[i]]);
    count++;
  }
  return count ? s / count : 0.0;
}

/* Sum over unmasked rows of T^2 KL(softmax(t/T) || softmax(s/T)). */
static double ref_kl(const double* student, const double* teacher, const int* mask, int N, int V,
                     double T) {
  double ps[512], pt[512], s = 0;
  for (int i = 0; i < N; i++) {
    if (mask && mask[i] < 0) continue;
    ref_softmax(ps, student + (size_t)i * V, V, T);
    ref_softmax(pt, teacher + (size_t)i * V, V, T);
    for (int j = 0; j < V; j++) s += T * T * pt[j] * (log(pt[j]) - log(ps[j]));
  }
  return s;
}

static void ref_embedding(double* out, const int* tokens, const double* wte, const double* wpe,
                          int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        out[((size_t)b * T + t) * C + c] =
            wte[(size_t)tokens[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

/* Compares an analytic float gradient with a double reference: |g - r| <= atol + rtol |r| with
 * atol = atol_frac * max|r|. Prints the worst element. Returns 1 when within tolerance. */
static int ref_compare(const char* what, const float* got, const double* ref, size_t n,
                       double atol_frac, double rtol) {
  double mx = 0;
  for (size_t i = 0; i < n; i++)
    if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
  double atol = atol_frac * mx + 1e-12, worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < n; i++) {
    double r = fabs(got[i] - ref[i]) / (atol + rtol * fabs(ref[i]));
    if (!(r <= worst)) {
      worst = r;
      wi = i;
    }
  }
  printf("  %-28s n=%-6zu max|ref|=%.3e worst [%zu] got %.7e ref %.7e (%.2f of tolerance)\n", what,
         n, mx, wi, n ? (double)got[wi] : 0.0, n ? ref[wi] : 0.0, worst);
  return worst <= 1.0;
}

#endif
