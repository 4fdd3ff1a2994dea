/* Launchers: start a job's workers on this cluster, follow them, stop them, and find them again
 * after a gateway restart from what was recorded. Three kinds: "local" (the command once, in a
 * fresh session), "mpirun" (mpirun -np W of the command, per-rank folders), "slurm" (a batch
 * script submitted with sbatch, followed with squeue/sacct, cancelled with scancel). It does not
 * know the job store or descriptors: the gateway builds the command and records what it reports. */
#ifndef NB_GATEWAY_LAUNCHER_H
#define NB_GATEWAY_LAUNCHER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"
#include "jobs/job_program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  NB_LAUNCHER_LOCAL = 0, /* fork/exec of the command on this host */
  NB_LAUNCHER_MPIRUN,    /* mpirun -np W of the command on this host */
  NB_LAUNCHER_SLURM,     /* sbatch of a generated batch script; srun of the command */
} nb_launcher_kind_t;

#define NB_LAUNCH_MAX_ARGS 16
#define NB_LAUNCH_ARG 256

/* A list of extra words for a tool's command line. */
typedef struct {
  int n;
  char v[NB_LAUNCH_MAX_ARGS][NB_LAUNCH_ARG];
} nb_launcher_args_t;

/* How jobs start (the gateway config's "launcher", "mpirun.*" and "slurm.*" keys). */
typedef struct {
  nb_launcher_kind_t kind;
  nb_launcher_args_t mpirun_args; /* extra mpirun flags, before the command */
  char partition[NB_LAUNCH_ARG];  /* #SBATCH --partition ("" = Slurm's default) */
  char account[NB_LAUNCH_ARG];    /* #SBATCH --account ("" = none) */
  nb_launcher_args_t sbatch_args; /* extra #SBATCH lines, e.g. "--time=10" */
  nb_launcher_args_t srun_args;   /* extra srun flags, e.g. "--mpi=pmix" */
  char slurm_step[16];            /* how the batch script starts the ranks: "srun" (default)
                                     or "mpirun" (OpenMPI inside the allocation) */
  int slurm_poll_ms;              /* at most one squeue per job this often (default 1000) */
} nb_launcher_conf_t;

/* Names of the files inside a job folder. */
#define NB_LAUNCH_STDOUT "stdout.log"
#define NB_LAUNCH_STDERR "stderr.log"
#define NB_LAUNCH_EXIT "exit_code"              /* written by the wrapper when the command ends */
#define NB_LAUNCH_PROGRESS NB_JOB_PROGRESS_FILE /* jobs/job_program.h */
#define NB_LAUNCH_RANKS "ranks" /* mpirun, slurm: ranks/<r>/{stdout.log,stderr.log,exit_code} */
#define NB_LAUNCH_SBATCH "job.sbatch" /* slurm: the generated batch script */

/* What was started. */
typedef struct {
  nb_launcher_kind_t kind;
  pid_t pid;            /* local, mpirun: the wrapper shell, leader of the job's session and
                           process group (sid == pgid == pid); 0 for slurm */
  uint64_t start_ticks; /* the process's start time (/proc/PID/stat field 22): tells a live job
                           from an unrelated process that reused the pid after a restart */
  char slurm_id[32];    /* slurm: the job id sbatch printed */
  int slurm_poll_ms;    /* slurm: squeue at most this often */
  int64_t next_poll_ns; /* slurm: when squeue may run again */
  int last_alive;       /* slurm: its answer until then */
  char dir[1024];       /* the job folder, absolute (exit_code, ranks/) */
} nb_launch_t;

/* Every launcher option at its default (local). */
void nb_launcher_conf_defaults(nb_launcher_conf_t* c);

/* Checks the values the option table cannot: slurm_step. NB_ERR_CONFIG naming the key. */
nb_status_t nb_launcher_conf_check(const nb_launcher_conf_t* c);

/* Parses "local", "mpirun" or "slurm". NB_ERR_UNSUPPORTED names the ones that exist. */
nb_status_t nb_launcher_parse(const char* name, nb_launcher_kind_t* out);
/* "local", "mpirun", "slurm". */
const char* nb_launcher_name(nb_launcher_kind_t kind);

/* Starts a job's `workers` workers of argv (NULL-terminated; argv[0] looked up in PATH) in
 * `jobdir` (must exist) with the launcher `conf` says, and fills *out:
 * - local: nb_launcher_start of argv (workers is only recorded);
 * - mpirun: nb_launcher_start of `mpirun -np W [--allow-run-as-root when root] --oversubscribe
 *   --bind-to none -x NAME for every entry of env [mpirun.args] /bin/sh -c RANK argv...`, where
 * RANK keeps each rank's stdout/stderr in jobdir/ranks/<r>/ (and in the job's logs) and its exit
 * status in jobdir/ranks/<r>/exit_code;
 * - slurm: writes jobdir/job.sbatch (job name, --ntasks W, --output/--error the job's logs,
 *   --chdir jobdir, partition, account, extra lines; srun of RANK argv, or with slurm_step
 *   "mpirun" `mpirun -np W -x NAME... [mpirun.args]` of it; exit_code at the end)
 *   and submits it with `sbatch --parsable`; pid is 0, slurm_id is set. The caller must not reap.
 * env: extra "K=V" entries for the workers (NULL-terminated, may be NULL). For local and mpirun
 * the caller is the parent and reaps the pid (waitpid). Returns NB_OK; NB_ERR_INVALID;
 * NB_ERR_SYSTEM (fork, files); NB_ERR_UNAVAILABLE (sbatch failed: its message). Thread-safe. */
nb_status_t nb_launcher_launch(const nb_launcher_conf_t* conf, const char* jobdir,
                               char* const* argv, char* const* env, int workers, nb_launch_t* out);

/* Stops a job's workers: nb_launcher_stop of the session for local and mpirun; scancel for slurm,
 * then scancel --signal=KILL after grace_ms, until squeue shows the job ended (or forgotten).
 * *killed (optional) is 1 when SIGKILL was needed. Returns NB_OK once nothing of the job runs;
 * NB_ERR_TIMEOUT; NB_ERR_UNAVAILABLE (scancel failed). */
nb_status_t nb_launcher_cancel(nb_launch_t* l, int64_t grace_ms, int* killed);

/* "process 1234" or "Slurm job 56", for messages. Returns buf. */
const char* nb_launcher_describe(const nb_launch_t* l, char* buf, size_t cap);

/* Adds what re-attaching needs to a JSON object ("launcher", "pid", "start_ticks", "slurm_id",
 * "dir");
 * nb_launcher_from_json reads it back (a record without "launcher" is local). from_json returns
 * 1 when the record names a job (a pid or a Slurm id), else 0. */
void nb_launcher_to_json(const nb_launch_t* l, json_t* obj);
int nb_launcher_from_json(json_t* obj, nb_launch_t* l);

/* Exit status of each rank in jobdir/ranks/<r>/exit_code for r < workers, as a JSON array
 * (null where a rank left none: it was killed or never started); NULL when there is no ranks
 * folder (local launcher). The caller owns the reference. */
json_t* nb_launcher_rank_codes(const char* jobdir, int workers);

/* The local launcher. Starts argv[0..] (argv NULL-terminated; argv[0] looked up in PATH) in
 * `jobdir` (must exist) as the leader of a new session and process group, through `/bin/sh -c` that
 * records the command's exit status in jobdir/exit_code (128+N when killed by signal N). stdin is
 * /dev/null; stdout and stderr go to jobdir/stdout.log and stderr.log (appended). env: extra "K=V"
 * entries (NULL-terminated, may be NULL). The caller is the parent and must reap the pid (waitpid).
 * Returns NB_OK; NB_ERR_INVALID; NB_ERR_SYSTEM (fork, log files). Thread-safe. */
nb_status_t nb_launcher_start(const char* jobdir, char* const* argv, char* const* env,
                              nb_launch_t* out);

/* Whether the job of `l` still runs. local, mpirun: its process is alive and is the same process
 * (start time matches; a zombie counts as gone). slurm: squeue (at most every slurm_poll_ms;
 * the answer is kept in between) shows it in a state that is not final; a job squeue no longer
 * knows, or knows as ended, is gone. When a Slurm job is found ended and left no exit_code file
 * (cancelled, timed out), one is written from sacct or scontrol's ExitCode (128+N for signal N).
 * When Slurm cannot be asked (squeue fails or takes over 5 s), the job counts as alive and
 * squeue waits 10 s before the next try. */
int nb_launcher_alive(nb_launch_t* l);

/* Sends SIGTERM to the whole process group and session pgid (processes that moved to a process
 * group of their own, as mpirun's ranks do, are still in the session), waits up to grace_ms for
 * every member to go, then SIGKILL to what remains. The caller reaps the leader (a zombie counts as
 * gone). *killed (optional) is 1 when SIGKILL was needed. Returns NB_OK once no process of the
 * group is left, NB_ERR_TIMEOUT if some survived SIGKILL for 5 s. */
nb_status_t nb_launcher_stop(pid_t pgid, int64_t grace_ms, int* killed);

/* Whether any process of group or session pgid is still alive (zombies excluded). */
int nb_launcher_group_alive(pid_t pgid);

/* Reads jobdir/exit_code: NB_OK with *code, NB_ERR_NOT_FOUND when absent, NB_ERR_INVALID. */
nb_status_t nb_launcher_exit_code(const char* jobdir, int* code);

#ifdef __cplusplus
}
#endif
#endif
