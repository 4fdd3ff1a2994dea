/* The gateway's config file (gateway/gateway.h): one option table (name, type, bounds, help)
 * that reads the JSON file and prints `nebula gateway --help`, and the defaults. Not here: what
 * the daemon does with the values. */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "jobs/cli_checks.h"
#include "security/pki.h"

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
  const char* note; /* shown by --help after the default, which nb_gateway_config_defaults
                       sets ("": none); in place of an empty one */
  const char* help;
} nb__opt_t;

#define NB__F(f) offsetof(nb_gateway_config_t, f), sizeof(((nb_gateway_config_t*)0)->f)

static const nb__opt_t nb__opts[] = {
    {"cluster_id", NB__OPT_STR, NB__F(cluster_id), 0, 0, "(required)",
     "this cluster's id; must be the identity in tls.cert"},
    {"listen", NB__OPT_STR, NB__F(listen), 0, 0, "",
     "address of the Gateway service (\":0\" picks a free port)"},
    {"tls.ca", NB__OPT_PATH, NB__F(tls_ca), 0, 0, "(required)",
     "federation CA certificate (PEM): verifies clients and descriptor signers"},
    {"tls.cert", NB__OPT_PATH, NB__F(tls_cert), 0, 0, "(required)",
     "this gateway's cluster certificate (PEM)"},
    {"tls.key", NB__OPT_PATH, NB__F(tls_key), 0, 0, "(required)", "its private key (PEM)"},
    {"peers", NB__OPT_PEERS, NB__F(peers), 0, 0, "",
     "peer gateways, cluster id -> \"host:port\" (kept for federation)"},
    {"launcher", NB__OPT_LAUNCHER, NB__F(launcher), 0, 0, "",
     "how jobs start: \"local\" (the command once), \"mpirun\" (mpirun -np {workers}), "
     "\"slurm\" (sbatch)"},
    {"mpirun.args", NB__OPT_LIST, NB__F(launcher.mpirun_args), 0, 0, "",
     "extra mpirun flags (launcher mpirun), e.g. [\"-x\", \"GLIBC_TUNABLES\"]"},
    {"slurm.partition", NB__OPT_STR, NB__F(launcher.partition), 0, 0, "",
     "#SBATCH --partition (launcher slurm; empty: Slurm's default)"},
    {"slurm.account", NB__OPT_STR, NB__F(launcher.account), 0, 0, "",
     "#SBATCH --account (empty: none)"},
    {"slurm.sbatch_args", NB__OPT_LIST, NB__F(launcher.sbatch_args), 0, 0, "",
     "extra #SBATCH lines, e.g. [\"--time=60\"]"},
    {"slurm.srun_args", NB__OPT_LIST, NB__F(launcher.srun_args), 0, 0, "",
     "extra srun flags, e.g. [\"--mpi=pmix\"]"},
    {"slurm.step", NB__OPT_STR, NB__F(launcher.slurm_step), 0, 0, "",
     "how the batch script starts the ranks: \"srun\" or \"mpirun\" (OpenMPI in the allocation)"},
    {"slurm.poll_ms", NB__OPT_INT, NB__F(launcher.slurm_poll_ms), 50, 5000, "",
     "at most one squeue per job this often"},
    {"command", NB__OPT_ARGV, NB__F(command), 0, 0, "",
     "job command; {descriptor} {jobdir} {job} {cluster} {workers} {nebula} are replaced"},
    {"worker_command", NB__OPT_WARGV, NB__F(worker_command), 0, 0, "",
     "one cluster of a multi-cluster job; also {listen} {pki} {secret_file} {peers}"},
    {"exchange_host", NB__OPT_STR, NB__F(exchange_host), 0, 0, "",
     "host this cluster's workers listen on for Exchange (the port is chosen per job); "
     "0.0.0.0 or :: needs exchange.advertise"},
    {"exchange.port_range", NB__OPT_STR, NB__F(exchange_port_range), 0, 0, "(any free port)",
     "\"LO-HI\": each job's Exchange port is one of LO..HI (1024..65535) not in use, so that a "
     "firewall opens only these; a submit when all are taken is refused"},
    {"exchange.advertise", NB__OPT_STR, NB__F(exchange_advertise), 0, 0, "(exchange_host)",
     "host (name or address) the peer clusters are told to dial for this cluster's Exchange: "
     "its public name behind NAT, a load balancer or a Kubernetes Service"},
    {"federation_timeout_ms", NB__OPT_INT, NB__F(federation_timeout_ms), 100, 600000, "",
     "deadline of one call to a peer gateway"},
    {"artifacts.max_put_bytes", NB__OPT_INT, NB__F(max_put_bytes), 1, 2147483647, "",
     "largest file a user may put into this gateway's artifact store (nebula artifact put)"},
    {"resources.slots", NB__OPT_INT, NB__F(slots), 1, 1 << 20, "",
     "workers run at once over all jobs; a submit beyond is refused"},
    {"resources.device", NB__OPT_DEVICE, NB__F(device), 0, 0, "",
     "device of this cluster: \"cpu\" or \"cuda\""},
    {"store", NB__OPT_PATH, NB__F(store_path), 0, 0, "<work_dir>/jobs.db", "SQLite job store"},
    {"work_dir", NB__OPT_PATH, NB__F(work_dir), 0, 0, "",
     "jobs run in <work_dir>/<job-id>/ (logs, exit status, progress)"},
    {"acl", NB__OPT_ACL, NB__F(acl), 0, 0, "(nobody)",
     "[{\"user\": NAME|\"*\", \"clusters\": [ID|\"*\"], \"max_workers\": N}]"},
    {"admins", NB__OPT_USERS, NB__F(admins), 0, 0, "", "users who may read and cancel every job"},
    {"limits.calls_per_identity", NB__OPT_INT, NB__F(calls_per_identity), 1, 4096, "",
     "calls (Watch and Logs streams included) one user or cluster certificate may have in "
     "flight at once; more get RESOURCE_EXHAUSTED. Keep it well under NB_RPC_MAX_CALLS"},
    {"run_as", NB__OPT_STR, NB__F(run_as), 0, 0, "",
     "user the jobs' processes run as (setpriv), for a gateway started as root; launcher local "
     "only; \"\" = the gateway's own user"},
    {"paths.allow", NB__OPT_PATHS, NB__F(allow), 0, 0, "",
     "folders besides the job's own that descriptor paths may name (data roots, a shared model "
     "store); read only: checkpoint.dir stays inside the job's folder"},
    {"cancel_grace_ms", NB__OPT_INT, NB__F(cancel_grace_ms), 0, 600000, "",
     "SIGTERM to the job's process group, SIGKILL after this"},
    {"poll_ms", NB__OPT_INT, NB__F(poll_ms), 10, 10000, "",
     "how often job processes and progress files are checked"},
    {"metrics.listen", NB__OPT_STR, NB__F(metrics_listen), 0, 0, "(off)",
     "Prometheus metrics at http://HOST:PORT/metrics (docs/operations.md), e.g. "
     "\"127.0.0.1:9464\"; port 0 picks a free one; plain HTTP, so keep it on loopback or a "
     "trusted network"},
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
  c->max_put_bytes = 256 << 20;
  c->slots = 4;
  c->device = NB_JOB_DEVICE_CPU;
  snprintf(c->work_dir, sizeof c->work_dir, "work");
  c->cancel_grace_ms = 5000;
  c->poll_ms = 100;
  c->calls_per_identity = 16;
}

/* Appends words[0..n) to buf as a JSON array of strings. */
static void nb__opt_words(char* buf, size_t cap, const char (*words)[NB_GW_STR], int n,
                          size_t stride) {
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s\"%s\"", i ? "," : "",
                          (const char*)words + (size_t)i * stride);
  if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* The default of option o as --help shows it, read from d (nb_gateway_config_defaults). */
static const char* nb__opt_default(const nb__opt_t* o, const nb_gateway_config_t* d, char* buf,
                                   size_t cap) {
  const char* p = (const char*)d + o->offset;
  switch (o->type) {
    case NB__OPT_STR:
    case NB__OPT_PATH:
      if (!*p) return *o->note ? "" : "\"\"";
      snprintf(buf, cap, "%s", p);
      return buf;
    case NB__OPT_INT:
      snprintf(buf, cap, "%d", *(const int*)p);
      return buf;
    case NB__OPT_LAUNCHER:
      return nb_launcher_name(d->launcher.kind);
    case NB__OPT_DEVICE:
      return d->device == NB_JOB_DEVICE_CUDA ? "cuda" : "cpu";
    case NB__OPT_LIST: {
      const nb_launcher_args_t* l = (const nb_launcher_args_t*)p;
      nb__opt_words(buf, cap, (const char(*)[NB_GW_STR])l->v, l->n, sizeof l->v[0]);
      return buf;
    }
    case NB__OPT_ARGV:
      nb__opt_words(buf, cap, d->command, d->n_command, sizeof d->command[0]);
      return buf;
    case NB__OPT_WARGV:
      nb__opt_words(buf, cap, d->worker_command, d->n_worker_command, sizeof d->worker_command[0]);
      return buf;
    case NB__OPT_PEERS:
      return d->n_peers ? "(set)" : "{}";
    case NB__OPT_ACL:
    case NB__OPT_USERS:
    case NB__OPT_PATHS:
      return "[]"; /* nb_gateway_config_defaults leaves them empty */
  }
  return "?";
}

void nb_gateway_config_help(FILE* f) {
  nb_gateway_config_t d;
  nb_gateway_config_defaults(&d);
  fprintf(f, "config file keys (JSON; a dotted key is a nested object):\n");
  for (size_t i = 0; i < NB__N_OPTS; i++) {
    static const char* tn[] = {"string", "path",   "integer", "[string]", "{id: addr}", "[rule]",
                               "[user]", "string", "string",  "[string]", "[string]",   "[path]"};
    _Static_assert(sizeof tn / sizeof tn[0] == NB__OPT_PATHS + 1, "a name for every type");
    char buf[2048];
    const char* def = nb__opt_default(&nb__opts[i], &d, buf, sizeof buf);
    const char* note = nb__opts[i].note;
    fprintf(f, "  %-18s %-10s default %s%s%s\n      %s\n", nb__opts[i].name, tn[nb__opts[i].type],
            def, *def && *note ? " " : "", note, nb__opts[i].help);
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

/* an array of strings into an nb_launcher_args_t (mpirun.args, slurm.*_args). */
static nb_status_t nb__cfg_list(const nb__opt_t* o, json_t* v, const char* base, char* p,
                                nb_gateway_config_t* c) {
  nb_launcher_args_t* l = (nb_launcher_args_t*)p;
  size_t n = json_is_array(v) ? json_array_size(v) : (size_t)-1;
  if (n > NB_LAUNCH_MAX_ARGS)
    return nb_error(NB_ERR_CONFIG, "config: %s: expected an array of at most %d strings", o->name,
                    NB_LAUNCH_MAX_ARGS);
  for (size_t i = 0; i < n; i++) {
    char key[128];
    snprintf(key, sizeof key, "%s[%zu]", o->name, i);
    NB_CHECK(nb__cfg_str(key, json_array_get(v, i), l->v[i], NB_LAUNCH_ARG, NULL));
  }
  l->n = (int)n;
  return NB_OK;
}

/* a command template: command or worker_command. */
static nb_status_t nb__cfg_argv(const nb__opt_t* o, json_t* v, const char* base, char* p,
                                nb_gateway_config_t* c) {
  int worker = o->type == NB__OPT_WARGV;
  size_t n = json_is_array(v) ? json_array_size(v) : 0;
  if (n < 1 || n > NB_GW_MAX_ARGS)
    return nb_error(NB_ERR_CONFIG, "config: %s: expected an array of 1..%d strings", o->name,
                    NB_GW_MAX_ARGS);
  for (size_t i = 0; i < n; i++) {
    char key[64];
    snprintf(key, sizeof key, "%s[%zu]", o->name, i);
    NB_CHECK(nb__cfg_str(key, json_array_get(v, i), worker ? c->worker_command[i] : c->command[i],
                         NB_GW_STR, NULL));
  }
  if (worker)
    c->n_worker_command = (int)n;
  else
    c->n_command = (int)n;
  return NB_OK;
}

/* paths.allow: folders, relative to the config file's. */
static nb_status_t nb__cfg_paths(const nb__opt_t* o, json_t* v, const char* base, char* p,
                                 nb_gateway_config_t* c) {
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

/* admins: user names. */
static nb_status_t nb__cfg_users(const nb__opt_t* o, json_t* v, const char* base, char* p,
                                 nb_gateway_config_t* c) {
  size_t n = json_is_array(v) ? json_array_size(v) : (size_t)-1;
  if (n > NB_GW_MAX_ADMINS)
    return nb_error(NB_ERR_CONFIG, "config: admins: expected an array of at most %d names",
                    NB_GW_MAX_ADMINS);
  for (size_t i = 0; i < n; i++)
    NB_CHECK(nb__cfg_str("admins[]", json_array_get(v, i), c->admins[i], NB_ACL_NAME_MAX, NULL));
  c->n_admins = (int)n;
  return NB_OK;
}

/* peers: cluster id -> "host:port". */
static nb_status_t nb__cfg_peers(const nb__opt_t* o, json_t* v, const char* base, char* p,
                                 nb_gateway_config_t* c) {
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

/* acl: the rules {"user", "clusters", "max_workers"}. */
static nb_status_t nb__cfg_acl(const nb__opt_t* o, json_t* v, const char* base, char* p,
                               nb_gateway_config_t* c) {
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
          return nb_error(NB_ERR_CONFIG, "config: acl[%zu].clusters[%zu]: expected a string", i, j);
        n++;
      }
    }
    if (mw &&
        (!json_is_integer(mw) || json_integer_value(mw) < 0 || json_integer_value(mw) > (1 << 20)))
      return nb_error(NB_ERR_CONFIG, "config: acl[%zu].max_workers: expected an integer >= 0", i);
    if (nb_acl_add(&c->acl, json_string_value(u), cls, n, mw ? (int)json_integer_value(mw) : 0) !=
        NB_OK)
      return nb_error_wrap(NB_ERR_CONFIG, "config: acl[%zu]", i);
  }
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
    case NB__OPT_LIST:
      return nb__cfg_list(o, v, base, p, c);
    case NB__OPT_ARGV:
    case NB__OPT_WARGV:
      return nb__cfg_argv(o, v, base, p, c);
    case NB__OPT_PATHS:
      return nb__cfg_paths(o, v, base, p, c);
    case NB__OPT_USERS:
      return nb__cfg_users(o, v, base, p, c);
    case NB__OPT_PEERS:
      return nb__cfg_peers(o, v, base, p, c);
    case NB__OPT_ACL:
      return nb__cfg_acl(o, v, base, p, c);
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

/* A host as exchange_host and exchange.advertise take it: a name or an address, "[v6]" or a
 * bare v6 address, no port and no space. */
static nb_status_t nb__cfg_host(const char* key, const char* h) {
  size_t n = strlen(h);
  if (!n) return nb_error(NB_ERR_CONFIG, "config: %s: empty host", key);
  const char* c1 = strchr(h, ':');
  int v6 = h[0] == '[' || (c1 && strchr(c1 + 1, ':')); /* a v6 address has two colons or more */
  if (h[0] == '[' && (n < 3 || h[n - 1] != ']'))
    return nb_error(NB_ERR_CONFIG, "config: %s: '%s' is not a host ([v6] unclosed)", key, h);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)h[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '-' || ch == '_' || (v6 && (ch == ':' || ch == '[' || ch == ']'));
    if (!ok)
      return nb_error(NB_ERR_CONFIG,
                      "config: %s: '%s' is not a host name or address (a port goes in "
                      "exchange.port_range, not here)",
                      key, h);
  }
  return NB_OK;
}

/* exchange_host, exchange.port_range and exchange.advertise together. */
static nb_status_t nb__cfg_exchange(nb_gateway_config_t* c) {
  NB_CHECK(nb__cfg_host("exchange_host", c->exchange_host));
  c->exchange_port_lo = c->exchange_port_hi = 0;
  const char* r = c->exchange_port_range;
  if (r[0]) {
    char* e = NULL;
    long lo = -1, hi = -1;
    if (r[0] >= '0' && r[0] <= '9') lo = strtol(r, &e, 10);
    if (e && *e == '-' && e[1] >= '0' && e[1] <= '9') hi = strtol(e + 1, &e, 10);
    if (lo < 0 || hi < 0 || !e || *e)
      return nb_error(NB_ERR_CONFIG,
                      "config: exchange.port_range: '%s' is not \"LO-HI\" (e.g. \"41000-41099\")",
                      r);
    if (lo < 1024 || hi > 65535 || lo > hi)
      return nb_error(NB_ERR_CONFIG,
                      "config: exchange.port_range: '%s' must have 1024 <= LO <= HI <= 65535", r);
    c->exchange_port_lo = (int)lo;
    c->exchange_port_hi = (int)hi;
  }
  if (c->exchange_advertise[0]) {
    NB_CHECK(nb__cfg_host("exchange.advertise", c->exchange_advertise));
    const char* a = c->exchange_advertise;
    if (!strcmp(a, "0.0.0.0") || !strcmp(a, "::") || !strcmp(a, "[::]"))
      return nb_error(NB_ERR_CONFIG,
                      "config: exchange.advertise: '%s' is a wildcard; give the name or address "
                      "the peer clusters reach this one at",
                      a);
  } else {
    const char* h = c->exchange_host;
    if (!strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "[::]"))
      return nb_error(NB_ERR_CONFIG,
                      "config: exchange.advertise: required when exchange_host is the wildcard "
                      "'%s' (peers cannot dial it): give the name or address they reach this "
                      "cluster at",
                      h);
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
  if (cfg->metrics_listen[0]) {
    if (!strncmp(cfg->metrics_listen, "unix:", 5))
      return nb_error(NB_ERR_CONFIG,
                      "config: metrics.listen: expected HOST:PORT, not a unix: "
                      "socket (Prometheus scrapes over TCP)");
    NB_CHECK(nb_cli_addr_check(cfg->metrics_listen, 1, "config: metrics.listen"));
    if (!strcmp(cfg->metrics_listen, cfg->listen) && !strstr(cfg->listen, ":0"))
      return nb_error(NB_ERR_CONFIG,
                      "config: metrics.listen: %s is the Gateway service's own "
                      "address (listen); give the metrics a port of their own",
                      cfg->metrics_listen);
  }
  NB_CHECK(nb__cfg_exchange(cfg));
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
