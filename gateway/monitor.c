/* The monitor thread: follows the processes of running jobs, turns progress lines into
 * "progress" events and a process's end into an "exit" event and the job's final state, and
 * hands the jobs that succeeded to publish.c. Not here: starting jobs (start.c). */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"

/* Appends new complete lines of the job's progress file as "progress" events. */
void nb__gw_tail_progress(nb_gateway_t* gw, nb_job_store_t* store, nb__active_t* a) {
  char path[sizeof a->dir + 32];
  snprintf(path, sizeof path, "%s/%s", a->dir, NB_LAUNCH_PROGRESS);
  int pfd = nb__gw_open_job_file(gw, path);
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

void nb__gw_log_launched(nb_gateway_t* gw, const char* id) {
  char what[64] = "?";
  const char* launcher = "?";
  int workers = 0;
  pthread_mutex_lock(&gw->active_mu);
  int k = nb__gw_active_find(gw, id);
  if (k >= 0) {
    nb_launcher_describe(&gw->active[k].launch, what, sizeof what);
    launcher = nb_launcher_name(gw->active[k].launch.kind);
    workers = gw->active[k].workers;
  }
  pthread_mutex_unlock(&gw->active_mu);
  NB_INFO(JOB, "job %s launched: %s (%s launcher), %d worker%s", id, what, launcher, workers,
          workers == 1 ? "" : "s");
}

/* Records the end of a job's process: exit event, final state unless already final. */
void nb__gw_job_ended(nb_gateway_t* gw, nb_job_store_t* store, nb__active_t* a, int code, int sig,
                      const char* how) {
  nb__gw_tail_progress(gw, store, a);
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
  pthread_mutex_lock(&gw->record_mu); /* the end and the report it queues, at once */
  if (!a->cancel_reason[0] && nb__gw_fed_load(store, a->id, &fed, &info) == NB_OK) {
    federated = 1;
    origin = !strcmp(fed.role, "origin");
    if (!origin) nb__gw_fed_release(&fed, info);
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
    if (to == NB_JOB_SUCCEEDED) {
      pthread_mutex_lock(&gw->queue_mu);
      if (gw->n_publish < 16) snprintf(gw->publish[gw->n_publish++], NB_JOB_ID_MAX, "%s", a->id);
      pthread_mutex_unlock(&gw->queue_mu);
    }
    NB_INFO(JOB, "job %s finished: %s, exit code %d%s%s, %s%s%s", a->id, what, code,
            sig ? ", signal " : "", sig ? strsignal(sig) : "", nb_job_state_name(to),
            reason[0] ? ": " : "", reason);
    if (origin) {
      /* this cluster's part of a federated job ended: the job's state is the aggregate */
      nb__gw_fed_cluster_state(store, a->id, info, gw->cfg.cluster_id, nb_job_state_name(to),
                               reason);
      nb__gw_fed_aggregate(gw, store, a->id, info);
      if (nb__gw_fed_save(store, &fed, info) != NB_OK)
        NB_WARN("job %s: cannot record its federation state: %s", a->id, nb_error_last());
    } else if (nb_job_store_transition(store, a->id, to, reason) != NB_OK) {
      NB_WARN("job %s: cannot record its end: %s", a->id, nb_error_last());
    } else if (to == NB_JOB_SUCCEEDED && !federated && !a->cancel_reason[0] &&
               !nb__gw_job_runs_program(store, a->id)) {
      nb__gw_report_queue(gw, a->id); /* a job of this cluster only, of the built-in model */
    }
  }
  pthread_mutex_unlock(&gw->record_mu);
  if (origin) nb__gw_fed_release(&fed, info);
  nb_job_record_clear(&rec);
}

/* One look at every launched job under active_mu: a process that ended is marked `ending` and
 * copied to gw->ended[] (its end is recorded without the lock, nb__monitor_pass); the others'
 * new progress lines are recorded. Returns how many ended. */
static int nb__monitor_poll(nb_gateway_t* gw) {
  int n_ended = 0;
  pthread_mutex_lock(&gw->active_mu);
  for (int i = 0; i < gw->n_active; i++) {
    nb__active_t* a = &gw->active[i];
    if (!nb__launched(a) || a->ending) continue; /* a reservation: nothing runs yet */
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
      nb__gw_tail_progress(gw, gw->mon_store, a);
      continue;
    }
    a->ending = 1;
    gw->ended[n_ended].a = *a;
    gw->ended[n_ended].code = code;
    gw->ended[n_ended].sig = sig;
    n_ended++;
  }
  pthread_mutex_unlock(&gw->active_mu);
  return n_ended;
}

/* One pass of the monitor: the ends seen by nb__monitor_poll recorded, their entries retired
 * (which frees their slots and lets a waiting Cancel answer), then the outputs of the jobs
 * that succeeded published. */
static void nb__monitor_pass(nb_gateway_t* gw) {
  int n_ended = nb__monitor_poll(gw);
  for (int i = 0; i < n_ended; i++) {
    nb__ended_t* e = &gw->ended[i];
    nb__gw_job_ended(gw, gw->mon_store, &e->a, e->code, e->sig,
                     e->code == -1 && !e->sig ? " (no exit status recorded)" : "");
  }
  pthread_mutex_lock(&gw->active_mu);
  for (int i = 0; i < n_ended; i++) {
    int k = nb__gw_active_find(gw, gw->ended[i].a.id);
    if (k >= 0 && gw->active[k].ending) gw->active[k] = gw->active[--gw->n_active];
  }
  pthread_mutex_unlock(&gw->active_mu);
  char todo[16][NB_JOB_ID_MAX];
  pthread_mutex_lock(&gw->queue_mu);
  int n_todo = gw->n_publish;
  memcpy(todo, gw->publish, sizeof todo);
  gw->n_publish = 0;
  pthread_mutex_unlock(&gw->queue_mu);
  for (int i = 0; i < n_todo; i++) nb__gw_publish(gw, gw->mon_store, todo[i]);
}

void* nb__gw_monitor(void* arg) {
  nb_gateway_t* gw = arg;
  while (!gw->stopping) {
    nb__monitor_pass(gw);
    nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  return NULL;
}
