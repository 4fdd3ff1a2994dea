/* Allocation helpers. Thin on purpose: the point is uniform status codes and overflow checks. */
#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

static nb_status_t nb__nomem(size_t n, size_t size, const char* what) {
  return nb_error(NB_ERR_NOMEM, "cannot allocate %zu x %zu bytes for %s", n, size,
                  what ? what : "?");
}

nb_status_t nb_alloc(void** out, size_t n, size_t size, const char* what) {
  size_t bytes;
  *out = NULL;
  if (nb_mul_overflow(n, size, &bytes)) return nb__nomem(n, size, what);
  void* p = malloc(bytes ? bytes : 1);
  if (!p) return nb__nomem(n, size, what);
  *out = p;
  return NB_OK;
}

nb_status_t nb_calloc(void** out, size_t n, size_t size, const char* what) {
  *out = NULL;
  void* p = calloc(n ? n : 1, size ? size : 1);
  if (!p) return nb__nomem(n, size, what);
  *out = p;
  return NB_OK;
}

nb_status_t nb_aligned_alloc(void** out, size_t n, size_t size, const char* what) {
  size_t bytes;
  *out = NULL;
  if (nb_mul_overflow(n, size, &bytes) || nb_add_overflow(bytes, NB_ALIGN - 1, &bytes))
    return nb__nomem(n, size, what);
  bytes &= ~(size_t)(NB_ALIGN - 1);
  void* p = NULL;
  if (posix_memalign(&p, NB_ALIGN, bytes ? bytes : NB_ALIGN) != 0) return nb__nomem(n, size, what);
  *out = p;
  return NB_OK;
}

nb_status_t nb_realloc(void** p, size_t n, size_t size, const char* what) {
  size_t bytes;
  if (nb_mul_overflow(n, size, &bytes)) return nb__nomem(n, size, what);
  void* q = realloc(*p, bytes ? bytes : 1);
  if (!q) return nb__nomem(n, size, what);
  *p = q;
  return NB_OK;
}

void nb_free(void* p) {
  free(p);
}
