/* The NEBULA_* environment of a program job (jobs/job_program.h). */
#include "jobs/job_program.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "jobs/descriptor.h"

/* Appends "K=V" (formatted) to env, keeping it NULL-terminated. */
static nb_status_t nb__pe_add(char** env, int cap, int* n, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static nb_status_t nb__pe_add(char** env, int cap, int* n, const char* fmt, ...) {
  if (*n + 1 >= cap) return nb_error(NB_ERR_INVALID, "program environment: too many variables");
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (len < 0) return nb_error(NB_ERR_INVALID, "program environment: bad entry");
  char* e = NULL;
  NB_CHECK(nb_alloc((void**)&e, (size_t)len + 1, 1, "program environment"));
  va_start(ap, fmt);
  vsnprintf(e, (size_t)len + 1, fmt, ap);
  va_end(ap);
  env[(*n)++] = e;
  env[*n] = NULL;
  return NB_OK;
}

nb_status_t nb_job_program_env(const nb_job_config_t* cfg, const nb_job_program_site_t* site,
                               char** env, int cap, int* n) {
  if (!cfg || !site || !env || !n || cap < NB_JOB_PROGRAM_MAX_ENV + 1)
    return nb_error(NB_ERR_INVALID, "program environment: bad argument");
  *n = 0;
  env[0] = NULL;
  nb_status_t s = NB_OK;
#define NB__PE(...)                                           \
  do {                                                        \
    if (s == NB_OK) s = nb__pe_add(env, cap, n, __VA_ARGS__); \
  } while (0)
  NB__PE("NEBULA_JOB_ID=%s", site->job_id);
  NB__PE("NEBULA_CLUSTER_ID=%s", site->cluster_id);
  NB__PE("NEBULA_N_CLUSTERS=%d", cfg->n_clusters);
  NB__PE("NEBULA_CLUSTER_INDEX=%d", site->cluster_index);
  NB__PE("NEBULA_LISTEN=%s", site->listen);
  if (s == NB_OK) {
    char peers[NB_JOB_MAX_CLUSTERS * (NB_JOB_NAME_MAX + 64) + 1];
    size_t o = 0;
    peers[0] = 0;
    for (int i = 0; i < site->n_peers && o < sizeof peers; i++)
      o += (size_t)snprintf(peers + o, sizeof peers - o, "%s%s", i ? "," : "", site->peers[i]);
    if (o >= sizeof peers) s = nb_error(NB_ERR_INVALID, "program environment: peers too long");
    NB__PE("NEBULA_PEERS=%s", peers);
  }
  NB__PE("NEBULA_PKI_DIR=%s", site->pki_dir);
  /* the secret by its file only: never in the environment or on the command line */
  if (cfg->security.seal)
    NB__PE("NEBULA_JOB_SECRET_FILE=%s", site->secret_file);
  else
    NB__PE("NEBULA_UNSEALED=1");
  NB__PE("NEBULA_INNER_STEPS=%d", cfg->sync.inner_steps);
  NB__PE("NEBULA_OUTER_LR=%.9g", cfg->sync.outer_lr);
  NB__PE("NEBULA_OUTER_MOMENTUM=%.9g", cfg->sync.outer_momentum);
  NB__PE("NEBULA_DENSITY=%.15g", cfg->compression.density_initial);
  NB__PE("NEBULA_VALUES=%s", nb_job_values_name(cfg->compression.values));
  NB__PE("NEBULA_ERROR_FEEDBACK=%d", cfg->compression.error_feedback ? 1 : 0);
  NB__PE("NEBULA_ERROR_FEEDBACK_DECAY=%.9g", cfg->compression.error_feedback_decay);
  NB__PE("NEBULA_ADAPTIVE=%d", cfg->compression.adaptive ? 1 : 0);
  NB__PE("NEBULA_EAGER=%d", cfg->sync.eager ? 1 : 0);
  NB__PE("NEBULA_TOPK_CHUNK=%d", cfg->compression.topk_chunk);
  NB__PE("NEBULA_DENSITY_MIN=%.15g", cfg->compression.density_min);
  NB__PE("NEBULA_DENSITY_MAX=%.15g", cfg->compression.density_max);
  NB__PE("NEBULA_RATE_MBIT=%.15g", cfg->link.rate_mbit);
  NB__PE("NEBULA_PEER_TIMEOUT_S=%.9g", cfg->sync.peer_timeout_seconds);
  if (site->progress_file) NB__PE("NEBULA_PROGRESS_FILE=%s", site->progress_file);
  /* the cluster's spec.clusters[i].metrics.listen: the session's metrics_listen */
  if (site->cluster_index >= 0 && site->cluster_index < cfg->n_clusters &&
      cfg->clusters[site->cluster_index].metrics_listen[0])
    NB__PE("NEBULA_METRICS_LISTEN=%s", cfg->clusters[site->cluster_index].metrics_listen);
#undef NB__PE
  if (s != NB_OK) {
    nb_job_program_env_free(env, *n);
    *n = 0;
  }
  return s;
}

void nb_job_program_env_free(char** env, int n) {
  for (int i = 0; i < n; i++) {
    nb_free(env[i]);
    env[i] = NULL;
  }
}
