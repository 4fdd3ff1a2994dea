/* The CUDA compression kernels against their CPU references, bit for bit: top-k (with ties),
 * error feedback, int8/fp16/bf16 quantization and inverse. Exits 77 (CTest: skipped) when the
 * build has no CUDA or the machine has no device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#ifdef NB_HAVE_CUDA
#include <cuda_runtime.h>

static uint64_t rng_state = 777;
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static void fill(float* x, size_t n, int ties) {
  for (size_t i = 0; i < n; i++) {
    if (ties)
      x[i] = (float)((int)(rng() % 7) - 3);
    else
      x[i] = (float)((double)(int64_t)rng() * 0x1.0p-63 * ldexp(1.0, (int)(rng() % 20) - 10));
  }
}

static void* dev_copy(const void* h, size_t bytes) {
  void* d = NULL;
  assert_int_equal(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess);
  if (h && bytes) assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
static void host_copy(void* h, const void* d, size_t bytes) {
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  if (bytes) assert_int_equal(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

static void test_topk_gpu(void** state) {
  (void)state;
  const size_t ns[] = {1, 1000, 65536, 1000003, 1u << 24};
  for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
    size_t n = ns[a];
    float* x = malloc(n * 4);
    uint32_t *want = malloc(n * 4), *got = malloc(n * 4);
    assert_true(x && want && got);
    for (int ties = 0; ties < 2; ties++) {
      fill(x, n, ties);
      float* d_x = dev_copy(x, n * 4);
      uint32_t* d_idx = dev_copy(NULL, n * 4);
      const double dens[] = {0.0, 0.001, 0.01, 0.3, 1.0};
      for (size_t d = 0; d < sizeof dens / sizeof dens[0]; d++) {
        size_t k = (size_t)(dens[d] * (double)n);
        assert_int_equal(nb_topk(x, n, k, want), NB_OK);
        assert_int_equal(nb_topk_cuda(d_x, n, k, d_idx, NULL), NB_OK);
        host_copy(got, d_idx, k * 4);
        for (size_t j = 0; j < k; j++)
          if (got[j] != want[j])
            fail_msg("top-k n=%zu k=%zu ties=%d: [%zu] cuda %u cpu %u", n, k, ties, j, got[j],
                     want[j]);
      }
      cudaFree(d_x);
      cudaFree(d_idx);
    }
    free(x);
    free(want);
    free(got);
  }
}

static void test_quantize_gpu(void** state) {
  (void)state;
  size_t n = 1000003;
  uint32_t block = 256;
  size_t nb = (n + block - 1) / block;
  float *x = malloc(n * 4), *y = malloc(n * 4), *y2 = malloc(n * 4), *s = malloc(nb * 4),
        *s2 = malloc(nb * 4);
  int8_t *q = malloc(n), *q2 = malloc(n);
  uint16_t *h = malloc(n * 2), *h2 = malloc(n * 2);
  assert_true(x && y && y2 && s && s2 && q && q2 && h && h2);
  fill(x, n, 0);
  x[7] = 1e9f; /* saturation in fp16 */
  float* d_x = dev_copy(x, n * 4);
  float* d_y = dev_copy(NULL, n * 4);
  float* d_s = dev_copy(NULL, nb * 4);
  int8_t* d_q = dev_copy(NULL, n);
  uint16_t* d_h = dev_copy(NULL, n * 2);

  assert_int_equal(nb_quantize_int8_block(x, n, block, q, s), NB_OK);
  nb_dequantize_int8_block(q, s, n, block, y);
  assert_int_equal(nb_quantize_int8_block_cuda(d_x, n, block, d_q, d_s, NULL), NB_OK);
  assert_int_equal(nb_dequantize_int8_block_cuda(d_q, d_s, n, block, d_y, NULL), NB_OK);
  host_copy(q2, d_q, n);
  host_copy(s2, d_s, nb * 4);
  host_copy(y2, d_y, n * 4);
  assert_memory_equal(q, q2, n);
  assert_memory_equal(s, s2, nb * 4);
  assert_memory_equal(y, y2, n * 4);

  for (int bf = 0; bf < 2; bf++) {
    if (bf)
      nb_quantize_bf16(x, n, h), nb_dequantize_bf16(h, n, y);
    else
      nb_quantize_fp16(x, n, h), nb_dequantize_fp16(h, n, y);
    assert_int_equal(
        bf ? nb_quantize_bf16_cuda(d_x, n, d_h, NULL) : nb_quantize_fp16_cuda(d_x, n, d_h, NULL),
        NB_OK);
    assert_int_equal(bf ? nb_dequantize_bf16_cuda(d_h, n, d_y, NULL)
                        : nb_dequantize_fp16_cuda(d_h, n, d_y, NULL),
                     NB_OK);
    host_copy(h2, d_h, n * 2);
    host_copy(y2, d_y, n * 4);
    assert_memory_equal(h, h2, n * 2);
    assert_memory_equal(y, y2, n * 4);
  }
  cudaFree(d_x);
  cudaFree(d_y);
  cudaFree(d_s);
  cudaFree(d_q);
  cudaFree(d_h);
  free(x), free(y), free(y2), free(s), free(s2), free(q), free(q2), free(h), free(h2);
}

static void test_error_feedback_gpu(void** state) {
  (void)state;
  size_t n = 1u << 20, k = 5000;
  float *r = malloc(n * 4), *u = malloc(n * 4), *r2 = malloc(n * 4), *sent = malloc(k * 4);
  uint32_t* idx = malloc(k * 4);
  assert_true(r && u && r2 && sent && idx);
  fill(r, n, 0);
  fill(u, n, 0);
  for (size_t j = 0; j < k; j++) idx[j] = (uint32_t)(j * 200 + 3), sent[j] = (float)j * 0.25f;
  float* d_r = dev_copy(r, n * 4);
  float* d_u = dev_copy(u, n * 4);
  float* d_s = dev_copy(sent, k * 4);
  uint32_t* d_i = dev_copy(idx, k * 4);
  nb_ef_accumulate(r, u, n);
  nb_ef_subtract_sent(r, idx, sent, k);
  assert_int_equal(nb_ef_accumulate_cuda(d_r, d_u, n, NULL), NB_OK);
  assert_int_equal(nb_ef_subtract_sent_cuda(d_r, d_i, d_s, k, NULL), NB_OK);
  host_copy(r2, d_r, n * 4);
  assert_memory_equal(r, r2, n * 4);
  cudaFree(d_r), cudaFree(d_u), cudaFree(d_s), cudaFree(d_i);
  free(r), free(u), free(r2), free(sent), free(idx);
}
#endif

int main(void) {
  if (!nb_device_built_with_cuda() || nb_device_count() == 0) {
    printf("no CUDA device: skipping the CUDA kernel tests\n");
    return NB_TEST_SKIP_CODE;
  }
#ifdef NB_HAVE_CUDA
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_topk_gpu),
      cmocka_unit_test(test_quantize_gpu),
      cmocka_unit_test(test_error_feedback_gpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
#else
  return NB_TEST_SKIP_CODE;
#endif
}
