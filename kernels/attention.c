/* CPU reference causal attention: per (batch, head) two sgemm calls (Q K^T, then P V) on strided
 * views of qkv, with a masked row softmax between them. Scores above the diagonal are computed by
 * the full product and then discarded: simpler than triangular blocking, and BLAS-fast. */
#include "kernels/attention.h"

#include <cblas.h>
#include <math.h>

void nb_attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  size_t C3 = (size_t)3 * C;
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float* q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + ((size_t)b * NH + h) * T * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, (int)C3, k, (int)C3,
                  0.0f, a, T);
      for (int i = 0; i < T; i++) {
        float* row = a + (size_t)i * T;
        float mx = row[0];
        for (int j = 1; j <= i; j++)
          if (row[j] > mx) mx = row[j];
        float sum = 0.0f;
        for (int j = 0; j <= i; j++) {
          row[j] = expf(row[j] - mx);
          sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= i; j++) row[j] *= inv;
        for (int j = i + 1; j < T; j++) row[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, (int)C3, 0.0f,
                  out + (size_t)b * T * C + (size_t)h * hs, C);
    }
  }
}

void nb_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                           const float* att, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  size_t C3 = (size_t)3 * C;
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      size_t qo = (size_t)b * T * C3 + (size_t)h * hs;
      const float* q = qkv + qo;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + qo;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + ((size_t)b * NH + h) * T * T;
      const float* dy = dout + (size_t)b * T * C + (size_t)h * hs;
      /* datt = dy V^T; dV += P^T dy */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, (int)C3, 0.0f,
                  scratch, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dy, C, 1.0f, dv,
                  (int)C3);
      /* softmax backward in place: dpre = P * (datt - sum(P * datt)); zero above the diagonal */
      for (int i = 0; i < T; i++) {
        float* d = scratch + (size_t)i * T;
        const float* p = a + (size_t)i * T;
        float dot = 0.0f;
        for (int j = 0; j <= i; j++) dot += p[j] * d[j];
        for (int j = 0; j <= i; j++) d[j] = p[j] * (d[j] - dot);
        for (int j = i + 1; j < T; j++) d[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, scratch, T, k,
                  (int)C3, 1.0f, dq, (int)C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, scratch, T, q, (int)C3,
                  1.0f, dk, (int)C3);
    }
  }
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_attention_forward_cuda(float* d_out, float* d_att, const float* d_qkv, int B, int T,
                                      int C, int NH, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "attention: built without CUDA");
}
nb_status_t nb_attention_backward_cuda(float* d_dqkv, float* d_scratch, const float* d_dout,
                                       const float* d_qkv, const float* d_att, int B, int T, int C,
                                       int NH, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "attention: built without CUDA");
}
#endif
