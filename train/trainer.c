/* The single-cluster training loop of train/trainer.h: data split and batches, steps, per-source
 * evaluation, checkpoints with bit-exact resume. Single process, CPU; ranks, collectives and the
 * WAN come from the caller through the grad hook and the synced buffer. */
#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "train/checkpoint.h"
#include "train/rng.h"
#include "train/translate.h" /* target-language tags */

typedef struct {
  size_t s, sl, t, tl; /* source and target byte ranges inside the text buffer */
} nb__pair_t;

typedef struct {
  uint8_t* train;
  size_t train_len;
  uint8_t* held;
  size_t held_len;
  nb__pair_t* train_pairs; /* pairs only */
  size_t n_train_pairs;
  nb__pair_t* held_pairs;
  size_t n_held_pairs;
  char tag[NB_TRANSLATE_TAG_MAX + 1]; /* pairs only: "<2xx>" of the target language */
  size_t tag_len;
} nb__source_t;

struct nb_trainer {
  nb_train_config_t cfg;
  int T;
  nb__source_t src[NB_TRAIN_MAX_SOURCES];
  nb_model_t* model;
  nb_model_t* teacher;
  nb_lora_t* lora;
  nb_adamw_t* opt;
  float* params; /* trainable buffer (model params or adapters) */
  float* grads;
  size_t n_train;
  int* tokens; /* (B, T) */
  int* targets;
  long step;
  uint64_t samples, tokens_total, run_tokens;
  double compute_s;
  double started_s;
};

void nb_train_config_defaults(nb_train_config_t* c) {
  memset(c, 0, sizeof *c);
  c->model = nb_model_config_make(4, 256, 4, 256);
  c->seed = 1;
  c->batch_size = 8;
  c->micro_batches = 1;
  c->seq_len = 0;
  c->max_steps = 1000;
  c->optim = nb_adamw_config_default();
  c->optim.lr = 6e-4f;
  c->optim.warmup_steps = 50;
  c->optim.total_steps = 1000;
  c->lora.rank = 8;
  c->lora.alpha = 16.0f;
  c->lora.sites = (1u << NB_SITE_QKV) | (1u << NB_SITE_ATTN_PROJ);
  c->distill_alpha = 0.5f;
  c->distill_temp = 2.0f;
  c->data_kind = NB_TRAIN_DATA_MONO;
  c->heldout_permille = 10;
  c->slowdown = 1.0;
  c->eval_every = 100;
  c->eval_batches = 4;
  c->checkpoint_keep = 3;
}

#define NB__CFGERR(...) nb_error(NB_ERR_CONFIG, "train config: " __VA_ARGS__)

nb_status_t nb_train_config_check(const nb_train_config_t* c) {
  if (!c) return nb_error(NB_ERR_INVALID, "train config: NULL");
  nb_status_t st = nb_model_config_check(&c->model);
  if (st != NB_OK) return nb_error(NB_ERR_CONFIG, "train config: model: %s", nb_error_last());
  if (c->batch_size < 1) return NB__CFGERR("batch_size must be >= 1, got %d", c->batch_size);
  if (c->micro_batches < 1)
    return NB__CFGERR("micro_batches must be >= 1, got %d", c->micro_batches);
  if (c->seq_len < 0 || c->seq_len > c->model.ctx)
    return NB__CFGERR("seq_len must be in [0, ctx = %d], got %d", c->model.ctx, c->seq_len);
  if (c->seq_len == 1 || (c->seq_len == 0 && c->model.ctx < 2))
    return NB__CFGERR("sequences must be at least 2 bytes long");
  if (c->max_steps < 1) return NB__CFGERR("max_steps must be >= 1, got %ld", c->max_steps);
  if (!(c->max_seconds >= 0)) return NB__CFGERR("max_seconds must be >= 0");
  if (!(c->optim.lr > 0) || !isfinite(c->optim.lr))
    return NB__CFGERR("optimizer lr must be > 0, got %g", (double)c->optim.lr);
  if (c->optim.warmup_steps < 0) return NB__CFGERR("warmup_steps must be >= 0");
  if (c->n_sources < 1 || c->n_sources > NB_TRAIN_MAX_SOURCES)
    return NB__CFGERR("n_sources must be in [1, %d], got %d", NB_TRAIN_MAX_SOURCES, c->n_sources);
  if (c->data_kind != NB_TRAIN_DATA_MONO && c->data_kind != NB_TRAIN_DATA_PAIRS)
    return NB__CFGERR("data_kind must be mono or pairs");
  for (int i = 0; i < c->n_sources; i++) {
    const nb_train_source_t* s = &c->sources[i];
    if (!memchr(s->label, 0, sizeof s->label) || !s->label[0])
      return NB__CFGERR("sources[%d].label is empty or not terminated", i);
    if (!memchr(s->path, 0, sizeof s->path) || !s->path[0])
      return NB__CFGERR("sources[%d] (%s): path is empty", i, s->label);
    if (!memchr(s->dev_path, 0, sizeof s->dev_path))
      return NB__CFGERR("sources[%d].dev_path is not terminated", i);
    for (int j = 0; j < i; j++)
      if (strcmp(c->sources[j].label, s->label) == 0)
        return NB__CFGERR("sources[%d]: label \"%s\" repeats sources[%d]", i, s->label, j);
  }
  if (c->heldout_permille < 1 || c->heldout_permille > 500)
    return NB__CFGERR("heldout_permille must be in [1, 500], got %d", c->heldout_permille);
  if (!(c->slowdown >= 1.0) || !isfinite(c->slowdown))
    return NB__CFGERR("slowdown must be a number >= 1, got %g", c->slowdown);
  if (c->eval_every < 0) return NB__CFGERR("eval_every must be >= 0");
  if (c->eval_batches < 1) return NB__CFGERR("eval_batches must be >= 1, got %d", c->eval_batches);
  if (c->checkpoint_every < 0) return NB__CFGERR("checkpoint_every must be >= 0");
  if (c->checkpoint_keep < 0) return NB__CFGERR("checkpoint_keep must be >= 0");
  if (!memchr(c->checkpoint_dir, 0, sizeof c->checkpoint_dir) ||
      !memchr(c->init_checkpoint, 0, sizeof c->init_checkpoint) ||
      !memchr(c->teacher_checkpoint, 0, sizeof c->teacher_checkpoint))
    return NB__CFGERR("a checkpoint path is not terminated");
  if (c->resume && !c->checkpoint_dir[0]) return NB__CFGERR("resume needs a checkpoint_dir");
  if (c->lora_enabled) {
    if (c->lora.rank < 1) return NB__CFGERR("lora rank must be >= 1, got %d", c->lora.rank);
    if (!(c->lora.alpha > 0)) return NB__CFGERR("lora alpha must be > 0");
    if (c->lora.sites == 0 || c->lora.sites >= (1u << NB_SITE_COUNT))
      return NB__CFGERR("lora sites must be a non-empty mask of the %d projections", NB_SITE_COUNT);
  }
  if (c->tp.size < 0 || c->tp.size > 1024)
    return NB__CFGERR("tp.size must be in [0, 1024], got %d", c->tp.size);
  if (c->tp.size > 1) {
    if (c->tp.rank < 0 || c->tp.rank >= c->tp.size)
      return NB__CFGERR("tp.rank must be in [0, %d), got %d", c->tp.size, c->tp.rank);
    if (!c->tp.allreduce) return NB__CFGERR("tp.allreduce is NULL");
    if (c->model.n_head % c->tp.size != 0)
      return NB__CFGERR("tensor parallelism over %d ranks needs n_head divisible by it, got %d",
                        c->tp.size, c->model.n_head);
    if (c->lora_enabled || c->teacher_checkpoint[0])
      return NB__CFGERR(
          "tensor parallelism works on the whole model: not with LoRA or "
          "distillation");
  }
  if (c->pp.stages < 0 || c->pp.stages > 256)
    return NB__CFGERR("pp.stages must be in [0, 256], got %d", c->pp.stages);
  if (c->pp.stages > 1) {
    if (c->pp.stage < 0 || c->pp.stage >= c->pp.stages)
      return NB__CFGERR("pp.stage must be in [0, %d), got %d", c->pp.stages, c->pp.stage);
    if (!c->pp.allreduce || !c->pipe.sendrecv || !c->pipe.allreduce)
      return NB__CFGERR("pp.allreduce, pipe.sendrecv and pipe.allreduce are required");
    if (c->model.n_layer % c->pp.stages != 0)
      return NB__CFGERR("%d pipeline stages need n_layer divisible by them, got %d", c->pp.stages,
                        c->model.n_layer);
    if (c->lora_enabled || c->teacher_checkpoint[0])
      return NB__CFGERR(
          "pipeline parallelism works on the whole model: not with LoRA or "
          "distillation");
  }
  if (c->teacher_checkpoint[0]) {
    if (!(c->distill_alpha >= 0 && c->distill_alpha <= 1))
      return NB__CFGERR("distill_alpha must be in [0, 1], got %g", (double)c->distill_alpha);
    if (!(c->distill_temp > 0)) return NB__CFGERR("distill_temp must be > 0");
  }
  return NB_OK;
}

int nb_train_is_heldout(const void* seg, size_t len, int permille) {
  return (int)(nb_xxh3_64(seg, len, NB_TRAIN_HOLDOUT_SEED) % 1000u) < permille;
}

/* ---- data ---------------------------------------------------------------------------------- */

static nb_status_t nb__read_file(const char* path, uint8_t** out, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return nb_error(NB_ERR_IO, "cannot open data file %s: %s", path, strerror(errno));
  uint8_t* buf = NULL;
  size_t cap = 0, n = 0;
  nb_status_t st = NB_OK;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : (1u << 20);
      if ((st = nb_realloc((void**)&buf, cap, 1, "data file")) != NB_OK) break;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  if (st == NB_OK && ferror(f)) st = nb_error(NB_ERR_IO, "cannot read data file %s", path);
  fclose(f);
  if (st != NB_OK) {
    nb_free(buf);
    return st;
  }
  *out = buf;
  *len = n;
  return NB_OK;
}

/* Calls fn for every non-empty line of text (without a '\r' at its end). */
#define NB__FOR_LINES(text, len, body)                               \
  do {                                                               \
    size_t i_ = 0;                                                   \
    while (i_ < (len)) {                                             \
      const uint8_t* nl_ = memchr((text) + i_, '\n', (len)-i_);      \
      size_t e_ = nl_ ? (size_t)(nl_ - (text)) : (len), n = e_ - i_; \
      const uint8_t* line = (text) + i_;                             \
      if (n > 0 && line[n - 1] == '\r') n--;                         \
      if (n > 0) body;                                               \
      i_ = e_ + 1;                                                   \
    }                                                                \
  } while (0)

/* The hash of the segment the fallback holds out when the rate selects none: the smallest. */
static uint64_t nb__fallback_hash(const uint8_t* text, size_t len, int permille) {
  uint64_t best = UINT64_MAX;
  int any = 0;
  NB__FOR_LINES(text, len, {
    uint64_t h = nb_xxh3_64(line, n, NB_TRAIN_HOLDOUT_SEED);
    if ((int)(h % 1000u) < permille) any = 1;
    if (h < best) best = h;
  });
  return any ? UINT64_MAX : best;
}

/* Appends every non-empty line of text to train or held (all_train / all_held force the side;
 * otherwise the held-out rule, or the fallback segment whose hash is `fallback`). */
static void nb__split_lines(const uint8_t* text, size_t len, int permille, int all_train,
                            int all_held, uint64_t fallback, uint8_t* train, size_t* tl,
                            uint8_t* held, size_t* hl) {
  NB__FOR_LINES(text, len, {
    int h = all_held;
    if (!all_train && !all_held) {
      uint64_t x = nb_xxh3_64(line, n, NB_TRAIN_HOLDOUT_SEED);
      h = (int)(x % 1000u) < permille || x == fallback;
    }
    uint8_t* dst = h ? held : train;
    size_t* dl = h ? hl : tl;
    memcpy(dst + *dl, line, n);
    dst[*dl + n] = '\n';
    *dl += n + 1;
  });
}

static nb_status_t nb__index_pairs(const uint8_t* text, size_t len, int swap, nb__pair_t** out,
                                   size_t* n_out) {
  size_t n = 0, cap = 0, i = 0;
  nb__pair_t* v = NULL;
  while (i < len) {
    const uint8_t* nl = memchr(text + i, '\n', len - i);
    size_t e = nl ? (size_t)(nl - text) : len;
    const uint8_t* tab = memchr(text + i, '\t', e - i);
    if (tab) {
      size_t t0 = (size_t)(tab - text) + 1;
      const uint8_t* tab2 = memchr(text + t0, '\t', e - t0);
      size_t t1 = tab2 ? (size_t)(tab2 - text) : e;
      if (n == cap) {
        cap = cap ? 2 * cap : 1024;
        nb_status_t st = nb_realloc((void**)&v, cap, sizeof *v, "pair index");
        if (st != NB_OK) {
          nb_free(v);
          return st;
        }
      }
      nb__pair_t p = {i, (size_t)(tab - text) - i, t0, t1 - t0};
      if (swap) p = (nb__pair_t){p.t, p.tl, p.s, p.sl};
      if (p.sl > 0 && p.tl > 0) v[n++] = p;
    }
    i = e + 1;
  }
  *out = v;
  *n_out = n;
  return NB_OK;
}

static nb_status_t nb__load_source(const nb_train_config_t* c, int idx, nb__source_t* s) {
  const nb_train_source_t* cs = &c->sources[idx];
  int pairs = c->data_kind == NB_TRAIN_DATA_PAIRS;
  int has_dev = pairs && cs->dev_path[0];
  uint8_t *raw = NULL, *dev = NULL;
  size_t raw_len = 0, dev_len = 0;
  nb_status_t st = nb__read_file(cs->path, &raw, &raw_len);
  if (st == NB_OK && has_dev) st = nb__read_file(cs->dev_path, &dev, &dev_len);
  /* One more byte per line at most ('\n' added to a last line without one). */
  if (st == NB_OK) st = nb_alloc((void**)&s->train, raw_len + 1, 1, "training text");
  if (st == NB_OK) st = nb_alloc((void**)&s->held, raw_len + dev_len + 2, 1, "held-out text");
  if (st == NB_OK) {
    uint64_t fb = has_dev ? UINT64_MAX : nb__fallback_hash(raw, raw_len, c->heldout_permille);
    nb__split_lines(raw, raw_len, c->heldout_permille, has_dev, 0, fb, s->train, &s->train_len,
                    s->held, &s->held_len);
    if (has_dev)
      nb__split_lines(dev, dev_len, c->heldout_permille, 0, 1, UINT64_MAX, s->train, &s->train_len,
                      s->held, &s->held_len);
  }
  nb_free(raw);
  nb_free(dev);
  if (st == NB_OK && pairs) {
    st = nb__index_pairs(s->train, s->train_len, cs->swap, &s->train_pairs, &s->n_train_pairs);
    if (st == NB_OK)
      st = nb__index_pairs(s->held, s->held_len, cs->swap, &s->held_pairs, &s->n_held_pairs);
    if (st == NB_OK && (s->n_train_pairs == 0 || s->n_held_pairs == 0))
      st = nb_error(NB_ERR_INVALID,
                    "source %s (%s): %zu training and %zu held-out pairs (\"source<TAB>target\" "
                    "lines); both must be non-empty",
                    cs->label, cs->path, s->n_train_pairs, s->n_held_pairs);
    char tgt[NB_TRANSLATE_LANG_MAX + 1];
    if (st == NB_OK) st = nb_translate_pair_target(cs->label, tgt, sizeof tgt);
    if (st == NB_OK) st = nb_translate_tag(tgt, s->tag, sizeof s->tag);
    if (st == NB_OK) s->tag_len = strlen(s->tag);
  } else if (st == NB_OK && (s->train_len < 2 || s->held_len < 2)) {
    st = nb_error(NB_ERR_INVALID,
                  "source %s (%s): %zu training and %zu held-out bytes; both need a segment (the "
                  "file needs more lines, or a larger heldout_permille)",
                  cs->label, cs->path, s->train_len, s->held_len);
  }
  return st;
}

static void nb__free_source(nb__source_t* s) {
  nb_free(s->train);
  nb_free(s->held);
  nb_free(s->train_pairs);
  nb_free(s->held_pairs);
  memset(s, 0, sizeof *s);
}

/* Element k of the sequence "<2tgt> source SEP target EOS" of pair p of source s (the tag and
 * the prefix up to SEP are those of nb_translate_prompt, byte for byte, when not truncated). */
static int nb__pair_el(const nb__source_t* s, const uint8_t* text, const nb__pair_t* p, size_t k) {
  if (k < s->tag_len) return (unsigned char)s->tag[k];
  k -= s->tag_len;
  if (k < p->sl) return text[p->s + k];
  if (k == p->sl) return NB_TOKEN_SEP;
  if (k < p->sl + 1 + p->tl) return text[p->t + k - p->sl - 1];
  return NB_TOKEN_EOS;
}

/* One pair sequence "<2tgt> source SEP target EOS" into row (T tokens / targets): targets are
 * scored only for the target bytes and EOS. Returns the number of scored positions. */
static int nb__pair_row(const nb__source_t* s, const uint8_t* text, const nb__pair_t* p, int T,
                        int* tok, int* tgt) {
  size_t L = s->tag_len + p->sl + p->tl + 2; /* tag, source, SEP, target, EOS */
  size_t sep = s->tag_len + p->sl;
  int scored = 0;
  for (int j = 0; j < T; j++) {
    size_t k = (size_t)j;
    tok[j] = k < L ? nb__pair_el(s, text, p, k) : NB_TOKEN_PAD;
    tgt[j] = (k + 1 < L && k >= sep) ? nb__pair_el(s, text, p, k + 1) : -1;
    if (tgt[j] >= 0) scored++;
  }
  return scored;
}

static uint64_t nb__batch_key(const nb_trainer_t* t, long step, int micro, int row) {
  uint64_t k[4] = {(uint64_t)t->cfg.data_rank, (uint64_t)step, (uint64_t)micro, (uint64_t)row};
  return nb_xxh3_64(k, sizeof k, t->cfg.seed);
}

/* Returns the number of scored targets. */
static long nb__fill_batch(nb_trainer_t* t, long step, int micro, int* tokens, int* targets) {
  const int B = t->cfg.batch_size, T = t->T;
  long scored = 0;
  for (int r = 0; r < B; r++) {
    nb_rng_t rng;
    nb_rng_seed(&rng, nb__batch_key(t, step, micro, r));
    const nb__source_t* s = &t->src[nb_rng_below(&rng, (uint64_t)t->cfg.n_sources)];
    int* tok = tokens + (size_t)r * T;
    int* tgt = targets + (size_t)r * T;
    if (t->cfg.data_kind == NB_TRAIN_DATA_PAIRS) {
      const nb__pair_t* p = &s->train_pairs[nb_rng_below(&rng, s->n_train_pairs)];
      scored += nb__pair_row(s, s->train, p, T, tok, tgt);
      continue;
    }
    size_t start = s->train_len > (size_t)T + 1 ? nb_rng_below(&rng, s->train_len - T) : 0;
    for (int j = 0; j < T; j++) {
      size_t k = start + (size_t)j;
      tok[j] = k < s->train_len ? s->train[k] : NB_TOKEN_PAD;
      tgt[j] = k + 1 < s->train_len ? s->train[k + 1] : -1;
      if (tgt[j] >= 0) scored++;
    }
  }
  return scored;
}

void nb_trainer_batch(nb_trainer_t* t, long step, int micro, int* tokens, int* targets) {
  (void)nb__fill_batch(t, step, micro, tokens, targets);
}

const uint8_t* nb_trainer_train_text(const nb_trainer_t* t, int i, size_t* len) {
  if (i < 0 || i >= t->cfg.n_sources) return NULL;
  *len = t->src[i].train_len;
  return t->src[i].train;
}

const uint8_t* nb_trainer_heldout_text(const nb_trainer_t* t, int i, size_t* len) {
  if (i < 0 || i >= t->cfg.n_sources) return NULL;
  *len = t->src[i].held_len;
  return t->src[i].held;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

static nb_status_t nb__mkdir_p(const char* path) {
  char tmp[NB_TRAIN_PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
    return nb_error(NB_ERR_INVALID, "path too long: %s", path);
  for (char* p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return nb_error(NB_ERR_IO, "mkdir %s: %s", tmp, strerror(errno));
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
    return nb_error(NB_ERR_IO, "mkdir %s: %s", tmp, strerror(errno));
  return NB_OK;
}

static nb_status_t nb__write_atomic(const char* dir, const char* name, const char* text) {
  char path[NB_TRAIN_PATH_MAX + 64], tmp[NB_TRAIN_PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%d", dir, name, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return nb_error(NB_ERR_IO, "open %s: %s", tmp, strerror(errno));
  size_t n = strlen(text);
  ssize_t w = write(fd, text, n);
  if (w != (ssize_t)n || fsync(fd) != 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return nb_error(NB_ERR_IO, "write %s: %s", tmp, strerror(e));
  }
  close(fd);
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return nb_error(NB_ERR_IO, "rename %s: %s", path, strerror(e));
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return NB_OK;
}

static void nb__remove_step_dir(const char* dir, const char* name) {
  char p[NB_TRAIN_PATH_MAX + 128];
  static const char* files[] = {"model.safetensors", "lora.safetensors", "optim.safetensors"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(p, sizeof p, "%s/%s/%s", dir, name, files[i]);
    (void)unlink(p);
  }
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (rmdir(p) != 0) NB_WARN("checkpoint: cannot remove %s: %s", p, strerror(errno));
}

static int nb__cmp_long(const void* a, const void* b) {
  long x = *(const long*)a, y = *(const long*)b;
  return (x > y) - (x < y);
}

/* Keeps the newest `keep` step folders. */
static void nb__prune(const char* dir, int keep) {
  if (keep <= 0) return;
  DIR* d = opendir(dir);
  if (!d) return;
  long steps[4096];
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) && n < 4096) {
    char* end;
    if (strncmp(e->d_name, "step-", 5) != 0) continue;
    long s = strtol(e->d_name + 5, &end, 10);
    if (*end == 0 && end != e->d_name + 5) steps[n++] = s;
  }
  closedir(d);
  qsort(steps, (size_t)n, sizeof steps[0], nb__cmp_long);
  for (int i = 0; i + keep < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "step-%ld", steps[i]);
    nb__remove_step_dir(dir, name);
  }
}

/* 1 when the model is a shard or a stage of a model-parallel group (the replica: its tensor-
 * parallel shards times its pipeline's stages, nb_model_group_*). */
static int nb__tp_on(const nb_trainer_t* t) {
  return t->cfg.tp.size > 1 || t->cfg.pp.stages > 1;
}

/* Under tensor parallelism: every rank of the group learns whether any failed (a rank that
 * failed keeps its own error). */
static nb_status_t nb__tp_agree(nb_trainer_t* t, nb_status_t st, const char* what) {
  if (!nb__tp_on(t)) return st;
  float bad = st != NB_OK ? 1.0f : 0.0f;
  nb_status_t a = nb_model_group_sum(t->model, &bad, 1);
  if (st != NB_OK) return st;
  if (a != NB_OK) return a;
  if (bad > 0)
    return nb_error(NB_ERR_IO, "trainer: %s failed on another rank of the model-parallel group",
                    what);
  return NB_OK;
}

/* The logical model of a sharded one (parameters gathered from the group; collective), for
 * checkpoints: *out is NULL on the ranks other than 0, which only take part in the gathers. */
static nb_status_t nb__tp_logical_model(nb_trainer_t* t, float* buf, nb_model_t** out) {
  *out = NULL;
  NB_CHECK(nb_model_tp_gather(t->model, t->params, buf));
  if (nb_model_group_rank(t->model) != 0) return NB_OK;
  NB_CHECK(nb_model_create(&t->cfg.model, t->cfg.seed, out));
  size_t n;
  memcpy(nb_model_params(*out, &n), buf, nb_model_num_logical_params(t->model) * sizeof(float));
  return NB_OK;
}

static nb_status_t nb__checkpoint(nb_trainer_t* t, const float* m, const float* v, size_t n_m,
                                  const nb_model_t* model);

nb_status_t nb_trainer_checkpoint(nb_trainer_t* t) {
  if (!t->cfg.checkpoint_dir[0]) return nb_error(NB_ERR_CONFIG, "trainer: no checkpoint_dir set");
  size_t nf;
  const float* st = nb_adamw_state(t->opt, &nf);
  if (!nb__tp_on(t)) return nb__checkpoint(t, st, st + t->n_train, t->n_train, t->model);
  /* the logical layout: parameters and both moments gathered (every rank takes part) */
  size_t nl = nb_model_num_logical_params(t->model);
  float* buf = NULL;
  nb_model_t* lm = NULL;
  nb_status_t s = nb_alloc((void**)&buf, 3 * nl, sizeof(float), "checkpoint gather");
  if (s == NB_OK) s = nb__tp_logical_model(t, buf, &lm);
  if (s == NB_OK) s = nb_model_tp_gather(t->model, st, buf + nl);
  if (s == NB_OK) s = nb_model_tp_gather(t->model, st + t->n_train, buf + 2 * nl);
  if (s == NB_OK && lm) s = nb__checkpoint(t, buf + nl, buf + 2 * nl, nl, lm);
  nb_model_destroy(lm);
  nb_free(buf);
  return nb__tp_agree(t, s, "the checkpoint");
}

static nb_status_t nb__checkpoint(nb_trainer_t* t, const float* m, const float* v, size_t n_m,
                                  const nb_model_t* model) {
  const char* dir = t->cfg.checkpoint_dir;
  char sdir[NB_TRAIN_PATH_MAX + 64], path[NB_TRAIN_PATH_MAX + 128], name[64];
  snprintf(name, sizeof name, "step-%ld", t->step);
  snprintf(sdir, sizeof sdir, "%s/%s", dir, name);
  NB_CHECK(nb__mkdir_p(sdir));
  if (t->lora) {
    snprintf(path, sizeof path, "%s/lora.safetensors", sdir);
    NB_CHECK(nb_checkpoint_save_lora(path, t->lora, t->step));
  } else {
    snprintf(path, sizeof path, "%s/model.safetensors", sdir);
    NB_CHECK(nb_checkpoint_save(path, model, t->step));
  }
  nb_ckpt_tensor_t ten[2] = {{"adam.m", 1, {(int64_t)n_m}, m}, {"adam.v", 1, {(int64_t)n_m}, v}};
  char step_s[32], samples_s[32], tokens_s[32], seed_s[32], rank_s[32], lora_s[8];
  snprintf(step_s, sizeof step_s, "%ld", t->step);
  snprintf(samples_s, sizeof samples_s, "%llu", (unsigned long long)t->samples);
  snprintf(tokens_s, sizeof tokens_s, "%llu", (unsigned long long)t->tokens_total);
  snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)t->cfg.seed);
  snprintf(rank_s, sizeof rank_s, "%d", t->cfg.data_rank);
  snprintf(lora_s, sizeof lora_s, "%d", t->lora ? 1 : 0);
  char as[32];
  snprintf(as, sizeof as, "%ld", nb_adamw_steps(t->opt));
  const char* meta[] = {"step",   step_s, "adam_steps", as,          "samples", samples_s, "tokens",
                        tokens_s, "seed", seed_s,       "data_rank", rank_s,    "lora",    lora_s};
  snprintf(path, sizeof path, "%s/optim.safetensors", sdir);
  NB_CHECK(nb_checkpoint_write(path, ten, 2, meta, sizeof meta / sizeof meta[0] / 2));
  char latest[80];
  snprintf(latest, sizeof latest, "%s\n", name);
  NB_CHECK(nb__write_atomic(dir, "LATEST", latest));
  nb__prune(dir, t->cfg.checkpoint_keep);
  return NB_OK;
}

static nb_status_t nb__meta_u64(const nb_ckpt_t* c, const char* path, const char* key,
                                uint64_t* out) {
  const char* v = nb_checkpoint_meta(c, key);
  char* end;
  if (!v) return nb_error(NB_ERR_INVALID, "%s: metadata \"%s\" missing", path, key);
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || end == v)
    return nb_error(NB_ERR_INVALID, "%s: metadata \"%s\" = \"%s\" is not a number", path, key, v);
  *out = x;
  return NB_OK;
}

/* Restores the newest checkpoint if LATEST exists. */
static nb_status_t nb__resume(nb_trainer_t* t) {
  const char* dir = t->cfg.checkpoint_dir;
  char path[NB_TRAIN_PATH_MAX + 128], name[80] = {0};
  snprintf(path, sizeof path, "%s/LATEST", dir);
  FILE* f = fopen(path, "r");
  if (!f) {
    if (errno == ENOENT) return NB_OK; /* nothing to resume: a fresh start */
    return nb_error(NB_ERR_IO, "cannot read %s: %s", path, strerror(errno));
  }
  if (!fgets(name, sizeof name, f)) name[0] = 0;
  fclose(f);
  name[strcspn(name, "\r\n")] = 0;
  if (strncmp(name, "step-", 5) != 0 || strchr(name, '/'))
    return nb_error(NB_ERR_INVALID, "%s: expected \"step-<N>\", found \"%s\"", path, name);

  long step = 0;
  if (t->lora) {
    snprintf(path, sizeof path, "%s/%s/lora.safetensors", dir, name);
    NB_CHECK(nb_checkpoint_load_lora_into(path, t->lora, &step));
  } else if (nb__tp_on(t)) { /* the logical model, then this rank's shard of it */
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, name);
    nb_model_t* lm = NULL;
    nb_status_t s = nb_model_create(&t->cfg.model, t->cfg.seed, &lm);
    if (s == NB_OK) s = nb_checkpoint_load_into(path, lm, &step);
    if (s == NB_OK) nb_model_tp_scatter(t->model, nb_model_params(lm, NULL), t->params);
    nb_model_destroy(lm);
    NB_CHECK(s);
  } else {
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, name);
    NB_CHECK(nb_checkpoint_load_into(path, t->model, &step));
  }
  snprintf(path, sizeof path, "%s/%s/optim.safetensors", dir, name);
  nb_ckpt_t* c = NULL;
  NB_CHECK(nb_checkpoint_open(path, &c));
  nb_status_t st = NB_OK;
  uint64_t ostep = 0, asteps = 0, samples = 0, tokens = 0, seed = 0, rank = 0, lora = 0;
  if ((st = nb__meta_u64(c, path, "step", &ostep)) != NB_OK ||
      (st = nb__meta_u64(c, path, "adam_steps", &asteps)) != NB_OK ||
      (st = nb__meta_u64(c, path, "samples", &samples)) != NB_OK ||
      (st = nb__meta_u64(c, path, "tokens", &tokens)) != NB_OK ||
      (st = nb__meta_u64(c, path, "seed", &seed)) != NB_OK ||
      (st = nb__meta_u64(c, path, "data_rank", &rank)) != NB_OK ||
      (st = nb__meta_u64(c, path, "lora", &lora)) != NB_OK)
    goto done;
  if ((long)ostep != step) {
    st = nb_error(NB_ERR_INVALID, "%s: step %llu does not match the parameters' step %ld", path,
                  (unsigned long long)ostep, step);
    goto done;
  }
  if (seed != t->cfg.seed || (int)rank != t->cfg.data_rank || (int)lora != (t->lora != NULL)) {
    st =
        nb_error(NB_ERR_CONFIG,
                 "%s: written by a run with seed %llu, data_rank %llu, lora %llu; this run has "
                 "seed %llu, data_rank %d, lora %d",
                 path, (unsigned long long)seed, (unsigned long long)rank, (unsigned long long)lora,
                 (unsigned long long)t->cfg.seed, t->cfg.data_rank, t->lora != NULL);
    goto done;
  }
  if (nb_checkpoint_num_tensors(c) != 2) {
    st = nb_error(NB_ERR_INVALID, "%s: expected tensors adam.m and adam.v", path);
    goto done;
  }
  size_t nf;
  float* state = nb_adamw_state(t->opt, &nf);
  size_t n_m = nb__tp_on(t) ? nb_model_num_logical_params(t->model) : t->n_train;
  for (size_t i = 0; i < 2; i++) {
    const char* nm;
    int nd;
    int64_t shape[4];
    const void* data;
    size_t nbytes;
    if ((st = nb_checkpoint_tensor(c, i, &nm, &nd, shape, &data, &nbytes)) != NB_OK) goto done;
    int which = strcmp(nm, "adam.m") == 0 ? 0 : strcmp(nm, "adam.v") == 0 ? 1 : -1;
    if (which < 0 || nd != 1 || (size_t)shape[0] != n_m) {
      st = nb_error(NB_ERR_INVALID, "%s: tensor %s: expected adam.m / adam.v of shape [%zu]", path,
                    nm, n_m);
      goto done;
    }
    if (nb__tp_on(t)) { /* the logical moments (copied: the file's may be unaligned): a shard */
      float* lg = NULL;
      if ((st = nb_alloc((void**)&lg, n_m, sizeof(float), "moments")) != NB_OK) goto done;
      memcpy(lg, data, nbytes);
      nb_model_tp_scatter(t->model, lg, state + (size_t)which * t->n_train);
      nb_free(lg);
    } else {
      memcpy(state + (size_t)which * t->n_train, data, nbytes);
    }
  }
  nb_adamw_set_steps(t->opt, (long)asteps);
  t->step = step;
  t->samples = samples;
  t->tokens_total = tokens;
  NB_INFO(TRAIN, "resumed from %s/%s at step %ld", dir, name, step);
done:
  nb_checkpoint_close(c);
  return st;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

nb_status_t nb_trainer_create(const nb_train_config_t* cfg, nb_trainer_t** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "trainer: NULL out");
  NB_CHECK(nb_train_config_check(cfg));
  nb_trainer_t* t = NULL;
  NB_CHECK(nb_calloc((void**)&t, 1, sizeof *t, "trainer"));
  t->cfg = *cfg;
  t->T = cfg->seq_len ? cfg->seq_len : cfg->model.ctx;
  nb_status_t st = NB_OK;
  for (int i = 0; i < cfg->n_sources && st == NB_OK; i++) st = nb__load_source(cfg, i, &t->src[i]);
  if (st != NB_OK) goto fail;

  const nb_model_tp_t* tp = cfg->tp.size > 1 ? &cfg->tp : NULL;
  const nb_model_pp_t* pp = cfg->pp.stages > 1 ? &cfg->pp : NULL;
  if (cfg->init_checkpoint[0]) {
    long s0;
    nb_model_t* lm = NULL; /* the logical model; the shard is taken from it under TP */
    st = nb_checkpoint_load(cfg->init_checkpoint, &lm, &s0);
    if (st == NB_OK) {
      const nb_model_config_t* mc = nb_model_get_config(lm);
      if (memcmp(mc, &cfg->model, sizeof *mc) != 0)
        st = nb_error(NB_ERR_CONFIG,
                      "train config: model (%d layers, width %d, %d heads, ctx %d) does not "
                      "match the checkpoint %s (%d, %d, %d, %d)",
                      cfg->model.n_layer, cfg->model.n_embd, cfg->model.n_head, cfg->model.ctx,
                      cfg->init_checkpoint, mc->n_layer, mc->n_embd, mc->n_head, mc->ctx);
    }
    if (st == NB_OK && (tp || pp)) {
      st = nb_model_create_mp(&cfg->model, cfg->seed, tp, pp, &t->model);
      if (st == NB_OK)
        nb_model_tp_scatter(t->model, nb_model_params(lm, NULL), nb_model_params(t->model, NULL));
      nb_model_destroy(lm);
    } else {
      t->model = lm;
    }
  } else {
    st = nb_model_create_mp(&cfg->model, cfg->seed, tp, pp, &t->model);
  }
  if (st != NB_OK) goto fail;
  if (cfg->teacher_checkpoint[0]) {
    st = nb_checkpoint_load(cfg->teacher_checkpoint, &t->teacher, NULL);
    if (st == NB_OK && nb_model_get_config(t->teacher)->ctx < t->T)
      st = nb_error(NB_ERR_CONFIG, "teacher %s: context %d is shorter than the sequences (%d)",
                    cfg->teacher_checkpoint, nb_model_get_config(t->teacher)->ctx, t->T);
    if (st != NB_OK) goto fail;
  }
  if (cfg->lora_enabled) {
    if ((st = nb_lora_create(t->model, &cfg->lora, cfg->seed ^ 0x4c6f5241ull, &t->lora)) != NB_OK)
      goto fail;
    t->params = nb_lora_params(t->lora, &t->n_train);
    t->grads = nb_lora_grads(t->lora, NULL);
  } else {
    t->params = nb_model_params(t->model, &t->n_train);
    t->grads = nb_model_grads(t->model, NULL);
  }
  nb_adamw_config_t oc = cfg->optim;
  if (oc.total_steps <= 0) oc.total_steps = cfg->max_steps;
  if ((st = nb_adamw_create(&oc, t->n_train, &t->opt)) != NB_OK) {
    st = nb_error(NB_ERR_CONFIG, "train config: optimizer: %s", nb_error_last());
    goto fail;
  }
  /* a pipeline takes a step's micro-batches at once */
  size_t bt = (size_t)cfg->batch_size * (size_t)t->T * (size_t)(pp ? cfg->micro_batches : 1);
  if ((st = nb_alloc((void**)&t->tokens, bt, sizeof(int), "batch")) != NB_OK ||
      (st = nb_alloc((void**)&t->targets, bt, sizeof(int), "batch")) != NB_OK)
    goto fail;
  if (cfg->resume && (st = nb__tp_agree(t, nb__resume(t), "the resume")) != NB_OK) goto fail;
  t->started_s = nb_now_s();
  *out = t;
  return NB_OK;
fail:
  nb_trainer_destroy(t);
  return st;
}

void nb_trainer_destroy(nb_trainer_t* t) {
  if (!t) return;
  for (int i = 0; i < NB_TRAIN_MAX_SOURCES; i++) nb__free_source(&t->src[i]);
  nb_lora_destroy(t->lora);
  nb_model_destroy(t->model);
  nb_model_destroy(t->teacher);
  nb_adamw_destroy(t->opt);
  nb_free(t->tokens);
  nb_free(t->targets);
  nb_free(t);
}

/* ---- steps, evaluation, the run -------------------------------------------------------------- */

static nb_status_t nb__one_step(nb_trainer_t* t, double* loss_out, double* gn_out) {
  const nb_train_config_t* c = &t->cfg;
  const int B = c->batch_size, T = t->T, M = c->micro_batches;
  double t0 = nb_now_s(), loss_sum = 0;
  if (t->lora)
    nb_lora_zero_grad(t->lora);
  else
    nb_model_zero_grad(t->model);
  long scored = 0;
  if (c->pp.stages > 1) { /* the step's micro-batches through the stages, 1F1B */
    size_t bt = (size_t)B * (size_t)T;
    for (int mb = 0; mb < M; mb++)
      scored += nb__fill_batch(t, t->step, mb, t->tokens + mb * bt, t->targets + mb * bt);
    double l = 0;
    NB_CHECK(nb_pipeline_step(t->model, &c->pipe, t->tokens, t->targets, M, B, T, &l));
    loss_sum = l * M;
  }
  for (int mb = 0; mb < M && c->pp.stages <= 1; mb++) {
    scored += nb__fill_batch(t, t->step, mb, t->tokens, t->targets);
    float loss = 0;
    if (t->teacher) {
      NB_CHECK(nb_model_forward(t->teacher, t->tokens, NULL, B, T, NULL));
      NB_CHECK(nb_model_forward_distill(t->model, t->tokens, t->targets,
                                        nb_model_logits(t->teacher), c->distill_alpha,
                                        c->distill_temp, B, T, &loss));
    } else {
      NB_CHECK(nb_model_forward(t->model, t->tokens, t->targets, B, T, &loss));
    }
    NB_CHECK(nb_model_backward(t->model));
    loss_sum += loss;
  }
  if (M > 1 && c->pp.stages <= 1) { /* (the pipeline averaged its own) */
    float s = 1.0f / (float)M;
    for (size_t i = 0; i < t->n_train; i++) t->grads[i] *= s;
  }
  if (c->grad_hook) NB_CHECK(c->grad_hook(c->grad_hook_ctx, t->grads, t->n_train));
  const uint8_t* mask = t->lora ? NULL : nb_model_decay_mask(t->model);
  if (nb__tp_on(t)) { /* clipped by the norm of the whole gradient, not of this shard */
    NB_CHECK(nb_model_tp_norm(t->model, t->grads, gn_out));
    NB_CHECK(nb_adamw_step_norm(t->opt, t->params, t->grads, mask, *gn_out));
  } else {
    NB_CHECK(nb_adamw_step(t->opt, t->params, t->grads, mask, gn_out));
  }
  t->step++;
  t->samples += (uint64_t)B * (uint64_t)M;
  t->tokens_total += (uint64_t)scored;
  t->run_tokens += (uint64_t)scored;
  double dt = nb_now_s() - t0;
  if (c->slowdown > 1.0) {
    nb_sleep_ns((int64_t)((c->slowdown - 1.0) * dt * 1e9));
    dt = nb_now_s() - t0;
  }
  t->compute_s += dt;
  *loss_out = loss_sum / M;
  return NB_OK;
}

static int nb__report_step(nb_trainer_t* t, double loss, double gn) {
  if (!t->cfg.progress) return 0;
  nb_adamw_config_t oc = t->cfg.optim;
  if (oc.total_steps <= 0) oc.total_steps = t->cfg.max_steps;
  nb_train_progress_t p = {.event = NB_TRAIN_EVENT_STEP,
                           .step = t->step,
                           .loss = loss,
                           .lr = nb_adamw_lr(&oc, t->step - 1),
                           .grad_norm = gn,
                           .tokens_per_s = t->compute_s > 0 ? t->run_tokens / t->compute_s : 0,
                           .elapsed_s = nb_now_s() - t->started_s,
                           .samples = t->samples};
  return t->cfg.progress(t->cfg.progress_ctx, &p);
}

static int nb__report_eval(nb_trainer_t* t, const nb_train_eval_t* e) {
  if (!t->cfg.progress) return 0;
  nb_train_progress_t p = {.event = NB_TRAIN_EVENT_EVAL,
                           .step = t->step,
                           .tokens_per_s = t->compute_s > 0 ? t->run_tokens / t->compute_s : 0,
                           .elapsed_s = nb_now_s() - t->started_s,
                           .samples = t->samples,
                           .eval = e};
  return t->cfg.progress(t->cfg.progress_ctx, &p);
}

nb_status_t nb_trainer_steps(nb_trainer_t* t, long k, double* loss_mean) {
  if (!t || k < 0) return nb_error(NB_ERR_INVALID, "trainer: bad step count %ld", k);
  double sum = 0;
  for (long i = 0; i < k; i++) {
    double loss, gn;
    NB_CHECK(nb__one_step(t, &loss, &gn));
    sum += loss;
    if (nb__report_step(t, loss, gn)) return nb_error(NB_ERR_CANCELLED, "training stopped");
  }
  if (loss_mean) *loss_mean = k > 0 ? sum / (double)k : 0;
  return NB_OK;
}

nb_status_t nb_trainer_steps_budget(nb_trainer_t* t, long k_max, double seconds, long* k_done,
                                    double* loss_mean) {
  if (!t || k_max < 1 || !(seconds >= 0))
    return nb_error(NB_ERR_INVALID, "trainer: bad round budget (%ld steps, %g s)", k_max, seconds);
  double t0 = nb_now_s(), sum = 0;
  long k = 0;
  nb_status_t st = NB_OK;
  while (k < k_max) {
    double loss, gn;
    if ((st = nb__one_step(t, &loss, &gn)) != NB_OK) break;
    sum += loss;
    k++;
    if (nb__report_step(t, loss, gn)) {
      st = nb_error(NB_ERR_CANCELLED, "training stopped");
      break;
    }
    /* stop before a step that would end past the budget (at the mean step time so far), so
     * that a slow cluster does not overrun the round and make the fast ones wait */
    double el = nb_now_s() - t0;
    if (el + el / (double)k > seconds) break;
  }
  if (k_done) *k_done = k;
  if (loss_mean) *loss_mean = k > 0 ? sum / (double)k : 0;
  return st;
}

nb_status_t nb_trainer_eval(nb_trainer_t* t, nb_train_eval_t* out) {
  const nb_train_config_t* c = &t->cfg;
  const int B = c->batch_size, T = t->T;
  memset(out, 0, sizeof *out);
  out->n = c->n_sources;
  double sum = 0;
  for (int i = 0; i < c->n_sources; i++) {
    const nb__source_t* s = &t->src[i];
    snprintf(out->label[i], NB_TRAIN_LABEL_MAX, "%s", c->sources[i].label);
    if (c->data_kind == NB_TRAIN_DATA_MONO) {
      size_t cap = (size_t)c->eval_batches * B * T + 1;
      size_t len = s->held_len < cap ? s->held_len : cap;
      if (c->pp.stages > 1)
        NB_CHECK(nb_pipeline_bits_per_byte(t->model, &c->pipe, s->held, len, B, T, &out->bpb[i],
                                           &out->scored[i]));
      else
        NB_CHECK(
            nb_model_bits_per_byte(t->model, s->held, len, B, T, &out->bpb[i], &out->scored[i]));
    } else {
      size_t n = (size_t)c->eval_batches * B;
      if (n > s->n_held_pairs) n = s->n_held_pairs;
      double nats = 0;
      size_t cnt = 0;
      for (size_t b0 = 0; b0 < n; b0 += (size_t)B) {
        int rows = (int)(n - b0 < (size_t)B ? n - b0 : (size_t)B);
        for (int r = 0; r < rows; r++)
          nb__pair_row(s, s->held, &s->held_pairs[b0 + r], T, t->tokens + (size_t)r * T,
                       t->targets + (size_t)r * T);
        size_t c_b = 0;
        for (size_t j = 0; j < (size_t)rows * T; j++) c_b += t->targets[j] >= 0;
        float loss = 0;
        /* the loss is the mean over the scored positions of the batch */
        if (c->pp.stages > 1) {
          double l = 0;
          NB_CHECK(
              nb_pipeline_forward(t->model, &c->pipe, t->tokens, t->targets, rows, T, &l, NULL));
          loss = (float)l;
        } else {
          NB_CHECK(nb_model_forward(t->model, t->tokens, t->targets, rows, T, &loss));
        }
        nats += (double)loss * (double)c_b;
        cnt += c_b;
      }
      out->bpb[i] = cnt ? nats / (double)cnt / log(2.0) : 0;
      out->scored[i] = cnt;
    }
    sum += out->bpb[i];
  }
  out->mean_bpb = sum / c->n_sources;
  return NB_OK;
}

nb_status_t nb_trainer_run(nb_trainer_t* t, nb_train_eval_t* final_eval) {
  const nb_train_config_t* c = &t->cfg;
  nb_train_eval_t ev;
  int have_ev = 0, cancelled = 0;
  long last_eval = -1, last_ckpt = -1;
  double t0 = nb_now_s();
  if (c->eval_every > 0 && t->step == 0) {
    NB_CHECK(nb_trainer_eval(t, &ev));
    have_ev = 1;
    last_eval = t->step;
    cancelled = nb__report_eval(t, &ev);
  }
  while (!cancelled && t->step < c->max_steps) {
    if (c->max_seconds > 0 && nb_now_s() - t0 >= c->max_seconds) break;
    double loss, gn;
    NB_CHECK(nb__one_step(t, &loss, &gn));
    if (nb__report_step(t, loss, gn)) {
      cancelled = 1;
      break;
    }
    if (c->eval_every > 0 && t->step % c->eval_every == 0 && t->step < c->max_steps) {
      NB_CHECK(nb_trainer_eval(t, &ev));
      have_ev = 1;
      last_eval = t->step;
      if (nb__report_eval(t, &ev)) cancelled = 1;
    }
    if (c->checkpoint_dir[0] && c->checkpoint_every > 0 && t->step % c->checkpoint_every == 0) {
      NB_CHECK(nb_trainer_checkpoint(t));
      last_ckpt = t->step;
    }
  }
  if (!cancelled && last_eval != t->step) {
    NB_CHECK(nb_trainer_eval(t, &ev));
    have_ev = 1;
    if (nb__report_eval(t, &ev)) cancelled = 1;
  }
  if (c->checkpoint_dir[0] && last_ckpt != t->step) NB_CHECK(nb_trainer_checkpoint(t));
  if (final_eval) {
    if (have_ev)
      *final_eval = ev;
    else
      memset(final_eval, 0, sizeof *final_eval);
  }
  if (cancelled) return nb_error(NB_ERR_CANCELLED, "training stopped at step %ld", t->step);
  return NB_OK;
}

/* ---- accessors ----------------------------------------------------------------------------- */

float* nb_trainer_sync_params(nb_trainer_t* t, size_t* n) {
  if (n) *n = t->n_train;
  return t->params;
}

nb_status_t nb_trainer_set_sync_params(nb_trainer_t* t, const float* src, size_t n) {
  if (!t || !src || n != t->n_train)
    return nb_error(NB_ERR_INVALID, "trainer: synced buffer has %zu floats, got %zu",
                    t ? t->n_train : 0, n);
  memmove(t->params, src, n * sizeof(float));
  return NB_OK;
}

size_t nb_trainer_logical_params(const nb_trainer_t* t) {
  return nb__tp_on(t) ? nb_model_num_logical_params(t->model) : t->n_train;
}

nb_status_t nb_trainer_tp_gather(nb_trainer_t* t, float* logical) {
  if (!nb__tp_on(t)) {
    memcpy(logical, t->params, t->n_train * sizeof(float));
    return NB_OK;
  }
  return nb_model_tp_gather(t->model, t->params, logical);
}

void nb_trainer_tp_scatter(nb_trainer_t* t, const float* logical) {
  if (!nb__tp_on(t))
    memmove(t->params, logical, t->n_train * sizeof(float));
  else
    nb_model_tp_scatter(t->model, logical, t->params);
}

long nb_trainer_step(const nb_trainer_t* t) {
  return t->step;
}
uint64_t nb_trainer_samples(const nb_trainer_t* t) {
  return t->samples;
}
uint64_t nb_trainer_tokens(const nb_trainer_t* t) {
  return t->tokens_total;
}
double nb_trainer_compute_seconds(const nb_trainer_t* t) {
  return t->compute_s;
}
nb_model_t* nb_trainer_model(nb_trainer_t* t) {
  return t->model;
}
nb_lora_t* nb_trainer_lora(nb_trainer_t* t) {
  return t->lora;
}
const nb_train_config_t* nb_trainer_config(const nb_trainer_t* t) {
  return &t->cfg;
}
