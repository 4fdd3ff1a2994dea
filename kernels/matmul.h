/* Dense layer y = x W^T + b and its backward, through OpenBLAS cblas_sgemm on the CPU and cuBLAS
 * on the GPU. Not a general GEMM wrapper: row-major activations (N, C) and weights (OC, C) only. */
#ifndef NB_KERNELS_MATMUL_H
#define NB_KERNELS_MATMUL_H

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC). bias may be NULL. All borrowed.
 * Thread-safe (no shared state); BLAS may use its own threads. */
void nb_matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC);

/* Accumulating backward: dinp (N, C) += dout @ weight; dweight (OC, C) += dout^T @ inp;
 * dbias (OC) += column sums of dout. Any of dinp / dweight / dbias may be NULL (skipped, e.g. for
 * frozen weights). */
void nb_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC);

/* The backward's halves, each writing its result (accumulate 0: as if the output were zeroed
 * first, without a pass to zero it) or adding to it (accumulate 1, as nb_matmul_backward), so a
 * caller may split a product over threads: dinp (N, C) = / += dout @ weight, and dweight (OC, C)
 * = / += dout^T @ inp with dbias (OC) = / += the column sums of dout (either may be NULL). A
 * caller splitting N sums the partial weight products of its ranges itself; the bits agree with
 * the whole product to rounding (the BLAS's kernels depend on a block's size). */
void nb_matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                              int OC, int accumulate);
void nb_matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               int N, int C, int OC, int accumulate);

/* The CPU BLAS's own thread count for the products (OpenBLAS's openblas_set_num_threads): sets it
 * to n >= 1 and returns the count before, or 0 (nothing set) when the BLAS has no such control.
 * Process-wide: a caller that runs the products on its own threads sets 1 and restores after. */
int nb_matmul_cpu_threads(int n);

/* CUDA versions on device pointers (d_*), same semantics, launched on `stream` (cudaStream_t or
 * NULL for the default stream). NB_ERR_UNSUPPORTED in builds without CUDA; NB_ERR_CUDA on a
 * cuBLAS / launch failure. Not thread-safe: one process-wide cuBLAS handle. */
nb_status_t nb_matmul_forward_cuda(float* d_out, const float* d_inp, const float* d_weight,
                                   const float* d_bias, int N, int C, int OC, void* stream);
nb_status_t nb_matmul_backward_cuda(float* d_dinp, float* d_dweight, float* d_dbias,
                                    const float* d_dout, const float* d_inp, const float* d_weight,
                                    int N, int C, int OC, void* stream);

#ifdef __cplusplus
}
#endif
#endif
