/* The codec points of `compression.values: "auto"`. The bits are bits per parameter per sync as
 * measured on the demo job (zstd and the Golomb-Rice chunked index included), written as bits
 * per kept value so that the scheduler scales them with the parameter count; the loss costs are
 * the held-out loss ratio - 1 against the exact single-cluster run (`nebula bench pareto`, mean
 * of seeds 1-3, the tables in docs/hybrid.md), with the update landing 4 of 32 steps into the
 * next round (land 0.125) and, for the sparse points, 24 of 32 (land 0.75, the `-t24` points);
 * the 2-bit points with decaying error feedback (errorFeedbackDecay 0.9) beside the demo job's
 * outer Nesterov momentum 0.5, the best recipe of the sweep there. The scheduler only compares
 * them, so it is their order that matters. Top-10 % int8 (1.33 bits, 1.0261) is left out: top-8 %
 * 2-bit costs less loss for less than half its bits. The same measurement at H 16 and H 8 (the
 * demo job with those inner steps, the `-h16` / `-h8` points; landing 4 steps in and later)
 * gives the tables for jobs with shorter rounds: a point costs far less at short H, and a late
 * landing costs by the steps it is late, so a job takes the table of the H nearest its own. */
#include "api/codec_points.h"

#include <math.h>

/* H 32 (the demo job) */
static const nb_codec_point_t nb__points_h32[] = {
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

/* H 16 (the demo job with innerSteps 16: the `-h16` points), sparse rounds eager (sync.eager:
 * the prediction from the frame sent), seeds 1-3 */
static const nb_codec_point_t nb__points_h16[] = {
    /* 7.66 bits/param; 1.0126 */
    {{"dense-int8", 1.0, 7.66, 0, 0.0126, 0, 0, 0}, NB_VALUES_INT8, 0},
    /* 0.391 bits/param; 1.0163 landing at 4/16, 1.0222 at 12/16 */
    {{"top5-2bit", 0.05, 7.82, 0, 0.0163, 0.25, 0.75, 0.0222}, NB_VALUES_INT2, 4096},
    /* 0.253 bits/param; 1.0181 at 4/16, 1.0193 at 12/16 */
    {{"top3-2bit", 0.03, 8.44, 0, 0.0181, 0.25, 0.75, 0.0193}, NB_VALUES_INT2, 4096},
};

/* H 8 (the `-h8` points: `nebula bench e2e --thin`'s rounds) */
static const nb_codec_point_t nb__points_h8[] = {
    /* 7.66 bits/param; not measured at H 8: H 16's 1.0126 (shorter rounds cost less) */
    {{"dense-int8", 1.0, 7.66, 0, 0.0126, 0, 0, 0}, NB_VALUES_INT8, 0},
    /* 0.143 bits/param; 1.0203 landing at 4/8, 1.0273 at 6/8 */
    {{"top1.5-2bit", 0.015, 9.55, 0, 0.0203, 0.5, 0.75, 0.0273}, NB_VALUES_INT2, 4096},
    /* 0.080 bits/param; 1.0340 at 4/8; at 6/8 not measured: top-1.5 %'s +0.0070 (a point
     * without a late cost would look as good landing late as early) */
    {{"top0.75-2bit", 0.0075, 10.67, 0, 0.0340, 0.5, 0.75, 0.0410}, NB_VALUES_INT2, 4096},
};

_Static_assert(sizeof nb__points_h32 / sizeof nb__points_h32[0] <= NB_CODEC_POINTS_MAX, "h32");
_Static_assert(sizeof nb__points_h16 / sizeof nb__points_h16[0] <= NB_CODEC_POINTS_MAX, "h16");
_Static_assert(sizeof nb__points_h8 / sizeof nb__points_h8[0] <= NB_CODEC_POINTS_MAX, "h8");

#define NB__TABLE(h, t) \
  { h, t, sizeof t / sizeof t[0] }
static const struct {
  long h;
  const nb_codec_point_t* points;
  size_t n;
} nb__tables[] = {NB__TABLE(32, nb__points_h32), NB__TABLE(16, nb__points_h16),
                  NB__TABLE(8, nb__points_h8)};

const nb_codec_point_t* nb_codec_points(long inner_steps, size_t* n, long* measured_h) {
  size_t best = 0;
  double h = inner_steps > 0 ? (double)inner_steps : 32, d_best = -1;
  for (size_t i = 0; i < sizeof nb__tables / sizeof nb__tables[0]; i++) {
    double d = fabs(log2(h / (double)nb__tables[i].h));
    if (d_best < 0 || d < d_best) best = i, d_best = d;
  }
  *n = nb__tables[best].n;
  if (measured_h) *measured_h = nb__tables[best].h;
  return nb__tables[best].points;
}

void nb_codec_auto_init(nb_codec_auto_t* a, long inner_steps, nb_hybrid_config_t* hc) {
  a->points = nb_codec_points(inner_steps, &a->n, &a->measured_h);
  for (size_t i = 0; i < a->n; i++) a->sched[i] = a->points[i].sched;
  a->cur = a->n - 1;
  hc->values = a->points[a->cur].values;
  hc->density = a->points[a->cur].sched.density;
  hc->topk_chunk = a->points[a->cur].topk_chunk;
}

nb_status_t nb_codec_auto_pick(nb_codec_auto_t* a, const nb_sched_config_t* cfg,
                               const nb_sched_input_t* in, const nb_sched_decision_t* prev,
                               nb_hybrid_t* h, nb_sched_decision_t* dec) {
  size_t next = a->cur;
  NB_CHECK(nb_sched_pick(cfg, in, a->sched, a->n, prev, a->cur, dec, &next));
  NB_CHECK(nb_hybrid_set_codec(h, a->points[next].values, a->points[next].topk_chunk));
  a->cur = next;
  return NB_OK;
}
