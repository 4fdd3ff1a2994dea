/* Path confinement of descriptors run by a gateway (jobs/job_paths.h) on real folders with real
 * symbolic links: ".." and absolute paths, links out of the job's folder and out of an allowed
 * root, dangling links, the JSON path of each refusal; then the real `nebula train` binary as a
 * gateway starts it (NB_JOB_DIR set) refusing a checkpoint.dir that a link turned into another
 * job's folder, and the checkpoint loader not echoing the bytes of a file that is no checkpoint. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"

static char g_dir[256];
static const char* g_nebula;

static int rm_one(const char* p, const struct stat* sb, int f, struct FTW* ftw) {
  (void)sb, (void)f, (void)ftw;
  return remove(p);
}

static void at(char* buf, size_t n, const char* rel) {
  snprintf(buf, n, "%s/%s", g_dir, rel);
}

static void put_file(const char* rel, const char* text) {
  char p[512];
  at(p, sizeof p, rel);
  FILE* f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void mk(const char* rel) {
  char p[512];
  at(p, sizeof p, rel);
  assert_int_equal(mkdir(p, 0755), 0);
}

static void link_to(const char* target_rel_or_abs, const char* rel) {
  char p[512], t[512];
  at(p, sizeof p, rel);
  if (target_rel_or_abs[0] == '/')
    snprintf(t, sizeof t, "%s", target_rel_or_abs);
  else
    at(t, sizeof t, target_rel_or_abs);
  assert_int_equal(symlink(t, p), 0);
}

static int setup(void** state) {
  (void)state;
  const char* t = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb_paths.XXXXXX", t && *t ? t : "/tmp");
  assert_non_null(mkdtemp(g_dir));
  /* work/alice-job (the job's folder), work/bob-job (someone else's, with checkpoints),
   * data/ (an allowed root), secret (a file nobody's job may read) */
  mk("work");
  mk("work/alice-job");
  mk("work/bob-job");
  mk("work/bob-job/checkpoints");
  mk("work/bob-job/checkpoints/step-10");
  put_file("work/bob-job/checkpoints/step-10/model.safetensors", "bob's weights");
  put_file("work/bob-job/checkpoints/LATEST", "step-10\n");
  mk("data");
  mk("data/quick");
  put_file("secret", "root:*:20000:0:99999:7:::\n");
  link_to("work/bob-job", "work/alice-job/out");           /* a link out of the job's folder */
  link_to("/nonexistent-nb-dir/x", "work/alice-job/dang"); /* points nowhere */
  link_to("work/bob-job", "data/bob");                     /* a link out of the allowed root */
  link_to("data/quick", "work/alice-job/mydata");          /* a link into the allowed root */
  return 0;
}

static int teardown(void** state) {
  (void)state;
  nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

static void base_cfg(nb_job_config_t* c) {
  nb_job_config_defaults(c);
  snprintf(c->name, sizeof c->name, "alice-job");
  c->n_clusters = 1;
  nb_job_cluster_defaults(&c->clusters[0]);
  snprintf(c->clusters[0].id, sizeof c->clusters[0].id, "dc-a");
}

/* Runs the check of cfg against work/alice-job (or a folder not made yet: job NULL) with data/
 * allowed; returns the status and the refusals formatted into msg. */
static nb_status_t check(const nb_job_config_t* cfg, int fresh, char* msg, size_t n) {
  char job[512], root[512];
  at(job, sizeof job, "work/alice-job");
  at(root, sizeof root, "data");
  const char* roots[] = {root};
  nb_descriptor_diag_t diag;
  memset(&diag, 0, sizeof diag);
  nb_status_t st = nb_job_paths_check(cfg, fresh ? NULL : job, roots, 1, &diag);
  msg[0] = 0;
  size_t o = 0;
  for (int i = 0; i < diag.count && o < n; i++) {
    char line[640];
    o += (size_t)snprintf(msg + o, n - o, "%s\n",
                          nb_descriptor_error_format(&diag.errors[i], line, sizeof line));
  }
  if (st != NB_OK) fprintf(stderr, "refused: %s", msg);
  assert_true(st == NB_OK || diag.count > 0);
  return st;
}

static void test_paths(void** state) {
  (void)state;
  nb_job_config_t* c = calloc(1, sizeof *c);
  char msg[4096], p[512];

  /* nothing named, and ordinary relative paths: fine */
  base_cfg(c);
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_OK);
  snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "checkpoints");
  snprintf(c->model.base_checkpoint, sizeof c->model.base_checkpoint, "pre/final.safetensors");
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_OK);
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_OK);

  /* the attack: checkpoint.dir at another job's folder (keep: 1 would prune its steps) */
  snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "../bob-job/checkpoints");
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_ERR_PERMISSION);
  assert_non_null(strstr(msg,
                         "$.spec.checkpoint.dir: \"../bob-job/checkpoints\": \"..\" is not "
                         "allowed in the paths of a job run by a gateway"));
  at(p, sizeof p, "work/bob-job/checkpoints");
  snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "%s", p);
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_ERR_PERMISSION);
  assert_non_null(strstr(msg, "$.spec.checkpoint.dir:"));
  assert_non_null(strstr(msg, "an absolute path is not allowed"));
  /* a link in the job's folder that leads to the other job */
  snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "out/checkpoints");
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_ERR_PERMISSION);
  assert_non_null(strstr(msg, "resolves outside the job's folder (through a symbolic link)"));
  /* a dangling link: creating through it would land anywhere */
  snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "dang");
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_ERR_PERMISSION);
  assert_non_null(strstr(msg, "symbolic link that points nowhere"));
  /* checkpoints may not go to an allowed (read-only) root either */
  snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "mydata/ck");
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_ERR_PERMISSION);
  snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "./checkpoints/");
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_OK);

  /* base checkpoint: another user's weights by "..", and by absolute path */
  snprintf(c->model.base_checkpoint, sizeof c->model.base_checkpoint,
           "../bob-job/final.safetensors");
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_ERR_PERMISSION);
  assert_non_null(strstr(msg, "$.spec.model.base.checkpoint: \"../bob-job/final.safetensors\""));
  at(p, sizeof p, "work/bob-job/checkpoints/step-10/model.safetensors");
  snprintf(c->model.base_checkpoint, sizeof c->model.base_checkpoint, "%s", p);
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_ERR_PERMISSION);
  assert_non_null(strstr(msg, "is outside the job's folder and the gateway's allowed roots"));
  /* through a link that the allowed root holds */
  at(p, sizeof p, "data/bob/final.safetensors");
  snprintf(c->model.base_checkpoint, sizeof c->model.base_checkpoint, "%s", p);
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_ERR_PERMISSION);
  snprintf(c->model.base_checkpoint, sizeof c->model.base_checkpoint, "/etc/shadow");
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_ERR_PERMISSION);
  /* inside the allowed root, directly and through a link of the job's folder: fine */
  at(p, sizeof p, "data/quick/pre.safetensors");
  snprintf(c->model.base_checkpoint, sizeof c->model.base_checkpoint, "%s", p);
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_OK);
  snprintf(c->model.base_checkpoint, sizeof c->model.base_checkpoint, "mydata/pre.safetensors");
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_OK);

  /* every other path field, each named by its JSON path, all reported together */
  at(p, sizeof p, "secret");
  snprintf(c->clusters[0].data_dir, sizeof c->clusters[0].data_dir, "/");
  c->training.distill.enabled = true;
  snprintf(c->training.distill.teacher, sizeof c->training.distill.teacher, "%s", p);
  snprintf(c->security.ca, sizeof c->security.ca, "../../secret");
  snprintf(c->security.cert, sizeof c->security.cert, "%s", p);
  snprintf(c->security.key, sizeof c->security.key, "/etc/shadow");
  assert_int_equal(check(c, 1, msg, sizeof msg), NB_ERR_PERMISSION);
  const char* fields[] = {"$.spec.clusters[0].data.dir:", "$.spec.training.distillation.teacher:",
                          "$.spec.security.ca:", "$.spec.security.cert:", "$.spec.security.key:"};
  for (int i = 0; i < 5; i++) assert_non_null(strstr(msg, fields[i]));
  /* teacher "base" is the base checkpoint, checked as such */
  base_cfg(c);
  c->training.distill.enabled = true;
  snprintf(c->training.distill.teacher, sizeof c->training.distill.teacher, "base");
  assert_int_equal(check(c, 0, msg, sizeof msg), NB_OK);
  free(c);
}

/* Runs the nebula binary with argv in folder cwd (NB_JOB_DIR = job when set); returns its exit
 * status and its stderr in err. */
static int run_nebula(const char* cwd, const char* job, char* const* argv, char* err, size_t n) {
  char errp[512];
  at(errp, sizeof errp, "stderr.txt");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (chdir(cwd) != 0) _exit(126);
    char root[512];
    at(root, sizeof root, "data");
    if (job) {
      setenv("NB_JOB_DIR", job, 1);
      setenv(NB_JOB_PATHS_ENV, root, 1);
    } else {
      unsetenv("NB_JOB_DIR");
      unsetenv(NB_JOB_PATHS_ENV);
    }
    FILE* e = freopen(errp, "w", stderr);
    FILE* o = freopen("/dev/null", "w", stdout);
    (void)e, (void)o;
    execv(g_nebula, argv);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  FILE* f = fopen(errp, "r");
  size_t k = f ? fread(err, 1, n - 1, f) : 0;
  err[k] = 0;
  if (f) fclose(f);
  fprintf(stderr, "nebula said: %s", err);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void test_worker_recheck(void** state) {
  (void)state;
  if (!g_nebula) skip();
  char job[512], desc[600], err[8192], data[512];
  at(job, sizeof job, "work/alice-job");
  at(data, sizeof data, "data/quick");
  /* checkpoint.dir "out/checkpoints" passes a submit check (relative, no ".."), but by the time
   * the job runs, "out" is a link to bob's job: the worker refuses before touching anything */
  snprintf(desc, sizeof desc, "%s/descriptor.json", job);
  FILE* f = fopen(desc, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
          "\"alice-job\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {\"dir\": "
          "\"mydata\", \"languages\": [\"en\"]}}], \"training\": {\"maxSteps\": 2}, "
          "\"checkpoint\": {\"dir\": \"out/checkpoints\", \"keep\": 1, \"everyRounds\": 1}}}");
  fclose(f);
  char* argv[] = {(char*)"nebula", (char*)"train", desc, (char*)"--out", job, NULL};
  assert_int_equal(run_nebula(job, job, argv, err, sizeof err), 1);
  assert_non_null(strstr(err, "refused paths of a job run by a gateway"));
  assert_non_null(strstr(err,
                         "$.spec.checkpoint.dir: \"out/checkpoints\" resolves outside the "
                         "job's folder"));
  /* bob's checkpoints are untouched */
  char p[512];
  struct stat sb;
  at(p, sizeof p, "work/bob-job/checkpoints/step-10/model.safetensors");
  assert_int_equal(stat(p, &sb), 0);
  at(p, sizeof p, "work/bob-job/checkpoints/LATEST");
  assert_int_equal(stat(p, &sb), 0);
}

/* The loader's error for a file that is no checkpoint names the problem, never its bytes:
 * "root:*:2" read as a header length is 3619251681095544690. A user's own run (no NB_JOB_DIR)
 * may name any file it can read; the message is the same. */
static void test_loader_no_echo(void** state) {
  (void)state;
  if (!g_nebula) skip();
  char job[512], desc[600], err[8192], secret[512];
  at(job, sizeof job, "work/alice-job");
  at(secret, sizeof secret, "secret");
  snprintf(desc, sizeof desc, "%s/own.json", g_dir);
  FILE* f = fopen(desc, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
          "\"own\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {\"dir\": \"%s\", "
          "\"languages\": [\"en\"]}}], \"model\": {\"base\": {\"checkpoint\": \"%s\"}}, "
          "\"training\": {\"maxSteps\": 2}}}",
          job, secret);
  fclose(f);
  /* a little text to train on, so that the run gets as far as loading the checkpoint */
  char mono[600];
  snprintf(mono, sizeof mono, "%s/mono", job);
  mkdir(mono, 0755);
  snprintf(mono, sizeof mono, "%s/mono/en.txt", job);
  f = fopen(mono, "w");
  assert_non_null(f);
  for (int i = 0; i < 400; i++) fprintf(f, "the quick brown fox jumps over the lazy dog %d\n", i);
  fclose(f);
  char out[512];
  snprintf(out, sizeof out, "%s/own-out", g_dir);
  char* argv[] = {(char*)"nebula", (char*)"train", desc, (char*)"--out", out, NULL};
  assert_int_equal(run_nebula(g_dir, NULL, argv, err, sizeof err), 1);
  assert_non_null(strstr(err, "not a safetensors file: header length out of range"));
  assert_null(strstr(err, "3619251681095544690"));
  assert_null(strstr(err, "root:"));
}

int main(int argc, char** argv) {
  g_nebula = argc > 1 ? argv[1] : NULL;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paths),
      cmocka_unit_test(test_worker_recheck),
      cmocka_unit_test(test_loader_no_echo),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
