/* cuBLAS for .cu files: the one process-wide handle (matmul.cu holds it; attention.cu borrows
 * it) and NB_CUBLAS_CHECK(call), which returns NB_ERR_CUDA with the cuBLAS status as detail. */
#ifndef NB_KERNELS_CUBLAS_CHECK_H
#define NB_KERNELS_CUBLAS_CHECK_H

#include <cublas_v2.h>

#include "kernels/cuda_check.h"

#define NB_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                          \
    cublasStatus_t nb__s = (call);                                                              \
    if (nb__s != CUBLAS_STATUS_SUCCESS)                                                         \
      return nb_error(NB_ERR_CUDA, "%s: cuBLAS status %d (%s:%d)", #call, (int)nb__s, __FILE__, \
                      __LINE__);                                                                \
  } while (0)

/* Borrow the shared handle bound to `stream`. Not thread-safe. */
extern "C" nb_status_t nb__cublas_get(void* stream, cublasHandle_t* out);

#endif
