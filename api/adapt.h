/* api/adapt: the adaptive scheduler (inter/sched.h) of one cluster, shared by the public
 * session's adaptive density (api/session.c) and `nebula worker`: what it reads of a live
 * exchange and of a codec (the slowest peer link's estimate, the scheduler's input from it), the
 * idle-link probes, and the decision of each next round (nb_adapt_next). Internal: not exported
 * by libnebula. */
#ifndef NB_API_ADAPT_H
#define NB_API_ADAPT_H

#include <stdint.h>

#include "api/codec_points.h"
#include "compress/compress.h"
#include "inter/exchange.h"
#include "inter/sched.h"
#include "train/hybrid.h"

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

/* ---- one cluster's adaptive scheduler: `nebula worker`'s and the public session's --------- */

/* exchanges whose measured time stands for the model's prediction (nb_sched_input_t.observed_*) */
#define NB_ADAPT_OBSERVED 3

typedef struct {
  nb_sched_config_t cfg; /* the caller's; cfg.overlap may change between rounds */
  double cap_Bps;        /* the link's rate per peer as an operator caps it (0: none) */
  int hint_cap;          /* 1: 90 % of cap_Bps until a transfer has measured the link */
  int auto_codec;        /* values "auto": each round a codec point of `codec` */
  nb_codec_auto_t codec;
  int have_dec;
  nb_sched_decision_t dec; /* the last decision */
  /* overlap: the model bytes of round r's frame (the decision it was made under) at [r % 4],
   * and the last NB_ADAPT_OBSERVED exchanges that landed: (seconds, model bytes) */
  double sent_bytes[4];
  double obs_s[NB_ADAPT_OBSERVED], obs_bytes[NB_ADAPT_OBSERVED];
  int n_obs;
} nb_adapt_t;

/* The round just done, as the next decision takes it. */
typedef struct {
  uint64_t round;     /* 0-based */
  nb_values_t values; /* of its frame */
  uint32_t topk_chunk;
  double density;
  uint64_t n_params;
  uint32_t steps;         /* H of the next round as it stands */
  double step_compute_s;  /* one inner step's compute (0: not measured) */
  double round_s;         /* wall-time rounds: the budget (0: counted steps) */
  uint32_t hide_steps;    /* overlap: the steps the exchange hides under (tau); 0: the round */
  double exchange_took_s; /* overlap inside the hybrid (cfg.overlap; the worker's): how long
                             the update that landed in this round, round - 1's frame, took from
                             its exchange's start to its decision (0: none landed); the slowest
                             of the last NB_ADAPT_OBSERVED stands for the model's prediction of
                             frames no larger than the smallest of theirs */
  int set_steps;          /* 1: the decision's H (a lengthened round) and tau go to the hybrid
                             too; 0: its density (and codec point) only */
} nb_adapt_round_t;

/* The next round's decision (*in: its input, *dec: the decision; both the caller's): the link's
 * estimate of ex through nb_adapt_input, the round's figures, the measured exchanges; then
 * nb_sched_decide, or with values "auto" nb_codec_auto_pick (which sets h's codec); then h's
 * density (and with set_steps its H and tau). Errors of those; on error the last decision and
 * h's density stay. */
nb_status_t nb_adapt_next(nb_adapt_t* a, nb_exchange_t* ex, nb_hybrid_t* h,
                          const nb_adapt_round_t* r, nb_sched_input_t* in,
                          nb_sched_decision_t* dec);

#endif
