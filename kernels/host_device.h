/* NB_HD marks a function defined in a header for both the host and CUDA device code (inline for
 * nvcc, static inline in C), so that a CPU reference and its kernel share one scalar definition
 * and produce identical bits. */
#ifndef NB_KERNELS_HOST_DEVICE_H
#define NB_KERNELS_HOST_DEVICE_H

#ifdef __CUDACC__
#define NB_HD __host__ __device__ __forceinline__
#else
#define NB_HD static inline
#endif

#endif
