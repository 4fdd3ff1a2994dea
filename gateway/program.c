/* Jobs that run the user's own program (spec.program) instead of the built-in worker: its
 * command words, its folder, and the NEBULA_* environment that describes this cluster's session
 * to nb_session_options_from_env (include/nebula.h). Not here: how the processes start (the
 * launcher, the same one as the worker's) and what happens when they end (monitor.c). */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "jobs/job_paths.h"
#include "security/seal.h"

int nb__gw_job_runs_program(nb_job_store_t* st, const char* id) {
  nb_job_config_t* cfg = NULL;
  if (nb__gw_job_config(st, id, &cfg) != NB_OK) return 0;
  int yes = cfg->program.argc > 0;
  nb_free(cfg);
  return yes;
}

/* A fresh job secret in dir/job.secret (0600, never through a link), for a job of this cluster
 * only: the session seals even when there is no peer to seal for. */
static nb_status_t nb__program_secret(nb_gateway_t* gw, const char* path) {
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  NB_CHECK(nb_seal_secret_generate(secret));
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  int ok = fd >= 0 && write(fd, secret, sizeof secret) == (ssize_t)sizeof secret;
  if (fd >= 0 && close(fd) != 0) ok = 0;
  explicit_bzero(secret, sizeof secret);
  if (!ok) return nb_error(NB_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  nb__gw_give(gw, path);
  return NB_OK;
}

/* Appends "K=V" to p->env (formatted), keeping it NULL-terminated. */
static nb_status_t nb__penv(nb__gw_program_t* p, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static nb_status_t nb__penv(nb__gw_program_t* p, const char* fmt, ...) {
  if (p->n_env + 1 >= NB__PROGRAM_MAX_ENV)
    return nb_error(NB_ERR_INVALID, "program environment: too many variables");
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return nb_error(NB_ERR_INVALID, "program environment: bad entry");
  char* e = NULL;
  NB_CHECK(nb_alloc((void**)&e, (size_t)n + 1, 1, "program environment"));
  va_start(ap, fmt);
  vsnprintf(e, (size_t)n + 1, fmt, ap);
  va_end(ap);
  p->env[p->n_env++] = e;
  p->env[p->n_env] = NULL;
  return NB_OK;
}

nb_status_t nb__gw_program_prepare(nb_gateway_t* gw, const char* id, const char* dir,
                                   const nb_job_config_t* cfg, const nb__wk_args_t* wk,
                                   nb__gw_program_t* p) {
  memset(p, 0, sizeof *p);
  const nb_job_program_t* pg = &cfg->program;
  /* the paths again, against the folder as it is now (links followed): Submit checked them
   * against one that did not exist yet */
  const char* roots[NB_JOB_PATHS_MAX_ROOTS];
  for (int i = 0; i < gw->cfg.n_allow; i++) roots[i] = gw->cfg.allow[i];
  nb_descriptor_diag_t* diag = NULL;
  NB_CHECK(nb_calloc((void**)&diag, 1, sizeof *diag, "diagnostics"));
  nb_status_t s = NB_OK;
  if (nb_job_paths_check(cfg, dir, roots, gw->cfg.n_allow, diag) != NB_OK)
    s = nb__gw_diag_error(NB_ERR_PERMISSION, "descriptor refused:", diag);
  nb_free(diag);
  NB_CHECK(s);
  if (snprintf(p->workdir, sizeof p->workdir, "%s%s%s", dir, pg->workdir[0] ? "/" : "",
               pg->workdir) >= (int)sizeof p->workdir)
    return nb_error(NB_ERR_INVALID, "$.spec.program.workDir: %s/%s is too long", dir, pg->workdir);
  if (pg->workdir[0]) {
    if (nb__gw_mkdirs(p->workdir) != 0)
      return nb_error(NB_ERR_IO, "cannot create the program's folder %s: %s", p->workdir,
                      strerror(errno));
    nb__gw_give(gw, p->workdir);
  }

  /* this cluster's place in the job: the descriptor's cluster order */
  int index = -1;
  for (int i = 0; i < cfg->n_clusters; i++)
    if (!strcmp(cfg->clusters[i].id, gw->cfg.cluster_id)) index = i;
  if (index < 0)
    return nb_error(NB_ERR_INVALID, "job %s does not name cluster '%s'", id, gw->cfg.cluster_id);

  /* what the worker gets on its command line (a federated job: from nb__gw_fed_start; a job of
   * this cluster only: made here) */
  char secret_file[sizeof p->workdir], pki[sizeof p->workdir], listen[NB_GW_STR + 16];
  snprintf(secret_file, sizeof secret_file, "%s/job.secret", dir);
  if (wk) {
    snprintf(pki, sizeof pki, "%s", wk->pki);
    snprintf(listen, sizeof listen, "%s", wk->listen);
  } else {
    if (cfg->security.seal) NB_CHECK(nb__program_secret(gw, secret_file));
    NB_CHECK(nb__gw_job_pki(gw, dir, pki, sizeof pki));
    NB_CHECK(nb__gw_free_endpoint(gw->cfg.exchange_host, listen, sizeof listen));
  }

  s = NB_OK;
#define NB__PENV(...)                             \
  do {                                            \
    if (s == NB_OK) s = nb__penv(p, __VA_ARGS__); \
  } while (0)
  NB__PENV("NEBULA_JOB_ID=%s", id);
  NB__PENV("NEBULA_CLUSTER_ID=%s", gw->cfg.cluster_id);
  NB__PENV("NEBULA_N_CLUSTERS=%d", cfg->n_clusters);
  NB__PENV("NEBULA_CLUSTER_INDEX=%d", index);
  NB__PENV("NEBULA_LISTEN=%s", listen);
  if (s == NB_OK) {
    char peers[NB_JOB_MAX_CLUSTERS * (NB_GW_STR + 1) + 1];
    size_t o = 0;
    peers[0] = 0;
    for (int i = 0; wk && i < wk->n_peers; i++)
      o += (size_t)snprintf(peers + o, sizeof peers - o, "%s%s", i ? "," : "", wk->peers[i]);
    NB__PENV("NEBULA_PEERS=%s", peers);
  }
  NB__PENV("NEBULA_PKI_DIR=%s", pki);
  /* the secret by its file only: never in the environment or on the command line */
  if (cfg->security.seal)
    NB__PENV("NEBULA_JOB_SECRET_FILE=%s", wk ? wk->secret_file : secret_file);
  else
    NB__PENV("NEBULA_UNSEALED=1");
  NB__PENV("NEBULA_INNER_STEPS=%d", cfg->sync.inner_steps);
  NB__PENV("NEBULA_OUTER_LR=%.9g", cfg->sync.outer_lr);
  NB__PENV("NEBULA_OUTER_MOMENTUM=%.9g", cfg->sync.outer_momentum);
  NB__PENV("NEBULA_DENSITY=%.15g", cfg->compression.density_initial);
  NB__PENV("NEBULA_VALUES=%s", nb_job_values_name(cfg->compression.values));
  NB__PENV("NEBULA_PROGRESS_FILE=%s/%s", dir, NB_LAUNCH_PROGRESS);
#undef NB__PENV
  if (s != NB_OK) nb__gw_program_clear(p);
  return s;
}

void nb__gw_program_clear(nb__gw_program_t* p) {
  for (int i = 0; i < p->n_env; i++) nb_free(p->env[i]);
  memset(p, 0, sizeof *p);
}
