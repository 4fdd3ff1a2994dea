/* inter/exchange: the per-round exchange of one cluster leader with its K-1 peers: server
 * (inter/link receiver), a link and a heartbeat thread per peer, and the round driver that sends
 * to everyone and collects everyone's frame under a deadline. It does not retry a round or decide
 * what a missing peer means for training (the trainer does). */
#include "inter/exchange.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "common/common.h"
#include "nebula/v1/exchange.pb-c.h"

#define NB__EX_METHOD_PULL "/nebula.v1.Exchange/Pull"
#define NB__EX_PULL_CHUNK ((size_t)1 << 20)
/* what one heartbeat costs on the wire, both ways (gRPC unary Ping over TLS: HTTP/2 frames, TLS
 * records, TCP/IP headers and ACKs), for the Ping period on a thin link */
#define NB__EX_HB_WIRE_BYTES 600
/* nb_exchange_destroy waits this long at most for the sends early rounds left running */
#define NB__EX_FLUSH_NS 10000000000LL

NB_PARAM_INT(ExchangeHeartbeatMs, "NB_EXCHANGE_HEARTBEAT_MS", 250, 20, 60000,
             "Ping period of the exchange heartbeat per peer")
NB_PARAM_INT(ExchangeHeartbeatSharePct, "NB_EXCHANGE_HEARTBEAT_SHARE_PCT", 2, 1, 100,
             "heartbeats take at most this percentage of the link's rate: on a thin link the "
             "Ping period grows beyond NB_EXCHANGE_HEARTBEAT_MS")
NB_PARAM_INT(ExchangeDeadMs, "NB_EXCHANGE_DEAD_MS", 2000, 100, 600000,
             "floor of the dead timeout: a peer not heard from for this long (or the timeout "
             "derived from RTT, rate and chunk size, if longer) is reported dead")
NB_PARAM_INT(ExchangeDeadRtts, "NB_EXCHANGE_DEAD_RTTS", 4, 1, 100,
             "derived dead timeout: RTTs it allows (the RTT measured with queueing)")
NB_PARAM_INT(ExchangeDeadChunks, "NB_EXCHANGE_DEAD_CHUNKS", 2, 0, 100,
             "derived dead timeout: chunk times it allows (a chunk per stream at the link's rate)")

typedef struct {
  struct nb_exchange* ex;
  char id[NB_LINK_ID_MAX];
  char target[256];
  nb_seal_ctx_t* seal;
  nb_link_t* link;
  pthread_t hb;
  int hb_started;
  int64_t last_ok_ns;   /* under ex->mu: the latest heartbeat answer (add_peer to start) */
  int64_t pull_ns;      /* under ex->mu: the latest Pull request from it */
  int dead;             /* under ex->mu: declared dead by the heartbeat */
  int64_t dead_at_ns;   /* under ex->mu: when; bytes heard after it bring the peer back */
  int64_t dead_ms_told; /* under ex->mu: the derived dead timeout last logged */
  int64_t ping_ns;      /* heartbeat thread only: when its latest Ping ended (0 = none yet) */
  uint64_t pings_ok, pings_failed;
  struct nb__bg* bg; /* round caller only: sends left running by nb_exchange_round_early */
} nb__peer_t;

struct nb_exchange {
  char job[NB_LINK_ID_MAX], self[NB_LINK_ID_MAX];
  const nb_tls_t* tls;
  int allow_insecure;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  int sealed;
  uint32_t epoch; /* our sealing epoch as a sender of frames (nb__ex_data_epoch) */
  uint32_t streams, window;
  size_t chunk_bytes;
  double rate_cap, rate_hint;
  int hb_ms, dead_ms; /* dead_ms: the floor of the derived dead timeout */
  int hb_share_pct;   /* NB_EXCHANGE_HEARTBEAT_SHARE_PCT */
  int dead_rtts, dead_chunks;
  nb_link_rx_t* rx;
  nb_rpc_server_t* srv;
  nb__peer_t** peers;
  size_t n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stopping;
  uint64_t calls; /* round calls so far (the caller's thread only) */
  /* the published global state (Pull), under mu */
  uint8_t* state;
  size_t state_len;
  uint64_t state_round;
};

/* The server answers as soon as nb_exchange_create returns, and the caller adds its peers after:
 * a peer whose process started first can call in between (seen under load: its first frame
 * refused, its round failed). A cluster not (yet) among our peers is waited for this long, as
 * nb_exchange_add_peer may be about to add it, before it is refused: well under the dead
 * timeout's floor, so that a cluster that is no peer hears "not a peer", not silence. */
#define NB__EX_AUTH_WAIT_NS 500000000LL

static nb_status_t nb__ex_authorize(const nb_tls_peer_t* peer, const char* method, void* user) {
  nb_exchange_t* ex = user;
  nb_status_t st = NB_ERR_PERMISSION;
  if (peer->kind == NB_TLS_PEER_CLUSTER) {
    int64_t until = nb_now_ns() + NB__EX_AUTH_WAIT_NS;
    pthread_mutex_lock(&ex->mu);
    for (;;) {
      for (size_t i = 0; i < ex->n; i++)
        if (strcmp(ex->peers[i]->id, peer->name) == 0) st = NB_OK;
      if (st == NB_OK || ex->stopping || nb_now_ns() >= until) break;
      nb_cond_wait_until(&ex->cv, &ex->mu, until);
    }
    pthread_mutex_unlock(&ex->mu);
  }
  if (st != NB_OK)
    st = nb_error(NB_ERR_PERMISSION, "%s '%s' is not a peer of job %s on %s",
                  peer->kind == NB_TLS_PEER_USER ? "user" : "cluster", peer->name, ex->job,
                  ex->self);
  return st;
}

static void nb__ex_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Associated data of a pulled state's chunks: "nbpull1" || total size || state hash. */
static size_t nb__ex_pull_aad(uint64_t total, uint64_t hash, uint8_t aad[24]) {
  memcpy(aad, "nbpull1", 8);
  nb__ex_le64(aad + 8, total);
  nb__ex_le64(aad + 16, hash);
  return 24;
}

/* Exchange.Pull: serves the published state in 1 MiB chunks. Sealed jobs seal each chunk under
 * a key of its own for this pull (a random sender epoch, sent in the high 32 bits of `round`),
 * so no nonce is ever reused whatever was served before. */
static nb_status_t nb__ex_pull(nb_rpc_call_t* call, void* user) {
  nb_exchange_t* ex = user;
  ProtobufCMessage* in = NULL;
  int end = 0;
  NB_CHECK(
      nb_rpc_call_recv_pb(call, &nebula__v1__pull_request__descriptor, &in, &end, NB_RPC_INFINITE));
  if (end) return nb_error(NB_ERR_INVALID, "Pull without a request");
  Nebula__V1__PullRequest* q = (Nebula__V1__PullRequest*)in;
  nb_status_t st = NB_OK;
  const nb_tls_peer_t* caller = nb_rpc_call_peer(call);
  char who[NB_LINK_ID_MAX];
  snprintf(who, sizeof who, "%s", q->requester ? q->requester : "");
  if (!q->job_id || strcmp(q->job_id, ex->job) != 0)
    st = nb_error(NB_ERR_PERMISSION, "Pull for job '%s' on job %s", q->job_id ? q->job_id : "",
                  ex->job);
  else if (caller && caller->kind == NB_TLS_PEER_CLUSTER && strcmp(caller->name, who) != 0)
    st = nb_error(NB_ERR_PERMISSION, "Pull: certificate of '%s' claims requester '%s'",
                  caller->name, who);
  protobuf_c_message_free_unpacked(in, NULL);
  if (st != NB_OK) return st;
  int known = 0;
  size_t step = NB__EX_PULL_CHUNK; /* chunks of the link's adaptive size, at most 1 MiB */
  pthread_mutex_lock(&ex->mu);
  for (size_t i = 0; i < ex->n; i++)
    if (strcmp(ex->peers[i]->id, who) == 0) {
      known = 1;
      ex->peers[i]->pull_ns = nb_now_ns(); /* a peer that pulls is alive */
      size_t c = nb_link_chunk_bytes(ex->peers[i]->link);
      if (c > 0 && c < step) step = c;
    }
  uint8_t* state = NULL;
  size_t len = ex->state_len;
  uint64_t round = ex->state_round;
  if (known && ex->state) st = nb_alloc((void**)&state, len, 1, "pulled state");
  if (state) memcpy(state, ex->state, len);
  pthread_mutex_unlock(&ex->mu);
  if (!known) return nb_error(NB_ERR_PERMISSION, "Pull: '%s' is not a peer of %s", who, ex->self);
  NB_CHECK(st);
  if (!state) return nb_error(NB_ERR_UNAVAILABLE, "%s has no global state to serve yet", ex->self);
  uint64_t hash = nb_xxh3_64(state, len, 0);
  uint32_t epoch = 0;
  nb_seal_ctx_t* seal = NULL;
  uint8_t* sealed = NULL;
  if (ex->sealed) {
    if (RAND_bytes((uint8_t*)&epoch, sizeof epoch) != 1) epoch = (uint32_t)nb_wall_ns();
    epoch |= 1u; /* odd: never a data epoch (nb__ex_data_epoch) */
    nb_seal_opts_t so = {.local_epoch = epoch};
    st = nb_seal_ctx_create(ex->secret, ex->job, ex->self, who, &so, &seal);
    if (st == NB_OK)
      st = nb_alloc((void**)&sealed, NB__EX_PULL_CHUNK + NB_SEAL_TAG_BYTES, 1, "sealed chunk");
  }
  uint8_t aad[24], hb[8];
  size_t aad_len = nb__ex_pull_aad(len, hash, aad);
  nb__ex_le64(hb, hash);
  for (size_t off = 0, i = 0; st == NB_OK && (off < len || i == 0); off += step, i++) {
    size_t n = len - off < step ? len - off : step;
    Nebula__V1__PullChunk c = NEBULA__V1__PULL_CHUNK__INIT;
    c.round = ((uint64_t)epoch << 32) | (round & 0xffffffffu);
    c.total_size = len;
    c.offset = off;
    c.last = off + n >= len;
    if (i == 0) {
      c.state_hash.data = hb;
      c.state_hash.len = 8;
    }
    if (seal) {
      size_t sl = 0;
      st = nb_seal_chunk(seal, round & 0xffffffffu, i, aad, aad_len, state + off, n, sealed, &sl);
      c.data.data = sealed;
      c.data.len = sl;
    } else {
      c.data.data = state + off;
      c.data.len = n;
    }
    if (st == NB_OK) st = nb_rpc_call_send_pb(call, &c.base);
  }
  if (st == NB_OK)
    NB_INFO(WIRE, "exchange %s: served the global state of round %llu (%zu bytes) to %s", ex->self,
            (unsigned long long)round, len, who);
  nb_seal_ctx_destroy(seal);
  nb_free(sealed);
  nb_free(state);
  return st;
}

nb_status_t nb_exchange_publish_state(nb_exchange_t* ex, uint64_t round, const void* state,
                                      size_t len) {
  if (!ex || !state || len == 0 || round > 0xffffffffu)
    return nb_error(NB_ERR_INVALID, "exchange publish: bad state or round");
  uint8_t* copy = NULL;
  NB_CHECK(nb_alloc((void**)&copy, len, 1, "published state"));
  memcpy(copy, state, len);
  pthread_mutex_lock(&ex->mu);
  uint8_t* old = ex->state;
  ex->state = copy;
  ex->state_len = len;
  ex->state_round = round;
  pthread_mutex_unlock(&ex->mu);
  nb_free(old);
  return NB_OK;
}

nb_status_t nb_exchange_pull(nb_exchange_t* ex, size_t i, int64_t timeout_ms, uint8_t** out,
                             size_t* out_len, uint64_t* out_round) {
  if (!ex || i >= ex->n || !out || !out_len)
    return nb_error(NB_ERR_INVALID, "exchange pull: bad arguments");
  *out = NULL;
  *out_len = 0;
  nb__peer_t* p = ex->peers[i];
  nb_rpc_client_opts_t co = {.tls = ex->tls,
                             .allow_insecure = ex->allow_insecure,
                             .expected_cluster = ex->tls ? p->id : NULL};
  nb_rpc_client_t* cli = NULL;
  nb_rpc_stream_t* s = NULL;
  nb_seal_ctx_t* seal = NULL;
  uint8_t* state = NULL;
  uint8_t* plain = NULL;
  uint64_t total = 0, hash = 0, round = 0, got = 0;
  int have_first = 0, last = 0;
  nb_status_t st;
  NB_CHECK_GOTO(nb_rpc_client_create(p->target, &co, &cli), st, out);
  NB_CHECK_GOTO(nb_rpc_stream_open(cli, NB__EX_METHOD_PULL, timeout_ms, NB_RPC_WAIT_FOR_READY, &s),
                st, out);
  Nebula__V1__PullRequest q = NEBULA__V1__PULL_REQUEST__INIT;
  q.job_id = ex->job;
  q.requester = ex->self;
  NB_CHECK_GOTO(nb_rpc_stream_send_pb(s, &q.base), st, out);
  NB_CHECK_GOTO(nb_rpc_stream_close_send(s), st, out);
  uint8_t aad[24];
  size_t aad_len = 0;
  for (uint64_t idx = 0; !last; idx++) {
    ProtobufCMessage* m = NULL;
    int end = 0;
    NB_CHECK_GOTO(
        nb_rpc_stream_recv_pb(s, &nebula__v1__pull_chunk__descriptor, &m, &end, NB_RPC_INFINITE),
        st, out);
    if (end) {
      st = nb_error(NB_ERR_CODEC, "pull from %s: the state ended after %llu of %llu bytes", p->id,
                    (unsigned long long)got, (unsigned long long)total);
      goto out;
    }
    Nebula__V1__PullChunk* c = (Nebula__V1__PullChunk*)m;
    st = NB_OK;
    pthread_mutex_lock(&ex->mu);
    p->pull_ns = nb_now_ns(); /* a chunk of the peer's state: we heard from it */
    pthread_mutex_unlock(&ex->mu);
    if (!have_first) {
      if (c->state_hash.len != 8 || c->total_size == 0 || c->total_size > ((uint64_t)4 << 30)) {
        st = nb_error(NB_ERR_CODEC, "pull from %s: first chunk without a size or hash", p->id);
      } else {
        total = c->total_size;
        round = c->round;
        for (int b = 0; b < 8; b++) hash |= (uint64_t)c->state_hash.data[b] << (8 * b);
        aad_len = nb__ex_pull_aad(total, hash, aad);
        st = nb_alloc((void**)&state, total, 1, "pulled state");
        if (st == NB_OK)
          st = nb_alloc((void**)&plain, NB__EX_PULL_CHUNK + NB_SEAL_TAG_BYTES, 1, "pull chunk");
        if (st == NB_OK && ex->sealed) {
          nb_seal_opts_t so = {.peer_epoch = (uint32_t)(round >> 32)};
          st = nb_seal_ctx_create(ex->secret, ex->job, ex->self, p->id, &so, &seal);
        }
        have_first = 1;
      }
    }
    size_t plen = c->data.len;
    if (st == NB_OK && (c->round != round || c->total_size != total || c->offset != got))
      st = nb_error(NB_ERR_CODEC, "pull from %s: chunk at %llu out of order", p->id,
                    (unsigned long long)c->offset);
    if (st == NB_OK && seal) {
      if (c->data.len > NB__EX_PULL_CHUNK + NB_SEAL_TAG_BYTES)
        st = nb_error(NB_ERR_CODEC, "pull from %s: chunk of %zu bytes", p->id, c->data.len);
      else
        st = nb_open_chunk(seal, round & 0xffffffffu, idx, aad, aad_len, c->data.data, c->data.len,
                           plain, &plen);
      if (st != NB_OK)
        st = nb_error(NB_ERR_INTEGRITY, "pull from %s: chunk %llu does not open", p->id,
                      (unsigned long long)idx);
    } else if (st == NB_OK) {
      memcpy(plain, c->data.data, plen < NB__EX_PULL_CHUNK ? plen : NB__EX_PULL_CHUNK);
    }
    if (st == NB_OK && (plen > NB__EX_PULL_CHUNK || got + plen > total))
      st = nb_error(NB_ERR_CODEC, "pull from %s: more bytes than the %llu announced", p->id,
                    (unsigned long long)total);
    if (st == NB_OK) {
      memcpy(state + got, plain, plen);
      got += plen;
      last = c->last;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    if (st != NB_OK) goto out;
  }
  if (got != total) {
    st = nb_error(NB_ERR_CODEC, "pull from %s: %llu of %llu bytes", p->id, (unsigned long long)got,
                  (unsigned long long)total);
    goto out;
  }
  if (nb_xxh3_64(state, total, 0) != hash) {
    st = nb_error(NB_ERR_INTEGRITY, "pull from %s: the state's hash differs from the announced one",
                  p->id);
    goto out;
  }
  st = nb_rpc_stream_finish(s);
  if (st != NB_OK) goto out;
  NB_INFO(WIRE, "exchange %s: pulled the global state of round %llu (%llu bytes) from %s", ex->self,
          (unsigned long long)(round & 0xffffffffu), (unsigned long long)total, p->id);
  *out = state;
  *out_len = total;
  if (out_round) *out_round = round & 0xffffffffu;
  state = NULL;
out:
  nb_free(state);
  nb_free(plain);
  nb_seal_ctx_destroy(seal);
  nb_rpc_stream_destroy(s);
  nb_rpc_client_destroy(cli);
  return st;
}

/* Our sealing epoch as a sender of frames: even (a Pull's are odd, so the two never share a key),
 * and later for a later start of the process: quarter seconds since 2026 (17 years of room).
 * A cluster that restarts and redoes a round (a resumed checkpoint, a rejoin) so seals it
 * under a new key instead of reusing the (round, chunk) nonces of its earlier incarnation, and
 * its peers adopt the newer epoch from the transfer's PushOpen (inter/link.c). */
static uint32_t nb__ex_data_epoch(void) {
  const uint64_t base_s = 1767225600; /* 2026-01-01T00:00:00Z */
  uint64_t q = (uint64_t)nb_wall_ns() / 250000000ull, b = base_s * 4;
  uint64_t e = q > b ? q - b : 0;
  return (uint32_t)(((e & 0x7fffffffull) << 1) + 2);
}

nb_status_t nb_exchange_create(const nb_exchange_config_t* cfg, nb_exchange_t** out) {
  if (!cfg || !out) return nb_error(NB_ERR_INVALID, "exchange: NULL config or out");
  *out = NULL;
  if (!cfg->job_id || !*cfg->job_id || strlen(cfg->job_id) >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "exchange: job_id missing or too long");
  if (!cfg->self || !*cfg->self || strlen(cfg->self) >= NB_LINK_ID_MAX)
    return nb_error(NB_ERR_INVALID, "exchange: self (our cluster id) missing or too long");
  if (!cfg->listen || !*cfg->listen)
    return nb_error(NB_ERR_INVALID, "exchange %s: no listen address", cfg->self);
  if (!cfg->tls && !cfg->allow_insecure)
    return nb_error(NB_ERR_INVALID, "exchange %s: no TLS material (allow_insecure not set)",
                    cfg->self);
  if (!cfg->job_secret && !cfg->allow_unsealed)
    return nb_error(NB_ERR_INVALID, "exchange %s: no job secret (allow_unsealed not set)",
                    cfg->self);
  if (cfg->tls && strcmp(nb_tls_self(cfg->tls)->name, cfg->self) != 0)
    return nb_error(NB_ERR_INVALID, "exchange: self is '%s' but our certificate says '%s'",
                    cfg->self, nb_tls_self(cfg->tls)->name);
  nb_exchange_t* ex = NULL;
  NB_CHECK(NB_CALLOC(ex, 1, "exchange"));
  snprintf(ex->job, sizeof ex->job, "%s", cfg->job_id);
  snprintf(ex->self, sizeof ex->self, "%s", cfg->self);
  ex->tls = cfg->tls;
  ex->allow_insecure = cfg->allow_insecure;
  if (cfg->job_secret) {
    memcpy(ex->secret, cfg->job_secret, NB_SEAL_SECRET_BYTES);
    ex->sealed = 1;
    ex->epoch = nb__ex_data_epoch();
  }
  ex->streams = cfg->streams;
  ex->window = cfg->window;
  ex->chunk_bytes = cfg->chunk_bytes;
  ex->rate_cap = cfg->rate_cap_Bps;
  ex->rate_hint = cfg->rate_hint_Bps;
  ex->hb_ms = cfg->heartbeat_ms > 0 ? cfg->heartbeat_ms : (int)nb_param_ExchangeHeartbeatMs();
  ex->hb_share_pct = (int)nb_param_ExchangeHeartbeatSharePct();
  ex->dead_ms = cfg->dead_ms > 0 ? cfg->dead_ms : (int)nb_param_ExchangeDeadMs();
  ex->dead_rtts = (int)nb_param_ExchangeDeadRtts();
  ex->dead_chunks = (int)nb_param_ExchangeDeadChunks();
  pthread_mutex_init(&ex->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&ex->cv, &ca);
  pthread_condattr_destroy(&ca);
  nb_status_t st;
  nb_link_rx_config_t rc = {.job_id = ex->job,
                            .local_cluster = ex->self,
                            .allow_plaintext = cfg->tls == NULL,
                            .allow_unsealed = cfg->job_secret == NULL};
  NB_CHECK_GOTO(nb_link_rx_create(&rc, &ex->rx), st, fail);
  nb_rpc_server_opts_t so = {.listen = cfg->listen,
                             .tls = cfg->tls,
                             .allow_insecure = cfg->allow_insecure,
                             .authorize = cfg->tls ? nb__ex_authorize : NULL,
                             .authorize_user = ex};
  NB_CHECK_GOTO(nb_rpc_server_create(&so, &ex->srv), st, fail);
  NB_CHECK_GOTO(nb_link_rx_register(ex->rx, ex->srv), st, fail);
  NB_CHECK_GOTO(nb_rpc_server_add_method(ex->srv, NB__EX_METHOD_PULL, NB_RPC_SERVER_STREAMING,
                                         nb__ex_pull, ex),
                st, fail);
  NB_CHECK_GOTO(nb_rpc_server_start(ex->srv), st, fail);
  NB_INFO(WIRE, "exchange %s (job %s) listening on port %d%s%s", ex->self, ex->job,
          nb_rpc_server_port(ex->srv), cfg->tls ? "" : ", PLAINTEXT",
          ex->sealed ? "" : ", UNSEALED");
  *out = ex;
  return NB_OK;
fail:
  nb_exchange_destroy(ex);
  return st;
}

int nb_exchange_port(const nb_exchange_t* ex) {
  return ex ? nb_rpc_server_port(ex->srv) : 0;
}
size_t nb_exchange_peer_count(const nb_exchange_t* ex) {
  return ex ? ex->n : 0;
}
nb_link_t* nb_exchange_link(nb_exchange_t* ex, size_t i) {
  return ex && i < ex->n ? ex->peers[i]->link : NULL;
}

int64_t nb__exchange_hb_ms(int64_t hb_ms, double rate_Bps, int share_pct) {
  if (!(rate_Bps > 0) || share_pct <= 0) return hb_ms;
  double ms = (double)NB__EX_HB_WIRE_BYTES / (rate_Bps * share_pct / 100.0) * 1e3;
  if (!(ms < 60000.0)) ms = 60000.0; /* at most a minute between pings */
  return (int64_t)ms > hb_ms ? (int64_t)ms : hb_ms;
}

int64_t nb__exchange_dead_ms(int64_t floor_ms, int rtts, int chunks, double rtt_s, double rate_Bps,
                             size_t chunk_wire_bytes, uint32_t streams) {
  double ms = (double)rtts * (rtt_s > 0 ? rtt_s : 0) * 1e3;
  if (rate_Bps > 0 && chunk_wire_bytes > 0)
    ms += (double)chunks * (double)chunk_wire_bytes * (streams ? streams : 1) / rate_Bps * 1e3;
  if (!(ms < 3.6e9)) ms = 3.6e9; /* an hour: NaN and absurd rates end here */
  int64_t d = (int64_t)ms + 1;
  return d > floor_ms ? d : floor_ms;
}

/* The dead timeout of peer p now, and when we last heard from it by any path (a heartbeat
 * answer, an ack or probe answer on our link, a message to our receiver, a Pull). The heaviest
 * single message that may stand between two arrivals is one chunk per stream: ours, theirs, or
 * the one a probe or the next send would use. ex->mu held (the link and receiver have locks of
 * their own, taken inside). */
static int64_t nb__dead_ms(nb_exchange_t* ex, nb__peer_t* p, int64_t* heard_ns, double* rtt_s,
                           double* rate_Bps, size_t* chunk) {
  nb_link_liveness_t lv;
  nb_link_liveness(p->link, &lv);
  nb_link_rx_peer_t rp;
  if (nb_link_rx_peer(ex->rx, p->id, &rp) != NB_OK) memset(&rp, 0, sizeof rp);
  int64_t h = p->last_ok_ns;
  if (lv.last_heard_ns > h) h = lv.last_heard_ns;
  if (rp.last_heard_ns > h) h = rp.last_heard_ns;
  if (p->pull_ns > h) h = p->pull_ns;
  size_t c = lv.chunk_next;
  if (lv.chunk_bytes > c) c = lv.chunk_bytes;
  if (rp.chunk_bytes > c) c = rp.chunk_bytes;
  if (lv.probe_bytes > c) c = lv.probe_bytes;
  if (heard_ns) *heard_ns = h;
  if (rtt_s) *rtt_s = lv.rtt_s;
  if (rate_Bps) *rate_Bps = lv.rate_Bps;
  if (chunk) *chunk = c;
  /* three Ping periods without a word is the least that can mean dead */
  int64_t floor = 3 * nb__exchange_hb_ms(ex->hb_ms, lv.rate_Bps, ex->hb_share_pct);
  if (floor < ex->dead_ms) floor = ex->dead_ms;
  return nb__exchange_dead_ms(floor, ex->dead_rtts, ex->dead_chunks, lv.rtt_s, lv.rate_Bps,
                              c + lv.seal_tag_bytes, lv.streams);
}

/* A dead peer we have heard from since it was declared dead lives again: any bytes count, not
 * only our heartbeat's answer (whose connection may still be in its reconnect backoff while the
 * peer's own pings and chunks already arrive). ex->mu held. */
static void nb__revive_locked(nb_exchange_t* ex, nb__peer_t* p, int64_t heard_ns) {
  if (!p->dead || heard_ns <= p->dead_at_ns) return;
  p->dead = 0;
  NB_WARN("exchange %s: peer %s answers again at unix %.3f", ex->self, p->id,
          (double)nb_wall_ns() / 1e9);
  nb_link_resume(p->link);
}

/* Milliseconds since we last heard from peer p. ex->mu held. */
static int64_t nb__silent_ms(nb_exchange_t* ex, nb__peer_t* p) {
  int64_t h = 0;
  nb__dead_ms(ex, p, &h, NULL, NULL, NULL);
  return (nb_now_ns() - h) / 1000000;
}

int nb_exchange_peer_alive(nb_exchange_t* ex, size_t i) {
  if (!ex || i >= ex->n) return 0;
  pthread_mutex_lock(&ex->mu);
  nb__peer_t* p = ex->peers[i];
  int64_t h = 0;
  int64_t dead_ms = nb__dead_ms(ex, p, &h, NULL, NULL, NULL);
  nb__revive_locked(ex, p, h);
  int alive = !p->dead && (nb_now_ns() - h) / 1000000 <= dead_ms;
  pthread_mutex_unlock(&ex->mu);
  return alive;
}

nb_status_t nb_exchange_peer_liveness(nb_exchange_t* ex, size_t i, nb_exchange_liveness_t* out) {
  if (!ex || i >= ex->n || !out) return nb_error(NB_ERR_INVALID, "exchange liveness: bad peer");
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&ex->mu);
  nb__peer_t* p = ex->peers[i];
  int64_t h = 0;
  out->dead_ms = nb__dead_ms(ex, p, &h, &out->rtt_s, &out->rate_Bps, &out->chunk_bytes);
  out->floor_ms = ex->dead_ms;
  out->silent_ms = (nb_now_ns() - h) / 1000000;
  out->dead = p->dead || out->silent_ms > out->dead_ms; /* as nb_exchange_peer_alive */
  out->pings_ok = p->pings_ok;
  out->pings_failed = p->pings_failed;
  pthread_mutex_unlock(&ex->mu);
  return NB_OK;
}

static void* nb__heartbeat(void* arg) {
  nb__peer_t* p = arg;
  nb_exchange_t* ex = p->ex;
  for (;;) {
    pthread_mutex_lock(&ex->mu);
    int stop = ex->stopping;
    /* never wait past the moment the peer would be declared dead: detection stays within the
     * dead timeout plus one short ping, also when pings hang instead of failing; but let a
     * slow answer (a queue on a thin link) come in, it measures the RTT the timeout needs */
    int64_t heard = 0;
    double rtt = 0, rate = 0;
    size_t chunk = 0;
    int64_t dead_ms = nb__dead_ms(ex, p, &heard, &rtt, &rate, &chunk);
    nb__revive_locked(ex, p, heard);
    int64_t told = p->dead_ms_told;
    int64_t diff = dead_ms > told ? dead_ms - told : told - dead_ms;
    if (!stop && (told == 0 || diff * 10 > told)) {
      p->dead_ms_told = dead_ms;
      if (told != 0 || dead_ms != ex->dead_ms)
        NB_INFO(WIRE,
                "exchange %s: peer %s: dead timeout %lld ms (floor %d ms; RTT %.0f ms, rate %.3g "
                "Mbit/s, chunks of %zu bytes)",
                ex->self, p->id, (long long)dead_ms, ex->dead_ms, rtt * 1e3, rate * 8e-6, chunk);
    }
    int64_t left = dead_ms - (nb_now_ns() - heard) / 1000000 + 20;
    /* the Ping period: NB_EXCHANGE_HEARTBEAT_MS, longer on a thin link; while the peer's own
     * bytes (chunks, acks, its pings) keep arriving within one period, one Ping in four periods
     * (it still measures the RTT) */
    int64_t period = nb__exchange_hb_ms(ex->hb_ms, rate, ex->hb_share_pct);
    int64_t now = nb_now_ns();
    int64_t quiet_ms = (now - heard) / 1000000;
    if (!stop && !p->dead && heard > 0 && quiet_ms < period && p->ping_ns > 0 &&
        now - p->ping_ns < 4 * period * 1000000) {
      int64_t until = heard + period * 1000000;
      int64_t next_ping = p->ping_ns + 4 * period * 1000000;
      if (next_ping < until) until = next_ping;
      struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
      pthread_cond_timedwait(&ex->cv, &ex->mu, &ts);
      pthread_mutex_unlock(&ex->mu);
      continue;
    }
    pthread_mutex_unlock(&ex->mu);
    if (stop) break;
    int64_t pt = left < dead_ms ? left : dead_ms;
    if (pt < 50) pt = 50;
    nb_status_t st = nb_link_ping(p->link, pt, 0, NULL);
    p->ping_ns = nb_now_ns(); /* only this thread reads and writes it */
    pthread_mutex_lock(&ex->mu);
    int declare = 0; /* declared dead now */
    if (st == NB_OK) {
      p->pings_ok++;
      p->last_ok_ns = nb_now_ns();
      nb__revive_locked(ex, p, p->last_ok_ns);
    } else {
      p->pings_failed++;
      dead_ms = nb__dead_ms(ex, p, &heard, NULL, NULL, NULL);
      int64_t silent = (nb_now_ns() - heard) / 1000000;
      if (!p->dead && silent > dead_ms) {
        p->dead = 1;
        p->dead_at_ns = nb_now_ns();
        declare = 1;
        NB_WARN(
            "exchange %s: peer %s (%s) stopped answering: nothing heard for %lld ms (dead "
            "timeout %lld ms, last ping %s), declared dead at unix %.3f",
            ex->self, p->id, p->target, (long long)silent, (long long)dead_ms, nb_status_name(st),
            (double)nb_wall_ns() / 1e9);
      }
    }
    int64_t wait_ms = nb__exchange_hb_ms(ex->hb_ms, rate, ex->hb_share_pct);
    if (st != NB_OK && !p->dead) {
      int64_t to_dead =
          nb__dead_ms(ex, p, &heard, NULL, NULL, NULL) - (nb_now_ns() - heard) / 1000000 + 10;
      if (to_dead < wait_ms) wait_ms = to_dead < 10 ? 10 : to_dead;
    }
    int64_t until = nb_now_ns() + wait_ms * 1000000;
    struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
    /* cancel under ex->mu, so that a revival (which resumes the link) cannot come between */
    if (declare) nb_link_cancel(p->link);
    if (!ex->stopping) pthread_cond_timedwait(&ex->cv, &ex->mu, &ts);
    pthread_mutex_unlock(&ex->mu);
  }
  return NULL;
}

nb_status_t nb_exchange_add_peer(nb_exchange_t* ex, const char* peer, const char* target) {
  if (!ex || !peer || !*peer || strlen(peer) >= NB_LINK_ID_MAX || !target || !*target ||
      strlen(target) >= 256)
    return nb_error(NB_ERR_INVALID, "exchange add_peer: bad peer id or target");
  if (strcmp(peer, ex->self) == 0)
    return nb_error(NB_ERR_INVALID, "exchange %s: cannot add itself as a peer", ex->self);
  for (size_t i = 0; i < ex->n; i++)
    if (strcmp(ex->peers[i]->id, peer) == 0)
      return nb_error(NB_ERR_EXISTS, "exchange %s: peer %s added twice", ex->self, peer);
  nb__peer_t* p = NULL;
  nb_status_t st;
  NB_CHECK(NB_CALLOC(p, 1, "exchange peer"));
  p->ex = ex;
  snprintf(p->id, sizeof p->id, "%s", peer);
  snprintf(p->target, sizeof p->target, "%s", target);
  if (ex->sealed)
    NB_CHECK_GOTO(nb_seal_ctx_create(ex->secret, ex->job, ex->self, peer,
                                     &(nb_seal_opts_t){.local_epoch = ex->epoch}, &p->seal),
                  st, fail);
  nb_link_config_t lc = {.job_id = ex->job,
                         .local_cluster = ex->self,
                         .peer_cluster = peer,
                         .target = target,
                         .tls = ex->tls,
                         .allow_insecure = ex->allow_insecure,
                         .seal = p->seal,
                         .allow_unsealed = !ex->sealed,
                         .streams = ex->streams,
                         .chunk_bytes = ex->chunk_bytes,
                         .window = ex->window,
                         .rate_cap_Bps = ex->rate_cap,
                         .rate_hint_Bps = ex->rate_hint};
  NB_CHECK_GOTO(nb_link_create(&lc, &p->link), st, fail);
  NB_CHECK_GOTO(nb_link_rx_add_peer(ex->rx, peer, p->seal), st, fail);
  NB_CHECK_GOTO(nb_realloc((void**)&ex->peers, ex->n + 1, sizeof *ex->peers, "exchange peers"), st,
                fail);
  p->last_ok_ns = nb_now_ns();
  pthread_mutex_lock(&ex->mu);
  ex->peers[ex->n++] = p;
  pthread_cond_broadcast(&ex->cv); /* a call from it may wait in nb__ex_authorize */
  pthread_mutex_unlock(&ex->mu);
  if (pthread_create(&p->hb, NULL, nb__heartbeat, p) != 0)
    return nb_error(NB_ERR_SYSTEM, "exchange %s: cannot start the heartbeat of %s", ex->self, peer);
  p->hb_started = 1;
  return NB_OK;
fail:
  nb_link_destroy(p->link);
  nb_seal_ctx_destroy(p->seal);
  nb_free(p);
  return st;
}

typedef struct {
  nb__peer_t* p;
  uint64_t round;
  const void* frame;
  size_t len;
  int64_t deadline_ns;
  nb_status_t st;
  char detail[256];
  nb_link_send_stats_t stats;
  int done; /* atomic: the send returned */
} nb__send_job_t;

/* A send that nb_exchange_round_early left running: its thread and its own copy of the frame,
 * joined by a later round call (its figures reported there) or by nb_exchange_destroy. */
typedef struct nb__bg {
  pthread_t th;
  nb__send_job_t job;
  uint8_t* copy;
  uint64_t call; /* the round call that started it */
  struct nb__bg* next;
} nb__bg_t;

static void* nb__sender(void* arg) {
  nb__send_job_t* j = arg;
  j->st = nb_link_send(j->p->link, j->round, j->frame, j->len, NULL, 0, j->deadline_ns, &j->stats);
  if (j->st != NB_OK) snprintf(j->detail, sizeof j->detail, "%s", nb_error_last());
  __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Starts a background send of a copy of frame to p (call: the round call's number). */
static nb_status_t nb__bg_start(nb__peer_t* p, uint64_t call, uint64_t round, const void* frame,
                                size_t len, int64_t deadline_ns) {
  nb__bg_t* b = NULL;
  NB_CHECK(NB_CALLOC(b, 1, "background send"));
  nb_status_t st = nb_alloc((void**)&b->copy, len, 1, "frame in flight");
  if (st != NB_OK) {
    nb_free(b);
    return st;
  }
  memcpy(b->copy, frame, len);
  b->call = call;
  b->job = (nb__send_job_t){
      .p = p, .round = round, .frame = b->copy, .len = len, .deadline_ns = deadline_ns};
  if (pthread_create(&b->th, NULL, nb__sender, &b->job) != 0) {
    nb_free(b->copy);
    nb_free(b);
    return nb_error(NB_ERR_SYSTEM, "cannot start a sender thread");
  }
  b->next = p->bg;
  p->bg = b;
  return NB_OK;
}

/* Joins p's background sends started before round call `call` (all of them for call 0), adds
 * their bytes, chunk messages and reconnects to *sent (nullable) and returns the first failed
 * one's status (NB_OK when none failed), its detail in why. */
static nb_status_t nb__bg_reap(nb__peer_t* p, uint64_t call, nb_link_send_stats_t* sent, char* why,
                               size_t why_cap) {
  nb_status_t first = NB_OK;
  for (nb__bg_t** at = &p->bg; *at;) {
    nb__bg_t* b = *at;
    if (call && b->call >= call) {
      at = &b->next;
      continue;
    }
    pthread_join(b->th, NULL);
    if (sent) {
      sent->bytes += b->job.stats.bytes;
      sent->chunks_sent += b->job.stats.chunks_sent;
      sent->reconnects += b->job.stats.reconnects;
    }
    if (b->job.st != NB_OK && first == NB_OK) {
      first = b->job.st;
      snprintf(why, why_cap, "sending round %llu to %.60s: %.160s",
               (unsigned long long)b->job.round, p->id, b->job.detail);
    }
    *at = b->next;
    nb_free(b->copy);
    nb_free(b);
  }
  return first;
}

/* 1 when every background send of every peer has returned. */
static int nb__bg_idle(const nb_exchange_t* ex) {
  for (size_t i = 0; i < ex->n; i++)
    for (const nb__bg_t* b = ex->peers[i]->bg; b; b = b->next)
      if (!__atomic_load_n(&b->job.done, __ATOMIC_ACQUIRE)) return 0;
  return 1;
}

void nb_exchange_results_release(nb_exchange_result_t* r, size_t n) {
  if (!r) return;
  for (size_t i = 0; i < n; i++) {
    nb_free(r[i].frame);
    memset(&r[i], 0, sizeof r[i]);
  }
}

nb_status_t nb_exchange_round_take(nb_exchange_t* ex, uint64_t round, const void* frame, size_t len,
                                   int64_t deadline_ns, size_t n, nb_bytes_t* frames,
                                   char (*names)[NB_LINK_ID_MAX], uint64_t* bytes_sent) {
  if (!ex || n != ex->n || !frames)
    return nb_error(NB_ERR_INTERNAL, "exchange round: %zu peers expected, the exchange has %zu", n,
                    ex ? ex->n : 0);
  nb_exchange_result_t* res = NULL;
  if (n) NB_CHECK(NB_CALLOC(res, n, "exchange results"));
  nb_status_t st = nb_exchange_round(ex, round, frame, len, deadline_ns, res);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    bytes += res[i].send.bytes;
    if (names) snprintf(names[i], NB_LINK_ID_MAX, "%s", res[i].peer);
    frames[i] = (nb_bytes_t){NULL, 0};
    if (st == NB_OK) {
      frames[i] = (nb_bytes_t){res[i].frame, res[i].len};
      res[i].frame = NULL;
    } else if (res[i].status != NB_OK) {
      NB_WARN("round %llu: peer %s: %s", (unsigned long long)round, res[i].peer, res[i].detail);
    }
  }
  nb_exchange_results_release(res, n);
  nb_free(res);
  if (bytes_sent) *bytes_sent = bytes;
  return st;
}

/* nb_exchange_round (early 0) and nb_exchange_round_early (1). */
static nb_status_t nb__ex_round(nb_exchange_t* ex, uint64_t round, const void* frame, size_t len,
                                int64_t deadline_ns, int early, nb_exchange_result_t* results) {
  if (!ex || !frame || len == 0 || !results)
    return nb_error(NB_ERR_INVALID, "exchange round: NULL argument or empty frame");
  size_t n = ex->n;
  uint64_t call = ++ex->calls;
  /* A peer that sent a later round's frame has moved past this one: a plain round's sends are
   * over when it returns. An early round's are not (they are over when the round after it
   * returns), so its frame of round + 1 can overtake this round's, even to our receiver's
   * threads (the two transfers' opens race): only round + 2 or later proves it past. */
  nb__send_job_t* jobs = NULL;
  pthread_t* th = NULL;
  int* started = NULL;
  int* pending = NULL;
  nb_status_t st;
  NB_CHECK_GOTO(NB_CALLOC(jobs, n ? n : 1, "send jobs"), st, out);
  NB_CHECK_GOTO(NB_CALLOC(th, n ? n : 1, "send threads"), st, out);
  NB_CHECK_GOTO(NB_CALLOC(started, n ? n : 1, "send flags"), st, out);
  NB_CHECK_GOTO(NB_CALLOC(pending, n ? n : 1, "recv flags"), st, out);
  for (size_t i = 0; i < n; i++) {
    nb__peer_t* p = ex->peers[i];
    nb_exchange_result_t* r = &results[i];
    memset(r, 0, sizeof *r);
    snprintf(r->peer, sizeof r->peer, "%s", p->id);
    if (!nb_exchange_peer_alive(ex, i)) {
      pthread_mutex_lock(&ex->mu);
      long long silent = (long long)nb__silent_ms(ex, p);
      pthread_mutex_unlock(&ex->mu);
      r->status = r->send_status = r->recv_status = NB_ERR_UNAVAILABLE;
      snprintf(r->detail, sizeof r->detail,
               "peer %s (%.100s) is not answering (nothing heard for %lld ms)", p->id, p->target,
               silent);
      continue;
    }
    nb_link_resume(p->link);
    jobs[i] = (nb__send_job_t){
        .p = p, .round = round, .frame = frame, .len = len, .deadline_ns = deadline_ns};
    if (early) {
      nb_status_t bs = nb__bg_start(p, call, round, frame, len, deadline_ns);
      if (bs != NB_OK) {
        jobs[i].st = bs;
        snprintf(jobs[i].detail, sizeof jobs[i].detail, "%s", nb_error_last());
      }
    } else if (pthread_create(&th[i], NULL, nb__sender, &jobs[i]) == 0) {
      started[i] = 1;
    } else {
      jobs[i].st = NB_ERR_SYSTEM;
      snprintf(jobs[i].detail, sizeof jobs[i].detail, "cannot start a sender thread");
    }
    pending[i] = 1;
  }
  /* Collect every peer's frame; give up on a peer whose heartbeat stopped. */
  for (;;) {
    size_t left = 0;
    for (size_t i = 0; i < n; i++) {
      if (!pending[i]) continue;
      nb_exchange_result_t* r = &results[i];
      nb__peer_t* p = ex->peers[i];
      nb_status_t rs = nb_link_rx_take(ex->rx, p->id, round, 0, &r->frame, &r->len);
      if (rs == NB_ERR_TIMEOUT && !nb_exchange_peer_alive(ex, i)) {
        pthread_mutex_lock(&ex->mu);
        long long silent = (long long)nb__silent_ms(ex, p);
        pthread_mutex_unlock(&ex->mu);
        rs = NB_ERR_UNAVAILABLE;
        snprintf(r->detail, sizeof r->detail,
                 "peer %s (%.100s) stopped answering: nothing heard for %lld ms", p->id, p->target,
                 silent);
        nb_link_cancel(p->link);
      } else if (rs == NB_ERR_TIMEOUT && nb_link_rx_newest(ex->rx, p->id) > round + early) {
        snprintf(r->detail, sizeof r->detail, "peer %s is already at round %llu, past %llu", p->id,
                 (unsigned long long)nb_link_rx_newest(ex->rx, p->id), (unsigned long long)round);
      } else if (rs == NB_ERR_TIMEOUT && deadline_ns && nb_now_ns() >= deadline_ns) {
        snprintf(r->detail, sizeof r->detail,
                 "peer %s: its frame of round %llu missed the deadline", p->id,
                 (unsigned long long)round);
      } else if (rs == NB_ERR_TIMEOUT) {
        left++;
        continue;
      } else if (rs != NB_OK) {
        snprintf(r->detail, sizeof r->detail, "peer %s: %s", p->id, nb_error_last());
      }
      r->recv_status = rs;
      pending[i] = 0;
    }
    if (left == 0) break;
    /* Sleep until something arrives (or 20 ms for the heartbeat and deadline checks). */
    for (size_t i = 0; i < n; i++) {
      if (!pending[i]) continue;
      uint8_t* f = NULL;
      size_t fl = 0;
      int64_t until = nb_now_ns() + 20000000;
      if (deadline_ns && until > deadline_ns) until = deadline_ns;
      if (nb_link_rx_take(ex->rx, ex->peers[i]->id, round, until, &f, &fl) == NB_OK) {
        results[i].frame = f;
        results[i].len = fl;
        results[i].recv_status = NB_OK;
        pending[i] = 0;
      }
      break;
    }
  }
  st = NB_OK;
  for (size_t i = 0; i < n; i++) {
    nb_exchange_result_t* r = &results[i];
    nb__peer_t* p = ex->peers[i];
    if (started[i]) {
      pthread_join(th[i], NULL);
      r->send_status = jobs[i].st;
      r->send = jobs[i].stats;
    } else if (jobs[i].p) {
      r->send_status = jobs[i].st;
    }
    /* the sends earlier early rounds left running: a peer that is gone ends them at once; a
     * refusal or a corrupt frame among them is this round's failure, any other failure of
     * theirs (the peer was down for a while) is no news about this round's frames */
    char why[256] = "";
    nb_status_t bst = NB_OK;
    if (p->bg) {
      if (!nb_exchange_peer_alive(ex, i)) nb_link_cancel(p->link);
      bst = nb__bg_reap(p, call, &r->send, why, sizeof why);
      if (r->send_status == NB_OK) r->send_status = bst;
    }
    if (r->status == NB_OK) {
      int alive = nb_exchange_peer_alive(ex, i);
      if (r->recv_status != NB_OK) {
        r->status = r->recv_status;
      } else if (jobs[i].st != NB_OK) {
        r->status = jobs[i].st;
        snprintf(r->detail, sizeof r->detail, "sending to %.60s: %.180s", r->peer, jobs[i].detail);
      } else if (bst == NB_ERR_PERMISSION || bst == NB_ERR_INTEGRITY) {
        r->status = bst;
        snprintf(r->detail, sizeof r->detail, "%s", why);
      }
      if (r->status == NB_ERR_CANCELLED && !alive) r->status = NB_ERR_UNAVAILABLE;
      if (r->status != NB_OK && !alive && r->status != NB_ERR_UNAVAILABLE) {
        r->status = NB_ERR_UNAVAILABLE;
      }
      if (r->status == NB_ERR_UNAVAILABLE && !strstr(r->detail, "answering"))
        snprintf(r->detail, sizeof r->detail, "peer %s (%.100s) stopped answering", r->peer,
                 ex->peers[i]->target);
    }
    r->newest = nb_link_rx_newest(ex->rx, ex->peers[i]->id);
    if (r->status != NB_OK) {
      nb_free(r->frame);
      r->frame = NULL;
      r->len = 0;
      if (st == NB_OK)
        st = nb_error(r->status, "exchange %s round %llu: %s", ex->self, (unsigned long long)round,
                      r->detail);
    }
  }
out:
  nb_free(jobs);
  nb_free(th);
  nb_free(started);
  nb_free(pending);
  return st;
}

nb_status_t nb_exchange_round(nb_exchange_t* ex, uint64_t round, const void* frame, size_t len,
                              int64_t deadline_ns, nb_exchange_result_t* results) {
  return nb__ex_round(ex, round, frame, len, deadline_ns, 0, results);
}

nb_status_t nb_exchange_round_early(nb_exchange_t* ex, uint64_t round, const void* frame,
                                    size_t len, int64_t deadline_ns,
                                    nb_exchange_result_t* results) {
  return nb__ex_round(ex, round, frame, len, deadline_ns, 1, results);
}

/* Waits until every background send has returned, a peer with one still running stops
 * answering (its link is cancelled), or until_ns. */
static void nb__ex_flush(nb_exchange_t* ex, int64_t until_ns) {
  while (!nb__bg_idle(ex) && nb_now_ns() < until_ns) {
    for (size_t i = 0; i < ex->n; i++)
      if (ex->peers[i]->bg && !nb_exchange_peer_alive(ex, i)) nb_link_cancel(ex->peers[i]->link);
    nb_sleep_ns(5000000LL);
  }
}

void nb_exchange_destroy(nb_exchange_t* ex) {
  if (!ex) return;
  /* the last early round's sends (its vote) still reach a live peer, which may be waiting for
   * them; bounded by NB__EX_FLUSH_NS, then cancelled with the links below */
  nb__ex_flush(ex, nb_now_ns() + NB__EX_FLUSH_NS);
  pthread_mutex_lock(&ex->mu);
  ex->stopping = 1;
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  for (size_t i = 0; i < ex->n; i++) {
    nb_link_cancel(ex->peers[i]->link);
    nb__bg_reap(ex->peers[i], 0, NULL, NULL, 0);
    if (ex->peers[i]->hb_started) pthread_join(ex->peers[i]->hb, NULL);
  }
  if (ex->rx) nb_link_rx_cancel(ex->rx);
  nb_rpc_server_destroy(ex->srv);
  for (size_t i = 0; i < ex->n; i++) {
    nb_link_destroy(ex->peers[i]->link);
    nb_seal_ctx_destroy(ex->peers[i]->seal);
    nb_free(ex->peers[i]);
  }
  nb_free(ex->peers);
  nb_link_rx_destroy(ex->rx);
  nb_free(ex->state);
  OPENSSL_cleanse(ex->secret, sizeof ex->secret);
  pthread_cond_destroy(&ex->cv);
  pthread_mutex_destroy(&ex->mu);
  nb_free(ex);
}
