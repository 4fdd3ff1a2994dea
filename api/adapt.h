/* api/adapt: what the adaptive scheduler (inter/sched.h) reads of a live exchange and of a codec,
 * shared by the public session's adaptive density (api/session.c) and `nebula worker`: the
 * slowest peer link's estimate, the scheduler's input from it and the codec, and the idle-link
 * probes. Internal: not exported by libnebula. */
#ifndef NB_API_ADAPT_H
#define NB_API_ADAPT_H

#include <stdint.h>

#include "compress/compress.h"
#include "inter/exchange.h"
#include "inter/sched.h"

/* The slowest peer link's estimate of ex (NULL: none): its goodput (0 while any link has none
 * yet) and the longest RTTs. */
void nb_adapt_estimate(nb_exchange_t* ex, nb_estimate_t* out);

/* The scheduler's input for round `round` as far as the link and the codec say: the estimate
 * of ex (nb_adapt_estimate), bounded by cap_Bps (> 0: the link's rate, the cap we apply or the
 * emulated link's; a burst after an idle gap can make a sample look faster than the link) and,
 * with hint_cap, 90 % of cap_Bps while nothing has measured the link yet (TCP, TLS and gRPC
 * framing take the rest: the small frames of a thin link may never measure it); the codec's
 * bits per kept value (the value type's, with one fp32 scale per block of 256) and per index
 * (delta+varint, about log2(1/density) / 7 bytes, or log2(chunk) bits with a chunked top-k) at
 * `density`, n_params, one link per peer. The caller sets the compute and the round's
 * shape (steps, step_compute_s, round_s, hide_steps). */
void nb_adapt_input(nb_exchange_t* ex, uint64_t round, double cap_Bps, int hint_cap, nb_values_t v,
                    double density, uint32_t chunk, uint64_t n_params, nb_sched_input_t* in);

/* Starts the idle-link bandwidth probes on every peer link of ex (frames may be too small to
 * measure a link: inter/link.h). */
nb_status_t nb_adapt_probes_start(nb_exchange_t* ex);

#endif
