/* api/adapt: the exchange's link estimate and the scheduler's input from it and the codec
 * (api/adapt.h). */
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
