/* Internals of the gateway daemon shared by its files in gateway/ (gateway.c, api.c,
 * federation.c, federation_api.c, start.c, monitor.c, publish.c, report_queue.c, recovery.c,
 * health.c):
 * the daemon's state (struct nb_gateway) and the functions one part calls in another. Nothing
 * outside gateway/ includes it. Each function is documented where it is defined. */
#ifndef NB_GATEWAY_GATEWAY_INTERNAL_H
#define NB_GATEWAY_GATEWAY_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <sys/types.h>

#include "gateway/artifact.h"
#include "gateway/gateway.h"
#include "gateway/store.h"
#include "common/prom.h"
#include "inter/rpc.h"
#include "jobs/descriptor.h"
#include "jobs/job_program.h"
#include "nebula/v1/federation.pb-c.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/pki.h"
#include "security/tls.h"

/* A job this gateway runs, or holds worker slots for (a reservation). */
typedef struct {
  char id[NB_JOB_ID_MAX];
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2];
  nb_launch_t launch; /* pid 0: a reservation (a federated job proposed, not launched yet) */
  int own_child;      /* 1: we forked it and reap it; 0: re-attached after a restart */
  int workers;
  long progress_off;
  int progress_skip;       /* lines already recorded before a restart */
  char cancel_reason[512]; /* set by Cancel: the end is recorded as cancelled with this */
  int ending; /* its processes are gone and the monitor is recording the end: it holds no
                 slots, and Cancel waits for it to be retired */
} nb__active_t;

/* An entry the monitor saw end, recorded outside active_mu (monitor thread only). */
typedef struct {
  nb__active_t a;
  int code, sig;
} nb__ended_t;

/* Something runs for this entry (a process, or a Slurm job); otherwise it is a reservation. */
static inline int nb__launched(const nb__active_t* a) {
  return a->launch.pid > 0 || a->launch.slurm_id[0] != 0;
}

#define NB__MAX_ACTIVE 256
#define NB__MAX_REPORTS 16

/* A run report to build (docs/gateway.md, Run report). */
typedef struct {
  char id[NB_JOB_ID_MAX];
  double started, next, deadline; /* nb_now_s(): queued, next try, last try */
} nb__report_t;

/* A handler of the gateway: spec is its method's (NULL for Submit and Propose, which have their
 * own prologue). */
typedef nb_status_t (*nb__gw_handler_fn)(nb_rpc_call_t* call, struct nb_gateway* gw,
                                         const void* spec);

/* One method of a service: its gRPC path, kind, handler and what the handler is given. */
typedef struct {
  const char* path;
  nb_rpc_kind_t kind;
  nb__gw_handler_fn fn;
  const void* spec;
} nb__gw_method_t;

#define NB__GW_API_METHODS 6 /* Submit, Get, List, Watch, Cancel, Logs */
#define NB__GW_FED_METHODS 6 /* Propose, Commit, Abort, Cancel, Report, Logs */
extern const nb__gw_method_t nb__gw_api_methods[NB__GW_API_METHODS];
extern const nb__gw_method_t nb__gw_fed_methods[NB__GW_FED_METHODS];

/* One method of the server, behind the per-identity limit (nb__limited). */
typedef struct {
  struct nb_gateway* gw;
  const nb__gw_method_t* m;
} nb__hand_t;

#define NB__MAX_IDENTITIES 256
#define NB__N_METHODS (NB__GW_API_METHODS + NB__GW_FED_METHODS)

/* The Federation client of one peer. Replaced by a new one when the certificates are reloaded
 * (nb__gw_peers_connect); the calls holding the old one (nb__gw_peer_acquire) finish on it,
 * and the last to let go destroys it. */
typedef struct {
  nb_rpc_client_t* cli;
  int uses;    /* holders now */
  int retired; /* replaced: destroyed when uses drops to 0 */
} nb__peer_t;

/* The daemon. Threads: the gRPC server's handler threads, the monitor (monitor.c), the
 * federation thread (federation.c) and the report thread (report_queue.c); each thread has its
 * own store handle, and each handler opens one per call.
 *
 * Locks and what they guard (none is recursive; none is held across a call to a peer):
 *   record_mu  the read-modify-write of a job's federation record in the store, and the
 *              recording of a job's end (its final state and the run report it queues), so
 *              that a reader who takes it after seeing a job final also sees its report queued
 *   active_mu  active[] and n_active: the jobs running or reserved here (slots), each entry's
 *              fields included (the monitor also reads progress files under it); xport[]
 *   queue_mu   publish[] / n_publish and report[] / n_report
 *   lim_mu     ident[] / n_ident: calls in flight per identity
 *   peer_mu    peer[] and each entry's uses and retired
 * Order: record_mu, then active_mu, then queue_mu; lim_mu and peer_mu are taken alone. Everything
 * else is set by nb_gateway_create before the threads start and only read afterwards, but
 * `stopping` (atomic), the ended[] scratch of the monitor, and the thread-owned store handles. */
struct nb_gateway {
  nb_gateway_config_t cfg;
  int run_as; /* jobs run as run_uid:run_gid (cfg.run_as) */
  uid_t run_uid;
  gid_t run_gid;
  nb__hand_t hand[NB__N_METHODS];
  char self_exe[NB_GW_STR];
  nb_tls_source_t* tls_src; /* tls.* as last loaded (start, SIGHUP: nb_gateway_reload_tls) */
  X509* ca;                 /* tls.ca as read at start: descriptor signatures */
  nb_rpc_server_t* srv;
  pthread_mutex_t peer_mu;
  nb__peer_t* peer[NB_GW_MAX_PEERS]; /* Federation clients, one per configured peer */
  nb_artifact_store_t* art;          /* <work_dir>/artifacts: what jobs produced */
  _Atomic int stopping;
  _Atomic int draining;      /* nb_gateway_drain: the health service answers NOT_SERVING */
  _Atomic int watch_serving; /* health Watch calls last told SERVING */
  nb__hand_t hand_watch;     /* the health Watch, behind the per-identity limit */

  pthread_mutex_t record_mu; /* federation records' read-modify-write; a job's end */

  pthread_mutex_t active_mu;
  nb__active_t active[NB__MAX_ACTIVE];
  int n_active;
  struct { /* exchange.port_range: ports handed to jobs (nb__gw_free_endpoint) */
    char id[NB_JOB_ID_MAX];
    int port, seen; /* seen: its job was in active[] */
    double at;      /* nb_now_s() when handed out */
  } xport[NB__MAX_ACTIVE];
  int n_xport, xport_next;

  pthread_mutex_t queue_mu;
  char publish[16][NB_JOB_ID_MAX]; /* jobs that succeeded here, outputs to put in `art` */
  int n_publish;
  nb__report_t report[NB__MAX_REPORTS]; /* run reports to build */
  int n_report;

  pthread_mutex_t lim_mu;
  int n_ident;
  struct {
    char key[160]; /* "user:alice", "cluster:dc-b" */
    int calls;
  } ident[NB__MAX_IDENTITIES];

  nb_job_store_t* mon_store; /* the monitor thread's own handle */
  pthread_t mon;
  int mon_started;
  nb__ended_t ended[NB__MAX_ACTIVE]; /* the monitor's: entries that ended this pass */
  nb_job_store_t* fed_store;         /* the federation thread's own handle */
  pthread_t fed;
  int fed_started;
  nb_job_store_t* rep_store; /* the report thread's own handle */
  pthread_t rep;
  int rep_started;
  nb_prom_t* prom;           /* metrics.listen: the registry and its listener; NULL = off */
  nb_job_store_t* met_store; /* the metrics listener thread's own handle (opened at a scrape) */
};

#define NB__MAX_PARTS (NB_JOB_MAX_CLUSTERS + 1) /* the clusters named + the base's holder */

/* What a cluster of a multi-cluster job adds to its command (worker_command). */
typedef struct {
  const char* listen;      /* our Exchange endpoint */
  const char* pki;         /* folder laid out as nebula certs does, for --pki */
  const char* secret_file; /* the job secret */
  int n_peers;
  char peers[NB_JOB_MAX_CLUSTERS][NB_GW_STR]; /* "ID=HOST:PORT" of every other cluster */
} nb__wk_args_t;

#define NB__PROGRAM_MAX_ENV (NB_JOB_PROGRAM_MAX_ENV + 1)

/* What a job running the user's program (spec.program) adds to its launch: the folder it runs
 * in and its NEBULA_* environment (nb__gw_program_prepare; released by nb__gw_program_clear). */
typedef struct {
  char workdir[NB_GW_STR * 2]; /* absolute: fits a command word */
  int n_env;
  char* env[NB__PROGRAM_MAX_ENV]; /* "K=V", NULL-terminated; owned */
} nb__gw_program_t;

/* A signed descriptor as Submit and Propose read it (nb__gw_read_signed). */
typedef struct {
  X509* cert;                 /* the signer's certificate */
  nb_job_config_t* cfg;       /* the parsed descriptor */
  nb_descriptor_diag_t* diag; /* its diagnostics */
} nb__gw_signed_t;

/* A cluster taking part in a job: workers > 0 runs a share of it; 0 only provides the base
 * checkpoint (model.base.cluster). */
typedef struct {
  char id[NB_JOB_NAME_MAX];
  int workers;
} nb__part_t;

/* start.c: job folders, command words, worker slots, stopping a job here */
int nb__gw_active_find(nb_gateway_t* gw, const char* id);
int nb__gw_slots_used(const nb_gateway_t* gw, const char* except);
nb_status_t nb__gw_diag_error(nb_status_t st, const char* prefix, const nb_descriptor_diag_t* diag);
nb_status_t nb__gw_read_signed(const nb_gateway_t* gw, const ProtobufCBinaryData* desc,
                               const ProtobufCBinaryData* sig, const char* cert_pem,
                               const char* user, nb_pki_identity_t* who, int all_errors,
                               nb__gw_signed_t* sd);
void nb__gw_signed_clear(nb__gw_signed_t* sd);
void nb__gw_jobdir(const nb_gateway_t* gw, const char* id, char* buf, size_t n);
void nb__gw_unreserve(nb_gateway_t* gw, const char* id);
int nb__gw_parts(const nb_job_config_t* cfg, nb__part_t* p);
int nb__gw_mkdirs(const char* path);
void nb__gw_give(const nb_gateway_t* gw, const char* path);
nb_status_t nb__gw_free_endpoint(nb_gateway_t* gw, const char* id, char* out, size_t cap);
nb_status_t nb__gw_exchange_listen(const nb_gateway_t* gw, const char* endpoint, char* out,
                                   size_t cap);
nb_status_t nb__gw_job_config(nb_job_store_t* st, const char* id, nb_job_config_t** cfg);
nb_status_t nb__gw_jobdir_write(nb_gateway_t* gw, const char* id, const uint8_t* desc, size_t len,
                                const uint8_t* sig, size_t sig_len, const char* cert_pem);
nb_status_t nb__gw_paths_check(const nb_gateway_t* gw, const nb_job_config_t* cfg,
                               nb_descriptor_diag_t* diag);
nb_status_t nb__gw_reserve(nb_gateway_t* gw, const char* id, int workers);
nb_status_t nb__gw_job_pki(nb_gateway_t* gw, const char* dir, char* pki, size_t cap);
nb_status_t nb__gw_cancel_local(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                const char* reason);
nb_status_t nb__gw_launch(nb_gateway_t* gw, nb_job_store_t* st, const char* id, int workers,
                          const nb__wk_args_t* wk);
int nb__gw_open_job_file(const nb_gateway_t* gw, const char* path);

/* program.c: jobs that run the user's program instead of the built-in worker */
int nb__gw_job_runs_program(nb_job_store_t* st, const char* id);
nb_status_t nb__gw_program_prepare(nb_gateway_t* gw, const char* id, const char* dir,
                                   const nb_job_config_t* cfg, const nb__wk_args_t* wk,
                                   nb__gw_program_t* p);
void nb__gw_program_clear(nb__gw_program_t* p);

/* federation.c: federation records, the origin's two-phase submit, the federation thread */
nb_status_t nb__gw_fed_save(nb_job_store_t* st, const nb_job_fed_t* f, json_t* info);
void nb__gw_fed_release(nb_job_fed_t* f, json_t* info);
void nb__gw_fed_update(nb_gateway_t* gw, nb_job_store_t* st, const char* id, const char* key,
                       json_t* value, const char* drop, int active);
const char* nb__gw_jstr(json_t* o, const char* k);
int nb__gw_is_peer(const nb_gateway_t* gw, const char* cluster);
nb__peer_t* nb__gw_peer_acquire(nb_gateway_t* gw, const char* cluster);
void nb__gw_peer_release(nb_gateway_t* gw, nb__peer_t* p);
nb_status_t nb__gw_peers_connect(nb_gateway_t* gw, const nb_tls_t* tls);
void nb__gw_peers_close(nb_gateway_t* gw);
void* nb__gw_fed_loop(void* arg);
json_t* nb__gw_fed_cluster(json_t* info, const char* cluster);
void nb__gw_fed_cluster_state(nb_job_store_t* st, const char* id, json_t* info, const char* cluster,
                              const char* to, const char* reason);
nb_status_t nb__gw_fed_load(nb_job_store_t* st, const char* id, nb_job_fed_t* f, json_t** info);
nb_status_t nb__gw_fed_cancel_peers(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                    const char* reason);
void nb__gw_fed_aggregate(nb_gateway_t* gw, nb_job_store_t* st, const char* id, json_t* info);
nb_status_t nb__gw_fed_submit(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                              const Nebula__V1__SubmitRequest* req, const nb__part_t* parts, int np,
                              int mine, const char* base_cluster, int ships_files);
nb_status_t nb__gw_fed_start(nb_gateway_t* gw, nb_job_store_t* st, const char* id, int workers,
                             const uint8_t secret[32], json_t* endpoints);

/* monitor.c: the monitor thread and the end of a job's process */
void* nb__gw_monitor(void* arg);
void nb__gw_tail_progress(nb_gateway_t* gw, nb_job_store_t* store, nb__active_t* a);
void nb__gw_job_ended(nb_gateway_t* gw, nb_job_store_t* store, nb__active_t* a, int code, int sig,
                      const char* how);
/* The lifecycle line of a job just launched (its pid and launcher, from active[]). */
void nb__gw_log_launched(nb_gateway_t* gw, const char* id);

/* publish.c: artifacts of jobs */
nb_status_t nb__gw_artifact_job(void* user, const char* job_id, const char* peer,
                                nb_artifact_job_t* out);
nb_status_t nb__gw_fetch_base(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                              const uint8_t secret[32]);
void nb__gw_publish(nb_gateway_t* gw, nb_job_store_t* st, const char* id);
nb_status_t nb__gw_may_put(void* user, const char* name);
/* spec.program.files into the job's folder before launch (secret NULL: a job of this cluster
 * only; origin NULL: this gateway is the origin). */
nb_status_t nb__gw_fetch_files(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                               const uint8_t* secret, const char* origin);

/* report_queue.c: run reports and the report thread */
int nb__gw_report_pending(nb_gateway_t* gw, const char* id);
void nb__gw_report_queue(nb_gateway_t* gw, const char* id);
void* nb__gw_report_loop(void* arg);
void nb__gw_report_recover(nb_gateway_t* gw, nb_job_store_t* st);

/* recovery.c: starting over an existing work_dir */
nb_status_t nb__gw_recover(nb_gateway_t* gw);
void nb__gw_store_orphans(nb_gateway_t* gw);
nb_status_t nb__gw_store_present(nb_gateway_t* gw);

/* metrics.c: the Prometheus metrics (no-ops while gw->prom is NULL) */
nb_status_t nb__gw_metrics_start(nb_gateway_t* gw);
void nb__gw_metrics_stop(nb_gateway_t* gw);
void nb__gw_metric_submission(nb_gateway_t* gw);
/* A refused call: counted under reason (the label of nebula_gateway_refusals_total) and logged
 * at INFO (JOB) naming the method, the caller ("user 'alice'", "cluster 'dc-b'"), the reason and
 * detail (the error answered; never a secret). */
void nb__gw_metric_refusal(nb_gateway_t* gw, const char* method, const char* caller,
                           const char* reason, const char* detail);
void nb__gw_metric_fed_call(nb_gateway_t* gw, const char* method, nb_status_t st);

/* gateway.c: the per-identity call limit every handler but the health Check passes */
nb_status_t nb__gw_limited(nb_rpc_call_t* call, void* user_data);

/* health.c: grpc.health.v1.Health */
nb_status_t nb__gw_health_add(nb_gateway_t* gw);

/* api.c: the nebula.v1.Gateway service */
nb_status_t nb__gw_open_store(nb_gateway_t* gw, nb_job_store_t** st);
const char* nb__gw_req_job_id(const ProtobufCMessage* req);
nb_status_t nb__gw_logs_send(nb_rpc_call_t* call, nb_gateway_t* gw, nb_job_store_t* st,
                             const Nebula__V1__LogsRequest* req);

#endif
