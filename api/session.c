/* api/session: the public session API (include/nebula.h) over the hybrid round (train/hybrid)
 * and the exchange (inter/exchange). The caller's tensors are gathered into one contiguous
 * theta_local vector, the hybrid's local model, before each round and theta_global is scattered
 * back after it. Not here: the round logic itself (hybrid.c), sockets (inter/), a training loop. */
#include <nebula.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/adapt.h"
#include "api/blas_check.h"
#include "api/codec_points.h"
#include "api/driven.h"
#include "api/ft.h"
#include "common/common.h"
#include "compress/compress.h"
#include "inter/exchange.h"
#include "inter/link.h"
#include "kernels/quantize.h"
#include "security/pki.h"
#include "security/seal.h"
#include "security/tls.h"
#include "train/hybrid.h"
#include "train/leader_metrics.h"

#define NB__SS_NAME_MAX 128
#define NB__SS_NDIM_MAX 8
#define NB__SS_MAX_PEERS (NB_HYBRID_MAX_CLUSTERS - 1)
/* The start message (the tensor table, docs/api.md): little-endian, exchange id 0; hybrid round
 * r travels as exchange id r + 1, so that no (round, chunk) is sealed twice. */
#define NB__SS_TABLE_MAGIC 0x5453424eu /* bytes 'N' 'B' 'S' 'T' */
#define NB__SS_TABLE_VERSION 3u        /* 2: each tensor's dtype; 3: the update norm bound */
#define NB__SS_STATE_VERSION 2u        /* a saved state's table: version 2 (no bound: not state) */
#define NB__SS_FLAG_VALUES 0x1u
#define NB__SS_FLAG_FT 0x2u /* fault-tolerant rounds: every cluster must say the same */
/* a driven session's start message (api/driven.h): every cluster starts from the same values by
 * construction, cluster 0 sends none; every cluster must say the same */
#define NB__SS_FLAG_SEEDED 0x4u

typedef struct {
  char name[NB__SS_NAME_MAX];
  void* data; /* borrowed: (prod shape) elements of dtype */
  nb_dtype_t dtype;
  int ndim;
  int64_t shape[NB__SS_NDIM_MAX];
  size_t count, offset; /* floats, and where they sit in theta_local */
} nb__ss_tensor_t;

struct nb_session {
  char job_id[NB_LINK_ID_MAX], cluster_id[NB_LINK_ID_MAX];
  uint32_t index, n_clusters;
  nb_hybrid_config_t hc;
  nb_tls_t* tls;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  int have_secret;
  nb_exchange_t* ex; /* NULL for one cluster */
  size_t n_peers;
  nb__ss_tensor_t* tensors;
  size_t n_tensors, cap_tensors, n; /* n: floats in all */
  /* (n) theta_local: the hybrid's local model. Between rounds (after start, a round, a load) it
   * holds theta_global: the fp32 master that a bf16 tensor's buffer is rounded from. */
  float* local;
  uint64_t samples; /* reported so far: the local model's sample count */
  nb_hybrid_t* h;
  int started, failed;
  long inner_steps;
  /* the overlapped round (nb_session_round_begin / _end): its exchange on `fly`; at_begin (n)
   * the caller's values when it began (bf16 as fp32), to carry the progress made since */
  int in_flight;
  int fly_done; /* atomic: the plain round's exchange thread has finished */
  pthread_t fly;
  float* at_begin;
  /* the eager start (hc.eager, docs/api.md "The overlapped round"): begin moved the buffers to
   * the round's predicted landing (at_begin then holds that, as the buffers took it); local
   * still holds theta_local */
  int moved;
  const uint8_t* fly_msg;
  size_t fly_len;
  uint64_t fly_round, fly_sent, fly_samples;
  double fly_secs;
  nb_status_t fly_status;
  char fly_error[512];
  nb_hybrid_msg_t fly_peers[NB_HYBRID_MAX_CLUSTERS];
  /* fault-tolerant rounds (docs/api.md "Faults"): the exchange's context, and rejoin */
  int ft, rejoin;
  double rejoin_timeout_s, start_timeout_s;
  nb_ft_link_t ftx;
  char* progress_file; /* NULL: no progress lines */
  double loss;         /* the caller's training loss for the next progress line */
  int have_loss;       /* 0: none given since the last line */
  /* metrics_listen: the leader's Prometheus endpoint (train/leader_metrics); NULL = off */
  nb_prom_t* prom;
  uint64_t wan_sent, received; /* totals since open: ours put on the WAN, the peers' frames */
  long skipped, late;          /* rounds not applied, and applied late (fault-tolerant) */
  double exchange_total_s;
  /* adaptive density (docs/api.md): the scheduler's settings and last decision; the caller's
   * compute is timed from when a call gave it control back (t_ready: start or a round returned;
   * t_begun: round_begin returned) to its next call */
  int adaptive;
  nb_adapt_t ad;   /* the scheduler (api/adapt.h; nebula worker's too) */
  double rate_Bps; /* the operator's cap per link, 0 = none */
  double t_ready, t_begun;
  /* a driven session (api/driven.h): the caller's local model with steps, no tensors */
  int driven;
  nb_hybrid_local_t drive;
  char pulled_from[NB_LINK_ID_MAX]; /* the peer of the last pull ("?" before) */
};

void nb_session_options_default(nb_session_options_t* o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->n_clusters = 1;
  o->listen = "127.0.0.1:0";
  o->inner_steps = NB_HYBRID_INNER_STEPS_DEFAULT;
  o->outer_lr = 0.7f;
  o->outer_momentum = 0.9f;
  o->density = 0.01;
  o->values = "int8";
  o->error_feedback = 1;
  o->eager = 1;
  o->update_norm_bound = NB_SESSION_NORM_BOUND_DEFAULT;
  o->round_deadline_s = 30;
  o->final_wait_s = 30;
  o->rejoin_timeout_s = 60;
  o->start_timeout_s = 120;
  o->density_min = 0.0001;
  o->density_max = 1;
  o->error_feedback_decay = 1;
}

/* ---- the local model: theta_local, and the samples the caller reported -------------------- */

static float* nb__ss_params(void* ctx, size_t* n) {
  nb_session_t* s = ctx;
  if (n) *n = s->n;
  return s->local;
}

static uint64_t nb__ss_samples(void* ctx) {
  return ((nb_session_t*)ctx)->samples;
}

/* The caller's buffers into theta_local. A bf16 tensor adds the caller's progress since the
 * last scatter (its bf16 now minus the bf16 we wrote, which is the rounding of the master that
 * local still holds) to the master, so Delta is what the caller trained and not also the bf16
 * rounding of theta_global; an untouched buffer gives Delta 0 exactly. master_valid 0 (start):
 * there is no master yet, the buffer's values are the local model (exact in fp32). */
/* A 16-bit tensor element (bf16 or fp16 bits) as fp32, and the rounding to it (nearest even). */
static float nb__ss_h2f(nb_dtype_t d, uint16_t v) {
  return d == NB_DTYPE_BF16 ? nb_bf16_to_f32(v) : nb_f16_to_f32(v);
}
static uint16_t nb__ss_f2h(nb_dtype_t d, float f) {
  return d == NB_DTYPE_BF16 ? nb_f32_to_bf16(f) : nb_f32_to_f16(f);
}

static void nb__ss_gather(nb_session_t* s, int master_valid) {
  for (size_t i = 0; i < s->n_tensors; i++) {
    const nb__ss_tensor_t* t = &s->tensors[i];
    float* dst = s->local + t->offset;
    if (t->dtype == NB_DTYPE_FP32) {
      memcpy(dst, t->data, t->count * sizeof(float));
      continue;
    }
    const uint16_t* src = t->data;
    for (size_t j = 0; j < t->count; j++) {
      float now = nb__ss_h2f(t->dtype, src[j]);
      dst[j] =
          master_valid ? dst[j] + (now - nb__ss_h2f(t->dtype, nb__ss_f2h(t->dtype, dst[j]))) : now;
    }
  }
}

/* src (n floats) into the caller's buffers; bf16 and fp16 rounded to nearest even (fp16
 * saturating at its largest finite value). */
static void nb__ss_write(nb_session_t* s, const float* src) {
  for (size_t i = 0; i < s->n_tensors; i++) {
    const nb__ss_tensor_t* t = &s->tensors[i];
    if (t->dtype == NB_DTYPE_FP32)
      memcpy(t->data, src + t->offset, t->count * sizeof(float));
    else if (t->dtype == NB_DTYPE_BF16)
      nb_quantize_bf16(src + t->offset, t->count, t->data);
    else
      nb_quantize_fp16(src + t->offset, t->count, t->data);
  }
}

/* theta_local (theta_global after a round) into the caller's buffers. */
static void nb__ss_scatter(nb_session_t* s) {
  nb__ss_write(s, s->local);
}

static const char* nb__ss_dtype_name(uint32_t d) {
  return d == NB_DTYPE_FP32   ? "fp32"
         : d == NB_DTYPE_BF16 ? "bf16"
         : d == NB_DTYPE_FP16 ? "fp16"
                              : "an unknown dtype";
}

/* ---- the exchange callback ------------------------------------------------------------------ */

/* Exchange id `round`: our msg to every peer, theirs into peers[] (peer order; their ids into
 * names, nullable). */
static nb_status_t nb__ss_exchange_id(uint64_t round, const void* msg, size_t len, nb_session_t* s,
                                      nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent,
                                      char (*names)[NB_LINK_ID_MAX]) {
  return nb_exchange_round_take(s->ex, round, msg, len, 0, n_peers, peers, names, sent);
}

static nb_status_t nb__ss_exchange(void* ctx, uint64_t round, const void* msg, size_t len,
                                   nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent) {
  nb_session_t* s = ctx;
  nb_status_t st = nb__ss_exchange_id(round + 1, msg, len, s, peers, n_peers, sent, NULL);
  for (size_t i = 0; st == NB_OK && i < n_peers; i++) s->received += peers[i].len;
  return st;
}

/* ---- open ----------------------------------------------------------------------------------- */

static nb_status_t nb__ss_copy_id(char* dst, const char* src, size_t len, const char* what) {
  if (!src || len == 0 || len >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "session: %s must be 1..%d bytes", what, NB_LINK_ID_MAX - 1);
  memcpy(dst, src, len);
  dst[len] = '\0';
  return NB_OK;
}

static nb_status_t nb__ss_security(nb_session_t* s, const nb_session_options_t* o) {
  if (o->pki_dir) {
    char ca[4096], crt[4096], key[4096];
    NB_CHECK(nb_pki_path(o->pki_dir, NB_PKI_NONE, NULL, "crt", ca, sizeof ca));
    NB_CHECK(nb_pki_path(o->pki_dir, NB_PKI_CLUSTER, s->cluster_id, "crt", crt, sizeof crt));
    NB_CHECK(nb_pki_path(o->pki_dir, NB_PKI_CLUSTER, s->cluster_id, "key", key, sizeof key));
    nb_tls_files_t files = {ca, crt, key};
    NB_CHECK(nb_error_wrap(nb_tls_create(&files, &s->tls), "session: pki_dir"));
  } else if (!o->insecure) {
    return nb_error(NB_ERR_CONFIG, "session: give pki_dir (mutual TLS) or set insecure (tests)");
  }
  if (o->job_secret) {
    memcpy(s->secret, o->job_secret, sizeof s->secret);
    s->have_secret = 1;
  } else if (!o->unsealed) {
    return nb_error(NB_ERR_CONFIG, "session: give job_secret (sealed frames) or set unsealed");
  }
  return NB_OK;
}

static nb_status_t nb__ss_config(nb_session_t* s, const nb_session_options_t* o) {
  nb_hybrid_config_t* hc = &s->hc;
  nb_hybrid_config_defaults(hc);
  hc->cluster_index = o->cluster_index;
  hc->n_clusters = o->n_clusters;
  hc->inner_steps = o->inner_steps;
  hc->outer_lr = o->outer_lr;
  hc->outer_momentum = o->outer_momentum;
  hc->density = o->density;
  hc->error_feedback = o->error_feedback ? 1 : 0;
  hc->norm_bound = o->update_norm_bound;
  /* values "auto": the scheduler picks our next frame's codec point (s->ad.codec) */
  s->ad.auto_codec = o->values && strcmp(o->values, "auto") == 0;
  if (o->values && !s->ad.auto_codec)
    NB_CHECK(nb_error_wrap(nb_values_parse(o->values, &hc->values), "session: values"));
  if (!(o->error_feedback_decay > 0 && o->error_feedback_decay <= 1))
    return nb_error(NB_ERR_CONFIG, "session: error_feedback_decay %g outside (0, 1] (1: no decay)",
                    o->error_feedback_decay);
  hc->ef_decay = (float)o->error_feedback_decay;
  hc->eager = o->eager ? 1 : 0;
  if (o->topk_chunk != 0 &&
      (o->topk_chunk < NB_FRAME_MIN_CHUNK || o->topk_chunk > NB_FRAME_MAX_CHUNK ||
       (o->topk_chunk & (o->topk_chunk - 1)) != 0))
    return nb_error(NB_ERR_CONFIG, "session: topk_chunk %u is not 0 or a power of two in [%u, %u]",
                    o->topk_chunk, NB_FRAME_MIN_CHUNK, NB_FRAME_MAX_CHUNK);
  hc->topk_chunk = o->topk_chunk;
  hc->exchange = nb__ss_exchange;
  hc->exchange_ctx = s;
  if (o->n_clusters < 1 || o->n_clusters > NB_HYBRID_MAX_CLUSTERS)
    return nb_error(NB_ERR_CONFIG, "session: n_clusters %u outside [1, %d]", o->n_clusters,
                    NB_HYBRID_MAX_CLUSTERS);
  if (o->cluster_index >= o->n_clusters)
    return nb_error(NB_ERR_CONFIG, "session: cluster_index %u >= n_clusters %u", o->cluster_index,
                    o->n_clusters);
  if (o->inner_steps < 1)
    return nb_error(NB_ERR_CONFIG, "session: inner_steps %ld < 1", o->inner_steps);
  if (!(o->outer_lr > 0) || !isfinite(o->outer_lr))
    return nb_error(NB_ERR_CONFIG, "session: outer_lr must be > 0");
  if (!(o->outer_momentum >= 0 && o->outer_momentum < 1))
    return nb_error(NB_ERR_CONFIG, "session: outer_momentum must be in [0, 1)");
  if (!(o->density > 0 && o->density <= 1))
    return nb_error(NB_ERR_CONFIG, "session: density %g outside (0, 1]", o->density);
  if (!(o->update_norm_bound == 0 || (o->update_norm_bound >= 1 && isfinite(o->update_norm_bound))))
    return nb_error(NB_ERR_CONFIG, "session: update_norm_bound %g is neither 0 (off) nor >= 1",
                    o->update_norm_bound);
  if (!(o->peer_timeout_s >= 0) || o->peer_timeout_s > 86400)
    return nb_error(NB_ERR_CONFIG, "session: peer_timeout_s must be in [0, 86400]");
  if (o->fault_tolerant != 0 && o->fault_tolerant != 1)
    return nb_error(NB_ERR_CONFIG, "session: fault_tolerant must be 0 or 1");
  if (o->rejoin != 0 && o->rejoin != 1)
    return nb_error(NB_ERR_CONFIG, "session: rejoin must be 0 or 1");
  if (o->rejoin && !o->fault_tolerant)
    return nb_error(NB_ERR_CONFIG,
                    "session: rejoin needs fault_tolerant rounds (a running job's state is "
                    "pulled from a live peer)");
  if (o->fault_tolerant && o->update_norm_bound != 0)
    return nb_error(NB_ERR_CONFIG,
                    "session: fault_tolerant rounds need update_norm_bound 0 (a cluster that "
                    "rejoins would judge updates by another history than its peers)");
  if (o->fault_tolerant && (!(o->round_deadline_s > 0) || o->round_deadline_s > 86400))
    return nb_error(NB_ERR_CONFIG, "session: round_deadline_s must be in (0, 86400]");
  if (o->fault_tolerant && (!(o->final_wait_s >= 0) || o->final_wait_s > 86400))
    return nb_error(NB_ERR_CONFIG, "session: final_wait_s must be in [0, 86400]");
  if (!(o->start_timeout_s > 0) || o->start_timeout_s > 86400)
    return nb_error(NB_ERR_CONFIG, "session: start_timeout_s must be in (0, 86400]");
  if (o->rejoin && (!(o->rejoin_timeout_s > 0) || o->rejoin_timeout_s > 86400))
    return nb_error(NB_ERR_CONFIG, "session: rejoin_timeout_s must be in (0, 86400]");
  if (o->adaptive != 0 && o->adaptive != 1)
    return nb_error(NB_ERR_CONFIG, "session: adaptive must be 0 or 1");
  if (!(o->density_max > 0 && o->density_max <= 1))
    return nb_error(NB_ERR_CONFIG, "session: density_max %g outside (0, 1]", o->density_max);
  if (!(o->density_min > 0 && o->density_min <= o->density_max))
    return nb_error(NB_ERR_CONFIG, "session: density_min %g outside (0, density_max %g]",
                    o->density_min, o->density_max);
  if (!(o->rate_mbit >= 0 && o->rate_mbit <= 1e6))
    return nb_error(NB_ERR_CONFIG, "session: rate_mbit %g outside [0, 1e6] (0: no cap)",
                    o->rate_mbit);
  s->adaptive = o->adaptive;
  s->rate_Bps = o->rate_mbit * 1e6 / 8;
  if (s->adaptive) {
    nb_sched_config_t* sc = &s->ad.cfg;
    nb_sched_config_default(sc);
    sc->density_floor = o->density_min;
    sc->density_ceiling = o->density_max;
    sc->initial_density = o->density;
    sc->max_steps_factor = 1; /* the caller runs its own rounds: never lengthened */
    s->ad.cap_Bps = s->rate_Bps;
    s->ad.hint_cap = 1;
    if (hc->density < o->density_min) hc->density = o->density_min; /* the first rounds' */
    if (hc->density > o->density_max) hc->density = o->density_max;
    NB_CHECK(nb_error_wrap(nb_sched_config_check(sc), "session: adaptive density"));
  }
  if (s->ad.auto_codec) {
    if (!s->adaptive)
      return nb_error(NB_ERR_CONFIG,
                      "session: values \"auto\" needs adaptive 1 (the scheduler picks the codec "
                      "point each round from the measured link)");
    /* the table measured at the H nearest ours; until the link is measured, the point of
     * fewest bytes, as `nebula worker` starts */
    nb_codec_auto_init(&s->ad.codec, o->inner_steps, hc);
  }
  return NB_OK;
}

/* nb_session_open, and nb_driven_open with d (the local model, the round's config, the link). */
static nb_status_t nb__ss_open(const nb_session_options_t* o, const nb_driven_t* d,
                               nb_session_t** out) {
  if (!o || !out) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  *out = NULL;
  /* the caller's model runs on OpenBLAS too: a generic kernel there must not go unnoticed */
  nb__api_blas_warn_once();
  nb_status_t st = NB_OK;
  nb_session_t* s = NULL;
  NB_CHECK(nb_calloc((void**)&s, 1, sizeof *s, "session"));
  NB_CHECK_GOTO(nb__ss_copy_id(s->job_id, o->job_id, o->job_id ? strlen(o->job_id) : 0, "job_id"),
                st, fail);
  NB_CHECK_GOTO(nb__ss_copy_id(s->cluster_id, o->cluster_id,
                               o->cluster_id ? strlen(o->cluster_id) : 0, "cluster_id"),
                st, fail);
  NB_CHECK_GOTO(nb__ss_config(s, o), st, fail);
  snprintf(s->pulled_from, sizeof s->pulled_from, "?");
  if (d) {
    /* the round is the caller's config; the exchange callbacks stay the session's */
    nb_hybrid_config_t hc = d->hc;
    hc.exchange = s->hc.exchange;
    hc.exchange_ctx = s->hc.exchange_ctx;
    hc.ft_exchange = NULL;
    hc.final_wait_s = 0;
    if (hc.cluster_index != o->cluster_index || hc.n_clusters != o->n_clusters ||
        hc.outer_lr != o->outer_lr || hc.outer_momentum != o->outer_momentum ||
        hc.norm_bound != o->update_norm_bound) {
      st = nb_error(NB_ERR_CONFIG, "session: the driven round's config differs from the options");
      goto fail;
    }
    if (o->adaptive || s->ad.auto_codec || (o->progress_file && o->progress_file[0]) ||
        (o->metrics_listen && o->metrics_listen[0])) {
      st = nb_error(NB_ERR_CONFIG,
                    "session: a driven session schedules, reports and serves metrics itself "
                    "(adaptive, values auto, progress_file and metrics_listen off)");
      goto fail;
    }
    if (!d->local.params || !d->local.samples) {
      st = nb_error(NB_ERR_INVALID, "session: a driven local model needs params and samples");
      goto fail;
    }
    s->hc = hc;
    s->driven = 1;
    s->drive = d->local;
  }
  s->index = o->cluster_index;
  s->n_clusters = o->n_clusters;
  if (o->n_peers > s->n_clusters - 1) {
    st = nb_error(NB_ERR_CONFIG, "session: %zu peers for %u clusters", o->n_peers, s->n_clusters);
    goto fail;
  }
  if (o->n_peers && !o->peers) {
    st = nb_error(NB_ERR_INVALID, "session: n_peers %zu but no peers", o->n_peers);
    goto fail;
  }
  NB_CHECK_GOTO(nb__ss_security(s, o), st, fail);
  s->inner_steps = o->inner_steps;
  s->start_timeout_s = o->start_timeout_s;
  if (o->progress_file && o->progress_file[0]) {
    size_t len = strlen(o->progress_file);
    NB_CHECK_GOTO(nb_alloc((void**)&s->progress_file, len + 1, 1, "session progress file"), st,
                  fail);
    memcpy(s->progress_file, o->progress_file, len + 1);
  }
  if (s->n_clusters > 1) {
    nb_exchange_config_t xc;
    memset(&xc, 0, sizeof xc);
    xc.job_id = s->job_id;
    xc.self = s->cluster_id;
    xc.listen = o->listen ? o->listen : "127.0.0.1:0";
    xc.tls = s->tls;
    xc.allow_insecure = s->tls == NULL;
    xc.job_secret = s->have_secret ? s->secret : NULL;
    xc.allow_unsealed = !s->have_secret;
    xc.dead_ms = (int)(o->peer_timeout_s * 1000);
    xc.rate_cap_Bps = s->rate_Bps;
    xc.rate_hint_Bps = s->rate_Bps;
    if (d) {
      xc.streams = d->streams;
      xc.chunk_bytes = d->chunk_bytes;
      if (d->rate_hint_Bps > 0) xc.rate_hint_Bps = d->rate_hint_Bps;
    }
    NB_CHECK_GOTO(nb_error_wrap(nb_exchange_create(&xc, &s->ex), "session: exchange"), st, fail);
    /* fault-tolerant rounds: with several clusters only (one alone has nobody to miss) */
    if (o->fault_tolerant) {
      s->ft = 1;
      s->rejoin = o->rejoin;
      s->rejoin_timeout_s = o->rejoin_timeout_s;
      s->ftx.ex = s->ex;
      s->ftx.deadline_s = o->round_deadline_s;
      s->hc.ft_exchange = nb_ft_exchange;
      s->hc.exchange_ctx = &s->ftx;
      s->hc.final_wait_s = o->final_wait_s;
    }
  }
  for (size_t i = 0; i < o->n_peers; i++)
    NB_CHECK_GOTO(nb_session_add_peer(s, o->peers[i]), st, fail);
  if (o->metrics_listen && o->metrics_listen[0])
    NB_CHECK_GOTO(nb_error_wrap(nb_leader_metrics_start(o->metrics_listen, s->job_id, s->cluster_id,
                                                        &s->prom),
                                "session: metrics_listen %s", o->metrics_listen),
                  st, fail);
  *out = s;
  return NB_OK;
fail:
  nb_session_close(s);
  return st;
}

nb_status_t nb_session_open(const nb_session_options_t* o, nb_session_t** out) {
  return nb__ss_open(o, NULL, out);
}

nb_status_t nb_driven_open(const nb_session_options_t* o, const nb_driven_t* d,
                           nb_session_t** out) {
  if (!d) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  return nb__ss_open(o, d, out);
}

int nb_session_port(const nb_session_t* s) {
  return s && s->ex ? nb_exchange_port(s->ex) : -1;
}

int nb_session_metrics_port(const nb_session_t* s) {
  return s && s->prom ? nb_prom_port(s->prom) : -1;
}

nb_status_t nb_session_add_peer(nb_session_t* s, const char* peer) {
  if (!s || !peer) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  if (s->started) return nb_error(NB_ERR_INVALID, "session: add_peer after start");
  const char* eq = strchr(peer, '=');
  if (!eq || eq == peer || !eq[1] || !strchr(eq + 1, ':'))
    return nb_error(NB_ERR_INVALID, "session: peer '%s' is not id=host:port", peer);
  if (s->n_peers + 1 > s->n_clusters - 1)
    return nb_error(NB_ERR_CONFIG, "session: peer '%s': more peers than n_clusters - 1 (%u)", peer,
                    s->n_clusters - 1);
  char id[NB_LINK_ID_MAX];
  NB_CHECK(nb__ss_copy_id(id, peer, (size_t)(eq - peer), "a peer's id"));
  if (!strcmp(id, s->cluster_id))
    return nb_error(NB_ERR_INVALID, "session: peer '%s' has our own cluster id", peer);
  NB_CHECK(nb_error_wrap(nb_exchange_add_peer(s->ex, id, eq + 1), "session: peer %s", id));
  s->n_peers++;
  s->ftx.n_peers = s->n_peers;
  return NB_OK;
}

nb_status_t nb_session_register(nb_session_t* s, const char* name, float* data,
                                const int64_t* shape, int ndim) {
  return nb_session_register_dtype(s, name, data, NB_DTYPE_FP32, shape, ndim);
}

nb_status_t nb_session_register_dtype(nb_session_t* s, const char* name, void* data,
                                      nb_dtype_t dtype, const int64_t* shape, int ndim) {
  if (!s || !name || !data || (ndim > 0 && !shape))
    return nb_error(NB_ERR_INVALID, "session: NULL argument");
  if (dtype != NB_DTYPE_FP32 && dtype != NB_DTYPE_BF16 && dtype != NB_DTYPE_FP16)
    return nb_error(NB_ERR_INVALID, "session: tensor '%s': unknown dtype %d", name, (int)dtype);
  if (s->started) return nb_error(NB_ERR_INVALID, "session: register '%s' after start", name);
  if (s->driven)
    return nb_error(NB_ERR_INVALID, "session: register '%s': a driven session syncs its model's",
                    name);
  size_t len = strlen(name);
  if (len == 0 || len >= NB__SS_NAME_MAX)
    return nb_error(NB_ERR_INVALID, "session: tensor name of %zu bytes (1..%d)", len,
                    NB__SS_NAME_MAX - 1);
  if (ndim < 0 || ndim > NB__SS_NDIM_MAX)
    return nb_error(NB_ERR_INVALID, "session: tensor '%s': ndim %d outside [0, %d]", name, ndim,
                    NB__SS_NDIM_MAX);
  size_t count = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1 || (uint64_t)shape[d] > (uint64_t)0xffffffffu / count)
      return nb_error(NB_ERR_INVALID, "session: tensor '%s': dimension %d is %lld", name, d,
                      (long long)shape[d]);
    count *= (size_t)shape[d];
  }
  if (s->n + count > 0xffffffffu)
    return nb_error(NB_ERR_INVALID, "session: tensor '%s': more than 2^32 synced floats", name);
  for (size_t i = 0; i < s->n_tensors; i++)
    if (!strcmp(s->tensors[i].name, name))
      return nb_error(NB_ERR_EXISTS, "session: tensor '%s' is registered already", name);
  if (s->n_tensors == s->cap_tensors) {
    size_t cap = s->cap_tensors ? 2 * s->cap_tensors : 8;
    NB_CHECK(nb_realloc((void**)&s->tensors, cap, sizeof *s->tensors, "session tensors"));
    s->cap_tensors = cap;
  }
  nb__ss_tensor_t* t = &s->tensors[s->n_tensors++];
  memset(t, 0, sizeof *t);
  memcpy(t->name, name, len + 1);
  t->data = data;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  t->count = count;
  t->offset = s->n;
  s->n += count;
  return NB_OK;
}

/* ---- start: the tensor table ---------------------------------------------------------------- */

typedef struct {
  uint8_t* p;
  size_t len, cap;
} nb__ss_buf_t;

static void nb__ss_put(nb__ss_buf_t* b, const void* v, size_t n) {
  memcpy(b->p + b->len, v, n);
  b->len += n;
}
static void nb__ss_put32(nb__ss_buf_t* b, uint32_t v) {
  uint8_t x[4];
  for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
  nb__ss_put(b, x, 4);
}
static void nb__ss_put64(nb__ss_buf_t* b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  nb__ss_put(b, x, 8);
}
static uint32_t nb__ss_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* magic, version, sender, n_clusters, flags, n_tensors, outer lr and momentum (fp32 bits), the
 * update norm bound (fp64 bits; version 3, the start message only), n,
 * then per tensor: name length (4), name, dtype (4), ndim (4), ndim dims (8 each); then, with
 * `values` (cluster 0's start message), the n values of theta_local (fp32). The same bytes
 * without values are a saved state's table (nb_session_save). */
static nb_status_t nb__ss_table_make(nb_session_t* s, nb__ss_buf_t* b, int values, int state) {
  size_t cap = 48 + (values ? s->n * sizeof(float) : 0);
  for (size_t i = 0; i < s->n_tensors; i++)
    cap += 12 + strlen(s->tensors[i].name) + 8 * (size_t)s->tensors[i].ndim;
  NB_CHECK(nb_alloc((void**)&b->p, cap, 1, "session table"));
  b->cap = cap;
  b->len = 0;
  nb__ss_put32(b, NB__SS_TABLE_MAGIC);
  nb__ss_put32(b, state ? NB__SS_STATE_VERSION : NB__SS_TABLE_VERSION);
  nb__ss_put32(b, s->index);
  nb__ss_put32(b, s->n_clusters);
  nb__ss_put32(b, (values ? NB__SS_FLAG_VALUES : 0) | (!state && s->ft ? NB__SS_FLAG_FT : 0) |
                      (!state && s->driven ? NB__SS_FLAG_SEEDED : 0));
  nb__ss_put32(b, (uint32_t)s->n_tensors);
  nb__ss_put32(b, nb__ss_bits(s->hc.outer_lr));
  nb__ss_put32(b, nb__ss_bits(s->hc.outer_momentum));
  if (!state) {
    uint64_t nb_bits;
    memcpy(&nb_bits, &s->hc.norm_bound, 8);
    nb__ss_put64(b, nb_bits);
  }
  nb__ss_put64(b, s->n);
  for (size_t i = 0; i < s->n_tensors; i++) {
    const nb__ss_tensor_t* t = &s->tensors[i];
    nb__ss_put32(b, (uint32_t)strlen(t->name));
    nb__ss_put(b, t->name, strlen(t->name));
    nb__ss_put32(b, (uint32_t)t->dtype);
    nb__ss_put32(b, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) nb__ss_put64(b, (uint64_t)t->shape[d]);
  }
  if (values) nb__ss_put(b, s->local, s->n * sizeof(float));
  return NB_OK;
}

/* A strict reader of a peer's table. */
typedef struct {
  const uint8_t* p;
  size_t len, at;
  int bad;
} nb__ss_rd_t;

static uint64_t nb__ss_get(nb__ss_rd_t* r, int bytes) {
  if (r->bad || r->len - r->at < (size_t)bytes) {
    r->bad = 1;
    return 0;
  }
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->at + (size_t)i] << (8 * i);
  r->at += (size_t)bytes;
  return v;
}

static void nb__ss_shape_str(const int64_t* shape, int ndim, char* buf, size_t cap) {
  size_t at = 0;
  buf[0] = '\0';
  if (ndim == 0) snprintf(buf, cap, "scalar");
  for (int d = 0; d < ndim && at < cap; d++)
    at += (size_t)snprintf(buf + at, cap - at, d ? "x%lld" : "%lld", (long long)shape[d]);
}

/* The header of a table (a peer's start message, or a saved state's). */
typedef struct {
  uint32_t version, idx, nc, flags, nt, lr, mu;
  uint64_t bound, n; /* bound: the norm bound's fp64 bits (version 3 on) */
} nb__ss_head_t;

/* Reads the header of a table of version `ours` (a peer's start message: NB__SS_TABLE_VERSION; a
 * saved state's: NB__SS_STATE_VERSION); `where` names its origin in errors ("at cluster east",
 * "in state.bin"). NB_ERR_CODEC when it is not a table of ours. */
static nb_status_t nb__ss_head_read(nb__ss_rd_t* r, const char* where, uint32_t ours,
                                    nb__ss_head_t* hd) {
  uint32_t magic = (uint32_t)nb__ss_get(r, 4), version = (uint32_t)nb__ss_get(r, 4);
  if (magic != NB__SS_TABLE_MAGIC) return nb_error(NB_ERR_CODEC, "no tensor table %s", where);
  if (version != ours)
    return nb_error(NB_ERR_CODEC, "the tensor table %s is version %u, ours %u", where, version,
                    ours);
  hd->version = version;
  hd->idx = (uint32_t)nb__ss_get(r, 4);
  hd->nc = (uint32_t)nb__ss_get(r, 4);
  hd->flags = (uint32_t)nb__ss_get(r, 4);
  hd->nt = (uint32_t)nb__ss_get(r, 4);
  hd->lr = (uint32_t)nb__ss_get(r, 4);
  hd->mu = (uint32_t)nb__ss_get(r, 4);
  hd->bound = version >= 3 ? nb__ss_get(r, 8) : 0;
  hd->n = nb__ss_get(r, 8);
  if (r->bad) return nb_error(NB_ERR_CODEC, "short tensor table %s", where);
  return NB_OK;
}

/* Compares the table's nt tensors with ours, in order: NB_ERR_CONFIG naming the first that
 * differs (name, shape or dtype), NB_ERR_CODEC when malformed. */
static nb_status_t nb__ss_tensors_check(nb_session_t* s, nb__ss_rd_t* r, uint32_t nt,
                                        const char* where) {
  char here[128], there[128];
  for (size_t i = 0; i < s->n_tensors || i < nt; i++) {
    const nb__ss_tensor_t* t = i < s->n_tensors ? &s->tensors[i] : NULL;
    if (i >= nt)
      return nb_error(NB_ERR_CONFIG,
                      "tensor %zu '%s' is registered here but not %s (%u tensors there, "
                      "%zu here)",
                      i, t->name, where, nt, s->n_tensors);
    char name[NB__SS_NAME_MAX];
    uint32_t nl = (uint32_t)nb__ss_get(r, 4);
    if (r->bad || nl == 0 || nl >= NB__SS_NAME_MAX || r->len - r->at < nl)
      return nb_error(NB_ERR_CODEC, "malformed tensor %zu %s", i, where);
    memcpy(name, r->p + r->at, nl);
    name[nl] = '\0';
    r->at += nl;
    uint32_t dt = (uint32_t)nb__ss_get(r, 4), nd = (uint32_t)nb__ss_get(r, 4);
    if (r->bad || nd > NB__SS_NDIM_MAX)
      return nb_error(NB_ERR_CODEC, "malformed tensor %zu %s", i, where);
    int64_t shape[NB__SS_NDIM_MAX];
    for (uint32_t d = 0; d < nd; d++) shape[d] = (int64_t)nb__ss_get(r, 8);
    if (r->bad) return nb_error(NB_ERR_CODEC, "malformed tensor %zu %s", i, where);
    nb__ss_shape_str(shape, (int)nd, there, sizeof there);
    if (!t)
      return nb_error(NB_ERR_CONFIG,
                      "tensor %zu '%s' (%s) is registered %s but not here (%zu tensors "
                      "here, %u there)",
                      i, name, there, where, s->n_tensors, nt);
    nb__ss_shape_str(t->shape, t->ndim, here, sizeof here);
    if (strcmp(name, t->name) || strcmp(here, there))
      return nb_error(NB_ERR_CONFIG, "tensor %zu differs: '%s' (%s) here, '%s' (%s) %s", i, t->name,
                      here, name, there, where);
    if (dt != (uint32_t)t->dtype)
      return nb_error(NB_ERR_CONFIG, "tensor %zu '%s' is %s here, %s %s", i, t->name,
                      nb__ss_dtype_name(t->dtype), nb__ss_dtype_name(dt), where);
  }
  return NB_OK;
}

/* Checks peer message m against our table. *values: cluster 0's values inside m (or NULL).
 * *sender: the peer's index. */
static nb_status_t nb__ss_table_check(nb_session_t* s, const char* peer, const uint8_t* m,
                                      size_t len, uint32_t* sender, const float** values) {
  nb__ss_rd_t r = {m, len, 0, 0};
  char where[NB_LINK_ID_MAX + 16];
  snprintf(where, sizeof where, "at cluster %s", peer);
  *values = NULL;
  nb__ss_head_t hd;
  NB_CHECK(nb__ss_head_read(&r, where, NB__SS_TABLE_VERSION, &hd));
  if (hd.nc != s->n_clusters)
    return nb_error(NB_ERR_CONFIG, "n_clusters is %u here, %u %s", s->n_clusters, hd.nc, where);
  if (hd.idx >= hd.nc || hd.idx == s->index)
    return nb_error(NB_ERR_INVALID, "cluster %s has index %u (ours %u of %u)", peer, hd.idx,
                    s->index, hd.nc);
  if (hd.lr != nb__ss_bits(s->hc.outer_lr) || hd.mu != nb__ss_bits(s->hc.outer_momentum))
    return nb_error(NB_ERR_CONFIG,
                    "outer_lr/outer_momentum differ between us (%g/%g) and cluster %s",
                    (double)s->hc.outer_lr, (double)s->hc.outer_momentum, peer);
  double bound;
  memcpy(&bound, &hd.bound, 8);
  if (memcmp(&bound, &s->hc.norm_bound, 8)) /* every cluster must refuse the same rounds */
    return nb_error(NB_ERR_CONFIG, "update_norm_bound differs between us (%g) and cluster %s (%g)",
                    s->hc.norm_bound, peer, bound);
  NB_CHECK(nb__ss_tensors_check(s, &r, hd.nt, where));
  if (hd.n != s->n && s->driven) /* no tensors: the model's size is the table */
    return nb_error(NB_ERR_CONFIG, "the model has %zu synced parameters here, %llu at cluster %s",
                    s->n, (unsigned long long)hd.n, peer);
  if (hd.n != s->n)
    return nb_error(NB_ERR_CODEC, "cluster %s: table of %llu floats, ours %zu", peer,
                    (unsigned long long)hd.n, s->n);
  if (((hd.flags & NB__SS_FLAG_FT) != 0) != (s->ft != 0))
    return nb_error(NB_ERR_CONFIG, "fault_tolerant is %d here, %d at cluster %s", s->ft,
                    (hd.flags & NB__SS_FLAG_FT) != 0, peer);
  if (((hd.flags & NB__SS_FLAG_SEEDED) != 0) != (s->driven != 0))
    return nb_error(NB_ERR_CONFIG,
                    "cluster %s %s the built-in worker's model, we %s (both must, or neither)",
                    peer, (hd.flags & NB__SS_FLAG_SEEDED) ? "trains" : "does not train",
                    s->driven ? "do" : "do not");
  size_t want = (hd.flags & NB__SS_FLAG_VALUES) ? s->n * sizeof(float) : 0;
  int sends = hd.idx == 0 && !(hd.flags & NB__SS_FLAG_SEEDED); /* cluster 0 sends its values */
  if ((hd.flags & ~(NB__SS_FLAG_VALUES | NB__SS_FLAG_FT | NB__SS_FLAG_SEEDED)) ||
      ((hd.flags & NB__SS_FLAG_VALUES) != 0) != sends || r.len - r.at != want)
    return nb_error(NB_ERR_CODEC, "cluster %s: malformed table (flags %u)", peer, hd.flags);
  if (want) *values = (const float*)(r.p + r.at);
  *sender = hd.idx;
  return NB_OK;
}

/* ---- fault-tolerant rounds: the state a rejoining cluster pulls ---------------------------- */

/* What we serve to a cluster that rejoins (Exchange.Pull): [u32 LE table length][our tensor
 * table, without values][the hybrid's exported state]; published after start and after every
 * round. */
static nb_status_t nb__ss_publish(nb_session_t* s) {
  nb__ss_buf_t t = {0};
  uint8_t *st8 = NULL, *all = NULL;
  size_t st_len = 0;
  nb_status_t st = nb__ss_table_make(s, &t, 0, 0);
  if (st == NB_OK) st = nb_hybrid_export(s->h, &st8, &st_len);
  if (st == NB_OK) st = nb_alloc((void**)&all, 4 + t.len + st_len, 1, "session: published state");
  if (st == NB_OK) {
    for (int i = 0; i < 4; i++) all[i] = (uint8_t)(t.len >> (8 * i));
    memcpy(all + 4, t.p, t.len);
    memcpy(all + 4 + t.len, st8, st_len);
    st = nb_exchange_publish_state(s->ex, nb_hybrid_rounds(s->h) & 0xffffffffu, all,
                                   4 + t.len + st_len);
  }
  nb_free(t.p);
  nb_free(st8);
  nb_free(all);
  return st == NB_OK ? NB_OK : nb_error_wrap(st, "session: publishing the global state");
}

/* A peer's published table must describe our job exactly (its cluster is another one). */
static nb_status_t nb__ss_published_check(nb_session_t* s, const uint8_t* m, size_t len) {
  nb__ss_rd_t r = {m, len, 0, 0};
  const char* where = "in the state a peer published";
  nb__ss_head_t hd;
  NB_CHECK(nb__ss_head_read(&r, where, NB__SS_TABLE_VERSION, &hd));
  if (hd.nc != s->n_clusters)
    return nb_error(NB_ERR_CONFIG, "n_clusters is %u here, %u %s", s->n_clusters, hd.nc, where);
  if (hd.idx >= hd.nc || hd.idx == s->index)
    return nb_error(NB_ERR_CONFIG, "the state's cluster has index %u (ours %u of %u)", hd.idx,
                    s->index, hd.nc);
  if (hd.lr != nb__ss_bits(s->hc.outer_lr) || hd.mu != nb__ss_bits(s->hc.outer_momentum))
    return nb_error(NB_ERR_CONFIG, "outer_lr/outer_momentum differ between us and the state");
  if ((hd.flags & ~NB__SS_FLAG_SEEDED) != NB__SS_FLAG_FT)
    return nb_error(NB_ERR_CONFIG, "the state %s is not of fault-tolerant rounds", where);
  NB_CHECK(nb__ss_tensors_check(s, &r, hd.nt, where));
  if (hd.n != s->n || r.at != r.len)
    return nb_error(NB_ERR_CODEC, "malformed tensor table %s", where);
  return NB_OK;
}

typedef struct {
  nb_session_t* s;
  uint64_t skip;
} nb__ss_adopt_t;

/* nb_ft_adopt_fn: checks the table, then imports the hybrid's state (theta_global into local). */
static nb_status_t nb__ss_adopt(void* ctx, const uint8_t* b, size_t len) {
  nb__ss_adopt_t* a = ctx;
  if (len < 4) return nb_error(NB_ERR_CODEC, "session: a published state of %zu bytes", len);
  size_t tl = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
  if (tl > len - 4) return nb_error(NB_ERR_CODEC, "session: a published state's table is cut");
  NB_CHECK(nb__ss_published_check(a->s, b + 4, tl));
  /* the state after a table of any length: copied to an aligned buffer (it holds floats) */
  uint8_t* state = NULL;
  size_t sl = len - 4 - tl;
  NB_CHECK(nb_alloc((void**)&state, sl ? sl : 1, 1, "session: pulled state"));
  memcpy(state, b + 4 + tl, sl);
  nb_status_t st = nb_hybrid_import(a->s->h, state, sl, a->skip);
  nb_free(state);
  return st;
}

/* Adopts a live peer's global state; skip: rounds added to its round (2 when this process
 * restarted: it must not reuse the exchange ids of its previous life). */
static nb_status_t nb__ss_pull(nb_session_t* s, double timeout_s, uint64_t skip,
                               const char** from) {
  nb__ss_adopt_t a = {s, skip};
  nb_status_t st = nb_ft_pull(s->ex, timeout_s, nb__ss_adopt, &a, from);
  if (st == NB_OK) snprintf(s->pulled_from, sizeof s->pulled_from, "%s", *from ? *from : "?");
  return st;
}

/* The hybrid on the local model: the caller's tensors gathered into local, or a driven one. */
static nb_status_t nb__ss_hybrid_create(nb_session_t* s) {
  nb_hybrid_local_t lm = {.ctx = s, .params = nb__ss_params, .samples = nb__ss_samples};
  return nb_error_wrap(nb_hybrid_create_local(&s->hc, s->driven ? &s->drive : &lm, &s->h),
                       "session: start");
}

/* Adaptive density: the idle-link probes (a thin link's small frames may never measure it), and
 * the caller's clock from here. */
static nb_status_t nb__ss_adaptive_start(nb_session_t* s) {
  if (s->adaptive && s->ex)
    NB_CHECK(nb_error_wrap(nb_adapt_probes_start(s->ex), "session: start (adaptive density)"));
  s->t_ready = nb_now_s();
  return NB_OK;
}

/* start with `rejoin`: no table agreement (the others are past it); the hybrid on our buffers,
 * then a live peer's state, checked against our table. */
static nb_status_t nb__ss_start_rejoin(nb_session_t* s) {
  NB_CHECK(nb__ss_hybrid_create(s));
  const char* from = "?";
  NB_CHECK(nb_error_wrap(nb__ss_pull(s, s->rejoin_timeout_s, 2, &from),
                         "session: start (rejoin: pulling the global state)"));
  NB_INFO(TRAIN, "session: %s rejoined from %s at round %llu (%llu rounds applied)", s->cluster_id,
          from, (unsigned long long)nb_hybrid_rounds(s->h),
          (unsigned long long)nb_hybrid_commits(s->h));
  nb__ss_scatter(s);
  NB_CHECK(nb__ss_publish(s));
  NB_CHECK(nb__ss_adaptive_start(s));
  s->started = 1;
  s->failed = 0;
  return NB_OK;
}

/* Until every peer has answered once (its program may still be starting: importing a framework
 * under load takes seconds, longer than the dead timeout) and is alive, at most timeout_s. The
 * table exchange then runs with peers that are up, so a late starter is not taken for dead. */
static nb_status_t nb__ss_wait_peers(nb_session_t* s, double timeout_s) {
  double until = nb_now_s() + timeout_s;
  for (;;) {
    size_t up = 0, first_down = 0;
    int have_down = 0;
    for (size_t i = 0; i < s->n_peers; i++) {
      nb_exchange_liveness_t lv;
      if (nb_exchange_peer_liveness(s->ex, i, &lv) == NB_OK && lv.pings_ok > 0 && !lv.dead)
        up++;
      else if (!have_down)
        first_down = i, have_down = 1;
    }
    if (up == s->n_peers) return NB_OK;
    if (nb_now_s() >= until)
      return nb_error(NB_ERR_UNAVAILABLE,
                      "session: start: peer %s has not answered in %.0f s (start_timeout_s): "
                      "is its program running, and does it listen where we were told?",
                      nb_link_peer(nb_exchange_link(s->ex, first_down)), timeout_s);
    nb_sleep_ns(50000000LL);
  }
}

nb_status_t nb_session_start(nb_session_t* s) {
  if (!s) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  if (s->started || s->failed)
    return nb_error(NB_ERR_INVALID, "session: start called twice (or after a failed start)");
  if (s->n_tensors == 0 && !s->driven)
    return nb_error(NB_ERR_INVALID, "session: start: no tensor registered");
  if (s->n_peers != s->n_clusters - 1)
    return nb_error(NB_ERR_CONFIG, "session: start: %zu peers for %u clusters", s->n_peers,
                    s->n_clusters);
  s->failed = 1;   /* until it succeeds */
  if (s->driven) { /* the table is the model's size; its values stay the model's */
    s->drive.params(s->drive.ctx, &s->n);
    if (s->n == 0 || s->n > 0xffffffffu)
      return nb_error(NB_ERR_INVALID, "session: start: a driven model of %zu floats", s->n);
  } else {
    NB_CHECK(nb_alloc((void**)&s->local, s->n, sizeof(float), "theta_local"));
    nb__ss_gather(s, 0);
  }
  if (s->rejoin) return nb__ss_start_rejoin(s);
  if (s->n_clusters > 1) {
    NB_CHECK(nb__ss_wait_peers(s, s->start_timeout_s));
    nb__ss_buf_t b = {0};
    nb_hybrid_msg_t got[NB__SS_MAX_PEERS];
    char names[NB__SS_MAX_PEERS][NB_LINK_ID_MAX];
    memset(got, 0, sizeof got);
    memset(names, 0, sizeof names);
    nb_status_t st = nb__ss_table_make(s, &b, s->index == 0 && !s->driven, 0);
    if (st == NB_OK) st = nb__ss_exchange_id(0, b.p, b.len, s, got, s->n_peers, NULL, names);
    if (st != NB_OK) st = nb_error_wrap(st, "session: start");
    nb_free(b.p);
    /* every peer's table is checked (in peer order, so that each side names its first
     * difference); cluster 0's values become theta_global */
    uint8_t seen[NB_HYBRID_MAX_CLUSTERS] = {0};
    seen[s->index] = 1;
    for (size_t i = 0; i < s->n_peers && st == NB_OK; i++) {
      uint32_t idx = 0;
      const float* v = NULL;
      st = nb__ss_table_check(s, names[i], got[i].data, got[i].len, &idx, &v);
      if (st != NB_OK) st = nb_error_wrap(st, "session: start");
      if (st == NB_OK && seen[idx])
        st = nb_error(NB_ERR_INVALID, "session: start: two clusters have index %u", idx);
      if (st == NB_OK) seen[idx] = 1;
      if (st == NB_OK && v) memcpy(s->local, v, s->n * sizeof(float));
    }
    for (size_t i = 0; i < s->n_peers; i++) nb_free(got[i].data);
    NB_CHECK(st);
  }
  NB_CHECK(nb__ss_hybrid_create(s));
  nb__ss_scatter(s);
  if (s->ft) NB_CHECK(nb__ss_publish(s));
  NB_CHECK(nb__ss_adaptive_start(s));
  s->started = 1;
  s->failed = 0;
  return NB_OK;
}

/* ---- rounds --------------------------------------------------------------------------------- */

static nb_status_t nb__ss_ready(const nb_session_t* s, const char* what) {
  if (!s) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  if (!s->started) return nb_error(NB_ERR_INVALID, "session: %s before start", what);
  if (s->in_flight && strcmp(what, "round_end"))
    return nb_error(NB_ERR_INVALID,
                    "session: %s while round %llu is in flight: call nb_session_round_end first",
                    what, (unsigned long long)s->fly_round);
  if (s->failed)
    return nb_error(NB_ERR_INVALID,
                    "session: %s after a failed round: the clusters no longer agree on the "
                    "round; close the session",
                    what);
  return NB_OK;
}

/* One JSON line per round in the progress file, the fields of the built-in worker's that the
 * session knows (a gateway turns each into a "progress" event). A file that cannot be written
 * costs the line, never the round. */
static void nb__ss_progress(const nb_session_t* s, uint64_t samples, const nb_hybrid_round_t* rec) {
  if (!s->progress_file) return;
  FILE* f = fopen(s->progress_file, "ae");
  if (!f) {
    NB_WARN("session: progress file %s: %s (no progress line for round %llu)", s->progress_file,
            strerror(errno), (unsigned long long)rec->round + 1);
    return;
  }
  double mbps = rec->exchange_s > 0 ? (double)rec->bytes_sent * 8 / 1e6 / rec->exchange_s : 0;
  char src[NB_LINK_ID_MAX]; /* the id as JSON text: anything but [A-Za-z0-9._-] shown as '?' */
  size_t k = 0;
  for (; s->cluster_id[k] && k + 1 < sizeof src; k++) {
    char ch = s->cluster_id[k];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-';
    src[k] = ok ? ch : '?';
  }
  src[k] = 0;
  /* the loss the caller reported for this round (nb_session_set_loss), when it did */
  char loss[48] = "";
  if (s->have_loss) snprintf(loss, sizeof loss, "\"loss\": %.9g, ", s->loss);
  /* one write of the whole line, so that a reader never sees half of it */
  char line[560];
  int n =
      snprintf(line, sizeof line,
               "{\"round\": %llu, \"step\": %llu, %s\"density\": %g, \"wan_mbps\": %.3f, "
               "\"bytes_sent\": %llu, \"samples\": %llu, \"samples_all\": %llu, "
               "\"source\": \"%s\", \"global_xxh3\": \"%016llx\"}\n",
               (unsigned long long)rec->round + 1,
               (unsigned long long)(rec->round + 1) * (unsigned long long)s->inner_steps, loss,
               rec->density, mbps, (unsigned long long)rec->bytes_sent, (unsigned long long)samples,
               (unsigned long long)rec->samples_all, src, (unsigned long long)rec->global_hash);
  if (n > 0 && (size_t)n < sizeof line) fwrite(line, 1, (size_t)n, f);
  fclose(f);
}

/* The links after a round: the slowest peer's measured rate and the longest round trip (what
 * the exchange's liveness uses; 0 where nothing was measured yet). */
static void nb__ss_link_figures(nb_session_t* s, nb_session_round_t* out) {
  double rate = 0, rtt = 0;
  for (size_t i = 0; s->ex && i < s->n_peers; i++) {
    nb_exchange_liveness_t lv;
    if (nb_exchange_peer_liveness(s->ex, i, &lv) != NB_OK) continue;
    if (lv.rate_Bps > 0 && (rate == 0 || lv.rate_Bps < rate)) rate = lv.rate_Bps;
    if (lv.rtt_s > rtt) rtt = lv.rtt_s;
  }
  out->goodput_Bps = rate;
  out->rtt_s = rtt;
}

/* The leader's metrics after a round (metrics_listen): the round's figures and the totals. */
static void nb__ss_metrics(nb_session_t* s, const nb_hybrid_round_t* rec,
                           const nb_session_round_t* r) {
  s->wan_sent += r->bytes_sent;
  s->exchange_total_s += r->exchange_s;
  if (s->ft && rec->landed && !rec->applied) s->skipped++;
  if (r->late) s->late++;
  if (!s->prom) return;
  uint64_t rounds = s->ft ? r->next_round : r->round + 1;
  nb_leader_figures_t f = {
      .round = (long)rounds,
      .rounds = 0, /* the caller's loop decides: unknown here */
      .step = (long)(rounds * (uint64_t)s->inner_steps),
      .max_steps = 0,
      .loss = rec->loss,
      .density = r->density,
      .wan_sent = s->wan_sent,
      .wan_received = s->ft ? s->ftx.received : s->received,
      .goodput_Bps = r->goodput_Bps,
      .rtt_s = r->rtt_s,
      .peers = (int)s->n_peers,
      .peers_alive = (int)r->peers_alive,
      .applied = r->commits,
      .skipped = s->skipped,
      .late = s->late,
      .compute_s = 0,
      .exchange_s = s->exchange_total_s,
  };
  if (s->have_loss) f.loss = s->loss;
  nb_leader_metrics_round(s->prom, &f);
}

/* Adaptive density: the next frame's density from the slowest link's estimate and the caller's
 * compute the exchange hid under (compute_s; overlapped: between round_begin and round_end, of
 * which the transfer may fill the headroom; blocking: between rounds, of which it may take the
 * fraction), as `nebula worker` decides it (inter/sched.h); then the hybrid's density. */
static void nb__ss_schedule(nb_session_t* s, const nb_hybrid_round_t* rec, double compute_s,
                            int overlap, nb_session_round_t* r) {
  r->next_density = rec->density;
  r->sched = "fixed";
  r->point = s->ad.auto_codec ? nb_codec_auto_name(&s->ad.codec) : NULL;
  if (!s->adaptive || !s->ex) return;
  uint32_t steps = (uint32_t)(s->inner_steps < UINT32_MAX ? s->inner_steps : UINT32_MAX);
  nb_adapt_round_t ar = {
      .round = rec->round,
      .values = s->hc.values,
      .topk_chunk = s->hc.topk_chunk,
      .density = rec->density,
      .n_params = s->n,
      .steps = steps,
      .step_compute_s = compute_s > 0 ? compute_s / (double)steps : 0,
  };
  s->ad.cfg.overlap = overlap;
  nb_sched_input_t in;
  nb_sched_decision_t dec;
  if (nb_adapt_next(&s->ad, s->ex, s->h, &ar, &in, &dec) != NB_OK) {
    NB_WARN("session: adaptive density: %s (the density stays %g)", nb_error_last(), rec->density);
    return;
  }
  r->next_density = dec.density;
  r->sched = nb_sched_reason_name(dec.reason); /* the names the worker logs */
  r->point = s->ad.auto_codec ? nb_codec_auto_name(&s->ad.codec) : NULL;
  char line[512];
  nb_sched_decision_format(&dec, line, sizeof line);
  NB_INFO(TRAIN, "session: %s: %s%s%s", s->cluster_id, line, r->point ? " point=" : "",
          r->point ? r->point : "");
}

/* The progress line, the metrics, the next density (nb__ss_schedule) and *out (nullable) of a
 * round applied on every cluster; wait_s: what the caller waited for the exchange; compute_s and
 * overlap as nb__ss_schedule takes them. */
static void nb__ss_figures(nb_session_t* s, uint64_t samples, const nb_hybrid_round_t* rec,
                           double wait_s, double compute_s, int overlap, nb_session_round_t* out) {
  nb__ss_progress(s, samples, rec);
  nb_session_round_t r;
  memset(&r, 0, sizeof r);
  r.round = rec->round;
  /* a round without fault tolerance that returns NB_OK was applied on every cluster */
  r.applied = s->ft ? rec->applied : 1;
  r.commits = s->ft ? rec->commits : rec->round + 1;
  r.peers_ok = s->ft ? rec->peers_ok : (uint32_t)s->n_peers;
  r.peers_alive = s->ft ? rec->peers_alive : (uint32_t)s->n_peers;
  r.late = s->ft ? rec->caught_up : 0;
  r.pulled = s->ft ? rec->need_state : 0;
  r.next_round = s->ft ? rec->next_round : rec->round + 1;
  r.samples = samples;
  r.samples_all = rec->samples_all;
  r.msg_bytes = rec->msg_bytes;
  r.bytes_sent = rec->bytes_sent;
  r.density = rec->density;
  r.wait_s = wait_s;
  r.exchange_s = rec->exchange_s;
  r.codec_s = rec->codec_s;
  r.global_hash = rec->global_hash;
  r.update_norm = rec->update_norm;
  nb__ss_link_figures(s, &r);
  nb__ss_schedule(s, rec, compute_s, overlap, &r);
  nb__ss_metrics(s, rec, &r);
  s->have_loss = 0; /* a loss is of one round */
  if (out) *out = r;
}

/* After a fault-tolerant round: a cluster found behind (the others applied rounds it cannot
 * replay) adopts a peer's state; then ours is published for the next one that rejoins. */
static nb_status_t nb__ss_after_ft(nb_session_t* s, nb_hybrid_round_t* rec) {
  if (rec->need_state) {
    const char* from = "?";
    NB_CHECK(nb_error_wrap(nb__ss_pull(s, s->ftx.deadline_s, 0, &from),
                           "catching up (pulling the global state)"));
    NB_INFO(TRAIN,
            "session: round %llu: behind the other clusters: pulled the global state from %s",
            (unsigned long long)rec->round, from);
    rec->commits = nb_hybrid_commits(s->h);
    rec->global_hash = nb_hybrid_global_hash(s->h);
    rec->next_round = nb_hybrid_rounds(s->h);
  }
  return nb__ss_publish(s);
}

/* After a driven round or drain (st its status): the catch-up and publishing of fault-tolerant
 * rounds; a failure fails the session. (The round's figures are the caller's: a driven session
 * serves no metrics.) */
static nb_status_t nb__ss_driven_done(nb_session_t* s, nb_status_t st, nb_hybrid_round_t* rec,
                                      const char* what) {
  if (st == NB_OK && s->ft) st = nb__ss_after_ft(s, rec);
  if (st != NB_OK) {
    s->failed = 1;
    return nb_error_wrap(st, "session: %s %llu", what, (unsigned long long)nb_hybrid_rounds(s->h));
  }
  return NB_OK;
}

nb_status_t nb_driven_round(nb_session_t* s, nb_hybrid_round_t* rec) {
  NB_CHECK(nb__ss_ready(s, "round"));
  if (!s->driven || !rec) return nb_error(NB_ERR_INVALID, "session: not a driven session");
  return nb__ss_driven_done(s, nb_hybrid_round(s->h, rec), rec, "round");
}

nb_status_t nb_driven_drain(nb_session_t* s, nb_hybrid_round_t* rec) {
  NB_CHECK(nb__ss_ready(s, "drain"));
  if (!s->driven || !rec) return nb_error(NB_ERR_INVALID, "session: not a driven session");
  return nb__ss_driven_done(s, nb_hybrid_drain(s->h, rec), rec,
                            "landing the update in flight before round");
}

nb_hybrid_t* nb_driven_hybrid(nb_session_t* s) {
  return s ? s->h : NULL;
}

nb_exchange_t* nb_driven_exchange(nb_session_t* s) {
  return s ? s->ex : NULL;
}

uint64_t nb_driven_received(const nb_session_t* s) {
  return !s ? 0 : s->ft ? s->ftx.received : s->received;
}

const char* nb_driven_pulled_from(const nb_session_t* s) {
  return s ? s->pulled_from : "?";
}

nb_status_t nb_session_round(nb_session_t* s, uint64_t samples, nb_session_round_t* out) {
  NB_CHECK(nb__ss_ready(s, "round"));
  if (s->driven)
    return nb_error(NB_ERR_INVALID, "session: round: a driven session's rounds run steps");
  double compute_s = nb_now_s() - s->t_ready; /* the caller's steps since it had control */
  if (samples > UINT64_MAX - s->samples)
    return nb_error(NB_ERR_INVALID, "session: round: sample count overflows");
  nb__ss_gather(s, 1);
  s->samples += samples;
  nb_hybrid_round_t rec;
  nb_status_t st = nb_hybrid_round(s->h, &rec);
  if (st == NB_OK && s->ft) st = nb__ss_after_ft(s, &rec);
  if (st != NB_OK) {
    s->failed = 1; /* the caller's buffers keep their own values: nothing was applied */
    return nb_error_wrap(st, "session: round %llu", (unsigned long long)nb_hybrid_rounds(s->h));
  }
  nb__ss_scatter(s);
  nb__ss_figures(s, samples, &rec, rec.exchange_s, compute_s, 0, out);
  s->t_ready = nb_now_s();
  return NB_OK;
}

/* ---- the overlapped round ------------------------------------------------------------------- */

static void* nb__ss_fly_main(void* arg) {
  nb_session_t* s = arg;
  double t0 = nb_now_s();
  s->fly_sent = 0;
  s->fly_status = NB_OK;
  if (s->n_clusters > 1)
    s->fly_status = nb__ss_exchange(s, s->fly_round, s->fly_msg, s->fly_len, s->fly_peers + 1,
                                    s->n_clusters - 1, &s->fly_sent);
  s->fly_secs = nb_now_s() - t0;
  if (s->fly_status != NB_OK) snprintf(s->fly_error, sizeof s->fly_error, "%s", nb_error_last());
  __atomic_store_n(&s->fly_done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* The caller's buffers as fp32 (bf16 widened) into dst. */
static void nb__ss_read_buffers(const nb_session_t* s, float* dst) {
  for (size_t i = 0; i < s->n_tensors; i++) {
    const nb__ss_tensor_t* t = &s->tensors[i];
    if (t->dtype == NB_DTYPE_FP32) {
      memcpy(dst + t->offset, t->data, t->count * sizeof(float));
      continue;
    }
    const uint16_t* src = t->data;
    for (size_t j = 0; j < t->count; j++) dst[t->offset + j] = nb__ss_h2f(t->dtype, src[j]);
  }
}

/* Eager start (hc.eager and a sparse frame: nb_hybrid_eager_target decides): the caller's
 * buffers move to where the round in flight will land as far as we know, so that its steps
 * until round_end train on a model that has most of the update already; at_begin then holds
 * that start as the buffers took it (bf16 and fp16 rounded), the progress is measured from
 * there, and s->local keeps theta_local as read at begin, which a round that is not applied
 * goes back to. */
static nb_status_t nb__ss_eager_start(nb_session_t* s) {
  int moved = 0;
  NB_CHECK(nb_hybrid_eager_target(s->h, s->at_begin, &moved));
  if (!moved) return NB_OK;
  nb__ss_write(s, s->at_begin);
  nb__ss_read_buffers(s, s->at_begin);
  s->moved = 1;
  return NB_OK;
}

int nb_session_round_ready(const nb_session_t* s) {
  if (!s || !s->in_flight) return 1;
  if (s->ft) return nb_hybrid_exchange_done(s->h);
  return __atomic_load_n(&s->fly_done, __ATOMIC_ACQUIRE);
}

int nb_session_begin_moved(const nb_session_t* s) {
  return s && s->in_flight && s->moved;
}

nb_status_t nb_session_round_begin(nb_session_t* s, uint64_t samples) {
  NB_CHECK(nb__ss_ready(s, "round_begin"));
  if (s->driven)
    return nb_error(NB_ERR_INVALID, "session: round_begin: a driven session overlaps inside");
  if (samples > UINT64_MAX - s->samples)
    return nb_error(NB_ERR_INVALID, "session: round_begin: sample count overflows");
  if (!s->at_begin)
    NB_CHECK(nb_alloc((void**)&s->at_begin, s->n, sizeof(float), "session: overlapped round"));
  nb__ss_gather(s, 1);
  s->samples += samples;
  nb__ss_read_buffers(s, s->at_begin);
  s->fly_round = nb_hybrid_rounds(s->h);
  s->fly_samples = samples;
  s->moved = 0;
  if (s->ft) { /* the update and the vote run on the hybrid's own thread */
    nb_status_t st = nb_hybrid_ft_begin(s->h);
    if (st == NB_OK) {
      s->in_flight = 1;
      st = nb__ss_eager_start(s);
    }
    if (st != NB_OK) {
      s->failed = 1;
      return nb_error_wrap(st, "session: round %llu", (unsigned long long)s->fly_round);
    }
    s->t_begun = nb_now_s();
    return NB_OK;
  }
  nb_status_t st = nb_hybrid_prepare(s->h, &s->fly_msg, &s->fly_len);
  if (st == NB_OK) st = nb__ss_eager_start(s);
  if (st != NB_OK) {
    s->failed = 1;
    return nb_error_wrap(st, "session: round %llu", (unsigned long long)s->fly_round);
  }
  memset(s->fly_peers, 0, sizeof s->fly_peers);
  s->fly_done = 0;
  if (pthread_create(&s->fly, NULL, nb__ss_fly_main, s) != 0) {
    s->failed = 1;
    return nb_error(NB_ERR_INTERNAL, "session: round %llu: cannot start the exchange thread",
                    (unsigned long long)s->fly_round);
  }
  s->in_flight = 1;
  s->t_begun = nb_now_s();
  return NB_OK;
}

/* Waits for the exchange in flight; NB_OK or its error (then the peers' frames are freed). */
static nb_status_t nb__ss_fly_join(nb_session_t* s) {
  pthread_join(s->fly, NULL);
  s->in_flight = 0;
  if (s->fly_status == NB_OK) return NB_OK;
  for (uint32_t i = 1; i < s->n_clusters; i++) nb_free(s->fly_peers[i].data);
  memset(s->fly_peers, 0, sizeof s->fly_peers);
  return nb_error(s->fly_status, "hybrid: exchange: %s", s->fly_error);
}

/* theta_local (theta_global in local now) plus what the caller trained since the round began:
 * its buffers now minus then (a bf16 buffer's progress in its own precision, as in gather), into
 * the caller's buffers. */
static void nb__ss_add_progress(nb_session_t* s) {
  const float* then = s->at_begin;
  for (size_t i = 0; i < s->n_tensors; i++) {
    const nb__ss_tensor_t* t = &s->tensors[i];
    float* l = s->local + t->offset;
    const float* b0 = then + t->offset;
    if (t->dtype == NB_DTYPE_FP32) {
      const float* b1 = t->data;
      for (size_t j = 0; j < t->count; j++) l[j] += b1[j] - b0[j];
    } else {
      const uint16_t* b1 = t->data;
      for (size_t j = 0; j < t->count; j++) l[j] += nb__ss_h2f(t->dtype, b1[j]) - b0[j];
    }
  }
  nb__ss_scatter(s);
}

/* round_end of a fault-tolerant session: the round applied (or a held one landed late, or the
 * state pulled) moves the buffers to theta_global plus the progress since begin; a skipped or
 * held round leaves them as the caller trained them (the next Delta carries that round too). */
static nb_status_t nb__ss_round_end_ft(nb_session_t* s, nb_session_round_t* out) {
  double t0 = nb_now_s(), hidden = t0 - s->t_begun;
  nb_hybrid_round_t rec;
  nb_status_t st = nb_hybrid_ft_end(s->h, &rec);
  s->in_flight = 0;
  double waited = nb_now_s() - t0;
  if (st == NB_OK) st = nb__ss_after_ft(s, &rec);
  if (st != NB_OK) {
    s->failed = 1;
    if (s->moved) nb__ss_add_progress(s); /* back to theta_local plus the progress */
    return nb_error_wrap(st, "session: round %llu", (unsigned long long)s->fly_round);
  }
  /* applied (or landed late, or pulled): theta_global plus the progress; else, after an eager
   * start, theta_local as it was at begin plus the progress (what the next Delta carries) */
  if (rec.applied || rec.caught_up || rec.need_state || s->moved) nb__ss_add_progress(s);
  nb__ss_figures(s, s->fly_samples, &rec, waited, hidden, 1, out);
  s->t_ready = nb_now_s();
  return NB_OK;
}

nb_status_t nb_session_round_end(nb_session_t* s, nb_session_round_t* out) {
  NB_CHECK(nb__ss_ready(s, "round_end"));
  if (!s->in_flight)
    return nb_error(NB_ERR_INVALID, "session: round_end without nb_session_round_begin");
  if (s->ft) return nb__ss_round_end_ft(s, out);
  double t0 = nb_now_s(), hidden = t0 - s->t_begun;
  nb_status_t st = nb__ss_fly_join(s);
  double waited = nb_now_s() - t0;
  nb_hybrid_round_t rec;
  if (st == NB_OK) {
    s->fly_peers[0].data = (uint8_t*)s->fly_msg;
    s->fly_peers[0].len = s->fly_len;
    st = nb_hybrid_apply(s->h, s->fly_peers, s->n_clusters, &rec);
    for (uint32_t i = 1; i < s->n_clusters; i++) nb_free(s->fly_peers[i].data);
    memset(s->fly_peers, 0, sizeof s->fly_peers);
  }
  if (st != NB_OK) {
    s->failed = 1; /* the caller's buffers keep their own values: nothing was applied */
    if (s->moved) nb__ss_add_progress(s); /* local is theta_local: undo the eager start */
    return nb_error_wrap(st, "session: round %llu", (unsigned long long)s->fly_round);
  }
  nb__ss_add_progress(s);
  rec.bytes_sent = s->fly_sent;
  rec.exchange_s = s->fly_secs;
  nb__ss_figures(s, s->fly_samples, &rec, waited, hidden, 1, out);
  s->t_ready = nb_now_s();
  return NB_OK;
}

nb_status_t nb_session_finish(nb_session_t* s) {
  NB_CHECK(nb__ss_ready(s, "finish"));
  /* the final check asks a silent peer again on fresh ids until final_wait_s: each attempt
   * waits a quarter of it at most (1 s at least), so that the whole check stays within it */
  double fw = s->hc.final_wait_s;
  if (s->ft && fw > 0 && s->ftx.deadline_s > fw / 4) s->ftx.deadline_s = fw / 4 > 1 ? fw / 4 : 1;
  nb_status_t st = nb_hybrid_finish(s->h);
  if (st != NB_OK) {
    s->failed = 1;
    return nb_error_wrap(st, "session: finish");
  }
  /* fault-tolerant rounds end on theta_global (a held round may have landed in the check) */
  if (s->ft) nb__ss_scatter(s);
  return NB_OK;
}

nb_status_t nb_session_set_loss(nb_session_t* s, double loss) {
  if (!s) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  if (!isfinite(loss))
    return nb_error(NB_ERR_INVALID, "session: set_loss: the loss must be a finite number");
  s->loss = loss;
  s->have_loss = 1;
  return NB_OK;
}

uint64_t nb_session_global_hash(const nb_session_t* s) {
  return s && s->h ? nb_hybrid_global_hash(s->h) : 0;
}

static const nb__ss_tensor_t* nb__ss_find(const nb_session_t* s, const char* name) {
  for (size_t i = 0; i < s->n_tensors; i++)
    if (!strcmp(s->tensors[i].name, name)) return &s->tensors[i];
  return NULL;
}

nb_status_t nb_session_read_global(const nb_session_t* s, const char* name, float* out,
                                   size_t count) {
  if (!s || !name || !out) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  if (!s->started) return nb_error(NB_ERR_INVALID, "session: read_global before start");
  const nb__ss_tensor_t* t = nb__ss_find(s, name);
  if (!t) return nb_error(NB_ERR_NOT_FOUND, "session: no tensor '%s'", name);
  if (count != t->count)
    return nb_error(NB_ERR_INVALID, "session: tensor '%s' has %zu elements, not %zu", name,
                    t->count, count);
  /* from the hybrid, not from local: after a refused round local holds that round's theta_local
   * while theta_global is unchanged */
  const float* g = nb_hybrid_global((nb_hybrid_t*)s->h, NULL);
  memcpy(out, g + t->offset, count * sizeof(float));
  return NB_OK;
}

/* ---- checkpoints: the hybrid's round state with our tensor table as its extension ----------- */

nb_status_t nb_session_save(nb_session_t* s, const char* path) {
  NB_CHECK(nb__ss_ready(s, "save"));
  if (!path) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  nb__ss_buf_t b = {0};
  NB_CHECK(nb__ss_table_make(s, &b, 0, 1));
  nb_status_t st = nb_hybrid_save_ext(s->h, path, b.p, b.len);
  nb_free(b.p);
  return st == NB_OK ? NB_OK : nb_error_wrap(st, "session: save");
}

typedef struct {
  nb_session_t* s;
  const char* where;
} nb__ss_load_t;

/* The saved table must be ours exactly: our cluster (the residual is its own), the job's
 * settings and every tensor (name, shape, dtype, in order). */
static nb_status_t nb__ss_state_check(void* ctx, const uint8_t* ext, size_t len) {
  const nb__ss_load_t* l = ctx;
  nb_session_t* s = l->s;
  nb__ss_rd_t r = {ext, len, 0, 0};
  nb__ss_head_t hd;
  NB_CHECK(nb__ss_head_read(&r, l->where, NB__SS_STATE_VERSION, &hd));
  if (hd.idx != s->index || hd.nc != s->n_clusters)
    return nb_error(NB_ERR_CONFIG, "the state %s is cluster %u of %u's, we are %u of %u", l->where,
                    hd.idx, hd.nc, s->index, s->n_clusters);
  if (hd.lr != nb__ss_bits(s->hc.outer_lr) || hd.mu != nb__ss_bits(s->hc.outer_momentum))
    return nb_error(NB_ERR_CONFIG, "outer_lr/outer_momentum differ between us and the state %s",
                    l->where);
  NB_CHECK(nb__ss_tensors_check(s, &r, hd.nt, l->where));
  if (hd.n != s->n || hd.flags != 0 || r.at != r.len)
    return nb_error(NB_ERR_CODEC, "malformed tensor table %s", l->where);
  return NB_OK;
}

nb_status_t nb_session_load(nb_session_t* s, const char* path) {
  NB_CHECK(nb__ss_ready(s, "load"));
  if (!path) return nb_error(NB_ERR_INVALID, "session: NULL argument");
  char where[4200];
  snprintf(where, sizeof where, "in %s", path);
  nb__ss_load_t l = {s, where};
  nb_status_t st = nb_hybrid_load_ext(s->h, path, nb__ss_state_check, &l);
  if (st == NB_ERR_CODEC) st = NB_ERR_INVALID; /* a file that holds no table of ours */
  if (st != NB_OK) return nb_error_wrap(st, "session: load");
  nb__ss_scatter(s); /* the hybrid wrote theta_global into local */
  return NB_OK;
}

void nb_session_close(nb_session_t* s) {
  if (!s) return;
  /* an overlapped round never ended: wait for it (a fault-tolerant one: the hybrid does) */
  if (s->in_flight && !s->ft) nb__ss_fly_join(s);
  nb_hybrid_destroy(s->h); /* first: it may wait for an exchange in flight */
  nb_exchange_destroy(s->ex);
  nb_tls_destroy(s->tls);
  nb_free(s->tensors);
  nb_free(s->local);
  nb_free(s->at_begin);
  memset(s->secret, 0, sizeof s->secret);
  nb_free(s->progress_file);
  nb_prom_destroy(s->prom);
  nb_free(s);
}
