/* Adaptive scheduler decision: a closed-form fit of density to the round's transfer budget, then
 * clamping, hysteresis and round lengthening at the floor. Transfer model: fixed round trips plus
 * (header + density x params x bits / 8) x fanout bytes at the measured goodput. Not a
 * controller with memory: the previous decision is passed in, and only used for hysteresis. */
#include "inter/sched.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

NB_PARAM_DOUBLE(SchedDensityFloor, "NB_SCHED_DENSITY_FLOOR", 0.0001, 1e-9, 1.0,
                "adaptive scheduler: lowest top-k density; below it rounds are lengthened")
NB_PARAM_DOUBLE(SchedDensityCeiling, "NB_SCHED_DENSITY_CEILING", 0.1, 1e-9, 1.0,
                "adaptive scheduler: highest top-k density")
NB_PARAM_DOUBLE(SchedInitialDensity, "NB_SCHED_INITIAL_DENSITY", 0.01, 1e-9, 1.0,
                "adaptive scheduler: density used before the link and compute are measured")
NB_PARAM_DOUBLE(SchedHeadroom, "NB_SCHED_HEADROOM", 0.9, 0.01, 1.0,
                "adaptive scheduler: share of a round's compute the transfer may fill (overlap on)")
NB_PARAM_DOUBLE(
    SchedFraction, "NB_SCHED_FRACTION", 0.1, 0.001, 1.0,
    "adaptive scheduler: share of a round's compute the transfer may take (overlap off)")
NB_PARAM_INT(SchedMaxStepsFactor, "NB_SCHED_MAX_STEPS_FACTOR", 8, 1, 1000,
             "adaptive scheduler: a lengthened round has at most this many times the base steps")
NB_PARAM_DOUBLE(SchedHysteresis, "NB_SCHED_HYSTERESIS", 0.1, 0.0, 0.99,
                "adaptive scheduler: keep the density while the new fit is less than this above it")

void nb_sched_config_default(nb_sched_config_t* cfg) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->density_floor = nb_param_SchedDensityFloor();
  cfg->density_ceiling = nb_param_SchedDensityCeiling();
  cfg->initial_density = nb_param_SchedInitialDensity();
  cfg->overlap = 1;
  cfg->headroom = nb_param_SchedHeadroom();
  cfg->fraction = nb_param_SchedFraction();
  /* a frame's chunks follow its open at once and a fault-tolerant round's vote leaves when
   * the peers' updates are in (not after our update's acks): an exchange, vote included, is
   * at the peers one round trip after its last byte left (it was four: two per transfer) */
  cfg->rtts_per_round = 1.0;
  /* a frame's fixed cost on the wire: the hybrid message header (~100 bytes), the codec
   * frame's, the link's chunk header and GCM tag, protobuf, gRPC, HTTP/2 and TLS framing: a few
   * hundred bytes; 4096 made a 4.4 KiB frame on a 0.16 Mbit/s link look twice as long as it
   * took and the thin bench lengthened its rounds for it */
  cfg->header_bytes = 1024.0;
  cfg->max_steps_factor = (uint32_t)nb_param_SchedMaxStepsFactor();
  cfg->hysteresis = nb_param_SchedHysteresis();
}

static int fin_ge0(double x) {
  return isfinite(x) && x >= 0.0;
}

nb_status_t nb_sched_config_check(const nb_sched_config_t* c) {
  if (!c) return nb_error(NB_ERR_INVALID, "scheduler: config is NULL");
  if (!(isfinite(c->density_floor) && c->density_floor > 0.0))
    return nb_error(NB_ERR_INVALID, "scheduler: density_floor must be > 0, got %g",
                    c->density_floor);
  if (!(isfinite(c->density_ceiling) && c->density_ceiling <= 1.0 &&
        c->density_ceiling >= c->density_floor))
    return nb_error(NB_ERR_INVALID,
                    "scheduler: density_ceiling must be in [density_floor %g, 1], got %g",
                    c->density_floor, c->density_ceiling);
  if (!(isfinite(c->initial_density) && c->initial_density > 0.0 && c->initial_density <= 1.0))
    return nb_error(NB_ERR_INVALID, "scheduler: initial_density must be in (0, 1], got %g",
                    c->initial_density);
  if (!(isfinite(c->headroom) && c->headroom > 0.0 && c->headroom <= 1.0))
    return nb_error(NB_ERR_INVALID, "scheduler: headroom must be in (0, 1], got %g", c->headroom);
  if (!(isfinite(c->fraction) && c->fraction > 0.0 && c->fraction <= 1.0))
    return nb_error(NB_ERR_INVALID, "scheduler: fraction must be in (0, 1], got %g", c->fraction);
  if (!fin_ge0(c->rtts_per_round))
    return nb_error(NB_ERR_INVALID, "scheduler: rtts_per_round must be >= 0, got %g",
                    c->rtts_per_round);
  if (!fin_ge0(c->header_bytes))
    return nb_error(NB_ERR_INVALID, "scheduler: header_bytes must be >= 0, got %g",
                    c->header_bytes);
  if (c->max_steps_factor < 1)
    return nb_error(NB_ERR_INVALID, "scheduler: max_steps_factor must be >= 1");
  if (!(isfinite(c->hysteresis) && c->hysteresis >= 0.0 && c->hysteresis < 1.0))
    return nb_error(NB_ERR_INVALID, "scheduler: hysteresis must be in [0, 1), got %g",
                    c->hysteresis);
  return NB_OK;
}

static nb_status_t sched_input_check(const nb_sched_input_t* in) {
  if (!in) return nb_error(NB_ERR_INVALID, "scheduler: input is NULL");
  if (!fin_ge0(in->goodput_Bps))
    return nb_error(NB_ERR_INVALID, "scheduler: goodput must be finite and >= 0, got %g",
                    in->goodput_Bps);
  if (!fin_ge0(in->rtt_s))
    return nb_error(NB_ERR_INVALID, "scheduler: rtt must be finite and >= 0, got %g", in->rtt_s);
  if (!fin_ge0(in->step_compute_s))
    return nb_error(NB_ERR_INVALID, "scheduler: step compute time must be finite and >= 0, got %g",
                    in->step_compute_s);
  if (in->steps < 1) return nb_error(NB_ERR_INVALID, "scheduler: steps per round must be >= 1");
  if (!fin_ge0(in->observed_s) || !fin_ge0(in->observed_bytes))
    return nb_error(NB_ERR_INVALID,
                    "scheduler: observed exchange (%g s, %g bytes) must be finite and >= 0",
                    in->observed_s, in->observed_bytes);
  if (in->n_params < 1) return nb_error(NB_ERR_INVALID, "scheduler: no synced parameters");
  if (!(isfinite(in->bits_per_value) && in->bits_per_value > 0.0 && in->bits_per_value <= 64.0))
    return nb_error(NB_ERR_INVALID, "scheduler: bits per value must be in (0, 64], got %g",
                    in->bits_per_value);
  if (!fin_ge0(in->round_s))
    return nb_error(NB_ERR_INVALID, "scheduler: round wall budget must be finite and >= 0, got %g",
                    in->round_s);
  if (!(isfinite(in->bits_per_index) && in->bits_per_index >= 0.0 && in->bits_per_index <= 64.0))
    return nb_error(NB_ERR_INVALID, "scheduler: bits per index must be in [0, 64], got %g",
                    in->bits_per_index);
  return NB_OK;
}

void nb_sched_input_from_estimate(nb_sched_input_t* in, const nb_estimate_t* est) {
  if (!in || !est) return;
  in->goodput_Bps = est->goodput_Bps;
  /* the latency floor: queueing behind our own traffic is already in the measured goodput */
  in->rtt_s = est->rtt_min_s > 0 ? est->rtt_min_s : est->rtt_s;
}

const char* nb_sched_reason_name(nb_sched_reason_t r) {
  switch (r) {
    case NB_SCHED_NO_ESTIMATE:
      return "no_estimate";
    case NB_SCHED_FIT:
      return "fit";
    case NB_SCHED_CEILING:
      return "ceiling";
    case NB_SCHED_HOLD:
      return "hold";
    case NB_SCHED_FLOOR_LENGTHEN:
      return "floor_lengthen";
    case NB_SCHED_FLOOR_MAX_STEPS:
      return "floor_max_steps";
    case NB_SCHED_FLOOR_LATER:
      return "floor_later";
  }
  return "unknown";
}

static double clampd(double x, double lo, double hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

/* Seconds a frame of `bytes` needs, round trips included: the link's model (fixed_s + bytes / g),
 * or less where a measured exchange of a frame at least as large took less (in->observed_*). */
static double nb__sched_time(const nb_sched_input_t* in, double bytes, double fixed_s, double g) {
  double t = g > 0.0 ? fixed_s + bytes / g : INFINITY;
  if (in->observed_s > 0.0 && bytes <= in->observed_bytes && in->observed_s < t) t = in->observed_s;
  return t;
}

nb_status_t nb_sched_decide(const nb_sched_config_t* cfg, const nb_sched_input_t* in,
                            const nb_sched_decision_t* prev, nb_sched_decision_t* out) {
  if (!out) return nb_error(NB_ERR_INVALID, "scheduler: out is NULL");
  NB_CHECK(nb_sched_config_check(cfg));
  NB_CHECK(sched_input_check(in));
  nb_sched_decision_t d;
  memset(&d, 0, sizeof d);
  d.in = *in;
  if (d.in.fanout == 0) d.in.fanout = 1;

  const double fanout = (double)d.in.fanout;
  const double bytes_full = (double)in->n_params * (in->bits_per_value + in->bits_per_index) / 8.0 *
                            fanout; /* bytes at density 1 */
  const double fixed_bytes = cfg->header_bytes * fanout;
  const double share = cfg->overlap ? cfg->headroom : cfg->fraction;
  const double g = in->goodput_Bps;
  const double fixed_s = cfg->rtts_per_round * in->rtt_s;
  const uint64_t max_steps64 = (uint64_t)in->steps * cfg->max_steps_factor;
  const uint32_t max_steps = max_steps64 > UINT32_MAX ? UINT32_MAX : (uint32_t)max_steps64;

  const int wall = in->round_s > 0.0;
  const double base_compute = wall ? in->round_s : in->step_compute_s * in->steps;
  double compute = base_compute;
  /* with overlap and tau < H the transfer hides under tau steps only: the update lands there */
  const int tau = cfg->overlap && in->hide_steps > 0 && in->hide_steps < in->steps &&
                  in->step_compute_s > 0.0 && in->step_compute_s * in->hide_steps < base_compute;
  const double hide_compute = tau ? in->step_compute_s * in->hide_steps : base_compute;

  d.steps = in->steps;
  d.hide_steps = tau ? in->hide_steps : 0;
  if (g <= 0.0 || (!wall && in->step_compute_s <= 0.0)) {
    d.reason = NB_SCHED_NO_ESTIMATE;
    d.density = clampd(cfg->initial_density, cfg->density_floor, cfg->density_ceiling);
  } else {
    /* with tau, the round trips do not eat tau's budget: tau steps carry the data, and the
     * update lands later by what the latency costs (below) */
    double budget = share * hide_compute;
    d.density_fit = (budget - (tau ? 0.0 : fixed_s) - fixed_bytes / g) * g / bytes_full;
    /* a frame as large as the one measured fits when that exchange did (no extrapolation) */
    if (in->observed_s > 0.0 && in->observed_s - (tau ? fixed_s : 0.0) <= budget) {
      double d_obs = (in->observed_bytes - fixed_bytes) / bytes_full;
      if (d_obs > d.density_fit) d.density_fit = d_obs;
    }
    if (d.density_fit >= cfg->density_ceiling) {
      d.reason = NB_SCHED_CEILING;
      d.density = cfg->density_ceiling;
    } else if (d.density_fit >= cfg->density_floor) {
      d.reason = NB_SCHED_FIT;
      d.density = d.density_fit;
      if (prev && prev->density >= cfg->density_floor && prev->density < d.density &&
          d.density <= prev->density * (1.0 + cfg->hysteresis)) {
        d.reason = NB_SCHED_HOLD; /* the previous density fits with room to spare */
        d.density = prev->density;
      }
    } else {
      d.density = cfg->density_floor;
      const double need_s = nb__sched_time(in, fixed_bytes + d.density * bytes_full, fixed_s, g);
      double steps_need = wall ? 0.0 : ceil(need_s / (share * in->step_compute_s));
      double tau_need = tau ? ceil(need_s / (share * in->step_compute_s)) : 0.0;
      if (tau && tau_need < (double)in->steps && tau_need * in->step_compute_s < base_compute) {
        d.reason = NB_SCHED_FLOOR_LATER; /* land later, still inside the round */
        d.hide_steps = tau_need > (double)in->hide_steps ? (uint32_t)tau_need : in->hide_steps;
      } else if (wall) {
        d.hide_steps = 0;
        double round_need = need_s / share, round_max = in->round_s * cfg->max_steps_factor;
        d.reason = round_need <= round_max ? NB_SCHED_FLOOR_LENGTHEN : NB_SCHED_FLOOR_MAX_STEPS;
        compute = round_need <= round_max ? (round_need > base_compute ? round_need : base_compute)
                                          : round_max;
      } else if (steps_need <= (double)max_steps) {
        d.hide_steps = 0; /* at the round's end */
        d.reason = NB_SCHED_FLOOR_LENGTHEN;
        d.steps = steps_need > (double)in->steps ? (uint32_t)steps_need : in->steps;
      } else {
        d.hide_steps = 0;
        d.reason = NB_SCHED_FLOOR_MAX_STEPS;
        d.steps = max_steps;
      }
    }
  }
  if (tau &&
      (d.reason == NB_SCHED_FIT || d.reason == NB_SCHED_CEILING || d.reason == NB_SCHED_HOLD)) {
    /* the data fits tau steps; the round trips make it land later, while that is in the round */
    double land = ceil(nb__sched_time(in, fixed_bytes + d.density * bytes_full, fixed_s, g) /
                       (share * in->step_compute_s));
    if (land > (double)d.hide_steps)
      d.hide_steps = land < (double)in->steps && land * in->step_compute_s < base_compute
                         ? (uint32_t)land
                         : 0; /* at the round's end */
  }
  double kf = ceil(d.density * (double)in->n_params);
  d.k = kf < 1.0 ? 1 : (kf > (double)in->n_params ? in->n_params : (uint64_t)kf);
  d.bytes = fixed_bytes + d.density * bytes_full;
  d.transfer_s = g > 0.0 ? nb__sched_time(in, d.bytes, fixed_s, g) : 0.0;
  d.compute_s = wall ? compute : in->step_compute_s * d.steps;
  d.budget_s = share * (d.hide_steps > 0 ? in->step_compute_s * d.hide_steps : d.compute_s);
  *out = d;
  if (nb_log_enabled(NB_LOG_INFO, NB_SUB_SCHED)) {
    char line[512];
    nb_sched_decision_format(out, line, sizeof line);
    NB_INFO(SCHED, "%s", line);
  }
  return NB_OK;
}

int nb_sched_decision_format(const nb_sched_decision_t* d, char* buf, size_t len) {
  if (!d) return snprintf(buf, len, "sched (null)");
  return snprintf(buf, len,
                  "sched round=%llu reason=%s density=%.6g k=%llu steps=%u base_steps=%u "
                  "fit=%.6g bytes=%.0f transfer_s=%.4f budget_s=%.4f compute_s=%.4f "
                  "goodput_mbit=%.3f rtt_ms=%.3f step_ms=%.3f params=%llu bits=%.3g+%.3g fanout=%u "
                  "round_s=%.4g tau=%u",
                  (unsigned long long)d->in.round, nb_sched_reason_name(d->reason), d->density,
                  (unsigned long long)d->k, d->steps, d->in.steps, d->density_fit, d->bytes,
                  d->transfer_s, d->budget_s, d->compute_s, d->in.goodput_Bps * 8e-6,
                  d->in.rtt_s * 1e3, d->in.step_compute_s * 1e3, (unsigned long long)d->in.n_params,
                  d->in.bits_per_value, d->in.bits_per_index, d->in.fanout, d->in.round_s,
                  d->hide_steps);
}

/* One point's decision: nb_sched_decide with the density pinned to the point's. */
static nb_status_t nb__sched_point(const nb_sched_config_t* cfg, const nb_sched_input_t* in,
                                   const nb_sched_point_t* p, nb_sched_decision_t* d) {
  nb_sched_config_t c = *cfg;
  c.density_floor = c.density_ceiling = c.initial_density = p->density;
  c.hysteresis = 0;
  nb_sched_input_t x = *in;
  x.bits_per_value = p->bits_per_value;
  x.bits_per_index = p->bits_per_index;
  return nb_sched_decide(&c, &x, NULL, d);
}

double nb_sched_point_cost(const nb_sched_point_t* p, double f) {
  if (!p) return INFINITY;
  if (!(p->land_late > p->land) || !(f > p->land)) return p->loss_cost;
  if (f > 1) f = 1;
  return p->loss_cost +
         (p->loss_cost_late - p->loss_cost) * (f - p->land) / (p->land_late - p->land);
}

/* Where decision d's update lands, as a fraction of its round: hide_steps of in.steps, or the
 * round's end. */
static double nb__sched_land(const nb_sched_decision_t* d) {
  return d->hide_steps > 0 && d->in.steps > 0 ? (double)d->hide_steps / d->in.steps : 1.0;
}

nb_status_t nb_sched_pick(const nb_sched_config_t* cfg, const nb_sched_input_t* in,
                          const nb_sched_point_t* points, size_t n, const nb_sched_decision_t* prev,
                          size_t prev_index, nb_sched_decision_t* out, size_t* index) {
  if (!out || !index || !points || n == 0)
    return nb_error(NB_ERR_INVALID, "scheduler: pick needs a table of at least one point");
  NB_CHECK(nb_sched_config_check(cfg));
  NB_CHECK(sched_input_check(in));
  size_t best = 0, cheapest = 0, fit = n;
  double fit_cost = INFINITY;
  nb_sched_decision_t d, dfit, dcheap;
  memset(&dfit, 0, sizeof dfit);
  memset(&dcheap, 0, sizeof dcheap);
  for (size_t i = 0; i < n; i++) {
    const nb_sched_point_t* p = &points[i];
    if (!(isfinite(p->density) && p->density > 0 && p->density <= 1) ||
        !(isfinite(p->bits_per_value) && p->bits_per_value > 0 && p->bits_per_value <= 64) ||
        !(fin_ge0(p->bits_per_index) && p->bits_per_index <= 64) || !isfinite(p->loss_cost) ||
        !(fin_ge0(p->land) && p->land <= 1) || !(fin_ge0(p->land_late) && p->land_late <= 1) ||
        !isfinite(p->loss_cost_late))
      return nb_error(NB_ERR_INVALID,
                      "scheduler: point %zu (%s): density must be in (0, 1], bits per value in "
                      "(0, 64], bits per index in [0, 64], landings in [0, 1], loss costs finite",
                      i, p->name ? p->name : "?");
    NB_CHECK(nb__sched_point(cfg, in, p, &d));
    if (p->loss_cost < points[best].loss_cost) best = i;
    if (i == 0 || d.bytes < dcheap.bytes) cheapest = i, dcheap = d;
    if (d.reason == NB_SCHED_CEILING || d.reason == NB_SCHED_FLOOR_LATER) {
      double c = nb_sched_point_cost(p, nb__sched_land(&d));
      if (fit == n || c < fit_cost || (c == fit_cost && d.bytes < dfit.bytes))
        fit = i, dfit = d, fit_cost = c;
    }
  }
  if (dcheap.reason == NB_SCHED_NO_ESTIMATE) {
    *index = cheapest;
    *out = dcheap;
    return NB_OK;
  }
  if (fit < n) {
    *index = fit;
    *out = dfit;
    if (dfit.reason == NB_SCHED_CEILING)
      out->reason = fit == best ? NB_SCHED_CEILING : NB_SCHED_FIT;
    /* hold: the previous point still fits and the better one would no longer fit on a link
     * slower by the hysteresis (under tau: it nearly fills its budget; landing later: it would
     * land past the round's end) */
    int near = dfit.reason == NB_SCHED_CEILING
                   ? dfit.transfer_s > (1.0 - cfg->hysteresis) * dfit.budget_s
                   : (double)dfit.hide_steps >= (1.0 - cfg->hysteresis) * (double)dfit.in.steps;
    if (prev && prev_index < n && prev_index != fit && near) {
      NB_CHECK(nb__sched_point(cfg, in, &points[prev_index], &d));
      if ((d.reason == NB_SCHED_CEILING || d.reason == NB_SCHED_FLOOR_LATER) &&
          nb_sched_point_cost(&points[prev_index], nb__sched_land(&d)) > fit_cost) {
        *index = prev_index;
        *out = d;
        out->reason = NB_SCHED_HOLD;
      }
    }
  } else {
    *index = cheapest;
    *out = dcheap;
  }
  if (nb_log_enabled(NB_LOG_INFO, NB_SUB_SCHED)) {
    char line[512];
    nb_sched_decision_format(out, line, sizeof line);
    NB_INFO(SCHED, "pick %s: %s (cost %.4g)", points[*index].name ? points[*index].name : "?", line,
            nb_sched_point_cost(&points[*index], nb__sched_land(out)));
  }
  return NB_OK;
}
