/* inter/exchange: one cluster leader's side of the per-round exchange among K clusters of a job:
 * an Exchange server (Push + Ping, inter/link's receiver), one link per peer, and a heartbeat
 * (Ping) per peer so that a peer we stop hearing from is reported within its dead timeout
 * (nb_exchange_peer_alive) instead of being waited on, and Pull, which serves the published global
 * state to a peer that rejoins. A round sends our frame to every peer and receives theirs under a
 * deadline. It does not encode or aggregate frames (the codec and the trainer do). */
#ifndef NB_INTER_EXCHANGE_H
#define NB_INTER_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/alloc.h"
#include "common/status.h"
#include "inter/link.h"
#include "security/seal.h"
#include "security/tls.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_exchange nb_exchange_t;

/* Zero-initialise; zero fields take defaults. Everything is borrowed during create only. */
typedef struct {
  const char* job_id;  /* required */
  const char* self;    /* our cluster id; with tls it must match our certificate */
  const char* listen;  /* our Exchange server address, "169.254.100.1:7000" or "127.0.0.1:0" */
  const nb_tls_t* tls; /* mTLS material for the server and every link; NULL = plaintext, needs
                          allow_insecure (benchmark baselines, tests) */
  int allow_insecure;
  const uint8_t* job_secret; /* NB_SEAL_SECRET_BYTES shared by the job; NULL = frames travel
                                unsealed, needs allow_unsealed */
  int allow_unsealed;
  uint32_t streams;     /* per link; 0: NB_LINK_STREAMS */
  size_t chunk_bytes;   /* 0: NB_LINK_CHUNK_KIB */
  uint32_t window;      /* 0: NB_LINK_WINDOW */
  double rate_cap_Bps;  /* operator cap per link, bytes/s; 0 = none */
  double rate_hint_Bps; /* nominal rate per link, bytes/s, until measured (nb_link_config_t) */
  int heartbeat_ms;     /* Ping period per peer; 0: NB_EXCHANGE_HEARTBEAT_MS (250) */
  int dead_ms;          /* floor of the dead timeout: a peer we heard nothing from for this long
                           (or for the derived timeout, if longer: see nb_exchange_peer_liveness)
                           is dead; 0: NB_EXCHANGE_DEAD_MS (2000) */
} nb_exchange_config_t;

/* Outcome of one round for one peer. */
typedef struct {
  char peer[NB_LINK_ID_MAX];
  nb_status_t status; /* NB_OK: frame received and ours delivered */
  char detail[256];   /* why not, naming the peer */
  uint8_t* frame;     /* the peer's frame (nb_free, or nb_exchange_results_release) */
  size_t len;
  nb_status_t send_status;   /* our frame to the peer */
  nb_status_t recv_status;   /* the peer's frame to us */
  nb_link_send_stats_t send; /* our transfer's figures */
  uint64_t newest; /* the newest round the peer has sent us (nb_link_rx_newest), 0 = none; a
                      peer already past this round is given up on (NB_ERR_TIMEOUT) at once */
} nb_exchange_result_t;

/* Creates the exchange and starts its server (bound when this returns: nb_exchange_port).
 * Returns NB_ERR_INVALID naming a bad field, NB_ERR_UNAVAILABLE (cannot bind), NB_ERR_CRYPTO,
 * NB_ERR_RPC, NB_ERR_NOMEM. */
nb_status_t nb_exchange_create(const nb_exchange_config_t* cfg, nb_exchange_t** out);

/* The bound port of our server. */
int nb_exchange_port(const nb_exchange_t* ex);

/* Adds peer cluster `peer` reachable at `target` ("169.254.100.2:7000"): a link to it, its
 * sealing context, permission for it to push to us, and its heartbeat (started now). Before
 * the first round; not thread-safe with rounds. Returns NB_ERR_INVALID, NB_ERR_EXISTS, and the
 * errors of nb_link_create / nb_seal_ctx_create. */
nb_status_t nb_exchange_add_peer(nb_exchange_t* ex, const char* peer, const char* target);

/* Number of peers, and the link to peer i (for its estimator; borrowed). */
size_t nb_exchange_peer_count(const nb_exchange_t* ex);
nb_link_t* nb_exchange_link(nb_exchange_t* ex, size_t i);

/* 1 while peer i is alive, 0 once it was declared dead (nothing heard for its dead timeout;
 * it lives again once anything is heard from it). Thread-safe.
 *
 * Liveness rule: any bytes from the peer count (a heartbeat answer; an ack or probe answer on
 * our link; a PushOpen, chunk or Ping at our receiver; a Pull), so a peer that fills a thin link
 * with data is alive although its pings queue behind that data. The dead timeout is
 *   max(dead_ms, NB_EXCHANGE_DEAD_RTTS x RTT + NB_EXCHANGE_DEAD_CHUNKS x S x chunk / rate)
 * with RTT the larger of the smoothed and the latest heartbeat RTT (queueing included), S the
 * link's streams, chunk the largest single message in flight or next (our send's chunk, the
 * peer's incoming chunk, a probe, the chunk the next send would use) plus its seal tag, and rate
 * nb_link_rate_Bps (no chunk term while it is unknown); dead_ms is raised to three Ping periods
 * where the Ping period grows on a thin link (nb__exchange_hb_ms). A peer is pinged only after
 * a Ping period in which nothing was heard from it. */
int nb_exchange_peer_alive(nb_exchange_t* ex, size_t i);

/* Peer i's liveness figures now. */
typedef struct {
  int64_t dead_ms;                 /* the derived dead timeout */
  int64_t floor_ms;                /* the configured floor (dead_ms of the config) */
  int64_t silent_ms;               /* since we last heard from it (any path) */
  double rtt_s;                    /* the RTT the timeout used */
  double rate_Bps;                 /* the rate it used, 0 = unknown */
  size_t chunk_bytes;              /* the chunk it used (plaintext) */
  int dead;                        /* 1 when nb_exchange_peer_alive would say 0 */
  uint64_t pings_ok, pings_failed; /* heartbeats answered / not */
} nb_exchange_liveness_t;

/* Fills *out. Returns NB_ERR_INVALID for a bad index. Thread-safe. */
nb_status_t nb_exchange_peer_liveness(nb_exchange_t* ex, size_t i, nb_exchange_liveness_t* out);

/* Internal (tests): the Ping period, in ms: hb_ms, or longer on a thin link so that heartbeats
 * (about 600 wire bytes each) take at most share_pct % of rate_Bps (0 = unknown: hb_ms); at
 * most a minute. */
int64_t nb__exchange_hb_ms(int64_t hb_ms, double rate_Bps, int share_pct);

/* Internal (tests): the dead-timeout rule as a pure function, in ms (see above). */
int64_t nb__exchange_dead_ms(int64_t floor_ms, int rtts, int chunks, double rtt_s, double rate_Bps,
                             size_t chunk_wire_bytes, uint32_t streams);

/* One round: sends frame/len to every peer and receives every peer's frame of `round`, all in
 * parallel, until deadline_ns (nb_now_ns clock; 0 = none, then only heartbeats end a wait).
 * results: an array of nb_exchange_peer_count() entries, filled in peer order (release with
 * nb_exchange_results_release). A peer declared dead is given up on at once
 * (NB_ERR_UNAVAILABLE in its result, naming it and how long it has been silent).
 * Returns NB_OK when every peer succeeded; otherwise the first failing peer's status (in peer
 * order) with a detail naming it: NB_ERR_UNAVAILABLE (peer dead), NB_ERR_TIMEOUT (deadline),
 * NB_ERR_INTEGRITY, NB_ERR_PERMISSION. One round at a time. */
nb_status_t nb_exchange_round(nb_exchange_t* ex, uint64_t round, const void* frame, size_t len,
                              int64_t deadline_ns, nb_exchange_result_t* results);

/* nb_exchange_round that returns as soon as every peer's frame of `round` is here (or given up
 * on), leaving its sends running in the background on a copy of frame: a fault-tolerant round's
 * update exchange is followed by its vote without waiting for the update's final acks, and the
 * vote's own acks are not waited for (they overlap the next compute). So a result's status is
 * the receive's (NB_OK: the peer's frame is here, whether or not ours is there yet), and
 * send_status / send describe the sends that earlier early rounds left running to that peer,
 * which every round call (early or not) waits for before it returns (the vote round thus waits
 * for its update's acks, which come about when the peers' votes do); a refusal or a corrupt
 * frame among them (NB_ERR_PERMISSION, NB_ERR_INTEGRITY) fails the round for that peer, any
 * other failure of theirs is reported in send_status only. nb_exchange_destroy lets the last
 * ones finish first (at most 10 s, less when their peer stops answering). A peer that uses
 * early rounds too sends round + 1 before its frame of this round is over, so here a peer
 * counts as past this round (given up on at once) only once a frame of round + 2 or later came
 * from it (in nb_exchange_round, of round + 1 or later). */
nb_status_t nb_exchange_round_early(nb_exchange_t* ex, uint64_t round, const void* frame,
                                    size_t len, int64_t deadline_ns, nb_exchange_result_t* results);

/* The global state this cluster serves to a peer that rejoins (Exchange.Pull): the exchange
 * copies `state` (len bytes, borrowed) and serves it, sealed, until the next publish. `round`
 * (< 2^32) names this state in the seal's nonce; a new state needs a new round. Before the
 * first publish a Pull is refused with UNAVAILABLE. Thread-safe. NB_ERR_NOMEM, NB_ERR_INVALID. */
nb_status_t nb_exchange_publish_state(nb_exchange_t* ex, uint64_t round, const void* state,
                                      size_t len);

/* Pulls peer i's published state (Exchange.Pull, chunks of the link's adaptive size, at most
 * 1 MiB, each sealed under a key of its
 * own for this pull when the job seals frames), and checks the XXH3-64 of the whole state that
 * the first chunk announces. *state: nb_alloc'd (caller nb_free), *len, *round (nullable).
 * timeout_ms bounds the call (it waits for the peer to be reachable). NB_ERR_UNAVAILABLE (the
 * peer has no state yet, or cannot be reached), NB_ERR_TIMEOUT, NB_ERR_INTEGRITY (a chunk does
 * not open or the hash differs), NB_ERR_CODEC (malformed chunks), NB_ERR_PERMISSION. */
nb_status_t nb_exchange_pull(nb_exchange_t* ex, size_t i, int64_t timeout_ms, uint8_t** state,
                             size_t* len, uint64_t* round);

/* nb_exchange_round for a caller that only wants the frames (the hybrid's exchange callbacks):
 * n must be the peer count; frames[i] receives peer i's frame, handed over (nb_free), when the
 * round is NB_OK, else {NULL, 0}; names[i] (nullable) its id; *bytes_sent (nullable) the bytes
 * we delivered. A peer that failed in a failed round is logged (WARN). Returns what
 * nb_exchange_round returns, NB_ERR_INTERNAL for a wrong n. */
nb_status_t nb_exchange_round_take(nb_exchange_t* ex, uint64_t round, const void* frame, size_t len,
                                   int64_t deadline_ns, size_t n, nb_bytes_t* frames,
                                   char (*names)[NB_LINK_ID_MAX], uint64_t* bytes_sent);

/* Frees the frames held by results (n entries) and zeroes them. */
void nb_exchange_results_release(nb_exchange_result_t* results, size_t n);

/* Stops the heartbeats, the server and the links, and frees everything. NULL ok. */
void nb_exchange_destroy(nb_exchange_t* ex);

#ifdef __cplusplus
}
#endif
#endif
