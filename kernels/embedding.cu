// CUDA embedding: gather forward, atomicAdd scatter backward (so the GPU backward is not
// bit-reproducible; the CPU one is).
#include "kernels/cuda_check.h"
#include "kernels/embedding.h"

__global__ static void nb__emb_fwd(float* out, const int* tok, const float* wte, const float* wpe,
                                   int B, int T, int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)B * T * C) return;
  int c = (int)(i % C);
  size_t bt = i / C;
  int t = (int)(bt % T);
  out[i] = wte[(size_t)tok[bt] * C + c] + wpe[(size_t)t * C + c];
}

__global__ static void nb__emb_bwd(float* dwte, float* dwpe, const float* dout, const int* tok,
                                   int B, int T, int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)B * T * C) return;
  int c = (int)(i % C);
  size_t bt = i / C;
  int t = (int)(bt % T);
  if (dwte) atomicAdd(&dwte[(size_t)tok[bt] * C + c], dout[i]);
  if (dwpe) atomicAdd(&dwpe[(size_t)t * C + c], dout[i]);
}

extern "C" nb_status_t nb_embedding_forward_cuda(float* d_out, const int* d_tokens,
                                                 const float* d_wte, const float* d_wpe, int B,
                                                 int T, int C, void* stream) {
  size_t n = (size_t)B * T * C;
  if (n == 0) return NB_OK;
  nb__emb_fwd<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_out, d_tokens, d_wte,
                                                                             d_wpe, B, T, C);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}

extern "C" nb_status_t nb_embedding_backward_cuda(float* d_dwte, float* d_dwpe, const float* d_dout,
                                                  const int* d_tokens, int B, int T, int C,
                                                  void* stream) {
  size_t n = (size_t)B * T * C;
  if (n == 0) return NB_OK;
  nb__emb_bwd<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_dwte, d_dwpe, d_dout,
                                                                             d_tokens, B, T, C);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}
