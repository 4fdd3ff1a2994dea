/* The settings of one training job as plain C data: what a job descriptor (jobs/descriptor.h)
 * fills in and what `nebula run` / the training loop consume. It deliberately knows nothing of
 * JSON, files or gateways and includes only the C library, so train/ can take it as is. */
#ifndef NB_JOBS_JOB_CONFIG_H
#define NB_JOBS_JOB_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "compress/compress.h" /* NB_CODEC_ZSTD_LEVEL_*: the defaults come from their module */
#include "train/hybrid.h"      /* NB_HYBRID_INNER_STEPS_DEFAULT, NB_HYBRID_OVERLAP_STEPS_DEFAULT */

#ifdef __cplusplus
extern "C" {
#endif

#define NB_JOB_MAX_CLUSTERS 16
#define NB_JOB_MAX_LANGS 8   /* per cluster: languages (pretraining) or pairs (translation) */
#define NB_JOB_NAME_MAX 64   /* job name, cluster id: lower-case letters, digits, '-'; with NUL */
#define NB_JOB_LANG_MAX 8    /* a data label ("en", "legal"), with NUL */
#define NB_JOB_PATH_MAX 512  /* file and folder paths, with NUL */
#define NB_JOB_TEXT_MAX 256  /* free-form description, with NUL */
#define NB_JOB_SHA256_HEX 65 /* 64 lower-case hex digits and NUL */
#define NB_JOB_PROGRAM_MAX_ARGS 32  /* words of spec.program.command */
#define NB_JOB_PROGRAM_MAX_FILES 16 /* entries of spec.program.files */
#define NB_JOB_ARTIFACT_MAX 256     /* an artifact name or "sha256:<hex>", with NUL */
#define NB_JOB_ADDR_MAX 256         /* a HOST:PORT address, with NUL */

typedef enum { NB_JOB_TASK_PRETRAIN = 0, NB_JOB_TASK_TRANSLATION = 1 } nb_job_task_t;
typedef enum { NB_JOB_DEVICE_CPU = 0, NB_JOB_DEVICE_CUDA = 1 } nb_job_device_t;
typedef enum { NB_JOB_DATA_QUICK = 0, NB_JOB_DATA_FULL = 1 } nb_job_data_tier_t;
typedef enum { NB_JOB_LR_COSINE = 0, NB_JOB_LR_CONSTANT = 1 } nb_job_lr_schedule_t;
/* outer: DiLoCo-style pseudo-gradient every round; step: compressed gradient every step
 * (DGC-style); dense: uncompressed fp32 gradient every step (the baseline). */
typedef enum { NB_JOB_SYNC_OUTER = 0, NB_JOB_SYNC_STEP = 1, NB_JOB_SYNC_DENSE = 2 } nb_job_sync_t;
/* Value type of the kept top-k entries on the wire. */
typedef enum {
  NB_JOB_VALUES_FP32 = 0,
  NB_JOB_VALUES_FP16 = 1,
  NB_JOB_VALUES_BF16 = 2,
  NB_JOB_VALUES_INT8 = 3,
  NB_JOB_VALUES_INT4 = 4, /* "4bit" */
  NB_JOB_VALUES_INT2 = 5, /* "2bit" */
  NB_JOB_VALUES_AUTO = 6  /* "auto": the adaptive scheduler picks a codec point each round */
} nb_job_values_t;

/* LoRA target projections (bit mask). */
enum {
  NB_JOB_LORA_QKV = 1u << 0,      /* attention input projection */
  NB_JOB_LORA_ATTN_OUT = 1u << 1, /* attention output projection */
  NB_JOB_LORA_MLP_UP = 1u << 2,   /* MLP expansion */
  NB_JOB_LORA_MLP_DOWN = 1u << 3  /* MLP contraction */
};

/* One cluster (datacenter) of the job and what runs there. */
typedef struct {
  char id[NB_JOB_NAME_MAX]; /* "dc-a"; unique in the job; orders the weighted sum */
  int workers;              /* ranks in the cluster (>= 1) */
  nb_job_device_t device;
  int threads_per_worker; /* CPU threads per rank for elementwise work; 0 = automatic */
  double slowdown;        /* >= 1; testing aid: each step made this many times slower */
  /* Data that lives in this cluster and never leaves it. */
  nb_job_data_tier_t data_tier;
  char data_dir[NB_JOB_PATH_MAX]; /* "" = the project's default data folder for the tier */
  int n_languages;                /* pretraining: monolingual text in these languages */
  char languages[NB_JOB_MAX_LANGS][NB_JOB_LANG_MAX];
  int n_pairs; /* translation: source→target pairs */
  char pair_src[NB_JOB_MAX_LANGS][NB_JOB_LANG_MAX];
  char pair_tgt[NB_JOB_MAX_LANGS][NB_JOB_LANG_MAX];
  /* The cluster leader's Prometheus endpoint (docs/operations.md), "HOST:PORT" with port
   * 0..65535 (0: a free one); "" = off. NEBULA_METRICS_LISTEN, when set, overrides it. */
  char metrics_listen[NB_JOB_ADDR_MAX];
  /* Model parallelism inside the cluster (built-in model): the workers form a grid of
   * workers / (tensor x pipeline) data-parallel replicas, each split over `tensor` ranks
   * (Megatron-style, heads divisible by it) and `pipeline` stages. 1 = none. */
  int tensor_parallel;
  int pipeline_parallel;
  /* Pipeline only: micro-batches a step's training.batchSize sequences are split into (they
   * go through the stages by the 1F1B schedule); 0 = the pipeline degree. Divides batchSize. */
  int micro_batches;
} nb_job_cluster_t;

typedef struct {
  int layers, width, heads, context; /* width % heads == 0 */
  /* Pretrained starting point ("" = random initialisation from the seed). */
  char base_checkpoint[NB_JOB_PATH_MAX];
  char base_cluster[NB_JOB_NAME_MAX];  /* cluster holding it ("" = present locally everywhere) */
  char base_sha256[NB_JOB_SHA256_HEX]; /* content hash ("" = not pinned) */
} nb_job_model_t;

typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  double grad_clip; /* global-norm clip; 0 = off */
  int warmup_steps;
  nb_job_lr_schedule_t schedule;
  double min_lr_ratio; /* cosine floor as a fraction of lr */
} nb_job_optimizer_t;

typedef struct {
  bool enabled;
  int rank;
  double alpha;
  unsigned targets; /* NB_JOB_LORA_* mask, never 0 when enabled */
} nb_job_lora_t;

typedef struct {
  bool enabled;
  char teacher[NB_JOB_PATH_MAX]; /* checkpoint path; "base" = model.base_checkpoint */
  double alpha;                  /* loss = (1-alpha) CE + alpha T^2 KL */
  double temperature;
} nb_job_distill_t;

typedef struct {
  uint64_t seed;
  int batch_size;     /* sequences per worker per step */
  int64_t max_steps;  /* inner steps per worker; the job ends when they are done */
  double max_seconds; /* wall-clock limit; 0 = none */
  int eval_every_rounds;
  int eval_batches;
  int eval_sentences; /* translation: sentences decoded for chrF/BLEU */
  nb_job_optimizer_t optimizer;
  nb_job_lora_t lora;
  nb_job_distill_t distill;
} nb_job_training_t;

typedef struct {
  nb_job_sync_t mode;
  int inner_steps;      /* H: inner steps per round (outer mode), when round_seconds == 0 */
  double round_seconds; /* > 0: a round is a wall-time budget instead of H steps */
  bool overlap;         /* exchange round r during round r+1 */
  int overlap_steps;    /* with overlap: round r's update lands after this many inner steps of
                           round r+1 (>= its steps: at its end, one round late) */
  bool eager;           /* with overlap: a sparse round starts from the predicted landing
                           (nb_hybrid_config_t.eager) */
  double outer_lr;
  double outer_momentum;
  bool outer_nesterov;
  double peer_timeout_seconds; /* a silent peer is declared gone after this */
} nb_job_sync_cfg_t;

typedef struct {
  double density_initial, density_min, density_max; /* fraction of entries kept, in (0, 1] */
  bool adaptive;          /* scheduler picks the density each round from the measured link */
  double budget_fraction; /* a round's transfer must fit in this fraction of its compute */
  bool error_feedback;
  double error_feedback_decay; /* beta in (0, 1]: the residual is scaled by it each round */
  int topk_chunk; /* chunked top-k: 0 (global top-k) or a power of two in [16, 65536] */
  nb_job_values_t values;
  int zstd_level; /* NB_CODEC_ZSTD_LEVEL_MIN..MAX (0 = no zstd) */
} nb_job_compression_t;

typedef struct {
  double rate_mbit; /* cap on WAN sending rate, megabits/s; 0 = uncapped */
  double delay_ms;  /* one-way delay of the emulated link (`nebula run`); 0 = none */
  int streams;      /* parallel gRPC streams per peer */
  int chunk_kib;    /* frame chunk size */
} nb_job_link_t;

typedef struct {
  char ca[NB_JOB_PATH_MAX], cert[NB_JOB_PATH_MAX], key[NB_JOB_PATH_MAX]; /* "" = gateway's own */
  bool seal; /* AES-256-GCM sealing of update frames */
} nb_job_security_t;

typedef struct {
  int every_rounds;          /* 0 = only the final checkpoint */
  int keep;                  /* newest checkpoints kept; 0 = all */
  char dir[NB_JOB_PATH_MAX]; /* "" = the job's work folder */
} nb_job_checkpoint_t;

/* The user's own program, run instead of the built-in model (spec.program): argv as given, no
 * shell; it reaches the other clusters through the public API (include/nebula.h) and the
 * NEBULA_* environment the gateway sets. argc 0 = the built-in model. */
typedef struct {
  int argc;
  char argv[NB_JOB_PROGRAM_MAX_ARGS][NB_JOB_PATH_MAX]; /* argv[0]: a name looked up in PATH, or a
                                                          path (confined: jobs/job_paths.h) */
  char workdir[NB_JOB_PATH_MAX]; /* "" = the job's folder; relative, inside it */
  int n_files;                   /* spec.program.files: fetched into workdir before launch */
  struct {
    char artifact[NB_JOB_ARTIFACT_MAX]; /* "<name>" (the user's namespace) or "sha256:<hex>" */
    char path[NB_JOB_PATH_MAX];         /* relative to workdir, no "..", unique */
    char cluster[NB_JOB_NAME_MAX];      /* the cluster whose store holds it; "" = the origin */
    int mode;                           /* permission bits (<= 0777); 0 = not given (0644) */
  } files[NB_JOB_PROGRAM_MAX_FILES];
} nb_job_program_t;

typedef struct {
  char name[NB_JOB_NAME_MAX];
  char description[NB_JOB_TEXT_MAX];
  nb_job_task_t task;
  int n_clusters;
  nb_job_cluster_t clusters[NB_JOB_MAX_CLUSTERS];
  nb_job_model_t model;
  nb_job_training_t training;
  nb_job_sync_cfg_t sync;
  nb_job_compression_t compression;
  nb_job_link_t link;
  nb_job_security_t security;
  nb_job_checkpoint_t checkpoint;
  nb_job_program_t program;
} nb_job_config_t;

/* Defaults of one cluster entry (id, data left empty: the descriptor requires them). */
static inline void nb_job_cluster_defaults(nb_job_cluster_t* c) {
  memset(c, 0, sizeof *c);
  c->workers = 1;
  c->device = NB_JOB_DEVICE_CPU;
  c->threads_per_worker = 0;
  c->slowdown = 1.0;
  c->data_tier = NB_JOB_DATA_QUICK;
  c->tensor_parallel = 1;
  c->pipeline_parallel = 1;
}

/* Every optional setting at its default; name, clusters and their data are left empty. The
 * numbers are the demo sizes: small enough to train on two CPU cores in minutes. */
static inline void nb_job_config_defaults(nb_job_config_t* c) {
  memset(c, 0, sizeof *c);
  c->task = NB_JOB_TASK_PRETRAIN;
  c->model.layers = 4;
  c->model.width = 256;
  c->model.heads = 4;
  c->model.context = 256;

  nb_job_training_t* t = &c->training;
  t->seed = 1;
  t->batch_size = 8;
  t->max_steps = 1000;
  t->max_seconds = 0;
  t->eval_every_rounds = 5;
  t->eval_batches = 8;
  t->eval_sentences = 8;
  t->optimizer.lr = 6e-4;
  t->optimizer.beta1 = 0.9;
  t->optimizer.beta2 = 0.95;
  t->optimizer.eps = 1e-8;
  t->optimizer.weight_decay = 0.1;
  t->optimizer.grad_clip = 1.0;
  t->optimizer.warmup_steps = 50;
  t->optimizer.schedule = NB_JOB_LR_COSINE;
  t->optimizer.min_lr_ratio = 0.1;
  t->lora.enabled = false;
  t->lora.rank = 8;
  t->lora.alpha = 16.0;
  t->lora.targets = NB_JOB_LORA_QKV | NB_JOB_LORA_ATTN_OUT;
  t->distill.enabled = false;
  t->distill.alpha = 0.5;
  t->distill.temperature = 2.0;

  c->sync.mode = NB_JOB_SYNC_OUTER;
  c->sync.inner_steps = NB_HYBRID_INNER_STEPS_DEFAULT;
  c->sync.round_seconds = 0;
  c->sync.overlap = false;
  c->sync.overlap_steps = NB_HYBRID_OVERLAP_STEPS_DEFAULT;
  c->sync.eager = true;
  c->sync.outer_lr = 0.7;
  c->sync.outer_momentum = 0.9;
  c->sync.outer_nesterov = true;
  c->sync.peer_timeout_seconds =
      2.0; /* detection within 3 s includes the heartbeat period and scheduling slack */

  c->compression.density_initial = 0.01;
  c->compression.density_min = 0.001;
  c->compression.density_max = 0.1;
  c->compression.adaptive = true;
  c->compression.budget_fraction = 1.0;
  c->compression.error_feedback = true;
  c->compression.error_feedback_decay = 1.0;
  c->compression.values = NB_JOB_VALUES_FP16;
  c->compression.zstd_level = NB_CODEC_ZSTD_LEVEL_DEFAULT;

  c->link.rate_mbit = 0;
  c->link.delay_ms = 0;
  c->link.streams = 4;
  c->link.chunk_kib = 1024;

  c->security.seal = true;

  c->checkpoint.every_rounds = 10;
  c->checkpoint.keep = 3;
}

#ifdef __cplusplus
}
#endif
#endif
