/* The run report: from each cluster's rounds.tsv, summary.json and (when present) curve.tsv under
 * a run folder, a job-level summary.json and a self-contained report.html (tables and inline SVG
 * charts, no scripts, no external assets). Not here: live progress (nebula watch) or reading
 * checkpoints. */
#ifndef NB_REPORT_REPORT_H
#define NB_REPORT_REPORT_H

#include "common/status.h"
#include "jobs/job_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads run_dir/<cluster_ids[i]>/rounds.tsv and summary.json for i < n (borrowed strings) and
 * writes run_dir/summary.json (per cluster: rounds, final loss and eval, WAN bytes, bits/param
 * per sync, utilization, wall, θ_global hash, translation chrF/BLEU of the base and the final
 * model when the cluster's summary has them; whether the hashes agree) and run_dir/report.html,
 * each atomically (temp file, fsync, rename). title (NULL = the job name from the first summary)
 * is HTML-escaped like every string read from the files. A "translation" entry of the wrong
 * shape is skipped with a warning and a score that is missing, not a number or outside [0, 100]
 * is shown as a dash (null in summary.json): they never fail the report. Returns NB_ERR_INVALID
 * for n < 1 or malformed input (detail names the file and line), NB_ERR_IO for a missing or
 * unreadable file or a failed write (no temp file is left behind), NB_ERR_NOMEM. Thread-safe
 * for distinct run_dir. */
nb_status_t nb_report_write(const char* run_dir, const char* const* cluster_ids, int n,
                            const char* title);

/* What nb_report_write_opts takes beyond the run folder; zero-initialised = nb_report_write. */
typedef struct {
  const char* title; /* NULL or "" = the job name from the first summary; borrowed */
  /* The job's settings (borrowed; NULL = none): the configuration block then shows the model's
   * shape, the training, sync, compression and link settings as the descriptor gave them.
   * Without it the block shows what the summaries say (job, clusters, mode, values, steps). */
  const nb_job_config_t* job;
} nb_report_options_t;

/* nb_report_write with options (opts NULL = all defaults). The report also holds a configuration
 * block (job, clusters, model, steps, compression, link, the nebula version and the generation
 * time in UTC: the one part of report.html that differs between two reports of the same files)
 * and the held-out evaluation curve: bits per byte by inner step, from a cluster's curve.tsv
 * (step, samples, seconds, one column per language, mean; as `nebula train` writes it) when it
 * has one, else from its summary's "evals" list and final evaluation. A curve.tsv that does not
 * parse is skipped with a warning (the summary's points are drawn instead). Returns as
 * nb_report_write. Thread-safe for distinct run_dir. */
nb_status_t nb_report_write_opts(const char* run_dir, const char* const* cluster_ids, int n,
                                 const nb_report_options_t* opts);

/* `nebula report DIR [--title T] [--job FILE]`: every subfolder of DIR holding a rounds.tsv is a
 * cluster. */
#ifdef __cplusplus
}
#endif
#endif
