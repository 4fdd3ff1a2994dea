/* End to end: `nebula run` on a tiny two-cluster job over loopback (mTLS, sealed frames): both
 * clusters finish with the same theta_global, their summaries hold what they should, and no
 * worker outlives the run, also when a cluster fails and when the run is interrupted.
 * argv[1] = data folder, argv[2] = the nebula binary. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/common.h"

static const char* g_data;
static const char* g_nebula;

/* overlap: 0 off, 1 on (the default overlapSteps, 4 = the round's end), 2 on with
 * overlapSteps 1 (the update lands inside the next round) */
static void write_job_opts(const char* path, const char* lang_b, long steps, int overlap,
                           const char* optim_extra, const char* spec_extra, int workers_a) {
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fprintf(
      f,
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\",\n"
      " \"metadata\": {\"name\": \"test-2dc\"},\n"
      " \"spec\": {\"task\": \"pretrain\",\n"
      "  \"clusters\": [\n"
      "   {\"id\": \"dc-b\", \"data\": {\"tier\": \"quick\", \"languages\": [\"en\", \"%s\"]}},\n"
      "   {\"id\": \"dc-a\", \"workers\": %d, \"data\": {\"tier\": \"quick\", \"languages\": "
      "[\"en\", \"de\"]}}],\n"
      "  \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, \"context\": 32},\n"
      "  \"training\": {\"seed\": 5, \"batchSize\": 4, \"maxSteps\": %ld,\n"
      "               \"eval\": {\"everyRounds\": 1, \"batches\": 1},\n"
      "               \"optimizer\": {\"lr\": 0.003, \"warmupSteps\": 2%s}},\n"
      "  \"sync\": {\"mode\": \"outer\", \"innerSteps\": 4, \"overlap\": %s%s},\n"
      "  \"compression\": {\"density\": {\"initial\": 0.05, \"min\": 0.001, \"max\": 0.1},\n"
      "                  \"values\": \"int8\"},\n"
      "  %s\"link\": {\"rateMbit\": 50}}}\n",
      lang_b, workers_a, steps, optim_extra, overlap ? "true" : "false",
      overlap == 2 ? ", \"overlapSteps\": 1" : "", spec_extra);
  fclose(f);
}

static void write_job(const char* path, const char* lang_b, long steps, int overlap) {
  write_job_opts(path, lang_b, steps, overlap, "", "", 1);
}

static pid_t spawn_run(const char* job, const char* out) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char log[600];
    snprintf(log, sizeof log, "%s.log", out);
    if (!freopen(log, "w", stdout)) _exit(126);
    dup2(1, 2);
    execl(g_nebula, "nebula", "run", job, "--out", out, "--data-dir", g_data, (char*)NULL);
    _exit(127);
  }
  return pid;
}

static int wait_exit(pid_t pid) {
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Processes whose command line mentions `needle` (the run's unique folder). */
static int processes_with(const char* needle) {
  DIR* d = opendir("/proc");
  assert_non_null(d);
  int found = 0;
  struct dirent* e;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char p[300], buf[4096];
    snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
    FILE* f = fopen(p, "rb");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
      if (!buf[i]) buf[i] = ' ';
    buf[n] = 0;
    if (strstr(buf, needle) && strstr(buf, "worker")) found++;
  }
  closedir(d);
  return found;
}

static char* make_tmpdir(void) {
  static char buf[4][64];
  static int k = 0;
  char* d = buf[k++ % 4];
  snprintf(d, 64, "/tmp/nb_hybrid_run.XXXXXX");
  assert_non_null(mkdtemp(d));
  return d;
}

static void rm_rf(const char* dir) {
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void run_two_clusters(int overlap) {
  char* dir = make_tmpdir();
  char job[128], out[128];
  snprintf(job, sizeof job, "%s/job.json", dir);
  snprintf(out, sizeof out, "%s/run", dir);
  write_job(job, "ru", 12, overlap);
  double t0 = nb_now_s();
  int rc = wait_exit(spawn_run(job, out));
  fprintf(stderr, "nebula run: exit %d in %.1f s\n", rc, nb_now_s() - t0);
  if (rc != 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "cat '%s.log' >&2", out);
    (void)system(cmd);
  }
  assert_int_equal(rc, 0);
  { /* each round's progress line, relayed by the run, says the step of the total and an ETA */
    char p[256], line[1024];
    snprintf(p, sizeof p, "%s.log", out);
    FILE* f = fopen(p, "r");
    assert_non_null(f);
    int rounds = 0, last = 0;
    while (fgets(line, sizeof line, f)) {
      const char* r = strstr(line, "] round ");
      if (!r || !strstr(r, "steps, loss")) continue;
      long a, b, st, tot;
      char eta[16];
      assert_int_equal(
          sscanf(r, "] round %ld/%ld: step %ld/%ld, eta %15[^:]", &a, &b, &st, &tot, eta), 5);
      assert_int_equal(b, 3);
      assert_int_equal(tot, 12);
      assert_int_equal(st, 4 * a); /* innerSteps 4 */
      rounds++;
      if (a == b) last += strcmp(eta, "0 s") == 0; /* nothing left after the last round */
    }
    fclose(f);
    assert_int_equal(rounds, 6); /* 3 rounds on each of 2 clusters */
    assert_int_equal(last, 2);
  }
  { /* the run report: job-level summary.json naming both clusters, and report.html */
    char p[256];
    snprintf(p, sizeof p, "%s/summary.json", out);
    json_error_t je;
    json_t* s = json_load_file(p, 0, &je);
    assert_non_null(s);
    assert_int_equal(json_array_size(json_object_get(s, "clusters")), 2);
    assert_true(json_is_true(json_object_get(s, "theta_global_identical")));
    json_decref(s);
    snprintf(p, sizeof p, "%s/report.html", out);
    assert_int_equal(access(p, R_OK), 0);
  }
  char hash[2][24];
  const char* ids[2] = {"dc-a", "dc-b"};
  for (int c = 0; c < 2; c++) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s/summary.json", out, ids[c]);
    json_error_t je;
    json_t* s = json_load_file(p, 0, &je);
    if (!s) fprintf(stderr, "%s: %s\n", p, je.text);
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(s, "cluster")), ids[c]);
    assert_int_equal(json_integer_value(json_object_get(s, "cluster_index")), c);
    assert_int_equal(json_integer_value(json_object_get(s, "rounds")), 3);
    assert_int_equal(json_integer_value(json_object_get(s, "inner_steps")), 12);
    assert_true(json_is_true(json_object_get(s, "tls")));
    assert_true(json_is_true(json_object_get(s, "sealed")));
    assert_int_equal(json_is_true(json_object_get(s, "overlap")), overlap);
    /* several clusters: fault-tolerant rounds, with or without overlap; no fault, none skipped */
    assert_true(json_is_true(json_object_get(s, "fault_tolerant")));
    assert_int_equal(json_integer_value(json_object_get(s, "rounds_skipped")), 0);
    assert_int_equal(json_integer_value(json_object_get(s, "rounds_applied")), 3);
    assert_true(json_integer_value(json_object_get(s, "wan_bytes_sent")) > 0);
    /* compression.adaptive defaults to on: one logged decision before each later round */
    assert_true(json_is_true(json_object_get(s, "adaptive")));
    json_t* dec = json_object_get(s, "decisions");
    assert_int_equal(json_array_size(dec), 2);
    for (size_t i = 0; i < 2; i++) {
      json_t* d = json_array_get(dec, i);
      double den = json_real_value(json_object_get(d, "density"));
      assert_true(den >= 0.001 && den <= 0.1);
      assert_non_null(json_string_value(json_object_get(d, "reason")));
    }
    double bpp = json_real_value(json_object_get(s, "bits_per_param_per_sync"));
    assert_true(bpp > 0 && bpp < 32 * 0.5); /* sparse: far below dense fp32 */
    double bpb = json_real_value(json_object_get(s, "final_eval_mean_bpb"));
    assert_true(isfinite(bpb) && bpb > 0 && bpb < 9);
    /* eval.everyRounds 1: one held-out evaluation after each round but the last */
    assert_int_equal(json_array_size(json_object_get(s, "evals")), 2);
    json_t* ev = json_object_get(s, "final_eval_bpb");
    assert_non_null(json_object_get(ev, "en"));
    assert_non_null(json_object_get(ev, c == 0 ? "de" : "ru"));
    snprintf(hash[c], sizeof hash[c], "%s", json_string_value(json_object_get(s, "global_xxh3")));
    pid_t pid = (pid_t)json_integer_value(json_object_get(s, "pid"));
    assert_true(pid > 0);
    assert_int_equal(kill(pid, 0), -1); /* the worker is gone */
    assert_int_equal(errno, ESRCH);
    json_decref(s);
    /* rounds.tsv: a header and one line per round */
    snprintf(p, sizeof p, "%s/%s/rounds.tsv", out, ids[c]);
    FILE* f = fopen(p, "r");
    assert_non_null(f);
    int lines = 0, ch;
    while ((ch = fgetc(f)) != EOF) lines += ch == '\n';
    fclose(f);
    assert_int_equal(lines, 4);
  }
  assert_string_equal(hash[0], hash[1]);
  /* the secret is private */
  struct stat st;
  char p[256];
  snprintf(p, sizeof p, "%s/job.secret", out);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 0077, 0);
  assert_int_equal(st.st_size, 32);
  assert_int_equal(processes_with(dir), 0);
  rm_rf(dir);
}

static void test_run_two_clusters(void** state) {
  (void)state;
  run_two_clusters(0);
}

static void test_run_two_clusters_overlap(void** state) {
  (void)state;
  run_two_clusters(1);
}

static pid_t spawn_run_args(const char* job, const char* out, const char* steps, int resume) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char log[600];
    snprintf(log, sizeof log, "%s.log", out);
    if (!freopen(log, "a", stdout)) _exit(126);
    dup2(1, 2);
    execl(g_nebula, "nebula", "run", job, "--out", out, "--data-dir", g_data, "--steps", steps,
          resume ? "--resume" : (char*)NULL, (char*)NULL);
    _exit(127);
  }
  return pid;
}

static void read_hash(const char* out, const char* id, char hash[24], long* resumed) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s/summary.json", out, id);
  json_error_t je;
  json_t* s = json_load_file(p, 0, &je);
  assert_non_null(s);
  snprintf(hash, 24, "%s", json_string_value(json_object_get(s, "global_xxh3")));
  *resumed = (long)json_integer_value(json_object_get(s, "resumed_at_round"));
  json_decref(s);
}

/* A run stopped after 2 of 3 rounds and resumed from its checkpoints ends with the same
 * theta_global as an uninterrupted run (constant learning rate, so the schedule's length does
 * not matter). With overlap (the update landing one step into the next round) each checkpoint
 * round lands its own update first, in both runs. */
static void run_resume_same_hash(int overlap) {
  char* dir = make_tmpdir();
  char job[128], a[128], b[128];
  snprintf(job, sizeof job, "%s/job.json", dir);
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  write_job_opts(job, "ru", 12, overlap, ", \"schedule\": \"constant\"",
                 "\"checkpoint\": {\"everyRounds\": 1}, ", 1);
  assert_int_equal(wait_exit(spawn_run_args(job, a, "12", 0)), 0);
  assert_int_equal(wait_exit(spawn_run_args(job, b, "8", 0)), 0);
  assert_int_equal(wait_exit(spawn_run_args(job, b, "12", 1)), 0);
  const char* ids[2] = {"dc-a", "dc-b"};
  for (int c = 0; c < 2; c++) {
    char ha[24], hb[24];
    long ra, rb;
    read_hash(a, ids[c], ha, &ra);
    read_hash(b, ids[c], hb, &rb);
    assert_int_equal(ra, 0);
    assert_int_equal(rb, 2);
    assert_string_equal(ha, hb);
  }
  assert_int_equal(processes_with(dir), 0);
  rm_rf(dir);
}

static void test_run_resume_same_hash(void** state) {
  (void)state;
  run_resume_same_hash(0);
}

static void test_run_resume_same_hash_overlap(void** state) {
  (void)state;
  run_resume_same_hash(2);
}

/* A cluster of two ranks under mpirun (gradients allreduced every step, theta_global broadcast
 * every round) syncs with a one-process cluster; nothing is left behind. */
static void run_mpi_cluster(int overlap) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    fprintf(stderr, "no mpirun: skipped\n");
    return;
  }
  char* dir = make_tmpdir();
  char job[128], out[128];
  snprintf(job, sizeof job, "%s/job.json", dir);
  snprintf(out, sizeof out, "%s/run", dir);
  write_job_opts(job, "ru", 12, overlap, "", "", 2);
  int rc = wait_exit(spawn_run(job, out));
  if (rc != 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "cat '%s.log' >&2", out);
    (void)system(cmd);
  }
  assert_int_equal(rc, 0);
  char ha[24], hb[24];
  long ra, rb;
  read_hash(out, "dc-a", ha, &ra);
  read_hash(out, "dc-b", hb, &rb);
  assert_string_equal(ha, hb);
  char p[256];
  snprintf(p, sizeof p, "%s/dc-a/summary.json", out);
  json_t* s = json_load_file(p, 0, NULL);
  assert_non_null(s);
  assert_int_equal(json_integer_value(json_object_get(s, "ranks")), 2);
  /* the leader counts its own samples: one micro-batch of 4 per step (not 2, the workers) */
  assert_int_equal(json_integer_value(json_object_get(s, "samples")), 12 * 4);
  json_decref(s);
  assert_int_equal(processes_with(dir), 0);
  rm_rf(dir);
}

static void test_run_mpi_cluster(void** state) {
  (void)state;
  run_mpi_cluster(0);
}

/* The same with overlap landing each update one inner step into the next round: the other rank
 * runs that step, takes theta_local from its leader, runs the rest. */
static void test_run_mpi_cluster_overlap_steps(void** state) {
  (void)state;
  run_mpi_cluster(2);
}

/* A cluster that cannot start (missing data) fails the run, and the other worker is stopped. */
static void test_run_failure_stops_everyone(void** state) {
  (void)state;
  char* dir = make_tmpdir();
  char job[128], out[128];
  snprintf(job, sizeof job, "%s/job.json", dir);
  snprintf(out, sizeof out, "%s/run", dir);
  write_job(job, "fa", 400, 0); /* the test corpus has no fa */
  int rc = wait_exit(spawn_run(job, out));
  assert_int_not_equal(rc, 0);
  assert_int_equal(processes_with(dir), 0);
  char p[256];
  snprintf(p, sizeof p, "%s/dc-a/summary.json", out);
  assert_int_equal(access(p, F_OK), -1);
  rm_rf(dir);
}

/* SIGINT during the rounds stops every worker. */
static void test_run_interrupted(void** state) {
  (void)state;
  char* dir = make_tmpdir();
  char job[128], out[128], log[160];
  snprintf(job, sizeof job, "%s/job.json", dir);
  snprintf(out, sizeof out, "%s/run", dir);
  snprintf(log, sizeof log, "%s/dc-a/worker.log", out);
  write_job(job, "ru", 400000, 1);
  pid_t pid = spawn_run(job, out);
  int started = 0;
  for (int i = 0; i < 300 && !started; i++) { /* up to 30 s for the first round */
    FILE* f = fopen(log, "r");
    if (f) {
      char line[512];
      while (fgets(line, sizeof line, f))
        if (strncmp(line, "round ", 6) == 0) started = 1;
      fclose(f);
    }
    if (!started) nb_sleep_ns(100000000);
  }
  assert_true(started);
  assert_true(processes_with(dir) == 2);
  kill(pid, SIGINT);
  int rc = wait_exit(pid);
  assert_int_not_equal(rc, 0);
  assert_int_equal(processes_with(dir), 0);
  rm_rf(dir);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s DATA_DIR NEBULA\n", argv[0]);
    return 2;
  }
  g_data = argv[1];
  g_nebula = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run_two_clusters),
      cmocka_unit_test(test_run_two_clusters_overlap),
      cmocka_unit_test(test_run_resume_same_hash),
      cmocka_unit_test(test_run_resume_same_hash_overlap),
      cmocka_unit_test(test_run_mpi_cluster),
      cmocka_unit_test(test_run_mpi_cluster_overlap_steps),
      cmocka_unit_test(test_run_failure_stops_everyone),
      cmocka_unit_test(test_run_interrupted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
