/* The codec points of `compression.values: "auto"`. The bits are bits per parameter per sync as
 * measured on the demo job (zstd included), written as bits per kept value so that the scheduler
 * scales them with the parameter count; the loss costs are the mean held-out loss ratio - 1
 * against the exact single-cluster run over three seeds (`nebula bench pareto --seeds 3`, the
 * table in docs/hybrid.md). */
#include "worker/codec_points.h"

static const nb_codec_point_t nb__points[] = {
    {{"dense-int8", 1.0, 7.65, 0, 0.0140}, NB_VALUES_INT8, 0},
    {{"top10-int8", 0.10, 13.3, 0, 0.0230}, NB_VALUES_INT8, 0},
    {{"top3-4bit", 0.03, 14.6, 0, 0.0300}, NB_VALUES_INT4, 4096},
    {{"top1.5-2bit", 0.015, 13.4, 0, 0.0500}, NB_VALUES_INT2, 4096},
};

const nb_codec_point_t* nb_codec_points(size_t* n) {
  *n = sizeof nb__points / sizeof nb__points[0];
  return nb__points;
}
