/* CPU reference of exact top-k (see topk.h): sample → threshold → candidate pass → quickselect
 * on the candidates → ordered filter. The codec runs the candidate pass fused and threaded and
 * reuses the selection pieces; this file stays single-threaded and readable. */
#include "kernels/topk.h"

#include <math.h>
#include <stdlib.h>

#include "common/alloc.h"

static int nb__cmp_u64_desc(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return (x < y) - (x > y);
}

uint64_t nb_topk_kth_largest(uint64_t* a, size_t m, size_t k) {
  ptrdiff_t lo = 0, hi = (ptrdiff_t)m - 1, target = (ptrdiff_t)k - 1;
  int budget = 128;
  while (lo < hi) {
    if (budget-- == 0) {
      qsort(a + lo, (size_t)(hi - lo + 1), sizeof *a, nb__cmp_u64_desc);
      return a[target];
    }
    ptrdiff_t mid = lo + (hi - lo) / 2;
    uint64_t x = a[lo], y = a[mid], z = a[hi], pivot;
    if (x < y)
      pivot = y < z ? y : (x < z ? z : x);
    else
      pivot = x < z ? x : (y < z ? z : y);
    ptrdiff_t i = lo, j = hi;
    while (i <= j) { /* descending Hoare partition */
      while (a[i] > pivot) i++;
      while (a[j] < pivot) j--;
      if (i <= j) {
        uint64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
        i++;
        j--;
      }
    }
    if (target <= j)
      hi = j;
    else if (target >= i)
      lo = i;
    else
      return a[target]; /* between j and i every value equals the pivot */
  }
  return a[target];
}

uint32_t nb_topk_sample_threshold(uint64_t* sample, size_t s, double fraction) {
  if (s == 0) return 0;
  double mean = fraction * (double)s;
  double rank = ceil(mean + 4.0 * sqrt(mean) + 2.0);
  if (!(rank < (double)s)) return 0;
  return (uint32_t)(nb_topk_kth_largest(sample, s, (size_t)rank) >> 32);
}

static uint64_t nb__splitmix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

nb_status_t nb_topk(const float* x, size_t n, size_t k, uint32_t* idx) {
  if (n > UINT32_MAX) return nb_error(NB_ERR_INVALID, "top-k: n (%zu) > UINT32_MAX", n);
  if (k > n) k = n;
  if (k == 0) return NB_OK;
  if (k == n) {
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    return NB_OK;
  }
  nb_status_t st = NB_OK;
  size_t s = n < 16384 ? n : 16384, cap = 0, m = 0;
  uint64_t *sample = NULL, *cand = NULL, *work = NULL;
  NB_CHECK_GOTO(NB_ALLOC(sample, s, "top-k sample"), st, done);
  uint64_t seed = 0x6e6562756c61ull ^ n;
  double fraction = 1.15 * (double)k / (double)n;
  for (size_t j = 0; j < s; j++) {
    uint32_t i = (uint32_t)(nb__splitmix(&seed) % n);
    sample[j] = nb_topk_pack(nb_topk_key(x[i]), (uint32_t)j);
  }
  uint32_t t = n <= s ? 0 : nb_topk_sample_threshold(sample, s, fraction);
  for (;;) {
    m = 0;
    for (size_t i = 0; i < n; i++) {
      uint32_t key = nb_topk_key(x[i]);
      if (key < t) continue;
      if (m == cap) {
        size_t ncap = cap ? 2 * cap : k + k / 2 + 64;
        NB_CHECK_GOTO(nb_realloc((void**)&cand, ncap, sizeof *cand, "top-k candidates"), st, done);
        cap = ncap;
      }
      cand[m++] = nb_topk_pack(key, (uint32_t)i);
    }
    if (m >= k) break;
    uint32_t t_old = t;
    do { /* the sample overestimated the threshold: lower it (or take everything), scan again */
      fraction *= 4.0;
      t = fraction >= 1.0 ? 0 : nb_topk_sample_threshold(sample, s, fraction);
    } while (t >= t_old && t != 0);
  }
  NB_CHECK_GOTO(NB_ALLOC(work, m, "top-k selection"), st, done);
  memcpy(work, cand, m * sizeof *cand);
  uint64_t kth = nb_topk_kth_largest(work, m, k);
  size_t o = 0;
  for (size_t j = 0; j < m; j++)
    if (cand[j] >= kth) idx[o++] = nb_topk_unpack_index(cand[j]);
  if (o != k) st = nb_error(NB_ERR_INTERNAL, "top-k: selected %zu of %zu", o, k);
done:
  nb_free(sample);
  nb_free(cand);
  nb_free(work);
  return st;
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_topk_cuda(const float* d_x, size_t n, size_t k, uint32_t* d_idx, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "%s: built without CUDA", __func__);
}
#endif
