/* `nebula worker`: one cluster's leader of a cross-datacenter job. It trains its cluster with
 * train/trainer, runs the outer-sync rounds of train/hybrid over inter/exchange (mTLS, sealed
 * frames) and writes rounds.tsv and summary.json. Not here: several ranks per cluster (a
 * cluster's workers are accumulated micro-batches, as in `nebula train`), overlap, the adaptive
 * density (fault-tolerant rounds and --rejoin are wired here; the logic is train/hybrid's). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "compress/compress.h"
#include "inter/estimator.h"
#include "inter/exchange.h"
#include "inter/sched.h"
#include "intra/intra.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"
#include "worker/worker.h"
#include "security/pki.h"
#include "security/seal.h"
#include "security/tls.h"
#include "train/checkpoint.h"
#include "train/hybrid.h"
#include "train/lora.h"
#include "train/trainer.h"

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

static nb_worker_outcome_t nb__wk_fail(const char* cluster, const char* what) {
  fprintf(stderr, "nebula worker: %s: %s: %s\n", cluster ? cluster : "?", what, nb_error_last());
  return NB_WORKER_FAILED;
}

static nb_values_t nb__wk_values(nb_job_values_t v) {
  switch (v) {
    case NB_JOB_VALUES_FP32:
      return NB_VALUES_FP32;
    case NB_JOB_VALUES_FP16:
      return NB_VALUES_FP16;
    case NB_JOB_VALUES_BF16:
      return NB_VALUES_BF16;
    case NB_JOB_VALUES_INT4:
      return NB_VALUES_INT4;
    case NB_JOB_VALUES_INT2:
      return NB_VALUES_INT2;
    default:
      return NB_VALUES_INT8;
  }
}

typedef struct {
  nb_exchange_t* ex;
  size_t n_peers;
  double peer_timeout_s;
  double deadline_s; /* fault-tolerant rounds: per exchange */
} nb__wk_exchange_t;

/* The fault-tolerant exchange (train/hybrid's ft_exchange): a peer that does not deliver by the
 * deadline, is dead or already past this round is left out (NULL) and named in a warning; the
 * round goes on with what arrived. */
static nb_status_t nb__wk_ft_exchange(void* ctx, uint64_t xround, const void* msg, size_t len,
                                      nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent,
                                      uint64_t* ahead, uint32_t* alive) {
  nb__wk_exchange_t* x = ctx;
  if (n_peers != x->n_peers)
    return nb_error(NB_ERR_INTERNAL, "worker: %zu peers expected, exchange has %zu", n_peers,
                    x->n_peers);
  nb_exchange_result_t res[NB_WORKER_MAX_PEERS];
  memset(res, 0, sizeof res);
  int64_t deadline = nb_now_ns() + (int64_t)(x->deadline_s * 1e9);
  nb_status_t st = nb_exchange_round(x->ex, xround, msg, len, deadline, res);
  if (st == NB_ERR_INVALID || st == NB_ERR_NOMEM) return st;
  uint64_t bytes = 0, newest = 0;
  uint32_t up = 0;
  nb_status_t fatal = NB_OK;
  for (size_t i = 0; i < n_peers; i++) {
    bytes += res[i].send.bytes;
    /* an unavailable or slow peer costs a round; a frame that fails its checks or a refused
     * transfer is never tolerated silently */
    if (fatal == NB_OK && (res[i].status == NB_ERR_INTEGRITY || res[i].status == NB_ERR_PERMISSION))
      fatal = nb_error(res[i].status, "exchange %llu: peer %s: %s", (unsigned long long)xround,
                       res[i].peer, res[i].detail);
    if (res[i].newest > xround && res[i].newest > newest) newest = res[i].newest;
    if (res[i].status == NB_OK) {
      peers[i].data = res[i].frame;
      peers[i].len = res[i].len;
      res[i].frame = NULL;
    } else {
      peers[i].data = NULL;
      peers[i].len = 0;
      NB_WARN("exchange %llu (round %llu): peer %s left out: %s (%s)", (unsigned long long)xround,
              (unsigned long long)(xround >= 2 ? (xround - 2) / 2 : 0), res[i].peer, res[i].detail,
              nb_status_name(res[i].status));
    }
    if (nb_exchange_peer_alive(x->ex, i)) up++;
  }
  if (fatal != NB_OK) {
    for (size_t i = 0; i < n_peers; i++) {
      nb_free(peers[i].data);
      peers[i].data = NULL;
    }
  }
  nb_exchange_results_release(res, n_peers);
  if (sent) *sent = bytes;
  if (ahead) *ahead = newest;
  if (alive) *alive = up;
  return fatal;
}

/* Publishes our global state for peers that rejoin (Exchange.Pull). */
static nb_status_t nb__wk_publish(nb_exchange_t* ex, nb_hybrid_t* h) {
  if (!ex) return NB_OK;
  uint8_t* b = NULL;
  size_t len = 0;
  NB_CHECK(nb_hybrid_export(h, &b, &len));
  nb_status_t st = nb_exchange_publish_state(ex, nb_hybrid_rounds(h) & 0xffffffffu, b, len);
  nb_free(b);
  return st;
}

/* Pulls the global state from the first peer that serves one (alive, and published), trying
 * every peer until timeout_s, and adopts it; skip: rounds added to the pulled round (a restarted
 * process must not reuse the exchange ids of its previous life). */
static nb_status_t nb__wk_pull_state(nb_exchange_t* ex, nb_hybrid_t* h, double timeout_s,
                                     uint64_t skip, const char** from) {
  double until = nb_now_s() + timeout_s;
  size_t np = nb_exchange_peer_count(ex);
  nb_status_t st = nb_error(NB_ERR_UNAVAILABLE, "no peer to pull the global state from");
  while (nb_now_s() < until) {
    for (size_t i = 0; i < np; i++) {
      if (!nb_exchange_peer_alive(ex, i)) continue;
      uint8_t* b = NULL;
      size_t len = 0;
      st = nb_exchange_pull(ex, i, 10000, &b, &len, NULL);
      if (st == NB_OK) {
        st = nb_hybrid_import(h, b, len, skip);
        nb_free(b);
        if (st == NB_OK) {
          *from = nb_link_peer(nb_exchange_link(ex, i));
          return NB_OK;
        }
      }
      NB_WARN("pulling the global state from %s: %s", nb_link_peer(nb_exchange_link(ex, i)),
              nb_error_last());
      if (st == NB_ERR_INTEGRITY) return st;
    }
    nb_sleep_ns(250000000LL);
  }
  return st;
}

/* The hybrid's exchange callback over inter/exchange. Peer order does not matter to the hybrid
 * (messages name their sender). */
static nb_status_t nb__wk_exchange(void* ctx, uint64_t round, const void* msg, size_t len,
                                   nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent) {
  nb__wk_exchange_t* x = ctx;
  if (n_peers != x->n_peers)
    return nb_error(NB_ERR_INTERNAL, "worker: %zu peers expected, exchange has %zu", n_peers,
                    x->n_peers);
  nb_exchange_result_t res[NB_WORKER_MAX_PEERS];
  memset(res, 0, sizeof res);
  nb_status_t st = nb_exchange_round(x->ex, round, msg, len, 0, res);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n_peers; i++) {
    bytes += res[i].send.bytes;
    if (st == NB_OK) {
      peers[i].data = res[i].frame;
      peers[i].len = res[i].len;
      res[i].frame = NULL;
    } else if (res[i].status != NB_OK) {
      NB_WARN("round %llu: peer %s: %s", (unsigned long long)round, res[i].peer, res[i].detail);
    }
  }
  nb_exchange_results_release(res, n_peers);
  if (sent) *sent = bytes;
  return st;
}

/* Codec bits per kept value and per index, for the scheduler's prediction: int8 carries one
 * fp32 scale per block; delta+varint indices take about log2(1/density)/7 bytes each. */
static void nb__wk_bits(nb_values_t v, double density, uint32_t chunk, double* per_value,
                        double* per_index) {
  double scale = 32.0 / 256; /* one fp32 scale per block of 256 (the codec's default) */
  *per_value = v == NB_VALUES_FP32   ? 32
               : v == NB_VALUES_INT8 ? 8 + scale
               : v == NB_VALUES_INT4 ? 4 + scale
               : v == NB_VALUES_INT2 ? 2 + scale
                                     : 16;
  double gap = density > 0 ? 1.0 / density : 1;
  double bytes = ceil(log2(gap + 1) / 7);
  *per_index = 8 * (bytes < 1 ? 1 : bytes);
  if (chunk > 0 && log2((double)chunk) < *per_index) *per_index = log2((double)chunk);
}

/* The slowest peer link's estimate (goodput 0 while any link has none yet). */
static void nb__wk_estimate(nb_exchange_t* ex, nb_estimate_t* out) {
  memset(out, 0, sizeof *out);
  size_t np = ex ? nb_exchange_peer_count(ex) : 0;
  for (size_t i = 0; i < np; i++) {
    nb_estimate_t e;
    nb_estimator_get(nb_link_estimator(nb_exchange_link(ex, i)), &e);
    if (i == 0 || e.goodput_Bps < out->goodput_Bps) out->goodput_Bps = e.goodput_Bps;
    if (e.rtt_s > out->rtt_s) out->rtt_s = e.rtt_s;
    if (e.rtt_min_s > out->rtt_min_s) out->rtt_min_s = e.rtt_min_s;
  }
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

/* Ranks of a cluster under mpirun: the gradient of every step is averaged over the ranks. */
static nb_status_t nb__wk_allreduce_hook(void* ctx, float* grads, size_t n) {
  return nb_comm_allreduce((nb_comm_t*)ctx, grads, grads, n, NB_COMM_FP32, NB_COMM_AVG);
}

/* A rank other than the leader: before each run of inner steps the leader broadcasts {steps,
 * go} and then the theta_local they start from (after an applied, landed, skipped or pulled
 * update alike); the rank takes it and runs the steps, allreducing every gradient. */
static nb_worker_outcome_t nb__wk_follower(nb_trainer_t* t, nb_comm_t* comm) {
  size_t n;
  float* p = nb_trainer_sync_params(t, &n);
  for (;;) {
    float ctl[2] = {0, 0};
    if (nb_comm_broadcast(comm, ctl, ctl, 2, NB_COMM_FP32, 0) != NB_OK) return NB_WORKER_FAILED;
    if (ctl[1] == 0) return NB_WORKER_DONE;
    if (nb_comm_broadcast(comm, p, p, n, NB_COMM_FP32, 0) != NB_OK ||
        nb_trainer_steps(t, (long)ctl[0], NULL) != NB_OK)
      return NB_WORKER_FAILED;
  }
}

/* Leader side of the above. */
static nb_status_t nb__wk_lead(nb_comm_t* comm, long steps, int go) {
  float ctl[2] = {(float)steps, go ? 1.0f : 0.0f};
  return comm ? nb_comm_broadcast(comm, ctl, ctl, 2, NB_COMM_FP32, 0) : NB_OK;
}

/* The hybrid round's hook under mpirun: before each run of inner steps the other ranks take
 * theta_local from the leader and run the steps with it. */
typedef struct {
  nb_comm_t* comm;
  nb_trainer_t* t;
} nb__wk_ranks_t;

static nb_status_t nb__wk_steps_hook(void* ctx, long k) {
  nb__wk_ranks_t* r = ctx;
  size_t n;
  float* p = nb_trainer_sync_params(r->t, &n);
  NB_CHECK(nb__wk_lead(r->comm, k, 1));
  return nb_comm_broadcast(r->comm, p, p, n, NB_COMM_FP32, 0);
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

nb_worker_outcome_t nb_worker_run(const nb_worker_opts_t* o) {
  const char *job_file = o->job_file, *cluster = o->cluster, *out = o->out;
  const char *listen = o->listen ? o->listen : "127.0.0.1:0", *pki = o->pki;
  const char *secret_file = o->secret_file, *data_dir = o->data_dir;
  const char* const* peer_arg = o->peers;
  int n_peer_arg = o->n_peers, insecure = o->insecure, resume = o->resume;
  int no_rate_cap = o->no_rate_cap, rejoin = o->rejoin;
  long steps = o->steps;
  /* under mpirun: one process per rank of this cluster; rank 0 leads */
  nb_comm_t* comm = NULL;
  int mpi_rank = 0, mpi_size = 1;
  const char* ws = getenv("OMPI_COMM_WORLD_SIZE");
  if (!ws) ws = getenv("PMI_SIZE");
  if (ws && atoi(ws) > 1) {
    nb_comm_config_t ccfg;
    nb_comm_config_init(&ccfg);
    ccfg.device = NB_COMM_DEVICE_CPU;
    if (nb_intra_init(NULL, NULL) != NB_OK || nb_comm_create(&ccfg, &comm) != NB_OK)
      return nb__wk_fail(cluster, "MPI");
    mpi_rank = nb_comm_rank(comm);
    mpi_size = nb_comm_size(comm);
  }
  nb_log_set_identity(cluster, mpi_rank);

  nb_worker_outcome_t rc = NB_WORKER_FAILED;
  nb_job_config_t* job = NULL;
  nb_descriptor_diag_t* diag = NULL;
  nb_train_config_t* tc = NULL;
  nb_trainer_t* t = NULL;
  nb_hybrid_t* h = NULL;
  nb_tls_t* tls = NULL;
  nb_exchange_t* ex = NULL;
  FILE* tsv = NULL;
  json_t* sum = NULL;
  json_t* decisions = NULL;
  json_t* evals = NULL;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  int have_secret = 0;
  if (nb_calloc((void**)&job, 1, sizeof *job, "job") != NB_OK ||
      nb_calloc((void**)&diag, 1, sizeof *diag, "diag") != NB_OK ||
      nb_calloc((void**)&tc, 1, sizeof *tc, "train config") != NB_OK) {
    rc = nb__wk_fail(cluster, "setup");
    goto done;
  }
  if (nb_descriptor_load(job_file, job, diag) != NB_OK) {
    char line[640];
    for (int i = 0; i < diag->count; i++)
      fprintf(stderr, "%s: %s\n", job_file,
              nb_descriptor_error_format(&diag->errors[i], line, sizeof line));
    fprintf(stderr, "nebula worker: %s: invalid descriptor\n", job_file);
    goto done;
  }
  if (nb_job_paths_confine_env(job) != NB_OK) { /* run by a gateway: paths stay in the job */
    rc = nb__wk_fail(cluster, job_file);
    goto done;
  }
  int ci = -1;
  uint32_t index = 0;
  for (int i = 0; i < job->n_clusters; i++) {
    if (strcmp(job->clusters[i].id, cluster) == 0) ci = i;
  }
  if (ci < 0) {
    fprintf(stderr, "nebula worker: job %s has no cluster '%s'\n", job->name, cluster);
    rc = NB_WORKER_MISFIT;
    goto done;
  }
  for (int i = 0; i < job->n_clusters; i++)
    if (strcmp(job->clusters[i].id, cluster) < 0) index++;
  /* every other cluster needs exactly one --peer */
  if (n_peer_arg != job->n_clusters - 1) {
    fprintf(stderr,
            "nebula worker: job %s has %d clusters: give one --peer ID=ADDR for each "
            "other cluster (got %d)\n",
            job->name, job->n_clusters, n_peer_arg);
    rc = NB_WORKER_MISFIT;
    goto done;
  }
  char peer_id[NB_WORKER_MAX_PEERS][NB_JOB_NAME_MAX];
  const char* peer_addr[NB_WORKER_MAX_PEERS];
  for (int i = 0; i < n_peer_arg; i++) {
    const char* eq = strchr(peer_arg[i], '=');
    size_t idlen = eq ? (size_t)(eq - peer_arg[i]) : 0;
    if (!eq || idlen == 0 || idlen >= NB_JOB_NAME_MAX || !eq[1]) {
      fprintf(stderr, "nebula worker: --peer needs ID=HOST:PORT, got '%s'\n", peer_arg[i]);
      rc = NB_WORKER_MISFIT;
      goto done;
    }
    memcpy(peer_id[i], peer_arg[i], idlen);
    peer_id[i][idlen] = 0;
    peer_addr[i] = eq + 1;
    int known = 0;
    for (int c = 0; c < job->n_clusters; c++)
      if (strcmp(job->clusters[c].id, peer_id[i]) == 0 && c != ci) known = 1;
    for (int j = 0; j < i; j++)
      if (strcmp(peer_id[j], peer_id[i]) == 0) known = 0;
    if (!known) {
      fprintf(stderr, "nebula worker: --peer %s: not another cluster of job %s (or repeated)\n",
              peer_id[i], job->name);
      rc = NB_WORKER_MISFIT;
      goto done;
    }
  }

  if (steps > 0) {
    job->training.max_steps = steps;
    if (job->training.optimizer.warmup_steps >= steps)
      job->training.optimizer.warmup_steps = (int)(steps / 10);
  }
  if (nb_train_config_from_job(job, ci, data_dir, tc) != NB_OK) {
    rc = nb__wk_fail(cluster, job_file);
    goto done;
  }
  tc->data_rank = (int)index; /* clusters that share a language read it in different orders */
  if (mpi_size > 1) {
    if (job->sync.mode != NB_JOB_SYNC_OUTER || job->sync.round_seconds > 0) {
      fprintf(stderr,
              "nebula worker: several ranks per cluster need sync.mode \"outer\" with "
              "step-counted rounds\n");
      rc = NB_WORKER_MISFIT;
      goto done;
    }
    /* real ranks replace the accumulated micro-batches that stand for workers otherwise */
    tc->micro_batches =
        job->clusters[ci].workers > mpi_size ? job->clusters[ci].workers / mpi_size : 1;
    tc->data_rank = (int)index * 1000 + mpi_rank;
    tc->grad_hook = nb__wk_allreduce_hook;
    tc->grad_hook_ctx = comm;
  }

  char odir[NB_JOB_PATH_MAX], path[NB_TRAIN_PATH_MAX + 64];
  if (out ? snprintf(odir, sizeof odir, "%s", out) >= (int)sizeof odir
          : snprintf(odir, sizeof odir, "runs/%s/%s", job->name, cluster) >= (int)sizeof odir) {
    fprintf(stderr, "nebula worker: --out path too long\n");
    rc = NB_WORKER_MISFIT;
    goto done;
  }
  if (nb__wk_mkdirs(odir) != 0) {
    fprintf(stderr, "nebula worker: cannot create %s: %s\n", odir, strerror(errno));
    goto done;
  }

  /* checkpoints: the trainer's step-<N>/ folders plus hybrid-step-<N>.bin beside them */
  /* with overlap the update in flight lands first (nb_hybrid_drain): nothing is in flight in a
   * checkpoint, and --resume starts with nothing in flight */
  int ckpt_every = job->checkpoint.every_rounds;
  tc->checkpoint_dir[0] = 0;
  if (ckpt_every > 0 || resume) {
    int w = job->checkpoint.dir[0]
                ? snprintf(tc->checkpoint_dir, sizeof tc->checkpoint_dir, "%s/%s",
                           job->checkpoint.dir, cluster)
                : snprintf(tc->checkpoint_dir, sizeof tc->checkpoint_dir, "%s/checkpoints", odir);
    if (w >= (int)sizeof tc->checkpoint_dir || nb__wk_mkdirs(tc->checkpoint_dir) != 0) {
      fprintf(stderr, "nebula worker: cannot create the checkpoint folder %s\n",
              tc->checkpoint_dir);
      goto done;
    }
  }
  tc->checkpoint_keep = job->checkpoint.keep;
  tc->resume = resume;

  /* security material */
  if (pki) {
    char ca[NB_JOB_PATH_MAX], crt[NB_JOB_PATH_MAX], key[NB_JOB_PATH_MAX];
    if (nb_pki_path(pki, NB_PKI_NONE, NULL, "crt", ca, sizeof ca) != NB_OK ||
        nb_pki_path(pki, NB_PKI_CLUSTER, cluster, "crt", crt, sizeof crt) != NB_OK ||
        nb_pki_path(pki, NB_PKI_CLUSTER, cluster, "key", key, sizeof key) != NB_OK) {
      rc = nb__wk_fail(cluster, "--pki");
      goto done;
    }
    nb_tls_files_t files = {ca, crt, key};
    if (nb_tls_create(&files, &tls) != NB_OK) {
      rc = nb__wk_fail(cluster, "loading the cluster certificate");
      goto done;
    }
  }
  if (secret_file) {
    FILE* f = fopen(secret_file, "rb");
    size_t got = f ? fread(secret, 1, sizeof secret, f) : 0;
    int extra = f ? fgetc(f) : EOF;
    if (f) fclose(f);
    if (got != sizeof secret || extra != EOF) {
      fprintf(stderr, "nebula worker: %s: --secret-file must hold exactly %d bytes\n", cluster,
              NB_SEAL_SECRET_BYTES);
      goto done;
    }
    have_secret = 1;
  } else if (job->security.seal && !insecure) {
    fprintf(stderr, "nebula worker: the job seals update frames: give --secret-file\n");
    rc = NB_WORKER_MISFIT;
    goto done;
  }

  if (job->sync.mode != NB_JOB_SYNC_OUTER) {
    tc->grad_hook = nb__wk_grad_hook;
    tc->grad_hook_ctx = &h;
  }
  double t_start = nb_now_s();
  nb_status_t cst = nb_trainer_create(tc, &t);
  if (cst != NB_OK) {
    rc = nb__wk_fail(cluster, "creating the trainer");
    if (cst == NB_ERR_IO)
      fprintf(stderr, "nebula worker: prepare the data with 'make data', or pass --data-dir\n");
    goto done;
  }

  if (mpi_rank > 0) {
    rc = nb__wk_follower(t, comm);
    goto done;
  }

  nb_exchange_config_t xc;
  memset(&xc, 0, sizeof xc);
  xc.job_id = job->name;
  xc.self = cluster;
  xc.listen = listen;
  xc.tls = tls;
  xc.allow_insecure = tls == NULL;
  xc.job_secret = have_secret ? secret : NULL;
  xc.allow_unsealed = !have_secret;
  xc.streams = job->link.streams > 0 ? (uint32_t)job->link.streams : 0;
  xc.chunk_bytes = job->link.chunk_kib > 0 ? (size_t)job->link.chunk_kib * 1024 : 0;
  xc.rate_cap_Bps = job->link.rate_mbit > 0 && !no_rate_cap ? job->link.rate_mbit * 1e6 / 8 : 0;
  if (job->sync.peer_timeout_seconds > 0) xc.dead_ms = (int)(job->sync.peer_timeout_seconds * 1000);
  if (job->n_clusters > 1) {
    if (nb_exchange_create(&xc, &ex) != NB_OK) {
      rc = nb__wk_fail(cluster, "starting the exchange");
      goto done;
    }
    for (int i = 0; i < n_peer_arg; i++) {
      if (nb_exchange_add_peer(ex, peer_id[i], peer_addr[i]) != NB_OK) {
        rc = nb__wk_fail(cluster, peer_id[i]);
        goto done;
      }
    }
  }
  nb__wk_exchange_t xctx = {ex, (size_t)n_peer_arg, job->sync.peer_timeout_seconds,
                            nb_param_RoundDeadlineS()};

  nb_hybrid_config_t hc;
  nb_hybrid_config_defaults(&hc);
  hc.cluster_index = index;
  hc.n_clusters = (uint32_t)job->n_clusters;
  hc.inner_steps = job->sync.inner_steps > 0 ? job->sync.inner_steps : 50;
  hc.round_seconds = job->sync.round_seconds;
  hc.outer_lr = (float)job->sync.outer_lr;
  hc.outer_momentum = (float)job->sync.outer_momentum;
  hc.density = job->compression.density_initial;
  hc.error_feedback = job->compression.error_feedback;
  hc.ef_decay = (float)job->compression.error_feedback_decay;
  hc.topk_chunk = (uint32_t)job->compression.topk_chunk;
  hc.values = nb__wk_values(job->compression.values);
  hc.zstd_level = job->compression.zstd_level;
  hc.mode = job->sync.mode == NB_JOB_SYNC_STEP    ? NB_HYBRID_STEP
            : job->sync.mode == NB_JOB_SYNC_DENSE ? NB_HYBRID_DENSE
                                                  : NB_HYBRID_OUTER;
  hc.overlap = job->sync.overlap && hc.mode == NB_HYBRID_OUTER;
  hc.overlap_steps = job->sync.overlap_steps;
  nb__wk_ranks_t ranks = {comm, t};
  if (comm) {
    hc.steps_hook = nb__wk_steps_hook;
    hc.hook_ctx = &ranks;
  }
  if (job->sync.overlap && hc.mode != NB_HYBRID_OUTER)
    fprintf(stderr, "nebula worker: %s: sync.overlap applies to the outer mode only; ignored\n",
            cluster);
  hc.exchange = nb__wk_exchange;
  hc.exchange_ctx = &xctx;
  /* fault-tolerant rounds: outer mode (with or without overlap), several clusters */
  int ft = ex != NULL && hc.mode == NB_HYBRID_OUTER && nb_param_FaultTolerant();
  if (ft) hc.ft_exchange = nb__wk_ft_exchange;
  hc.final_wait_s = nb_param_FinalWaitS();
  if (rejoin && !ft) {
    fprintf(stderr,
            "nebula worker: --rejoin needs fault-tolerant rounds (outer mode, several "
            "clusters, NB_FAULT_TOLERANT=1)\n");
    rc = NB_WORKER_MISFIT;
    goto done;
  }
  hc.samples_scale = (uint32_t)mpi_size;
  if (nb_hybrid_create(&hc, t, &h) != NB_OK) {
    rc = nb__wk_fail(cluster, "creating the round state");
    goto done;
  }
  size_t n_params;
  nb_hybrid_global(h, &n_params);
  if (resume && nb_trainer_step(t) > 0) {
    snprintf(path, sizeof path, "%s/hybrid-step-%ld.bin", tc->checkpoint_dir, nb_trainer_step(t));
    if (nb_hybrid_load(h, path) != NB_OK) {
      rc = nb__wk_fail(cluster, "resuming the round state");
      goto done;
    }
    printf("nebula worker: %s resumes at round %llu (step %ld), theta %016llx\n", cluster,
           (unsigned long long)nb_hybrid_rounds(h), nb_trainer_step(t),
           (unsigned long long)nb_hybrid_global_hash(h));
  }
  long rejoined_at = -1;
  if (rejoin) {
    const char* from = "?";
    if (nb__wk_pull_state(ex, h, nb_param_RejoinTimeoutS(), 2, &from) != NB_OK) {
      rc = nb__wk_fail(cluster, "rejoining (pulling the global state)");
      goto done;
    }
    rejoined_at = (long)nb_hybrid_rounds(h);
    printf("nebula worker: %s rejoined from %s at round %ld (%llu rounds applied), theta %016llx\n",
           cluster, from, rejoined_at, (unsigned long long)nb_hybrid_commits(h),
           (unsigned long long)nb_hybrid_global_hash(h));
    fflush(stdout);
  }
  if (ft && nb__wk_publish(ex, h) != NB_OK) {
    rc = nb__wk_fail(cluster, "publishing the global state");
    goto done;
  }
  long round0 = (long)nb_hybrid_rounds(h);
  int adaptive = job->compression.adaptive && ex != NULL && hc.mode == NB_HYBRID_OUTER;
  nb_sched_config_t scfg;
  nb_sched_config_default(&scfg);
  scfg.density_floor = job->compression.density_min;
  scfg.density_ceiling = job->compression.density_max;
  scfg.initial_density = job->compression.density_initial;
  scfg.overlap = job->sync.overlap;
  if (job->compression.budget_fraction > 0 && job->compression.budget_fraction <= 1)
    scfg.fraction = job->compression.budget_fraction;
  if (adaptive && nb_sched_config_check(&scfg) != NB_OK) {
    rc = nb__wk_fail(cluster, "compression settings for the scheduler");
    goto done;
  }
  /* frames may be too small to measure the link: probe it while it is idle (inter/link.h) */
  for (int i = 0; adaptive && i < n_peer_arg; i++)
    if (nb_link_probe_start(nb_exchange_link(ex, (size_t)i), 0, 0) != NB_OK) {
      rc = nb__wk_fail(cluster, "starting the link probe");
      goto done;
    }
  nb_sched_decision_t dec, prev_dec;
  int have_dec = 0;
  decisions = json_array();
  evals = json_array();
  long rounds = (long)((job->training.max_steps + hc.inner_steps - 1) / hc.inner_steps);
  printf(
      "nebula worker: job %s, cluster %s (%u of %d), %zu synced parameters, %ld rounds of %ld "
      "steps, density %g %s%s, exchange on port %d\n",
      job->name, cluster, index, job->n_clusters, n_params, rounds, hc.inner_steps, hc.density,
      nb_values_name(hc.values), hc.overlap ? ", overlap" : "", ex ? nb_exchange_port(ex) : 0);
  fflush(stdout);

  snprintf(path, sizeof path, "%s/rounds.tsv", odir);
  tsv = fopen(path, resume || rejoin ? "a" : "w");
  if (!tsv) {
    fprintf(stderr, "nebula worker: cannot write %s: %s\n", path, strerror(errno));
    goto done;
  }
  fseek(tsv, 0, SEEK_END);
  if (ftell(tsv) == 0)
    fprintf(tsv,
            "round\tsteps\tsamples\tsamples_all\tloss\tmsg_bytes\tbytes_sent\tdensity\t"
            "compute_s\tcodec_s\texchange_s\tglobal_xxh3\tapplied\tcommits\tpeers_ok\t"
            "peers_alive\tevent\n");
  double compute_s = 0, exchange_s = 0, codec_s = 0, last_loss = 0, density_sum = 0;
  uint64_t wan_bytes = 0, msg_bytes = 0;
  long steps_done = nb_trainer_step(t), step0 = steps_done, cur_h = hc.inner_steps;
  long skipped = 0, late = 0, jumps = 0, pulls = 0, prev_r = round0 - 1;
  for (long r = round0; r < rounds; r = (long)nb_hybrid_rounds(h)) {
    nb_hybrid_round_t rec;
    long left = (long)job->training.max_steps - steps_done;
    if (hc.mode != NB_HYBRID_OUTER && left < hc.inner_steps && left > 0)
      nb_hybrid_set_inner_steps(h, cur_h = left); /* in step modes a round only groups the log */
    if (nb_hybrid_round(h, &rec) != NB_OK) {      /* the ranks follow through hc's hooks */
      rc = nb__wk_fail(cluster, "round");
      goto done;
    }
    int ckpt_now =
        ckpt_every > 0 && ((r + 1) % ckpt_every == 0 || (long)nb_hybrid_rounds(h) >= rounds);
    int drained_skip = 0;
    if (ckpt_now && hc.overlap) {
      /* a checkpoint round: this round's update lands now (nothing in flight in the state) */
      nb_hybrid_round_t d;
      if (nb_hybrid_drain(h, &d) != NB_OK) {
        rc = nb__wk_fail(cluster, "landing the update before the checkpoint");
        goto done;
      }
      rec.exchange_s += d.exchange_s;
      rec.bytes_sent += d.bytes_sent;
      rec.global_hash = d.global_hash;
      if (ft) {
        rec.commits = d.commits;
        if (!d.applied) {
          drained_skip = 1;
          printf(
              "round %ld: not applied (decided before the checkpoint: updates from %u of %d "
              "peers, %u alive) at unix %.3f\n",
              r + 1, d.peers_ok, n_peer_arg, d.peers_alive, (double)nb_wall_ns() / 1e9);
        }
        if (d.caught_up) rec.caught_up = 1;
        if (d.need_state) rec.need_state = 1;
        if (d.next_round > rec.next_round) rec.next_round = d.next_round;
      }
    }
    const char* event = "-";
    if (!ft) {
      rec.applied = 1;
      rec.commits = nb_hybrid_commits(h);
      rec.peers_ok = rec.peers_alive = (uint32_t)n_peer_arg;
    } else {
      /* with overlap rec tells the previous round's update, decided in this one */
      if (rec.landed && !rec.applied) skipped++, event = "skipped";
      if (drained_skip) skipped++, event = "skipped";
      if (rec.caught_up) late++, event = "late";
      if (rec.next_round > rec.round + 1) jumps++, event = "jump";
      if (rec.need_state) {
        /* a peer applied rounds we cannot replay: adopt its state */
        const char* from = "?";
        if (nb__wk_pull_state(ex, h, nb_param_RoundDeadlineS(), 0, &from) != NB_OK) {
          rc = nb__wk_fail(cluster, "catching up (pulling the global state)");
          goto done;
        }
        pulls++;
        event = "pulled";
        rec.commits = nb_hybrid_commits(h);
        rec.global_hash = nb_hybrid_global_hash(h);
        printf("round %llu: behind the other clusters: pulled the global state from %s\n",
               (unsigned long long)rec.round, from);
      }
      if (r == round0 && rejoined_at >= 0) event = "rejoined";
      if (nb__wk_publish(ex, h) != NB_OK) {
        rc = nb__wk_fail(cluster, "publishing the global state");
        goto done;
      }
    }
    compute_s += rec.compute_s;
    exchange_s += rec.exchange_s;
    codec_s += rec.codec_s;
    wan_bytes += rec.bytes_sent;
    msg_bytes += rec.msg_bytes;
    steps_done += rec.steps;
    last_loss = rec.loss;
    density_sum += rec.density;
    fprintf(tsv,
            "%llu\t%ld\t%llu\t%llu\t%.6f\t%llu\t%llu\t%g\t%.4f\t%.4f\t%.4f\t%016llx\t%d\t%llu\t%"
            "u\t%u\t%s\n",
            (unsigned long long)rec.round, rec.steps, (unsigned long long)rec.samples,
            (unsigned long long)rec.samples_all, rec.loss, (unsigned long long)rec.msg_bytes,
            (unsigned long long)rec.bytes_sent, rec.density, rec.compute_s, rec.codec_s,
            rec.exchange_s, (unsigned long long)rec.global_hash, rec.applied,
            (unsigned long long)rec.commits, rec.peers_ok, rec.peers_alive, event);
    fflush(tsv);
    printf(
        "round %ld/%ld: %ld steps, loss %.4f, sent %.1f KiB (density %g), compute %.2f s, "
        "exchange %.2f s, theta %016llx%s%s\n",
        r + 1, rounds, rec.steps, rec.loss, rec.msg_bytes / 1024.0, rec.density, rec.compute_s,
        rec.exchange_s, (unsigned long long)rec.global_hash, strcmp(event, "-") ? ", " : "",
        strcmp(event, "-") ? event : "");
    if (ft && rec.landed && !rec.applied)
      printf("round %ld%s: not applied (updates from %u of %d peers, %u alive) at unix %.3f\n",
             hc.overlap ? prev_r + 1 : r + 1, hc.overlap ? " (decided in the next round)" : "",
             rec.peers_ok, n_peer_arg, rec.peers_alive, (double)nb_wall_ns() / 1e9);
    prev_r = r;
    fflush(stdout);
    nb__wk_progress(cluster, r + 1, rounds, steps_done, (long)job->training.max_steps, &rec);
    int every = job->training.eval_every_rounds;
    if (every > 0 && (r + 1) % every == 0 && r + 1 < rounds) {
      /* the held-out curve on theta_global (with overlap: the parameters as they are) */
      nb_train_eval_t mid;
      if (nb_trainer_eval(t, &mid) != NB_OK) {
        rc = nb__wk_fail(cluster, "evaluation");
        goto done;
      }
      printf("eval after round %ld: mean %.4f bpb\n", r + 1, mid.mean_bpb);
      json_t* e = json_object();
      json_object_set_new(e, "round", json_integer(r + 1));
      json_object_set_new(e, "step", json_integer(nb_trainer_step(t)));
      json_object_set_new(e, "mean_bpb", json_real(mid.mean_bpb));
      json_array_append_new(evals, e);
    }
    if (ckpt_now) {
      /* the round state first, then the trainer's checkpoint moves LATEST to it */
      snprintf(path, sizeof path, "%s/hybrid-step-%ld.bin", tc->checkpoint_dir, nb_trainer_step(t));
      if (nb_hybrid_save(h, path) != NB_OK || nb_trainer_checkpoint(t) != NB_OK) {
        rc = nb__wk_fail(cluster, "checkpoint");
        goto done;
      }
      nb__wk_prune_states(tc->checkpoint_dir);
    }
    if (adaptive && r + 1 < rounds) {
      /* the next round's density (and length) from the measured link and compute */
      nb_estimate_t est;
      nb__wk_estimate(ex, &est);
      nb_sched_input_t in;
      memset(&in, 0, sizeof in);
      in.round = (uint64_t)r + 1;
      nb_sched_input_from_estimate(&in, &est);
      in.step_compute_s = rec.steps > 0 ? rec.compute_s / (double)rec.steps : 0;
      in.steps = (uint32_t)hc.inner_steps;
      in.n_params = n_params;
      nb__wk_bits(hc.values, rec.density, hc.topk_chunk, &in.bits_per_value, &in.bits_per_index);
      in.fanout = 1; /* one capped link per peer */
      in.round_s = hc.round_seconds;
      /* with overlap the update lands tau steps into the next round: only those hide it */
      if (hc.overlap && hc.overlap_steps > 0)
        in.hide_steps = (uint32_t)(hc.overlap_steps < UINT32_MAX ? hc.overlap_steps : UINT32_MAX);
      if (nb_sched_decide(&scfg, &in, have_dec ? &prev_dec : NULL, &dec) != NB_OK ||
          nb_hybrid_set_density(h, dec.density) != NB_OK ||
          nb_hybrid_set_inner_steps(h, (long)dec.steps) != NB_OK ||
          (in.hide_steps > 0 &&
           nb_hybrid_set_overlap_steps(
               h, dec.hide_steps > 0 ? (long)dec.hide_steps : (long)dec.steps) != NB_OK)) {
        rc = nb__wk_fail(cluster, "scheduler");
        goto done;
      }
      prev_dec = dec;
      have_dec = 1;
      cur_h = (long)dec.steps;
      char line[512];
      nb_sched_decision_format(&dec, line, sizeof line);
      printf("%s\n", line);
      json_t* d = json_object();
      json_object_set_new(d, "round", json_integer(r + 1));
      json_object_set_new(d, "reason", json_string(nb_sched_reason_name(dec.reason)));
      json_object_set_new(d, "density", json_real(dec.density));
      json_object_set_new(d, "steps", json_integer(dec.steps));
      json_object_set_new(d, "goodput_Bps", json_real(in.goodput_Bps));
      json_object_set_new(d, "rtt_s", json_real(in.rtt_s));
      json_object_set_new(d, "step_compute_s", json_real(in.step_compute_s));
      json_object_set_new(d, "predicted_transfer_s", json_real(dec.transfer_s));
      json_object_set_new(d, "budget_s", json_real(dec.budget_s));
      json_object_set_new(d, "overlap_steps", json_integer(dec.hide_steps));
      json_array_append_new(decisions, d);
    }
  }
  if (nb__wk_lead(comm, 0, 0) != NB_OK) {
    rc = nb__wk_fail(cluster, "stopping the ranks");
    goto done;
  }
  if (ft && hc.overlap) {
    /* the last round's update is decided here (not inside the final check), so that it is
     * counted, and a cluster found behind pulls the state before the check */
    nb_hybrid_round_t d;
    if (nb_hybrid_drain(h, &d) != NB_OK) {
      rc = nb__wk_fail(cluster, "landing the last update");
      goto done;
    }
    exchange_s += d.exchange_s;
    wan_bytes += d.bytes_sent;
    if (d.landed && !d.applied) {
      skipped++;
      printf(
          "round %ld: not applied (decided at the end: updates from %u of %d peers, %u alive) "
          "at unix %.3f\n",
          prev_r + 1, d.peers_ok, n_peer_arg, d.peers_alive, (double)nb_wall_ns() / 1e9);
    }
    if (d.caught_up) late++;
    if (d.need_state) {
      const char* from = "?";
      if (nb__wk_pull_state(ex, h, nb_param_RoundDeadlineS(), 0, &from) != NB_OK) {
        rc = nb__wk_fail(cluster, "catching up (pulling the global state)");
        goto done;
      }
      pulls++;
      printf("end: behind the other clusters: pulled the global state from %s\n", from);
    }
    fflush(stdout);
  }
  /* the final check asks a silent peer again on fresh ids: each attempt waits a quarter of the
   * final wait at most, so that the whole check stays within about the final wait */
  if (hc.final_wait_s > 0 && xctx.deadline_s > hc.final_wait_s / 4)
    xctx.deadline_s = hc.final_wait_s / 4 > 1 ? hc.final_wait_s / 4 : 1;
  if (nb_hybrid_finish(h) != NB_OK) {
    rc = nb__wk_fail(cluster, "final check");
    goto done;
  }
  nb_train_eval_t ev;
  double te = nb_now_s();
  if (nb_trainer_eval(t, &ev) != NB_OK) {
    rc = nb__wk_fail(cluster, "evaluation");
    goto done;
  }
  /* Translation jobs: chrF/BLEU of the base and the final model on the test split. */
  json_t* tr_scores = NULL;
  if (job->task == NB_JOB_TASK_TRANSLATION && job->training.eval_sentences > 0 &&
      nb_translation_eval(tc, nb_trainer_model(t), (size_t)job->training.eval_sentences,
                          &tr_scores) != NB_OK)
    NB_WARN("no translation scores in the summary: %s", nb_error_last());
  double eval_s = nb_now_s() - te;
  /* the final model (LoRA merged), as `nebula train` writes it: what a gateway publishes */
  snprintf(path, sizeof path, "%s/final.safetensors", odir);
  if ((nb_trainer_lora(t) && nb_lora_merge(nb_trainer_lora(t)) != NB_OK) ||
      nb_checkpoint_save(path, nb_trainer_model(t), nb_trainer_step(t)) != NB_OK) {
    rc = nb__wk_fail(cluster, path);
    goto done;
  }
  double wall = nb_now_s() - t_start;

  sum = json_object();
  json_t* evj = json_object();
  for (int i = 0; i < ev.n; i++) json_object_set_new(evj, ev.label[i], json_real(ev.bpb[i]));
  char hex[24];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)nb_hybrid_global_hash(h));
  /* per sync: a round in outer mode, a step in step and dense modes */
  long syncs = hc.mode == NB_HYBRID_OUTER ? rounds - round0 : steps_done - step0;
  double bpp = syncs > 0 ? 8.0 * (double)msg_bytes / (double)syncs / (double)n_params : 0;
  json_object_set_new(sum, "job", json_string(job->name));
  json_object_set_new(sum, "cluster", json_string(cluster));
  json_object_set_new(sum, "cluster_index", json_integer(index));
  json_object_set_new(sum, "ranks", json_integer(mpi_size));
  json_object_set_new(sum, "pid", json_integer(getpid()));
  json_object_set_new(sum, "mode", json_string(nb_job_sync_name(job->sync.mode)));
  json_object_set_new(sum, "overlap", json_boolean(hc.overlap));
  json_object_set_new(sum, "params_synced", json_integer((json_int_t)n_params));
  json_object_set_new(sum, "rounds", json_integer(rounds));
  json_object_set_new(sum, "resumed_at_round", json_integer(rejoin ? 0 : round0));
  json_object_set_new(sum, "fault_tolerant", json_boolean(ft));
  json_object_set_new(sum, "rounds_applied", json_integer((json_int_t)nb_hybrid_commits(h)));
  json_object_set_new(sum, "rounds_skipped", json_integer(skipped));
  json_object_set_new(sum, "final_check_attempts", json_integer(nb_hybrid_final_attempts(h)));
  json_object_set_new(sum, "rounds_late", json_integer(late));
  json_object_set_new(sum, "round_jumps", json_integer(jumps));
  json_object_set_new(sum, "state_pulls", json_integer(pulls));
  json_object_set_new(sum, "rejoined_at_round", json_integer(rejoined_at));
  json_object_set_new(sum, "syncs", json_integer(syncs));
  json_object_set_new(sum, "inner_steps", json_integer(steps_done));
  json_object_set_new(sum, "samples", json_integer((json_int_t)nb_trainer_samples(t)));
  json_object_set_new(sum, "final_train_loss", json_real(last_loss));
  json_object_set_new(sum, "final_eval_bpb", evj);
  json_object_set_new(sum, "final_eval_mean_bpb", json_real(ev.mean_bpb));
  json_object_set_new(sum, "wall_s", json_real(wall));
  json_object_set_new(sum, "compute_s", json_real(compute_s));
  json_object_set_new(sum, "codec_s", json_real(codec_s));
  json_object_set_new(sum, "exchange_s", json_real(exchange_s));
  json_object_set_new(sum, "eval_s", json_real(eval_s));
  json_object_set_new(sum, "compute_utilization", json_real(wall > 0 ? compute_s / wall : 0));
  json_object_set_new(sum, "wan_bytes_sent", json_integer((json_int_t)wan_bytes));
  json_object_set_new(sum, "msg_bytes", json_integer((json_int_t)msg_bytes));
  json_object_set_new(sum, "density_mean", json_real(rounds > 0 ? density_sum / rounds : 0));
  json_object_set_new(sum, "values", json_string(nb_values_name(hc.values)));
  json_object_set_new(sum, "bits_per_param_per_sync", json_real(bpp));
  json_object_set_new(sum, "global_xxh3", json_string(hex));
  json_object_set_new(sum, "adaptive", json_boolean(adaptive));
  json_object_set(sum, "decisions", decisions);
  json_object_set(sum, "evals", evals);
  json_object_set_new(sum, "tls", json_boolean(tls != NULL));
  json_object_set_new(sum, "sealed", json_boolean(have_secret));
  if (tr_scores) json_object_set_new(sum, "translation", tr_scores);
  char tmp[NB_JOB_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/summary.json", odir);
  snprintf(tmp, sizeof tmp, "%s/summary.json.tmp", odir);
  if (json_dump_file(sum, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "nebula worker: cannot write %s\n", path);
    goto done;
  }
  printf(
      "nebula worker: %s done: %ld rounds, eval mean %.4f bpb, %.1f KiB sent, %.1f s wall, "
      "theta %s\n",
      cluster, rounds, ev.mean_bpb, wan_bytes / 1024.0, wall, hex);
  rc = NB_WORKER_DONE;
done:
  json_decref(evals);
  json_decref(decisions);
  json_decref(sum);
  if (tsv) fclose(tsv);
  nb_hybrid_destroy(h);
  nb_exchange_destroy(ex);
  nb_tls_destroy(tls);
  nb_trainer_destroy(t);
  nb_free(tc);
  nb_free(diag);
  nb_free(job);
  memset(secret, 0, sizeof secret);
  if (comm) {
    if (rc != NB_WORKER_DONE && mpi_size > 1) {
      /* the other ranks wait in a collective: take the whole cluster down */
      fflush(stdout);
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, rc);
    }
    nb_comm_destroy(comm);
    nb_intra_finalize();
  }
  return rc;
}
