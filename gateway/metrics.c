/* The gateway's Prometheus metrics (config "metrics.listen"; docs/operations.md): the families
 * it exports, the updates the API and federation code make, and the scrape-time reading of the
 * job store and the artifact totals. The exposition and the HTTP listener are common/prom's;
 * nothing here runs when metrics are off (gw->prom NULL: every update is a no-op). */
#include "gateway/gateway_internal.h"

#include <ctype.h>
#include <string.h>

#include "common/common.h"

static const struct {
  const char* name;
  nb_prom_type_t type;
  const char* labels;
  const char* help;
} nb__gw_families[] = {
    {"nebula_gateway_info", NB_PROM_GAUGE, "cluster,version",
     "Always 1: the cluster this gateway serves and the nebula version."},
    {"nebula_gateway_jobs", NB_PROM_GAUGE, "state",
     "Jobs in the job store by state (pending, proposed, running, succeeded, failed, cancelled)."},
    {"nebula_gateway_active_jobs", NB_PROM_GAUGE, NULL,
     "Jobs running or holding worker slots on this cluster now."},
    {"nebula_gateway_slots_used", NB_PROM_GAUGE, NULL,
     "Worker slots in use over all jobs (of resources.slots)."},
    {"nebula_gateway_slots", NB_PROM_GAUGE, NULL,
     "Worker slots of this cluster (resources.slots)."},
    {"nebula_gateway_submissions_total", NB_PROM_COUNTER, NULL,
     "Submit calls received, accepted or refused."},
    {"nebula_gateway_refusals_total", NB_PROM_COUNTER, "reason",
     "Calls refused, by reason: submit_incomplete, signature, descriptor, acl, unknown_cluster, "
     "device, slots, federation, call_limit."},
    {"nebula_gateway_federation_calls_total", NB_PROM_COUNTER, "method,outcome",
     "Calls this gateway made to peer gateways (nebula.v1.Federation), by method and outcome "
     "(ok or the status, e.g. unavailable, timeout)."},
    {"nebula_gateway_artifact_bytes_total", NB_PROM_COUNTER, "direction",
     "Artifact bytes (plaintext) moved between gateways: in = fetched from peers, out = served "
     "to them."},
};

/* Runs on the listener's thread at each scrape: the store through a handle of its own. */
static void nb__gw_collect(nb_prom_t* p, void* user) {
  nb_gateway_t* gw = user;
  if (!gw->met_store && nb_job_store_open(gw->cfg.store_path, &gw->met_store) != NB_OK) {
    NB_WARN("metrics: cannot open the job store for nebula_gateway_jobs: %s", nb_error_last());
    gw->met_store = NULL;
  }
  for (int s = NB_JOB_PENDING; s <= NB_JOB_CANCELLED && gw->met_store; s++) {
    int64_t n = 0;
    if (nb_job_store_count(gw->met_store, s, &n) != NB_OK) {
      NB_WARN("metrics: counting %s jobs: %s", nb_job_state_name((nb_job_state_t)s),
              nb_error_last());
      break;
    }
    nb_prom_set(p, "nebula_gateway_jobs", (const char*[]){nb_job_state_name((nb_job_state_t)s)},
                (double)n);
  }
  pthread_mutex_lock(&gw->active_mu);
  int used = nb__gw_slots_used(gw, NULL), active = gw->n_active;
  pthread_mutex_unlock(&gw->active_mu);
  nb_prom_set(p, "nebula_gateway_active_jobs", NULL, active);
  nb_prom_set(p, "nebula_gateway_slots_used", NULL, used);
  uint64_t in = 0, out = 0;
  nb_artifact_store_bytes(gw->art, &in, &out);
  nb_prom_set(p, "nebula_gateway_artifact_bytes_total", (const char*[]){"in"}, (double)in);
  nb_prom_set(p, "nebula_gateway_artifact_bytes_total", (const char*[]){"out"}, (double)out);
}

/* Declares the families and starts the listener when metrics.listen is set; the store handle
 * of the collector is opened at the first scrape. */
nb_status_t nb__gw_metrics_start(nb_gateway_t* gw) {
  if (!gw->cfg.metrics_listen[0]) return NB_OK;
  nb_status_t s = NB_OK;
  NB_CHECK(nb_prom_create(&gw->prom));
  for (size_t i = 0; i < sizeof nb__gw_families / sizeof nb__gw_families[0]; i++)
    NB_CHECK_GOTO(nb_prom_declare(gw->prom, nb__gw_families[i].name, nb__gw_families[i].type,
                                  nb__gw_families[i].help, nb__gw_families[i].labels),
                  s, fail);
  nb_prom_set(gw->prom, "nebula_gateway_info",
              (const char*[]){gw->cfg.cluster_id, NB_VERSION_STRING}, 1);
  nb_prom_set(gw->prom, "nebula_gateway_slots", NULL, gw->cfg.slots);
  nb_prom_set(gw->prom, "nebula_gateway_artifact_bytes_total", (const char*[]){"in"}, 0);
  nb_prom_set(gw->prom, "nebula_gateway_artifact_bytes_total", (const char*[]){"out"}, 0);
  nb_prom_set_collect(gw->prom, nb__gw_collect, gw);
  s = nb_prom_listen(gw->prom, gw->cfg.metrics_listen);
  if (s != NB_OK) {
    s = nb_error_wrap(s, "config: metrics.listen");
    goto fail;
  }
  return NB_OK;
fail:
  nb_prom_destroy(gw->prom);
  gw->prom = NULL;
  return s;
}

/* Stops the listener (no scrape runs after it), then closes the collector's store handle. */
void nb__gw_metrics_stop(nb_gateway_t* gw) {
  nb_prom_destroy(gw->prom);
  gw->prom = NULL;
  nb_job_store_close(gw->met_store);
  gw->met_store = NULL;
}

int nb_gateway_metrics_port(const nb_gateway_t* gw) {
  return gw ? nb_prom_port(gw->prom) : 0;
}

void nb__gw_metric_submission(nb_gateway_t* gw) {
  nb_prom_add(gw->prom, "nebula_gateway_submissions_total", NULL, 1);
}

void nb__gw_metric_refusal(nb_gateway_t* gw, const char* method, const char* caller,
                           const char* reason, const char* detail) {
  NB_INFO(JOB, "%s refused: %s: reason %s: %s", method, caller, reason,
          detail && *detail ? detail : "-");
  nb_prom_add(gw->prom, "nebula_gateway_refusals_total", (const char*[]){reason}, 1);
}

/* outcome: "ok", or the status's short name ("unavailable", "timeout", ...). */
void nb__gw_metric_fed_call(nb_gateway_t* gw, const char* method, nb_status_t st) {
  if (!gw->prom) return;
  char outcome[32] = "ok";
  if (st != NB_OK) {
    const char* n = nb_status_name(st);
    if (!strncmp(n, "NB_ERR_", 7)) n += 7;
    size_t i = 0;
    for (; n[i] && i + 1 < sizeof outcome; i++) outcome[i] = (char)tolower((unsigned char)n[i]);
    outcome[i] = 0;
  }
  nb_prom_add(gw->prom, "nebula_gateway_federation_calls_total", (const char*[]){method, outcome},
              1);
}
