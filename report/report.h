/* The run report: from each cluster's rounds.tsv and summary.json under a run folder, a job-level
 * summary.json and a self-contained report.html (tables and inline SVG charts, no scripts, no
 * external assets). Not here: live progress (nebula watch) or reading checkpoints. */
#ifndef NB_REPORT_REPORT_H
#define NB_REPORT_REPORT_H

#include "common/status.h"

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

/* `nebula report DIR [--title T]`: every subfolder of DIR holding a rounds.tsv is a cluster. */
#ifdef __cplusplus
}
#endif
#endif
