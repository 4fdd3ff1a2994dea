/* The codec points of `compression.values: "auto"`. The bits are bits per parameter per sync as
 * measured on the demo job (zstd included), written as bits per kept value so that the scheduler
 * scales them with the parameter count; the loss costs are the held-out loss ratio - 1 against
 * the exact single-cluster run (`nebula bench pareto`, the table in docs/hybrid.md), the sparse
 * points with SparseLoCo's decaying error feedback (errorFeedbackDecay 0.95, outer momentum 0),
 * which is what they are meant to run with. The scheduler only compares them, so it is their
 * order that matters: less loss costs more bits. */
#include "worker/codec_points.h"

static const nb_codec_point_t nb__points[] = {
    /* 7.66 bits/param; 1.0169 (3 seeds, outer Nesterov 0.5) */
    {{"dense-int8", 1.0, 7.66, 0, 0.0169}, NB_VALUES_INT8, 0},
    /* 1.31 bits/param; 1.0341 (seed 1, beta 0.95 and no outer momentum; 1.0261 with Nesterov) */
    {{"top10-int8", 0.10, 13.1, 0, 0.0341}, NB_VALUES_INT8, 0},
    /* 0.424 bits/param; 1.0484 (seed 1, beta 0.95); 4bit at 3 % costs more bits and more loss */
    {{"top3-2bit", 0.03, 14.1, 0, 0.0484}, NB_VALUES_INT2, 4096},
    /* 0.213 bits/param; 1.0866 (seeds 1-2, beta 0.95) */
    {{"top1.5-2bit", 0.015, 14.2, 0, 0.0866}, NB_VALUES_INT2, 4096},
};

const nb_codec_point_t* nb_codec_points(size_t* n) {
  *n = sizeof nb__points / sizeof nb__points[0];
  return nb__points;
}
