/* The leader's Prometheus families (train/leader_metrics.h) and their update from a round's
 * figures. Not here: measuring them (worker/worker.c, api/session.c) or serving them
 * (common/prom). */
#include "train/leader_metrics.h"

#include <math.h>
#include <stddef.h>

#include "common/common.h"

static const struct {
  const char* name;
  nb_prom_type_t type;
  const char* labels;
  const char* help;
} nb__lm_families[] = {
    {"nebula_leader_info", NB_PROM_GAUGE, "job_name,cluster",
     "Always 1: the job and the cluster this leader trains."},
    {"nebula_leader_round", NB_PROM_GAUGE, NULL, "Rounds done by this cluster (1-based)."},
    {"nebula_leader_rounds", NB_PROM_GAUGE, NULL, "Rounds the job plans."},
    {"nebula_leader_step", NB_PROM_GAUGE, NULL, "Inner steps done."},
    {"nebula_leader_max_steps", NB_PROM_GAUGE, NULL, "Inner steps the job plans."},
    {"nebula_leader_loss", NB_PROM_GAUGE, NULL, "Mean inner training loss of the last round."},
    {"nebula_leader_eval_bpb", NB_PROM_GAUGE, NULL,
     "Held-out mean bits per byte on theta_global at the last evaluation (NaN before one)."},
    {"nebula_leader_eval_round", NB_PROM_GAUGE, NULL, "Round of the last held-out evaluation."},
    {"nebula_leader_wan_sent_bytes_total", NB_PROM_COUNTER, NULL,
     "Bytes this leader put on the WAN (its frames to every peer)."},
    {"nebula_leader_wan_received_bytes_total", NB_PROM_COUNTER, NULL,
     "Bytes of peers' frames this leader received."},
    {"nebula_leader_goodput_bytes_per_second", NB_PROM_GAUGE, NULL,
     "Estimated goodput of the slowest peer link (0 until measured)."},
    {"nebula_leader_rtt_seconds", NB_PROM_GAUGE, NULL,
     "Estimated round-trip time of the slowest peer link (0 until measured)."},
    {"nebula_leader_density", NB_PROM_GAUGE, NULL,
     "Top-k density of the last round's frame (1 = dense)."},
    {"nebula_leader_peers", NB_PROM_GAUGE, NULL, "Other clusters of the job."},
    {"nebula_leader_peers_alive", NB_PROM_GAUGE, NULL,
     "Other clusters answering their heartbeat after the last exchange."},
    {"nebula_leader_rounds_applied_total", NB_PROM_COUNTER, NULL,
     "Rounds whose outer step was taken (on every cluster): theta_global's version."},
    {"nebula_leader_rounds_skipped_total", NB_PROM_COUNTER, NULL,
     "Rounds not applied (a peer's update missing or a vote lost: fault-tolerant rounds)."},
    {"nebula_leader_rounds_late_total", NB_PROM_COUNTER, NULL,
     "Rounds held back and applied late, in a later round."},
    {"nebula_leader_compute_seconds_total", NB_PROM_COUNTER, NULL, "Time in inner steps."},
    {"nebula_leader_exchange_seconds_total", NB_PROM_COUNTER, NULL,
     "Time inside the WAN exchange."},
};

nb_status_t nb_leader_metrics_start(const char* listen, const char* job, const char* cluster,
                                    nb_prom_t** out) {
  if (!listen || !job || !cluster || !out)
    return nb_error(NB_ERR_INVALID, "leader metrics: NULL argument");
  nb_prom_t* p = NULL;
  nb_status_t s = NB_OK;
  NB_CHECK(nb_prom_create(&p));
  for (size_t i = 0; i < sizeof nb__lm_families / sizeof nb__lm_families[0]; i++)
    NB_CHECK_GOTO(nb_prom_declare(p, nb__lm_families[i].name, nb__lm_families[i].type,
                                  nb__lm_families[i].help, nb__lm_families[i].labels),
                  s, fail);
  NB_CHECK_GOTO(nb_prom_set(p, "nebula_leader_info", (const char*[]){job, cluster}, 1), s, fail);
  nb_prom_set(p, "nebula_leader_eval_bpb", NULL, NAN);
  NB_CHECK_GOTO(nb_prom_listen(p, listen), s, fail);
  *out = p;
  return NB_OK;
fail:
  nb_prom_destroy(p);
  return s;
}

void nb_leader_metrics_round(nb_prom_t* p, const nb_leader_figures_t* f) {
  if (!p || !f) return;
  nb_prom_set(p, "nebula_leader_round", NULL, (double)f->round);
  nb_prom_set(p, "nebula_leader_rounds", NULL, (double)f->rounds);
  nb_prom_set(p, "nebula_leader_step", NULL, (double)f->step);
  nb_prom_set(p, "nebula_leader_max_steps", NULL, (double)f->max_steps);
  nb_prom_set(p, "nebula_leader_loss", NULL, f->loss);
  nb_prom_set(p, "nebula_leader_wan_sent_bytes_total", NULL, (double)f->wan_sent);
  nb_prom_set(p, "nebula_leader_wan_received_bytes_total", NULL, (double)f->wan_received);
  nb_prom_set(p, "nebula_leader_goodput_bytes_per_second", NULL, f->goodput_Bps);
  nb_prom_set(p, "nebula_leader_rtt_seconds", NULL, f->rtt_s);
  nb_prom_set(p, "nebula_leader_density", NULL, f->density);
  nb_prom_set(p, "nebula_leader_peers", NULL, f->peers);
  nb_prom_set(p, "nebula_leader_peers_alive", NULL, f->peers_alive);
  nb_prom_set(p, "nebula_leader_rounds_applied_total", NULL, (double)f->applied);
  nb_prom_set(p, "nebula_leader_rounds_skipped_total", NULL, (double)f->skipped);
  nb_prom_set(p, "nebula_leader_rounds_late_total", NULL, (double)f->late);
  nb_prom_set(p, "nebula_leader_compute_seconds_total", NULL, f->compute_s);
  nb_prom_set(p, "nebula_leader_exchange_seconds_total", NULL, f->exchange_s);
}

void nb_leader_metrics_eval(nb_prom_t* p, long round, double mean_bpb) {
  nb_prom_set(p, "nebula_leader_eval_bpb", NULL, mean_bpb);
  nb_prom_set(p, "nebula_leader_eval_round", NULL, (double)round);
}
