/* The gateway daemon (jobs/gateway.h): config option table, the nebula.v1.Gateway handlers, the
 * process monitor that turns process exits and progress lines into job events, and recovery after
 * a restart. Not here: federation with peers (a job naming another cluster is refused for now),
 * scheduling beyond a slot count. How workers start is jobs/launcher.h's business. */
#include "jobs/gateway.h"

#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "jobs/cli.h"
#include "jobs/descriptor.h"
#include "jobs/store.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/pki.h"
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
  c->slots = 4;
  c->device = NB_JOB_DEVICE_CPU;
  snprintf(c->work_dir, sizeof c->work_dir, "work");
  c->cancel_grace_ms = 5000;
  c->poll_ms = 100;
}

void nb_gateway_config_help(FILE* f) {
  fprintf(f, "config file keys (JSON; a dotted key is a nested object):\n");
  for (size_t i = 0; i < NB__N_OPTS; i++) {
    static const char* tn[] = {"string", "path",   "integer", "[string]", "{id: addr}",
                               "[rule]", "[user]", "string",  "string",   "[string]"};
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
    case NB__OPT_ARGV: {
      size_t n = json_is_array(v) ? json_array_size(v) : 0;
      if (n < 1 || n > NB_GW_MAX_ARGS)
        return nb_error(NB_ERR_CONFIG, "config: command: expected an array of 1..%d strings",
                        NB_GW_MAX_ARGS);
      for (size_t i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "command[%zu]", i);
        NB_CHECK(nb__cfg_str(key, json_array_get(v, i), c->command[i], NB_GW_STR, NULL));
      }
      c->n_command = (int)n;
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
  nb_launch_t launch;
  int own_child; /* 1: we forked it and reap it; 0: re-attached after a restart */
  int workers;
  long progress_off;
  int progress_skip;       /* lines already recorded before a restart */
  char cancel_reason[512]; /* set by Cancel: the end is recorded as cancelled with this */
} nb__active_t;

#define NB__MAX_ACTIVE 256

struct nb_gateway {
  nb_gateway_config_t cfg;
  char self_exe[NB_GW_STR];
  nb_tls_t* tls;
  X509* ca;
  nb_rpc_server_t* srv;
  nb_job_store_t* mon_store; /* monitor thread's own handle */
  pthread_t mon;
  int mon_started;
  _Atomic int stopping;
  pthread_mutex_t mu;
  nb__active_t active[NB__MAX_ACTIVE];
  int n_active;
};

static int nb__active_find(nb_gateway_t* gw, const char* id) {
  for (int i = 0; i < gw->n_active; i++)
    if (!strcmp(gw->active[i].id, id)) return i;
  return -1;
}

static void nb__jobdir(const nb_gateway_t* gw, const char* id, char* buf, size_t n) {
  snprintf(buf, n, "%s/%s", gw->cfg.work_dir, id);
}

/* Appends new complete lines of the job's progress file as "progress" events. */
static void nb__tail_progress(nb_gateway_t* gw, nb_job_store_t* store, nb__active_t* a) {
  char path[sizeof a->dir + 32];
  snprintf(path, sizeof path, "%s/%s", a->dir, NB_LAUNCH_PROGRESS);
  FILE* f = fopen(path, "re");
  if (!f) return;
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
  if (nb_job_store_get(store, a->id, &rec) == NB_OK && rec.state == NB_JOB_RUNNING) {
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
    if (nb_job_store_transition(store, a->id, to, reason) != NB_OK)
      NB_WARN("job %s: cannot record its end: %s", a->id, nb_error_last());
  }
  nb_job_record_clear(&rec);
}

static void* nb__monitor(void* arg) {
  nb_gateway_t* gw = arg;
  while (!gw->stopping) {
    pthread_mutex_lock(&gw->mu);
    for (int i = 0; i < gw->n_active; i++) {
      nb__active_t* a = &gw->active[i];
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
    pthread_mutex_unlock(&gw->mu);
    nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  return NULL;
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
    if (!strcmp(ev[i].kind, "progress")) (*progress)++;
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
  return NB_OK;
}

/* ------------------------------------------------------------------ handlers */

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
  if (nb_job_state_is_final(rec.state) && nb_job_store_events(st, id, 0, 0, &ev, &n) == NB_OK) {
    for (size_t i = 0; i < n; i++) {
      if (strcmp(ev[i].kind, "exit")) continue;
      json_t* j = json_loads(ev[i].payload, 0, NULL);
      if (j) m.exit_code = (int32_t)json_integer_value(json_object_get(j, "exit_code"));
      json_decref(j);
    }
    nb_job_events_free(ev, n);
  }
  nb_status_t s = nb_rpc_call_send_pb(call, &m.base);
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

/* Creates the job's folder and files and starts its process; on NB_OK the job is running and
 * registered with the monitor. */
static nb_status_t nb__launch(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                              const Nebula__V1__SubmitRequest* req, int workers) {
  nb__active_t a;
  memset(&a, 0, sizeof a);
  snprintf(a.id, sizeof a.id, "%s", id);
  a.workers = workers;
  nb__jobdir(gw, id, a.dir, sizeof a.dir);
  if (mkdir(a.dir, 0750) != 0)
    return nb_error(NB_ERR_IO, "cannot create job folder %s: %s", a.dir, strerror(errno));
  char path[sizeof a.dir + 32], wk[16];
  snprintf(path, sizeof path, "%s/descriptor.json", a.dir);
  NB_CHECK(nb__write_file(path, req->descriptor.data, req->descriptor.len));
  char* b64 = NULL;
  if (nb_b64_encode(req->signature.data, req->signature.len, &b64) == NB_OK) {
    char sp[sizeof path];
    snprintf(sp, sizeof sp, "%s/descriptor.sig", a.dir);
    nb__write_file(sp, b64, strlen(b64));
    nb_free(b64);
    snprintf(sp, sizeof sp, "%s/signer.pem", a.dir);
    nb__write_file(sp, req->cert_pem, strlen(req->cert_pem));
  }
  snprintf(wk, sizeof wk, "%d", workers);
  const char* keys[] = {"{descriptor}", "{jobdir}", "{job}", "{cluster}", "{workers}", "{nebula}"};
  const char* vals[] = {path, a.dir, id, gw->cfg.cluster_id, wk, gw->self_exe};
  static char words[NB_GW_MAX_ARGS][NB_GW_STR * 2]; /* guarded by gw->mu below */
  char* argv[NB_GW_MAX_ARGS + 1];
  char env0[128], env1[NB_GW_STR * 2], env2[NB_GW_STR * 2], env3[128];
  snprintf(env0, sizeof env0, "NB_JOB_ID=%s", id);
  snprintf(env1, sizeof env1, "NB_JOB_DIR=%s", a.dir);
  snprintf(env2, sizeof env2, "NB_JOB_PROGRESS=%s/%s", a.dir, NB_LAUNCH_PROGRESS);
  snprintf(env3, sizeof env3, "NB_CLUSTER_ID=%s", gw->cfg.cluster_id);
  char* env[] = {env0, env1, env2, env3, NULL};
  pthread_mutex_lock(&gw->mu);
  for (int i = 0; i < gw->cfg.n_command; i++) {
    if (i == 0 && !strcmp(gw->cfg.command[0], "nebula"))
      snprintf(words[0], sizeof words[0], "%s", gw->self_exe);
    else
      nb__subst(gw->cfg.command[i], words[i], sizeof words[i], keys, vals, 6);
    argv[i] = words[i];
  }
  argv[gw->cfg.n_command] = NULL;
  /* the slot check again, under the lock: two submits may have raced past the first one */
  int used = 0;
  for (int i = 0; i < gw->n_active; i++) used += gw->active[i].workers;
  nb_status_t s;
  if (gw->n_active >= NB__MAX_ACTIVE)
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
    gw->active[gw->n_active++] = a;
  }
  pthread_mutex_unlock(&gw->mu);
  return s;
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
  /* Which clusters: this one only, until federation exists. */
  nb_acl_want_t want[NB_JOB_MAX_CLUSTERS];
  int mine = -1;
  for (int i = 0; i < cfg->n_clusters; i++) {
    want[i].cluster = cfg->clusters[i].id;
    want[i].workers = cfg->clusters[i].workers;
    if (!strcmp(cfg->clusters[i].id, gw->cfg.cluster_id)) mine = i;
  }
  s = nb_acl_check(&gw->cfg.acl, user, want, (size_t)cfg->n_clusters);
  if (s != NB_OK) goto done;
  if (mine < 0) {
    s = nb_error(NB_ERR_INVALID,
                 "the job runs on cluster '%s' but this gateway is cluster '%s' (submitting to a "
                 "peer's cluster needs federation, not available yet)",
                 cfg->clusters[0].id, gw->cfg.cluster_id);
    goto done;
  }
  if (cfg->n_clusters > 1) {
    s = nb_error(NB_ERR_UNSUPPORTED,
                 "the job spans %d clusters: multi-cluster jobs need federation between gateways, "
                 "which this gateway does not offer yet",
                 cfg->n_clusters);
    goto done;
  }
  if (cfg->clusters[mine].device == NB_JOB_DEVICE_CUDA && gw->cfg.device != NB_JOB_DEVICE_CUDA) {
    s = nb_error(NB_ERR_INVALID, "$.spec.clusters[%d].device: cluster '%s' has no cuda devices",
                 mine, gw->cfg.cluster_id);
    goto done;
  }
  int used = 0;
  pthread_mutex_lock(&gw->mu);
  for (int i = 0; i < gw->n_active; i++) used += gw->active[i].workers;
  pthread_mutex_unlock(&gw->mu);
  if (used + cfg->clusters[mine].workers > gw->cfg.slots) {
    s = nb_error(
        NB_ERR_UNAVAILABLE, "cluster '%s' has %d free worker slots of %d, the job needs %d",
        gw->cfg.cluster_id, gw->cfg.slots - used, gw->cfg.slots, cfg->clusters[mine].workers);
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
  s = nb__launch(gw, st, id, req, cfg->clusters[mine].workers);
  if (s != NB_OK) {
    char reason[512];
    snprintf(reason, sizeof reason, "launch failed: %s", nb_error_last());
    nb_job_store_transition(st, id, NB_JOB_FAILED, reason);
    NB_WARN("job %s: %s", id, reason);
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
    nb_job_event_t* ev = NULL;
    size_t n = 0;
    s = nb_job_store_events(st, req->job_id, after, 256, &ev, &n);
    for (size_t i = 0; s == NB_OK && i < n; i++) {
      s = nb__send_event(call, req->job_id, &ev[i]);
      after = ev[i].seq;
      sent++;
    }
    nb_job_events_free(ev, n);
    if (s != NB_OK || (final && n == 0)) break;
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
  nb_status_t s = nb__open_store(gw, &st);
  if (s == NB_OK) s = nb__job_for(st, req->job_id, user, admin, &rec);
  if (s == NB_OK && !nb_job_state_is_final(rec.state)) {
    char reason[512];
    snprintf(reason, sizeof reason, "cancelled by %s%s%.300s", user,
             req->reason && *req->reason ? ": " : "", req->reason ? req->reason : "");
    /* A job with processes: the monitor records the end (exit event, then `cancelled`) once
     * they are gone, and retires the entry, which frees its slots before we answer. */
    pthread_mutex_lock(&gw->mu);
    int k = nb__active_find(gw, req->job_id);
    nb_launch_t launch;
    if (k >= 0) launch = gw->active[k].launch;
    if (k >= 0) memcpy(gw->active[k].cancel_reason, reason, sizeof reason);
    pthread_mutex_unlock(&gw->mu);
    if (k >= 0) {
      int killed = 0;
      char what[64];
      s = nb_launcher_cancel(&launch, gw->cfg.cancel_grace_ms, &killed);
      NB_INFO(JOB, "job %s: %s stopped%s", req->job_id,
              nb_launcher_describe(&launch, what, sizeof what), killed ? " with SIGKILL" : "");
      int64_t until = nb_now_ns() + 5000000000LL + (int64_t)gw->cfg.poll_ms * 4000000;
      for (;;) {
        pthread_mutex_lock(&gw->mu);
        k = nb__active_find(gw, req->job_id);
        pthread_mutex_unlock(&gw->mu);
        if (k < 0 || s != NB_OK) break;
        if (nb_now_ns() > until) {
          s = nb_error(NB_ERR_TIMEOUT,
                       "job %s: its processes are gone but the end was not "
                       "recorded in time",
                       req->job_id);
          break;
        }
        nb_sleep_ns(5000000);
      }
    } else {
      s = nb_job_store_transition(st, req->job_id, NB_JOB_CANCELLED, reason);
      if (s == NB_ERR_INVALID) s = NB_OK; /* it reached a final state meanwhile */
    }
  }
  if (s == NB_OK) s = nb__send_job(call, gw, st, req->job_id, 0);
  nb_job_record_clear(&rec);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
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
  FILE* f = NULL;
  uint8_t* buf = NULL;
  int sent = 0;
  const char* which = req->stream && *req->stream ? req->stream : "stdout";
  nb_status_t s = NB_OK;
  if (strcmp(which, "stdout") && strcmp(which, "stderr")) {
    s = nb_error(NB_ERR_INVALID, "stream must be \"stdout\" or \"stderr\", not '%s'", which);
    goto done;
  }
  NB_CHECK_GOTO(nb__open_store(gw, &st), s, done);
  NB_CHECK_GOTO(nb__job_for(st, req->job_id, user, admin, &rec), s, done);
  nb_job_record_clear(&rec);
  NB_CHECK_GOTO(nb_alloc((void**)&buf, 65536, 1, "log chunk"), s, done);
  char path[NB_GW_STR + 128];
  snprintf(path, sizeof path, "%s/%s/%s.log", gw->cfg.work_dir, req->job_id, which);
  int64_t off = req->offset > 0 ? req->offset : 0;
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
done:
  if (f) fclose(f);
  nb_free(buf);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* ------------------------------------------------------------------ lifecycle */

nb_status_t nb_gateway_create(const nb_gateway_config_t* cfg, nb_gateway_t** out) {
  if (!cfg || !out) return nb_error(NB_ERR_INVALID, "gateway: NULL argument");
  nb_gateway_t* gw = NULL;
  nb_status_t s = NB_OK;
  NB_CHECK(nb_calloc((void**)&gw, 1, sizeof *gw, "gateway"));
  gw->cfg = *cfg;
  pthread_mutex_init(&gw->mu, NULL);
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
  NB_CHECK_GOTO(nb_job_store_open(gw->cfg.store_path, &gw->mon_store), s, fail);
  NB_CHECK_GOTO(nb__recover(gw), s, fail);

  nb_rpc_server_opts_t so = {0};
  so.listen = gw->cfg.listen;
  so.tls = gw->tls;
  NB_CHECK_GOTO(nb_rpc_server_create(&so, &gw->srv), s, fail);
  static const struct {
    const char* m;
    nb_rpc_kind_t k;
    nb_rpc_handler_fn fn;
  } methods[] = {
      {"/nebula.v1.Gateway/Submit", NB_RPC_UNARY, nb__submit},
      {"/nebula.v1.Gateway/Get", NB_RPC_UNARY, nb__get},
      {"/nebula.v1.Gateway/List", NB_RPC_UNARY, nb__list},
      {"/nebula.v1.Gateway/Watch", NB_RPC_SERVER_STREAMING, nb__watch},
      {"/nebula.v1.Gateway/Cancel", NB_RPC_UNARY, nb__cancel},
      {"/nebula.v1.Gateway/Logs", NB_RPC_SERVER_STREAMING, nb__logs},
  };
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
    NB_CHECK_GOTO(nb_rpc_server_add_method(gw->srv, methods[i].m, methods[i].k, methods[i].fn, gw),
                  s, fail);
  if (pthread_create(&gw->mon, NULL, nb__monitor, gw) != 0) {
    s = nb_error(NB_ERR_SYSTEM, "gateway: cannot start the monitor thread");
    goto fail;
  }
  gw->mon_started = 1;
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
  nb_job_store_close(gw->mon_store);
  if (gw->ca) X509_free(gw->ca);
  nb_tls_destroy(gw->tls);
  pthread_mutex_destroy(&gw->mu);
  nb_free(gw);
}

/* ------------------------------------------------------------------ `nebula gateway` */

static void nb__gateway_usage(FILE* f) {
  fprintf(f,
          "usage: nebula gateway --config FILE [--check]\n\n"
          "Runs this cluster's gateway: the nebula.v1.Gateway API over mutual TLS, the job store\n"
          "and the launcher. Stops on SIGINT/SIGTERM; running jobs keep running and are\n"
          "re-attached at the next start. Prints 'listening on ADDR port PORT' once serving.\n\n"
          "  --config FILE  JSON config (keys below)\n"
          "  --check        read and check the config, print it, and exit\n"
          "  --help         show this help\n\n");
  nb_gateway_config_help(f);
  fprintf(f, "\nExit status: 0 stopped by a signal, 1 failure, 2 usage error.\n");
}

int nb_gateway_main(int argc, char** argv) {
  const char* path = NULL;
  int check = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      nb__gateway_usage(stdout);
      return NB_EXIT_OK;
    } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
      path = argv[++i];
    } else if (!strcmp(argv[i], "--check")) {
      check = 1;
    } else {
      fprintf(stderr, "nebula gateway: unknown argument '%s'\n", argv[i]);
      nb__gateway_usage(stderr);
      return NB_EXIT_USAGE;
    }
  }
  if (!path) {
    nb__gateway_usage(stderr);
    return NB_EXIT_USAGE;
  }
  nb_gateway_config_t cfg;
  nb_gateway_config_defaults(&cfg);
  if (nb_gateway_config_load(path, &cfg) != NB_OK) {
    fprintf(stderr, "nebula gateway: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (check) {
    printf("cluster_id %s\nlisten %s\nwork_dir %s\nacl rules %d\npeers %d\n", cfg.cluster_id,
           cfg.listen, cfg.work_dir, cfg.acl.n_rules, cfg.n_peers);
    return NB_EXIT_OK;
  }
  nb_log_set_identity(cfg.cluster_id, -1);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread inherits it; sigwait below */
  nb_gateway_t* gw = NULL;
  if (nb_gateway_create(&cfg, &gw) != NB_OK) {
    fprintf(stderr, "nebula gateway: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (cfg.acl.n_rules == 0)
    NB_WARN("gateway %s: the ACL is empty, so nobody may submit jobs; add \"acl\" rules to %s",
            cfg.cluster_id, path);
  if (cfg.n_peers > 0)
    NB_INFO(JOB, "gateway %s: %d peers configured (federation is not active yet)", cfg.cluster_id,
            cfg.n_peers);
  printf("listening on %s port %d\n", cfg.listen, nb_gateway_port(gw));
  fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  NB_WARN("gateway %s: stopping on signal %d; running jobs keep running", cfg.cluster_id, sig);
  nb_gateway_destroy(gw);
  return NB_EXIT_OK;
}
