/* The ranks of one cluster under mpirun: rank 0 leads (it alone talks to the other clusters and
 * holds the round state), the others follow its control messages. The ranks form a grid:
 * replicas of `mp` consecutive ranks that hold one copy of the model between them, split by
 * tensor parallelism (spec.clusters[i].parallel.tensor: each rank a shard of every layer), by
 * pipeline parallelism (parallel.pipeline: each rank a stage of consecutive layers, micro-batches
 * through the 1F1B schedule) or by both (stages of `tensor` shards each: a replica's rank
 * stage * tensor + shard), and across the replicas data parallelism (the gradient of every step
 * averaged over the ranks that hold the same part).
 *
 * Without model parallelism the leader's trainer buffer is what the round state syncs, and
 * before every run of inner steps the leader broadcasts it to every rank. With it the round
 * state works on the logical parameters (the layout of the whole model, what every cluster
 * agrees on whatever its own layout): the leader's replica gathers them after its steps, the
 * leader broadcasts them before the next ones and every rank takes its part. Evaluations and
 * checkpoints are collective over the leader's replica, which the leader announces first.
 * Memory: the logical buffer is held by every rank (the broadcast's target), besides the
 * part's parameters, gradients and moments. */
#ifndef NB_WORKER_RANKS_H
#define NB_WORKER_RANKS_H

#include <stddef.h>

#include "common/status.h"
#include "intra/intra.h"
#include "train/hybrid.h"
#include "train/trainer.h"

typedef struct {
  nb_comm_t* world; /* every rank of the cluster (NULL: one process, nothing to do) */
  int rank, size;
  int mp, mp_rank;    /* replica width (ranks of one model) and this rank's place in it */
  int tp, pp;         /* tensor shards per stage and pipeline stages of a replica (mp = tp x pp) */
  int dp, dp_rank;    /* replicas and this rank's */
  nb_comm_t* mp_comm; /* this rank's replica (mp > 1) */
  nb_comm_t* dp_comm; /* the ranks holding the same shard (dp > 1) */
  /* both tensor and pipeline: this stage's shards, and the stages of this rank's shard */
  nb_comm_t *stage_comm, *pipe_comm;
  nb_trainer_t* t; /* borrowed, set by nb_wk_ranks_attach */
  float* logical;  /* mp > 1: the logical parameters */
  size_t n_logical;
} nb_wk_ranks_t;

/* The grid over world (NULL = one process) with replicas of tp (tensor) x pp (pipeline) ranks:
 * NB_ERR_CONFIG when the ranks do not divide into them. Collective. */
nb_status_t nb_wk_ranks_grid(nb_wk_ranks_t* r, nb_comm_t* world, int tp, int pp);

/* This rank's part of the trainer's config: its shard or stage, the gradient average over the
 * replicas (grad hook) and the data order (data_rank = base + replica). */
void nb_wk_ranks_train_config(nb_wk_ranks_t* r, nb_train_config_t* tc, int data_rank_base);

/* After the trainer is created on every rank: the logical buffer, gathered. Collective. */
nb_status_t nb_wk_ranks_attach(nb_wk_ranks_t* r, nb_trainer_t* t);

/* The leader's local model for the round (*out: the trainer's, or the gathered buffer of tensor
 * or pipeline ranks), and in hc the steps hook that hands the ranks each run of inner steps and
 * the samples scale of the data-parallel replicas. */
void nb_wk_ranks_local(nb_wk_ranks_t* r, nb_hybrid_config_t* hc, nb_hybrid_local_t* out);

/* Leader: the evaluation and the checkpoint of the trainer (collective over its replica under
 * tensor parallelism, announced to the ranks first). */
nb_status_t nb_wk_ranks_eval(nb_wk_ranks_t* r, nb_train_eval_t* out);
nb_status_t nb_wk_ranks_checkpoint(nb_wk_ranks_t* r);

/* Leader: the unsharded model of the current parameters (the trainer's own model without tensor
 * parallelism, borrowed; under it a new one from the logical buffer, *owned = 1). */
nb_status_t nb_wk_ranks_model(nb_wk_ranks_t* r, nb_model_t** m, int* owned);

/* Leader: the ranks stop (their nb_wk_ranks_follow returns NB_OK). */
nb_status_t nb_wk_ranks_stop(nb_wk_ranks_t* r);

/* A rank other than the leader: follows the leader's messages until it stops. */
nb_status_t nb_wk_ranks_follow(nb_wk_ranks_t* r);

/* Frees the sub-communicators and the buffer (not world). */
void nb_wk_ranks_release(nb_wk_ranks_t* r);

#endif
