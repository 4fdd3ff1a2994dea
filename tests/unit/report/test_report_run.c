/* A real, tiny translation run: `nebula train` and `nebula run` (one cluster, loopback, no MPI)
 * on the trainer's committed corpus with training.eval.sentences = 3 write the chrF/BLEU of the
 * base and the final model into summary.json, the run report renders them, and sentences = 0
 * turns them off; `nebula report --job` puts the descriptor's settings into the report and a bad
 * descriptor fails it. argv[1] = data folder, argv[2] = the nebula binary. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char* g_data;
static const char* g_nebula;

static char* slurp(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* s = calloc(1, (size_t)n + 1);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return s;
}

static void write_job(const char* path, const char* name, int sentences) {
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fprintf(
      f,
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\",\n"
      " \"metadata\": {\"name\": \"%s\"},\n"
      " \"spec\": {\"task\": \"translation\",\n"
      "  \"clusters\": [{\"id\": \"dc-a\", \"data\": {\"dir\": \"%s\", \"pairs\": [\"en-de\"]}}],\n"
      "  \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, \"context\": 64},\n"
      "  \"training\": {\"batchSize\": 4, \"maxSteps\": 10, \"optimizer\": {\"warmupSteps\": 2},\n"
      "   \"eval\": {\"everyRounds\": 1, \"batches\": 1, \"sentences\": %d}},\n"
      "  \"sync\": {\"innerSteps\": 5}, \"checkpoint\": {\"everyRounds\": 0, \"keep\": 1}}}\n",
      name, g_data, sentences);
  assert_int_equal(fclose(f), 0);
}

static void run(const char* cmd, const char* dir) {
  int rc = system(cmd);
  if (rc != 0) {
    char p[512];
    snprintf(p, sizeof p, "%s/stderr", dir);
    char* e = slurp(p);
    fail_msg("'%s' failed (%d): %s", cmd, rc, e ? e : "");
  }
}

/* The translation object of a summary: en-de with 3 sentences and four scores in [0, 100]. */
static void check_scores(json_t* tr) {
  assert_true(json_is_object(tr));
  assert_int_equal(json_object_size(tr), 1);
  json_t* p = json_object_get(tr, "en-de");
  assert_non_null(p);
  assert_int_equal(json_integer_value(json_object_get(p, "sentences")), 3);
  const char* side[] = {"base", "final"};
  const char* metric[] = {"chrf", "bleu"};
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 2; k++) {
      json_t* v = json_object_get(json_object_get(p, side[i]), metric[k]);
      assert_true(json_is_number(v));
      double d = json_number_value(v);
      print_message("en-de %s %s = %.3f\n", side[i], metric[k], d);
      assert_true(d >= 0 && d <= 100);
    }
}

static void test_translation_run(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_run_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char job[600], cmd[4096], p[700];
  json_error_t je;

  /* nebula train: one cluster in this process */
  snprintf(job, sizeof job, "%s/tr.json", dir);
  write_job(job, "tiny-translate", 3);
  snprintf(cmd, sizeof cmd, "'%s' train '%s' --out '%s/train' > '%s/stdout' 2> '%s/stderr'",
           g_nebula, job, dir, dir, dir);
  run(cmd, dir);
  snprintf(p, sizeof p, "%s/train/summary.json", dir);
  json_t* s = json_load_file(p, 0, &je);
  assert_non_null(s);
  assert_string_equal(json_string_value(json_object_get(s, "task")), "translation");
  check_scores(json_object_get(s, "translation"));
  json_decref(s);

  /* nebula run: the worker's summary, then the job-level summary and report.html */
  snprintf(cmd, sizeof cmd, "'%s' run '%s' --out '%s/run' --no-mpi > '%s/stdout' 2> '%s/stderr'",
           g_nebula, job, dir, dir, dir);
  run(cmd, dir);
  snprintf(p, sizeof p, "%s/run/dc-a/summary.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  check_scores(json_object_get(s, "translation"));
  json_decref(s);
  snprintf(p, sizeof p, "%s/run/summary.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  check_scores(json_object_get(json_array_get(json_object_get(s, "clusters"), 0), "translation"));
  json_decref(s);
  snprintf(p, sizeof p, "%s/run/report.html", dir);
  char* h = slurp(p);
  assert_non_null(h);
  assert_non_null(strstr(h, "Translation quality"));
  assert_non_null(strstr(h, "<td>en-de</td><td>3</td>"));
  assert_non_null(strstr(h, "base vs final model"));
  assert_non_null(strstr(h, "<h2>Held-out evaluation</h2>"));
  free(h);

  /* nebula report --job: the descriptor's settings in the configuration block; a descriptor
   * that does not load fails with its problem named, and leaves the report as it was */
  snprintf(cmd, sizeof cmd, "'%s' report '%s/run' --job '%s' > '%s/stdout' 2> '%s/stderr'",
           g_nebula, dir, job, dir, dir);
  run(cmd, dir);
  h = slurp(p);
  assert_non_null(h);
  assert_non_null(strstr(h, "1 layer, width 32, 2 heads, context 64"));
  assert_non_null(strstr(h, "10 steps per cluster, batch 4"));
  free(h);
  snprintf(cmd, sizeof cmd, "%s/bad.json", dir);
  FILE* bf = fopen(cmd, "w");
  assert_non_null(bf);
  fputs("{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\"}\n", bf);
  assert_int_equal(fclose(bf), 0);
  snprintf(cmd, sizeof cmd, "'%s' report '%s/run' --job '%s/bad.json' > '%s/stdout' 2> '%s/stderr'",
           g_nebula, dir, dir, dir, dir);
  int rc = system(cmd);
  assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
  snprintf(cmd, sizeof cmd, "%s/stderr", dir);
  char* err = slurp(cmd);
  assert_non_null(err);
  print_message("bad --job: %s", err);
  assert_non_null(strstr(err, "bad.json"));
  free(err);
  h = slurp(p);
  assert_non_null(strstr(h, "1 layer, width 32, 2 heads, context 64")); /* untouched */
  free(h);

  /* eval.sentences = 0: no decoding, no translation field */
  write_job(job, "tiny-translate-off", 0);
  snprintf(cmd, sizeof cmd, "'%s' train '%s' --out '%s/off' > '%s/stdout' 2> '%s/stderr'", g_nebula,
           job, dir, dir, dir);
  run(cmd, dir);
  snprintf(p, sizeof p, "%s/off/summary.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  assert_null(json_object_get(s, "translation"));
  json_decref(s);

  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s DATA_DIR NEBULA\n", argv[0]);
    return 1;
  }
  g_data = argv[1];
  g_nebula = argv[2];
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_translation_run)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
