/* The byte-level decoder-only transformer (GPT-2 shape): forward, backward, the flat parameter /
 * gradient arenas the optimizer, codec and collectives consume, and K/V-cached greedy decoding.
 * CPU only here; not a serving runtime (no sampling, no beams) and not a tokenizer: tokens are
 * bytes plus specials. */
#ifndef NB_TRAIN_MODEL_H
#define NB_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Vocabulary: the 256 byte values, then the specials. */
#define NB_TOKEN_SEP 256 /* source / target separator in translation pairs */
#define NB_TOKEN_EOS 257 /* end of sequence */
#define NB_TOKEN_PAD 258 /* padding (never a target: pair it with target -1) */
#define NB_VOCAB 259

typedef struct {
  int n_layer; /* transformer blocks, >= 1 */
  int n_embd;  /* width C, divisible by n_head */
  int n_head;  /* attention heads */
  int ctx;     /* maximum sequence length T (learned positions) */
  int vocab;   /* NB_VOCAB; kept in the config so checkpoints say what they hold */
} nb_model_config_t;

/* One named tensor inside an arena: elements [offset, offset + numel). Row-major; matrices are
 * (out, in). decay says whether AdamW weight decay applies (matrices yes; biases, LayerNorm and
 * position tables no). */
typedef struct {
  char name[64];
  size_t offset;
  size_t numel;
  int ndim;
  int shape[2];
  int decay;
} nb_tensor_view_t;

/* The four linear projections of a block (used by LoRA to pick sites). */
typedef enum {
  NB_SITE_QKV = 0,       /* attn.c_attn: (3C, C) */
  NB_SITE_ATTN_PROJ = 1, /* attn.c_proj: (C, C) */
  NB_SITE_FC = 2,        /* mlp.c_fc: (4C, C) */
  NB_SITE_FC_PROJ = 3,   /* mlp.c_proj: (C, 4C) */
  NB_SITE_COUNT = 4
} nb_linear_site_t;

typedef struct nb_model nb_model_t;
/* Thread safety: a model is used by one thread at a time (its forward/backward share activation
 * buffers); distinct models are independent. The elementwise work inside runs on the pool of
 * train/parallel.h. */

/* A config with the given sizes and vocab = NB_VOCAB. */
nb_model_config_t nb_model_config_make(int n_layer, int n_embd, int n_head, int ctx);

/* NB_ERR_INVALID naming the field when a size is out of range or n_embd % n_head != 0. */
nb_status_t nb_model_config_check(const nb_model_config_t* cfg);

/* Allocates the model and initialises parameters deterministically from seed (same seed → same
 * bits): weights N(0, 0.02), the residual projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm
 * weights 1. Gradients start at zero. *out owned by the caller (nb_model_destroy).
 * NB_ERR_INVALID (bad config), NB_ERR_NOMEM. */
nb_status_t nb_model_create(const nb_model_config_t* cfg, uint64_t seed, nb_model_t** out);
void nb_model_destroy(nb_model_t* m); /* NULL ok */

const nb_model_config_t* nb_model_get_config(const nb_model_t* m);

/* ---- Tensor parallelism (Megatron-style) inside one replica. The tp.size ranks of a group each
 * hold a shard: attn.c_attn and mlp.c_fc are split by output rows (each rank has n_head / size
 * whole heads: its rows of q, of k and of v), attn.c_proj and mlp.c_proj by input columns; the
 * embeddings, LayerNorms and the biases of the two row-parallel products are replicated. The
 * forward sums the partial outputs of attn.c_proj and mlp.c_proj over the group, the backward the
 * partial input gradients of attn.c_attn and mlp.c_fc: two allreduces each way per layer, of
 * (B, T, C) floats. Every rank of a group calls forward and backward with the same tokens;
 * logits, losses and the replicated parameters' gradients then have the same bits on every
 * rank. The arenas, the tensor table (names as without tensor parallelism, shapes those of the
 * shard) and the decay mask are the shard's; nb_model_segments maps them into the logical
 * (size 1) layout that checkpoints and the outer sync use. Decoding and LoRA refuse a sharded
 * model (NB_ERR_UNSUPPORTED). */
typedef nb_status_t (*nb_model_allreduce_fn)(void* ctx, float* buf, size_t n);
typedef struct {
  int rank; /* in [0, size) */
  int size; /* ranks of the group; 1 = no tensor parallelism (allreduce unused) */
  /* In-place sum of n floats over the group; every rank must receive the same bits (any
   * reduction order that gives all ranks one result). */
  nb_model_allreduce_fn allreduce;
  void* ctx;
} nb_model_tp_t;

/* nb_model_create for rank tp->rank of a group of tp->size (NULL = size 1). The shard holds
 * exactly the values the size-1 model of the same seed has at its logical positions.
 * NB_ERR_INVALID naming the field when n_head is not divisible by the size, the rank is out of
 * range or the allreduce is missing. */
nb_status_t nb_model_create_tp(const nb_model_config_t* cfg, uint64_t seed, const nb_model_tp_t* tp,
                               nb_model_t** out);

int nb_model_tp_size(const nb_model_t* m);
int nb_model_tp_rank(const nb_model_t* m);

/* Parameters of the whole model (nb_model_num_params of the size-1 model). */
size_t nb_model_num_logical_params(const nb_model_t* m);

/* One run of the shard's arena in the logical arena: local[local + i] is logical[logical + i]
 * for i < len. sharded: NB_SEG_OWN when only this rank of the group holds those elements,
 * NB_SEG_REPLICATED when every rank holds the same values, NB_SEG_STAGE (tensor and pipeline
 * parallelism together) when the tensor-parallel ranks of this stage do. The segments cover the
 * local arena once, in order, and the segments of all ranks of a group cover the logical arena
 * (replicated ones once per rank). Size 1: one segment. */
enum {
  NB_SEG_REPLICATED = 0, /* every rank of the replica holds the same values */
  NB_SEG_OWN = 1,        /* only this rank holds them */
  NB_SEG_STAGE = 2       /* tensor and pipeline together: this stage's tensor group holds them */
};
typedef struct {
  size_t local, logical, len;
  int sharded; /* NB_SEG_* */
} nb_model_segment_t;
const nb_model_segment_t* nb_model_segments(const nb_model_t* m, size_t* n);

/* The logical arena (nb_model_num_logical_params floats) from an arena-shaped local buffer
 * (parameters, gradients, a moment): collective over the group, every rank receives the whole. */
nb_status_t nb_model_tp_gather(nb_model_t* m, const float* local, float* logical);
/* This rank's shard of a logical arena into an arena-shaped local buffer (no communication). */
void nb_model_tp_scatter(const nb_model_t* m, const float* logical, float* local);
/* The global L2 norm of an arena-shaped buffer (the gradients, for clipping): sharded elements
 * summed over the group, replicated ones counted once. Collective; the same bits on every rank. */
nb_status_t nb_model_tp_norm(nb_model_t* m, const float* buf, double* norm);

/* ---- Pipeline parallelism: the model's layers split into `stages` stages of n_layer / stages
 * consecutive layers, one per rank of a pipeline group. Every stage also holds the embeddings
 * and the final LayerNorm (replicated: the first stage embeds, the last applies the final
 * LayerNorm and the tied output head; nb_model_pp_reduce_grads sums their gradients over the
 * stages after a step's micro-batches, so every stage keeps the same values). A stage's table
 * names its layers as in the whole model (h.<l>...); nb_model_segments, nb_model_tp_gather,
 * _scatter and _norm then run over the pipeline group as they do over a tensor-parallel one.
 * nb_model_forward and nb_model_backward refuse a stage: the pipeline (train/pipeline.h) drives
 * the stage calls below and moves the activations between them. */
typedef struct {
  int stage;                       /* in [0, stages) */
  int stages;                      /* 1 = no pipeline; must divide n_layer */
  nb_model_allreduce_fn allreduce; /* in-place sum over the stages (the same bits everywhere) */
  void* ctx;
} nb_model_pp_t;

/* Stage pp->stage of pp->stages: the values the size-1 model of the same seed has there.
 * NB_ERR_INVALID naming the field (stages not dividing n_layer, stage out of range, no
 * allreduce). */
nb_status_t nb_model_create_pp(const nb_model_config_t* cfg, uint64_t seed, const nb_model_pp_t* pp,
                               nb_model_t** out);
/* Both (either may be NULL): rank tp->rank of the tensor-parallel shards of stage pp->stage. The
 * replica is tp->size x pp->stages ranks; tp's allreduce runs over this stage's shards, pp's over
 * the stages of the same tensor-parallel rank, and the pipeline moves activations between those
 * (every shard of a stage holds the whole activation). */
nb_status_t nb_model_create_mp(const nb_model_config_t* cfg, uint64_t seed, const nb_model_tp_t* tp,
                               const nb_model_pp_t* pp, nb_model_t** out);
/* The replica's group (tensor x pipeline): this rank in it (stage * tp size + tp rank), its
 * size, and an in-place sum over it (the tensor-parallel sum, then the pipeline's). */
int nb_model_group_rank(const nb_model_t* m);
int nb_model_group_size(const nb_model_t* m);
nb_status_t nb_model_group_sum(nb_model_t* m, float* buf, size_t n);
int nb_model_pp_stages(const nb_model_t* m);
int nb_model_pp_stage(const nb_model_t* m);
/* 1 when the model is a tensor-parallel shard or a pipeline stage (its tables are not the whole
 * model's: checkpoints, decoding and LoRA refuse it). */
int nb_model_is_sharded(const nb_model_t* m);

/* A stage's forward of one micro-batch: the first stage embeds `tokens` (x_in NULL), a later one
 * continues from x_in (B, T, C), the previous stage's output; the last needs `targets` and gives
 * the mean loss (0 elsewhere). nb_model_stage_output: this stage's output (B, T, C), valid until
 * the next forward in the same slot. */
nb_status_t nb_model_stage_forward(nb_model_t* m, const int* tokens, const int* targets,
                                   const float* x_in, int B, int T, float* loss);
const float* nb_model_stage_output(const nb_model_t* m);
/* The backward of the current slot's micro-batch, accumulating into the gradients: the last stage
 * from its loss (dx_out NULL), an earlier one from dx_out (B, T, C), the gradient of its output.
 * nb_model_stage_dinput: the gradient of its input (stages after the first), valid until the next
 * backward. */
nb_status_t nb_model_stage_backward(nb_model_t* m, const float* dx_out);
const float* nb_model_stage_dinput(const nb_model_t* m);
/* Sums the replicated tensors' gradients over the stages (collective; a no-op without stages). */
nb_status_t nb_model_pp_reduce_grads(nb_model_t* m);

/* Activation slots: k sets of activations, so that k micro-batches can be in flight between their
 * forward and their backward (each slot allocated at its first forward). use_slot selects the one
 * the next forward or backward works in. NB_ERR_INVALID out of range. */
nb_status_t nb_model_set_slots(nb_model_t* m, int k);
nb_status_t nb_model_use_slot(nb_model_t* m, int i);

/* The flat arenas (owned by the model, valid until destroy; n set to the element count). The
 * gradient arena has the same layout as the parameter arena. */
float* nb_model_params(nb_model_t* m, size_t* n);
float* nb_model_grads(nb_model_t* m, size_t* n);
size_t nb_model_num_params(const nb_model_t* m);

/* Tensor table: views into both arenas, in arena order (GPT-2 names: wte, wpe, h.<l>.ln_1.weight,
 * ..., ln_f.bias). Borrowed pointers. nb_model_find_tensor returns NULL when absent. */
size_t nb_model_num_tensors(const nb_model_t* m);
const nb_tensor_view_t* nb_model_tensor(const nb_model_t* m, size_t i);
const nb_tensor_view_t* nb_model_find_tensor(const nb_model_t* m, const char* name);

/* Per-element weight-decay mask over the arena (1 = decay), for nb_adamw_step. Borrowed. */
const uint8_t* nb_model_decay_mask(const nb_model_t* m);

/* Forward pass on tokens (B, T) (values in [0, vocab)). With targets (B, T) (values in [-1,
 * vocab), -1 = not scored) computes the mean cross-entropy over scored positions into *loss (0
 * when none is scored) and prepares nb_model_backward; targets may be NULL (logits only; loss
 * untouched). tokens/targets are copied. Activations are reallocated when B or T grow.
 * NB_ERR_INVALID (T > ctx, B < 1, token or target out of range), NB_ERR_NOMEM. Not thread-safe
 * per model. */
nb_status_t nb_model_forward(nb_model_t* m, const int* tokens, const int* targets, int B, int T,
                             float* loss);

/* Distillation forward: loss = (1 - alpha) * CE + alpha * temp^2 * KL(softmax(teacher/temp) ||
 * softmax(student/temp)), both means over scored positions. teacher_logits (B, T, vocab) is
 * borrowed until the next forward (the teacher is frozen: nothing flows back into it).
 * NB_ERR_INVALID also for alpha outside [0, 1] or temp <= 0. */
nb_status_t nb_model_forward_distill(nb_model_t* m, const int* tokens, const int* targets,
                                     const float* teacher_logits, float alpha, float temp, int B,
                                     int T, float* loss);

/* Logits (B, T, vocab) of the last forward; borrowed, overwritten by the next forward. */
const float* nb_model_logits(const nb_model_t* m);

/* Per-position cross-entropy in nats (B, T) of the last forward with targets (0 where the
 * target was -1): for bits-per-byte evaluation. Borrowed, overwritten by the next forward. */
const float* nb_model_losses(const nb_model_t* m);

/* Greedy decoding: appends up to max_new argmax tokens (lowest index on ties) to prompt (n_prompt
 * >= 1 tokens in [0, vocab)) and writes them to out (max_new entries, caller-owned); stops after
 * emitting stop_token (pass -1 for none). *n_out receives the count. The prompt runs once through
 * the forward, filling per-layer key/value caches that the model keeps (2 * L * ctx * C floats
 * per sequence, allocated on first use); each further token costs one position against them.
 * Once the sequence is longer than ctx, the last ctx tokens are the window and, as every position
 * of it moves, each token reruns the forward over it. The tokens are those of rerunning the
 * forward for every token (the logits agree to rounding). Overwrites the logits of the last
 * forward. NB_ERR_INVALID (bad sizes or prompt tokens), NB_ERR_NOMEM. Not thread-safe per model.
 */
nb_status_t nb_model_generate_greedy(nb_model_t* m, const int* prompt, int n_prompt, int max_new,
                                     int stop_token, int* out, int* n_out);

/* nb_model_generate_greedy for B independent sequences at once, with the same result for each
 * (prompts[b]: n_prompt[b] tokens; max_new[b] >= 0; out[b]: max_new[b] entries, caller-owned;
 * n_out[b] receives the count). Each round every unfinished sequence gains one token; the
 * sequences within the context share one product per projection (a (rows, C) x (C, OC) sgemm
 * instead of one GEMV each), which reads the weights once for all of them. Caches hold B
 * sequences. Borrowed arrays. NB_ERR_INVALID naming the sequence, NB_ERR_NOMEM. */
nb_status_t nb_model_generate_greedy_batch(nb_model_t* m, int B, const int* const* prompts,
                                           const int* n_prompt, const int* max_new, int stop_token,
                                           int* const* out, int* n_out);

/* The windows nb_model_bits_per_byte scores: up to B rows of T tokens from text[*start ...] and
 * their targets (the next bytes; -1 past the end, the last row padded), *start moved past them.
 * Returns the rows filled (0 when *start + 1 >= len). For a pipelined evaluation. */
int nb_model_text_windows(const uint8_t* text, size_t len, int B, int T, size_t* start, int* tok,
                          int* tgt);

/* Held-out loss of a byte text in bits per byte: every byte after the first is predicted once,
 * from windows of up to T bytes of context (consecutive windows of T + 1 bytes overlapping by
 * one), B windows per forward. *bpb = mean cross-entropy / ln 2; *n_scored (nullable) receives
 * the number of predicted bytes. Overwrites the last forward. NB_ERR_INVALID (len < 2, T outside
 * [1, ctx], B < 1), NB_ERR_NOMEM. */
nb_status_t nb_model_bits_per_byte(nb_model_t* m, const uint8_t* text, size_t len, int B, int T,
                                   double* bpb, size_t* n_scored);

/* Sets the gradient arena to zero. */
void nb_model_zero_grad(nb_model_t* m);

/* Backward of the last forward (which must have had targets): ADDS the gradient of its loss into
 * the gradient arena (call nb_model_zero_grad first unless accumulating). With the base frozen
 * (nb_model_set_frozen) the base gradients are not computed at all; attached adapters still get
 * theirs. NB_ERR_INVALID when there was no forward with targets. */
nb_status_t nb_model_backward(nb_model_t* m);

/* Freeze (1) or unfreeze (0) the base parameters for the backward. */
void nb_model_set_frozen(nb_model_t* m, int frozen);

/* Model FLOPs per token for one training step (forward + backward): 6 * params + 12 * L * C * T
 * (attention scores and values, PaLM's accounting), of the whole model (all shards). */
double nb_model_flops_per_token(const nb_model_t* m, int T);

#ifdef __cplusplus
}
#endif
#endif
