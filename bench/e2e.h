/* Shared by `nebula bench e2e` and `nebula bench pareto` (bench_e2e.c): derive a variant of a
 * two-cluster job, run it with `nebula run` as a child process, and read back its summaries. */
#ifndef NB_BENCH_E2E_H
#define NB_BENCH_E2E_H

#include <jansson.h>

#include "common/opts.h"

/* One run's figures: wall = slowest cluster, bpb = mean over languages (a language evaluated by
 * several clusters counts once: they hold the same parameters), utilization and bits per
 * parameter per sync averaged over the clusters, WAN bytes summed. ok: every summary read. */
typedef struct {
  const char* name; /* "single" (cluster dc-all) or anything else (dc-a and dc-b) */
  double wall_s, eval_bpb, util;
  long long wan_bytes;
  double bits_per_param;
  int ok;
} nb_e2e_result_t;

/* A fixed point of the codec for the nebula variant (bench pareto): density and value type with
 * the scheduler off, or adaptive = 1 for the scheduler's own choice (with values, e.g. "auto",
 * set as compression.values); ef_decay > 0 sets
 * compression.errorFeedbackDecay; outer_momentum >= 0 sets sync.outer.momentum; topk_chunk > 0
 * sets compression.topkChunk. */
typedef struct {
  const char* name;
  double density;
  const char* values;
  int adaptive;
  double ef_decay;
  double outer_momentum;
  int topk_chunk;    /* > 0: compression.topkChunk (chunked top-k) */
  int overlap_steps; /* > 0: sync.overlapSteps (where the update lands), else the job's */
  double outer_lr;   /* > 0: sync.outer.lr, else the job's */
  int inner_steps;   /* > 0: sync.innerSteps (H), else the job's */
  int no_eager;      /* 1: sync.eager false (a sparse round starts from theta_global - own) */
} nb_e2e_point_t;

/* Writes variant v ("single": one cluster with every language and worker, exact dense fp32
 * rounds; "dense": fp32 gradients every step; "nebula": outer sync with overlap, adaptive unless
 * `point` fixes it) of base to path, with the link's rate (Mbit/s) and, as root, one-way delay.
 * 0 on success, -1 when base lacks spec.sync or spec.link or the file cannot be written. */
int nb_e2e_write_job(json_t* base, const char* v, double rate, double delay, const char* path,
                     const nb_e2e_point_t* point);

/* Loads the job `job` for `nebula bench <bench>`, sets training.seed (seed >= 0) and
 * training.eval.batches (eval_batches > 0), and creates runs/ and out. NULL with *rc set (1: a
 * file error, 2: no spec.training) after printing why. */
json_t* nb_e2e_load_job(const char* bench, const char* job, long seed, long eval_batches,
                        const char* out, int* rc);

/* Runs `nebula run JOB --out OUT [--data-dir D] [--steps N]` (steps 0: the job's) with its output
 * in LOG; returns the exit code (-1 when it could not run). */
int nb_e2e_run(const char* job, const char* out, const char* log, const char* data_dir, long steps);

/* The option-table rows `bench e2e` and `bench pareto` share (common/opts.h): the job, the run
 * length, the evaluation, the corpus, the output folder and JSON output, into the fields job,
 * steps (long), eval_batches (long), data_dir, out and as_json of *o. */
#define NB_E2E_RUN_OPTIONS(o, out_default)                                                         \
  NB_OPTION("job", NB_OPT_STR, &(o)->job, "FILE",                                                  \
            "the job (default jobs/examples/pretrain-2dc-small.json)"),                            \
      NB_OPTION("steps", NB_OPT_LONG, &(o)->steps, "N", "training steps (default: the job's)",     \
                .min = 1),                                                                         \
      NB_OPTION("eval-batches", NB_OPT_LONG, &(o)->eval_batches, "B",                              \
                "training.eval.batches of every run", .min = 1, .max = 1000000),                   \
      NB_OPTION("data-dir", NB_OPT_STR, &(o)->data_dir, "DIR", "the corpus (default: the job's)"), \
      NB_OPTION("out", NB_OPT_STR, &(o)->out, "DIR",                                               \
                "logs and results (default " out_default ")"),                                     \
      NB_OPTION("json", NB_OPT_FLAG, &(o)->as_json, NULL, "print one JSON object")

/* Reads the summaries of a finished run under out into r (r->name picks the clusters). */
void nb_e2e_collect(const char* out, nb_e2e_result_t* r);

/* Median compute seconds per round of one cluster's finished run (dir/rounds.tsv) and its synced
 * parameter count (dir/summary.json) into *n_params; 0 when unreadable. */
double nb_e2e_round_compute(const char* dir, long long* n_params);

#endif
