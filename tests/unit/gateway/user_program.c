/* A user's own program as a gateway job runs it (spec.program): only <nebula.h> and libnebula.
 * It prints the NEBULA_* environment it was given (the secret file by its path and mode, never
 * its bytes), then, on the leader rank, opens the session from the environment, syncs one small
 * tensor for a few rounds and prints θ_global's hash (the rank from mpirun or srun). Options:
 * --rounds N (default 3), --exit N (print, then exit N at once), --sleep S (print, then sleep S
 * seconds: a job to cancel). */
#include <nebula.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char** environ;

int main(int argc, char** argv) {
  int rounds = 3, code = -1, sleep_s = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--exit")) code = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--sleep")) sleep_s = atoi(argv[i + 1]);
  }
  const char* rank_s = getenv("OMPI_COMM_WORLD_RANK");
  if (!rank_s) rank_s = getenv("SLURM_PROCID"); /* under srun */
  int rank = rank_s ? atoi(rank_s) : 0;
  for (char** e = environ; *e; e++)
    if (!strncmp(*e, "NEBULA_", 7)) printf("rank %d env %s\n", rank, *e);
  const char* sf = getenv("NEBULA_JOB_SECRET_FILE");
  struct stat sb;
  if (sf && stat(sf, &sb) == 0)
    printf("rank %d secret file mode %03o size %lld\n", rank, (unsigned)(sb.st_mode & 0777),
           (long long)sb.st_size);
  char cwd[1024];
  if (getcwd(cwd, sizeof cwd)) printf("rank %d cwd %s\n", rank, cwd);
  fflush(stdout);
  if (code >= 0) {
    fprintf(stderr, "user program: exiting with %d as asked\n", code);
    fflush(stderr);
    /* at once: nothing of the session exists yet. Under LeakSanitizer (the sanitize tier) a
     * process that exits a few milliseconds after it started sometimes never finishes the
     * sanitizer's exit-time check (its stop-the-world helper was seen runnable but never run
     * for 30 s on a loaded 2-core machine, 2 of about 300 runs): _exit skips that check, which
     * has nothing to find here. */
    _exit(code);
  }
  if (sleep_s > 0) sleep((unsigned)sleep_s);
  if (rank != 0) return 0; /* the leader alone talks to the other clusters */

  nb_session_options_t o;
  nb_session_t* s = NULL;
  if (nb_session_options_from_env(&o) != NB_OK) {
    fprintf(stderr, "user program: %s\n", nb_error_last());
    return 1;
  }
  float w[64];
  int64_t shape[1] = {64};
  for (int i = 0; i < 64; i++) w[i] = (float)(o.cluster_index + 1) * 0.01f * (float)i;
  nb_status_t st = nb_session_open(&o, &s);
  nb_session_options_free(&o);
  if (st == NB_OK) st = nb_session_register(s, "w", w, shape, 1);
  if (st == NB_OK) st = nb_session_start(s);
  for (int r = 0; r < rounds && st == NB_OK; r++) {
    for (int i = 0; i < 64; i++) w[i] += 0.001f * (float)(i % 7); /* the "inner steps" */
    nb_session_round_t info;
    st = nb_session_round(s, 32, &info);
    if (st == NB_OK)
      printf("round %llu applied %d hash %016llx\n", (unsigned long long)info.round, info.applied,
             (unsigned long long)info.global_hash);
  }
  if (st == NB_OK) st = nb_session_finish(s);
  if (st == NB_OK)
    printf("done %d rounds, global %016llx\n", rounds,
           (unsigned long long)nb_session_global_hash(s));
  else
    fprintf(stderr, "user program: %s\n", nb_error_last());
  nb_session_close(s);
  return st == NB_OK ? 0 : 2;
}
