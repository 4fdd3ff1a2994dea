/* Launchers: start a job's processes on this cluster, follow them, and stop them. The local
 * launcher runs the job's command in a fresh process group in the job's own folder, with stdout
 * and stderr in log files. It does not know the job store or descriptors: the gateway builds the
 * command and records what the launcher reports. mpirun and Slurm launchers plug in here later
 * (nb_launcher_kind_t). */
#ifndef NB_JOBS_LAUNCHER_H
#define NB_JOBS_LAUNCHER_H

#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  NB_LAUNCHER_LOCAL = 0, /* fork/exec on this host */
  /* NB_LAUNCHER_MPIRUN, NB_LAUNCHER_SLURM: not yet */
} nb_launcher_kind_t;

/* Names of the files inside a job folder. */
#define NB_LAUNCH_STDOUT "stdout.log"
#define NB_LAUNCH_STDERR "stderr.log"
#define NB_LAUNCH_EXIT "exit_code"          /* written by the wrapper when the command ends */
#define NB_LAUNCH_PROGRESS "progress.jsonl" /* one JSON object per line, appended by the job */

/* What was started. */
typedef struct {
  pid_t pid;            /* the wrapper shell: leader of the job's process group (pgid == pid) */
  uint64_t start_ticks; /* the process's start time (/proc/PID/stat field 22): tells a live job
                           from an unrelated process that reused the pid after a restart */
} nb_launch_t;

/* Parses "local" (the only launcher for now). NB_ERR_UNSUPPORTED names the others. */
nb_status_t nb_launcher_parse(const char* name, nb_launcher_kind_t* out);

/* Starts argv[0..] (argv NULL-terminated; argv[0] looked up in PATH) in `jobdir` (must exist)
 * as the leader of a new process group, through `/bin/sh -c` that records the command's exit
 * status in jobdir/exit_code (128+N when killed by signal N). stdin is /dev/null; stdout and
 * stderr go to jobdir/stdout.log and stderr.log (appended). env: extra "K=V" entries
 * (NULL-terminated, may be NULL). The caller is the parent and must reap the pid (waitpid).
 * Returns NB_OK; NB_ERR_INVALID; NB_ERR_SYSTEM (fork, log files). Thread-safe. */
nb_status_t nb_launcher_start(const char* jobdir, char* const* argv, char* const* env,
                              nb_launch_t* out);

/* Whether the process of `l` is still alive and is the same process (start time matches; a
 * zombie counts as gone). */
int nb_launcher_alive(const nb_launch_t* l);

/* Sends SIGTERM to the whole process group, waits up to grace_ms for every member to go, then
 * SIGKILL to what remains. reap: 1 when the caller is the parent and lets this function reap
 * the leader (otherwise the caller reaps it later; a zombie leader counts as gone).
 * *killed (optional) is 1 when SIGKILL was needed. Returns NB_OK once no process of the group
 * is left, NB_ERR_TIMEOUT if some survived SIGKILL for 5 s. */
nb_status_t nb_launcher_stop(pid_t pgid, int64_t grace_ms, int* killed);

/* Whether any process of group pgid is still alive (zombies excluded). */
int nb_launcher_group_alive(pid_t pgid);

/* Reads jobdir/exit_code: NB_OK with *code, NB_ERR_NOT_FOUND when absent, NB_ERR_INVALID. */
nb_status_t nb_launcher_exit_code(const char* jobdir, int* code);

#ifdef __cplusplus
}
#endif
#endif
