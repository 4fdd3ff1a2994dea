/* The gateway daemon of one cluster: `nebula gateway --config FILE`. It serves the client API
 * nebula.v1.Gateway over mutual TLS (Submit a signed descriptor, Get, List, Watch, Cancel, Logs),
 * decides with the ACL, keeps jobs in the SQLite job store and runs them with a launcher (local,
 * mpirun or Slurm: gateway/launcher.h), and federates with its peer gateways (nebula.v1.Federation)
 * so that a job runs on every cluster it names. It also serves the standard gRPC health service
 * (grpc.health.v1.Health) and holds its probe (nb_gateway_health_check). It does not schedule
 * beyond a slot count.
 *
 * Thread safety: the config functions touch only the struct they are given (one thread per
 * struct). A gateway runs threads of its own (the gRPC handlers, a monitor of the job processes,
 * a federation thread and a run-report thread) that share its state under separate locks
 * (gateway/gateway_internal.h says which lock guards what, and their order); nb_gateway_port may
 * be called from any thread while it lives. nb_gateway_create and nb_gateway_destroy are not
 * thread-safe with respect to the same gateway: destroy only once, from one thread, and not
 * while another thread still uses it. Several gateways may live in one process (the tests run
 * two or three) as long as each has its own work_dir. */
#ifndef NB_GATEWAY_GATEWAY_H
#define NB_GATEWAY_GATEWAY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "jobs/acl.h"
#include "jobs/job_config.h"
#include "jobs/job_paths.h"
#include "gateway/launcher.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_GW_MAX_PEERS 16
#define NB_GW_MAX_ARGS 32
#define NB_GW_MAX_ADMINS 16
#define NB_GW_STR 512

typedef struct {
  char id[NB_ACL_NAME_MAX];
  char address[NB_GW_STR];
} nb_gateway_peer_t;

/* Everything the config file sets (docs/gateway.md; `nebula gateway --help` lists it). */
typedef struct {
  char cluster_id[NB_ACL_NAME_MAX];
  char listen[NB_GW_STR];
  char tls_ca[NB_GW_STR], tls_cert[NB_GW_STR], tls_key[NB_GW_STR];
  int n_peers; /* peer gateways: federation partners (nebula.v1.Federation) */
  nb_gateway_peer_t peers[NB_GW_MAX_PEERS];
  /* "launcher", "mpirun.*", "slurm.*" (gateway/launcher.h) */
  nb_launcher_conf_t launcher;
  int n_command; /* the job command template; placeholders {descriptor} {jobdir} {job}
                    {cluster} {workers} {nebula}; a first word "nebula" and {nebula} mean this
                    very binary */
  char command[NB_GW_MAX_ARGS][NB_GW_STR];
  int slots; /* workers this cluster runs at once, over all jobs */
  nb_job_device_t device;
  char store_path[NB_GW_STR]; /* "" = <work_dir>/jobs.db */
  char work_dir[NB_GW_STR];
  nb_acl_t acl;
  int n_admins; /* users who may read and cancel every job */
  char admins[NB_GW_MAX_ADMINS][NB_ACL_NAME_MAX];
  int n_worker_command; /* the command of one cluster of a multi-cluster job; also
                          {listen} {pki} {secret_file}, and a word "{peers}" becomes
                          "--peer ID=ADDR" for every other cluster */
  char worker_command[NB_GW_MAX_ARGS][NB_GW_STR];
  char exchange_host[NB_GW_STR]; /* host this cluster's workers listen on for Exchange */
  char exchange_port_range[32];  /* exchange.port_range: "LO-HI" as written ("" = any port) */
  int exchange_port_lo, exchange_port_hi; /* parsed from it; 0, 0: a free port from the system */
  char exchange_advertise[NB_GW_STR];     /* exchange.advertise: host peers are told to dial for
                                             this cluster's Exchange ("" = exchange_host) */
  int federation_timeout_ms;              /* one Federation call; also how long a proposal waits */
  int max_put_bytes;      /* artifacts.max_put_bytes: largest file a user may put (Artifacts.Put) */
  int cancel_grace_ms;    /* SIGTERM → SIGKILL */
  int poll_ms;            /* how often processes and progress files are looked at */
  int calls_per_identity; /* limits.calls_per_identity: concurrent calls of one certificate */
  char run_as[NB_ACL_NAME_MAX]; /* run_as: the user jobs run as ("" = the gateway's own) */
  int n_allow; /* paths.allow: folders besides the job's own that descriptor paths may name */
  char allow[NB_JOB_PATHS_MAX_ROOTS][NB_GW_STR];
  char metrics_listen[NB_GW_STR]; /* metrics.listen: Prometheus /metrics "host:port"; "" = off */
} nb_gateway_config_t;

typedef struct nb_gateway nb_gateway_t;

/* Every option at its default (cluster id, TLS files and ACL left empty). */
void nb_gateway_config_defaults(nb_gateway_config_t* cfg);

/* Reads a JSON config through the option table: unknown keys and wrong types are errors naming
 * the key; relative paths are taken relative to base_dir (NULL = as given). text: borrowed.
 * Returns NB_OK or NB_ERR_CONFIG (the message names the key and the problem). */
nb_status_t nb_gateway_config_parse(const char* text, size_t len, const char* base_dir,
                                    nb_gateway_config_t* cfg);
/* nb_gateway_config_parse on a file (relative paths against the file's folder); NB_ERR_IO. */
nb_status_t nb_gateway_config_load(const char* path, nb_gateway_config_t* cfg);
/* Prints the option table (name, type, default, help). */
void nb_gateway_config_help(FILE* f);

/* Opens the store, recovers jobs left by an earlier run (re-attaches to live processes, marks the
 * others failed with a reason), starts the process monitor and the gRPC server.
 * cfg: copied. Returns NB_OK; NB_ERR_CONFIG (missing cluster id, TLS files); NB_ERR_CRYPTO /
 * NB_ERR_IO (TLS files); NB_ERR_UNAVAILABLE (address in use); NB_ERR_IO (store). */
nb_status_t nb_gateway_create(const nb_gateway_config_t* cfg, nb_gateway_t** out);

/* The bound port (useful with listen ":0"). */
int nb_gateway_port(const nb_gateway_t* gw);

/* The bound port of the metrics listener (metrics.listen, useful with port 0); 0 when metrics
 * are off. */
int nb_gateway_metrics_port(const nb_gateway_t* gw);

/* The service name the health service (grpc.health.v1.Health) answers for besides "" (the
 * gateway as a whole); nebula.v1.Federation and nebula.v1.Artifacts are known too. */
#define NB_GATEWAY_HEALTH_SERVICE "nebula.v1.Gateway"

/* Marks the gateway NOT_SERVING on its health service (Check and Watch) while it goes on
 * serving every call: a probe or load balancer stops sending it work before it stops.
 * nb_gateway_destroy does it first. Thread-safe; NULL ok. */
void nb_gateway_drain(nb_gateway_t* gw);

/* The probe of `nebula gateway --check`: calls grpc.health.v1.Health/Check for service ("" or
 * NULL: the gateway as a whole) over mutual TLS with cfg's own PKI (tls.ca, tls.cert, tls.key),
 * at address, or (NULL or "") at cfg->listen with a wildcard or empty host as loopback. The
 * server must present cfg->cluster_id's certificate. cfg: borrowed. On NB_OK *status is the
 * answer (1 SERVING, 2 NOT_SERVING: nb_gateway_health_name); target (target_cap bytes) gets the
 * address dialled in every case. Returns NB_ERR_CONFIG (listen with port 0 and no address, a
 * bad address), NB_ERR_IO / NB_ERR_CRYPTO (the TLS files), NB_ERR_UNAVAILABLE (nothing answers
 * there), NB_ERR_TIMEOUT (timeout_ms passed), NB_ERR_PERMISSION (TLS refused either way),
 * NB_ERR_NOT_FOUND (a service the gateway does not serve). Thread-safe. */
nb_status_t nb_gateway_health_check(const nb_gateway_config_t* cfg, const char* address,
                                    const char* service, int64_t timeout_ms, int* status,
                                    char* target, size_t target_cap);

/* "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN" for a health status. */
const char* nb_gateway_health_name(int status);

/* Certificate rotation without a restart (what `nebula gateway` does on SIGHUP): reads tls.ca,
 * tls.cert and tls.key again and checks them as at start (they parse, the key matches the
 * certificate, the certificate chains to the CA, is valid now and is this cluster's). When
 * they pass, new TLS handshakes of the server present the new pair and verify clients against
 * the new CA file (connections already open keep theirs), the Federation channels to the peers
 * are replaced by new ones presenting it (calls under way finish on the old), artifact fetches
 * from peers use it, and "certificates reloaded" is logged (INFO, JOB) with its subject,
 * notAfter and serial. When they do not, the previous pair goes on serving and a WARN
 * ("certificate reload failed") names the file and the problem. Descriptor signatures are
 * still checked against the CA certificate read at start. Call it from one thread at a time
 * (the daemon's main thread). Returns NB_OK; NB_ERR_IO, NB_ERR_CRYPTO, NB_ERR_CONFIG (not this
 * cluster's certificate), NB_ERR_INVALID, NB_ERR_NOMEM. */
nb_status_t nb_gateway_reload_tls(nb_gateway_t* gw);

/* Stops serving and monitoring (NOT_SERVING first: an open health Watch is told). Running jobs
 * are left running: a restarted gateway re-attaches to them. NULL ok. */
void nb_gateway_destroy(nb_gateway_t* gw);

#ifdef __cplusplus
}
#endif
#endif
