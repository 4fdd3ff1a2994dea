/* Allocation helpers: status-returning, overflow-checked, cache-line aligned where asked.
 * Memory from nb_alloc, nb_calloc and nb_aligned_alloc is released with nb_free. */
#ifndef NB_COMMON_ALLOC_H
#define NB_COMMON_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_ALIGN 64

/* *out = malloc(n * size); NB_ERR_NOMEM on failure or overflow (message names `what`). */
nb_status_t nb_alloc(void** out, size_t n, size_t size, const char* what);
/* Zeroed. */
nb_status_t nb_calloc(void** out, size_t n, size_t size, const char* what);
/* NB_ALIGN-byte aligned (for vectors fed to SIMD loops and DMA). */
nb_status_t nb_aligned_alloc(void** out, size_t n, size_t size, const char* what);
/* Grows *p to hold n elements of size bytes; *p is unchanged on failure. */
nb_status_t nb_realloc(void** p, size_t n, size_t size, const char* what);
/* Accepts NULL. */
void nb_free(void* p);

/* a*b without overflow: returns 0 and sets *out, or returns 1 on overflow. */
static inline int nb_mul_overflow(size_t a, size_t b, size_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
static inline int nb_add_overflow(size_t a, size_t b, size_t* out) {
  return __builtin_add_overflow(a, b, out);
}

/* An allocation handed from one owner to the next with its length (released with nb_free). */
typedef struct {
  uint8_t* data;
  size_t len;
} nb_bytes_t;

#define NB_ALLOC(ptr, n, what) nb_alloc((void**)&(ptr), (n), sizeof(*(ptr)), (what))
#define NB_CALLOC(ptr, n, what) nb_calloc((void**)&(ptr), (n), sizeof(*(ptr)), (what))

#ifdef __cplusplus
}
#endif
#endif
