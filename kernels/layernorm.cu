// CUDA LayerNorm: one warp per row for the forward and the input gradient; weight/bias gradients
// by one thread per column (deterministic, no atomics). Written for clarity, not peak speed.
#include "kernels/cuda_check.h"
#include "kernels/layernorm.h"

__device__ static float nb__warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ static void nb__ln_fwd(float* out, float* mean, float* rstd, const float* inp,
                                  const float* w, const float* b, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + (size_t)row * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  float m = nb__warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  float r = rsqrtf(nb__warp_sum(v) / C + NB_LAYERNORM_EPS);
  float* y = out + (size_t)row * C;
  for (int c = lane; c < C; c += 32) y[c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

__global__ static void nb__ln_bwd_x(float* dinp, const float* dout, const float* inp,
                                    const float* w, const float* mean, const float* rstd, int N,
                                    int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + (size_t)row * C;
  const float* dy = dout + (size_t)row * C;
  float m = mean[row], r = rstd[row];
  float a = 0.0f, bb = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float n = (x[c] - m) * r, dn = w[c] * dy[c];
    a += dn;
    bb += dn * n;
  }
  a = nb__warp_sum(a) / C;
  bb = nb__warp_sum(bb) / C;
  float* dx = dinp + (size_t)row * C;
  for (int c = lane; c < C; c += 32) {
    float n = (x[c] - m) * r, dn = w[c] * dy[c];
    dx[c] += r * (dn - a - n * bb);
  }
}

__global__ static void nb__ln_bwd_wb(float* dw, float* db, const float* dout, const float* inp,
                                     const float* mean, const float* rstd, int N, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0.0f, sb = 0.0f;
  for (int i = 0; i < N; i++) {
    float dy = dout[(size_t)i * C + c];
    sb += dy;
    sw += (inp[(size_t)i * C + c] - mean[i]) * rstd[i] * dy;
  }
  if (dw) dw[c] += sw;
  if (db) db[c] += sb;
}

extern "C" nb_status_t nb_layernorm_forward_cuda(float* d_out, float* d_mean, float* d_rstd,
                                                 const float* d_inp, const float* d_weight,
                                                 const float* d_bias, int N, int C, void* stream) {
  nb__ln_fwd<<<(N + 7) / 8, 256, 0, (cudaStream_t)stream>>>(d_out, d_mean, d_rstd, d_inp, d_weight,
                                                            d_bias, N, C);
  NB_CUDA_LAUNCH_CHECK();
  return NB_OK;
}

extern "C" nb_status_t nb_layernorm_backward_cuda(float* d_dinp, float* d_dweight, float* d_dbias,
                                                  const float* d_dout, const float* d_inp,
                                                  const float* d_weight, const float* d_mean,
                                                  const float* d_rstd, int N, int C, void* stream) {
  nb__ln_bwd_x<<<(N + 7) / 8, 256, 0, (cudaStream_t)stream>>>(d_dinp, d_dout, d_inp, d_weight,
                                                              d_mean, d_rstd, N, C);
  NB_CUDA_LAUNCH_CHECK();
  if (d_dweight || d_dbias) {
    nb__ln_bwd_wb<<<(C + 255) / 256, 256, 0, (cudaStream_t)stream>>>(d_dweight, d_dbias, d_dout,
                                                                     d_inp, d_mean, d_rstd, N, C);
    NB_CUDA_LAUNCH_CHECK();
  }
  return NB_OK;
}
