/* CUDA error conversion for .cu files: NB_CUDA_CHECK(call) returns NB_ERR_CUDA with the CUDA
 * error text as the detail; NB_CUDA_LAUNCH_CHECK() follows every kernel launch. */
#ifndef NB_KERNELS_CUDA_CHECK_H
#define NB_KERNELS_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "common/status.h"

#define NB_CUDA_CHECK(call)                                                                      \
  do {                                                                                           \
    cudaError_t nb__e = (call);                                                                  \
    if (nb__e != cudaSuccess)                                                                    \
      return nb_error(NB_ERR_CUDA, "%s: %s (%s:%d)", #call, cudaGetErrorString(nb__e), __FILE__, \
                      __LINE__);                                                                 \
  } while (0)

#define NB_CUDA_LAUNCH_CHECK() NB_CUDA_CHECK(cudaGetLastError())

#endif
