/* Jobs on this cluster: their folders, the command words from the templates, the worker slots
 * (reservations for proposed jobs) and stopping them. How processes start (local, mpirun,
 * Slurm) is gateway/launcher.h's business; what happens when they end is monitor.c's. */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"
#include "security/pki.h"
#include "security/sign.h"

/* The index of job id in active[], or -1. Caller holds active_mu (or runs alone, at start). */
int nb__gw_active_find(nb_gateway_t* gw, const char* id) {
  for (int i = 0; i < gw->n_active; i++)
    if (!strcmp(gw->active[i].id, id)) return i;
  return -1;
}

/* Worker slots held by the jobs in active[] but `except` (NULL: none) and those whose end is
 * being recorded (their processes are gone). Caller holds active_mu. */
int nb__gw_slots_used(const nb_gateway_t* gw, const char* except) {
  int used = 0;
  for (int i = 0; i < gw->n_active; i++)
    if (!gw->active[i].ending && (!except || strcmp(gw->active[i].id, except)))
      used += gw->active[i].workers;
  return used;
}

void nb__gw_jobdir(const nb_gateway_t* gw, const char* id, char* buf, size_t n) {
  snprintf(buf, n, "%s/%.63s", gw->cfg.work_dir, id);
}

/* With run_as, the job's user owns what the gateway prepares for it to read or write there. */
void nb__gw_give(const nb_gateway_t* gw, const char* path) {
  if (gw->run_as && lchown(path, gw->run_uid, gw->run_gid) != 0)
    NB_WARN("cannot give %s to the run_as user: %s", path, strerror(errno));
}

/* Opens a file the job's processes wrote, for the gateway to read. With run_as the job's user
 * owns the job's folder and could put a link there to a file only the gateway may read: a file
 * is read only if, once open, it is a regular file of that user (so nothing the job could not
 * read itself). Returns the descriptor or -1 (errno EPERM for a refused file). */
int nb__gw_open_job_file(const nb_gateway_t* gw, const char* path) {
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
nb_status_t nb__gw_jobdir_write(nb_gateway_t* gw, const char* id, const uint8_t* desc, size_t len,
                                const uint8_t* sig, size_t sig_len, const char* cert_pem) {
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], path[sizeof dir + 32];
  nb__gw_jobdir(gw, id, dir, sizeof dir);
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

/* Error st with every error of diag after prefix, separated by ';' (at most 2 KiB). */
nb_status_t nb__gw_diag_error(nb_status_t st, const char* prefix,
                              const nb_descriptor_diag_t* diag) {
  char msg[2048];
  size_t o = (size_t)snprintf(msg, sizeof msg, "%s", prefix);
  for (int i = 0; i < diag->count && o + 2 < sizeof msg; i++) {
    char line[640];
    o += (size_t)snprintf(msg + o, sizeof msg - o, "%s %s", i ? ";" : "",
                          nb_descriptor_error_format(&diag->errors[i], line, sizeof line));
    if (o >= sizeof msg) o = sizeof msg - 1;
  }
  return nb_error(st, "%s", msg);
}

/* What Submit and Propose check first: cert_pem is a certificate the federation CA issued
 * (*cert: the caller X509_frees it, NULL when it does not parse) and its key signed the
 * descriptor's bytes; with user, the signer must be that user; with who, the signer's
 * identity. NB_ERR_INVALID (no certificate) or NB_ERR_PERMISSION (bad signature, refused
 * signer). */
static nb_status_t nb__verify_signed(const nb_gateway_t* gw, const ProtobufCBinaryData* desc,
                                     const ProtobufCBinaryData* sig, const char* cert_pem,
                                     const char* user, nb_pki_identity_t* who, X509** cert) {
  if (nb_pki_cert_from_pem(cert_pem, 0, cert) != NB_OK)
    return nb_error_wrap(NB_ERR_INVALID, "cert_pem");
  nb_status_t s =
      nb_sign_verify(*cert, gw->ca, desc->data, desc->len, sig->data, sig->len, user, who);
  if (s == NB_ERR_INTEGRITY)
    return nb_error_wrap(NB_ERR_PERMISSION, "descriptor signature does not verify");
  if (s != NB_OK) return nb_error_wrap(NB_ERR_PERMISSION, "signer certificate refused");
  return NB_OK;
}

/* The signed descriptor of a Submit or Propose, read into sd (zeroed by the caller): its
 * signature (nb__verify_signed), the descriptor parsed (all its errors in the message, or the
 * first only) and its paths checked (nb__gw_paths_check). The caller releases sd with
 * nb__gw_signed_clear, on failure too. */
nb_status_t nb__gw_read_signed(const nb_gateway_t* gw, const ProtobufCBinaryData* desc,
                               const ProtobufCBinaryData* sig, const char* cert_pem,
                               const char* user, nb_pki_identity_t* who, int all_errors,
                               nb__gw_signed_t* sd) {
  NB_CHECK(nb__verify_signed(gw, desc, sig, cert_pem, user, who, &sd->cert));
  NB_CHECK(nb_calloc((void**)&sd->cfg, 1, sizeof *sd->cfg, "job config"));
  NB_CHECK(nb_calloc((void**)&sd->diag, 1, sizeof *sd->diag, "diagnostics"));
  if (nb_descriptor_parse((const char*)desc->data, desc->len, sd->cfg, sd->diag) != NB_OK) {
    if (all_errors) return nb__gw_diag_error(NB_ERR_INVALID, "descriptor is invalid:", sd->diag);
    char line[640];
    const nb_descriptor_diag_t* d = sd->diag;
    return nb_error(NB_ERR_INVALID, "descriptor is invalid: %s",
                    d->count ? nb_descriptor_error_format(&d->errors[0], line, sizeof line) : "?");
  }
  return nb__gw_paths_check(gw, sd->cfg, sd->diag);
}

void nb__gw_signed_clear(nb__gw_signed_t* sd) {
  if (sd->cert) X509_free(sd->cert);
  nb_free(sd->cfg);
  nb_free(sd->diag);
  memset(sd, 0, sizeof *sd);
}

/* Every path of a descriptor stays inside the job's folder (created afresh, so a relative path
 * without ".." does) or the config's paths.allow: refused otherwise, naming each JSON path. */
nb_status_t nb__gw_paths_check(const nb_gateway_t* gw, const nb_job_config_t* cfg,
                               nb_descriptor_diag_t* diag) {
  const char* roots[NB_JOB_PATHS_MAX_ROOTS];
  for (int i = 0; i < gw->cfg.n_allow; i++) roots[i] = gw->cfg.allow[i];
  memset(diag, 0, sizeof *diag);
  if (nb_job_paths_check(cfg, NULL, roots, gw->cfg.n_allow, diag) == NB_OK) return NB_OK;
  return nb__gw_diag_error(NB_ERR_PERMISSION, "descriptor refused:", diag);
}

/* Starts the job's command in its folder (written by nb__gw_jobdir_write): `command`, or with wk
 * `worker_command`. On NB_OK the job is running and registered with the monitor, replacing its
 * reservation if it had one. */
nb_status_t nb__gw_launch(nb_gateway_t* gw, nb_job_store_t* st, const char* id, int workers,
                          const nb__wk_args_t* wk) {
  nb__active_t a;
  memset(&a, 0, sizeof a);
  snprintf(a.id, sizeof a.id, "%s", id);
  a.workers = workers;
  nb__gw_jobdir(gw, id, a.dir, sizeof a.dir);
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
  /* the user's program (spec.program) instead of the templates: its words as given, the
   * NEBULA_* environment of this cluster's session */
  nb_job_config_t* jc = NULL;
  nb__gw_program_t* pg = NULL;
  if (nb__gw_job_config(st, id, &jc) == NB_OK && jc->program.argc > 0) {
    es = nb_calloc((void**)&pg, 1, sizeof *pg, "program");
    if (es == NB_OK) es = nb__gw_program_prepare(gw, id, a.dir, jc, wk, pg);
    if (es != NB_OK) {
      nb_free(pg);
      nb_free(jc);
      nb_free(words);
      nb_free(env4);
      return es;
    }
  }
  char* env[5 + NB__PROGRAM_MAX_ENV + 1] = {env0, env1, env2, env3, env4, NULL};
  for (int i = 0; pg && i < pg->n_env; i++) env[5 + i] = pg->env[i];
  int n_tmpl = pg ? 0 : wk ? gw->cfg.n_worker_command : gw->cfg.n_command;
  pthread_mutex_lock(&gw->active_mu);
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
  if (pg && strcmp(pg->workdir, a.dir)) {
    /* into its workDir without a shell reading the words: they stay positional */
    static const char* const cd[] = {"/bin/sh", "-c", "cd \"$1\" || exit 126; shift; exec \"$@\"",
                                     "nebula-program"};
    for (int w = 0; w < 4; w++) snprintf(words[n++], sizeof words[0], "%s", cd[w]);
    snprintf(words[n++], sizeof words[0], "%s", pg->workdir);
  }
  for (int i = 0; pg && i < jc->program.argc && n < NB__MAX_WORDS; i++)
    snprintf(words[n++], sizeof words[0], "%s", jc->program.argv[i]);
  for (int w = 0; w < n; w++) argv[w] = words[w];
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
  int mine = nb__gw_active_find(gw, id); /* our own reservation */
  int used = nb__gw_slots_used(gw, id);
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
  pthread_mutex_unlock(&gw->active_mu);
  if (pg) nb__gw_program_clear(pg);
  nb_free(pg);
  nb_free(jc);
  nb_free(words);
  nb_free(env4);
  return s;
}

/* Holds `workers` slots for a proposed job until it launches or is aborted (nb__gw_unreserve).
 * NB_ERR_UNAVAILABLE when they are not free. */
nb_status_t nb__gw_reserve(nb_gateway_t* gw, const char* id, int workers) {
  pthread_mutex_lock(&gw->active_mu);
  int used = nb__gw_slots_used(gw, NULL);
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
    nb__gw_jobdir(gw, id, a->dir, sizeof a->dir);
    a->workers = workers;
  }
  pthread_mutex_unlock(&gw->active_mu);
  return s;
}

void nb__gw_unreserve(nb_gateway_t* gw, const char* id) {
  pthread_mutex_lock(&gw->active_mu);
  int k = nb__gw_active_find(gw, id);
  if (k >= 0 && !nb__launched(&gw->active[k])) gw->active[k] = gw->active[--gw->n_active];
  pthread_mutex_unlock(&gw->active_mu);
}

int nb__gw_parts(const nb_job_config_t* cfg, nb__part_t* p) {
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

/* Whether host:port can be bound now (SO_REUSEADDR, as gRPC's listener: a port held only by
 * connections in TIME_WAIT counts as free, one with a listener does not). *port 0: any port,
 * the one bound written back. Returns 0 free, -1 taken (errno), -2 the host does not resolve. */
static int nb__bindable(const char* host, int* port, int* v6) {
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", *port);
  int rc = getaddrinfo(host, ps, &hints, &ai);
  if (rc != 0 || !ai) {
    errno = rc;
    return -2;
  }
  *v6 = ai->ai_family == AF_INET6;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, ok = 0, err = 0;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ok = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    err = errno;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (ok && *port == 0 && getsockname(fd, (struct sockaddr*)&ss, &sl) == 0)
      *port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6*)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in*)&ss)->sin_port);
    close(fd);
  } else {
    err = errno;
  }
  freeaddrinfo(ai);
  errno = err;
  return ok ? 0 : -1;
}

/* A port for job id's Exchange listener: a free one from the system, or with
 * exchange.port_range the next one of the range (round robin) that can be bound and that this
 * gateway has not handed to another job whose workers may not have bound it yet. Written as
 * the endpoint the peers are told, "advertise:port" (exchange.advertise, else exchange_host;
 * "[host]:port" for IPv6). Caller does not hold active_mu. NB_ERR_CONFIG (exchange_host does
 * not resolve), NB_ERR_UNAVAILABLE (no port free). */
nb_status_t nb__gw_free_endpoint(nb_gateway_t* gw, const char* id, char* out, size_t cap) {
  const nb_gateway_config_t* c = &gw->cfg;
  int port = 0, v6 = 0, rc = -1, lo = c->exchange_port_lo, hi = c->exchange_port_hi;
  if (!lo) {
    rc = nb__bindable(c->exchange_host, &port, &v6);
  } else {
    pthread_mutex_lock(&gw->active_mu);
    double now = nb_now_s();
    /* an entry is dropped once its job is gone from active[] after having been seen there,
     * or 30 s after it was handed out (a submit that failed before launching) */
    for (int i = 0; i < gw->n_xport;) {
      int live = nb__gw_active_find(gw, gw->xport[i].id) >= 0;
      if (live) gw->xport[i].seen = 1;
      if (!live && (gw->xport[i].seen || now - gw->xport[i].at > 30))
        gw->xport[i] = gw->xport[--gw->n_xport];
      else
        i++;
    }
    int n = hi - lo + 1;
    if (gw->xport_next < lo || gw->xport_next > hi) gw->xport_next = lo;
    for (int k = 0; k < n && rc != 0 && gw->n_xport < NB__MAX_ACTIVE; k++) {
      int p = gw->xport_next + k > hi ? gw->xport_next + k - n : gw->xport_next + k, held = 0;
      for (int i = 0; i < gw->n_xport && !held; i++) held = gw->xport[i].port == p;
      if (held) continue;
      port = p;
      rc = nb__bindable(c->exchange_host, &port, &v6);
      if (rc == -2) break;
    }
    if (rc == 0) {
      snprintf(gw->xport[gw->n_xport].id, sizeof gw->xport[0].id, "%s", id);
      gw->xport[gw->n_xport].port = port;
      gw->xport[gw->n_xport].at = now;
      gw->xport[gw->n_xport].seen = 0;
      gw->n_xport++;
      gw->xport_next = port == hi ? lo : port + 1;
    }
    pthread_mutex_unlock(&gw->active_mu);
  }
  if (rc == -2)
    return nb_error(NB_ERR_CONFIG, "config: exchange_host '%s': %s", c->exchange_host,
                    gai_strerror(errno));
  if (rc != 0 && lo)
    return nb_error(NB_ERR_UNAVAILABLE,
                    "exchange.port_range %s: all %d ports are taken on exchange_host '%s' (by "
                    "jobs of this gateway or other processes): widen the range or wait for a "
                    "job to end",
                    c->exchange_port_range, hi - lo + 1, c->exchange_host);
  if (rc != 0)
    return nb_error(NB_ERR_UNAVAILABLE, "no free port on exchange_host '%s': %s", c->exchange_host,
                    strerror(errno));
  const char* adv = c->exchange_advertise[0] ? c->exchange_advertise : c->exchange_host;
  int bracket = adv[0] != '[' && strchr(adv, ':') != NULL;
  (void)v6;
  snprintf(out, cap, bracket ? "[%s]:%d" : "%s:%d", adv, port);
  return NB_OK;
}

/* The address this cluster's workers bind for the Exchange endpoint that peers are told
 * (nb__gw_free_endpoint): exchange_host with the endpoint's port. */
nb_status_t nb__gw_exchange_listen(const nb_gateway_t* gw, const char* endpoint, char* out,
                                   size_t cap) {
  const char* colon = endpoint ? strrchr(endpoint, ':') : NULL;
  if (!colon || !colon[1])
    return nb_error(NB_ERR_INVALID, "Exchange endpoint '%s' has no port", endpoint ? endpoint : "");
  const char* h = gw->cfg.exchange_host;
  int bracket = h[0] != '[' && strchr(h, ':') != NULL;
  int n = snprintf(out, cap, bracket ? "[%s]:%s" : "%s:%s", h, colon + 1);
  if (n < 0 || (size_t)n >= cap) return nb_error(NB_ERR_INVALID, "Exchange endpoint too long");
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
nb_status_t nb__gw_job_pki(nb_gateway_t* gw, const char* dir, char* pki, size_t cap) {
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
  nb__gw_give(gw, p);
  nb__gw_give(gw, pki);
  return NB_OK;
}

/* Parses the stored descriptor of job id into *cfg (allocated; nb_free it). */
nb_status_t nb__gw_job_config(nb_job_store_t* st, const char* id, nb_job_config_t** cfg) {
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

int nb__gw_mkdirs(const char* path) {
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

/* Waits until the monitor retired job id's entry (it recorded the job's end); NB_ERR_TIMEOUT
 * when that takes longer than the processes' end plausibly can. */
static nb_status_t nb__wait_retired(nb_gateway_t* gw, const char* id) {
  int64_t until = nb_now_ns() + 5000000000LL + (int64_t)gw->cfg.poll_ms * 4000000;
  for (;;) {
    pthread_mutex_lock(&gw->active_mu);
    int k = nb__gw_active_find(gw, id);
    pthread_mutex_unlock(&gw->active_mu);
    if (k < 0) return NB_OK;
    if (nb_now_ns() > until)
      return nb_error(NB_ERR_TIMEOUT,
                      "job %s: its processes are gone but the end was not recorded in time", id);
    nb_sleep_ns(5000000);
  }
}

/* Stops a job's processes here (or, without any, moves it to cancelled at once) and waits until
 * the monitor recorded the end. */
nb_status_t nb__gw_cancel_local(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                const char* reason) {
  nb_status_t s = NB_OK;
  pthread_mutex_lock(&gw->active_mu);
  int k = nb__gw_active_find(gw, id);
  int ending = k >= 0 && gw->active[k].ending; /* the monitor is recording its end */
  int launched = k >= 0 && !ending && nb__launched(&gw->active[k]);
  nb_launch_t launch;
  if (launched) launch = gw->active[k].launch;
  if (k >= 0 && !ending)
    snprintf(gw->active[k].cancel_reason, sizeof gw->active[k].cancel_reason, "%s", reason);
  if (k >= 0 && !ending && !launched)
    gw->active[k] = gw->active[--gw->n_active]; /* a reservation */
  pthread_mutex_unlock(&gw->active_mu);
  if (launched) {
    int killed = 0;
    char what[64];
    s = nb_launcher_cancel(&launch, gw->cfg.cancel_grace_ms, &killed);
    NB_INFO(JOB, "job %s: %s stopped%s", id, nb_launcher_describe(&launch, what, sizeof what),
            killed ? " with SIGKILL" : "");
    return s == NB_OK ? nb__wait_retired(gw, id) : s;
  }
  if (ending) NB_CHECK(nb__wait_retired(gw, id));
  s = nb_job_store_transition(st, id, NB_JOB_CANCELLED, reason);
  if (s == NB_ERR_INVALID) s = NB_OK; /* it reached a final state meanwhile */
  return s;
}
