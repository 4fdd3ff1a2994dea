/* inter/link: multi-stream, resumable, sealed frame transfer to one peer (sender) and the Push /
 * Ping handlers that reassemble frames from any stream (receiver). The wire protocol is
 * nebula.v1.Exchange/Push (docs/link.md); one ack per chunk, in order, on the stream that carried
 * it. It does not pick peers or deadlines (inter/exchange) and does not encode frames. */
#include "inter/link.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "nebula/v1/exchange.pb-c.h"

NB_PARAM_INT(LinkStreams, "NB_LINK_STREAMS", 4, 1, 64,
             "parallel streams (TCP connections) per link")
NB_PARAM_INT(LinkChunkKib, "NB_LINK_CHUNK_KIB", 1024, 4, 65536, "plaintext KiB per frame chunk")
NB_PARAM_INT(LinkWindow, "NB_LINK_WINDOW", 8, 1, 1024, "chunks in flight per stream")
NB_PARAM_INT(LinkStallMs, "NB_LINK_STALL_MS", 15000, 100, 3600000,
             "a stream without an ack for this long is dropped and reopened")
NB_PARAM_INT(LinkProbeMaxShareX100, "NB_LINK_PROBE_SHARE_PCT", 25, 1, 100,
             "bandwidth probes take at most this percentage of the link's time")
NB_PARAM_INT(LinkProbeKib, "NB_LINK_PROBE_KIB", 256, 1, 4096,
             "bandwidth probe size in KiB (nb_link_probe_start with 0 bytes)")
NB_PARAM_INT(LinkProbeMs, "NB_LINK_PROBE_MS", 2000, 10, 3600000,
             "period of the bandwidth probe in ms (nb_link_probe_start with interval 0)")
NB_PARAM_INT(LinkProbeIdleMs, "NB_LINK_PROBE_IDLE_MS", 10000, 0, 3600000,
             "bandwidth probes only after this long without a completed send")
NB_PARAM_INT(LinkMaxFrameMb, "NB_LINK_MAX_FRAME_MB", 4096, 1, 1048576,
             "largest frame a receiver accepts, MiB")
NB_PARAM_INT(LinkChunkMs, "NB_LINK_CHUNK_MS", 1000, 50, 60000,
             "adaptive chunks: one chunk takes about this long on one stream at the link's rate")
NB_PARAM_INT(LinkChunkMinKib, "NB_LINK_CHUNK_MIN_KIB", 16, 1, 65536,
             "adaptive chunks: smallest chunk in KiB")

#define NB__LINK_BACKOFF_MIN_NS 100000000LL
/* sends of one link in progress at once whose streams nb_link_cancel reaches directly */
#define NB__LINK_MAX_SENDS 4
#define NB__LINK_BACKOFF_MAX_NS 2000000000LL
#define NB__LINK_TICK_MS 100
/* a send this large measures the rate well enough to plan chunks with (the estimator's own
 * threshold for a goodput sample) */
#define NB__LINK_RATE_MIN_BYTES ((size_t)64 << 10)
/* smaller sends are timed as probes (bytes / (time - min RTT)); below this their time is
 * mostly the round trip */
#define NB__LINK_SMALL_SAMPLE_BYTES ((size_t)4 << 10)
#define NB__LINK_SMALL_SAMPLE_S 0.1
/* A frame measures the link's rate only when it is this many bandwidth-delay products long:
 * a shorter one spends its time in TCP's slow start (a connection idle since the last round
 * starts again from its initial window), so its bytes / time reads the round trip, not the rate
 * (a 430 kB frame on a 100 Mbit/s link 25 ms away: 9-14 Mbit/s) */
#define NB__LINK_RAMP_BDPS 8.0

static void nb__copy_id(char* dst, const char* src) {
  snprintf(dst, NB_LINK_ID_MAX, "%s", src ? src : "");
}

static void nb__be64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}
static void nb__be32(uint8_t* p, uint32_t v) {
  for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

size_t nb_link_chunk_aad(uint64_t transfer_id, uint64_t frame_size, uint32_t chunk_size,
                         uint32_t chunk_count, const void* header, size_t header_len, uint8_t* buf,
                         size_t cap) {
  uint8_t fixed[28];
  memcpy(fixed, "nbx1", 4);
  nb__be64(fixed + 4, transfer_id);
  nb__be64(fixed + 12, frame_size);
  nb__be32(fixed + 20, chunk_size);
  nb__be32(fixed + 24, chunk_count);
  size_t total = sizeof fixed + header_len;
  if (buf && cap) {
    size_t n = cap < sizeof fixed ? cap : sizeof fixed;
    memcpy(buf, fixed, n);
    if (cap > sizeof fixed && header_len)
      memcpy(buf + sizeof fixed, header,
             cap - sizeof fixed < header_len ? cap - sizeof fixed : header_len);
  }
  return total;
}

uint64_t nb_link_transfer_id(uint64_t round) {
  return (round << 1) | 1u;
}

/* ==================================================================== sender */

enum { NB__CH_PENDING = 0, NB__CH_INFLIGHT = 1, NB__CH_ACKED = 2 };

struct nb_link {
  char job[NB_LINK_ID_MAX], local[NB_LINK_ID_MAX], peer[NB_LINK_ID_MAX];
  char target[256];
  nb_seal_ctx_t* seal;
  uint32_t streams, window;
  size_t chunk_bytes; /* the configured (largest) chunk */
  size_t chunk_min;   /* adaptive chunks: the smallest */
  int64_t chunk_ms;   /* adaptive chunks: target time of one chunk on one stream; 0 = fixed */
  int64_t stall_ms;
  nb_rpc_client_t** data; /* streams clients */
  nb_rpc_client_t* hb;    /* heartbeats (payload-free pings) only: never behind bulk bytes */
  nb_rpc_client_t* ctl;   /* probes (pings with payload) */
  nb_ratelimit_t* rl;
  nb_estimator_t* est;
  pthread_mutex_t mu;
  int cancelled;
  nb_rpc_stream_t** active; /* the stream each worker has open (for cancel) */
  uint64_t ping_seq;
  /* bandwidth probes (under mu): a send in progress, a probe in progress, probes started and
   * finished (a ping that overlapped one does not count as an RTT sample: it queued behind it) */
  int sending, probing;
  uint64_t probe_gen, pings_ok;
  pthread_t probe_th;
  int probe_running, probe_stop;
  pthread_cond_t probe_cv;
  size_t probe_bytes;
  int64_t probe_interval_ms;
  /* liveness (under mu): when bytes from the peer last arrived, the latest heartbeat RTT, and
   * what is in flight (the chunk of the send in progress, the payload of probes in progress) */
  int64_t last_heard_ns;
  double hb_rtt_last_s;
  double send_Bps; /* goodput of the latest completed send of at least NB__LINK_RATE_MIN_BYTES */
  double rate_hint_Bps; /* cfg->rate_hint_Bps: the rate while nothing is known */
  /* when the latest small send timed like a probe completed (0 = none): probes wait for an
   * idle link */
  int64_t send_done_ns;
  uint64_t sends_ok; /* sends completed */
  size_t send_chunk;
  size_t probe_inflight;
};

/* One transfer in progress, shared by the stream workers. */
typedef struct {
  nb_link_t* L;
  uint64_t round, tid;
  const uint8_t* frame;
  size_t len;
  size_t chunk; /* plaintext bytes per chunk of this transfer */
  uint32_t count;
  uint8_t* aad;
  size_t aad_len;
  uint64_t hash;
  int64_t deadline_ns;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint8_t* state; /* per chunk */
  uint32_t scan;  /* no pending chunk below this index */
  uint32_t acked;
  int complete;
  nb_status_t fatal;
  char fatal_msg[256];
  uint64_t sent;
  uint32_t resumed_from, reconnects;
} nb__xfer_t;

typedef struct {
  nb__xfer_t* x;
  uint32_t sid;
} nb__worker_t;

nb_status_t nb_link_create(const nb_link_config_t* cfg, nb_link_t** out) {
  if (!cfg || !out) return nb_error(NB_ERR_INVALID, "link: NULL config or out");
  *out = NULL;
  if (!cfg->job_id || !*cfg->job_id || strlen(cfg->job_id) >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "link: job_id missing or longer than %d", NB_LINK_ID_MAX - 1);
  if (!cfg->local_cluster || !*cfg->local_cluster || !cfg->peer_cluster || !*cfg->peer_cluster ||
      strlen(cfg->local_cluster) >= NB_LINK_ID_MAX || strlen(cfg->peer_cluster) >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "link: local_cluster and peer_cluster are required");
  if (!cfg->target || !*cfg->target || strlen(cfg->target) >= 256)
    return nb_error(NB_ERR_INVALID, "link to '%s': no target address", cfg->peer_cluster);
  if (!cfg->seal && !cfg->allow_unsealed)
    return nb_error(NB_ERR_INVALID, "link to '%s': no seal context (allow_unsealed not set)",
                    cfg->peer_cluster);
  if (!cfg->tls && !cfg->allow_insecure)
    return nb_error(NB_ERR_INVALID, "link to '%s': no TLS material (allow_insecure not set)",
                    cfg->peer_cluster);
  if (cfg->streams > 64) return nb_error(NB_ERR_INVALID, "link: streams %u > 64", cfg->streams);
  if (!(cfg->rate_cap_Bps >= 0) || cfg->rate_cap_Bps > 1e15)
    return nb_error(NB_ERR_INVALID, "link: rate cap must be >= 0 bytes/s and finite");
  if (!(cfg->rate_hint_Bps >= 0) || cfg->rate_hint_Bps > 1e15)
    return nb_error(NB_ERR_INVALID, "link: rate hint must be >= 0 bytes/s and finite");
  if (cfg->chunk_ms < 0 || cfg->chunk_ms > 3600000)
    return nb_error(NB_ERR_INVALID, "link to '%s': chunk_ms %lld out of [0, 3600000]",
                    cfg->peer_cluster, (long long)cfg->chunk_ms);
  nb_link_t* L = NULL;
  nb_status_t st = NB_CALLOC(L, 1, "link");
  if (st != NB_OK) return st;
  nb__copy_id(L->job, cfg->job_id);
  nb__copy_id(L->local, cfg->local_cluster);
  nb__copy_id(L->peer, cfg->peer_cluster);
  snprintf(L->target, sizeof L->target, "%s", cfg->target);
  L->seal = cfg->seal;
  L->streams = cfg->streams ? cfg->streams : (uint32_t)nb_param_LinkStreams();
  L->window = cfg->window ? cfg->window : (uint32_t)nb_param_LinkWindow();
  L->chunk_bytes = cfg->chunk_bytes ? cfg->chunk_bytes : (size_t)nb_param_LinkChunkKib() << 10;
  L->chunk_min = (size_t)nb_param_LinkChunkMinKib() << 10;
  if (L->chunk_min > L->chunk_bytes) L->chunk_min = L->chunk_bytes;
  L->chunk_ms = cfg->fixed_chunks ? 0 : cfg->chunk_ms > 0 ? cfg->chunk_ms : nb_param_LinkChunkMs();
  L->stall_ms = cfg->stall_ms > 0 ? cfg->stall_ms : nb_param_LinkStallMs();
  L->rate_hint_Bps = cfg->rate_hint_Bps;
  pthread_mutex_init(&L->mu, NULL);
  nb_cond_init_mono(&L->probe_cv);
  if (L->chunk_bytes > ((size_t)48 << 20)) {
    st = nb_error(NB_ERR_INVALID, "link: chunk of %zu bytes > 48 MiB", L->chunk_bytes);
    goto fail;
  }
  NB_CHECK_GOTO(NB_CALLOC(L->data, L->streams, "link clients"), st, fail);
  NB_CHECK_GOTO(NB_CALLOC(L->active, L->streams * NB__LINK_MAX_SENDS, "link streams"), st, fail);
  nb_rpc_client_opts_t co = {.tls = cfg->tls,
                             .allow_insecure = cfg->allow_insecure,
                             .expected_cluster = cfg->tls ? cfg->peer_cluster : NULL,
                             .server_name = cfg->server_name};
  for (uint32_t i = 0; i < L->streams; i++)
    NB_CHECK_GOTO(nb_rpc_client_create(L->target, &co, &L->data[i]), st, fail);
  NB_CHECK_GOTO(nb_rpc_client_create(L->target, &co, &L->ctl), st, fail);
  NB_CHECK_GOTO(nb_rpc_client_create(L->target, &co, &L->hb), st, fail);
  NB_CHECK_GOTO(nb_ratelimit_create(cfg->rate_cap_Bps, 0, &L->rl), st, fail);
  NB_CHECK_GOTO(nb_estimator_create(NULL, &L->est), st, fail);
  NB_INFO(WIRE,
          "link %s -> %s at %s: %u streams, chunks of %s%zu bytes%s, window %u, cap %.0f B/s%s",
          L->local, L->peer, L->target, L->streams, L->chunk_ms ? "at most " : "", L->chunk_bytes,
          L->chunk_ms ? " (adapted to the rate)" : "", L->window, cfg->rate_cap_Bps,
          L->seal ? "" : ", UNSEALED");
  *out = L;
  return NB_OK;
fail:
  nb_link_destroy(L);
  return st;
}

void nb_link_destroy(nb_link_t* L) {
  if (!L) return;
  nb_link_probe_stop(L);
  if (L->data)
    for (uint32_t i = 0; i < L->streams; i++) nb_rpc_client_destroy(L->data[i]);
  nb_rpc_client_destroy(L->ctl);
  nb_rpc_client_destroy(L->hb);
  nb_ratelimit_destroy(L->rl);
  nb_estimator_destroy(L->est);
  nb_free(L->data);
  nb_free(L->active);
  pthread_cond_destroy(&L->probe_cv);
  pthread_mutex_destroy(&L->mu);
  nb_free(L);
}

void nb_link_cancel(nb_link_t* L) {
  if (!L) return;
  pthread_mutex_lock(&L->mu);
  L->cancelled = 1;
  for (uint32_t i = 0; i < L->streams * NB__LINK_MAX_SENDS; i++)
    if (L->active[i]) nb_rpc_stream_cancel(L->active[i]);
  pthread_mutex_unlock(&L->mu);
}

void nb_link_resume(nb_link_t* L) {
  if (!L) return;
  pthread_mutex_lock(&L->mu);
  L->cancelled = 0;
  pthread_mutex_unlock(&L->mu);
}

static int nb__link_cancelled(nb_link_t* L) {
  pthread_mutex_lock(&L->mu);
  int c = L->cancelled;
  pthread_mutex_unlock(&L->mu);
  return c;
}

nb_estimator_t* nb_link_estimator(nb_link_t* L) {
  return L ? L->est : NULL;
}
const char* nb_link_peer(const nb_link_t* L) {
  return L ? L->peer : NULL;
}
const char* nb_link_target(const nb_link_t* L) {
  return L ? L->target : NULL;
}

/* Bytes from the peer arrived on this link (an ack, a ping's or a probe's reply). */
static void nb__link_heard(nb_link_t* L) {
  int64_t now = nb_now_ns();
  pthread_mutex_lock(&L->mu);
  if (now > L->last_heard_ns) L->last_heard_ns = now;
  pthread_mutex_unlock(&L->mu);
}

int64_t nb_link_last_heard_ns(nb_link_t* L) {
  if (!L) return 0;
  pthread_mutex_lock(&L->mu);
  int64_t t = L->last_heard_ns;
  pthread_mutex_unlock(&L->mu);
  return t;
}

/* The smallest of the known rates: a probe can overestimate a shaped link (a shaper's burst
 * lets it through at line rate) and the estimator mixes probes in; an underestimate only makes
 * chunks smaller and the dead timeout longer. With nothing known: the configured hint (0 if
 * none). */
double nb_link_rate_Bps(nb_link_t* L) {
  if (!L) return 0;
  nb_ratelimit_stats_t rs;
  nb_ratelimit_stats(L->rl, &rs);
  nb_estimate_t e;
  nb_estimator_get(L->est, &e);
  pthread_mutex_lock(&L->mu);
  double known[3] = {rs.rate_Bps, e.goodput_Bps, L->send_Bps};
  pthread_mutex_unlock(&L->mu);
  double r = 0;
  for (int i = 0; i < 3; i++)
    if (known[i] > 0 && (r == 0 || known[i] < r)) r = known[i];
  return r > 0 ? r : L->rate_hint_Bps;
}

int nb__link_send_measures_rate(size_t len, double nominal_Bps, double rtt_min_s) {
  if (!(nominal_Bps > 0) || !(rtt_min_s > 0)) return 1;
  return (double)len >= NB__LINK_RAMP_BDPS * nominal_Bps * rtt_min_s;
}

size_t nb__link_chunk_for_rate(double rate_Bps, uint32_t streams, int64_t chunk_ms, size_t min,
                               size_t max) {
  if (min > max) min = max;
  if (chunk_ms <= 0) return max; /* fixed chunks */
  if (!(rate_Bps > 0)) return min;
  if (streams == 0) streams = 1;
  double c = rate_Bps * (double)chunk_ms * 1e-3 / (double)streams;
  if (c >= (double)max) return max;
  size_t n = (size_t)c & ~(size_t)1023; /* whole KiB */
  return n < min ? min : n;
}

size_t nb_link_chunk_bytes(nb_link_t* L) {
  if (!L) return 0;
  return nb__link_chunk_for_rate(nb_link_rate_Bps(L), L->streams, L->chunk_ms, L->chunk_min,
                                 L->chunk_bytes);
}

void nb_link_liveness(nb_link_t* L, nb_link_liveness_t* out) {
  memset(out, 0, sizeof *out);
  if (!L) return;
  nb_estimate_t e;
  nb_estimator_get(L->est, &e);
  out->rate_Bps = nb_link_rate_Bps(L);
  pthread_mutex_lock(&L->mu);
  out->last_heard_ns = L->last_heard_ns;
  out->sending = L->sending > 0;
  out->chunk_bytes = L->sending ? L->send_chunk : 0;
  out->streams = L->streams;
  out->probe_bytes = L->probe_inflight;
  double rtt = L->hb_rtt_last_s;
  pthread_mutex_unlock(&L->mu);
  if (e.rtt_s > rtt) rtt = e.rtt_s;
  out->rtt_s = rtt;
  out->chunk_next =
      nb__link_chunk_for_rate(out->rate_Bps, L->streams, L->chunk_ms, L->chunk_min, L->chunk_bytes);
  out->seal_tag_bytes = L->seal ? NB_SEAL_TAG_BYTES : 0;
}

void nb_link_ratelimit_stats(nb_link_t* L, nb_ratelimit_stats_t* out) {
  memset(out, 0, sizeof *out);
  if (L) nb_ratelimit_stats(L->rl, out);
}

nb_status_t nb_link_set_rate_cap(nb_link_t* L, double rate_Bps) {
  if (!L) return nb_error(NB_ERR_INVALID, "link: NULL");
  return nb_ratelimit_set_rate(L->rl, rate_Bps, 0);
}

nb_status_t nb_link_ping(nb_link_t* L, int64_t timeout_ms, size_t payload_bytes, double* rtt_s) {
  if (!L) return nb_error(NB_ERR_INVALID, "link: NULL");
  if (payload_bytes > ((size_t)16 << 20))
    return nb_error(NB_ERR_INVALID, "ping payload %zu > 16 MiB", payload_bytes);
  uint8_t* pay = NULL;
  if (payload_bytes) {
    NB_CHECK(nb_calloc((void**)&pay, payload_bytes, 1, "ping payload"));
  }
  Nebula__V1__PingRequest req = NEBULA__V1__PING_REQUEST__INIT;
  pthread_mutex_lock(&L->mu);
  req.seq = ++L->ping_seq;
  uint64_t gen0 = L->probe_gen;
  int busy0 = L->probing;
  pthread_mutex_unlock(&L->mu);
  req.sent_unix_ns = nb_wall_ns();
  req.sender = L->local;
  req.payload.data = pay;
  req.payload.len = payload_bytes;
  ProtobufCMessage* resp = NULL;
  int64_t t0 = nb_now_ns();
  /* heartbeats have a connection of their own: not behind a probe's payload, nor chunks */
  nb_status_t st = nb_rpc_unary_pb(payload_bytes ? L->ctl : L->hb, NB_LINK_METHOD_PING, &req.base,
                                   &nebula__v1__ping_reply__descriptor, &resp, timeout_ms, 0);
  double rtt = (double)(nb_now_ns() - t0) * 1e-9;
  nb_free(pay);
  if (st != NB_OK) return nb_error_wrap(st, "ping %s (%s)", L->peer, L->target);
  Nebula__V1__PingReply* r = (Nebula__V1__PingReply*)resp;
  if (r->seq != req.seq || !r->responder || strcmp(r->responder, L->peer) != 0) {
    st = nb_error(NB_ERR_REMOTE, "ping %s: reply from '%s' seq %llu (expected seq %llu)", L->peer,
                  r->responder ? r->responder : "", (unsigned long long)r->seq,
                  (unsigned long long)req.seq);
  } else {
    nb__link_heard(L);
    pthread_mutex_lock(&L->mu);
    int first = payload_bytes == 0 && L->pings_ok++ == 0;
    if (payload_bytes == 0 && !first) L->hb_rtt_last_s = rtt;
    int clean = !busy0 && !L->probing && gen0 == L->probe_gen;
    pthread_mutex_unlock(&L->mu);
    if (first && payload_bytes == 0) {
      /* the first ping also opened the connection (TCP, TLS handshake): not an RTT sample;
       * measure again on the open connection */
      protobuf_c_message_free_unpacked(resp, NULL);
      return nb_link_ping(L, timeout_ms, 0, rtt_s);
    }
    if (payload_bytes == 0 && clean) nb_estimator_add_rtt(L->est, rtt > 1e-6 ? rtt : 1e-6);
    if (rtt_s) *rtt_s = rtt;
  }
  protobuf_c_message_free_unpacked(resp, NULL);
  return st;
}

nb_status_t nb_link_probe(nb_link_t* L, size_t bytes, int64_t timeout_ms, double* goodput_Bps) {
  if (goodput_Bps) *goodput_Bps = 0;
  if (!L) return nb_error(NB_ERR_INVALID, "link: NULL");
  if (bytes == 0 || bytes > ((size_t)4 << 20))
    return nb_error(NB_ERR_INVALID, "probe of %zu bytes: must be in [1, 4 MiB]", bytes);
  /* a probe on a connection still being opened would time the TCP and TLS handshakes too;
   * wait for it in slices, so that nb_link_cancel (a send's rate probe) ends the wait */
  int64_t ready_by = nb_now_ns() + (timeout_ms > 0 ? timeout_ms : 5000) * 1000000LL;
  while (nb_rpc_client_state(L->ctl, 1) != NB_RPC_READY && nb_now_ns() < ready_by) {
    if (nb__link_cancelled(L)) return nb_error(NB_ERR_CANCELLED, "probe %s: cancelled", L->peer);
    (void)nb_rpc_client_wait_ready(L->ctl, NB__LINK_TICK_MS);
  }
  pthread_mutex_lock(&L->mu);
  L->probing++;
  L->probe_gen++;
  L->probe_inflight += bytes;
  pthread_mutex_unlock(&L->mu);
  int64_t t0 = nb_now_ns();
  int64_t deadline = timeout_ms > 0 ? t0 + timeout_ms * 1000000LL : 0;
  /* the probe's bytes pass the operator's cap like data (it is part of the link) */
  nb_status_t st = deadline ? nb_ratelimit_acquire_until(L->rl, bytes, deadline)
                            : nb_ratelimit_acquire(L->rl, bytes);
  if (st == NB_OK) {
    int64_t left = deadline ? (deadline - nb_now_ns()) / 1000000 : timeout_ms;
    st = left < 1 && deadline
             ? nb_error(NB_ERR_TIMEOUT, "probe %s: no time left after the cap", L->peer)
             : nb_link_ping(L, left, bytes, NULL);
  }
  double secs = (double)(nb_now_ns() - t0) * 1e-9;
  pthread_mutex_lock(&L->mu);
  L->probing--;
  L->probe_gen++;
  L->probe_inflight -= bytes;
  pthread_mutex_unlock(&L->mu);
  if (st != NB_OK) return st;
  NB_CHECK(nb_estimator_add_probe(L->est, bytes, secs));
  nb_estimate_t e;
  nb_estimator_get(L->est, &e);
  if (goodput_Bps) *goodput_Bps = e.goodput_last_Bps;
  NB_INFO(WIRE, "link %s -> %s: probe of %zu bytes in %.3f s (min RTT %.1f ms): %.2f Mbit/s",
          L->local, L->peer, bytes, secs, e.rtt_min_s * 1e3, e.goodput_last_Bps * 8e-6);
  return NB_OK;
}

/* The probe thread: one probe every interval while no send is in progress, at most
 * NB_LINK_PROBE_SHARE_PCT of the time. */
static void* nb__probe_main(void* arg) {
  nb_link_t* L = arg;
  double share = (double)nb_param_LinkProbeMaxShareX100() / 100.0;
  int64_t due = nb_now_ns() + L->probe_interval_ms * 1000000LL;
  pthread_mutex_lock(&L->mu);
  while (!L->probe_stop) {
    int64_t now = nb_now_ns();
    if (now < due) {
      nb_cond_wait_until(&L->probe_cv, &L->mu, due);
      continue;
    }
    if (L->sending || L->cancelled) { /* data has the link: look again shortly */
      due = now + 100000000LL;
      continue;
    }
    /* small sends timed like probes (a thin link's frames) measure the link themselves; a probe
     * then only takes link time a send may need (seconds of it): probe only a link they left
     * idle for NB_LINK_PROBE_IDLE_MS. Frames of 64 KiB or more are transfer samples, which
     * count the round trip in (bytes / time) and read a fat, distant link low: the probes go
     * on beside them, as beside frames too small to measure */
    int64_t idle_ns = (int64_t)nb_param_LinkProbeIdleMs() * 1000000LL;
    if (L->send_done_ns && now - L->send_done_ns < idle_ns) {
      due = L->send_done_ns + idle_ns;
      continue;
    }
    size_t bytes = L->probe_bytes;
    int64_t interval_ns = L->probe_interval_ms * 1000000LL;
    pthread_mutex_unlock(&L->mu);
    /* a probe is one message, like a chunk: once the rate is known, no longer on a thin link
     * than an adaptive chunk (before, the full size measures it: a shaper's burst would let a
     * small probe through at line rate) */
    size_t cap = L->chunk_ms && nb_link_rate_Bps(L) > 0 ? nb_link_chunk_bytes(L) : bytes;
    if (bytes > cap) bytes = cap;
    int64_t t0 = nb_now_ns();
    nb_status_t st = nb_link_probe(L, bytes, 5000, NULL);
    int64_t took = nb_now_ns() - t0;
    if (st != NB_OK)
      NB_INFO(WIRE, "link %s -> %s: probe failed: %s", L->local, L->peer, nb_error_last());
    int64_t gap = (int64_t)((double)took / share) - took;
    due = nb_now_ns() + (gap > interval_ns ? gap : interval_ns);
    pthread_mutex_lock(&L->mu);
  }
  pthread_mutex_unlock(&L->mu);
  return NULL;
}

nb_status_t nb_link_probe_start(nb_link_t* L, size_t bytes, int64_t interval_ms) {
  if (!L) return nb_error(NB_ERR_INVALID, "link: NULL");
  if (bytes == 0) bytes = (size_t)nb_param_LinkProbeKib() << 10;
  if (interval_ms == 0) interval_ms = nb_param_LinkProbeMs();
  if (bytes == 0 || bytes > ((size_t)4 << 20))
    return nb_error(NB_ERR_INVALID, "probe of %zu bytes: must be in [1, 4 MiB]", bytes);
  if (interval_ms < 10)
    return nb_error(NB_ERR_INVALID, "probe interval %lld ms: must be >= 10",
                    (long long)interval_ms);
  pthread_mutex_lock(&L->mu);
  L->probe_bytes = bytes;
  L->probe_interval_ms = interval_ms;
  int running = L->probe_running;
  if (!running) {
    L->probe_stop = 0;
    if (pthread_create(&L->probe_th, NULL, nb__probe_main, L) != 0) {
      pthread_mutex_unlock(&L->mu);
      return nb_error(NB_ERR_SYSTEM, "link %s: cannot start the probe thread", L->peer);
    }
    L->probe_running = 1;
  }
  pthread_mutex_unlock(&L->mu);
  return NB_OK;
}

void nb_link_probe_stop(nb_link_t* L) {
  if (!L) return;
  pthread_mutex_lock(&L->mu);
  int running = L->probe_running;
  L->probe_stop = 1;
  L->probe_running = 0;
  pthread_cond_broadcast(&L->probe_cv);
  pthread_mutex_unlock(&L->mu);
  if (running) pthread_join(L->probe_th, NULL);
}

/* Sets the transfer's fatal status (first one wins) and wakes everybody. x->mu held. */
static void nb__xfer_fail(nb__xfer_t* x, nb_status_t st, const char* msg) {
  if (x->fatal == NB_OK) {
    x->fatal = st;
    snprintf(x->fatal_msg, sizeof x->fatal_msg, "%s", msg);
  }
  pthread_cond_broadcast(&x->cv);
}

/* Next pending chunk (marked in flight) or -1. x->mu held. */
static int64_t nb__xfer_take(nb__xfer_t* x) {
  for (uint32_t i = x->scan; i < x->count; i++) {
    if (x->state[i] == NB__CH_PENDING) {
      x->state[i] = NB__CH_INFLIGHT;
      x->scan = i + 1;
      return i;
    }
  }
  x->scan = x->count;
  return -1;
}

static void nb__xfer_requeue(nb__xfer_t* x, uint32_t i) {
  if (x->state[i] == NB__CH_INFLIGHT) {
    x->state[i] = NB__CH_PENDING;
    if (i < x->scan) x->scan = i;
    pthread_cond_broadcast(&x->cv);
  }
}

static void nb__xfer_ack(nb__xfer_t* x, uint32_t i) {
  if (x->state[i] != NB__CH_ACKED) {
    x->state[i] = NB__CH_ACKED;
    x->acked++;
  }
}

/* Registers an open stream for nb_link_cancel in a free slot (sends may overlap: an exchange's
 * next frame can start while the last one waits for its final ack). Returns the slot, or the
 * slot count when every slot is taken (the stream then ends by the cancel flag, at the next
 * tick). L->mu held. */
static uint32_t nb__link_track(nb_link_t* L, nb_rpc_stream_t* s) {
  uint32_t cap = L->streams * NB__LINK_MAX_SENDS;
  for (uint32_t i = 0; i < cap; i++)
    if (!L->active[i]) {
      L->active[i] = s;
      return i;
    }
  return cap;
}

static int nb__xfer_over(nb__xfer_t* x) {
  return x->complete || x->fatal != NB_OK;
}

/* Applies an ack's status. Returns 1 when the transfer is over. x->mu held. */
static int nb__xfer_status(nb__xfer_t* x, const Nebula__V1__PushAck* a) {
  char msg[256];
  switch (a->status) {
    case NEBULA__V1__PUSH_ACK__STATUS__STATUS_COMPLETE:
      x->complete = 1;
      pthread_cond_broadcast(&x->cv);
      return 1;
    case NEBULA__V1__PUSH_ACK__STATUS__STATUS_INTEGRITY:
      snprintf(msg, sizeof msg, "%s found round %llu corrupt: %s", x->L->peer,
               (unsigned long long)x->round, a->detail ? a->detail : "");
      nb__xfer_fail(x, NB_ERR_INTEGRITY, msg);
      return 1;
    case NEBULA__V1__PUSH_ACK__STATUS__STATUS_REJECTED:
      snprintf(msg, sizeof msg, "%s rejected round %llu: %s", x->L->peer,
               (unsigned long long)x->round, a->detail ? a->detail : "");
      nb__xfer_fail(x, NB_ERR_PERMISSION, msg);
      return 1;
    default:
      return 0;
  }
}

static nb_status_t nb__send_open(nb__xfer_t* x, nb_rpc_stream_t* s) {
  Nebula__V1__TransferKey key = NEBULA__V1__TRANSFER_KEY__INIT;
  key.job_id = x->L->job;
  key.sender = x->L->local;
  key.round = x->round;
  key.transfer_id = x->tid;
  Nebula__V1__PushOpen o = NEBULA__V1__PUSH_OPEN__INIT;
  o.key = &key;
  o.frame_size = x->len;
  o.chunk_size = (uint32_t)x->chunk;
  o.chunk_count = x->count;
  o.frame_hash = x->hash;
  o.frame_header.data = x->aad + 28;
  o.frame_header.len = x->aad_len - 28;
  o.sender_epoch = nb_seal_local_epoch(x->L->seal);
  Nebula__V1__PushRequest req = NEBULA__V1__PUSH_REQUEST__INIT;
  req.kind_case = NEBULA__V1__PUSH_REQUEST__KIND_OPEN;
  req.open = &o;
  return nb_rpc_stream_send_pb(s, &req.base);
}

static size_t nb__varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t* nb__varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

size_t nb__link_chunk_encode(uint8_t* out, uint64_t transfer_id, uint32_t index, uint64_t offset,
                             size_t data_len, uint32_t crc32, size_t* data_at) {
  /* PushRequest{chunk (2): PushChunk{transfer_id 1, index 2, offset 3, data 4, crc32 5}}, fields
   * in number order and zero scalars left out, as protobuf-c packs it. */
  size_t inner = (transfer_id ? 1 + nb__varint_len(transfer_id) : 0) +
                 (index ? 1 + nb__varint_len(index) : 0) +
                 (offset ? 1 + nb__varint_len(offset) : 0) + 1 + nb__varint_len(data_len) +
                 data_len + (crc32 ? 1 + nb__varint_len(crc32) : 0);
  size_t total = 1 + nb__varint_len(inner) + inner;
  if (out == NULL) return total;
  uint8_t* p = out;
  *p++ = 0x12;
  p = nb__varint(p, inner);
  if (transfer_id) {
    *p++ = 0x08;
    p = nb__varint(p, transfer_id);
  }
  if (index) {
    *p++ = 0x10;
    p = nb__varint(p, index);
  }
  if (offset) {
    *p++ = 0x18;
    p = nb__varint(p, offset);
  }
  *p++ = 0x22;
  p = nb__varint(p, data_len);
  *data_at = (size_t)(p - out);
  p += data_len;
  if (crc32) {
    *p++ = 0x28;
    p = nb__varint(p, crc32);
  }
  return total;
}

/* Seals (or copies) chunk i straight into the message that carries it and sends it on s: the
 * sealed bytes are written once, into the gRPC slice, not into a buffer of ours first. */
static nb_status_t nb__send_chunk(nb__xfer_t* x, nb_rpc_stream_t* s, uint32_t i) {
  nb_link_t* L = x->L;
  size_t off = (size_t)i * x->chunk;
  size_t n = x->len - off < x->chunk ? x->len - off : x->chunk;
  const uint8_t* data = x->frame + off;
  size_t dlen = n + (L->seal ? NB_SEAL_TAG_BYTES : 0);
  /* The crc32 guards unsealed chunks only: a sealed chunk's GCM tag is the stronger check, and
   * zlib's crc32 (about 1.4 GB/s here) is slower than AES-GCM itself. 0 = not computed. */
  uint32_t crc = L->seal ? 0 : nb_crc32(0, data, n);
  size_t at = 0;
  nb_rpc_out_t m;
  NB_CHECK(nb_rpc_out_alloc(nb__link_chunk_encode(NULL, x->tid, i, off, dlen, crc, &at), &m));
  nb__link_chunk_encode(m.data, x->tid, i, off, dlen, crc, &at);
  if (L->seal) {
    size_t w = 0;
    nb_status_t st =
        nb_seal_chunk(L->seal, x->round, i, x->aad, x->aad_len, data, n, m.data + at, &w);
    if (st == NB_OK && w != dlen)
      st = nb_error(NB_ERR_INTERNAL, "sealed chunk of %zu bytes, expected %zu", w, dlen);
    if (st != NB_OK) {
      nb_rpc_out_release(&m);
      return st;
    }
  } else {
    memcpy(m.data + at, data, n);
  }
  nb_status_t st = x->deadline_ns ? nb_ratelimit_acquire_until(L->rl, dlen, x->deadline_ns)
                                  : nb_ratelimit_acquire(L->rl, dlen);
  if (st != NB_OK) {
    nb_rpc_out_release(&m);
    return st;
  }
  return nb_rpc_stream_send_out(s, &m);
}

static nb_status_t nb__recv_ack(nb_rpc_stream_t* s, int64_t wait_ms, Nebula__V1__PushAck** out) {
  ProtobufCMessage* m = NULL;
  int end = 0;
  nb_status_t st = nb_rpc_stream_recv_pb(s, &nebula__v1__push_ack__descriptor, &m, &end, wait_ms);
  if (st != NB_OK) return st;
  if (end) return nb_error(NB_ERR_UNAVAILABLE, "Push stream ended by the receiver");
  *out = (Nebula__V1__PushAck*)m;
  return NB_OK;
}

static int64_t nb__ms_left(int64_t deadline_ns) {
  if (!deadline_ns) return NB_RPC_INFINITE;
  int64_t left = (deadline_ns - nb_now_ns()) / 1000000;
  return left > 0 ? left : 0;
}

/* The state of one open stream, shared by its sender (the worker) and its ack reader. Guarded by
 * the transfer's mutex. */
typedef struct {
  nb__xfer_t* x;
  nb_rpc_stream_t* s;
  uint32_t* fifo; /* chunks in flight on this stream, in send order */
  uint32_t nin, head, window;
  nb_status_t err; /* the stream failed (or was told to stop) */
  int64_t last_ack_ns;
  int open_pending; /* the PushOpen's ack is yet to come (a first open: chunks follow at once) */
} nb__stream_t;

/* Applies the PushOpen's ack: the transfer's status, and the chunks the receiver already holds
 * (a resumed transfer) counted as acknowledged. Returns 1 when the transfer is over. x->mu held. */
static int nb__open_acked(nb__xfer_t* x, const Nebula__V1__PushAck* a) {
  int done = nb__xfer_status(x, a);
  if (!done) {
    uint32_t next = a->next_chunk > x->count ? x->count : a->next_chunk;
    for (uint32_t i = 0; i < next; i++) nb__xfer_ack(x, i);
    if (next > x->resumed_from) x->resumed_from = next;
  }
  return done;
}

/* Reads acks until the stream fails, is cancelled, or the transfer is over. Acks arrive in the
 * order their chunks were sent, so each one retires the head of the in-flight FIFO (after the
 * PushOpen's own ack, when the stream's chunks followed the open without waiting). Reading in
 * its own thread keeps acks drained while the sender blocks in a send (gRPC delivers a failed
 * call's status only after the messages before it were read). */
static void* nb__ack_reader(void* arg) {
  nb__stream_t* st = arg;
  nb__xfer_t* x = st->x;
  for (;;) {
    Nebula__V1__PushAck* a = NULL;
    nb_status_t rc = nb__recv_ack(st->s, NB_RPC_INFINITE, &a);
    pthread_mutex_lock(&x->mu);
    if (rc != NB_OK) {
      if (st->err == NB_OK) st->err = rc;
      pthread_cond_broadcast(&x->cv);
      pthread_mutex_unlock(&x->mu);
      if (rc == NB_ERR_PERMISSION) NB_INFO(WIRE, "Push refused: %s", nb_error_last());
      break;
    }
    st->last_ack_ns = nb_now_ns();
    nb__link_heard(x->L);
    int done;
    if (st->open_pending) {
      st->open_pending = 0;
      done = nb__open_acked(x, a);
    } else {
      if (st->nin > 0) {
        nb__xfer_ack(x, st->fifo[st->head]);
        st->head = (st->head + 1) % st->window;
        st->nin--;
      }
      done = nb__xfer_status(x, a);
    }
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    protobuf_c_message_free_unpacked(&a->base, NULL);
    if (done) break;
  }
  return NULL;
}

/* One stream's life inside a transfer: (re)open, send within the window while a reader thread
 * takes the acks; on a drop requeue what is unacknowledged and reopen with backoff. */
static void* nb__worker(void* arg) {
  nb__worker_t* w = arg;
  nb__xfer_t* x = w->x;
  nb_link_t* L = x->L;
  nb__stream_t st = {.x = x, .window = L->window};
  int64_t backoff = NB__LINK_BACKOFF_MIN_NS;
  int attempts = 0;
  if (NB_CALLOC(st.fifo, L->window, "link window") != NB_OK) {
    pthread_mutex_lock(&x->mu);
    nb__xfer_fail(x, NB_ERR_NOMEM, "out of memory for a stream buffer");
    pthread_mutex_unlock(&x->mu);
    goto out;
  }
  for (;;) {
    pthread_mutex_lock(&x->mu);
    int over = nb__xfer_over(x);
    pthread_mutex_unlock(&x->mu);
    if (over || nb__link_cancelled(L)) break;
    if (x->deadline_ns && nb_now_ns() >= x->deadline_ns) break;
    if (attempts++ > 0) { /* a reopen: back off first */
      int64_t until = nb_now_ns() + backoff;
      if (x->deadline_ns && until > x->deadline_ns) until = x->deadline_ns;
      pthread_mutex_lock(&x->mu);
      x->reconnects++;
      while (!nb__xfer_over(x) && nb_now_ns() < until) nb_cond_wait_until(&x->cv, &x->mu, until);
      over = nb__xfer_over(x);
      pthread_mutex_unlock(&x->mu);
      backoff = backoff * 2 > NB__LINK_BACKOFF_MAX_NS ? NB__LINK_BACKOFF_MAX_NS : backoff * 2;
      if (over || nb__link_cancelled(L)) break;
    }
    nb_rpc_stream_t* s = NULL;
    nb_status_t rc = nb_rpc_stream_open(L->data[w->sid], NB_LINK_METHOD_PUSH,
                                        nb__ms_left(x->deadline_ns), NB_RPC_WAIT_FOR_READY, &s);
    if (rc != NB_OK) continue;
    pthread_mutex_lock(&L->mu);
    uint32_t slot = nb__link_track(L, s);
    if (L->cancelled) nb_rpc_stream_cancel(s);
    pthread_mutex_unlock(&L->mu);
    rc = nb__send_open(x, s);
    /* The stream's first open sends its chunks right behind the PushOpen (its ack, read first by
     * the reader, says what the receiver already holds: nothing, for a transfer new to it), so
     * the frame is there one way after its last byte leaves, not a round trip later. A reopen
     * waits for the ack, to resume where the receiver is. */
    int pipelined = attempts == 1;
    Nebula__V1__PushAck* a = NULL;
    /* The open's ack: also waits for the connection (wait-for-ready). */
    while (rc == NB_OK && !pipelined) {
      rc = nb__recv_ack(s, NB__LINK_TICK_MS, &a);
      if (rc != NB_ERR_TIMEOUT) break;
      rc = NB_OK;
      pthread_mutex_lock(&x->mu);
      over = nb__xfer_over(x);
      pthread_mutex_unlock(&x->mu);
      if (over || nb__link_cancelled(L))
        rc = NB_ERR_CANCELLED;
      else if (x->deadline_ns && nb_now_ns() >= x->deadline_ns)
        rc = NB_ERR_TIMEOUT;
    }
    int reader = 0;
    pthread_t rth;
    if (rc == NB_OK) {
      int done = 0;
      if (!pipelined) {
        nb__link_heard(L);
        pthread_mutex_lock(&x->mu);
        done = nb__open_acked(x, a);
        pthread_mutex_unlock(&x->mu);
        protobuf_c_message_free_unpacked(&a->base, NULL);
      }
      backoff = NB__LINK_BACKOFF_MIN_NS;
      st.s = s;
      st.nin = st.head = 0;
      st.err = NB_OK;
      st.open_pending = pipelined;
      st.last_ack_ns = nb_now_ns();
      if (!done) {
        if (pthread_create(&rth, NULL, nb__ack_reader, &st) == 0)
          reader = 1;
        else
          rc = nb_error(NB_ERR_SYSTEM, "cannot start an ack reader");
      }
    }
    pthread_mutex_lock(&x->mu);
    while (reader && rc == NB_OK) {
      if (nb__xfer_over(x) || st.err != NB_OK) break;
      if (nb__link_cancelled(L)) { /* lock order: x->mu, then L->mu */
        rc = NB_ERR_CANCELLED;
        break;
      }
      if (x->deadline_ns && nb_now_ns() >= x->deadline_ns) {
        rc = NB_ERR_TIMEOUT;
        break;
      }
      int64_t c = st.nin < st.window ? nb__xfer_take(x) : -1;
      if (c >= 0) {
        x->sent++;
        st.fifo[(st.head + st.nin) % st.window] = (uint32_t)c;
        st.nin++;
        pthread_mutex_unlock(&x->mu);
        rc = nb__send_chunk(x, s, (uint32_t)c);
        pthread_mutex_lock(&x->mu);
        continue;
      }
      /* (a pipelined open's stream may still be connecting: until its ack only the deadline
       * and a cancel end the wait, as for a waited-for open) */
      if (!st.open_pending && st.nin > 0 &&
          nb_now_ns() - st.last_ack_ns > L->stall_ms * 1000000LL) {
        NB_WARN("link %s -> %s: stream %u stalled (no ack for %lld ms): reopening", L->local,
                L->peer, w->sid, (long long)L->stall_ms);
        rc = NB_ERR_TIMEOUT;
        break;
      }
      nb_cond_wait_until(&x->cv, &x->mu, nb_now_ns() + (int64_t)NB__LINK_TICK_MS * 1000000);
    }
    if (rc == NB_OK) rc = st.err;
    int finished = nb__xfer_over(x);
    pthread_mutex_unlock(&x->mu);
    /* Stop the reader (the call is cancelled: it returns at once) and retire the stream. */
    pthread_mutex_lock(&L->mu);
    if (slot < L->streams * NB__LINK_MAX_SENDS) L->active[slot] = NULL;
    pthread_mutex_unlock(&L->mu);
    nb_rpc_stream_cancel(s);
    if (reader) pthread_join(rth, NULL);
    pthread_mutex_lock(&x->mu);
    for (uint32_t k = 0; k < st.nin; k++) nb__xfer_requeue(x, st.fifo[(st.head + k) % st.window]);
    st.nin = 0;
    finished = nb__xfer_over(x);
    pthread_mutex_unlock(&x->mu);
    if (!finished && rc != NB_OK && rc != NB_ERR_CANCELLED)
      NB_INFO(WIRE, "link %s -> %s: stream %u dropped (%s): %s", L->local, L->peer, w->sid,
              nb_status_name(rc), nb_error_last());
    if (!finished && rc == NB_ERR_PERMISSION) { /* a certificate problem is not transient */
      pthread_mutex_lock(&x->mu);
      nb__xfer_fail(x, rc, nb_error_last());
      pthread_mutex_unlock(&x->mu);
    }
    nb_rpc_stream_destroy(s);
  }
out:
  nb_free(st.fifo);
  return NULL;
}

nb_status_t nb_link_send(nb_link_t* L, uint64_t round, const void* frame, size_t len,
                         const void* frame_header, size_t header_len, int64_t deadline_ns,
                         nb_link_send_stats_t* stats) {
  if (stats) memset(stats, 0, sizeof *stats);
  if (!L || !frame || len == 0)
    return nb_error(NB_ERR_INVALID, "link send: NULL link or empty frame");
  if (header_len && !frame_header)
    return nb_error(NB_ERR_INVALID, "link send: header_len without a header");
  if (round > NB_SEAL_MAX_ROUND)
    return nb_error(NB_ERR_INVALID, "link send: round %llu does not fit the nonce",
                    (unsigned long long)round);
  if (nb__link_cancelled(L)) return nb_error(NB_ERR_CANCELLED, "link to %s is cancelled", L->peer);
  /* Adaptive chunks follow the link's rate; while it has none (no cap, nothing measured yet)
   * the smallest chunk is used: that first transfer measures the rate. A probe of the same
   * size would not (a shaper's burst lets it through at line rate). */
  size_t chunk = nb_link_chunk_bytes(L);
  uint64_t count64 = (len + chunk - 1) / chunk;
  if (count64 > UINT32_MAX)
    return nb_error(NB_ERR_INVALID, "link send: %zu bytes is too many chunks", len);
  nb__xfer_t x = {.L = L,
                  .round = round,
                  .tid = nb_link_transfer_id(round),
                  .frame = frame,
                  .len = len,
                  .chunk = chunk,
                  .count = (uint32_t)count64,
                  .deadline_ns = deadline_ns};
  nb_status_t st = NB_OK;
  pthread_t* th = NULL;
  nb__worker_t* ws = NULL;
  uint32_t started = 0;
  x.aad_len =
      nb_link_chunk_aad(x.tid, len, (uint32_t)x.chunk, x.count, frame_header, header_len, NULL, 0);
  NB_CHECK_GOTO(nb_alloc((void**)&x.aad, x.aad_len, 1, "chunk aad"), st, out);
  nb_link_chunk_aad(x.tid, len, (uint32_t)x.chunk, x.count, frame_header, header_len, x.aad,
                    x.aad_len);
  NB_CHECK_GOTO(nb_calloc((void**)&x.state, x.count, 1, "chunk states"), st, out);
  NB_CHECK_GOTO(NB_CALLOC(th, L->streams, "link threads"), st, out);
  NB_CHECK_GOTO(NB_CALLOC(ws, L->streams, "link workers"), st, out);
  x.hash = nb_xxh3_64(frame, len, 0);
  pthread_mutex_init(&x.mu, NULL);
  nb_cond_init_mono(&x.cv);
  uint32_t nstreams = L->streams < x.count ? L->streams : x.count;
  pthread_mutex_lock(&L->mu);
  L->sending++;
  L->send_chunk = x.chunk;
  pthread_mutex_unlock(&L->mu);
  int64_t t0 = nb_now_ns();
  for (; started < nstreams; started++) {
    ws[started] = (nb__worker_t){.x = &x, .sid = started};
    if (pthread_create(&th[started], NULL, nb__worker, &ws[started]) != 0) {
      pthread_mutex_lock(&x.mu);
      nb__xfer_fail(&x, NB_ERR_SYSTEM, "cannot start a stream thread");
      pthread_mutex_unlock(&x.mu);
      break;
    }
  }
  for (uint32_t i = 0; i < started; i++) pthread_join(th[i], NULL);
  double secs = (double)(nb_now_ns() - t0) * 1e-9;
  pthread_mutex_lock(&L->mu);
  L->sending--;
  pthread_mutex_unlock(&L->mu);
  if (x.complete) {
    st = NB_OK;
    /* The link's first send and one that reconnected have TCP and TLS handshakes in their
     * time: with a configured rate (cap, else hint) to cut chunks by they are no sample (the
     * first one read a 100 Mbit/s link, 25 ms away, as 9 Mbit/s and cost two rounds density);
     * without one, a low first estimate is better than none. */
    pthread_mutex_lock(&L->mu);
    int warm = L->sends_ok > 0 && x.reconnects == 0;
    L->sends_ok++;
    pthread_mutex_unlock(&L->mu);
    nb_ratelimit_stats_t rs;
    nb_ratelimit_stats(L->rl, &rs);
    double nominal = rs.rate_Bps > 0 ? rs.rate_Bps : L->rate_hint_Bps;
    nb_estimate_t e;
    nb_estimator_get(L->est, &e);
    int ramped = nb__link_send_measures_rate(len, nominal, e.rtt_min_s);
    if (secs > 0 && (warm || nominal <= 0) && ramped)
      nb_estimator_add_transfer(L->est, len, secs, nstreams);
    /* a frame too small for a transfer sample (a sparse frame on a thin link) still measures
     * the rate the way a probe does, net of the round trip, where the configured rate says it
     * takes NB__LINK_SMALL_SAMPLE_S or more (on a fast link a small frame's time is latency and
     * CPU: under load it reported a fat link as a thin one); the link then needs no probes */
    int slow = nominal > 0 && (double)len / nominal >= NB__LINK_SMALL_SAMPLE_S;
    int small = len < NB__LINK_RATE_MIN_BYTES && len >= NB__LINK_SMALL_SAMPLE_BYTES && warm && slow;
    if (secs > 0 && small) nb_estimator_add_probe(L->est, len, secs);
    pthread_mutex_lock(&L->mu);
    if (secs > 0 && len >= NB__LINK_RATE_MIN_BYTES) L->send_Bps = (double)len / secs;
    if (secs > 0 && small) L->send_done_ns = nb_now_ns();
    pthread_mutex_unlock(&L->mu);
    NB_INFO(WIRE,
            "link %s -> %s: round %llu, %zu bytes in %.3f s (%.1f Mbit/s), %u chunks of %zu "
            "bytes, %u reconnects",
            L->local, L->peer, (unsigned long long)round, len, secs, len * 8e-6 / secs, x.count,
            x.chunk, x.reconnects);
  } else if (x.fatal != NB_OK) {
    st = nb_error(x.fatal, "link %s -> %s: %s", L->local, L->peer, x.fatal_msg);
  } else if (nb__link_cancelled(L)) {
    st = nb_error(NB_ERR_CANCELLED, "link %s -> %s: round %llu cancelled (%u of %u chunks acked)",
                  L->local, L->peer, (unsigned long long)round, x.acked, x.count);
  } else {
    st = nb_error(NB_ERR_TIMEOUT,
                  "link %s -> %s (%s): round %llu missed its deadline (%u of %u chunks acked)",
                  L->local, L->peer, L->target, (unsigned long long)round, x.acked, x.count);
  }
  if (stats) {
    stats->bytes = x.complete ? len : 0;
    stats->chunks = x.count;
    stats->chunk_bytes = (uint32_t)x.chunk;
    stats->chunks_sent = x.sent;
    stats->resumed_from = x.resumed_from;
    stats->reconnects = x.reconnects;
    stats->seconds = secs;
    stats->goodput_Bps = x.complete && secs > 0 ? len / secs : 0;
  }
  pthread_cond_destroy(&x.cv);
  pthread_mutex_destroy(&x.mu);
out:
  nb_free(x.aad);
  nb_free(x.state);
  nb_free(th);
  nb_free(ws);
  return st;
}

/* ================================================================== receiver */

typedef struct nb__rx_peer {
  char id[NB_LINK_ID_MAX];
  nb_seal_ctx_t* seal;
  /* liveness, under rx->mu: the latest message from this peer, and the round it was for */
  int64_t last_heard_ns;
  uint64_t messages;
  uint64_t last_round;
  int have_round;
  struct nb__rx_peer* next;
} nb__rx_peer_t;

enum { NB__RX_RECEIVING = 0, NB__RX_COMPLETE = 1, NB__RX_TAKEN = 2, NB__RX_FAILED = 3 };

/* One (sender, round). Records live until the receiver is destroyed (a few hundred bytes each;
 * the frame itself is freed when taken), so a handler's pointer never dangles and a delivered
 * round is remembered: a replay of it is refused. */
typedef struct nb__rx_xfer {
  char sender[NB_LINK_ID_MAX];
  uint64_t round, tid, size, hash;
  uint32_t chunk_size, count, have, prefix;
  uint8_t* header;
  size_t header_len;
  uint8_t* frame;
  uint8_t* bits; /* per chunk: NB__CH_MISSING, _OPENING or _HELD */
  int state;
  int openers; /* handlers opening a chunk straight into frame, outside the lock */
  char fail_msg[200];
  struct nb__rx_xfer* next;
} nb__rx_xfer_t;

/* A sealed chunk is opened straight into its place in the frame, outside the receiver's lock:
 * the handler first claims the chunk (OPENING), so no other stream writes that region, and the
 * frame is not freed while anyone is opening into it. Only a chunk whose tag verified becomes
 * HELD; a failed one leaves zeros (nb_open_chunk clears its output) and fails the transfer. */
enum { NB__CH_MISSING = 0, NB__CH_OPENING = 1, NB__CH_HELD = 2 };

/* Marks x failed (under rx->mu) and frees its frame unless a handler is still opening into it
 * (the last one frees it then). */
static void nb__rx_fail_locked(nb_link_rx_t* rx, nb__rx_xfer_t* x, const char* msg);

/* How long a transfer from a sender not (yet) among the receiver's peers waits for
 * nb_link_rx_add_peer before it is refused (the exchange's authorisation waits as long for a
 * certificate's cluster; docs/link.md): well under the dead timeout's floor, so that a cluster
 * that is no peer hears "unknown sender", not silence. */
#define NB__RX_PEER_WAIT_NS 500000000LL

struct nb_link_rx {
  char job[NB_LINK_ID_MAX], local[NB_LINK_ID_MAX];
  int allow_plaintext, allow_unsealed;
  uint64_t max_frame;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int cancelled;
  nb__rx_peer_t* peers;
  nb__rx_xfer_t* xfers;
  nb_link_rx_stats_t stats;
};

static void nb__rx_fail_locked(nb_link_rx_t* rx, nb__rx_xfer_t* x, const char* msg) {
  if (x->state == NB__RX_RECEIVING) {
    x->state = NB__RX_FAILED;
    snprintf(x->fail_msg, sizeof x->fail_msg, "%s", msg);
  }
  if (x->state == NB__RX_FAILED && x->openers == 0) {
    nb_free(x->frame);
    x->frame = NULL;
  }
  pthread_cond_broadcast(&rx->cv);
}

nb_status_t nb_link_rx_create(const nb_link_rx_config_t* cfg, nb_link_rx_t** out) {
  if (!cfg || !out) return nb_error(NB_ERR_INVALID, "link rx: NULL config or out");
  *out = NULL;
  if (!cfg->job_id || !*cfg->job_id || strlen(cfg->job_id) >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "link rx: job_id missing or too long");
  if (!cfg->local_cluster || !*cfg->local_cluster || strlen(cfg->local_cluster) >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "link rx: local_cluster missing or too long");
  nb_link_rx_t* rx = NULL;
  NB_CHECK(NB_CALLOC(rx, 1, "link receiver"));
  nb__copy_id(rx->job, cfg->job_id);
  nb__copy_id(rx->local, cfg->local_cluster);
  rx->allow_plaintext = cfg->allow_plaintext;
  rx->allow_unsealed = cfg->allow_unsealed;
  rx->max_frame =
      cfg->max_frame_bytes ? cfg->max_frame_bytes : (uint64_t)nb_param_LinkMaxFrameMb() << 20;
  pthread_mutex_init(&rx->mu, NULL);
  nb_cond_init_mono(&rx->cv);
  *out = rx;
  return NB_OK;
}

void nb_link_rx_destroy(nb_link_rx_t* rx) {
  if (!rx) return;
  for (nb__rx_peer_t* p = rx->peers; p;) {
    nb__rx_peer_t* n = p->next;
    nb_free(p);
    p = n;
  }
  for (nb__rx_xfer_t* x = rx->xfers; x;) {
    nb__rx_xfer_t* n = x->next;
    nb_free(x->frame);
    nb_free(x->bits);
    nb_free(x->header);
    nb_free(x);
    x = n;
  }
  pthread_cond_destroy(&rx->cv);
  pthread_mutex_destroy(&rx->mu);
  nb_free(rx);
}

nb_status_t nb_link_rx_add_peer(nb_link_rx_t* rx, const char* peer, nb_seal_ctx_t* seal) {
  if (!rx || !peer || !*peer || strlen(peer) >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "link rx: bad peer id");
  if (!seal && !rx->allow_unsealed)
    return nb_error(NB_ERR_INVALID,
                    "link rx: peer '%s' without a seal context (allow_unsealed "
                    "not set)",
                    peer);
  nb_status_t st = NB_OK;
  pthread_mutex_lock(&rx->mu);
  for (nb__rx_peer_t* p = rx->peers; p; p = p->next)
    if (strcmp(p->id, peer) == 0) st = nb_error(NB_ERR_EXISTS, "link rx: peer '%s' twice", peer);
  nb__rx_peer_t* p = NULL;
  if (st == NB_OK && (st = NB_CALLOC(p, 1, "link rx peer")) == NB_OK) {
    nb__copy_id(p->id, peer);
    p->seal = seal;
    p->next = rx->peers;
    rx->peers = p;
    pthread_cond_broadcast(&rx->cv); /* a transfer from it may wait in nb__rx_open */
  }
  pthread_mutex_unlock(&rx->mu);
  return st;
}

void nb_link_rx_cancel(nb_link_rx_t* rx) {
  if (!rx) return;
  pthread_mutex_lock(&rx->mu);
  rx->cancelled = 1;
  pthread_cond_broadcast(&rx->cv);
  pthread_mutex_unlock(&rx->mu);
}

void nb_link_rx_stats(nb_link_rx_t* rx, nb_link_rx_stats_t* out) {
  pthread_mutex_lock(&rx->mu);
  *out = rx->stats;
  pthread_mutex_unlock(&rx->mu);
}

static nb__rx_xfer_t* nb__rx_find(nb_link_rx_t* rx, const char* sender, uint64_t round) {
  for (nb__rx_xfer_t* x = rx->xfers; x; x = x->next)
    if (x->round == round && strcmp(x->sender, sender) == 0) return x;
  return NULL;
}

/* A message from peer p arrived (for transfer round `round` when has_round). */
static void nb__rx_heard(nb_link_rx_t* rx, nb__rx_peer_t* p, int has_round, uint64_t round) {
  if (!p) return;
  int64_t now = nb_now_ns();
  pthread_mutex_lock(&rx->mu);
  if (now > p->last_heard_ns) p->last_heard_ns = now;
  p->messages++;
  if (has_round) {
    p->last_round = round;
    p->have_round = 1;
  }
  pthread_mutex_unlock(&rx->mu);
}

static nb__rx_peer_t* nb__rx_peer_find(nb_link_rx_t* rx, const char* id) {
  nb__rx_peer_t* found = NULL;
  pthread_mutex_lock(&rx->mu);
  for (nb__rx_peer_t* p = rx->peers; p; p = p->next)
    if (strcmp(p->id, id) == 0) found = p;
  pthread_mutex_unlock(&rx->mu);
  return found;
}

nb_status_t nb_link_rx_peer(nb_link_rx_t* rx, const char* peer, nb_link_rx_peer_t* out) {
  if (!rx || !peer || !out) return nb_error(NB_ERR_INVALID, "link rx peer: NULL");
  memset(out, 0, sizeof *out);
  nb_status_t st = NB_ERR_NOT_FOUND; /* the message only when so: a lookup must not overwrite a
                                        caller's last error with a failure that did not happen */
  pthread_mutex_lock(&rx->mu);
  for (nb__rx_peer_t* p = rx->peers; p; p = p->next) {
    if (strcmp(p->id, peer) != 0) continue;
    out->last_heard_ns = p->last_heard_ns;
    out->messages = p->messages;
    nb__rx_xfer_t* x = p->have_round ? nb__rx_find(rx, peer, p->last_round) : NULL;
    if (x && x->state == NB__RX_RECEIVING) out->chunk_bytes = x->chunk_size;
    st = NB_OK;
  }
  pthread_mutex_unlock(&rx->mu);
  if (st != NB_OK) return nb_error(st, "link rx: '%.64s' is not a peer", peer);
  return st;
}

uint64_t nb_link_rx_newest(nb_link_rx_t* rx, const char* sender) {
  if (!rx || !sender) return 0;
  uint64_t newest = 0;
  pthread_mutex_lock(&rx->mu);
  for (nb__rx_xfer_t* x = rx->xfers; x; x = x->next)
    if (x->round > newest && strcmp(x->sender, sender) == 0) newest = x->round;
  pthread_mutex_unlock(&rx->mu);
  return newest;
}

nb_status_t nb_link_rx_take(nb_link_rx_t* rx, const char* sender, uint64_t round,
                            int64_t deadline_ns, uint8_t** frame, size_t* len) {
  if (!rx || !sender || !frame || !len) return nb_error(NB_ERR_INVALID, "link rx take: NULL");
  *frame = NULL;
  *len = 0;
  nb_status_t st;
  pthread_mutex_lock(&rx->mu);
  for (;;) {
    nb__rx_xfer_t* x = nb__rx_find(rx, sender, round);
    if (x && x->state == NB__RX_COMPLETE) {
      *frame = x->frame;
      *len = x->size;
      x->frame = NULL;
      nb_free(x->bits);
      x->bits = NULL;
      x->state = NB__RX_TAKEN;
      st = NB_OK;
      break;
    }
    if (x && x->state == NB__RX_TAKEN) {
      st = nb_error(NB_ERR_NOT_FOUND, "round %llu from %s was already taken",
                    (unsigned long long)round, sender);
      break;
    }
    if (x && x->state == NB__RX_FAILED) {
      st = nb_error(NB_ERR_INTEGRITY, "round %llu from %s: %s", (unsigned long long)round, sender,
                    x->fail_msg);
      break;
    }
    if (rx->cancelled) {
      st = nb_error(NB_ERR_CANCELLED, "receiver shut down");
      break;
    }
    if (deadline_ns == 0 || nb_now_ns() >= deadline_ns) {
      st = nb_error(NB_ERR_TIMEOUT, "round %llu from %s: %s", (unsigned long long)round, sender,
                    x ? "incomplete" : "not started");
      break;
    }
    nb_cond_wait_until(&rx->cv, &rx->mu, deadline_ns);
  }
  pthread_mutex_unlock(&rx->mu);
  return st;
}

static nb_status_t nb__rx_ack(nb_rpc_call_t* call, uint64_t tid, uint32_t next, int status,
                              const char* detail) {
  Nebula__V1__PushAck ack = NEBULA__V1__PUSH_ACK__INIT;
  ack.transfer_id = tid;
  ack.next_chunk = next;
  ack.status = (Nebula__V1__PushAck__Status)status;
  ack.detail = (char*)(detail ? detail : "");
  return nb_rpc_call_send_pb(call, &ack.base);
}

#define NB__ST_OK NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK
#define NB__ST_COMPLETE NEBULA__V1__PUSH_ACK__STATUS__STATUS_COMPLETE
#define NB__ST_REJECTED NEBULA__V1__PUSH_ACK__STATUS__STATUS_REJECTED
#define NB__ST_INTEGRITY NEBULA__V1__PUSH_ACK__STATUS__STATUS_INTEGRITY

/* Handler state of one Push call. */
typedef struct {
  nb_link_rx_t* rx;
  nb_rpc_call_t* call;
  nb__rx_peer_t* peer; /* the sender, once a PushOpen named a known one */
  nb__rx_xfer_t* cur;  /* the transfer opened on this call */
  nb_seal_ctx_t* seal;
  uint8_t* aad;
  size_t aad_len;
} nb__rx_call_t;

/* Refuses: acks REJECTED with the reason and ends the call with `st`. */
static nb_status_t nb__rx_refuse(nb__rx_call_t* c, uint64_t tid, nb_status_t st, int status,
                                 const char* fmt, ...) __attribute__((format(printf, 5, 6)));
static nb_status_t nb__rx_refuse(nb__rx_call_t* c, uint64_t tid, nb_status_t st, int status,
                                 const char* fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&c->rx->mu);
  if (status == NB__ST_INTEGRITY)
    c->rx->stats.integrity_failures++;
  else
    c->rx->stats.rejected++;
  pthread_mutex_unlock(&c->rx->mu);
  NB_WARN("exchange receiver %s: %s (caller %s)", c->rx->local, msg,
          nb_rpc_call_peer_address(c->call));
  nb__rx_ack(c->call, tid, 0, status, msg);
  return nb_error(st, "%s", msg);
}

/* The sender's sealing epoch of a PushOpen: a newer one than we hold is a restarted sender
 * (a resumed or rejoined cluster), whose key we derive now (nb_seal_set_peer_epoch; two streams
 * may announce it at once, the second finds it set); an older one is a stale incarnation or a
 * replay, refused. */
static nb_status_t nb__rx_epoch(nb__rx_call_t* c, nb__rx_peer_t* peer, uint32_t epoch,
                                uint64_t tid) {
  if (!peer->seal) return NB_OK;
  uint32_t cur = nb_seal_peer_epoch(peer->seal);
  if (epoch > cur && nb_seal_set_peer_epoch(peer->seal, epoch) != NB_OK)
    cur = nb_seal_peer_epoch(peer->seal);
  else if (epoch > cur)
    cur = epoch;
  if (epoch != cur)
    return nb__rx_refuse(c, tid, NB_ERR_PERMISSION, NB__ST_REJECTED,
                         "sender '%s' seals with epoch %u, older than its current %u", peer->id,
                         epoch, cur);
  return NB_OK;
}

static nb_status_t nb__rx_open(nb__rx_call_t* c, const Nebula__V1__PushOpen* o) {
  nb_link_rx_t* rx = c->rx;
  const Nebula__V1__TransferKey* k = o->key;
  if (!k || !k->sender || !k->job_id)
    return nb__rx_refuse(c, 0, NB_ERR_INVALID, NB__ST_REJECTED, "PushOpen without a key");
  if (strcmp(k->job_id, rx->job) != 0)
    return nb__rx_refuse(c, k->transfer_id, NB_ERR_PERMISSION, NB__ST_REJECTED,
                         "transfer for job '%.64s', this is job '%s'", k->job_id, rx->job);
  const nb_tls_peer_t* who = nb_rpc_call_peer(c->call);
  if (who && who->kind != NB_TLS_PEER_NONE) {
    if (who->kind != NB_TLS_PEER_CLUSTER || strcmp(who->name, k->sender) != 0)
      return nb__rx_refuse(c, k->transfer_id, NB_ERR_PERMISSION, NB__ST_REJECTED,
                           "sender '%.64s' but the certificate says '%s'", k->sender, who->name);
  } else if (!rx->allow_plaintext) {
    return nb__rx_refuse(c, k->transfer_id, NB_ERR_PERMISSION, NB__ST_REJECTED,
                         "caller without a certificate");
  }
  /* A sender not (yet) among our peers is waited for a while: our server answers from the
   * exchange's creation on and the peers are added after it, so a peer whose process started
   * first can open a transfer in between (seen under load on plaintext links, which have no
   * certificate for the exchange's authorisation to wait on) */
  nb__rx_peer_t* peer = NULL;
  int64_t until = nb_now_ns() + NB__RX_PEER_WAIT_NS;
  pthread_mutex_lock(&rx->mu);
  for (;;) {
    for (nb__rx_peer_t* p = rx->peers; p; p = p->next)
      if (strcmp(p->id, k->sender) == 0) peer = p;
    if (peer || rx->cancelled || nb_now_ns() >= until) break;
    nb_cond_wait_until(&rx->cv, &rx->mu, until);
  }
  pthread_mutex_unlock(&rx->mu);
  if (!peer)
    return nb__rx_refuse(c, k->transfer_id, NB_ERR_PERMISSION, NB__ST_REJECTED,
                         "unknown sender '%.64s'", k->sender);
  c->peer = peer; /* its identity was checked above */
  nb__rx_heard(rx, peer, 1, k->round);
  if (o->chunk_size == 0 || o->chunk_size > (48u << 20) || o->frame_size == 0 ||
      o->frame_size > rx->max_frame ||
      o->chunk_count != (o->frame_size + o->chunk_size - 1) / o->chunk_size ||
      k->round > NB_SEAL_MAX_ROUND || o->frame_header.len > 65536)
    return nb__rx_refuse(c, k->transfer_id, NB_ERR_INVALID, NB__ST_REJECTED,
                         "bad transfer shape: %llu bytes in %u chunks of %u (limit %llu bytes)",
                         (unsigned long long)o->frame_size, o->chunk_count, o->chunk_size,
                         (unsigned long long)rx->max_frame);
  NB_CHECK(nb__rx_epoch(c, peer, o->sender_epoch, k->transfer_id));
  nb_status_t st = NB_OK;
  int status = NB__ST_OK;
  uint32_t next = 0;
  char why[256] = "";
  pthread_mutex_lock(&rx->mu);
  rx->stats.opens++;
  nb__rx_xfer_t* x = nb__rx_find(rx, k->sender, k->round);
  if (!x) {
    if ((st = NB_CALLOC(x, 1, "transfer")) == NB_OK &&
        (st = nb_alloc((void**)&x->frame, o->frame_size, 1, "received frame")) == NB_OK &&
        (st = nb_calloc((void**)&x->bits, o->chunk_count, 1, "chunk bitmap")) == NB_OK &&
        (o->frame_header.len == 0 ||
         (st = nb_alloc((void**)&x->header, o->frame_header.len, 1, "frame header")) == NB_OK)) {
      nb__copy_id(x->sender, k->sender);
      x->round = k->round;
      x->tid = k->transfer_id;
      x->size = o->frame_size;
      x->hash = o->frame_hash;
      x->chunk_size = o->chunk_size;
      x->count = o->chunk_count;
      x->header_len = o->frame_header.len;
      if (x->header_len) memcpy(x->header, o->frame_header.data, x->header_len);
      x->next = rx->xfers;
      rx->xfers = x;
    } else if (x) {
      nb_free(x->frame);
      nb_free(x->bits);
      nb_free(x);
      x = NULL;
    }
  } else if (x->tid != k->transfer_id || x->size != o->frame_size ||
             x->chunk_size != o->chunk_size || x->hash != o->frame_hash ||
             x->header_len != o->frame_header.len ||
             (x->header_len && memcmp(x->header, o->frame_header.data, x->header_len) != 0)) {
    status = NB__ST_REJECTED;
    snprintf(why, sizeof why, "round %llu from %s already has another transfer",
             (unsigned long long)k->round, k->sender);
  } else if (x->state == NB__RX_TAKEN) {
    /* The very transfer again after it was delivered: the sender's stream lost the last ack
     * (a reconnect under load) and it resumes. It is told the transfer is complete, as its
     * chunks would be; nothing is delivered twice (the frame is gone, take finds nothing). */
    status = NB__ST_COMPLETE;
    next = x->count;
  } else if (x->state == NB__RX_FAILED) {
    status = NB__ST_INTEGRITY;
    snprintf(why, sizeof why, "%s", x->fail_msg);
  } else if (x->state == NB__RX_COMPLETE) {
    status = NB__ST_COMPLETE;
    next = x->count;
  } else {
    next = x->prefix;
  }
  pthread_mutex_unlock(&rx->mu);
  if (st != NB_OK) return st;
  if (status == NB__ST_REJECTED)
    return nb__rx_refuse(c, k->transfer_id, NB_ERR_PERMISSION, status, "%s", why);
  if (status == NB__ST_INTEGRITY)
    return nb__rx_refuse(c, k->transfer_id, NB_ERR_INTEGRITY, status, "%s", why);
  c->cur = x;
  c->seal = peer->seal;
  size_t need = nb_link_chunk_aad(x->tid, x->size, x->chunk_size, x->count, NULL,
                                  o->frame_header.len, NULL, 0);
  nb_free(c->aad);
  c->aad = NULL;
  NB_CHECK(nb_alloc((void**)&c->aad, need, 1, "chunk aad"));
  c->aad_len = nb_link_chunk_aad(x->tid, x->size, x->chunk_size, x->count, o->frame_header.data,
                                 o->frame_header.len, c->aad, need);
  return nb__rx_ack(c->call, x->tid, next, status, NULL);
}

static nb_status_t nb__rx_chunk(nb__rx_call_t* c, const Nebula__V1__PushChunk* ch) {
  nb_link_rx_t* rx = c->rx;
  nb__rx_xfer_t* x = c->cur;
  if (x) nb__rx_heard(rx, c->peer, 1, x->round);
  if (!x || ch->transfer_id != x->tid)
    return nb__rx_refuse(c, ch->transfer_id, NB_ERR_INVALID, NB__ST_REJECTED,
                         "chunk of transfer %llu without its PushOpen on this stream",
                         (unsigned long long)ch->transfer_id);
  if (ch->index >= x->count || ch->offset != (uint64_t)ch->index * x->chunk_size)
    return nb__rx_refuse(c, x->tid, NB_ERR_INVALID, NB__ST_REJECTED,
                         "chunk %u at offset %llu does not fit %u chunks of %u", ch->index,
                         (unsigned long long)ch->offset, x->count, x->chunk_size);
  uint64_t plain = x->size - ch->offset < x->chunk_size ? x->size - ch->offset : x->chunk_size;
  uint64_t want = plain + (c->seal ? NB_SEAL_TAG_BYTES : 0);
  if (ch->data.len != want || (!c->seal && nb_crc32(0, ch->data.data, ch->data.len) != ch->crc32))
    return nb__rx_refuse(c, x->tid, NB_ERR_INTEGRITY, NB__ST_INTEGRITY,
                         "chunk %u of round %llu from %s: %s", ch->index,
                         (unsigned long long)x->round, x->sender,
                         ch->data.len != want ? "wrong length" : "crc32 mismatch");
  /* A chunk we already hold or another stream is opening (a resend after a dropped stream):
   * acknowledge and drop it. Otherwise claim it. */
  pthread_mutex_lock(&rx->mu);
  int state = x->state;
  int dup = state == NB__RX_RECEIVING && x->bits[ch->index] != NB__CH_MISSING;
  uint32_t next = x->prefix;
  uint8_t* dst = NULL;
  if (dup) rx->stats.duplicates++;
  if (!dup && state == NB__RX_RECEIVING && c->seal) {
    x->bits[ch->index] = NB__CH_OPENING;
    x->openers++;
    dst = x->frame + ch->offset;
  }
  pthread_mutex_unlock(&rx->mu);
  if (state == NB__RX_COMPLETE || state == NB__RX_TAKEN)
    return nb__rx_ack(c->call, x->tid, x->count, NB__ST_COMPLETE, NULL);
  if (state == NB__RX_FAILED)
    return nb__rx_refuse(c, x->tid, NB_ERR_INTEGRITY, NB__ST_INTEGRITY, "%s", x->fail_msg);
  if (dup) return nb__rx_ack(c->call, x->tid, next, NB__ST_OK, NULL);
  if (c->seal) {
    size_t out_len = 0;
    nb_status_t st = nb_open_chunk(c->seal, x->round, ch->index, c->aad, c->aad_len, ch->data.data,
                                   ch->data.len, dst, &out_len);
    char msg[200] = "";
    pthread_mutex_lock(&rx->mu);
    x->openers--;
    if (st == NB_OK && out_len == plain) {
      x->bits[ch->index] = NB__CH_HELD;
    } else {
      x->bits[ch->index] = NB__CH_MISSING;
      if (st == NB_OK) st = NB_ERR_INTEGRITY; /* cannot happen: the length was checked */
      if (st != NB_ERR_EXISTS) {
        snprintf(msg, sizeof msg, "chunk %u of round %llu from %s failed to open: %s", ch->index,
                 (unsigned long long)x->round, x->sender, nb_status_name(st));
        nb__rx_fail_locked(rx, x, msg);
      } else if (x->state == NB__RX_FAILED) {
        nb__rx_fail_locked(rx, x, ""); /* frees the frame if we were the last opener */
      }
    }
    pthread_mutex_unlock(&rx->mu);
    if (st == NB_ERR_EXISTS)
      return nb__rx_refuse(c, x->tid, NB_ERR_PERMISSION, NB__ST_REJECTED,
                           "chunk %u of round %llu from %s is a replay", ch->index,
                           (unsigned long long)x->round, x->sender);
    if (st != NB_OK)
      return nb__rx_refuse(c, x->tid, st == NB_ERR_INTEGRITY ? NB_ERR_INTEGRITY : st,
                           NB__ST_INTEGRITY, "%s", msg);
  }
  int status = NB__ST_OK;
  pthread_mutex_lock(&rx->mu);
  int fresh = 0;
  if (c->seal) {
    /* opened above; the transfer may have failed meanwhile on another stream */
    fresh = x->state == NB__RX_RECEIVING;
    if (!fresh) nb__rx_fail_locked(rx, x, "");
  } else if (x->state == NB__RX_RECEIVING && x->bits[ch->index] == NB__CH_MISSING) {
    memcpy(x->frame + ch->offset, ch->data.data, plain);
    x->bits[ch->index] = NB__CH_HELD;
    fresh = 1;
  }
  if (fresh) {
    x->have++;
    rx->stats.chunks++;
    while (x->prefix < x->count && x->bits[x->prefix] == NB__CH_HELD) x->prefix++;
    if (x->have == x->count) { /* every chunk HELD: nobody is opening into the frame */
      if (nb_xxh3_64(x->frame, x->size, 0) == x->hash) {
        x->state = NB__RX_COMPLETE;
        rx->stats.frames++;
        pthread_cond_broadcast(&rx->cv);
      } else {
        nb__rx_fail_locked(rx, x, "frame hash mismatch after reassembly");
      }
    }
  }
  state = x->state;
  next = x->prefix;
  pthread_mutex_unlock(&rx->mu);
  if (state == NB__RX_FAILED)
    return nb__rx_refuse(c, x->tid, NB_ERR_INTEGRITY, NB__ST_INTEGRITY, "round %llu from %s: %s",
                         (unsigned long long)x->round, x->sender, x->fail_msg);
  if (state == NB__RX_COMPLETE || state == NB__RX_TAKEN) status = NB__ST_COMPLETE;
  return nb__rx_ack(c->call, x->tid, status == NB__ST_COMPLETE ? x->count : next, status, NULL);
}

static nb_status_t nb__rx_push(nb_rpc_call_t* call, void* user) {
  nb__rx_call_t c = {.rx = user, .call = call};
  nb_status_t st = NB_OK;
  for (;;) {
    ProtobufCMessage* in = NULL;
    int end = 0;
    st = nb_rpc_call_recv_pb(call, &nebula__v1__push_request__descriptor, &in, &end,
                             NB_RPC_INFINITE);
    if (st != NB_OK || end) break;
    Nebula__V1__PushRequest* req = (Nebula__V1__PushRequest*)in;
    if (req->kind_case == NEBULA__V1__PUSH_REQUEST__KIND_OPEN)
      st = nb__rx_open(&c, req->open);
    else if (req->kind_case == NEBULA__V1__PUSH_REQUEST__KIND_CHUNK)
      st = nb__rx_chunk(&c, req->chunk);
    else
      st = nb_error(NB_ERR_INVALID, "PushRequest without open or chunk");
    protobuf_c_message_free_unpacked(in, NULL);
    if (st != NB_OK) break;
  }
  nb_free(c.aad);
  return st;
}

static nb_status_t nb__rx_ping(nb_rpc_call_t* call, void* user) {
  nb_link_rx_t* rx = user;
  ProtobufCMessage* in = NULL;
  int end = 0;
  NB_CHECK(
      nb_rpc_call_recv_pb(call, &nebula__v1__ping_request__descriptor, &in, &end, NB_RPC_INFINITE));
  if (end) return nb_error(NB_ERR_INVALID, "Ping without a request");
  Nebula__V1__PingRequest* q = (Nebula__V1__PingRequest*)in;
  if (q->sender && *q->sender) { /* a peer's ping is news of it, if it is who it says */
    const nb_tls_peer_t* who = nb_rpc_call_peer(call);
    int verified = who && who->kind != NB_TLS_PEER_NONE;
    if (!verified || (who->kind == NB_TLS_PEER_CLUSTER && strcmp(who->name, q->sender) == 0))
      nb__rx_heard(rx, nb__rx_peer_find(rx, q->sender), 0, 0);
  }
  Nebula__V1__PingReply r = NEBULA__V1__PING_REPLY__INIT;
  r.seq = q->seq;
  r.echo_sent_unix_ns = q->sent_unix_ns;
  r.recv_unix_ns = nb_wall_ns();
  r.responder = rx->local;
  r.payload_size_seen = (uint32_t)q->payload.len;
  uint8_t* pay = NULL;
  nb_status_t st = NB_OK;
  if (q->reply_size > (16u << 20)) {
    st = nb_error(NB_ERR_INVALID, "Ping reply_size %u > 16 MiB", q->reply_size);
  } else if (q->reply_size) {
    st = nb_calloc((void**)&pay, q->reply_size, 1, "ping reply");
    r.payload.data = pay;
    r.payload.len = q->reply_size;
  }
  if (st == NB_OK) st = nb_rpc_call_send_pb(call, &r.base);
  nb_free(pay);
  protobuf_c_message_free_unpacked(in, NULL);
  return st;
}

nb_status_t nb_link_rx_register(nb_link_rx_t* rx, nb_rpc_server_t* srv) {
  if (!rx || !srv) return nb_error(NB_ERR_INVALID, "link rx register: NULL");
  NB_CHECK(nb_rpc_server_add_method(srv, NB_LINK_METHOD_PUSH, NB_RPC_BIDI, nb__rx_push, rx));
  return nb_rpc_server_add_method(srv, NB_LINK_METHOD_PING, NB_RPC_UNARY, nb__rx_ping, rx);
}
