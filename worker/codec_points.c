/* The codec points of `compression.values: "auto"`. The bits are bits per parameter per sync as
 * measured on the demo job (zstd included), written as bits per kept value so that the scheduler
 * scales them with the parameter count; the loss costs are the held-out loss ratio - 1 against
 * the exact single-cluster run (`nebula bench pareto`, the table in docs/hybrid.md), the 2-bit
 * points with decaying error feedback (errorFeedbackDecay 0.9) beside the demo job's outer
 * Nesterov momentum 0.5, the best recipe of the sweep there. The scheduler only compares them, so
 * it is their order that matters: less loss costs more bits. */
#include "worker/codec_points.h"

static const nb_codec_point_t nb__points[] = {
    /* 7.66 bits/param; 1.0169 (3 seeds) */
    {{"dense-int8", 1.0, 7.66, 0, 0.0169, 0, 0, 0}, NB_VALUES_INT8, 0},
    /* 1.33 bits/param; 1.0261 (3 seeds; no error-feedback decay) */
    {{"top10-int8", 0.10, 13.3, 0, 0.0261, 0, 0, 0}, NB_VALUES_INT8, 0},
    /* 0.424 bits/param; 1.0352 (3 seeds); 4bit at 3 % costs more bits and more loss */
    {{"top3-2bit", 0.03, 14.1, 0, 0.0352, 0, 0, 0}, NB_VALUES_INT2, 4096},
    /* 0.213 bits/param; 1.0484 (3 seeds) */
    {{"top1.5-2bit", 0.015, 14.2, 0, 0.0484, 0, 0, 0}, NB_VALUES_INT2, 4096},
};

const nb_codec_point_t* nb_codec_points(size_t* n) {
  *n = sizeof nb__points / sizeof nb__points[0];
  return nb__points;
}
