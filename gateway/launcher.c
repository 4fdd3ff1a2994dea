/* The launchers (gateway/launcher.h). local: fork + exec of a wrapper shell that leads a fresh
 * session, logs to files, and leaves the command's exit status in a file that survives a gateway
 * restart; mpirun: the same with mpirun -np W in front; slurm: a batch script, sbatch, squeue,
 * sacct, scancel (run as child processes). Sessions are found through /proc. It is not a scheduler
 * and knows no job store. */
#include "gateway/launcher.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"

extern char** environ;

static const char* const nb__kinds[] = {"local", "mpirun", "slurm"};

void nb_launcher_conf_defaults(nb_launcher_conf_t* c) {
  memset(c, 0, sizeof *c);
  c->kind = NB_LAUNCHER_LOCAL;
  c->slurm_poll_ms = 1000;
  snprintf(c->slurm_step, sizeof c->slurm_step, "srun");
}

nb_status_t nb_launcher_conf_check(const nb_launcher_conf_t* c) {
  if (strcmp(c->slurm_step, "srun") && strcmp(c->slurm_step, "mpirun"))
    return nb_error(NB_ERR_CONFIG,
                    "config: slurm.step: expected \"srun\" or \"mpirun\", found '%s'",
                    c->slurm_step);
  return NB_OK;
}

nb_status_t nb_launcher_parse(const char* name, nb_launcher_kind_t* out) {
  for (int i = 0; name && i < 3; i++) {
    if (!strcmp(name, nb__kinds[i])) {
      *out = (nb_launcher_kind_t)i;
      return NB_OK;
    }
  }
  return nb_error(NB_ERR_UNSUPPORTED,
                  "launcher '%s' is not available: expected \"local\", \"mpirun\" or \"slurm\"",
                  name ? name : "(null)");
}

const char* nb_launcher_name(nb_launcher_kind_t kind) {
  return (unsigned)kind < 3 ? nb__kinds[kind] : "?";
}

/* Fields of /proc/PID/stat after the command name: state (3), pgrp (5), session (6),
 * starttime (22). */
static int nb__proc_stat2(pid_t pid, char* state, pid_t* pgrp, pid_t* sid, uint64_t* start) {
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
  long long pg = 0, se = 0;
  unsigned long long t = 0;
  for (char* q = p; *q && field <= 22; q++) {
    if (*q != ' ') continue;
    field++;
    if (field == 5) pg = strtoll(q + 1, NULL, 10);
    if (field == 6) se = strtoll(q + 1, NULL, 10);
    if (field == 22) t = strtoull(q + 1, NULL, 10);
  }
  if (state) *state = st;
  if (pgrp) *pgrp = (pid_t)pg;
  if (sid) *sid = (pid_t)se;
  if (start) *start = t;
  return 1;
}

static int nb__proc_stat(pid_t pid, char* state, pid_t* pgrp, uint64_t* start) {
  return nb__proc_stat2(pid, state, pgrp, NULL, start);
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
  /* the status file is made afresh (set -C: O_EXCL, never through a link the job left) */
  cargv[2] =
      (char*)"\"$@\"; rc=$?; rm -f " NB_LAUNCH_EXIT ".tmp; set -C; echo $rc > " NB_LAUNCH_EXIT
             ".tmp && mv -f " NB_LAUNCH_EXIT ".tmp " NB_LAUNCH_EXIT "; exit $rc";
  cargv[3] = (char*)"nebula-job";
  for (size_t i = 0; i < na; i++) cargv[4 + i] = argv[i];
  NB_CHECK_GOTO(nb_calloc((void**)&cenv, ne0 + ne + 1, sizeof *cenv, "launch env"), st, fail);
  for (size_t i = 0; i < ne0; i++) cenv[i] = environ[i];
  for (size_t i = 0; i < ne; i++) cenv[ne0 + i] = env[i];

  memset(out, 0, sizeof *out);
  if (!realpath(jobdir, out->dir)) snprintf(out->dir, sizeof out->dir, "%s", jobdir);
  pid_t pid = fork();
  if (pid < 0) {
    st = NB_ERRNO("fork");
    goto fail;
  }
  if (pid == 0) {
    setsid(); /* session and process group leader: pgid == sid == pid */
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
  /* No window where a kill(-pid) misses: wait until the child leads its session (setpgid from
   * here would race with its setsid). */
  for (int i = 0; i < 20000 && getsid(pid) != pid; i++) {
    char stc = 0;
    if (!nb__proc_stat(pid, &stc, NULL, NULL) || stc == 'Z') break;
    nb_sleep_ns(50000);
  }
  out->kind = NB_LAUNCHER_LOCAL;
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

static int nb__slurm_alive(nb_launch_t* l);

int nb_launcher_alive(nb_launch_t* l) {
  if (l && l->kind == NB_LAUNCHER_SLURM) return nb__slurm_alive(l);
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
    pid_t pg = 0, sid = 0;
    if (nb__proc_stat2((pid_t)pid, &state, &pg, &sid, NULL) && (pg == pgid || sid == pgid) &&
        state != 'Z' && state != 'X')
      alive = 1;
  }
  closedir(d);
  return alive;
}

/* Signals the process group pgid and every process of session pgid (some moved to groups of
 * their own). Returns how many were signalled. */
static int nb__signal_session(pid_t pgid, int sig) {
  int n = kill(-pgid, sig) == 0;
  DIR* d = opendir("/proc");
  if (!d) return n;
  struct dirent* e;
  while ((e = readdir(d))) {
    char* end = NULL;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    char state = 0;
    pid_t pg = 0, sid = 0;
    if (nb__proc_stat2((pid_t)pid, &state, &pg, &sid, NULL) && sid == pgid && pg != pgid &&
        state != 'Z' && state != 'X' && kill((pid_t)pid, sig) == 0)
      n++;
  }
  closedir(d);
  return n;
}

nb_status_t nb_launcher_stop(pid_t pgid, int64_t grace_ms, int* killed) {
  if (killed) *killed = 0;
  if (pgid <= 0) return nb_error(NB_ERR_INVALID, "launcher: bad process group %d", (int)pgid);
  if (nb__signal_session(pgid, SIGTERM) == 0 && !nb_launcher_group_alive(pgid)) return NB_OK;
  int64_t deadline = nb_now_ns() + grace_ms * 1000000;
  while (nb_launcher_group_alive(pgid)) {
    if (nb_now_ns() >= deadline) {
      if (killed) *killed = 1;
      nb__signal_session(pgid, SIGKILL);
      int64_t hard = nb_now_ns() + 5000000000LL;
      while (nb_launcher_group_alive(pgid)) {
        if (nb_now_ns() >= hard)
          return nb_error(NB_ERR_TIMEOUT, "process group %d survived SIGKILL for 5 s", (int)pgid);
        nb__signal_session(pgid, SIGKILL); /* children forked meanwhile */
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
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* never a link */
  if (fd < 0) return nb_error(NB_ERR_NOT_FOUND, "no exit status in %s", path);
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  size_t n = r > 0 ? (size_t)r : 0;
  buf[n] = 0;
  char* end = NULL;
  long v = strtol(buf, &end, 10);
  if (end == buf || v < 0 || v > 255)
    return nb_error(NB_ERR_INVALID, "%s: not an exit status", path);
  *code = (int)v;
  return NB_OK;
}

/* ------------------------------------------------------------------ helpers for the others */

/* Runs argv (argv[0] looked up in PATH) with environ + env, stdin /dev/null, and collects its
 * stdout and stderr together into out (NUL-terminated, truncated to cap). Gives up after
 * timeout_ms (the tool is killed). Returns the exit status (128+N for signal N), -1 when it
 * could not run (out says why). */
static int nb__run(char* const* argv, char* const* env, char* out, size_t cap, int timeout_ms) {
  size_t ne = 0, ne0 = 0, o = 0;
  out[0] = 0;
  while (env && env[ne]) ne++;
  while (environ && environ[ne0]) ne0++;
  char** cenv = NULL;
  if (nb_calloc((void**)&cenv, ne0 + ne + 1, sizeof *cenv, "tool env") != NB_OK) {
    snprintf(out, cap, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < ne0; i++) cenv[i] = environ[i];
  for (size_t i = 0; i < ne; i++) cenv[ne0 + i] = env[i];
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    snprintf(out, cap, "pipe: %s", strerror(errno));
    nb_free(cenv);
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, argv[0], &fa, &at, argv, cenv);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  nb_free(cenv);
  close(fds[1]);
  if (rc != 0) {
    snprintf(out, cap, "cannot run %s: %s", argv[0], strerror(rc));
    close(fds[0]);
    return -1;
  }
  int64_t deadline = nb_now_ns() + (int64_t)timeout_ms * 1000000;
  int timed_out = 0;
  for (;;) {
    int64_t left = (deadline - nb_now_ns()) / 1000000;
    if (left <= 0) {
      timed_out = 1;
      kill(pid, SIGKILL);
      break;
    }
    struct pollfd pf = {fds[0], POLLIN, 0};
    int r = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char tmp[1024];
    ssize_t n = read(fds[0], tmp, sizeof tmp);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n && o + 1 < cap; i++) out[o++] = tmp[i];
    out[o] = 0;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    snprintf(out, cap, "%s did not answer within %d ms", argv[0], timeout_ms);
    return -1;
  }
  while (o > 0 && (out[o - 1] == '\n' || out[o - 1] == ' ')) out[--o] = 0;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define NB__ENV_NAME 64

/* The NAME of a "NAME=value" entry into name (NB__ENV_NAME bytes): 1 when it is a plain
 * variable name (letters, digits, '_'), which is all mpirun's -x and a script may hold. */
static int nb__env_name(const char* kv, char* name) {
  size_t n = 0;
  for (; kv[n] && kv[n] != '='; n++) {
    char ch = kv[n];
    int ok = ch == '_' || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
             (n > 0 && ch >= '0' && ch <= '9');
    if (!ok || n + 1 >= NB__ENV_NAME) return 0;
    name[n] = ch;
  }
  name[n] = 0;
  return n > 0 && kv[n] == '=';
}

/* The per-rank wrapper: $1 is the job folder, then the command. Each rank's stdout and stderr go
 * both to the job's logs and to ranks/<r>/; its exit status to ranks/<r>/exit_code. No single
 * quotes inside (it is quoted with them in the batch script). */
static const char nb__rank_sh[] =
    "d=\"$1/" NB_LAUNCH_RANKS
    "/${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-0}}\"; shift; "
    "mkdir -p \"$d\" || exit 126; rm -f \"$d/exit_code\"; "
    "{ { \"$@\"; echo $? > \"$d/exit_code\"; } 2>&1 1>&3 3>&- | tee -a \"$d/stderr.log\" >&2 3>&-; "
    "} 3>&1 | tee -a \"$d/stdout.log\"; "
    "rc=$(cat \"$d/exit_code\" 2>/dev/null); exit ${rc:-1}";

static nb_status_t nb__launch_mpirun(const nb_launcher_conf_t* conf, const char* jobdir,
                                     char* const* argv, char* const* env, int workers,
                                     nb_launch_t* out) {
  size_t na = 0, ne = 0;
  while (argv[na]) na++;
  while (env && env[ne]) ne++;
  char np[16], dir[1024];
  snprintf(np, sizeof np, "%d", workers);
  if (!realpath(jobdir, dir))
    return nb_error(NB_ERR_IO, "job folder %s: %s", jobdir, strerror(errno));
  char** a = NULL;
  char(*names)[NB__ENV_NAME] = NULL;
  NB_CHECK(nb_calloc((void**)&names, ne + 1, sizeof *names, "mpirun -x names"));
  nb_status_t cs =
      nb_calloc((void**)&a, na + 2 * ne + 32 + NB_LAUNCH_MAX_ARGS, sizeof *a, "mpirun argv");
  if (cs != NB_OK) {
    nb_free(names);
    return cs;
  }
  size_t k = 0;
  a[k++] = (char*)"mpirun";
  if (geteuid() == 0) a[k++] = (char*)"--allow-run-as-root";
  a[k++] = (char*)"--oversubscribe";
  a[k++] = (char*)"--bind-to";
  a[k++] = (char*)"none";
  a[k++] = (char*)"-np";
  a[k++] = np;
  /* every variable the gateway adds reaches every rank (-x NAME takes it from mpirun's
   * environment, which the wrapper shell inherits) */
  for (size_t i = 0; i < ne; i++) {
    if (!nb__env_name(env[i], names[i])) continue;
    a[k++] = (char*)"-x";
    a[k++] = names[i];
  }
  for (int i = 0; i < conf->mpirun_args.n; i++) a[k++] = (char*)conf->mpirun_args.v[i];
  a[k++] = (char*)"/bin/sh";
  a[k++] = (char*)"-c";
  a[k++] = (char*)nb__rank_sh;
  a[k++] = (char*)"nebula-rank";
  a[k++] = dir;
  for (size_t i = 0; i < na; i++) a[k++] = argv[i];
  a[k] = NULL;
  /* -x NAME needs NAME in mpirun's environment: the wrapper shell inherits env */
  nb_status_t st = nb_launcher_start(jobdir, a, env, out);
  nb_free(a);
  nb_free(names);
  if (st == NB_OK) out->kind = NB_LAUNCHER_MPIRUN;
  return st;
}

/* Appends s to the script, single-quoted for sh. */
static void nb__sh_quote(FILE* f, const char* s) {
  fputc('\'', f);
  for (; *s; s++) {
    if (*s == '\'')
      fputs("'\\''", f);
    else
      fputc(*s, f);
  }
  fputc('\'', f);
}

static nb_status_t nb__check_word(const char* what, const char* s) {
  for (const char* p = s; *p; p++)
    if (*p == '\n' || *p == '\r')
      return nb_error(NB_ERR_INVALID, "slurm: %s '%s' contains a line break", what, s);
  return NB_OK;
}

static nb_status_t nb__launch_slurm(const nb_launcher_conf_t* conf, const char* jobdir,
                                    char* const* argv, char* const* env, int workers,
                                    nb_launch_t* out) {
  memset(out, 0, sizeof *out);
  out->kind = NB_LAUNCHER_SLURM;
  out->slurm_poll_ms = conf->slurm_poll_ms > 0 ? conf->slurm_poll_ms : 1000;
  if (!realpath(jobdir, out->dir))
    return nb_error(NB_ERR_IO, "job folder %s: %s", jobdir, strerror(errno));
  for (const char* p = out->dir; *p; p++)
    if (*p == '%' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\\' || *p == '"')
      return nb_error(NB_ERR_INVALID,
                      "slurm: the job folder %s contains '%c', which #SBATCH paths cannot hold",
                      out->dir, *p);
  NB_CHECK(nb__check_word("partition", conf->partition));
  NB_CHECK(nb__check_word("account", conf->account));
  for (int i = 0; i < conf->sbatch_args.n; i++)
    NB_CHECK(nb__check_word("sbatch argument", conf->sbatch_args.v[i]));
  const char* base = strrchr(out->dir, '/');
  base = base ? base + 1 : out->dir;
  char path[1200];
  snprintf(path, sizeof path, "%s/%s", out->dir, NB_LAUNCH_SBATCH);
  FILE* f = fopen(path, "we");
  if (!f) return nb_error(NB_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  fprintf(f, "#!/bin/sh\n");
  fprintf(f, "# generated by the nebula gateway: the job's workers as one Slurm job\n");
  fprintf(f, "#SBATCH --job-name=nebula-%s\n", base);
  fprintf(f, "#SBATCH --ntasks=%d\n", workers > 0 ? workers : 1);
  fprintf(f, "#SBATCH --output=%s/%s\n", out->dir, NB_LAUNCH_STDOUT);
  fprintf(f, "#SBATCH --error=%s/%s\n", out->dir, NB_LAUNCH_STDERR);
  fprintf(f, "#SBATCH --open-mode=append\n");
  fprintf(f, "#SBATCH --chdir=%s\n", out->dir);
  if (conf->partition[0]) fprintf(f, "#SBATCH --partition=%s\n", conf->partition);
  if (conf->account[0]) fprintf(f, "#SBATCH --account=%s\n", conf->account);
  for (int i = 0; i < conf->sbatch_args.n; i++) fprintf(f, "#SBATCH %s\n", conf->sbatch_args.v[i]);
  fprintf(f, "rm -f %s\n", NB_LAUNCH_EXIT);
  if (!strcmp(conf->slurm_step, "mpirun")) {
    /* OpenMPI finds the allocation itself (ranks here, orted through srun elsewhere) */
    fprintf(f, "mpirun%s --bind-to none -np %d", geteuid() == 0 ? " --allow-run-as-root" : "",
            workers > 0 ? workers : 1);
    for (size_t i = 0; env && env[i]; i++) {
      char name[NB__ENV_NAME];
      if (nb__env_name(env[i], name)) fprintf(f, " -x %s", name);
    }
    for (int i = 0; i < conf->mpirun_args.n; i++) {
      fputc(' ', f);
      nb__sh_quote(f, conf->mpirun_args.v[i]);
    }
  } else {
    fputs("srun", f);
    for (int i = 0; i < conf->srun_args.n; i++) {
      fputc(' ', f);
      nb__sh_quote(f, conf->srun_args.v[i]);
    }
  }
  fputs(" /bin/sh -c ", f);
  nb__sh_quote(f, nb__rank_sh);
  fputs(" nebula-rank ", f);
  nb__sh_quote(f, out->dir);
  for (size_t i = 0; argv[i]; i++) {
    fputc(' ', f);
    nb__sh_quote(f, argv[i]);
  }
  fprintf(f, "\nrc=$?\necho $rc > %s.tmp && mv %s.tmp %s\nexit $rc\n", NB_LAUNCH_EXIT,
          NB_LAUNCH_EXIT, NB_LAUNCH_EXIT);
  if (fclose(f) != 0) return nb_error(NB_ERR_IO, "cannot write %s", path);
  char msg[2048];
  char* sargv[] = {(char*)"sbatch", (char*)"--parsable", path, NULL};
  int rc = nb__run(sargv, env, msg, sizeof msg, 30000);
  if (rc != 0) return nb_error(NB_ERR_UNAVAILABLE, "sbatch %s failed (%d): %s", path, rc, msg);
  /* --parsable: "ID" or "ID;cluster" on the last line */
  char* line = strrchr(msg, '\n');
  line = line ? line + 1 : msg;
  size_t n = strspn(line, "0123456789");
  if (n == 0 || n >= sizeof out->slurm_id)
    return nb_error(NB_ERR_UNAVAILABLE, "sbatch printed no job id: '%s'", msg);
  memcpy(out->slurm_id, line, n);
  out->slurm_id[n] = 0;
  out->last_alive = 1;
  return NB_OK;
}

nb_status_t nb_launcher_launch(const nb_launcher_conf_t* conf, const char* jobdir,
                               char* const* argv, char* const* env, int workers, nb_launch_t* out) {
  if (!conf || !jobdir || !argv || !argv[0] || !out)
    return nb_error(NB_ERR_INVALID, "launcher: NULL configuration, job folder or command");
  if (workers < 1) return nb_error(NB_ERR_INVALID, "launcher: %d workers", workers);
  switch (conf->kind) {
    case NB_LAUNCHER_LOCAL:
      return nb_launcher_start(jobdir, argv, env, out);
    case NB_LAUNCHER_MPIRUN:
      return nb__launch_mpirun(conf, jobdir, argv, env, workers, out);
    case NB_LAUNCHER_SLURM:
      return nb__launch_slurm(conf, jobdir, argv, env, workers, out);
  }
  return nb_error(NB_ERR_INVALID, "launcher: unknown kind %d", (int)conf->kind);
}

/* ------------------------------------------------------------------ slurm: follow, end, cancel */

static int nb__slurm_final(const char* state) {
  static const char* const fin[] = {"COMPLETED",     "CANCELLED",    "FAILED",    "TIMEOUT",
                                    "NODE_FAIL",     "PREEMPTED",    "BOOT_FAIL", "DEADLINE",
                                    "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"};
  for (size_t i = 0; i < sizeof fin / sizeof fin[0]; i++)
    if (!strncmp(state, fin[i], strlen(fin[i]))) return 1;
  return 0;
}

/* "A:B" (exit code A, signal B) → A, or 128+B. -1 when unreadable. */
static int nb__slurm_code(const char* s) {
  int a = -1, b = 0;
  if (sscanf(s, "%d:%d", &a, &b) < 1 || a < 0) return -1;
  return b > 0 ? 128 + b : (a > 255 ? 255 : a);
}

/* The job ended without writing exit_code (cancelled, timed out, the node failed): ask sacct
 * (accounting), then scontrol (the controller still remembers it), and write the file. */
static void nb__slurm_record_exit(nb_launch_t* l) {
  int code = -1;
  if (nb_launcher_exit_code(l->dir, &code) == NB_OK) return;
  char out[1024];
  char* sa[] = {(char*)"sacct",    (char*)"-n", (char*)"-X", (char*)"-P", (char*)"-o",
                (char*)"ExitCode", (char*)"-j", l->slurm_id, NULL};
  if (nb__run(sa, NULL, out, sizeof out, 10000) == 0 && out[0]) code = nb__slurm_code(out);
  if (code < 0) {
    char* sc[] = {(char*)"scontrol", (char*)"-o", (char*)"show", (char*)"job", l->slurm_id, NULL};
    if (nb__run(sc, NULL, out, sizeof out, 10000) == 0) {
      const char* e = strstr(out, " ExitCode=");
      if (e) code = nb__slurm_code(e + 10);
    }
  }
  if (code < 0) return;
  char path[1200], tmp[1210];
  snprintf(path, sizeof path, "%s/%s", l->dir, NB_LAUNCH_EXIT);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "we");
  if (!f) return;
  fprintf(f, "%d\n", code);
  if (fclose(f) == 0) rename(tmp, path);
}

static int nb__slurm_alive(nb_launch_t* l) {
  if (!l->slurm_id[0]) return 0;
  int64_t now = nb_now_ns();
  if (now < l->next_poll_ns) return l->last_alive;
  l->next_poll_ns = now + (int64_t)(l->slurm_poll_ms > 0 ? l->slurm_poll_ms : 1000) * 1000000;
  char out[1024];
  char* q[] = {(char*)"squeue",       (char*)"-h", (char*)"-j", l->slurm_id,
               (char*)"--states=all", (char*)"-o", (char*)"%T", NULL};
  /* Runs under the gateway's lock: a short timeout, and a pause after a failure. */
  int rc = nb__run(q, NULL, out, sizeof out, 5000);
  int alive;
  if (rc == 0 && out[0])
    alive = !nb__slurm_final(out);
  else if (rc == 0 || strstr(out, "Invalid job id"))
    alive = 0; /* no longer known: purged after it ended */
  else {
    NB_WARN("Slurm job %s: squeue failed (%d: %s); assuming it still runs, asking again in 10 s",
            l->slurm_id, rc, out);
    l->next_poll_ns = nb_now_ns() + 10000000000LL;
    alive = 1;
  }
  if (!alive && l->last_alive) nb__slurm_record_exit(l);
  l->last_alive = alive;
  return alive;
}

nb_status_t nb_launcher_cancel(nb_launch_t* l, int64_t grace_ms, int* killed) {
  if (killed) *killed = 0;
  if (!l) return nb_error(NB_ERR_INVALID, "launcher: NULL launch");
  if (l->kind != NB_LAUNCHER_SLURM) {
    if (l->pid <= 0) return NB_OK;
    return nb_launcher_stop(l->pid, grace_ms, killed);
  }
  if (!l->slurm_id[0]) return NB_OK;
  char out[1024];
  char* sc[] = {(char*)"scancel", l->slurm_id, NULL};
  int rc = nb__run(sc, NULL, out, sizeof out, 10000);
  if (rc != 0 && !strstr(out, "Invalid job id") && !strstr(out, "complet"))
    return nb_error(NB_ERR_UNAVAILABLE, "scancel %s failed (%d): %s", l->slurm_id, rc, out);
  int64_t deadline = nb_now_ns() + grace_ms * 1000000;
  int64_t hard = deadline + 10000000000LL;
  for (;;) {
    l->next_poll_ns = 0;
    if (!nb__slurm_alive(l)) return NB_OK;
    int64_t now = nb_now_ns();
    if (now >= hard)
      return nb_error(NB_ERR_TIMEOUT, "Slurm job %s still runs 10 s after scancel --signal=KILL",
                      l->slurm_id);
    if (now >= deadline && (!killed || !*killed)) {
      if (killed) *killed = 1;
      char* sk[] = {(char*)"scancel", (char*)"--full", (char*)"--signal=KILL", l->slurm_id, NULL};
      nb__run(sk, NULL, out, sizeof out, 10000);
      deadline = hard;
    }
    nb_sleep_ns(100000000);
  }
}

const char* nb_launcher_describe(const nb_launch_t* l, char* buf, size_t cap) {
  if (l && l->kind == NB_LAUNCHER_SLURM)
    snprintf(buf, cap, "Slurm job %s", l->slurm_id);
  else
    snprintf(buf, cap, "process %d", l ? (int)l->pid : 0);
  return buf;
}

void nb_launcher_to_json(const nb_launch_t* l, json_t* obj) {
  json_object_set_new(obj, "launcher", json_string(nb_launcher_name(l->kind)));
  json_object_set_new(obj, "pid", json_integer(l->pid));
  json_object_set_new(obj, "start_ticks", json_integer((json_int_t)l->start_ticks));
  if (l->slurm_id[0]) json_object_set_new(obj, "slurm_id", json_string(l->slurm_id));
  if (l->kind == NB_LAUNCHER_SLURM)
    json_object_set_new(obj, "slurm_poll_ms", json_integer(l->slurm_poll_ms));
  if (l->dir[0]) json_object_set_new(obj, "dir", json_string(l->dir));
}

int nb_launcher_from_json(json_t* obj, nb_launch_t* l) {
  memset(l, 0, sizeof *l);
  const char* k = json_string_value(json_object_get(obj, "launcher"));
  if (!k || nb_launcher_parse(k, &l->kind) != NB_OK) l->kind = NB_LAUNCHER_LOCAL;
  l->pid = (pid_t)json_integer_value(json_object_get(obj, "pid"));
  l->start_ticks = (uint64_t)json_integer_value(json_object_get(obj, "start_ticks"));
  const char* id = json_string_value(json_object_get(obj, "slurm_id"));
  if (id) snprintf(l->slurm_id, sizeof l->slurm_id, "%s", id);
  l->slurm_poll_ms = (int)json_integer_value(json_object_get(obj, "slurm_poll_ms"));
  const char* dir = json_string_value(json_object_get(obj, "dir"));
  if (dir) snprintf(l->dir, sizeof l->dir, "%s", dir);
  l->last_alive = 1;
  return l->kind == NB_LAUNCHER_SLURM ? l->slurm_id[0] != 0 : l->pid > 0;
}

json_t* nb_launcher_rank_codes(const char* jobdir, int workers) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", jobdir, NB_LAUNCH_RANKS);
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return NULL;
  json_t* a = json_array();
  for (int r = 0; r < workers && a; r++) {
    snprintf(path, sizeof path, "%s/%s/%d", jobdir, NB_LAUNCH_RANKS, r);
    int code = 0;
    if (nb_launcher_exit_code(path, &code) == NB_OK)
      json_array_append_new(a, json_integer(code));
    else
      json_array_append_new(a, json_null());
  }
  return a;
}
