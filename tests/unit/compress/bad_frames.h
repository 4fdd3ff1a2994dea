/* A corpus of defective codec frames, each with the status and message text a strict decoder
 * must answer with; plus a few good frames. Shared by the frame tests and the fuzz corpus. */
#ifndef NB_TESTS_BAD_FRAMES_H
#define NB_TESTS_BAD_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct {
  char name[48];
  uint8_t* bytes; /* malloc'd */
  size_t len;
  nb_status_t want;   /* NB_OK for the good frames */
  const char* needle; /* text the error message must contain (NULL for good frames) */
} nb_test_frame_t;

/* Builds the corpus; returns its size. Free with nb_test_frames_free. */
size_t nb_test_frames_build(nb_test_frame_t** out);
void nb_test_frames_free(nb_test_frame_t* f, size_t count);
/* The n a frame's header declares, or 0 when there is no readable header. */
uint64_t nb_test_frame_n(const uint8_t* f, size_t len);

#endif
