/* Jobs that run the user's own program (spec.program) instead of the built-in worker: its
 * command words, its folder, and the NEBULA_* environment that describes this cluster's session
 * to nb_session_options_from_env (include/nebula.h). Not here: how the processes start (the
 * launcher, the same one as the worker's) and what happens when they end (monitor.c). */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "jobs/job_paths.h"
#include "jobs/job_program.h"
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
    char ep[NB_GW_STR + 16];
    NB_CHECK(nb__gw_free_endpoint(gw, id, ep, sizeof ep));
    NB_CHECK(nb__gw_exchange_listen(gw, ep, listen, sizeof listen));
  }

  const char* peers[NB_JOB_MAX_CLUSTERS];
  int n_peers = 0;
  for (int i = 0; wk && i < wk->n_peers && i < NB_JOB_MAX_CLUSTERS; i++)
    peers[n_peers++] = wk->peers[i];
  char progress[sizeof p->workdir + 32];
  snprintf(progress, sizeof progress, "%s/%s", dir, NB_LAUNCH_PROGRESS);
  nb_job_program_site_t site = {.job_id = id,
                                .cluster_id = gw->cfg.cluster_id,
                                .cluster_index = index,
                                .listen = listen,
                                .peers = peers,
                                .n_peers = n_peers,
                                .pki_dir = pki,
                                .secret_file = wk ? wk->secret_file : secret_file,
                                .progress_file = progress};
  s = nb_job_program_env(cfg, &site, p->env, NB__PROGRAM_MAX_ENV, &p->n_env);
  if (s != NB_OK) nb__gw_program_clear(p);
  return s;
}

void nb__gw_program_clear(nb__gw_program_t* p) {
  nb_job_program_env_free(p->env, p->n_env);
  memset(p, 0, sizeof *p);
}
