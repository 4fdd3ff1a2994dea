/* api/adapt: the exchange's link estimate, the scheduler's input from it and the codec, and one
 * cluster's decision of each next round (api/adapt.h). */
#include "api/adapt.h"

#include <math.h>
#include <string.h>

#include "inter/link.h"

void nb_adapt_estimate(nb_exchange_t* ex, nb_estimate_t* out) {
  memset(out, 0, sizeof *out);
  size_t np = ex ? nb_exchange_peer_count(ex) : 0;
  for (size_t i = 0; i < np; i++) {
    nb_estimate_t e;
    nb_estimator_get(nb_link_estimator(nb_exchange_link(ex, i)), &e);
    if (i == 0 || e.goodput_Bps < out->goodput_Bps) out->goodput_Bps = e.goodput_Bps;
    if (e.rtt_s > out->rtt_s) out->rtt_s = e.rtt_s;
    if (e.rtt_min_s > out->rtt_min_s) out->rtt_min_s = e.rtt_min_s;
  }
}

/* Codec bits per kept value and per index, for the scheduler's prediction. */
static void nb__adapt_bits(nb_values_t v, double density, uint32_t chunk, double* per_value,
                           double* per_index) {
  double scale = 32.0 / 256; /* one fp32 scale per block of 256 (the codec's default) */
  *per_value = v == NB_VALUES_FP32   ? 32
               : v == NB_VALUES_INT8 ? 8 + scale
               : v == NB_VALUES_INT4 ? 4 + scale
               : v == NB_VALUES_INT2 ? 2 + scale
                                     : 16;
  double gap = density > 0 ? 1.0 / density : 1;
  double bytes = ceil(log2(gap + 1) / 7);
  *per_index = 8 * (bytes < 1 ? 1 : bytes);
  if (chunk > 0 && log2((double)chunk) < *per_index) *per_index = log2((double)chunk);
}

void nb_adapt_input(nb_exchange_t* ex, uint64_t round, double cap_Bps, int hint_cap, nb_values_t v,
                    double density, uint32_t chunk, uint64_t n_params, nb_sched_input_t* in) {
  nb_estimate_t est;
  nb_adapt_estimate(ex, &est);
  memset(in, 0, sizeof *in);
  in->round = round;
  nb_sched_input_from_estimate(in, &est);
  if (cap_Bps > 0 && in->goodput_Bps > cap_Bps) in->goodput_Bps = cap_Bps;
  if (hint_cap && cap_Bps > 0 && in->goodput_Bps <= 0) in->goodput_Bps = 0.9 * cap_Bps;
  in->n_params = n_params;
  nb__adapt_bits(v, density, chunk, &in->bits_per_value, &in->bits_per_index);
  in->fanout = 1; /* one (capped) link per peer */
}

nb_status_t nb_adapt_probes_start(nb_exchange_t* ex) {
  size_t np = ex ? nb_exchange_peer_count(ex) : 0;
  for (size_t i = 0; i < np; i++)
    NB_CHECK(nb_error_wrap(nb_link_probe_start(nb_exchange_link(ex, i), 0, 0),
                           "starting the link probe of peer %zu", i));
  return NB_OK;
}

/* Records round r's landing (it lands round r - 1's frame) and, once NB_ADAPT_OBSERVED landed,
 * the slowest of them for the smallest of their frames into in. */
static void nb__adapt_observe(nb_adapt_t* a, const nb_adapt_round_t* r, nb_sched_input_t* in) {
  double b = r->round >= 1 ? a->sent_bytes[(r->round - 1) % 4] : 0;
  if (r->exchange_took_s > 0 && b > 0) {
    memmove(a->obs_s + 1, a->obs_s, (NB_ADAPT_OBSERVED - 1) * sizeof(double));
    memmove(a->obs_bytes + 1, a->obs_bytes, (NB_ADAPT_OBSERVED - 1) * sizeof(double));
    a->obs_s[0] = r->exchange_took_s;
    a->obs_bytes[0] = b;
    if (a->n_obs < NB_ADAPT_OBSERVED) a->n_obs++;
  }
  if (a->n_obs < NB_ADAPT_OBSERVED) return;
  in->observed_s = 0;
  in->observed_bytes = INFINITY;
  for (int i = 0; i < NB_ADAPT_OBSERVED; i++) {
    if (a->obs_s[i] > in->observed_s) in->observed_s = a->obs_s[i];
    if (a->obs_bytes[i] < in->observed_bytes) in->observed_bytes = a->obs_bytes[i];
  }
}

nb_status_t nb_adapt_next(nb_adapt_t* a, nb_exchange_t* ex, nb_hybrid_t* h,
                          const nb_adapt_round_t* r, nb_sched_input_t* in,
                          nb_sched_decision_t* dec) {
  nb_adapt_input(ex, r->round + 1, a->cap_Bps, a->hint_cap, r->values, r->density, r->topk_chunk,
                 r->n_params, in);
  in->step_compute_s = r->step_compute_s;
  in->steps = r->steps;
  in->round_s = r->round_s;
  in->hide_steps = r->hide_steps;
  if (a->cfg.overlap) nb__adapt_observe(a, r, in);
  const nb_sched_decision_t* prev = a->have_dec ? &a->dec : NULL;
  NB_CHECK(a->auto_codec ? nb_codec_auto_pick(&a->codec, &a->cfg, in, prev, h, dec)
                         : nb_sched_decide(&a->cfg, in, prev, dec));
  NB_CHECK(nb_hybrid_set_density(h, dec->density));
  if (r->set_steps) {
    NB_CHECK(nb_hybrid_set_inner_steps(h, (long)dec->steps));
    if (in->hide_steps > 0)
      NB_CHECK(nb_hybrid_set_overlap_steps(
          h, dec->hide_steps > 0 ? (long)dec->hide_steps : (long)dec->steps));
  }
  a->dec = *dec;
  a->have_dec = 1;
  a->sent_bytes[(r->round + 1) % 4] = dec->bytes; /* round r + 1's frame */
  return NB_OK;
}
