/* CPU reference embedding: row copies and row adds in a fixed order, so the backward is
 * bit-reproducible. */
#include "kernels/embedding.h"

#include <stddef.h>

void nb_embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                          int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float* o = out + ((size_t)b * T + t) * C;
      const float* e = wte + (size_t)tokens[b * T + t] * C;
      const float* p = wpe + (size_t)t * C;
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

void nb_embedding_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B,
                           int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float* d = dout + ((size_t)b * T + t) * C;
      if (dwte) {
        float* e = dwte + (size_t)tokens[b * T + t] * C;
        for (int c = 0; c < C; c++) e[c] += d[c];
      }
      if (dwpe) {
        float* p = dwpe + (size_t)t * C;
        for (int c = 0; c < C; c++) p[c] += d[c];
      }
    }
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_embedding_forward_cuda(float* d_out, const int* d_tokens, const float* d_wte,
                                      const float* d_wpe, int B, int T, int C, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "embedding: built without CUDA");
}
nb_status_t nb_embedding_backward_cuda(float* d_dwte, float* d_dwpe, const float* d_dout,
                                       const int* d_tokens, int B, int T, int C, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "embedding: built without CUDA");
}
#endif
