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
#include "train/hybrid.h"

/* The most points a table has (each is checked at compile time). */
#define NB_CODEC_POINTS_MAX 16

typedef struct {
  nb_sched_point_t sched; /* name, density, bits, loss cost: what the scheduler weighs */
  nb_values_t values;     /* what the codec then sends */
  uint32_t topk_chunk;    /* 0 = global top-k */
} nb_codec_point_t;

/* The table measured at the H (inner steps per round) nearest inner_steps (by ratio; <= 0: 32),
 * best quality first; *n receives its length, *measured_h (nullable) that H. Static, never
 * NULL. */
const nb_codec_point_t* nb_codec_points(long inner_steps, size_t* n, long* measured_h);

/* values "auto" for one cluster, as `nebula worker` and the public session run it: the table,
 * its points as the scheduler weighs them, and the point in use. */
typedef struct {
  const nb_codec_point_t* points;
  size_t n, cur;
  long measured_h;
  nb_sched_point_t sched[NB_CODEC_POINTS_MAX];
} nb_codec_auto_t;

/* The table of inner_steps (nb_codec_points) with its point of fewest bytes in use (until the
 * link is measured), written into hc's values, density and topk_chunk. */
void nb_codec_auto_init(nb_codec_auto_t* a, long inner_steps, nb_hybrid_config_t* hc);

/* The next frame's point: nb_sched_pick over a's table (prev: the last decision, nullable),
 * then h's codec set to it and a->cur moved there. *dec gets the decision; its density is the
 * caller's to set (nb_hybrid_set_density). On error a->cur and h are as they were. */
nb_status_t nb_codec_auto_pick(nb_codec_auto_t* a, const nb_sched_config_t* cfg,
                               const nb_sched_input_t* in, const nb_sched_decision_t* prev,
                               nb_hybrid_t* h, nb_sched_decision_t* dec);

/* The name of the point in use ("top3-2bit", "dense-int8"; static). */
static inline const char* nb_codec_auto_name(const nb_codec_auto_t* a) {
  return a->points[a->cur].sched.name;
}

#endif
