/* The single-cluster training loop: multilingual byte data with a deterministic held-out slice
 * per language, AdamW steps (optionally LoRA-only, optionally distilled), per-language
 * bits-per-byte evaluation, atomic checkpoints and bit-exact resume, progress callbacks, and the
 * hooks the cross-datacenter loop drives (K inner steps, the synced buffer, samples processed).
 * Driven by a plain struct; it knows nothing of job descriptors, MPI or the WAN. */
#ifndef NB_TRAIN_TRAINER_H
#define NB_TRAIN_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "train/lora.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_TRAIN_MAX_SOURCES 16
#define NB_TRAIN_LABEL_MAX 16
#define NB_TRAIN_PATH_MAX 1024

/* Held-out rule: a segment (one non-empty line, without its newline) is held out when
 * xxh3_64(segment, NB_TRAIN_HOLDOUT_SEED) % 1000 < heldout_permille; in a file where no segment
 * qualifies (a small one), the segment with the smallest hash is held out instead. The seed is
 * fixed (not the training seed) so every run and `nebula eval` agree on the slice, and identical
 * segments always land on the same side. */
#define NB_TRAIN_HOLDOUT_SEED 0x6e6562756c61ull /* "nebula" */

typedef enum {
  NB_TRAIN_DATA_MONO = 0, /* one segment per line; sequences are random byte windows */
  NB_TRAIN_DATA_PAIRS = 1 /* "source<TAB>target" per line; sequences "<2tgt>source SEP target
                           * EOS" (train/translate.h: the tag names the label's target language) */
} nb_train_data_kind_t;

/* One data source: a language (mono) or a language pair (pairs). */
typedef struct {
  char label[NB_TRAIN_LABEL_MAX]; /* "en", "en-de": names the per-language results */
  char path[NB_TRAIN_PATH_MAX];   /* mono text or pair TSV (train split) */
  /* Pairs only: explicit held-out TSV (e.g. the dev split); "" = hold out by hash from path. */
  char dev_path[NB_TRAIN_PATH_MAX];
  int swap; /* pairs only: the TSV holds target<TAB>source (e.g. "de-en" read from en-de) */
} nb_train_source_t;

/* What a progress report is about. */
typedef enum { NB_TRAIN_EVENT_STEP = 0, NB_TRAIN_EVENT_EVAL = 1 } nb_train_event_t;

/* Per-language evaluation result. */
typedef struct {
  int n; /* sources evaluated (= config n_sources) */
  char label[NB_TRAIN_MAX_SOURCES][NB_TRAIN_LABEL_MAX];
  double bpb[NB_TRAIN_MAX_SOURCES];    /* held-out bits per byte (pairs: target bytes + EOS) */
  size_t scored[NB_TRAIN_MAX_SOURCES]; /* predicted bytes behind each figure */
  double mean_bpb;                     /* unweighted mean over sources */
} nb_train_eval_t;

typedef struct {
  nb_train_event_t event;
  long step;                   /* optimizer steps done (after this step) */
  double loss;                 /* STEP: this step's training loss (nats per scored token) */
  double lr;                   /* STEP: learning rate used */
  double grad_norm;            /* STEP: pre-clip gradient norm */
  double tokens_per_s;         /* STEP: scored tokens per second since the trainer started */
  double elapsed_s;            /* seconds of this process's training so far */
  uint64_t samples;            /* sequences trained on so far (including before a resume) */
  const nb_train_eval_t* eval; /* EVAL: the result (borrowed for the call); NULL for STEP */
} nb_train_progress_t;

/* Progress callback: return 0 to continue, nonzero to stop the run (NB_ERR_CANCELLED). Called
 * on the training thread after every step and every evaluation. */
typedef int (*nb_train_progress_fn)(void* ctx, const nb_train_progress_t* p);

/* Called after the backward of each step with the gradient that the optimizer is about to use
 * (the trainable buffer: the whole model, or the LoRA adapters only), e.g. to allreduce it
 * across a cluster's ranks in place. A non-OK status aborts the step. */
typedef nb_status_t (*nb_train_grad_hook_fn)(void* ctx, float* grads, size_t n);

typedef struct {
  nb_model_config_t model;
  uint64_t seed;           /* initialisation (when not from a checkpoint) and data order */
  int batch_size;          /* sequences per micro-batch */
  int micro_batches;       /* micro-batches accumulated per step (gradients averaged); >= 1 */
  int seq_len;             /* T of training sequences; 0 = model ctx */
  long max_steps;          /* optimizer steps of nb_trainer_run (>= 1) */
  double max_seconds;      /* nb_trainer_run also stops after this much wall time; 0 = none */
  nb_adamw_config_t optim; /* total_steps drives the cosine schedule */

  /* Starting point: "" = random init from seed; otherwise a model checkpoint of this shape. */
  char init_checkpoint[NB_TRAIN_PATH_MAX];
  int lora_enabled; /* train only LoRA adapters on the (frozen) starting point */
  nb_lora_config_t lora;
  /* Distillation from a frozen teacher checkpoint ("" = off). */
  char teacher_checkpoint[NB_TRAIN_PATH_MAX];
  float distill_alpha, distill_temp;

  nb_train_data_kind_t data_kind;
  int n_sources; /* 1..NB_TRAIN_MAX_SOURCES */
  nb_train_source_t sources[NB_TRAIN_MAX_SOURCES];
  int heldout_permille; /* segments held out per source, in [1, 500]; default 10 */
  int data_rank;        /* mixes into the data order: distinct ranks see distinct batches */
  /* Testing aid for heterogeneous clusters: each step is made this many times slower (the step
   * sleeps (slowdown - 1) x its own compute time, counted as compute). 1 = off; >= 1. */
  double slowdown;

  long eval_every;  /* evaluate at step 0, every N steps and at the end; 0 = only at the end */
  int eval_batches; /* batches of batch_size sequences per source and evaluation (>= 1) */

  /* Checkpoints under checkpoint_dir ("" = none): step-<N>/ folders, LATEST names the newest. */
  char checkpoint_dir[NB_TRAIN_PATH_MAX];
  long checkpoint_every; /* 0 = only the final one */
  int checkpoint_keep;   /* newest step folders kept; 0 = all */
  int resume;            /* continue from checkpoint_dir/LATEST when it exists */

  nb_train_progress_fn progress; /* nullable */
  void* progress_ctx;
  nb_train_grad_hook_fn grad_hook; /* nullable */
  void* grad_hook_ctx;

  /* Tensor parallelism (train/model.h): this process holds shard tp.rank of tp.size; size 0 or
   * 1 = none. Every rank of the group runs the same steps, evaluations and checkpoints together
   * (they are collective) with the same data_rank. The grad hook sees the shard's gradients (a
   * data-parallel allreduce then runs over the ranks holding the same shard); the synced buffer
   * is the shard (nb_trainer_tp_gather / _scatter give the logical one). Checkpoints are written
   * in the logical layout by tp.rank 0 and load at any tp.size. Not with LoRA or distillation. */
  nb_model_tp_t tp;
  /* Pipeline parallelism (train/pipeline.h): this process runs stage pp.stage of pp.stages
   * (0 or 1 = none), each step's micro_batches through the 1F1B schedule over `pipe`; the same
   * rules as tp above (collective steps, evaluations and checkpoints; the stage's buffer synced;
   * checkpoints in the logical layout from stage 0). Not together with tp. */
  nb_model_pp_t pp;
  nb_pipeline_t pipe;
} nb_train_config_t;

/* Defaults: 4 layers, width 256, 4 heads, ctx 256; seed 1; batch 8; 1 micro-batch; 1000 steps;
 * AdamW defaults with lr 6e-4, warm-up 50; LoRA rank 8 alpha 16 on qkv + attn proj (off);
 * distillation alpha 0.5, T 2 (off); mono data, no sources; 10 permille held out; slowdown 1;
 * eval every 100 steps over 4 batches; no checkpoints. */
void nb_train_config_defaults(nb_train_config_t* cfg);

/* NB_ERR_CONFIG naming the field when a setting is out of range or inconsistent. */
nb_status_t nb_train_config_check(const nb_train_config_t* cfg);

/* 1 when a segment is in the held-out slice at this rate by the hash rule (see
 * NB_TRAIN_HOLDOUT_SEED; the small-file fallback is not covered). */
int nb_train_is_heldout(const void* segment, size_t len, int heldout_permille);

typedef struct nb_trainer nb_trainer_t;
/* Thread safety: one thread at a time per trainer. */

/* Checks cfg, reads the data (split into training text and held-out slice per source), builds
 * the model (random, or from init_checkpoint), attaches LoRA, loads the teacher, creates the
 * optimizer over the trainable buffer and, with resume, restores the newest checkpoint
 * (parameters, adapters, AdamW moments, step and sample counters) so that continuing gives the
 * same bits as an uninterrupted run. cfg is copied. NB_ERR_CONFIG (bad config), NB_ERR_IO
 * (unreadable data or checkpoint; names the path), NB_ERR_INVALID (a source without any
 * training or held-out segment, checkpoint mismatch), NB_ERR_INTEGRITY, NB_ERR_NOMEM. */
nb_status_t nb_trainer_create(const nb_train_config_t* cfg, nb_trainer_t** out);
void nb_trainer_destroy(nb_trainer_t* t); /* NULL ok */

/* Runs from the current step to max_steps (or max_seconds), evaluating and checkpointing as
 * configured, reporting progress, and writes a final checkpoint when a checkpoint_dir is set.
 * *final_eval (nullable) receives the last evaluation. NB_ERR_CANCELLED when the callback asked
 * to stop (a checkpoint is written first), or any error of the steps. */
nb_status_t nb_trainer_run(nb_trainer_t* t, nb_train_eval_t* final_eval);

/* K optimizer steps (the hybrid loop's inner steps), with no evaluation or checkpoint; progress
 * STEP events are reported. *loss_mean (nullable): mean training loss over the K steps. */
nb_status_t nb_trainer_steps(nb_trainer_t* t, long k, double* loss_mean);

/* A wall-time round: optimizer steps while the next one is expected to end within `seconds`
 * of the call (at the mean step time so far; at least one step) or until k_max steps are done.
 * *k_done (nullable) receives the steps taken, *loss_mean (nullable) their mean loss. Errors as
 * nb_trainer_steps. */
nb_status_t nb_trainer_steps_budget(nb_trainer_t* t, long k_max, double seconds, long* k_done,
                                    double* loss_mean);

/* Held-out bits per byte per source. Does not change parameters or the data order. */
nb_status_t nb_trainer_eval(nb_trainer_t* t, nb_train_eval_t* out);

/* Writes checkpoint_dir/step-<N>/ (model.safetensors or lora.safetensors, optim.safetensors)
 * and then atomically replaces checkpoint_dir/LATEST; prunes to checkpoint_keep.
 * NB_ERR_CONFIG when no checkpoint_dir is set, NB_ERR_IO. */
nb_status_t nb_trainer_checkpoint(nb_trainer_t* t);

/* The buffer a cross-cluster sync exchanges: all model parameters, or the LoRA adapters only
 * when LoRA is on. Owned by t; writing into it (e.g. the outer step's result) is allowed
 * between steps. The AdamW moments are kept (DiLoCo keeps inner optimizer state). */
float* nb_trainer_sync_params(nb_trainer_t* t, size_t* n);
/* Copies n floats into the synced buffer. NB_ERR_INVALID when n does not match. */
nb_status_t nb_trainer_set_sync_params(nb_trainer_t* t, const float* src, size_t n);

/* Tensor or pipeline parallelism: the logical synced buffer (nb_trainer_logical_params floats) from
 * every rank's shard (collective over the group: every rank receives the whole), and this rank's
 * shard of a logical buffer into the synced buffer (no communication). Without tensor
 * parallelism the logical buffer is the synced one (a copy). */
size_t nb_trainer_logical_params(const nb_trainer_t* t);
nb_status_t nb_trainer_tp_gather(nb_trainer_t* t, float* logical);
void nb_trainer_tp_scatter(nb_trainer_t* t, const float* logical);

long nb_trainer_step(const nb_trainer_t* t);        /* optimizer steps done */
uint64_t nb_trainer_samples(const nb_trainer_t* t); /* sequences trained on */
uint64_t nb_trainer_tokens(const nb_trainer_t* t);  /* scored tokens trained on */
/* Seconds spent inside forward / backward / optimizer steps by this process. */
double nb_trainer_compute_seconds(const nb_trainer_t* t);
nb_model_t* nb_trainer_model(nb_trainer_t* t); /* borrowed */
nb_lora_t* nb_trainer_lora(nb_trainer_t* t);   /* NULL without LoRA */
const nb_train_config_t* nb_trainer_config(const nb_trainer_t* t);

/* Fills tokens/targets (batch_size, T) with the micro-batch `micro` of step `step` exactly as
 * training would (a pure function of seed, data_rank, step and micro). For tests and tools. */
void nb_trainer_batch(nb_trainer_t* t, long step, int micro, int* tokens, int* targets);

/* The training text / held-out text of source i (mono: segments joined by '\n'; pairs: the
 * TSV lines). Borrowed. NULL when i is out of range. */
const uint8_t* nb_trainer_train_text(const nb_trainer_t* t, int i, size_t* len);
const uint8_t* nb_trainer_heldout_text(const nb_trainer_t* t, int i, size_t* len);

#ifdef __cplusplus
}
#endif
#endif
