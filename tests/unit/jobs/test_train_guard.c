/* `nebula train` never overwrites checkpoints by accident (the real binary on a tiny model and
 * the trainer's committed corpus): --resume with LATEST gone is an error that changes nothing
 * (it used to start a fresh model over the old checkpoints, exit 0); a fresh run into a folder
 * with checkpoints, or with an earlier run's summary.json, is refused; --force starts afresh on
 * purpose and removes the earlier checkpoints first; a good LATEST resumes.
 * And what train and eval say when given bad input: a checkpoint with NaN weights, nothing to
 * score, out-of-range --batch/--batches, a teacher checkpoint that is not there (no `make data`
 * advice, no half-written output folder left behind).
 * argv[1]: the nebula binary; argv[2]: the corpus folder (mono/, pairs/). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "train/model.h"

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

  /* a shorter rerun with --force leaves no stale later checkpoint beside its own: step-4 of the
   * run before is removed (and said so), not kept by pruning over the new step-2 */
  assert_int_equal(train("--force --steps 2", err, sizeof err), 0);
  assert_non_null(strstr(err, "--force: removed 2 checkpoints of an earlier run"));
  assert_int_equal(mtime_ns("step-4"), -1);
  assert_true(mtime_ns("step-2/model.safetensors") > 0);
  snprintf(p, sizeof p, "%s/out/checkpoints/LATEST", g_dir);
  f = fopen(p, "r");
  assert_non_null(f);
  char latest[32] = "";
  assert_non_null(fgets(latest, sizeof latest, f));
  fclose(f);
  assert_string_equal(latest, "step-2\n");

  /* an output folder with an earlier run's results (its checkpoints kept elsewhere or gone) is
   * refused without --force or --resume too: summary.json would be overwritten without a word */
  snprintf(p, sizeof p, "rm -rf '%s/out/checkpoints'", g_dir);
  assert_int_equal(system(p), 0);
  assert_int_equal(train("", err, sizeof err), 1);
  assert_non_null(strstr(err, "already holds an earlier run's results (summary.json)"));
  assert_non_null(strstr(err, "--force"));

  /* --resume with no checkpoint at all */
  snprintf(p, sizeof p, "rm -rf '%s/out'", g_dir);
  assert_int_equal(system(p), 0);
  assert_int_equal(train("--resume", err, sizeof err), 1);
  assert_non_null(strstr(err, "no checkpoint to resume from"));
}

/* `nebula CMD ARGS` in g_dir, stdout and stderr into out; returns the exit status. */
static int run(const char* args, char* out, size_t n) {
  char cmd[2048], p[512];
  snprintf(p, sizeof p, "%s/out.txt", g_dir);
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s > '%s' 2>&1", g_dir, g_nebula, args, p);
  int st = system(cmd);
  FILE* f = fopen(p, "r");
  size_t k = f ? fread(out, 1, n - 1, f) : 0;
  out[k] = 0;
  if (f) fclose(f);
  fprintf(stderr, "nebula %s -> %d: %s", args, WEXITSTATUS(st), out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_bad_input_messages(void** state) {
  (void)state;
  char args[2048], out[8192], p[512];
  /* a checksummed checkpoint with one NaN weight: eval fails naming the tensor, prints no score */
  nb_model_config_t cfg = nb_model_config_make(1, 32, 2, 32);
  nb_model_t* m = NULL;
  assert_int_equal(nb_model_create(&cfg, 1, &m), NB_OK);
  nb_model_params(m, NULL)[3] = NAN;
  snprintf(p, sizeof p, "%s/nan.safetensors", g_dir);
  assert_int_equal(nb_checkpoint_save(p, m, 1), NB_OK);
  nb_model_params(m, NULL)[3] = 0.5f;
  snprintf(p, sizeof p, "%s/good.safetensors", g_dir);
  assert_int_equal(nb_checkpoint_save(p, m, 1), NB_OK);
  nb_model_destroy(m);
  snprintf(args, sizeof args, "eval nan.safetensors --data-dir '%s' --langs en", g_data);
  assert_int_equal(run(args, out, sizeof out), 1);
  assert_non_null(strstr(out, "holds a non-finite value (NaN or infinity)"));
  assert_null(strstr(out, "bits per byte"));

  /* nothing to score: the one held-out pair's source fills the whole context (32 bytes), so
   * no target byte is left to score; eval used to print "0.0000 (0 bytes)" and exit 0 */
  char sh[2048];
  snprintf(sh, sizeof sh,
           "mkdir -p '%1$s/tiny/pairs' && cp '%2$s/pairs/en-de.train.tsv' "
           "'%1$s/tiny/pairs/' && printf '%%0200d\\tx\\n' 0 > '%1$s/tiny/pairs/en-de.dev.tsv'",
           g_dir, g_data);
  assert_int_equal(system(sh), 0);
  assert_int_equal(run("eval good.safetensors --data-dir tiny --pairs en-de", out, sizeof out), 1);
  assert_non_null(strstr(out, "nothing was scored for 'en-de'"));
  assert_non_null(strstr(out, "model's context of 32 bytes"));
  assert_null(strstr(out, "0.0000"));
  /* with --translate the translation scores stand; the source's bits per byte are n/a */
  snprintf(sh, sizeof sh, "cp '%s/pairs/en-de.test.tsv' '%s/tiny/pairs/'", g_data, g_dir);
  assert_int_equal(system(sh), 0);
  assert_int_equal(
      run("eval good.safetensors --data-dir tiny --pairs en-de --translate 1", out, sizeof out), 0);
  assert_non_null(strstr(out, "nothing was scored for 'en-de'"));
  assert_non_null(strstr(out, "en-de  n/a     (nothing scored)"));
  assert_non_null(strstr(out, "chrF"));
  assert_null(strstr(out, "0.0000"));

  /* sizes that do not fit: refused, not truncated to 32 bits */
  snprintf(args, sizeof args, "eval good.safetensors --data-dir '%s' --batch 4294967297", g_data);
  assert_int_equal(run(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "--batch needs an integer in 1..4096, got '4294967297'"));
  snprintf(args, sizeof args, "eval good.safetensors --data-dir '%s' --batches 4294967296", g_data);
  assert_int_equal(run(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "--batches needs an integer in 1..1000000"));

  /* a teacher checkpoint that is not there: the message is about it, not about `make data`, and
   * the run leaves no output folder with header-only tsv files behind */
  snprintf(p, sizeof p, "%s/distill.json", g_dir);
  FILE* f = fopen(p, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
          "\"distill\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {\"dir\": \"%s\", "
          "\"languages\": [\"en\"]}}], \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, "
          "\"context\": 32}, \"training\": {\"batchSize\": 2, \"maxSteps\": 2, \"distillation\": "
          "{\"enabled\": true, \"teacher\": \"%s/no-such-teacher.safetensors\"}}}}",
          g_data, g_dir);
  fclose(f);
  assert_int_equal(run("train distill.json --out fresh-out", out, sizeof out), 1);
  assert_non_null(strstr(out, "no-such-teacher.safetensors"));
  assert_null(strstr(out, "make data"));
  snprintf(p, sizeof p, "%s/fresh-out", g_dir);
  assert_int_equal(access(p, F_OK), -1);
  /* into an existing folder: the folder stays, the tsv files this run made do not */
  assert_int_equal(mkdir(p, 0755), 0);
  assert_int_equal(run("train distill.json --out fresh-out", out, sizeof out), 1);
  assert_int_equal(access(p, F_OK), 0);
  snprintf(p, sizeof p, "%s/fresh-out/curve.tsv", g_dir);
  assert_int_equal(access(p, F_OK), -1);
  snprintf(p, sizeof p, "%s/fresh-out/rounds.tsv", g_dir);
  assert_int_equal(access(p, F_OK), -1);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NEBULA DATA_DIR\n", argv[0]);
    return 2;
  }
  g_nebula = argv[1];
  g_data = argv[2];
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_resume_guard),
                                     cmocka_unit_test(test_bad_input_messages)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
