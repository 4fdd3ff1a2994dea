/* api/driven: the public session (include/nebula.h) driving a local model that runs its own inner
 * steps: `nebula worker` is a client of the session through these calls, so that connecting,
 * agreeing on the table, the round, fault-tolerant rounds, rejoin, catching up, the final check
 * and checkpoints are one path for a user's program and the built-in worker (docs/api.md,
 * "The built-in worker"). A driven session registers no tensors: its table is the local model's
 * parameter count, and its rounds run the model's steps inside the hybrid round (overlap with
 * tau and early landing, wall-time rounds, the step and dense modes, the ranks' hook).
 * Internal: not exported by libnebula (the names are not nb_session_*). */
#ifndef NB_API_DRIVEN_H
#define NB_API_DRIVEN_H

#include <nebula.h>
#include <stddef.h>
#include <stdint.h>

#include "inter/exchange.h"
#include "train/hybrid.h"

typedef struct {
  /* The local model, with steps (nb_hybrid_round runs them); ctx must outlive the session. */
  nb_hybrid_local_t local;
  /* The round's config: every field but the exchange callbacks and their context (the session's)
   * and final_wait_s (the options'). cluster_index, n_clusters, outer_lr, outer_momentum and
   * norm_bound must equal the options' (the start message carries the options'). */
  nb_hybrid_config_t hc;
  /* The link: streams per peer, chunk bytes (0 = the exchange's defaults) and the rate taken as
   * the link's until measured (0 = none); the options' rate_mbit stays the cap of our sends. */
  uint32_t streams;
  size_t chunk_bytes;
  double rate_hint_Bps;
} nb_driven_t;

/* nb_session_open for a driven local model: the options as there (adaptive, values "auto",
 * progress_file and metrics_listen are the caller's business: they must be off), the round's
 * config and the link from *d. Every cluster's model starts from the same values by
 * construction (one seed), so nb_session_start sends none: the first round's hash check finds a
 * cluster that does not (NB_ERR_INTEGRITY). Errors of nb_session_open, NB_ERR_CONFIG for an
 * option a driven session does not take. */
nb_status_t nb_driven_open(const nb_session_options_t* o, const nb_driven_t* d, nb_session_t** out);

/* One round of a driven session: the model's inner steps and the exchange (nb_hybrid_round),
 * then for fault-tolerant rounds a catch-up pull when the others applied rounds we cannot replay
 * (rec->need_state; nb_driven_pulled_from names the peer) and our state published. *rec: the
 * hybrid's record (with overlap: of the update that landed in this round). Errors as
 * nb_session_round. */
nb_status_t nb_driven_round(nb_session_t* s, nb_hybrid_round_t* rec);

/* With overlap: the update in flight lands now (a checkpoint, the run's end), with the catch-up
 * and publishing of nb_driven_round. *rec as nb_hybrid_drain's. */
nb_status_t nb_driven_drain(nb_session_t* s, nb_hybrid_round_t* rec);

/* The session's round state (between rounds: the scheduler's setters, the gradient of the step
 * and dense modes, counters) and exchange (the link's estimates; NULL for one cluster). */
nb_hybrid_t* nb_driven_hybrid(nb_session_t* s);
nb_exchange_t* nb_driven_exchange(nb_session_t* s);
/* Bytes of peers' frames received since open. */
uint64_t nb_driven_received(const nb_session_t* s);
/* The peer whose state the last pull (start with rejoin, or a catch-up) adopted; "?" before. */
const char* nb_driven_pulled_from(const nb_session_t* s);

#endif
