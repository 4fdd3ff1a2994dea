/* The codec points that `compression.values: "auto"` lets the adaptive scheduler choose from,
 * round by round (inter/sched.h, nb_sched_pick): a value type, a density and a top-k chunk each,
 * with the bits per parameter per sync and the held-out loss cost measured for it by
 * `nebula bench pareto` (docs/hybrid.md, "Choosing a point"). */
#ifndef NB_API_CODEC_POINTS_H
#define NB_API_CODEC_POINTS_H

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"
#include "inter/sched.h"

typedef struct {
  nb_sched_point_t sched; /* name, density, bits, loss cost: what the scheduler weighs */
  nb_values_t values;     /* what the codec then sends */
  uint32_t topk_chunk;    /* 0 = global top-k */
} nb_codec_point_t;

/* The table measured at the H (inner steps per round) nearest inner_steps (by ratio; <= 0: 32),
 * best quality first; *n receives its length, *measured_h (nullable) that H. Static, never
 * NULL. */
const nb_codec_point_t* nb_codec_points(long inner_steps, size_t* n, long* measured_h);

#endif
