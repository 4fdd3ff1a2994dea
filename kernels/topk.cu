// CUDA exact top-k (see topk.h): four 8-bit radix passes find the exact k-th magnitude key T and
// how many ties at T to keep; then an order-preserving compaction writes the winning indices in
// ascending order (ties kept by lower index, like the CPU reference). No sort anywhere.
#include "kernels/cuda_check.h"
#include "kernels/topk.h"

namespace {

constexpr int kTile = 256;  // one element per thread; 8 warps

__global__ void nb__topk_hist(const float* x, size_t n, uint32_t prefix, int shift,
                              unsigned* hist) {
  __shared__ unsigned sh[256];
  sh[threadIdx.x] = 0;
  __syncthreads();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t key = nb_topk_key(x[i]);
    if (((uint64_t)key >> (shift + 8)) == prefix) atomicAdd(&sh[(key >> shift) & 255u], 1u);
  }
  __syncthreads();
  if (sh[threadIdx.x]) atomicAdd(&hist[threadIdx.x], sh[threadIdx.x]);
}

// Exclusive prefix of `flag` over the 256 threads of the block; *total gets the block's count.
__device__ unsigned nb__tile_scan(bool flag, unsigned* total) {
  __shared__ unsigned wsum[kTile / 32], wpre[kTile / 32 + 1];
  unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) wsum[warp] = __popc(ballot);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned s = 0;
    for (int w = 0; w < kTile / 32; w++) {
      wpre[w] = s;
      s += wsum[w];
    }
    wpre[kTile / 32] = s;
  }
  __syncthreads();
  unsigned r = wpre[warp] + __popc(ballot & ((1u << lane) - 1u));
  *total = wpre[kTile / 32];
  __syncthreads();
  return r;
}

// mode 0: count ties (key == T) per tile. mode 1: count selected per tile. mode 2: write.
__global__ void nb__topk_tiles(const float* x, size_t n, uint32_t T, uint32_t need, int mode,
                               const unsigned* tie_off, const unsigned* sel_off, unsigned* cnt,
                               uint32_t* out) {
  size_t i = blockIdx.x * (size_t)kTile + threadIdx.x;
  uint32_t key = i < n ? nb_topk_key(x[i]) : 0u;
  bool valid = i < n;
  unsigned total;
  bool tie = valid && key == T;
  if (mode == 0) {
    nb__tile_scan(tie, &total);
    if (threadIdx.x == 0) cnt[blockIdx.x] = total;
    return;
  }
  unsigned tie_rank = tie_off[blockIdx.x] + nb__tile_scan(tie, &total);
  bool sel = valid && (key > T || (tie && tie_rank < need));
  unsigned pos = nb__tile_scan(sel, &total);
  if (mode == 1) {
    if (threadIdx.x == 0) cnt[blockIdx.x] = total;
    return;
  }
  if (sel) out[sel_off[blockIdx.x] + pos] = (uint32_t)i;
}

// Exclusive scan of cnt[0..m) into off[0..m) with one block of 1024 threads.
__global__ void nb__topk_scan(const unsigned* cnt, size_t m, unsigned* off) {
  __shared__ unsigned part[1024];
  size_t per = (m + 1023) / 1024, b = threadIdx.x * per, e = b + per < m ? b + per : m;
  unsigned s = 0;
  for (size_t j = b; j < e; j++) s += cnt[j];
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned acc = 0;
    for (int t = 0; t < 1024; t++) {
      unsigned v = part[t];
      part[t] = acc;
      acc += v;
    }
  }
  __syncthreads();
  s = part[threadIdx.x];
  for (size_t j = b; j < e; j++) {
    off[j] = s;
    s += cnt[j];
  }
}

__global__ void nb__topk_iota(uint32_t* out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = (uint32_t)i;
}

}  // namespace

extern "C" nb_status_t nb_topk_cuda(const float* d_x, size_t n, size_t k, uint32_t* d_idx,
                                    void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
  if (n > UINT32_MAX) return nb_error(NB_ERR_INVALID, "top-k: n (%zu) > UINT32_MAX", n);
  if (k > n) k = n;
  if (k == 0) return NB_OK;
  size_t grid = (n + 255) / 256;
  unsigned g = grid > 65535 * 8 ? 65535 * 8 : (unsigned)grid;
  if (k == n) {
    nb__topk_iota<<<g, 256, 0, s>>>(d_idx, n);
    NB_CUDA_LAUNCH_CHECK();
    return NB_OK;
  }
  size_t tiles = (n + kTile - 1) / kTile;
  unsigned* d_buf = NULL;  // hist[256] | cnt[tiles] | tie_off[tiles] | sel_off[tiles]
  NB_CUDA_CHECK(cudaMallocAsync((void**)&d_buf, (256 + 3 * tiles) * sizeof(unsigned), s));
  unsigned *d_hist = d_buf, *d_cnt = d_buf + 256, *d_tie = d_cnt + tiles, *d_sel = d_tie + tiles;
  nb_status_t st = NB_OK;
  unsigned h[256];
  uint32_t prefix = 0;
  size_t need = k;  // how many more winners are needed at or below the current prefix
  cudaError_t e = cudaSuccess;
  for (int shift = 24; shift >= 0 && e == cudaSuccess; shift -= 8) {
    e = cudaMemsetAsync(d_hist, 0, 256 * sizeof(unsigned), s);
    if (e != cudaSuccess) break;
    nb__topk_hist<<<g, 256, 0, s>>>(d_x, n, prefix, shift, d_hist);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(h, d_hist, sizeof h, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) break;
    int d = 255;
    for (; d > 0; d--) {
      if (h[d] >= need) break;
      need -= h[d];
    }
    prefix = (prefix << 8) | (uint32_t)d;
  }
  if (e == cudaSuccess) {
    uint32_t T = prefix;
    unsigned tg = (unsigned)tiles;
    nb__topk_tiles<<<tg, kTile, 0, s>>>(d_x, n, T, (uint32_t)need, 0, NULL, NULL, d_cnt, NULL);
    nb__topk_scan<<<1, 1024, 0, s>>>(d_cnt, tiles, d_tie);
    nb__topk_tiles<<<tg, kTile, 0, s>>>(d_x, n, T, (uint32_t)need, 1, d_tie, NULL, d_cnt, NULL);
    nb__topk_scan<<<1, 1024, 0, s>>>(d_cnt, tiles, d_sel);
    nb__topk_tiles<<<tg, kTile, 0, s>>>(d_x, n, T, (uint32_t)need, 2, d_tie, d_sel, d_cnt, d_idx);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    st = nb_error(NB_ERR_CUDA, "top-k: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
  cudaError_t fe = cudaFreeAsync(d_buf, s);
  if (st == NB_OK && fe != cudaSuccess)
    st = nb_error(NB_ERR_CUDA, "top-k: cudaFreeAsync: %s", cudaGetErrorString(fe));
  return st;
}
