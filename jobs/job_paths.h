/* Path confinement of a job descriptor run by a gateway: every path a descriptor names
 * (checkpoint.dir, model.base.checkpoint, data.dir, the distillation teacher, security.*,
 * program.workDir, program.files[i].path, and program.command[0] when it is a path rather than a
 * name) must resolve, symlinks followed, inside the job's own folder or one of the gateway's
 * allowed roots. A user's own `nebula train` / `nebula run` on their own machine is not
 * confined; this is for a gateway that runs someone else's descriptor with its own privileges
 * (docs/security.md). */
#ifndef NB_JOBS_JOB_PATHS_H
#define NB_JOBS_JOB_PATHS_H

#include "common/status.h"
#include "jobs/descriptor.h"
#include "jobs/job_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_JOB_PATHS_MAX_ROOTS 16
/* Environment of a job's processes started by a gateway: the allowed roots, ':'-separated. The
 * job's folder is NB_JOB_DIR; a process that sees NB_JOB_DIR confines itself. */
#define NB_JOB_PATHS_ENV "NB_JOB_ALLOW"

/* Checks every path of cfg. job_dir: the job's folder; relative paths are taken relative to it
 * (the folder a gateway starts the job's processes in). NULL = a folder that does not exist yet
 * (at submit: the gateway creates it afresh), where a relative path without ".." cannot leave it.
 * roots: n_roots folders (borrowed; need not be canonical) where data, base checkpoints,
 * teachers and TLS files may also lie; checkpoint.dir, which the job writes and prunes, must be
 * inside the job's folder. Each refusal is added to diag (optional) with the JSON path of the
 * field ("$.spec.checkpoint.dir") and a message saying why. Returns NB_OK or NB_ERR_PERMISSION
 * (the first refusal also in nb_error_last()). Thread-safe. */
nb_status_t nb_job_paths_check(const nb_job_config_t* cfg, const char* job_dir,
                               const char* const* roots, int n_roots, nb_descriptor_diag_t* diag);

/* For a job process (`nebula train`, `nebula worker`): when NB_JOB_DIR is set (a gateway started
 * us), nb_job_paths_check against the current folder with the roots of NB_JOB_ALLOW, before
 * anything is opened; NB_OK at once otherwise (a user's own run). Returns NB_OK or
 * NB_ERR_PERMISSION with every refusal in the message. */
nb_status_t nb_job_paths_confine_env(const nb_job_config_t* cfg);

#ifdef __cplusplus
}
#endif
#endif
