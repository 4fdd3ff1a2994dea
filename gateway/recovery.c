/* A gateway's start over an existing work_dir: the store must be there if job folders are,
 * folders without a record are named, and the jobs of an earlier run are re-attached or
 * finished. Not here: the run reports left pending (report_queue.c). */
#include "gateway/gateway_internal.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"

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
nb_status_t nb__gw_recover(nb_gateway_t* gw) {
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
    nb__gw_jobdir(gw, a.id, a.dir, sizeof a.dir);
    nb_job_fed_t fed;
    json_t* info = NULL;
    if (nb__gw_fed_load(st, a.id, &fed, &info) == NB_OK) {
      /* a federated job with no workers here: its clusters report to us, nothing to attach */
      int here = (int)json_integer_value(
          json_object_get(nb__gw_fed_cluster(info, gw->cfg.cluster_id), "workers"));
      nb__gw_fed_release(&fed, info);
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
      nb__gw_job_ended(gw, st, &a, code, code > 128 && code < 193 ? code - 128 : 0,
                       " while the gateway was down");
    } else {
      nb__gw_tail_progress(gw, st, &a);
      char reason[256];
      snprintf(reason, sizeof reason,
               "%s is gone and left no exit status (it died while the gateway was down)", what);
      nb_job_store_transition(st, a.id, NB_JOB_FAILED, reason);
      NB_WARN("job %s: %s: marked failed", a.id, reason);
    }
  }
  nb_job_records_free(r, n);
  nb__gw_report_recover(gw, st);
  return NB_OK;
}

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
nb_status_t nb__gw_store_present(nb_gateway_t* gw) {
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
void nb__gw_store_orphans(nb_gateway_t* gw) {
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
