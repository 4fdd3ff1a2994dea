/* Unit tests of the job descriptor parser: the shipped examples validate with the expected
 * settings, defaults are filled in, normalization round-trips, and every file of the bad corpus
 * (tests/unit/jobs/bad/NAME.json + NAME.expect) is rejected with its precise message: by the
 * parser, or (the 5x/6x path cases, valid on their own) by the path confinement of a gateway.
 * argv[1]: the source tree's root. */
#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/common.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"
#include "jobs/job_program.h"

static const char* nb_src = ".";

static char* read_file(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  buf[got] = 0;
  if (len) *len = got;
  return buf;
}

static void example_path(char* buf, size_t n, const char* name) {
  snprintf(buf, n, "%s/jobs/examples/%s", nb_src, name);
}

static const char* minimal_doc =
    "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": \"m\"},"
    " \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {\"languages\": [\"en\"]}}]}}";

static void test_pretrain_example(void** state) {
  (void)state;
  char path[1024];
  example_path(path, sizeof path, "pretrain-2dc.json");
  nb_job_config_t cfg;
  nb_descriptor_diag_t diag;
  nb_status_t st = nb_descriptor_load(path, &cfg, &diag);
  if (st != NB_OK && diag.count)
    fprintf(stderr, "%s: %s\n", diag.errors[0].path, diag.errors[0].message);
  assert_int_equal(st, NB_OK);
  assert_int_equal(diag.count, 0);
  assert_string_equal(cfg.name, "pretrain-2dc");
  assert_int_equal(cfg.task, NB_JOB_TASK_PRETRAIN);
  assert_int_equal(cfg.n_clusters, 2);
  assert_string_equal(cfg.clusters[0].id, "dc-a");
  assert_string_equal(cfg.clusters[1].id, "dc-b");
  const char* a[] = {"en", "de", "fr", "es"};
  const char* b[] = {"en", "ru", "zh", "fa"};
  assert_int_equal(cfg.clusters[0].n_languages, 4);
  assert_int_equal(cfg.clusters[1].n_languages, 4);
  for (int i = 0; i < 4; i++) {
    assert_string_equal(cfg.clusters[0].languages[i], a[i]);
    assert_string_equal(cfg.clusters[1].languages[i], b[i]);
  }
  assert_int_equal(cfg.clusters[0].workers, 2);
  assert_int_equal(cfg.sync.mode, NB_JOB_SYNC_OUTER);
  assert_int_equal(cfg.sync.inner_steps, 50);
  assert_true(cfg.sync.overlap);
  assert_true(cfg.compression.adaptive);
  assert_int_equal(cfg.compression.values, NB_JOB_VALUES_FP16);
  assert_true(cfg.link.rate_mbit == 100.0);
  assert_true(cfg.link.delay_ms == 25.0);
  assert_false(cfg.training.lora.enabled);
  assert_false(cfg.training.distill.enabled);
  assert_true(cfg.model.base_checkpoint[0] == 0);
  assert_int_equal(cfg.training.seed, 1234);
}

static void test_finetune_example(void** state) {
  (void)state;
  char path[1024];
  example_path(path, sizeof path, "finetune-translation-remote.json");
  nb_job_config_t cfg;
  nb_descriptor_diag_t diag;
  assert_int_equal(nb_descriptor_load(path, &cfg, &diag), NB_OK);
  assert_int_equal(cfg.task, NB_JOB_TASK_TRANSLATION);
  assert_int_equal(cfg.n_clusters, 1);
  assert_string_equal(cfg.clusters[0].id, "dc-b");
  assert_int_equal(cfg.clusters[0].n_pairs, 4);
  assert_string_equal(cfg.clusters[0].pair_src[0], "en");
  assert_string_equal(cfg.clusters[0].pair_tgt[0], "de");
  assert_string_equal(cfg.clusters[0].pair_tgt[3], "zh");
  assert_int_equal(cfg.clusters[0].n_languages, 0);
  assert_string_equal(cfg.model.base_checkpoint, "pretrain-2dc/final.safetensors");
  assert_string_equal(cfg.model.base_cluster, "dc-a");
  assert_true(cfg.training.lora.enabled);
  assert_int_equal(cfg.training.lora.rank, 8);
  assert_true(cfg.training.lora.alpha == 16.0);
  assert_int_equal(cfg.training.lora.targets, NB_JOB_LORA_QKV | NB_JOB_LORA_ATTN_OUT |
                                                  NB_JOB_LORA_MLP_UP | NB_JOB_LORA_MLP_DOWN);
  assert_true(cfg.training.distill.enabled);
  assert_string_equal(cfg.training.distill.teacher, "base");
  assert_true(cfg.training.distill.alpha == 0.3);
  assert_true(cfg.training.optimizer.weight_decay == 0.0);
  /* optimizer fields not written keep their defaults */
  assert_true(cfg.training.optimizer.beta2 == 0.95);
}

static void test_defaults_filled(void** state) {
  (void)state;
  nb_job_config_t cfg, def;
  assert_int_equal(nb_descriptor_parse(minimal_doc, strlen(minimal_doc), &cfg, NULL), NB_OK);
  nb_job_config_defaults(&def);
  /* Everything but what the document names equals the documented defaults. */
  assert_memory_equal(&cfg.model, &def.model, sizeof def.model);
  assert_memory_equal(&cfg.training, &def.training, sizeof def.training);
  assert_memory_equal(&cfg.sync, &def.sync, sizeof def.sync);
  assert_memory_equal(&cfg.compression, &def.compression, sizeof def.compression);
  assert_memory_equal(&cfg.link, &def.link, sizeof def.link);
  assert_memory_equal(&cfg.security, &def.security, sizeof def.security);
  assert_memory_equal(&cfg.checkpoint, &def.checkpoint, sizeof def.checkpoint);
  /* And the defaults are the documented values. */
  assert_int_equal(cfg.task, NB_JOB_TASK_PRETRAIN);
  assert_int_equal(cfg.clusters[0].workers, 1);
  assert_int_equal(cfg.clusters[0].device, NB_JOB_DEVICE_CPU);
  assert_true(cfg.clusters[0].slowdown == 1.0);
  assert_int_equal(cfg.clusters[0].data_tier, NB_JOB_DATA_QUICK);
  assert_int_equal(cfg.model.layers, 4);
  assert_int_equal(cfg.model.width, 256);
  assert_int_equal(cfg.sync.mode, NB_JOB_SYNC_OUTER);
  assert_int_equal(cfg.sync.inner_steps, 50);
  assert_false(cfg.sync.overlap);
  assert_true(cfg.compression.density_initial == 0.01);
  assert_true(cfg.compression.density_min == 0.001);
  assert_true(cfg.compression.density_max == 0.1);
  assert_int_equal(cfg.compression.zstd_level, NB_CODEC_ZSTD_LEVEL_DEFAULT);
  assert_int_equal(cfg.link.streams, 4);
  assert_true(cfg.security.seal);
  assert_int_equal(cfg.checkpoint.every_rounds, 10);
  assert_false(cfg.training.lora.enabled);
}

static void test_default_warmup_shrinks_for_short_runs(void** state) {
  (void)state;
  const char* doc =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": \"m\"},"
      " \"spec\": {\"clusters\": [{\"id\": \"a\", \"data\": {\"languages\": [\"en\"]}}],"
      " \"training\": {\"maxSteps\": 20}}}";
  nb_job_config_t cfg;
  assert_int_equal(nb_descriptor_parse(doc, strlen(doc), &cfg, NULL), NB_OK);
  assert_int_equal(cfg.training.optimizer.warmup_steps, 2);
}

/* A user's own corpus: any data label of 1..7 of [a-z0-9_] starting with a letter, for
 * languages and for pairs; anything that could leave mono/ or name no file refused. */
static void test_own_data_labels(void** state) {
  (void)state;
  nb_job_config_t* cfg = calloc(1, sizeof *cfg);
  nb_descriptor_diag_t* diag = calloc(1, sizeof *diag);
  assert_non_null(cfg);
  assert_non_null(diag);
  static const char* ok =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"m\"}, \"spec\": {\"clusters\": [{\"id\": \"a\", \"data\": {\"languages\": [\"legal\", "
      "\"med_de\", \"x1\", \"en\"]}}]}}";
  assert_int_equal(nb_descriptor_parse(ok, strlen(ok), cfg, diag), NB_OK);
  assert_int_equal(cfg->clusters[0].n_languages, 4);
  assert_string_equal(cfg->clusters[0].languages[0], "legal");
  assert_string_equal(cfg->clusters[0].languages[1], "med_de");
  static const char* pairs =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"m\"}, \"spec\": {\"task\": \"translation\", \"clusters\": [{\"id\": \"a\", \"data\": "
      "{\"pairs\": [\"en-legal\"]}}]}}";
  assert_int_equal(nb_descriptor_parse(pairs, strlen(pairs), cfg, diag), NB_OK);
  assert_string_equal(cfg->clusters[0].pair_src[0], "en");
  assert_string_equal(cfg->clusters[0].pair_tgt[0], "legal");
  static const char* const bad[] = {"../etc", "a/b", "Legal", "1x", "toolong1", "", "a.b", "-x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char doc[512];
    snprintf(doc, sizeof doc,
             "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": "
             "{\"name\": \"m\"}, \"spec\": {\"clusters\": [{\"id\": \"a\", \"data\": "
             "{\"languages\": [\"%s\"]}}]}}",
             bad[i]);
    assert_int_not_equal(nb_descriptor_parse(doc, strlen(doc), cfg, diag), NB_OK);
    assert_true(diag->count >= 1);
    assert_non_null(strstr(diag->errors[0].message, "expected a data label"));
  }
  free(cfg);
  free(diag);
}

/* parse → print → parse gives the same config and the same text. */
static void roundtrip(const char* text, size_t len) {
  nb_job_config_t* a = calloc(1, sizeof *a);
  nb_job_config_t* b = calloc(1, sizeof *b);
  assert_int_equal(nb_descriptor_parse(text, len, a, NULL), NB_OK);
  char *j1 = NULL, *j2 = NULL;
  assert_int_equal(nb_descriptor_to_json(a, &j1), NB_OK);
  nb_descriptor_diag_t diag;
  nb_status_t st = nb_descriptor_parse(j1, strlen(j1), b, &diag);
  if (st != NB_OK) fprintf(stderr, "%s: %s\n%s\n", diag.errors[0].path, diag.errors[0].message, j1);
  assert_int_equal(st, NB_OK);
  assert_memory_equal(a, b, sizeof *a);
  assert_int_equal(nb_descriptor_to_json(b, &j2), NB_OK);
  assert_string_equal(j1, j2);
  free(j1);
  free(j2);
  free(a);
  free(b);
}

static void test_normalized_roundtrip(void** state) {
  (void)state;
  const char* names[] = {"pretrain-2dc.json", "finetune-translation-remote.json"};
  for (int i = 0; i < 2; i++) {
    char path[1024];
    example_path(path, sizeof path, names[i]);
    size_t len = 0;
    char* text = read_file(path, &len);
    assert_non_null(text);
    roundtrip(text, len);
    free(text);
  }
  roundtrip(minimal_doc, strlen(minimal_doc));
  const char* wall =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": \"w\"},"
      " \"spec\": {\"clusters\": [{\"id\": \"a\", \"data\": {\"languages\": [\"en\"]}}],"
      " \"sync\": {\"roundSeconds\": 12.5},"
      " \"security\": {\"ca\": \"ca.pem\", \"cert\": \"u.pem\", \"key\": \"u.key\"}}}";
  roundtrip(wall, strlen(wall));
}

/* spec.clusters[i].metrics.listen: the leader's Prometheus endpoint per cluster, accepted for the
 * built-in model and a program job, written back by the printer (round trip), absent = off; an
 * address that cannot be a TCP listener refused naming the path, the first error of a document
 * staying the thread's error detail. */
static void test_metrics_listen(void** state) {
  (void)state;
  nb_job_config_t* cfg = calloc(1, sizeof *cfg);
  nb_descriptor_diag_t* diag = calloc(1, sizeof *diag);
  assert_non_null(cfg);
  assert_non_null(diag);
  static const char* ok =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"m\"}, \"spec\": {\"clusters\": [{\"id\": \"a\", \"data\": {\"languages\": [\"en\"]}}, "
      "{\"id\": \"b\", \"data\": {\"languages\": [\"en\"]}, \"metrics\": {\"listen\": "
      "\"127.0.0.1:0\"}}, {\"id\": \"c\", \"data\": {\"languages\": [\"en\"]}, \"metrics\": "
      "{\"listen\": \"[::1]:9465\"}}]}}";
  assert_int_equal(nb_descriptor_parse(ok, strlen(ok), cfg, diag), NB_OK);
  assert_string_equal(cfg->clusters[0].metrics_listen, "");
  assert_string_equal(cfg->clusters[1].metrics_listen, "127.0.0.1:0");
  assert_string_equal(cfg->clusters[2].metrics_listen, "[::1]:9465");
  char* j = NULL;
  assert_int_equal(nb_descriptor_to_json(cfg, &j), NB_OK);
  assert_non_null(strstr(j, "\"metrics\": {\n          \"listen\": \"127.0.0.1:0\"\n        }"));
  /* cluster a has none written: its first "metrics" is cluster b's, after b's id */
  assert_true(strstr(j, "\"metrics\"") > strstr(j, "\"id\": \"b\""));
  free(j);
  roundtrip(ok, strlen(ok));
  static const char* prog =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"p\"}, \"spec\": {\"clusters\": [{\"id\": \"a\", \"metrics\": {\"listen\": "
      "\"0.0.0.0:9465\"}}], \"program\": {\"command\": [\"python3\", \"train.py\"]}}}";
  assert_int_equal(nb_descriptor_parse(prog, strlen(prog), cfg, diag), NB_OK);
  assert_string_equal(cfg->clusters[0].metrics_listen, "0.0.0.0:9465");
  roundtrip(prog, strlen(prog));
  /* a program job's session gets it as NEBULA_METRICS_LISTEN (docs/api.md, The environment) */
  char* env[NB_JOB_PROGRAM_MAX_ENV + 1];
  int n_env = 0, found = 0;
  nb_job_program_site_t site = {.job_id = "p",
                                .cluster_id = "a",
                                .listen = "127.0.0.1:0",
                                .pki_dir = "pki",
                                .secret_file = "secret"};
  assert_int_equal(nb_job_program_env(cfg, &site, env, NB_JOB_PROGRAM_MAX_ENV + 1, &n_env), NB_OK);
  for (int i = 0; i < n_env; i++) found += !strcmp(env[i], "NEBULA_METRICS_LISTEN=0.0.0.0:9465");
  assert_int_equal(found, 1);
  nb_job_program_env_free(env, n_env);
  cfg->clusters[0].metrics_listen[0] = 0; /* no key: no variable */
  assert_int_equal(nb_job_program_env(cfg, &site, env, NB_JOB_PROGRAM_MAX_ENV + 1, &n_env), NB_OK);
  for (int i = 0; i < n_env; i++) assert_null(strstr(env[i], "NEBULA_METRICS_LISTEN"));
  nb_job_program_env_free(env, n_env);

  static const struct {
    const char* metrics; /* the value of clusters[1].metrics */
    const char *path, *msg;
  } bad[] = {
      {"{\"listen\": \"localhost\"}", "$.spec.clusters[1].metrics.listen", "has no port"},
      {"{\"listen\": \"127.0.0.1:99999\"}", "$.spec.clusters[1].metrics.listen",
       "expected HOST:PORT: port '99999' of '127.0.0.1:99999' is not a port number in 0..65535"},
      {"{\"listen\": \"h:-1\"}", "$.spec.clusters[1].metrics.listen", "not a port number"},
      {"{\"listen\": \"h:80x\"}", "$.spec.clusters[1].metrics.listen", "not a port number"},
      {"{\"listen\": \"\"}", "$.spec.clusters[1].metrics.listen", "empty address"},
      {"{\"listen\": \"unix:/tmp/m\"}", "$.spec.clusters[1].metrics.listen", "not a unix:"},
      {"{\"listen\": 9465}", "$.spec.clusters[1].metrics.listen", "expected a string"},
      {"{\"listen\": \"a\\nb:1\"}", "$.spec.clusters[1].metrics.listen", "control characters"},
      {"{}", "$.spec.clusters[1].metrics.listen", "required field is missing"},
      {"{\"listn\": \"h:1\"}", "$.spec.clusters[1].metrics.listn", "did you mean \"listen\"?"},
      {"\"127.0.0.1:9465\"", "$.spec.clusters[1].metrics", "expected an object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char doc[768];
    snprintf(doc, sizeof doc,
             "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": "
             "{\"name\": \"m\"}, \"spec\": {\"clusters\": [{\"id\": \"a\", \"data\": "
             "{\"languages\": [\"en\"]}}, {\"id\": \"b\", \"data\": {\"languages\": [\"en\"]}, "
             "\"metrics\": %s}]}}",
             bad[i].metrics);
    assert_int_equal(nb_descriptor_parse(doc, strlen(doc), cfg, diag), NB_ERR_CONFIG);
    if (diag->count != 1 || strcmp(diag->errors[0].path, bad[i].path) ||
        !strstr(diag->errors[0].message, bad[i].msg))
      fail_msg("%s: got %d errors, the first %s: %s", bad[i].metrics, diag->count,
               diag->errors[0].path, diag->errors[0].message);
    assert_non_null(strstr(nb_error_last(), bad[i].path));
  }
  /* an earlier error stays the thread's detail (the address check reports through it too) */
  static const char* two =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"m\"}, \"spec\": {\"clusters\": [{\"id\": \"a\", \"workers\": 0, \"data\": "
      "{\"languages\": [\"en\"]}, \"metrics\": {\"listen\": \"h:70000\"}}]}}";
  assert_int_equal(nb_descriptor_parse(two, strlen(two), cfg, diag), NB_ERR_CONFIG);
  assert_int_equal(diag->count, 2);
  assert_string_equal(diag->errors[1].path, "$.spec.clusters[0].metrics.listen");
  assert_non_null(strstr(nb_error_last(), "$.spec.clusters[0].workers"));
  assert_null(strstr(nb_error_last(), "70000"));
  free(cfg);
  free(diag);
}

/* Reals are held to 15 significant digits, so the normalized text and the config agree bit for
 * bit whatever digits the author wrote. */
static void test_reals_canonical(void** state) {
  (void)state;
  const char* doc =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": \"r\"},"
      " \"spec\": {\"clusters\": [{\"id\": \"a\", \"data\": {\"languages\": [\"en\"]}}],"
      " \"training\": {\"optimizer\": {\"lr\": 0.30000000000000004}}}}";
  nb_job_config_t cfg;
  assert_int_equal(nb_descriptor_parse(doc, strlen(doc), &cfg, NULL), NB_OK);
  assert_true(cfg.training.optimizer.lr == 0.3);
  char* j = NULL;
  assert_int_equal(nb_descriptor_to_json(&cfg, &j), NB_OK);
  assert_non_null(strstr(j, "\"lr\": 0.3,"));
  free(j);
  roundtrip(doc, strlen(doc));
}

static void test_many_errors_reported(void** state) {
  (void)state;
  const char* doc =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"x\"},\n"
      " \"spec\": {\"clusters\": [{\"id\": \"a\", \"workrs\": 2, \"data\": {\"languages\": "
      "[\"en\"]}},\n"
      "  {\"id\": \"b\", \"workers\": -3, \"data\": {\"languages\": [\"J P\"]}}],\n"
      "  \"sync\": {\"mode\": \"outr\"}}}";
  nb_job_config_t cfg;
  nb_descriptor_diag_t diag;
  assert_int_equal(nb_descriptor_parse(doc, strlen(doc), &cfg, &diag), NB_ERR_CONFIG);
  assert_int_equal(diag.count, 4);
  assert_string_equal(diag.errors[0].path, "$.spec.clusters[0].workrs");
  assert_string_equal(diag.errors[1].path, "$.spec.clusters[1].workers");
  assert_string_equal(diag.errors[2].path, "$.spec.clusters[1].data.languages[0]");
  assert_string_equal(diag.errors[3].path, "$.spec.sync.mode");
  assert_int_equal(diag.errors[0].line, 0);
  /* the first error is also the thread's error detail */
  assert_non_null(strstr(nb_error_last(), "$.spec.clusters[0].workrs"));
}

static void test_error_limit(void** state) {
  (void)state;
  /* 40 unknown fields: 32 kept, 8 counted as dropped. */
  char doc[4096];
  size_t off = (size_t)snprintf(doc, sizeof doc,
                                "{\"apiVersion\": \"nebula/v1\", \"kind\": "
                                "\"TrainingJob\", \"metadata\": {\"name\": \"x\"");
  for (int i = 0; i < 40; i++)
    off += (size_t)snprintf(doc + off, sizeof doc - off, ", \"zz%d\": 1", i);
  snprintf(doc + off, sizeof doc - off, "}}");
  nb_job_config_t cfg;
  nb_descriptor_diag_t diag;
  assert_int_equal(nb_descriptor_parse(doc, strlen(doc), &cfg, &diag), NB_ERR_CONFIG);
  assert_int_equal(diag.count, NB_DESCRIPTOR_MAX_ERRORS);
  assert_true(diag.dropped >= 8);
}

static void test_limits_and_args(void** state) {
  (void)state;
  nb_job_config_t cfg;
  nb_descriptor_diag_t diag;
  assert_int_equal(nb_descriptor_parse(NULL, 0, &cfg, &diag), NB_ERR_INVALID);
  size_t big = NB_DESCRIPTOR_MAX_BYTES + 1;
  char* buf = malloc(big);
  memset(buf, ' ', big);
  assert_int_equal(nb_descriptor_parse(buf, big, &cfg, &diag), NB_ERR_CONFIG);
  assert_non_null(strstr(diag.errors[0].message, "exceeds the limit"));
  free(buf);
  assert_int_equal(nb_descriptor_load("/nonexistent/nebula-job.json", &cfg, &diag), NB_ERR_IO);
  assert_non_null(strstr(diag.errors[0].message, "cannot open"));
  /* NUL bytes inside the text are a syntax error, not a truncation */
  const char nul[] = "{\"apiVersion\": \"nebula/v1\"\0}";
  assert_int_equal(nb_descriptor_parse(nul, sizeof nul - 1, &cfg, &diag), NB_ERR_CONFIG);
  assert_true(diag.errors[0].line >= 1);
}

static int has_suffix(const char* s, const char* suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static int cmp_str(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

static void test_bad_corpus(void** state) {
  (void)state;
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/unit/jobs/bad", nb_src);
  DIR* d = opendir(dir);
  assert_non_null(d);
  char* names[256];
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) && n < 256)
    if (has_suffix(e->d_name, ".json")) names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], cmp_str);
  assert_true(n >= 20);
  int failures = 0;
  for (int i = 0; i < n; i++) {
    char path[1400], expect_path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    snprintf(expect_path, sizeof expect_path, "%s", path);
    strcpy(expect_path + strlen(expect_path) - 5, ".expect");
    char* expect = read_file(expect_path, NULL);
    if (!expect) {
      fprintf(stderr, "%s: no .expect file\n", names[i]);
      failures++;
      continue;
    }
    expect[strcspn(expect, "\n")] = 0;
    nb_job_config_t cfg;
    nb_descriptor_diag_t diag;
    nb_status_t st = nb_descriptor_load(path, &cfg, &diag);
    /* a descriptor that is valid on its own (a user's own `nebula train` accepts it) must be
     * refused by the path confinement of a gateway, as Submit does: a job folder made afresh,
     * no allowed roots */
    int confined = st == NB_OK;
    if (confined) {
      memset(&diag, 0, sizeof diag);
      st = nb_job_paths_check(&cfg, NULL, NULL, 0, &diag) == NB_ERR_PERMISSION ? NB_ERR_CONFIG
                                                                               : NB_OK;
    }
    int found = 0;
    char line[640];
    for (int k = 0; k < diag.count; k++)
      if (strstr(nb_descriptor_error_format(&diag.errors[k], line, sizeof line), expect)) found = 1;
    if (st != NB_ERR_CONFIG || !found || expect[0] == 0) {
      fprintf(stderr, "%s: status %s%s, wanted an error containing '%s'; got:\n", names[i],
              nb_status_name(st), confined ? " (path check)" : "", expect);
      for (int k = 0; k < diag.count; k++)
        fprintf(stderr, "  %s\n", nb_descriptor_error_format(&diag.errors[k], line, sizeof line));
      failures++;
    }
    free(expect);
    free(names[i]);
  }
  printf("bad corpus: %d descriptors, %d failures\n", n, failures);
  assert_int_equal(failures, 0);
}

/* Runs `nebula validate` in-process with stdout captured into buf. */
static int run_validate(char** argv, int argc, char* buf, size_t n) {
  fflush(stdout);
  char tmpl[] = "/tmp/nb-validate-XXXXXX";
  int fd = mkstemp(tmpl);
  assert_true(fd >= 0);
  int saved = dup(1);
  dup2(fd, 1);
  int rc = nb_validate_main(argc, argv);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  lseek(fd, 0, SEEK_SET);
  ssize_t got = read(fd, buf, n - 1);
  buf[got > 0 ? got : 0] = 0;
  close(fd);
  unlink(tmpl);
  return rc;
}

static void test_validate_cli(void** state) {
  (void)state;
  static char out[1 << 16];
  char good[1024], bad[1024];
  example_path(good, sizeof good, "pretrain-2dc.json");
  snprintf(bad, sizeof bad, "%s/tests/unit/jobs/bad/18-workers-negative.json", nb_src);

  char* a1[] = {"validate", good};
  assert_int_equal(run_validate(a1, 2, out, sizeof out), 0);
  assert_non_null(strstr(out, "\"peerTimeoutSeconds\": 2.0")); /* a default, written out */

  char* a2[] = {"validate", good, "--json"};
  assert_int_equal(run_validate(a2, 3, out, sizeof out), 0);
  assert_non_null(strstr(out, "\"valid\": true"));
  assert_non_null(strstr(out, "\"config\": {"));

  char* a3[] = {"validate", "--json", bad};
  assert_int_equal(run_validate(a3, 3, out, sizeof out), 1);
  assert_non_null(strstr(out, "\"valid\": false"));
  assert_non_null(strstr(out, "\"path\": \"$.spec.clusters[1].workers\""));

  char* a4[] = {"validate"};
  assert_int_equal(run_validate(a4, 1, out, sizeof out), 2);
  char* a5[] = {"validate", good, "--frobnicate"};
  assert_int_equal(run_validate(a5, 3, out, sizeof out), 2);
  char* a6[] = {"validate", good, bad};
  assert_int_equal(run_validate(a6, 3, out, sizeof out), 2);
  char* a7[] = {"validate", "--help"};
  assert_int_equal(run_validate(a7, 2, out, sizeof out), 0);
  assert_non_null(strstr(out, "usage: nebula validate"));
}

int main(int argc, char** argv) {
  if (argc > 1) nb_src = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pretrain_example),
      cmocka_unit_test(test_finetune_example),
      cmocka_unit_test(test_defaults_filled),
      cmocka_unit_test(test_own_data_labels),
      cmocka_unit_test(test_default_warmup_shrinks_for_short_runs),
      cmocka_unit_test(test_normalized_roundtrip),
      cmocka_unit_test(test_reals_canonical),
      cmocka_unit_test(test_metrics_listen),
      cmocka_unit_test(test_many_errors_reported),
      cmocka_unit_test(test_error_limit),
      cmocka_unit_test(test_limits_and_args),
      cmocka_unit_test(test_bad_corpus),
      cmocka_unit_test(test_validate_cli),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
