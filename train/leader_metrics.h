/* The Prometheus metrics of a cluster's leader (docs/operations.md): the families it exports and
 * their update after each round, shared by `nebula worker` rank 0 and the public API's session
 * (api/session.c), which is why they sit on train/, below both. The exposition and the HTTP
 * listener are common/prom's; what a round measured is its caller's. */
#ifndef NB_TRAIN_LEADER_METRICS_H
#define NB_TRAIN_LEADER_METRICS_H

#include <stdint.h>

#include "common/prom.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the leader knows after a round: totals since this run started, and the round's own. */
typedef struct {
  long round, rounds;           /* rounds done (1-based), planned */
  long step, max_steps;         /* inner steps done, planned */
  double loss;                  /* the round's mean inner training loss */
  double density;               /* of our frame this round */
  uint64_t wan_sent;            /* bytes put on the WAN, total */
  uint64_t wan_received;        /* peers' frames received, total bytes */
  double goodput_Bps, rtt_s;    /* the slowest peer link's estimate (0: none yet) */
  int peers, peers_alive;       /* other clusters; those answering their heartbeat */
  uint64_t applied;             /* rounds applied (theta_global's version) */
  long skipped, late;           /* rounds not applied; held and applied late */
  double compute_s, exchange_s; /* totals */
} nb_leader_figures_t;

/* Declares the leader's families on a new registry, labelled by job and cluster in
 * nebula_leader_info, and serves it on listen ("HOST:PORT", common/prom.h). job, cluster,
 * listen: borrowed. out: freed with nb_prom_destroy. Returns NB_OK, NB_ERR_INVALID (a malformed
 * address), NB_ERR_UNAVAILABLE (address in use), NB_ERR_SYSTEM, NB_ERR_NOMEM. */
nb_status_t nb_leader_metrics_start(const char* listen, const char* job, const char* cluster,
                                    nb_prom_t** out);

/* Sets every family from f. p NULL: nothing. Thread-safe (common/prom). */
void nb_leader_metrics_round(nb_prom_t* p, const nb_leader_figures_t* f);

/* The held-out evaluation: mean bits per byte on theta_global after round `round`. */
void nb_leader_metrics_eval(nb_prom_t* p, long round, double mean_bpb);

#ifdef __cplusplus
}
#endif
#endif
