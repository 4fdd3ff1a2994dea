/* The transformer, llm.c style: parameters and gradients in one arena each with a tensor table,
 * activations in a third arena sized for the largest (B, T) seen, hand-written backward, and an
 * incremental one-position forward over per-layer K/V caches for greedy decoding. Everything runs
 * on the CPU through kernels/ (sgemm/sgemv via OpenBLAS); no autograd, no GPU path. */
#include "train/model.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "train/model_internal.h"
#include "train/parallel.h"
#include "train/rng.h"

/* Per-layer parameter tensors, in arena order. */
enum {
  P_LN1W,
  P_LN1B,
  P_QKVW,
  P_QKVB,
  P_PROJW,
  P_PROJB,
  P_LN2W,
  P_LN2B,
  P_FCW,
  P_FCB,
  P_FCPROJW,
  P_FCPROJB,
  P_LAYER_COUNT
};

static const char* const nb__layer_names[P_LAYER_COUNT] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/* Activations of one layer (pointers into the activation arena). */
typedef struct {
  float* ln1;      /* (N, C) */
  float* ln1_mean; /* (N) */
  float* ln1_rstd; /* (N) */
  float* qkv;      /* (N, 3C) */
  float* atty;     /* (N, C) */
  float* lse;      /* (B, NH, T) logsumexp of each attention score row */
  float* attproj;  /* (N, C) */
  float* res2;     /* (N, C) */
  float* ln2;      /* (N, C) */
  float* ln2_mean; /* (N) */
  float* ln2_rstd; /* (N) */
  float* fch;      /* (N, 4C) */
  float* fch_gelu; /* (N, 4C) */
  float* fcproj;   /* (N, C) */
  float* res3;     /* (N, C) */
} nb__layer_acts_t;

/* What one micro-batch in flight holds: the activation arena and everything of the last forward
 * (pipeline parallelism keeps several; nb_model_use_slot swaps them in). */
/* (clang-format lays this list out anew each time it runs) */
/* clang-format off */
#define NB__SLOT_FIELDS(X)                                                                      \
  X(int, cap_B) X(int, cap_T) X(float*, acts) X(nb__layer_acts_t*, la) X(float*, encoded)       \
  X(float*, lnf) X(float*, lnf_mean) X(float*, lnf_rstd) X(float*, logits) X(float*, probs)     \
  X(float*, losses) X(float*, dres) X(float*, dln) X(float*, dqkv) X(float*, datty)             \
  X(float*, dfch) X(float*, dfch_gelu) X(float*, dlogits) X(float*, att_ws) X(size_t, att_ws_n) \
  X(int, att_chunks) X(float*, ps) X(float*, pt) X(float*, kl) X(float*, partial)               \
  X(int*, tokens) X(int*, targets) X(int, B) X(int, T) X(int, have_targets) X(int, count)      \
  X(float, alpha) X(float, temp)
/* clang-format on */

typedef struct {
#define X(type, name) type name;
  NB__SLOT_FIELDS(X)
#undef X
} nb__slot_t;

struct nb_model {
  nb_model_config_t cfg;
  size_t n_params;
  float* params;
  float* grads;
  uint8_t* decay;
  nb_tensor_view_t* views;
  size_t n_views;
  size_t layer_view0; /* index of h.0.ln_1.weight */

  /* activations, sized for cap_B x cap_T */
  int cap_B, cap_T;
  float* acts;
  nb__layer_acts_t* la;
  float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits, *probs, *losses;
  float *dres, *dln, *dqkv, *datty, *dfch, *dfch_gelu, *dlogits;
  float* att_ws;   /* (att_chunks, att_ws_n) blocked-attention scratch, one per chunk */
  size_t att_ws_n; /* floats per chunk */
  int att_chunks;
  float *ps, *pt, *kl; /* distillation */
  float* partial;      /* (NB__CHUNKS, 4C) per-chunk gradient partials (LayerNorm 2C, fc bias 4C) */
  int* tokens;
  int* targets;

  /* last forward */
  int B, T;
  int have_targets;
  int count;
  float alpha, temp; /* distillation weight (0 = plain CE) and temperature */

  int frozen;
  nb_lora_t* lora;

  /* tensor parallelism (size 1 when off): this shard's width of the split products (C / size)
   * and heads, the logical parameter count and the local -> logical segments */
  nb_model_tp_t tp;
  int Cl, NHl;
  size_t n_logical;
  nb_model_segment_t* seg;
  size_t n_seg, cap_seg;
  /* pipeline parallelism (1 stage when off): this stage holds layers [l0, l0 + Ls) of the
   * logical model, the embeddings and the final LayerNorm (replicated over the stages) */
  int pp_stage, pp_stages, l0, Ls;
  int in_layers; /* while building the table: a layer's tensor (sharded over the stages) */
  /* the replica gather, scatter and the norm run over (its tensor-parallel group, then its
   * pipeline): this rank in it, stage * tp.size + tp.rank, of tp.size * stages */
  int grp_rank, grp_size;
  nb_model_pp_t pp;  /* the pipeline group (this tensor-parallel rank's stages) */
  float* mm_partial; /* dweight / dbias partial products (nb__mm_partial_floats), at the first
                        backward: scratch of one product at a time, whatever the slot */
  nb__slot_t* slots; /* NULL, or n_slots activation sets (the current one lives in the fields) */
  int n_slots, cur_slot;

  /* decoding: key and value caches (dec_cap, L, ctx, C) each, one position's activations for
   * dec_cap rows */
  float* dec;
  int dec_cap; /* sequences the caches hold */
  float *dec_k, *dec_v;
  float *dec_x, *dec_ln, *dec_qkv, *dec_y, *dec_o, *dec_h, *dec_hg, *dec_att, *dec_logits;
  float *dec_mean, *dec_rstd;
};

nb_model_config_t nb_model_config_make(int n_layer, int n_embd, int n_head, int ctx) {
  nb_model_config_t c = {n_layer, n_embd, n_head, ctx, NB_VOCAB};
  return c;
}

nb_status_t nb_model_config_check(const nb_model_config_t* c) {
  if (!c) return nb_error(NB_ERR_INVALID, "model config: NULL");
  if (c->n_layer < 1 || c->n_layer > 256)
    return nb_error(NB_ERR_INVALID, "model config: n_layer %d not in [1, 256]", c->n_layer);
  if (c->n_head < 1 || c->n_head > 256)
    return nb_error(NB_ERR_INVALID, "model config: n_head %d not in [1, 256]", c->n_head);
  if (c->n_embd < 1 || c->n_embd > 16384 || c->n_embd % c->n_head != 0)
    return nb_error(NB_ERR_INVALID,
                    "model config: n_embd %d must be in [1, 16384] and divisible by n_head %d",
                    c->n_embd, c->n_head);
  if (c->ctx < 1 || c->ctx > 65536)
    return nb_error(NB_ERR_INVALID, "model config: ctx %d not in [1, 65536]", c->ctx);
  if (c->vocab != NB_VOCAB)
    return nb_error(NB_ERR_INVALID, "model config: vocab %d, this build uses %d", c->vocab,
                    NB_VOCAB);
  return NB_OK;
}

/* How a tensor is split across a tensor-parallel group. */
enum {
  SPLIT_NONE, /* replicated */
  SPLIT_QKV,  /* rows, in three blocks (q, k, v): each rank its share of each */
  SPLIT_ROWS, /* rows */
  SPLIT_COLS  /* columns */
};

static void nb__add_seg(nb_model_t* m, size_t local, size_t logical, size_t len, int sharded) {
  nb_model_segment_t* last = m->n_seg ? &m->seg[m->n_seg - 1] : NULL;
  if (last && last->sharded == sharded && last->local + last->len == local &&
      last->logical + last->len == logical) {
    last->len += len;
    return;
  }
  m->seg[m->n_seg++] = (nb_model_segment_t){local, logical, len, sharded};
}

/* Adds the shard of a logical (rows, cols) tensor (cols 0: a vector) split as split says, with
 * its segments. */
static void nb__add_view(nb_model_t* m, const char* name, int rows, int cols, int decay,
                         int split) {
  int P = m->tp.size, r = m->tp.rank;
  if (P == 1) split = SPLIT_NONE;
  int lrows = (split == SPLIT_QKV || split == SPLIT_ROWS) ? rows / P : rows;
  int lcols = split == SPLIT_COLS ? cols / P : cols;
  size_t w = (size_t)(cols > 0 ? cols : 1), lw = (size_t)(lcols > 0 ? lcols : 1);
  nb_tensor_view_t* v = &m->views[m->n_views++];
  snprintf(v->name, sizeof v->name, "%s", name);
  v->offset = m->n_params;
  v->ndim = cols > 0 ? 2 : 1;
  v->shape[0] = lrows;
  v->shape[1] = cols > 0 ? lcols : 0;
  v->numel = (size_t)lrows * lw;
  v->decay = decay;
  size_t lo = v->offset, go = m->n_logical, part = (size_t)rows / 3 / (size_t)P;
  switch (split) {
    case SPLIT_NONE: /* a stage's own layer: this rank's alone, or its tensor group's */
      nb__add_seg(m, lo, go, v->numel,
                  m->in_layers && m->pp_stages > 1 ? (P > 1 ? NB_SEG_STAGE : NB_SEG_OWN)
                                                   : NB_SEG_REPLICATED);
      break;
    case SPLIT_QKV:
      for (size_t k = 0; k < 3; k++)
        nb__add_seg(m, lo + k * part * w, go + (k * (size_t)rows / 3 + (size_t)r * part) * w,
                    part * w, NB_SEG_OWN);
      break;
    case SPLIT_ROWS:
      nb__add_seg(m, lo, go + (size_t)r * v->numel, v->numel, NB_SEG_OWN);
      break;
    case SPLIT_COLS:
      for (size_t i = 0; i < (size_t)rows; i++)
        nb__add_seg(m, lo + i * lw, go + i * w + (size_t)r * lw, lw, NB_SEG_OWN);
      break;
  }
  m->n_params += v->numel;
  m->n_logical += (size_t)rows * w;
}

#define LP(m, l, k) \
  ((m)->params + (m)->views[(m)->layer_view0 + (size_t)(l)*P_LAYER_COUNT + (k)].offset)
#define LG(m, l, k) \
  ((m)->grads + (m)->views[(m)->layer_view0 + (size_t)(l)*P_LAYER_COUNT + (k)].offset)
#define GP(m, i) ((m)->params + (m)->views[(i)].offset)
#define GG(m, i) ((m)->grads + (m)->views[(i)].offset)
/* global view indices */
#define V_WTE 0
#define V_WPE 1
#define V_LNFW(m) ((m)->n_views - 2)
#define V_LNFB(m) ((m)->n_views - 1)

static nb_status_t nb__create(const nb_model_config_t* cfg, uint64_t seed, const nb_model_tp_t* tp,
                              const nb_model_pp_t* pp, nb_model_t** out);

nb_status_t nb_model_create(const nb_model_config_t* cfg, uint64_t seed, nb_model_t** out) {
  return nb__create(cfg, seed, NULL, NULL, out);
}

nb_status_t nb_model_create_tp(const nb_model_config_t* cfg, uint64_t seed, const nb_model_tp_t* tp,
                               nb_model_t** out) {
  return nb__create(cfg, seed, tp, NULL, out);
}

nb_status_t nb_model_create_pp(const nb_model_config_t* cfg, uint64_t seed, const nb_model_pp_t* pp,
                               nb_model_t** out) {
  if (!pp) return nb_error(NB_ERR_INVALID, "model: NULL pipeline settings");
  return nb__create(cfg, seed, NULL, pp, out);
}

nb_status_t nb_model_create_mp(const nb_model_config_t* cfg, uint64_t seed, const nb_model_tp_t* tp,
                               const nb_model_pp_t* pp, nb_model_t** out) {
  return nb__create(cfg, seed, tp, pp, out);
}

static nb_status_t nb__create(const nb_model_config_t* cfg, uint64_t seed, const nb_model_tp_t* tp,
                              const nb_model_pp_t* pp, nb_model_t** out) {
  nb_status_t st = NB_OK;
  nb_model_t* m = NULL;
  nb_model_t* full = NULL;
  if (!out) return nb_error(NB_ERR_INVALID, "model: NULL out");
  *out = NULL;
  NB_CHECK(nb_model_config_check(cfg));
  nb_model_tp_t one = {.rank = 0, .size = 1};
  if (!tp) tp = &one;
  nb_model_pp_t one_stage = {.stage = 0, .stages = 1};
  if (!pp) pp = &one_stage;
  if (pp->stages < 1 || pp->stages > cfg->n_layer || cfg->n_layer % pp->stages != 0)
    return nb_error(NB_ERR_INVALID,
                    "model: %d pipeline stages must divide n_layer %d (each stage whole layers)",
                    pp->stages, cfg->n_layer);
  if (pp->stage < 0 || pp->stage >= pp->stages)
    return nb_error(NB_ERR_INVALID, "model: pipeline stage %d not in [0, %d)", pp->stage,
                    pp->stages);
  if (pp->stages > 1 && !pp->allreduce)
    return nb_error(NB_ERR_INVALID, "model: %d pipeline stages need an allreduce", pp->stages);
  if (tp->size < 1 || tp->size > cfg->n_head || cfg->n_head % tp->size != 0)
    return nb_error(NB_ERR_INVALID,
                    "model: tensor-parallel size %d must divide n_head %d (each rank whole heads)",
                    tp->size, cfg->n_head);
  if (tp->rank < 0 || tp->rank >= tp->size)
    return nb_error(NB_ERR_INVALID, "model: tensor-parallel rank %d not in [0, %d)", tp->rank,
                    tp->size);
  if (tp->size > 1 && !tp->allreduce)
    return nb_error(NB_ERR_INVALID, "model: tensor-parallel size %d needs an allreduce", tp->size);
  NB_CHECK(nb_calloc((void**)&m, 1, sizeof *m, "model"));
  m->cfg = *cfg;
  m->tp = *tp;
  m->pp_stage = pp->stage;
  m->pp_stages = pp->stages;
  m->Ls = cfg->n_layer / pp->stages;
  m->l0 = pp->stage * m->Ls;
  m->pp = *pp;
  m->grp_rank = pp->stage * tp->size + tp->rank;
  m->grp_size = tp->size * pp->stages;
  int L = cfg->n_layer, C = cfg->n_embd, V = cfg->vocab;
  m->Cl = C / tp->size;
  m->NHl = cfg->n_head / tp->size;
  /* at most 2 C + 6 segments per layer (the column-split matrices one per row) */
  m->cap_seg = 4 + (size_t)L * (P_LAYER_COUNT + 2 * (size_t)C + 6);
  NB_CHECK_GOTO(nb_calloc((void**)&m->views, 4 + (size_t)L * P_LAYER_COUNT, sizeof *m->views,
                          "model tensor table"),
                st, fail);
  NB_CHECK_GOTO(nb_calloc((void**)&m->seg, m->cap_seg, sizeof *m->seg, "model shard segments"), st,
                fail);
  nb__add_view(m, "wte", V, C, 1, SPLIT_NONE);
  nb__add_view(m, "wpe", cfg->ctx, C, 0, SPLIT_NONE);
  m->layer_view0 = m->n_views;
  const int rows[P_LAYER_COUNT] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
  const int cols[P_LAYER_COUNT] = {0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0};
  const int split[P_LAYER_COUNT] = {SPLIT_NONE, SPLIT_NONE, SPLIT_QKV,  SPLIT_QKV,
                                    SPLIT_COLS, SPLIT_NONE, SPLIT_NONE, SPLIT_NONE,
                                    SPLIT_ROWS, SPLIT_ROWS, SPLIT_COLS, SPLIT_NONE};
  m->in_layers = 1;
  for (int l = 0; l < L; l++)
    for (int k = 0; k < P_LAYER_COUNT; k++) {
      if (l < m->l0 || l >= m->l0 + m->Ls) { /* another stage's layer: only its logical place */
        m->n_logical += (size_t)rows[k] * (size_t)(cols[k] > 0 ? cols[k] : 1);
        continue;
      }
      char name[64];
      snprintf(name, sizeof name, "h.%d.%s", l, nb__layer_names[k]);
      nb__add_view(m, name, rows[k], cols[k], cols[k] > 0, split[k]);
    }
  m->in_layers = 0;
  nb__add_view(m, "ln_f.weight", C, 0, 0, SPLIT_NONE);
  nb__add_view(m, "ln_f.bias", C, 0, 0, SPLIT_NONE);

  NB_CHECK_GOTO(nb_aligned_alloc((void**)&m->params, m->n_params, sizeof(float), "parameters"), st,
                fail);
  NB_CHECK_GOTO(nb_aligned_alloc((void**)&m->grads, m->n_params, sizeof(float), "gradients"), st,
                fail);
  NB_CHECK_GOTO(nb_alloc((void**)&m->decay, m->n_params, 1, "decay mask"), st, fail);
  memset(m->grads, 0, m->n_params * sizeof(float));
  for (size_t i = 0; i < m->n_views; i++)
    memset(m->decay + m->views[i].offset, m->views[i].decay, m->views[i].numel);

  if (tp->size > 1 || pp->stages > 1) {
    /* the shard (or stage) of the size-1 model of the same seed */
    NB_CHECK_GOTO(nb__create(cfg, seed, NULL, NULL, &full), st, fail);
    nb_model_tp_scatter(m, full->params, m->params);
    nb_model_destroy(full);
    *out = m;
    return NB_OK;
  }
  /* deterministic init: one stream, tensors in arena order */
  nb_rng_t rng;
  nb_rng_seed(&rng, seed);
  double proj_std = 0.02 / sqrt(2.0 * L);
  for (size_t i = 0; i < m->n_views; i++) {
    const nb_tensor_view_t* v = &m->views[i];
    float* p = m->params + v->offset;
    size_t len = strlen(v->name);
    int is_ln_w = strstr(v->name, "ln_") && len > 7 && strcmp(v->name + len - 7, ".weight") == 0;
    int is_bias = len > 5 && strcmp(v->name + len - 5, ".bias") == 0;
    if (is_ln_w) {
      for (size_t j = 0; j < v->numel; j++) p[j] = 1.0f;
    } else if (is_bias) {
      memset(p, 0, v->numel * sizeof(float));
    } else {
      double sd = strstr(v->name, "c_proj.weight") ? proj_std : 0.02;
      for (size_t j = 0; j < v->numel; j++) p[j] = (float)(sd * nb_rng_normal(&rng));
    }
  }
  *out = m;
  return NB_OK;
fail:
  nb_model_destroy(m);
  return st;
}

static void nb__free_acts(nb_model_t* m) {
  nb_free(m->acts);
  nb_free(m->la);
  nb_free(m->tokens);
  nb_free(m->targets);
  m->acts = NULL;
  m->la = NULL;
  m->tokens = m->targets = NULL;
  m->cap_B = m->cap_T = 0;
}

static void nb__slots_free(nb_model_t* m);

void nb_model_destroy(nb_model_t* m) {
  if (!m) return;
  nb__slots_free(m);
  nb__free_acts(m);
  nb_free(m->dec);
  nb_free(m->mm_partial);
  nb_free(m->params);
  nb_free(m->grads);
  nb_free(m->decay);
  nb_free(m->views);
  nb_free(m->seg);
  nb_free(m);
}

const nb_model_config_t* nb_model_get_config(const nb_model_t* m) {
  return &m->cfg;
}
float* nb_model_params(nb_model_t* m, size_t* n) {
  if (n) *n = m->n_params;
  return m->params;
}
float* nb_model_grads(nb_model_t* m, size_t* n) {
  if (n) *n = m->n_params;
  return m->grads;
}
size_t nb_model_num_params(const nb_model_t* m) {
  return m->n_params;
}
size_t nb_model_num_tensors(const nb_model_t* m) {
  return m->n_views;
}
const nb_tensor_view_t* nb_model_tensor(const nb_model_t* m, size_t i) {
  return i < m->n_views ? &m->views[i] : NULL;
}
const nb_tensor_view_t* nb_model_find_tensor(const nb_model_t* m, const char* name) {
  for (size_t i = 0; i < m->n_views; i++)
    if (strcmp(m->views[i].name, name) == 0) return &m->views[i];
  return NULL;
}
const uint8_t* nb_model_decay_mask(const nb_model_t* m) {
  return m->decay;
}
const float* nb_model_logits(const nb_model_t* m) {
  return m->logits;
}
const float* nb_model_losses(const nb_model_t* m) {
  return m->losses;
}
void nb_model_set_frozen(nb_model_t* m, int frozen) {
  m->frozen = frozen;
}

double nb_model_flops_per_token(const nb_model_t* m, int T) {
  return 6.0 * (double)m->n_logical + 12.0 * m->cfg.n_layer * m->cfg.n_embd * (double)T;
}

int nb_model_tp_size(const nb_model_t* m) {
  return m->tp.size;
}
int nb_model_tp_rank(const nb_model_t* m) {
  return m->tp.rank;
}
size_t nb_model_num_logical_params(const nb_model_t* m) {
  return m->n_logical;
}
const nb_model_segment_t* nb_model_segments(const nb_model_t* m, size_t* n) {
  if (n) *n = m->n_seg;
  return m->seg;
}

static nb_status_t nb__tp_sum(nb_model_t* m, float* buf, size_t n) {
  if (m->tp.size == 1) return NB_OK;
  nb_status_t st = m->tp.allreduce(m->tp.ctx, buf, n);
  if (st != NB_OK)
    return nb_error(st, "model: tensor-parallel allreduce of %zu floats failed (rank %d of %d)", n,
                    m->tp.rank, m->tp.size);
  return NB_OK;
}

/* The pipeline group's sum (this tensor-parallel rank's stages). */
static nb_status_t nb__pp_sum(nb_model_t* m, float* buf, size_t n) {
  if (m->pp_stages == 1) return NB_OK;
  nb_status_t st = m->pp.allreduce(m->pp.ctx, buf, n);
  if (st != NB_OK)
    return nb_error(st, "model: pipeline allreduce of %zu floats failed (stage %d of %d)", n,
                    m->pp_stage, m->pp_stages);
  return NB_OK;
}

/* The replica's sum: over the tensor-parallel group, then over the pipeline's. */
static nb_status_t nb__grp_sum(nb_model_t* m, float* buf, size_t n) {
  NB_CHECK(nb__tp_sum(m, buf, n));
  return nb__pp_sum(m, buf, n);
}

int nb_model_group_rank(const nb_model_t* m) {
  return m->grp_rank;
}
int nb_model_group_size(const nb_model_t* m) {
  return m->grp_size;
}
nb_status_t nb_model_group_sum(nb_model_t* m, float* buf, size_t n) {
  return nb__grp_sum(m, buf, n);
}

/* 1 when this rank writes segment g into a gather: its own elements, its stage's (tensor rank 0
 * of the stage), the replica's (rank 0 of the replica). */
static int nb__seg_mine(const nb_model_t* m, const nb_model_segment_t* g) {
  return g->sharded == NB_SEG_OWN || (g->sharded == NB_SEG_STAGE && m->tp.rank == 0) ||
         (g->sharded == NB_SEG_REPLICATED && m->grp_rank == 0);
}

int nb_model_pp_stages(const nb_model_t* m) {
  return m->pp_stages;
}
int nb_model_pp_stage(const nb_model_t* m) {
  return m->pp_stage;
}
int nb_model_is_sharded(const nb_model_t* m) {
  return m->tp.size > 1 || m->pp_stages > 1;
}

nb_status_t nb_model_tp_gather(nb_model_t* m, const float* local, float* logical) {
  if (m->grp_size == 1) {
    memcpy(logical, local, m->n_params * sizeof(float));
    return NB_OK;
  }
  /* each element is written by exactly one rank (replicated ones by rank 0), the rest are
   * zero, so the sum is exact */
  memset(logical, 0, m->n_logical * sizeof(float));
  for (size_t i = 0; i < m->n_seg; i++) {
    const nb_model_segment_t* g = &m->seg[i];
    if (nb__seg_mine(m, g)) memcpy(logical + g->logical, local + g->local, g->len * sizeof(float));
  }
  return nb__grp_sum(m, logical, m->n_logical);
}

void nb_model_tp_scatter(const nb_model_t* m, const float* logical, float* local) {
  for (size_t i = 0; i < m->n_seg; i++) {
    const nb_model_segment_t* g = &m->seg[i];
    memcpy(local + g->local, logical + g->logical, g->len * sizeof(float));
  }
}

nb_status_t nb_model_tp_norm(nb_model_t* m, const float* buf, double* norm) {
  double sq[2] = {0.0, 0.0}; /* replicated over the replica; summed over it */
  for (size_t i = 0; i < m->n_seg; i++) {
    const nb_model_segment_t* g = &m->seg[i];
    if (g->sharded == NB_SEG_STAGE && m->tp.rank != 0) continue; /* the stage's, counted once */
    double s = 0.0;
    for (size_t j = 0; j < g->len; j++) s += (double)buf[g->local + j] * buf[g->local + j];
    sq[g->sharded != NB_SEG_REPLICATED] += s;
  }
  /* the sharded partial sums meet in float (enough for clipping); every rank receives the
   * same total */
  float part = (float)sq[1];
  NB_CHECK(nb__grp_sum(m, &part, 1));
  *norm = sqrt(sq[0] + (double)part);
  return NB_OK;
}

float* nb__model_site_weight(nb_model_t* m, int layer, int site, int* OC, int* IC) {
  int C = m->cfg.n_embd; /* the whole model's shapes: LoRA refuses a sharded one */
  static const int k[NB_SITE_COUNT] = {P_QKVW, P_PROJW, P_FCW, P_FCPROJW};
  static const int oc[NB_SITE_COUNT] = {3, 1, 4, 1}, ic[NB_SITE_COUNT] = {1, 1, 1, 4};
  *OC = oc[site] * C;
  *IC = ic[site] * C;
  return LP(m, layer, k[site]);
}

void nb__model_attach_lora(nb_model_t* m, nb_lora_t* l) {
  m->lora = l;
}

/* ---- elementwise work over the thread pool. The chunk count is fixed (not the thread count),
 * so every result, including the LayerNorm partial sums, has the same bits on any pool size. */
#define NB__CHUNKS 16

typedef struct {
  float *out, *a, *b, *c, *d, *e, *f, *g;
  const int* ints;
  size_t n;
  int rows, cols;
  int counts[NB__CHUNKS];
  float scalar, scalar2, temp; /* loss weights and temperature */
} nb__par_t;

static size_t nb__chunks_for(size_t work) {
  return work < 16384 ? 1 : NB__CHUNKS;
}

/* Runs fn over the NB__CHUNKS chunks, inline when the work (rows x cols) is small. */
static void nb__par_run(void (*fn)(void*, size_t), nb__par_t* p) {
  if (nb__chunks_for((size_t)p->rows * p->cols) == 1)
    for (size_t i = 0; i < NB__CHUNKS; i++) fn(p, i);
  else
    nb_parallel_for(NB__CHUNKS, fn, p);
}

static void nb__zero_chunk(void* ctx, size_t i) {
  nb_model_t* m = ctx;
  size_t b, e;
  nb_parallel_range(m->n_params, NB__CHUNKS, i, &b, &e);
  memset(m->grads + b, 0, (e - b) * sizeof(float));
}

void nb_model_zero_grad(nb_model_t* m) { /* over the pool: a pass over memory, bound by it */
  if (m->n_params < (1u << 16))
    memset(m->grads, 0, m->n_params * sizeof(float));
  else
    nb_parallel_for(NB__CHUNKS, nb__zero_chunk, m);
}

/* ---- the dense products over the same pool: one thread plan for the whole step. OpenBLAS's own
 * threads are set to 1 for the forward and the backward (and restored after), and the pool splits
 * each product into tasks, each a sgemm of its own on one OpenBLAS thread: the forward and dinp
 * by rows of N, dweight by the rows of N it sums over (each task a partial product, summed in a
 * fixed order after). The split depends on the sizes only (never the thread count), so the bits
 * are the same on any pool size (OpenBLAS's own results depend on how a product is split).
 * OpenBLAS's idle threads then sleep instead of spinning beside the pool's (8-17 % of the step's
 * samples in perf before).
 *
 * Fewer, larger tasks: every task packs its whole panel of W (forward, dinp) or of the input
 * (dweight) again, and a sgemm of 128 rows ran at 0.82 of a whole one (one AVX-512 core: 125
 * against 152 GFLOP/s), dweight split by output rows at 0.72 (each task packed all N rows of the
 * input). A product is split into NB__MM_TASKS(N) tasks, four up to 4096 rows. */
#define NB__MM_MAX_TASKS 16
#define NB__MM_ROWS_PER_TASK 512 /* rows of N per task beyond the first four tasks */
#define NB__MM_MIN_ROWS 64       /* a task's rows at least */
#define NB__MM_KSPLIT_MAX 4      /* dweight's partial products at most (their buffers) */

typedef struct {
  float *out, *dinp, *dw, *db, *partial;
  const float *inp, *w, *b, *dout;
  int N, C, OC;
  int row_tasks, k_tasks; /* the backward's tasks: row_tasks of dinp, then k_tasks of dweight */
} nb__mm_par_t;

/* Tasks for a product over N rows: 4 up to 4 * NB__MM_ROWS_PER_TASK rows, then one per
 * NB__MM_ROWS_PER_TASK rows (a power of two, at most 16), none under NB__MM_MIN_ROWS rows. */
static int nb__mm_tasks(int rows) {
  int t = 4;
  while (t < NB__MM_MAX_TASKS && rows >= 2 * t * NB__MM_ROWS_PER_TASK) t *= 2;
  while (t > 1 && rows < t * NB__MM_MIN_ROWS) t /= 2;
  return t;
}

/* Floats of dweight partial products a model of this width needs (m->mm_partial). */
static size_t nb__mm_partial_floats(int C, int V) {
  size_t oc = (size_t)(4 * C > V ? 4 * C : V);
  return (size_t)(NB__MM_KSPLIT_MAX - 1) * oc * (size_t)C + (size_t)NB__MM_KSPLIT_MAX * oc;
}

static void nb__mm_fwd_chunk(void* ctx, size_t i) {
  nb__mm_par_t* p = ctx;
  size_t b, e;
  nb_parallel_range((size_t)p->N, (size_t)p->row_tasks, i, &b, &e);
  nb_matmul_forward(p->out + b * p->OC, p->inp + b * p->C, p->w, p->b, (int)(e - b), p->C, p->OC);
}

/* out (N, OC) = inp W^T (+ bias) over the pool. */
static void nb__mm_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                           int C, int OC) {
  nb__mm_par_t p = {.out = out, .inp = inp, .w = w, .b = bias, .N = N, .C = C, .OC = OC};
  p.row_tasks = nb__mm_tasks(N);
  if (p.row_tasks == 1)
    nb_matmul_forward(out, inp, w, bias, N, C, OC);
  else
    nb_parallel_for((size_t)p.row_tasks, nb__mm_fwd_chunk, &p);
}

/* Task i < row_tasks: rows of dinp (written). Task row_tasks + k: dweight and dbias over the k-th
 * range of N: the first adds to dweight / dbias, the others write partial k - 1. */
static void nb__mm_bwd_chunk(void* ctx, size_t i) {
  nb__mm_par_t* p = ctx;
  size_t b, e;
  if (i < (size_t)p->row_tasks) {
    nb_parallel_range((size_t)p->N, (size_t)p->row_tasks, i, &b, &e);
    nb_matmul_backward_input(p->dinp + b * p->C, p->dout + b * p->OC, p->w, (int)(e - b), p->C,
                             p->OC, 0);
    return;
  }
  size_t k = i - (size_t)p->row_tasks, OC = (size_t)p->OC, C = (size_t)p->C;
  nb_parallel_range((size_t)p->N, (size_t)p->k_tasks, k, &b, &e);
  float* dw = p->dw;
  float* db = p->db;
  if (k > 0) {
    if (dw) dw = p->partial + (k - 1) * OC * C;
    if (db) db = p->partial + (size_t)(NB__MM_KSPLIT_MAX - 1) * OC * C + k * OC;
  }
  nb_matmul_backward_weight(dw, db, p->dout + b * OC, p->inp + b * C, (int)(e - b), p->C, p->OC,
                            k == 0);
}

/* dweight (and dbias) += the partials 1.. in order, over rows of OC. */
static void nb__mm_sum_chunk(void* ctx, size_t i) {
  nb__mm_par_t* p = ctx;
  size_t b, e, OC = (size_t)p->OC, C = (size_t)p->C;
  nb_parallel_range(OC, NB__CHUNKS, i, &b, &e);
  for (int k = 1; k < p->k_tasks; k++) {
    if (p->dw) {
      const float* part = p->partial + (size_t)(k - 1) * OC * C;
      for (size_t j = b * C; j < e * C; j++) p->dw[j] += part[j];
    }
    if (p->db) {
      const float* part = p->partial + (size_t)(NB__MM_KSPLIT_MAX - 1) * OC * C + (size_t)k * OC;
      for (size_t j = b; j < e; j++) p->db[j] += part[j];
    }
  }
}

/* The dense backward over the pool: dinp (N, C) written (not accumulated: no pass to zero it
 * first), dweight and dbias accumulated as nb_matmul_backward does, from partial products over
 * ranges of N (tasks of one loop with dinp's rows: they write disjoint buffers), then the
 * partials summed in a fixed order. */
static void nb__mm_backward(nb_model_t* m, float* dinp, float* dweight, float* dbias,
                            const float* dout, const float* inp, const float* w, int N, int C,
                            int OC) {
  nb__mm_par_t p = {.dinp = dinp,
                    .dw = dweight,
                    .db = dbias,
                    .partial = m->mm_partial,
                    .dout = dout,
                    .inp = inp,
                    .w = w,
                    .N = N,
                    .C = C,
                    .OC = OC};
  p.row_tasks = dinp ? nb__mm_tasks(N) : 0;
  p.k_tasks = 0;
  if (dweight || dbias) {
    p.k_tasks = nb__mm_tasks(N);
    if (p.k_tasks > NB__MM_KSPLIT_MAX) p.k_tasks = NB__MM_KSPLIT_MAX;
  }
  if (p.row_tasks + p.k_tasks <= 1) {
    if (dinp) nb_matmul_backward_input(dinp, dout, w, N, C, OC, 0);
    nb_matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC, 1);
    return;
  }
  nb_parallel_for((size_t)(p.row_tasks + p.k_tasks), nb__mm_bwd_chunk, &p);
  if (p.k_tasks > 1) nb_parallel_for(NB__CHUNKS, nb__mm_sum_chunk, &p);
}

/* fc bias + GELU in one pass over row chunks: a = pre-activation (bias added in place),
 * out = GELU, d = bias. */
static void nb__bias_gelu_fwd_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e, C = (size_t)p->cols;
  nb_parallel_range((size_t)p->rows, NB__CHUNKS, i, &b, &e);
  nb_gelu_bias_forward(p->out + b * C, p->a + b * C, p->d, (int)(e - b), p->cols, NB_CPU_PATH_AUTO);
}
/* Its backward: out = dpre (written), b = dout, a = pre, f = per-chunk bias partials or NULL. */
static void nb__bias_gelu_bwd_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e, C = (size_t)p->cols;
  nb_parallel_range((size_t)p->rows, NB__CHUNKS, i, &b, &e);
  nb_gelu_bias_backward(p->out + b * C, p->f ? p->f + i * C : NULL, p->a + b * C, p->b + b * C,
                        (int)(e - b), p->cols, NB_CPU_PATH_AUTO);
}
static void nb__add_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e;
  nb_parallel_range(p->n, NB__CHUNKS, i, &b, &e);
  for (size_t k = b; k < e; k++) p->out[k] = p->a[k] + p->b[k];
}
static void nb__par_elementwise(void (*fn)(void*, size_t), float* out, float* a, float* b,
                                size_t n) {
  nb__par_t p = {
      .out = out, .a = a, .b = b, .n = n, .rows = (int)(n > 1u << 30 ? 1u << 30 : n), .cols = 1};
  nb__par_run(fn, &p);
}

/* dpre = gelu'(pre) * dout over (N, OC), and dbias += its column sums (fixed-order partials). */
static void nb__par_bias_gelu_backward(nb_model_t* m, float* dpre, float* dbias, const float* pre,
                                       const float* dout, int N, int OC) {
  nb__par_t p = {.out = dpre,
                 .a = (float*)pre,
                 .b = (float*)dout,
                 .f = dbias ? m->partial : NULL,
                 .rows = N,
                 .cols = OC};
  nb__par_run(nb__bias_gelu_bwd_chunk, &p);
  if (!dbias) return;
  for (size_t i = 0; i < NB__CHUNKS; i++) {
    const float* part = m->partial + i * (size_t)OC;
    for (int c = 0; c < OC; c++) dbias[c] += part[c];
  }
}

/* g = a + f first when f is given (the residual add fused: the same bits as the add, then the
 * LayerNorm), then out = LN(a or g; d, e), mean b / rstd c per row */
static void nb__ln_fwd_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e, C = (size_t)p->cols;
  nb_parallel_range((size_t)p->rows, NB__CHUNKS, i, &b, &e);
  if (p->f)
    nb_residual_layernorm_forward(p->g + b * C, p->out + b * C, p->b + b, p->c + b, p->a + b * C,
                                  p->f + b * C, p->d, p->e, (int)(e - b), p->cols);
  else
    nb_layernorm_forward(p->out + b * C, p->b + b, p->c + b, p->a + b * C, p->d, p->e, (int)(e - b),
                         p->cols);
}
/* res = x + y (when y is given), out = LN(res or x; w, bias) in one pass per row */
static void nb__par_res_ln_forward(float* res, float* out, float* mean, float* rstd, const float* x,
                                   const float* y, const float* w, const float* bias, int N,
                                   int C) {
  nb__par_t p = {.g = res,
                 .out = out,
                 .a = (float*)x,
                 .f = (float*)y,
                 .b = mean,
                 .c = rstd,
                 .d = (float*)w,
                 .e = (float*)bias,
                 .rows = N,
                 .cols = C};
  nb__par_run(nb__ln_fwd_chunk, &p);
}
/* out = LN(inp; w, bias), mean/rstd per row */
static void nb__par_ln_forward(float* out, float* mean, float* rstd, const float* inp,
                               const float* w, const float* bias, int N, int C) {
  nb__par_res_ln_forward(NULL, out, mean, rstd, inp, NULL, w, bias, N, C);
}

static void nb__ln_bwd_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e, C = (size_t)p->cols;
  nb_parallel_range((size_t)p->rows, NB__CHUNKS, i, &b, &e);
  float* part = p->f ? p->f + i * 2 * C : NULL;
  if (part) memset(part, 0, 2 * C * sizeof(float));
  /* a=dinp, b=dout, c=inp, d=weight, e=mean, out=rstd */
  nb_layernorm_backward(p->a + b * C, part, part ? part + C : NULL, p->b + b * C, p->c + b * C,
                        p->d, p->e + b, p->out + b, (int)(e - b), p->cols);
}
/* Accumulating LayerNorm backward; weight/bias gradients via fixed-order partial sums. */
static void nb__par_ln_backward(nb_model_t* m, float* dinp, float* dw, float* db, const float* dout,
                                const float* inp, const float* w, const float* mean,
                                const float* rstd, int N, int C) {
  nb__par_t p = {.a = dinp,
                 .b = (float*)dout,
                 .c = (float*)inp,
                 .d = (float*)w,
                 .e = (float*)mean,
                 .out = (float*)rstd,
                 .f = dw ? m->partial : NULL,
                 .rows = N,
                 .cols = C};
  nb__par_run(nb__ln_bwd_chunk, &p);
  if (!dw) return;
  for (size_t i = 0; i < NB__CHUNKS; i++) {
    const float* part = m->partial + i * 2 * (size_t)C;
    for (int c = 0; c < C; c++) {
      dw[c] += part[c];
      db[c] += part[C + c];
    }
  }
}

static void nb__ce_fwd_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e, V = (size_t)p->cols;
  nb_parallel_range((size_t)p->rows, NB__CHUNKS, i, &b, &e);
  p->counts[i] = nb_crossentropy_forward(p->out + b, p->a + b * V, p->b + b * V, p->ints + b,
                                         (int)(e - b), p->cols);
}
static void nb__ce_bwd_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e, V = (size_t)p->cols;
  nb_parallel_range((size_t)p->rows, NB__CHUNKS, i, &b, &e);
  memset(p->out + b * V, 0, (e - b) * V * sizeof(float)); /* its rows of dlogits, zeroed here */
  nb_crossentropy_backward(p->out + b * V, p->a + b * V, p->ints + b, p->scalar, (int)(e - b),
                           p->cols);
  if (p->c) /* distillation term: c = ps, d = pt */
    nb_kldiv_backward(p->out + b * V, p->c + b * V, p->d + b * V, p->ints + b, p->scalar2,
                      (int)(e - b), p->cols, p->temp);
}
static void nb__kl_fwd_chunk(void* ctx, size_t i) {
  nb__par_t* p = ctx;
  size_t b, e, V = (size_t)p->cols;
  nb_parallel_range((size_t)p->rows, NB__CHUNKS, i, &b, &e);
  nb_kldiv_forward(p->out + b, p->c + b * V, p->d + b * V, p->a + b * V, p->b + b * V, p->ints + b,
                   (int)(e - b), p->cols, p->temp);
}

/* Lays the activation arena out for B x T (sizes in floats; one allocation). */
static nb_status_t nb__ensure_acts(nb_model_t* m, int B, int T) {
  if (m->acts && B <= m->cap_B && T <= m->cap_T) return NB_OK;
  nb__free_acts(m);
  int L = m->Ls, C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab;
  size_t N = (size_t)B * T, NC = N * C, NV = N * V, att = (size_t)B * NH * T;
  /* attention runs (batch, head) ranges on the pool, one scratch per range; the ranges are
   * whole heads, so the results do not depend on how many there are */
  int chunks = nb_parallel_threads();
  if (chunks > NB__CHUNKS) chunks = NB__CHUNKS;
  if (chunks > B * m->NHl) chunks = B * m->NHl;
  size_t ws = (nb_attention_blocked_scratch(T, m->Cl, m->NHl) + 15) / 16 * 16;
  /* per layer: ln1 atty attproj res2 ln2 fcproj res3 (7 NC), qkv (3 NC), fch and fch_gelu
   * (8 NC), four row statistics (4 N) and the attention row statistics (no (T, T) matrix: the
   * backward recomputes the probabilities) */
  size_t per_layer = NC * 18 + N * 4 + att;
  size_t total = per_layer * L + NC * 2 + N * 3 + NV * 2 /* encoded lnf, stats, logits probs */
                 + NC * 14 + NV + ws * (size_t)chunks    /* backward and attention scratch */
                 + NV * 2 + N                            /* distillation */
                 + (size_t)NB__CHUNKS * 4 * C;           /* gradient partials */
  nb_status_t st = NB_OK;
  NB_CHECK_GOTO(nb_aligned_alloc((void**)&m->acts, total, sizeof(float), "activations"), st, fail);
  NB_CHECK_GOTO(nb_calloc((void**)&m->la, (size_t)L, sizeof *m->la, "activation table"), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&m->tokens, N, sizeof(int), "tokens"), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&m->targets, N, sizeof(int), "targets"), st, fail);
  float* p = m->acts;
#define TAKE(dst, n) \
  do {               \
    (dst) = p;       \
    p += (n);        \
  } while (0)
  for (int l = 0; l < L; l++) {
    nb__layer_acts_t* a = &m->la[l];
    TAKE(a->ln1, NC);
    TAKE(a->ln1_mean, N);
    TAKE(a->ln1_rstd, N);
    TAKE(a->qkv, 3 * NC);
    TAKE(a->atty, NC);
    TAKE(a->lse, att);
    TAKE(a->attproj, NC);
    TAKE(a->res2, NC);
    TAKE(a->ln2, NC);
    TAKE(a->ln2_mean, N);
    TAKE(a->ln2_rstd, N);
    TAKE(a->fch, 4 * NC);
    TAKE(a->fch_gelu, 4 * NC);
    TAKE(a->fcproj, NC);
    TAKE(a->res3, NC);
  }
  TAKE(m->encoded, NC);
  TAKE(m->lnf, NC);
  TAKE(m->lnf_mean, N);
  TAKE(m->lnf_rstd, N);
  TAKE(m->logits, NV);
  TAKE(m->probs, NV);
  TAKE(m->losses, N);
  TAKE(m->dres, NC);
  TAKE(m->dln, NC);
  TAKE(m->dqkv, 3 * NC);
  TAKE(m->datty, NC);
  TAKE(m->dfch, 4 * NC);
  TAKE(m->dfch_gelu, 4 * NC);
  TAKE(m->dlogits, NV);
  TAKE(m->att_ws, ws * (size_t)chunks);
  TAKE(m->ps, NV);
  TAKE(m->pt, NV);
  TAKE(m->kl, N);
  TAKE(m->partial, (size_t)NB__CHUNKS * 4 * C);
#undef TAKE
  if ((size_t)(p - m->acts) > total) return nb_error(NB_ERR_INTERNAL, "activation arena overrun");
  m->att_ws_n = ws;
  m->att_chunks = chunks;
  m->cap_B = B;
  m->cap_T = T;
  return NB_OK;
fail:
  nb__free_acts(m);
  return st;
}

/* Blocked attention over the pool: chunk i takes the i-th range of the B * NH (batch, head)
 * pairs with its own scratch. */
typedef struct {
  nb_model_t* m;
  float *out, *lse, *dqkv;
  const float *qkv, *dout;
  int B, T, chunks, backward;
} nb__att_par_t;

static void nb__att_chunk(void* ctx, size_t i) {
  nb__att_par_t* p = ctx;
  nb_model_t* m = p->m;
  int C = m->Cl, NH = m->NHl; /* this shard's heads */
  size_t b, e;
  nb_parallel_range((size_t)p->B * NH, (size_t)p->chunks, i, &b, &e);
  float* ws = m->att_ws + i * m->att_ws_n;
  if (p->backward)
    nb_attention_blocked_backward(p->dqkv, p->dout, p->out, p->lse, p->qkv, p->B, p->T, C, NH,
                                  (int)b, (int)e, ws, NB_CPU_PATH_AUTO, 0);
  else
    nb_attention_blocked_forward(p->out, p->lse, p->qkv, p->B, p->T, C, NH, (int)b, (int)e, ws,
                                 NB_CPU_PATH_AUTO);
}

static void nb__par_attention(nb_model_t* m, nb__att_par_t* p) {
  p->m = m;
  p->chunks = m->att_chunks < p->B * m->NHl ? m->att_chunks : p->B * m->NHl;
  if (p->chunks == 1)
    nb__att_chunk(p, 0);
  else
    nb_parallel_for((size_t)p->chunks, nb__att_chunk, p);
}

static int nb__par_crossentropy(nb_model_t* m, int N) {
  nb__par_t p = {.out = m->losses,
                 .a = m->probs,
                 .b = m->logits,
                 .ints = m->targets,
                 .rows = N,
                 .cols = m->cfg.vocab};
  nb__par_run(nb__ce_fwd_chunk, &p);
  int count = 0;
  for (int i = 0; i < NB__CHUNKS; i++) count += p.counts[i];
  return count;
}

/* The forward through the first nl layers; with nl == n_layer also the final LayerNorm and the
 * logits (nb__forward). */
static nb_status_t nb__forward_layers_run(nb_model_t* m, const int* tokens, const int* targets,
                                          const float* x_in, int B, int T, int nl) {
  if (!m || !tokens) return nb_error(NB_ERR_INVALID, "model forward: NULL model or tokens");
  const nb_model_config_t* c = &m->cfg;
  if (B < 1 || T < 1 || T > c->ctx)
    return nb_error(NB_ERR_INVALID, "model forward: B=%d T=%d (need B >= 1, 1 <= T <= ctx %d)", B,
                    T, c->ctx);
  size_t N = (size_t)B * T;
  for (size_t i = 0; i < N; i++) {
    if (tokens[i] < 0 || tokens[i] >= c->vocab)
      return nb_error(NB_ERR_INVALID, "model forward: token %d at %zu not in [0, %d)", tokens[i], i,
                      c->vocab);
    if (targets && (targets[i] < -1 || targets[i] >= c->vocab))
      return nb_error(NB_ERR_INVALID, "model forward: target %d at %zu not in [-1, %d)", targets[i],
                      i, c->vocab);
  }
  NB_CHECK(nb__ensure_acts(m, B, T));
  memcpy(m->tokens, tokens, N * sizeof(int));
  if (targets) memcpy(m->targets, targets, N * sizeof(int));
  m->B = B;
  m->T = T;
  m->have_targets = 0;
  int C = c->n_embd, V = c->vocab, n = (int)N;
  int Cl = m->Cl, lead = m->tp.rank == 0; /* the row-parallel biases are added once */
  /* the last pipeline stage (or the whole model) ends in the final LayerNorm and the logits */
  int head = nl == m->Ls && m->pp_stage == m->pp_stages - 1;

  if (x_in) /* a later pipeline stage: the previous stage's output is the residual stream */
    memcpy(m->encoded, x_in, N * C * sizeof(float));
  else
    nb_embedding_forward(m->encoded, m->tokens, GP(m, V_WTE), GP(m, V_WPE), B, T, C);
  /* Each residual add is fused with the LayerNorm after it: res2 with ln2, res3 with the next
   * layer's ln1 (or the final one). Layer 0's ln1 reads the embeddings. */
  const float* residual = m->encoded;
  if (nl > 0)
    nb__par_ln_forward(m->la[0].ln1, m->la[0].ln1_mean, m->la[0].ln1_rstd, residual,
                       LP(m, 0, P_LN1W), LP(m, 0, P_LN1B), n, C);
  else if (head)
    nb__par_ln_forward(m->lnf, m->lnf_mean, m->lnf_rstd, residual, GP(m, V_LNFW(m)),
                       GP(m, V_LNFB(m)), n, C);
  for (int l = 0; l < nl; l++) {
    nb__layer_acts_t* a = &m->la[l];
    nb__mm_forward(a->qkv, a->ln1, LP(m, l, P_QKVW), LP(m, l, P_QKVB), n, C, 3 * Cl);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_QKV, a->ln1, a->qkv, n));
    nb__att_par_t ap = {.out = a->atty, .lse = a->lse, .qkv = a->qkv, .B = B, .T = T};
    nb__par_attention(m, &ap);
    nb__mm_forward(a->attproj, a->atty, LP(m, l, P_PROJW), lead ? LP(m, l, P_PROJB) : NULL, n, Cl,
                   C);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_ATTN_PROJ, a->atty, a->attproj, n));
    NB_CHECK(nb__tp_sum(m, a->attproj, N * C));
    nb__par_res_ln_forward(a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, residual, a->attproj,
                           LP(m, l, P_LN2W), LP(m, l, P_LN2B), n, C);
    /* the fc bias joins the GELU pass instead of being broadcast before the product */
    nb__mm_forward(a->fch, a->ln2, LP(m, l, P_FCW), NULL, n, C, 4 * Cl);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_FC, a->ln2, a->fch, n));
    nb__par_t gp = {
        .out = a->fch_gelu, .a = a->fch, .d = LP(m, l, P_FCB), .rows = n, .cols = 4 * Cl};
    nb__par_run(nb__bias_gelu_fwd_chunk, &gp);
    nb__mm_forward(a->fcproj, a->fch_gelu, LP(m, l, P_FCPROJW), lead ? LP(m, l, P_FCPROJB) : NULL,
                   n, 4 * Cl, C);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_FC_PROJ, a->fch_gelu, a->fcproj, n));
    NB_CHECK(nb__tp_sum(m, a->fcproj, N * C));
    if (l + 1 < nl) {
      nb__layer_acts_t* an = &m->la[l + 1];
      nb__par_res_ln_forward(a->res3, an->ln1, an->ln1_mean, an->ln1_rstd, a->res2, a->fcproj,
                             LP(m, l + 1, P_LN1W), LP(m, l + 1, P_LN1B), n, C);
    } else if (head) {
      nb__par_res_ln_forward(a->res3, m->lnf, m->lnf_mean, m->lnf_rstd, a->res2, a->fcproj,
                             GP(m, V_LNFW(m)), GP(m, V_LNFB(m)), n, C);
    } else {
      nb__par_elementwise(nb__add_chunk, a->res3, a->res2, a->fcproj, N * C);
    }
    residual = a->res3;
  }
  if (!head) return NB_OK;
  nb__mm_forward(m->logits, m->lnf, GP(m, V_WTE), NULL, n, C, V);
  return NB_OK;
}

static nb_status_t nb__forward_layers(nb_model_t* m, const int* tokens, const int* targets, int B,
                                      int T, int nl) {
  int blas = nb_matmul_cpu_threads(1); /* the pool is the step's one thread set */
  nb_status_t s = nb__forward_layers_run(m, tokens, targets, NULL, B, T, nl);
  if (blas) nb_matmul_cpu_threads(blas);
  return s;
}

static nb_status_t nb__forward(nb_model_t* m, const int* tokens, const int* targets, int B, int T) {
  if (m && m->pp_stages > 1) /* one stage alone is not the model */
    return nb_error(NB_ERR_UNSUPPORTED,
                    "model forward: a pipeline stage runs through train/pipeline.h, not alone");
  return nb__forward_layers(m, tokens, targets, B, T, m ? m->Ls : 0);
}

nb_status_t nb_model_forward(nb_model_t* m, const int* tokens, const int* targets, int B, int T,
                             float* loss) {
  NB_CHECK(nb__forward(m, tokens, targets, B, T));
  m->alpha = 0.0f;
  if (!targets) return NB_OK;
  int N = B * T;
  m->count = nb__par_crossentropy(m, N);
  double s = 0.0;
  for (int i = 0; i < N; i++) s += m->losses[i];
  if (loss) *loss = m->count ? (float)(s / m->count) : 0.0f;
  m->have_targets = 1;
  return NB_OK;
}

nb_status_t nb_model_forward_distill(nb_model_t* m, const int* tokens, const int* targets,
                                     const float* teacher_logits, float alpha, float temp, int B,
                                     int T, float* loss) {
  if (!targets || !teacher_logits)
    return nb_error(NB_ERR_INVALID, "distill forward: targets and teacher logits are required");
  if (!(alpha >= 0.0f && alpha <= 1.0f) || !(temp > 0.0f))
    return nb_error(NB_ERR_INVALID, "distill forward: alpha %g must be in [0, 1], temp %g > 0",
                    (double)alpha, (double)temp);
  NB_CHECK(nb__forward(m, tokens, targets, B, T));
  int N = B * T, V = m->cfg.vocab;
  m->count = nb__par_crossentropy(m, N);
  nb__par_t kp = {.out = m->kl,
                  .a = m->logits,
                  .b = (float*)teacher_logits,
                  .c = m->ps,
                  .d = m->pt,
                  .ints = m->targets,
                  .rows = N,
                  .cols = V,
                  .temp = temp};
  nb__par_run(nb__kl_fwd_chunk, &kp);
  double ce = 0.0, kl = 0.0;
  for (int i = 0; i < N; i++) {
    ce += m->losses[i];
    kl += m->kl[i];
  }
  if (loss) *loss = m->count ? (float)(((1.0 - alpha) * ce + alpha * kl) / m->count) : 0.0f;
  m->alpha = alpha;
  m->temp = temp;
  m->have_targets = 1;
  return NB_OK;
}

/* The last stage's (or the whole model's) backward through the loss, the tied output head and
 * the final LayerNorm: dres receives the gradient of the last layer's output. The gradient
 * pointers are NULL for a frozen model. */
static void nb__backward_head(nb_model_t* m, float* dwte, float* dlnfw, float* dlnfb) {
  int B = m->B, T = m->T, L = m->Ls, C = m->cfg.n_embd, V = m->cfg.vocab;
  int n = B * T;
  size_t N = (size_t)n, NC = N * C;
  if (m->count == 0) {
    memset(m->dlogits, 0, N * V * sizeof(float));
  } else { /* each chunk zeroes its rows of dlogits first */
    float inv = 1.0f / (float)m->count;
    nb__par_t p = {.out = m->dlogits,
                   .a = m->probs,
                   .ints = m->targets,
                   .rows = n,
                   .cols = V,
                   .scalar = (1.0f - m->alpha) * inv,
                   .scalar2 = m->alpha * inv,
                   .temp = m->temp};
    if (m->alpha > 0.0f) {
      p.c = m->ps;
      p.d = m->pt;
    }
    nb__par_run(nb__ce_bwd_chunk, &p);
  }
  nb__mm_backward(m, m->dln, dwte, NULL, m->dlogits, m->lnf, GP(m, V_WTE), n, C, V);
  memset(m->dres, 0, NC * sizeof(float));
  const float* last = L > 0 ? m->la[L - 1].res3 : m->encoded;
  nb__par_ln_backward(m, m->dres, dlnfw, dlnfb, m->dln, last, GP(m, V_LNFW(m)), m->lnf_mean,
                      m->lnf_rstd, n, C);
}

/* dx_out: a pipeline stage before the last: the gradient of its output (B, T, C); NULL on the
 * last stage (or the whole model), which starts from its loss. */
static nb_status_t nb__backward(nb_model_t* m, const float* dx_out) {
  int last_stage = m->pp_stage == m->pp_stages - 1;
  if (!m->have_targets)
    return nb_error(NB_ERR_INVALID, "model backward: no forward with targets before it");
  if (!last_stage && !dx_out)
    return nb_error(NB_ERR_INVALID, "model backward: stage %d needs its output's gradient",
                    m->pp_stage);
  const nb_model_config_t* c = &m->cfg;
  int B = m->B, T = m->T, L = m->Ls, C = c->n_embd, Cl = m->Cl;
  int n = B * T;
  size_t N = (size_t)n, NC = N * C;
  int fz = m->frozen;
  if (!m->mm_partial)
    NB_CHECK(nb_aligned_alloc((void**)&m->mm_partial, nb__mm_partial_floats(C, c->vocab),
                              sizeof(float), "dweight partial products"));
#define G(ptr) (fz ? NULL : (ptr))

  if (last_stage)
    nb__backward_head(m, G(GG(m, V_WTE)), G(GG(m, V_LNFW(m))), G(GG(m, V_LNFB(m))));
  else /* the gradient of this stage's output, from the next stage */
    memcpy(m->dres, dx_out, NC * sizeof(float));
  for (int l = L - 1; l >= 0; l--) {
    nb__layer_acts_t* a = &m->la[l];
    const float* residual = l == 0 ? m->encoded : m->la[l - 1].res3;
    /* dres is d(res3) = d(res2) (skip) = d(fcproj) */
    nb__mm_backward(m, m->dfch_gelu, G(LG(m, l, P_FCPROJW)), G(LG(m, l, P_FCPROJB)), m->dres,
                    a->fch_gelu, LP(m, l, P_FCPROJW), n, 4 * Cl, C);
    if (m->lora)
      nb__lora_backward(m->lora, l, NB_SITE_FC_PROJ, a->fch_gelu, m->dres, m->dfch_gelu, n);
    /* dfch written (not accumulated) by the GELU pass, which also sums the fc bias gradient */
    nb__par_bias_gelu_backward(m, m->dfch, G(LG(m, l, P_FCB)), a->fch, m->dfch_gelu, n, 4 * Cl);
    nb__mm_backward(m, m->dln, G(LG(m, l, P_FCW)), NULL, m->dfch, a->ln2, LP(m, l, P_FCW), n, C,
                    4 * Cl);
    if (m->lora) nb__lora_backward(m->lora, l, NB_SITE_FC, a->ln2, m->dfch, m->dln, n);
    NB_CHECK(nb__tp_sum(m, m->dln, NC));
    nb__par_ln_backward(m, m->dres, G(LG(m, l, P_LN2W)), G(LG(m, l, P_LN2B)), m->dln, a->res2,
                        LP(m, l, P_LN2W), a->ln2_mean, a->ln2_rstd, n, C);
    /* dres is now d(res2) = d(residual) (skip) = d(attproj) */
    nb__mm_backward(m, m->datty, G(LG(m, l, P_PROJW)), G(LG(m, l, P_PROJB)), m->dres, a->atty,
                    LP(m, l, P_PROJW), n, Cl, C);
    if (m->lora) nb__lora_backward(m->lora, l, NB_SITE_ATTN_PROJ, a->atty, m->dres, m->datty, n);
    /* dqkv written by the attention's backward (every column of every row: no zeroing pass) */
    nb__att_par_t ap = {.out = a->atty,
                        .lse = a->lse,
                        .dqkv = m->dqkv,
                        .qkv = a->qkv,
                        .dout = m->datty,
                        .B = B,
                        .T = T,
                        .backward = 1};
    nb__par_attention(m, &ap);
    nb__mm_backward(m, m->dln, G(LG(m, l, P_QKVW)), G(LG(m, l, P_QKVB)), m->dqkv, a->ln1,
                    LP(m, l, P_QKVW), n, C, 3 * Cl);
    if (m->lora) nb__lora_backward(m->lora, l, NB_SITE_QKV, a->ln1, m->dqkv, m->dln, n);
    NB_CHECK(nb__tp_sum(m, m->dln, NC));
    nb__par_ln_backward(m, m->dres, G(LG(m, l, P_LN1W)), G(LG(m, l, P_LN1B)), m->dln, residual,
                        LP(m, l, P_LN1W), a->ln1_mean, a->ln1_rstd, n, C);
  }
  /* a later pipeline stage leaves d(its input) in dres (nb_model_stage_dinput) */
  if (!fz && m->pp_stage == 0)
    nb_embedding_backward(GG(m, V_WTE), GG(m, V_WPE), m->dres, m->tokens, B, T, C);
#undef G
  return NB_OK;
}

nb_status_t nb_model_backward(nb_model_t* m) {
  if (!m) return nb_error(NB_ERR_INVALID, "model backward: NULL model");
  if (m->pp_stages > 1)
    return nb_error(NB_ERR_UNSUPPORTED,
                    "model backward: a pipeline stage runs through train/pipeline.h, not alone");
  int blas = nb_matmul_cpu_threads(1); /* the pool is the step's one thread set */
  nb_status_t s = nb__backward(m, NULL);
  if (blas) nb_matmul_cpu_threads(blas);
  return s;
}

/* ---- pipeline stages ---------------------------------------------------------------------- */

nb_status_t nb_model_stage_forward(nb_model_t* m, const int* tokens, const int* targets,
                                   const float* x_in, int B, int T, float* loss) {
  if (!m) return nb_error(NB_ERR_INVALID, "stage forward: NULL model");
  int first = m->pp_stage == 0, last = m->pp_stage == m->pp_stages - 1;
  if (first == (x_in != NULL))
    return nb_error(NB_ERR_INVALID, "stage forward: stage %d %s an input activation", m->pp_stage,
                    first ? "takes tokens, not" : "needs");
  if (last && !targets)
    return nb_error(NB_ERR_INVALID, "stage forward: the last stage needs the targets");
  int blas = nb_matmul_cpu_threads(1);
  nb_status_t st = nb__forward_layers_run(m, tokens, targets, x_in, B, T, m->Ls);
  if (blas) nb_matmul_cpu_threads(blas);
  NB_CHECK(st);
  m->alpha = 0.0f;
  m->have_targets = 1; /* backward may run */
  if (loss) *loss = 0.0f;
  if (!last) return NB_OK;
  int N = B * T;
  m->count = nb__par_crossentropy(m, N);
  double s = 0.0;
  for (int i = 0; i < N; i++) s += m->losses[i];
  if (loss) *loss = m->count ? (float)(s / m->count) : 0.0f;
  return NB_OK;
}

const float* nb_model_stage_output(const nb_model_t* m) {
  return m->Ls > 0 ? m->la[m->Ls - 1].res3 : m->encoded;
}

nb_status_t nb_model_stage_backward(nb_model_t* m, const float* dx_out) {
  if (!m) return nb_error(NB_ERR_INVALID, "stage backward: NULL model");
  int blas = nb_matmul_cpu_threads(1);
  nb_status_t s = nb__backward(m, dx_out);
  if (blas) nb_matmul_cpu_threads(blas);
  return s;
}

const float* nb_model_stage_dinput(const nb_model_t* m) {
  return m->dres;
}

nb_status_t nb_model_pp_reduce_grads(nb_model_t* m) {
  if (m->pp_stages == 1) return NB_OK;
  /* the embeddings (used by the first stage, and wte by the last as the output head) and the
   * final LayerNorm (the last stage): their contributions meet on every stage */
  const size_t idx[4] = {V_WTE, V_WPE, V_LNFW(m), V_LNFB(m)};
  for (size_t i = 0; i < 4; i++) NB_CHECK(nb__pp_sum(m, GG(m, idx[i]), m->views[idx[i]].numel));
  return NB_OK;
}

static void nb__slot_save(const nb_model_t* m, nb__slot_t* s) {
#define X(type, name) s->name = m->name;
  NB__SLOT_FIELDS(X)
#undef X
}

static void nb__slot_load(nb_model_t* m, const nb__slot_t* s) {
#define X(type, name) m->name = s->name;
  NB__SLOT_FIELDS(X)
#undef X
}

/* Frees every slot but the current one (which stays in the model's fields). */
static void nb__slots_free(nb_model_t* m) {
  if (!m->slots) return;
  nb__slot_t cur;
  nb__slot_save(m, &cur);
  for (int i = 0; i < m->n_slots; i++) {
    if (i == m->cur_slot) continue;
    nb__slot_load(m, &m->slots[i]);
    nb__free_acts(m);
  }
  nb__slot_load(m, &cur);
  nb_free(m->slots);
  m->slots = NULL;
  m->n_slots = m->cur_slot = 0;
}

nb_status_t nb_model_set_slots(nb_model_t* m, int k) {
  if (!m || k < 1 || k > 256) return nb_error(NB_ERR_INVALID, "model: slots %d not in [1, 256]", k);
  nb__slots_free(m);
  if (k == 1) return NB_OK;
  NB_CHECK(nb_calloc((void**)&m->slots, (size_t)k, sizeof *m->slots, "activation slots"));
  m->n_slots = k;
  m->cur_slot = 0;
  return NB_OK;
}

nb_status_t nb_model_use_slot(nb_model_t* m, int i) {
  int n = m && m->slots ? m->n_slots : 1;
  if (!m || i < 0 || i >= n) return nb_error(NB_ERR_INVALID, "model: slot %d not in [0, %d)", i, n);
  if (i == m->cur_slot) return NB_OK;
  nb__slot_save(m, &m->slots[m->cur_slot]);
  nb__slot_load(m, &m->slots[i]);
  m->cur_slot = i;
  return NB_OK;
}

/* ---- greedy decoding. Each prompt goes once through the training forward (B = 1), whose packed
 * qkv rows fill that sequence's per-layer K/V caches; each further token costs one position per
 * sequence: the projections of all active sequences in one product (cblas_sgemv for one, sgemm
 * for several), attention of each query against its own cached keys. The products sum in another
 * order than the full forward's sgemm, so logits agree to rounding, not to the bit. */

/* Caches for nseq sequences, (nseq, L, ctx, C) each, and the activations of nseq rows. */
static nb_status_t nb__ensure_decode(nb_model_t* m, int nseq) {
  if (m->dec && nseq <= m->dec_cap) return NB_OK;
  nb_free(m->dec);
  m->dec = NULL;
  m->dec_cap = 0;
  int L = m->cfg.n_layer, C = m->cfg.n_embd, ctx = m->cfg.ctx, V = m->cfg.vocab;
  size_t S = (size_t)nseq, cache = S * L * ctx * C;
  size_t total = 2 * cache + S * ((size_t)C * 15 + V + 2) + (size_t)ctx;
  NB_CHECK(nb_aligned_alloc((void**)&m->dec, total, sizeof(float), "decoding caches"));
  float* p = m->dec;
  m->dec_k = p, p += cache;
  m->dec_v = p, p += cache;
  m->dec_x = p, p += S * C;
  m->dec_ln = p, p += S * C;
  m->dec_qkv = p, p += S * 3 * C;
  m->dec_y = p, p += S * C;
  m->dec_o = p, p += S * C;
  m->dec_h = p, p += S * 4 * C;
  m->dec_hg = p, p += S * 4 * C;
  m->dec_logits = p, p += S * V;
  m->dec_mean = p, p += S;
  m->dec_rstd = p, p += S;
  m->dec_att = p;
  m->dec_cap = nseq;
  return NB_OK;
}

/* Keys (or values) of sequence slot, layer l, from position 0: (ctx, C) rows. */
static float* nb__dec_cache(nb_model_t* m, float* base, int slot, int l) {
  return base + ((size_t)slot * m->cfg.n_layer + (size_t)l) * m->cfg.ctx * m->cfg.n_embd;
}

/* out (N, OC) = inp (N, IC) W^T (+ bias): nb_matmul_forward, as a GEMV for one row. */
static void nb__linear(float* out, const float* inp, const float* w, const float* bias, int N,
                       int IC, int OC) {
  if (N > 1) {
    nb_matmul_forward(out, inp, w, bias, N, IC, OC);
    return;
  }
  if (bias) memcpy(out, bias, (size_t)OC * sizeof(float));
  cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, IC, 1.0f, w, IC, inp, 1, bias ? 1.0f : 0.0f, out, 1);
}

/* Runs tokens (n <= ctx, validated by the forward) and caches their keys and values in slot;
 * *logits = the last position's row (in the forward's logits). */
static nb_status_t nb__decode_prefill(nb_model_t* m, int slot, const int* tokens, int n,
                                      const float** logits) {
  NB_CHECK(nb__forward(m, tokens, NULL, 1, n));
  int L = m->cfg.n_layer, C = m->cfg.n_embd;
  for (int l = 0; l < L; l++) {
    const float* qkv = m->la[l].qkv;
    float* kc = nb__dec_cache(m, m->dec_k, slot, l);
    float* vc = nb__dec_cache(m, m->dec_v, slot, l);
    for (int t = 0; t < n; t++) {
      memcpy(kc + (size_t)t * C, qkv + (size_t)t * 3 * C + C, (size_t)C * sizeof(float));
      memcpy(vc + (size_t)t * C, qkv + (size_t)t * 3 * C + 2 * C, (size_t)C * sizeof(float));
    }
  }
  *logits = m->logits + (size_t)(n - 1) * m->cfg.vocab;
  return NB_OK;
}

/* One position for each of N rows: token tok[r] at position pos[r] (< ctx) of sequence slot[r],
 * whose positions [0, pos[r]) are cached. The ops of nb__forward row by row, LoRA adapters
 * included; appends each row's key and value. Logits land in dec_logits (N, vocab). With tok
 * NULL the rows are already in dec_x, entering layer l0 (only layers [l0, L) are run). */
static nb_status_t nb__decode_step(nb_model_t* m, int N, const int* tok, const int* pos,
                                   const int* slot, int l0) {
  const nb_model_config_t* c = &m->cfg;
  int L = c->n_layer, C = c->n_embd, NH = c->n_head, V = c->vocab, hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  float *x = m->dec_x, *ln = m->dec_ln, *qkv = m->dec_qkv, *y = m->dec_y, *o = m->dec_o;
  float *h = m->dec_h, *hg = m->dec_hg, *att = m->dec_att, *mean = m->dec_mean;
  float* rstd = m->dec_rstd;
  size_t NC = (size_t)N * C;
  for (int r = 0; tok && r < N; r++)
    nb_embedding_forward(x + (size_t)r * C, &tok[r], GP(m, V_WTE),
                         GP(m, V_WPE) + (size_t)pos[r] * C, 1, 1, C);
  for (int l = l0; l < L; l++) {
    nb_layernorm_forward(ln, mean, rstd, x, LP(m, l, P_LN1W), LP(m, l, P_LN1B), N, C);
    nb__linear(qkv, ln, LP(m, l, P_QKVW), LP(m, l, P_QKVB), N, C, 3 * C);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_QKV, ln, qkv, N));
    for (int r = 0; r < N; r++) {
      const float* q = qkv + (size_t)r * 3 * C;
      float* kc = nb__dec_cache(m, m->dec_k, slot[r], l);
      float* vc = nb__dec_cache(m, m->dec_v, slot[r], l);
      int t = pos[r];
      memcpy(kc + (size_t)t * C, q + C, (size_t)C * sizeof(float));
      memcpy(vc + (size_t)t * C, q + 2 * C, (size_t)C * sizeof(float));
      for (int hd = 0; hd < NH; hd++) {
        size_t off = (size_t)hd * hs;
        /* scores against keys [0, t], the softmax of nb_attention_forward, then P V */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, t + 1, hs, scale, kc + off, C, q + off, 1, 0.0f,
                    att, 1);
        float mx = att[0];
        for (int j = 1; j <= t; j++)
          if (att[j] > mx) mx = att[j];
        float sum = 0.0f;
        for (int j = 0; j <= t; j++) {
          att[j] = expf(att[j] - mx);
          sum += att[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++) att[j] *= inv;
        cblas_sgemv(CblasRowMajor, CblasTrans, t + 1, hs, 1.0f, vc + off, C, att, 1, 0.0f,
                    y + (size_t)r * C + off, 1);
      }
    }
    nb__linear(o, y, LP(m, l, P_PROJW), LP(m, l, P_PROJB), N, C, C);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_ATTN_PROJ, y, o, N));
    for (size_t i = 0; i < NC; i++) x[i] = x[i] + o[i];
    nb_layernorm_forward(ln, mean, rstd, x, LP(m, l, P_LN2W), LP(m, l, P_LN2B), N, C);
    nb__linear(h, ln, LP(m, l, P_FCW), LP(m, l, P_FCB), N, C, 4 * C);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_FC, ln, h, N));
    nb_gelu_forward(hg, h, 4 * NC);
    nb__linear(o, hg, LP(m, l, P_FCPROJW), LP(m, l, P_FCPROJB), N, 4 * C, C);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_FC_PROJ, hg, o, N));
    for (size_t i = 0; i < NC; i++) x[i] = x[i] + o[i];
  }
  nb_layernorm_forward(ln, mean, rstd, x, GP(m, V_LNFW(m)), GP(m, V_LNFB(m)), N, C);
  nb__linear(m->dec_logits, ln, GP(m, V_WTE), NULL, N, C, V);
  return NB_OK;
}

/* The last row's logits for a window of T tokens (past the context, where nothing cached is
 * valid): the forward over every row through layers [0, L - 1), then in the last layer only the
 * keys and values of rows [0, T - 1) and one decoding position for the last row, whose logits
 * are the only ones used. Uses slot's caches as scratch; *logits = dec_logits row 0. */
static nb_status_t nb__decode_window(nb_model_t* m, int slot, const int* tokens, int T,
                                     const float** logits) {
  int L = m->cfg.n_layer, C = m->cfg.n_embd, l = L - 1, n = T - 1, pos = T - 1;
  NB_CHECK(nb__forward_layers(m, tokens, NULL, 1, T, l));
  const float* res = l > 0 ? m->la[l - 1].res3 : m->encoded;
  nb__layer_acts_t* a = &m->la[l];
  if (n > 0) {
    nb__par_ln_forward(a->ln1, a->ln1_mean, a->ln1_rstd, res, LP(m, l, P_LN1W), LP(m, l, P_LN1B), n,
                       C);
    nb_matmul_forward(a->qkv, a->ln1, LP(m, l, P_QKVW), LP(m, l, P_QKVB), n, C, 3 * C);
    if (m->lora) NB_CHECK(nb__lora_forward(m->lora, l, NB_SITE_QKV, a->ln1, a->qkv, n));
    float* kc = nb__dec_cache(m, m->dec_k, slot, l);
    float* vc = nb__dec_cache(m, m->dec_v, slot, l);
    for (int t = 0; t < n; t++) {
      memcpy(kc + (size_t)t * C, a->qkv + (size_t)t * 3 * C + C, (size_t)C * sizeof(float));
      memcpy(vc + (size_t)t * C, a->qkv + (size_t)t * 3 * C + 2 * C, (size_t)C * sizeof(float));
    }
  }
  memcpy(m->dec_x, res + (size_t)pos * C, (size_t)C * sizeof(float));
  NB_CHECK(nb__decode_step(m, 1, NULL, &pos, &slot, l)); /* dec_x enters layer l */
  *logits = m->dec_logits;
  return NB_OK;
}

/* Per-sequence state of a cached decoding. */
typedef struct {
  int* seq;      /* prompt, then the emitted tokens */
  int len;       /* tokens in seq */
  int cached;    /* positions [0, cached) of seq are in the K/V caches */
  int fin;       /* stop token emitted or max_new reached */
  int max_new;   /* this sequence's limit */
  int* out;      /* caller's output */
  int* n_out;    /* caller's count */
  float* logits; /* nullable: row k of the logits each token was chosen from */
} nb__gen_seq_t;

/* Appends the argmax of row (lowest index on ties); finishes on the stop token or at max_new. */
static void nb__gen_emit(nb__gen_seq_t* g, const float* row, int V, int stop_token) {
  int best = 0;
  for (int j = 1; j < V; j++)
    if (row[j] > row[best]) best = j;
  if (g->logits) memcpy(g->logits + (size_t)*g->n_out * V, row, (size_t)V * sizeof(float));
  g->seq[g->len++] = best;
  g->out[(*g->n_out)++] = best;
  if (best == stop_token || *g->n_out == g->max_new) g->fin = 1;
}

/* The cached decoding of B sequences; logits0 (nullable) receives sequence 0's rows. */
static nb_status_t nb__generate_cached(nb_model_t* m, int B, const int* const* prompts,
                                       const int* n_prompt, const int* max_new, int stop_token,
                                       int* const* out, int* n_out, float* logits0) {
  if (!m || B < 1 || !prompts || !n_prompt || !max_new || !out || !n_out)
    return nb_error(NB_ERR_INVALID, "generate: need a model, B >= 1 and every array");
  if (nb_model_is_sharded(m))
    return nb_error(NB_ERR_UNSUPPORTED,
                    "generate: K/V-cached decoding of a tensor-parallel shard or a pipeline stage "
                    "is not supported yet");
  int V = m->cfg.vocab, ctx = m->cfg.ctx;
  size_t total = 0;
  for (int b = 0; b < B; b++) {
    n_out[b] = 0;
    if (!prompts[b] || !out[b] || n_prompt[b] < 1 || max_new[b] < 0)
      return nb_error(NB_ERR_INVALID,
                      "generate: sequence %d: need a prompt and an output, n_prompt %d >= 1, "
                      "max_new %d >= 0",
                      b, n_prompt[b], max_new[b]);
    for (int i = 0; i < n_prompt[b]; i++)
      if (prompts[b][i] < 0 || prompts[b][i] >= V)
        return nb_error(NB_ERR_INVALID,
                        "generate: sequence %d: prompt token %d at %d not in [0, %d)", b,
                        prompts[b][i], i, V);
    total += (size_t)n_prompt[b] + (size_t)max_new[b];
  }
  nb_status_t st = NB_OK;
  int *seq = NULL, *rows = NULL;
  nb__gen_seq_t* g = NULL;
  NB_CHECK_GOTO(nb_alloc((void**)&seq, total, sizeof(int), "generate sequences"), st, done);
  NB_CHECK_GOTO(nb_alloc((void**)&rows, (size_t)B * 4, sizeof(int), "generate rows"), st, done);
  NB_CHECK_GOTO(nb_calloc((void**)&g, (size_t)B, sizeof *g, "generate state"), st, done);
  NB_CHECK_GOTO(nb__ensure_decode(m, B), st, done);
  int *tok = rows, *pos = rows + B, *slot = rows + 2 * B, *who = rows + 3 * B;
  size_t off = 0;
  for (int b = 0; b < B; off += (size_t)n_prompt[b] + (size_t)max_new[b], b++) {
    g[b] = (nb__gen_seq_t){.seq = seq + off,
                           .len = n_prompt[b],
                           .fin = max_new[b] == 0,
                           .max_new = max_new[b],
                           .out = out[b],
                           .n_out = &n_out[b],
                           .logits = b == 0 ? logits0 : NULL};
    memcpy(g[b].seq, prompts[b], (size_t)n_prompt[b] * sizeof(int));
  }
  for (;;) {
    /* every unfinished sequence advances by one token per round: those whose prefix is cached
     * together in one step, the others alone */
    int N = 0, any = 0;
    for (int b = 0; b < B; b++) {
      nb__gen_seq_t* s = &g[b];
      if (s->fin) continue;
      any = 1;
      const float* row = NULL;
      if (s->len <= ctx && s->cached == s->len - 1 && s->cached > 0) {
        tok[N] = s->seq[s->len - 1], pos[N] = s->len - 1, slot[N] = b, who[N] = b;
        N++;
        continue;
      }
      if (s->len <= ctx) {
        NB_CHECK_GOTO(nb__decode_prefill(m, b, s->seq, s->len, &row), st, done);
        s->cached = s->len;
      } else {
        /* past ctx the window slides: every position moves (learned absolute positions), so
         * nothing cached stays valid and the whole window is rerun, as the reference does */
        NB_CHECK_GOTO(nb__decode_window(m, b, s->seq + s->len - ctx, ctx, &row), st, done);
        s->cached = 0;
      }
      nb__gen_emit(s, row, V, stop_token);
    }
    if (!any) break;
    if (N == 0) continue;
    NB_CHECK_GOTO(nb__decode_step(m, N, tok, pos, slot, 0), st, done);
    for (int r = 0; r < N; r++) {
      g[who[r]].cached = pos[r] + 1;
      nb__gen_emit(&g[who[r]], m->dec_logits + (size_t)r * V, V, stop_token);
    }
  }
done:
  nb_free(seq);
  nb_free(rows);
  nb_free(g);
  return st;
}

/* The reference: each token reruns the forward over the window (the last ctx tokens). */
static nb_status_t nb__generate_full(nb_model_t* m, const int* prompt, int n_prompt, int max_new,
                                     int stop_token, int* out, int* n_out, float* logits_out) {
  int V = m->cfg.vocab, ctx = m->cfg.ctx;
  size_t cap = (size_t)n_prompt + (size_t)max_new;
  int* seq = NULL;
  NB_CHECK(nb_alloc((void**)&seq, cap, sizeof(int), "generate sequence"));
  memcpy(seq, prompt, (size_t)n_prompt * sizeof(int));
  size_t len = (size_t)n_prompt;
  nb_status_t st = NB_OK;
  for (int k = 0; k < max_new; k++) {
    int w = len > (size_t)ctx ? ctx : (int)len;
    st = nb_model_forward(m, seq + len - (size_t)w, NULL, 1, w, NULL);
    if (st != NB_OK) break;
    const float* row = m->logits + (size_t)(w - 1) * V;
    if (logits_out) memcpy(logits_out + (size_t)k * V, row, (size_t)V * sizeof(float));
    int best = 0;
    for (int j = 1; j < V; j++)
      if (row[j] > row[best]) best = j;
    seq[len++] = best;
    out[(*n_out)++] = best;
    if (best == stop_token) break;
  }
  nb_free(seq);
  return st;
}

nb_status_t nb__model_generate(nb_model_t* m, const int* prompt, int n_prompt, int max_new,
                               int stop_token, int use_cache, int* out, int* n_out,
                               float* logits_out) {
  if (!m || !prompt || !out || !n_out || n_prompt < 1 || max_new < 0)
    return nb_error(NB_ERR_INVALID, "generate: need a model, n_prompt >= 1, max_new >= 0");
  *n_out = 0;
  if (!use_cache)
    return nb__generate_full(m, prompt, n_prompt, max_new, stop_token, out, n_out, logits_out);
  return nb__generate_cached(m, 1, &prompt, &n_prompt, &max_new, stop_token, &out, n_out,
                             logits_out);
}

nb_status_t nb_model_generate_greedy(nb_model_t* m, const int* prompt, int n_prompt, int max_new,
                                     int stop_token, int* out, int* n_out) {
  return nb__model_generate(m, prompt, n_prompt, max_new, stop_token, 1, out, n_out, NULL);
}

nb_status_t nb_model_generate_greedy_batch(nb_model_t* m, int B, const int* const* prompts,
                                           const int* n_prompt, const int* max_new, int stop_token,
                                           int* const* out, int* n_out) {
  return nb__generate_cached(m, B, prompts, n_prompt, max_new, stop_token, out, n_out, NULL);
}

int nb_model_text_windows(const uint8_t* text, size_t len, int B, int T, size_t* start, int* tok,
                          int* tgt) {
  int b = 0;
  for (; b < B && *start + 1 < len; b++, *start += (size_t)T) {
    for (int t = 0; t < T; t++) {
      size_t i = *start + (size_t)t;
      tok[b * T + t] = i < len ? text[i] : NB_TOKEN_PAD;
      tgt[b * T + t] = i + 1 < len ? text[i + 1] : -1;
    }
  }
  return b;
}

nb_status_t nb_model_bits_per_byte(nb_model_t* m, const uint8_t* text, size_t len, int B, int T,
                                   double* bpb, size_t* n_scored) {
  if (!m || !text || !bpb || len < 2 || B < 1 || T < 1 || T > m->cfg.ctx)
    return nb_error(NB_ERR_INVALID,
                    "bits per byte: need a model, >= 2 bytes, B >= 1 and 1 <= T <= ctx (%d)",
                    m ? m->cfg.ctx : 0);
  int *tok = NULL, *tgt = NULL;
  nb_status_t st = NB_OK;
  NB_CHECK_GOTO(nb_alloc((void**)&tok, (size_t)B * T, sizeof(int), "eval tokens"), st, done);
  NB_CHECK_GOTO(nb_alloc((void**)&tgt, (size_t)B * T, sizeof(int), "eval targets"), st, done);
  double nats = 0.0;
  size_t scored = 0, start = 0; /* the next window predicts text[start + 1 ...] */
  while (start + 1 < len) {
    int b = nb_model_text_windows(text, len, B, T, &start, tok, tgt);
    float loss;
    NB_CHECK_GOTO(nb_model_forward(m, tok, tgt, b, T, &loss), st, done);
    nats += (double)loss * m->count;
    scored += (size_t)m->count;
  }
  *bpb = nats / (double)scored / log(2.0);
  if (n_scored) *n_scored = scored;
done:
  nb_free(tok);
  nb_free(tgt);
  return st;
}
