/* The NEBULA_* environment of a job that runs the user's own program (spec.program): what a
 * launcher tells one cluster's program about its session, read back by
 * nb_session_options_from_env (include/nebula.h; docs/api.md, "The environment"). One list for
 * every launcher (the gateway's, `nebula run`), so a program sees the same variables wherever it
 * runs. Data only: nothing here starts a process. */
#ifndef NB_JOBS_JOB_PROGRAM_H
#define NB_JOBS_JOB_PROGRAM_H

#include "common/common.h"
#include "jobs/job_config.h"

#define NB_JOB_PROGRAM_MAX_ENV 28
/* The per-round progress lines' file in a job's (or a `nebula run` cluster's) folder: the
 * NEBULA_PROGRESS_FILE launchers set; one JSON object per line, appended by the job. */
#define NB_JOB_PROGRESS_FILE "progress.jsonl"

/* Where this cluster's program stands in the job (every string borrowed for the call). */
typedef struct {
  const char* job_id;
  const char* cluster_id;
  int cluster_index;        /* in the descriptor's cluster order */
  const char* listen;       /* host:port its session binds */
  const char* const* peers; /* "id=host:port" of every other cluster */
  int n_peers;
  const char* pki_dir;       /* ca.crt, <cluster>.crt/.key */
  const char* secret_file;   /* the job secret (0600); used when the job seals */
  const char* progress_file; /* one JSON line per round; NULL: none */
} nb_job_program_site_t;

/* The environment: env[0..*n) "K=V" strings (allocated; nb_job_program_env_free), env[*n] NULL.
 * cap: entries env holds, at least NB_JOB_PROGRAM_MAX_ENV + 1. The secret goes by its file
 * only, never by value. */
nb_status_t nb_job_program_env(const nb_job_config_t* cfg, const nb_job_program_site_t* site,
                               char** env, int cap, int* n);
void nb_job_program_env_free(char** env, int n);

#endif
