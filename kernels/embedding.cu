// CUDA embedding: gather forward, atomicAdd scatter backward (so the GPU backward is not
// bit-reproducible; the CPU one is).
#include "kernels/cuda_check.h"
#include "kernels/embedding.h"

// An element of a (B, T, C) tensor: flat index i, its token bt (of the B * T), the token's
// position t and the channel c.
typedef struct {
  size_t i, bt;
  int t, c;
} nb__emb_at_t;

// The element of this thread (one per element, both directions); false past the end.
__device__ static bool nb__emb_at(int B, int T, int C, nb__emb_at_t* e) {
  e->i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e->i >= (size_t)B * T * C) return false;
  e->c = (int)(e->i % C);
  e->bt = e->i / C;
  e->t = (int)(e->bt % T);
  return true;
}

__global__ static void nb__emb_fwd(float* out, const int* tok, const float* wte, const float* wpe,
                                   int B, int T, int C) {
  nb__emb_at_t e;
  if (!nb__emb_at(B, T, C, &e)) return;
  out[e.i] = wte[(size_t)tok[e.bt] * C + e.c] + wpe[(size_t)e.t * C + e.c];
}

__global__ static void nb__emb_bwd(float* dwte, float* dwpe, const float* dout, const int* tok,
                                   int B, int T, int C) {
  nb__emb_at_t e;
  if (!nb__emb_at(B, T, C, &e)) return;
  if (dwte) atomicAdd(&dwte[(size_t)tok[e.bt] * C + e.c], dout[e.i]);
  if (dwpe) atomicAdd(&dwpe[(size_t)e.t * C + e.c], dout[e.i]);
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
