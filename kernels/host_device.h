/* NB_HD marks a function defined in a header for both the host and CUDA device code (inline for
 * nvcc, static inline in C), so that a CPU reference and its kernel share one scalar definition
 * and produce identical bits; with the fp32 bit casts those definitions use. */
#ifndef NB_KERNELS_HOST_DEVICE_H
#define NB_KERNELS_HOST_DEVICE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define NB_HD __host__ __device__ __forceinline__
#else
#define NB_HD static inline
#endif

/* The bits of an fp32 value, and the value of fp32 bits (memcpy is the defined way to
 * reinterpret them; compilers turn it into a register move). */
NB_HD uint32_t nb_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
NB_HD float nb_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
