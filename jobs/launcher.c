/* The local launcher (jobs/launcher.h): fork + exec of a wrapper shell that leads a fresh process
 * group, logs to files, and leaves the command's exit status in a file that survives a gateway
 * restart. Process groups are found through /proc. It is not a scheduler and knows no job store. */
#include "jobs/launcher.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"

extern char** environ;

nb_status_t nb_launcher_parse(const char* name, nb_launcher_kind_t* out) {
  if (name && !strcmp(name, "local")) {
    *out = NB_LAUNCHER_LOCAL;
    return NB_OK;
  }
  return nb_error(NB_ERR_UNSUPPORTED,
                  "launcher '%s' is not available: only \"local\" is (mpirun and slurm are not "
                  "implemented yet)",
                  name ? name : "(null)");
}

/* Fields of /proc/PID/stat after the command name: state (3), pgrp (5), starttime (22). */
static int nb__proc_stat(pid_t pid, char* state, pid_t* pgrp, uint64_t* start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char* p = strrchr(buf, ')');
  if (!p) return 0;
  p += 2; /* field 3 */
  char st = *p;
  int field = 3;
  long long pg = 0;
  unsigned long long t = 0;
  for (char* q = p; *q && field <= 22; q++) {
    if (*q != ' ') continue;
    field++;
    if (field == 5) pg = strtoll(q + 1, NULL, 10);
    if (field == 22) t = strtoull(q + 1, NULL, 10);
  }
  if (state) *state = st;
  if (pgrp) *pgrp = (pid_t)pg;
  if (start) *start = t;
  return 1;
}

nb_status_t nb_launcher_start(const char* jobdir, char* const* argv, char* const* env,
                              nb_launch_t* out) {
  if (!jobdir || !argv || !argv[0] || !out)
    return nb_error(NB_ERR_INVALID, "launcher: NULL job folder or command");
  nb_status_t st = NB_OK;
  char path[4096];
  int fd_out = -1, fd_err = -1, fd_null = -1;
  char** cargv = NULL;
  char** cenv = NULL;
  size_t na = 0, ne = 0, ne0 = 0;
  while (argv[na]) na++;
  while (env && env[ne]) ne++;
  while (environ && environ[ne0]) ne0++;

  snprintf(path, sizeof path, "%s/%s", jobdir, NB_LAUNCH_STDOUT);
  fd_out = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_out < 0) {
    st = NB_ERRNO("open stdout log");
    goto fail;
  }
  snprintf(path, sizeof path, "%s/%s", jobdir, NB_LAUNCH_STDERR);
  fd_err = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_err < 0) {
    st = NB_ERRNO("open stderr log");
    goto fail;
  }
  fd_null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd_null < 0) {
    st = NB_ERRNO("open /dev/null");
    goto fail;
  }
  /* Everything the child needs is built before fork: only async-signal-safe calls after it. */
  NB_CHECK_GOTO(nb_calloc((void**)&cargv, na + 5, sizeof *cargv, "launch argv"), st, fail);
  cargv[0] = (char*)"/bin/sh";
  cargv[1] = (char*)"-c";
  cargv[2] = (char*)"\"$@\"; rc=$?; echo $rc > " NB_LAUNCH_EXIT ".tmp && mv " NB_LAUNCH_EXIT
                    ".tmp " NB_LAUNCH_EXIT "; exit $rc";
  cargv[3] = (char*)"nebula-job";
  for (size_t i = 0; i < na; i++) cargv[4 + i] = argv[i];
  NB_CHECK_GOTO(nb_calloc((void**)&cenv, ne0 + ne + 1, sizeof *cenv, "launch env"), st, fail);
  for (size_t i = 0; i < ne0; i++) cenv[i] = environ[i];
  for (size_t i = 0; i < ne; i++) cenv[ne0 + i] = env[i];

  pid_t pid = fork();
  if (pid < 0) {
    st = NB_ERRNO("fork");
    goto fail;
  }
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    if (chdir(jobdir) != 0) _exit(126);
    if (dup2(fd_null, 0) < 0 || dup2(fd_out, 1) < 0 || dup2(fd_err, 2) < 0) _exit(126);
    syscall(SYS_close_range, 3u, ~0u, 0u);
    execve("/bin/sh", cargv, cenv);
    _exit(127);
  }
  setpgid(pid, pid); /* also in the parent: no window where a kill(-pid) misses */
  out->pid = pid;
  out->start_ticks = 0;
  nb__proc_stat(pid, NULL, NULL, &out->start_ticks);
fail:
  if (fd_out >= 0) close(fd_out);
  if (fd_err >= 0) close(fd_err);
  if (fd_null >= 0) close(fd_null);
  nb_free(cargv);
  nb_free(cenv);
  return st;
}

int nb_launcher_alive(const nb_launch_t* l) {
  char state = 0;
  uint64_t start = 0;
  if (!l || l->pid <= 0 || !nb__proc_stat(l->pid, &state, NULL, &start)) return 0;
  if (state == 'Z' || state == 'X') return 0;
  return l->start_ticks == 0 || start == l->start_ticks;
}

int nb_launcher_group_alive(pid_t pgid) {
  if (pgid <= 0) return 0;
  DIR* d = opendir("/proc");
  if (!d) return kill(-pgid, 0) == 0;
  int alive = 0;
  struct dirent* e;
  while (!alive && (e = readdir(d))) {
    char* end = NULL;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    char state = 0;
    pid_t pg = 0;
    if (nb__proc_stat((pid_t)pid, &state, &pg, NULL) && pg == pgid && state != 'Z' && state != 'X')
      alive = 1;
  }
  closedir(d);
  return alive;
}

nb_status_t nb_launcher_stop(pid_t pgid, int64_t grace_ms, int* killed) {
  if (killed) *killed = 0;
  if (pgid <= 0) return nb_error(NB_ERR_INVALID, "launcher: bad process group %d", (int)pgid);
  if (kill(-pgid, SIGTERM) != 0 && errno == ESRCH) return NB_OK;
  int64_t deadline = nb_now_ns() + grace_ms * 1000000;
  while (nb_launcher_group_alive(pgid)) {
    if (nb_now_ns() >= deadline) {
      if (killed) *killed = 1;
      kill(-pgid, SIGKILL);
      int64_t hard = nb_now_ns() + 5000000000LL;
      while (nb_launcher_group_alive(pgid)) {
        if (nb_now_ns() >= hard)
          return nb_error(NB_ERR_TIMEOUT, "process group %d survived SIGKILL for 5 s", (int)pgid);
        nb_sleep_ns(20000000);
      }
      break;
    }
    nb_sleep_ns(20000000);
  }
  return NB_OK;
}

nb_status_t nb_launcher_exit_code(const char* jobdir, int* code) {
  char path[4096], buf[32];
  snprintf(path, sizeof path, "%s/%s", jobdir, NB_LAUNCH_EXIT);
  FILE* f = fopen(path, "re");
  if (!f) return nb_error(NB_ERR_NOT_FOUND, "no exit status in %s", path);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char* end = NULL;
  long v = strtol(buf, &end, 10);
  if (end == buf || v < 0 || v > 255)
    return nb_error(NB_ERR_INVALID, "%s: not an exit status", path);
  *code = (int)v;
  return NB_OK;
}
