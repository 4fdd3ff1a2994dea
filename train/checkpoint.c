/* safetensors reader/writer with strict validation. The whole file is read into memory and every
 * structural rule is checked before any tensor is exposed; the data section's SHA-256 (OpenSSL
 * EVP) is stored in __metadata__ and verified on load. No mmap, no lazy loading. */
#include "train/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c writes host floats as little-endian F32: big-endian hosts need byte swaps"
#endif

#define NB__FORMAT "nebula-ckpt-1"

typedef struct {
  char* name;
  int ndim;
  int64_t shape[4];
  size_t begin, end; /* within the data section */
} nb__entry_t;

struct nb_ckpt {
  uint8_t* buf; /* whole file */
  size_t len;
  const uint8_t* data; /* data section */
  size_t data_len;
  nb__entry_t* t;
  size_t n;
  json_t* meta; /* object of strings (owned reference) */
};

/* ---------------------------------------------------------------- hashing */

static nb_status_t nb__sha256_hex(const void* const* parts, const size_t* lens, size_t n,
                                  char hex[65]) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  unsigned char md[32];
  unsigned int mdlen = 0;
  int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
  for (size_t i = 0; ok && i < n; i++) ok = EVP_DigestUpdate(ctx, parts[i], lens[i]) == 1;
  ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == 32;
  EVP_MD_CTX_free(ctx);
  if (!ok) return nb_error(NB_ERR_CRYPTO, "checkpoint: SHA-256 failed (OpenSSL EVP)");
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
  return NB_OK;
}

/* ---------------------------------------------------------------- writing */

static nb_status_t nb__write_all(int fd, const void* p, size_t n, const char* path) {
  const uint8_t* b = p;
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return nb_error(NB_ERR_IO, "checkpoint: write %s: %s", path, strerror(errno));
    }
    b += w;
    n -= (size_t)w;
  }
  return NB_OK;
}

nb_status_t nb_checkpoint_write(const char* path, const nb_ckpt_tensor_t* tensors, size_t n,
                                const char* const* meta, size_t n_meta) {
  nb_status_t st = NB_OK;
  json_t* hdr = json_object();
  json_t* md = json_object();
  char* text = NULL;
  char* tmp = NULL;
  char* dircopy = NULL;
  const void** parts = NULL;
  size_t* lens = NULL;
  int fd = -1;
  if (!hdr || !md) {
    st = nb_error(NB_ERR_NOMEM, "checkpoint: JSON allocation");
    goto done;
  }
  NB_CHECK_GOTO(nb_calloc((void**)&parts, n + 1, sizeof *parts, "checkpoint parts"), st, done);
  NB_CHECK_GOTO(nb_calloc((void**)&lens, n + 1, sizeof *lens, "checkpoint parts"), st, done);
  for (size_t i = 0; i < n_meta; i++) {
    const char *k = meta[2 * i], *v = meta[2 * i + 1];
    if (!k || !v || strcmp(k, "format") == 0 || strcmp(k, "sha256") == 0) {
      st = nb_error(NB_ERR_INVALID, "checkpoint: metadata key %zu is NULL or reserved", i);
      goto done;
    }
    if (json_object_set_new(md, k, json_string(v)) != 0) {
      st = nb_error(NB_ERR_INVALID, "checkpoint: metadata key %zu or its value is not UTF-8", i);
      goto done;
    }
  }
  json_object_set_new(md, "format", json_string(NB__FORMAT));
  json_object_set_new(hdr, "__metadata__", md);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const nb_ckpt_tensor_t* t = &tensors[i];
    if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0 || t->ndim < 0 ||
        t->ndim > 4 || json_object_get(hdr, t->name)) {
      st = nb_error(NB_ERR_INVALID, "checkpoint: tensor %zu (%s): bad or duplicate name or ndim %d",
                    i, t->name ? t->name : "NULL", t->ndim);
      goto done;
    }
    size_t numel = 1;
    json_t* shape = json_array();
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0 || nb_mul_overflow(numel, (size_t)t->shape[d], &numel)) {
        json_decref(shape);
        st = nb_error(NB_ERR_INVALID, "checkpoint: tensor %s: bad shape", t->name);
        goto done;
      }
      json_array_append_new(shape, json_integer(t->shape[d]));
    }
    if (numel > 0 && !t->data) {
      json_decref(shape);
      st = nb_error(NB_ERR_INVALID, "checkpoint: tensor %s: NULL data", t->name);
      goto done;
    }
    json_t* e = json_object();
    json_object_set_new(e, "dtype", json_string("F32"));
    json_object_set_new(e, "shape", shape);
    json_t* offs = json_array();
    json_array_append_new(offs, json_integer((json_int_t)off));
    json_array_append_new(offs, json_integer((json_int_t)(off + numel * 4)));
    json_object_set_new(e, "data_offsets", offs);
    if (json_object_set_new(hdr, t->name, e) != 0) {
      st = nb_error(NB_ERR_INVALID, "checkpoint: tensor %zu: name is not valid UTF-8", i);
      goto done;
    }
    parts[i] = t->data;
    lens[i] = numel * 4;
    off += numel * 4;
  }
  char hex[65];
  NB_CHECK_GOTO(nb__sha256_hex(parts, lens, n, hex), st, done);
  json_object_set_new(md, "sha256", json_string(hex));
  text = json_dumps(hdr, JSON_COMPACT);
  if (!text) {
    st = nb_error(NB_ERR_NOMEM, "checkpoint: JSON encoding");
    goto done;
  }
  size_t tl = strlen(text), hl = (tl + 7) & ~(size_t)7; /* pad with spaces to 8 bytes */
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)hl >> (8 * i));

  size_t pl = strlen(path);
  NB_CHECK_GOTO(nb_alloc((void**)&tmp, pl + 16, 1, "checkpoint temp path"), st, done);
  snprintf(tmp, pl + 16, "%s.tmp.XXXXXX", path);
  fd = mkstemp(tmp);
  if (fd < 0) {
    st = nb_error(NB_ERR_IO, "checkpoint: cannot create temporary file next to %s: %s", path,
                  strerror(errno));
    goto done;
  }
  static const char spaces[8] = "        ";
  NB_CHECK_GOTO(nb__write_all(fd, lenb, 8, tmp), st, done);
  NB_CHECK_GOTO(nb__write_all(fd, text, tl, tmp), st, done);
  NB_CHECK_GOTO(nb__write_all(fd, spaces, hl - tl, tmp), st, done);
  for (size_t i = 0; i < n; i++) NB_CHECK_GOTO(nb__write_all(fd, parts[i], lens[i], tmp), st, done);
  if (fchmod(fd, 0644) != 0 || fsync(fd) != 0) {
    st = nb_error(NB_ERR_IO, "checkpoint: fsync %s: %s", tmp, strerror(errno));
    goto done;
  }
  if (close(fd) != 0) {
    fd = -1;
    st = nb_error(NB_ERR_IO, "checkpoint: close %s: %s", tmp, strerror(errno));
    goto done;
  }
  fd = -1;
  if (rename(tmp, path) != 0) {
    st = nb_error(NB_ERR_IO, "checkpoint: rename %s -> %s: %s", tmp, path, strerror(errno));
    goto done;
  }
  nb_free(tmp);
  tmp = NULL;
  /* make the rename durable */
  NB_CHECK_GOTO(nb_alloc((void**)&dircopy, pl + 1, 1, "checkpoint dir"), st, done);
  memcpy(dircopy, path, pl + 1);
  int dfd = open(dirname(dircopy), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
done:
  if (fd >= 0) close(fd);
  if (tmp) unlink(tmp);
  nb_free(tmp);
  nb_free(dircopy);
  free(text);
  nb_free(parts);
  nb_free(lens);
  json_decref(hdr);
  return st;
}

/* ---------------------------------------------------------------- reading */

void nb_checkpoint_close(nb_ckpt_t* c) {
  if (!c) return;
  for (size_t i = 0; i < c->n; i++) nb_free(c->t[i].name);
  nb_free(c->t);
  json_decref(c->meta);
  nb_free(c->buf);
  nb_free(c);
}

static int nb__cmp_entry(const void* a, const void* b) {
  const nb__entry_t *x = a, *y = b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}

#define BAD(...) nb_error(NB_ERR_INVALID, __VA_ARGS__)

/* One tensor entry `key` of a checkpoint's header into c->t[c->n]: F32, at most 4 dimensions,
 * data offsets inside the data section that hold exactly the shape's values. */
static nb_status_t nb__parse_entry(nb_ckpt_t* c, const char* what, const char* key, json_t* val) {
  if (!json_is_object(val)) {
    return BAD("checkpoint %s: tensor %s: entry is not an object", what, key);
  }
  json_t* dt = json_object_get(val, "dtype");
  json_t* sh = json_object_get(val, "shape");
  json_t* of = json_object_get(val, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(of)) {
    return BAD("checkpoint %s: tensor %s: needs string dtype, array shape, array data_offsets",
               what, key);
  }
  if (strcmp(json_string_value(dt), "F32") != 0) {
    return BAD("checkpoint %s: tensor %s: unsupported dtype '%s' (only F32)", what, key,
               json_string_value(dt));
  }
  nb__entry_t* e = &c->t[c->n];
  size_t ndim = json_array_size(sh), numel = 1;
  if (ndim > 4) {
    return BAD("checkpoint %s: tensor %s: %zu dimensions (at most 4)", what, key, ndim);
  }
  for (size_t d = 0; d < ndim; d++) {
    json_t* x = json_array_get(sh, d);
    if (!json_is_integer(x) || json_integer_value(x) < 0 ||
        nb_mul_overflow(numel, (size_t)json_integer_value(x), &numel)) {
      return BAD("checkpoint %s: tensor %s: shape[%zu] is not a non-negative integer", what, key,
                 d);
    }
    e->shape[d] = json_integer_value(x);
  }
  e->ndim = (int)ndim;
  json_t* b0 = json_array_get(of, 0);
  json_t* b1 = json_array_get(of, 1);
  if (json_array_size(of) != 2 || !json_is_integer(b0) || !json_is_integer(b1) ||
      json_integer_value(b0) < 0 || json_integer_value(b1) < json_integer_value(b0)) {
    return BAD("checkpoint %s: tensor %s: data_offsets must be [begin, end] with 0 <= begin <= end",
               what, key);
  }
  e->begin = (size_t)json_integer_value(b0);
  e->end = (size_t)json_integer_value(b1);
  if (e->end > c->data_len) {
    return BAD(
        "checkpoint %s: tensor %s: data_offsets [%zu, %zu] out of bounds (data section has "
        "%zu bytes)",
        what, key, e->begin, e->end, c->data_len);
  }
  size_t nbytes;
  if (nb_mul_overflow(numel, 4, &nbytes) || nbytes != e->end - e->begin) {
    return BAD(
        "checkpoint %s: tensor %s: shape holds %zu F32 values but data_offsets span %zu "
        "bytes",
        what, key, numel, e->end - e->begin);
  }
  NB_CHECK(nb_alloc((void**)&e->name, strlen(key) + 1, 1, "tensor name"));
  memcpy(e->name, key, strlen(key) + 1);
  c->n++;
  return NB_OK;
}

/* The tensors' data offsets do not overlap and cover the data section exactly. */
static nb_status_t nb__check_layout(const nb_ckpt_t* c, const char* what) {
  nb_status_t st = NB_OK;
  nb__entry_t* sorted = NULL;
  NB_CHECK_GOTO(nb_alloc((void**)&sorted, c->n ? c->n : 1, sizeof *sorted, "checkpoint sort"), st,
                done);
  memcpy(sorted, c->t, c->n * sizeof *sorted);
  qsort(sorted, c->n, sizeof *sorted, nb__cmp_entry);
  size_t pos = 0;
  for (size_t i = 0; i < c->n; i++) {
    if (sorted[i].begin < pos) {
      st =
          BAD("checkpoint %s: tensor %s overlaps the previous tensor (begins at %zu, previous "
              "ends at %zu)",
              what, sorted[i].name, sorted[i].begin, pos);
      goto done;
    }
    if (sorted[i].begin > pos) {
      st = BAD("checkpoint %s: gap in the data section before tensor %s (%zu..%zu)", what,
               sorted[i].name, pos, sorted[i].begin);
      goto done;
    }
    pos = sorted[i].end;
  }
  if (pos != c->data_len) {
    st = BAD("checkpoint %s: data section has %zu bytes but tensors cover %zu", what, c->data_len,
             pos);
    goto done;
  }
done:
  nb_free(sorted);
  return st;
}

/* The data section hashes to the sha256 of __metadata__. */
static nb_status_t nb__check_sha(const nb_ckpt_t* c, const char* what) {
  const char* want = nb_checkpoint_meta(c, "sha256");
  if (!want) {
    return nb_error(NB_ERR_INTEGRITY, "checkpoint %s: no sha256 in __metadata__", what);
  }
  char hex[65];
  const void* part = c->data;
  size_t plen = c->data_len;
  NB_CHECK(nb__sha256_hex(&part, &plen, 1, hex));
  if (strcmp(hex, want) != 0) {
    return nb_error(NB_ERR_INTEGRITY,
                    "checkpoint %s: checksum mismatch: header says sha256 %.64s, data hashes to %s",
                    what, want, hex);
  }
  return NB_OK;
}

/* Values: a NaN or Inf weight loads fine and then scores as a plausible-looking number (eval
 * printed 99.66 bpb), so no tensor with one is ever exposed. Only the tensor is named; the
 * name is shown with anything outside [A-Za-z0-9._-] as '?', and the value never. */
static nb_status_t nb__check_finite(const nb_ckpt_t* c, const char* what) {
  for (size_t i = 0; i < c->n; i++) {
    const uint8_t* p = c->data + c->t[i].begin;
    size_t nv = (c->t[i].end - c->t[i].begin) / 4;
    for (size_t k = 0; k < nv; k++) {
      float v;
      memcpy(&v, p + 4 * k, sizeof v);
      if (isfinite(v)) continue;
      char name[96];
      size_t j = 0;
      for (const char* q = c->t[i].name; *q && j + 1 < sizeof name; q++, j++) {
        unsigned char ch = (unsigned char)*q;
        name[j] = (ch >= '0' && ch <= '9') || (ch >= 'A' && ch <= 'Z') ||
                          (ch >= 'a' && ch <= 'z') || ch == '.' || ch == '_' || ch == '-'
                      ? (char)ch
                      : '?';
      }
      name[j] = '\0';
      return BAD(
          "checkpoint %s: tensor %s holds a non-finite value (NaN or infinity) at element %zu "
          "of %zu: the weights are corrupt or training diverged; use an earlier checkpoint",
          what, name, k, nv);
    }
  }
  return NB_OK;
}

/* Takes ownership of buf. */
static nb_status_t nb__parse_owned(uint8_t* buf, size_t len, const char* what, nb_ckpt_t** out) {
  nb_status_t st = NB_OK;
  nb_ckpt_t* c = NULL;
  json_t* root = NULL;
  *out = NULL;
  if (nb_calloc((void**)&c, 1, sizeof *c, "checkpoint") != NB_OK) {
    nb_free(buf);
    return NB_ERR_NOMEM;
  }
  c->buf = buf;
  c->len = len;
  if (len < 8) {
    st = BAD("checkpoint %s: truncated: %zu bytes, shorter than the 8-byte header length", what,
             len);
    goto fail;
  }
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
  if (hl < 2 || hl > NB_CKPT_MAX_HEADER || hl > len - 8) {
    /* never the number itself: those are the file's first 8 bytes, whatever the file is */
    st =
        BAD("checkpoint %s: not a safetensors file: header length out of range (the file has %zu "
            "bytes; a header is at most %u)",
            what, len, NB_CKPT_MAX_HEADER);
    goto fail;
  }
  json_error_t jerr;
  root = json_loadb((const char*)buf + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    /* jansson's text quotes the bytes near the error: only the position is given */
    st = BAD("checkpoint %s: not a safetensors file: header is not valid JSON (at byte %d)", what,
             jerr.position);
    goto fail;
  }
  if (!json_is_object(root)) {
    st = BAD("checkpoint %s: header JSON is not an object", what);
    goto fail;
  }
  c->data = buf + 8 + hl;
  c->data_len = len - 8 - (size_t)hl;
  size_t cap = json_object_size(root);
  NB_CHECK_GOTO(nb_calloc((void**)&c->t, cap ? cap : 1, sizeof *c->t, "checkpoint entries"), st,
                fail);
  const char* key;
  json_t* val;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(val)) {
        st = BAD("checkpoint %s: __metadata__ is not an object", what);
        goto fail;
      }
      const char* mk;
      json_t* mv;
      json_object_foreach(val, mk, mv) {
        if (!json_is_string(mv)) {
          st = BAD("checkpoint %s: __metadata__.%s is not a string", what, mk);
          goto fail;
        }
      }
      c->meta = json_incref(val);
      continue;
    }
    NB_CHECK_GOTO(nb__parse_entry(c, what, key, val), st, fail);
  }
  NB_CHECK_GOTO(nb__check_layout(c, what), st, fail);
  NB_CHECK_GOTO(nb__check_sha(c, what), st, fail);
  NB_CHECK_GOTO(nb__check_finite(c, what), st, fail);
  json_decref(root);
  *out = c;
  return NB_OK;
fail:
  json_decref(root);
  nb_checkpoint_close(c);
  return st;
}

nb_status_t nb_checkpoint_parse(const void* buf, size_t len, const char* what, nb_ckpt_t** out) {
  uint8_t* copy = NULL;
  *out = NULL;
  NB_CHECK(nb_alloc((void**)&copy, len ? len : 1, 1, "checkpoint image"));
  if (len) memcpy(copy, buf, len);
  return nb__parse_owned(copy, len, what ? what : "(memory)", out);
}

nb_status_t nb_checkpoint_open(const char* path, nb_ckpt_t** out) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nb_error(NB_ERR_IO, "checkpoint: cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  nb_status_t st = NB_OK;
  uint8_t* buf = NULL;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = nb_error(NB_ERR_IO, "checkpoint: %s is not a readable regular file", path);
    goto fail;
  }
  size_t len = (size_t)sb.st_size, got = 0;
  NB_CHECK_GOTO(nb_alloc((void**)&buf, len ? len : 1, 1, "checkpoint file"), st, fail);
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      st = nb_error(NB_ERR_IO, "checkpoint: read %s: %s", path, r < 0 ? strerror(errno) : "EOF");
      goto fail;
    }
    got += (size_t)r;
  }
  close(fd);
  return nb__parse_owned(buf, len, path, out);
fail:
  close(fd);
  nb_free(buf);
  return st;
}

const char* nb_checkpoint_meta(const nb_ckpt_t* c, const char* key) {
  if (!c->meta) return NULL;
  return json_string_value(json_object_get(c->meta, key));
}

size_t nb_checkpoint_num_tensors(const nb_ckpt_t* c) {
  return c->n;
}

nb_status_t nb_checkpoint_tensor(const nb_ckpt_t* c, size_t i, const char** name, int* ndim,
                                 int64_t shape[4], const void** data, size_t* nbytes) {
  if (i >= c->n) return nb_error(NB_ERR_INVALID, "checkpoint: tensor index %zu >= %zu", i, c->n);
  const nb__entry_t* e = &c->t[i];
  if (name) *name = e->name;
  if (ndim) *ndim = e->ndim;
  if (shape)
    for (int d = 0; d < 4; d++) shape[d] = d < e->ndim ? e->shape[d] : 0;
  if (data) *data = c->data + e->begin;
  if (nbytes) *nbytes = e->end - e->begin;
  return NB_OK;
}

/* ---------------------------------------------------------------- models and adapters */

typedef const nb_tensor_view_t* (*nb__view_fn)(const void* owner, size_t i);
static const nb_tensor_view_t* nb__model_view(const void* m, size_t i) {
  return nb_model_tensor(m, i);
}
static const nb_tensor_view_t* nb__lora_view(const void* l, size_t i) {
  return nb_lora_tensor(l, i);
}

static nb_status_t nb__save_views(const char* path, nb__view_fn view, const void* owner, size_t nv,
                                  const float* arena, const char* const* meta, size_t n_meta) {
  nb_ckpt_tensor_t* t = NULL;
  NB_CHECK(nb_calloc((void**)&t, nv ? nv : 1, sizeof *t, "checkpoint tensors"));
  for (size_t i = 0; i < nv; i++) {
    const nb_tensor_view_t* v = view(owner, i);
    t[i].name = v->name;
    t[i].ndim = v->ndim;
    t[i].shape[0] = v->shape[0];
    t[i].shape[1] = v->shape[1];
    t[i].data = arena + v->offset;
  }
  nb_status_t st = nb_checkpoint_write(path, t, nv, meta, n_meta);
  nb_free(t);
  return st;
}

/* Validates that c holds exactly the views' tensors with their shapes, then copies them. */
static nb_status_t nb__load_views(const nb_ckpt_t* c, const char* path, nb__view_fn view,
                                  const void* owner, size_t nv, float* arena) {
  {
    for (size_t i = 0; i < c->n; i++) {
      size_t j = 0;
      while (j < nv && strcmp(view(owner, j)->name, c->t[i].name) != 0) j++;
      if (j == nv)
        return nb_error(NB_ERR_INVALID, "checkpoint %s: unexpected tensor %s", path, c->t[i].name);
    }
  }
  /* first pass validates everything, second copies: on error the target is untouched */
  for (int pass = 0; pass < 2; pass++)
    for (size_t j = 0; j < nv; j++) {
      const nb_tensor_view_t* v = view(owner, j);
      size_t i = 0;
      while (i < c->n && strcmp(c->t[i].name, v->name) != 0) i++;
      if (i == c->n)
        return nb_error(NB_ERR_INVALID, "checkpoint %s: missing tensor %s", path, v->name);
      const nb__entry_t* e = &c->t[i];
      if (pass == 0) {
        int same = e->ndim == v->ndim;
        for (int d = 0; same && d < v->ndim; d++) same = e->shape[d] == v->shape[d];
        if (!same)
          return nb_error(NB_ERR_INVALID,
                          "checkpoint %s: shape mismatch for %s: file [%" PRId64 ", %" PRId64
                          "] (ndim %d), model [%d, %d] (ndim %d)",
                          path, v->name, e->shape[0], e->shape[1], e->ndim, v->shape[0],
                          v->shape[1], v->ndim);
      } else {
        memcpy(arena + v->offset, c->data + e->begin, v->numel * sizeof(float));
      }
    }
  return NB_OK;
}

static nb_status_t nb__meta_long(const nb_ckpt_t* c, const char* path, const char* key, long* out) {
  const char* s = nb_checkpoint_meta(c, key);
  if (!s) return nb_error(NB_ERR_INVALID, "checkpoint %s: __metadata__ lacks %s", path, key);
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end)
    return nb_error(NB_ERR_INVALID, "checkpoint %s: __metadata__.%s is not an integer", path, key);
  *out = v;
  return NB_OK;
}

static nb_status_t nb__read_config(const nb_ckpt_t* c, const char* path, nb_model_config_t* cfg,
                                   long* step) {
  long v[6];
  static const char* const keys[6] = {"n_layer", "n_embd", "n_head", "ctx", "vocab", "step"};
  for (int i = 0; i < 6; i++) NB_CHECK(nb__meta_long(c, path, keys[i], &v[i]));
  for (int i = 0; i < 5; i++)
    if (v[i] < 0 || v[i] > 1000000)
      return nb_error(NB_ERR_INVALID, "checkpoint %s: %s = %ld out of range", path, keys[i], v[i]);
  cfg->n_layer = (int)v[0];
  cfg->n_embd = (int)v[1];
  cfg->n_head = (int)v[2];
  cfg->ctx = (int)v[3];
  cfg->vocab = (int)v[4];
  if (step) *step = v[5];
  nb_status_t st = nb_model_config_check(cfg);
  return st == NB_OK ? NB_OK : nb_error_wrap(st, "checkpoint %s", path);
}

nb_status_t nb_checkpoint_save(const char* path, const nb_model_t* m, long step) {
  if (nb_model_is_sharded(m)) /* a shard's tensors are not the model's: save the logical one */
    return nb_error(NB_ERR_UNSUPPORTED, "checkpoint %s: a tensor-parallel shard (gather it)", path);
  const nb_model_config_t* c = nb_model_get_config(m);
  char v[6][24];
  snprintf(v[0], 24, "%d", c->n_layer);
  snprintf(v[1], 24, "%d", c->n_embd);
  snprintf(v[2], 24, "%d", c->n_head);
  snprintf(v[3], 24, "%d", c->ctx);
  snprintf(v[4], 24, "%d", c->vocab);
  snprintf(v[5], 24, "%ld", step);
  const char* meta[] = {"n_layer", v[0], "n_embd", v[1], "n_head", v[2],
                        "ctx",     v[3], "vocab",  v[4], "step",   v[5]};
  return nb__save_views(path, nb__model_view, m, nb_model_num_tensors(m),
                        nb_model_params((nb_model_t*)m, NULL), meta, 6);
}

nb_status_t nb_checkpoint_load_into(const char* path, nb_model_t* m, long* step) {
  if (nb_model_is_sharded(m))
    return nb_error(NB_ERR_UNSUPPORTED, "checkpoint %s: a tensor-parallel shard (scatter it)",
                    path);
  nb_ckpt_t* c;
  NB_CHECK(nb_checkpoint_open(path, &c));
  nb_model_config_t cfg;
  long s = 0;
  nb_status_t st = nb__read_config(c, path, &cfg, &s);
  const nb_model_config_t* mc = nb_model_get_config(m);
  if (st == NB_OK && memcmp(&cfg, mc, sizeof cfg) != 0)
    st = nb_error(NB_ERR_INVALID,
                  "checkpoint %s: config L=%d C=%d H=%d ctx=%d V=%d differs from the model's "
                  "L=%d C=%d H=%d ctx=%d V=%d",
                  path, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.ctx, cfg.vocab, mc->n_layer,
                  mc->n_embd, mc->n_head, mc->ctx, mc->vocab);
  if (st == NB_OK)
    st = nb__load_views(c, path, nb__model_view, m, nb_model_num_tensors(m),
                        nb_model_params(m, NULL));
  if (st == NB_OK && step) *step = s;
  nb_checkpoint_close(c);
  return st;
}

nb_status_t nb_checkpoint_load(const char* path, nb_model_t** out, long* step) {
  *out = NULL;
  nb_ckpt_t* c;
  NB_CHECK(nb_checkpoint_open(path, &c));
  nb_model_config_t cfg;
  nb_model_t* m = NULL;
  long s = 0;
  nb_status_t st = nb__read_config(c, path, &cfg, &s);
  if (st == NB_OK) st = nb_model_create(&cfg, 0, &m);
  if (st == NB_OK)
    st = nb__load_views(c, path, nb__model_view, m, nb_model_num_tensors(m),
                        nb_model_params(m, NULL));
  nb_checkpoint_close(c);
  if (st != NB_OK) {
    nb_model_destroy(m);
    return st;
  }
  if (step) *step = s;
  *out = m;
  return NB_OK;
}

nb_status_t nb_checkpoint_save_lora(const char* path, const nb_lora_t* l, long step) {
  const nb_lora_config_t* lc = nb_lora_get_config(l);
  char v[4][32];
  snprintf(v[0], 32, "%d", lc->rank);
  snprintf(v[1], 32, "%.9g", (double)lc->alpha);
  snprintf(v[2], 32, "%u", lc->sites);
  snprintf(v[3], 32, "%ld", step);
  const char* meta[] = {"lora_rank", v[0], "lora_alpha", v[1], "lora_sites", v[2], "step", v[3]};
  return nb__save_views(path, nb__lora_view, l, nb_lora_num_tensors(l),
                        nb_lora_params((nb_lora_t*)l, NULL), meta, 4);
}

nb_status_t nb_checkpoint_load_lora_into(const char* path, nb_lora_t* l, long* step) {
  nb_ckpt_t* c;
  NB_CHECK(nb_checkpoint_open(path, &c));
  long s = 0, rank = 0, sites = 0;
  nb_status_t st = nb__meta_long(c, path, "step", &s);
  if (st == NB_OK) st = nb__meta_long(c, path, "lora_rank", &rank);
  if (st == NB_OK) st = nb__meta_long(c, path, "lora_sites", &sites);
  const char* alpha = st == NB_OK ? nb_checkpoint_meta(c, "lora_alpha") : NULL;
  const nb_lora_config_t* lc = nb_lora_get_config(l);
  if (st == NB_OK &&
      (!alpha || rank != lc->rank || sites != (long)lc->sites || strtof(alpha, NULL) != lc->alpha))
    st = nb_error(NB_ERR_INVALID,
                  "checkpoint %s: adapters rank %ld alpha %s sites 0x%lx, these are rank %d alpha "
                  "%g sites 0x%x",
                  path, rank, alpha ? alpha : "(none)", (unsigned long)sites, lc->rank,
                  (double)lc->alpha, lc->sites);
  if (st == NB_OK)
    st = nb__load_views(c, path, nb__lora_view, l, nb_lora_num_tensors(l), nb_lora_params(l, NULL));
  if (st == NB_OK && step) *step = s;
  nb_checkpoint_close(c);
  return st;
}

/* Views of the AdamW state arena (m then v) under the model's names. */
typedef struct {
  nb_tensor_view_t* v;
  size_t n;
} nb__view_list_t;
static const nb_tensor_view_t* nb__list_view(const void* l, size_t i) {
  return &((const nb__view_list_t*)l)->v[i];
}

static nb_status_t nb__optim_views(const nb_model_t* m, nb_adamw_t* opt, nb__view_list_t* out) {
  size_t nf, np = nb_model_num_params(m), nt = nb_model_num_tensors(m);
  (void)nb_adamw_state(opt, &nf);
  if (nf != 2 * np)
    return nb_error(NB_ERR_INVALID,
                    "optimizer checkpoint: optimizer holds %zu parameters, model %zu", nf / 2, np);
  NB_CHECK(nb_calloc((void**)&out->v, 2 * nt, sizeof *out->v, "optimizer views"));
  out->n = 2 * nt;
  for (size_t k = 0; k < 2; k++)
    for (size_t i = 0; i < nt; i++) {
      nb_tensor_view_t* v = &out->v[k * nt + i];
      *v = *nb_model_tensor(m, i);
      char name[80];
      int len = snprintf(name, sizeof name, "adam.%c.%s", k ? 'v' : 'm', v->name);
      if (len < 0 || (size_t)len >= sizeof v->name) {
        nb_free(out->v);
        out->v = NULL;
        return nb_error(NB_ERR_INVALID, "optimizer checkpoint: tensor name %s too long", v->name);
      }
      memcpy(v->name, name, (size_t)len + 1);
      v->offset += k * np;
    }
  return NB_OK;
}

nb_status_t nb_checkpoint_save_optim(const char* path, const nb_model_t* m, nb_adamw_t* opt) {
  nb__view_list_t l = {0};
  NB_CHECK(nb__optim_views(m, opt, &l));
  char step[24];
  snprintf(step, sizeof step, "%ld", nb_adamw_steps(opt));
  const char* meta[] = {"step", step};
  nb_status_t st = nb__save_views(path, nb__list_view, &l, l.n, nb_adamw_state(opt, NULL), meta, 1);
  nb_free(l.v);
  return st;
}

nb_status_t nb_checkpoint_load_optim_into(const char* path, const nb_model_t* m, nb_adamw_t* opt) {
  nb__view_list_t l = {0};
  NB_CHECK(nb__optim_views(m, opt, &l));
  nb_ckpt_t* c = NULL;
  long step = 0;
  nb_status_t st = nb_checkpoint_open(path, &c);
  if (st == NB_OK) st = nb__meta_long(c, path, "step", &step);
  if (st == NB_OK && step < 0)
    st = nb_error(NB_ERR_INVALID, "checkpoint %s: negative step %ld", path, step);
  if (st == NB_OK) st = nb__load_views(c, path, nb__list_view, &l, l.n, nb_adamw_state(opt, NULL));
  if (st == NB_OK) nb_adamw_set_steps(opt, step);
  nb_checkpoint_close(c);
  nb_free(l.v);
  return st;
}
