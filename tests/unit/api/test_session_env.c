/* nb_session_options_from_env (and _from_descriptor) through libnebula.so and <nebula.h> only:
 * every variable read into its field, the storage the options own and nb_session_options_free, a
 * one-cluster session opened from the environment, each malformed variable refused naming it, and
 * the job secret file's checks (size, hex, mode, kind). Single-threaded: it sets the process
 * environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <nebula.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char* const vars[] = {"NEBULA_JOB_ID",
                                   "NEBULA_CLUSTER_ID",
                                   "NEBULA_CLUSTER_INDEX",
                                   "NEBULA_N_CLUSTERS",
                                   "NEBULA_LISTEN",
                                   "NEBULA_PEERS",
                                   "NEBULA_PKI_DIR",
                                   "NEBULA_JOB_SECRET_FILE",
                                   "NEBULA_INNER_STEPS",
                                   "NEBULA_OUTER_LR",
                                   "NEBULA_OUTER_MOMENTUM",
                                   "NEBULA_DENSITY",
                                   "NEBULA_VALUES",
                                   "NEBULA_INSECURE",
                                   "NEBULA_UNSEALED",
                                   "NEBULA_UPDATE_NORM_BOUND",
                                   "NEBULA_ERROR_FEEDBACK",
                                   "NEBULA_PEER_TIMEOUT_S",
                                   "NEBULA_ADAPTIVE",
                                   "NEBULA_DENSITY_MIN",
                                   "NEBULA_DENSITY_MAX",
                                   "NEBULA_RATE_MBIT",
                                   "NEBULA_ERROR_FEEDBACK_DECAY",
                                   "NEBULA_EAGER",
                                   "NEBULA_TOPK_CHUNK"};

static char dir[256];

static void env_clear(void) {
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* A file in the test's folder with `len` bytes of `data` and `mode`; its path into path. */
static void write_file(const char* name, const void* data, size_t len, mode_t mode, char* path,
                       size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  unlink(path);
  FILE* f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
  assert_int_equal(chmod(path, mode), 0);
}

static int setup(void** state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/nb_test_env_XXXXXX");
  assert_non_null(mkdtemp(dir));
  return 0;
}

static int teardown(void** state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  env_clear();
  return 0;
}

static void test_reads_every_variable(void** state) {
  (void)state;
  env_clear();
  uint8_t secret[32];
  for (int i = 0; i < 32; i++) secret[i] = (uint8_t)(0xa0 + i);
  char path[512];
  write_file("secret.bin", secret, 32, 0600, path, sizeof path);
  setenv("NEBULA_JOB_ID", "env-job", 1);
  setenv("NEBULA_CLUSTER_ID", "east", 1);
  setenv("NEBULA_CLUSTER_INDEX", "1", 1);
  setenv("NEBULA_N_CLUSTERS", "3", 1);
  setenv("NEBULA_LISTEN", "127.0.0.1:7001", 1);
  setenv("NEBULA_PEERS", "west=10.0.0.2:7000,north=[::1]:7002", 1);
  setenv("NEBULA_PKI_DIR", "/etc/nebula/pki", 1);
  setenv("NEBULA_JOB_SECRET_FILE", path, 1);
  setenv("NEBULA_INNER_STEPS", "32", 1);
  setenv("NEBULA_OUTER_LR", "0.5", 1);
  setenv("NEBULA_OUTER_MOMENTUM", "0", 1);
  setenv("NEBULA_DENSITY", "1", 1);
  setenv("NEBULA_VALUES", "bf16", 1);
  setenv("NEBULA_INSECURE", "1", 1);
  setenv("NEBULA_UNSEALED", "0", 1);
  setenv("NEBULA_UPDATE_NORM_BOUND", "0", 1);
  setenv("NEBULA_PEER_TIMEOUT_S", "7.5", 1);
  setenv("NEBULA_ADAPTIVE", "1", 1);
  setenv("NEBULA_DENSITY_MIN", "0.002", 1);
  setenv("NEBULA_DENSITY_MAX", "0.5", 1);
  setenv("NEBULA_RATE_MBIT", "250", 1);
  setenv("NEBULA_ERROR_FEEDBACK_DECAY", "0.85", 1);
  setenv("NEBULA_EAGER", "0", 1);
  setenv("NEBULA_TOPK_CHUNK", "4096", 1);
  nb_session_options_t o;
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_true(o.error_feedback_decay == 0.85);
  assert_int_equal(o.eager, 0);
  assert_int_equal(o.topk_chunk, 4096);
  assert_int_equal(o.adaptive, 1);
  assert_true(o.density_min == 0.002 && o.density_max == 0.5 && o.rate_mbit == 250);
  assert_string_equal(o.job_id, "env-job");
  assert_string_equal(o.cluster_id, "east");
  assert_int_equal(o.cluster_index, 1);
  assert_int_equal(o.n_clusters, 3);
  assert_string_equal(o.listen, "127.0.0.1:7001");
  assert_int_equal(o.n_peers, 2);
  assert_string_equal(o.peers[0], "west=10.0.0.2:7000");
  assert_string_equal(o.peers[1], "north=[::1]:7002");
  assert_string_equal(o.pki_dir, "/etc/nebula/pki");
  assert_non_null(o.job_secret);
  assert_memory_equal(o.job_secret, secret, 32);
  assert_int_equal(o.inner_steps, 32);
  assert_true(o.outer_lr == 0.5f);
  assert_true(o.outer_momentum == 0.0f);
  assert_true(o.density == 1.0);
  assert_string_equal(o.values, "bf16");
  assert_int_equal(o.insecure, 1);
  assert_int_equal(o.unsealed, 0);
  assert_int_equal(o.error_feedback, 1); /* no variable: the default */
  assert_true(o.peer_timeout_s == 7.5);
  assert_true(o.update_norm_bound == 0); /* off */
  assert_non_null(o.env_storage);
  /* the copies are the options' own: the environment may change under them */
  setenv("NEBULA_JOB_ID", "changed", 1);
  assert_string_equal(o.job_id, "env-job");
  /* free clears what pointed into the storage and keeps what the caller set */
  o.cluster_id = "mine";
  nb_session_options_free(&o);
  assert_null(o.env_storage);
  assert_null(o.job_id);
  assert_null(o.peers);
  assert_int_equal(o.n_peers, 0);
  assert_null(o.job_secret);
  assert_string_equal(o.cluster_id, "mine");
  assert_int_equal(o.inner_steps, 32);
  nb_session_options_free(&o); /* owns nothing now: a no-op */
  nb_session_options_free(NULL);

  /* the secret as 64 hex digits with openssl's newline */
  char hex[66];
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02X", secret[i]);
  hex[64] = '\n';
  write_file("secret.hex", hex, 65, 0400, path, sizeof path);
  setenv("NEBULA_JOB_SECRET_FILE", path, 1);
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_memory_equal(o.job_secret, secret, 32);
  nb_session_options_free(&o);

  /* a job whose descriptor turns error feedback off (compression.errorFeedback: false) */
  setenv("NEBULA_ERROR_FEEDBACK", "0", 1);
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_int_equal(o.error_feedback, 0);
  nb_session_options_free(&o);
}

/* Nothing set: the defaults, owning nothing worth keeping; a session opens from the variables
 * a one-cluster test sets, and the caller can still override a field. */
static void test_defaults_and_open(void** state) {
  (void)state;
  env_clear();
  nb_session_options_t o, d;
  nb_session_options_default(&d);
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_null(o.job_id);
  assert_int_equal(o.n_clusters, d.n_clusters);
  assert_int_equal(o.inner_steps, d.inner_steps);
  assert_string_equal(o.values, d.values);
  nb_session_options_free(&o);

  setenv("NEBULA_JOB_ID", "env-open", 1);
  setenv("NEBULA_CLUSTER_ID", "solo", 1);
  setenv("NEBULA_INSECURE", "1", 1);
  setenv("NEBULA_UNSEALED", "1", 1);
  setenv("NEBULA_VALUES", "fp32", 1);
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  o.inner_steps = 4;
  nb_session_t* s = NULL;
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  nb_session_options_free(&o); /* the session copied what it keeps */
  float v[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  assert_int_equal(nb_session_register(s, "v", v, shape, 1), NB_OK);
  assert_int_equal(nb_session_start(s), NB_OK);
  assert_int_equal(nb_session_round(s, 1, NULL), NB_OK);
  nb_session_close(s);
}

typedef struct {
  const char* var;
  const char* value;
} bad_t;

static void test_each_bad_variable(void** state) {
  (void)state;
  static const bad_t bad[] = {
      {"NEBULA_JOB_ID", ""},
      {"NEBULA_CLUSTER_ID", ""},
      {"NEBULA_LISTEN", ""},
      {"NEBULA_PKI_DIR", ""},
      {"NEBULA_N_CLUSTERS", "0"},
      {"NEBULA_N_CLUSTERS", "65"},
      {"NEBULA_N_CLUSTERS", "two"},
      {"NEBULA_N_CLUSTERS", " 2"},
      {"NEBULA_N_CLUSTERS", "2 "},
      {"NEBULA_N_CLUSTERS", "2.0"},
      {"NEBULA_CLUSTER_INDEX", "-1"},
      {"NEBULA_CLUSTER_INDEX", "1"}, /* with one cluster (the default count) */
      {"NEBULA_INNER_STEPS", "0"},
      {"NEBULA_INNER_STEPS", "1e3"},
      {"NEBULA_INNER_STEPS", "99999999999999999999999"},
      {"NEBULA_OUTER_LR", "0"},
      {"NEBULA_OUTER_LR", "-0.5"},
      {"NEBULA_OUTER_LR", "nan"},
      {"NEBULA_OUTER_LR", "inf"},
      {"NEBULA_OUTER_LR", "0.7x"},
      {"NEBULA_OUTER_MOMENTUM", "1"},
      {"NEBULA_OUTER_MOMENTUM", "-0.1"},
      {"NEBULA_DENSITY", "0"},
      {"NEBULA_DENSITY", "1.5"},
      {"NEBULA_DENSITY", ""},
      {"NEBULA_UPDATE_NORM_BOUND", "-1"},
      {"NEBULA_UPDATE_NORM_BOUND", "inf"},
      {"NEBULA_UPDATE_NORM_BOUND", "big"},
      {"NEBULA_VALUES", "int7"},
      {"NEBULA_ADAPTIVE", "yes"},
      {"NEBULA_DENSITY_MIN", "0"},
      {"NEBULA_DENSITY_MAX", "2"},
      {"NEBULA_RATE_MBIT", "-1"},
      {"NEBULA_ERROR_FEEDBACK_DECAY", "0"},
      {"NEBULA_ERROR_FEEDBACK_DECAY", "1.5"},
      {"NEBULA_VALUES", "automatic"},
      {"NEBULA_ERROR_FEEDBACK", "off"},
      {"NEBULA_EAGER", "true"},
      {"NEBULA_TOPK_CHUNK", "70000"},
      {"NEBULA_TOPK_CHUNK", "-16"},
      {"NEBULA_ERROR_FEEDBACK", "2"},
      {"NEBULA_PEER_TIMEOUT_S", "-1"},
      {"NEBULA_PEER_TIMEOUT_S", "1e9"},
      {"NEBULA_INSECURE", "yes"},
      {"NEBULA_INSECURE", "2"},
      {"NEBULA_UNSEALED", "true"},
      {"NEBULA_UNSEALED", ""},
      {"NEBULA_PEERS", "west"},
      {"NEBULA_PEERS", "=h:1"},
      {"NEBULA_PEERS", "west=host"},
      {"NEBULA_PEERS", "west=host:"},
      {"NEBULA_PEERS", "west=h:1,,north=h:2"},
      {"NEBULA_PEERS", "west=h:1,"},
      {"NEBULA_JOB_SECRET_FILE", ""},
      {"NEBULA_JOB_SECRET_FILE", "/nonexistent/nebula/secret"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    env_clear();
    setenv(bad[i].var, bad[i].value, 1);
    nb_session_options_t o;
    nb_status_t st = nb_session_options_from_env(&o);
    print_message("%s=\"%s\": %s\n", bad[i].var, bad[i].value, nb_error_last());
    assert_int_equal(st, NB_ERR_CONFIG);
    assert_non_null(strstr(nb_error_last(), bad[i].var));
    /* on error: the defaults, owning nothing */
    assert_null(o.env_storage);
    assert_null(o.job_id);
    assert_int_equal(o.n_clusters, 1);
  }
  /* the index is checked against the count given beside it */
  env_clear();
  setenv("NEBULA_N_CLUSTERS", "4", 1);
  setenv("NEBULA_CLUSTER_INDEX", "3", 1);
  nb_session_options_t o;
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_int_equal(o.cluster_index, 3);
  nb_session_options_free(&o);
  setenv("NEBULA_CLUSTER_INDEX", "4", 1);
  assert_int_equal(nb_session_options_from_env(&o), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "NEBULA_CLUSTER_INDEX"));
  assert_int_equal(nb_session_options_from_env(NULL), NB_ERR_INVALID);
}

/* The secret file: the size, the hex, the mode and the kind of file are checked. */
static void test_secret_file_checks(void** state) {
  (void)state;
  uint8_t bytes[80];
  for (int i = 0; i < 80; i++) bytes[i] = (uint8_t)('0' + i % 10);
  char path[512];
  struct {
    const char* name;
    size_t len;
    mode_t mode;
    const char* says;
  } cases[] = {
      {"open.bin", 32, 0644, "chmod 600"}, /* world-readable */
      {"group.bin", 32, 0640, "group or others"},
      {"gw.bin", 32, 0620, "group or others"}, /* group-writable: swapped under us */
      {"short.bin", 31, 0600, "holds 31 bytes"},
      {"long.bin", 33, 0600, "holds 33 bytes"},
      {"hex63.bin", 63, 0600, "holds 63 bytes"},
      {"huge.bin", 80, 0600, "at least"},
      {"empty.bin", 0, 0600, "holds 0 bytes"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    env_clear();
    write_file(cases[i].name, bytes, cases[i].len, cases[i].mode, path, sizeof path);
    setenv("NEBULA_JOB_SECRET_FILE", path, 1);
    nb_session_options_t o;
    assert_int_equal(nb_session_options_from_env(&o), NB_ERR_CONFIG);
    print_message("%s: %s\n", cases[i].name, nb_error_last());
    assert_non_null(strstr(nb_error_last(), "NEBULA_JOB_SECRET_FILE"));
    assert_non_null(strstr(nb_error_last(), cases[i].says));
    assert_null(o.job_secret);
  }
  /* 64 characters that are not all hex digits */
  char hex[64];
  memset(hex, 'a', sizeof hex);
  hex[17] = 'g';
  write_file("nothex.bin", hex, 64, 0600, path, sizeof path);
  setenv("NEBULA_JOB_SECRET_FILE", path, 1);
  nb_session_options_t o;
  assert_int_equal(nb_session_options_from_env(&o), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "hex"));
  /* 64 hex digits without a newline are fine, with two newlines are not */
  hex[17] = 'b';
  write_file("hex.bin", hex, 64, 0600, path, sizeof path);
  setenv("NEBULA_JOB_SECRET_FILE", path, 1);
  assert_int_equal(nb_session_options_from_env(&o), NB_OK);
  assert_int_equal(o.job_secret[8], 0xab);
  nb_session_options_free(&o);
  char hex2[66];
  memcpy(hex2, hex, 64);
  hex2[64] = hex2[65] = '\n';
  write_file("hex2.bin", hex2, 66, 0600, path, sizeof path);
  setenv("NEBULA_JOB_SECRET_FILE", path, 1);
  assert_int_equal(nb_session_options_from_env(&o), NB_ERR_CONFIG);
  /* a folder is not a secret file */
  setenv("NEBULA_JOB_SECRET_FILE", dir, 1);
  assert_int_equal(nb_session_options_from_env(&o), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "regular file"));
}

/* nb_session_options_from_descriptor: the job's settings from a descriptor, the deployment's
 * left to the caller, the environment ignored; a cluster that is not in it, a bad descriptor and
 * a missing file refused. */
static void test_from_descriptor(void** state) {
  (void)state;
  env_clear();
  setenv("NEBULA_DENSITY", "0.9", 1); /* the environment is not read here */
  const char* doc =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"desc-job\"},\n \"spec\": {\"clusters\": [{\"id\": \"dc-a\"}, {\"id\": \"dc-b\"}],\n"
      "  \"program\": {\"command\": [\"/bin/true\"]},\n"
      "  \"sync\": {\"innerSteps\": 8, \"peerTimeoutSeconds\": 3, \"outer\": {\"lr\": 0.5, "
      "\"momentum\": 0.25}, \"eager\": false},\n"
      "  \"compression\": {\"density\": {\"initial\": 0.05, \"min\": 0.01, \"max\": 0.2}, "
      "\"values\": \"auto\", \"topkChunk\": 1024, \"errorFeedback\": false, "
      "\"errorFeedbackDecay\": 0.9, "
      "\"adaptive\": true},\n"
      "  \"link\": {\"rateMbit\": 40}}}\n";
  char path[512];
  write_file("job.json", doc, strlen(doc), 0644, path, sizeof path);
  nb_session_options_t o;
  assert_int_equal(nb_session_options_from_descriptor(&o, path, "dc-b"), NB_OK);
  assert_string_equal(o.job_id, "desc-job");
  assert_string_equal(o.cluster_id, "dc-b");
  assert_int_equal(o.cluster_index, 1);
  assert_int_equal(o.n_clusters, 2);
  assert_int_equal(o.inner_steps, 8);
  assert_true(o.outer_lr == 0.5f && o.outer_momentum == 0.25f);
  assert_true(o.density == 0.05);
  assert_string_equal(o.values, "auto");
  assert_true(o.error_feedback_decay == 0.9);
  assert_int_equal(o.error_feedback, 0);
  assert_true(o.peer_timeout_s == 3);
  assert_int_equal(o.eager, 0); /* sync.eager */
  assert_int_equal(o.topk_chunk, 1024);
  assert_int_equal(o.adaptive, 1);
  assert_true(o.density_min == 0.01 && o.density_max == 0.2 && o.rate_mbit == 40);
  /* the deployment's fields stay the defaults: the caller gives them */
  assert_string_equal(o.listen, "127.0.0.1:0");
  assert_null(o.pki_dir);
  assert_null(o.job_secret);
  assert_int_equal(o.n_peers, 0);
  assert_non_null(o.env_storage);
  nb_session_options_free(&o);
  assert_null(o.job_id);

  /* one cluster of it, the caller's deployment: a session opens */
  const char* one =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"solo-job\"}, \"spec\": {\"clusters\": [{\"id\": \"solo\"}], \"program\": {\"command\": "
      "[\"/bin/true\"]}}}";
  write_file("one.json", one, strlen(one), 0644, path, sizeof path);
  assert_int_equal(nb_session_options_from_descriptor(&o, path, "solo"), NB_OK);
  o.insecure = 1;
  o.unsealed = 1;
  nb_session_t* s = NULL;
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  nb_session_options_free(&o);
  nb_session_close(s);

  /* refusals */
  assert_int_equal(nb_session_options_from_descriptor(&o, path, "dc-z"), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "cluster 'dc-z' is not in $.spec.clusters (solo)"));
  assert_null(o.env_storage);
  const char* bad =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"b\"}, \"spec\": {\"clusters\": [{\"id\": \"a\"}], \"program\": {\"command\": "
      "[\"/bin/true\"]}, \"sync\": {\"innerStep\": 3}}}";
  write_file("bad.json", bad, strlen(bad), 0644, path, sizeof path);
  assert_int_equal(nb_session_options_from_descriptor(&o, path, "a"), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "$.spec.sync.innerStep"));
  snprintf(path, sizeof path, "%s/none.json", dir);
  assert_int_not_equal(nb_session_options_from_descriptor(&o, path, "a"), NB_OK);
  assert_int_equal(nb_session_options_from_descriptor(NULL, path, "a"), NB_ERR_INVALID);
  unsetenv("NEBULA_DENSITY");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reads_every_variable), cmocka_unit_test(test_defaults_and_open),
      cmocka_unit_test(test_each_bad_variable),    cmocka_unit_test(test_secret_file_checks),
      cmocka_unit_test(test_from_descriptor),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
