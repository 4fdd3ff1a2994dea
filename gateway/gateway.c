/* The gateway daemon (gateway/gateway.h): config option table, the nebula.v1.Gateway handlers, the
 * process monitor that turns process exits and progress lines into job events, recovery after a
 * restart, and federation with peer gateways (nebula.v1.Federation: propose / commit / abort,
 * cancel, event reports to the origin). Not here: scheduling beyond a slot count. How workers
 * start (local, mpirun, Slurm) is gateway/launcher.h's business. */
#include "gateway/gateway.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <netdb.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "gateway/artifact.h"
#include "jobs/cli_checks.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"
#include "report/report.h"
#include "gateway/store.h"
#include "nebula/v1/federation.pb-c.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/pki.h"
#include "security/seal.h"
#include "security/sign.h"
#include "security/tls.h"

/* ------------------------------------------------------------------ config: the option table */

typedef enum {
  NB__OPT_STR,      /* string into a char[NB_GW_STR or NB_ACL_NAME_MAX] */
  NB__OPT_PATH,     /* string; relative to the config file's folder */
  NB__OPT_INT,      /* integer in [min, max] */
  NB__OPT_ARGV,     /* array of strings: the command template */
  NB__OPT_PEERS,    /* object: cluster id → "host:port" */
  NB__OPT_ACL,      /* array of {"user", "clusters", "max_workers"} */
  NB__OPT_USERS,    /* array of user names */
  NB__OPT_LAUNCHER, /* "local" | "mpirun" | "slurm" */
  NB__OPT_DEVICE,   /* "cpu" | "cuda" */
  NB__OPT_LIST,     /* array of strings into an nb_launcher_args_t */
  NB__OPT_WARGV,    /* array of strings: the worker command template */
  NB__OPT_PATHS,    /* array of paths (relative to the config file's folder): allowed roots */
} nb__opt_type_t;

typedef struct {
  const char* name; /* dotted JSON path: "tls.ca" is {"tls": {"ca": ...}} */
  nb__opt_type_t type;
  size_t offset, size;
  long min, max;
  const char* def; /* shown by --help; the real default is set by nb_gateway_config_defaults */
  const char* help;
} nb__opt_t;

#define NB__F(f) offsetof(nb_gateway_config_t, f), sizeof(((nb_gateway_config_t*)0)->f)

static const nb__opt_t nb__opts[] = {
    {"cluster_id", NB__OPT_STR, NB__F(cluster_id), 0, 0, "(required)",
     "this cluster's id; must be the identity in tls.cert"},
    {"listen", NB__OPT_STR, NB__F(listen), 0, 0, "127.0.0.1:7070",
     "address of the Gateway service (\":0\" picks a free port)"},
    {"tls.ca", NB__OPT_PATH, NB__F(tls_ca), 0, 0, "(required)",
     "federation CA certificate (PEM): verifies clients and descriptor signers"},
    {"tls.cert", NB__OPT_PATH, NB__F(tls_cert), 0, 0, "(required)",
     "this gateway's cluster certificate (PEM)"},
    {"tls.key", NB__OPT_PATH, NB__F(tls_key), 0, 0, "(required)", "its private key (PEM)"},
    {"peers", NB__OPT_PEERS, NB__F(peers), 0, 0, "{}",
     "peer gateways, cluster id -> \"host:port\" (kept for federation)"},
    {"launcher", NB__OPT_LAUNCHER, NB__F(launcher), 0, 0, "local",
     "how jobs start: \"local\" (the command once), \"mpirun\" (mpirun -np {workers}), "
     "\"slurm\" (sbatch)"},
    {"mpirun.args", NB__OPT_LIST, NB__F(launcher.mpirun_args), 0, 0, "[]",
     "extra mpirun flags (launcher mpirun), e.g. [\"-x\", \"GLIBC_TUNABLES\"]"},
    {"slurm.partition", NB__OPT_STR, NB__F(launcher.partition), 0, 0, "\"\"",
     "#SBATCH --partition (launcher slurm; empty: Slurm's default)"},
    {"slurm.account", NB__OPT_STR, NB__F(launcher.account), 0, 0, "\"\"",
     "#SBATCH --account (empty: none)"},
    {"slurm.sbatch_args", NB__OPT_LIST, NB__F(launcher.sbatch_args), 0, 0, "[]",
     "extra #SBATCH lines, e.g. [\"--time=60\"]"},
    {"slurm.srun_args", NB__OPT_LIST, NB__F(launcher.srun_args), 0, 0, "[]",
     "extra srun flags, e.g. [\"--mpi=pmix\"]"},
    {"slurm.step", NB__OPT_STR, NB__F(launcher.slurm_step), 0, 0, "srun",
     "how the batch script starts the ranks: \"srun\" or \"mpirun\" (OpenMPI in the allocation)"},
    {"slurm.poll_ms", NB__OPT_INT, NB__F(launcher.slurm_poll_ms), 50, 5000, "1000",
     "at most one squeue per job this often"},
    {"command", NB__OPT_ARGV, NB__F(command), 0, 0,
     "[\"nebula\",\"train\",\"{descriptor}\",\"--out\",\"{jobdir}\"]",
     "job command; {descriptor} {jobdir} {job} {cluster} {workers} {nebula} are replaced"},
    {"worker_command", NB__OPT_WARGV, NB__F(worker_command), 0, 0,
     "[\"nebula\",\"worker\",\"--job\",\"{descriptor}\",\"--cluster\",\"{cluster}\",\"--out\","
     "\"{jobdir}/out\",\"--listen\",\"{listen}\",\"{peers}\",\"--pki\",\"{pki}\","
     "\"--secret-file\",\"{secret_file}\"]",
     "one cluster of a multi-cluster job; also {listen} {pki} {secret_file} {peers}"},
    {"exchange_host", NB__OPT_STR, NB__F(exchange_host), 0, 0, "127.0.0.1",
     "host this cluster's workers listen on for Exchange (the port is chosen per job)"},
    {"federation_timeout_ms", NB__OPT_INT, NB__F(federation_timeout_ms), 100, 600000, "10000",
     "deadline of one call to a peer gateway"},
    {"resources.slots", NB__OPT_INT, NB__F(slots), 1, 1 << 20, "4",
     "workers run at once over all jobs; a submit beyond is refused"},
    {"resources.device", NB__OPT_DEVICE, NB__F(device), 0, 0, "cpu",
     "device of this cluster: \"cpu\" or \"cuda\""},
    {"store", NB__OPT_PATH, NB__F(store_path), 0, 0, "<work_dir>/jobs.db", "SQLite job store"},
    {"work_dir", NB__OPT_PATH, NB__F(work_dir), 0, 0, "work",
     "jobs run in <work_dir>/<job-id>/ (logs, exit status, progress)"},
    {"acl", NB__OPT_ACL, NB__F(acl), 0, 0, "[] (nobody)",
     "[{\"user\": NAME|\"*\", \"clusters\": [ID|\"*\"], \"max_workers\": N}]"},
    {"admins", NB__OPT_USERS, NB__F(admins), 0, 0, "[]", "users who may read and cancel every job"},
    {"limits.calls_per_identity", NB__OPT_INT, NB__F(calls_per_identity), 1, 4096, "16",
     "calls (Watch and Logs streams included) one user or cluster certificate may have in "
     "flight at once; more get RESOURCE_EXHAUSTED. Keep it well under NB_RPC_MAX_CALLS"},
    {"run_as", NB__OPT_STR, NB__F(run_as), 0, 0, "\"\"",
     "user the jobs' processes run as (setpriv), for a gateway started as root; launcher local "
     "only; \"\" = the gateway's own user"},
    {"paths.allow", NB__OPT_PATHS, NB__F(allow), 0, 0, "[]",
     "folders besides the job's own that descriptor paths may name (data roots, a shared model "
     "store); read only: checkpoint.dir stays inside the job's folder"},
    {"cancel_grace_ms", NB__OPT_INT, NB__F(cancel_grace_ms), 0, 600000, "5000",
     "SIGTERM to the job's process group, SIGKILL after this"},
    {"poll_ms", NB__OPT_INT, NB__F(poll_ms), 10, 10000, "100",
     "how often job processes and progress files are checked"},
};
#define NB__N_OPTS (sizeof nb__opts / sizeof nb__opts[0])

void nb_gateway_config_defaults(nb_gateway_config_t* c) {
  memset(c, 0, sizeof *c);
  snprintf(c->listen, sizeof c->listen, "127.0.0.1:7070");
  nb_launcher_conf_defaults(&c->launcher);
  const char* cmd[] = {"nebula", "train", "{descriptor}", "--out", "{jobdir}"};
  c->n_command = 5;
  for (int i = 0; i < 5; i++) snprintf(c->command[i], NB_GW_STR, "%s", cmd[i]);
  const char* wcmd[] = {"nebula",    "worker", "--job",        "{descriptor}",  "--cluster",
                        "{cluster}", "--out",  "{jobdir}/out", "--listen",      "{listen}",
                        "{peers}",   "--pki",  "{pki}",        "--secret-file", "{secret_file}"};
  c->n_worker_command = (int)(sizeof wcmd / sizeof wcmd[0]);
  for (int i = 0; i < c->n_worker_command; i++)
    snprintf(c->worker_command[i], NB_GW_STR, "%s", wcmd[i]);
  snprintf(c->exchange_host, sizeof c->exchange_host, "127.0.0.1");
  c->federation_timeout_ms = 10000;
  c->slots = 4;
  c->device = NB_JOB_DEVICE_CPU;
  snprintf(c->work_dir, sizeof c->work_dir, "work");
  c->cancel_grace_ms = 5000;
  c->poll_ms = 100;
  c->calls_per_identity = 16;
}

void nb_gateway_config_help(FILE* f) {
  fprintf(f, "config file keys (JSON; a dotted key is a nested object):\n");
  for (size_t i = 0; i < NB__N_OPTS; i++) {
    static const char* tn[] = {"string", "path",   "integer", "[string]", "{id: addr}", "[rule]",
                               "[user]", "string", "string",  "[string]", "[string]",   "[path]"};
    _Static_assert(sizeof tn / sizeof tn[0] == NB__OPT_PATHS + 1, "a name for every type");
    fprintf(f, "  %-18s %-10s default %s\n      %s\n", nb__opts[i].name, tn[nb__opts[i].type],
            nb__opts[i].def, nb__opts[i].help);
  }
}

static nb_status_t nb__cfg_str(const char* key, json_t* v, char* dst, size_t cap,
                               const char* base) {
  if (!json_is_string(v)) return nb_error(NB_ERR_CONFIG, "config: %s: expected a string", key);
  const char* s = json_string_value(v);
  int n;
  if (base && s[0] != '/' && s[0])
    n = snprintf(dst, cap, "%s/%s", base, s);
  else
    n = snprintf(dst, cap, "%s", s);
  if (n < 0 || (size_t)n >= cap)
    return nb_error(NB_ERR_CONFIG, "config: %s: longer than %zu bytes", key, cap - 1);
  return NB_OK;
}

static nb_status_t nb__cfg_set(const nb__opt_t* o, json_t* v, const char* base,
                               nb_gateway_config_t* c) {
  char* p = (char*)c + o->offset;
  switch (o->type) {
    case NB__OPT_STR:
      return nb__cfg_str(o->name, v, p, o->size, NULL);
    case NB__OPT_PATH:
      return nb__cfg_str(o->name, v, p, o->size, base);
    case NB__OPT_INT: {
      if (!json_is_integer(v))
        return nb_error(NB_ERR_CONFIG, "config: %s: expected an integer", o->name);
      json_int_t x = json_integer_value(v);
      if (x < o->min || x > o->max)
        return nb_error(NB_ERR_CONFIG, "config: %s: expected %ld..%ld, found %lld", o->name, o->min,
                        o->max, (long long)x);
      *(int*)p = (int)x;
      return NB_OK;
    }
    case NB__OPT_LAUNCHER: {
      if (!json_is_string(v)) return nb_error(NB_ERR_CONFIG, "config: launcher: expected a string");
      nb_status_t st = nb_launcher_parse(json_string_value(v), &c->launcher.kind);
      return st == NB_OK ? NB_OK : nb_error_wrap(NB_ERR_CONFIG, "config");
    }
    case NB__OPT_DEVICE: {
      const char* s = json_string_value(v);
      if (s && !strcmp(s, "cpu"))
        c->device = NB_JOB_DEVICE_CPU;
      else if (s && !strcmp(s, "cuda"))
        c->device = NB_JOB_DEVICE_CUDA;
      else
        return nb_error(NB_ERR_CONFIG, "config: %s: expected \"cpu\" or \"cuda\"", o->name);
      return NB_OK;
    }
    case NB__OPT_LIST: {
      nb_launcher_args_t* l = (nb_launcher_args_t*)p;
      size_t n = json_is_array(v) ? json_array_size(v) : (size_t)-1;
      if (n > NB_LAUNCH_MAX_ARGS)
        return nb_error(NB_ERR_CONFIG, "config: %s: expected an array of at most %d strings",
                        o->name, NB_LAUNCH_MAX_ARGS);
      for (size_t i = 0; i < n; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s[%zu]", o->name, i);
        NB_CHECK(nb__cfg_str(key, json_array_get(v, i), l->v[i], NB_LAUNCH_ARG, NULL));
      }
      l->n = (int)n;
      return NB_OK;
    }
    case NB__OPT_ARGV:
    case NB__OPT_WARGV: {
      int worker = o->type == NB__OPT_WARGV;
      size_t n = json_is_array(v) ? json_array_size(v) : 0;
      if (n < 1 || n > NB_GW_MAX_ARGS)
        return nb_error(NB_ERR_CONFIG, "config: %s: expected an array of 1..%d strings", o->name,
                        NB_GW_MAX_ARGS);
      for (size_t i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s[%zu]", o->name, i);
        NB_CHECK(nb__cfg_str(key, json_array_get(v, i),
                             worker ? c->worker_command[i] : c->command[i], NB_GW_STR, NULL));
      }
      if (worker)
        c->n_worker_command = (int)n;
      else
        c->n_command = (int)n;
      return NB_OK;
    }
    case NB__OPT_PATHS: {
      size_t n = json_is_array(v) ? json_array_size(v) : (size_t)-1;
      if (n > NB_JOB_PATHS_MAX_ROOTS)
        return nb_error(NB_ERR_CONFIG, "config: %s: expected an array of at most %d paths", o->name,
                        NB_JOB_PATHS_MAX_ROOTS);
      for (size_t i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s[%zu]", o->name, i);
        NB_CHECK(nb__cfg_str(key, json_array_get(v, i), c->allow[i], NB_GW_STR, base));
        if (!c->allow[i][0] || strchr(c->allow[i], ':'))
          return nb_error(NB_ERR_CONFIG, "config: %s: expected a non-empty path without ':'", key);
      }
      c->n_allow = (int)n;
      return NB_OK;
    }
    case NB__OPT_USERS: {
      size_t n = json_is_array(v) ? json_array_size(v) : (size_t)-1;
      if (n > NB_GW_MAX_ADMINS)
        return nb_error(NB_ERR_CONFIG, "config: admins: expected an array of at most %d names",
                        NB_GW_MAX_ADMINS);
      for (size_t i = 0; i < n; i++)
        NB_CHECK(
            nb__cfg_str("admins[]", json_array_get(v, i), c->admins[i], NB_ACL_NAME_MAX, NULL));
      c->n_admins = (int)n;
      return NB_OK;
    }
    case NB__OPT_PEERS: {
      if (!json_is_object(v))
        return nb_error(NB_ERR_CONFIG, "config: peers: expected an object id -> address");
      const char* id;
      json_t* a;
      c->n_peers = 0;
      json_object_foreach(v, id, a) {
        if (c->n_peers >= NB_GW_MAX_PEERS)
          return nb_error(NB_ERR_CONFIG, "config: peers: more than %d", NB_GW_MAX_PEERS);
        nb_gateway_peer_t* pe = &c->peers[c->n_peers];
        if (nb_pki_name_check(id, "peer cluster id") != NB_OK)
          return nb_error_wrap(NB_ERR_CONFIG, "config: peers");
        snprintf(pe->id, sizeof pe->id, "%s", id);
        char key[128];
        snprintf(key, sizeof key, "peers.%s", id);
        NB_CHECK(nb__cfg_str(key, a, pe->address, sizeof pe->address, NULL));
        char what[160];
        snprintf(what, sizeof what, "config: %s", key);
        NB_CHECK(nb_cli_addr_check(pe->address, 0, what));
        c->n_peers++;
      }
      return NB_OK;
    }
    case NB__OPT_ACL: {
      if (!json_is_array(v)) return nb_error(NB_ERR_CONFIG, "config: acl: expected an array");
      memset(&c->acl, 0, sizeof c->acl);
      for (size_t i = 0; i < json_array_size(v); i++) {
        json_t* r = json_array_get(v, i);
        const char* k;
        json_t* x;
        if (!json_is_object(r))
          return nb_error(NB_ERR_CONFIG, "config: acl[%zu]: expected an object", i);
        json_object_foreach(r, k, x) {
          if (strcmp(k, "user") && strcmp(k, "clusters") && strcmp(k, "max_workers"))
            return nb_error(NB_ERR_CONFIG,
                            "config: acl[%zu].%s: unknown key (user, clusters, max_workers)", i, k);
        }
        json_t* u = json_object_get(r, "user");
        json_t* cl = json_object_get(r, "clusters");
        json_t* mw = json_object_get(r, "max_workers");
        if (!json_is_string(u))
          return nb_error(NB_ERR_CONFIG, "config: acl[%zu].user: expected a string", i);
        const char* cls[NB_ACL_MAX_CLUSTERS];
        int n = 0;
        if (!cl) {
          cls[n++] = "*";
        } else {
          if (!json_is_array(cl) || json_array_size(cl) < 1 ||
              json_array_size(cl) > NB_ACL_MAX_CLUSTERS)
            return nb_error(NB_ERR_CONFIG, "config: acl[%zu].clusters: expected 1..%d strings", i,
                            NB_ACL_MAX_CLUSTERS);
          for (size_t j = 0; j < json_array_size(cl); j++) {
            cls[n] = json_string_value(json_array_get(cl, j));
            if (!cls[n])
              return nb_error(NB_ERR_CONFIG, "config: acl[%zu].clusters[%zu]: expected a string", i,
                              j);
            n++;
          }
        }
        if (mw && (!json_is_integer(mw) || json_integer_value(mw) < 0 ||
                   json_integer_value(mw) > (1 << 20)))
          return nb_error(NB_ERR_CONFIG, "config: acl[%zu].max_workers: expected an integer >= 0",
                          i);
        if (nb_acl_add(&c->acl, json_string_value(u), cls, n,
                       mw ? (int)json_integer_value(mw) : 0) != NB_OK)
          return nb_error_wrap(NB_ERR_CONFIG, "config: acl[%zu]", i);
      }
      return NB_OK;
    }
  }
  return nb_error(NB_ERR_INTERNAL, "config: bad option type");
}

/* Walks an object; `prefix` is the dotted path so far. Every leaf must be an option. */
static nb_status_t nb__cfg_walk(json_t* obj, const char* prefix, const char* base,
                                nb_gateway_config_t* c) {
  const char* k;
  json_t* v;
  json_object_foreach(obj, k, v) {
    char name[256];
    snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", k);
    const nb__opt_t* o = NULL;
    int is_prefix = 0;
    size_t ln = strlen(name);
    for (size_t i = 0; i < NB__N_OPTS; i++) {
      if (!strcmp(nb__opts[i].name, name)) o = &nb__opts[i];
      if (!strncmp(nb__opts[i].name, name, ln) && nb__opts[i].name[ln] == '.') is_prefix = 1;
    }
    if (o) {
      NB_CHECK(nb__cfg_set(o, v, base, c));
    } else if (is_prefix) {
      if (!json_is_object(v))
        return nb_error(NB_ERR_CONFIG, "config: %s: expected an object", name);
      NB_CHECK(nb__cfg_walk(v, name, base, c));
    } else {
      return nb_error(NB_ERR_CONFIG, "config: %s: unknown key (see nebula gateway --help)", name);
    }
  }
  return NB_OK;
}

nb_status_t nb_gateway_config_parse(const char* text, size_t len, const char* base_dir,
                                    nb_gateway_config_t* cfg) {
  if (!text || !cfg) return nb_error(NB_ERR_INVALID, "config: NULL argument");
  json_error_t je;
  json_t* root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return nb_error(NB_ERR_CONFIG, "config: line %d, column %d: %s", je.line, je.column, je.text);
  nb_status_t st = NB_OK;
  if (!json_is_object(root))
    st = nb_error(NB_ERR_CONFIG, "config: expected a JSON object at the top");
  else
    st = nb__cfg_walk(root, "", base_dir, cfg);
  json_decref(root);
  if (st != NB_OK) return st;
  if (!cfg->cluster_id[0]) return nb_error(NB_ERR_CONFIG, "config: cluster_id is required");
  NB_CHECK(nb_cli_addr_check(cfg->listen, 1, "config: listen"));
  if (nb_pki_name_check(cfg->cluster_id, "cluster_id") != NB_OK)
    return nb_error_wrap(NB_ERR_CONFIG, "config");
  if (!cfg->tls_ca[0] || !cfg->tls_cert[0] || !cfg->tls_key[0])
    return nb_error(NB_ERR_CONFIG, "config: tls.ca, tls.cert and tls.key are required");
  NB_CHECK(nb_launcher_conf_check(&cfg->launcher));
  if (base_dir && cfg->work_dir[0] != '/' && !strcmp(cfg->work_dir, "work")) {
    char tmp[NB_GW_STR];
    snprintf(tmp, sizeof tmp, "%s/work", base_dir);
    memcpy(cfg->work_dir, tmp, sizeof tmp);
  }
  return NB_OK;
}

nb_status_t nb_gateway_config_load(const char* path, nb_gateway_config_t* cfg) {
  FILE* f = fopen(path, "re");
  if (!f) return nb_error(NB_ERR_IO, "config: cannot open %s: %s", path, strerror(errno));
  char* buf = NULL;
  size_t cap = 1 << 20, n;
  nb_status_t st = nb_alloc((void**)&buf, cap, 1, "config");
  if (st != NB_OK) {
    fclose(f);
    return st;
  }
  n = fread(buf, 1, cap, f);
  fclose(f);
  if (n == cap) {
    nb_free(buf);
    return nb_error(NB_ERR_CONFIG, "config: %s is larger than 1 MiB", path);
  }
  char dir[NB_GW_STR];
  snprintf(dir, sizeof dir, "%s", path);
  char* d = dirname(dir);
  char absdir[NB_GW_STR];
  if (!realpath(d, absdir)) snprintf(absdir, sizeof absdir, "%s", d);
  st = nb_gateway_config_parse(buf, n, absdir, cfg);
  nb_free(buf);
  if (st != NB_OK) return nb_error_wrap(st, "%s", path);
  return NB_OK;
}

/* ------------------------------------------------------------------ the daemon */

typedef struct {
  char id[NB_JOB_ID_MAX];
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2];
  nb_launch_t launch; /* pid 0: a reservation (a federated job proposed, not launched yet) */
  int own_child;      /* 1: we forked it and reap it; 0: re-attached after a restart */
  int workers;
  long progress_off;
  int progress_skip;       /* lines already recorded before a restart */
  char cancel_reason[512]; /* set by Cancel: the end is recorded as cancelled with this */
} nb__active_t;

/* Something runs for this entry (a process, or a Slurm job); otherwise it is a reservation. */
static int nb__launched(const nb__active_t* a) {
  return a->launch.pid > 0 || a->launch.slurm_id[0] != 0;
}

#define NB__MAX_ACTIVE 256
#define NB__MAX_REPORTS 16

/* A run report to build (docs/gateway.md, Run report). */
typedef struct {
  char id[NB_JOB_ID_MAX];
  double started, next, deadline; /* nb_now_s(): queued, next try, last try */
} nb__report_t;

/* One method of the server, behind the per-identity limit (nb__limited). */
typedef struct {
  struct nb_gateway* gw;
  nb_rpc_handler_fn fn;
} nb__hand_t;

#define NB__MAX_IDENTITIES 256
#define NB__N_METHODS 12

struct nb_gateway {
  nb_gateway_config_t cfg;
  int run_as; /* jobs run as run_uid:run_gid (cfg.run_as) */
  uid_t run_uid;
  gid_t run_gid;
  nb__hand_t hand[NB__N_METHODS];
  pthread_mutex_t lim_mu; /* calls in flight per identity */
  int n_ident;
  struct {
    char key[160]; /* "user:alice", "cluster:dc-b" */
    int calls;
  } ident[NB__MAX_IDENTITIES];
  char self_exe[NB_GW_STR];
  nb_tls_t* tls;
  X509* ca;
  nb_rpc_server_t* srv;
  nb_job_store_t* mon_store; /* monitor thread's own handle */
  pthread_t mon;
  int mon_started;
  _Atomic int stopping;
  pthread_mutex_t mu; /* recursive: active[] and read-modify-write of federation records */
  nb_rpc_client_t* peer_cli[NB_GW_MAX_PEERS]; /* Federation clients, one per configured peer */
  nb_job_store_t* fed_store;                  /* the federation thread's own handle */
  nb_artifact_store_t* art;                   /* <work_dir>/artifacts: what jobs produced */
  char publish[16][NB_JOB_ID_MAX]; /* jobs that succeeded here, outputs to put in `art` (mu) */
  int n_publish;
  nb__report_t report[NB__MAX_REPORTS]; /* run reports to build (mu) */
  int n_report;
  nb_job_store_t* rep_store; /* the report thread's own handle */
  pthread_t rep;
  int rep_started;
  pthread_t fed;
  int fed_started;
  nb__active_t active[NB__MAX_ACTIVE];
  int n_active;
};

static int nb__active_find(nb_gateway_t* gw, const char* id) {
  for (int i = 0; i < gw->n_active; i++)
    if (!strcmp(gw->active[i].id, id)) return i;
  return -1;
}

static void nb__jobdir(const nb_gateway_t* gw, const char* id, char* buf, size_t n) {
  snprintf(buf, n, "%s/%.63s", gw->cfg.work_dir, id);
}

/* With run_as, the job's user owns what the gateway prepares for it to read or write there. */
static void nb__give(const nb_gateway_t* gw, const char* path) {
  if (gw->run_as && lchown(path, gw->run_uid, gw->run_gid) != 0)
    NB_WARN("cannot give %s to the run_as user: %s", path, strerror(errno));
}

/* Opens a file the job's processes wrote, for the gateway to read. With run_as the job's user
 * owns the job's folder and could put a link there to a file only the gateway may read: a file
 * is read only if, once open, it is a regular file of that user (so nothing the job could not
 * read itself). Returns the descriptor or -1 (errno EPERM for a refused file). */
static int nb__open_job_file(const nb_gateway_t* gw, const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0 || !gw->run_as) return fd;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != gw->run_uid) {
    NB_WARN("%s is not a regular file of the run_as user '%s': not read", path, gw->cfg.run_as);
    close(fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

/* ------------------------------------------------------------------ federation records */

#define NB__MAX_PARTS (NB_JOB_MAX_CLUSTERS + 1) /* the clusters named + the base's holder */

/* A federated job's record and its info object (parsed; "{}" when empty). On NB_OK the caller
 * releases both (nb_job_fed_clear, json_decref). NB_ERR_NOT_FOUND: not federated. */
static nb_status_t nb__fed_load(nb_job_store_t* st, const char* id, nb_job_fed_t* f,
                                json_t** info) {
  NB_CHECK(nb_job_store_fed_get(st, id, f));
  *info = json_loads(f->info ? f->info : "{}", 0, NULL);
  if (!json_is_object(*info)) {
    json_decref(*info);
    *info = json_object();
  }
  return NB_OK;
}

static nb_status_t nb__fed_save(nb_job_store_t* st, const nb_job_fed_t* f, json_t* info) {
  char* txt = json_dumps(info, JSON_COMPACT);
  if (!txt) return nb_error(NB_ERR_NOMEM, "federation record of job %s", f->job_id);
  nb_job_fed_t tmp = *f;
  tmp.info = txt;
  nb_status_t s = nb_job_store_fed_put(st, &tmp);
  free(txt);
  return s;
}

static void nb__fed_release(nb_job_fed_t* f, json_t* info) {
  nb_job_fed_clear(f);
  json_decref(info);
}

/* info.clusters[cluster] (created when absent). */
static json_t* nb__fed_cluster(json_t* info, const char* cluster) {
  json_t* cl = json_object_get(info, "clusters");
  if (!json_is_object(cl)) {
    cl = json_object();
    json_object_set_new(info, "clusters", cl);
  }
  json_t* c = json_object_get(cl, cluster);
  if (!json_is_object(c)) {
    c = json_pack("{s:i, s:s, s:s, s:s, s:I}", "workers", 0, "state", "proposed", "reason", "",
                  "endpoint", "", "seq", (json_int_t)0);
    json_object_set_new(cl, cluster, c);
  }
  return c;
}

static const char* nb__jstr(json_t* o, const char* k) {
  const char* v = json_string_value(json_object_get(o, k));
  return v ? v : "";
}

/* Records that `cluster` of an origin job moved to state `to` (info and a cluster_state event). */
static void nb__fed_cluster_state(nb_job_store_t* st, const char* id, json_t* info,
                                  const char* cluster, const char* to, const char* reason) {
  json_t* c = nb__fed_cluster(info, cluster);
  json_t* ev = json_pack("{s:s, s:s, s:s, s:s}", "cluster", cluster, "from", nb__jstr(c, "state"),
                         "to", to, "reason", reason ? reason : "");
  char* txt = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
  if (txt) nb_job_store_append_event(st, id, "cluster_state", txt, NULL);
  free(txt);
  json_decref(ev);
  json_object_set_new(c, "state", json_string(to));
  json_object_set_new(c, "reason", json_string(reason ? reason : ""));
}

static int nb__active_find(nb_gateway_t* gw, const char* id);
static void nb__report_queue(nb_gateway_t* gw, const char* id);

/* The origin's job state from its clusters' (those with workers): failed (or cancelled by
 * someone else than the origin) as soon as one is, and then the others are to be cancelled;
 * succeeded once all are. A final job is left alone. Caller holds gw->mu or runs alone. */
static void nb__fed_aggregate(nb_gateway_t* gw, nb_job_store_t* st, const char* id, json_t* info) {
  nb_job_record_t rec = {0};
  if (nb_job_store_get(st, id, &rec) != NB_OK) return;
  int final = nb_job_state_is_final(rec.state);
  nb_job_record_clear(&rec);
  if (final || json_object_get(info, "cancelling")) return;
  const char* k;
  json_t* c;
  int n = 0, ok = 0;
  char reason[768] = "";
  json_object_foreach(json_object_get(info, "clusters"), k, c) {
    if (json_integer_value(json_object_get(c, "workers")) <= 0) continue;
    n++;
    const char* s = nb__jstr(c, "state");
    if (!strcmp(s, "succeeded")) ok++;
    if (!reason[0] && (!strcmp(s, "failed") || !strcmp(s, "cancelled")))
      snprintf(reason, sizeof reason, "cluster '%s' %s: %.600s", k, s, nb__jstr(c, "reason"));
  }
  if (reason[0]) {
    json_object_set_new(info, "cancel_pending", json_true());
    nb_job_store_transition(st, id, NB_JOB_FAILED, reason);
    NB_WARN("job %s: %s: stopping the other clusters", id, reason);
    pthread_mutex_lock(&gw->mu);
    int i = nb__active_find(gw, id);
    int launched = i >= 0 && nb__launched(&gw->active[i]);
    nb_launch_t launch;
    if (launched) launch = gw->active[i].launch;
    pthread_mutex_unlock(&gw->mu);
    if (launched && nb_launcher_cancel(&launch, gw->cfg.cancel_grace_ms, NULL) != NB_OK)
      NB_WARN("job %s: cannot stop this cluster's workers: %s", id, nb_error_last());
  } else if (n > 0 && ok == n) {
    if (nb_job_store_transition(st, id, NB_JOB_SUCCEEDED, NULL) == NB_OK) nb__report_queue(gw, id);
  }
}

/* Appends new complete lines of the job's progress file as "progress" events. */
static void nb__tail_progress(nb_gateway_t* gw, nb_job_store_t* store, nb__active_t* a) {
  char path[sizeof a->dir + 32];
  snprintf(path, sizeof path, "%s/%s", a->dir, NB_LAUNCH_PROGRESS);
  int pfd = nb__open_job_file(gw, path);
  FILE* f = pfd >= 0 ? fdopen(pfd, "re") : NULL;
  if (!f) {
    if (pfd >= 0) close(pfd);
    return;
  }
  if (fseek(f, a->progress_off, SEEK_SET) != 0) {
    fclose(f);
    return;
  }
  char line[8192];
  while (fgets(line, sizeof line, f)) {
    size_t n = strlen(line);
    if (n == 0 || line[n - 1] != '\n') break; /* incomplete: read again next time */
    a->progress_off += (long)n;
    json_t* j = json_loads(line, 0, NULL);
    if (!j || !json_is_object(j)) {
      if (a->progress_skip == 0)
        NB_WARN("job %s: progress line is not a JSON object, ignored", a->id);
      json_decref(j);
      continue;
    }
    if (a->progress_skip > 0) { /* recorded before a restart (only valid lines were) */
      a->progress_skip--;
      json_decref(j);
      continue;
    }
    char* txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (txt && nb_job_store_append_event(store, a->id, "progress", txt, NULL) != NB_OK)
      NB_WARN("job %s: cannot record progress: %s", a->id, nb_error_last());
    free(txt);
  }
  fclose(f);
  (void)gw;
}

/* Records the end of a job's process: exit event, final state unless already final. */
static void nb__job_ended(nb_gateway_t* gw, nb_job_store_t* store, nb__active_t* a, int code,
                          int sig, const char* how) {
  nb__tail_progress(gw, store, a);
  if (a->launch.pid > 0 && nb_launcher_group_alive(a->launch.pid))
    nb_launcher_stop(a->launch.pid, 0, NULL); /* strays */
  char what[64];
  nb_launcher_describe(&a->launch, what, sizeof what);
  json_t* ej =
      json_pack("{s:i, s:i, s:i}", "pid", (int)a->launch.pid, "exit_code", code, "signal", sig);
  json_t* ranks = nb_launcher_rank_codes(a->dir, a->workers);
  if (ej && ranks) json_object_set_new(ej, "ranks", ranks);
  if (ej && a->launch.slurm_id[0])
    json_object_set_new(ej, "slurm_id", json_string(a->launch.slurm_id));
  char* payload = ej ? json_dumps(ej, JSON_COMPACT) : NULL;
  json_decref(ej);
  nb_job_store_append_event(store, a->id, "exit", payload ? payload : "{}", NULL);
  free(payload);
  nb_job_record_t rec = {0};
  nb_job_fed_t fed;
  json_t* info = NULL;
  int origin = 0, federated = 0;
  if (!a->cancel_reason[0] && nb__fed_load(store, a->id, &fed, &info) == NB_OK) {
    federated = 1;
    origin = !strcmp(fed.role, "origin");
    if (!origin) nb__fed_release(&fed, info);
  }
  if (nb_job_store_get(store, a->id, &rec) == NB_OK && (rec.state == NB_JOB_RUNNING || origin)) {
    char reason[512];
    nb_job_state_t to = NB_JOB_SUCCEEDED;
    reason[0] = 0;
    if (a->cancel_reason[0]) {
      to = NB_JOB_CANCELLED;
      snprintf(reason, sizeof reason, "%s", a->cancel_reason);
    } else if (sig) {
      to = NB_JOB_FAILED;
      snprintf(reason, sizeof reason, "%s killed by signal %d (%s)%s", what, sig, strsignal(sig),
               how);
    } else if (code != 0) {
      to = NB_JOB_FAILED;
      snprintf(reason, sizeof reason, "%s exited with code %d%s", what, code, how);
    } else if (*how) {
      snprintf(reason, sizeof reason, "finished%s", how);
    }
    if (to == NB_JOB_SUCCEEDED && gw->n_publish < 16) {
      pthread_mutex_lock(&gw->mu);
      snprintf(gw->publish[gw->n_publish++], NB_JOB_ID_MAX, "%s", a->id);
      pthread_mutex_unlock(&gw->mu);
    }
    if (origin) {
      /* this cluster's part of a federated job ended: the job's state is the aggregate */
      nb__fed_cluster_state(store, a->id, info, gw->cfg.cluster_id, nb_job_state_name(to), reason);
      nb__fed_aggregate(gw, store, a->id, info);
      if (nb__fed_save(store, &fed, info) != NB_OK)
        NB_WARN("job %s: cannot record its federation state: %s", a->id, nb_error_last());
    } else if (nb_job_store_transition(store, a->id, to, reason) != NB_OK) {
      NB_WARN("job %s: cannot record its end: %s", a->id, nb_error_last());
    } else if (to == NB_JOB_SUCCEEDED && !federated && !a->cancel_reason[0]) {
      nb__report_queue(gw, a->id); /* a job of this cluster only */
    }
  }
  if (origin) nb__fed_release(&fed, info);
  nb_job_record_clear(&rec);
}

/* Puts the files of one output folder in the artifact store as
 * "<owner>/<job name>/<prefix><file>", owned by (owner, id): every *.safetensors, summary.json
 * and rounds.tsv at its top. Records an "artifact" event for each. */
static void nb__publish_dir(nb_gateway_t* gw, nb_job_store_t* st, const char* id, const char* owner,
                            const char* job_name, const char* dir, const char* prefix) {
  DIR* d = opendir(dir);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    int want = (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) ||
               !strcmp(e->d_name, "summary.json") || !strcmp(e->d_name, "rounds.tsv");
    if (!want) continue;
    char path[NB_GW_STR * 2 + 512], name[NB_ARTIFACT_NAME_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (snprintf(name, sizeof name, "%s/%s/%s%s", owner, job_name, prefix, e->d_name) >=
        (int)sizeof name)
      continue;
    int fd = nb__open_job_file(gw, path);
    if (fd < 0) continue;
    char via[64]; /* the file just checked, whatever its name points to by now */
    snprintf(via, sizeof via, "/proc/self/fd/%d", fd);
    nb_artifact_info_t info;
    nb_status_t ps = nb_artifact_put(gw->art, name, owner, id, via, &info);
    close(fd);
    if (ps != NB_OK) {
      NB_WARN("job %s: cannot keep %s as artifact %s: %s", id, path, name, nb_error_last());
      continue;
    }
    json_t* j = json_pack("{s:s, s:s, s:I}", "name", name, "sha256", info.sha256, "size",
                          (json_int_t)info.size);
    char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt) nb_job_store_append_event(st, id, "artifact", txt, NULL);
    free(txt);
    json_decref(j);
  }
  closedir(d);
}

/* A job's part succeeded here: its outputs (final model, summary, the latest checkpoint with
 * the adapters of a LoRA job) become artifacts under "<owner>/<job name>/<relative path>",
 * owned by the job's user and the job, where peer gateways of a later job of the same user can
 * fetch them (gateway/artifact.h: who is entitled to what). */
static void nb__publish(nb_gateway_t* gw, nb_job_store_t* st, const char* id) {
  if (!gw->art) return;
  nb_job_record_t rec = {0};
  if (nb_job_store_get(st, id, &rec) != NB_OK) return;
  json_t* d = json_loads(rec.descriptor ? rec.descriptor : "", 0, NULL);
  char owner[NB_ARTIFACT_ID_MAX];
  snprintf(owner, sizeof owner, "%.63s", rec.owner);
  nb_job_record_clear(&rec);
  if (!owner[0] || strchr(owner, '/')) {
    json_decref(d);
    NB_WARN("job %s: no owner recorded; its outputs are not kept as artifacts", id);
    return;
  }
  const char* nm = json_string_value(json_object_get(json_object_get(d, "metadata"), "name"));
  char job_name[NB_JOB_NAME_MAX];
  snprintf(job_name, sizeof job_name, "%.63s", nm ? nm : id);
  json_decref(d);
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], out[sizeof dir + 8], ck[sizeof out + 16];
  nb__jobdir(gw, id, dir, sizeof dir);
  snprintf(out, sizeof out, "%s/out", dir);
  const char* tops[2] = {out, dir};
  for (int t = 0; t < 2; t++) {
    nb__publish_dir(gw, st, id, owner, job_name, tops[t], "");
    /* the newest trainer checkpoint folder step-<N> */
    snprintf(ck, sizeof ck, "%s/checkpoints", tops[t]);
    DIR* cd = opendir(ck);
    if (!cd) continue;
    long best = -1;
    struct dirent* e;
    while ((e = readdir(cd))) {
      long step;
      char tail;
      if (sscanf(e->d_name, "step-%ld%c", &step, &tail) == 1 && step > best) best = step;
    }
    closedir(cd);
    if (best < 0) continue;
    char sub[sizeof ck + 32], prefix[64];
    snprintf(sub, sizeof sub, "%s/step-%ld", ck, best);
    snprintf(prefix, sizeof prefix, "checkpoints/step-%ld/", best);
    nb__publish_dir(gw, st, id, owner, job_name, sub, prefix);
  }
}

static void* nb__monitor(void* arg) {
  nb_gateway_t* gw = arg;
  while (!gw->stopping) {
    pthread_mutex_lock(&gw->mu);
    for (int i = 0; i < gw->n_active; i++) {
      nb__active_t* a = &gw->active[i];
      if (!nb__launched(a)) continue; /* a reservation: nothing runs yet */
      int ended = 0, code = -1, sig = 0;
      if (a->own_child) {
        int status = 0;
        pid_t r = waitpid(a->launch.pid, &status, WNOHANG);
        if (r == a->launch.pid) {
          ended = 1;
          if (WIFEXITED(status)) code = WEXITSTATUS(status);
          if (WIFSIGNALED(status)) sig = WTERMSIG(status);
          /* the wrapper reports a command killed by signal N as 128+N */
          if (code > 128 && code < 128 + 65) {
            sig = code - 128;
          }
        } else if (r < 0 && errno == ECHILD) {
          a->own_child = 0;
        }
      }
      if (!a->own_child && !ended && !nb_launcher_alive(&a->launch)) {
        ended = 1;
        if (nb_launcher_exit_code(a->dir, &code) != NB_OK) code = -1;
        if (code > 128 && code < 128 + 65) sig = code - 128;
      }
      if (!ended) {
        nb__tail_progress(gw, gw->mon_store, a);
        continue;
      }
      nb__job_ended(gw, gw->mon_store, a, code, sig,
                    code == -1 && !sig ? " (no exit status recorded)" : "");
      gw->active[i] = gw->active[--gw->n_active];
      i--;
    }
    char todo[16][NB_JOB_ID_MAX];
    int n_todo = gw->n_publish;
    memcpy(todo, gw->publish, sizeof todo);
    gw->n_publish = 0;
    pthread_mutex_unlock(&gw->mu);
    for (int i = 0; i < n_todo; i++) nb__publish(gw, gw->mon_store, todo[i]);
    nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  return NULL;
}

/* After a restart: the run reports that were pending when the gateway stopped (jobs that
 * succeeded here in the last hour, as origin or of this cluster only, with neither a "report"
 * nor a "report_failed" event) are queued again. */
static void nb__report_recover(nb_gateway_t* gw, nb_job_store_t* st) {
  nb_job_record_t* r = NULL;
  size_t n = 0;
  if (nb_job_store_list(st, NULL, NB_JOB_SUCCEEDED, &r, &n) != NB_OK) return;
  int64_t since = nb_wall_ns() - 3600LL * 1000000000LL;
  for (size_t i = 0; i < n; i++) {
    if (r[i].updated_ns < since) continue;
    nb_job_fed_t fed;
    json_t* info = NULL;
    if (nb__fed_load(st, r[i].id, &fed, &info) == NB_OK) {
      int member = strcmp(fed.role, "origin") != 0;
      nb__fed_release(&fed, info);
      if (member) continue;
    }
    nb_job_event_t* ev = NULL;
    size_t ne = 0;
    int done = 0;
    if (nb_job_store_events(st, r[i].id, 0, 0, &ev, &ne) != NB_OK) continue;
    for (size_t k = 0; k < ne; k++)
      done |= !strcmp(ev[k].kind, "report") || !strcmp(ev[k].kind, "report_failed");
    nb_job_events_free(ev, ne);
    if (!done) nb__report_queue(gw, r[i].id);
  }
  nb_job_records_free(r, n);
}

/* The last "launch" event of a job: pid, start ticks. */
static int nb__last_launch(nb_job_store_t* st, const char* id, nb_launch_t* l, int* workers,
                           int* progress) {
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  int found = 0;
  *progress = 0;
  if (nb_job_store_events(st, id, 0, 0, &ev, &n) != NB_OK) return 0;
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(ev[i].kind, "progress") && !strstr(ev[i].payload, "\"cluster\":"))
      (*progress)++; /* only this cluster's own lines (reported ones carry "cluster") */
    if (strcmp(ev[i].kind, "launch")) continue;
    json_t* j = json_loads(ev[i].payload, 0, NULL);
    if (j) {
      found = nb_launcher_from_json(j, l);
      *workers = (int)json_integer_value(json_object_get(j, "workers"));
      json_decref(j);
    }
  }
  nb_job_events_free(ev, n);
  return found;
}

/* After a restart: pending/proposed jobs were never launched → failed; running jobs are
 * re-attached when their process still lives, else finished from their exit file. */
static nb_status_t nb__recover(nb_gateway_t* gw) {
  nb_job_store_t* st = gw->mon_store;
  for (int s = NB_JOB_PENDING; s <= NB_JOB_PROPOSED; s++) {
    nb_job_record_t* r = NULL;
    size_t n = 0;
    NB_CHECK(nb_job_store_list(st, NULL, s, &r, &n));
    for (size_t i = 0; i < n; i++) {
      nb_job_store_transition(st, r[i].id, NB_JOB_FAILED,
                              "the gateway restarted before the job was launched");
      NB_WARN("job %s: was %s when the gateway stopped: marked failed", r[i].id,
              nb_job_state_name(s));
    }
    nb_job_records_free(r, n);
  }
  nb_job_record_t* r = NULL;
  size_t n = 0;
  NB_CHECK(nb_job_store_list(st, NULL, NB_JOB_RUNNING, &r, &n));
  for (size_t i = 0; i < n; i++) {
    nb__active_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.id, sizeof a.id, "%s", r[i].id);
    nb__jobdir(gw, a.id, a.dir, sizeof a.dir);
    nb_job_fed_t fed;
    json_t* info = NULL;
    if (nb__fed_load(st, a.id, &fed, &info) == NB_OK) {
      /* a federated job with no workers here: its clusters report to us, nothing to attach */
      int here = (int)json_integer_value(
          json_object_get(nb__fed_cluster(info, gw->cfg.cluster_id), "workers"));
      nb__fed_release(&fed, info);
      if (here == 0) {
        NB_WARN("job %s: runs on peer clusters only: still followed", a.id);
        continue;
      }
    }
    if (!nb__last_launch(st, a.id, &a.launch, &a.workers, &a.progress_skip)) {
      nb_job_store_transition(st, a.id, NB_JOB_FAILED,
                              "the gateway restarted and found no record of the job's process");
      continue;
    }
    char what[64];
    nb_launcher_describe(&a.launch, what, sizeof what);
    if (nb_launcher_alive(&a.launch) && gw->n_active < NB__MAX_ACTIVE) {
      NB_WARN("job %s: %s still runs: re-attached", a.id, what);
      gw->active[gw->n_active++] = a;
      continue;
    }
    int code = -1;
    if (nb_launcher_exit_code(a.dir, &code) == NB_OK) {
      nb__job_ended(gw, st, &a, code, code > 128 && code < 193 ? code - 128 : 0,
                    " while the gateway was down");
    } else {
      nb__tail_progress(gw, st, &a);
      char reason[256];
      snprintf(reason, sizeof reason,
               "%s is gone and left no exit status (it died while the gateway was down)", what);
      nb_job_store_transition(st, a.id, NB_JOB_FAILED, reason);
      NB_WARN("job %s: %s: marked failed", a.id, reason);
    }
  }
  nb_job_records_free(r, n);
  nb__report_recover(gw, st);
  return NB_OK;
}

/* ------------------------------------------------------------------ handlers */

/* Every Gateway and Federation call passes here: one certificate may have at most
 * limits.calls_per_identity calls in flight, so that one user's streams (Watch, Logs -f) cannot
 * take every handler of the server (NB_RPC_MAX_CALLS) from the others. */
static nb_status_t nb__limited(nb_rpc_call_t* call, void* user_data) {
  nb__hand_t* h = user_data;
  nb_gateway_t* gw = h->gw;
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind == NB_TLS_PEER_NONE) return h->fn(call, gw); /* refused there */
  char key[sizeof gw->ident[0].key];
  snprintf(key, sizeof key, "%s:%.140s", p->kind == NB_TLS_PEER_CLUSTER ? "cluster" : "user",
           p->name);
  int limit = gw->cfg.calls_per_identity > 0 ? gw->cfg.calls_per_identity : 16, k = -1, n = 0;
  pthread_mutex_lock(&gw->lim_mu);
  for (int i = 0; i < gw->n_ident && k < 0; i++)
    if (!strcmp(gw->ident[i].key, key)) k = i;
  if (k < 0 && gw->n_ident < NB__MAX_IDENTITIES) {
    k = gw->n_ident++;
    snprintf(gw->ident[k].key, sizeof gw->ident[k].key, "%s", key);
    gw->ident[k].calls = 0;
  }
  if (k >= 0 && (n = gw->ident[k].calls) < limit) gw->ident[k].calls++;
  pthread_mutex_unlock(&gw->lim_mu);
  if (k < 0)
    return nb_error(NB_ERR_NOMEM, "gateway '%s' serves calls of at most %d identities at once",
                    gw->cfg.cluster_id, NB__MAX_IDENTITIES);
  if (n >= limit) {
    NB_WARN("%s '%s' has %d calls in flight, refusing another (limits.calls_per_identity)",
            p->kind == NB_TLS_PEER_CLUSTER ? "cluster" : "user", p->name, n);
    /* NB_ERR_NOMEM is what the RPC layer answers as RESOURCE_EXHAUSTED */
    return nb_error(NB_ERR_NOMEM,
                    "%s '%s' already has %d calls in flight at gateway '%s', the limit per "
                    "identity (limits.calls_per_identity = %d): end one (a watch or logs -f) "
                    "and try again",
                    p->kind == NB_TLS_PEER_CLUSTER ? "cluster" : "user", p->name, n,
                    gw->cfg.cluster_id, limit);
  }
  nb_status_t st = h->fn(call, gw);
  pthread_mutex_lock(&gw->lim_mu);
  for (int i = 0; i < gw->n_ident; i++)
    if (!strcmp(gw->ident[i].key, key)) {
      if (--gw->ident[i].calls <= 0) gw->ident[i] = gw->ident[--gw->n_ident];
      break;
    }
  pthread_mutex_unlock(&gw->lim_mu);
  return st;
}

static int nb__is_admin(const nb_gateway_t* gw, const char* user) {
  for (int i = 0; i < gw->cfg.n_admins; i++)
    if (!strcmp(gw->cfg.admins[i], user)) return 1;
  return 0;
}

/* The caller's user name; cluster certificates (peer gateways) act as admins. */
static nb_status_t nb__caller(nb_rpc_call_t* call, const char** user, int* admin) {
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind == NB_TLS_PEER_NONE)
    return nb_error(NB_ERR_PERMISSION, "the Gateway API needs a client certificate");
  *user = p->name;
  *admin = p->kind == NB_TLS_PEER_CLUSTER;
  return NB_OK;
}

/* The start of every handler but Submit: who calls (listed admins included) and its request. */
static nb_status_t nb__request(nb_rpc_call_t* call, nb_gateway_t* gw,
                               const ProtobufCMessageDescriptor* desc, const char* method,
                               const char** user, int* admin, ProtobufCMessage** m) {
  NB_CHECK(nb__caller(call, user, admin));
  *admin |= nb__is_admin(gw, *user);
  int end = 0;
  *m = NULL;
  NB_CHECK(nb_rpc_call_recv_pb(call, desc, m, &end, NB_RPC_INFINITE));
  if (!*m) return nb_error(NB_ERR_INVALID, "%s: no request", method);
  return NB_OK;
}

static nb_status_t nb__open_store(nb_gateway_t* gw, nb_job_store_t** st) {
  nb_status_t s = nb_job_store_open(gw->cfg.store_path, st);
  if (s != NB_OK) return nb_error_wrap(NB_ERR_UNAVAILABLE, "job store");
  return NB_OK;
}

/* Fills a Job message from a record; strings point into rec (keep it alive while sending). */
static void nb__job_msg(nb_gateway_t* gw, const nb_job_record_t* rec, int with_descriptor,
                        Nebula__V1__Job* m, char* name, size_t name_cap) {
  nebula__v1__job__init(m);
  m->id = (char*)rec->id;
  m->owner = (char*)rec->owner;
  m->state = (char*)nb_job_state_name(rec->state);
  m->reason = rec->reason ? rec->reason : (char*)"";
  m->created_unix_ns = rec->created_ns;
  m->updated_unix_ns = rec->updated_ns;
  m->cluster = gw->cfg.cluster_id;
  m->descriptor = with_descriptor && rec->descriptor ? rec->descriptor : (char*)"";
  m->exit_code = -1;
  name[0] = 0;
  json_t* d = rec->descriptor ? json_loads(rec->descriptor, 0, NULL) : NULL;
  const char* nm = json_string_value(json_object_get(json_object_get(d, "metadata"), "name"));
  if (nm) snprintf(name, name_cap, "%s", nm);
  json_decref(d);
  m->name = name;
  pthread_mutex_lock(&gw->mu);
  int k = nb__active_find(gw, rec->id);
  if (k >= 0) m->pid = gw->active[k].launch.pid;
  pthread_mutex_unlock(&gw->mu);
}

static nb_status_t nb__send_job(nb_rpc_call_t* call, nb_gateway_t* gw, nb_job_store_t* st,
                                const char* id, int with_descriptor) {
  nb_job_record_t rec = {0};
  NB_CHECK(nb_job_store_get(st, id, &rec));
  Nebula__V1__Job m;
  char name[NB_JOB_NAME_MAX];
  nb__job_msg(gw, &rec, with_descriptor, &m, name, sizeof name);
  /* exit code from the last exit event */
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  char report[NB_GW_STR * 2] = "";
  if (nb_job_state_is_final(rec.state) && nb_job_store_events(st, id, 0, 0, &ev, &n) == NB_OK) {
    for (size_t i = 0; i < n; i++) {
      int is_exit = !strcmp(ev[i].kind, "exit"), is_report = !strcmp(ev[i].kind, "report");
      if (!is_exit && !is_report) continue;
      json_t* j = json_loads(ev[i].payload, 0, NULL);
      if (j && is_exit) m.exit_code = (int32_t)json_integer_value(json_object_get(j, "exit_code"));
      if (j && is_report) snprintf(report, sizeof report, "%s", nb__jstr(j, "path"));
      json_decref(j);
    }
    m.report = report;
    nb_job_events_free(ev, n);
  }
  /* the origin of a federated job: every cluster's part */
  Nebula__V1__ClusterPart parts[NB__MAX_PARTS];
  Nebula__V1__ClusterPart* pp[NB__MAX_PARTS];
  nb_job_fed_t fed;
  json_t* info = NULL;
  int loaded = with_descriptor && nb__fed_load(st, id, &fed, &info) == NB_OK;
  if (loaded && !strcmp(fed.role, "origin")) {
    const char* k;
    json_t* c;
    json_object_foreach(json_object_get(info, "clusters"), k, c) {
      if (m.n_clusters >= NB__MAX_PARTS) break;
      Nebula__V1__ClusterPart* p = &parts[m.n_clusters];
      nebula__v1__cluster_part__init(p);
      p->cluster = (char*)k;
      p->workers = (int32_t)json_integer_value(json_object_get(c, "workers"));
      p->state = (char*)nb__jstr(c, "state");
      p->reason = (char*)nb__jstr(c, "reason");
      p->endpoint = (char*)nb__jstr(c, "endpoint");
      pp[m.n_clusters++] = p;
    }
    m.clusters = pp;
  }
  nb_status_t s = nb_rpc_call_send_pb(call, &m.base);
  if (loaded) nb__fed_release(&fed, info);
  nb_job_record_clear(&rec);
  return s;
}

/* Loads a job the caller may see: its own, or any for admins. */
static nb_status_t nb__job_for(nb_job_store_t* st, const char* id, const char* user, int admin,
                               nb_job_record_t* rec) {
  if (!id || !*id) return nb_error(NB_ERR_INVALID, "job_id is empty");
  nb_status_t s = nb_job_store_get(st, id, rec);
  if (s == NB_ERR_NOT_FOUND) return nb_error(NB_ERR_NOT_FOUND, "no job '%s' here", id);
  if (s != NB_OK) return s;
  if (!admin && strcmp(rec->owner, user)) {
    nb_job_record_clear(rec);
    return nb_error(NB_ERR_PERMISSION, "job '%s' belongs to user '%s', not to '%s'", id, rec->owner,
                    user);
  }
  return NB_OK;
}

/* Replaces {descriptor} {jobdir} {job} {cluster} {workers} in one template word. */
static void nb__subst(const char* in, char* out, size_t cap, const char* const* keys,
                      const char* const* vals, int nk) {
  size_t o = 0;
  while (*in && o + 1 < cap) {
    int hit = 0;
    for (int k = 0; k < nk; k++) {
      size_t kl = strlen(keys[k]);
      if (!strncmp(in, keys[k], kl)) {
        o += (size_t)snprintf(out + o, cap - o, "%s", vals[k]);
        if (o >= cap) o = cap - 1;
        in += kl;
        hit = 1;
        break;
      }
    }
    if (!hit) out[o++] = *in++;
  }
  out[o] = 0;
}

static nb_status_t nb__write_file(const char* path, const void* data, size_t len) {
  FILE* f = fopen(path, "wxe");
  if (!f) return nb_error(NB_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  size_t w = fwrite(data, 1, len, f);
  if (fclose(f) != 0 || w != len) return nb_error(NB_ERR_IO, "cannot write %s", path);
  return NB_OK;
}

/* Creates the job's folder with descriptor.json (the signed bytes), descriptor.sig (base64) and
 * signer.pem. */
static nb_status_t nb__jobdir_write(nb_gateway_t* gw, const char* id, const uint8_t* desc,
                                    size_t len, const uint8_t* sig, size_t sig_len,
                                    const char* cert_pem) {
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], path[sizeof dir + 32];
  nb__jobdir(gw, id, dir, sizeof dir);
  if (mkdir(dir, 0750) != 0)
    return nb_error(NB_ERR_IO, "cannot create job folder %s: %s", dir, strerror(errno));
  /* run_as: the job's user works in the folder (group-writable); sticky, so that it cannot
   * replace what the gateway writes there (logs, exit status, descriptor) */
  if (gw->run_as && (chown(dir, 0, gw->run_gid) != 0 || chmod(dir, 01770) != 0))
    return nb_error(NB_ERR_IO, "cannot prepare job folder %s for user '%s': %s", dir,
                    gw->cfg.run_as, strerror(errno));
  snprintf(path, sizeof path, "%s/descriptor.json", dir);
  NB_CHECK(nb__write_file(path, desc, len));
  char* b64 = NULL;
  if (nb_b64_encode(sig, sig_len, &b64) == NB_OK) {
    snprintf(path, sizeof path, "%s/descriptor.sig", dir);
    nb__write_file(path, b64, strlen(b64));
    nb_free(b64);
    snprintf(path, sizeof path, "%s/signer.pem", dir);
    nb__write_file(path, cert_pem, strlen(cert_pem));
  }
  return NB_OK;
}

/* What a cluster of a multi-cluster job adds to its command (worker_command). */
typedef struct {
  const char* listen;      /* our Exchange endpoint */
  const char* pki;         /* folder laid out as nebula certs does, for --pki */
  const char* secret_file; /* the job secret */
  int n_peers;
  char peers[NB_JOB_MAX_CLUSTERS][NB_GW_STR]; /* "ID=HOST:PORT" of every other cluster */
} nb__wk_args_t;

#define NB__MAX_WORDS (NB_GW_MAX_ARGS + 2 * NB_JOB_MAX_CLUSTERS + 8)

/* NB_JOB_ALLOW=<root>:<root>...: the job's processes check the descriptor's paths again against
 * their folder and these roots before opening anything (jobs/job_paths.h). */
static nb_status_t nb__allow_env(const nb_gateway_t* gw, char** out) {
  size_t cap = sizeof NB_JOB_PATHS_ENV + 2 + (size_t)gw->cfg.n_allow * (NB_GW_STR + 1);
  NB_CHECK(nb_calloc((void**)out, 1, cap, "job environment"));
  size_t o = (size_t)snprintf(*out, cap, "%s=", NB_JOB_PATHS_ENV);
  for (int i = 0; i < gw->cfg.n_allow; i++)
    o += (size_t)snprintf(*out + o, cap - o, "%s%s", i ? ":" : "", gw->cfg.allow[i]);
  return NB_OK;
}

/* Every path of a descriptor stays inside the job's folder (created afresh, so a relative path
 * without ".." does) or the config's paths.allow: refused otherwise, naming each JSON path. */
static nb_status_t nb__paths_check(const nb_gateway_t* gw, const nb_job_config_t* cfg,
                                   nb_descriptor_diag_t* diag) {
  const char* roots[NB_JOB_PATHS_MAX_ROOTS];
  for (int i = 0; i < gw->cfg.n_allow; i++) roots[i] = gw->cfg.allow[i];
  memset(diag, 0, sizeof *diag);
  if (nb_job_paths_check(cfg, NULL, roots, gw->cfg.n_allow, diag) == NB_OK) return NB_OK;
  char msg[2048] = "descriptor refused:";
  size_t o = strlen(msg);
  for (int i = 0; i < diag->count && o + 2 < sizeof msg; i++) {
    char line[640];
    o += (size_t)snprintf(msg + o, sizeof msg - o, "%s %s", i ? ";" : "",
                          nb_descriptor_error_format(&diag->errors[i], line, sizeof line));
    if (o >= sizeof msg) o = sizeof msg - 1;
  }
  return nb_error(NB_ERR_PERMISSION, "%s", msg);
}

/* Starts the job's command in its folder (written by nb__jobdir_write): `command`, or with wk
 * `worker_command`. On NB_OK the job is running and registered with the monitor, replacing its
 * reservation if it had one. */
static nb_status_t nb__launch(nb_gateway_t* gw, nb_job_store_t* st, const char* id, int workers,
                              const nb__wk_args_t* wk) {
  nb__active_t a;
  memset(&a, 0, sizeof a);
  snprintf(a.id, sizeof a.id, "%s", id);
  a.workers = workers;
  nb__jobdir(gw, id, a.dir, sizeof a.dir);
  char path[sizeof a.dir + 32], wk_s[16];
  snprintf(path, sizeof path, "%s/descriptor.json", a.dir);
  snprintf(wk_s, sizeof wk_s, "%d", workers);
  const char* keys[] = {"{descriptor}", "{jobdir}", "{job}", "{cluster}",    "{workers}",
                        "{nebula}",     "{listen}", "{pki}", "{secret_file}"};
  const char* vals[] = {path,
                        a.dir,
                        id,
                        gw->cfg.cluster_id,
                        wk_s,
                        gw->self_exe,
                        wk ? wk->listen : "",
                        wk ? wk->pki : "",
                        wk ? wk->secret_file : ""};
  char(*words)[NB_GW_STR * 2] = NULL;
  NB_CHECK(nb_calloc((void**)&words, NB__MAX_WORDS, sizeof *words, "command words"));
  char* argv[NB__MAX_WORDS + 1];
  char env0[128], env1[NB_GW_STR * 2], env2[NB_GW_STR * 2], env3[128], *env4 = NULL;
  snprintf(env0, sizeof env0, "NB_JOB_ID=%s", id);
  snprintf(env1, sizeof env1, "NB_JOB_DIR=%s", a.dir);
  snprintf(env2, sizeof env2, "NB_JOB_PROGRESS=%s/%s", a.dir, NB_LAUNCH_PROGRESS);
  snprintf(env3, sizeof env3, "NB_CLUSTER_ID=%s", gw->cfg.cluster_id);
  nb_status_t es = nb__allow_env(gw, &env4);
  if (es != NB_OK) {
    nb_free(words);
    return es;
  }
  char* env[] = {env0, env1, env2, env3, env4, NULL};
  int n_tmpl = wk ? gw->cfg.n_worker_command : gw->cfg.n_command;
  pthread_mutex_lock(&gw->mu);
  int n = 0;
  if (gw->run_as) { /* setpriv drops to the run_as user before the job's command */
    snprintf(words[n++], sizeof words[0], "setpriv");
    snprintf(words[n++], sizeof words[0], "--reuid=%u", (unsigned)gw->run_uid);
    snprintf(words[n++], sizeof words[0], "--regid=%u", (unsigned)gw->run_gid);
    snprintf(words[n++], sizeof words[0], "--clear-groups");
    snprintf(words[n++], sizeof words[0], "--no-new-privs");
    snprintf(words[n++], sizeof words[0], "--");
    for (int w = 0; w < n; w++) argv[w] = words[w];
  }
  int first = n;
  for (int i = 0; i < n_tmpl; i++) {
    const char* w = wk ? gw->cfg.worker_command[i] : gw->cfg.command[i];
    if (wk && !strcmp(w, "{peers}")) {
      for (int p = 0; p < wk->n_peers && n + 2 <= NB__MAX_WORDS; p++) {
        snprintf(words[n], sizeof words[n], "--peer");
        argv[n] = words[n];
        n++;
        snprintf(words[n], sizeof words[n], "%s", wk->peers[p]);
        argv[n] = words[n];
        n++;
      }
      continue;
    }
    if (n >= NB__MAX_WORDS) break;
    if (i == 0 && n == first && !strcmp(w, "nebula"))
      snprintf(words[n], sizeof words[n], "%s", gw->self_exe);
    else
      nb__subst(w, words[n], sizeof words[n], keys, vals, 9);
    argv[n] = words[n];
    n++;
  }
  argv[n] = NULL;
  /* the slot check again, under the lock: two submits may have raced past the first one */
  int used = 0, mine = -1;
  for (int i = 0; i < gw->n_active; i++) {
    if (!strcmp(gw->active[i].id, id)) {
      mine = i; /* our own reservation */
      continue;
    }
    used += gw->active[i].workers;
  }
  nb_status_t s;
  if (mine < 0 && gw->n_active >= NB__MAX_ACTIVE)
    s = nb_error(NB_ERR_UNAVAILABLE, "too many jobs running on this gateway");
  else if (used + workers > gw->cfg.slots)
    s = nb_error(NB_ERR_UNAVAILABLE, "cluster '%s' has %d free worker slots, the job needs %d",
                 gw->cfg.cluster_id, gw->cfg.slots - used, workers);
  else
    s = nb_launcher_launch(&gw->cfg.launcher, a.dir, argv, env, workers, &a.launch);
  if (s == NB_OK) {
    a.own_child = a.launch.pid > 0; /* a Slurm job is no child of ours */
    json_t* cmd = json_array();
    for (int i = 0; argv[i]; i++) json_array_append_new(cmd, json_string(argv[i]));
    json_t* j = json_pack("{s:s, s:i, s:o}", "dir", a.dir, "workers", workers, "command", cmd);
    nb_launcher_to_json(&a.launch, j); /* launcher, pid, start_ticks, slurm_id, dir */
    char* txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    /* running + launch event before the monitor may see the exit */
    s = nb_job_store_transition(st, id, NB_JOB_RUNNING, NULL);
    if (s == NB_OK) s = nb_job_store_append_event(st, id, "launch", txt ? txt : "{}", NULL);
    free(txt);
    /* a job the store does not know as running must not run: the monitor reaps it */
    if (s != NB_OK) nb_launcher_cancel(&a.launch, 0, NULL);
    if (mine >= 0)
      gw->active[mine] = a;
    else
      gw->active[gw->n_active++] = a;
  }
  pthread_mutex_unlock(&gw->mu);
  nb_free(words);
  nb_free(env4);
  return s;
}

/* Holds `workers` slots for a proposed job until it launches or is aborted (nb__unreserve).
 * NB_ERR_UNAVAILABLE when they are not free. */
static nb_status_t nb__reserve(nb_gateway_t* gw, const char* id, int workers) {
  pthread_mutex_lock(&gw->mu);
  int used = 0;
  for (int i = 0; i < gw->n_active; i++) used += gw->active[i].workers;
  nb_status_t s = NB_OK;
  if (gw->n_active >= NB__MAX_ACTIVE)
    s = nb_error(NB_ERR_UNAVAILABLE, "too many jobs running on this gateway");
  else if (used + workers > gw->cfg.slots)
    s = nb_error(NB_ERR_UNAVAILABLE,
                 "cluster '%s' has %d free worker slots of %d, the job needs %d",
                 gw->cfg.cluster_id, gw->cfg.slots - used, gw->cfg.slots, workers);
  if (s == NB_OK) {
    nb__active_t* a = &gw->active[gw->n_active++];
    memset(a, 0, sizeof *a);
    snprintf(a->id, sizeof a->id, "%s", id);
    nb__jobdir(gw, id, a->dir, sizeof a->dir);
    a->workers = workers;
  }
  pthread_mutex_unlock(&gw->mu);
  return s;
}

static void nb__unreserve(nb_gateway_t* gw, const char* id) {
  pthread_mutex_lock(&gw->mu);
  int k = nb__active_find(gw, id);
  if (k >= 0 && !nb__launched(&gw->active[k])) gw->active[k] = gw->active[--gw->n_active];
  pthread_mutex_unlock(&gw->mu);
}

/* ------------------------------------------------------------------ federation */

/* A cluster taking part in a job: workers > 0 runs a share of it; 0 only provides the base
 * checkpoint (model.base.cluster). */
typedef struct {
  char id[NB_JOB_NAME_MAX];
  int workers;
} nb__part_t;

static int nb__parts(const nb_job_config_t* cfg, nb__part_t* p) {
  int n = 0, base_in = 0;
  for (int i = 0; i < cfg->n_clusters; i++) {
    snprintf(p[n].id, sizeof p[n].id, "%s", cfg->clusters[i].id);
    p[n].workers = cfg->clusters[i].workers;
    if (!strcmp(cfg->clusters[i].id, cfg->model.base_cluster)) base_in = 1;
    n++;
  }
  if (cfg->model.base_cluster[0] && !base_in) {
    snprintf(p[n].id, sizeof p[n].id, "%s", cfg->model.base_cluster);
    p[n].workers = 0;
    n++;
  }
  return n;
}

static nb_rpc_client_t* nb__peer_client(nb_gateway_t* gw, const char* cluster) {
  for (int i = 0; i < gw->cfg.n_peers; i++)
    if (!strcmp(gw->cfg.peers[i].id, cluster)) return gw->peer_cli[i];
  return NULL;
}

/* One Federation call to peer `cluster`; a peer that cannot be reached fails fast
 * (NB_ERR_UNAVAILABLE). wait >= 1: after such a failure, give the channel up to a second to
 * connect and try once more; wait 2: a deadline of 30 x federation_timeout_ms (a Commit whose
 * peer first fetches the base checkpoint). */
static nb_status_t nb__fed_call(nb_gateway_t* gw, const char* cluster, const char* method,
                                const ProtobufCMessage* req, const ProtobufCMessageDescriptor* rd,
                                ProtobufCMessage** resp, int wait) {
  nb_rpc_client_t* c = nb__peer_client(gw, cluster);
  if (!c)
    return nb_error(NB_ERR_INVALID, "cluster '%s' is not a peer of gateway '%s'", cluster,
                    gw->cfg.cluster_id);
  char m[96];
  snprintf(m, sizeof m, "/nebula.v1.Federation/%s", method);
  *resp = NULL;
  int64_t deadline = (int64_t)gw->cfg.federation_timeout_ms * (wait == 2 ? 30 : 1);
  nb_status_t s = nb_rpc_unary_pb(c, m, req, rd, resp, deadline, 0);
  if (s == NB_ERR_UNAVAILABLE && wait && nb_rpc_client_wait_ready(c, 1000) == NB_OK) {
    /* the channel was idle or backing off from an earlier failure: once more, connected */
    if (*resp) protobuf_c_message_free_unpacked(*resp, NULL);
    *resp = NULL;
    s = nb_rpc_unary_pb(c, m, req, rd, resp, deadline, 0);
  }
  return s;
}

/* Federation calls come from the cluster certificate of a configured peer only. */
static nb_status_t nb__fed_caller(nb_rpc_call_t* call, nb_gateway_t* gw, const char** cluster) {
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind != NB_TLS_PEER_CLUSTER)
    return nb_error(NB_ERR_PERMISSION,
                    "the Federation API is for peer gateways (a cluster certificate), not '%s'",
                    p ? p->name : "?");
  if (!nb__peer_client(gw, p->name))
    return nb_error(NB_ERR_PERMISSION, "cluster '%s' is not a peer of gateway '%s'", p->name,
                    gw->cfg.cluster_id);
  *cluster = p->name;
  return NB_OK;
}

/* A free port on exchange_host, as "host:port" ("[host]:port" for IPv6). */
static nb_status_t nb__free_endpoint(const char* host, char* out, size_t cap) {
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host, "0", &hints, &ai);
  if (rc != 0 || !ai)
    return nb_error(NB_ERR_CONFIG, "exchange_host '%s': %s", host, gai_strerror(rc));
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int port = -1;
  if (fd >= 0 && bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr*)&ss, &sl) == 0)
      port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6*)&ss)->sin6_port)
                                      : ntohs(((struct sockaddr_in*)&ss)->sin_port);
  }
  int v6 = ai->ai_family == AF_INET6;
  if (fd >= 0) close(fd);
  freeaddrinfo(ai);
  if (port <= 0)
    return nb_error(NB_ERR_UNAVAILABLE, "no free port on exchange_host '%s': %s", host,
                    strerror(errno));
  snprintf(out, cap, v6 ? "[%s]:%d" : "%s:%d", host, port);
  return NB_OK;
}

/* Copies src to a new file dst (never through a link) owned by uid:gid, mode 0600. */
static int nb__copy_owned(const char* src, const char* dst, uid_t uid, gid_t gid) {
  int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return -1;
  int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  int rc = out < 0 ? -1 : 0;
  char buf[16384];
  ssize_t n;
  while (rc == 0 && (n = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, (size_t)n) != n) rc = -1;
  if (rc == 0 && fchown(out, uid, gid) != 0) rc = -1;
  if (out >= 0 && close(out) != 0) rc = -1;
  close(in);
  return rc;
}

/* The PKI folder the worker's --pki wants, as links to this gateway's own files (copies owned
 * by the run_as user when jobs run as another user). */
static nb_status_t nb__job_pki(nb_gateway_t* gw, const char* dir, char* pki, size_t cap) {
  snprintf(pki, cap, "%s/pki", dir);
  char p[NB_GW_STR * 2 + 64], real[PATH_MAX];
  snprintf(p, sizeof p, "%s/clusters", pki);
  if ((mkdir(pki, 0700) != 0 && errno != EEXIST) || (mkdir(p, 0700) != 0 && errno != EEXIST))
    return nb_error(NB_ERR_IO, "cannot create %s: %s", p, strerror(errno));
  const char* src[3] = {gw->cfg.tls_ca, gw->cfg.tls_cert, gw->cfg.tls_key};
  const char* ext[3] = {"ca.crt", "crt", "key"};
  for (int i = 0; i < 3; i++) {
    if (i == 0)
      snprintf(p, sizeof p, "%s/ca.crt", pki);
    else
      snprintf(p, sizeof p, "%s/clusters/%s.%s", pki, gw->cfg.cluster_id, ext[i]);
    unlink(p);
    if (gw->run_as) {
      /* the job's user cannot read the gateway's files: a copy it owns (the cluster's key too,
       * which its workers present) */
      if (nb__copy_owned(src[i], p, gw->run_uid, gw->run_gid) != 0)
        return nb_error(NB_ERR_IO, "cannot copy %s to %s: %s", src[i], p, strerror(errno));
      continue;
    }
    if (!realpath(src[i], real) || symlink(real, p) != 0)
      return nb_error(NB_ERR_IO, "cannot link %s to %s: %s", p, src[i], strerror(errno));
  }
  snprintf(p, sizeof p, "%s/clusters", pki);
  nb__give(gw, p);
  nb__give(gw, pki);
  return NB_OK;
}

/* Parses the stored descriptor of job id into *cfg (allocated; nb_free it). */
static nb_status_t nb__job_config(nb_job_store_t* st, const char* id, nb_job_config_t** cfg) {
  nb_job_record_t rec = {0};
  nb_descriptor_diag_t* diag = NULL;
  *cfg = NULL;
  NB_CHECK(nb_job_store_get(st, id, &rec));
  nb_status_t s = nb_calloc((void**)cfg, 1, sizeof **cfg, "job config");
  if (s == NB_OK) s = nb_calloc((void**)&diag, 1, sizeof *diag, "diagnostics");
  if (s == NB_OK &&
      nb_descriptor_parse(rec.descriptor, strlen(rec.descriptor), *cfg, diag) != NB_OK)
    s = nb_error(NB_ERR_INVALID, "job %s: its stored descriptor does not parse", id);
  nb_free(diag);
  nb_job_record_clear(&rec);
  if (s != NB_OK) {
    nb_free(*cfg);
    *cfg = NULL;
  }
  return s;
}

/* The artifact service asks whether `peer` takes part in job_id (one of the clusters its
 * descriptor names, or the one holding its base checkpoint) and for the job's secret, owner and
 * base checkpoint, from which it decides what the job is entitled to (gateway/artifact.h). */
static nb_status_t nb__artifact_job(void* user, const char* job_id, const char* peer,
                                    nb_artifact_job_t* out) {
  nb_gateway_t* gw = user;
  nb_job_store_t* st = NULL;
  nb_job_config_t* cfg = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  int loaded = 0;
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) {
    s = nb__fed_load(st, job_id, &fed, &info);
    loaded = s == NB_OK;
    if (s == NB_ERR_NOT_FOUND) s = nb_error(NB_ERR_NOT_FOUND, "no federated job '%s' here", job_id);
  }
  if (s == NB_OK && !fed.has_secret)
    s = nb_error(NB_ERR_NOT_FOUND, "job '%s' is not committed here", job_id);
  if (s == NB_OK) s = nb__job_config(st, job_id, &cfg);
  if (s == NB_OK) {
    nb__part_t parts[NB__MAX_PARTS];
    int np = nb__parts(cfg, parts), in = 0;
    for (int i = 0; i < np; i++) in |= !strcmp(parts[i].id, peer);
    in |= !strcmp(fed.origin, peer); /* the origin fetches the job's outputs for its report */
    if (!in)
      s = nb_error(NB_ERR_PERMISSION, "cluster '%s' takes no part in job '%s'", peer, job_id);
  }
  nb_job_record_t rec = {0};
  if (s == NB_OK) s = nb_job_store_get(st, job_id, &rec);
  if (s == NB_OK) {
    memcpy(out->secret, fed.secret, 32);
    snprintf(out->owner, sizeof out->owner, "%.63s", rec.owner);
    snprintf(out->base, sizeof out->base, "%.255s", cfg->model.base_checkpoint);
    snprintf(out->base_sha256, sizeof out->base_sha256, "%s", cfg->model.base_sha256);
  }
  nb_job_record_clear(&rec);
  if (loaded) nb__fed_release(&fed, info);
  nb_free(cfg);
  nb_job_store_close(st);
  return s;
}

static int nb__mkdirs(const char* path) {
  char tmp[NB_GW_STR * 2 + 512];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
  for (char* p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0750) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(tmp, 0750) != 0 && errno != EEXIST ? -1 : 0;
}

/* A job whose model.base names another cluster: fetch that checkpoint from that cluster's
 * gateway into the job folder at the descriptor's relative path (by content hash when the
 * descriptor pins one), before anything runs. */
static nb_status_t nb__fetch_base(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                  const uint8_t secret[32]) {
  nb_job_config_t* cfg = NULL;
  NB_CHECK(nb__job_config(st, id, &cfg));
  nb_status_t s = NB_OK;
  const nb_job_model_t* mo = &cfg->model;
  const char* target = NULL;
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], dest[sizeof dir + NB_JOB_PATH_MAX + 2],
      parent[sizeof dest], name[NB_JOB_SHA256_HEX + 8];
  if (!mo->base_checkpoint[0] || !mo->base_cluster[0] ||
      !strcmp(mo->base_cluster, gw->cfg.cluster_id))
    goto out;
  if (nb_artifact_name_check(mo->base_checkpoint) != NB_OK) {
    s = nb_error_wrap(NB_ERR_INVALID, "model.base.checkpoint '%s' cannot be fetched",
                      mo->base_checkpoint);
    goto out;
  }
  for (int i = 0; i < gw->cfg.n_peers; i++)
    if (!strcmp(gw->cfg.peers[i].id, mo->base_cluster)) target = gw->cfg.peers[i].address;
  if (!target) {
    s = nb_error(NB_ERR_INVALID, "model.base.cluster '%s' is not a peer of gateway '%s'",
                 mo->base_cluster, gw->cfg.cluster_id);
    goto out;
  }
  nb__jobdir(gw, id, dir, sizeof dir);
  snprintf(dest, sizeof dest, "%s/%s", dir, mo->base_checkpoint);
  snprintf(parent, sizeof parent, "%s", dest);
  *strrchr(parent, '/') = 0;
  if (nb__mkdirs(parent) != 0) {
    s = nb_error(NB_ERR_IO, "cannot create %s: %s", parent, strerror(errno));
    goto out;
  }
  if (mo->base_sha256[0]) snprintf(name, sizeof name, "sha256:%s", mo->base_sha256);
  nb_artifact_fetch_opts_t o;
  memset(&o, 0, sizeof o);
  o.target = target;
  o.tls = gw->tls;
  o.expected_cluster = mo->base_cluster;
  o.job_id = id;
  o.secret = secret;
  o.name = mo->base_sha256[0] ? name : mo->base_checkpoint;
  o.dest = dest;
  o.timeout_ms = (int64_t)gw->cfg.federation_timeout_ms * 30;
  nb_artifact_info_t info;
  double t0 = nb_now_s();
  s = nb_artifact_fetch(&o, &info);
  if (s != NB_OK) {
    s = nb_error_wrap(s, "fetching the base checkpoint %s from cluster '%s'", o.name,
                      mo->base_cluster);
    goto out;
  }
  if (gw->run_as) /* the fetched file and the folders made for it, up to the job's folder */
    for (char* q = dest; strlen(q) > strlen(dir);) {
      nb__give(gw, q);
      char* sl = strrchr(q, '/');
      if (!sl) break;
      *sl = 0;
    }
  json_t* j =
      json_pack("{s:s, s:s, s:s, s:I, s:f}", "name", o.name, "from", mo->base_cluster, "sha256",
                info.sha256, "size", (json_int_t)info.size, "seconds", nb_now_s() - t0);
  char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (txt) nb_job_store_append_event(st, id, "fetch", txt, NULL);
  free(txt);
  json_decref(j);
  NB_INFO(JOB, "job %s: base checkpoint %s fetched from %s (%llu bytes)", id, o.name,
          mo->base_cluster, (unsigned long long)info.size);
out:
  nb_free(cfg);
  return s;
}

/* ------------------------------------------------------------------ the run report */

/* Queues the run report of a job that just succeeded here as its origin (or as a job of this
 * cluster only); the report thread builds it (nb__report_loop), off gw->mu. */
static void nb__report_queue(nb_gateway_t* gw, const char* id) {
  pthread_mutex_lock(&gw->mu);
  for (int k = 0; k < gw->n_report; k++)
    if (!strcmp(gw->report[k].id, id)) {
      pthread_mutex_unlock(&gw->mu);
      return; /* already queued */
    }
  if (gw->n_report < NB__MAX_REPORTS) {
    nb__report_t* r = &gw->report[gw->n_report++];
    snprintf(r->id, sizeof r->id, "%s", id);
    double wait = 2e-3 * gw->cfg.federation_timeout_ms;
    r->started = nb_now_s();
    r->deadline = r->started + (wait < 10 ? 10 : wait);
  } else {
    NB_WARN("job %s: too many run reports pending: none is written for it", id);
  }
  pthread_mutex_unlock(&gw->mu);
}

static void nb__report_event(nb_job_store_t* st, const char* id, const char* kind, json_t* j) {
  char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (txt) nb_job_store_append_event(st, id, kind, txt, NULL);
  free(txt);
  json_decref(j);
}

/* Copies file src to dst (dst's folder exists); 0 or -1 (errno). */
static int nb__copy_file(const nb_gateway_t* gw, const char* src, const char* dst) {
  int ifd = nb__open_job_file(gw, src);
  FILE* in = ifd >= 0 ? fdopen(ifd, "rbe") : NULL;
  if (!in) {
    if (ifd >= 0) close(ifd);
    return -1;
  }
  FILE* out = fopen(dst, "wbe");
  if (!out) {
    fclose(in);
    return -1;
  }
  char buf[65536];
  size_t n;
  int rc = 0;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, n, out) != n) rc = -1;
  if (ferror(in)) rc = -1;
  fclose(in);
  if (fclose(out) != 0) rc = -1;
  return rc;
}

/* The content hash of artifact `name` ("<job name>/<file>") that cluster reported publishing
 * (its last "cluster_artifact" event among the job's events ev); 0 when none arrived yet. */
static int nb__report_hash(const nb_job_event_t* ev, size_t n, const char* cluster,
                           const char* name, char hash[NB_ARTIFACT_HASH_HEX]) {
  int found = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(ev[i].kind, "cluster_artifact")) continue;
    json_t* j = json_loads(ev[i].payload, 0, NULL);
    const char* h = nb__jstr(j, "sha256");
    if (!strcmp(nb__jstr(j, "cluster"), cluster) && !strcmp(nb__jstr(j, "name"), name) &&
        strlen(h) == NB_ARTIFACT_HASH_HEX - 1) {
      snprintf(hash, NB_ARTIFACT_HASH_HEX, "%s", h);
      found = 1;
    }
    json_decref(j);
  }
  return found;
}

/* One try at the run report of job id: every cluster with workers gets report/<cluster>/ with
 * its rounds.tsv and summary.json (this cluster's copied from the job's output folder, the
 * others' fetched from their gateways as artifacts), then nb_report_write. Returns 1 when done
 * (written, or failed for good: a warning and a "report_failed" event), 0 to try again later.
 * `last`: the final try (the peers' files had their time to arrive). */
static int nb__report_try(nb_gateway_t* gw, nb_job_store_t* st, const nb__report_t* r, int last) {
  const char* id = r->id;
  nb_job_config_t* cfg = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  int loaded = 0, done = 1, n = 0;
  nb_job_event_t* ev = NULL;
  size_t nev = 0;
  char err[768] = "";
  const char* ids[NB_JOB_MAX_CLUSTERS];
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], rdir[sizeof dir + 16], cdir[sizeof rdir + 80],
      src[sizeof dir + 64], dst[sizeof cdir + 32];
  nb__jobdir(gw, id, dir, sizeof dir);
  snprintf(rdir, sizeof rdir, "%s/report", dir);
  if (nb__job_config(st, id, &cfg) != NB_OK) {
    snprintf(err, sizeof err, "%s", nb_error_last());
    last = 1;
    goto out;
  }
  if (gw->run_as) {
    /* the job's user owns the job's folder: the gateway writes report/ only as a folder of its
     * own (made now, the job's processes being gone), never through something the job left */
    struct stat rs;
    if (lstat(rdir, &rs) != 0 && errno == ENOENT && mkdir(rdir, 0755) != 0) {
      snprintf(err, sizeof err, "cannot create %s: %s", rdir, strerror(errno));
      last = 1;
      goto out;
    }
    if (lstat(rdir, &rs) != 0 || !S_ISDIR(rs.st_mode) || rs.st_uid != geteuid()) {
      snprintf(err, sizeof err, "%s was not made by the gateway (the job left it): no report",
               rdir);
      last = 1;
      goto out;
    }
  }
  loaded = nb__fed_load(st, id, &fed, &info) == NB_OK;
  if (loaded && nb_job_store_events(st, id, 0, 0, &ev, &nev) != NB_OK) {
    ev = NULL;
    nev = 0;
  }
  static const char* const files[2] = {"rounds.tsv", "summary.json"};
  for (int i = 0; i < cfg->n_clusters && !err[0]; i++) {
    const char* c = cfg->clusters[i].id;
    if (cfg->clusters[i].workers <= 0) continue;
    ids[n++] = c;
    snprintf(cdir, sizeof cdir, "%s/%s", rdir, c);
    if (nb__mkdirs(cdir) != 0) {
      snprintf(err, sizeof err, "cannot create %s: %s", cdir, strerror(errno));
      break;
    }
    if (!strcmp(c, gw->cfg.cluster_id)) {
      /* ours: `worker_command` writes to <jobdir>/out, `command` (nebula train) to <jobdir> */
      snprintf(src, sizeof src, "%s/out/rounds.tsv", dir);
      const char* base = access(src, R_OK) == 0 ? "/out" : "";
      for (int f = 0; f < 2 && !err[0]; f++) {
        snprintf(src, sizeof src, "%s%s/%s", dir, base, files[f]);
        snprintf(dst, sizeof dst, "%s/%s", cdir, files[f]);
        if (nb__copy_file(gw, src, dst) != 0) {
          snprintf(err, sizeof err, "cannot copy %s: %s", src, strerror(errno));
          last = 1; /* our worker is gone: nothing more will come */
        }
      }
      continue;
    }
    const char* target = NULL;
    for (int p = 0; p < gw->cfg.n_peers; p++)
      if (!strcmp(gw->cfg.peers[p].id, c)) target = gw->cfg.peers[p].address;
    if (!target || !loaded || !fed.has_secret) {
      snprintf(err, sizeof err, "cluster '%s': %s", c,
               !target ? "not a peer of this gateway" : "no job secret here to fetch its files");
      last = 1;
      break;
    }
    for (int f = 0; f < 2 && !err[0]; f++) {
      char name[NB_ARTIFACT_NAME_MAX], hash[NB_ARTIFACT_HASH_HEX],
          by_hash[NB_ARTIFACT_HASH_HEX + 8];
      snprintf(dst, sizeof dst, "%s/%s", cdir, files[f]);
      snprintf(name, sizeof name, "%s/%s", cfg->name, files[f]);
      /* by the hash the cluster reported publishing; by name once the report is overdue */
      int have = nb__report_hash(ev, nev, c, name, hash);
      if (!have && nb_now_s() < r->started + (r->deadline - r->started) / 2) {
        done = 0;
        continue;
      }
      if (have) snprintf(by_hash, sizeof by_hash, "sha256:%s", hash);
      nb_artifact_fetch_opts_t o;
      memset(&o, 0, sizeof o);
      o.target = target;
      o.tls = gw->tls;
      o.expected_cluster = c;
      o.job_id = id;
      o.secret = fed.secret;
      o.name = have ? by_hash : name;
      o.dest = dst;
      o.timeout_ms = gw->cfg.federation_timeout_ms < 5000 ? gw->cfg.federation_timeout_ms : 5000;
      if (nb_artifact_fetch(&o, NULL) == NB_OK) continue;
      if (last)
        snprintf(err, sizeof err, "fetching %s from cluster '%s': %s", name, c, nb_error_last());
      else
        done = 0;
    }
  }
  if (err[0] || !done) goto out;
  nb_status_t s = nb_report_write(rdir, ids, n, cfg->name);
  if (s != NB_OK) {
    snprintf(err, sizeof err, "%s", nb_error_last());
    last = 1;
    goto out;
  }
  json_t* cl = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(cl, json_string(ids[i]));
  snprintf(src, sizeof src, "%s/report.html", rdir);
  snprintf(dst, sizeof dst, "%s/summary.json", rdir);
  nb__report_event(st, id, "report",
                   json_pack("{s:s, s:s, s:o}", "path", src, "summary", dst, "clusters", cl));
  NB_INFO(JOB, "job %s: run report %s", id, src);
out:
  if (err[0] && !last) done = 0; /* a peer may still be publishing: try again */
  if (err[0] && last) {
    NB_WARN("job %s: no run report: %s", id, err);
    nb__report_event(st, id, "report_failed", json_pack("{s:s}", "reason", err));
    done = 1;
  }
  if (loaded) nb__fed_release(&fed, info);
  nb_job_events_free(ev, nev);
  nb_free(cfg);
  return done;
}

/* Whether the run report of job id is queued and not yet written or given up. */
static int nb__report_pending(nb_gateway_t* gw, const char* id) {
  pthread_mutex_lock(&gw->mu);
  int found = 0;
  for (int k = 0; k < gw->n_report; k++) found |= !strcmp(gw->report[k].id, id);
  pthread_mutex_unlock(&gw->mu);
  return found;
}

/* One try at each pending report that is due, off gw->mu. */
static void nb__report_step(nb_gateway_t* gw, nb_job_store_t* st) {
  nb__report_t todo[NB__MAX_REPORTS];
  pthread_mutex_lock(&gw->mu);
  int n = gw->n_report;
  memcpy(todo, gw->report, sizeof todo);
  pthread_mutex_unlock(&gw->mu);
  for (int i = 0; i < n && !gw->stopping; i++) {
    double now = nb_now_s();
    if (now < todo[i].next) continue;
    if (!nb__report_try(gw, st, &todo[i], now >= todo[i].deadline)) {
      todo[i].next = nb_now_s() + 0.2;
      pthread_mutex_lock(&gw->mu);
      for (int k = 0; k < gw->n_report; k++)
        if (!strcmp(gw->report[k].id, todo[i].id)) gw->report[k].next = todo[i].next;
      pthread_mutex_unlock(&gw->mu);
      continue;
    }
    pthread_mutex_lock(&gw->mu);
    for (int k = 0; k < gw->n_report; k++)
      if (!strcmp(gw->report[k].id, todo[i].id)) {
        gw->report[k] = gw->report[--gw->n_report];
        break;
      }
    pthread_mutex_unlock(&gw->mu);
  }
}

/* The report thread: fetching a peer's files may wait on the network, so it runs apart from
 * the monitor (which follows the jobs) and the federation thread. */
static void* nb__report_loop(void* arg) {
  nb_gateway_t* gw = arg;
  while (!gw->stopping) {
    nb__report_step(gw, gw->rep_store);
    nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  return NULL;
}

/* Launches this cluster's share of a committed federated job: the job secret in a 0600 file,
 * the PKI links, and worker_command with every other cluster's endpoint (or `command` when the
 * job has a single cluster with workers). A cluster without workers has nothing to run: its
 * part is done at once. */
static nb_status_t nb__fed_start(nb_gateway_t* gw, nb_job_store_t* st, const char* id, int workers,
                                 const uint8_t secret[32], json_t* endpoints) {
  if (workers <= 0) {
    NB_CHECK(nb_job_store_transition(st, id, NB_JOB_RUNNING, NULL));
    return nb_job_store_transition(
        st, id, NB_JOB_SUCCEEDED,
        "no workers on this cluster: it takes part to provide the job's base checkpoint");
  }
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], secret_file[sizeof dir + 16], pki[sizeof dir + 8];
  nb__jobdir(gw, id, dir, sizeof dir);
  snprintf(secret_file, sizeof secret_file, "%s/job.secret", dir);
  int fd = open(secret_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, secret, 32) != 32 || close(fd) != 0)
    return nb_error(NB_ERR_IO, "cannot write %s: %s", secret_file, strerror(errno));
  nb__give(gw, secret_file);
  NB_CHECK(nb__job_pki(gw, dir, pki, sizeof pki));
  nb__wk_args_t wk;
  memset(&wk, 0, sizeof wk);
  wk.pki = pki;
  wk.secret_file = secret_file;
  wk.listen = json_string_value(json_object_get(endpoints, gw->cfg.cluster_id));
  const char* k;
  json_t* v;
  int clusters = 0;
  json_object_foreach(endpoints, k, v) {
    const char* addr = json_string_value(v);
    if (!addr || !*addr) continue;
    clusters++;
    if (!strcmp(k, gw->cfg.cluster_id) || wk.n_peers >= NB_JOB_MAX_CLUSTERS) continue;
    snprintf(wk.peers[wk.n_peers++], NB_GW_STR, "%s=%s", k, addr);
  }
  if (!wk.listen)
    return nb_error(NB_ERR_INVALID, "no Exchange endpoint for cluster '%s'", gw->cfg.cluster_id);
  NB_CHECK(nb__fetch_base(gw, st, id, secret));
  return nb__launch(gw, st, id, workers, clusters > 1 ? &wk : NULL);
}

/* Maps a failed peer call to what Submit answers: refusals keep their code; a peer that cannot
 * be reached or timed out is UNAVAILABLE. */
static nb_status_t nb__fed_code(nb_status_t s) {
  switch (s) {
    case NB_ERR_PERMISSION:
    case NB_ERR_INVALID:
    case NB_ERR_UNAVAILABLE:
    case NB_ERR_NOT_FOUND:
    case NB_ERR_UNSUPPORTED:
      return s;
    default:
      return NB_ERR_UNAVAILABLE;
  }
}

/* Origin side of Submit for a job involving other clusters: Propose to each, then Commit to each
 * and launch here, or Abort everywhere. The job (proposed) is in the store; on failure it ends
 * failed and the returned error names the cluster and its reason. */
static nb_status_t nb__fed_submit(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                  const Nebula__V1__SubmitRequest* req, const nb__part_t* parts,
                                  int np, int mine, const char* base_cluster) {
  nb_job_fed_t fed;
  memset(&fed, 0, sizeof fed);
  snprintf(fed.job_id, sizeof fed.job_id, "%s", id);
  snprintf(fed.role, sizeof fed.role, "origin");
  snprintf(fed.origin, sizeof fed.origin, "%s", gw->cfg.cluster_id);
  fed.active = 1;
  json_t* info = json_object();
  json_t* endpoints = json_object();
  int my_workers = mine >= 0 ? parts[mine].workers : 0;
  int accepted[NB__MAX_PARTS] = {0}, committed[NB__MAX_PARTS] = {0}, reserved = 0;
  char why[2048] = "";
  nb_status_t s = NB_OK, code = NB_OK;
  for (int i = 0; i < np; i++)
    json_object_set_new(nb__fed_cluster(info, parts[i].id), "workers",
                        json_integer(parts[i].workers));
  s = nb__jobdir_write(gw, id, req->descriptor.data, req->descriptor.len, req->signature.data,
                       req->signature.len, req->cert_pem);
  if (s == NB_OK && my_workers > 0) {
    s = nb__reserve(gw, id, my_workers);
    reserved = s == NB_OK;
    char ep[NB_GW_STR + 16];
    if (s == NB_OK) s = nb__free_endpoint(gw->cfg.exchange_host, ep, sizeof ep);
    if (s == NB_OK) {
      json_object_set_new(nb__fed_cluster(info, gw->cfg.cluster_id), "endpoint", json_string(ep));
      json_object_set_new(endpoints, gw->cfg.cluster_id, json_string(ep));
    }
  }
  if (s == NB_OK) s = nb__fed_save(st, &fed, info);
  if (s != NB_OK) {
    code = s;
    snprintf(why, sizeof why, "cluster '%s' (this gateway) cannot run the job: %.900s",
             gw->cfg.cluster_id, nb_error_last());
  }
  /* phase 1: every other cluster validates and reserves */
  for (int i = 0; i < np && !why[0]; i++) {
    if (i == mine) continue;
    Nebula__V1__ProposeRequest pr = NEBULA__V1__PROPOSE_REQUEST__INIT;
    pr.job_id = (char*)id;
    pr.descriptor = req->descriptor;
    pr.signature = req->signature;
    pr.cert_pem = req->cert_pem;
    pr.origin = gw->cfg.cluster_id;
    pr.workers = parts[i].workers;
    ProtobufCMessage* resp = NULL;
    s = nb__fed_call(gw, parts[i].id, "Propose", &pr.base, &nebula__v1__propose_reply__descriptor,
                     &resp, 1);
    if (s != NB_OK) {
      code = nb__fed_code(s);
      snprintf(why, sizeof why, "cluster '%.63s' refused the job: %.900s", parts[i].id,
               nb_error_last());
      break;
    }
    accepted[i] = 1;
    const char* ep = ((Nebula__V1__ProposeReply*)resp)->endpoint;
    if (parts[i].workers > 0 && (!ep || !*ep)) {
      code = NB_ERR_INTERNAL;
      snprintf(why, sizeof why, "cluster '%.63s' accepted the job without an Exchange endpoint",
               parts[i].id);
    } else if (parts[i].workers > 0) {
      json_object_set_new(nb__fed_cluster(info, parts[i].id), "endpoint", json_string(ep));
      json_object_set_new(endpoints, parts[i].id, json_string(ep));
    }
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  /* phase 2: the secret and every endpoint to each, then launch here */
  if (!why[0]) {
    s = nb_seal_secret_generate(fed.secret);
    fed.has_secret = s == NB_OK;
    json_object_set(info, "endpoints", endpoints);
    if (s == NB_OK) s = nb__fed_save(st, &fed, info);
    if (s != NB_OK) {
      code = s;
      snprintf(why, sizeof why, "cannot keep the job's secret: %.900s", nb_error_last());
    }
  }
  Nebula__V1__Endpoint eps[NB__MAX_PARTS];
  Nebula__V1__Endpoint* epp[NB__MAX_PARTS];
  size_t n_eps = 0;
  {
    const char* k;
    json_t* v;
    json_object_foreach(endpoints, k, v) {
      nebula__v1__endpoint__init(&eps[n_eps]);
      eps[n_eps].cluster = (char*)k;
      eps[n_eps].address = (char*)json_string_value(v);
      epp[n_eps] = &eps[n_eps];
      n_eps++;
    }
  }
  for (int i = 0; i < np && !why[0]; i++) {
    if (i == mine) continue;
    Nebula__V1__CommitRequest cr = NEBULA__V1__COMMIT_REQUEST__INIT;
    cr.job_id = (char*)id;
    cr.secret.data = fed.secret;
    cr.secret.len = sizeof fed.secret;
    cr.n_endpoints = n_eps;
    cr.endpoints = epp;
    ProtobufCMessage* resp = NULL;
    int fetches = base_cluster && base_cluster[0] && strcmp(base_cluster, parts[i].id) &&
                  parts[i].workers > 0;
    s = nb__fed_call(gw, parts[i].id, "Commit", &cr.base, &nebula__v1__federation_ack__descriptor,
                     &resp, fetches ? 2 : 1);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    if (s != NB_OK) {
      code = nb__fed_code(s);
      snprintf(why, sizeof why, "cluster '%.63s' could not start the job: %.900s", parts[i].id,
               nb_error_last());
      break;
    }
    committed[i] = 1;
    json_object_set_new(nb__fed_cluster(info, parts[i].id), "state", json_string("committed"));
  }
  if (!why[0]) {
    s = my_workers > 0 ? nb__fed_start(gw, st, id, my_workers, fed.secret, endpoints)
                       : nb_job_store_transition(st, id, NB_JOB_RUNNING, NULL);
    if (s != NB_OK) {
      code = s;
      snprintf(why, sizeof why, "cluster '%s' (this gateway) could not start the job: %.900s",
               gw->cfg.cluster_id, nb_error_last());
    } else if (mine >= 0) {
      json_object_set_new(nb__fed_cluster(info, gw->cfg.cluster_id), "state",
                          json_string(my_workers > 0 ? "running" : "none"));
    }
  }
  if (why[0]) {
    /* abort everywhere: the committed ones are cancelled, the others aborted */
    for (int i = 0; i < np; i++) {
      if (!accepted[i]) continue;
      ProtobufCMessage* resp = NULL;
      if (committed[i]) {
        Nebula__V1__FederationCancelRequest c = NEBULA__V1__FEDERATION_CANCEL_REQUEST__INIT;
        c.job_id = (char*)id;
        c.reason = why;
        nb__fed_call(gw, parts[i].id, "Cancel", &c.base, &nebula__v1__federation_ack__descriptor,
                     &resp, 1);
      } else {
        Nebula__V1__AbortRequest a = NEBULA__V1__ABORT_REQUEST__INIT;
        a.job_id = (char*)id;
        a.reason = why;
        nb__fed_call(gw, parts[i].id, "Abort", &a.base, &nebula__v1__federation_ack__descriptor,
                     &resp, 1);
      }
      if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    }
    if (reserved) nb__unreserve(gw, id);
    nb_job_store_transition(st, id, NB_JOB_FAILED, why);
    fed.active = 0;
    nb__fed_save(st, &fed, info);
    NB_WARN("job %s: %s", id, why);
    s = nb_error(code == NB_OK ? NB_ERR_INTERNAL : code, "%s", why);
  } else {
    pthread_mutex_lock(&gw->mu);
    /* reports may already have come in: merge our view into the stored one */
    nb_job_fed_t cur;
    json_t* now = NULL;
    if (nb__fed_load(st, id, &cur, &now) == NB_OK) {
      const char* k;
      json_t* c;
      json_object_foreach(json_object_get(info, "clusters"), k, c) {
        json_t* stored = nb__fed_cluster(now, k);
        if (!strcmp(nb__jstr(stored, "state"), "proposed"))
          json_object_set(stored, "state", json_object_get(c, "state"));
      }
      nb__fed_save(st, &fed, now);
      nb__fed_release(&cur, now);
    }
    pthread_mutex_unlock(&gw->mu);
    NB_INFO(JOB, "job %s: committed on %d clusters", id, np);
  }
  json_decref(endpoints);
  json_decref(info);
  explicit_bzero(fed.secret, sizeof fed.secret);
  return s;
}

/* Stops a job's processes here (or, without any, moves it to cancelled at once) and waits until
 * the monitor recorded the end. */
static nb_status_t nb__cancel_local(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                    const char* reason) {
  nb_status_t s = NB_OK;
  pthread_mutex_lock(&gw->mu);
  int k = nb__active_find(gw, id);
  int launched = k >= 0 && nb__launched(&gw->active[k]);
  nb_launch_t launch;
  if (launched) launch = gw->active[k].launch;
  if (k >= 0)
    snprintf(gw->active[k].cancel_reason, sizeof gw->active[k].cancel_reason, "%s", reason);
  if (k >= 0 && !launched) gw->active[k] = gw->active[--gw->n_active]; /* a reservation */
  pthread_mutex_unlock(&gw->mu);
  if (launched) {
    int killed = 0;
    char what[64];
    s = nb_launcher_cancel(&launch, gw->cfg.cancel_grace_ms, &killed);
    NB_INFO(JOB, "job %s: %s stopped%s", id, nb_launcher_describe(&launch, what, sizeof what),
            killed ? " with SIGKILL" : "");
    int64_t until = nb_now_ns() + 5000000000LL + (int64_t)gw->cfg.poll_ms * 4000000;
    for (;;) {
      pthread_mutex_lock(&gw->mu);
      k = nb__active_find(gw, id);
      pthread_mutex_unlock(&gw->mu);
      if (k < 0 || s != NB_OK) break;
      if (nb_now_ns() > until) {
        s = nb_error(NB_ERR_TIMEOUT,
                     "job %s: its processes are gone but the end was not recorded in time", id);
        break;
      }
      nb_sleep_ns(5000000);
    }
  } else {
    s = nb_job_store_transition(st, id, NB_JOB_CANCELLED, reason);
    if (s == NB_ERR_INVALID) s = NB_OK; /* it reached a final state meanwhile */
  }
  return s;
}

/* Origin: Federation.Cancel to every other cluster with workers whose part has not ended.
 * Returns the first failure (the others are still tried). */
static nb_status_t nb__fed_cancel_peers(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                        const char* reason) {
  nb_job_fed_t fed;
  json_t* info = NULL;
  pthread_mutex_lock(&gw->mu);
  nb_status_t s = nb__fed_load(st, id, &fed, &info);
  pthread_mutex_unlock(&gw->mu);
  if (s != NB_OK) return NB_OK; /* not federated */
  if (strcmp(fed.role, "origin")) {
    nb__fed_release(&fed, info);
    return NB_OK;
  }
  nb_status_t first = NB_OK;
  char err[768] = "";
  const char* k;
  json_t* c;
  json_object_foreach(json_object_get(info, "clusters"), k, c) {
    if (!strcmp(k, gw->cfg.cluster_id) || json_integer_value(json_object_get(c, "workers")) <= 0)
      continue;
    nb_job_state_t cs;
    if (nb_job_state_parse(nb__jstr(c, "state"), &cs) == NB_OK && nb_job_state_is_final(cs))
      continue;
    Nebula__V1__FederationCancelRequest cr = NEBULA__V1__FEDERATION_CANCEL_REQUEST__INIT;
    cr.job_id = (char*)id;
    cr.reason = (char*)reason;
    ProtobufCMessage* resp = NULL;
    s = nb__fed_call(gw, k, "Cancel", &cr.base, &nebula__v1__federation_ack__descriptor, &resp, 0);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    if (s != NB_OK && first == NB_OK) {
      first = s;
      snprintf(err, sizeof err, "cluster '%s': %.700s", k, nb_error_last());
    }
  }
  nb__fed_release(&fed, info);
  if (first != NB_OK) return nb_error(first, "%s", err);
  return NB_OK;
}

/* Reads a request of a Federation method from a configured peer. */
static nb_status_t nb__fed_request(nb_rpc_call_t* call, nb_gateway_t* gw,
                                   const ProtobufCMessageDescriptor* desc, const char* method,
                                   const char** caller, ProtobufCMessage** m) {
  NB_CHECK(nb__fed_caller(call, gw, caller));
  int end = 0;
  *m = NULL;
  NB_CHECK(nb_rpc_call_recv_pb(call, desc, m, &end, NB_RPC_INFINITE));
  if (!*m) return nb_error(NB_ERR_INVALID, "%s: no request", method);
  return NB_OK;
}

/* Loads the member record of job id, which `caller` must be the origin of. */
static nb_status_t nb__fed_member(nb_job_store_t* st, const char* id, const char* caller,
                                  nb_job_fed_t* fed, json_t** info) {
  if (!id || !*id) return nb_error(NB_ERR_INVALID, "job_id is empty");
  nb_status_t s = nb__fed_load(st, id, fed, info);
  if (s == NB_ERR_NOT_FOUND) return nb_error(NB_ERR_NOT_FOUND, "no federated job '%s' here", id);
  if (s != NB_OK) return s;
  if (strcmp(fed->role, "member") || strcmp(fed->origin, caller)) {
    nb__fed_release(fed, *info);
    return nb_error(NB_ERR_PERMISSION, "cluster '%s' is not the origin of job '%s'", caller, id);
  }
  return NB_OK;
}

static nb_status_t nb__fed_ack(nb_rpc_call_t* call, nb_job_store_t* st, const char* id) {
  nb_job_record_t rec = {0};
  NB_CHECK(nb_job_store_get(st, id, &rec));
  Nebula__V1__FederationAck a = NEBULA__V1__FEDERATION_ACK__INIT;
  a.state = (char*)nb_job_state_name(rec.state);
  nb_status_t s = nb_rpc_call_send_pb(call, &a.base);
  nb_job_record_clear(&rec);
  return s;
}

/* Member, phase 1: the same checks as Submit (signature, descriptor, our ACL and resources),
 * then the job is stored as proposed, its slots reserved and our Exchange endpoint chosen. */
static nb_status_t nb__fed_propose(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* caller = "";
  ProtobufCMessage* m = NULL;
  NB_CHECK(
      nb__fed_request(call, gw, &nebula__v1__propose_request__descriptor, "Propose", &caller, &m));
  Nebula__V1__ProposeRequest* req = (Nebula__V1__ProposeRequest*)m;
  nb_status_t s = NB_OK;
  X509* cert = NULL;
  nb_job_config_t* cfg = NULL;
  nb_descriptor_diag_t* diag = NULL;
  nb_job_store_t* st = NULL;
  json_t* info = NULL;
  int reserved = 0, created = 0;
  nb_pki_identity_t who;
  char ep[NB_GW_STR + 16] = "";
  if (!req->origin || strcmp(req->origin, caller)) {
    s = nb_error(NB_ERR_PERMISSION, "Propose: origin '%s' is not the caller '%s'",
                 req->origin ? req->origin : "", caller);
    goto done;
  }
  if (!req->job_id || !*req->job_id || !req->descriptor.len || !req->signature.len ||
      !req->cert_pem || !*req->cert_pem) {
    s = nb_error(NB_ERR_INVALID, "Propose needs the job id, descriptor, signature and certificate");
    goto done;
  }
  if (nb_pki_cert_from_pem(req->cert_pem, 0, &cert) != NB_OK) {
    s = nb_error_wrap(NB_ERR_INVALID, "cert_pem");
    goto done;
  }
  s = nb_sign_verify(cert, gw->ca, req->descriptor.data, req->descriptor.len, req->signature.data,
                     req->signature.len, NULL, &who);
  if (s == NB_ERR_INTEGRITY) {
    s = nb_error_wrap(NB_ERR_PERMISSION, "descriptor signature does not verify");
    goto done;
  }
  if (s != NB_OK) {
    s = nb_error_wrap(NB_ERR_PERMISSION, "signer certificate refused");
    goto done;
  }
  NB_CHECK_GOTO(nb_calloc((void**)&cfg, 1, sizeof *cfg, "job config"), s, done);
  NB_CHECK_GOTO(nb_calloc((void**)&diag, 1, sizeof *diag, "diagnostics"), s, done);
  if (nb_descriptor_parse((const char*)req->descriptor.data, req->descriptor.len, cfg, diag) !=
      NB_OK) {
    char line[640];
    s = nb_error(
        NB_ERR_INVALID, "descriptor is invalid: %s",
        diag->count ? nb_descriptor_error_format(&diag->errors[0], line, sizeof line) : "?");
    goto done;
  }
  s = nb__paths_check(gw, cfg, diag);
  if (s != NB_OK) goto done;
  nb__part_t parts[NB__MAX_PARTS];
  int np = nb__parts(cfg, parts), mine = -1;
  for (int i = 0; i < np; i++)
    if (!strcmp(parts[i].id, gw->cfg.cluster_id)) mine = i;
  if (mine < 0) {
    s = nb_error(NB_ERR_INVALID, "job '%s' does not involve cluster '%s'", req->job_id,
                 gw->cfg.cluster_id);
    goto done;
  }
  int workers = parts[mine].workers;
  nb_acl_want_t want = {gw->cfg.cluster_id, workers};
  s = nb_acl_check(&gw->cfg.acl, who.name, &want, 1);
  if (s != NB_OK) goto done;
  for (int i = 0; i < cfg->n_clusters && workers > 0; i++) {
    if (!strcmp(cfg->clusters[i].id, gw->cfg.cluster_id) &&
        cfg->clusters[i].device == NB_JOB_DEVICE_CUDA && gw->cfg.device != NB_JOB_DEVICE_CUDA) {
      s = nb_error(NB_ERR_INVALID, "$.spec.clusters[%d].device: cluster '%s' has no cuda devices",
                   i, gw->cfg.cluster_id);
      goto done;
    }
  }
  if (workers > 0) {
    NB_CHECK_GOTO(nb__reserve(gw, req->job_id, workers), s, done);
    reserved = 1;
    NB_CHECK_GOTO(nb__free_endpoint(gw->cfg.exchange_host, ep, sizeof ep), s, done);
  }
  NB_CHECK_GOTO(nb__open_store(gw, &st), s, done);
  {
    char* text = NULL;
    NB_CHECK_GOTO(nb_alloc((void**)&text, req->descriptor.len + 1, 1, "descriptor"), s, done);
    memcpy(text, req->descriptor.data, req->descriptor.len);
    text[req->descriptor.len] = 0;
    s = nb_job_store_create(st, req->job_id, who.name, text);
    nb_free(text);
    if (s == NB_ERR_EXISTS) s = nb_error(NB_ERR_EXISTS, "job '%s' is already here", req->job_id);
    if (s != NB_OK) goto done;
    created = 1;
  }
  NB_CHECK_GOTO(nb_job_store_transition(st, req->job_id, NB_JOB_PROPOSED, NULL), s, done);
  NB_CHECK_GOTO(nb__jobdir_write(gw, req->job_id, req->descriptor.data, req->descriptor.len,
                                 req->signature.data, req->signature.len, req->cert_pem),
                s, done);
  {
    nb_job_fed_t fed;
    memset(&fed, 0, sizeof fed);
    snprintf(fed.job_id, sizeof fed.job_id, "%s", req->job_id);
    snprintf(fed.role, sizeof fed.role, "member");
    snprintf(fed.origin, sizeof fed.origin, "%s", caller);
    fed.active = 1;
    info = json_pack("{s:I}", "report_seq", (json_int_t)0);
    json_t* me = nb__fed_cluster(info, gw->cfg.cluster_id);
    json_object_set_new(me, "workers", json_integer(workers));
    json_object_set_new(me, "endpoint", json_string(ep));
    NB_CHECK_GOTO(nb__fed_save(st, &fed, info), s, done);
  }
  NB_INFO(JOB, "job %s proposed by %s for user %s: %d workers here, exchange %s", req->job_id,
          caller, who.name, workers, ep[0] ? ep : "-");
  {
    Nebula__V1__ProposeReply r = NEBULA__V1__PROPOSE_REPLY__INIT;
    r.endpoint = ep;
    s = nb_rpc_call_send_pb(call, &r.base);
  }
done:
  if (s != NB_OK) {
    char why[768];
    snprintf(why, sizeof why, "%s", nb_error_last());
    if (reserved) nb__unreserve(gw, req->job_id);
    if (created) nb_job_store_transition(st, req->job_id, NB_JOB_FAILED, why);
    NB_WARN("job %s proposed by %s: refused: %s", req->job_id ? req->job_id : "?", caller, why);
    s = nb_error(s, "%s", why);
  }
  json_decref(info);
  if (cert) X509_free(cert);
  nb_free(cfg);
  nb_free(diag);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* Member, phase 2: keep the secret and the endpoints, launch our share. */
static nb_status_t nb__fed_commit(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* caller = "";
  ProtobufCMessage* m = NULL;
  NB_CHECK(
      nb__fed_request(call, gw, &nebula__v1__commit_request__descriptor, "Commit", &caller, &m));
  Nebula__V1__CommitRequest* req = (Nebula__V1__CommitRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  int loaded = 0;
  nb_job_record_t rec = {0};
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) {
    pthread_mutex_lock(&gw->mu);
    s = nb__fed_member(st, req->job_id, caller, &fed, &info);
    loaded = s == NB_OK;
    if (s == NB_OK && req->secret.len != sizeof fed.secret)
      s = nb_error(NB_ERR_INVALID, "Commit: the secret must be %zu bytes", sizeof fed.secret);
    if (s == NB_OK) s = nb_job_store_get(st, req->job_id, &rec);
    if (s == NB_OK && rec.state != NB_JOB_PROPOSED)
      s = nb_error(NB_ERR_INVALID, "job '%s' is %s here, not proposed", req->job_id,
                   nb_job_state_name(rec.state));
    json_t* eps = json_object();
    for (size_t i = 0; s == NB_OK && i < req->n_endpoints; i++)
      json_object_set_new(eps, req->endpoints[i]->cluster, json_string(req->endpoints[i]->address));
    if (s == NB_OK) {
      memcpy(fed.secret, req->secret.data, sizeof fed.secret);
      fed.has_secret = 1;
      json_object_set(info, "endpoints", eps);
      s = nb__fed_save(st, &fed, info);
    }
    pthread_mutex_unlock(&gw->mu);
    int workers = (int)json_integer_value(
        json_object_get(nb__fed_cluster(info ? info : eps, gw->cfg.cluster_id), "workers"));
    if (s == NB_OK) {
      s = nb__fed_start(gw, st, req->job_id, workers, fed.secret, eps);
      if (s != NB_OK) {
        char reason[768];
        snprintf(reason, sizeof reason, "launch failed: %.700s", nb_error_last());
        nb__unreserve(gw, req->job_id);
        nb_job_store_transition(st, req->job_id, NB_JOB_FAILED, reason);
        s = nb_error(s, "%s", reason);
      }
    }
    json_decref(eps);
  }
  if (s == NB_OK) s = nb__fed_ack(call, st, req->job_id);
  if (loaded) nb__fed_release(&fed, info);
  nb_job_record_clear(&rec);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* Member: the origin gave up on the job (another cluster refused): release, launch nothing. */
static nb_status_t nb__fed_abort(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* caller = "";
  ProtobufCMessage* m = NULL;
  NB_CHECK(nb__fed_request(call, gw, &nebula__v1__abort_request__descriptor, "Abort", &caller, &m));
  Nebula__V1__AbortRequest* req = (Nebula__V1__AbortRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__fed_member(st, req->job_id, caller, &fed, &info);
  if (s == NB_OK) {
    nb__unreserve(gw, req->job_id);
    char reason[768];
    snprintf(reason, sizeof reason, "aborted by the origin '%s': %.600s", caller,
             req->reason ? req->reason : "");
    nb_status_t t = nb_job_store_transition(st, req->job_id, NB_JOB_FAILED, reason);
    if (t != NB_OK && t != NB_ERR_INVALID) s = t;
    nb__fed_release(&fed, info);
  }
  if (s == NB_OK) s = nb__fed_ack(call, st, req->job_id);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* Member: stop our share of the job (the origin cancelled it, or another cluster failed). */
static nb_status_t nb__fed_cancel(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* caller = "";
  ProtobufCMessage* m = NULL;
  NB_CHECK(nb__fed_request(call, gw, &nebula__v1__federation_cancel_request__descriptor, "Cancel",
                           &caller, &m));
  Nebula__V1__FederationCancelRequest* req = (Nebula__V1__FederationCancelRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__fed_member(st, req->job_id, caller, &fed, &info);
  if (s == NB_OK) {
    nb__fed_release(&fed, info);
    char reason[768];
    snprintf(reason, sizeof reason, "cancelled by the origin '%s'%s%.600s", caller,
             req->reason && *req->reason ? ": " : "", req->reason ? req->reason : "");
    s = nb__cancel_local(gw, st, req->job_id, reason);
  }
  if (s == NB_OK) s = nb__fed_ack(call, st, req->job_id);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* The most a member's event seq may run ahead of its last accepted one at the origin. */
#define NB__FED_SEQ_MAX_GAP 1000

/* Origin: a batch of a member's events. Stored tagged with the cluster (state → cluster_state,
 * launch/exit → cluster_launch/cluster_exit, progress keeps its kind); the cluster's state feeds
 * the job's aggregate state. Idempotent: events at or below the cluster's acked seq are skipped. */
static nb_status_t nb__fed_report(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* caller = "";
  ProtobufCMessage* m = NULL;
  NB_CHECK(
      nb__fed_request(call, gw, &nebula__v1__report_request__descriptor, "Report", &caller, &m));
  Nebula__V1__ReportRequest* req = (Nebula__V1__ReportRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  int64_t acked = 0;
  nb_status_t s = NB_OK;
  if (!req->cluster || strcmp(req->cluster, caller)) {
    s = nb_error(NB_ERR_PERMISSION, "Report: cluster '%s' is not the caller '%s'",
                 req->cluster ? req->cluster : "", caller);
    goto out;
  }
  NB_CHECK_GOTO(nb__open_store(gw, &st), s, out);
  pthread_mutex_lock(&gw->mu);
  s = nb__fed_load(st, req->job_id ? req->job_id : "", &fed, &info);
  if (s == NB_ERR_NOT_FOUND)
    s = nb_error(NB_ERR_NOT_FOUND, "no federated job '%s' here", req->job_id);
  if (s == NB_OK) {
    json_t* c = json_object_get(json_object_get(info, "clusters"), caller);
    if (strcmp(fed.role, "origin") || !json_is_object(c)) {
      s = nb_error(NB_ERR_PERMISSION, "cluster '%s' takes no part in job '%s' from here", caller,
                   req->job_id);
    } else {
      acked = json_integer_value(json_object_get(c, "seq"));
      /* A member numbers its events 1, 2, 3, ... in its own store and reports them in order, so
       * a new event follows the last accepted one closely. One far ahead (or going backwards)
       * would move the acked seq past the member's real events, which would then be skipped as
       * already stored: the job would never end here. The whole batch is refused, nothing is
       * stored, and the member is told why. */
      int64_t prev = acked;
      for (size_t i = 0; i < req->n_events && s == NB_OK; i++) {
        int64_t q = req->events[i]->seq;
        if (q <= acked) continue;
        if (q <= prev)
          s = nb_error(NB_ERR_INVALID,
                       "Report from cluster '%s' for job '%s' refused: event seq %" PRId64
                       " does not follow seq %" PRId64
                       " (a member's events are in increasing "
                       "order); nothing stored",
                       caller, req->job_id, q, prev);
        else if (q - prev > NB__FED_SEQ_MAX_GAP)
          s = nb_error(NB_ERR_INVALID,
                       "Report from cluster '%s' for job '%s' refused: event seq %" PRId64
                       " is more than %d ahead of seq %" PRId64
                       ", the last accepted; "
                       "nothing stored",
                       caller, req->job_id, q, NB__FED_SEQ_MAX_GAP, prev);
        else
          prev = q;
      }
      if (s != NB_OK) NB_WARN("federation: %s", nb_error_last());
      for (size_t i = 0; i < req->n_events && s == NB_OK; i++) {
        Nebula__V1__ReportEvent* e = req->events[i];
        if (e->seq <= acked) continue;
        json_t* p = json_loads(e->payload_json ? e->payload_json : "", 0, NULL);
        if (!json_is_object(p)) {
          json_decref(p);
          p = json_object();
        }
        json_object_set_new(p, "cluster", json_string(caller));
        char kind[32];
        if (!strcmp(e->kind, "progress")) {
          snprintf(kind, sizeof kind, "progress");
          if (!json_object_get(p, "source")) json_object_set_new(p, "source", json_string(caller));
        } else {
          snprintf(kind, sizeof kind, "cluster_%.20s", e->kind);
        }
        if (!strcmp(e->kind, "state")) {
          const char* to = nb__jstr(p, "to");
          json_object_set_new(c, "state", json_string(to));
          json_object_set_new(c, "reason", json_string(nb__jstr(p, "reason")));
        }
        char* txt = json_dumps(p, JSON_COMPACT);
        json_decref(p);
        s = txt ? nb_job_store_append_event(st, req->job_id, kind, txt, NULL)
                : nb_error(NB_ERR_NOMEM, "report");
        free(txt);
        if (s == NB_OK) acked = e->seq;
      }
      json_object_set_new(c, "seq", json_integer(acked));
      nb__fed_aggregate(gw, st, req->job_id, info);
      nb_status_t t = nb__fed_save(st, &fed, info);
      if (s == NB_OK) s = t;
    }
    nb__fed_release(&fed, info);
  }
  pthread_mutex_unlock(&gw->mu);
  if (s == NB_OK) {
    Nebula__V1__ReportReply r = NEBULA__V1__REPORT_REPLY__INIT;
    r.acked_seq = acked;
    s = nb_rpc_call_send_pb(call, &r.base);
  }
out:
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* One pass of the federation thread over the active records: members report their new events
 * to the origin (retried next pass while it is away) and give up a proposal the origin never
 * committed; origins cancel the remaining clusters of a job that failed. */
static void nb__fed_pass(nb_gateway_t* gw) {
  nb_job_store_t* st = gw->fed_store;
  nb_job_fed_t* recs = NULL;
  size_t n = 0;
  if (nb_job_store_fed_list_active(st, &recs, &n) != NB_OK) return;
  for (size_t i = 0; i < n && !gw->stopping; i++) {
    nb_job_fed_t* f = &recs[i];
    nb_job_record_t rec = {0};
    if (nb_job_store_get(st, f->job_id, &rec) != NB_OK) continue;
    int final = nb_job_state_is_final(rec.state);
    nb_job_state_t state = rec.state;
    int64_t created = rec.created_ns;
    nb_job_record_clear(&rec);
    json_t* info = json_loads(f->info ? f->info : "{}", 0, NULL);
    if (!json_is_object(info)) {
      json_decref(info);
      info = json_object();
    }
    if (!strcmp(f->role, "member")) {
      if (state == NB_JOB_PROPOSED && !f->has_secret && /* never committed */
          nb_wall_ns() - created > (int64_t)gw->cfg.federation_timeout_ms * 6 * 1000000) {
        nb__unreserve(gw, f->job_id);
        nb_job_store_transition(st, f->job_id, NB_JOB_FAILED,
                                "the origin never committed the job (proposal expired)");
        json_decref(info);
        continue; /* its state event is reported next pass */
      }
      int64_t after = json_integer_value(json_object_get(info, "report_seq"));
      nb_job_event_t* ev = NULL;
      size_t ne = 0;
      if (nb_job_store_events(st, f->job_id, after, 128, &ev, &ne) == NB_OK && ne > 0) {
        Nebula__V1__ReportEvent* es = NULL;
        Nebula__V1__ReportEvent** ep = NULL;
        if (nb_calloc((void**)&es, ne, sizeof *es, "report") == NB_OK &&
            nb_calloc((void**)&ep, ne, sizeof *ep, "report") == NB_OK) {
          for (size_t k = 0; k < ne; k++) {
            nebula__v1__report_event__init(&es[k]);
            es[k].seq = ev[k].seq;
            es[k].time_unix_ns = ev[k].time_ns;
            es[k].kind = ev[k].kind;
            es[k].payload_json = ev[k].payload;
            ep[k] = &es[k];
          }
          Nebula__V1__ReportRequest rr = NEBULA__V1__REPORT_REQUEST__INIT;
          rr.job_id = f->job_id;
          rr.cluster = gw->cfg.cluster_id;
          rr.n_events = ne;
          rr.events = ep;
          ProtobufCMessage* resp = NULL;
          if (nb__fed_call(gw, f->origin, "Report", &rr.base, &nebula__v1__report_reply__descriptor,
                           &resp, 0) == NB_OK) {
            int64_t acked = ((Nebula__V1__ReportReply*)resp)->acked_seq;
            pthread_mutex_lock(&gw->mu);
            nb_job_fed_t cur;
            json_t* now = NULL;
            if (nb__fed_load(st, f->job_id, &cur, &now) == NB_OK) {
              json_object_set_new(now, "report_seq", json_integer(acked));
              nb__fed_save(st, &cur, now);
              nb__fed_release(&cur, now);
            }
            pthread_mutex_unlock(&gw->mu);
            after = acked;
          } else {
            NB_TRACE(RPC, "job %s: report to %s: %s", f->job_id, f->origin, nb_error_last());
          }
          if (resp) protobuf_c_message_free_unpacked(resp, NULL);
        }
        nb_free(es);
        nb_free(ep);
      }
      nb_job_events_free(ev, ne);
      if (final && ne == 0) { /* everything reported */
        pthread_mutex_lock(&gw->mu);
        nb_job_fed_t cur;
        json_t* now = NULL;
        if (nb__fed_load(st, f->job_id, &cur, &now) == NB_OK) {
          cur.active = 0;
          nb__fed_save(st, &cur, now);
          nb__fed_release(&cur, now);
        }
        pthread_mutex_unlock(&gw->mu);
      }
    } else if (final) {
      /* origin: once final, the clusters still running are cancelled, then nothing is left */
      int ok = 1;
      if (json_is_true(json_object_get(info, "cancel_pending"))) {
        nb_job_record_t r2 = {0};
        char reason[640] = "another cluster of the job failed";
        if (nb_job_store_get(st, f->job_id, &r2) == NB_OK && r2.reason && *r2.reason)
          snprintf(reason, sizeof reason, "%.600s", r2.reason);
        nb_job_record_clear(&r2);
        ok = nb__fed_cancel_peers(gw, st, f->job_id, reason) == NB_OK;
      }
      if (ok) {
        pthread_mutex_lock(&gw->mu);
        nb_job_fed_t cur;
        json_t* now = NULL;
        if (nb__fed_load(st, f->job_id, &cur, &now) == NB_OK) {
          cur.active = 0;
          json_object_del(now, "cancel_pending");
          nb__fed_save(st, &cur, now);
          nb__fed_release(&cur, now);
        }
        pthread_mutex_unlock(&gw->mu);
      }
    }
    json_decref(info);
  }
  nb_job_feds_free(recs, n);
}

static void* nb__fed_loop(void* arg) {
  nb_gateway_t* gw = arg;
  while (!gw->stopping) {
    nb__fed_pass(gw);
    for (int i = 0; i < 4 && !gw->stopping; i++) nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  return NULL;
}

static nb_status_t nb__submit(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* user = "";
  int admin = 0;
  NB_CHECK(nb__caller(call, &user, &admin));
  const nb_tls_peer_t* peer = nb_rpc_call_peer(call);
  if (peer->kind != NB_TLS_PEER_USER)
    return nb_error(NB_ERR_PERMISSION, "only user certificates may submit jobs (caller is %s '%s')",
                    "cluster", peer->name);
  ProtobufCMessage* m = NULL;
  int end = 0;
  NB_CHECK(nb_rpc_call_recv_pb(call, &nebula__v1__submit_request__descriptor, &m, &end,
                               NB_RPC_INFINITE));
  if (!m) return nb_error(NB_ERR_INVALID, "Submit: no request");
  Nebula__V1__SubmitRequest* req = (Nebula__V1__SubmitRequest*)m;
  nb_status_t s = NB_OK;
  X509* cert = NULL;
  nb_job_config_t* cfg = NULL;
  nb_descriptor_diag_t* diag = NULL;
  nb_job_store_t* st = NULL;
  char id[NB_JOB_ID_MAX];

  if (!req->descriptor.len || !req->signature.len || !req->cert_pem || !*req->cert_pem) {
    s = nb_error(NB_ERR_INVALID,
                 "Submit needs the descriptor, its signature and the signer's "
                 "certificate");
    goto done;
  }
  if (nb_pki_cert_from_pem(req->cert_pem, 0, &cert) != NB_OK) {
    s = nb_error_wrap(NB_ERR_INVALID, "cert_pem");
    goto done;
  }
  s = nb_sign_verify(cert, gw->ca, req->descriptor.data, req->descriptor.len, req->signature.data,
                     req->signature.len, user, NULL);
  if (s == NB_ERR_INTEGRITY) {
    s = nb_error_wrap(NB_ERR_PERMISSION, "descriptor signature does not verify");
    goto done;
  }
  if (s != NB_OK) {
    s = nb_error_wrap(NB_ERR_PERMISSION, "signer certificate refused");
    goto done;
  }
  NB_CHECK_GOTO(nb_calloc((void**)&cfg, 1, sizeof *cfg, "job config"), s, done);
  NB_CHECK_GOTO(nb_calloc((void**)&diag, 1, sizeof *diag, "diagnostics"), s, done);
  if (nb_descriptor_parse((const char*)req->descriptor.data, req->descriptor.len, cfg, diag) !=
      NB_OK) {
    char msg[2048] = "descriptor is invalid:";
    size_t o = strlen(msg);
    for (int i = 0; i < diag->count && o + 2 < sizeof msg; i++) {
      char line[640];
      o += (size_t)snprintf(msg + o, sizeof msg - o, "%s %s", i ? ";" : "",
                            nb_descriptor_error_format(&diag->errors[i], line, sizeof line));
      if (o >= sizeof msg) o = sizeof msg - 1;
    }
    s = nb_error(NB_ERR_INVALID, "%s", msg);
    goto done;
  }
  s = nb__paths_check(gw, cfg, diag);
  if (s != NB_OK) goto done;
  /* Which clusters: each one named, and the one holding the base checkpoint */
  nb__part_t parts[NB__MAX_PARTS];
  int np = nb__parts(cfg, parts), mine = -1, fed = 0;
  nb_acl_want_t want[NB_JOB_MAX_CLUSTERS];
  for (int i = 0; i < cfg->n_clusters; i++) {
    want[i].cluster = cfg->clusters[i].id;
    want[i].workers = cfg->clusters[i].workers;
  }
  s = nb_acl_check(&gw->cfg.acl, user, want, (size_t)cfg->n_clusters);
  if (s != NB_OK) goto done;
  for (int i = 0; i < np; i++) {
    if (!strcmp(parts[i].id, gw->cfg.cluster_id)) {
      mine = i;
      continue;
    }
    fed = 1;
    if (!nb__peer_client(gw, parts[i].id)) {
      s = nb_error(NB_ERR_INVALID,
                   "the job names cluster '%s', which is not a peer of gateway '%s' (add it to "
                   "\"peers\" in the gateway's config)",
                   parts[i].id, gw->cfg.cluster_id);
      goto done;
    }
  }
  int my_workers = mine >= 0 ? parts[mine].workers : 0;
  for (int i = 0; i < cfg->n_clusters && my_workers > 0; i++) {
    if (!strcmp(cfg->clusters[i].id, gw->cfg.cluster_id) &&
        cfg->clusters[i].device == NB_JOB_DEVICE_CUDA && gw->cfg.device != NB_JOB_DEVICE_CUDA) {
      s = nb_error(NB_ERR_INVALID, "$.spec.clusters[%d].device: cluster '%s' has no cuda devices",
                   i, gw->cfg.cluster_id);
      goto done;
    }
  }
  int used = 0;
  pthread_mutex_lock(&gw->mu);
  for (int i = 0; i < gw->n_active; i++) used += gw->active[i].workers;
  pthread_mutex_unlock(&gw->mu);
  if (used + my_workers > gw->cfg.slots) {
    s = nb_error(NB_ERR_UNAVAILABLE,
                 "cluster '%s' has %d free worker slots of %d, the job needs %d",
                 gw->cfg.cluster_id, gw->cfg.slots - used, gw->cfg.slots, my_workers);
    goto done;
  }
  NB_CHECK_GOTO(nb__open_store(gw, &st), s, done);
  {
    /* the store wants JSON text: the signed bytes, NUL-terminated */
    char* text = NULL;
    NB_CHECK_GOTO(nb_alloc((void**)&text, req->descriptor.len + 1, 1, "descriptor"), s, done);
    memcpy(text, req->descriptor.data, req->descriptor.len);
    text[req->descriptor.len] = 0;
    s = NB_ERR_EXISTS;
    for (int attempt = 0; attempt < 4 && s == NB_ERR_EXISTS; attempt++) {
      uint32_t rnd = 0;
      if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd ^= (uint32_t)nb_now_ns();
      snprintf(id, sizeof id, "%.40s-%08x", cfg->name, rnd);
      s = nb_job_store_create(st, id, user, text);
    }
    nb_free(text);
    if (s != NB_OK) goto done;
  }
  NB_CHECK_GOTO(nb_job_store_transition(st, id, NB_JOB_PROPOSED, NULL), s, done);
  if (fed) {
    /* two-phase with every other cluster; on failure the job is failed here and Submit fails */
    s = nb__fed_submit(gw, st, id, req, parts, np, mine, cfg->model.base_cluster);
    if (s != NB_OK) goto done;
  } else {
    s = nb__jobdir_write(gw, id, req->descriptor.data, req->descriptor.len, req->signature.data,
                         req->signature.len, req->cert_pem);
    if (s == NB_OK) s = nb__launch(gw, st, id, my_workers, NULL);
    if (s != NB_OK) {
      char reason[512];
      snprintf(reason, sizeof reason, "launch failed: %s", nb_error_last());
      nb_job_store_transition(st, id, NB_JOB_FAILED, reason);
      NB_WARN("job %s: %s", id, reason);
    }
  }
  NB_INFO(JOB, "job %s submitted by %s", id, user);
  s = nb__send_job(call, gw, st, id, 1);
done:
  if (cert) X509_free(cert);
  nb_free(cfg);
  nb_free(diag);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

static nb_status_t nb__get(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* user = "";
  int admin = 0;
  ProtobufCMessage* m = NULL;
  NB_CHECK(nb__request(call, gw, &nebula__v1__get_request__descriptor, "Get", &user, &admin, &m));
  Nebula__V1__GetRequest* req = (Nebula__V1__GetRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_record_t rec = {0};
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__job_for(st, req->job_id, user, admin, &rec);
  if (s == NB_OK) s = nb__send_job(call, gw, st, req->job_id, 1);
  nb_job_record_clear(&rec);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

static nb_status_t nb__list(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* user = "";
  int admin = 0;
  ProtobufCMessage* m = NULL;
  NB_CHECK(nb__request(call, gw, &nebula__v1__list_request__descriptor, "List", &user, &admin, &m));
  Nebula__V1__ListRequest* req = (Nebula__V1__ListRequest*)m;
  nb_status_t s = NB_OK;
  nb_job_store_t* st = NULL;
  nb_job_record_t* recs = NULL;
  size_t n = 0;
  Nebula__V1__Job* jobs = NULL;
  Nebula__V1__Job** ptrs = NULL;
  char(*names)[NB_JOB_NAME_MAX] = NULL;
  const char* owner = req->owner && *req->owner ? req->owner : NULL;
  if (!admin && owner && strcmp(owner, user)) {
    s = nb_error(NB_ERR_PERMISSION, "user '%s' may only list its own jobs (asked for '%s')", user,
                 owner);
    goto done;
  }
  if (!admin) owner = user;
  nb_job_state_t state = (nb_job_state_t)-1;
  if (req->state && *req->state && nb_job_state_parse(req->state, &state) != NB_OK) {
    s = nb_error(NB_ERR_INVALID,
                 "state '%s' is not a job state (pending, proposed, running, "
                 "succeeded, failed, cancelled)",
                 req->state);
    goto done;
  }
  NB_CHECK_GOTO(nb__open_store(gw, &st), s, done);
  NB_CHECK_GOTO(nb_job_store_list(st, owner, (int)state, &recs, &n), s, done);
  if (n) {
    NB_CHECK_GOTO(nb_calloc((void**)&jobs, n, sizeof *jobs, "jobs"), s, done);
    NB_CHECK_GOTO(nb_calloc((void**)&ptrs, n, sizeof *ptrs, "jobs"), s, done);
    NB_CHECK_GOTO(nb_calloc((void**)&names, n, sizeof *names, "names"), s, done);
  }
  for (size_t i = 0; i < n; i++) {
    nb__job_msg(gw, &recs[i], 0, &jobs[i], names[i], sizeof names[i]);
    ptrs[i] = &jobs[i];
  }
  Nebula__V1__ListReply rep = NEBULA__V1__LIST_REPLY__INIT;
  rep.n_jobs = n;
  rep.jobs = ptrs;
  s = nb_rpc_call_send_pb(call, &rep.base);
done:
  nb_free(jobs);
  nb_free(ptrs);
  nb_free(names);
  nb_job_records_free(recs, n);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

static double nb__jnum(json_t* o, const char* k, double def) {
  json_t* v = json_object_get(o, k);
  return json_is_number(v) ? json_number_value(v) : def;
}

static nb_status_t nb__send_event(nb_rpc_call_t* call, const char* id, const nb_job_event_t* e) {
  Nebula__V1__JobEvent m = NEBULA__V1__JOB_EVENT__INIT;
  m.job_id = (char*)id;
  m.seq = e->seq;
  m.time_unix_ns = e->time_ns;
  m.kind = (char*)e->kind;
  m.payload_json = e->payload;
  m.eta_seconds = -1;
  json_t* j = json_loads(e->payload, 0, NULL);
  char state[32] = "", source[NB_JOB_NAME_MAX] = "";
  char* reason = NULL;
  if (j && !strcmp(e->kind, "state")) {
    const char* to = json_string_value(json_object_get(j, "to"));
    if (to) snprintf(state, sizeof state, "%s", to);
    reason = (char*)json_string_value(json_object_get(j, "reason"));
  } else if (j && !strcmp(e->kind, "progress")) {
    m.round = (int64_t)nb__jnum(j, "round", 0);
    m.step = (int64_t)nb__jnum(j, "step", 0);
    m.max_steps = (int64_t)nb__jnum(j, "max_steps", 0);
    m.loss = nb__jnum(j, "loss", 0);
    m.wan_mbps = nb__jnum(j, "wan_mbps", 0);
    m.density = nb__jnum(j, "density", 0);
    m.eta_seconds = nb__jnum(j, "eta_s", -1);
    const char* src = json_string_value(json_object_get(j, "source"));
    if (src) snprintf(source, sizeof source, "%s", src);
  }
  m.state = state;
  m.reason = reason ? reason : (char*)"";
  m.source = source;
  nb_status_t s = nb_rpc_call_send_pb(call, &m.base);
  json_decref(j);
  return s;
}

static nb_status_t nb__watch(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* user = "";
  int admin = 0;
  ProtobufCMessage* m = NULL;
  NB_CHECK(
      nb__request(call, gw, &nebula__v1__watch_request__descriptor, "Watch", &user, &admin, &m));
  Nebula__V1__WatchRequest* req = (Nebula__V1__WatchRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_record_t rec = {0};
  int64_t after = req->after_seq;
  int sent = 0;
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__job_for(st, req->job_id, user, admin, &rec);
  nb_job_record_clear(&rec);
  while (s == NB_OK) {
    if (nb_rpc_call_cancelled(call)) {
      s = nb_error(NB_ERR_CANCELLED, "Watch: client went away");
      break;
    }
    /* read the state before the events: a final state seen here has all its events below */
    s = nb_job_store_get(st, req->job_id, &rec);
    if (s != NB_OK) break;
    int final = nb_job_state_is_final(rec.state);
    nb_job_record_clear(&rec);
    /* a succeeded job's run report is still being built: its "report" event is to come */
    int pending = final && nb__report_pending(gw, req->job_id);
    nb_job_event_t* ev = NULL;
    size_t n = 0;
    s = nb_job_store_events(st, req->job_id, after, 256, &ev, &n);
    for (size_t i = 0; s == NB_OK && i < n; i++) {
      s = nb__send_event(call, req->job_id, &ev[i]);
      after = ev[i].seq;
      sent++;
    }
    nb_job_events_free(ev, n);
    if (s != NB_OK || (final && n == 0 && !pending)) break;
    if (n == 0) nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  if (s == NB_OK && sent == 0) {
    /* a stream must carry something: repeat the final state */
    nb_job_event_t e = {0};
    nb_job_store_get(st, req->job_id, &rec);
    e.seq = after;
    e.time_ns = rec.updated_ns;
    snprintf(e.kind, sizeof e.kind, "state");
    json_t* j = json_pack("{s:s, s:s}", "to", nb_job_state_name(rec.state), "reason",
                          rec.reason ? rec.reason : "");
    e.payload = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    s = nb__send_event(call, req->job_id, &e);
    free(e.payload);
    nb_job_record_clear(&rec);
  }
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

static nb_status_t nb__cancel(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* user = "";
  int admin = 0;
  ProtobufCMessage* m = NULL;
  NB_CHECK(
      nb__request(call, gw, &nebula__v1__cancel_request__descriptor, "Cancel", &user, &admin, &m));
  Nebula__V1__CancelRequest* req = (Nebula__V1__CancelRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_record_t rec = {0};
  nb_status_t s = NB_OK;
  /* the reason is stored and shown by `nebula list/get/watch`: printable text only */
  for (size_t i = 0; req->reason && req->reason[i] && s == NB_OK; i++) {
    unsigned char c = (unsigned char)req->reason[i];
    if (c < 0x20 || c == 0x7f ||
        (c == 0xc2 && (unsigned char)req->reason[i + 1] >= 0x80 &&
         (unsigned char)req->reason[i + 1] <= 0x9f))
      s = nb_error(NB_ERR_INVALID,
                   "Cancel: the reason has a control character (0x%02x) at byte %zu; give "
                   "printable text",
                   c == 0xc2 ? (unsigned char)req->reason[i + 1] : c, i);
  }
  if (s == NB_OK) s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__job_for(st, req->job_id, user, admin, &rec);
  if (s == NB_OK && !nb_job_state_is_final(rec.state)) {
    char reason[512];
    snprintf(reason, sizeof reason, "cancelled by %s%s%.300s", user,
             req->reason && *req->reason ? ": " : "", req->reason ? req->reason : "");
    /* a federated job: every other cluster stops first (each answers once its workers are
     * gone), then ours. A job with processes: the monitor records the end (exit event, then
     * `cancelled`) once they are gone, and retires the entry, which frees its slots before we
     * answer. */
    pthread_mutex_lock(&gw->mu);
    nb_job_fed_t fed;
    json_t* info = NULL;
    if (nb__fed_load(st, req->job_id, &fed, &info) == NB_OK) {
      /* the peers' cancelled states that come in now must not fail the job */
      json_object_set_new(info, "cancelling", json_string(reason));
      nb__fed_save(st, &fed, info);
      nb__fed_release(&fed, info);
    }
    pthread_mutex_unlock(&gw->mu);
    nb_status_t peers = nb__fed_cancel_peers(gw, st, req->job_id, reason);
    char perr[768] = "";
    if (peers != NB_OK) {
      snprintf(perr, sizeof perr, "%s", nb_error_last());
      /* the federation thread keeps trying the clusters that did not answer */
      pthread_mutex_lock(&gw->mu);
      if (nb__fed_load(st, req->job_id, &fed, &info) == NB_OK) {
        json_object_set_new(info, "cancel_pending", json_true());
        nb__fed_save(st, &fed, info);
        nb__fed_release(&fed, info);
      }
      pthread_mutex_unlock(&gw->mu);
    }
    s = nb__cancel_local(gw, st, req->job_id, reason);
    if (s == NB_OK && peers != NB_OK)
      s = nb_error(peers,
                   "job %s: cancelled here, but not yet on every cluster (retried in the "
                   "background): %s",
                   req->job_id, perr);
  }
  if (s == NB_OK) s = nb__send_job(call, gw, st, req->job_id, 0);
  nb_job_record_clear(&rec);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* Streams <work_dir>/<job>/<stream>.log from req's offset as LogChunks (at least one, empty
 * when there is nothing yet); with req->follow until the job is final here. */
static nb_status_t nb__logs_send(nb_rpc_call_t* call, nb_gateway_t* gw, nb_job_store_t* st,
                                 const Nebula__V1__LogsRequest* req) {
  const char* which = req->stream && *req->stream ? req->stream : "stdout";
  if (strcmp(which, "stdout") && strcmp(which, "stderr"))
    return nb_error(NB_ERR_INVALID, "stream must be \"stdout\" or \"stderr\", not '%s'", which);
  if (req->offset < 0) /* it used to read from 0, as if asked for the whole log */
    return nb_error(NB_ERR_INVALID, "Logs: offset %" PRId64 " is negative; give a byte offset >= 0",
                    req->offset);
  nb_job_record_t rec = {0};
  FILE* f = NULL;
  uint8_t* buf = NULL;
  int sent = 0;
  nb_status_t s = NB_OK;
  NB_CHECK(nb_alloc((void**)&buf, 65536, 1, "log chunk"));
  char path[NB_GW_STR + 128];
  snprintf(path, sizeof path, "%s/%s/%s.log", gw->cfg.work_dir, req->job_id, which);
  int64_t off = req->offset;
  for (;;) {
    if (nb_rpc_call_cancelled(call)) {
      s = nb_error(NB_ERR_CANCELLED, "Logs: client went away");
      break;
    }
    int final = 1;
    if (req->follow) {
      s = nb_job_store_get(st, req->job_id, &rec);
      if (s != NB_OK) break;
      final = nb_job_state_is_final(rec.state);
      nb_job_record_clear(&rec);
    }
    if (!f) f = fopen(path, "rbe");
    size_t got = 0;
    if (f && fseeko(f, off, SEEK_SET) == 0) got = fread(buf, 1, 65536, f);
    if (f) clearerr(f);
    if (got) {
      Nebula__V1__LogChunk c = NEBULA__V1__LOG_CHUNK__INIT;
      c.offset = off;
      c.data.data = buf;
      c.data.len = got;
      s = nb_rpc_call_send_pb(call, &c.base);
      if (s != NB_OK) break;
      off += (int64_t)got;
      sent++;
      continue;
    }
    if (final) break; /* the state was read before this last read: nothing more will come */
    nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  if (s == NB_OK && !sent) {
    Nebula__V1__LogChunk c = NEBULA__V1__LOG_CHUNK__INIT; /* empty: the log is empty so far */
    c.offset = off;
    s = nb_rpc_call_send_pb(call, &c.base);
  }
  if (f) fclose(f);
  nb_free(buf);
  return s;
}

/* The origin relays another cluster's output of a job it federates: Federation.Logs at that
 * cluster's gateway, each chunk passed on as it comes. */
static nb_status_t nb__logs_relay(nb_rpc_call_t* call, nb_gateway_t* gw, nb_job_store_t* st,
                                  const Nebula__V1__LogsRequest* req) {
  nb_job_fed_t fed;
  json_t* info = NULL;
  nb_status_t s = nb__fed_load(st, req->job_id, &fed, &info);
  if (s == NB_ERR_NOT_FOUND)
    return nb_error(NB_ERR_NOT_FOUND, "job '%s' runs on cluster '%s' only; no cluster '%s'",
                    req->job_id, gw->cfg.cluster_id, req->cluster);
  NB_CHECK(s);
  int member = json_is_object(json_object_get(json_object_get(info, "clusters"), req->cluster));
  int origin = !strcmp(fed.role, "origin");
  char at[NB_JOB_ID_MAX];
  snprintf(at, sizeof at, "%s", fed.origin);
  nb__fed_release(&fed, info);
  if (!origin)
    return nb_error(NB_ERR_INVALID,
                    "another cluster's output of job '%s' is served by its origin '%s', not here",
                    req->job_id, at);
  if (!member)
    return nb_error(NB_ERR_NOT_FOUND, "job '%s' has no cluster '%s'", req->job_id, req->cluster);
  nb_rpc_client_t* c = nb__peer_client(gw, req->cluster);
  if (!c)
    return nb_error(NB_ERR_INVALID, "cluster '%s' is not a peer of gateway '%s'", req->cluster,
                    gw->cfg.cluster_id);
  Nebula__V1__LogsRequest fwd = *req;
  fwd.cluster = (char*)"";
  nb_rpc_stream_t* rs = NULL;
  int64_t deadline = req->follow ? NB_RPC_INFINITE : (int64_t)gw->cfg.federation_timeout_ms * 30;
  NB_CHECK(nb_rpc_stream_open(c, "/nebula.v1.Federation/Logs", deadline, 0, &rs));
  s = nb_rpc_stream_send_pb(rs, &fwd.base);
  if (s == NB_OK) s = nb_rpc_stream_close_send(rs);
  while (s == NB_OK) {
    ProtobufCMessage* m = NULL;
    int end = 0;
    s = nb_rpc_stream_recv_pb(rs, &nebula__v1__log_chunk__descriptor, &m, &end, 1000);
    if (s == NB_ERR_TIMEOUT) { /* the peer's log is quiet: is our client still there? */
      s = nb_rpc_call_cancelled(call) ? nb_error(NB_ERR_CANCELLED, "Logs: client went away")
                                      : NB_OK;
      continue;
    }
    if (s != NB_OK || end) break;
    s = nb_rpc_call_send_pb(call, m);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  if (s == NB_OK) s = nb_rpc_stream_finish(rs);
  nb_rpc_stream_destroy(rs);
  if (s != NB_OK) return nb_error_wrap(s, "cluster's log");
  return NB_OK;
}

static nb_status_t nb__logs(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* user = "";
  int admin = 0;
  ProtobufCMessage* m = NULL;
  NB_CHECK(nb__request(call, gw, &nebula__v1__logs_request__descriptor, "Logs", &user, &admin, &m));
  Nebula__V1__LogsRequest* req = (Nebula__V1__LogsRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_record_t rec = {0};
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__job_for(st, req->job_id, user, admin, &rec);
  nb_job_record_clear(&rec);
  if (s == NB_OK) {
    if (req->cluster && *req->cluster && strcmp(req->cluster, gw->cfg.cluster_id))
      s = nb__logs_relay(call, gw, st, req);
    else
      s = nb__logs_send(call, gw, st, req);
  }
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* Member: the origin asks for this cluster's output of one of its jobs (`nebula logs
 * --cluster` there). */
static nb_status_t nb__fed_logs(nb_rpc_call_t* call, void* user_data) {
  nb_gateway_t* gw = user_data;
  const char* caller = "";
  ProtobufCMessage* m = NULL;
  NB_CHECK(nb__fed_request(call, gw, &nebula__v1__logs_request__descriptor, "Logs", &caller, &m));
  Nebula__V1__LogsRequest* req = (Nebula__V1__LogsRequest*)m;
  nb_job_store_t* st = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__fed_member(st, req->job_id, caller, &fed, &info);
  if (s == NB_OK) {
    nb__fed_release(&fed, info);
    s = nb__logs_send(call, gw, st, req);
  }
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* ------------------------------------------------------------------ lifecycle */

/* The job folders in work_dir: sub-folders holding a descriptor.json. Counts them and keeps the
 * first name (in directory order) for messages; calls fn on each when given. */
static int nb__job_folders(nb_gateway_t* gw, char* first, size_t cap,
                           void (*fn)(nb_gateway_t*, const char*, void*), void* ctx) {
  DIR* d = opendir(gw->cfg.work_dir);
  int n = 0;
  if (first && cap) first[0] = 0;
  if (!d) return 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.' || strlen(e->d_name) >= NB_JOB_ID_MAX) continue;
    char p[NB_GW_STR + NB_JOB_ID_MAX + 32];
    struct stat sb;
    int w = snprintf(p, sizeof p, "%s/%s/descriptor.json", gw->cfg.work_dir, e->d_name);
    if (w < 0 || (size_t)w >= sizeof p || lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (n++ == 0 && first && cap) snprintf(first, cap, "%s", e->d_name);
    if (fn) fn(gw, e->d_name, ctx);
  }
  closedir(d);
  return n;
}

/* Before the store is opened (which would create an empty one): a missing or empty jobs.db next
 * to job folders means the record of those jobs was lost, and starting would serve an empty
 * gateway over them without a word. Refused; the operator restores or moves them. */
static nb_status_t nb__store_present(nb_gateway_t* gw) {
  struct stat sb, wb;
  char wal[NB_GW_STR + 8];
  snprintf(wal, sizeof wal, "%s-wal", gw->cfg.store_path);
  int missing = stat(gw->cfg.store_path, &sb) != 0 && errno == ENOENT;
  int empty = !missing && S_ISREG(sb.st_mode) && sb.st_size == 0 &&
              (stat(wal, &wb) != 0 || wb.st_size == 0); /* a WAL may hold it all */
  if (!missing && !empty) return NB_OK;
  char first[NB_JOB_ID_MAX];
  int n = nb__job_folders(gw, first, sizeof first, NULL, NULL);
  if (n == 0) return NB_OK; /* a new gateway */
  return nb_error(NB_ERR_INTEGRITY,
                  "gateway: job store %s is %s but work_dir %s holds %d job folder%s (e.g. '%s'): "
                  "starting would forget those jobs; restore jobs.db from a backup, or move the "
                  "job folders out of work_dir to start with an empty store",
                  gw->cfg.store_path, missing ? "missing" : "empty (0 bytes)", gw->cfg.work_dir, n,
                  n == 1 ? "" : "s", first);
}

typedef struct {
  int n;
  char first[NB_JOB_ID_MAX];
} nb__orphans_t;

static void nb__orphan_one(nb_gateway_t* gw, const char* id, void* ctx) {
  nb__orphans_t* o = ctx;
  nb_job_record_t r;
  memset(&r, 0, sizeof r);
  nb_status_t s = nb_job_store_get(gw->mon_store, id, &r);
  if (s == NB_OK)
    nb_job_record_clear(&r);
  else if (s == NB_ERR_NOT_FOUND && o->n++ == 0)
    snprintf(o->first, sizeof o->first, "%s", id);
}

/* Job folders the store has no entry for (a store restored from an older backup, a folder
 * copied in): not served, and said so once at start. */
static void nb__store_orphans(nb_gateway_t* gw) {
  nb__orphans_t o = {0};
  nb__job_folders(gw, NULL, 0, nb__orphan_one, &o);
  if (o.n > 0)
    NB_WARN(
        "gateway: %d job folder%s in %s %s no entry in job store %s (e.g. '%s'): not served; "
        "restore a newer jobs.db, or move the folder%s away",
        o.n, o.n == 1 ? "" : "s", gw->cfg.work_dir, o.n == 1 ? "has" : "have", gw->cfg.store_path,
        o.first, o.n == 1 ? "" : "s");
  nb_error_clear();
}

nb_status_t nb_gateway_create(const nb_gateway_config_t* cfg, nb_gateway_t** out) {
  if (!cfg || !out) return nb_error(NB_ERR_INVALID, "gateway: NULL argument");
  nb_gateway_t* gw = NULL;
  nb_status_t s = NB_OK;
  NB_CHECK(nb_calloc((void**)&gw, 1, sizeof *gw, "gateway"));
  gw->cfg = *cfg;
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&gw->mu, &ma);
  pthread_mutex_init(&gw->lim_mu, NULL);
  pthread_mutexattr_destroy(&ma);
  if (!gw->cfg.cluster_id[0]) {
    s = nb_error(NB_ERR_CONFIG, "gateway: cluster_id is required");
    goto fail;
  }
  ssize_t n = readlink("/proc/self/exe", gw->self_exe, sizeof gw->self_exe - 1);
  if (n > 0) gw->self_exe[n] = 0;
  if (mkdir(gw->cfg.work_dir, 0750) != 0 && errno != EEXIST) {
    s = nb_error(NB_ERR_IO, "gateway: cannot create work_dir %s: %s", gw->cfg.work_dir,
                 strerror(errno));
    goto fail;
  }
  if (gw->cfg.run_as[0]) {
    struct passwd pw, *pr = NULL;
    char pbuf[4096];
    struct stat wd;
    if (getpwnam_r(gw->cfg.run_as, &pw, pbuf, sizeof pbuf, &pr) != 0 || !pr) {
      s = nb_error(NB_ERR_CONFIG, "config: run_as: no user '%s' on this host", gw->cfg.run_as);
      goto fail;
    }
    if (geteuid() != 0 || pr->pw_uid == 0) {
      s = nb_error(NB_ERR_CONFIG,
                   "config: run_as '%s': needs a gateway started as root (it runs as uid %u) "
                   "and a user other than root",
                   gw->cfg.run_as, (unsigned)geteuid());
      goto fail;
    }
    if (gw->cfg.launcher.kind != NB_LAUNCHER_LOCAL) {
      s = nb_error(NB_ERR_CONFIG, "config: run_as works with launcher \"local\" only (for now)");
      goto fail;
    }
    /* the job's user must reach its folder */
    if (stat(gw->cfg.work_dir, &wd) != 0 || !(wd.st_mode & S_IXOTH)) {
      s = nb_error(NB_ERR_CONFIG,
                   "config: run_as '%s': work_dir %s must be searchable by others (chmod o+x), "
                   "or the job's user cannot reach its folder",
                   gw->cfg.run_as, gw->cfg.work_dir);
      goto fail;
    }
    gw->run_as = 1;
    gw->run_uid = pr->pw_uid;
    gw->run_gid = pr->pw_gid;
  }
  if (!gw->cfg.store_path[0])
    snprintf(gw->cfg.store_path, sizeof gw->cfg.store_path, "%.*s/jobs.db", NB_GW_STR - 16,
             gw->cfg.work_dir);
  nb_tls_files_t files = {gw->cfg.tls_ca, gw->cfg.tls_cert, gw->cfg.tls_key};
  NB_CHECK_GOTO(nb_tls_create(&files, &gw->tls), s, fail);
  const nb_tls_peer_t* self = nb_tls_self(gw->tls);
  if (self->kind != NB_TLS_PEER_CLUSTER || strcmp(self->name, gw->cfg.cluster_id)) {
    s = nb_error(NB_ERR_CONFIG, "gateway: tls.cert %s is '%s', not cluster '%s'", gw->cfg.tls_cert,
                 self->name, gw->cfg.cluster_id);
    goto fail;
  }
  NB_CHECK_GOTO(nb_pki_cert_load(gw->cfg.tls_ca, &gw->ca), s, fail);
  NB_CHECK_GOTO(nb__store_present(gw), s, fail);
  {
    /* the store holds job secrets: owner only, and SQLite gives its -wal and -shm files the
     * mode of the database file */
    int fd = open(gw->cfg.store_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    const char* sfx[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
      char p[NB_GW_STR + 8];
      snprintf(p, sizeof p, "%s%s", gw->cfg.store_path, sfx[i]);
      if (chmod(p, 0600) != 0 && errno != ENOENT)
        NB_WARN("gateway: cannot restrict %s to its owner: %s", p, strerror(errno));
    }
  }
  NB_CHECK_GOTO(nb_job_store_open(gw->cfg.store_path, &gw->mon_store), s, fail);
  if ((s = nb_job_store_check(gw->mon_store)) != NB_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", nb_error_last()); /* nb_error writes where it reads */
    s = nb_error(s,
                 "gateway: %s; refusing to start on job store %s: restore it from a backup "
                 "(the job folders in %s are untouched)",
                 why, gw->cfg.store_path, gw->cfg.work_dir);
    goto fail;
  }
  nb__store_orphans(gw);
  NB_CHECK_GOTO(nb_job_store_open(gw->cfg.store_path, &gw->fed_store), s, fail);
  NB_CHECK_GOTO(nb_job_store_open(gw->cfg.store_path, &gw->rep_store), s, fail);
  NB_CHECK_GOTO(nb__recover(gw), s, fail);
  for (int i = 0; i < gw->cfg.n_peers; i++) {
    nb_rpc_client_opts_t co = {0};
    co.tls = gw->tls;
    co.expected_cluster = gw->cfg.peers[i].id;
    NB_CHECK_GOTO(nb_rpc_client_create(gw->cfg.peers[i].address, &co, &gw->peer_cli[i]), s, fail);
  }

  nb_rpc_server_opts_t so = {0};
  so.listen = gw->cfg.listen;
  so.tls = gw->tls;
  NB_CHECK_GOTO(nb_rpc_server_create(&so, &gw->srv), s, fail);
  {
    char adir[NB_GW_STR + 16];
    snprintf(adir, sizeof adir, "%s/artifacts", gw->cfg.work_dir);
    NB_CHECK_GOTO(nb_artifact_store_open(adir, &gw->art), s, fail);
    NB_CHECK_GOTO(nb_artifact_service_add(gw->srv, gw->art, nb__artifact_job, gw), s, fail);
  }
  static const struct {
    const char* m;
    nb_rpc_kind_t k;
    nb_rpc_handler_fn fn;
  } methods[NB__N_METHODS] = {
      {"/nebula.v1.Gateway/Submit", NB_RPC_UNARY, nb__submit},
      {"/nebula.v1.Gateway/Get", NB_RPC_UNARY, nb__get},
      {"/nebula.v1.Gateway/List", NB_RPC_UNARY, nb__list},
      {"/nebula.v1.Gateway/Watch", NB_RPC_SERVER_STREAMING, nb__watch},
      {"/nebula.v1.Gateway/Cancel", NB_RPC_UNARY, nb__cancel},
      {"/nebula.v1.Gateway/Logs", NB_RPC_SERVER_STREAMING, nb__logs},
      {"/nebula.v1.Federation/Propose", NB_RPC_UNARY, nb__fed_propose},
      {"/nebula.v1.Federation/Commit", NB_RPC_UNARY, nb__fed_commit},
      {"/nebula.v1.Federation/Abort", NB_RPC_UNARY, nb__fed_abort},
      {"/nebula.v1.Federation/Cancel", NB_RPC_UNARY, nb__fed_cancel},
      {"/nebula.v1.Federation/Report", NB_RPC_UNARY, nb__fed_report},
      {"/nebula.v1.Federation/Logs", NB_RPC_SERVER_STREAMING, nb__fed_logs},
  };
  for (size_t i = 0; i < NB__N_METHODS; i++) {
    gw->hand[i].gw = gw;
    gw->hand[i].fn = methods[i].fn;
    NB_CHECK_GOTO(
        nb_rpc_server_add_method(gw->srv, methods[i].m, methods[i].k, nb__limited, &gw->hand[i]), s,
        fail);
  }
  if (pthread_create(&gw->mon, NULL, nb__monitor, gw) != 0) {
    s = nb_error(NB_ERR_SYSTEM, "gateway: cannot start the monitor thread");
    goto fail;
  }
  gw->mon_started = 1;
  if (pthread_create(&gw->fed, NULL, nb__fed_loop, gw) != 0) {
    s = nb_error(NB_ERR_SYSTEM, "gateway: cannot start the federation thread");
    goto fail;
  }
  gw->fed_started = 1;
  if (pthread_create(&gw->rep, NULL, nb__report_loop, gw) != 0) {
    s = nb_error(NB_ERR_SYSTEM, "gateway: cannot start the report thread");
    goto fail;
  }
  gw->rep_started = 1;
  NB_CHECK_GOTO(nb_rpc_server_start(gw->srv), s, fail);
  *out = gw;
  return NB_OK;
fail:
  nb_gateway_destroy(gw);
  return s;
}

int nb_gateway_port(const nb_gateway_t* gw) {
  return gw && gw->srv ? nb_rpc_server_port(gw->srv) : 0;
}

void nb_gateway_destroy(nb_gateway_t* gw) {
  if (!gw) return;
  nb_rpc_server_destroy(gw->srv);
  gw->stopping = 1;
  if (gw->mon_started) pthread_join(gw->mon, NULL);
  if (gw->fed_started) pthread_join(gw->fed, NULL);
  if (gw->rep_started) pthread_join(gw->rep, NULL);
  for (int i = 0; i < gw->cfg.n_peers; i++) nb_rpc_client_destroy(gw->peer_cli[i]);
  nb_job_store_close(gw->fed_store);
  nb_job_store_close(gw->rep_store);
  nb_job_store_close(gw->mon_store);
  nb_artifact_store_close(gw->art);
  if (gw->ca) X509_free(gw->ca);
  nb_tls_destroy(gw->tls);
  pthread_mutex_destroy(&gw->mu);
  pthread_mutex_destroy(&gw->lim_mu);
  nb_free(gw);
}
