/* `nebula train CONFIG.json` (one cluster of a job, in this process) and `nebula eval
 * CHECKPOINT` (held-out bits per byte per language). Not the multi-cluster runner: no MPI, no
 * WAN; several workers are emulated by gradient accumulation. */
#include "cli/cli.h"
#include "common/opts.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/tfevents.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"
#include "train/checkpoint.h"
#include "train/translate.h"
#include "worker/worker.h"

#define NB__CP(dst, ...) (snprintf((dst), sizeof(dst), __VA_ARGS__) >= (int)sizeof(dst))

/* ---- nebula train ------------------------------------------------------------------------- */

/* SIGTERM / SIGINT during training: the signal's number. The step under way finishes, the
 * trainer writes a checkpoint, and summary.json says "interrupted" (nb__train_finish). */
static volatile sig_atomic_t nb__train_signal;

static void nb__train_on_signal(int sig) {
  nb__train_signal = sig;
}

/* Handlers for the training loop only (SA_RESETHAND: a second signal stops at once); old holds
 * what to restore. */
static void nb__train_signals(int on, struct sigaction old[2]) {
  static const int sigs[2] = {SIGTERM, SIGINT};
  for (int i = 0; i < 2; i++) {
    if (!on) {
      sigaction(sigs[i], &old[i], NULL);
      continue;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = nb__train_on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, &old[i]);
  }
}

typedef struct {
  FILE* curve;
  FILE* log; /* progress lines (stdout, or stderr with --json) */
  long print_every;
  FILE* progress; /* $NB_JOB_PROGRESS when run by a gateway: one JSON object per line */
  long max_steps;
  const char* source; /* cluster id */
  /* rounds.tsv in the format of `nebula worker` (one row per sync.innerSteps steps, no WAN) so
   * that a single-cluster run feeds the same run report */
  FILE* rounds;
  long round_len, round, round_steps;
  double loss_sum, last_loss, round_t0;
  uint64_t round_s0;
  long eval_step; /* of the last evaluation; -1 none */
  long step0;     /* the step this run started at (a resume's) */
  double max_seconds;
  /* TensorBoard scalars in OUT/tb, opened at the first figure (a run that fails before its
   * first step leaves no folder behind); NULL: off, not yet, or not writable */
  nb_tfevents_t* tb;
  const char* odir;
  int tb_tried;
} nb__train_ctx_t;

/* The event file, at the first figure written (a failure warns once; training goes on). */
static nb_tfevents_t* nb__train_tb(nb__train_ctx_t* x) {
  if (x->tb_tried) return x->tb;
  x->tb_tried = 1;
  if (!nb_tfevents_enabled() || !x->odir) return NULL;
  char dir[NB_TRAIN_PATH_MAX + 8];
  snprintf(dir, sizeof dir, "%s/tb", x->odir);
  if (nb_tfevents_open(dir, &x->tb) != NB_OK)
    NB_WARN("%s; training goes on without TensorBoard events (NB_TENSORBOARD=0 turns them off)",
            nb_error_last());
  return x->tb;
}

static void nb__round_row(nb__train_ctx_t* x, const nb_train_progress_t* p) {
  x->loss_sum += p->loss;
  x->last_loss = p->loss;
  x->round_steps++;
  /* a round's row at its end, at the last step, and at the step a signal stopped */
  if (!x->rounds || (p->step % x->round_len != 0 && p->step != x->max_steps && !nb__train_signal))
    return;
  double mean = x->loss_sum / (double)x->round_steps;
  uint64_t samples = p->samples - x->round_s0;
  fprintf(x->rounds, "%ld\t%ld\t%llu\t%llu\t%.6f\t0\t0\t0\t%.3f\t0\t0\t-\t1\t%ld\t0\t0\t-\n",
          x->round, x->round_steps, (unsigned long long)samples, (unsigned long long)samples, mean,
          p->elapsed_s - x->round_t0, x->round + 1);
  fflush(x->rounds);
  nb_tfevents_t* tb = nb__train_tb(x);
  nb_tfevents_scalar(tb, p->step, "loss", mean);
  nb_tfevents_scalar(tb, p->step, "time/compute_s", p->elapsed_s - x->round_t0);
  nb_tfevents_scalar(tb, p->step, "tokens_per_s", p->tokens_per_s);
  nb_tfevents_flush(tb);
  x->round++;
  x->round_steps = 0;
  x->loss_sum = 0;
  x->round_t0 = p->elapsed_s;
  x->round_s0 = p->samples;
}

/* The gateway's progress contract (docs/gateway.md): append-only JSON lines. */
static void nb__report_progress(nb__train_ctx_t* x, const nb_train_progress_t* p) {
  if (!x->progress) return;
  long done = p->step - x->step0;
  double eta = done > 0 ? p->elapsed_s / (double)done * (double)(x->max_steps - p->step) : 0;
  if (p->event == NB_TRAIN_EVENT_STEP)
    fprintf(x->progress,
            "{\"step\": %ld, \"max_steps\": %ld, \"loss\": %.6g, \"eta_s\": %.1f, "
            "\"source\": \"%s\"}\n",
            p->step, x->max_steps, p->loss, eta < 0 ? 0 : eta, x->source);
  else
    fprintf(x->progress,
            "{\"step\": %ld, \"max_steps\": %ld, \"eval_bpb\": %.6g, \"source\": \"%s\"}\n",
            p->step, x->max_steps, p->eval->mean_bpb, x->source);
  fflush(x->progress);
}

static int nb__on_progress(void* vctx, const nb_train_progress_t* p) {
  nb__train_ctx_t* x = vctx;
  if (p->event == NB_TRAIN_EVENT_EVAL || (x->print_every > 0 && p->step % x->print_every == 0) ||
      p->step == x->max_steps)
    nb__report_progress(x, p);
  if (p->event == NB_TRAIN_EVENT_STEP) {
    nb__round_row(x, p);
    if (x->print_every > 0 && p->step % x->print_every == 0) {
      /* the time left at this run's pace so far, capped by training.maxSeconds */
      long done = p->step - x->step0;
      double eta = done > 0 ? p->elapsed_s / (double)done * (double)(x->max_steps - p->step) : -1;
      if (x->max_seconds > 0 && (eta < 0 || eta > x->max_seconds - p->elapsed_s))
        eta = x->max_seconds - p->elapsed_s > 0 ? x->max_seconds - p->elapsed_s : 0;
      char es[24];
      fprintf(x->log, "step %6ld/%ld  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s  %.1f s  eta %s\n",
              p->step, x->max_steps, p->loss, p->lr, p->grad_norm, p->tokens_per_s, p->elapsed_s,
              nb_duration_format(eta, es, sizeof es));
    }
    return nb__train_signal != 0;
  }
  const nb_train_eval_t* e = p->eval;
  x->eval_step = p->step;
  fprintf(x->log, "eval %6ld ", p->step);
  for (int i = 0; i < e->n; i++) fprintf(x->log, " %s %.3f", e->label[i], e->bpb[i]);
  fprintf(x->log, "  mean %.3f bits/byte\n", e->mean_bpb);
  fflush(x->log);
  if (x->curve) {
    fprintf(x->curve, "%ld\t%llu\t%.1f", p->step, (unsigned long long)p->samples, p->elapsed_s);
    for (int i = 0; i < e->n; i++) fprintf(x->curve, "\t%.4f", e->bpb[i]);
    fprintf(x->curve, "\t%.4f\n", e->mean_bpb);
    fflush(x->curve);
  }
  nb_tfevents_t* tb = nb__train_tb(x);
  char tag[NB_TFEVENTS_TAG_MAX + 1];
  for (int i = 0; i < e->n && tb; i++) {
    snprintf(tag, sizeof tag, "eval/bpb/%s", e->label[i]);
    nb_tfevents_scalar(tb, p->step, tag, e->bpb[i]);
  }
  nb_tfevents_scalar(tb, p->step, "eval/bpb_mean", e->mean_bpb);
  nb_tfevents_flush(tb);
  return nb__train_signal != 0;
}

static int nb__ckpt_held(const char* dir, int* has_latest, char* names, size_t cap) {
  char p[NB_TRAIN_PATH_MAX + 16];
  struct stat sb;
  snprintf(p, sizeof p, "%s/LATEST", dir);
  *has_latest = lstat(p, &sb) == 0;
  names[0] = 0;
  int n = 0;
  DIR* d = opendir(dir);
  struct dirent* e;
  size_t o = 0;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, "step-", 5) != 0) continue;
    if (n++ < 4 && o + 2 < cap) {
      int k = snprintf(names + o, cap - o, "%s%.40s", o ? ", " : "", e->d_name);
      if (k > 0) o += (size_t)k < cap - o ? (size_t)k : cap - o - 1;
    }
  }
  if (d) closedir(d);
  return n;
}

/* Removes the step-N folders and LATEST of an earlier run from dir (--force: a fresh run's
 * checkpoints must not sit beside a stale later one, which pruning would keep over the new ones
 * and a later look would take for this run's). Returns how many step-N folders went. */
static int nb__ckpt_clear(const char* dir) {
  int n = 0;
  char p[NB_TRAIN_PATH_MAX + 320];
  DIR* d = opendir(dir);
  struct dirent* e;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, "step-", 5) != 0) continue;
    char sdir[NB_TRAIN_PATH_MAX + 64];
    if (snprintf(sdir, sizeof sdir, "%s/%s", dir, e->d_name) >= (int)sizeof sdir) continue;
    DIR* sd = opendir(sdir);
    struct dirent* f;
    while (sd && (f = readdir(sd))) {
      if (f->d_name[0] == '.' && (!f->d_name[1] || (f->d_name[1] == '.' && !f->d_name[2])))
        continue;
      snprintf(p, sizeof p, "%s/%s", sdir, f->d_name);
      (void)unlink(p);
    }
    if (sd) closedir(sd);
    if (rmdir(sdir) == 0)
      n++;
    else
      NB_WARN("--force: cannot remove %s: %s", sdir, strerror(errno));
  }
  if (d) closedir(d);
  snprintf(p, sizeof p, "%s/LATEST", dir);
  (void)unlink(p);
  return n;
}

/* Nothing is overwritten by accident: --resume needs the checkpoint that LATEST names (a
 * missing LATEST is an error, not a fresh start over the folder's checkpoints), and a fresh
 * run refuses an output folder that holds an earlier run's results (summary.json,
 * final.safetensors) or a checkpoint folder that holds checkpoints. --force starts afresh
 * regardless, and removes the earlier run's checkpoints first, saying so. Returns 0, or the
 * exit status after saying why. */
static int nb__ckpt_guard(const char* odir, const char* dir, int resume, int force) {
  int latest = 0;
  char names[256];
  int n = nb__ckpt_held(dir, &latest, names, sizeof names);
  if (force) {
    if (latest || n) {
      int gone = nb__ckpt_clear(dir);
      fprintf(stderr,
              "nebula train: --force: removed %d checkpoint%s of an earlier run (%s%s) and "
              "LATEST from %s\n",
              gone, gone == 1 ? "" : "s", names, n > 4 ? ", ..." : "", dir);
    }
    return 0;
  }
  if (resume && !latest) {
    if (n)
      fprintf(stderr,
              "nebula train: --resume: %s/LATEST is missing, but the folder holds %d "
              "checkpoint%s (%s%s): nothing was changed. Write the one to resume into LATEST "
              "(e.g. \"step-N\"), or start afresh over them with --force\n",
              dir, n, n == 1 ? "" : "s", names, n > 4 ? ", ..." : "");
    else
      fprintf(stderr,
              "nebula train: --resume: no checkpoint to resume from (%s/LATEST is missing): "
              "nothing was changed; run without --resume to start afresh\n",
              dir);
    return NB_EXIT_FAIL;
  }
  if (!resume && (latest || n)) {
    fprintf(stderr,
            "nebula train: %s already holds checkpoints (%s%s%s): nothing was changed. Continue "
            "with --resume, or start afresh with --force (which removes them)\n",
            dir, latest ? "LATEST" : "", latest && n ? ", " : "", names);
    return NB_EXIT_FAIL;
  }
  static const char* const results[] = {"summary.json", "final.safetensors"};
  for (size_t i = 0; !resume && i < sizeof results / sizeof results[0]; i++) {
    char p[NB_TRAIN_PATH_MAX + 32];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", odir, results[i]);
    if (stat(p, &sb) == 0) {
      fprintf(stderr,
              "nebula train: %s already holds an earlier run's results (%s): nothing was "
              "changed. Continue it with --resume, start afresh over it with --force, or choose "
              "another --out\n",
              odir, results[i]);
      return NB_EXIT_FAIL;
    }
  }
  return 0;
}

static int nb__fail(const char* cmd, const char* what) {
  fprintf(stderr, "nebula %s: %s%s%s\n", cmd, what ? what : "", what ? ": " : "", nb_error_last());
  return NB_EXIT_FAIL;
}

static json_t* nb__eval_json(const nb_train_eval_t* e) {
  json_t* o = json_object();
  for (int i = 0; i < e->n; i++)
    json_object_set_new(o, e->label[i], isfinite(e->bpb[i]) ? json_real(e->bpb[i]) : json_null());
  return o;
}

/* One `nebula train` run: its options, the job and what the phases below open. */
typedef struct {
  const char *file, *out, *data_dir, *cluster;
  long steps;
  double seconds; /* < 0: the descriptor's */
  int as_json, resume, force;
  nb_job_config_t* job;
  nb_descriptor_diag_t* diag;
  nb_train_config_t* tc;
  const nb_job_cluster_t* cl;
  char odir[NB_TRAIN_PATH_MAX - 64], path[NB_TRAIN_PATH_MAX + 64];
  FILE *curve, *rounds, *progress;
  nb__train_ctx_t px;
  nb_trainer_t* t;
  double setup_s;
  long step0;
  uint64_t tok0;
  /* what this run created, removed again when it fails before training a step */
  char made_curve[NB_TRAIN_PATH_MAX + 64], made_rounds[NB_TRAIN_PATH_MAX + 64];
  char made_odir[NB_TRAIN_PATH_MAX];
  int trained;
  int signal; /* the SIGTERM or SIGINT that stopped training; 0: none */
} nb__train_run_t;

static int nb__train_write_summary(nb__train_run_t* r, const nb_train_eval_t* ev, double wall,
                                   json_t* tr_scores);

/* The descriptor, our cluster, the overrides and the trainer's config. */
static int nb__train_load(nb__train_run_t* r) {
  if (nb_cli_descriptor_precheck(r->file) != NB_OK) {
    fprintf(stderr, "nebula train: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (nb_descriptor_load(r->file, r->job, r->diag) != NB_OK) {
    nb_descriptor_diag_print(stderr, r->file, r->diag);
    fprintf(stderr, "nebula train: %s: invalid descriptor\n", r->file);
    return NB_EXIT_FAIL;
  }
  nb_job_config_t* job = r->job;
  if (r->job->program.argc > 0) {
    fprintf(stderr,
            "nebula train: %s: $.spec.program: this job runs the user's own program, not the "
            "built-in model: submit it to a gateway (nebula submit), which starts it with the "
            "NEBULA_* environment (docs/gateway.md)\n",
            r->file);
    return NB_EXIT_FAIL;
  }
  if (nb_job_paths_confine_env(job) != NB_OK) /* run by a gateway: paths stay in the job */
    return nb__fail("train", r->file);
  int ci = 0;
  if (r->cluster) {
    while (ci < job->n_clusters && strcmp(job->clusters[ci].id, r->cluster) != 0) ci++;
    if (ci == job->n_clusters) {
      fprintf(stderr, "nebula train: job %s has no cluster '%s'\n", job->name, r->cluster);
      return NB_EXIT_USAGE;
    }
  }
  r->cl = &job->clusters[ci];
  if (r->steps > 0) {
    job->training.max_steps = r->steps;
    if (job->training.optimizer.warmup_steps >= r->steps)
      job->training.optimizer.warmup_steps = (int)(r->steps / 10);
  }
  if (r->seconds >= 0) job->training.max_seconds = r->seconds;
  if (nb_train_config_from_job(job, ci, r->data_dir, r->tc) != NB_OK)
    return nb__fail("train", r->file);
  if (r->cl->device == NB_JOB_DEVICE_CUDA)
    fprintf(stderr, "nebula train: cluster %s asks for cuda; the training loop runs on the CPU\n",
            r->cl->id);
  if (r->cl->threads_per_worker > 0 && !getenv("NB_TRAIN_THREADS")) {
    char v[16];
    snprintf(v, sizeof v, "%d", r->cl->threads_per_worker);
    setenv("NB_TRAIN_THREADS", v, 0);
  }
  return NB_EXIT_OK;
}

/* Opens odir/name (appends with --resume); made receives its path when it did not exist. */
static FILE* nb__train_open_tsv(nb__train_run_t* r, const char* name, char* made, size_t cap) {
  snprintf(r->path, sizeof r->path, "%s/%s", r->odir, name);
  struct stat pre;
  if (stat(r->path, &pre) != 0) snprintf(made, cap, "%s", r->path);
  FILE* f = fopen(r->path, r->resume ? "a" : "w");
  if (!f) fprintf(stderr, "nebula train: cannot write %s: %s\n", r->path, strerror(errno));
  return f;
}

/* The output folder, the checkpoint guard, curve.tsv, rounds.tsv and the progress file. */
static int nb__train_outputs(nb__train_run_t* r) {
  nb_train_config_t* tc = r->tc;
  const nb_job_config_t* job = r->job;
  if (r->out ? NB__CP(r->odir, "%s", r->out) : NB__CP(r->odir, "runs/%s", job->name)) {
    fprintf(stderr, "nebula train: --out path too long\n");
    return NB_EXIT_USAGE;
  }
  if (mkdir(r->odir, 0755) != 0 && errno != EEXIST) {
    if (!(errno == ENOENT && !r->out && mkdir("runs", 0755) == 0 && mkdir(r->odir, 0755) == 0)) {
      fprintf(stderr, "nebula train: cannot create %s: %s\n", r->odir, strerror(errno));
      return NB_EXIT_FAIL;
    }
    snprintf(r->made_odir, sizeof r->made_odir, "%s", r->odir);
  } else if (errno != EEXIST) {
    snprintf(r->made_odir, sizeof r->made_odir, "%s", r->odir);
  }
  if (job->checkpoint.dir[0])
    snprintf(tc->checkpoint_dir, sizeof tc->checkpoint_dir, "%s", job->checkpoint.dir);
  else
    snprintf(tc->checkpoint_dir, sizeof tc->checkpoint_dir, "%s/checkpoints", r->odir);
  int rc = nb__ckpt_guard(r->odir, tc->checkpoint_dir, r->resume, r->force);
  if (rc != 0) return rc;
  tc->resume = r->resume && !r->force;
  if (!(r->curve = nb__train_open_tsv(r, "curve.tsv", r->made_curve, sizeof r->made_curve)))
    return NB_EXIT_FAIL;
  if (ftell(r->curve) == 0) {
    fprintf(r->curve, "step\tsamples\tseconds");
    for (int i = 0; i < tc->n_sources; i++) fprintf(r->curve, "\t%s", tc->sources[i].label);
    fprintf(r->curve, "\tmean\n");
  }
  if (!(r->rounds = nb__train_open_tsv(r, "rounds.tsv", r->made_rounds, sizeof r->made_rounds)))
    return NB_EXIT_FAIL;
  if (ftell(r->rounds) == 0) fprintf(r->rounds, "%s", NB_WORKER_ROUNDS_TSV_HEADER);
  nb__train_ctx_t* px = &r->px;
  px->curve = r->curve;
  px->rounds = r->rounds;
  px->round_len = job->sync.inner_steps > 0 ? job->sync.inner_steps : NB_HYBRID_INNER_STEPS_DEFAULT;
  px->log = r->as_json ? stderr : stdout;
  px->print_every = tc->max_steps >= 200 ? 25 : 5;
  px->max_steps = tc->max_steps;
  px->source = r->cl->id;
  px->odir = r->odir;
  const char* progress_path = getenv("NB_JOB_PROGRESS");
  if (progress_path && *progress_path) {
    r->progress = fopen(progress_path, "a");
    px->progress = r->progress;
    if (!r->progress)
      NB_WARN("cannot append progress to %s (%s); the gateway will see no progress events",
              progress_path, strerror(errno));
  }
  tc->progress = nb__on_progress;
  tc->progress_ctx = px;
  return NB_EXIT_OK;
}

/* The trainer (model, data, optimizer; a checkpoint with --resume) and the banner. */
static int nb__train_start(nb__train_run_t* r) {
  double t0 = nb_now_s();
  nb_status_t st = nb_trainer_create(r->tc, &r->t);
  if (st != NB_OK) {
    int rc = nb__fail("train", r->file);
    if (st == NB_ERR_IO && strstr(nb_error_last(), "data file")) /* not a checkpoint's */
      fprintf(stderr, "nebula train: prepare the data with 'make data', or pass --data-dir\n");
    return rc;
  }
  r->setup_s = nb_now_s() - t0;
  r->step0 = nb_trainer_step(r->t);
  r->px.step0 = r->step0;
  r->px.max_seconds = r->tc->max_seconds;
  r->px.round = r->step0 / r->px.round_len;
  r->px.round_s0 = nb_trainer_samples(r->t);
  r->tok0 = nb_trainer_tokens(r->t);
  size_t n_sync;
  nb_trainer_sync_params(r->t, &n_sync);
  fprintf(r->px.log,
          "nebula train: job %s, cluster %s, %zu parameters (%zu trained), %d sources, "
          "steps %ld..%ld\n",
          r->job->name, r->cl->id, nb_model_num_params(nb_trainer_model(r->t)), n_sync,
          r->tc->n_sources, r->step0, r->tc->max_steps);
  return NB_EXIT_OK;
}

/* The run's summary object (what summary.json holds); tr_scores is stolen. */
static json_t* nb__train_summary(nb__train_run_t* r, const nb_train_eval_t* ev, double wall,
                                 json_t* tr_scores) {
  nb_trainer_t* t = r->t;
  size_t n_tr;
  nb_trainer_sync_params(t, &n_tr);
  double comp = nb_trainer_compute_seconds(t);
  uint64_t toks = nb_trainer_tokens(t) - r->tok0;
  json_t* o = json_object();
  json_object_set_new(o, "job", json_string(r->job->name));
  json_object_set_new(o, "cluster", json_string(r->cl->id));
  json_object_set_new(o, "task", json_string(nb_job_task_name(r->job->task)));
  json_object_set_new(o, "params",
                      json_integer((json_int_t)nb_model_num_params(nb_trainer_model(t))));
  json_object_set_new(o, "trainable_params", json_integer((json_int_t)n_tr));
  json_object_set_new(o, "steps", json_integer(nb_trainer_step(t)));
  json_object_set_new(o, "steps_this_run", json_integer(nb_trainer_step(t) - r->step0));
  json_object_set_new(o, "samples", json_integer((json_int_t)nb_trainer_samples(t)));
  json_object_set_new(o, "tokens", json_integer((json_int_t)nb_trainer_tokens(t)));
  json_object_set_new(o, "wall_s", json_real(wall));
  json_object_set_new(o, "setup_s", json_real(r->setup_s));
  json_object_set_new(o, "compute_s", json_real(comp));
  json_object_set_new(o, "tokens_per_s", json_real(comp > 0 ? toks / comp : 0));
  json_object_set_new(o, "rounds", json_integer(r->px.round));
  json_object_set_new(o, "final_train_loss", json_real(r->px.last_loss));
  json_object_set_new(o, "compute_utilization", json_real(wall > 0 ? comp / wall : 0));
  json_t* mean = ev->n > 0 && isfinite(ev->mean_bpb) ? json_real(ev->mean_bpb) : json_null();
  json_object_set_new(o, "final_eval_bpb", nb__eval_json(ev));
  json_object_set_new(o, "final_eval_mean_bpb", mean);
  json_object_set_new(o, "final_mean_bpb", json_copy(mean));
  json_object_set_new(o, "final_model", r->path[0] ? json_string(r->path) : json_null());
  json_object_set_new(o, "checkpoint_dir", json_string(r->tc->checkpoint_dir));
  json_object_set_new(o, "interrupted", json_boolean(r->signal != 0));
  if (r->signal) { /* stopped by a signal after the step under way: no final model */
    char ck[NB_TRAIN_PATH_MAX + 32];
    snprintf(ck, sizeof ck, "%s/step-%ld", r->tc->checkpoint_dir, nb_trainer_step(t));
    json_object_set_new(o, "signal", json_string(r->signal == SIGINT ? "SIGINT" : "SIGTERM"));
    json_object_set_new(o, "checkpoint", json_string(ck));
    json_object_set_new(o, "eval_step",
                        r->px.eval_step >= 0 ? json_integer(r->px.eval_step) : json_null());
  }
  char data_dir[NB_TRAIN_PATH_MAX];
  if (nb_train_config_data_dir(r->tc, data_dir, sizeof data_dir) == NB_OK)
    json_object_set_new(o, "data_dir", json_string(data_dir));
  if (tr_scores) json_object_set_new(o, "translation", tr_scores);
  return o;
}

/* Trains, writes final.safetensors (LoRA merged, what `nebula eval` reads) and summary.json. */
static int nb__train_finish(nb__train_run_t* r) {
  nb_trainer_t* t = r->t;
  nb_train_eval_t ev;
  double t1 = nb_now_s();
  struct sigaction old[2];
  nb__train_signal = 0;
  r->px.eval_step = -1;
  nb__train_signals(1, old);
  nb_status_t st = nb_trainer_run(t, &ev);
  nb__train_signals(0, old);
  double wall = nb_now_s() - t1;
  r->trained = nb_trainer_step(t) > r->step0;
  if (st == NB_ERR_CANCELLED && nb__train_signal) {
    /* the trainer wrote the step's checkpoint; the summary says where, and that it stopped */
    r->signal = nb__train_signal;
    r->trained = 1;
    r->path[0] = 0;
    return nb__train_write_summary(r, &ev, wall, NULL);
  }
  if (st != NB_OK) return nb__fail("train", NULL);
  snprintf(r->path, sizeof r->path, "%s/final.safetensors", r->odir);
  if (nb_trainer_lora(t) && nb_lora_merge(nb_trainer_lora(t)) != NB_OK)
    return nb__fail("train", "merge LoRA");
  if (nb_checkpoint_save(r->path, nb_trainer_model(t), nb_trainer_step(t)) != NB_OK)
    return nb__fail("train", r->path);
  /* Translation jobs: chrF/BLEU of the base and the final (merged) model on the test split. */
  json_t* tr_scores = NULL;
  const nb_job_config_t* job = r->job;
  if (job->task == NB_JOB_TASK_TRANSLATION && job->training.eval_sentences > 0 &&
      nb_translation_eval(r->tc, nb_trainer_model(t), (size_t)job->training.eval_sentences,
                          &tr_scores) != NB_OK)
    NB_WARN("no translation scores in the summary: %s", nb_error_last());
  return nb__train_write_summary(r, &ev, wall, tr_scores);
}

/* summary.json, and the closing line (or the summary with --json); tr_scores is stolen. Returns
 * the exit status: 0, or 128 + the signal's number when one stopped the run (SIGINT 130,
 * SIGTERM 143). */
static int nb__train_write_summary(nb__train_run_t* r, const nb_train_eval_t* evp, double wall,
                                   json_t* tr_scores) {
  nb_trainer_t* t = r->t;
  nb_train_eval_t ev = *evp;
  json_t* o = nb__train_summary(r, &ev, wall, tr_scores);
  char* text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
  json_decref(o);
  char spath[NB_TRAIN_PATH_MAX + 64];
  snprintf(spath, sizeof spath, "%s/summary.json", r->odir);
  FILE* sf = text ? fopen(spath, "w") : NULL;
  if (!sf || fprintf(sf, "%s\n", text) < 0 || fclose(sf) != 0) {
    fprintf(stderr, "nebula train: cannot write %s\n", spath);
    free(text);
    return NB_EXIT_FAIL;
  }
  double comp = nb_trainer_compute_seconds(t);
  uint64_t toks = nb_trainer_tokens(t) - r->tok0;
  if (r->as_json)
    printf("%s\n", text);
  else if (r->signal)
    printf("interrupted by %s after step %ld: checkpoint %s/step-%ld, %s (no final model)\n",
           r->signal == SIGINT ? "SIGINT" : "SIGTERM", nb_trainer_step(t), r->tc->checkpoint_dir,
           nb_trainer_step(t), spath);
  else
    printf("done: %ld steps in %.1f s (%.0f tokens/s), mean held-out %.3f bits/byte; %s\n",
           nb_trainer_step(t) - r->step0, wall, comp > 0 ? toks / comp : 0, ev.mean_bpb, spath);
  fflush(stdout);
  free(text);
  return r->signal ? 128 + r->signal : NB_EXIT_OK;
}

int nb_train_main(int argc, char** argv) {
  nb__train_run_t r;
  memset(&r, 0, sizeof r);
  r.seconds = -1;
  // clang-format off: one option per entry
  const nb_opt_t opts[] = {
      {.name = "out",
       .kind = NB_OPT_STR,
       .dst = &r.out,
       .meta = "DIR",
       .help = "output folder (default runs/<job name>)"},
      {.name = "steps",
       .kind = NB_OPT_LONG,
       .dst = &r.steps,
       .meta = "N",
       .min = 1,
       .help = "override training.maxSteps (also the cosine schedule's length)"},
      {.name = "seconds",
       .kind = NB_OPT_DOUBLE,
       .dst = &r.seconds,
       .meta = "S",
       .min = 0,
       .help = "override training.maxSeconds"},
      {.name = "data-dir",
       .kind = NB_OPT_STR,
       .dst = &r.data_dir,
       .meta = "D",
       .help = "data folder (mono/, pairs/) instead of the cluster's data.dir"},
      {.name = "cluster",
       .kind = NB_OPT_STR,
       .dst = &r.cluster,
       .meta = "ID",
       .help = "which cluster of the job to train"},
      {.name = "resume",
       .kind = NB_OPT_FLAG,
       .dst = &r.resume,
       .help = "continue from the checkpoint LATEST names (an error without one)"},
      {.name = "force",
       .kind = NB_OPT_FLAG,
       .dst = &r.force,
       .help = "start afresh even where an earlier run's results and checkpoints are\n"
               "(its checkpoints are removed first)"},
      {.name = "json",
       .kind = NB_OPT_FLAG,
       .dst = &r.as_json,
       .help = "print the summary as JSON on stdout (progress goes to stderr)"},
      {.name = NULL},
  };
  // clang-format on
  const nb_cmd_spec_t spec = {
      .cmd = "nebula train",
      .synopsis =
          "usage: nebula train CONFIG.json [--out DIR] [--steps N] [--seconds S] [--data-dir D]\n"
          "                    [--cluster ID] [--resume] [--force] [--json]",
      .about =
          "Trains one cluster of a job descriptor (the first, or --cluster ID) in this process.\n"
          "Writes DIR/summary.json, DIR/curve.tsv (step, samples, seconds, held-out bits per\n"
          "byte per language, mean), DIR/rounds.tsv (as `nebula worker`, one row per\n"
          "sync.innerSteps steps, no WAN columns), DIR/final.safetensors (LoRA merged into "
          "the base) and\ncheckpoints under the descriptor's checkpoint.dir or "
          "DIR/checkpoints.",
      .epilog =
          "\nSIGTERM or SIGINT: the step under way finishes, a checkpoint and summary.json\n"
          "(\"interrupted\": true) are written, and the exit status is 128 + the signal's\n"
          "number (143, 130); a second signal stops at once.\n"
          "\nExit status: 0 done, 1 failure, 2 usage error, 130/143 interrupted.",
      .arg_name = "CONFIG",
      .arg = &r.file,
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (!r.file) return nb_opts_usage_error(&spec, "missing CONFIG.json");
  if (nb_calloc((void**)&r.job, 1, sizeof *r.job, "job") != NB_OK ||
      nb_calloc((void**)&r.diag, 1, sizeof *r.diag, "diag") != NB_OK ||
      nb_calloc((void**)&r.tc, 1, sizeof *r.tc, "train config") != NB_OK) {
    rc = nb__fail("train", NULL);
  } else {
    rc = nb__train_load(&r);
    if (rc == NB_EXIT_OK) rc = nb__train_outputs(&r);
    if (rc == NB_EXIT_OK) rc = nb__train_start(&r);
    if (rc == NB_EXIT_OK) rc = nb__train_finish(&r);
  }
  if (r.curve) fclose(r.curve);
  if (r.rounds) fclose(r.rounds);
  if (r.progress) fclose(r.progress);
  nb_tfevents_close(r.px.tb);
  /* A run that failed before its first step leaves nothing behind of its own: no header-only
   * tsv files, no empty output folder. Once it trained, its files describe the checkpoints it
   * kept and stay. */
  if (rc != NB_EXIT_OK && !r.trained) {
    if (r.made_curve[0]) unlink(r.made_curve);
    if (r.made_rounds[0]) unlink(r.made_rounds);
    if (r.made_odir[0]) {
      char ck[NB_TRAIN_PATH_MAX + 16];
      snprintf(ck, sizeof ck, "%s/checkpoints", r.made_odir);
      rmdir(ck);                                            /* only when empty */
      if (rmdir(r.made_odir) == 0 && !r.out) rmdir("runs"); /* ditto */
    }
  }
  nb_trainer_destroy(r.t);
  nb_free(r.tc);
  nb_free(r.diag);
  nb_free(r.job);
  return rc;
}

static int nb__add_sources(nb_train_config_t* c, const char* list, const char* dir, int pairs) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (c->n_sources == NB_TRAIN_MAX_SOURCES) return -1;
    nb_train_source_t* s = &c->sources[c->n_sources++];
    snprintf(s->label, sizeof s->label, "%s", tok);
    if (!pairs) {
      snprintf(s->path, sizeof s->path, "%s/mono/%s.txt", dir, tok);
      continue;
    }
    const char* x = strncmp(tok, "en-", 3) == 0 ? tok + 3 : NULL;
    if (!x && strlen(tok) > 3 && strcmp(tok + strlen(tok) - 3, "-en") == 0) {
      static char xs[8];
      snprintf(xs, sizeof xs, "%.*s", (int)(strlen(tok) - 3), tok);
      x = xs;
      s->swap = 1;
    }
    if (!x) return -2;
    snprintf(s->path, sizeof s->path, "%s/pairs/en-%s.train.tsv", dir, x);
    snprintf(s->dev_path, sizeof s->dev_path, "%s/pairs/en-%s.dev.tsv", dir, x);
  }
  return 0;
}

/* The sources to evaluate: --pairs, --langs, or every mono/<lang>.txt found under dir. */
static int nb__eval_sources(nb_train_config_t* c, const char* pairs, const char* langs,
                            const char* dir) {
  if (pairs) {
    c->data_kind = NB_TRAIN_DATA_PAIRS;
    if (nb__add_sources(c, pairs, dir, 1)) {
      fprintf(stderr, "nebula eval: --pairs: expected en-X or X-en items, at most %d\n",
              NB_TRAIN_MAX_SOURCES);
      return NB_EXIT_USAGE;
    }
  } else if (langs) {
    if (nb__add_sources(c, langs, dir, 0)) {
      fprintf(stderr, "nebula eval: --langs: at most %d languages\n", NB_TRAIN_MAX_SOURCES);
      return NB_EXIT_USAGE;
    }
  } else {
    static const char* all[] = {"en", "de", "fr", "ru", "es", "zh", "fa"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
      char p[NB_TRAIN_PATH_MAX + 32];
      snprintf(p, sizeof p, "%s/mono/%s.txt", dir, all[i]);
      struct stat sb;
      if (stat(p, &sb) == 0) nb__add_sources(c, all[i], dir, 0);
    }
    if (c->n_sources == 0) {
      fprintf(stderr, "nebula eval: no mono/<lang>.txt under %s (run make data, or --data-dir)\n",
              dir);
      return NB_EXIT_FAIL;
    }
  }
  return NB_EXIT_OK;
}

/* A mean over nothing is not a score: such a source has no bits per byte (n/a, null in JSON,
 * left out of the mean). Without --translate there is then nothing to report for it, which is
 * an error; with it, the translation scores still stand. Returns how many such sources. */
static int nb__eval_unscored(nb_train_eval_t* ev, const nb_train_config_t* c, int pairs) {
  int unscored = 0;
  double sum = 0;
  for (int i = 0; i < ev->n; i++) {
    if (ev->scored[i] > 0) {
      sum += ev->bpb[i];
      continue;
    }
    unscored++;
    ev->bpb[i] = NAN;
    fprintf(stderr,
            "nebula eval: nothing was scored for '%s': no held-out byte of it can be scored "
            "within the model's context of %d bytes (%s); a mean over nothing is not a score\n",
            ev->label[i], c->model.ctx,
            pairs ? "every held-out source in pairs/*.dev.tsv fills the context"
                  : "its held-out slice of mono/<lang>.txt is too short");
  }
  ev->mean_bpb = unscored < ev->n ? sum / (ev->n - unscored) : NAN;
  return unscored;
}

/* --translate: greedy decoding of the first n pairs of each test split (the trainer's model is
 * the checkpoint's, already loaded), chrF and BLEU into ts[]. */
static int nb__eval_translate(nb_trainer_t* t, const nb_train_config_t* c, long n,
                              nb_translate_score_t* ts) {
  nb_model_t* tm = nb_trainer_model(t);
  for (int i = 0; i < c->n_sources; i++) {
    char tsv[NB_TRAIN_PATH_MAX + 32];
    snprintf(tsv, sizeof tsv, "%s", c->sources[i].dev_path);
    char* dot = strstr(tsv, ".dev.tsv");
    if (dot) memcpy(dot, ".test.tsv", sizeof ".test.tsv");
    char tgt[NB_TRANSLATE_LANG_MAX + 1]; /* the language the trainer tagged this pair with */
    if (nb_translate_pair_target(c->sources[i].label, tgt, sizeof tgt) != NB_OK ||
        nb_translate_eval_tsv(tm, tsv, c->sources[i].swap, tgt, (size_t)n, &ts[i]) != NB_OK)
      return nb__fail("eval", tsv);
  }
  return NB_EXIT_OK;
}

/* --json: one object (ts NULL without --translate). */
static void nb__eval_print_json(const char* ckpt, const char* dir, long step,
                                const nb_train_eval_t* ev, const nb_train_config_t* c,
                                const nb_translate_score_t* ts) {
  json_t* o = json_object();
  json_object_set_new(o, "checkpoint", json_string(ckpt));
  json_object_set_new(o, "data_dir", json_string(dir));
  json_object_set_new(o, "step", json_integer(step));
  json_object_set_new(o, "bits_per_byte", nb__eval_json(ev));
  if (ts) {
    json_t* tr = json_object();
    for (int i = 0; i < c->n_sources; i++) {
      json_t* one = json_object();
      json_object_set_new(one, "sentences", json_integer((json_int_t)ts[i].sentences));
      json_object_set_new(one, "chrf", json_real(ts[i].chrf));
      json_object_set_new(one, "bleu", json_real(ts[i].bleu));
      json_object_set_new(tr, c->sources[i].label, one);
    }
    json_object_set_new(o, "translation", tr);
  }
  json_t* sc = json_object();
  for (int i = 0; i < ev->n; i++)
    json_object_set_new(sc, ev->label[i], json_integer((json_int_t)ev->scored[i]));
  json_object_set_new(o, "scored_bytes", sc);
  json_object_set_new(o, "mean_bpb",
                      isfinite(ev->mean_bpb) ? json_real(ev->mean_bpb) : json_null());
  char* text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
  json_decref(o);
  if (text) printf("%s\n", text);
  free(text);
}

/* The text report (ts NULL without --translate). */
static void nb__eval_print_text(const char* ckpt, const char* dir, long step,
                                const nb_train_eval_t* ev, const nb_train_config_t* c,
                                const nb_translate_score_t* ts) {
  printf("%s (step %ld): held-out bits per byte on %s\n", ckpt, step, dir);
  for (int i = 0; i < ev->n; i++)
    if (ev->scored[i] > 0)
      printf("  %-6s %.4f  (%zu bytes)\n", ev->label[i], ev->bpb[i], ev->scored[i]);
    else
      printf("  %-6s n/a     (nothing scored)\n", ev->label[i]);
  if (isfinite(ev->mean_bpb))
    printf("  %-6s %.4f\n", "mean", ev->mean_bpb);
  else
    printf("  %-6s n/a\n", "mean");
  if (ts) {
    printf("translation of the test split (greedy decoding):\n");
    for (int i = 0; i < c->n_sources; i++)
      printf("  %-6s chrF %6.2f  BLEU %6.2f  (%zu sentences, %.1f s)\n", c->sources[i].label,
             ts[i].chrf, ts[i].bleu, ts[i].sentences, ts[i].seconds);
  }
}

/* eval's data folder without --data-dir: the one the run that wrote the checkpoint trained on,
 * as its summary.json records it ("data_dir", absolute) beside final.safetensors, or three
 * folders up from checkpoints/step-N/model.safetensors; else data/quick, like train's default
 * (data/<tier> of the current folder). Returns dir or buf. */
static const char* nb__eval_default_dir(const char* ckpt, char* buf, size_t cap) {
  char d[NB_TRAIN_PATH_MAX];
  snprintf(d, sizeof d, "%s", ckpt);
  for (int up = 0; up < 3; up++) {
    char* slash = strrchr(d, '/');
    if (slash)
      *slash = 0;
    else
      snprintf(d, sizeof d, ".");
    if (up == 1) continue; /* checkpoints/step-N holds no summary */
    char sp[NB_TRAIN_PATH_MAX + 16];
    snprintf(sp, sizeof sp, "%s/summary.json", d);
    json_t* s = json_load_file(sp, 0, NULL);
    const char* dd = s ? json_string_value(json_object_get(s, "data_dir")) : NULL;
    struct stat sb;
    int ok = dd && stat(dd, &sb) == 0 && S_ISDIR(sb.st_mode) &&
             (size_t)snprintf(buf, cap, "%s", dd) < cap;
    json_decref(s);
    if (ok) return buf;
    if (!slash) break;
  }
  return "data/quick";
}

/* eval's sizes: a batch is B sequences held at once, int-sized in the trainer */
#define NB__EVAL_MAX_BATCH 4096
#define NB__EVAL_MAX_BATCHES 1000000

int nb_eval_main(int argc, char** argv) {
  const char *ckpt = NULL, *dir = NULL, *langs = NULL, *pairs = NULL;
  char run_data[NB_TRAIN_PATH_MAX];
  long batches = 8, batch = 8, translate = 0;
  int as_json = 0;
  const nb_opt_t opts[] = {
      {.name = "data-dir",
       .kind = NB_OPT_STR,
       .dst = &dir,
       .meta = "D",
       .help = "data folder (default: the one the run trained on, as its summary.json\n"
               "beside the checkpoint records it; else data/quick)"},
      {.name = "langs",
       .kind = NB_OPT_STR,
       .dst = &langs,
       .meta = "L,...",
       .help = "languages (default: every mono/<lang>.txt of en de fr ru es zh fa)"},
      {.name = "pairs",
       .kind = NB_OPT_STR,
       .dst = &pairs,
       .meta = "P,...",
       .help = "evaluate translation pairs instead"},
      {.name = "batches",
       .kind = NB_OPT_LONG,
       .dst = &batches,
       .meta = "N",
       .help = "batches per language (default 8, 1..1000000)",
       .min = 1,
       .max = NB__EVAL_MAX_BATCHES},
      {.name = "batch",
       .kind = NB_OPT_LONG,
       .dst = &batch,
       .meta = "B",
       .help = "sequences per batch (default 8, 1..4096)",
       .min = 1,
       .max = NB__EVAL_MAX_BATCH},
      {.name = "translate",
       .kind = NB_OPT_LONG,
       .dst = &translate,
       .meta = "N",
       .help = "with --pairs: also translate the first N pairs of the test split\n"
               "(pairs/en-<x>.test.tsv) by greedy decoding and score chrF and BLEU",
       .min = 1},
      {.name = "json",
       .kind = NB_OPT_FLAG,
       .dst = &as_json,
       .meta = NULL,
       .help = "print one JSON object"},
      {.name = NULL},
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula eval",
      .synopsis =
          "usage: nebula eval CHECKPOINT [--data-dir D] [--langs en,de,...] [--pairs en-de,...]\n"
          "                   [--batches N] [--batch B] [--translate N] [--json]",
      .about =
          "Held-out bits per byte of a model checkpoint (safetensors) per language, on the same\n"
          "held-out slice `nebula train` never trains on (mono/<lang>.txt segments selected by\n"
          "hash), or per pair on pairs/en-<x>.dev.tsv (target bytes given the source).",
      .arg_name = "CHECKPOINT",
      .arg = &ckpt,
      .opts = opts,
  };
  int prc = nb_opts_parse(&spec, argc, argv);
  if (prc != NB_OPTS_RUN) return prc;
  if (!ckpt) return nb_opts_usage_error(&spec, "missing CHECKPOINT");
  if (langs && pairs) return nb_opts_usage_error(&spec, "--langs and --pairs exclude each other");
  if (translate && !pairs) return nb_opts_usage_error(&spec, "--translate needs --pairs");
  if (!dir) dir = nb__eval_default_dir(ckpt, run_data, sizeof run_data);
  nb_model_t* m = NULL;
  long step = 0;
  if (nb_checkpoint_load(ckpt, &m, &step) != NB_OK) return nb__fail("eval", NULL);
  nb_train_config_t* c = NULL;
  if (nb_calloc((void**)&c, 1, sizeof *c, "config") != NB_OK) {
    nb_model_destroy(m);
    return nb__fail("eval", NULL);
  }
  nb_train_config_defaults(c);
  c->model = *nb_model_get_config(m);
  nb_model_destroy(m);
  snprintf(c->init_checkpoint, sizeof c->init_checkpoint, "%s", ckpt);
  c->batch_size = (int)batch;
  c->eval_batches = (int)batches;
  c->max_steps = 1;
  int rc = nb__eval_sources(c, pairs, langs, dir);
  nb_trainer_t* t = NULL;
  nb_train_eval_t ev;
  nb_translate_score_t ts[NB_TRAIN_MAX_SOURCES];
  if (rc != NB_EXIT_OK) goto done;
  rc = NB_EXIT_FAIL;
  if (nb_trainer_create(c, &t) != NB_OK || nb_trainer_eval(t, &ev) != NB_OK) {
    rc = nb__fail("eval", ckpt);
    goto done;
  }
  if (nb__eval_unscored(&ev, c, pairs != NULL) && !translate) goto done;
  if (translate && (rc = nb__eval_translate(t, c, translate, ts)) != NB_EXIT_OK) goto done;
  if (as_json)
    nb__eval_print_json(ckpt, dir, step, &ev, c, translate ? ts : NULL);
  else
    nb__eval_print_text(ckpt, dir, step, &ev, c, translate ? ts : NULL);
  rc = NB_EXIT_OK;
done:
  nb_trainer_destroy(t);
  nb_free(c);
  return rc;
}
