/* CPU reference causal attention: per (batch, head, block of queries) two sgemm calls (Q K^T,
 * then P V) on strided views of qkv, with a masked row softmax between them. Within a block the
 * few scores above the diagonal are computed and discarded; no flash-style tiling. */
#include "kernels/attention.h"

#include <cblas.h>
#include <math.h>

#include "kernels/attention_rows.h"

/* Query rows are processed in blocks of NB__ATT_BLOCK: block [r0, r1) only needs keys [0, r1),
 * which skips most of the masked upper triangle (62% of the full products computed at T = 256)
 * while keeping each sgemm large enough to run at BLAS speed. */
#define NB__ATT_BLOCK 64

void nb_attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  int C3 = 3 * C;
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float* q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + ((size_t)b * NH + h) * T * T;
      float* o = out + (size_t)b * T * C + (size_t)h * hs;
      for (int r0 = 0; r0 < T; r0 += NB__ATT_BLOCK) {
        int r1 = r0 + NB__ATT_BLOCK < T ? r0 + NB__ATT_BLOCK : T, nr = r1 - r0;
        /* scores of queries [r0, r1) against keys [0, r1) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, scale, q + (size_t)r0 * C3,
                    C3, k, C3, 0.0f, a + (size_t)r0 * T, T);
        for (int i = r0; i < r1; i++) nb_att_softmax_row(a + (size_t)i * T, i, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, 1.0f, a + (size_t)r0 * T,
                    T, v, C3, 0.0f, o + (size_t)r0 * C, C);
      }
    }
  }
}

void nb_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                           const float* att, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  int C3 = 3 * C;
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
      for (int r0 = 0; r0 < T; r0 += NB__ATT_BLOCK) {
        int r1 = r0 + NB__ATT_BLOCK < T ? r0 + NB__ATT_BLOCK : T, nr = r1 - r0;
        const float* ab = a + (size_t)r0 * T; /* P rows [r0, r1), keys [0, r1) */
        float* d = scratch + (size_t)r0 * T;
        const float* dyb = dy + (size_t)r0 * C;
        /* datt = dy V^T; dV[0, r1) += P^T dy */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, 1.0f, dyb, C, v, C3, 0.0f,
                    d, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, nr, 1.0f, ab, T, dyb, C, 1.0f,
                    dv, C3);
        /* softmax backward in place: dpre = P * (datt - sum(P * datt)); zero above the diagonal */
        for (int i = r0; i < r1; i++)
          nb_att_softmax_bwd_row(scratch + (size_t)i * T, a + (size_t)i * T, i, r1);
        /* dQ[r0, r1) += s dpre K; dK[0, r1) += s dpre^T Q[r0, r1) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, scale, d, T, k, C3, 1.0f,
                    dq + (size_t)r0 * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, nr, scale, d, T,
                    q + (size_t)r0 * C3, C3, 1.0f, dk, C3);
      }
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
