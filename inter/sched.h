/* The adaptive scheduler's decision: from the link's measured goodput and RTT and the measured
 * compute time per inner step, pick the top-k density of the next round so that its transfer fits
 * under the compute it can really hide under (overlap on: the tau inner steps after which the
 * update must land, or the whole round) or within a fraction of the round's compute; at the
 * density floor, let the update land later (a larger tau, up to the round's end), then lengthen
 * the round. Pure logic on numbers: it does not measure, sleep, send or train; the
 * training loop calls nb_sched_decide once per round and applies the result. */
#ifndef NB_INTER_SCHED_H
#define NB_INTER_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "inter/estimator.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  double density_floor;   /* lowest density, (0, density_ceiling]; default NB_SCHED_DENSITY_FLOOR */
  double density_ceiling; /* highest density, <= 1; default NB_SCHED_DENSITY_CEILING */
  double initial_density; /* used while there is no measurement yet; clamped to [floor, ceiling];
                             default NB_SCHED_INITIAL_DENSITY */
  int overlap;            /* 1: the exchange runs during the next round's compute (budget =
                             headroom x compute); 0: it stalls training (budget = fraction x
                             compute) */
  double headroom;        /* share of compute the transfer may fill with overlap, (0, 1];
                             default NB_SCHED_HEADROOM */
  double fraction;        /* share of compute the transfer may take without overlap, (0, 1];
                             default NB_SCHED_FRACTION */
  double rtts_per_round;  /* fixed round trips each exchange costs (the last chunk's way out
                             and the peers' votes or acks back), >= 0; default 1 */
  double header_bytes;    /* fixed bytes per frame (headers, seal tags), >= 0; default 1024 */
  uint32_t max_steps_factor; /* a lengthened round has at most factor x base steps, >= 1;
                                default NB_SCHED_MAX_STEPS_FACTOR */
  double hysteresis;         /* keep the previous density while the new fit is above it by less
                                than this fraction (never when the previous one no longer fits),
                                [0, 1); default NB_SCHED_HYSTERESIS */
} nb_sched_config_t;

typedef struct {
  uint64_t round;        /* the round this decision is for (for the log) */
  double goodput_Bps;    /* measured goodput of the link, bytes/s; 0 = unknown yet */
  double rtt_s;          /* smoothed RTT, seconds; 0 = unknown (counted as 0) */
  double step_compute_s; /* measured compute time of one inner step; 0 = unknown yet */
  uint32_t steps;        /* base inner steps per round (H), >= 1 */
  uint64_t n_params;     /* synced parameters, >= 1 */
  double bits_per_value; /* codec bits per kept value, (0, 64] */
  double bits_per_index; /* codec bits per kept index, [0, 64] */
  uint32_t fanout;       /* frames sent over this link per round (peers sharing it), >= 1; 0 = 1 */
  double round_s;        /* wall-time rounds (heterogeneous clusters): the base round budget in
                            seconds; step_compute_s is then not needed and steps is passed
                            through. 0 = a round is `steps` inner steps */
  uint32_t hide_steps;   /* with cfg.overlap: the update should land this many inner steps into
                            the next round (sync.overlapSteps, tau), so the frame's data must fit
                            under those (the round trips of the exchange are added on top: the
                            decision's hide_steps says when it lands); 0, or >= steps: the whole
                            round. Needs step_compute_s (in wall-time rounds too; without it the
                            whole round counts) */
  double observed_s;     /* measured: a recent exchange of a frame of observed_bytes took this
                            long from its start to its decision (round trips, the peers' own
                            start, the vote: everything); a frame no larger is then taken to need
                            no longer than that, whatever goodput and RTT say (a shaper's burst
                            passes a small frame faster than its rate). 0 = none */
  double observed_bytes; /* that frame's size as a decision counts it (its `bytes`: the same
                            model, header and fanout included, so that sizes compare) */
} nb_sched_input_t;

typedef enum {
  NB_SCHED_NO_ESTIMATE = 0,     /* goodput or compute time not measured yet: initial density */
  NB_SCHED_FIT = 1,             /* density chosen so the transfer fits the budget */
  NB_SCHED_CEILING = 2,         /* the link could carry more: density at the ceiling */
  NB_SCHED_HOLD = 3,            /* the fit rose less than the hysteresis: previous density kept */
  NB_SCHED_FLOOR_LENGTHEN = 4,  /* at the floor; the round is lengthened so the transfer fits */
  NB_SCHED_FLOOR_MAX_STEPS = 5, /* at the floor and the longest round: the transfer still does
                                   not fit; training will wait on the link */
  NB_SCHED_FLOOR_LATER = 6,     /* at the floor; the update lands later in the next round (a
                                   larger hide_steps, still inside the round) so the transfer fits */
} nb_sched_reason_t;

typedef struct {
  nb_sched_input_t in; /* the inputs, copied */
  nb_sched_reason_t reason;
  double density;      /* chosen top-k density, in [floor, ceiling] */
  uint64_t k;          /* kept values: ceil(density x n_params), >= 1, <= n_params */
  uint32_t steps;      /* inner steps of the next round, >= in.steps (= in.steps in wall-time
                          mode) */
  uint32_t hide_steps; /* inner steps after which the next round's update must land: in.hide_steps,
                          raised at the floor (NB_SCHED_FLOOR_LATER); 0 when in.hide_steps is 0 or
                          no longer below the round's steps (the update lands at the round's end) */
  double density_fit;  /* unclamped density that exactly fills the budget at in.steps (may
                          be < 0 when even the fixed costs do not fit); 0 with no estimate */
  double bytes;        /* predicted frame bytes x fanout */
  double transfer_s;   /* predicted transfer time */
  double compute_s;    /* the next round's compute: steps x step_compute_s, or in wall-time mode
                          its wall budget (>= in.round_s; lengthened at the floor) */
  double budget_s;     /* the share of the compute it hides under (hide_steps x step_compute_s,
                          or compute_s) that the transfer may take */
} nb_sched_decision_t;

/* Fills cfg with defaults (NB_SCHED_* environment parameters); overlap defaults to 1. */
void nb_sched_config_default(nb_sched_config_t* cfg);

/* Checks a configuration; NB_ERR_INVALID names the first bad field. */
nb_status_t nb_sched_config_check(const nb_sched_config_t* cfg);

/* Copies goodput and RTT from an estimate into in (other fields untouched). The RTT is the
 * windowed minimum (the smoothed one while there is none): the fixed round trips of an exchange
 * cost the link's latency, while queueing behind our own traffic is already in the goodput. */
void nb_sched_input_from_estimate(nb_sched_input_t* in, const nb_estimate_t* est);

/* Decides the next round. cfg, in: borrowed. prev: the previous round's decision or NULL (used
 * for hysteresis only). out: written on NB_OK. Logs the decision under NB_DEBUG_SUBSYS=SCHED.
 * Returns NB_ERR_INVALID naming the bad config field or input (negative, NaN or infinite numbers,
 * steps 0, n_params 0, bits out of range). Pure and thread-safe. */
nb_status_t nb_sched_decide(const nb_sched_config_t* cfg, const nb_sched_input_t* in,
                            const nb_sched_decision_t* prev, nb_sched_decision_t* out);

/* A point of the codec the scheduler may choose: a row of the quality table measured by
 * `nebula bench pareto` (docs/hybrid.md). */
typedef struct {
  const char* name;      /* for the log, e.g. "top1.5-2bit"; borrowed */
  double density;        /* top-k density, (0, 1]; 1 = a dense frame */
  double bits_per_value; /* bits per kept value, scales included, (0, 64] */
  double bits_per_index; /* bits per kept index, [0, 64] (0 for a dense frame) */
  double loss_cost;      /* held-out loss ratio - 1 against the exact single-cluster run; the
                            lower the better; finite */
  /* Where the update lands matters too (a later update is staler). loss_cost was measured with
   * the update landing `land` of the way into the next round (tau / H, e.g. 4 / 32), and
   * loss_cost_late with it landing land_late of the way (e.g. 24 / 32). With land_late > land
   * the pick weighs each point at the landing its transfer needs, linearly between the two and
   * beyond (at most to the round's end); land_late 0: loss_cost wherever it lands. */
  double land, land_late, loss_cost_late;
} nb_sched_point_t;

/* The loss cost of point p when its update lands at fraction f of the next round (see above). */
double nb_sched_point_cost(const nb_sched_point_t* p, double f);

/* Picks the point of `points` (n >= 1) for the next round: among those whose transfer fits
 * the round (as nb_sched_decide: under tau steps with overlap, or landing later in the round,
 * floor_later; else under the round), the least loss cost at the landing each needs
 * (nb_sched_point_cost); if none fits, the point of fewest bytes, with the round lengthened. A
 * point is kept over a better one that would fill more than (1 - hysteresis) of its budget (reason
 * hold), so that a link near a boundary does not flip the codec every round. Without an estimate
 * the point of fewest bytes (no_estimate). *index: the chosen point; out: its decision as
 * nb_sched_decide makes it for that point's density (reason ceiling when the chosen point is the
 * table's best, fit when the link made it choose a cheaper one). prev: the previous decision
 * and prev_index its point, or NULL. Returns NB_ERR_INVALID for a bad table entry (naming it),
 * config or input. Pure and thread-safe. */
nb_status_t nb_sched_pick(const nb_sched_config_t* cfg, const nb_sched_input_t* in,
                          const nb_sched_point_t* points, size_t n, const nb_sched_decision_t* prev,
                          size_t prev_index, nb_sched_decision_t* out, size_t* index);

/* Short constant name of a reason ("fit", "floor_lengthen", ...); never NULL. */
const char* nb_sched_reason_name(nb_sched_reason_t r);

/* Writes the decision as one log line of key=value pairs (no newline) into buf (always
 * NUL-terminated when len > 0). Returns the length it needed, as snprintf. */
int nb_sched_decision_format(const nb_sched_decision_t* d, char* buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
