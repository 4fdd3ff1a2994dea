/* Link estimator: an EWMA of transfer goodput with a change detector (a run of samples all on one
 * side of the average, far from it, restarts the average at their mean), and RFC 6298 smoothing
 * of RTT plus a windowed minimum. Not a model of TCP: it reports what transfers achieved. */
#include "inter/estimator.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "common/common.h"

NB_PARAM_DOUBLE(EstAlpha, "NB_EST_ALPHA", 0.3, 0.01, 1.0,
                "link estimator: EWMA weight of a new goodput sample")
NB_PARAM_INT(EstMinSampleBytes, "NB_EST_MIN_SAMPLE_BYTES", 65536, 1, 1073741824,
             "link estimator: transfers smaller than this feed RTT only, not goodput")
NB_PARAM_INT(EstChangeSamples, "NB_EST_CHANGE_SAMPLES", 3, 1, 64,
             "link estimator: consecutive far-off goodput samples that restart the average")
NB_PARAM_DOUBLE(EstChangeRatio, "NB_EST_CHANGE_RATIO", 0.25, 0.01, 0.99,
                "link estimator: relative deviation from the average that counts as far off")

#define EST_RTT_WINDOW_MAX 1024

struct nb_estimator {
  pthread_mutex_t mu;
  nb_estimator_config_t cfg;
  nb_estimate_t e;
  double last_goodput_s; /* clock time (s) of the last goodput sample */
  double run[64];        /* the current run of far-off samples */
  uint32_t run_len;
  int run_side; /* +1 above, -1 below */
  double rtt_ring[EST_RTT_WINDOW_MAX];
  uint32_t rtt_head, rtt_count;
  nb_clock_t clk; /* stamps samples: updated_s and staleness */
};

static double est_now_s(const nb_estimator_t* est) {
  return (double)est->clk.now_ns(est->clk.ctx) * 1e-9;
}

void nb_estimator_config_default(nb_estimator_config_t* cfg) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->alpha = nb_param_EstAlpha();
  cfg->min_bytes = (uint64_t)nb_param_EstMinSampleBytes();
  cfg->change_samples = (uint32_t)nb_param_EstChangeSamples();
  cfg->change_ratio = nb_param_EstChangeRatio();
  cfg->rtt_window = 32;
  cfg->stale_s = 120.0;
}

nb_status_t nb_estimator_create(const nb_estimator_config_t* cfg, nb_estimator_t** out) {
  return nb_estimator_create_clock(cfg, NULL, out);
}

nb_status_t nb_estimator_create_clock(const nb_estimator_config_t* cfg, const nb_clock_t* clk,
                                      nb_estimator_t** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "estimator: out is NULL");
  *out = NULL;
  if (clk && !clk->now_ns) return nb_error(NB_ERR_INVALID, "estimator: the clock lacks now_ns");
  nb_estimator_config_t c;
  if (cfg)
    c = *cfg;
  else
    nb_estimator_config_default(&c);
  if (!(c.alpha > 0.0 && c.alpha <= 1.0))
    return nb_error(NB_ERR_INVALID, "estimator: alpha must be in (0, 1], got %g", c.alpha);
  if (c.change_samples < 1 || c.change_samples > 64)
    return nb_error(NB_ERR_INVALID, "estimator: change_samples must be in [1, 64], got %u",
                    c.change_samples);
  if (!(c.change_ratio > 0.0 && c.change_ratio < 1.0))
    return nb_error(NB_ERR_INVALID, "estimator: change_ratio must be in (0, 1), got %g",
                    c.change_ratio);
  if (c.rtt_window < 1 || c.rtt_window > EST_RTT_WINDOW_MAX)
    return nb_error(NB_ERR_INVALID, "estimator: rtt_window must be in [1, %d], got %u",
                    EST_RTT_WINDOW_MAX, c.rtt_window);
  if (!(c.stale_s >= 0.0) || !isfinite(c.stale_s))
    return nb_error(NB_ERR_INVALID, "estimator: stale_s must be finite and >= 0, got %g",
                    c.stale_s);
  nb_estimator_t* est = NULL;
  NB_CHECK(nb_calloc((void**)&est, 1, sizeof *est, "link estimator"));
  if (pthread_mutex_init(&est->mu, NULL) != 0) {
    nb_free(est);
    return nb_error(NB_ERR_SYSTEM, "estimator: pthread_mutex_init failed");
  }
  est->cfg = c;
  est->clk = clk ? *clk : *nb_clock_real();
  *out = est;
  return NB_OK;
}

void nb_estimator_destroy(nb_estimator_t* est) {
  if (!est) return;
  pthread_mutex_destroy(&est->mu);
  nb_free(est);
}

/* Restarts the goodput average at value g. Caller holds mu. */
static void est_restart(nb_estimator_t* est, double g, const char* why) {
  if (est->e.transfer_samples > 0)
    NB_INFO(WIRE, "estimator: goodput average restarted (%s): %.3f -> %.3f Mbit/s", why,
            est->e.goodput_Bps * 8e-6, g * 8e-6);
  est->e.goodput_Bps = g;
  est->e.goodput_max_Bps = g;
  est->e.restarts += est->e.transfer_samples > 0;
  est->run_len = 0;
  est->run_side = 0;
}

/* One goodput sample g (bytes/s) into the EWMA and the change detector. streams 0: keep the
 * current stream count (probes travel on one connection of their own and say nothing about the
 * data streams). Caller holds mu. */
static void est_goodput_sample(nb_estimator_t* est, double g, uint32_t streams, double now) {
  nb_estimate_t* e = &est->e;
  e->goodput_last_Bps = g;
  if (streams == 0) streams = e->transfer_samples ? e->streams : 1;
  if (e->transfer_samples == 0) {
    est_restart(est, g, "first sample");
  } else if (streams != e->streams) {
    est_restart(est, g, "stream count changed");
  } else if (est->cfg.stale_s > 0.0 && now - est->last_goodput_s > est->cfg.stale_s) {
    est_restart(est, g, "estimate stale");
  } else {
    double dev = (g - e->goodput_Bps) / e->goodput_Bps;
    int side = dev > est->cfg.change_ratio ? 1 : (dev < -est->cfg.change_ratio ? -1 : 0);
    if (side != 0 && side == est->run_side) {
      est->run[est->run_len++] = g;
    } else if (side != 0) {
      est->run_side = side;
      est->run_len = 0;
      est->run[est->run_len++] = g;
    } else {
      est->run_side = 0;
      est->run_len = 0;
    }
    if (est->run_len >= est->cfg.change_samples) {
      double sum = 0.0;
      for (uint32_t i = 0; i < est->run_len; ++i) sum += est->run[i];
      est_restart(est, sum / est->run_len, side > 0 ? "link got faster" : "link got slower");
    } else {
      e->goodput_Bps += est->cfg.alpha * (g - e->goodput_Bps);
      if (g > e->goodput_max_Bps) e->goodput_max_Bps = g;
    }
  }
  e->streams = streams;
  e->transfer_samples++;
  est->last_goodput_s = now;
}

nb_status_t nb_estimator_add_transfer(nb_estimator_t* est, uint64_t bytes, double seconds,
                                      uint32_t streams) {
  if (!est) return nb_error(NB_ERR_INVALID, "estimator: estimator is NULL");
  if (bytes == 0) return nb_error(NB_ERR_INVALID, "estimator: transfer of 0 bytes");
  if (!isfinite(seconds) || seconds <= 0.0)
    return nb_error(NB_ERR_INVALID, "estimator: transfer time must be finite and > 0, got %g",
                    seconds);
  if (streams == 0) return nb_error(NB_ERR_INVALID, "estimator: transfer over 0 streams");
  double now = est_now_s(est);
  pthread_mutex_lock(&est->mu);
  est->e.bytes_total += bytes;
  est->e.seconds_total += seconds;
  est->e.updated_s = now;
  if (bytes >= est->cfg.min_bytes) /* smaller ones say nothing about bandwidth: mostly RTTs */
    est_goodput_sample(est, (double)bytes / seconds, streams, now);
  pthread_mutex_unlock(&est->mu);
  return NB_OK;
}

nb_status_t nb_estimator_add_probe(nb_estimator_t* est, uint64_t bytes, double seconds) {
  if (!est) return nb_error(NB_ERR_INVALID, "estimator: estimator is NULL");
  if (bytes == 0) return nb_error(NB_ERR_INVALID, "estimator: probe of 0 bytes");
  if (!isfinite(seconds) || seconds <= 0.0)
    return nb_error(NB_ERR_INVALID, "estimator: probe time must be finite and > 0, got %g",
                    seconds);
  double now = est_now_s(est);
  pthread_mutex_lock(&est->mu);
  /* The probe's time is one round trip plus its bytes at the bottleneck rate; the round trip
   * is the smallest one seen lately (queueing excluded). At least 5% of the time is kept as
   * transfer time, so a probe faster than the RTT floor cannot claim an infinite rate. */
  double t = seconds - est->e.rtt_min_s;
  if (t < 0.05 * seconds) t = 0.05 * seconds;
  est->e.probe_samples++;
  est->e.updated_s = now;
  est_goodput_sample(est, (double)bytes / t, 0, now);
  pthread_mutex_unlock(&est->mu);
  return NB_OK;
}

nb_status_t nb_estimator_add_rtt(nb_estimator_t* est, double rtt_s) {
  if (!est) return nb_error(NB_ERR_INVALID, "estimator: estimator is NULL");
  if (!isfinite(rtt_s) || rtt_s <= 0.0)
    return nb_error(NB_ERR_INVALID, "estimator: RTT must be finite and > 0, got %g", rtt_s);
  pthread_mutex_lock(&est->mu);
  nb_estimate_t* e = &est->e;
  if (e->rtt_samples == 0) {
    e->rtt_s = rtt_s;
    e->rtt_var_s = rtt_s / 2.0;
  } else {
    e->rtt_var_s = 0.75 * e->rtt_var_s + 0.25 * fabs(e->rtt_s - rtt_s);
    e->rtt_s = 0.875 * e->rtt_s + 0.125 * rtt_s;
  }
  e->rtt_last_s = rtt_s;
  e->rtt_samples++;
  uint32_t w = est->cfg.rtt_window;
  est->rtt_ring[est->rtt_head] = rtt_s;
  est->rtt_head = (est->rtt_head + 1) % w;
  if (est->rtt_count < w) est->rtt_count++;
  double mn = rtt_s;
  for (uint32_t i = 0; i < est->rtt_count; ++i)
    if (est->rtt_ring[i] < mn) mn = est->rtt_ring[i];
  e->rtt_min_s = mn;
  e->updated_s = est_now_s(est);
  pthread_mutex_unlock(&est->mu);
  return NB_OK;
}

void nb_estimator_get(nb_estimator_t* est, nb_estimate_t* out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!est) return;
  pthread_mutex_lock(&est->mu);
  *out = est->e;
  pthread_mutex_unlock(&est->mu);
}

double nb_estimator_predict_s(nb_estimator_t* est, uint64_t bytes) {
  nb_estimate_t e;
  nb_estimator_get(est, &e);
  if (e.goodput_Bps <= 0.0) return -1.0;
  return e.rtt_s + (double)bytes / e.goodput_Bps;
}
