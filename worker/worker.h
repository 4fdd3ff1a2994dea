/* The training program of one cluster's leader (`nebula worker`) and the one mapping from a job
 * descriptor to the configs of the layers below (trainer, round, scheduler). The command line
 * that fills nb_worker_opts_t is cli/worker_cli.c; this folder parses no argv. */
#ifndef NB_WORKER_WORKER_H
#define NB_WORKER_WORKER_H

#include <jansson.h>
#include <stddef.h>

#include "common/status.h"
#include "inter/sched.h"
#include "jobs/job_config.h"
#include "train/hybrid.h"
#include "train/model.h"
#include "train/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_WORKER_MAX_PEERS (NB_JOB_MAX_CLUSTERS - 1)

/* The header line of rounds.tsv, one row per round (the run report and the benchmarks read these
 * columns; `nebula train` writes the same file without the WAN columns filled). */
#define NB_WORKER_ROUNDS_TSV_HEADER                                                       \
  "round\tsteps\tsamples\tsamples_all\tloss\tmsg_bytes\tbytes_sent\tdensity\tcompute_s\t" \
  "codec_s\texchange_s\tglobal_xxh3\tapplied\tcommits\tpeers_ok\tpeers_alive\tevent\n"

/* What `nebula worker` was asked to do. Every string is borrowed and must outlive the run. */
typedef struct {
  const char* job_file;    /* the job descriptor (required) */
  const char* cluster;     /* this cluster's id in the job (required) */
  const char* out;         /* output folder; NULL: runs/<job>/<cluster> */
  const char* listen;      /* our exchange server, "HOST:PORT" */
  const char* pki;         /* federation PKI folder; NULL: plaintext (insecure must be set) */
  const char* secret_file; /* the job secret that seals frames; NULL: unsealed */
  const char* data_dir;    /* NULL: the cluster's data.dir */
  const char* peers[NB_WORKER_MAX_PEERS]; /* "ID=HOST:PORT", one per other cluster */
  int n_peers;
  long steps; /* > 0: overrides training.maxSteps */
  int insecure, resume, rejoin, no_rate_cap;
} nb_worker_opts_t;

/* How a run ended; the command line maps it to its exit code. */
typedef enum {
  NB_WORKER_DONE = 0,   /* trained, checked and wrote its summary */
  NB_WORKER_FAILED = 1, /* something failed (the reason is on stderr) */
  NB_WORKER_MISFIT = 2, /* the options do not fit the job (no such cluster, a missing --peer…) */
} nb_worker_outcome_t;

/* Runs cluster opts->cluster of the job: under mpirun every rank calls it (rank 0 leads).
 * Prints its progress on stdout, errors on stderr; writes rounds.tsv, summary.json and
 * final.safetensors into the output folder. Not thread-safe (one run per process). */
nb_worker_outcome_t nb_worker_run(const nb_worker_opts_t* opts);

/* The trainer's config for cluster #ci of the job (data_dir NULL or "": the cluster's own).
 * Returns NB_ERR_CONFIG naming the setting that cannot be mapped. */
nb_status_t nb_train_config_from_job(const nb_job_config_t* job, int cluster, const char* data_dir,
                                     nb_train_config_t* out);

/* The data folder a trainer's config reads (the folder above mono/ or pairs/ of its first
 * source), absolute when it exists, into out (cap bytes): what summary.json records as
 * "data_dir", so that `nebula eval` of the run's model finds the same data from anywhere.
 * Returns NB_OK, or NB_ERR_CONFIG when c has no source or the path does not fit. */
nb_status_t nb_train_config_data_dir(const nb_train_config_t* c, char* out, size_t cap);

/* The round's config for the cluster that is index-th of the job's clusters by id: the job's
 * sync and compression settings over nb_hybrid_config_defaults. The caller adds the hooks and
 * the exchange callbacks. */
void nb_hybrid_config_from_job(const nb_job_config_t* job, uint32_t index, nb_hybrid_config_t* hc);

/* The adaptive scheduler's config: the job's density range and budget over its defaults. */
void nb_sched_config_from_job(const nb_job_config_t* job, nb_sched_config_t* sc);

/* Translation jobs: chrF/BLEU of the base and the final model on the first `sentences` of each
 * pair's test split, as the summary's "translation" object (*out, caller frees). */
nb_status_t nb_translation_eval(const nb_train_config_t* tc, nb_model_t* final_model,
                                size_t sentences, json_t** out);

#ifdef __cplusplus
}
#endif
#endif
