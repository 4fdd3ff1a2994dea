/* The gateway daemon's life (gateway/gateway.h): create (TLS, store, recovery, peers, the
 * services and the three threads), the per-identity call limit every handler passes, destroy.
 * The parts: config.c, api.c, federation.c, federation_api.c, start.c, monitor.c, publish.c,
 * report_queue.c, recovery.c, health.c; their shared state is gateway_internal.h. */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "security/pki.h"

/* Every Gateway and Federation call passes here: one certificate may have at most
 * limits.calls_per_identity calls in flight, so that one user's streams (Watch, Logs -f) cannot
 * take every handler of the server (NB_RPC_MAX_CALLS) from the others. */
nb_status_t nb__gw_limited(nb_rpc_call_t* call, void* user_data) {
  nb__hand_t* h = user_data;
  nb_gateway_t* gw = h->gw;
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind == NB_TLS_PEER_NONE) return h->m->fn(call, gw, h->m->spec); /* refused there */
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
    nb_status_t r = nb_error(NB_ERR_NOMEM,
                             "%s '%s' already has %d calls in flight at gateway '%s', the limit "
                             "per identity (limits.calls_per_identity = %d): end one (a watch or "
                             "logs -f) and try again",
                             p->kind == NB_TLS_PEER_CLUSTER ? "cluster" : "user", p->name, n,
                             gw->cfg.cluster_id, limit);
    char who[sizeof key + 8];
    snprintf(who, sizeof who, "%s '%s'", p->kind == NB_TLS_PEER_CLUSTER ? "cluster" : "user",
             p->name);
    const char* method = strrchr(h->m->path, '/');
    nb__gw_metric_refusal(gw, method ? method + 1 : h->m->path, who, "call_limit", nb_error_last());
    return r;
  }
  nb_status_t st = h->m->fn(call, gw, h->m->spec);
  pthread_mutex_lock(&gw->lim_mu);
  for (int i = 0; i < gw->n_ident; i++)
    if (!strcmp(gw->ident[i].key, key)) {
      if (--gw->ident[i].calls <= 0) gw->ident[i] = gw->ident[--gw->n_ident];
      break;
    }
  pthread_mutex_unlock(&gw->lim_mu);
  return st;
}

/* Reads and checks tls.ca, tls.cert and tls.key (nb_tls_create: they parse, the key matches the
 * certificate, which chains to the CA and is valid now) and that the certificate is this
 * cluster's. */
static nb_status_t nb__gw_tls_load(const nb_gateway_t* gw, nb_tls_t** out) {
  nb_tls_files_t files = {gw->cfg.tls_ca, gw->cfg.tls_cert, gw->cfg.tls_key};
  NB_CHECK(nb_tls_create(&files, out));
  const nb_tls_peer_t* self = nb_tls_self(*out);
  if (self->kind != NB_TLS_PEER_CLUSTER || strcmp(self->name, gw->cfg.cluster_id)) {
    nb_status_t s = nb_error(NB_ERR_CONFIG, "gateway: tls.cert %s is %s '%s', not cluster '%s'",
                             gw->cfg.tls_cert, self->kind == NB_TLS_PEER_USER ? "user" : "cluster",
                             self->name, gw->cfg.cluster_id);
    nb_tls_destroy(*out);
    *out = NULL;
    return s;
  }
  return NB_OK;
}

nb_status_t nb_gateway_reload_tls(nb_gateway_t* gw) {
  if (!gw || !gw->tls_src) return nb_error(NB_ERR_INVALID, "gateway: NULL argument");
  nb_tls_t* tls = NULL;
  nb_status_t s = nb__gw_tls_load(gw, &tls);
  if (s != NB_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", nb_error_last()); /* nb_error writes where it reads */
    nb_tls_t* cur = nb_tls_source_get(gw->tls_src);
    const nb_tls_cert_info_t* ci = nb_tls_cert_info(cur);
    NB_WARN(
        "gateway %s: certificate reload failed, still serving the previous certificate "
        "(serial %s, notAfter %s): %s; fix the file and send SIGHUP again",
        gw->cfg.cluster_id, ci->serial, ci->not_after, why);
    s = nb_error(s, "certificate reload failed: %s", why);
    nb_tls_destroy(cur);
    return s;
  }
  const nb_tls_cert_info_t* ci = nb_tls_cert_info(tls);
  NB_INFO(JOB,
          "gateway %s: certificates reloaded: subject %s, notAfter %s, serial %s (from %s, %s, "
          "CA %s); new TLS connections present it",
          gw->cfg.cluster_id, ci->subject, ci->not_after, ci->serial, gw->cfg.tls_cert,
          gw->cfg.tls_key, gw->cfg.tls_ca);
  /* new channels to the peers with it; calls under way finish on the old ones */
  s = nb__gw_peers_connect(gw, tls);
  if (s != NB_OK)
    NB_WARN("gateway %s: the Federation channels keep the previous certificate: %s",
            gw->cfg.cluster_id, nb_error_last());
  nb_tls_source_set(gw->tls_src, tls);
  return s;
}

nb_status_t nb_gateway_create(const nb_gateway_config_t* cfg, nb_gateway_t** out) {
  if (!cfg || !out) return nb_error(NB_ERR_INVALID, "gateway: NULL argument");
  nb_gateway_t* gw = NULL;
  nb_status_t s = NB_OK;
  NB_CHECK(nb_calloc((void**)&gw, 1, sizeof *gw, "gateway"));
  gw->cfg = *cfg;
  pthread_mutex_init(&gw->record_mu, NULL);
  pthread_mutex_init(&gw->active_mu, NULL);
  pthread_mutex_init(&gw->queue_mu, NULL);
  pthread_mutex_init(&gw->lim_mu, NULL);
  pthread_mutex_init(&gw->peer_mu, NULL);
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
  {
    nb_tls_t* tls = NULL;
    NB_CHECK_GOTO(nb__gw_tls_load(gw, &tls), s, fail);
    if ((s = nb_tls_source_create(tls, &gw->tls_src)) != NB_OK) {
      nb_tls_destroy(tls);
      goto fail;
    }
  }
  NB_CHECK_GOTO(nb_pki_cert_load(gw->cfg.tls_ca, &gw->ca), s, fail);
  NB_CHECK_GOTO(nb__gw_store_present(gw), s, fail);
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
  nb__gw_store_orphans(gw);
  NB_CHECK_GOTO(nb_job_store_open(gw->cfg.store_path, &gw->fed_store), s, fail);
  NB_CHECK_GOTO(nb_job_store_open(gw->cfg.store_path, &gw->rep_store), s, fail);
  NB_CHECK_GOTO(nb__gw_recover(gw), s, fail);
  {
    nb_tls_t* tls = nb_tls_source_get(gw->tls_src);
    s = nb__gw_peers_connect(gw, tls);
    nb_tls_destroy(tls);
    if (s != NB_OK) goto fail;
  }

  nb_rpc_server_opts_t so = {0};
  so.listen = gw->cfg.listen;
  so.tls_source = gw->tls_src; /* each new handshake presents the pair loaded last */
  NB_CHECK_GOTO(nb_rpc_server_create(&so, &gw->srv), s, fail);
  {
    char adir[NB_GW_STR + 16];
    snprintf(adir, sizeof adir, "%s/artifacts", gw->cfg.work_dir);
    NB_CHECK_GOTO(nb_artifact_store_open(adir, &gw->art), s, fail);
    NB_CHECK_GOTO(nb_artifact_service_add(gw->srv, gw->art, nb__gw_artifact_job, gw), s, fail);
    NB_CHECK_GOTO(nb_artifact_put_service_add(gw->srv, gw->art, (uint64_t)gw->cfg.max_put_bytes,
                                              nb__gw_may_put, gw),
                  s, fail);
  }
  for (size_t i = 0; i < NB__N_METHODS; i++) {
    const nb__gw_method_t* m = i < NB__GW_API_METHODS ? &nb__gw_api_methods[i]
                                                      : &nb__gw_fed_methods[i - NB__GW_API_METHODS];
    gw->hand[i].gw = gw;
    gw->hand[i].m = m;
    NB_CHECK_GOTO(nb_rpc_server_add_method(gw->srv, m->path, m->kind, nb__gw_limited, &gw->hand[i]),
                  s, fail);
  }
  NB_CHECK_GOTO(nb__gw_health_add(gw), s, fail);
  if (pthread_create(&gw->mon, NULL, nb__gw_monitor, gw) != 0) {
    s = nb_error(NB_ERR_SYSTEM, "gateway: cannot start the monitor thread");
    goto fail;
  }
  gw->mon_started = 1;
  if (pthread_create(&gw->fed, NULL, nb__gw_fed_loop, gw) != 0) {
    s = nb_error(NB_ERR_SYSTEM, "gateway: cannot start the federation thread");
    goto fail;
  }
  gw->fed_started = 1;
  if (pthread_create(&gw->rep, NULL, nb__gw_report_loop, gw) != 0) {
    s = nb_error(NB_ERR_SYSTEM, "gateway: cannot start the report thread");
    goto fail;
  }
  gw->rep_started = 1;
  NB_CHECK_GOTO(nb__gw_metrics_start(gw), s, fail);
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
  /* NOT_SERVING first: a health Watch still open is told before its call is cancelled (it
   * looks every 50 ms; a second at most) */
  nb_gateway_drain(gw);
  for (int i = 0; i < 40 && gw->watch_serving > 0; i++) nb_sleep_ns(25000000);
  nb__gw_metrics_stop(gw); /* before what its scrapes read: the store, active[], the artifacts */
  nb_rpc_server_destroy(gw->srv);
  gw->stopping = 1;
  if (gw->mon_started) pthread_join(gw->mon, NULL);
  if (gw->fed_started) pthread_join(gw->fed, NULL);
  if (gw->rep_started) pthread_join(gw->rep, NULL);
  nb__gw_peers_close(gw);
  nb_job_store_close(gw->fed_store);
  nb_job_store_close(gw->rep_store);
  nb_job_store_close(gw->mon_store);
  nb_artifact_store_close(gw->art);
  if (gw->ca) X509_free(gw->ca);
  nb_tls_source_destroy(gw->tls_src);
  pthread_mutex_destroy(&gw->record_mu);
  pthread_mutex_destroy(&gw->active_mu);
  pthread_mutex_destroy(&gw->queue_mu);
  pthread_mutex_destroy(&gw->lim_mu);
  pthread_mutex_destroy(&gw->peer_mu);
  nb_free(gw);
}
