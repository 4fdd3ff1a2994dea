/* `nebula worker` (one cluster's leader in a cross-datacenter job: the hybrid outer-sync loop
 * over inter/exchange) and `nebula run` (every cluster of a job on this machine, over loopback).
 * The round logic itself is train/hybrid.h; these are the process and file plumbing. */
#ifndef NB_JOBS_WORKER_CLI_H
#define NB_JOBS_WORKER_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

int nb_worker_main(int argc, char** argv); /* nebula worker */
int nb_run_main(int argc, char** argv);    /* nebula run */

#ifdef __cplusplus
}
#endif
#endif
