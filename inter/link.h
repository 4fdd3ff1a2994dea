/* inter/link: a link to one peer cluster over the Exchange service. The sender side cuts a frame
 * (opaque bytes) into chunks, seals each (security/seal), and moves them over S parallel Push
 * streams on S separate TCP connections with a bounded in-flight window per stream, resumes from
 * the acknowledged chunks after a connection drop, honours an operator bandwidth cap and feeds
 * the link's estimator. The receiver side (nb_link_rx_*) serves Push and Ping on an inter/rpc
 * server, opens and reassembles chunks from any stream, acknowledges, and rejects tampered or
 * replayed data. It does not decide what a frame contains (the codec does) nor who exchanges
 * with whom (inter/exchange does). */
#ifndef NB_INTER_LINK_H
#define NB_INTER_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "inter/estimator.h"
#include "inter/ratelimit.h"
#include "inter/rpc.h"
#include "security/seal.h"
#include "security/tls.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_LINK_METHOD_PUSH "/nebula.v1.Exchange/Push"
#define NB_LINK_METHOD_PING "/nebula.v1.Exchange/Ping"
#define NB_LINK_ID_MAX 64 /* longest job / cluster id, including the NUL */

/* ------------------------------------------------------------------ sender */

typedef struct nb_link nb_link_t;

/* Configuration of a link. Zero-initialise; zero fields take the NB_LINK_* defaults. Strings
 * and pointers are borrowed for the duration of nb_link_create only, except `seal`, which must
 * outlive the link. */
typedef struct {
  const char* job_id;        /* required */
  const char* local_cluster; /* our cluster id (the `sender` of our transfers); required */
  const char* peer_cluster;  /* the receiving cluster; with tls its certificate must say so */
  const char* target;        /* the peer's Exchange server, "169.254.100.2:7000"; required */
  const nb_tls_t* tls;       /* mTLS material; NULL = plaintext, needs allow_insecure */
  int allow_insecure;
  const char* server_name; /* with tls: name to check instead of the target's host (optional) */
  nb_seal_ctx_t* seal;     /* sealing of local -> peer; NULL = chunks travel unsealed, which
                              needs allow_unsealed (benchmark baselines only) */
  int allow_unsealed;
  uint32_t streams;     /* parallel streams / TCP connections; 0: NB_LINK_STREAMS (4) */
  size_t chunk_bytes;   /* largest plaintext bytes per chunk; 0: NB_LINK_CHUNK_KIB (1024) KiB.
                           Chunks adapt to the rate (see chunk_ms) unless fixed_chunks */
  uint32_t window;      /* chunks in flight per stream; 0: NB_LINK_WINDOW (8) */
  double rate_cap_Bps;  /* operator cap over all streams, bytes/s; 0 = none */
  double rate_hint_Bps; /* the link's nominal rate, bytes/s (a contracted or emulated rate), used
                           by nb_link_rate_Bps while nothing is measured or capped, so the first
                           chunks and dead timeouts fit a thin link; 0 = none */
  int64_t stall_ms;     /* a stream without an ack for this long is dropped and reopened;
                           0: NB_LINK_STALL_MS */
  int64_t chunk_ms;     /* adaptive chunks: each send picks chunks of rate * chunk_ms / streams
                           bytes (rate: nb_link_rate_Bps), within [NB_LINK_CHUNK_MIN_KIB,
                           chunk_bytes], so one chunk takes about chunk_ms on its stream and
                           acknowledgements keep arriving on a thin link; 0: NB_LINK_CHUNK_MS */
  int fixed_chunks;     /* 1: every chunk is chunk_bytes, whatever the rate */
} nb_link_config_t;

/* What one nb_link_send did. */
typedef struct {
  uint64_t bytes;        /* frame bytes delivered */
  uint32_t chunks;       /* chunks in the frame */
  uint64_t chunks_sent;  /* chunk messages sent, resends included */
  uint32_t resumed_from; /* largest next_chunk a reopened stream was told to resume from */
  uint32_t reconnects;   /* streams dropped and reopened */
  double seconds;        /* first open to completion */
  double goodput_Bps;    /* bytes / seconds */
  uint32_t chunk_bytes;  /* plaintext bytes per chunk this send used (the last one shorter) */
} nb_link_send_stats_t;

/* Creates a link: S clients (one TCP connection each, connecting lazily) for data, one for
 * bandwidth probes and one for heartbeat pings only, so heartbeats never queue behind chunks or
 * a probe's payload in a connection, and never wait in the rate cap's bucket (only chunks and
 * probes are charged to it). cfg: see above. out: destroy with nb_link_destroy. Returns
 * NB_ERR_INVALID naming a bad field, NB_ERR_RPC, NB_ERR_NOMEM. */
nb_status_t nb_link_create(const nb_link_config_t* cfg, nb_link_t** out);

/* Cancels a send in progress (NB_ERR_CANCELLED) and joins nothing; then frees. NULL ok. No
 * other thread may be inside nb_link_send when it is called. */
void nb_link_destroy(nb_link_t* link);

/* Moves one frame to the peer as transfer (local_cluster, round) and blocks until the receiver
 * confirmed it (every chunk opened and the frame's xxh3 matched) or it failed. One frame per
 * round and direction: the seal's nonces are (round, chunk). frame/len: borrowed, len >= 1.
 * deadline_ns: nb_now_ns() clock, 0 = none. frame_header: optional bytes authenticated with every
 * chunk (may be NULL/0). stats: may be NULL. The chunk size is nb_link_chunk_bytes() at the
 * start: the smallest while the link has no rate yet (no cap, nothing measured), so the first
 * transfer keeps acks coming on any link and measures the rate for the next.
 * A stream's chunks follow its PushOpen at once (the open's ack comes first on the stream), so
 * the frame is at the receiver one-way delay after its last chunk leaves.
 * A dropped connection is reopened with backoff (100 ms doubling to 2 s), waiting for the open's
 * ack this time, and the transfer resumes from the acknowledged chunks. Returns NB_OK;
 * NB_ERR_INTEGRITY (the receiver found a chunk or the frame corrupt: not retried);
 * NB_ERR_PERMISSION (refused: certificate, identity, or the receiver rejected the transfer, e.g. a
 * replayed round); NB_ERR_TIMEOUT (deadline); NB_ERR_CANCELLED (nb_link_cancel); NB_ERR_INVALID.
 * The detail names the peer. On success the estimator gets (len, seconds, streams). Sends of
 * different rounds may overlap (an exchange's vote starts while its update waits for the final
 * ack), up to 4 reached directly by nb_link_cancel (more end at its flag, within 100 ms). */
nb_status_t nb_link_send(nb_link_t* link, uint64_t round, const void* frame, size_t len,
                         const void* frame_header, size_t header_len, int64_t deadline_ns,
                         nb_link_send_stats_t* stats);

/* From any thread: makes a send in progress (and every later one, until nb_link_resume) return
 * NB_ERR_CANCELLED promptly, cancelling its streams. Used when a heartbeat declares the peer
 * dead. */
void nb_link_cancel(nb_link_t* link);
/* Clears a cancellation. Thread-safe. */
void nb_link_resume(nb_link_t* link);

/* One Ping to the peer: without payload (a heartbeat) on the heartbeat connection, with payload
 * on the probe connection. timeout_ms bounds it. *rtt_s (may be NULL) gets the round trip, which
 * also feeds the estimator. payload_bytes: probe bytes sent along (0 for a heartbeat). An answer
 * counts as hearing from the peer (nb_link_last_heard_ns). Returns NB_OK, NB_ERR_TIMEOUT,
 * NB_ERR_UNAVAILABLE, NB_ERR_PERMISSION, NB_ERR_REMOTE (a reply from someone other than
 * peer_cluster), others from nb_rpc_unary. Thread-safe, may run during a send. */
nb_status_t nb_link_ping(nb_link_t* link, int64_t timeout_ms, size_t payload_bytes, double* rtt_s);

/* One bandwidth probe: `bytes` (1 B .. 4 MiB) of payload in a Ping on the control connection,
 * after passing the operator's cap like data. Its time feeds the estimator as a probe
 * (nb_estimator_add_probe: bytes / (time - min RTT)), so links whose frames are too small to
 * measure bandwidth still get a goodput estimate that follows the link. *goodput_Bps (may be
 * NULL) gets the sample. Heartbeats that overlap a probe are not used as RTT samples. Returns
 * NB_ERR_INVALID for a bad size, else as nb_link_ping. Thread-safe. */
nb_status_t nb_link_probe(nb_link_t* link, size_t bytes, int64_t timeout_ms, double* goodput_Bps);

/* Starts (or re-tunes) a background thread that probes every interval_ms (>= 10; 0 =
 * NB_LINK_PROBE_MS) with `bytes` (0 = NB_LINK_PROBE_KIB),
 * skipping while a send is in progress, and spacing probes so that they take at most
 * NB_LINK_PROBE_SHARE_PCT of the time. Stopped by nb_link_probe_stop or nb_link_destroy.
 * Returns NB_ERR_INVALID for bad values, NB_ERR_SYSTEM. Thread-safe. */
nb_status_t nb_link_probe_start(nb_link_t* link, size_t bytes, int64_t interval_ms);

/* Stops the probe thread (waits for a probe in flight, at most its 5 s timeout). NULL ok. */
void nb_link_probe_stop(nb_link_t* link);

/* The link's goodput/RTT estimator, fed by every completed send and every ping; the scheduler
 * reads it (nb_estimator_get / nb_estimator_predict_s). Borrowed, valid for the link's lifetime. */
nb_estimator_t* nb_link_estimator(nb_link_t* link);

/* The counters of the link's rate-cap bucket (bytes granted to chunks and probes, acquires,
 * waits). Zeroed for link NULL. Thread-safe. */
void nb_link_ratelimit_stats(nb_link_t* link, nb_ratelimit_stats_t* out);

/* Changes the operator cap at run time (0 = none). Returns NB_ERR_INVALID for a bad rate. */
nb_status_t nb_link_set_rate_cap(nb_link_t* link, double rate_Bps);

/* The rate the link plans chunks and liveness with, bytes/s: the smallest of the operator cap,
 * the estimator's smoothed goodput and the goodput of the latest send of at least 64 KiB
 * (probes, which the estimator mixes in, can overestimate a shaped link); 0 while none is
 * known. Thread-safe. */
double nb_link_rate_Bps(nb_link_t* link);

/* The plaintext chunk size a send would use now: rate * chunk_ms / streams within
 * [NB_LINK_CHUNK_MIN_KIB, chunk_bytes]; chunk_bytes with fixed_chunks; the smallest while the
 * rate is unknown. Thread-safe. */
size_t nb_link_chunk_bytes(nb_link_t* link);

/* nb_now_ns() when bytes from the peer last arrived on this link's connections: an ack of a
 * chunk or of a PushOpen, a heartbeat's or a probe's answer. 0 = never. Thread-safe. */
int64_t nb_link_last_heard_ns(nb_link_t* link);

/* What a liveness check needs to know about the link now (see inter/exchange's dead rule). */
typedef struct {
  int64_t last_heard_ns;   /* nb_link_last_heard_ns */
  double rtt_s;            /* max(smoothed RTT, latest heartbeat RTT): queueing included */
  double rate_Bps;         /* nb_link_rate_Bps, 0 = unknown */
  int sending;             /* a send is in progress */
  size_t chunk_bytes;      /* plaintext bytes per chunk of that send, 0 when none */
  size_t chunk_next;       /* nb_link_chunk_bytes: what the next send (and a probe) would use */
  uint32_t streams;        /* the link's streams (a send of few chunks uses fewer) */
  size_t probe_bytes;      /* payload of probes in progress */
  uint32_t seal_tag_bytes; /* wire bytes a chunk carries beyond its plaintext */
} nb_link_liveness_t;

/* Fills *out (zeroed for link NULL). Thread-safe. */
void nb_link_liveness(nb_link_t* link, nb_link_liveness_t* out);

/* Internal (tests): the chunk size rule of nb_link_chunk_bytes as a pure function. chunk_ms 0 =
 * fixed (returns max); rate 0 = unknown (returns min). */
size_t nb__link_chunk_for_rate(double rate_Bps, uint32_t streams, int64_t chunk_ms, size_t min,
                               size_t max);

/* Internal (tests): 1 when a completed send of len bytes measures the link's rate (is a transfer
 * sample): it must be at least 8 bandwidth-delay products long at the configured rate (the cap,
 * else the hint, bytes/s) and the minimum RTT (s), or its time is TCP's slow start after the
 * idle gap between rounds. Without a configured rate or an RTT, 1: the measured goodput cannot
 * judge its own samples (on loopback its bandwidth-delay product is megabytes, and no frame
 * would measure anything after the first). */
int nb__link_send_measures_rate(size_t len, double nominal_Bps, double rtt_min_s);

/* The peer cluster id and target of the link (borrowed). */
const char* nb_link_peer(const nb_link_t* link);
const char* nb_link_target(const nb_link_t* link);

/* ---------------------------------------------------------------- receiver */

typedef struct nb_link_rx nb_link_rx_t;

typedef struct {
  const char* job_id;        /* required; transfers of other jobs are rejected */
  const char* local_cluster; /* our cluster id (the Ping responder); required */
  int allow_plaintext;       /* accept callers without a certificate (plaintext servers) */
  int allow_unsealed;        /* accept peers added without a seal context (baselines only) */
  uint64_t max_frame_bytes;  /* 0: NB_LINK_MAX_FRAME_MB */
} nb_link_rx_config_t;

typedef struct {
  uint64_t chunks;             /* chunks accepted */
  uint64_t duplicates;         /* chunks received again (resends after a drop), dropped */
  uint64_t integrity_failures; /* chunks or frames that failed a check */
  uint64_t rejected;           /* opens or chunks refused (replayed round, bad key, identity) */
  uint64_t frames;             /* frames completed */
  uint64_t opens;              /* PushOpen messages (resumes included) */
} nb_link_rx_stats_t;

/* Creates a receiver. cfg: borrowed. Returns NB_ERR_INVALID, NB_ERR_NOMEM, NB_ERR_SYSTEM. */
nb_status_t nb_link_rx_create(const nb_link_rx_config_t* cfg, nb_link_rx_t** out);

/* Frees the receiver and every frame not taken. The servers it was registered with must be
 * destroyed first. NULL ok. */
void nb_link_rx_destroy(nb_link_rx_t* rx);

/* Lets cluster `peer` send to us; chunks are opened with `seal` (borrowed, must outlive rx; the
 * same context as the peer's link to us uses, i.e. nb_seal_ctx_create(secret, job, us, peer)).
 * seal NULL = the peer's chunks are not sealed (needs allow_unsealed). Before any transfer of that
 * peer. Returns NB_ERR_INVALID, NB_ERR_EXISTS, NB_ERR_NOMEM. Thread-safe. */
nb_status_t nb_link_rx_add_peer(nb_link_rx_t* rx, const char* peer, nb_seal_ctx_t* seal);

/* Adds the Push and Ping handlers to srv (before nb_rpc_server_start). The receiver keeps its
 * transfers across servers: a server may be destroyed and another registered (a restart), and
 * interrupted transfers resume. Returns what nb_rpc_server_add_method returns. */
nb_status_t nb_link_rx_register(nb_link_rx_t* rx, nb_rpc_server_t* srv);

/* Waits until the frame of (sender, round) is complete and hands it over: *frame (caller frees
 * with nb_free) and *len. deadline_ns: nb_now_ns() clock; 0 = only look, do not wait.
 * Returns NB_OK; NB_ERR_TIMEOUT (not complete by the deadline; it may still complete later);
 * NB_ERR_INTEGRITY (the transfer failed its checks); NB_ERR_NOT_FOUND (already taken);
 * NB_ERR_CANCELLED (nb_link_rx_cancel); NB_ERR_INVALID. Thread-safe. */
nb_status_t nb_link_rx_take(nb_link_rx_t* rx, const char* sender, uint64_t round,
                            int64_t deadline_ns, uint8_t** frame, size_t* len);

/* What the receiver heard from one peer. */
typedef struct {
  int64_t last_heard_ns; /* nb_now_ns() of the latest message from it (PushOpen, chunk, Ping),
                            0 = none yet */
  uint32_t chunk_bytes;  /* chunk size of its transfer still arriving, 0 when none */
  uint64_t messages;     /* messages received from it */
} nb_link_rx_peer_t;

/* Fills *out for `peer` (added with nb_link_rx_add_peer). A Ping counts when its sender field
 * names the peer and, on a TLS server, the caller's certificate is that peer. Returns NB_OK,
 * NB_ERR_NOT_FOUND (not a peer), NB_ERR_INVALID. Thread-safe. */
nb_status_t nb_link_rx_peer(nb_link_rx_t* rx, const char* peer, nb_link_rx_peer_t* out);

/* The newest round of any transfer `sender` opened to us (complete, taken or still arriving),
 * 0 when none: a sender already past the round we wait for will not send it. Thread-safe. */
uint64_t nb_link_rx_newest(nb_link_rx_t* rx, const char* sender);

/* Wakes every nb_link_rx_take with NB_ERR_CANCELLED (shutdown). Thread-safe. */
void nb_link_rx_cancel(nb_link_rx_t* rx);

void nb_link_rx_stats(nb_link_rx_t* rx, nb_link_rx_stats_t* out);

/* The associated data every chunk is sealed with (for tests and other implementations):
 * "nbx1" || transfer_id (8 bytes BE) || frame_size (8, BE) || chunk_size (4, BE) ||
 * chunk_count (4, BE) || frame_header. job, sender, receiver are in the key, round and chunk in
 * the nonce. Writes at most cap bytes to buf and returns the full length. */
size_t nb_link_chunk_aad(uint64_t transfer_id, uint64_t frame_size, uint32_t chunk_size,
                         uint32_t chunk_count, const void* header, size_t header_len, uint8_t* buf,
                         size_t cap);

/* Internal (tests): the wire bytes of PushRequest{chunk: PushChunk{transfer_id, index, offset,
 * data, crc32}} exactly as protobuf-c packs them, written around a data field of data_len bytes
 * that is left for the caller: *data_at is where it starts. out NULL: only returns the length. */
size_t nb__link_chunk_encode(uint8_t* out, uint64_t transfer_id, uint32_t index, uint64_t offset,
                             size_t data_len, uint32_t crc32, size_t* data_at);

/* The transfer id nb_link_send uses for (round): one frame per round and direction. */
uint64_t nb_link_transfer_id(uint64_t round);

#ifdef __cplusplus
}
#endif
#endif
