/* The training program of one cluster's leader (`nebula worker`, worker/worker.h), read top to
 * bottom: set up (ranks, descriptor, peers, trainer), connect (exchange, round state, resume or
 * rejoin, scheduler, log), the round loop (round, log, evaluate, checkpoint, schedule), finish
 * (final check, evaluation, final model, summary.json). The cross-datacenter side is the public
 * session's (api/driven.h: the session of include/nebula.h driving this cluster's trainer), so a
 * user's program and the built-in worker run one path: connecting, agreeing on the table, the
 * round, faults, rejoin, the final check and the round state of checkpoints. This file wires the
 * trainer, the job and the scheduler to it. It parses no command line. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/adapt.h"
#include "api/driven.h"
#include "common/common.h"
#include "common/tfevents.h"
#include "compress/compress.h"
#include "inter/estimator.h"
#include "inter/exchange.h"
#include "inter/sched.h"
#include "intra/intra.h"
#include "jobs/cli_checks.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"
#include "api/codec_points.h"
#include "train/leader_metrics.h"
#include "worker/worker.h"
#include "security/seal.h"
#include "train/checkpoint.h"
#include "train/hybrid.h"
#include "train/lora.h"
#include "train/trainer.h"
#include "worker/ranks.h"

NB_PARAM_DOUBLE(RoundDeadlineS, "NB_ROUND_DEADLINE_S", 30, 0.5, 3600,
                "fault-tolerant rounds: how long a round's update or vote exchange waits for a "
                "live peer before the round is skipped")
NB_PARAM_DOUBLE(FinalWaitS, "NB_FINAL_WAIT_S", 30, 0, 3600,
                "fault-tolerant rounds: how long the final check keeps asking a peer that has "
                "not answered (a link back near the end of a run still ends in agreement)")
NB_PARAM_INT(
    FaultTolerant, "NB_FAULT_TOLERANT", 1, 0, 1,
    "1: outer rounds (with or without overlap) survive a link down or a dead cluster (a round "
    "counts on every cluster or on none; docs/hybrid.md, Faults); 0: any exchange "
    "failure stops the worker")
NB_PARAM_DOUBLE(RejoinTimeoutS, "NB_REJOIN_TIMEOUT_S", 60, 1, 3600,
                "nebula worker --rejoin: how long to keep trying to pull the global state")
NB_PARAM_DOUBLE(StartTimeoutS, "NB_START_TIMEOUT_S", 120, 1, 86400,
                "nebula worker: how long the start waits for every peer cluster to answer "
                "before the clusters agree on the model (a peer still starting is not dead)")
NB_PARAM_STRING(MetricsListen, "NEBULA_METRICS_LISTEN", "",
                "nebula worker, cluster leader (rank 0): serve Prometheus metrics (round, loss, "
                "WAN bytes, link, rounds applied) at http://HOST:PORT/metrics; port 0 picks a "
                "free one, printed at the start; overrides the descriptor's "
                "spec.clusters[i].metrics.listen; empty: that key, or off (docs/operations.md)")

static nb_worker_outcome_t nb__wk_fail(const char* cluster, const char* what) {
  fprintf(stderr, "nebula worker: %s: %s: %s\n", cluster ? cluster : "?", what, nb_error_last());
  return NB_WORKER_FAILED;
}

/* The trainer's grad hook in step and dense modes; ctx is the nb_hybrid_t* slot, filled right
 * after the trainer is created (the hook runs only during steps). */
static nb_status_t nb__wk_grad_hook(void* ctx, float* grads, size_t n) {
  return nb_hybrid_gradient(*(nb_hybrid_t**)ctx, grads, n);
}

/* Removes hybrid-step-<N>.bin files whose trainer folder step-<N> was pruned. */
static void nb__wk_prune_states(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d))) {
    long step;
    char tail[8];
    if (sscanf(e->d_name, "hybrid-step-%ld.bi%1s", &step, tail) != 2 || strcmp(tail, "n") != 0)
      continue;
    char p[NB_TRAIN_PATH_MAX + 320];
    struct stat st;
    snprintf(p, sizeof p, "%s/step-%ld", dir, step);
    if (stat(p, &st) != 0) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  }
  closedir(d);
}

/* One progress line per round for a gateway ($NB_JOB_PROGRESS, docs/gateway.md). */
static void nb__wk_progress(const char* cluster, long round, long rounds, long step, long max_steps,
                            const nb_hybrid_round_t* rec) {
  const char* path = getenv("NB_JOB_PROGRESS");
  FILE* f = path && *path ? fopen(path, "a") : NULL;
  if (!f) return;
  double mbps = rec->exchange_s > 0 ? (double)rec->bytes_sent * 8 / 1e6 / rec->exchange_s : 0;
  fprintf(f,
          "{\"round\": %ld, \"rounds\": %ld, \"step\": %ld, \"max_steps\": %ld, \"loss\": %.6f, "
          "\"wan_mbps\": %.3f, \"density\": %g, \"source\": \"%s\", \"global_xxh3\": "
          "\"%016llx\"}\n",
          round, rounds, step, max_steps, rec->loss, mbps, rec->density, cluster,
          (unsigned long long)rec->global_hash);
  fclose(f);
}

static int nb__wk_mkdirs(const char* path) {
  char tmp[NB_JOB_PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
  for (char* p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* ---- the run: every phase below shares one nb__wk_t ---------------------------------------- */

/* What one run holds. The phases fill it in order (set up, connect, rounds, finish) and
 * nb__wk_release frees what it owns. */
typedef struct {
  const nb_worker_opts_t* o;
  const char* cluster;
  /* set up */
  nb_comm_t* comm; /* under mpirun: this cluster's ranks (rank 0 leads); NULL alone */
  int rank, size;
  nb_job_config_t* job;
  nb_descriptor_diag_t* diag;
  nb_train_config_t* tc;
  int ci;         /* the cluster's position in the descriptor */
  uint32_t index; /* its position among the job's clusters ordered by id */
  char peer_id[NB_WORKER_MAX_PEERS][NB_JOB_NAME_MAX];
  const char* peer_addr[NB_WORKER_MAX_PEERS];
  int n_peers;
  char odir[NB_JOB_PATH_MAX];
  char path[NB_TRAIN_PATH_MAX + 64]; /* scratch for the files written */
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  int have_secret;
  nb_trainer_t* t;
  double t_start;
  /* connect */
  nb_session_t* s;   /* the session that drives the trainer (api/driven.h) */
  nb_exchange_t* ex; /* its exchange (NULL for one cluster) and round state, borrowed */
  nb_hybrid_t* h;
  nb_wk_ranks_t ranks; /* this cluster's ranks and their grid (worker/ranks.h) */
  nb_hybrid_config_t hc;
  int ft; /* fault-tolerant rounds: outer mode, several clusters, NB_FAULT_TOLERANT */
  size_t n_params;
  long rejoined_at, round0, rounds;
  int adaptive;
  /* the scheduler (api/adapt.h; the public session's too), and with values "auto" the codec
   * points it picks from */
  nb_adapt_t ad;
  /* the rounds' log and totals */
  FILE* tsv;
  json_t* decisions;
  json_t* evals;
  double compute_s, exchange_s, codec_s, last_loss, density_sum;
  uint64_t wan_bytes, msg_bytes;
  long steps_done, step0, skipped, late, jumps, pulls, prev_r;
  double t_rounds;   /* when this run's first round began: the ETA's pace */
  nb_prom_t* prom;   /* NEBULA_METRICS_LISTEN: the leader's metrics; NULL = off */
  nb_tfevents_t* tb; /* OUT/tb: TensorBoard scalars each round; NULL = off or not writable */
} nb__wk_t;

#define NB__WK_TRY(call)                         \
  do {                                           \
    nb_worker_outcome_t nb__rc = (call);         \
    if (nb__rc != NB_WORKER_DONE) return nb__rc; \
  } while (0)

/* ---- set up --------------------------------------------------------------------------------- */

/* Under mpirun: one process per rank of this cluster; rank 0 leads. */
static nb_worker_outcome_t nb__wk_join_ranks(nb__wk_t* w) {
  w->size = 1;
  if (nb_intra_launch_size() > 1) {
    nb_comm_config_t ccfg;
    nb_comm_config_init(&ccfg);
    ccfg.device = NB_COMM_DEVICE_CPU;
    if (nb_intra_init(NULL, NULL) != NB_OK || nb_comm_create(&ccfg, &w->comm) != NB_OK)
      return nb__wk_fail(w->cluster, "MPI");
    w->rank = nb_comm_rank(w->comm);
    w->size = nb_comm_size(w->comm);
  }
  nb_log_set_identity(w->cluster, w->rank);
  return NB_WORKER_DONE;
}

/* The descriptor, confined to the job's paths when a gateway runs it, and our cluster in it. */
static nb_worker_outcome_t nb__wk_load_job(nb__wk_t* w) {
  const char* job_file = w->o->job_file;
  if (nb_calloc((void**)&w->job, 1, sizeof *w->job, "job") != NB_OK ||
      nb_calloc((void**)&w->diag, 1, sizeof *w->diag, "diag") != NB_OK ||
      nb_calloc((void**)&w->tc, 1, sizeof *w->tc, "train config") != NB_OK)
    return nb__wk_fail(w->cluster, "setup");
  if (nb_cli_descriptor_precheck(job_file) != NB_OK) { /* missing, unreadable, a folder, large */
    fprintf(stderr, "nebula worker: %s\n", nb_error_last());
    return NB_WORKER_FAILED;
  }
  if (nb_descriptor_load(job_file, w->job, w->diag) != NB_OK) {
    nb_descriptor_diag_print(stderr, job_file, w->diag);
    fprintf(stderr, "nebula worker: %s: invalid descriptor\n", job_file);
    return NB_WORKER_FAILED;
  }
  if (w->job->program.argc > 0) {
    fprintf(stderr,
            "nebula worker: %s: $.spec.program: this job runs the user's own program, not the "
            "built-in model: submit it to a gateway (nebula submit), which starts it with the "
            "NEBULA_* environment (docs/gateway.md)\n",
            job_file);
    return NB_WORKER_FAILED;
  }
  if (nb_job_paths_confine_env(w->job) != NB_OK) /* run by a gateway: paths stay in the job */
    return nb__wk_fail(w->cluster, job_file);
  const nb_job_config_t* job = w->job;
  w->ci = -1;
  for (int i = 0; i < job->n_clusters; i++) {
    if (strcmp(job->clusters[i].id, w->cluster) == 0) w->ci = i;
  }
  if (w->ci < 0) {
    fprintf(stderr, "nebula worker: job %s has no cluster '%s'\n", job->name, w->cluster);
    return NB_WORKER_MISFIT;
  }
  for (int i = 0; i < job->n_clusters; i++)
    if (strcmp(job->clusters[i].id, w->cluster) < 0) w->index++;
  return NB_WORKER_DONE;
}

/* Every other cluster needs exactly one --peer ID=HOST:PORT. */
static nb_worker_outcome_t nb__wk_peers(nb__wk_t* w) {
  const nb_job_config_t* job = w->job;
  const char* const* arg = w->o->peers;
  w->n_peers = w->o->n_peers;
  if (w->n_peers != job->n_clusters - 1) {
    fprintf(stderr,
            "nebula worker: job %s has %d clusters: give one --peer ID=ADDR for each "
            "other cluster (got %d)\n",
            job->name, job->n_clusters, w->n_peers);
    return NB_WORKER_MISFIT;
  }
  for (int i = 0; i < w->n_peers; i++) {
    const char* eq = strchr(arg[i], '=');
    size_t idlen = eq ? (size_t)(eq - arg[i]) : 0;
    if (!eq || idlen == 0 || idlen >= NB_JOB_NAME_MAX || !eq[1]) {
      fprintf(stderr, "nebula worker: --peer needs ID=HOST:PORT, got '%s'\n", arg[i]);
      return NB_WORKER_MISFIT;
    }
    memcpy(w->peer_id[i], arg[i], idlen);
    w->peer_id[i][idlen] = 0;
    w->peer_addr[i] = eq + 1;
    int known = 0;
    for (int c = 0; c < job->n_clusters; c++)
      if (strcmp(job->clusters[c].id, w->peer_id[i]) == 0 && c != w->ci) known = 1;
    for (int j = 0; j < i; j++)
      if (strcmp(w->peer_id[j], w->peer_id[i]) == 0) known = 0;
    if (!known) {
      fprintf(stderr, "nebula worker: --peer %s: not another cluster of job %s (or repeated)\n",
              w->peer_id[i], job->name);
      return NB_WORKER_MISFIT;
    }
  }
  return NB_WORKER_DONE;
}

/* The trainer's config: the job's, with --steps, the ranks and the data order of this cluster. */
static nb_worker_outcome_t nb__wk_train_config(nb__wk_t* w) {
  nb_job_config_t* job = w->job;
  nb_train_config_t* tc = w->tc;
  long steps = w->o->steps;
  if (steps > 0) {
    job->training.max_steps = steps;
    if (job->training.optimizer.warmup_steps >= steps)
      job->training.optimizer.warmup_steps = (int)(steps / 10);
  }
  if (nb_train_config_from_job(job, w->ci, w->o->data_dir, tc) != NB_OK)
    return nb__wk_fail(w->cluster, w->o->job_file);
  tc->data_rank = (int)w->index; /* clusters that share a language read it in different orders */
  if (w->size > 1) {
    if (job->sync.mode != NB_JOB_SYNC_OUTER || job->sync.round_seconds > 0) {
      fprintf(stderr,
              "nebula worker: several ranks per cluster need sync.mode \"outer\" with "
              "step-counted rounds\n");
      return NB_WORKER_MISFIT;
    }
  }
  /* the grid: replicas of parallel.tensor or parallel.pipeline ranks, data parallel across */
  const nb_job_cluster_t* cl = &job->clusters[w->ci];
  int width = cl->tensor_parallel * cl->pipeline_parallel;
  if (width > 1 && w->size == 1) {
    fprintf(stderr,
            "nebula worker: %s: parallel.%s %d needs that many ranks: start the cluster under "
            "mpirun (or through a gateway's mpirun or slurm launcher)\n",
            w->cluster, cl->pipeline_parallel > 1 ? "pipeline" : "tensor", width);
    return NB_WORKER_MISFIT;
  }
  if (nb_wk_ranks_grid(&w->ranks, w->comm, cl->tensor_parallel, cl->pipeline_parallel) != NB_OK)
    return nb__wk_fail(w->cluster, "the ranks");
  if (w->size > 1) {
    /* real replicas replace the accumulated micro-batches that stand for workers otherwise */
    int replicas = cl->workers / width;
    tc->micro_batches = replicas > w->ranks.dp ? replicas / w->ranks.dp : 1;
    if (cl->pipeline_parallel > 1) { /* the step's batch in micro-batches through the stages */
      int m = cl->micro_batches > 0 ? cl->micro_batches : cl->pipeline_parallel;
      tc->batch_size /= m;
      tc->micro_batches *= m;
    }
    nb_wk_ranks_train_config(&w->ranks, tc, (int)w->index * 1000);
  }
  return NB_WORKER_DONE;
}

/* The output folder and, with checkpoints or --resume, the checkpoint folder: the trainer's
 * step-<N>/ folders plus hybrid-step-<N>.bin beside them. With overlap the update in flight
 * lands first (nb_hybrid_drain): nothing is in flight in a checkpoint, and --resume starts with
 * nothing in flight. */
static nb_worker_outcome_t nb__wk_folders(nb__wk_t* w) {
  const nb_job_config_t* job = w->job;
  nb_train_config_t* tc = w->tc;
  const char* out = w->o->out;
  if (out ? snprintf(w->odir, sizeof w->odir, "%s", out) >= (int)sizeof w->odir
          : snprintf(w->odir, sizeof w->odir, "runs/%s/%s", job->name, w->cluster) >=
                (int)sizeof w->odir) {
    fprintf(stderr, "nebula worker: --out path too long\n");
    return NB_WORKER_MISFIT;
  }
  if (nb__wk_mkdirs(w->odir) != 0) {
    fprintf(stderr, "nebula worker: cannot create %s: %s\n", w->odir, strerror(errno));
    return NB_WORKER_FAILED;
  }
  tc->checkpoint_dir[0] = 0;
  if (job->checkpoint.every_rounds > 0 || w->o->resume) {
    int n = job->checkpoint.dir[0] ? snprintf(tc->checkpoint_dir, sizeof tc->checkpoint_dir,
                                              "%s/%s", job->checkpoint.dir, w->cluster)
                                   : snprintf(tc->checkpoint_dir, sizeof tc->checkpoint_dir,
                                              "%s/checkpoints", w->odir);
    if (n >= (int)sizeof tc->checkpoint_dir || nb__wk_mkdirs(tc->checkpoint_dir) != 0) {
      fprintf(stderr, "nebula worker: cannot create the checkpoint folder %s\n",
              tc->checkpoint_dir);
      return NB_WORKER_FAILED;
    }
  }
  tc->checkpoint_keep = job->checkpoint.keep;
  tc->resume = w->o->resume;
  return NB_WORKER_DONE;
}

/* The job secret that seals update frames (the session loads the cluster's certificate). */
static nb_worker_outcome_t nb__wk_security(nb__wk_t* w) {
  const char* secret_file = w->o->secret_file;
  if (secret_file) {
    FILE* f = fopen(secret_file, "rb");
    size_t got = f ? fread(w->secret, 1, sizeof w->secret, f) : 0;
    int extra = f ? fgetc(f) : EOF;
    if (f) fclose(f);
    if (got != sizeof w->secret || extra != EOF) {
      fprintf(stderr, "nebula worker: %s: --secret-file must hold exactly %d bytes\n", w->cluster,
              NB_SEAL_SECRET_BYTES);
      return NB_WORKER_FAILED;
    }
    w->have_secret = 1;
  } else if (w->job->security.seal && !w->o->insecure) {
    fprintf(stderr, "nebula worker: the job seals update frames: give --secret-file\n");
    return NB_WORKER_MISFIT;
  }
  return NB_WORKER_DONE;
}

static nb_worker_outcome_t nb__wk_trainer(nb__wk_t* w) {
  if (w->job->sync.mode != NB_JOB_SYNC_OUTER) {
    w->tc->grad_hook = nb__wk_grad_hook;
    w->tc->grad_hook_ctx = &w->h;
  }
  w->t_start = nb_now_s();
  nb_status_t st = nb_trainer_create(w->tc, &w->t);
  if (st == NB_OK) st = nb_wk_ranks_attach(&w->ranks, w->t);
  if (st != NB_OK) {
    nb_worker_outcome_t rc = nb__wk_fail(w->cluster, "creating the trainer");
    if (st == NB_ERR_IO && strstr(nb_error_last(), "data file")) /* not a checkpoint's */
      fprintf(stderr, "nebula worker: prepare the data with 'make data', or pass --data-dir\n");
    return rc;
  }
  return NB_WORKER_DONE;
}

static nb_worker_outcome_t nb__wk_setup(nb__wk_t* w) {
  NB__WK_TRY(nb__wk_join_ranks(w));
  NB__WK_TRY(nb__wk_load_job(w));
  NB__WK_TRY(nb__wk_peers(w));
  NB__WK_TRY(nb__wk_train_config(w));
  NB__WK_TRY(nb__wk_folders(w));
  NB__WK_TRY(nb__wk_security(w));
  return nb__wk_trainer(w);
}

/* ---- connect -------------------------------------------------------------------------------- */

/* The round's config from the job (worker/job_map.c), the codec points of values "auto", and
 * the local model: the trainer, or the gathered buffer of this cluster's ranks. */
static nb_worker_outcome_t nb__wk_round_config(nb__wk_t* w, nb_driven_t* d) {
  nb_hybrid_config_t* hc = &w->hc;
  nb_hybrid_config_from_job(w->job, w->index, hc);
  /* values "auto": the scheduler picks a codec point each round (api/codec_points.h); until
   * it has measured the link, the point of fewest bytes */
  w->ad.auto_codec = w->job->compression.values == NB_JOB_VALUES_AUTO;
  if (w->ad.auto_codec) {
    nb_codec_auto_init(&w->ad.codec, hc->inner_steps, hc);
    printf("values auto: %zu codec points, their loss measured at H %ld (this job: H %ld)\n",
           w->ad.codec.n, w->ad.codec.measured_h, hc->inner_steps);
  }
  if (w->job->sync.overlap && hc->mode != NB_HYBRID_OUTER)
    fprintf(stderr, "nebula worker: %s: sync.overlap applies to the outer mode only; ignored\n",
            w->cluster);
  /* fault-tolerant rounds: outer mode (with or without overlap), several clusters */
  w->ft = w->job->n_clusters > 1 && hc->mode == NB_HYBRID_OUTER && nb_param_FaultTolerant();
  if (w->o->rejoin && !w->ft) {
    fprintf(stderr,
            "nebula worker: --rejoin needs fault-tolerant rounds (outer mode, several "
            "clusters, NB_FAULT_TOLERANT=1)\n");
    return NB_WORKER_MISFIT;
  }
  memset(d, 0, sizeof *d);
  nb_wk_ranks_local(&w->ranks, hc, &d->local);
  d->hc = *hc;
  const nb_job_config_t* job = w->job;
  d->streams = job->link.streams > 0 ? (uint32_t)job->link.streams : 0;
  d->chunk_bytes = job->link.chunk_kib > 0 ? (size_t)job->link.chunk_kib * 1024 : 0;
  d->rate_hint_Bps = job->link.rate_mbit > 0 ? job->link.rate_mbit * 1e6 / 8 : 0;
  return NB_WORKER_DONE;
}

/* The session: our exchange server and a link per peer cluster (mutual TLS with --pki, frames
 * sealed with the job secret), then the start: every cluster agrees on the model's size and
 * the job's settings, or (--rejoin) a live peer's global state is pulled. */
static nb_worker_outcome_t nb__wk_session(nb__wk_t* w) {
  const nb_job_config_t* job = w->job;
  nb_driven_t d;
  NB__WK_TRY(nb__wk_round_config(w, &d));
  const nb_hybrid_config_t* hc = &w->hc;
  nb_session_options_t so;
  nb_session_options_default(&so);
  so.job_id = job->name;
  so.cluster_id = w->cluster;
  so.cluster_index = w->index;
  so.n_clusters = (uint32_t)job->n_clusters;
  so.listen = w->o->listen ? w->o->listen : "127.0.0.1:0";
  so.peers = w->o->peers;
  so.n_peers = (size_t)w->n_peers;
  so.pki_dir = w->o->pki;
  so.insecure = w->o->pki == NULL;
  so.job_secret = w->have_secret ? w->secret : NULL;
  so.unsealed = !w->have_secret;
  so.inner_steps = hc->inner_steps;
  so.outer_lr = hc->outer_lr;
  so.outer_momentum = hc->outer_momentum;
  so.density = hc->density;
  so.values = nb_values_name(hc->values);
  so.error_feedback = hc->error_feedback;
  so.topk_chunk = hc->topk_chunk;
  so.update_norm_bound = hc->norm_bound;
  so.peer_timeout_s = job->sync.peer_timeout_seconds > 0 ? job->sync.peer_timeout_seconds : 0;
  so.fault_tolerant = w->ft;
  so.round_deadline_s = nb_param_RoundDeadlineS();
  so.final_wait_s = nb_param_FinalWaitS();
  so.rejoin = w->o->rejoin;
  so.rejoin_timeout_s = nb_param_RejoinTimeoutS();
  so.start_timeout_s = nb_param_StartTimeoutS();
  so.rate_mbit = w->o->no_rate_cap ? 0 : job->link.rate_mbit;
  if (nb_driven_open(&so, &d, &w->s) != NB_OK)
    return nb__wk_fail(w->cluster, "opening the session");
  w->ex = nb_driven_exchange(w->s);
  if (nb_session_start(w->s) != NB_OK)
    return nb__wk_fail(w->cluster, w->o->rejoin ? "rejoining" : "starting the session");
  w->h = nb_driven_hybrid(w->s);
  nb_hybrid_global(w->h, &w->n_params);
  return NB_WORKER_DONE;
}

/* --resume: the round state saved beside the trainer's checkpoint (the session's own file);
 * --rejoin: the start pulled a live peer's. */
static nb_worker_outcome_t nb__wk_restore(nb__wk_t* w) {
  nb_hybrid_t* h = w->h;
  long step = nb_trainer_step(w->t);
  if (w->o->resume && step > 0) {
    snprintf(w->path, sizeof w->path, "%s/hybrid-step-%ld.bin", w->tc->checkpoint_dir, step);
    if (nb_session_load(w->s, w->path) != NB_OK)
      return nb__wk_fail(w->cluster, "resuming the round state");
    printf("nebula worker: %s resumes at round %llu (step %ld), theta %016llx\n", w->cluster,
           (unsigned long long)nb_hybrid_rounds(h), nb_trainer_step(w->t),
           (unsigned long long)nb_hybrid_global_hash(h));
  }
  w->rejoined_at = -1;
  if (w->o->rejoin) {
    w->rejoined_at = (long)nb_hybrid_rounds(h);
    printf("nebula worker: %s rejoined from %s at round %ld (%llu rounds applied), theta %016llx\n",
           w->cluster, nb_driven_pulled_from(w->s), w->rejoined_at,
           (unsigned long long)nb_hybrid_commits(h), (unsigned long long)nb_hybrid_global_hash(h));
    fflush(stdout);
  }
  w->round0 = (long)nb_hybrid_rounds(h);
  return NB_WORKER_DONE;
}

/* The adaptive scheduler (outer mode, several clusters) and the idle-link probes it measures
 * with: frames may be too small to measure the link (inter/link.h). */
static nb_worker_outcome_t nb__wk_scheduler(nb__wk_t* w) {
  w->adaptive = w->job->compression.adaptive && w->ex != NULL && w->hc.mode == NB_HYBRID_OUTER;
  nb_sched_config_from_job(w->job, &w->ad.cfg);
  /* with values "auto", until a transfer large enough to measure has crossed, 90 % of the
   * link's rate is the estimate, so that the point and the landing step fit the link from the
   * second round on */
  w->ad.cap_Bps = w->job->link.rate_mbit * 1e6 / 8;
  w->ad.hint_cap = w->ad.auto_codec;
  if (w->adaptive && nb_sched_config_check(&w->ad.cfg) != NB_OK)
    return nb__wk_fail(w->cluster, "compression settings for the scheduler");
  if (w->adaptive && nb_adapt_probes_start(w->ex) != NB_OK)
    return nb__wk_fail(w->cluster, "starting the link probe");
  return NB_WORKER_DONE;
}

/* The leader's Prometheus endpoint: NEBULA_METRICS_LISTEN when set, else the cluster's
 * spec.clusters[i].metrics.listen. A value that does not serve (a bad address, a port in use)
 * stops the worker: metrics asked for and missing would go unnoticed. */
static nb_worker_outcome_t nb__wk_metrics_start(nb__wk_t* w) {
  const char* listen = nb_param_MetricsListen();
  char from[64];
  snprintf(from, sizeof from, "NEBULA_METRICS_LISTEN");
  if (!listen[0]) {
    listen = w->job->clusters[w->ci].metrics_listen;
    snprintf(from, sizeof from, "$.spec.clusters[%d].metrics.listen", w->ci);
  }
  if (!listen[0]) return NB_WORKER_DONE;
  if (nb_leader_metrics_start(listen, w->job->name, w->cluster, &w->prom) != NB_OK) {
    fprintf(stderr, "nebula worker: %s: %s=%s: %s\n", w->cluster, from, listen, nb_error_last());
    return NB_WORKER_FAILED;
  }
  const char* colon = strrchr(listen, ':');
  int host_len = colon ? (int)(colon - listen) : 0;
  printf("nebula worker: %s metrics at http://%.*s:%d/metrics\n", w->cluster,
         host_len ? host_len : 9, host_len ? listen : "127.0.0.1", nb_prom_port(w->prom));
  fflush(stdout);
  return NB_WORKER_DONE;
}

/* OUT/tb/events.out.tfevents.*: a new file per run (TensorBoard reads them all, resumed runs
 * too). One that cannot be made is a warning: training goes on without it. */
static void nb__wk_tensorboard_open(nb__wk_t* w) {
  if (!nb_tfevents_enabled()) return;
  char dir[sizeof w->odir + 8];
  snprintf(dir, sizeof dir, "%s/tb", w->odir);
  if (nb_tfevents_open(dir, &w->tb) != NB_OK)
    NB_WARN("%s; training goes on without TensorBoard events (NB_TENSORBOARD=0 turns them off)",
            nb_error_last());
}

/* The held-out figures as TensorBoard scalars at `step`: each language's and the mean. */
static void nb__wk_tensorboard_eval(nb__wk_t* w, long step, const nb_train_eval_t* ev) {
  char tag[NB_TFEVENTS_TAG_MAX + 1];
  for (int i = 0; i < ev->n; i++) {
    snprintf(tag, sizeof tag, "eval/bpb/%s", ev->label[i]);
    nb_tfevents_scalar(w->tb, step, tag, ev->bpb[i]);
  }
  nb_tfevents_scalar(w->tb, step, "eval/bpb_mean", ev->mean_bpb);
  nb_tfevents_flush(w->tb);
}

/* The banner and rounds.tsv (appended to on --resume and --rejoin). */
static nb_worker_outcome_t nb__wk_open_log(nb__wk_t* w) {
  const nb_job_config_t* job = w->job;
  const nb_hybrid_config_t* hc = &w->hc;
  w->decisions = json_array();
  w->evals = json_array();
  w->rounds = (long)((job->training.max_steps + hc->inner_steps - 1) / hc->inner_steps);
  printf(
      "nebula worker: job %s, cluster %s (%u of %d), %zu synced parameters, %ld rounds of %ld "
      "steps, density %g %s%s, exchange on port %d\n",
      job->name, w->cluster, w->index, job->n_clusters, w->n_params, w->rounds, hc->inner_steps,
      hc->density, nb_values_name(hc->values), hc->overlap ? ", overlap" : "",
      w->ex ? nb_session_port(w->s) : 0);
  const nb_wk_ranks_t* rk = &w->ranks;
  if (rk->size > 1)
    printf("nebula worker: %s: %d ranks: data %d x tensor %d x pipeline %d%s\n", w->cluster,
           rk->size, rk->dp, rk->tp, rk->pp,
           rk->pp > 1 ? " (1F1B over the step's micro-batches)" : "");
  fflush(stdout);
  snprintf(w->path, sizeof w->path, "%s/rounds.tsv", w->odir);
  w->tsv = fopen(w->path, w->o->resume || w->o->rejoin ? "a" : "w");
  if (!w->tsv) {
    fprintf(stderr, "nebula worker: cannot write %s: %s\n", w->path, strerror(errno));
    return NB_WORKER_FAILED;
  }
  fseek(w->tsv, 0, SEEK_END);
  if (ftell(w->tsv) == 0) fprintf(w->tsv, "%s", NB_WORKER_ROUNDS_TSV_HEADER);
  w->steps_done = w->step0 = nb_trainer_step(w->t);
  w->prev_r = w->round0 - 1;
  w->t_rounds = nb_now_s();
  nb__wk_tensorboard_open(w);
  return NB_WORKER_DONE;
}

/* The metrics first: a leader that waits for its peers at the start is seen doing so (round 0,
 * no peer alive). */
static nb_worker_outcome_t nb__wk_connect(nb__wk_t* w) {
  NB__WK_TRY(nb__wk_metrics_start(w));
  NB__WK_TRY(nb__wk_session(w));
  NB__WK_TRY(nb__wk_restore(w));
  NB__WK_TRY(nb__wk_scheduler(w));
  return nb__wk_open_log(w);
}

/* ---- the round loop ------------------------------------------------------------------------- */

/* A checkpoint round with overlap: this round's update lands now (nothing in flight in the
 * state); *skip: it was decided not applied. */
static nb_worker_outcome_t nb__wk_land_for_checkpoint(nb__wk_t* w, long r, nb_hybrid_round_t* rec,
                                                      int* skip) {
  nb_hybrid_round_t d;
  if (nb_driven_drain(w->s, &d) != NB_OK)
    return nb__wk_fail(w->cluster, "landing the update before the checkpoint");
  rec->exchange_s += d.exchange_s;
  rec->bytes_sent += d.bytes_sent;
  rec->global_hash = d.global_hash;
  if (!w->ft) return NB_WORKER_DONE;
  rec->commits = d.commits;
  if (!d.applied) {
    *skip = 1;
    printf(
        "round %ld: not applied (decided before the checkpoint: updates from %u of %d "
        "peers, %u alive) at unix %.3f\n",
        r + 1, d.peers_ok, w->n_peers, d.peers_alive, (double)nb_wall_ns() / 1e9);
  }
  if (d.caught_up) rec->caught_up = 1;
  if (d.need_state) rec->need_state = 1;
  if (d.next_round > rec->next_round) rec->next_round = d.next_round;
  return NB_WORKER_DONE;
}

/* What the round's record means for the counters and the event column; with overlap rec tells
 * the previous round's update, decided in this one. */
static nb_worker_outcome_t nb__wk_tally(nb__wk_t* w, long r, nb_hybrid_round_t* rec, int skip,
                                        const char** event) {
  if (!w->ft) {
    rec->applied = 1;
    rec->commits = nb_hybrid_commits(w->h);
    rec->peers_ok = rec->peers_alive = (uint32_t)w->n_peers;
    return NB_WORKER_DONE;
  }
  if (rec->landed && !rec->applied) w->skipped++, *event = "skipped";
  if (skip) w->skipped++, *event = "skipped";
  if (rec->caught_up) w->late++, *event = "late";
  if (rec->next_round > rec->round + 1) w->jumps++, *event = "jump";
  if (rec->need_state) { /* the session pulled it (and published ours) */
    w->pulls++;
    *event = "pulled";
    rec->commits = nb_hybrid_commits(w->h);
    rec->global_hash = nb_hybrid_global_hash(w->h);
    printf("round %llu: behind the other clusters: pulled the global state from %s\n",
           (unsigned long long)rec->round, nb_driven_pulled_from(w->s));
  }
  if (r == w->round0 && w->rejoined_at >= 0) *event = "rejoined";
  return NB_WORKER_DONE;
}

/* The totals, a rounds.tsv row, the round's line and the gateway's progress line. */
static void nb__wk_log(nb__wk_t* w, long r, const nb_hybrid_round_t* rec, const char* event) {
  w->compute_s += rec->compute_s;
  w->exchange_s += rec->exchange_s;
  w->codec_s += rec->codec_s;
  w->wan_bytes += rec->bytes_sent;
  w->msg_bytes += rec->msg_bytes;
  w->steps_done += rec->steps;
  w->last_loss = rec->loss;
  w->density_sum += rec->density;
  fprintf(w->tsv,
          "%llu\t%ld\t%llu\t%llu\t%.6f\t%llu\t%llu\t%g\t%.4f\t%.4f\t%.4f\t%016llx\t%d\t%llu\t%"
          "u\t%u\t%s\n",
          (unsigned long long)rec->round, rec->steps, (unsigned long long)rec->samples,
          (unsigned long long)rec->samples_all, rec->loss, (unsigned long long)rec->msg_bytes,
          (unsigned long long)rec->bytes_sent, rec->density, rec->compute_s, rec->codec_s,
          rec->exchange_s, (unsigned long long)rec->global_hash, rec->applied,
          (unsigned long long)rec->commits, rec->peers_ok, rec->peers_alive, event);
  fflush(w->tsv);
  int evt = strcmp(event, "-") != 0;
  /* the time left at this run's pace of rounds so far */
  long done = r + 1 - w->round0;
  double eta =
      done > 0 ? (nb_now_s() - w->t_rounds) / (double)done * (double)(w->rounds - r - 1) : -1;
  char es[24];
  int overlap = w->hc.overlap;
  char at[48] = "";
  if (overlap && rec->landed && rec->landed_step >= 0)
    snprintf(at, sizeof at, ", landed after step %ld", rec->landed_step);
  printf(
      "round %ld/%ld: step %ld/%ld, eta %s: %ld steps, loss %.4f, sent %.1f KiB (density %g), "
      "compute %.2f s, exchange %.2f s%s, theta %016llx%s%s\n",
      r + 1, w->rounds, w->steps_done, (long)w->job->training.max_steps,
      nb_duration_format(eta, es, sizeof es), rec->steps, rec->loss, rec->msg_bytes / 1024.0,
      rec->density, rec->compute_s, rec->exchange_s, at, (unsigned long long)rec->global_hash,
      evt ? ", " : "", evt ? event : "");
  if (w->ft && rec->landed && !rec->applied)
    printf("round %ld%s: not applied (updates from %u of %d peers, %u alive) at unix %.3f\n",
           overlap ? w->prev_r + 1 : r + 1, overlap ? " (decided in the next round)" : "",
           rec->peers_ok, w->n_peers, rec->peers_alive, (double)nb_wall_ns() / 1e9);
  w->prev_r = r;
  fflush(stdout);
  nb_estimate_t est;
  nb_adapt_estimate(w->ex, &est);
  if (w->tb) { /* the step axis: inner steps done; statuses ignored (a failure warns once) */
    long st = w->steps_done;
    nb_tfevents_scalar(w->tb, st, "loss", rec->loss);
    nb_tfevents_scalar(w->tb, st, "density", rec->density);
    nb_tfevents_scalar(w->tb, st, "wan/bytes_sent", (double)rec->bytes_sent);
    nb_tfevents_scalar(w->tb, st, "wan/msg_bytes", (double)rec->msg_bytes);
    nb_tfevents_scalar(w->tb, st, "wan/goodput_bytes_per_s", est.goodput_Bps);
    nb_tfevents_scalar(w->tb, st, "wan/rtt_s", est.rtt_s);
    nb_tfevents_scalar(w->tb, st, "time/compute_s", rec->compute_s);
    nb_tfevents_scalar(w->tb, st, "time/exchange_s", rec->exchange_s);
    nb_tfevents_scalar(w->tb, st, "peers_alive", (double)rec->peers_alive);
    nb_tfevents_flush(w->tb);
  }
  if (w->prom) {
    nb_leader_figures_t f = {
        .round = r + 1,
        .rounds = w->rounds,
        .step = w->steps_done,
        .max_steps = (long)w->job->training.max_steps,
        .loss = rec->loss,
        .density = rec->density,
        .wan_sent = w->wan_bytes,
        .wan_received = nb_driven_received(w->s),
        .goodput_Bps = est.goodput_Bps,
        .rtt_s = est.rtt_s,
        .peers = w->n_peers,
        .peers_alive = (int)rec->peers_alive,
        .applied = rec->commits,
        .skipped = w->skipped,
        .late = w->late,
        .compute_s = w->compute_s,
        .exchange_s = w->exchange_s,
    };
    nb_leader_metrics_round(w->prom, &f);
  }
  nb__wk_progress(w->cluster, r + 1, w->rounds, w->steps_done, (long)w->job->training.max_steps,
                  rec);
}

/* The held-out curve on theta_global (with overlap: the parameters as they are). */
static nb_worker_outcome_t nb__wk_eval_round(nb__wk_t* w, long r) {
  nb_train_eval_t mid;
  if (nb_wk_ranks_eval(&w->ranks, &mid) != NB_OK) return nb__wk_fail(w->cluster, "evaluation");
  printf("eval after round %ld: mean %.4f bpb\n", r + 1, mid.mean_bpb);
  nb_leader_metrics_eval(w->prom, r + 1, mid.mean_bpb);
  nb__wk_tensorboard_eval(w, nb_trainer_step(w->t), &mid);
  json_t* e = json_object();
  json_object_set_new(e, "round", json_integer(r + 1));
  json_object_set_new(e, "step", json_integer(nb_trainer_step(w->t)));
  json_object_set_new(e, "mean_bpb", json_real(mid.mean_bpb));
  /* each language's point too (the report draws one curve per language); one that scored
   * nothing (NaN, which JSON cannot hold) is left out */
  json_t* langs = json_object();
  for (int i = 0; i < mid.n; i++)
    if (isfinite(mid.bpb[i])) json_object_set_new(langs, mid.label[i], json_real(mid.bpb[i]));
  json_object_set_new(e, "bpb", langs);
  json_array_append_new(w->evals, e);
  return NB_WORKER_DONE;
}

/* The round state first, then the trainer's checkpoint moves LATEST to it. */
static nb_worker_outcome_t nb__wk_checkpoint(nb__wk_t* w) {
  const char* dir = w->tc->checkpoint_dir;
  snprintf(w->path, sizeof w->path, "%s/hybrid-step-%ld.bin", dir, nb_trainer_step(w->t));
  if (nb_session_save(w->s, w->path) != NB_OK || nb_wk_ranks_checkpoint(&w->ranks) != NB_OK)
    return nb__wk_fail(w->cluster, "checkpoint");
  nb__wk_prune_states(dir);
  return NB_WORKER_DONE;
}

static json_t* nb__wk_decision_json(long r, const nb_sched_input_t* in,
                                    const nb_sched_decision_t* dec) {
  json_t* d = json_object();
  json_object_set_new(d, "round", json_integer(r + 1));
  json_object_set_new(d, "reason", json_string(nb_sched_reason_name(dec->reason)));
  json_object_set_new(d, "density", json_real(dec->density));
  json_object_set_new(d, "steps", json_integer(dec->steps));
  json_object_set_new(d, "goodput_Bps", json_real(in->goodput_Bps));
  json_object_set_new(d, "rtt_s", json_real(in->rtt_s));
  json_object_set_new(d, "step_compute_s", json_real(in->step_compute_s));
  json_object_set_new(d, "predicted_transfer_s", json_real(dec->transfer_s));
  if (in->observed_s > 0) json_object_set_new(d, "observed_exchange_s", json_real(in->observed_s));
  json_object_set_new(d, "budget_s", json_real(dec->budget_s));
  json_object_set_new(d, "overlap_steps", json_integer(dec->hide_steps));
  return d;
}

/* The next round's density (and length) from the measured link and compute. */
static nb_worker_outcome_t nb__wk_schedule(nb__wk_t* w, long r, const nb_hybrid_round_t* rec) {
  const nb_hybrid_config_t* hc = &w->hc;
  nb_adapt_round_t ar = {
      .round = (uint64_t)r,
      .values = hc->values,
      .topk_chunk = hc->topk_chunk,
      .density = rec->density,
      .n_params = w->n_params,
      .steps = (uint32_t)hc->inner_steps,
      .step_compute_s = rec->steps > 0 ? rec->compute_s / (double)rec->steps : 0,
      .round_s = hc->round_seconds,
      .exchange_took_s = rec->exchange_took_s,
      .set_steps = 1,
  };
  /* with overlap the update lands tau steps into the next round: only those hide it */
  if (hc->overlap && hc->overlap_steps > 0)
    ar.hide_steps = (uint32_t)(hc->overlap_steps < UINT32_MAX ? hc->overlap_steps : UINT32_MAX);
  nb_sched_input_t in;
  nb_sched_decision_t dec;
  if (nb_adapt_next(&w->ad, w->ex, w->h, &ar, &in, &dec) != NB_OK)
    return nb__wk_fail(w->cluster, "scheduler");
  char line[512];
  nb_sched_decision_format(&dec, line, sizeof line);
  const char* point = w->ad.auto_codec ? nb_codec_auto_name(&w->ad.codec) : NULL;
  printf("%s%s%s\n", line, point ? " point=" : "", point ? point : "");
  json_t* d = nb__wk_decision_json(r, &in, &dec);
  if (point) json_object_set_new(d, "point", json_string(point));
  json_array_append_new(w->decisions, d);
  return NB_WORKER_DONE;
}

/* Round r: inner steps and the exchange (the ranks follow through hc's hooks), then log,
 * evaluate, checkpoint and schedule the next one. */
static nb_worker_outcome_t nb__wk_round(nb__wk_t* w, long r) {
  const nb_job_config_t* job = w->job;
  nb_hybrid_round_t rec;
  long left = (long)job->training.max_steps - w->steps_done;
  if (w->hc.mode != NB_HYBRID_OUTER && left < w->hc.inner_steps && left > 0)
    nb_hybrid_set_inner_steps(w->h, left); /* in step modes a round only groups the log */
  if (nb_driven_round(w->s, &rec) != NB_OK) return nb__wk_fail(w->cluster, "round");
  int every = job->checkpoint.every_rounds;
  int ckpt_now = every > 0 && ((r + 1) % every == 0 || (long)nb_hybrid_rounds(w->h) >= w->rounds);
  int skip = 0;
  if (ckpt_now && w->hc.overlap) NB__WK_TRY(nb__wk_land_for_checkpoint(w, r, &rec, &skip));
  const char* event = "-";
  NB__WK_TRY(nb__wk_tally(w, r, &rec, skip, &event));
  nb__wk_log(w, r, &rec, event);
  int eval_every = job->training.eval_every_rounds;
  if (eval_every > 0 && (r + 1) % eval_every == 0 && r + 1 < w->rounds)
    NB__WK_TRY(nb__wk_eval_round(w, r));
  if (ckpt_now) NB__WK_TRY(nb__wk_checkpoint(w));
  if (w->adaptive && r + 1 < w->rounds) NB__WK_TRY(nb__wk_schedule(w, r, &rec));
  return NB_WORKER_DONE;
}

/* ---- finish --------------------------------------------------------------------------------- */

/* With overlap the last round's update is decided here (not inside the final check), so that it
 * is counted, and a cluster found behind pulls the state before the check. */
static nb_worker_outcome_t nb__wk_land_last(nb__wk_t* w) {
  nb_hybrid_round_t d;
  if (nb_driven_drain(w->s, &d) != NB_OK) return nb__wk_fail(w->cluster, "landing the last update");
  w->exchange_s += d.exchange_s;
  w->wan_bytes += d.bytes_sent;
  if (d.landed && !d.applied) {
    w->skipped++;
    printf(
        "round %ld: not applied (decided at the end: updates from %u of %d peers, %u alive) "
        "at unix %.3f\n",
        w->prev_r + 1, d.peers_ok, w->n_peers, d.peers_alive, (double)nb_wall_ns() / 1e9);
  }
  if (d.caught_up) w->late++;
  if (d.need_state) { /* the session pulled it */
    w->pulls++;
    printf("end: behind the other clusters: pulled the global state from %s\n",
           nb_driven_pulled_from(w->s));
  }
  fflush(stdout);
  return NB_WORKER_DONE;
}

/* summary.json (atomically: a temp file renamed); ev and tr_scores (stolen) are the final
 * evaluation's. */
static nb_worker_outcome_t nb__wk_summary(nb__wk_t* w, const nb_train_eval_t* ev, json_t* tr_scores,
                                          double eval_s, double wall, const char* hex) {
  const nb_job_config_t* job = w->job;
  const nb_hybrid_config_t* hc = &w->hc;
  nb_hybrid_t* h = w->h;
  json_t* sum = json_object();
  json_t* evj = json_object();
  for (int i = 0; i < ev->n; i++) json_object_set_new(evj, ev->label[i], json_real(ev->bpb[i]));
  /* per sync: a round in outer mode, a step in step and dense modes */
  long syncs = hc->mode == NB_HYBRID_OUTER ? w->rounds - w->round0 : w->steps_done - w->step0;
  double bpp = syncs > 0 ? 8.0 * (double)w->msg_bytes / (double)syncs / (double)w->n_params : 0;
  json_object_set_new(sum, "job", json_string(job->name));
  json_object_set_new(sum, "cluster", json_string(w->cluster));
  json_object_set_new(sum, "cluster_index", json_integer(w->index));
  json_object_set_new(sum, "ranks", json_integer(w->size));
  json_t* par = json_object();
  json_object_set_new(par, "data", json_integer(w->ranks.dp > 0 ? w->ranks.dp : 1));
  json_object_set_new(par, "tensor", json_integer(w->ranks.pp > 1 ? 1 : w->ranks.mp));
  json_object_set_new(par, "pipeline", json_integer(w->ranks.pp > 1 ? w->ranks.pp : 1));
  json_object_set_new(sum, "parallel", par);
  json_object_set_new(sum, "pid", json_integer(getpid()));
  json_object_set_new(sum, "mode", json_string(nb_job_sync_name(job->sync.mode)));
  json_object_set_new(sum, "overlap", json_boolean(hc->overlap));
  json_object_set_new(sum, "params_synced", json_integer((json_int_t)w->n_params));
  json_object_set_new(sum, "rounds", json_integer(w->rounds));
  json_object_set_new(sum, "resumed_at_round", json_integer(w->o->rejoin ? 0 : w->round0));
  json_object_set_new(sum, "fault_tolerant", json_boolean(w->ft));
  json_object_set_new(sum, "rounds_applied", json_integer((json_int_t)nb_hybrid_commits(h)));
  json_object_set_new(sum, "rounds_skipped", json_integer(w->skipped));
  json_object_set_new(sum, "final_check_attempts", json_integer(nb_hybrid_final_attempts(h)));
  json_object_set_new(sum, "rounds_late", json_integer(w->late));
  json_object_set_new(sum, "round_jumps", json_integer(w->jumps));
  json_object_set_new(sum, "state_pulls", json_integer(w->pulls));
  json_object_set_new(sum, "rejoined_at_round", json_integer(w->rejoined_at));
  json_object_set_new(sum, "syncs", json_integer(syncs));
  json_object_set_new(sum, "inner_steps", json_integer(w->steps_done));
  json_object_set_new(sum, "samples", json_integer((json_int_t)nb_trainer_samples(w->t)));
  json_object_set_new(sum, "final_train_loss", json_real(w->last_loss));
  json_object_set_new(sum, "final_eval_bpb", evj);
  json_object_set_new(sum, "final_eval_mean_bpb", json_real(ev->mean_bpb));
  json_object_set_new(sum, "wall_s", json_real(wall));
  json_object_set_new(sum, "compute_s", json_real(w->compute_s));
  json_object_set_new(sum, "codec_s", json_real(w->codec_s));
  json_object_set_new(sum, "exchange_s", json_real(w->exchange_s));
  json_object_set_new(sum, "eval_s", json_real(eval_s));
  json_object_set_new(sum, "compute_utilization", json_real(wall > 0 ? w->compute_s / wall : 0));
  json_object_set_new(sum, "wan_bytes_sent", json_integer((json_int_t)w->wan_bytes));
  json_object_set_new(sum, "msg_bytes", json_integer((json_int_t)w->msg_bytes));
  json_object_set_new(sum, "density_mean",
                      json_real(w->rounds > 0 ? w->density_sum / w->rounds : 0));
  json_object_set_new(sum, "values", json_string(nb_values_name(hc->values)));
  json_object_set_new(sum, "bits_per_param_per_sync", json_real(bpp));
  json_object_set_new(sum, "global_xxh3", json_string(hex));
  json_object_set_new(sum, "adaptive", json_boolean(w->adaptive));
  json_object_set(sum, "decisions", w->decisions);
  json_object_set(sum, "evals", w->evals);
  json_object_set_new(sum, "tls", json_boolean(w->o->pki != NULL));
  json_object_set_new(sum, "sealed", json_boolean(w->have_secret));
  char data_dir[NB_TRAIN_PATH_MAX];
  if (nb_train_config_data_dir(w->tc, data_dir, sizeof data_dir) == NB_OK)
    json_object_set_new(sum, "data_dir", json_string(data_dir));
  if (tr_scores) json_object_set_new(sum, "translation", tr_scores);
  char tmp[NB_JOB_PATH_MAX + 64];
  snprintf(w->path, sizeof w->path, "%s/summary.json", w->odir);
  snprintf(tmp, sizeof tmp, "%s/summary.json.tmp", w->odir);
  int bad = json_dump_file(sum, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || rename(tmp, w->path);
  json_decref(sum);
  if (bad) {
    fprintf(stderr, "nebula worker: cannot write %s\n", w->path);
    return NB_WORKER_FAILED;
  }
  return NB_WORKER_DONE;
}

/* Stops the ranks, lands the last update, runs the final check and the final evaluation, and
 * writes final.safetensors (LoRA merged, what a gateway publishes) and summary.json. */
static nb_worker_outcome_t nb__wk_finish(nb__wk_t* w) {
  /* the ranks stop now, unless the final evaluation needs the leader's replica */
  int tp = w->ranks.mp > 1;
  if (!tp && nb_wk_ranks_stop(&w->ranks) != NB_OK)
    return nb__wk_fail(w->cluster, "stopping the ranks");
  if (w->ft && w->hc.overlap) NB__WK_TRY(nb__wk_land_last(w));
  if (nb_session_finish(w->s) != NB_OK) return nb__wk_fail(w->cluster, "final check");
  nb_train_eval_t ev;
  double te = nb_now_s();
  if (nb_wk_ranks_eval(&w->ranks, &ev) != NB_OK) return nb__wk_fail(w->cluster, "evaluation");
  if (tp && nb_wk_ranks_stop(&w->ranks) != NB_OK)
    return nb__wk_fail(w->cluster, "stopping the ranks");
  /* the unsharded model: what decoding and final.safetensors take */
  nb_model_t* model = NULL;
  int owned = 0;
  if (nb_wk_ranks_model(&w->ranks, &model, &owned) != NB_OK)
    return nb__wk_fail(w->cluster, "the final model");
  /* Translation jobs: chrF/BLEU of the base and the final model on the test split. */
  json_t* tr_scores = NULL;
  const nb_job_config_t* job = w->job;
  if (job->task == NB_JOB_TASK_TRANSLATION && job->training.eval_sentences > 0 &&
      nb_translation_eval(w->tc, model, (size_t)job->training.eval_sentences, &tr_scores) != NB_OK)
    NB_WARN("no translation scores in the summary: %s", nb_error_last());
  double eval_s = nb_now_s() - te;
  nb__wk_tensorboard_eval(w, nb_trainer_step(w->t), &ev);
  snprintf(w->path, sizeof w->path, "%s/final.safetensors", w->odir);
  nb_lora_t* lora = nb_trainer_lora(w->t);
  nb_status_t saved = NB_OK;
  if ((lora && (saved = nb_lora_merge(lora)) != NB_OK) ||
      (saved = nb_checkpoint_save(w->path, model, nb_trainer_step(w->t))) != NB_OK)
    nb__wk_fail(w->cluster, w->path);
  if (owned) nb_model_destroy(model);
  if (saved != NB_OK) {
    json_decref(tr_scores);
    return NB_WORKER_FAILED;
  }
  double wall = nb_now_s() - w->t_start;
  char hex[24];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)nb_hybrid_global_hash(w->h));
  NB__WK_TRY(nb__wk_summary(w, &ev, tr_scores, eval_s, wall, hex));
  printf(
      "nebula worker: %s done: %ld rounds, eval mean %.4f bpb, %.1f KiB sent, %.1f s wall, "
      "theta %s\n",
      w->cluster, w->rounds, ev.mean_bpb, w->wan_bytes / 1024.0, wall, hex);
  return NB_WORKER_DONE;
}

/* Frees what the run holds; on failure under mpirun the other ranks wait in a collective, so
 * the whole cluster goes down. */
static void nb__wk_release(nb__wk_t* w, nb_worker_outcome_t rc) {
  nb_prom_destroy(w->prom);
  nb_tfevents_close(w->tb);
  json_decref(w->evals);
  json_decref(w->decisions);
  if (w->tsv) fclose(w->tsv);
  nb_session_close(w->s); /* the round state, the exchange and its links */
  nb_trainer_destroy(w->t);
  nb_wk_ranks_release(&w->ranks);
  nb_free(w->tc);
  nb_free(w->diag);
  nb_free(w->job);
  memset(w->secret, 0, sizeof w->secret);
  if (w->comm) {
    if (rc != NB_WORKER_DONE && w->size > 1) {
      fflush(stdout);
      fflush(stderr);
      nb_comm_abort(w->comm, (int)rc);
    }
    nb_comm_destroy(w->comm);
    nb_intra_finalize();
  }
}

nb_worker_outcome_t nb_worker_run(const nb_worker_opts_t* o) {
  nb__wk_t* w = NULL;
  if (nb_calloc((void**)&w, 1, sizeof *w, "worker") != NB_OK)
    return nb__wk_fail(o->cluster, "setup");
  w->o = o;
  w->cluster = o->cluster;
  nb_worker_outcome_t rc = nb__wk_setup(w);
  if (rc == NB_WORKER_DONE && w->rank > 0) {
    rc = nb_wk_ranks_follow(&w->ranks) == NB_OK ? NB_WORKER_DONE
                                                : nb__wk_fail(w->cluster, "following the leader");
  } else if (rc == NB_WORKER_DONE) {
    rc = nb__wk_connect(w);
    for (long r = w->round0; rc == NB_WORKER_DONE && r < w->rounds;
         r = (long)nb_hybrid_rounds(w->h))
      rc = nb__wk_round(w, r);
    if (rc == NB_WORKER_DONE) rc = nb__wk_finish(w);
  }
  nb__wk_release(w, rc);
  nb_free(w);
  return rc;
}
