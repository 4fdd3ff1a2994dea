/* `nebula train` and `nebula eval`: one cluster of a job descriptor trained by train/trainer.h,
 * and held-out bits per byte of a checkpoint. The mapping from a job's settings to the trainer's
 * config is exported for the commands that run several clusters. */
#ifndef NB_JOBS_TRAIN_CLI_H
#define NB_JOBS_TRAIN_CLI_H

#include "common/status.h"
#include "jobs/job_config.h"
#include "train/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills out with the trainer settings of cluster `cluster` (index into job->clusters) of job:
 * model, seed, batch (workers W become W accumulated micro-batches: the mean gradient W ranks
 * would allreduce), steps and seconds, optimizer, LoRA, distillation, data files under data_dir
 * (NULL = the cluster's data.dir, else "data/<tier>"): mono/<lang>.txt, or
 * pairs/en-<x>.{train,dev}.tsv (an "x-en" pair reads the en-x files swapped); evaluation and
 * checkpoints every eval.everyRounds / checkpoint.everyRounds rounds of sync.innerSteps steps.
 * Checkpoint dir and progress hooks are left for the caller. NB_ERR_CONFIG naming the setting
 * that cannot be mapped. */
nb_status_t nb_train_config_from_job(const nb_job_config_t* job, int cluster, const char* data_dir,
                                     nb_train_config_t* out);

int nb_train_main(int argc, char** argv); /* nebula train */
int nb_eval_main(int argc, char** argv);  /* nebula eval */

#ifdef __cplusplus
}
#endif
#endif
