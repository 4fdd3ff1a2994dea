// CUDA causal attention: cuBLAS strided-batched products over the heads of each sequence, and
// row kernels for the masked softmax and its backward. Materialises (T, T) scores, like the CPU.
#include <math.h>

#include "kernels/attention.h"
#include "kernels/attention_rows.h"
#include "kernels/cublas_check.h"

// One thread per row of every (head, query) in a sequence: causal softmax in place.
__global__ static void nb__causal_softmax(float* att, int rows, int T) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) nb_att_softmax_row(att + (size_t)r * T, r % T, T);
}

__global__ static void nb__softmax_bwd(float* d, const float* att, int rows, int T) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) nb_att_softmax_bwd_row(d + (size_t)r * T, att + (size_t)r * T, r % T, T);
}

extern "C" nb_status_t nb_attention_forward_cuda(float* d_out, float* d_att, const float* d_qkv,
                                                 int B, int T, int C, int NH, void* stream) {
  cublasHandle_t h;
  NB_CHECK(nb__cublas_get(stream, &h));
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs), zero = 0.0f, one = 1.0f;
  long long TT = (long long)T * T;
  for (int b = 0; b < B; b++) {
    const float* q = d_qkv + (size_t)b * T * C3;
    float* a = d_att + (size_t)b * NH * TT;
    // S^T (col-major) = K . Q^T per head
    NB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale, q + C,
                                              C3, hs, q, C3, hs, &zero, a, T, TT, NH));
    int rows = NH * T;
    nb__causal_softmax<<<(rows + 127) / 128, 128, 0, (cudaStream_t)stream>>>(a, rows, T);
    NB_CUDA_LAUNCH_CHECK();
    // out^T = V^T . P^T per head
    NB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one,
                                              q + 2 * C, C3, hs, a, T, TT, &zero,
                                              d_out + (size_t)b * T * C, C, hs, NH));
  }
  return NB_OK;
}

extern "C" nb_status_t nb_attention_backward_cuda(float* d_dqkv, float* d_scratch,
                                                  const float* d_dout, const float* d_qkv,
                                                  const float* d_att, int B, int T, int C, int NH,
                                                  void* stream) {
  cublasHandle_t h;
  NB_CHECK(nb__cublas_get(stream, &h));
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs), zero = 0.0f, one = 1.0f;
  long long TT = (long long)T * T;
  for (int b = 0; b < B; b++) {
    const float* q = d_qkv + (size_t)b * T * C3;
    float* dq = d_dqkv + (size_t)b * T * C3;
    const float* a = d_att + (size_t)b * NH * TT;
    float* s = d_scratch + (size_t)b * NH * TT;
    const float* dy = d_dout + (size_t)b * T * C;
    // datt = dy . V^T
    NB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one,
                                              q + 2 * C, C3, hs, dy, C, hs, &zero, s, T, TT, NH));
    // dV += P^T . dy
    NB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, dy, C,
                                              hs, a, T, TT, &one, dq + 2 * C, C3, hs, NH));
    int rows = NH * T;
    nb__softmax_bwd<<<(rows + 127) / 128, 128, 0, (cudaStream_t)stream>>>(s, a, rows, T);
    NB_CUDA_LAUNCH_CHECK();
    // dQ += scale dpre . K ; dK += scale dpre^T . Q
    NB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &scale, q + C,
                                              C3, hs, s, T, TT, &one, dq, C3, hs, NH));
    NB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &scale, q, C3,
                                              hs, s, T, TT, &one, dq + C, C3, hs, NH));
  }
  return NB_OK;
}
