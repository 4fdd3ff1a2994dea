/* Byte-file data source: one buffer, xoshiro-drawn window starts. */
#include "train/bytedata.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "train/model.h"
#include "train/rng.h"

struct nb_bytedata {
  uint8_t* buf;
  size_t len;
  nb_rng_t rng;
};

nb_status_t nb_bytedata_from_memory(const void* data, size_t len, uint64_t seed,
                                    nb_bytedata_t** out) {
  *out = NULL;
  if (len < 2) return nb_error(NB_ERR_INVALID, "byte data: %zu bytes, need at least 2", len);
  nb_bytedata_t* d = NULL;
  NB_CHECK(nb_calloc((void**)&d, 1, sizeof *d, "byte data"));
  nb_status_t st = nb_alloc((void**)&d->buf, len, 1, "byte data buffer");
  if (st != NB_OK) {
    nb_free(d);
    return st;
  }
  memcpy(d->buf, data, len);
  d->len = len;
  nb_rng_seed(&d->rng, seed);
  *out = d;
  return NB_OK;
}

nb_status_t nb_bytedata_open(const char* path, uint64_t seed, nb_bytedata_t** out) {
  *out = NULL;
  FILE* f = fopen(path, "rb");
  if (!f) return nb_error(NB_ERR_IO, "byte data: cannot open %s: %s", path, strerror(errno));
  nb_status_t st = NB_OK;
  void* buf = NULL;
  long len = -1;
  if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
  if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
    st = nb_error(NB_ERR_IO, "byte data: cannot size %s: %s", path, strerror(errno));
    goto done;
  }
  NB_CHECK_GOTO(nb_alloc(&buf, (size_t)len + 1, 1, "byte data file"), st, done);
  if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
    st = nb_error(NB_ERR_IO, "byte data: short read on %s", path);
    goto done;
  }
  st = nb_bytedata_from_memory(buf, (size_t)len, seed, out);
  if (st != NB_OK) st = nb_error_wrap(st, "%s", path);
done:
  nb_free(buf);
  fclose(f);
  return st;
}

void nb_bytedata_destroy(nb_bytedata_t* d) {
  if (!d) return;
  nb_free(d->buf);
  nb_free(d);
}

size_t nb_bytedata_size(const nb_bytedata_t* d) {
  return d->len;
}

void nb_bytedata_batch(nb_bytedata_t* d, int B, int T, int* tokens, int* targets) {
  size_t need = (size_t)T + 1;
  for (int b = 0; b < B; b++) {
    size_t start = d->len > need ? (size_t)nb_rng_below(&d->rng, d->len - need + 1) : 0;
    for (int t = 0; t < T; t++) {
      size_t i = start + (size_t)t;
      tokens[b * T + t] = i < d->len ? d->buf[i] : NB_TOKEN_PAD;
      targets[b * T + t] = i + 1 < d->len ? d->buf[i + 1] : -1;
    }
  }
}
