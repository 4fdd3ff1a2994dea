/* nebula.h: the public C API of libnebula. A session per cluster leader syncs the caller's own
 * fp32 or bf16 tensors with the other clusters of a job, one blocking outer round (DiLoCo-style)
 * after every H inner steps that the caller runs itself. It is not a training loop, an
 * intra-cluster communicator or a job launcher: the caller's program owns its model, data and
 * optimizer.
 *
 * Usage (docs/api.md has a complete example):
 *   nb_session_options_t o;
 *   nb_session_options_default(&o);   // or nb_session_options_from_env(&o) under a launcher
 *   o.job_id = "demo"; o.cluster_id = "a"; o.cluster_index = 0; o.n_clusters = 2; ...
 *   nb_session_open(&o, &s);
 *   nb_session_register(s, "w", w, shape, 2);       // borrowed, before start
 *   nb_session_start(s);                              // agree on the table; theta from cluster 0
 *   for (;;) { run H inner steps on w; nb_session_round(s, samples, &r); }
 *   nb_session_save(s, path);                         // a checkpoint, between rounds
 *   nb_session_close(s);
 *
 * Errors: every fallible function returns an nb_status_t; nb_error_last() then holds a one-line
 * message naming what was wrong (thread-local: read it on the thread that got the error).
 * Thread safety: one thread at a time per session; distinct sessions are independent.
 * Only the names declared here are exported by libnebula. */
#ifndef NEBULA_H
#define NEBULA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NEBULA_VERSION_MAJOR 0
#define NEBULA_VERSION_MINOR 1
#define NEBULA_VERSION_PATCH 0

/* Status codes. nebula's internals take them from here too (common/status.h): append-only. */
typedef enum {
  NB_OK = 0,
  NB_ERR_INVALID = 1,      /* invalid argument or malformed input from the caller */
  NB_ERR_SYSTEM = 2,       /* an OS call failed (errno in the message) */
  NB_ERR_NOMEM = 3,        /* allocation failed */
  NB_ERR_CUDA = 4,         /* CUDA runtime or driver error */
  NB_ERR_NCCL = 5,         /* NCCL error */
  NB_ERR_MPI = 6,          /* MPI error */
  NB_ERR_RPC = 7,          /* gRPC transport or call failure */
  NB_ERR_CRYPTO = 8,       /* OpenSSL failure (not an integrity failure) */
  NB_ERR_INTEGRITY = 9,    /* bad tag, bad checksum, hash mismatch: never retried silently */
  NB_ERR_CODEC = 10,       /* a frame or encoded buffer is malformed */
  NB_ERR_TIMEOUT = 11,     /* a deadline passed */
  NB_ERR_REMOTE = 12,      /* the peer reported an error */
  NB_ERR_UNSUPPORTED = 13, /* not built in or not available on this machine */
  NB_ERR_NOT_FOUND = 14,   /* a named thing does not exist */
  NB_ERR_EXISTS = 15,      /* a thing that must not exist does */
  NB_ERR_PERMISSION = 16,  /* authenticated but not allowed */
  NB_ERR_CONFIG = 17,      /* a configuration or descriptor is invalid */
  NB_ERR_IO = 18,          /* a file is unreadable, truncated or could not be written */
  NB_ERR_CANCELLED = 19,   /* the operation was cancelled */
  NB_ERR_UNAVAILABLE = 20, /* a peer or resource is not reachable now (may be transient) */
  NB_ERR_INTERNAL = 21,    /* an invariant of nebula itself was broken: a bug */
  NB_STATUS_COUNT_
} nb_status_t;

/* Short constant name of a status ("NB_ERR_CONFIG"); never NULL. Thread-safe. */
const char* nb_status_name(nb_status_t st);
/* One-line description of a status; never NULL. Thread-safe. */
const char* nb_status_str(nb_status_t st);
/* The message of the last error on this thread, or "" when none. Valid until this thread's next
 * call into libnebula. */
const char* nb_error_last(void);

/* ---- the session ------------------------------------------------------------------------- */

typedef struct nb_session nb_session_t;

/* Where a session is, what it talks to and how it syncs. Fill with nb_session_options_default
 * (or nb_session_options_from_env), then set at least job_id, cluster_id, the cluster index and
 * count, listen and (with several clusters) peers, and either pki_dir or insecure, and either
 * job_secret or unsealed. Every pointer is borrowed during nb_session_open only. Every cluster of a
 * job must give the same n_clusters, outer_lr and outer_momentum (nb_session_start checks). */
#define NB_SESSION_NORM_BOUND_DEFAULT 100.0

typedef struct {
  const char* job_id;       /* names the job: in the sealing keys and the exchange; required */
  const char* cluster_id;   /* our cluster's id ([A-Za-z0-9._-]); with pki_dir, our certificate's */
  uint32_t cluster_index;   /* our position in the cluster order, < n_clusters; cluster 0's values
                               are everyone's starting theta_global */
  uint32_t n_clusters;      /* 1..64; default 1 */
  const char* listen;       /* our exchange server, "host:port"; port 0 picks a free one
                               (nb_session_port); default "127.0.0.1:0" */
  const char* const* peers; /* n_peers entries "id=host:port", one per other cluster; more can
                               be added with nb_session_add_peer before start */
  size_t n_peers;
  const char* pki_dir;       /* a `nebula certs` folder: ca.crt and clusters/<cluster_id>.{crt,key};
                                every connection is then mutual TLS */
  int insecure;              /* 1: plaintext gRPC without pki_dir (tests on loopback only) */
  const uint8_t* job_secret; /* 32 bytes shared by the job's clusters: frames are sealed
                                (AES-256-GCM, keys per job and direction) */
  int unsealed;              /* 1: frames travel unsealed without job_secret (tests only) */
  long inner_steps;          /* H: the inner steps the caller runs per round (>= 1; default 50);
                                it only labels the messages: the caller counts its own steps */
  float outer_lr;            /* outer Nesterov learning rate (> 0; default 0.7) */
  float outer_momentum;      /* [0, 1); default 0.9 */
  double density;            /* top-k fraction of the update sent per round, (0, 1]; 1 = a dense
                                frame; default 0.01 */
  const char* values;        /* value type on the wire: "fp32", "fp16", "bf16", "int8", "4bit",
                                "2bit"; default "int8". "auto" (needs adaptive): each round the
                                scheduler picks a whole codec point (value type, density,
                                chunked top-k) from the table `nebula bench pareto` measured,
                                the least loss whose transfer fits (docs/api.md "Adaptive
                                density"); the round names it in `point` */
  int error_feedback;        /* 1 (default): keep what top-k and quantization dropped and send it
                                in later rounds */
  double peer_timeout_s;     /* a peer silent for this long is dead (its round fails with
                                NB_ERR_UNAVAILABLE); 0 = the exchange's default (2 s, longer on a
                                slow link) */
  double update_norm_bound;  /* refuse a round whose summed update has an L2 norm above this many
                                times the median of the last 8 applied rounds' (once 3 were
                                applied): on every cluster, naming the cluster that sent the
                                largest part, nothing applied. Every cluster must give the same.
                                0 = off; default NB_SESSION_NORM_BOUND_DEFAULT (100) */
  int fault_tolerant;        /* 1: fault-tolerant rounds (docs/api.md "Faults"): a round counts
                                on every cluster or on none (an update, then a vote); a peer that
                                is dead, unreachable or late costs the round (nb_session_round
                                returns NB_OK with applied 0: the progress stays in our buffers
                                and goes into the next round), not the session; a cluster that
                                restarts rejoins with `rejoin`. Every cluster must give the
                                same; needs update_norm_bound 0; blocking or overlapped rounds.
                                Default 0 */
  double round_deadline_s;   /* fault-tolerant rounds: how long one exchange waits for a peer
                                before the round goes on without it (> 0; default 30) */
  double final_wait_s;       /* fault-tolerant rounds: how long nb_session_finish keeps asking a
                                peer that has not answered the final check (>= 0; default 30) */
  int rejoin;                /* 1 (fault-tolerant rounds): nb_session_start pulls the global
                                state (theta_global, momentum, round) from a live peer instead of
                                agreeing at the job's start: a restarted cluster joins the running
                                job. Its tensor table must equal the peer's. Default 0 */
  double rejoin_timeout_s;   /* how long start keeps trying to pull (> 0; default 60) */
  double start_timeout_s;    /* how long nb_session_start waits for every peer to answer (its
                                program may still be starting) before the tensor table is
                                agreed (> 0; default 120): NB_ERR_UNAVAILABLE naming the peer */
  const char* progress_file; /* NULL (default): none; else a file that gets one JSON line per
                                round (round, step, density, wan_mbps, bytes_sent, samples, source,
                                global_xxh3), appended: how a gateway shows a program's rounds */
  const char* metrics_listen;  /* NULL or "" (default): none; else "HOST:PORT" (port 0 picks a
                                  free one: nb_session_metrics_port) where the session serves the
                                  cluster leader's Prometheus metrics at GET /metrics, updated
                                  after each round (docs/operations.md); an empty host is
                                  loopback. nb_session_open fails when it cannot serve there */
  int adaptive;                /* 1: each round's density is chosen from the measured link and
                                  the caller's compute (docs/api.md "Adaptive density"): the
                                  largest in [density_min, density_max] whose frame crosses the
                                  slowest peer link within the compute the exchange hides under
                                  (overlapped rounds: the caller's time between round_begin and
                                  round_end; blocking ones: a tenth of its time between rounds),
                                  as `nebula worker` chooses it; `density` until the link and the
                                  compute are measured. Every cluster decides its own (frames say
                                  theirs). Default 0: `density` every round */
  double density_min;          /* adaptive: the lowest density, (0, density_max]; default 0.0001 */
  double density_max;          /* adaptive: the highest density, (0, 1]; default 1 */
  double rate_mbit;            /* the link's rate per peer in Mbit/s, as an operator caps it: our
                                  sends are held to it, and adaptive density takes it as the
                                  link's rate until a transfer has measured the link, and as the
                                  bound of what is measured after. 0 (default): no cap */
  double error_feedback_decay; /* beta in (0, 1]: each round the error-feedback residual is
                                  scaled by beta before the new Delta joins it (SparseLoCo's
                                  e <- beta e + Delta; 0.85-0.9 with 2-bit values, docs/hybrid.md);
                                  default 1: all of it is kept */
  uint32_t topk_chunk;         /* chunked top-k (the thin link's points, docs/hybrid.md):
                                  0 (default) the codec's (the top-k of the whole update);
                                  C, a power of two in [16, 65536]: every chunk of C values
                                  sends its own top share, its indices Golomb-Rice coded
                                  (about 6.6 bits each at 3 % instead of 12 and more).
                                  values "auto" sets it per point */
  int eager;                   /* overlapped rounds with a sparse frame (density < 1): 1
                                  (default) round_begin moves the caller's buffers to where the
                                  round will land as far as this cluster knows it (the outer step
                                  on its share of the frame it sent), so that the steps until
                                  round_end train on a model that holds most of the update
                                  (docs/api.md "The overlapped round"); 0: they train on from
                                  their own values. The built-in worker's sync.eager */
  void* env_storage;           /* owned by the options when nb_session_options_from_env filled
                                  them (the strings, peers and secret it read; freed by
                                  nb_session_options_free); NULL otherwise: leave it alone */
} nb_session_options_t;

/* Fills *o with the defaults above (NULL pointers, one cluster, H 50, outer lr 0.7, momentum 0.9,
 * density 0.01, "int8", error feedback without decay, adaptive off, density range [0.0001, 1], no
 * rate cap). */
void nb_session_options_default(nb_session_options_t* o);

/* Fills *o from the environment a launcher sets: the defaults (nb_session_options_default), then
 * every variable that is set (docs/api.md, "The environment"):
 *   NEBULA_JOB_ID, NEBULA_CLUSTER_ID, NEBULA_LISTEN, NEBULA_PKI_DIR, NEBULA_VALUES   text
 *   NEBULA_CLUSTER_INDEX, NEBULA_N_CLUSTERS (1..64), NEBULA_INNER_STEPS (>= 1)     integers
 *   NEBULA_OUTER_LR (> 0), NEBULA_OUTER_MOMENTUM ([0, 1)), NEBULA_DENSITY ((0, 1]) numbers
 *   NEBULA_UPDATE_NORM_BOUND (0 = off, or >= 1), NEBULA_PEER_TIMEOUT_S ([0, 86400]) numbers
 *   NEBULA_DENSITY_MIN, NEBULA_DENSITY_MAX ((0, 1]), NEBULA_RATE_MBIT (>= 0)       numbers
 *   NEBULA_TOPK_CHUNK (0, or a power of two in [16, 65536])                       integer
 *   NEBULA_ERROR_FEEDBACK, NEBULA_ADAPTIVE, NEBULA_EAGER   "0" or "1"
 *   NEBULA_PEERS              "id=host:port,id=host:port" (one per other cluster; "" = none)
 *   NEBULA_JOB_SECRET_FILE    a file of exactly 32 bytes, or 64 hex digits (one trailing
 *                             newline allowed); a regular file that neither group nor others
 *                             may access (chmod 600)
 *   NEBULA_INSECURE, NEBULA_UNSEALED   "0" or "1" (tests only)
 *   NEBULA_PROGRESS_FILE      a path: progress_file
 *   NEBULA_METRICS_LISTEN     "HOST:PORT": metrics_listen
 * A variable that is not set keeps its default, so the caller may set fields afterwards
 * (nb_session_open checks that the required ones are there). The strings, the peer list and the
 * secret are copied into storage that *o owns (o->env_storage): they stay valid until
 * nb_session_options_free(o), which the caller calls once the session is open (or not needed);
 * fields the caller sets itself stay the caller's. An owned block rather than static storage, so
 * that the call is thread-safe, two option sets can coexist, and the secret's bytes are wiped
 * when freed. Returns NB_ERR_CONFIG naming the variable that is malformed or out of range, or
 * the secret file that is unreadable, of the wrong size or too open; NB_ERR_INVALID (o NULL),
 * NB_ERR_NOMEM. On error *o holds the defaults and owns nothing. *o is overwritten: free options
 * that own storage before filling them again, and free a struct copied from them only once.
 * Thread-safe (it only reads the environment: do not setenv concurrently). */
nb_status_t nb_session_options_from_env(nb_session_options_t* o);

/* Fills *o from a job descriptor (a `nebula validate` file, docs/descriptor.md) for cluster
 * `cluster_id` of it: job_id = metadata.name, n_clusters and cluster_index from spec.clusters,
 * inner_steps, outer_lr, outer_momentum (sync), density (compression.density.initial), values,
 * error_feedback, error_feedback_decay, adaptive, density_min and density_max (compression),
 * rate_mbit (link.rateMbit),
 * peer_timeout_s, and unsealed when security.seal is false: the same mapping
 * a gateway's launcher uses for NEBULA_* (one implementation). What belongs to the deployment is
 * left to the caller: listen, peers, pki_dir (or insecure), job_secret. Storage as
 * nb_session_options_from_env (free it with nb_session_options_free). NB_ERR_CONFIG naming the
 * first problem of the descriptor (`$.spec...`), or a cluster_id that is not in it (the ids it
 * has are listed); NB_ERR_IO (unreadable file), NB_ERR_INVALID (NULL), NB_ERR_NOMEM. On error
 * *o holds the defaults and owns nothing. */
nb_status_t nb_session_options_from_descriptor(nb_session_options_t* o, const char* path,
                                               const char* cluster_id);

/* Frees what nb_session_options_from_env (or _from_descriptor) stored in *o (wiping the secret) and
 * clears the fields that pointed into it; the other fields are left as they are. NULL, or options
 * that own nothing, ok. */
void nb_session_options_free(nb_session_options_t* o);

/* Opens a session: validates the options, loads the PKI, and starts our exchange server (bound
 * when this returns). Nothing is sent yet. *out: the session (nb_session_close frees it); NULL on
 * error. Returns NB_ERR_INVALID (a NULL or malformed field, naming it), NB_ERR_CONFIG (values out
 * of range, a peer list that does not fit n_clusters, insecure/unsealed missing), NB_ERR_IO or
 * NB_ERR_CRYPTO (the PKI folder's files), NB_ERR_UNAVAILABLE (cannot bind listen), NB_ERR_RPC,
 * NB_ERR_NOMEM. */
nb_status_t nb_session_open(const nb_session_options_t* o, nb_session_t** out);

/* The bound port of our exchange server (for listen "host:0"); -1 for a one-cluster session. */
int nb_session_port(const nb_session_t* s);

/* The bound port of the metrics endpoint (for metrics_listen "host:0"); -1 without one.
 * Thread-safe. */
int nb_session_metrics_port(const nb_session_t* s);

/* Adds a peer cluster "id=host:port" (borrowed during the call), before nb_session_start.
 * NB_ERR_INVALID (malformed text, after start), NB_ERR_EXISTS (an id given twice), NB_ERR_CONFIG
 * (more peers than n_clusters - 1), and the link's errors. */
nb_status_t nb_session_add_peer(nb_session_t* s, const char* peer);

/* Element types of a registered tensor (nb_session_register_dtype). */
typedef enum {
  NB_DTYPE_FP32 = 0, /* IEEE binary32 */
  NB_DTYPE_BF16 = 1, /* bfloat16: the upper 16 bits of a binary32, as uint16_t */
  NB_DTYPE_FP16 = 2  /* IEEE binary16 bits, as uint16_t */
} nb_dtype_t;

/* Registers a synced tensor before nb_session_start: `data` holds prod(shape) fp32 values on the
 * host, borrowed: it must stay valid, at this address, until nb_session_close. The session reads
 * it at each round and writes theta_global into it. `name` (copied; 1..127 bytes, unique) and
 * `shape` (ndim entries >= 1, copied; ndim 0..8, 0 = a scalar) must match the other clusters'
 * tensor of the same position. NB_ERR_INVALID (NULL, a bad name or shape, after start),
 * NB_ERR_EXISTS (the name is taken), NB_ERR_NOMEM. */
nb_status_t nb_session_register(nb_session_t* s, const char* name, float* data,
                                const int64_t* shape, int ndim);

/* nb_session_register for a tensor of element type `dtype`: `data` holds prod(shape) elements of
 * that type (for NB_DTYPE_BF16 and NB_DTYPE_FP16, uint16_t bits), borrowed as above. The
 * session keeps theta_global in fp32 for every tensor; a 16-bit buffer is a view of it: each
 * round the caller's progress (its values minus the values the session wrote) is added to the
 * fp32 master, so the rounding of theta_global to 16 bits is never sent as an update, and
 * theta_global is written back rounded to nearest even (a finite overflow saturates at the
 * type's largest finite value; fp16's is 65504).
 * The dtype is part of the tensor table: every cluster must register the same one
 * (nb_session_start names the tensor otherwise). NB_ERR_INVALID (as nb_session_register, or an
 * unknown dtype), NB_ERR_EXISTS, NB_ERR_NOMEM. */
nb_status_t nb_session_register_dtype(nb_session_t* s, const char* name, void* data,
                                      nb_dtype_t dtype, const int64_t* shape, int ndim);

/* Connects to every peer and agrees on the tensor table: every cluster sends its table (names,
 * shapes, in registration order) and the job's settings it was given, cluster 0 also its values;
 * every cluster checks every peer's. Then theta_global = cluster 0's values, written into our
 * registered buffers. Blocks until every peer answered (or is dead: see peer_timeout_s).
 * NB_ERR_CONFIG on every cluster when a table differs (naming the first differing tensor and the
 * peer) or a setting does (naming it); NB_ERR_INVALID (no tensor registered, called twice, the
 * peers do not fill every index), NB_ERR_UNAVAILABLE / NB_ERR_TIMEOUT (a peer does not answer),
 * NB_ERR_INTEGRITY (a sealed frame fails to open), NB_ERR_PERMISSION, NB_ERR_NOMEM. After an
 * error the session can only be closed. */
nb_status_t nb_session_start(nb_session_t* s);

/* What one round did. */
typedef struct {
  uint64_t round;       /* 0-based */
  int applied;          /* 1: the outer step was taken on every cluster */
  uint64_t samples;     /* ours, as given to nb_session_round */
  uint64_t samples_all; /* every cluster's together: the weights' denominator */
  uint64_t msg_bytes;   /* our message (header and codec frame) */
  uint64_t bytes_sent;  /* what we put on the WAN this round (msg_bytes to every peer) */
  double density;       /* of our frame */
  double wait_s;        /* what the caller waited for the exchange (blocking round: all of it;
                           overlapped: inside nb_session_round_end) */
  double exchange_s;    /* the exchange itself: sending ours, receiving the peers' */
  double codec_s;       /* encode, decode and the outer step */
  uint64_t global_hash; /* XXH3-64 of theta_global after the round (equal on every cluster) */
  double update_norm;   /* L2 norm of the summed update the outer step took */
  double goodput_Bps;   /* the slowest peer link's measured rate, bytes/s (0: not measured yet) */
  double rtt_s;         /* the longest round trip to a peer, seconds (0: not measured yet) */
  /* fault-tolerant rounds (otherwise commits = round + 1, peers_ok = peers_alive = the peers,
   * the rest 0): */
  uint64_t commits;     /* rounds applied so far: theta_global's version, equal on every
                           cluster once they agree */
  uint32_t peers_ok;    /* peers whose update of this round arrived */
  uint32_t peers_alive; /* peers answering their heartbeat after the round */
  int late;             /* 1: a round held from before (its vote was lost) was applied now */
  int pulled;           /* 1: we were behind the others and adopted a peer's global state
                           (our buffers now hold it; the progress since the last applied round
                           is dropped) */
  uint64_t next_round;  /* the round we run next (> round + 1 when a peer was further) */
  /* adaptive density (otherwise next_density = density and sched "fixed"): */
  double next_density; /* the density of our next frame, chosen after this round */
  const char* sched;   /* why (static text): "no_estimate" (link or compute not measured yet),
                          "fit" (the frame fills the budget), "ceiling" (density_max fits),
                          "hold" (kept: the fit rose by less than the hysteresis),
                          "floor_max_steps" (density_min does not fit: training waits on the
                          link), or "fixed" */
  const char* point;   /* values "auto": the codec point of our next frame (static text, e.g.
                          "top3-2bit", "dense-int8"); otherwise NULL */
} nb_session_round_t;

/* One blocking outer round, called by every cluster after its H inner steps: Delta =
 * theta_global - our buffers, through the codec with error feedback, sealed to every peer; the
 * peers' updates summed in cluster order weighted by each cluster's `samples` (what it trained on
 * since the last round; > 0 somewhere); the outer Nesterov step; theta_global (bit-identical on
 * every cluster, checked by hash in the next round) written back into our buffers. *out
 * (nullable) receives the round's figures. Returns NB_ERR_INVALID before start, after a failed
 * round, or when an update is not finite (a NaN or infinity in any cluster's buffers: the round
 * is refused on every cluster, naming the cluster, and nothing is applied: theta_global and our
 * buffers are unchanged) or when the summed update's norm is beyond update_norm_bound times the
 * recent rounds' (refused the same way, naming the cluster that sent the largest part);
 * NB_ERR_INTEGRITY when the replicas diverged (a hash differs) or a frame
 * fails to open; NB_ERR_CODEC for a malformed peer frame; NB_ERR_UNAVAILABLE / NB_ERR_TIMEOUT /
 * NB_ERR_RPC when a peer cannot be reached. After an error (other than before start) the session
 * can only be closed: the clusters no longer agree on the round. */
nb_status_t nb_session_round(nb_session_t* s, uint64_t samples, nb_session_round_t* out);

/* The round in two halves, so that the exchange overlaps the caller's next inner steps
 * (Streaming DiLoCo's overlap: the update lands tau steps into the next round).
 * nb_session_round_begin: Delta from the caller's buffers now (as nb_session_round), encoded and
 * sent on a background thread; returns at once. The caller keeps training on its buffers.
 * nb_session_round_end: waits for the peers' updates, takes the outer step, and writes into the
 * caller's buffers theta_global plus what the caller trained since begin (its buffers now minus
 * at begin), so no step is lost; that progress goes into the next round's Delta. With no step
 * between the two it is exactly nb_session_round. Between begin and end the session refuses
 * every other call but end (NB_ERR_INVALID naming the call) and the registered buffers may be
 * trained on but not freed; nb_session_close waits for a round in flight. Errors as
 * nb_session_round (begin: the codec's and the refusal of a non-finite update are found by end
 * on every cluster, the thread's start failure NB_ERR_INTERNAL); end without begin is
 * NB_ERR_INVALID. The session keeps one more copy of the tensors (fp32) for it. Fault-tolerant
 * sessions: the update exchange and the vote run on the thread; end reports the round as
 * nb_session_round does (applied, commits, peers_*, late, pulled), moves the buffers to
 * theta_global plus the progress since begin when the round was applied (or a held one landed,
 * or the state was pulled) and leaves them as trained otherwise; a non-finite update fails begin
 * (the peers skip the round).
 * Eager start (options.eager, the default, and a sparse frame): begin also writes into the
 * buffers the round's predicted landing, theta_global - lr mu^2 m - lr (1 + mu) / n_clusters *
 * (our frame, decoded) (nb_session_begin_moved says so: a caller that trains on a copy of the
 * buffers must copy them back), and the progress end adds is measured from there; a round that
 * is not applied (skipped, held, or an error) puts the buffers back to their values at begin
 * plus the progress since. */
nb_status_t nb_session_round_begin(nb_session_t* s, uint64_t samples);
nb_status_t nb_session_round_end(nb_session_t* s, nb_session_round_t* out);
/* 1 while an overlapped round is in flight whose begin moved the caller's buffers (eager start);
 * 0 otherwise (and for NULL). */
int nb_session_begin_moved(const nb_session_t* s);
/* 1 when no overlapped round is in flight or its exchange is over (its vote too), so that
 * nb_session_round_end lands it without waiting; 0 while the exchange runs. A loop that polls
 * it after each inner step and ends the round as soon as it says 1 (at the planned step at the
 * latest) lands the update as early as the link allows: a landing later than needed costs loss
 * (docs/hybrid.md, thin links). From the thread that calls round_begin and round_end. */
int nb_session_round_ready(const nb_session_t* s);

/* A final hash-only exchange after the last round, so that its result is compared too; every
 * cluster calls it once. NB_ERR_INTEGRITY when the replicas differ, NB_ERR_INVALID (before start
 * or after a failed round), the exchange's errors. */
nb_status_t nb_session_finish(nb_session_t* s);

/* The caller's training loss of the round it is about to run (for example the mean of its inner
 * steps' losses): written as "loss" into that round's progress line (progress_file), so that a
 * gateway's progress events and `nebula watch` show the user's program's loss; a round without
 * one has none. Kept until the next round's figures are written. NB_ERR_INVALID for NULL or a
 * loss that is not finite (nothing kept). */
nb_status_t nb_session_set_loss(nb_session_t* s, double loss);

/* XXH3-64 of theta_global now (0 before start). */
uint64_t nb_session_global_hash(const nb_session_t* s);

/* Copies tensor `name`'s part of theta_global, in fp32, into out (count floats: the tensor's
 * element count; caller's buffer): for a bf16 tensor the master its buffer is rounded from.
 * After start. NB_ERR_INVALID (NULL, before start, count differs), NB_ERR_NOT_FOUND (no such
 * tensor). */
nb_status_t nb_session_read_global(const nb_session_t* s, const char* name, float* out,
                                   size_t count);

/* Writes the session's round state to `path` for a checkpoint: theta_global, the outer momentum,
 * our error-feedback residual, the round counter and the tensor table (names, shapes, dtypes),
 * atomically (`path`.tmp beside it, fsync, rename, the folder synced: a crash leaves the old file
 * or the new one) and ending in a checksum. Every cluster saves its own file after the same round
 * (the residual is its own); one save at a time per path. Between rounds, after start.
 * NB_ERR_INVALID (NULL, before start, after a failed round), NB_ERR_IO naming the path. */
nb_status_t nb_session_save(nb_session_t* s, const char* path);

/* Restores a state written by nb_session_save, after nb_session_start and before the next round:
 * theta_global (also written into the registered buffers), momentum, residual and the round
 * counter. Every cluster loads its own file of the same round, so the next round continues the
 * saved run (a cluster that loads another round's state fails that round's hash check with
 * NB_ERR_INTEGRITY). Strict: NB_ERR_NOT_FOUND (no file), NB_ERR_IO (unreadable), NB_ERR_INVALID
 * (not a session state, truncated, or NULL / before start / after a failed round),
 * NB_ERR_INTEGRITY (a checksum fails), NB_ERR_CONFIG (a state for another tensor table, naming
 * the first differing tensor); on every error the session is unchanged. */
nb_status_t nb_session_load(nb_session_t* s, const char* path);

/* Stops the exchange (server, links, heartbeats) and frees everything. The registered buffers
 * stay the caller's. NULL ok. */
void nb_session_close(nb_session_t* s);

/* ---- the BLAS under the model ------------------------------------------------------------ */

/* What nb_blas_check found. */
typedef struct {
  int generic;        /* 1: OpenBLAS runs a generic (pre-AVX2) kernel on a CPU that has AVX2 or
                         AVX-512, so matrix products run at a fraction of the CPU's rate */
  char core[32];      /* the kernel OpenBLAS runs ("Prescott", "Haswell", "Cooperlake"); "" when
                         no OpenBLAS is loaded in this process (then generic is 0: not checked) */
  char suggested[32]; /* the OPENBLAS_CORETYPE for this CPU ("Cooperlake", "SkylakeX", "Zen",
                         "Haswell"); "" on a CPU without AVX2 */
  char text[512];     /* one line for a log: the kernel, the CPU and, when generic, what to set */
} nb_blas_report_t;

/* Checks the kernel of the OpenBLAS loaded in this process (the one the caller's model runs on;
 * the session itself multiplies no matrices) against this CPU's instruction sets. OpenBLAS reads
 * OPENBLAS_CORETYPE only when it loads, so a program that gets generic = 1 must be started again
 * with OPENBLAS_CORETYPE=<suggested> in its environment (the `nebula` command re-executes itself
 * so; a library cannot). nb_session_open prints text as a warning, once per process, when generic
 * is 1. An OPENBLAS_CORETYPE the user set is reported, never changed. NB_DEBUG_BLAS_CORENAME, when
 * set and OPENBLAS_CORETYPE is not, stands in for the core name OpenBLAS chose (tests simulate
 * "Prescott" with it). *out is the caller's. Returns NB_OK, or NB_ERR_INVALID (out NULL).
 * Thread-safe. */
nb_status_t nb_blas_check(nb_blas_report_t* out);

#ifdef __cplusplus
}
#endif
#endif
