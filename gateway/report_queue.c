/* Run reports: the queue of jobs whose report.html is to be built, and the report thread that
 * gathers every cluster's rounds.tsv and summary.json (fetching the peers' as artifacts) and
 * calls report/report.h. It runs apart from the monitor because fetches wait on the network. */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "report/report.h"

/* After a restart: the run reports that were pending when the gateway stopped (jobs that
 * succeeded here in the last hour, as origin or of this cluster only, with neither a "report"
 * nor a "report_failed" event) are queued again. */
void nb__gw_report_recover(nb_gateway_t* gw, nb_job_store_t* st) {
  nb_job_record_t* r = NULL;
  size_t n = 0;
  if (nb_job_store_list(st, NULL, NB_JOB_SUCCEEDED, &r, &n) != NB_OK) return;
  int64_t since = nb_wall_ns() - 3600LL * 1000000000LL;
  for (size_t i = 0; i < n; i++) {
    if (r[i].updated_ns < since) continue;
    nb_job_fed_t fed;
    json_t* info = NULL;
    if (nb__gw_fed_load(st, r[i].id, &fed, &info) == NB_OK) {
      int member = strcmp(fed.role, "origin") != 0;
      nb__gw_fed_release(&fed, info);
      if (member) continue;
    }
    nb_job_event_t* ev = NULL;
    size_t ne = 0;
    int done = 0;
    if (nb_job_store_events(st, r[i].id, 0, 0, &ev, &ne) != NB_OK) continue;
    for (size_t k = 0; k < ne; k++)
      done |= !strcmp(ev[k].kind, "report") || !strcmp(ev[k].kind, "report_failed");
    nb_job_events_free(ev, ne);
    if (!done) nb__gw_report_queue(gw, r[i].id);
  }
  nb_job_records_free(r, n);
}

/* Queues the run report of a job that just succeeded here as its origin (or as a job of this
 * cluster only); the report thread builds it (nb__gw_report_loop), off every lock. */
void nb__gw_report_queue(nb_gateway_t* gw, const char* id) {
  pthread_mutex_lock(&gw->queue_mu);
  for (int k = 0; k < gw->n_report; k++)
    if (!strcmp(gw->report[k].id, id)) {
      pthread_mutex_unlock(&gw->queue_mu);
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
  pthread_mutex_unlock(&gw->queue_mu);
}

static void nb__report_event(nb_job_store_t* st, const char* id, const char* kind, json_t* j) {
  char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (txt) nb_job_store_append_event(st, id, kind, txt, NULL);
  free(txt);
  json_decref(j);
}

/* Copies file src to dst (dst's folder exists); 0 or -1 (errno). */
static int nb__copy_file(const nb_gateway_t* gw, const char* src, const char* dst) {
  int ifd = nb__gw_open_job_file(gw, src);
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
    const char* h = nb__gw_jstr(j, "sha256");
    if (!strcmp(nb__gw_jstr(j, "cluster"), cluster) && !strcmp(nb__gw_jstr(j, "name"), name) &&
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
  nb__gw_jobdir(gw, id, dir, sizeof dir);
  snprintf(rdir, sizeof rdir, "%s/report", dir);
  if (nb__gw_job_config(st, id, &cfg) != NB_OK) {
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
  loaded = nb__gw_fed_load(st, id, &fed, &info) == NB_OK;
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
    if (nb__gw_mkdirs(cdir) != 0) {
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
      nb_tls_t* tls = nb_tls_source_get(gw->tls_src); /* the pair in use now (SIGHUP reloads) */
      o.tls = tls;
      o.account = gw->art;
      o.expected_cluster = c;
      o.job_id = id;
      o.secret = fed.secret;
      o.name = have ? by_hash : name;
      o.dest = dst;
      o.timeout_ms = gw->cfg.federation_timeout_ms < 5000 ? gw->cfg.federation_timeout_ms : 5000;
      nb_status_t fs = nb_artifact_fetch(&o, NULL);
      nb_tls_destroy(tls);
      if (fs == NB_OK) continue;
      if (last)
        snprintf(err, sizeof err, "fetching %s from cluster '%s': %s", name, c, nb_error_last());
      else
        done = 0;
    }
  }
  if (err[0] || !done) goto out;
  nb_report_options_t ro = {.title = cfg->name, .job = cfg};
  nb_status_t s = nb_report_write_opts(rdir, ids, n, &ro);
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
  if (loaded) nb__gw_fed_release(&fed, info);
  nb_job_events_free(ev, nev);
  nb_free(cfg);
  return done;
}

/* Whether the run report of job id is queued and not yet written or given up. */
int nb__gw_report_pending(nb_gateway_t* gw, const char* id) {
  /* a job's end and the report it queues are recorded under record_mu: once it is ours, a job
   * seen final has its report queued (or none is to come) */
  pthread_mutex_lock(&gw->record_mu);
  pthread_mutex_lock(&gw->queue_mu);
  int found = 0;
  for (int k = 0; k < gw->n_report; k++) found |= !strcmp(gw->report[k].id, id);
  pthread_mutex_unlock(&gw->queue_mu);
  pthread_mutex_unlock(&gw->record_mu);
  return found;
}

/* One try at each pending report that is due, off every lock. */
static void nb__report_step(nb_gateway_t* gw, nb_job_store_t* st) {
  nb__report_t todo[NB__MAX_REPORTS];
  pthread_mutex_lock(&gw->queue_mu);
  int n = gw->n_report;
  memcpy(todo, gw->report, sizeof todo);
  pthread_mutex_unlock(&gw->queue_mu);
  for (int i = 0; i < n && !gw->stopping; i++) {
    double now = nb_now_s();
    if (now < todo[i].next) continue;
    if (!nb__report_try(gw, st, &todo[i], now >= todo[i].deadline)) {
      todo[i].next = nb_now_s() + 0.2;
      pthread_mutex_lock(&gw->queue_mu);
      for (int k = 0; k < gw->n_report; k++)
        if (!strcmp(gw->report[k].id, todo[i].id)) gw->report[k].next = todo[i].next;
      pthread_mutex_unlock(&gw->queue_mu);
      continue;
    }
    pthread_mutex_lock(&gw->queue_mu);
    for (int k = 0; k < gw->n_report; k++)
      if (!strcmp(gw->report[k].id, todo[i].id)) {
        gw->report[k] = gw->report[--gw->n_report];
        break;
      }
    pthread_mutex_unlock(&gw->queue_mu);
  }
}

/* The report thread: fetching a peer's files may wait on the network, so it runs apart from
 * the monitor (which follows the jobs) and the federation thread. */
void* nb__gw_report_loop(void* arg) {
  nb_gateway_t* gw = arg;
  while (!gw->stopping) {
    nb__report_step(gw, gw->rep_store);
    nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  return NULL;
}
