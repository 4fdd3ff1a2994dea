/* Exact top-k by magnitude with a deterministic order: element i ranks before j when |x_i| > |x_j|,
 * or when they are equal and i < j (NaN ranks above infinity). The result is the k winning
 * indices in ascending order. CPU reference (topk.c): a threshold estimated from a random sample,
 * one pass collecting the candidates at or above it, then an exact selection among the candidates
 * (quickselect on packed key/index pairs) — never a full sort. CUDA (topk.cu): radix select of the
 * exact k-th key, then an order-preserving compaction. Indices are 32-bit: n <= UINT32_MAX.
 * Not a sort or partial-sort utility: the winners come back in index order, not by size. */
#ifndef NB_KERNELS_TOPK_H
#define NB_KERNELS_TOPK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/status.h"
#include "kernels/host_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* |x| as an integer with the same order as the magnitude (NaN largest). */
NB_HD uint32_t nb_topk_key(float x) {
  return nb_f32_bits(x) & 0x7fffffffu;
}

/* Key and index packed so that a larger packed value ranks first: key high, ~index low. */
NB_HD uint64_t nb_topk_pack(uint32_t key, uint32_t idx) {
  return ((uint64_t)key << 32) | (uint64_t)(uint32_t)~idx;
}
NB_HD uint32_t nb_topk_unpack_index(uint64_t packed) {
  return ~(uint32_t)packed;
}

/* The k-th largest of a[0..m) (1 <= k <= m); reorders a. Introselect: expected O(m), falls back
 * to sorting the remaining range when partitioning degenerates. */
uint64_t nb_topk_kth_largest(uint64_t* a, size_t m, size_t k);

/* A key threshold from a sample: given s packed sample values (reordered), returns the key t such
 * that about `fraction` of the population plus a 4-sigma margin has key >= t. Returns 0 (take
 * everything) when the wanted rank reaches the sample size. */
uint32_t nb_topk_sample_threshold(uint64_t* sample, size_t s, double fraction);

/* Exact top-k of x[0..n) into idx[0..k) in ascending index order (see the order above).
 * k > n is clamped to n. Allocates scratch of about 3k packed values; single-threaded.
 * NB_ERR_INVALID when n > UINT32_MAX, NB_ERR_NOMEM when scratch cannot be allocated.
 * Borrowed pointers; thread-safe. */
nb_status_t nb_topk(const float* x, size_t n, size_t k, uint32_t* idx);

/* CUDA version: same result as nb_topk for the same input (including ties). d_x and d_idx are
 * device pointers, `stream` a cudaStream_t (NULL = default). Synchronizes with the stream a few
 * times (radix passes) and allocates stream-ordered scratch. NB_ERR_CUDA on CUDA failures,
 * NB_ERR_INVALID for n > UINT32_MAX, NB_ERR_UNSUPPORTED without CUDA in the build. */
nb_status_t nb_topk_cuda(const float* d_x, size_t n, size_t k, uint32_t* d_idx, void* stream);

#ifdef __cplusplus
}
#endif
#endif
