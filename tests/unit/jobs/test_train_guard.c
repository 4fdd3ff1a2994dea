/* `nebula train` never overwrites checkpoints by accident (the real binary on a tiny model and
 * the trainer's committed corpus): --resume with LATEST gone is an error that changes nothing
 * (it used to start a fresh model over the old checkpoints, exit 0); a fresh run into a folder
 * with checkpoints is refused; --force starts afresh on purpose; a good LATEST resumes.
 * argv[1]: the nebula binary; argv[2]: the corpus folder (mono/, pairs/). */
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

static char g_dir[256];
static const char *g_nebula, *g_data;

static int rm_one(const char* p, const struct stat* sb, int f, struct FTW* ftw) {
  (void)sb, (void)f, (void)ftw;
  return remove(p);
}

static int setup(void** state) {
  (void)state;
  const char* t = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb_guard.XXXXXX", t && *t ? t : "/tmp");
  assert_non_null(mkdtemp(g_dir));
  return 0;
}

static int teardown(void** state) {
  (void)state;
  nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

/* nebula train DESC --out g_dir/out [extra], stderr into err; returns the exit status. */
static int train(const char* extra, char* err, size_t n) {
  char cmd[2048], errp[512];
  snprintf(errp, sizeof errp, "%s/stderr.txt", g_dir);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && '%s' train '%s/job.json' --out '%s/out' %s > /dev/null 2> '%s'", g_dir,
           g_nebula, g_dir, g_dir, extra, errp);
  int st = system(cmd);
  FILE* f = fopen(errp, "r");
  size_t k = f ? fread(err, 1, n - 1, f) : 0;
  err[k] = 0;
  if (f) fclose(f);
  fprintf(stderr, "nebula train %s -> %d: %s", extra, WEXITSTATUS(st), err);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static long mtime_ns(const char* rel) {
  char p[512];
  snprintf(p, sizeof p, "%s/out/checkpoints/%s", g_dir, rel);
  struct stat sb;
  if (stat(p, &sb) != 0) return -1;
  return (long)sb.st_mtim.tv_sec * 1000000000L + sb.st_mtim.tv_nsec;
}

static void test_resume_guard(void** state) {
  (void)state;
  char p[512], err[8192];
  snprintf(p, sizeof p, "%s/job.json", g_dir);
  FILE* f = fopen(p, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
          "\"guard\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {\"dir\": \"%s\", "
          "\"languages\": [\"en\"]}}], \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, "
          "\"context\": 32}, \"training\": {\"seed\": 3, \"batchSize\": 2, \"maxSteps\": 4, "
          "\"eval\": {\"batches\": 1}, \"optimizer\": {\"warmupSteps\": 1}}, \"sync\": "
          "{\"innerSteps\": 2}, \"checkpoint\": {\"everyRounds\": 1, \"keep\": 3}}}",
          g_data);
  fclose(f);
  assert_int_equal(train("", err, sizeof err), 0);
  long m2 = mtime_ns("step-2/model.safetensors"), m4 = mtime_ns("step-4/model.safetensors");
  assert_true(m2 > 0 && m4 > 0);
  assert_true(mtime_ns("LATEST") > 0);

  /* the finding: LATEST gone, --resume */
  snprintf(p, sizeof p, "%s/out/checkpoints/LATEST", g_dir);
  assert_int_equal(unlink(p), 0);
  assert_int_equal(train("--resume", err, sizeof err), 1);
  assert_non_null(strstr(err, "--resume: "));
  assert_non_null(strstr(err, "LATEST is missing, but the folder holds 2 checkpoints"));
  assert_non_null(strstr(err, "nothing was changed"));
  assert_int_equal(mtime_ns("step-2/model.safetensors"), m2);
  assert_int_equal(mtime_ns("step-4/model.safetensors"), m4);
  assert_int_equal(mtime_ns("LATEST"), -1);
  /* a fresh run over them is refused too */
  assert_int_equal(train("", err, sizeof err), 1);
  assert_non_null(strstr(err, "already holds checkpoints"));
  assert_non_null(strstr(err, "--force"));
  assert_int_equal(mtime_ns("step-4/model.safetensors"), m4);

  /* a good LATEST resumes (nothing left to train: the step-4 model is kept) */
  f = fopen(p, "w");
  assert_non_null(f);
  fputs("step-4\n", f);
  fclose(f);
  assert_int_equal(train("--resume", err, sizeof err), 0);
  assert_int_equal(mtime_ns("step-2/model.safetensors"), m2);

  /* --force: afresh, on purpose */
  assert_int_equal(train("--force", err, sizeof err), 0);
  assert_true(mtime_ns("step-4/model.safetensors") != m4);

  /* --resume with no checkpoint at all */
  snprintf(p, sizeof p, "rm -rf '%s/out'", g_dir);
  assert_int_equal(system(p), 0);
  assert_int_equal(train("--resume", err, sizeof err), 1);
  assert_non_null(strstr(err, "no checkpoint to resume from"));
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NEBULA DATA_DIR\n", argv[0]);
    return 2;
  }
  g_nebula = argv[1];
  g_data = argv[2];
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_resume_guard)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
