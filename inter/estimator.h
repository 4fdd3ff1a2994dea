/* Bandwidth and RTT estimator of one WAN link, fed by every real transfer (bytes moved, seconds
 * taken, streams used) and by pings; read by the adaptive scheduler (inter/sched.h). It smooths,
 * and it notices a changed link rate within a few samples. It does not probe the link itself and
 * does not send anything: the link layer feeds it. */
#ifndef NB_INTER_ESTIMATOR_H
#define NB_INTER_ESTIMATOR_H

#include <stdint.h>

#include "common/clock.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_estimator nb_estimator_t;

typedef struct {
  double alpha;            /* EWMA weight of a new goodput sample, (0, 1]; default NB_EST_ALPHA */
  uint64_t min_bytes;      /* transfers smaller than this feed RTT only, not goodput (they measure
                              latency, not bandwidth); default NB_EST_MIN_SAMPLE_BYTES */
  uint32_t change_samples; /* this many consecutive goodput samples beyond change_ratio of the
                              smoothed value (same side) restart the average at their mean;
                              default NB_EST_CHANGE_SAMPLES, >= 1 */
  double change_ratio;     /* relative deviation that counts as "beyond", (0, 1); default
                              NB_EST_CHANGE_RATIO */
  uint32_t rtt_window;     /* min RTT is the minimum of the last rtt_window samples, 1..1024;
                              default 32 */
  double stale_s;          /* a goodput sample arriving after this long without one restarts
                              the average; 0 = never; default 120 */
} nb_estimator_config_t;

typedef struct {
  double goodput_Bps;      /* smoothed goodput, bytes/s; 0 until the first transfer sample */
  double goodput_last_Bps; /* the latest goodput sample */
  double goodput_max_Bps;  /* largest sample since the last restart of the average */
  uint32_t streams;        /* streams of the latest transfer sample */
  double rtt_s;            /* smoothed RTT (RFC 6298, alpha 1/8); 0 until the first RTT sample */
  double rtt_var_s;        /* RTT mean deviation (RFC 6298, beta 1/4) */
  double rtt_min_s;        /* minimum over the RTT window */
  double rtt_last_s;       /* latest RTT sample */
  uint64_t transfer_samples, rtt_samples; /* goodput samples (transfers and probes), RTTs */
  uint64_t probe_samples;                 /* goodput samples that came from probes */
  uint64_t restarts;    /* times the goodput average was restarted (change, streams, stale) */
  uint64_t bytes_total; /* bytes of every transfer reported */
  double seconds_total; /* seconds of every transfer reported */
  double updated_s;     /* time (s, the estimator's clock: nb_now_s by default) of the latest
                           sample of either kind, 0 = none */
} nb_estimate_t;

/* Fills cfg with defaults (from the NB_EST_* environment parameters). */
void nb_estimator_config_default(nb_estimator_config_t* cfg);

/* Creates an estimator. cfg NULL = defaults; cfg is copied. Returns NB_ERR_INVALID naming a bad
 * field, NB_ERR_NOMEM. *out is owned by the caller (nb_estimator_destroy). */
nb_status_t nb_estimator_create(const nb_estimator_config_t* cfg, nb_estimator_t** out);

/* As nb_estimator_create, with the time source clk (NULL = nb_clock_real()) for updated_s and for
 * cfg->stale_s, so tests can age an estimate in virtual time. Only clk->now_ns is used. clk is
 * copied; its ctx is borrowed and must outlive the estimator. Returns also NB_ERR_INVALID for a
 * clock without now_ns. */
nb_status_t nb_estimator_create_clock(const nb_estimator_config_t* cfg, const nb_clock_t* clk,
                                      nb_estimator_t** out);

/* NULL ok. */
void nb_estimator_destroy(nb_estimator_t* est);

/* Reports one finished transfer: `bytes` payload bytes delivered in `seconds` (wall time from the
 * first byte sent to the last acknowledged) over `streams` parallel streams. A change of the
 * stream count restarts the goodput average. Returns NB_ERR_INVALID for bytes 0, seconds not
 * finite or <= 0, streams 0. Thread-safe. */
nb_status_t nb_estimator_add_transfer(nb_estimator_t* est, uint64_t bytes, double seconds,
                                      uint32_t streams);

/* Reports one bandwidth probe: `bytes` sent in one request that took `seconds` until its
 * (small) answer came back. Its goodput sample is bytes / (seconds - minimum RTT), so probes
 * smaller than a bandwidth-delay product still measure the rate rather than the latency (feed
 * RTT samples first; without any the whole time counts). Probes bypass min_bytes and do not
 * change the stream count. NB_ERR_INVALID for bytes 0, seconds not finite or <= 0.
 * Thread-safe. */
nb_status_t nb_estimator_add_probe(nb_estimator_t* est, uint64_t bytes, double seconds);

/* Reports one round-trip time sample in seconds (ping or request/ack). NB_ERR_INVALID for a
 * value not finite or <= 0. Thread-safe. */
nb_status_t nb_estimator_add_rtt(nb_estimator_t* est, double rtt_s);

/* Copies the current estimate. Thread-safe. */
void nb_estimator_get(nb_estimator_t* est, nb_estimate_t* out);

/* Predicted seconds to move `bytes` in one transfer: one RTT plus bytes at the smoothed goodput.
 * Returns -1 while there is no goodput estimate. Thread-safe. */
double nb_estimator_predict_s(nb_estimator_t* est, uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
