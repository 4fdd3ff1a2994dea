/* jobs: the umbrella header of the job-descriptor layer — the descriptor's schema, validation and
 * defaults (descriptor.h, job_config.h), the ACL (acl.h), job paths (job_paths.h), a program
 * job's NEBULA_* environment (job_program.h) and the input
 * checks the commands share (cli_checks.h). Data only: nothing here trains, listens or starts a
 * process. Include the specific header where only one part is needed. */
#ifndef NB_JOBS_JOBS_H
#define NB_JOBS_JOBS_H

#include "jobs/acl.h"
#include "jobs/cli_checks.h"
#include "jobs/descriptor.h"
#include "jobs/job_config.h"
#include "jobs/job_paths.h"
#include "jobs/job_program.h"

#endif
