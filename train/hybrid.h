/* train/hybrid: the cross-datacenter round of the `outer` (DiLoCo-style) sync mode as a library:
 * theta_global on the host, K inner steps, pseudo-gradient through the codec with error feedback,
 * an exchange through a callback, a sample-weighted sum in cluster order, the outer Nesterov step
 * and a hash check that every cluster holds bit-identical theta_global. The local model is an
 * interface (nb_hybrid_local_t): nebula's trainer is one (nb_hybrid_create), a caller's own
 * inner loop another (the public session API). It does not own processes, sockets or job
 * descriptors: the worker plugs inter/exchange into the callback, tests plug in an in-process
 * rendezvous. */
#ifndef NB_TRAIN_HYBRID_H
#define NB_TRAIN_HYBRID_H

#include <stddef.h>
#include <stdint.h>

#include "common/alloc.h"
#include "common/status.h"
#include "compress/compress.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Size of the message header in front of the codec frame (docs/hybrid.md). */
#define NB_HYBRID_MSG_HEADER_BYTES 64
#define NB_HYBRID_MSG_MAGIC 0x5948424eu /* bytes 'N' 'B' 'H' 'Y' */
#define NB_HYBRID_MAX_CLUSTERS 64
/* The default of nb_hybrid_config_t.overlap_steps (and of the descriptor's sync.overlapSteps). */
#define NB_HYBRID_OVERLAP_STEPS_DEFAULT 4
/* H: inner steps per round when a config does not say (nb_hybrid_config_defaults, the job
 * descriptor's sync.innerSteps). */
#define NB_HYBRID_INNER_STEPS_DEFAULT 50

/* One received message (a peer's, or our own). data is owned by the hybrid after the exchange
 * callback returns (allocated with nb_alloc; freed with nb_free). The common nb_bytes_t, so that
 * an exchange (inter/exchange.h) hands its frames over into the callback's array directly. */
typedef nb_bytes_t nb_hybrid_msg_t;

/* The exchange: send `msg` (len bytes, borrowed) of `round` to every other cluster and fill
 * peers[0..n_peers) with their messages of that round (any order; each entry's data allocated
 * with nb_alloc and handed over, also on failure for the entries set). *bytes_sent: bytes put on
 * the WAN by us this round (nullable). A non-OK status aborts the round. */
typedef nb_status_t (*nb_hybrid_exchange_fn)(void* ctx, uint64_t round, const void* msg, size_t len,
                                             nb_hybrid_msg_t* peers, size_t n_peers,
                                             uint64_t* bytes_sent);

/* The exchange of fault-tolerant rounds (cfg.ft_exchange, outer mode; with overlap it is called
 * from the hybrid's background thread, one call at a time): like
 * nb_hybrid_exchange_fn, but `xround` is an exchange id (2 per round: the update, then the vote,
 * see docs/hybrid.md "Faults"), and a peer that did not deliver by the deadline (dead, link down,
 * already past this round) leaves its entry's data NULL while the call still returns NB_OK; only
 * a local failure is an error. *ahead (nullable): the newest exchange id any peer already sent
 * that is beyond xround, else 0 (the hybrid then jumps to that round). *alive (nullable): peers
 * that answer their heartbeat now. */
typedef nb_status_t (*nb_hybrid_ft_exchange_fn)(void* ctx, uint64_t xround, const void* msg,
                                                size_t len, nb_hybrid_msg_t* peers, size_t n_peers,
                                                uint64_t* bytes_sent, uint64_t* ahead,
                                                uint32_t* alive);

/* What is exchanged. outer: the pseudo-gradient once per round (DiLoCo); step: the compressed
 * gradient every inner step (DGC-style, error feedback); dense: the fp32 gradient every step
 * (the naive baseline). In step and dense modes the trainer must be created with
 * nb_hybrid_gradient as its grad hook (see there); every cluster then applies the same
 * weighted gradient, so the parameters stay identical without an outer step. */
typedef enum { NB_HYBRID_OUTER = 0, NB_HYBRID_STEP = 1, NB_HYBRID_DENSE = 2 } nb_hybrid_mode_t;

typedef struct {
  nb_hybrid_mode_t mode;  /* default outer */
  uint32_t cluster_index; /* our position in the cluster-id order, < n_clusters */
  uint32_t n_clusters;    /* 1..NB_HYBRID_MAX_CLUSTERS */
  long inner_steps;       /* H: inner steps per round (>= 1); the cap of a timed round */
  double round_seconds;   /* > 0: a round is this wall-time budget (at least one step) */
  float outer_lr;         /* outer Nesterov learning rate (> 0; 1 with momentum 0 = averaging) */
  float outer_momentum;   /* [0, 1) */
  double density;         /* top-k fraction in (0, 1]; 1 = a dense frame (no error feedback) */
  int error_feedback;     /* keep the residual of what top-k / quantization dropped */
  float ef_decay;         /* beta in (0, 1]: each round the residual is scaled by beta before
                             the new Delta joins it (SparseLoCo's e <- beta e + Delta); 0 or 1 =
                             keep all of it (default) */
  uint32_t samples_scale; /* ranks of this cluster training in lockstep with this trainer (their
                             samples count for the weights); 0 = 1 */
  nb_values_t values;     /* value type on the wire */
  uint32_t topk_chunk;    /* chunked top-k: a power of two in [16, 65536] (the codec's
                             topk_chunk); 0 = the codec's default (NB_CODEC_TOPK_CHUNK) */
  int zstd_level;         /* 0..19 */
  /* 1: round r's exchange runs on a background thread during round r+1's inner steps and its
   * update lands overlap_steps into round r+1 (or at its end); each round starts from theta_global
   * as last applied plus this cluster's own not-yet-landed progress; nb_hybrid_finish applies the
   * last one (the trainer then holds theta_global). Only through nb_hybrid_round. */
  int overlap;
  /* With overlap: the previous round's update lands after this many inner steps of the next
   * round (Streaming DiLoCo's tau), waiting for its exchange if it is still running, and the
   * round's own progress so far is kept on top of it; 0 = before the first step; >= the
   * round's steps (or a wall-time round whose budget ends first) = at the round's end, one
   * whole round late. */
  long overlap_steps;
  /* With overlap and overlap_steps below the round's steps: 1 = the update lands at the first
   * inner-step boundary after its exchange finished, overlap_steps being the latest (where it
   * waits for it); the adaptive scheduler's tau is an estimate of the exchange's time, and a
   * landing later than needed costs loss (docs/hybrid.md). Which step that is depends on the
   * link's timing, so a run is no longer repeatable bit for bit: 0 (default) = exactly after
   * overlap_steps. Not with a wall-time round (round_seconds). */
  int land_early;
  /* With overlap: 1 = a round whose frame is sparse starts from a prediction of the theta_global
   * its update lands on (the outer step on this cluster's equal share of its own Delta) instead
   * of theta_global minus the own Delta; where it lands, the progress made since stays on top as
   * without. A dense round never does (it costs a dense frame loss, docs/hybrid.md). Changes
   * only theta_local: theta_global is the same bits on every cluster either way. */
  int eager;
  /* Intra-cluster ranks (nullable): steps_hook(ctx, k) runs before each run of k inner steps,
   * when the trainer's synced buffer holds the theta_local they start from (also after an update
   * landed inside the round), so that the cluster's other ranks can take it and follow. A
   * negative k: -k more steps straight after a run, nothing changed in between (land_early's
   * step at a time): the ranks follow without taking the buffer again. */
  nb_status_t (*steps_hook)(void* ctx, long k);
  void* hook_ctx;
  nb_hybrid_exchange_fn exchange; /* required by nb_hybrid_round; unused by prepare/apply */
  void* exchange_ctx;
  /* Non-NULL: fault-tolerant rounds (outer mode; exchange then is unused and exchange_ctx goes
   * to this one). A round counts on every cluster or on none: it is applied only when every
   * cluster received every message and confirmed it in a vote; otherwise it is skipped, the
   * trainer keeps its theta_local and the next Delta carries the skipped progress. With overlap
   * the update exchange and the vote run on the background thread, and the decision is taken
   * where the update lands (overlap_steps into the next round, before that round's message at
   * the latest). */
  nb_hybrid_ft_exchange_fn ft_exchange;
  /* Fault-tolerant rounds: how long nb_hybrid_finish keeps asking a peer that has not answered
   * the final check (each attempt on a fresh exchange id, following a peer that is further), so
   * that a link back near the end of a run still ends in agreement; 0 = one attempt. */
  double final_wait_s;
  /* > 0: a round whose summed update has an L2 norm above norm_bound times the median of the
   * last NB_HYBRID_NORM_WINDOW applied rounds' (once NB_HYBRID_NORM_WARMUP were applied) is
   * refused on every cluster (NB_ERR_INVALID naming the cluster that sent the largest part),
   * nothing applied: the sum is the same bits everywhere, so every cluster decides the same.
   * The history starts empty at create and at load; fault-tolerant rounds, whose clusters can
   * rejoin with another history, refuse the bound (NB_ERR_CONFIG). 0 = off (default). */
  double norm_bound;
} nb_hybrid_config_t;

#define NB_HYBRID_NORM_WINDOW 8
#define NB_HYBRID_NORM_WARMUP 3

/* Defaults: one cluster, H 50, outer lr 0.7 momentum 0.9, density 0.01, error feedback, int8,
 * zstd 3, no exchange. */
void nb_hybrid_config_defaults(nb_hybrid_config_t* cfg);

/* What one round did (also the rows of a worker's rounds.tsv). */
typedef struct {
  uint64_t round;       /* 0-based */
  long steps;           /* inner steps taken by this cluster */
  uint64_t samples;     /* sequences this cluster trained on in the round */
  uint64_t samples_all; /* all clusters together: the denominator of the weights */
  double loss;          /* this cluster's mean inner training loss */
  uint64_t msg_bytes;   /* our message (header + codec frame) */
  uint64_t bytes_sent;  /* put on the WAN by us (from the exchange; msg_bytes x peers in tests) */
  double density;       /* used for our frame */
  double compute_s;     /* inner steps */
  double codec_s;       /* encode + decode + outer step */
  double exchange_s;    /* inside the exchange callback */
  uint64_t global_hash; /* XXH3-64 of theta_global after the round */
  /* fault-tolerant rounds only (otherwise applied 1, the rest 0). With overlap they describe
   * the previous round's update, which is decided inside this round (landed 1; the first round
   * has none to decide: landed 0). */
  int landed;             /* 1: an update was decided in this round (applied says how) */
  int applied;            /* 1: this round's outer step was taken (on every cluster) */
  int caught_up;          /* 1: a round held from before was applied late (a lost vote) */
  int need_state;         /* 1: a peer is further ahead than a held round covers: pull its state */
  uint64_t commits;       /* rounds applied so far (theta_global's version) */
  uint32_t peers_ok;      /* peers whose update of this round arrived */
  uint32_t peers_alive;   /* peers answering their heartbeat after the exchange */
  uint64_t next_round;    /* the round this cluster runs next (> round + 1 after a jump) */
  double update_norm;     /* L2 norm of the summed update the outer step took (applied rounds) */
  long landed_step;       /* overlap: the inner step of this round after which the previous round's
                             update landed; -1 = not inside it (at its end, or none in flight) */
  double exchange_took_s; /* overlap: how long the update that landed in this round took from
                             the start of its exchange to its decision (vote included); 0 =
                             none landed */
} nb_hybrid_round_t;

typedef struct nb_hybrid nb_hybrid_t;
/* Thread safety: one thread at a time per hybrid (it drives its local model). */

/* The local model a round syncs: a context and the functions the hybrid calls on it, always from
 * the thread that calls the hybrid (never from the overlap thread). */
typedef struct {
  void* ctx; /* passed to every function; borrowed, must outlive the hybrid */
  /* Required. The synced parameters (theta_local) as one contiguous fp32 host vector of *n
   * floats (n nullable), owned by the local model, the same size for the hybrid's life. The
   * hybrid reads it between steps and writes into it what the model continues from
   * (theta_global after an applied round). */
  float* (*params)(void* ctx, size_t* n);
  /* Required. Samples (sequences) trained on so far in total, never decreasing: the weight of a
   * round's Delta is the difference across it. */
  uint64_t (*samples)(void* ctx);
  /* Runs k inner steps from the synced buffer; *loss_mean their mean training loss. NULL: the
   * caller runs its own inner loop between rounds, and a round counts the samples since the
   * previous one (blocking outer rounds only: no overlap, no round_seconds, mode outer). */
  nb_status_t (*steps)(void* ctx, long k, double* loss_mean);
  /* At most k_max inner steps within `seconds` (at least one); *k_done, *loss_mean. Required by
   * cfg.round_seconds > 0. */
  nb_status_t (*steps_budget)(void* ctx, long k_max, double seconds, long* k_done,
                              double* loss_mean);
  /* Samples of one inner step of this rank (the weight of its gradient). Required by the step
   * and dense modes. */
  uint64_t (*step_samples)(void* ctx);
} nb_hybrid_local_t;

/* Creates the round state for the local model `local` (copied; its ctx must outlive h):
 * theta_global = the synced buffer now, zero momentum and residual, a codec. cfg is copied.
 * NB_ERR_CONFIG naming a bad field (or a config the local model cannot run: see
 * nb_hybrid_local_t.steps), NB_ERR_INVALID (a missing function, an empty buffer), NB_ERR_NOMEM,
 * the codec's errors. */
nb_status_t nb_hybrid_create_local(const nb_hybrid_config_t* cfg, const nb_hybrid_local_t* local,
                                   nb_hybrid_t** out);

/* nebula's trainer as the local model (train/hybrid_trainer.c): its synced buffer
 * (nb_trainer_sync_params), its sample count, its steps. t is borrowed and must outlive h. Errors
 * of nb_hybrid_create_local. */
typedef struct nb_trainer nb_trainer_t;
nb_status_t nb_hybrid_create(const nb_hybrid_config_t* cfg, nb_trainer_t* t, nb_hybrid_t** out);
/* The local model nb_hybrid_create makes of trainer t (borrowed), for a driver that creates the
 * hybrid itself (the session of `nebula worker`, api/driven.h). */
void nb_hybrid_trainer_local(nb_trainer_t* t, nb_hybrid_local_t* out);
/* Waits for an exchange still in flight (overlap) and frees everything. NULL ok. */
void nb_hybrid_destroy(nb_hybrid_t* h);

/* One whole round. Outer mode: prepare, exchange through cfg.exchange, apply. Step and dense
 * modes: H inner steps, each exchanging its gradient (bytes and exchange time summed over the
 * steps). With overlap: prepare, wait
 * for the previous round's exchange (its time is rec->exchange_s) and apply it, then start this
 * round's exchange in the background. *rec (nullable) receives the round's figures
 * (global_hash: theta_global after what was applied). Errors of prepare, the exchange's status
 * (wrapped), and of apply. Fault-tolerant rounds (cfg.ft_exchange): the update, a vote, then
 * the round is applied, held or skipped (rec->applied, caught_up, need_state, next_round); a
 * missing peer is not an error, a diverged replica is (NB_ERR_INTEGRITY). After an error the hybrid
 * must only be destroyed. */
nb_status_t nb_hybrid_round(nb_hybrid_t* h, nb_hybrid_round_t* rec);

/* The halves of a round, for drivers that exchange on their own (tests, overlap):
 * prepare runs the inner steps and encodes Delta = theta_global - theta_local into our message
 * (*msg borrowed from h, valid until the next prepare). Errors of the trainer and the codec. */
nb_status_t nb_hybrid_prepare(nb_hybrid_t* h, const uint8_t** msg, size_t* len);
/* apply takes every cluster's message of this round (ours included, any order; borrowed),
 * checks them (round, one per cluster, same theta_global hash as ours at the round's start),
 * sums the decoded Deltas in cluster order weighted by samples, takes the outer step on
 * theta_global and copies it into the trainer. *rec (nullable) gets the round's figures
 * (exchange_s and bytes_sent left 0). NB_ERR_INTEGRITY when a cluster's theta_global hash
 * differs from ours (names the cluster and both hashes) or a frame fails its checksum;
 * NB_ERR_CODEC / NB_ERR_INVALID for a malformed or unexpected message (theta_global is then
 * unchanged); NB_ERR_INVALID naming the cluster when an update is not finite: a Delta with a NaN
 * or infinity is not encoded, its message says so and every cluster refuses the round (so does
 * a weighted sum that decodes to non-finite values), theta_global unchanged. With fault-tolerant
 * rounds a non-finite Delta fails our prepare instead (the peers skip the round). */
nb_status_t nb_hybrid_apply(nb_hybrid_t* h, const nb_hybrid_msg_t* msgs, size_t n_msgs,
                            nb_hybrid_round_t* rec);

/* A fault-tolerant round in two halves, for a local model without steps whose caller trains on
 * while the round's exchange runs (the session's overlapped round; cfg.overlap 0): begin encodes
 * the round's update from theta_local as it is now (as nb_hybrid_round does) and starts the
 * update exchange and the vote on a thread; end waits for them and applies, holds or skips the
 * round. *rec (nullable) as nb_hybrid_round's for that round (next_round included). The local
 * model's theta_local is theta_global after an applied round (or a held one that landed late:
 * rec->caught_up), else it stays what begin read. NB_ERR_INVALID for begin without fault-tolerant
 * rounds, with steps, or with a round in flight, and for end without begin; else the errors of
 * nb_hybrid_round. */
nb_status_t nb_hybrid_ft_begin(nb_hybrid_t* h);
nb_status_t nb_hybrid_ft_end(nb_hybrid_t* h, nb_hybrid_round_t* rec);

/* The eager start of a local model's overlapped round (cfg.eager; docs/hybrid.md "Eager
 * overlap"), for a driver whose caller trains on while the round is in flight (the session):
 * right after nb_hybrid_prepare or nb_hybrid_ft_begin, out (n floats) = where the round will land
 * as far as this cluster knows it, theta_global - lr mu^2 m - lr (1 + mu) / n_clusters * (our
 * frame, decoded), and *moved = 1; *moved = 0 and out untouched when there is nothing to
 * predict (cfg.eager 0, not outer mode, a dense frame, a refused message without a frame).
 * Reads our message, theta_global and the momentum only (safe while the exchange thread runs).
 * NB_ERR_INVALID for NULL, NB_ERR_NOMEM. */
nb_status_t nb_hybrid_eager_target(nb_hybrid_t* h, float* out, int* moved);

/* Overlap: lands the update in flight now, waiting for its exchange (a checkpoint round: then
 * nothing is in flight and nb_hybrid_save works); the trainer's theta_local is theta_global when
 * it is applied (call it right after nb_hybrid_round: no inner step since). Fault-tolerant
 * rounds: the update is applied, held or skipped as inside a round; *rec (nullable) reports it
 * (landed, applied, caught_up, need_state, commits, exchange_s: the wait). Nothing in flight:
 * NB_OK, rec->landed 0. Errors: the exchange's, NB_ERR_INTEGRITY as apply. */
nb_status_t nb_hybrid_drain(nb_hybrid_t* h, nb_hybrid_round_t* rec);

/* Applies an exchange still in flight (overlap), then a final hash-only exchange through
 * cfg.exchange so that the last round's result is compared too. NB_ERR_INTEGRITY as apply, or
 * the exchange's status. Fault-tolerant rounds: the headers carry the rounds applied; a held
 * round that a peer applied lands first, a peer one applied round behind is accepted (it lands
 * its held round), a peer that does not answer is asked again until cfg.final_wait_s has passed
 * and then gives NB_ERR_UNAVAILABLE; the trainer then holds theta_global. */
nb_status_t nb_hybrid_finish(nb_hybrid_t* h);

/* The per-step exchange of step and dense modes, for the trainer's grad hook: encodes grads
 * (n floats, the trainable buffer; borrowed), exchanges them with every cluster through
 * cfg.exchange, and replaces grads with the sample-weighted sum of every cluster's decoded
 * gradient in cluster order. Each message also carries the hash of the parameters before the
 * step: NB_ERR_INTEGRITY when a cluster's differ. A no-op in outer mode. The trainer takes its
 * hook at creation, before the hybrid exists, so wire it through a pointer:
 *   static nb_status_t hook(void* ctx, float* g, size_t n) {
 *     return nb_hybrid_gradient(*(nb_hybrid_t**)ctx, g, n); }
 * with cfg.grad_hook_ctx = &h, h created right after the trainer. */
nb_status_t nb_hybrid_gradient(nb_hybrid_t* h, float* grads, size_t n);

/* Sets the density of the next rounds' frames, (0, 1] (the adaptive scheduler's decision); the
 * message buffer grows on the next prepare when needed. NB_ERR_CONFIG when out of range. */
nb_status_t nb_hybrid_set_density(nb_hybrid_t* h, double density);
/* Sets H, the inner steps of the next rounds (>= 1; the cap of a wall-time round).
 * NB_ERR_CONFIG when < 1. */
nb_status_t nb_hybrid_set_inner_steps(nb_hybrid_t* h, long steps);
/* Sets the value type and top-k chunk (0 = global top-k) of the next rounds' frames (the
 * scheduler's codec point; frames are self-describing, so clusters may differ). Between rounds
 * only (the codec is used by the thread that calls nb_hybrid_round). NB_ERR_CONFIG in dense mode
 * (fp32 fixed) or for a chunk the codec refuses, NB_ERR_NOMEM. */
nb_status_t nb_hybrid_set_codec(nb_hybrid_t* h, nb_values_t values, uint32_t topk_chunk);
/* Sets tau, the inner steps of the next rounds after which the previous update lands (overlap;
 * >= 0, see cfg.overlap_steps; the scheduler raises it on a thin link). NB_ERR_CONFIG when < 0. */
nb_status_t nb_hybrid_set_overlap_steps(nb_hybrid_t* h, long steps);

/* Writes the round state (theta_global, outer momentum, error-feedback residual, round
 * counters) to `path` atomically (a temp file, fsync, rename, the folder synced), ending in an XXH3
 * checksum; layout in docs/hybrid.md. With an exchange in flight (overlap) NB_ERR_INVALID: save
 * between rounds of a run without overlap, after nb_hybrid_drain, or after nb_hybrid_finish.
 * NB_ERR_IO naming the path. */
nb_status_t nb_hybrid_save(const nb_hybrid_t* h, const char* path);
/* Restores a state written by nb_hybrid_save for the same synced buffer size and copies
 * theta_global into the trainer. NB_ERR_NOT_FOUND (no file), NB_ERR_IO, NB_ERR_INTEGRITY (bad
 * checksum), NB_ERR_INVALID (not a state file, or another size); h is unchanged on error. */
nb_status_t nb_hybrid_load(nb_hybrid_t* h, const char* path);

/* The most bytes of a caller's extension section in a state file. */
#define NB_HYBRID_STATE_EXT_MAX (1u << 24)
/* nb_hybrid_save with a caller's extension section (ext_len bytes, borrowed; <=
 * NB_HYBRID_STATE_EXT_MAX) after the residual, inside the checksum: the public session stores
 * its tensor table there, so that one file, written once, holds all of a checkpoint. */
nb_status_t nb_hybrid_save_ext(const nb_hybrid_t* h, const char* path, const void* ext,
                               size_t ext_len);
/* nb_hybrid_load that hands the file's extension section (borrowed during the call) to
 * check(ctx, ext, len) once the size and checksums hold and before anything changes: a non-OK
 * status from it is returned with h unchanged. check NULL: any extension is accepted. */
nb_status_t nb_hybrid_load_ext(nb_hybrid_t* h, const char* path,
                               nb_status_t (*check)(void* ctx, const uint8_t* ext, size_t len),
                               void* ctx);

/* Fault-tolerant rounds: the global state another cluster needs to rejoin (theta_global, outer
 * momentum, next round, rounds applied; not the residual, which is per cluster). *out: nb_alloc'd
 * (caller nb_free), layout in docs/hybrid.md; *round: the next round. NB_ERR_INVALID with an
 * exchange in flight (except a fault-tolerant one: it touches none of this), NB_ERR_NOMEM. */
nb_status_t nb_hybrid_export(const nb_hybrid_t* h, uint8_t** out, size_t* len);
/* Adopts a state made by nb_hybrid_export: theta_global, momentum, rounds applied, and the next
 * round = its round + skip (or ours when that is later: exchange ids never go back); zero
 * residual; the trainer's synced buffer = theta_global (this
 * cluster's progress not in that state is dropped). Checks the size, layout, trailing XXH3 and
 * theta_global's hash: NB_ERR_INVALID, NB_ERR_INTEGRITY; h unchanged on error. */
nb_status_t nb_hybrid_import(nb_hybrid_t* h, const uint8_t* state, size_t len, uint64_t skip);
/* Exchanges the final check of fault-tolerant rounds took (1 when every peer answered at once;
 * 0 before nb_hybrid_finish or without fault-tolerant rounds). */
uint32_t nb_hybrid_final_attempts(const nb_hybrid_t* h);

/* Rounds applied (fault-tolerant rounds; equals nb_hybrid_rounds otherwise). */
uint64_t nb_hybrid_commits(const nb_hybrid_t* h);

/* theta_global (n floats, owned by h). Writing into it is for tests that corrupt a replica. */
float* nb_hybrid_global(nb_hybrid_t* h, size_t* n);
/* XXH3-64 of theta_global as it is now. */
uint64_t nb_hybrid_global_hash(const nb_hybrid_t* h);
/* Rounds completed. */
uint64_t nb_hybrid_rounds(const nb_hybrid_t* h);
/* 1 when no update is in flight or its exchange is over (it lands at the next chance without
 * waiting); 0 while the exchange runs. From the thread running the rounds (or its hooks). */
int nb_hybrid_exchange_done(const nb_hybrid_t* h);

#ifdef __cplusplus
}
#endif
#endif
