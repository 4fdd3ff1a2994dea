/* A job's program shipped as artifacts (spec.program.files): two in-process gateways over mutual
 * TLS on loopback, alice puts a shell script into her gateway's store (Artifacts.Put) and a
 * job runs it with `sh train.sh` on both clusters. Also: bob can neither put into alice's
 * namespace nor have her file nor see it listed, an upload over artifacts.max_put_bytes is refused,
 * a missing artifact fails the job naming it, and bad `files` entries are refused naming the field.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "gateway/artifact.h"
#include "gateway/gateway.h"
#include "gateway/store.h"
#include "inter/rpc.h"
#include "jobs/descriptor.h"
#include "nebula/v1/artifact.pb-c.h"
#include "security/tls.h"
#include "tests/lib/gw_testlib.h"

static char g_dir[256];
static int g_port[2];
static nb_gateway_config_t g_cfg[2];
static nb_gateway_t* g_gw[2];
static const char* g_ids[2] = {"dc-a", "dc-b"};

#define MAX_PUT 4096 /* dc-a's artifacts.max_put_bytes */

static const char g_script[] =
    "echo \"trained on $NEBULA_CLUSTER_ID of $NEBULA_N_CLUSTERS\"\n"
    "cat conf/lr.txt\n";
static const char g_conf[] = "lr 0.25\n";

static void make_config(int i) {
  char cfg[4096];
  snprintf(cfg, sizeof cfg,
           "{\"cluster_id\": \"%s\", \"listen\": \"127.0.0.1:%d\",\n"
           " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"%s.crt\", \"key\": \"%s.key\"},\n"
           " \"peers\": {\"%s\": \"127.0.0.1:%d\"}, \"launcher\": \"local\",\n"
           " \"resources\": {\"slots\": 4}, \"work_dir\": \"work-%s\",\n"
           " \"acl\": [{\"user\": \"alice\"}, {\"user\": \"bob\"}],\n"
           " \"artifacts\": {\"max_put_bytes\": %d},\n"
           " \"federation_timeout_ms\": 5000, \"cancel_grace_ms\": 2000, \"poll_ms\": 20}",
           g_ids[i], g_port[i], g_ids[i], g_ids[i], g_ids[1 - i], g_port[1 - i], g_ids[i], MAX_PUT);
  gwt_parse_config(g_dir, cfg, &g_cfg[i]);
}

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_progfiles");
  const char* users[] = {"alice", "bob", "carol"}; /* carol: not in the ACL */
  gwt_make_pki(g_dir, g_ids, 2, users, 3, NULL, NULL);
  gwt_start_pair(g_port, g_cfg, g_gw, make_config);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  gwt_stop_pair(g_gw);
  gwt_reap();
  if (!getenv("NB_TEST_KEEP")) gwt_remove_dir(g_dir);
  return 0;
}

static void write_file(const char* name, const char* text, size_t len, char* path, size_t cap) {
  snprintf(path, cap, "%s/%s", g_dir, name);
  FILE* f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

/* user puts the file `local` (in g_dir) as `name` into gateway 0's store. */
static nb_status_t put(const char* user, const char* local, const char* name,
                       nb_artifact_info_t* info) {
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, user, g_port[0], &tls);
  nb_rpc_client_destroy(cli);
  char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, local);
  nb_artifact_upload_opts_t o = {
      .target = NULL, .tls = tls, .file = path, .name = name, .timeout_ms = 30000};
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", g_port[0]);
  o.target = target;
  nb_status_t st = nb_artifact_upload(&o, info);
  nb_tls_destroy(tls);
  return st;
}

static void put_script(nb_artifact_info_t* sh, nb_artifact_info_t* conf) {
  char p[512];
  write_file("train.sh", g_script, strlen(g_script), p, sizeof p);
  write_file("lr.txt", g_conf, strlen(g_conf), p, sizeof p);
  assert_int_equal(put("alice", "train.sh", "train.sh", sh), NB_OK);
  assert_string_equal(sh->name, "alice/train.sh");
  assert_int_equal(sh->size, strlen(g_script));
  assert_int_equal(put("alice", "lr.txt", "alice/conf/lr.txt", conf), NB_OK);
  assert_string_equal(conf->name, "alice/conf/lr.txt");
}

/* A job of `user` running `sh train.sh` in workDir "run" with the given files entries. */
static void job_doc(char* buf, size_t cap, const char* name, int both, const char* files) {
  snprintf(buf, cap,
           "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
           "\"%s\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\"}%s],"
           " \"program\": {\"command\": [\"sh\", \"train.sh\"], \"workDir\": \"run\","
           " \"files\": [%s]},"
           " \"sync\": {\"innerSteps\": 8}}}",
           name, both ? ", {\"id\": \"dc-b\"}" : "", files);
}

static nb_status_t submit(const char* user, const char* doc, char* id, size_t cap) {
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, user, g_port[0], &tls);
  nb_status_t st = gwt_submit_id(cli, g_dir, user, doc, 0, 30000, id, cap);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  return st;
}

static const char* job_file(int i, const char* id, const char* name) {
  static char buf[1 << 16];
  char p[1400];
  snprintf(p, sizeof p, "%s/%s/%s", g_cfg[i].work_dir, id, name);
  buf[0] = 0;
  FILE* f = fopen(p, "r");
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* The script put by alice at dc-a runs on both clusters of a job: dc-b fetches it from dc-a
 * (by name, and the config file by hash), both run it in their workDir with its mode set. */
static void test_shipped_two_clusters(void** state) {
  (void)state;
  nb_artifact_info_t sh, conf;
  put_script(&sh, &conf);
  char files[512], doc[4096], id[128];
  snprintf(files, sizeof files,
           "{\"artifact\": \"train.sh\", \"path\": \"train.sh\", \"mode\": \"0750\"},"
           " {\"artifact\": \"sha256:%s\", \"path\": \"conf/lr.txt\", \"cluster\": \"dc-a\"}",
           conf.sha256);
  job_doc(doc, sizeof doc, "ship-two", 1, files);
  assert_int_equal(submit("alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  gwt_wait_state(&g_cfg[1], id, NB_JOB_SUCCEEDED, 10);
  for (int i = 0; i < 2; i++) {
    char want[64];
    snprintf(want, sizeof want, "trained on %s of 2\nlr 0.25\n", g_ids[i]);
    assert_string_equal(job_file(i, id, "stdout.log"), want);
    assert_string_equal(job_file(i, id, "run/train.sh"), g_script);
    char p[1400];
    snprintf(p, sizeof p, "%s/%s/run/train.sh", g_cfg[i].work_dir, id);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0750);
    snprintf(p, sizeof p, "%s/%s/run/conf/lr.txt", g_cfg[i].work_dir, id);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0644);
    assert_int_equal(gwt_count_events(&g_cfg[i], id, "fetch", "\"from\":\"dc-a\""), 2);
    assert_int_equal(gwt_count_events(&g_cfg[i], id, "fetch", sh.sha256), 1);
  }
}

/* Namespaces: bob cannot put into alice's, and neither a job of bob at dc-a (from the store)
 * nor one on both clusters (dc-b fetching from dc-a) gets her file; his own name is his. */
static void test_other_user(void** state) {
  (void)state;
  nb_artifact_info_t sh, conf, info;
  put_script(&sh, &conf);
  assert_int_equal(put("bob", "train.sh", "alice/train.sh", &info), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "user 'bob' may not put artifact 'alice/train.sh'"));
  char doc[4096], id[128], why[1024];
  job_doc(doc, sizeof doc, "bob-local", 0,
          "{\"artifact\": \"alice/train.sh\", \"path\": \"train.sh\"}");
  assert_int_equal(submit("bob", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_FAILED, 30);
  gwt_job_state(&g_cfg[0], id, why, sizeof why);
  assert_non_null(strstr(why, "$.spec.program.files[0]: artifact 'alice/train.sh'"));
  assert_non_null(strstr(why, "no artifact 'alice/train.sh' in the namespace of user 'bob'"));
  assert_string_equal(job_file(0, id, "run/train.sh"), "");
  char files0[256];
  snprintf(files0, sizeof files0, "{\"artifact\": \"sha256:%s\", \"path\": \"train.sh\"}",
           sh.sha256);
  job_doc(doc, sizeof doc, "bob-hash", 0, files0);
  assert_int_equal(submit("bob", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_FAILED, 30);
  gwt_job_state(&g_cfg[0], id, why, sizeof why);
  assert_non_null(strstr(why, "of user 'bob' in this store"));
  assert_string_equal(job_file(0, id, "run/train.sh"), "");
  /* by hash: the same answer as for a hash nobody holds */
  char files[256];
  snprintf(files, sizeof files, "{\"artifact\": \"sha256:%s\", \"path\": \"train.sh\"}", sh.sha256);
  job_doc(doc, sizeof doc, "bob-two", 1, files);
  assert_int_not_equal(submit("bob", doc, id, sizeof id), NB_OK);
  assert_non_null(strstr(nb_error_last(), "cluster 'dc-b' could not start the job"));
  assert_non_null(strstr(nb_error_last(), "$.spec.program.files[0]"));
  assert_non_null(strstr(nb_error_last(), "that job"));
  /* bob's own put of the same bytes is in his namespace and runs */
  assert_int_equal(put("bob", "train.sh", "train.sh", &info), NB_OK);
  assert_string_equal(info.name, "bob/train.sh");
  assert_string_equal(info.sha256, sh.sha256);
  /* List: each user sees its own namespace only */
  const char* users[2] = {"alice", "bob"};
  for (int u = 0; u < 2; u++) {
    nb_tls_t* tls = NULL;
    nb_rpc_client_destroy(gwt_client(g_dir, users[u], g_port[0], &tls));
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", g_port[0]);
    nb_artifact_upload_opts_t o = {.target = target, .tls = tls, .timeout_ms = 30000};
    nb_artifact_info_t* a = NULL;
    size_t n = 0;
    int more = 1;
    assert_int_equal(nb_artifact_list(&o, u == 0 ? "" : NULL, &a, &n, &more), NB_OK);
    assert_false(more);
    if (u == 0) {
      assert_int_equal(n, 2);
      assert_string_equal(a[0].name, "alice/conf/lr.txt");
      assert_string_equal(a[0].sha256, conf.sha256);
      assert_string_equal(a[1].name, "alice/train.sh");
      assert_int_equal(a[1].size, strlen(g_script));
      nb_free(a);
      assert_int_equal(nb_artifact_list(&o, "conf/", &a, &n, NULL), NB_OK);
      assert_int_equal(n, 1);
      assert_string_equal(a[0].name, "alice/conf/lr.txt");
    } else {
      assert_int_equal(n, 1);
      assert_string_equal(a[0].name, "bob/train.sh");
    }
    nb_free(a);
    nb_tls_destroy(tls);
  }
}

/* A file over dc-a's artifacts.max_put_bytes is refused and leaves nothing in the store. */
static void test_oversize(void** state) {
  (void)state;
  static char big[MAX_PUT + 1];
  memset(big, 'x', sizeof big);
  char p[512];
  write_file("big.bin", big, sizeof big, p, sizeof p);
  nb_artifact_info_t info;
  assert_int_equal(put("alice", "big.bin", "big.bin", &info), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "artifacts.max_put_bytes = 4096"));
  assert_non_null(strstr(nb_error_last(), "alice/big.bin"));
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s/artifacts/tmp", g_cfg[0].work_dir);
  /* nothing half-written: no temp file left, and the name is unknown to a job */
  char cmd[700];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", tmp);
  assert_int_equal(system(cmd), 0);
  char doc[4096], id[128], why[1024];
  job_doc(doc, sizeof doc, "big", 0, "{\"artifact\": \"big.bin\", \"path\": \"train.sh\"}");
  assert_int_equal(submit("alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_FAILED, 30);
  gwt_job_state(&g_cfg[0], id, why, sizeof why);
  assert_non_null(strstr(why, "artifact 'big.bin'"));
  /* one byte less is taken */
  write_file("big.bin", big, MAX_PUT, p, sizeof p);
  assert_int_equal(put("alice", "big.bin", "big.bin", &info), NB_OK);
  assert_int_equal(info.size, MAX_PUT);
}

/* One Put call by hand: first message (name, size, sha256, data), then `more` as a second. */
static nb_status_t raw_put(const char* name, uint64_t size, const char* sha256, const char* data,
                           const char* more) {
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = gwt_client(g_dir, "alice", g_port[0], &tls);
  nb_rpc_stream_t* s = NULL;
  nb_status_t st = nb_rpc_stream_open(cli, "/nebula.v1.Artifacts/Put", 30000, 0, &s);
  Nebula__V1__PutChunk m = NEBULA__V1__PUT_CHUNK__INIT;
  m.name = (char*)name;
  m.size = size;
  m.sha256 = (char*)sha256;
  m.data.data = (uint8_t*)data;
  m.data.len = strlen(data);
  if (st == NB_OK) st = nb_rpc_stream_send_pb(s, &m.base);
  if (st == NB_OK && more) {
    Nebula__V1__PutChunk m2 = NEBULA__V1__PUT_CHUNK__INIT;
    m2.data.data = (uint8_t*)more;
    m2.data.len = strlen(more);
    st = nb_rpc_stream_send_pb(s, &m2.base);
  }
  if (st == NB_OK) st = nb_rpc_stream_close_send(s);
  if (st == NB_OK) { /* the reply, or the end of a refused call */
    nb_rpc_msg_t r = {0};
    int end = 0;
    st = nb_rpc_stream_recv(s, &r, &end, NB_RPC_INFINITE);
    nb_rpc_msg_release(&r);
  }
  nb_status_t fs = s ? nb_rpc_stream_finish(s) : st;
  nb_rpc_stream_destroy(s);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  return fs != NB_OK ? fs : st;
}

/* What a Put is checked for: the caller's certificate and ACL, the announced hash and size. */
static void test_put_checks(void** state) {
  (void)state;
  char p[512];
  write_file("train.sh", g_script, strlen(g_script), p, sizeof p);
  nb_artifact_info_t info;
  assert_int_equal(put("carol", "train.sh", "train.sh", &info), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "user 'carol' is not in this gateway's ACL"));
  /* the hash of "ab" is not that of "abc": nothing stored */
  static const char h_abc[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  assert_int_equal(raw_put("x.txt", 2, h_abc, "a", "b"), NB_ERR_INTEGRITY);
  assert_non_null(strstr(nb_error_last(), "nothing stored"));
  assert_int_equal(raw_put("x.txt", 3, h_abc, "ab", NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "2 bytes arrived of the announced 3"));
  assert_int_equal(raw_put("x.txt", 2, h_abc, "ab", "c"), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "more bytes than the announced 2"));
  assert_int_equal(raw_put("../x.txt", 3, h_abc, "abc", NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "'../x.txt'"));
  assert_int_equal(raw_put("x.txt", 3, "12", "abc", NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "sha256"));
  /* in two pieces with the right hash it is stored */
  assert_int_equal(raw_put("x.txt", 3, h_abc, "a", "bc"), NB_OK);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "abc", 0, "{\"artifact\": \"x.txt\", \"path\": \"train.sh\"}");
  assert_int_equal(submit("alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_FAILED, 30); /* sh runs "abc": not a command */
  assert_string_equal(job_file(0, id, "run/train.sh"), "abc");
  char tmp[600], cmd[700];
  snprintf(tmp, sizeof tmp, "%s/artifacts/tmp", g_cfg[0].work_dir);
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", tmp);
  assert_int_equal(system(cmd), 0);
}

/* A shipped file with mode 0755 is the command itself ("./run.sh", inside the job's folder). */
static void test_run_directly(void** state) {
  (void)state;
  static const char prog[] = "#!/bin/sh\necho direct in $(basename \"$PWD\")\n";
  char p[512], doc[4096], id[128];
  write_file("run.sh", prog, strlen(prog), p, sizeof p);
  nb_artifact_info_t info;
  assert_int_equal(put("alice", "run.sh", "tools/run.sh", &info), NB_OK);
  job_doc(doc, sizeof doc, "direct", 0,
          "{\"artifact\": \"tools/run.sh\", \"path\": \"bin/run.sh\", \"mode\": \"0755\"}");
  char* cmd = strstr(doc, "[\"sh\", \"train.sh\"]");
  assert_non_null(cmd);
  char rest[4096];
  snprintf(rest, sizeof rest, "[\"./bin/run.sh\"]%s", cmd + strlen("[\"sh\", \"train.sh\"]"));
  snprintf(cmd, sizeof doc - (size_t)(cmd - doc), "%s", rest);
  assert_int_equal(submit("alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 30);
  assert_string_equal(job_file(0, id, "stdout.log"), "direct in run\n");
}

/* A job naming an artifact nobody put fails before launch, naming the file. */
static void test_missing(void** state) {
  (void)state;
  char doc[4096], id[128], why[1024];
  job_doc(doc, sizeof doc, "missing", 0, "{\"artifact\": \"nope.sh\", \"path\": \"train.sh\"}");
  assert_int_equal(submit("alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_FAILED, 30);
  gwt_job_state(&g_cfg[0], id, why, sizeof why);
  assert_non_null(strstr(why,
                         "launch failed: $.spec.program.files[0]: artifact 'nope.sh' from "
                         "cluster 'dc-a'"));
  assert_non_null(strstr(why, "no artifact 'nope.sh' in the namespace of user 'alice'"));
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "launch", NULL), 0);
}

/* Bad entries are refused by the parser (nebula validate, Submit) naming the field; a good one
 * round-trips through the normalized descriptor. */
static void test_validate(void** state) {
  (void)state;
  static const struct {
    const char* files;
    const char* path; /* what the error names */
    const char* says;
  } bad[] = {
      {"{\"artifact\": \"a\", \"path\": \"../x\"}", "$.spec.program.files[0].path", "\"..\""},
      {"{\"artifact\": \"a\", \"path\": \"/etc/x\"}", "$.spec.program.files[0].path", "relative"},
      {"{\"artifact\": \"a\", \"path\": \"a//b\"}", "$.spec.program.files[0].path", "empty"},
      {"{\"artifact\": \"a\", \"path\": \"x\"}, {\"artifact\": \"b\", \"path\": \"x\"}",
       "$.spec.program.files[1].path", "the same path as $.spec.program.files[0].path"},
      {"{\"artifact\": \"a\", \"path\": \"x\"}, {\"artifact\": \"b\", \"path\": \"x/y\"}",
       "$.spec.program.files[1].path", "inside"},
      {"{\"path\": \"x\"}", "$.spec.program.files[0].artifact", "nebula artifact put"},
      {"{\"artifact\": \"a\"}", "$.spec.program.files[0].path", "relative to workDir"},
      {"{\"artifact\": \"../a\", \"path\": \"x\"}", "$.spec.program.files[0].artifact", ".."},
      {"{\"artifact\": \"sha256:12\", \"path\": \"x\"}", "$.spec.program.files[0].artifact", "64"},
      {"{\"artifact\": \"a\", \"path\": \"x\", \"cluster\": \"dc-z\"}",
       "$.spec.program.files[0].cluster", "one of the job's clusters"},
      {"{\"artifact\": \"a\", \"path\": \"x\", \"mode\": \"4755\"}", "$.spec.program.files[0].mode",
       "octal"},
      {"{\"artifact\": \"a\", \"path\": \"x\", \"mode\": \"rwx\"}", "$.spec.program.files[0].mode",
       "octal"},
      {"{\"artifact\": \"a\", \"path\": \"x\", \"owner\": \"bob\"}",
       "$.spec.program.files[0].owner", "unknown field"},
      {"\"train.sh\"", "$.spec.program.files[0]", "object"},
  };
  char doc[4096];
  nb_job_config_t* cfg = calloc(1, sizeof *cfg);
  assert_non_null(cfg);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    job_doc(doc, sizeof doc, "bad", 0, bad[i].files);
    nb_status_t st = nb_descriptor_parse(doc, strlen(doc), cfg, NULL);
    if (st == NB_OK || !strstr(nb_error_last(), bad[i].path) ||
        !strstr(nb_error_last(), bad[i].says))
      fail_msg("case %zu (%s): %s", i, bad[i].files, st == NB_OK ? "accepted" : nb_error_last());
  }
  /* Submit answers the same, as INVALID_ARGUMENT */
  job_doc(doc, sizeof doc, "bad", 0, bad[0].files);
  assert_int_equal(submit("alice", doc, NULL, 0), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "$.spec.program.files[0].path"));
  /* round trip */
  job_doc(doc, sizeof doc, "good", 1,
          "{\"artifact\": \"train.sh\", \"path\": \"train.sh\", \"mode\": \"755\"},"
          " {\"artifact\": \"alice/conf/lr.txt\", \"path\": \"conf/lr.txt\", \"cluster\": "
          "\"dc-b\"}");
  assert_int_equal(nb_descriptor_parse(doc, strlen(doc), cfg, NULL), NB_OK);
  assert_int_equal(cfg->program.n_files, 2);
  assert_int_equal(cfg->program.files[0].mode, 0755);
  assert_string_equal(cfg->program.files[1].cluster, "dc-b");
  char *a = NULL, *b = NULL;
  assert_int_equal(nb_descriptor_to_json(cfg, &a), NB_OK);
  assert_non_null(strstr(a, "\"mode\": \"0755\""));
  assert_int_equal(nb_descriptor_parse(a, strlen(a), cfg, NULL), NB_OK);
  assert_int_equal(nb_descriptor_to_json(cfg, &b), NB_OK);
  assert_string_equal(a, b);
  free(a);
  free(b);
  free(cfg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_shipped_two_clusters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_user, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversize, setup, teardown),
      cmocka_unit_test_setup_teardown(test_put_checks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_run_directly, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_validate, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
