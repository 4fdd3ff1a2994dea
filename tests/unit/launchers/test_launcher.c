/* gateway/launcher.h without a gateway: names, the session-wide cancel of the local launcher (a
 * process that moved to a process group of its own is still stopped), launch records and their
 * round trip, per-rank exit codes, and the Slurm launcher against stand-in sbatch / squeue /
 * scontrol / sacct / scancel scripts put first in PATH (the batch script as written, the job id
 * parsed, states followed, an exit status recovered from ExitCode, scancel, sbatch errors).
 * A real Slurm is exercised by slurm.sh. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "gateway/launcher.h"

static char g_dir[256];

static void put(const char* rel, const char* text, int exec) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, rel);
  FILE* f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  if (exec) chmod(p, 0755);
}

static char* slurp(const char* rel) {
  static char buf[8192];
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, rel);
  FILE* f = fopen(p, "r");
  if (!f) return NULL;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return buf;
}

static int rm_cb(const char* p, const struct stat* s, int f, struct FTW* w) {
  (void)s, (void)f, (void)w;
  return remove(p);
}

static int setup(void** st) {
  (void)st;
  snprintf(g_dir, sizeof g_dir, "/tmp/nb_test_launcher.XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  char p[512];
  snprintf(p, sizeof p, "%s/bin", g_dir);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/job", g_dir);
  mkdir(p, 0755);
  /* stand-ins for the Slurm commands: they log their arguments and answer from files */
  put("bin/sbatch",
      "#!/bin/sh\necho \"$@\" >> \"$FAKE/sbatch.args\"\n"
      "if [ -f \"$FAKE/sbatch.fail\" ]; then cat \"$FAKE/sbatch.fail\" >&2; exit 1; fi\n"
      "echo \"$NB_JOB_ID\" > \"$FAKE/sbatch.env\"\necho '77;nbtest'\n",
      1);
  put("bin/squeue",
      "#!/bin/sh\necho \"$@\" >> \"$FAKE/squeue.args\"\n"
      "s=$(cat \"$FAKE/state\")\n"
      "case \"$s\" in\n"
      "GONE) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1;;\n"
      "DOWN) echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1;;\n"
      "esac\necho \"$s\"\n",
      1);
  put("bin/scontrol",
      "#!/bin/sh\necho \"JobId=$4 JobState=$(cat \"$FAKE/state\") ExitCode=0:15\"\n", 1);
  put("bin/sacct", "#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2; exit 1\n", 1);
  put("bin/scancel",
      "#!/bin/sh\necho \"$@\" >> \"$FAKE/scancel.args\"\necho CANCELLED > \"$FAKE/state\"\n", 1);
  char path[4096];
  snprintf(path, sizeof path, "%s/bin:%s", g_dir,
           getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  setenv("PATH", path, 1);
  setenv("FAKE", g_dir, 1);
  return 0;
}

static int teardown(void** st) {
  (void)st;
  nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

static void test_names(void** st) {
  (void)st;
  nb_launcher_kind_t k;
  assert_int_equal(nb_launcher_parse("local", &k), NB_OK);
  assert_int_equal(k, NB_LAUNCHER_LOCAL);
  assert_int_equal(nb_launcher_parse("mpirun", &k), NB_OK);
  assert_int_equal(k, NB_LAUNCHER_MPIRUN);
  assert_int_equal(nb_launcher_parse("slurm", &k), NB_OK);
  assert_int_equal(k, NB_LAUNCHER_SLURM);
  assert_string_equal(nb_launcher_name(NB_LAUNCHER_SLURM), "slurm");
  assert_int_equal(nb_launcher_parse("pbs", &k), NB_ERR_UNSUPPORTED);
  assert_non_null(strstr(nb_error_last(), "launcher 'pbs' is not available"));
  assert_int_equal(nb_launcher_parse(NULL, &k), NB_ERR_UNSUPPORTED);
}

static int pid_alive(pid_t p) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char* q = strrchr(buf, ')');
  return q && q[2] != 'Z' && q[2] != 'X';
}

/* The local launcher leads a session: a child that left the process group (setpgid, as mpirun's
 * ranks do; perl-base is essential on Debian) is still stopped by cancel. */
static void test_local_session_cancel(void** st) {
  (void)st;
  nb_launcher_conf_t conf;
  nb_launcher_conf_defaults(&conf);
  char jd[300];
  snprintf(jd, sizeof jd, "%s/job", g_dir);
  char* argv[] = {(char*)"/bin/sh", (char*)"-c",
                  (char*)"perl -e 'setpgrp(0, 0); sleep 300' & echo $! > bg; "
                          "sleep 300 & echo $! >> bg; wait", NULL};
  nb_launch_t l;
  assert_int_equal(nb_launcher_launch(&conf, jd, argv, NULL, 1, &l), NB_OK);
  assert_int_equal(l.kind, NB_LAUNCHER_LOCAL);
  assert_true(l.pid > 0);
  assert_int_equal(getsid(l.pid), l.pid);
  pid_t bg[2] = {0, 0};
  for (int i = 0; i < 500 && !bg[1]; i++) {
    char* t = slurp("job/bg");
    if (t && strchr(t, '\n') && strchr(strchr(t, '\n') + 1, '\n'))
      sscanf(t, "%d %d", &bg[0], &bg[1]);
    else
      nb_sleep_ns(10000000);
  }
  assert_true(bg[0] > 0 && bg[1] > 0);
  for (int i = 0; i < 500 && getpgid(bg[0]) == l.pid; i++) nb_sleep_ns(10000000);
  assert_int_not_equal(getpgid(bg[0]), l.pid); /* really outside the leader's process group */
  assert_int_equal(getsid(bg[0]), l.pid);
  assert_true(nb_launcher_alive(&l));
  char what[64], expect[64];
  snprintf(expect, sizeof expect, "process %d", (int)l.pid);
  assert_string_equal(nb_launcher_describe(&l, what, sizeof what), expect);
  int killed = -1;
  assert_int_equal(nb_launcher_cancel(&l, 2000, &killed), NB_OK);
  assert_false(pid_alive(bg[0]));
  assert_false(pid_alive(bg[1]));
  assert_false(nb_launcher_group_alive(l.pid));
  int status = 0;
  assert_int_equal(waitpid(l.pid, &status, 0), l.pid);
  assert_false(nb_launcher_alive(&l));
}

static void test_records(void** st) {
  (void)st;
  nb_launch_t a, b;
  memset(&a, 0, sizeof a);
  a.kind = NB_LAUNCHER_SLURM;
  snprintf(a.slurm_id, sizeof a.slurm_id, "4242");
  a.slurm_poll_ms = 250;
  snprintf(a.dir, sizeof a.dir, "/x/job-1");
  json_t* j = json_object();
  nb_launcher_to_json(&a, j);
  assert_string_equal(json_string_value(json_object_get(j, "launcher")), "slurm");
  assert_int_equal(nb_launcher_from_json(j, &b), 1);
  assert_int_equal(b.kind, NB_LAUNCHER_SLURM);
  assert_string_equal(b.slurm_id, "4242");
  assert_int_equal(b.slurm_poll_ms, 250);
  assert_string_equal(b.dir, "/x/job-1");
  json_decref(j);
  /* a record from before launchers had names: local, by pid */
  j = json_pack("{s:i, s:I}", "pid", 1234, "start_ticks", (json_int_t)99);
  assert_int_equal(nb_launcher_from_json(j, &b), 1);
  assert_int_equal(b.kind, NB_LAUNCHER_LOCAL);
  assert_int_equal(b.pid, 1234);
  assert_int_equal((int)b.start_ticks, 99);
  json_decref(j);
  j = json_pack("{s:s}", "launcher", "slurm"); /* no id: nothing to re-attach to */
  assert_int_equal(nb_launcher_from_json(j, &b), 0);
  json_decref(j);
  char what[64];
  assert_string_equal(nb_launcher_describe(&a, what, sizeof what), "Slurm job 4242");
}

static void test_rank_codes(void** st) {
  (void)st;
  char jd[300];
  snprintf(jd, sizeof jd, "%s/rc", g_dir);
  mkdir(jd, 0755);
  assert_null(nb_launcher_rank_codes(jd, 2)); /* no ranks folder: local launcher */
  char p[400];
  snprintf(p, sizeof p, "%s/ranks", jd);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/ranks/0", jd);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/ranks/2", jd);
  mkdir(p, 0755);
  put("rc/ranks/0/exit_code", "0\n", 0);
  put("rc/ranks/2/exit_code", "137\n", 0);
  json_t* a = nb_launcher_rank_codes(jd, 3);
  assert_non_null(a);
  char* t = json_dumps(a, JSON_COMPACT);
  assert_string_equal(t, "[0,null,137]");
  free(t);
  json_decref(a);
}

static void test_slurm_fake(void** st) {
  (void)st;
  nb_launcher_conf_t conf;
  nb_launcher_conf_defaults(&conf);
  conf.kind = NB_LAUNCHER_SLURM;
  snprintf(conf.partition, sizeof conf.partition, "p1");
  snprintf(conf.account, sizeof conf.account, "a1");
  conf.sbatch_args.n = 1;
  snprintf(conf.sbatch_args.v[0], NB_LAUNCH_ARG, "--time=5");
  conf.srun_args.n = 1;
  snprintf(conf.srun_args.v[0], NB_LAUNCH_ARG, "--mpi=pmix");
  conf.slurm_poll_ms = 50;
  char jd[300];
  snprintf(jd, sizeof jd, "%s/sj", g_dir);
  mkdir(jd, 0755);
  char* argv[] = {(char*)"/bin/echo", (char*)"it's", NULL};
  char* env[] = {(char*)"NB_JOB_ID=sj-1", (char*)"NEBULA_JOB_ID=sj-1", NULL};
  nb_launch_t l;
  put("state", "PENDING\n", 0);
  assert_int_equal(nb_launcher_launch(&conf, jd, argv, env, 3, &l), NB_OK);
  assert_int_equal(l.kind, NB_LAUNCHER_SLURM);
  assert_int_equal(l.pid, 0);
  assert_string_equal(l.slurm_id, "77");
  assert_string_equal(slurp("sbatch.env"), "sj-1\n"); /* the job's variables reach sbatch */
  char* args = slurp("sbatch.args");
  assert_non_null(strstr(args, "--parsable"));
  assert_non_null(strstr(args, "/sj/job.sbatch"));
  char* s = slurp("sj/job.sbatch");
  assert_non_null(s);
  char line[1200];
  const char* want[] = {"#!/bin/sh\n",
                        "#SBATCH --job-name=nebula-sj\n",
                        "#SBATCH --ntasks=3\n",
                        "#SBATCH --partition=p1\n",
                        "#SBATCH --account=a1\n",
                        "#SBATCH --time=5\n"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) assert_non_null(strstr(s, want[i]));
  snprintf(line, sizeof line, "#SBATCH --output=%s/stdout.log\n", l.dir);
  assert_non_null(strstr(s, line));
  snprintf(line, sizeof line, "#SBATCH --error=%s/stderr.log\n", l.dir);
  assert_non_null(strstr(s, line));
  snprintf(line, sizeof line, "#SBATCH --chdir=%s\n", l.dir);
  assert_non_null(strstr(s, line));
  assert_non_null(strstr(s, "\nsrun '--mpi=pmix' /bin/sh -c '"));
  assert_non_null(strstr(s, "'/bin/echo' 'it'\\''s'\n"));
  assert_non_null(strstr(s, "echo $rc > exit_code.tmp && mv exit_code.tmp exit_code\n"));
  /* the script is valid sh */
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "sh -n %s/job.sbatch", l.dir);
  assert_int_equal(system(cmd), 0);

  /* followed with squeue: pending and running are alive; answers are kept for poll_ms */
  assert_true(nb_launcher_alive(&l));
  put("state", "RUNNING\n", 0);
  l.next_poll_ns = 0;
  assert_true(nb_launcher_alive(&l));
  assert_non_null(strstr(slurp("squeue.args"), "-h -j 77 --states=all -o %T"));
  put("state", "DOWN\n", 0); /* controller unreachable: still counted as running */
  l.next_poll_ns = 0;
  assert_true(nb_launcher_alive(&l));
  put("state", "COMPLETING\n", 0);
  l.next_poll_ns = 0;
  assert_true(nb_launcher_alive(&l));
  put("state", "TIMEOUT\n", 0);
  assert_true(nb_launcher_alive(&l)); /* within poll_ms: the last answer */
  nb_sleep_ns(60000000);
  assert_false(nb_launcher_alive(&l));
  /* it left no exit_code: sacct refuses (no accounting), scontrol's ExitCode=0:15 → 143 */
  int code = -1;
  assert_int_equal(nb_launcher_exit_code(jd, &code), NB_OK);
  assert_int_equal(code, 143);

  /* forgotten by the controller: ended */
  nb_launch_t l2 = l;
  l2.last_alive = 1;
  l2.next_poll_ns = 0;
  put("state", "GONE\n", 0);
  assert_false(nb_launcher_alive(&l2));

  /* cancel: scancel, then squeue says CANCELLED */
  put("state", "RUNNING\n", 0);
  nb_launch_t l3 = l;
  l3.last_alive = 1;
  int killed = -1;
  assert_int_equal(nb_launcher_cancel(&l3, 2000, &killed), NB_OK);
  assert_int_equal(killed, 0);
  assert_string_equal(slurp("scancel.args"), "77\n");

  /* slurm.step "mpirun": OpenMPI inside the allocation instead of srun */
  snprintf(conf.slurm_step, sizeof conf.slurm_step, "mpirun");
  assert_int_equal(nb_launcher_conf_check(&conf), NB_OK);
  conf.mpirun_args.n = 1;
  snprintf(conf.mpirun_args.v[0], NB_LAUNCH_ARG, "--mca");
  snprintf(jd, sizeof jd, "%s/sjm", g_dir);
  mkdir(jd, 0755);
  assert_int_equal(nb_launcher_launch(&conf, jd, argv, env, 2, &l), NB_OK);
  s = slurp("sjm/job.sbatch");
  assert_null(strstr(s, "\nsrun "));
  /* every variable of env is passed on to the ranks, the gateway's NB_JOB_* and NEBULA_* */
  snprintf(line, sizeof line,
           "\nmpirun%s --bind-to none -np 2 -x NB_JOB_ID -x NEBULA_JOB_ID '--mca' /bin/sh -c '",
           geteuid() == 0 ? " --allow-run-as-root" : "");
  assert_non_null(strstr(s, line));
  snprintf(conf.slurm_step, sizeof conf.slurm_step, "mpiexec");
  assert_int_equal(nb_launcher_conf_check(&conf), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "slurm.step"));
  snprintf(conf.slurm_step, sizeof conf.slurm_step, "srun");

  /* sbatch refuses: UNAVAILABLE with its message */
  put("sbatch.fail", "sbatch: error: invalid partition specified: p1\n", 0);
  snprintf(jd, sizeof jd, "%s/sj2", g_dir);
  mkdir(jd, 0755);
  assert_int_equal(nb_launcher_launch(&conf, jd, argv, env, 1, &l), NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(nb_error_last(), "invalid partition specified"));

  /* a job folder #SBATCH lines cannot hold */
  snprintf(jd, sizeof jd, "%s/s j", g_dir);
  mkdir(jd, 0755);
  assert_int_equal(nb_launcher_launch(&conf, jd, argv, env, 1, &l), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "#SBATCH"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),      cmocka_unit_test(test_local_session_cancel),
      cmocka_unit_test(test_records),    cmocka_unit_test(test_rank_codes),
      cmocka_unit_test(test_slurm_fake),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
