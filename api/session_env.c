/* api/session_env: nb_session_options_from_env, the session options from the environment a
 * launcher sets (include/nebula.h, docs/api.md "The environment"), through one table of the
 * variables. Not common/param.h's registry: that one is for process-wide knobs read once, which
 * fall back to their default on a bad value; these are a job's settings, read at each call, and a
 * malformed one is an error naming it. */
#include <nebula.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "compress/compress.h"
#include "jobs/descriptor.h"
#include "jobs/job_program.h"
#include "security/seal.h"

typedef enum {
  NB__EV_TEXT,   /* const char* field */
  NB__EV_U32,    /* uint32_t field, an integer in [lo, hi] */
  NB__EV_LONG,   /* long field, an integer in [lo, hi] */
  NB__EV_FLOAT,  /* float field, a finite number in the range */
  NB__EV_DOUBLE, /* double field, likewise */
  NB__EV_FLAG,   /* int field, "0" or "1" */
  NB__EV_PEERS,  /* peers and n_peers */
  NB__EV_SECRET  /* job_secret, from a file */
} nb__ev_kind_t;

typedef struct {
  const char* env;
  nb__ev_kind_t kind;
  size_t off; /* the field in nb_session_options_t */
  double lo, hi;
  int lo_open, hi_open; /* 1: the bound itself is out of range */
} nb__ev_t;

#define NB__EV_OFF(f) offsetof(nb_session_options_t, f)
static const nb__ev_t nb__ev_table[] = {
    {"NEBULA_JOB_ID", NB__EV_TEXT, NB__EV_OFF(job_id), 0, 0, 0, 0},
    {"NEBULA_CLUSTER_ID", NB__EV_TEXT, NB__EV_OFF(cluster_id), 0, 0, 0, 0},
    {"NEBULA_N_CLUSTERS", NB__EV_U32, NB__EV_OFF(n_clusters), 1, 64, 0, 0},
    /* after N_CLUSTERS: its bound is the count, checked once both are read */
    {"NEBULA_CLUSTER_INDEX", NB__EV_U32, NB__EV_OFF(cluster_index), 0, 63, 0, 0},
    {"NEBULA_LISTEN", NB__EV_TEXT, NB__EV_OFF(listen), 0, 0, 0, 0},
    {"NEBULA_PEERS", NB__EV_PEERS, NB__EV_OFF(peers), 0, 0, 0, 0},
    {"NEBULA_PKI_DIR", NB__EV_TEXT, NB__EV_OFF(pki_dir), 0, 0, 0, 0},
    {"NEBULA_JOB_SECRET_FILE", NB__EV_SECRET, NB__EV_OFF(job_secret), 0, 0, 0, 0},
    {"NEBULA_INNER_STEPS", NB__EV_LONG, NB__EV_OFF(inner_steps), 1, (double)LONG_MAX, 0, 0},
    {"NEBULA_OUTER_LR", NB__EV_FLOAT, NB__EV_OFF(outer_lr), 0, INFINITY, 1, 1},
    {"NEBULA_OUTER_MOMENTUM", NB__EV_FLOAT, NB__EV_OFF(outer_momentum), 0, 1, 0, 1},
    {"NEBULA_DENSITY", NB__EV_DOUBLE, NB__EV_OFF(density), 0, 1, 1, 0},
    {"NEBULA_VALUES", NB__EV_TEXT, NB__EV_OFF(values), 0, 0, 0, 0},
    {"NEBULA_INSECURE", NB__EV_FLAG, NB__EV_OFF(insecure), 0, 1, 0, 0},
    {"NEBULA_UNSEALED", NB__EV_FLAG, NB__EV_OFF(unsealed), 0, 1, 0, 0},
    {"NEBULA_ERROR_FEEDBACK", NB__EV_FLAG, NB__EV_OFF(error_feedback), 0, 1, 0, 0},
    {"NEBULA_ERROR_FEEDBACK_DECAY", NB__EV_DOUBLE, NB__EV_OFF(error_feedback_decay), 0, 1, 1, 0},
    {"NEBULA_ADAPTIVE", NB__EV_FLAG, NB__EV_OFF(adaptive), 0, 1, 0, 0},
    {"NEBULA_EAGER", NB__EV_FLAG, NB__EV_OFF(eager), 0, 1, 0, 0},
    /* a power of two: nb_session_open checks that, as for the field set in code */
    {"NEBULA_TOPK_CHUNK", NB__EV_U32, NB__EV_OFF(topk_chunk), 0, 65536, 0, 0},
    {"NEBULA_DENSITY_MIN", NB__EV_DOUBLE, NB__EV_OFF(density_min), 0, 1, 1, 0},
    {"NEBULA_DENSITY_MAX", NB__EV_DOUBLE, NB__EV_OFF(density_max), 0, 1, 1, 0},
    {"NEBULA_RATE_MBIT", NB__EV_DOUBLE, NB__EV_OFF(rate_mbit), 0, 1e6, 0, 0},
    {"NEBULA_PEER_TIMEOUT_S", NB__EV_DOUBLE, NB__EV_OFF(peer_timeout_s), 0, 86400, 0, 0},
    {"NEBULA_UPDATE_NORM_BOUND", NB__EV_DOUBLE, NB__EV_OFF(update_norm_bound), 0, INFINITY, 0, 1},
    {"NEBULA_PROGRESS_FILE", NB__EV_TEXT, NB__EV_OFF(progress_file), 0, 0, 0, 0},
    {"NEBULA_METRICS_LISTEN", NB__EV_TEXT, NB__EV_OFF(metrics_listen), 0, 0, 0, 0},
    {"NEBULA_FAULT_TOLERANT", NB__EV_FLAG, NB__EV_OFF(fault_tolerant), 0, 1, 0, 0},
    {"NEBULA_ROUND_DEADLINE_S", NB__EV_DOUBLE, NB__EV_OFF(round_deadline_s), 0, 86400, 1, 0},
    {"NEBULA_REJOIN", NB__EV_FLAG, NB__EV_OFF(rejoin), 0, 1, 0, 0},
    {"NEBULA_START_TIMEOUT_S", NB__EV_DOUBLE, NB__EV_OFF(start_timeout_s), 0, 86400, 1, 0},
};
#define NB__EV_N (sizeof nb__ev_table / sizeof nb__ev_table[0])

/* What the options own (o->env_storage): the variables' text by table row, the peer list split
 * out of its row's copy, the secret. */
typedef struct {
  char* text[NB__EV_N];
  const char** peers;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
} nb__ev_store_t;

static void nb__ev_store_free(nb__ev_store_t* st) {
  if (!st) return;
  for (size_t i = 0; i < NB__EV_N; i++) nb_free(st->text[i]);
  nb_free(st->peers);
  memset(st->secret, 0, sizeof st->secret);
  nb_free(st);
}

static nb_status_t nb__ev_bad(const nb__ev_t* v, const char* text, const char* want) {
  return nb_error(NB_ERR_CONFIG, "session options: %s=\"%s\" is not %s", v->env, text, want);
}

static int nb__ev_in_range(const nb__ev_t* v, double x) {
  if (v->lo_open ? !(x > v->lo) : !(x >= v->lo)) return 0;
  return v->hi_open ? x < v->hi : x <= v->hi;
}

/* A number: the whole text, no spaces; integers in decimal (a leading 0 is not octal). */
static nb_status_t nb__ev_number(const nb__ev_t* v, const char* text, double* out) {
  char* end = NULL;
  errno = 0;
  int integer = v->kind == NB__EV_U32 || v->kind == NB__EV_LONG || v->kind == NB__EV_FLAG;
  double x;
  const char* what = v->kind == NB__EV_FLAG ? "0 or 1" : integer ? "an integer" : "a number";
  if (!text[0] || isspace((unsigned char)text[0])) return nb__ev_bad(v, text, what);
  if (integer) {
    long long i = strtoll(text, &end, 10);
    x = (double)i;
  } else {
    x = strtod(text, &end);
  }
  if (errno || *end || !isfinite(x)) return nb__ev_bad(v, text, integer ? what : "a finite number");
  if (!nb__ev_in_range(v, x)) {
    char want[96];
    if (v->kind == NB__EV_FLAG)
      snprintf(want, sizeof want, "0 or 1");
    else
      snprintf(want, sizeof want, "in %c%g, %g%c", v->lo_open ? '(' : '[', v->lo, v->hi,
               v->hi_open ? ')' : ']');
    return nb__ev_bad(v, text, want);
  }
  *out = x;
  return NB_OK;
}

/* "id=host:port,id=host:port" split in place in `text` (ours); "" is no peer. */
static nb_status_t nb__ev_peers(const nb__ev_t* v, char* text, nb__ev_store_t* st,
                                nb_session_options_t* o) {
  size_t n = 0;
  if (!text[0]) return NB_OK;
  for (const char* c = text; *c; c++) n += *c == ',';
  n++;
  NB_CHECK(nb_alloc((void**)&st->peers, n, sizeof *st->peers, "session options peers"));
  char* at = text;
  for (size_t i = 0; i < n; i++) {
    char* comma = strchr(at, ',');
    if (comma) *comma = '\0';
    const char* eq = strchr(at, '=');
    if (!eq || eq == at || !eq[1] || !strchr(eq + 1, ':') || strchr(eq + 1, ':')[1] == '\0')
      return nb_error(NB_ERR_CONFIG,
                      "session options: NEBULA_PEERS entry %zu \"%s\" is not id=host:port (the "
                      "variable is a comma-separated list)",
                      i + 1, at);
    st->peers[i] = at;
    at = comma ? comma + 1 : at + strlen(at);
  }
  (void)v;
  o->peers = st->peers;
  o->n_peers = n;
  return NB_OK;
}

static int nb__ev_hex(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The job secret file: a regular file that only its owner may access (the secret seals every
 * frame of the job: a readable copy is a leaked key), holding exactly the 32 bytes, or them as
 * 64 hex digits (what `openssl rand -hex 32` writes, with its newline). */
static nb_status_t nb__ev_secret(const char* path, uint8_t* secret) {
  const char* env = "NEBULA_JOB_SECRET_FILE";
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return nb_error(NB_ERR_CONFIG, "session options: %s: cannot open %s: %s", env, path,
                    strerror(errno));
  struct stat sb;
  nb_status_t st = NB_OK;
  uint8_t buf[67];
  ssize_t got = 0;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = nb_error(NB_ERR_CONFIG, "session options: %s: %s is not a regular file", env, path);
  } else if (sb.st_mode & 077) {
    st = nb_error(NB_ERR_CONFIG,
                  "session options: %s: %s is accessible by group or others (mode %03o): the "
                  "job secret must be the owner's only (chmod 600)",
                  env, path, (unsigned)(sb.st_mode & 0777));
  } else {
    /* one read of at most sizeof buf: a longer file is refused, whatever it holds */
    do got = read(fd, buf, sizeof buf);
    while (got < 0 && errno == EINTR);
    if (got < 0)
      st = nb_error(NB_ERR_CONFIG, "session options: %s: cannot read %s: %s", env, path,
                    strerror(errno));
  }
  close(fd);
  if (st == NB_OK && got == NB_SEAL_SECRET_BYTES) {
    memcpy(secret, buf, NB_SEAL_SECRET_BYTES);
  } else if (st == NB_OK && (got == 64 || (got == 65 && buf[64] == '\n'))) {
    for (int i = 0; i < 32 && st == NB_OK; i++) {
      int hi = nb__ev_hex(buf[2 * i]), lo = nb__ev_hex(buf[2 * i + 1]);
      if (hi < 0 || lo < 0)
        st = nb_error(NB_ERR_CONFIG,
                      "session options: %s: %s holds 64 bytes that are not all hex digits", env,
                      path);
      else
        secret[i] = (uint8_t)(hi << 4 | lo);
    }
  } else if (st == NB_OK) {
    st = nb_error(NB_ERR_CONFIG,
                  "session options: %s: %s holds %s%zd bytes: expected exactly 32 bytes, or 64 "
                  "hex digits",
                  env, path, got == (ssize_t)sizeof buf ? "at least " : "", got);
  }
  memset(buf, 0, sizeof buf);
  if (st != NB_OK) memset(secret, 0, NB_SEAL_SECRET_BYTES);
  return st;
}

/* One variable's text (copied into st->text[row]) into its field of o. */
static nb_status_t nb__ev_read(size_t row, const char* text, nb__ev_store_t* st,
                               nb_session_options_t* o) {
  const nb__ev_t* v = &nb__ev_table[row];
  void* field = (char*)o + v->off;
  double x = 0;
  switch (v->kind) {
    case NB__EV_TEXT:
    case NB__EV_PEERS: {
      if (!text[0] && v->kind == NB__EV_TEXT) return nb__ev_bad(v, text, "set (it is empty)");
      size_t len = strlen(text);
      NB_CHECK(nb_alloc((void**)&st->text[row], len + 1, 1, "session options text"));
      memcpy(st->text[row], text, len + 1);
      if (v->kind == NB__EV_PEERS) return nb__ev_peers(v, st->text[row], st, o);
      if (v->off == NB__EV_OFF(values)) {
        nb_values_t vt;
        if (strcmp(text, "auto") != 0 && nb_values_parse(text, &vt) != NB_OK)
          return nb__ev_bad(v, text, "fp32, fp16, bf16, int8, 4bit, 2bit or auto");
      }
      *(const char**)field = st->text[row];
      return NB_OK;
    }
    case NB__EV_SECRET:
      if (!text[0]) return nb__ev_bad(v, text, "set (it is empty)");
      NB_CHECK(nb__ev_secret(text, st->secret));
      o->job_secret = st->secret;
      return NB_OK;
    default:
      break;
  }
  NB_CHECK(nb__ev_number(v, text, &x));
  if (v->kind == NB__EV_U32) *(uint32_t*)field = (uint32_t)x;
  if (v->kind == NB__EV_LONG) *(long*)field = (long)x;
  if (v->kind == NB__EV_FLOAT) *(float*)field = (float)x;
  if (v->kind == NB__EV_DOUBLE) *(double*)field = x;
  if (v->kind == NB__EV_FLAG) *(int*)field = (int)x;
  return NB_OK;
}

/* The defaults, then every variable get(ctx, name) gives (NULL: not set), read by the table;
 * `source` names where they came from in the log. */
static nb_status_t nb__ev_fill(nb_session_options_t* o, const char* (*get)(void*, const char*),
                               void* ctx, const char* source) {
  nb_session_options_default(o);
  nb_session_options_t tmp = *o;
  nb__ev_store_t* store = NULL;
  NB_CHECK(nb_calloc((void**)&store, 1, sizeof *store, "session options"));
  nb_status_t st = NB_OK;
  int have_index = 0;
  for (size_t i = 0; i < NB__EV_N && st == NB_OK; i++) {
    const char* text = get(ctx, nb__ev_table[i].env);
    if (!text) continue;
    st = nb__ev_read(i, text, store, &tmp);
    if (nb__ev_table[i].off == NB__EV_OFF(cluster_index)) have_index = 1;
    /* never the secret's bytes: only where it came from */
    if (st == NB_OK) NB_INFO(ENV, "%s=%s (%s)", nb__ev_table[i].env, text, source);
  }
  if (st == NB_OK && have_index && tmp.cluster_index >= tmp.n_clusters)
    st = nb_error(NB_ERR_CONFIG,
                  "session options: NEBULA_CLUSTER_INDEX=%u is not below the cluster count %u "
                  "(NEBULA_N_CLUSTERS)",
                  tmp.cluster_index, tmp.n_clusters);
  if (st != NB_OK) {
    nb__ev_store_free(store);
    return st;
  }
  tmp.env_storage = store;
  *o = tmp;
  return NB_OK;
}

static const char* nb__ev_getenv(void* ctx, const char* name) {
  (void)ctx;
  return getenv(name);
}

nb_status_t nb_session_options_from_env(nb_session_options_t* o) {
  if (!o) return nb_error(NB_ERR_INVALID, "session options: NULL argument");
  return nb__ev_fill(o, nb__ev_getenv, NULL, "environment");
}

/* A descriptor's settings as the launchers' variables (jobs/job_program.c: one mapping), less
 * those of the deployment, which the caller gives. */
typedef struct {
  char** env;
  int n;
} nb__ev_list_t;

static const char* nb__ev_from_list(void* ctx, const char* name) {
  static const char* const deployment[] = {"NEBULA_LISTEN", "NEBULA_PEERS", "NEBULA_PKI_DIR",
                                           "NEBULA_JOB_SECRET_FILE", "NEBULA_PROGRESS_FILE"};
  for (size_t i = 0; i < sizeof deployment / sizeof deployment[0]; i++)
    if (!strcmp(name, deployment[i])) return NULL;
  const nb__ev_list_t* l = ctx;
  size_t len = strlen(name);
  for (int i = 0; i < l->n; i++)
    if (!strncmp(l->env[i], name, len) && l->env[i][len] == '=') return l->env[i] + len + 1;
  return NULL;
}

nb_status_t nb_session_options_from_descriptor(nb_session_options_t* o, const char* path,
                                               const char* cluster_id) {
  if (!o || !path || !cluster_id) return nb_error(NB_ERR_INVALID, "session options: NULL argument");
  nb_session_options_default(o);
  nb_job_config_t* cfg = NULL;
  NB_CHECK(nb_calloc((void**)&cfg, 1, sizeof *cfg, "session options: descriptor"));
  nb_status_t st = nb_descriptor_load(path, cfg, NULL);
  if (st != NB_OK) {
    nb_free(cfg);
    return nb_error_wrap(st, "session options: descriptor %s", path);
  }
  int index = -1;
  char known[NB_JOB_MAX_CLUSTERS * (NB_JOB_NAME_MAX + 2) + 1] = "";
  size_t at = 0;
  for (int i = 0; i < cfg->n_clusters; i++) {
    if (!strcmp(cfg->clusters[i].id, cluster_id)) index = i;
    at +=
        (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "", cfg->clusters[i].id);
    if (at >= sizeof known) at = sizeof known - 1;
  }
  if (index < 0) {
    st = nb_error(NB_ERR_CONFIG,
                  "session options: descriptor %s: cluster '%s' is not in $.spec.clusters (%s)",
                  path, cluster_id, known);
    nb_free(cfg);
    return st;
  }
  nb_job_program_site_t site = {.job_id = cfg->name,
                                .cluster_id = cluster_id,
                                .cluster_index = index,
                                .listen = "",
                                .pki_dir = "",
                                .secret_file = ""};
  char* env[NB_JOB_PROGRAM_MAX_ENV + 1];
  int n = 0;
  st = nb_job_program_env(cfg, &site, env, NB_JOB_PROGRAM_MAX_ENV + 1, &n);
  if (st == NB_OK) {
    nb__ev_list_t l = {env, n};
    st = nb__ev_fill(o, nb__ev_from_list, &l, path);
    nb_job_program_env_free(env, n);
  }
  nb_free(cfg);
  return st;
}

void nb_session_options_free(nb_session_options_t* o) {
  if (!o || !o->env_storage) return;
  nb__ev_store_t* store = o->env_storage;
  /* clear what points into the storage; a field the caller set since keeps its value */
  for (size_t i = 0; i < NB__EV_N; i++) {
    const char** field = (const char**)((char*)o + nb__ev_table[i].off);
    if (nb__ev_table[i].kind == NB__EV_TEXT && store->text[i] && *field == store->text[i])
      *field = NULL;
  }
  if (store->peers && o->peers == store->peers) {
    o->peers = NULL;
    o->n_peers = 0;
  }
  if (o->job_secret == store->secret) o->job_secret = NULL;
  nb__ev_store_free(store);
  o->env_storage = NULL;
}
