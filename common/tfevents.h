/* TensorBoard event files: scalars written as TFRecord-framed `Event` protobufs, the format
 * `tensorboard --logdir` reads (docs/operations.md, *TensorBoard*). Only what scalars need is
 * encoded (Event.wall_time, step, file_version, summary; Summary.Value.tag, simple_value): it is
 * not a protobuf library, and it writes images, histograms or tensors not at all. */
#ifndef NB_COMMON_TFEVENTS_H
#define NB_COMMON_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The longest tag accepted, in bytes. */
#define NB_TFEVENTS_TAG_MAX 255
/* What a framed record adds to its data: length (8), its masked CRC-32C (4), data's (4). */
#define NB_TFEVENTS_FRAME_OVERHEAD 16

typedef struct nb_tfevents nb_tfevents_t;

/* NB_TENSORBOARD (default 1): whether `nebula worker` and `nebula train` write event files. */
int nb_tfevents_enabled(void);

/* Creates folder dir (its parent must exist; an existing one is used) and in it a new file
 * `events.out.tfevents.<unix-seconds>.<host>.<pid>` (".<n>" appended when that name exists),
 * whose first record is the file version "brain.Event:2". dir: borrowed. out: closed with
 * nb_tfevents_close. Returns NB_OK, NB_ERR_INVALID (dir NULL or empty, a path over 4 KiB),
 * NB_ERR_IO (the folder or the file cannot be made; the message names the path), NB_ERR_NOMEM.
 */
nb_status_t nb_tfevents_open(const char* dir, nb_tfevents_t** out);

/* As nb_tfevents_open, into exactly the file path (created or truncated). */
nb_status_t nb_tfevents_open_path(const char* path, nb_tfevents_t** out);

/* The file's path (valid until close); "" for NULL. */
const char* nb_tfevents_path(const nb_tfevents_t* w);

/* Appends one Event holding scalar `tag` = value (as float, TensorBoard's simple_value) at
 * `step`, stamped with the wall clock. Buffered: nb_tfevents_flush makes it visible. w NULL:
 * nothing, NB_OK. Returns NB_OK, NB_ERR_INVALID (tag NULL, empty or over NB_TFEVENTS_TAG_MAX),
 * NB_ERR_IO once a write has failed. A writer logs its first write failure with NB_WARN and then
 * stays failed and silent: a caller may ignore the status (training never stops for it). Not
 * thread-safe: one writer per thread. */
nb_status_t nb_tfevents_scalar(nb_tfevents_t* w, int64_t step, const char* tag, double value);

/* Hands what is buffered to the file (a live TensorBoard sees it). w NULL: NB_OK. Returns
 * NB_OK or NB_ERR_IO (logged once, as for nb_tfevents_scalar). */
nb_status_t nb_tfevents_flush(nb_tfevents_t* w);

/* Flushes and closes; NULL is accepted. */
void nb_tfevents_close(nb_tfevents_t* w);

/* ---- the encoding, for tests and tools --------------------------------------------------- */

/* TFRecord framing of len bytes of data into out (cap bytes): uint64 length little-endian,
 * masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the data. Returns the bytes
 * written (len + NB_TFEVENTS_FRAME_OVERHEAD), or 0 when cap is too small. */
size_t nb_tfevents_frame(const void* data, size_t len, uint8_t* out, size_t cap);

/* TFRecord's mask of a CRC-32C: rotated right by 15 bits plus 0xa282ead8. */
uint32_t nb_tfevents_mask_crc(uint32_t crc);

/* The Event protobuf (unframed) of one scalar, or of the file version (tag NULL: file_version
 * "brain.Event:2", no step). Returns its length, or 0 when cap is too small or tag is too
 * long. */
size_t nb_tfevents_encode(double wall_time, int64_t step, const char* tag, float value,
                          uint8_t* out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
