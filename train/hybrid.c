/* train/hybrid: the outer-sync round (see hybrid.h). Every cluster decodes every message, its own
 * included, and sums them in cluster order into a zeroed buffer, so the float operations and
 * therefore the bits of theta_global are the same everywhere. Fault-tolerant rounds (an update and
 * a vote exchange; a round counts on every cluster or none) are here too. Not here: sockets,
 * processes, the density scheduler, or deciding what a dead peer means for the job. */
#include "train/hybrid.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "train/optim.h"

#define NB__HY_VERSION 1u
#define NB__HY_FLAG_HASH_ONLY 0x1u
#define NB__HY_FLAG_FT 0x2u      /* fault-tolerant round: offset 56 carries the rounds applied */
#define NB__HY_FLAG_VOTE 0x4u    /* with FT: the vote of a round (samples field: 1 = have all) */
#define NB__HY_FLAG_REFUSED 0x8u /* the sender's Delta was not finite: no frame, round refused */
#define NB__HY_FLAGS_KNOWN \
  (NB__HY_FLAG_HASH_ONLY | NB__HY_FLAG_FT | NB__HY_FLAG_VOTE | NB__HY_FLAG_REFUSED)

struct nb_hybrid {
  nb_hybrid_config_t cfg;
  nb_hybrid_local_t local; /* the local model (train/hybrid_trainer.c adapts the trainer) */
  uint64_t s_mark;         /* local.samples() at the end of the last round's steps */
  nb_codec_t* codec;
  size_t n;
  float* global;   /* (n) theta_global */
  float* momentum; /* (n) outer momentum */
  float* residual; /* (n) error feedback */
  float* delta;    /* (n) this round's pseudo-gradient, then the weighted sum */
  uint8_t* msg;    /* header + frame */
  size_t msg_cap, msg_len;
  uint64_t round;
  uint64_t hash;     /* of theta_global as it is now */
  uint64_t msg_hash; /* of theta_global at the start of the round of our last message */
  uint64_t xseq;     /* step and dense modes: exchanges done (the round number on the wire) */
  uint64_t step_sent, step_msg_bytes;
  double step_exchange_s, step_codec_s;
  /* overlap: the exchange of round inflight_round runs on `thread` with a copy of our message */
  int inflight;
  int fly_done; /* atomic: the exchange thread of the update in flight has finished */
  long mid_tau; /* the inner step of this round the update in flight landed after */
  pthread_t thread;
  uint64_t inflight_round, inflight_hash;
  uint8_t* fly; /* our message of that round */
  float* own;   /* (n) this round's own Delta, kept on top of theta_global until it lands */
  int own_valid;
  /* eager overlap: eshift = (theta_global - theta_local at the send) - own Delta, what the
   * prediction moved, undone when the round is skipped */
  float* eshift;
  int eshift_valid;
  size_t fly_cap, fly_len;
  nb_hybrid_msg_t fly_peers[NB_HYBRID_MAX_CLUSTERS];
  nb_status_t fly_status;
  char fly_error[256];
  uint64_t fly_sent;
  double fly_secs;
  /* overlap: the previous round's update landed inside this round, after overlap_steps */
  int mid_landed;
  nb_hybrid_round_t mid_rec;
  double mid_waited;
  uint64_t mid_sent;
  /* fault-tolerant rounds (docs/hybrid.md, Faults) */
  uint64_t commits;                    /* rounds applied */
  double norms[NB_HYBRID_NORM_WINDOW]; /* the last applied rounds' update norms (a ring) */
  uint32_t n_norms;                    /* applied rounds in it (up to the window) */
  uint64_t norm_at;                    /* next slot: the count of norms ever recorded */
  double norm;                         /* of the sum nb__hy_sum wrote last */
  uint32_t final_attempts;             /* exchanges the final check of fault-tolerant rounds took */
  uint64_t ft_samples;   /* samples trained on since the last applied round: the weight of our
                            Delta, which carries all of that progress */
  uint64_t pend_samples; /* what the held round's message of ours claimed */
  float* res_pre;        /* (n) residual before this round's encode: restored when it is skipped */
  float* lsend;          /* (n) theta_local when this round's message was made */
  int pend; /* every message of round pend_round arrived, the vote did not confirm it */
  uint64_t pend_round, pend_commits, pend_hash;
  nb_hybrid_msg_t pend_msgs[NB_HYBRID_MAX_CLUSTERS]; /* owned copies, cluster order */
  float* pend_local;                                 /* (n) theta_local at that round's send */
  float* pend_res;                                   /* (n) residual after that round's encode */
  /* fault-tolerant rounds with overlap: what the exchange thread (update exchange + vote) found
   * for the round in flight; the landing inside the next round applies, holds or skips it */
  uint64_t fly_k;       /* rounds applied that our message of that round stated */
  uint64_t fly_samples; /* its samples field: every sample since the last applied round */
  int fly_folded;       /* its frame carried the residual (dense with error feedback) */
  nb_hybrid_msg_t fly_all[NB_HYBRID_MAX_CLUSTERS]; /* the peers' updates by cluster (owned) */
  int fly_have_all, fly_commit;
  uint64_t fly_newest, fly_ahead; /* newest rounds applied / exchange id seen from a peer */
  uint32_t fly_ok, fly_alive;
  /* prepare's figures for the record */
  long steps;
  uint64_t samples;
  double loss, compute_s, codec_s;
};

typedef struct {
  uint32_t sender, flags;
  uint64_t round, samples, steps, hash, frame_len, commits;
  const uint8_t* frame;
} nb__hy_hdr_t;

static void nb__put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void nb__put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t nb__get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t nb__get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Index of the first NaN or infinity in x[0..n), or n when all are finite. */
static size_t nb__hy_first_nonfinite(const float* x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return i;
  return n;
}

/* A message header into p (NB_HYBRID_MSG_HEADER_BYTES); no hybrid state touched (the exchange
 * thread of fault-tolerant rounds with overlap writes its vote with it). */
static void nb__hy_header_to(uint8_t* p, uint32_t sender, uint32_t flags, uint64_t round,
                             uint64_t samples, uint64_t steps, uint64_t hash, uint64_t frame_len,
                             uint64_t commits) {
  nb__put32(p + 0, NB_HYBRID_MSG_MAGIC);
  nb__put32(p + 4, NB__HY_VERSION);
  nb__put32(p + 8, sender);
  nb__put32(p + 12, flags);
  nb__put64(p + 16, round);
  nb__put64(p + 24, samples);
  nb__put64(p + 32, steps);
  nb__put64(p + 40, hash);
  nb__put64(p + 48, frame_len);
  nb__put64(p + 56, (flags & NB__HY_FLAG_FT) ? commits : 0);
}

static void nb__hy_write_header(nb_hybrid_t* h, uint32_t flags, uint64_t frame_len, uint64_t hash) {
  nb__hy_header_to(h->msg, h->cfg.cluster_index, flags, h->round, h->samples, (uint64_t)h->steps,
                   hash, frame_len, h->commits);
  h->msg_len = NB_HYBRID_MSG_HEADER_BYTES + frame_len;
}

static nb_status_t nb__hy_parse(const nb_hybrid_msg_t* m, nb__hy_hdr_t* o) {
  if (!m->data || m->len < NB_HYBRID_MSG_HEADER_BYTES)
    return nb_error(NB_ERR_CODEC, "hybrid: message of %zu bytes is shorter than its header",
                    m->len);
  const uint8_t* p = m->data;
  if (nb__get32(p) != NB_HYBRID_MSG_MAGIC)
    return nb_error(NB_ERR_CODEC, "hybrid: message has a bad magic 0x%08x", nb__get32(p));
  if (nb__get32(p + 4) != NB__HY_VERSION)
    return nb_error(NB_ERR_CODEC, "hybrid: message version %u, expected %u", nb__get32(p + 4),
                    NB__HY_VERSION);
  o->sender = nb__get32(p + 8);
  o->flags = nb__get32(p + 12);
  o->round = nb__get64(p + 16);
  o->samples = nb__get64(p + 24);
  o->steps = nb__get64(p + 32);
  o->hash = nb__get64(p + 40);
  o->frame_len = nb__get64(p + 48);
  o->commits = nb__get64(p + 56);
  if ((o->flags & ~NB__HY_FLAGS_KNOWN) || (!(o->flags & NB__HY_FLAG_FT) && o->commits != 0) ||
      ((o->flags & NB__HY_FLAG_VOTE) && !(o->flags & NB__HY_FLAG_FT)))
    return nb_error(NB_ERR_CODEC, "hybrid: message from cluster %u has unknown flags", o->sender);
  if (o->frame_len != m->len - NB_HYBRID_MSG_HEADER_BYTES)
    return nb_error(NB_ERR_CODEC,
                    "hybrid: message from cluster %u declares %llu frame bytes, has %zu", o->sender,
                    (unsigned long long)o->frame_len, m->len - NB_HYBRID_MSG_HEADER_BYTES);
  o->frame = p + NB_HYBRID_MSG_HEADER_BYTES;
  return NB_OK;
}

void nb_hybrid_config_defaults(nb_hybrid_config_t* c) {
  memset(c, 0, sizeof *c);
  c->cluster_index = 0;
  c->n_clusters = 1;
  c->inner_steps = NB_HYBRID_INNER_STEPS_DEFAULT;
  c->outer_lr = 0.7f;
  c->outer_momentum = 0.9f;
  c->density = 0.01;
  c->error_feedback = 1;
  c->values = NB_VALUES_INT8;
  c->zstd_level = NB_CODEC_ZSTD_LEVEL_DEFAULT;
  c->overlap_steps = NB_HYBRID_OVERLAP_STEPS_DEFAULT;
  c->eager = 1;
}

static nb_status_t nb__hy_check(const nb_hybrid_config_t* c) {
  if (c->n_clusters < 1 || c->n_clusters > NB_HYBRID_MAX_CLUSTERS)
    return nb_error(NB_ERR_CONFIG, "hybrid: n_clusters %u outside [1, %d]", c->n_clusters,
                    NB_HYBRID_MAX_CLUSTERS);
  if (!(c->ef_decay >= 0.0f && c->ef_decay <= 1.0f))
    return nb_error(NB_ERR_CONFIG, "hybrid: ef_decay %g outside (0, 1] (0 = 1)",
                    (double)c->ef_decay);
  if (c->cluster_index >= c->n_clusters)
    return nb_error(NB_ERR_CONFIG, "hybrid: cluster_index %u >= n_clusters %u", c->cluster_index,
                    c->n_clusters);
  if (c->inner_steps < 1)
    return nb_error(NB_ERR_CONFIG, "hybrid: inner_steps %ld < 1", c->inner_steps);
  if (!(c->norm_bound >= 0) || !isfinite(c->norm_bound) || (c->norm_bound > 0 && c->norm_bound < 1))
    return nb_error(NB_ERR_CONFIG, "hybrid: norm_bound %g is neither 0 (off) nor >= 1",
                    c->norm_bound);
  if (c->norm_bound > 0 && c->ft_exchange)
    return nb_error(
        NB_ERR_CONFIG,
        "hybrid: norm_bound with fault-tolerant rounds (a rejoining cluster would judge "
        "by another history than its peers)");
  if (!(c->round_seconds >= 0) || !isfinite(c->round_seconds))
    return nb_error(NB_ERR_CONFIG, "hybrid: round_seconds must be >= 0");
  if (!(c->outer_lr > 0) || !isfinite(c->outer_lr))
    return nb_error(NB_ERR_CONFIG, "hybrid: outer_lr must be > 0");
  if (!(c->outer_momentum >= 0 && c->outer_momentum < 1))
    return nb_error(NB_ERR_CONFIG, "hybrid: outer_momentum must be in [0, 1)");
  if (!(c->density > 0 && c->density <= 1))
    return nb_error(NB_ERR_CONFIG, "hybrid: density %g outside (0, 1]", c->density);
  if (c->mode != NB_HYBRID_OUTER && c->mode != NB_HYBRID_STEP && c->mode != NB_HYBRID_DENSE)
    return nb_error(NB_ERR_CONFIG, "hybrid: unknown mode %d", (int)c->mode);
  if (c->mode != NB_HYBRID_OUTER && c->overlap)
    return nb_error(NB_ERR_CONFIG, "hybrid: overlap applies to the outer mode only");
  if (c->ft_exchange && c->mode != NB_HYBRID_OUTER)
    return nb_error(NB_ERR_CONFIG, "hybrid: fault-tolerant rounds need the outer mode");
  if (c->overlap_steps < 0)
    return nb_error(NB_ERR_CONFIG, "hybrid: overlap_steps %ld < 0", c->overlap_steps);
  if (c->zstd_level < NB_CODEC_ZSTD_LEVEL_MIN || c->zstd_level > NB_CODEC_ZSTD_LEVEL_MAX)
    return nb_error(NB_ERR_CONFIG, "hybrid: zstd_level %d outside [%d, %d]", c->zstd_level,
                    NB_CODEC_ZSTD_LEVEL_MIN, NB_CODEC_ZSTD_LEVEL_MAX);
  return NB_OK;
}

/* The local model's synced buffer (theta_local), and writes into it. */
static float* nb__hy_params(nb_hybrid_t* h, size_t* n) {
  return h->local.params(h->local.ctx, n);
}
static nb_status_t nb__hy_set_params(nb_hybrid_t* h, const float* src, size_t n) {
  size_t have = 0;
  float* dst = nb__hy_params(h, &have);
  if (!dst || have != n)
    return nb_error(NB_ERR_INVALID, "hybrid: the synced buffer has %zu floats, expected %zu", have,
                    n);
  memmove(dst, src, n * sizeof(float));
  return NB_OK;
}

/* A local model without a steps function runs its own inner loop between rounds: only blocking
 * outer rounds fit it (overlap, wall-time rounds and the per-step modes drive the steps). */
static nb_status_t nb__hy_check_local(const nb_hybrid_config_t* c, const nb_hybrid_local_t* l) {
  if (!l->params || !l->samples)
    return nb_error(NB_ERR_INVALID, "hybrid: the local model needs params and samples");
  if (!l->steps && (c->mode != NB_HYBRID_OUTER || c->overlap || c->round_seconds > 0))
    return nb_error(NB_ERR_CONFIG,
                    "hybrid: a local model that runs its own inner steps needs blocking outer "
                    "rounds (no overlap, no round_seconds, mode outer)");
  if (c->round_seconds > 0 && !l->steps_budget)
    return nb_error(NB_ERR_CONFIG, "hybrid: round_seconds needs the local model's steps_budget");
  if (c->mode != NB_HYBRID_OUTER && !l->step_samples)
    return nb_error(NB_ERR_CONFIG, "hybrid: step and dense modes need the local step_samples");
  return NB_OK;
}

nb_status_t nb_hybrid_create_local(const nb_hybrid_config_t* cfg, const nb_hybrid_local_t* lm,
                                   nb_hybrid_t** out) {
  if (!cfg || !lm || !out) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  *out = NULL;
  NB_CHECK(nb__hy_check(cfg));
  NB_CHECK(nb__hy_check_local(cfg, lm));
  nb_status_t st = NB_OK;
  nb_hybrid_t* h = NULL;
  NB_CHECK(nb_calloc((void**)&h, 1, sizeof *h, "hybrid"));
  h->cfg = *cfg;
  h->local = *lm;
  float* local = nb__hy_params(h, &h->n);
  if (!local || h->n == 0 || h->n > 0xffffffffu) {
    st = nb_error(NB_ERR_INVALID, "hybrid: synced buffer of %zu floats", h->n);
    goto fail;
  }
  h->s_mark = h->local.samples(h->local.ctx);
  if (h->cfg.mode == NB_HYBRID_DENSE) {
    h->cfg.density = 1.0;
    h->cfg.values = NB_VALUES_FP32;
    h->cfg.zstd_level = 0;
  }
  cfg = &h->cfg;
  nb_codec_config_t cc;
  nb_codec_config_default(&cc);
  cc.values = cfg->values;
  cc.zstd_level = cfg->zstd_level;
  if (cfg->topk_chunk) cc.topk_chunk = cfg->topk_chunk;
  NB_CHECK_GOTO(nb_codec_create(&cc, &h->codec), st, fail);
  NB_CHECK_GOTO(nb_calloc((void**)&h->global, h->n, sizeof(float), "theta_global"), st, fail);
  NB_CHECK_GOTO(nb_calloc((void**)&h->momentum, h->n, sizeof(float), "outer momentum"), st, fail);
  NB_CHECK_GOTO(nb_calloc((void**)&h->residual, h->n, sizeof(float), "residual"), st, fail);
  NB_CHECK_GOTO(nb_calloc((void**)&h->delta, h->n, sizeof(float), "delta"), st, fail);
  size_t k = cfg->density >= 1 ? h->n : nb_codec_k_for_density(h->n, cfg->density);
  h->msg_cap = NB_HYBRID_MSG_HEADER_BYTES +
               nb_codec_frame_bound(h->n, k, cfg->values, nb_codec_config(h->codec)->block_size);
  NB_CHECK_GOTO(nb_alloc((void**)&h->msg, h->msg_cap, 1, "hybrid message"), st, fail);
  memcpy(h->global, local, h->n * sizeof(float));
  h->hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  *out = h;
  return NB_OK;
fail:
  nb_hybrid_destroy(h);
  return st;
}

static void nb__hy_release(nb_hybrid_msg_t* m, size_t n);

void nb_hybrid_destroy(nb_hybrid_t* h) {
  if (!h) return;
  if (h->inflight) {
    pthread_join(h->thread, NULL);
    nb__hy_release(h->fly_peers, NB_HYBRID_MAX_CLUSTERS);
  }
  nb__hy_release(h->fly_all, NB_HYBRID_MAX_CLUSTERS);
  nb_free(h->fly);
  nb_free(h->own);
  nb__hy_release(h->pend_msgs, NB_HYBRID_MAX_CLUSTERS);
  nb_free(h->res_pre);
  nb_free(h->lsend);
  nb_free(h->eshift);
  nb_free(h->pend_local);
  nb_free(h->pend_res);
  nb_codec_destroy(h->codec);
  nb_free(h->global);
  nb_free(h->momentum);
  nb_free(h->residual);
  nb_free(h->delta);
  nb_free(h->msg);
  nb_free(h);
}

/* A dense round (density 1, e.g. the adaptive scheduler at a ceiling of 1 after sparse rounds)
 * sends the error-feedback residual inside its frame, so that what the sparse rounds held back
 * is not dropped; the residual is cleared after the encode. A sparse round leaves Delta alone:
 * the codec adds the residual itself. */
static void nb__hy_residual_in(nb_hybrid_t* h) {
  if (h->cfg.error_feedback && h->cfg.ef_decay > 0.0f && h->cfg.ef_decay < 1.0f) {
    float b = h->cfg.ef_decay;
    for (size_t i = 0; i < h->n; i++) h->residual[i] *= b;
  }
  if (h->cfg.error_feedback && h->cfg.density >= 1)
    for (size_t i = 0; i < h->n; i++) h->delta[i] += h->residual[i];
}

static nb_status_t nb__hy_land(nb_hybrid_t* h, nb_hybrid_round_t* applied, double* waited);
/* Fault-tolerant rounds with overlap: where the update in flight is decided. MID: between two
 * inner steps of the next round (its progress so far stays on top); END: after the next round's
 * steps, before its message; DRAIN: right after a round (no step since: theta_local =
 * theta_global when it is applied). */
enum { NB__HY_LAND_MID = 0, NB__HY_LAND_END = 1, NB__HY_LAND_DRAIN = 2 };
static nb_status_t nb__hy_land_ft(nb_hybrid_t* h, int how);

/* k inner steps (or a wall-time budget of `seconds` with at most k), announced to the
 * cluster's other ranks (k < 0: -k steps straight after the last run, see steps_hook). Adds the
 * steps to *done and their summed loss to *loss_sum. */
static nb_status_t nb__hy_steps(nb_hybrid_t* h, long k, double seconds, long* done,
                                double* loss_sum) {
  if (h->cfg.steps_hook) NB_CHECK(h->cfg.steps_hook(h->cfg.hook_ctx, k));
  if (k < 0) k = -k; /* more steps straight after the last run (see steps_hook) */
  long did = k;
  double loss = 0;
  if (h->cfg.round_seconds > 0)
    NB_CHECK(h->local.steps_budget(h->local.ctx, k, seconds, &did, &loss));
  else
    NB_CHECK(h->local.steps(h->local.ctx, k, &loss));
  *done += did;
  *loss_sum += loss * (double)did;
  return NB_OK;
}

/* Overlap: lands the previous round's update between two inner steps of this round. This
 * round started at theta_global - own (own: the previous round's progress, not landed yet);
 * its progress so far, p = theta_local - (theta_global - own), is kept on top of the new
 * theta_global, and the round's Delta is then measured from that theta_global. */
static nb_status_t nb__hy_land_mid(nb_hybrid_t* h) {
  if (h->cfg.ft_exchange) return nb__hy_land_ft(h, NB__HY_LAND_MID);
  size_t n;
  float* local = nb__hy_params(h, &n);
  for (size_t i = 0; i < n; i++) h->own[i] = local[i] - h->global[i] + h->own[i];
  /* on error nothing changed but own (the run stops) */
  NB_CHECK(nb__hy_land(h, &h->mid_rec, &h->mid_waited));
  h->mid_sent = h->fly_sent;
  local = nb__hy_params(h, &n);
  for (size_t i = 0; i < n; i++) local[i] = h->global[i] + h->own[i];
  h->own_valid = 0;
  h->mid_landed = 1;
  return NB_OK;
}

nb_status_t nb_hybrid_prepare(nb_hybrid_t* h, const uint8_t** msg, size_t* len) {
  if (!h || !msg || !len) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  /* Hashed now, not after the last apply, so that a replica changed in between is caught. The
   * message states theta_global as of the round's start, also when an update lands inside it. */
  h->hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  h->msg_hash = h->hash;
  h->mid_landed = 0;
  /* a local model that runs its own steps trained on what it counted since the last round */
  uint64_t s0 = h->local.steps ? h->local.samples(h->local.ctx) : h->s_mark;
  double t0 = nb_now_s(), loss_sum = 0;
  long kh = h->cfg.inner_steps, done = h->local.steps ? 0 : kh;
  if (h->cfg.overlap && h->inflight && h->own_valid && h->cfg.overlap_steps < kh) {
    long tau = h->cfg.overlap_steps;
    if (h->cfg.land_early && h->cfg.round_seconds <= 0 && h->cfg.n_clusters > 1) {
      /* one step at a time until the exchange is over, tau at the latest (the ranks take the
       * buffer before the first only: nothing changes it in between) */
      while (done < tau && !__atomic_load_n(&h->fly_done, __ATOMIC_ACQUIRE))
        NB_CHECK(nb__hy_steps(h, done > 0 ? -1 : 1, 0, &done, &loss_sum));
      h->mid_tau = done;
      NB_CHECK(nb__hy_land_mid(h));
    } else {
      if (tau > 0) NB_CHECK(nb__hy_steps(h, tau, h->cfg.round_seconds, &done, &loss_sum));
      /* a wall-time round whose budget ended first lands it at its end, as without tau */
      if (done == tau && (h->cfg.round_seconds <= 0 || nb_now_s() - t0 < h->cfg.round_seconds)) {
        h->mid_tau = done;
        NB_CHECK(nb__hy_land_mid(h));
      }
    }
  }
  if (done < kh && (done == 0 || h->mid_landed)) {
    double left = h->cfg.round_seconds > 0 ? h->cfg.round_seconds - (nb_now_s() - t0) : 0;
    if (h->cfg.round_seconds <= 0 || left > 0 || done == 0)
      NB_CHECK(
          nb__hy_steps(h, kh - done, done == 0 ? h->cfg.round_seconds : left, &done, &loss_sum));
  }
  /* fault-tolerant rounds with overlap: the previous round's update is decided before this
   * round's message is made (its rounds applied and hash then state the outcome); at the round's
   * end when it did not land inside it */
  if (h->cfg.ft_exchange && h->inflight) NB_CHECK(nb__hy_land_ft(h, NB__HY_LAND_END));
  h->steps = done;
  h->loss = done > 0 ? loss_sum / (double)done : 0;
  double t1 = nb_now_s();
  h->compute_s = t1 - t0 - (h->mid_landed ? h->mid_waited + h->mid_rec.codec_s : 0);
  /* the landed update's wait and decode overlap the steps' own timing by a few microseconds:
   * never report (or schedule from) a negative compute time */
  if (h->compute_s < 0) h->compute_s = 0;
  h->s_mark = h->local.samples(h->local.ctx);
  h->samples = (h->s_mark - s0) * (h->cfg.samples_scale ? h->cfg.samples_scale : 1);

  size_t k = h->cfg.density >= 1 ? h->n : nb_codec_k_for_density(h->n, h->cfg.density);
  size_t need = NB_HYBRID_MSG_HEADER_BYTES +
                nb_codec_frame_bound(h->n, k, h->cfg.values, nb_codec_config(h->codec)->block_size);
  if (need > h->msg_cap) {
    NB_CHECK(nb_realloc((void**)&h->msg, need, 1, "hybrid message"));
    h->msg_cap = need;
  }
  size_t n;
  const float* local = nb__hy_params(h, &n);
  for (size_t i = 0; i < n; i++) h->delta[i] = h->global[i] - local[i];
  /* overlap: the round started at theta_global - own (the previous round's own progress, not
   * landed yet); Delta is this round's progress only */
  if (h->cfg.overlap && h->own_valid)
    for (size_t i = 0; i < n; i++) h->delta[i] -= h->own[i];
  /* A non-finite Delta (a diverged local model, a NaN in the caller's buffers) never reaches the
   * codec or the residual: without fault tolerance every cluster must hear of it, so the message
   * goes out frameless and flagged, and every cluster's apply refuses the round; with it, the
   * round fails here and the peers skip it as a missing update. */
  size_t bad = nb__hy_first_nonfinite(h->delta, n);
  if (bad < n) {
    if (h->cfg.ft_exchange)
      return nb_error(NB_ERR_INVALID,
                      "hybrid: round %llu: our update is not finite (element %zu): refused",
                      (unsigned long long)h->round, bad);
    NB_WARN(
        "hybrid: round %llu: our update is not finite (element %zu): every cluster refuses "
        "the round",
        (unsigned long long)h->round, bad);
    nb__hy_write_header(h, NB__HY_FLAG_REFUSED, 0, h->msg_hash);
    h->codec_s = nb_now_s() - t1;
    *msg = h->msg;
    *len = h->msg_len;
    return NB_OK;
  }
  if (h->cfg.ft_exchange && h->cfg.overlap && h->res_pre) /* restored if the round is skipped */
    memcpy(h->res_pre, h->residual, h->n * sizeof(float));
  nb__hy_residual_in(h);
  size_t flen = 0;
  uint8_t* frame = h->msg + NB_HYBRID_MSG_HEADER_BYTES;
  size_t cap = h->msg_cap - NB_HYBRID_MSG_HEADER_BYTES;
  uint32_t me = h->cfg.cluster_index;
  if (h->cfg.density >= 1)
    NB_CHECK(nb_codec_encode_dense(h->codec, h->delta, n, h->round, me, frame, cap, &flen));
  else
    NB_CHECK(nb_codec_encode_sparse(h->codec, h->delta, h->cfg.error_feedback ? h->residual : NULL,
                                    n, h->cfg.density, h->round, me, frame, cap, &flen));
  if (h->cfg.error_feedback && h->cfg.density >= 1) /* a dense frame carried the residual */
    memset(h->residual, 0, h->n * sizeof(float));
  nb__hy_write_header(h, 0, flen, h->msg_hash);
  h->codec_s = nb_now_s() - t1;
  *msg = h->msg;
  *len = h->msg_len;
  return NB_OK;
}

/* Parses and checks the messages of this round: one per cluster, right round and kind, and
 * the same theta_global hash as ours. byc[c] receives cluster c's header. */
static nb_status_t nb__hy_collect(nb_hybrid_t* h, const nb_hybrid_msg_t* msgs, size_t n_msgs,
                                  uint32_t flags, uint64_t round, uint64_t hash,
                                  nb__hy_hdr_t* byc) {
  uint32_t nc = h->cfg.n_clusters;
  if (!msgs || n_msgs != nc)
    return nb_error(NB_ERR_INVALID, "hybrid: round %llu: %zu messages for %u clusters",
                    (unsigned long long)round, n_msgs, nc);
  uint8_t seen[NB_HYBRID_MAX_CLUSTERS] = {0};
  for (size_t i = 0; i < n_msgs; i++) {
    nb__hy_hdr_t hd;
    NB_CHECK(nb__hy_parse(&msgs[i], &hd));
    if (hd.sender >= nc || seen[hd.sender])
      return nb_error(NB_ERR_INVALID, "hybrid: round %llu: unexpected or repeated sender %u",
                      (unsigned long long)round, hd.sender);
    seen[hd.sender] = 1;
    if (hd.round == round && (hd.flags & NB__HY_FLAG_REFUSED))
      return nb_error(NB_ERR_INVALID,
                      "hybrid: round %llu: the update of cluster %u is not finite: the round is "
                      "refused, nothing applied",
                      (unsigned long long)round, hd.sender);
    if (hd.round != round || hd.flags != flags)
      return nb_error(NB_ERR_INVALID,
                      "hybrid: cluster %u sent round %llu (flags %u); expected round %llu "
                      "(flags %u)",
                      hd.sender, (unsigned long long)hd.round, hd.flags, (unsigned long long)round,
                      flags);
    if (hd.hash != hash)
      return nb_error(NB_ERR_INTEGRITY,
                      "hybrid: round %llu: theta_global of cluster %u (xxh3 %016llx) differs "
                      "from ours (cluster %u, %016llx): the replicas diverged",
                      (unsigned long long)round, hd.sender, (unsigned long long)hd.hash,
                      h->cfg.cluster_index, (unsigned long long)hash);
    byc[hd.sender] = hd;
  }
  return NB_OK;
}

/* L2 norm of x[0..n), summed in double in index order (the same bits on every cluster). */
static double nb__hy_norm(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
  return sqrt(s);
}

static int nb__hy_cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* cfg.norm_bound: the sum in h->delta (norm h->norm) against the median of the last applied
 * rounds'. Refused: which cluster sent the largest part (each frame decoded alone into h->delta,
 * which the refused round does not use; only on this path). */
static nb_status_t nb__hy_norm_check(nb_hybrid_t* h, const nb__hy_hdr_t* byc, uint64_t total,
                                     uint64_t round) {
  if (!(h->cfg.norm_bound > 0) || h->n_norms < NB_HYBRID_NORM_WARMUP) return NB_OK;
  double sorted[NB_HYBRID_NORM_WINDOW];
  memcpy(sorted, h->norms, h->n_norms * sizeof *sorted);
  qsort(sorted, h->n_norms, sizeof *sorted, nb__hy_cmp_double);
  uint32_t m = h->n_norms;
  double med = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
  if (!(h->norm > h->cfg.norm_bound * med)) return NB_OK;
  uint32_t worst = 0;
  double worst_norm = -1;
  for (uint32_t c = 0; c < h->cfg.n_clusters; c++) {
    memset(h->delta, 0, h->n * sizeof(float));
    float w = (float)((double)byc[c].samples / (double)total);
    if (nb_codec_decode_accumulate(h->codec, byc[c].frame, byc[c].frame_len, w, h->delta, h->n,
                                   NULL) != NB_OK)
      continue; /* decoded a moment ago: cannot fail now */
    double v = nb__hy_norm(h->delta, h->n);
    if (v > worst_norm) {
      worst_norm = v;
      worst = c;
    }
  }
  return nb_error(NB_ERR_INVALID,
                  "hybrid: round %llu: the summed update's norm %.4g is %.3g times the median "
                  "%.4g of the last %u applied rounds (bound %g): the round is refused, nothing "
                  "applied; cluster %u sent the largest part (norm %.4g)",
                  (unsigned long long)round, h->norm, med > 0 ? h->norm / med : INFINITY, med, m,
                  h->cfg.norm_bound, worst, worst_norm);
}

/* An applied round's update norm joins the history. */
static void nb__hy_norm_push(nb_hybrid_t* h) {
  h->norms[h->norm_at % NB_HYBRID_NORM_WINDOW] = h->norm;
  h->norm_at++;
  if (h->n_norms < NB_HYBRID_NORM_WINDOW) h->n_norms++;
}

/* Checks and applies the messages of `round`, whose senders held theta_global with `hash`. */
/* Checks the messages of `round` (senders holding `hash`) and writes the sample-weighted sum of
 * their decoded frames, in cluster order, into h->delta. *total: all clusters' samples. */
static nb_status_t nb__hy_sum(nb_hybrid_t* h, const nb_hybrid_msg_t* msgs, size_t n_msgs,
                              uint64_t round, uint64_t hash, uint64_t* total_out) {
  nb__hy_hdr_t byc[NB_HYBRID_MAX_CLUSTERS];
  NB_CHECK(
      nb__hy_collect(h, msgs, n_msgs, h->cfg.ft_exchange ? NB__HY_FLAG_FT : 0, round, hash, byc));
  uint32_t nc = h->cfg.n_clusters;
  uint64_t total = 0;
  for (uint32_t c = 0; c < nc; c++) {
    if (total + byc[c].samples < total)
      return nb_error(NB_ERR_INVALID, "hybrid: sample counts overflow");
    total += byc[c].samples;
    nb_frame_info_t fi;
    NB_CHECK(nb_error_wrap(nb_codec_frame_info(byc[c].frame, byc[c].frame_len, NULL, &fi),
                           "hybrid: frame of a cluster"));
    if (fi.n != h->n || fi.sender != c || fi.round != round)
      return nb_error(NB_ERR_INVALID,
                      "hybrid: cluster %u's frame is for n %llu sender %u round %llu; expected "
                      "n %zu sender %u round %llu",
                      c, (unsigned long long)fi.n, fi.sender, (unsigned long long)fi.round, h->n, c,
                      (unsigned long long)round);
  }
  if (total == 0) return nb_error(NB_ERR_INVALID, "hybrid: no cluster trained on any sample");
  /* The weighted sum, in cluster order, into a zeroed buffer: the same bits everywhere. */
  memset(h->delta, 0, h->n * sizeof(float));
  for (uint32_t c = 0; c < nc; c++) {
    float w = (float)((double)byc[c].samples / (double)total);
    nb_status_t st = nb_codec_decode_accumulate(h->codec, byc[c].frame, byc[c].frame_len, w,
                                                h->delta, h->n, NULL);
    if (st != NB_OK) return nb_error_wrap(st, "hybrid: decoding a cluster's frame");
  }
  /* a peer's frame can decode to non-finite values (fp32 values carry NaN): never step on them */
  size_t bad = nb__hy_first_nonfinite(h->delta, h->n);
  if (bad < h->n)
    return nb_error(NB_ERR_INVALID,
                    "hybrid: round %llu: the weighted sum of the updates is not finite (element "
                    "%zu): the round is refused, nothing applied",
                    (unsigned long long)round, bad);
  h->norm = nb__hy_norm(h->delta, h->n);
  NB_CHECK(nb__hy_norm_check(h, byc, total, round));
  *total_out = total;
  return NB_OK;
}

/* The eager prediction's move for our message of length len (header included): p = lr mu^2 m +
 * lr (1 + mu) / n_clusters times our decoded frame. codec: scratch, or NULL (a call while the
 * exchange thread runs). */
static nb_status_t nb__hy_eager_move(nb_hybrid_t* h, nb_codec_t* codec, const uint8_t* msg,
                                     size_t len, float* p) {
  float lr = h->cfg.outer_lr, mu = h->cfg.outer_momentum;
  float base = lr * mu * mu, w = lr * (1.0f + mu) / (float)h->cfg.n_clusters;
  for (size_t i = 0; i < h->n; i++) p[i] = base * h->momentum[i];
  return nb_codec_decode_accumulate(codec, msg + NB_HYBRID_MSG_HEADER_BYTES,
                                    len - NB_HYBRID_MSG_HEADER_BYTES, w, p, h->n, NULL);
}

/* Eager overlap (a sparse round): theta_local for the round that starts now, whose own frame is
 * in flight, is the outer step (Nesterov as nb_outer_step, momentum untouched) on this cluster's
 * share of what that frame carries, sent / n_clusters, instead of theta_global - own: what the
 * landing will move theta_global by as far as this cluster knows it. The frame, not the whole
 * Delta: what it leaves in the error-feedback residual lands in later rounds, and the other
 * clusters' part is unknown yet (their last round's is no guide, measured). The share is the
 * equal one, not the samples' (those of the round in flight are not known here), so that a
 * resumed run starts every round where the uninterrupted one did. The step is linear in the
 * frame: lr mu^2 m on every coordinate plus lr (1 + mu) / n_clusters times the decoded frame.
 * h->own becomes theta_global - theta_local, so that the landing keeps the progress since on
 * top, as without; eshift records the move (a skipped round moves back by it). A message
 * without a frame (a refused round) starts plainly. */
static nb_status_t nb__hy_eager_start(nb_hybrid_t* h, float* local) {
  size_t flen = h->msg_len - NB_HYBRID_MSG_HEADER_BYTES;
  if (flen == 0) {
    for (size_t i = 0; i < h->n; i++) local[i] = h->global[i] - h->own[i];
    h->eshift_valid = 0;
    return NB_OK;
  }
  if (!h->eshift) NB_CHECK(nb_alloc((void**)&h->eshift, h->n, sizeof(float), "eager shift"));
  for (size_t i = 0; i < h->n; i++) h->eshift[i] = -h->own[i];
  NB_CHECK(nb__hy_eager_move(h, h->codec, h->msg, h->msg_len, h->own));
  for (size_t i = 0; i < h->n; i++) {
    h->eshift[i] += h->own[i];
    local[i] = h->global[i] - h->own[i];
  }
  h->eshift_valid = 1;
  return NB_OK;
}

nb_status_t nb_hybrid_eager_target(nb_hybrid_t* h, float* out, int* moved) {
  if (!h || !out || !moved) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  *moved = 0;
  /* ours in flight (ft_begin: the copy the thread sends, read only there) or just prepared */
  const uint8_t* msg = h->inflight ? h->fly : h->msg;
  size_t len = h->inflight ? h->fly_len : h->msg_len;
  if (!h->cfg.eager || h->cfg.mode != NB_HYBRID_OUTER || h->cfg.density >= 1 || !msg ||
      len <= NB_HYBRID_MSG_HEADER_BYTES)
    return NB_OK;
  NB_CHECK(nb__hy_eager_move(h, NULL, msg, len, out));
  for (size_t i = 0; i < h->n; i++) out[i] = h->global[i] - out[i];
  *moved = 1;
  return NB_OK;
}

static nb_status_t nb__hy_apply(nb_hybrid_t* h, const nb_hybrid_msg_t* msgs, size_t n_msgs,
                                uint64_t round, uint64_t hash, nb_hybrid_round_t* rec) {
  double t0 = nb_now_s();
  uint64_t total = 0;
  NB_CHECK(nb__hy_sum(h, msgs, n_msgs, round, hash, &total));
  nb_outer_step(h->global, h->delta, h->momentum, h->cfg.outer_lr, h->cfg.outer_momentum, h->n);
  NB_CHECK(nb__hy_set_params(h, h->global, h->n));
  h->hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  h->commits++;
  nb__hy_norm_push(h);
  if (rec) {
    memset(rec, 0, sizeof *rec);
    rec->update_norm = h->norm;
    rec->round = round;
    rec->steps = h->steps;
    rec->samples = h->samples;
    rec->samples_all = total;
    rec->loss = h->loss;
    rec->msg_bytes = h->msg_len;
    rec->density = h->cfg.density;
    rec->compute_s = h->compute_s;
    rec->codec_s = h->codec_s + (nb_now_s() - t0);
    rec->global_hash = h->hash;
  }
  return NB_OK;
}

nb_status_t nb_hybrid_apply(nb_hybrid_t* h, const nb_hybrid_msg_t* msgs, size_t n_msgs,
                            nb_hybrid_round_t* rec) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (h->cfg.overlap)
    return nb_error(NB_ERR_INVALID, "hybrid: apply is for rounds without overlap");
  NB_CHECK(nb__hy_apply(h, msgs, n_msgs, h->round, h->hash, rec));
  h->round++;
  return NB_OK;
}

static void nb__hy_release(nb_hybrid_msg_t* m, size_t n) {
  for (size_t i = 0; i < n; i++) {
    nb_free(m[i].data);
    m[i].data = NULL;
    m[i].len = 0;
  }
}

/* Exchanges our current message; all[0] is ours (borrowed), all[1..] the peers' (owned). */
static nb_status_t nb__hy_exchange(nb_hybrid_t* h, nb_hybrid_msg_t* all, uint64_t* sent,
                                   double* secs) {
  if (!h->cfg.exchange) return nb_error(NB_ERR_CONFIG, "hybrid: no exchange callback");
  all[0].data = h->msg;
  all[0].len = h->msg_len;
  double t0 = nb_now_s();
  nb_status_t st = NB_OK;
  if (h->cfg.n_clusters > 1)
    st = h->cfg.exchange(h->cfg.exchange_ctx, h->round, h->msg, h->msg_len, all + 1,
                         h->cfg.n_clusters - 1, sent);
  *secs = nb_now_s() - t0;
  if (st != NB_OK) {
    nb__hy_release(all + 1, h->cfg.n_clusters - 1);
    return nb_error_wrap(st, "hybrid: exchange");
  }
  return NB_OK;
}

static void* nb__hy_fly_noop(void* arg) {
  nb_hybrid_t* h = arg;
  __atomic_store_n(&h->fly_done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void* nb__hy_fly_main(void* arg) {
  nb_hybrid_t* h = arg;
  h->fly_sent = 0;
  double t0 = nb_now_s();
  h->fly_status = h->cfg.exchange(h->cfg.exchange_ctx, h->inflight_round, h->fly, h->fly_len,
                                  h->fly_peers, h->cfg.n_clusters - 1, &h->fly_sent);
  h->fly_secs = nb_now_s() - t0;
  if (h->fly_status != NB_OK) snprintf(h->fly_error, sizeof h->fly_error, "%s", nb_error_last());
  __atomic_store_n(&h->fly_done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Waits for the exchange in flight and applies it. *waited: seconds spent waiting. */
static nb_status_t nb__hy_land(nb_hybrid_t* h, nb_hybrid_round_t* applied, double* waited) {
  double t0 = nb_now_s();
  pthread_join(h->thread, NULL);
  h->inflight = 0;
  *waited = nb_now_s() - t0;
  nb_status_t st = h->fly_status;
  if (st != NB_OK) {
    nb__hy_release(h->fly_peers, h->cfg.n_clusters - 1);
    return nb_error(st, "hybrid: exchange of round %llu: %s", (unsigned long long)h->inflight_round,
                    h->fly_error);
  }
  nb_hybrid_msg_t all[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  all[0].data = h->fly;
  all[0].len = h->fly_len;
  for (uint32_t i = 1; i < h->cfg.n_clusters; i++) all[i] = h->fly_peers[i - 1];
  st = nb__hy_apply(h, all, h->cfg.n_clusters, h->inflight_round, h->inflight_hash, applied);
  nb__hy_release(h->fly_peers, h->cfg.n_clusters - 1);
  return st;
}

static nb_status_t nb__hy_round_overlap(nb_hybrid_t* h, nb_hybrid_round_t* rec) {
  if (!h->cfg.exchange) return nb_error(NB_ERR_CONFIG, "hybrid: no exchange callback");
  const uint8_t* msg;
  size_t len;
  NB_CHECK(nb_hybrid_prepare(h, &msg, &len));
  uint64_t msg_hash = h->msg_hash; /* what our message states; landing changes h->hash */
  if (!h->own) NB_CHECK(nb_alloc((void**)&h->own, h->n, sizeof(float), "own delta"));
  memcpy(h->own, h->delta, h->n * sizeof(float)); /* landing overwrites h->delta */
  h->own_valid = 1;
  nb_hybrid_round_t applied;
  memset(&applied, 0, sizeof applied);
  double waited = 0;
  uint64_t sent = 0;
  int landed_any = h->inflight || h->mid_landed;
  if (h->inflight) {
    NB_CHECK(nb__hy_land(h, &applied, &waited));
    sent = h->fly_sent;
  } else if (h->mid_landed) {
    applied = h->mid_rec;
    waited = h->mid_waited;
    sent = h->mid_sent;
  }
  /* The next round continues from theta_global as landed plus this round's own progress, which
   * is not in it yet (it lands, averaged, one round later): theta_local = theta_global - Delta.
   * Restarting from theta_global alone would put every round one round behind, and the late
   * updates would then overshoot. */
  {
    size_t n;
    float* local = nb__hy_params(h, &n);
    if (h->cfg.eager && h->cfg.density < 1)
      NB_CHECK(nb__hy_eager_start(h, local));
    else
      for (size_t i = 0; i < n; i++) local[i] = h->global[i] - h->own[i];
  }
  if (len > h->fly_cap) {
    NB_CHECK(nb_realloc((void**)&h->fly, len, 1, "hybrid message in flight"));
    h->fly_cap = len;
  }
  double took = landed_any ? h->fly_secs : 0; /* the landed exchange's, before the next starts */
  memcpy(h->fly, msg, len);
  h->fly_len = len;
  h->inflight_round = h->round;
  h->inflight_hash = msg_hash;
  h->fly_status = NB_OK;
  if (h->cfg.n_clusters > 1) {
    h->fly_done = 0;
    if (pthread_create(&h->thread, NULL, nb__hy_fly_main, h) != 0)
      return nb_error(NB_ERR_SYSTEM, "hybrid: cannot start the exchange thread");
  } else {
    h->fly_sent = 0;
    h->fly_done = 0;
    if (pthread_create(&h->thread, NULL, nb__hy_fly_noop, h) != 0)
      return nb_error(NB_ERR_SYSTEM, "hybrid: cannot start the exchange thread");
  }
  h->inflight = 1;
  if (rec) {
    memset(rec, 0, sizeof *rec);
    rec->round = h->round;
    rec->steps = h->steps;
    rec->samples = h->samples;
    rec->samples_all = applied.samples_all;
    rec->landed_step = h->mid_landed ? h->mid_tau : -1;
    rec->exchange_took_s = took;
    rec->loss = h->loss;
    rec->msg_bytes = h->msg_len;
    rec->bytes_sent = sent;
    rec->density = h->cfg.density;
    rec->compute_s = h->compute_s;
    rec->codec_s = h->codec_s + applied.codec_s;
    rec->exchange_s = waited;
    rec->global_hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  }
  h->round++;
  return NB_OK;
}

nb_status_t nb_hybrid_gradient(nb_hybrid_t* h, float* grads, size_t n) {
  if (!h || !grads) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (h->cfg.mode == NB_HYBRID_OUTER) return NB_OK;
  if (n != h->n)
    return nb_error(NB_ERR_INVALID, "hybrid: gradient of %zu floats, synced buffer %zu", n, h->n);
  double t0 = nb_now_s();
  h->samples =
      h->local.step_samples(h->local.ctx) * (h->cfg.samples_scale ? h->cfg.samples_scale : 1);
  h->steps = 1;
  h->hash = nb_xxh3_64(nb__hy_params(h, NULL), n * sizeof(float), 0);
  uint8_t* frame = h->msg + NB_HYBRID_MSG_HEADER_BYTES;
  size_t cap = h->msg_cap - NB_HYBRID_MSG_HEADER_BYTES, flen = 0;
  uint32_t me = h->cfg.cluster_index;
  if (h->cfg.density >= 1)
    NB_CHECK(nb_codec_encode_dense(h->codec, grads, n, h->xseq, me, frame, cap, &flen));
  else
    NB_CHECK(nb_codec_encode_sparse(h->codec, grads, h->cfg.error_feedback ? h->residual : NULL, n,
                                    h->cfg.density, h->xseq, me, frame, cap, &flen));
  uint64_t saved_round = h->round;
  h->round = h->xseq; /* the header's round field */
  nb__hy_write_header(h, 0, flen, h->hash);
  h->round = saved_round;
  double t1 = nb_now_s();
  nb_hybrid_msg_t all[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  all[0].data = h->msg;
  all[0].len = h->msg_len;
  uint64_t sent = 0;
  nb_status_t st = NB_OK;
  if (h->cfg.n_clusters > 1) {
    if (!h->cfg.exchange) return nb_error(NB_ERR_CONFIG, "hybrid: no exchange callback");
    st = h->cfg.exchange(h->cfg.exchange_ctx, h->xseq, h->msg, h->msg_len, all + 1,
                         h->cfg.n_clusters - 1, &sent);
  }
  double t2 = nb_now_s();
  if (st == NB_OK) {
    uint64_t total;
    st = nb__hy_sum(h, all, h->cfg.n_clusters, h->xseq, h->hash, &total);
  }
  nb__hy_release(all + 1, h->cfg.n_clusters - 1);
  if (st != NB_OK) return nb_error_wrap(st, "hybrid: step %llu", (unsigned long long)h->xseq);
  memcpy(grads, h->delta, n * sizeof(float));
  h->xseq++;
  h->step_sent += sent;
  h->step_msg_bytes += h->msg_len;
  h->step_exchange_s += t2 - t1;
  h->step_codec_s += (t1 - t0) + (nb_now_s() - t2);
  return NB_OK;
}

static nb_status_t nb__hy_round_steps(nb_hybrid_t* h, nb_hybrid_round_t* rec) {
  h->step_sent = h->step_msg_bytes = 0;
  h->step_exchange_s = h->step_codec_s = 0;
  uint64_t s0 = h->local.samples(h->local.ctx), x0 = h->xseq;
  double loss = 0, t0 = nb_now_s();
  long k = h->cfg.inner_steps;
  if (h->cfg.round_seconds > 0)
    NB_CHECK(h->local.steps_budget(h->local.ctx, k, h->cfg.round_seconds, &k, &loss));
  else
    NB_CHECK(h->local.steps(h->local.ctx, k, &loss));
  double wall = nb_now_s() - t0;
  if (h->cfg.n_clusters > 1 && h->xseq - x0 != (uint64_t)k)
    return nb_error(NB_ERR_CONFIG,
                    "hybrid: %s mode needs nb_hybrid_gradient as the trainer's "
                    "grad hook (%llu exchanges in %ld steps)",
                    h->cfg.mode == NB_HYBRID_DENSE ? "dense" : "step",
                    (unsigned long long)(h->xseq - x0), k);
  memcpy(h->global, nb__hy_params(h, NULL), h->n * sizeof(float));
  h->hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  if (rec) {
    memset(rec, 0, sizeof *rec);
    rec->round = h->round;
    rec->steps = k;
    rec->samples = h->local.samples(h->local.ctx) - s0;
    rec->loss = loss;
    rec->msg_bytes = h->step_msg_bytes;
    rec->bytes_sent = h->step_sent;
    rec->density = h->cfg.density;
    rec->exchange_s = h->step_exchange_s;
    rec->codec_s = h->step_codec_s;
    rec->compute_s = wall - h->step_exchange_s - h->step_codec_s;
    rec->global_hash = h->hash;
  }
  h->round++;
  return NB_OK;
}

/* ------------------------------------------------------------ fault-tolerant rounds */

static nb_status_t nb__hy_ft_buffers(nb_hybrid_t* h) {
  float** bufs[4] = {&h->res_pre, &h->lsend, &h->pend_local, &h->pend_res};
  for (int i = 0; i < 4; i++)
    if (!*bufs[i])
      NB_CHECK(nb_calloc((void**)bufs[i], h->n, sizeof(float), "fault-tolerant round"));
  return NB_OK;
}

static void nb__hy_drop_pending(nb_hybrid_t* h) {
  nb__hy_release(h->pend_msgs, NB_HYBRID_MAX_CLUSTERS);
  h->pend = 0;
}

/* Applies the held round (every cluster applied it; our confirmation was lost), then puts our
 * own progress since that round's message on top: theta_local = theta_global + (local now -
 * local at that send), and the residual is the one that round's encode left. */
static nb_status_t nb__hy_land_pending(nb_hybrid_t* h) {
  size_t n;
  float* local = nb__hy_params(h, &n);
  memcpy(h->lsend, local, n * sizeof(float)); /* the progress is measured from here */
  NB_CHECK(nb__hy_apply(h, h->pend_msgs, h->cfg.n_clusters, h->pend_round, h->pend_hash, NULL));
  for (size_t i = 0; i < n; i++) local[i] = h->global[i] + (h->lsend[i] - h->pend_local[i]);
  memcpy(h->residual, h->pend_res, n * sizeof(float));
  h->ft_samples = h->ft_samples > h->pend_samples ? h->ft_samples - h->pend_samples : 0;
  NB_WARN("hybrid: round %llu applied late (a lost vote): %llu rounds applied, theta %016llx",
          (unsigned long long)h->pend_round, (unsigned long long)h->commits,
          (unsigned long long)h->hash);
  nb__hy_drop_pending(h);
  return NB_OK;
}

/* Copies a message (owned copy). */
static nb_status_t nb__hy_copy_msg(nb_hybrid_msg_t* dst, const uint8_t* data, size_t len) {
  NB_CHECK(nb_alloc((void**)&dst->data, len ? len : 1, 1, "held message"));
  memcpy(dst->data, data, len);
  dst->len = len;
  return NB_OK;
}

/* Holds round a (every update arrived, not every vote): owned copies of the messages in
 * cluster order, theta_local when ours was made (h->lsend), the residual after its encode, and
 * what it lands on (k rounds applied, hash) with the samples it covers; landed late when a peer
 * turns out to have applied it (nb__hy_land_pending). */
static nb_status_t nb__hy_hold(nb_hybrid_t* h, const nb_hybrid_msg_t* all, uint64_t a, uint64_t k,
                               uint64_t hash, uint64_t samples) {
  nb_status_t st = NB_OK;
  nb__hy_drop_pending(h);
  for (uint32_t c = 0; c < h->cfg.n_clusters && st == NB_OK; c++)
    st = nb__hy_copy_msg(&h->pend_msgs[c], all[c].data, all[c].len);
  memcpy(h->pend_local, h->lsend, h->n * sizeof(float));
  memcpy(h->pend_res, h->residual, h->n * sizeof(float));
  h->pend = st == NB_OK;
  h->pend_round = a;
  h->pend_commits = k;
  h->pend_hash = hash;
  h->pend_samples = samples;
  return st;
}

/* The votes of round a: how many peers confirm every update of it on our theta_global (k
 * rounds applied, hash); malformed, foreign and repeated votes are ignored. *newest: raised to
 * the highest rounds-applied count a vote states. */
static uint32_t nb__hy_count_votes(const nb_hybrid_t* h, const nb_hybrid_msg_t* votes, uint32_t np,
                                   uint64_t a, uint64_t k, uint64_t hash, uint64_t* newest) {
  uint32_t nc = h->cfg.n_clusters, me = h->cfg.cluster_index, yes = 0;
  uint8_t seen[NB_HYBRID_MAX_CLUSTERS] = {0};
  for (uint32_t i = 0; i < np; i++) {
    nb__hy_hdr_t hd;
    if (!votes[i].data || nb__hy_parse(&votes[i], &hd) != NB_OK) continue;
    if (hd.flags != (NB__HY_FLAG_FT | NB__HY_FLAG_VOTE) || hd.sender >= nc || hd.sender == me ||
        seen[hd.sender] || hd.round != a)
      continue;
    seen[hd.sender] = 1;
    if (hd.commits > *newest) *newest = hd.commits;
    if (hd.samples == 1 && hd.commits == k && hd.hash == hash) yes++;
  }
  return yes;
}

/* Sorts the peers' updates of round a into all[] by sender (moved out of got[], which is then
 * released): which peers sent a usable update of this round on the same theta_global (k rounds
 * applied, hash)? Malformed, foreign and repeated ones are ignored; *have_all is cleared unless
 * every peer's update is usable, *ok counts the usable ones and *newest is raised to the highest
 * rounds-applied count stated. NB_ERR_INTEGRITY when a peer at k holds another theta_global. */
static nb_status_t nb__hy_ft_take_updates(const nb_hybrid_t* h, nb_hybrid_msg_t* got, uint32_t np,
                                          uint64_t a, uint64_t k, uint64_t hash,
                                          nb_hybrid_msg_t* all, int* have_all, uint32_t* ok,
                                          uint64_t* newest) {
  uint32_t nc = h->cfg.n_clusters, me = h->cfg.cluster_index;
  for (uint32_t i = 0; i < np; i++) {
    if (!got[i].data) {
      *have_all = 0;
      continue;
    }
    nb__hy_hdr_t hd;
    if (nb__hy_parse(&got[i], &hd) != NB_OK) {
      NB_WARN("hybrid: round %llu: a malformed update ignored: %s", (unsigned long long)a,
              nb_error_last());
      *have_all = 0;
      continue;
    }
    if (!(hd.flags & NB__HY_FLAG_FT) || (hd.flags & (NB__HY_FLAG_VOTE | NB__HY_FLAG_HASH_ONLY)) ||
        hd.sender >= nc || hd.sender == me || all[hd.sender].data) {
      NB_WARN(
          "hybrid: round %llu: an update ignored (flags 0x%x, from cluster %u of %u, we are "
          "%u%s): not a fault-tolerant round's update of another cluster",
          (unsigned long long)a, (unsigned)hd.flags, hd.sender, nc, me,
          hd.sender < nc && all[hd.sender].data ? ", a repeat" : "");
      *have_all = 0;
      continue;
    }
    if (hd.commits > *newest) *newest = hd.commits;
    if (hd.commits == k && hd.hash != hash) {
      nb__hy_release(got, np);
      for (uint32_t c = 0; c < nc; c++) /* what was taken so far: the caller gets nothing */
        if (c != me) {
          nb_free(all[c].data);
          all[c].data = NULL;
        }
      return nb_error(NB_ERR_INTEGRITY,
                      "hybrid: round %llu: theta_global of cluster %u (xxh3 %016llx) differs "
                      "from ours (cluster %u, %016llx) after %llu applied rounds: the replicas "
                      "diverged",
                      (unsigned long long)a, hd.sender, (unsigned long long)hd.hash, me,
                      (unsigned long long)hash, (unsigned long long)k);
    }
    if (hd.commits != k || hd.round != a) *have_all = 0;
    all[hd.sender] = got[i];
    got[i].data = NULL;
    (*ok)++;
  }
  nb__hy_release(got, np);
  return NB_OK;
}

/* A round that was not applied while a peer states more rounds applied (newest > k): the held
 * round lands late when it is the one missing (*caught_up), otherwise this cluster needs the
 * state (*need_state). */
static nb_status_t nb__hy_ft_catch_up(nb_hybrid_t* h, int commit, uint64_t newest, uint64_t a,
                                      uint64_t k, int* caught_up, int* need_state) {
  if (!commit && newest > k) {
    if (newest == k + 1 && h->pend && h->pend_commits == k && h->pend_round != a) {
      NB_CHECK(nb__hy_land_pending(h));
      *caught_up = 1;
    } else {
      *need_state = 1;
    }
  }
  return NB_OK;
}

/* What one fault-tolerant round saw of its peers (nb__hy_round_ft). */
typedef struct {
  uint64_t sent, sent2, ahead, newest_commits;
  uint32_t alive, ok;
  int have_all, commit, caught_up, need_state;
  double xs;
} nb__hy_ft_seen_t;

/* The update of a fault-tolerant round: encoded (the residual before it kept in h->res_pre),
 * its header stating the samples of every round since the last applied one, and theta_local at
 * the send kept in h->lsend. */
static nb_status_t nb__hy_ft_prepare(nb_hybrid_t* h) {
  NB_CHECK(nb__hy_ft_buffers(h));
  memcpy(h->res_pre, h->residual, h->n * sizeof(float));
  const uint8_t* msg;
  size_t len;
  NB_CHECK(nb_hybrid_prepare(h, &msg, &len));
  uint64_t round_samples = h->samples;
  h->ft_samples += round_samples;
  h->samples = h->ft_samples; /* our Delta covers every round since the last applied one */
  nb__hy_write_header(h, NB__HY_FLAG_FT, h->msg_len - NB_HYBRID_MSG_HEADER_BYTES, h->hash);
  h->samples = round_samples;
  memcpy(h->lsend, nb__hy_params(h, NULL), h->n * sizeof(float));
  return NB_OK;
}

/* The update exchange of round a (none without peers), its usable updates sorted into all[]. */
static nb_status_t nb__hy_ft_updates(nb_hybrid_t* h, uint64_t a, uint64_t k, uint64_t hash,
                                     nb_hybrid_msg_t* all, nb__hy_ft_seen_t* s) {
  uint32_t np = h->cfg.n_clusters - 1;
  nb_hybrid_msg_t got[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  if (np > 0) {
    nb_status_t st = h->cfg.ft_exchange(h->cfg.exchange_ctx, 2 * a + 2, h->msg, h->msg_len, got, np,
                                        &s->sent, &s->ahead, &s->alive);
    if (st != NB_OK) {
      nb__hy_release(got, np);
      return nb_error_wrap(st, "hybrid: exchange");
    }
  }
  return nb__hy_ft_take_updates(h, got, np, a, k, hash, all, &s->have_all, &s->ok,
                                &s->newest_commits);
}

/* The vote of round a (1 when every update arrived; sent even when not, so nobody waits for it)
 * and the peers' votes: s->commit when every update is here and every peer voted yes. The
 * header of the update in h->msg is put back after the vote's is written. */
static nb_status_t nb__hy_ft_vote(nb_hybrid_t* h, uint64_t a, uint64_t k, uint64_t hash,
                                  nb__hy_ft_seen_t* s) {
  uint32_t np = h->cfg.n_clusters - 1, alive2 = 0;
  uint64_t ahead2 = 0;
  nb_hybrid_msg_t votes[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  uint8_t saved[NB_HYBRID_MSG_HEADER_BYTES];
  memcpy(saved, h->msg, sizeof saved);
  uint64_t s_samples = h->samples, s_steps = (uint64_t)h->steps;
  size_t s_len = h->msg_len;
  h->samples = (uint64_t)s->have_all;
  h->steps = 0;
  nb__hy_write_header(h, NB__HY_FLAG_FT | NB__HY_FLAG_VOTE, 0, h->hash);
  uint8_t vote[NB_HYBRID_MSG_HEADER_BYTES];
  memcpy(vote, h->msg, sizeof vote);
  memcpy(h->msg, saved, sizeof saved);
  h->msg_len = s_len;
  h->samples = s_samples;
  h->steps = (long)s_steps;
  nb_status_t st = h->cfg.ft_exchange(h->cfg.exchange_ctx, 2 * a + 3, vote, sizeof vote, votes, np,
                                      &s->sent2, &ahead2, &alive2);
  if (st != NB_OK) {
    nb__hy_release(votes, np);
    return nb_error_wrap(st, "hybrid: vote exchange");
  }
  uint32_t yes = nb__hy_count_votes(h, votes, np, a, k, hash, &s->newest_commits);
  nb__hy_release(votes, np);
  s->commit = s->have_all && yes == np;
  if (ahead2 > s->ahead) s->ahead = ahead2;
  s->alive = alive2;
  return NB_OK;
}

/* Frees the peers' updates in all[] (ours, h->msg, is not theirs to free). */
static void nb__hy_free_peers(const nb_hybrid_t* h, nb_hybrid_msg_t* all) {
  for (uint32_t c = 0; c < h->cfg.n_clusters; c++)
    if (c != h->cfg.cluster_index) nb_free(all[c].data);
}

/* Round a applied (every cluster has every message and said so), held (every update is here but
 * not every vote: a cluster may have applied it; it keeps the residual this round's encode left
 * if it lands late) or skipped: then the residual goes back to before this round's encode (the
 * next Delta carries all of it) and theta_local trains on. */
static nb_status_t nb__hy_ft_settle(nb_hybrid_t* h, const nb_hybrid_msg_t* all, uint64_t a,
                                    uint64_t k, uint64_t hash, const nb__hy_ft_seen_t* s,
                                    nb_hybrid_round_t* applied) {
  nb_status_t st = NB_OK;
  if (s->commit) {
    st = nb__hy_apply(h, all, h->cfg.n_clusters, a, hash, applied);
    h->ft_samples = 0;
    if (h->pend) nb__hy_drop_pending(h);
  } else {
    if (s->have_all) st = nb__hy_hold(h, all, a, k, hash, h->ft_samples);
    memcpy(h->residual, h->res_pre, h->n * sizeof(float));
  }
  return st;
}

/* The fault-tolerant outcome of a round into its record: applied or not, caught up, in need of
 * the state, the commits so far, the peers that answered and those alive. */
static void nb__hy_outcome(nb_hybrid_round_t* r, const nb_hybrid_t* h, int applied, int caught_up,
                           int need_state, uint32_t ok, uint32_t alive) {
  r->applied = applied;
  r->caught_up = caught_up;
  r->need_state = need_state;
  r->commits = h->commits;
  r->peers_ok = ok;
  r->peers_alive = alive;
}

static void nb__hy_ft_record(const nb_hybrid_t* h, uint64_t a, const nb__hy_ft_seen_t* s,
                             const nb_hybrid_round_t* applied, nb_hybrid_round_t* rec) {
  memset(rec, 0, sizeof *rec);
  rec->round = a;
  rec->steps = h->steps;
  rec->samples = h->samples;
  rec->samples_all = s->commit ? applied->samples_all : 0;
  rec->loss = h->loss;
  rec->msg_bytes = h->msg_len;
  rec->bytes_sent = s->sent + s->sent2;
  rec->density = h->cfg.density;
  rec->compute_s = h->compute_s;
  rec->codec_s = h->codec_s + applied->codec_s;
  rec->exchange_s = s->xs;
  rec->global_hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  rec->landed = 1;
  nb__hy_outcome(rec, h, s->commit, s->caught_up, s->need_state, s->ok, s->alive);
}

/* One fault-tolerant round (docs/hybrid.md, Faults): update exchange, vote exchange, then the
 * round is applied (every cluster has every message and said so), held (we have every message
 * but not every vote: a cluster may have applied it; the next exchange tells), or skipped. */
static nb_status_t nb__hy_round_ft(nb_hybrid_t* h, nb_hybrid_round_t* rec) {
  uint32_t np = h->cfg.n_clusters - 1, me = h->cfg.cluster_index;
  NB_CHECK(nb__hy_ft_prepare(h));
  uint64_t a = h->round, k = h->commits, hash = h->hash;
  nb_hybrid_msg_t all[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  nb__hy_ft_seen_t s = {.newest_commits = k, .have_all = 1};
  double t0 = nb_now_s();
  nb_status_t st = NB_OK;
  all[me].data = h->msg;
  all[me].len = h->msg_len;
  NB_CHECK(nb__hy_ft_updates(h, a, k, hash, all, &s));
  if (s.have_all && h->pend) nb__hy_drop_pending(h); /* everyone is at k: nobody applied it */
  if (np > 0) {
    st = nb__hy_ft_vote(h, a, k, hash, &s);
    if (st != NB_OK) {
      nb__hy_free_peers(h, all);
      return st;
    }
  } else {
    s.commit = 1;
  }
  s.xs = nb_now_s() - t0;
  nb_hybrid_round_t applied;
  memset(&applied, 0, sizeof applied);
  st = nb__hy_ft_settle(h, all, a, k, hash, &s, &applied);
  nb__hy_free_peers(h, all);
  NB_CHECK(st);
  NB_CHECK(nb__hy_ft_catch_up(h, s.commit, s.newest_commits, a, k, &s.caught_up, &s.need_state));
  if (rec) nb__hy_ft_record(h, a, &s, &applied, rec);
  uint64_t next = a + 1;
  if (s.ahead >= 2) {
    uint64_t b = (s.ahead - 2) / 2; /* the round of the newest exchange id seen */
    if (b > next) next = b;
  }
  if (next > a + 1)
    NB_WARN("hybrid: a peer is already at round %llu: round %llu goes next",
            (unsigned long long)next, (unsigned long long)next);
  h->round = next;
  if (rec) rec->next_round = next;
  return NB_OK;
}

/* ---------------------------------------- fault-tolerant rounds with overlap */

/* The exchange thread of a fault-tolerant round with overlap: the update exchange and the vote
 * of round inflight_round (as in nb__hy_round_ft), recording the outcome for the landing. Reads
 * only the message in flight and the constant config; writes only fly_* fields. */
static void* nb__hy_fly_ft_main(void* arg) {
  nb_hybrid_t* h = arg;
  uint32_t nc = h->cfg.n_clusters, np = nc - 1, me = h->cfg.cluster_index;
  uint64_t a = h->inflight_round, k = h->fly_k, hash = h->inflight_hash;
  nb_hybrid_msg_t got[NB_HYBRID_MAX_CLUSTERS] = {{0}}, votes[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  uint64_t ahead = 0, ahead2 = 0, sent2 = 0;
  uint32_t alive2 = 0, yes = 0;
  h->fly_sent = 0;
  h->fly_ok = h->fly_alive = 0;
  h->fly_have_all = 1;
  h->fly_commit = 0;
  h->fly_newest = k;
  h->fly_ahead = 0;
  h->fly_status = NB_OK;
  double t0 = nb_now_s();
  nb_status_t st = NB_OK;
  if (np == 0) {
    h->fly_commit = 1;
    goto out;
  }
  st = h->cfg.ft_exchange(h->cfg.exchange_ctx, 2 * a + 2, h->fly, h->fly_len, got, np, &h->fly_sent,
                          &ahead, &h->fly_alive);
  if (st != NB_OK) {
    nb__hy_release(got, np);
    st = nb_error_wrap(st, "hybrid: exchange");
    goto out;
  }
  st = nb__hy_ft_take_updates(h, got, np, a, k, hash, h->fly_all, &h->fly_have_all, &h->fly_ok,
                              &h->fly_newest);
  if (st != NB_OK) goto out;
  double t1 = nb_now_s();
  /* the vote: 1 when every update arrived; sent even when not, so nobody waits for it */
  uint8_t vote[NB_HYBRID_MSG_HEADER_BYTES];
  nb__hy_header_to(vote, me, NB__HY_FLAG_FT | NB__HY_FLAG_VOTE, a, (uint64_t)h->fly_have_all, 0,
                   hash, 0, k);
  st = h->cfg.ft_exchange(h->cfg.exchange_ctx, 2 * a + 3, vote, sizeof vote, votes, np, &sent2,
                          &ahead2, &alive2);
  if (st != NB_OK) {
    nb__hy_release(votes, np);
    st = nb_error_wrap(st, "hybrid: vote exchange");
    goto out;
  }
  yes = nb__hy_count_votes(h, votes, np, a, k, hash, &h->fly_newest);
  nb__hy_release(votes, np);
  NB_INFO(TRAIN, "round %llu: update exchange %.3f s, vote %.3f s", (unsigned long long)a, t1 - t0,
          nb_now_s() - t1);
  h->fly_commit = h->fly_have_all && yes == np;
  h->fly_sent += sent2;
  h->fly_ahead = ahead2 > ahead ? ahead2 : ahead;
  h->fly_alive = alive2;
out:
  h->fly_secs = nb_now_s() - t0;
  if (st != NB_OK) {
    h->fly_status = st;
    snprintf(h->fly_error, sizeof h->fly_error, "%s", nb_error_last());
    nb__hy_release(h->fly_all, NB_HYBRID_MAX_CLUSTERS);
  }
  __atomic_store_n(&h->fly_done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Decides the update in flight (see NB__HY_LAND_*): waits for its exchange, then applies it
 * (every cluster has every update and voted yes), holds it (every update but not every vote: a
 * peer may have applied it) or skips it. Applied: as nb__hy_land_mid (the progress made since
 * the round's start stays on top). Skipped: theta_global stays, theta_local too (so the next
 * Delta, measured from theta_global, carries that round's progress as well), the residual goes
 * back to before that round's encode unless its frame carried it (then theta_local carries it).
 * A lost vote lands the held round late, a peer further ahead sets need_state, a peer at a later
 * round moves this one there. The outcome goes to h->mid_rec. */
static nb_status_t nb__hy_land_ft(nb_hybrid_t* h, int how) {
  uint32_t nc = h->cfg.n_clusters, me = h->cfg.cluster_index;
  nb_hybrid_round_t* o = &h->mid_rec;
  double t0 = nb_now_s();
  pthread_join(h->thread, NULL);
  h->inflight = 0;
  h->mid_waited = nb_now_s() - t0;
  h->mid_sent = h->fly_sent;
  h->mid_landed = 1;
  memset(o, 0, sizeof *o);
  uint64_t a = h->inflight_round, k = h->fly_k, hash = h->inflight_hash;
  if (h->fly_status != NB_OK) {
    nb__hy_release(h->fly_all, NB_HYBRID_MAX_CLUSTERS);
    return nb_error(h->fly_status, "hybrid: exchange of round %llu: %s", (unsigned long long)a,
                    h->fly_error);
  }
  NB_CHECK(nb__hy_ft_buffers(h));
  size_t n;
  float* local = nb__hy_params(h, &n);
  nb_hybrid_msg_t all[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  for (uint32_t c = 0; c < nc; c++) all[c] = h->fly_all[c];
  all[me].data = h->fly;
  all[me].len = h->fly_len;
  if (h->fly_have_all && h->pend) nb__hy_drop_pending(h); /* everyone is at k: nobody applied it */
  int commit = h->fly_commit, caught_up = 0, need_state = 0;
  nb_status_t st = NB_OK;
  if (commit) {
    for (size_t i = 0; i < n; i++) h->own[i] = local[i] - h->global[i] + h->own[i];
    st = nb__hy_apply(h, all, nc, a, hash, o);
    if (st == NB_OK) {
      if (how != NB__HY_LAND_DRAIN) { /* a drain has no progress since: theta_local = global */
        local = nb__hy_params(h, &n);
        for (size_t i = 0; i < n; i++) local[i] = h->global[i] + h->own[i];
      }
      h->ft_samples = 0;
      if (h->pend) nb__hy_drop_pending(h);
    }
  } else {
    if (h->fly_have_all) {
      st = nb__hy_hold(h, all, a, k, hash, h->fly_samples);
    }
    if (!h->fly_folded) memcpy(h->residual, h->res_pre, h->n * sizeof(float));
    /* eager: the prediction did not happen; back to theta_global - own Delta + progress (and
     * the held round's late landing measures the progress from the shifted send as well) */
    if (h->eshift_valid) {
      for (size_t i = 0; i < n; i++) local[i] += h->eshift[i];
      if (h->pend)
        for (size_t i = 0; i < n; i++) h->pend_local[i] += h->eshift[i];
    }
  }
  nb__hy_release(h->fly_all, NB_HYBRID_MAX_CLUSTERS);
  h->own_valid = 0;
  h->eshift_valid = 0;
  NB_CHECK(st);
  NB_CHECK(nb__hy_ft_catch_up(h, commit, h->fly_newest, a, k, &caught_up, &need_state));
  if (h->fly_ahead >= 2) {
    uint64_t b = (h->fly_ahead - 2) / 2; /* the round of the newest exchange id seen */
    if (b > h->round) {
      NB_WARN("hybrid: a peer is already at round %llu: round %llu goes next",
              (unsigned long long)b, (unsigned long long)b);
      h->round = b;
    }
  }
  if (!commit) o->round = a;
  nb__hy_outcome(o, h, commit, caught_up, need_state, h->fly_ok, h->fly_alive);
  o->bytes_sent = h->fly_sent;
  o->exchange_s = h->fly_secs;
  o->global_hash = h->hash;
  return NB_OK;
}

/* A fault-tolerant round with overlap: the inner steps, during which the previous round's update
 * is decided (after overlap_steps, or at the end), then this round's message (the rounds applied
 * and theta_global's hash as they are after that decision; samples since the last applied
 * round), and its update exchange and vote start on the background thread. rec reports the
 * decision taken in this round (applied, caught_up, need_state, peers_*). */
static nb_status_t nb__hy_round_ft_overlap(nb_hybrid_t* h, nb_hybrid_round_t* rec) {
  NB_CHECK(nb__hy_ft_buffers(h));
  if (!h->own) NB_CHECK(nb_alloc((void**)&h->own, h->n, sizeof(float), "own delta"));
  uint64_t started = h->round;
  int landing = h->inflight;
  const uint8_t* msg;
  size_t len;
  NB_CHECK(nb_hybrid_prepare(h, &msg, &len));
  nb_hybrid_round_t landed;
  memset(&landed, 0, sizeof landed);
  if (landing) landed = h->mid_rec;
  uint64_t round_samples = h->samples;
  h->ft_samples += round_samples;
  h->samples = h->ft_samples; /* our Delta covers every round since the last applied one */
  nb__hy_write_header(h, NB__HY_FLAG_FT, h->msg_len - NB_HYBRID_MSG_HEADER_BYTES, h->hash);
  h->samples = round_samples;
  len = h->msg_len;
  if (landed.need_state) {
    /* a peer applied rounds we cannot replay: the caller pulls its state; this round's message
     * is not sent (its exchange ids are used up, the peers give up on it when we move on) */
    memcpy(h->residual, h->res_pre, h->n * sizeof(float));
  } else {
    /* as without faults: the next round continues from theta_global minus this round's own
     * progress, which lands (or is carried by the next Delta) one round later */
    memcpy(h->own, h->delta, h->n * sizeof(float));
    h->own_valid = 1;
    size_t n;
    float* local = nb__hy_params(h, &n);
    if (h->cfg.eager && h->cfg.density < 1)
      NB_CHECK(nb__hy_eager_start(h, local));
    else
      for (size_t i = 0; i < n; i++) local[i] = h->global[i] - h->own[i];
    memcpy(h->lsend, local, n * sizeof(float));
    if (len > h->fly_cap) {
      NB_CHECK(nb_realloc((void**)&h->fly, len, 1, "hybrid message in flight"));
      h->fly_cap = len;
    }
    memcpy(h->fly, h->msg, len);
    h->fly_len = len;
    h->inflight_round = h->round;
    h->inflight_hash = h->hash;
    h->fly_k = h->commits;
    h->fly_samples = h->ft_samples;
    h->fly_folded = h->cfg.error_feedback && h->cfg.density >= 1;
    h->fly_done = 0;
    if (pthread_create(&h->thread, NULL, nb__hy_fly_ft_main, h) != 0)
      return nb_error(NB_ERR_SYSTEM, "hybrid: cannot start the exchange thread");
    h->inflight = 1;
  }
  if (rec) {
    memset(rec, 0, sizeof *rec);
    rec->round = started;
    rec->steps = h->steps;
    rec->samples = h->samples;
    rec->samples_all = landed.applied ? landed.samples_all : 0;
    rec->loss = h->loss;
    rec->msg_bytes = h->msg_len;
    rec->bytes_sent = landed.bytes_sent;
    rec->density = h->cfg.density;
    rec->compute_s = h->compute_s;
    rec->codec_s = h->codec_s + landed.codec_s;
    rec->exchange_s = landing ? h->mid_waited : 0;
    rec->global_hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
    rec->landed = landing;
    rec->landed_step = h->mid_landed ? h->mid_tau : -1;
    rec->exchange_took_s = landing ? landed.exchange_s : 0;
    nb__hy_outcome(rec, h, landed.applied, landed.caught_up, landed.need_state, landed.peers_ok,
                   landed.peers_alive);
  }
  h->round++;
  if (rec) rec->next_round = h->round;
  return NB_OK;
}

nb_status_t nb_hybrid_ft_begin(nb_hybrid_t* h) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (!h->cfg.ft_exchange || h->cfg.overlap || h->local.steps)
    return nb_error(NB_ERR_INVALID,
                    "hybrid: ft_begin is for fault-tolerant rounds of a local model without "
                    "steps or overlap");
  if (h->inflight)
    return nb_error(NB_ERR_INVALID, "hybrid: ft_begin while round %llu is in flight",
                    (unsigned long long)h->inflight_round);
  if (!h->own) NB_CHECK(nb_alloc((void**)&h->own, h->n, sizeof(float), "own delta"));
  NB_CHECK(nb__hy_ft_prepare(h));
  if (h->msg_len > h->fly_cap) {
    NB_CHECK(nb_realloc((void**)&h->fly, h->msg_len, 1, "hybrid message in flight"));
    h->fly_cap = h->msg_len;
  }
  memcpy(h->fly, h->msg, h->msg_len);
  h->fly_len = h->msg_len;
  h->inflight_round = h->round;
  h->inflight_hash = h->hash;
  h->fly_k = h->commits;
  h->fly_samples = h->ft_samples;
  h->fly_folded = 0; /* a skipped round's residual goes back to before its encode */
  h->own_valid = 0;  /* theta_local is the caller's: nothing kept on top of theta_global */
  h->eshift_valid = 0;
  h->fly_done = 0;
  if (pthread_create(&h->thread, NULL, nb__hy_fly_ft_main, h) != 0)
    return nb_error(NB_ERR_SYSTEM, "hybrid: cannot start the exchange thread");
  h->inflight = 1;
  h->round++;
  return NB_OK;
}

nb_status_t nb_hybrid_ft_end(nb_hybrid_t* h, nb_hybrid_round_t* rec) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (!h->inflight || h->cfg.overlap)
    return nb_error(NB_ERR_INVALID, "hybrid: ft_end without ft_begin");
  /* as a drain: the caller's progress since begin is its own to add */
  NB_CHECK(nb__hy_land_ft(h, NB__HY_LAND_DRAIN));
  if (!rec) return NB_OK;
  *rec = h->mid_rec;
  rec->round = h->inflight_round;
  rec->steps = h->steps;
  rec->samples = h->samples;
  rec->msg_bytes = h->fly_len;
  rec->density = h->cfg.density;
  rec->exchange_s = h->fly_secs;
  rec->landed = 1;
  rec->global_hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  rec->next_round = h->round;
  return NB_OK;
}

nb_status_t nb_hybrid_drain(nb_hybrid_t* h, nb_hybrid_round_t* rec) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (rec) memset(rec, 0, sizeof *rec);
  if (!h->inflight) return NB_OK;
  nb_hybrid_round_t o;
  memset(&o, 0, sizeof o);
  if (h->cfg.ft_exchange) {
    NB_CHECK(nb__hy_land_ft(h, NB__HY_LAND_DRAIN));
    o = h->mid_rec;
    o.round = h->inflight_round;
    o.exchange_s = h->mid_waited;
  } else {
    double waited = 0;
    NB_CHECK(nb__hy_land(h, &o, &waited)); /* theta_local = theta_global: no step since */
    o.exchange_s = waited;
    o.bytes_sent = h->fly_sent;
    o.applied = 1;
    o.commits = h->commits;
    h->own_valid = 0;
  }
  if (rec) {
    *rec = o;
    rec->landed = 1;
    rec->global_hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
    rec->next_round = h->round;
  }
  return NB_OK;
}

nb_status_t nb_hybrid_round(nb_hybrid_t* h, nb_hybrid_round_t* rec) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (h->cfg.ft_exchange)
    return h->cfg.overlap ? nb__hy_round_ft_overlap(h, rec) : nb__hy_round_ft(h, rec);
  if (h->cfg.mode != NB_HYBRID_OUTER) return nb__hy_round_steps(h, rec);
  if (h->cfg.overlap) return nb__hy_round_overlap(h, rec);
  const uint8_t* msg;
  size_t len;
  NB_CHECK(nb_hybrid_prepare(h, &msg, &len));
  nb_hybrid_msg_t all[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  uint64_t sent = 0;
  double secs = 0;
  NB_CHECK(nb__hy_exchange(h, all, &sent, &secs));
  nb_status_t st = nb_hybrid_apply(h, all, h->cfg.n_clusters, rec);
  nb__hy_release(all + 1, h->cfg.n_clusters - 1);
  if (st == NB_OK && rec) {
    rec->bytes_sent = sent;
    rec->exchange_s = secs;
  }
  return st;
}

/* The final check of fault-tolerant rounds: hash-only messages carrying the rounds applied; a
 * held round that a peer applied lands first; a peer one applied round behind us holds that
 * round and lands it on its side. A peer that does not answer (link still down, heartbeat not
 * yet back, frames lost) is asked again, with exchange ids 2·rounds + 2, + 4, ... (each attempt
 * a fresh id, so nothing is replayed), until cfg.final_wait_s has passed: an attempt that finds
 * the peer already at a later id follows it there, and one that finds it unreachable waits a
 * moment first, so that both sides meet on one id soon after the link is back. Peers that
 * answered once are not waited on again (they may have finished and gone). */
static nb_status_t nb__hy_finish_ft(nb_hybrid_t* h) {
  uint32_t nc = h->cfg.n_clusters, np = nc - 1;
  NB_CHECK(nb__hy_ft_buffers(h));
  if (h->inflight) { /* overlap: the last round's update is decided first */
    NB_CHECK(nb__hy_land_ft(h, NB__HY_LAND_DRAIN));
    if (h->mid_rec.need_state)
      return nb_error(NB_ERR_UNAVAILABLE,
                      "hybrid: final check: the other clusters applied rounds that this one "
                      "cannot replay (%llu applied here)",
                      (unsigned long long)h->commits);
  }
  h->samples = 0;
  h->steps = 0;
  nb__hy_hdr_t hd[NB_HYBRID_MAX_CLUSTERS];
  int have[NB_HYBRID_MAX_CLUSTERS] = {0};
  uint32_t missing = np, attempts = 0;
  uint64_t xid = 2 * h->round + 2;
  double until = nb_now_s() + (h->cfg.final_wait_s > 0 ? h->cfg.final_wait_s : 0);
  nb_status_t st = NB_OK;
  while (missing > 0 && st == NB_OK) {
    h->hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
    nb__hy_write_header(h, NB__HY_FLAG_HASH_ONLY | NB__HY_FLAG_FT, 0, h->hash);
    nb_hybrid_msg_t got[NB_HYBRID_MAX_CLUSTERS] = {{0}};
    uint64_t sent = 0, ahead = 0;
    uint32_t alive = 0;
    attempts++;
    st = h->cfg.ft_exchange(h->cfg.exchange_ctx, xid, h->msg, h->msg_len, got, np, &sent, &ahead,
                            &alive);
    for (uint32_t i = 0; i < np && st == NB_OK; i++) {
      nb__hy_hdr_t x;
      if (have[i] || !got[i].data || nb__hy_parse(&got[i], &x) != NB_OK ||
          x.flags != (NB__HY_FLAG_HASH_ONLY | NB__HY_FLAG_FT) || x.sender >= nc)
        continue;
      hd[i] = x;
      have[i] = 1;
      missing--;
      if (x.commits == h->commits + 1 && h->pend && h->pend_commits == h->commits)
        st = nb__hy_land_pending(h);
    }
    nb__hy_release(got, np);
    if (st != NB_OK || missing == 0 || nb_now_s() >= until) break;
    /* ask again on a fresh id: the peer's own if it is already further, else the next one;
     * a peer that cannot be reached at all is given a moment before that */
    uint64_t next = xid + 2;
    if (ahead > xid && ahead % 2 == 0 && ahead > next) next = ahead;
    if (alive < missing && ahead <= xid) nb_sleep_ns(200 * 1000000LL);
    if (attempts == 1)
      NB_WARN("hybrid: final check: %u of %u peers not heard yet; asking again for up to %.1f s",
              missing, np, until - nb_now_s());
    NB_INFO(TRAIN, "hybrid: final check: attempt %u: asking again on exchange id %llu",
            attempts + 1, (unsigned long long)next);
    xid = next;
  }
  NB_CHECK(nb_error_wrap(st, "hybrid: final check"));
  uint64_t hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  h->hash = hash;
  for (uint32_t i = 0; i < np; i++) {
    if (!have[i]) continue;
    if (hd[i].commits == h->commits && hd[i].hash != hash)
      return nb_error(NB_ERR_INTEGRITY,
                      "hybrid: final check: theta_global of cluster %u (xxh3 %016llx) differs "
                      "from ours (%016llx) after %llu applied rounds: the replicas diverged",
                      hd[i].sender, (unsigned long long)hd[i].hash, (unsigned long long)hash,
                      (unsigned long long)h->commits);
    if (hd[i].commits + 1 < h->commits || hd[i].commits > h->commits)
      return nb_error(
          NB_ERR_INTEGRITY, "hybrid: final check: cluster %u applied %llu rounds, we applied %llu",
          hd[i].sender, (unsigned long long)hd[i].commits, (unsigned long long)h->commits);
  }
  h->final_attempts = attempts;
  /* the trainer holds theta_global (progress of rounds skipped at the very end is dropped) */
  NB_CHECK(nb__hy_set_params(h, h->global, h->n));
  if (missing)
    return nb_error(NB_ERR_UNAVAILABLE,
                    "hybrid: final check: %u of %u peers did not answer in %u attempts over "
                    "%.1f s (final wait)",
                    missing, np, attempts, h->cfg.final_wait_s);
  return NB_OK;
}

nb_status_t nb_hybrid_finish(nb_hybrid_t* h) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (h->cfg.ft_exchange) return nb__hy_finish_ft(h);
  if (h->inflight) {
    double waited;
    NB_CHECK(nb__hy_land(h, NULL, &waited));
  }
  h->samples = 0;
  h->steps = 0;
  h->hash = nb_xxh3_64(h->global, h->n * sizeof(float), 0);
  uint64_t saved_round = h->round;
  if (h->cfg.mode != NB_HYBRID_OUTER) h->round = h->xseq; /* after the last step's exchange */
  nb__hy_write_header(h, NB__HY_FLAG_HASH_ONLY, 0, h->hash);
  nb_hybrid_msg_t all[NB_HYBRID_MAX_CLUSTERS] = {{0}};
  uint64_t sent = 0;
  double secs = 0;
  NB_CHECK(nb__hy_exchange(h, all, &sent, &secs));
  nb__hy_hdr_t byc[NB_HYBRID_MAX_CLUSTERS];
  nb_status_t st =
      nb__hy_collect(h, all, h->cfg.n_clusters, NB__HY_FLAG_HASH_ONLY, h->round, h->hash, byc);
  nb__hy_release(all + 1, h->cfg.n_clusters - 1);
  h->round = saved_round;
  return st;
}

nb_status_t nb_hybrid_set_density(nb_hybrid_t* h, double density) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (!(density > 0 && density <= 1))
    return nb_error(NB_ERR_CONFIG, "hybrid: density %g outside (0, 1]", density);
  h->cfg.density = density;
  return NB_OK;
}

/* The checks of a step count set between rounds: a round to set it on, at least `min` steps. */
static nb_status_t nb__hy_steps_ok(const nb_hybrid_t* h, const char* name, long steps, long min) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (steps < min) return nb_error(NB_ERR_CONFIG, "hybrid: %s %ld < %ld", name, steps, min);
  return NB_OK;
}

nb_status_t nb_hybrid_set_inner_steps(nb_hybrid_t* h, long steps) {
  NB_CHECK(nb__hy_steps_ok(h, "inner_steps", steps, 1));
  h->cfg.inner_steps = steps;
  return NB_OK;
}

nb_status_t nb_hybrid_set_codec(nb_hybrid_t* h, nb_values_t values, uint32_t topk_chunk) {
  if (!h) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  const nb_codec_config_t* cur = nb_codec_config(h->codec);
  uint32_t chunk = topk_chunk; /* 0: global top-k, whatever the previous point used */
  if (cur->values == values && cur->topk_chunk == chunk) return NB_OK;
  if (h->cfg.mode == NB_HYBRID_DENSE)
    return nb_error(NB_ERR_CONFIG, "hybrid: dense mode sends fp32 gradients; no codec to set");
  nb_codec_config_t cc = *cur;
  cc.values = values;
  cc.topk_chunk = chunk;
  nb_codec_t* c = NULL;
  nb_status_t st = nb_codec_create(&cc, &c);
  if (st != NB_OK) return nb_error(NB_ERR_CONFIG, "hybrid: codec: %s", nb_error_last());
  nb_codec_destroy(h->codec);
  h->codec = c;
  h->cfg.values = values;
  h->cfg.topk_chunk = chunk;
  return NB_OK;
}

nb_status_t nb_hybrid_set_overlap_steps(nb_hybrid_t* h, long steps) {
  NB_CHECK(nb__hy_steps_ok(h, "overlap_steps", steps, 0));
  h->cfg.overlap_steps = steps;
  return NB_OK;
}

float* nb_hybrid_global(nb_hybrid_t* h, size_t* n) {
  if (n) *n = h->n;
  return h->global;
}

uint64_t nb_hybrid_global_hash(const nb_hybrid_t* h) {
  return nb_xxh3_64(h->global, h->n * sizeof(float), 0);
}

int nb_hybrid_exchange_done(const nb_hybrid_t* h) {
  return !h || !h->inflight || __atomic_load_n(&h->fly_done, __ATOMIC_ACQUIRE);
}

uint64_t nb_hybrid_rounds(const nb_hybrid_t* h) {
  return h->round;
}

#define NB__HY_STATE_MAGIC 0x5348424eu /* bytes 'N' 'B' 'H' 'S' */
#define NB__HY_STATE_HEADER 64

/* After the rename: the folder's entry, so that a crash after we returned keeps the new file
 * (not only its bytes). Best effort: the file is complete either way, only its durability is at
 * stake, and some filesystems refuse fsync on a folder. */
static void nb__hy_sync_dir(const char* path) {
  char dir[4096];
  const char* slash = strrchr(path, '/');
  size_t len = slash ? (size_t)(slash - path) : 1;
  if (len >= sizeof dir) return;
  if (slash && len == 0) len = 1; /* "/state.bin" */
  memcpy(dir, slash ? path : ".", len);
  dir[len] = '\0';
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

nb_status_t nb_hybrid_save(const nb_hybrid_t* h, const char* path) {
  return nb_hybrid_save_ext(h, path, NULL, 0);
}

nb_status_t nb_hybrid_save_ext(const nb_hybrid_t* h, const char* path, const void* ext,
                               size_t ext_len) {
  if (!h || !path || (ext_len && !ext)) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (h->inflight)
    return nb_error(NB_ERR_INVALID, "hybrid: cannot save with an exchange in flight");
  uint8_t hdr[NB__HY_STATE_HEADER] = {0};
  nb__put32(hdr + 0, NB__HY_STATE_MAGIC);
  nb__put32(hdr + 4, 1);
  nb__put64(hdr + 8, h->n);
  nb__put64(hdr + 16, h->round);
  nb__put64(hdr + 24, h->xseq);
  nb__put64(hdr + 32, nb_xxh3_64(h->global, h->n * sizeof(float), 0));
  nb__put32(hdr + 40, (uint32_t)h->cfg.mode);
  nb__put64(hdr + 48, h->commits);
  nb__put64(hdr + 56, ext_len); /* 0 in files from before the extension: the same layout */
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return nb_error(NB_ERR_INVALID, "hybrid: path too long: %s", path);
  nb_xxh3_state_t* xs = nb_xxh3_create(0);
  if (!xs) return nb_error(NB_ERR_NOMEM, "hybrid: checksum state");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    nb_xxh3_destroy(xs);
    return nb_error(NB_ERR_IO, "hybrid: cannot write %s: %s", tmp, strerror(errno));
  }
  const void* parts[5] = {hdr, h->global, h->momentum, h->residual, ext};
  size_t lens[5] = {sizeof hdr, h->n * sizeof(float), h->n * sizeof(float), h->n * sizeof(float),
                    ext_len};
  int ok = 1;
  for (int i = 0; i < 5 && ok; i++) {
    if (lens[i] == 0) continue;
    nb_xxh3_update(xs, parts[i], lens[i]);
    const uint8_t* p = parts[i];
    size_t left = lens[i];
    while (left > 0 && ok) {
      ssize_t w = write(fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        ok = 0;
      else
        p += w, left -= (size_t)w;
    }
  }
  uint8_t sum[8];
  nb__put64(sum, nb_xxh3_digest(xs));
  nb_xxh3_destroy(xs);
  if (ok) ok = write(fd, sum, 8) == 8;
  if (ok) ok = fsync(fd) == 0;
  if (close(fd) != 0) ok = 0;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return nb_error(NB_ERR_IO, "hybrid: cannot write %s: %s", path, strerror(e));
  }
  nb__hy_sync_dir(path);
  return NB_OK;
}

/* The whole of a state file (its size bounds the buffer). */
static nb_status_t nb__hy_read_file(const char* path, uint8_t** out, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f)
    return nb_error(errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "hybrid: cannot open %s: %s",
                    path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return nb_error(NB_ERR_IO, "hybrid: %s is not a readable regular file", path);
  }
  size_t cap = (size_t)sb.st_size;
  uint8_t* buf = NULL;
  nb_status_t st = nb_alloc((void**)&buf, cap + 1, 1, "hybrid state");
  if (st == NB_OK) {
    *len = fread(buf, 1, cap + 1, f);
    if (ferror(f)) st = nb_error(NB_ERR_IO, "hybrid: cannot read %s", path);
  }
  fclose(f);
  if (st != NB_OK) nb_free(buf);
  *out = st == NB_OK ? buf : NULL;
  return st;
}

nb_status_t nb_hybrid_load(nb_hybrid_t* h, const char* path) {
  return nb_hybrid_load_ext(h, path, NULL, NULL);
}

nb_status_t nb_hybrid_load_ext(nb_hybrid_t* h, const char* path,
                               nb_status_t (*check)(void* ctx, const uint8_t* ext, size_t len),
                               void* ctx) {
  if (!h || !path) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  size_t got = 0;
  uint8_t* buf = NULL;
  NB_CHECK(nb__hy_read_file(path, &buf, &got));
  nb_status_t st = NB_OK;
  /* the size first (a truncated file says so), then the checksum over all of it (a flipped bit
   * anywhere), and only then what the bytes mean: the extension's check (which names what
   * differs, so the file's own n is used until then), then our fields */
  int ours =
      got >= NB__HY_STATE_HEADER && nb__get32(buf) == NB__HY_STATE_MAGIC && nb__get32(buf + 4) == 1;
  uint64_t fn = ours ? nb__get64(buf + 8) : 0, ext_len = ours ? nb__get64(buf + 56) : 0;
  if (!ours || fn > got / 12 || ext_len > NB_HYBRID_STATE_EXT_MAX ||
      got != NB__HY_STATE_HEADER + 12 * fn + ext_len + 8) {
    st = nb_error(NB_ERR_INVALID, "hybrid: %s is not a round state (%zu bytes%s)", path, got,
                  ours ? ": truncated or extended" : "");
    goto out;
  }
  if (nb_xxh3_64(buf, got - 8, 0) != nb__get64(buf + got - 8)) {
    st = nb_error(NB_ERR_INTEGRITY, "hybrid: %s: checksum mismatch", path);
    goto out;
  }
  size_t nb = (size_t)fn * sizeof(float), body = NB__HY_STATE_HEADER + 3 * nb;
  const uint8_t* p = buf + NB__HY_STATE_HEADER;
  if (nb_xxh3_64(p, nb, 0) != nb__get64(buf + 32)) {
    st = nb_error(NB_ERR_INTEGRITY, "hybrid: %s: theta_global hash mismatch", path);
    goto out;
  }
  /* a forged or damaged file whose checksums hold can still carry a NaN or an infinity, which
   * would poison every round after it: refused before anything changes */
  static const char* const what[3] = {"theta_global", "the outer momentum", "the residual"};
  for (int a = 0; a < 3; a++) {
    size_t bad = nb__hy_first_nonfinite((const float*)(p + (size_t)a * nb), (size_t)fn);
    if (bad < fn) {
      st = nb_error(NB_ERR_INVALID, "hybrid: %s: %s holds a non-finite value (element %zu)", path,
                    what[a], bad);
      goto out;
    }
  }
  if (check) {
    st = check(ctx, buf + body, (size_t)ext_len);
    if (st != NB_OK) goto out;
  }
  if (fn != h->n) {
    st = nb_error(NB_ERR_INVALID, "hybrid: %s is a round state of %llu synced parameters, not %zu",
                  path, (unsigned long long)fn, h->n);
    goto out;
  }
  st = nb__hy_set_params(h, (const float*)p, h->n);
  if (st != NB_OK) goto out;
  memcpy(h->global, p, nb);
  memcpy(h->momentum, p + nb, nb);
  memcpy(h->residual, p + 2 * nb, nb);
  h->round = nb__get64(buf + 16);
  h->xseq = nb__get64(buf + 24);
  h->commits = nb__get64(buf + 48);
  h->hash = nb_xxh3_64(h->global, nb, 0);
  h->n_norms = 0; /* every cluster loads at once: the history restarts everywhere */
  h->norm_at = 0;
out:
  nb_free(buf);
  return st;
}

uint32_t nb_hybrid_final_attempts(const nb_hybrid_t* h) {
  return h ? h->final_attempts : 0;
}

uint64_t nb_hybrid_commits(const nb_hybrid_t* h) {
  return h->commits;
}

#define NB__HY_EXPORT_MAGIC 0x5848424eu /* bytes 'N' 'B' 'H' 'X' */

nb_status_t nb_hybrid_export(const nb_hybrid_t* h, uint8_t** out, size_t* len) {
  if (!h || !out || !len) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  /* with overlap a fault-tolerant round's exchange may be in flight: it reads none of this, and
   * the cluster that pulls this state was not in that round, so it cannot be applied anywhere */
  if (h->inflight && !h->cfg.ft_exchange)
    return nb_error(NB_ERR_INVALID, "hybrid: cannot export with an exchange in flight");
  size_t nb = h->n * sizeof(float), total = NB__HY_STATE_HEADER + 2 * nb + 8;
  uint8_t* b = NULL;
  NB_CHECK(nb_alloc((void**)&b, total, 1, "hybrid export"));
  memset(b, 0, NB__HY_STATE_HEADER);
  nb__put32(b + 0, NB__HY_EXPORT_MAGIC);
  nb__put32(b + 4, 1);
  nb__put64(b + 8, h->n);
  nb__put64(b + 16, h->round);
  nb__put64(b + 24, h->commits);
  nb__put64(b + 32, nb_xxh3_64(h->global, nb, 0));
  memcpy(b + NB__HY_STATE_HEADER, h->global, nb);
  memcpy(b + NB__HY_STATE_HEADER + nb, h->momentum, nb);
  nb__put64(b + total - 8, nb_xxh3_64(b, total - 8, 0));
  *out = b;
  *len = total;
  return NB_OK;
}

nb_status_t nb_hybrid_import(nb_hybrid_t* h, const uint8_t* b, size_t len, uint64_t skip) {
  if (!h || !b) return nb_error(NB_ERR_INVALID, "hybrid: NULL argument");
  if (h->inflight)
    return nb_error(NB_ERR_INVALID, "hybrid: cannot import with an exchange in flight");
  size_t nb = h->n * sizeof(float), total = NB__HY_STATE_HEADER + 2 * nb + 8;
  if (len != total || nb__get32(b) != NB__HY_EXPORT_MAGIC || nb__get32(b + 4) != 1 ||
      nb__get64(b + 8) != h->n)
    return nb_error(NB_ERR_INVALID,
                    "hybrid: not a global state for %zu synced parameters (%zu bytes)", h->n, len);
  if (nb_xxh3_64(b, total - 8, 0) != nb__get64(b + total - 8))
    return nb_error(NB_ERR_INTEGRITY, "hybrid: global state: checksum mismatch");
  const uint8_t* p = b + NB__HY_STATE_HEADER;
  if (nb_xxh3_64(p, nb, 0) != nb__get64(b + 32))
    return nb_error(NB_ERR_INTEGRITY, "hybrid: global state: theta_global hash mismatch");
  for (int a = 0; a < 2; a++) { /* theta_global and the momentum: finite, as in a state file */
    size_t bad = nb__hy_first_nonfinite((const float*)(p + (size_t)a * nb), h->n);
    if (bad < h->n)
      return nb_error(NB_ERR_INVALID,
                      "hybrid: global state: %s holds a non-finite value "
                      "(element %zu)",
                      a ? "the outer momentum" : "theta_global", bad);
  }
  NB_CHECK(nb__hy_set_params(h, (const float*)p, h->n));
  memcpy(h->global, p, nb);
  memcpy(h->momentum, p + nb, nb);
  memset(h->residual, 0, nb);
  uint64_t next = nb__get64(b + 16) + skip;
  if (next > h->round) h->round = next; /* never back: exchange ids are not reused */
  h->commits = nb__get64(b + 24);
  h->hash = nb__get64(b + 32);
  h->ft_samples = 0;
  if (h->pend) nb__hy_drop_pending(h);
  return NB_OK;
}
