/* The codec points of `compression.values: "auto"`. The bits are bits per parameter per sync as
 * measured on the demo job (zstd and the Golomb-Rice chunked index included), written as bits
 * per kept value so that the scheduler scales them with the parameter count; the loss costs are
 * the held-out loss ratio - 1 against the exact single-cluster run (`nebula bench pareto`, mean
 * of seeds 1-3, the tables in docs/hybrid.md), with the update landing 4 of 32 steps into the
 * next round (land 0.125) and, for the sparse points, 24 of 32 (land 0.75, the `-t24` points);
 * the 2-bit points with decaying error feedback (errorFeedbackDecay 0.9) beside the demo job's
 * outer Nesterov momentum 0.5, the best recipe of the sweep there. The scheduler only compares
 * them, so it is their order that matters. Top-10 % int8 (1.33 bits, 1.0261) is left out: top-8 %
 * 2-bit costs less loss for less than half its bits. */
#include "worker/codec_points.h"

static const nb_codec_point_t nb__points[] = {
    /* 7.66 bits/param; 1.0169 (3 seeds); no late measurement */
    {{"dense-int8", 1.0, 7.66, 0, 0.0169, 0, 0, 0}, NB_VALUES_INT8, 0},
    /* 0.576 bits/param; 1.0249 landing at 4/32, 1.0290 at 24/32 */
    {{"top8-2bit", 0.08, 7.21, 0, 0.0249, 0.125, 0.75, 0.0290}, NB_VALUES_INT2, 4096},
    /* 0.390 bits/param; 1.0316 / 1.0339 */
    {{"top5-2bit", 0.05, 7.79, 0, 0.0316, 0.125, 0.75, 0.0339}, NB_VALUES_INT2, 4096},
    /* 0.254 bits/param; 1.0352 / 1.0441 */
    {{"top3-2bit", 0.03, 8.47, 0, 0.0352, 0.125, 0.75, 0.0441}, NB_VALUES_INT2, 4096},
    /* 0.144 bits/param; 1.0484 / 1.0695 */
    {{"top1.5-2bit", 0.015, 9.58, 0, 0.0484, 0.125, 0.75, 0.0695}, NB_VALUES_INT2, 4096},
};

const nb_codec_point_t* nb_codec_points(size_t* n) {
  *n = sizeof nb__points / sizeof nb__points[0];
  return nb__points;
}
