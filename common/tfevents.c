/* The TensorBoard event-file writer: a hand encoder for the few Event fields scalars use, the
 * TFRecord framing, and a FILE that remembers its first failure. Not a reader: the tests read
 * the files back with TensorBoard's own EventAccumulator. */
#include "common/tfevents.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"

NB_PARAM_INT(Tensorboard, "NB_TENSORBOARD", 1, 0, 1,
             "1: nebula worker and nebula train write TensorBoard event files into OUT/tb; 0: none")

int nb_tfevents_enabled(void) {
  return nb_param_Tensorboard() != 0;
}

#define NB__TFE_PATH_MAX 4096

struct nb_tfevents {
  FILE* f;
  int failed; /* a write failed: logged once, every later call is NB_ERR_IO */
  char path[NB__TFE_PATH_MAX];
};

/* ---- encoding ------------------------------------------------------------------------------ */

uint32_t nb_tfevents_mask_crc(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void nb__le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void nb__le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

size_t nb_tfevents_frame(const void* data, size_t len, uint8_t* out, size_t cap) {
  if (len > SIZE_MAX - NB_TFEVENTS_FRAME_OVERHEAD || cap < len + NB_TFEVENTS_FRAME_OVERHEAD)
    return 0;
  nb__le64(out, (uint64_t)len);
  nb__le32(out + 8, nb_tfevents_mask_crc(nb_crc32c(0, out, 8)));
  if (len) memcpy(out + 12, data, len);
  nb__le32(out + 12 + len, nb_tfevents_mask_crc(nb_crc32c(0, data, len)));
  return len + NB_TFEVENTS_FRAME_OVERHEAD;
}

/* A base-128 varint of v at p; returns its length (at most 10). */
static size_t nb__varint(uint8_t* p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

static size_t nb__varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

/* Field keys: (number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32). */
#define NB__KEY(field, wire) ((uint8_t)(((field) << 3) | (wire)))

size_t nb_tfevents_encode(double wall_time, int64_t step, const char* tag, float value,
                          uint8_t* out, size_t cap) {
  static const char version[] = "brain.Event:2";
  size_t tag_len = tag ? strlen(tag) : 0;
  if (tag && (tag_len == 0 || tag_len > NB_TFEVENTS_TAG_MAX)) return 0;
  /* Summary.Value { tag = 1; simple_value = 2 }, inside Summary { repeated value = 1 } */
  size_t value_len = 1 + nb__varint_len(tag_len) + tag_len + 1 + 4;
  size_t summary_len = 1 + nb__varint_len(value_len) + value_len;
  size_t need = 1 + 8; /* wall_time = 1, double */
  if (tag)
    need += 1 + nb__varint_len((uint64_t)step) + 1 + nb__varint_len(summary_len) + summary_len;
  else
    need += 1 + 1 + sizeof version - 1;
  if (cap < need) return 0;
  size_t n = 0;
  uint64_t bits;
  memcpy(&bits, &wall_time, sizeof bits);
  out[n++] = NB__KEY(1, 1);
  nb__le64(out + n, bits);
  n += 8;
  if (!tag) {
    out[n++] = NB__KEY(3, 2); /* file_version */
    out[n++] = (uint8_t)(sizeof version - 1);
    memcpy(out + n, version, sizeof version - 1);
    return n + sizeof version - 1;
  }
  out[n++] = NB__KEY(2, 0); /* step, int64: a negative one as its 64-bit two's complement */
  n += nb__varint(out + n, (uint64_t)step);
  out[n++] = NB__KEY(5, 2); /* summary */
  n += nb__varint(out + n, summary_len);
  out[n++] = NB__KEY(1, 2); /* Summary.value */
  n += nb__varint(out + n, value_len);
  out[n++] = NB__KEY(1, 2); /* Value.tag */
  n += nb__varint(out + n, tag_len);
  memcpy(out + n, tag, tag_len);
  n += tag_len;
  out[n++] = NB__KEY(2, 5); /* Value.simple_value, float */
  uint32_t fb;
  memcpy(&fb, &value, sizeof fb);
  nb__le32(out + n, fb);
  return n + 4;
}

/* ---- the writer ---------------------------------------------------------------------------- */

/* The first failure is logged; the writer stays failed. */
static nb_status_t nb__tfe_fail(nb_tfevents_t* w, int err) {
  if (!w->failed)
    NB_WARN(
        "tensorboard: cannot write %s: %s; no more TensorBoard events from this run "
        "(training goes on; free space or fix the folder for the next run)",
        w->path, strerror(err));
  w->failed = 1;
  return nb_error(NB_ERR_IO, "tensorboard: %s: %s", w->path, strerror(err));
}

static nb_status_t nb__tfe_record(nb_tfevents_t* w, const uint8_t* ev, size_t len) {
  uint8_t rec[NB_TFEVENTS_TAG_MAX + 64 + NB_TFEVENTS_FRAME_OVERHEAD];
  size_t n = nb_tfevents_frame(ev, len, rec, sizeof rec);
  if (n == 0) return nb_error(NB_ERR_INTERNAL, "tensorboard: record of %zu bytes", len);
  errno = 0;
  if (fwrite(rec, 1, n, w->f) != n) return nb__tfe_fail(w, errno ? errno : EIO);
  return NB_OK;
}

nb_status_t nb_tfevents_open_path(const char* path, nb_tfevents_t** out) {
  *out = NULL;
  if (!path || !*path) return nb_error(NB_ERR_INVALID, "tensorboard: no file path");
  if (strlen(path) >= NB__TFE_PATH_MAX)
    return nb_error(NB_ERR_INVALID, "tensorboard: path of %zu bytes", strlen(path));
  nb_tfevents_t* w = NULL;
  NB_CHECK(nb_calloc((void**)&w, 1, sizeof *w, "tensorboard writer"));
  snprintf(w->path, sizeof w->path, "%s", path);
  w->f = fopen(path, "wb");
  if (!w->f) {
    int e = errno;
    nb_free(w);
    return nb_error(NB_ERR_IO, "tensorboard: cannot create %s: %s", path, strerror(e));
  }
  uint8_t ev[64];
  size_t len = nb_tfevents_encode((double)nb_wall_ns() / 1e9, 0, NULL, 0, ev, sizeof ev);
  nb_status_t s = nb__tfe_record(w, ev, len);
  if (s != NB_OK) {
    nb_tfevents_close(w);
    return s;
  }
  *out = w;
  return NB_OK;
}

nb_status_t nb_tfevents_open(const char* dir, nb_tfevents_t** out) {
  *out = NULL;
  if (!dir || !*dir) return nb_error(NB_ERR_INVALID, "tensorboard: no folder");
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return nb_error(NB_ERR_IO, "tensorboard: cannot create %s: %s", dir, strerror(errno));
  char host[64];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = 0;
  for (char* c = host; *c; c++) /* a file name: no '/' from an odd host name */
    if (*c == '/') *c = '_';
  long sec = (long)(nb_wall_ns() / 1000000000);
  char path[NB__TFE_PATH_MAX];
  for (int k = 0; k < 1000; k++) {
    int n = k ? snprintf(path, sizeof path, "%s/events.out.tfevents.%ld.%s.%d.%d", dir, sec, host,
                         (int)getpid(), k)
              : snprintf(path, sizeof path, "%s/events.out.tfevents.%ld.%s.%d", dir, sec, host,
                         (int)getpid());
    if (n < 0 || n >= (int)sizeof path)
      return nb_error(NB_ERR_INVALID, "tensorboard: folder path of %zu bytes", strlen(dir));
    struct stat st;
    if (stat(path, &st) != 0) return nb_tfevents_open_path(path, out);
  }
  return nb_error(NB_ERR_IO, "tensorboard: %s: no free event file name", dir);
}

const char* nb_tfevents_path(const nb_tfevents_t* w) {
  return w ? w->path : "";
}

nb_status_t nb_tfevents_scalar(nb_tfevents_t* w, int64_t step, const char* tag, double value) {
  if (!w) return NB_OK;
  if (!tag || !*tag || strlen(tag) > NB_TFEVENTS_TAG_MAX)
    return nb_error(NB_ERR_INVALID, "tensorboard: tag %s", !tag || !*tag ? "empty" : "too long");
  if (w->failed) return nb_error(NB_ERR_IO, "tensorboard: %s: an earlier write failed", w->path);
  uint8_t ev[NB_TFEVENTS_TAG_MAX + 64];
  size_t len =
      nb_tfevents_encode((double)nb_wall_ns() / 1e9, step, tag, (float)value, ev, sizeof ev);
  return nb__tfe_record(w, ev, len);
}

nb_status_t nb_tfevents_flush(nb_tfevents_t* w) {
  if (!w) return NB_OK;
  if (w->failed) return nb_error(NB_ERR_IO, "tensorboard: %s: an earlier write failed", w->path);
  errno = 0;
  if (fflush(w->f) != 0) return nb__tfe_fail(w, errno ? errno : EIO);
  return NB_OK;
}

void nb_tfevents_close(nb_tfevents_t* w) {
  if (!w) return;
  if (w->f) {
    if (!w->failed) nb_tfevents_flush(w);
    fclose(w->f);
  }
  nb_free(w);
}
