/* The gateway in process over mutual TLS on 127.0.0.1:0, with a PKI made by security/pki in a
 * temporary folder and jobs that are small real shell programs: submit → get → watch → logs,
 * refusals (plaintext, user outside the ACL, tampered signature, bad descriptor), cancel of a
 * whole process group, a failing job, and a restart that keeps jobs and fails a dead one. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pwd.h>
#include <sys/stat.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <openssl/x509v3.h>
#include <sqlite3.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "gateway/gateway.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/pki.h"
#include "security/tls.h"
#include "tests/lib/gw_testlib.h"

static char g_dir[256];
static nb_gateway_config_t g_cfg;

/* $1 is the job id: its name prefix picks the behaviour. */
static const char* g_script =
    "case \"$1\" in\n"
    "quick-*) echo \"hello from $1\"; i=1; while [ $i -le 3 ]; do\n"
    "  echo \"{\\\"round\\\":$i,\\\"step\\\":$((i*10)),\\\"max_steps\\\":30,\\\"loss\\\":$i.5,"
    "\\\"wan_mbps\\\":12.5,\\\"density\\\":0.01,\\\"eta_s\\\":1}\" >> \"$NB_JOB_PROGRESS\";\n"
    "  sleep 0.1; i=$((i+1)); done; echo done;;\n"
    "sleepy-*) echo '{\"step\":1}' >> \"$NB_JOB_PROGRESS\"; sleep 300 & echo $! > pids; sleep 300 "
    "& echo $! >> pids; echo $$ >> pids; wait;;\n"
    "fail-*) echo oops >&2; exit 3;;\n"
    "stray-*) sleep 300 & echo $! > pids; sleep 300 & echo $! >> pids; echo $$ >> pids;;\n"
    "slow-*) echo \"line 1\"; i=0; while [ ! -e release ] && [ $i -lt 1500 ]; do sleep 0.02; "
    "i=$((i+1)); done; echo \"line 2\";;\n"
    "late-*) sleep 1; printf 'round\\tloss\\tbytes_sent\\tdensity\\tcompute_s\\texchange_s\\t"
    "global_xxh3\\n0\\t2.5\\t0\\t0\\t0.1\\t0\\t-\\n' > rounds.tsv; echo '{\"job\": \"late\"}' > "
    "summary.json;;\n"
    "runas-*) id -u > uid.txt; echo '{\"step\":1}' >> \"$NB_JOB_PROGRESS\"; "
    "ln -s /etc/shadow final.safetensors; ln -s \"$NB_TEST_SECRET\" summary.json; "
    "ln -s \"$NB_TEST_SECRET\" exit_code.tmp; printf 'round\\tloss\\n0\\t1\\n' > rounds.tsv; "
    "touch ../escaped 2>/dev/null && echo yes > escaped.txt; true;;\n"
    "report-*) printf 'round\\tloss\\tbytes_sent\\tdensity\\tcompute_s\\texchange_s\\t"
    "global_xxh3\\n0\\t2.5\\t0\\t0\\t0.1\\t0\\t-\\n1\\t2.0\\t0\\t0\\t0.1\\t0\\t-\\n' > "
    "rounds.tsv; echo '{\"job\": \"report\", \"cluster\": \"dc-a\", \"final_train_loss\": "
    "2.0, \"global_xxh3\": \"00ff\"}' > summary.json;;\n"
    "esac\n";

static void path_of(char* buf, size_t n, const char* rel) {
  snprintf(buf, n, "%s/%s", g_dir, rel);
}

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_gw");
  const char* clusters[] = {"dc-a"};
  const char* users[] = {"alice", "bob", "mallory"};
  EVP_PKEY *ca_key, *k;
  X509 *ca, *c;
  gwt_make_pki(g_dir, clusters, 1, users, 3, &ca_key, &ca);
  /* "cn-alice": the CA signs a certificate with CN=alice and no subjectAltName at all (a user
   * certificate with its identity URI taken out, then signed again) */
  nb_pki_issue_opts_t cu = {.kind = NB_PKI_USER, .name = "alice"};
  assert_int_equal(nb_pki_cert_issue(ca_key, ca, &cu, &k, &c), NB_OK);
  int san = X509_get_ext_by_NID(c, NID_subject_alt_name, -1);
  assert_true(san >= 0);
  X509_EXTENSION_free(X509_delete_ext(c, san));
  assert_true(X509_get_ext_by_NID(c, NID_subject_alt_name, -1) < 0);
  assert_true(X509_sign(c, ca_key, EVP_sha256()) > 0);
  gwt_write_pair(g_dir, k, c, "cn-alice");
  EVP_PKEY_free(ca_key);
  X509_free(ca);

  char cfg[4096], p[512];
  snprintf(
      cfg, sizeof cfg,
      "{\"cluster_id\": \"dc-a\", \"listen\": \"127.0.0.1:0\",\n"
      " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"dc-a.crt\", \"key\": \"dc-a.key\"},\n"
      " \"peers\": {\"dc-b\": \"127.0.0.1:7999\"}, \"launcher\": \"local\",\n"
      " \"command\": [\"/bin/sh\", \"-c\", \"eval \\\"$NB_TEST_SCRIPT\\\"\", \"job\", \"{job}\"],\n"
      " \"resources\": {\"slots\": 8, \"device\": \"cpu\"}, \"work_dir\": \"work\",\n"
      " \"acl\": [{\"user\": \"alice\", \"clusters\": [\"dc-a\"], \"max_workers\": 2},\n"
      "         {\"user\": \"bob\", \"clusters\": [\"dc-b\"]},\n"
      "         {\"user\": \"alice\", \"clusters\": [\"dc-a\", \"dc-b\"], \"max_workers\": 1}],\n"
      " \"paths\": {\"allow\": [\"data\"]},\n"
      " \"cancel_grace_ms\": 500, \"poll_ms\": 20}");
  snprintf(p, sizeof p, "%s/data", g_dir);
  assert_int_equal(mkdir(p, 0755), 0);
  gwt_parse_config(g_dir, cfg, &g_cfg);
  setenv("NB_TEST_SCRIPT", g_script, 1);
  assert_string_equal(g_cfg.command[2], "eval \"$NB_TEST_SCRIPT\"");
  return 0;
}

static int teardown(void** state) {
  (void)state;
  gwt_reap();
  gwt_remove_dir(g_dir);
  return 0;
}

static nb_rpc_client_t* client_as(const char* user, nb_tls_t** tls_out, int port) {
  return gwt_client(g_dir, user, port, tls_out);
}

static const char* doc_fmt =
    "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": \"%s\"},"
    " \"spec\": {\"clusters\": [{\"id\": \"%s\", \"workers\": %d, \"data\": {\"languages\": "
    "[\"en\"]}}]}}";

/* Submits `doc` signed by `signer` (tamper: flip a byte after signing). */
static nb_status_t submit(nb_rpc_client_t* cli, const char* signer, const char* doc, int tamper,
                          Nebula__V1__Job** out) {
  return gwt_submit(cli, g_dir, signer, doc, tamper, 10000, out);
}

static Nebula__V1__Job* get_job(nb_rpc_client_t* cli, const char* id) {
  Nebula__V1__GetRequest req = NEBULA__V1__GET_REQUEST__INIT;
  req.job_id = (char*)id;
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Get", &req.base,
                                   &nebula__v1__job__descriptor, &rep, 10000, 0),
                   NB_OK);
  return (Nebula__V1__Job*)rep;
}

static void wait_state(nb_rpc_client_t* cli, const char* id, const char* state) {
  for (int i = 0; i < 500; i++) {
    Nebula__V1__Job* j = get_job(cli, id);
    int done = !strcmp(j->state, state);
    protobuf_c_message_free_unpacked(&j->base, NULL);
    if (done) return;
    nb_sleep_ns(20000000);
  }
  fail_msg("job %s never reached %s", id, state);
}

/* Watches a job that is final (or becomes so) from after_seq on; returns the number of
 * progress events, *total (optional) the number of all events. */
static int watch_count(nb_rpc_client_t* cli, const char* id, int64_t after_seq, int* total) {
  Nebula__V1__WatchRequest wr = NEBULA__V1__WATCH_REQUEST__INIT;
  wr.job_id = (char*)id;
  wr.after_seq = after_seq;
  int all = 0;
  uint8_t buf[256];
  size_t len = nebula__v1__watch_request__pack(&wr, buf);
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Watch", 20000, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, len), NB_OK);
  int n = 0, end = 0;
  for (;;) {
    ProtobufCMessage* m = NULL;
    assert_int_equal(
        nb_rpc_stream_recv_pb(s, &nebula__v1__job_event__descriptor, &m, &end, NB_RPC_INFINITE),
        NB_OK);
    if (end) break;
    n += !strcmp(((Nebula__V1__JobEvent*)m)->kind, "progress");
    all++;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  nb_rpc_stream_destroy(s);
  if (total) *total = all;
  return n;
}

static int count_progress(nb_rpc_client_t* cli, const char* id) {
  return watch_count(cli, id, 0, NULL);
}

static void test_submit_watch_logs(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  char doc[1024];
  snprintf(doc, sizeof doc, doc_fmt, "quick", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  assert_string_equal(job->owner, "alice");
  assert_string_equal(job->name, "quick");
  assert_string_equal(job->cluster, "dc-a");
  assert_true(!strcmp(job->state, "running") || !strcmp(job->state, "succeeded"));
  assert_string_equal(job->descriptor, doc);
  char id[64];
  snprintf(id, sizeof id, "%s", job->id);
  assert_true(!strncmp(id, "quick-", 6));
  protobuf_c_message_free_unpacked(&job->base, NULL);

  /* Watch to completion */
  Nebula__V1__WatchRequest wr = NEBULA__V1__WATCH_REQUEST__INIT;
  wr.job_id = id;
  uint8_t buf[256];
  size_t len = nebula__v1__watch_request__pack(&wr, buf);
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Watch", 20000, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, len), NB_OK);
  assert_int_equal(nb_rpc_stream_close_send(s), NB_OK);
  int progress = 0, end = 0;
  int64_t last_seq = 0, max_step = 0;
  char last_state[32] = "";
  double last_loss = 0;
  for (;;) {
    ProtobufCMessage* m = NULL;
    assert_int_equal(
        nb_rpc_stream_recv_pb(s, &nebula__v1__job_event__descriptor, &m, &end, NB_RPC_INFINITE),
        NB_OK);
    if (end) break;
    Nebula__V1__JobEvent* e = (Nebula__V1__JobEvent*)m;
    assert_true(e->seq > last_seq);
    last_seq = e->seq;
    if (!strcmp(e->kind, "progress")) {
      progress++;
      max_step = e->step > max_step ? e->step : max_step;
      last_loss = e->loss;
      assert_true(e->wan_mbps > 12 && e->wan_mbps < 13);
    }
    if (!strcmp(e->kind, "state")) snprintf(last_state, sizeof last_state, "%s", e->state);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);
  assert_int_equal(progress, 3);
  assert_int_equal(max_step, 30);
  assert_true(last_loss > 3.4 && last_loss < 3.6);
  assert_string_equal(last_state, "succeeded");
  /* resuming after a sequence number gives only what follows */
  int total = 0;
  assert_int_equal(watch_count(cli, id, last_seq - 1, &total), 0);
  assert_int_equal(total, 1);
  assert_int_equal(watch_count(cli, id, 0, &total), 3);
  assert_int_equal(total, (int)last_seq);

  job = get_job(cli, id);
  assert_string_equal(job->state, "succeeded");
  assert_int_equal(job->exit_code, 0);
  protobuf_c_message_free_unpacked(&job->base, NULL);

  /* Logs */
  Nebula__V1__LogsRequest lr = NEBULA__V1__LOGS_REQUEST__INIT;
  lr.job_id = id;
  len = nebula__v1__logs_request__pack(&lr, buf);
  assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Logs", 10000, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, len), NB_OK);
  char text[4096] = "";
  for (;;) {
    ProtobufCMessage* m = NULL;
    assert_int_equal(
        nb_rpc_stream_recv_pb(s, &nebula__v1__log_chunk__descriptor, &m, &end, NB_RPC_INFINITE),
        NB_OK);
    if (end) break;
    Nebula__V1__LogChunk* c = (Nebula__V1__LogChunk*)m;
    strncat(text, (const char*)c->data.data, c->data.len < 2000 ? c->data.len : 2000);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  nb_rpc_stream_destroy(s);
  char want[128];
  snprintf(want, sizeof want, "hello from %s\ndone\n", id);
  assert_string_equal(text, want);
  /* from an offset */
  lr.offset = 6;
  len = nebula__v1__logs_request__pack(&lr, buf);
  assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Logs", 10000, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, len), NB_OK);
  ProtobufCMessage* lm = NULL;
  assert_int_equal(
      nb_rpc_stream_recv_pb(s, &nebula__v1__log_chunk__descriptor, &lm, &end, NB_RPC_INFINITE),
      NB_OK);
  assert_int_equal(((Nebula__V1__LogChunk*)lm)->offset, 6);
  assert_memory_equal(((Nebula__V1__LogChunk*)lm)->data.data, want + 6, strlen(want) - 6);
  protobuf_c_message_free_unpacked(lm, NULL);
  nb_rpc_stream_destroy(s);
  /* a negative offset is refused (it used to read the whole log, as from 0) */
  lr.offset = -1;
  len = nebula__v1__logs_request__pack(&lr, buf);
  assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Logs", 10000, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, len), NB_OK);
  lm = NULL;
  assert_int_equal(
      nb_rpc_stream_recv_pb(s, &nebula__v1__log_chunk__descriptor, &lm, &end, NB_RPC_INFINITE),
      NB_ERR_INVALID);
  assert_null(lm);
  assert_non_null(strstr(nb_error_last(), "offset -1 is negative"));
  nb_rpc_stream_destroy(s);

  /* List: alice sees her job */
  Nebula__V1__ListRequest lq = NEBULA__V1__LIST_REQUEST__INIT;
  lq.state = (char*)"succeeded";
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/List", &lq.base,
                                   &nebula__v1__list_reply__descriptor, &rep, 10000, 0),
                   NB_OK);
  Nebula__V1__ListReply* lrep = (Nebula__V1__ListReply*)rep;
  assert_true(lrep->n_jobs >= 1);
  int found = 0;
  for (size_t i = 0; i < lrep->n_jobs; i++) found |= !strcmp(lrep->jobs[i]->id, id);
  assert_true(found);
  protobuf_c_message_free_unpacked(rep, NULL);

  /* A bad state name in List */
  lq.state = (char*)"done";
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/List", &lq.base,
                                   &nebula__v1__list_reply__descriptor, &rep, 10000, 0),
                   NB_ERR_INVALID);
  /* Another user cannot read alice's job */
  nb_tls_t* tls_b = NULL;
  nb_rpc_client_t* cli_b = client_as("bob", &tls_b, nb_gateway_port(gw));
  Nebula__V1__GetRequest gq = NEBULA__V1__GET_REQUEST__INIT;
  gq.job_id = id;
  assert_int_equal(nb_rpc_unary_pb(cli_b, "/nebula.v1.Gateway/Get", &gq.base,
                                   &nebula__v1__job__descriptor, &rep, 10000, 0),
                   NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "belongs to user 'alice'"));
  gq.job_id = (char*)"nope-1";
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Get", &gq.base,
                                   &nebula__v1__job__descriptor, &rep, 10000, 0),
                   NB_ERR_NOT_FOUND);
  nb_rpc_client_destroy(cli_b);
  nb_tls_destroy(tls_b);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

/* Watches a final job to the end of the stream; returns the payload of its last event of
 * `kind` (malloc'd, NULL when none). */
static char* watch_find(nb_rpc_client_t* cli, const char* id, const char* kind) {
  Nebula__V1__WatchRequest wr = NEBULA__V1__WATCH_REQUEST__INIT;
  wr.job_id = (char*)id;
  uint8_t buf[256];
  size_t len = nebula__v1__watch_request__pack(&wr, buf);
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Watch", 30000, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, len), NB_OK);
  char* found = NULL;
  int end = 0;
  for (;;) {
    ProtobufCMessage* m = NULL;
    assert_int_equal(
        nb_rpc_stream_recv_pb(s, &nebula__v1__job_event__descriptor, &m, &end, NB_RPC_INFINITE),
        NB_OK);
    if (end) break;
    Nebula__V1__JobEvent* e = (Nebula__V1__JobEvent*)m;
    if (!strcmp(e->kind, kind)) {
      free(found);
      found = strdup(e->payload_json);
    }
    protobuf_c_message_free_unpacked(m, NULL);
  }
  nb_rpc_stream_destroy(s);
  return found;
}

/* A succeeded job of this cluster only gets its run report (report/summary.json and
 * report/report.html from the job folder's rounds.tsv and summary.json), announced by a
 * "report" event that Watch delivers before the stream ends, and Get names it; a job that
 * leaves no rounds.tsv still succeeds, with a "report_failed" event and no report in Get; a job
 * that finishes while the gateway is down gets its report when the gateway is back. */
static void test_report(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  char doc[1024], id[64], want[1200], p[1200];
  snprintf(doc, sizeof doc, doc_fmt, "report", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  wait_state(cli, id, "succeeded");
  char* ev = watch_find(cli, id, "report");
  assert_non_null(ev);
  snprintf(want, sizeof want, "%s/%s/report/report.html", g_cfg.work_dir, id);
  json_t* j = json_loads(ev, 0, NULL);
  free(ev);
  assert_string_equal(json_string_value(json_object_get(j, "path")), want);
  json_decref(j);
  job = get_job(cli, id);
  assert_string_equal(job->state, "succeeded");
  assert_string_equal(job->report, want);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  assert_int_equal(access(want, R_OK), 0);
  snprintf(p, sizeof p, "%s/%s/report/summary.json", g_cfg.work_dir, id);
  json_t* sum = json_load_file(p, 0, NULL);
  assert_non_null(sum);
  json_t* cl = json_object_get(sum, "clusters");
  assert_int_equal(json_array_size(cl), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 0), "cluster")), "dc-a");
  assert_int_equal(json_integer_value(json_object_get(json_array_get(cl, 0), "rounds")), 2);
  assert_true(json_is_true(json_object_get(sum, "theta_global_identical")));
  json_decref(sum);

  /* no rounds.tsv: still succeeded, the failure is an event */
  snprintf(doc, sizeof doc, doc_fmt, "quick", "dc-a", 1);
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  wait_state(cli, id, "succeeded");
  ev = watch_find(cli, id, "report_failed");
  assert_non_null(ev);
  assert_non_null(strstr(ev, "rounds.tsv"));
  free(ev);
  job = get_job(cli, id);
  assert_string_equal(job->state, "succeeded");
  assert_string_equal(job->report, "");
  protobuf_c_message_free_unpacked(&job->base, NULL);

  /* a job that finishes while the gateway is down gets its report once it is back */
  snprintf(doc, sizeof doc, doc_fmt, "late", "dc-a", 1);
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
  snprintf(p, sizeof p, "%s/%s/exit_code", g_cfg.work_dir, id);
  for (int k = 0; k < 250 && access(p, R_OK) != 0; k++) nb_sleep_ns(20000000);
  assert_int_equal(access(p, R_OK), 0);
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  cli = client_as("alice", &tls, nb_gateway_port(gw));
  wait_state(cli, id, "succeeded");
  ev = watch_find(cli, id, "report");
  assert_non_null(ev);
  free(ev);
  job = get_job(cli, id);
  snprintf(want, sizeof want, "%s/%s/report/report.html", g_cfg.work_dir, id);
  assert_string_equal(job->report, want);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

/* The gateway's lifecycle lines (NB_DEBUG=INFO, subsystem JOB, text) into g_dir/<name>: set
 * before the gateway starts, read back after it is destroyed (log_end; the caller frees). */
static void log_begin(const char* name) {
  char p[512];
  path_of(p, sizeof p, name);
  setenv("NB_DEBUG", "INFO", 1);
  setenv("NB_DEBUG_SUBSYS", "JOB", 1);
  setenv("NB_DEBUG_FILE", p, 1);
  nb_log_reload();
}

static char* log_end(const char* name) {
  unsetenv("NB_DEBUG");
  unsetenv("NB_DEBUG_SUBSYS");
  unsetenv("NB_DEBUG_FILE");
  nb_log_reload();
  char p[512];
  path_of(p, sizeof p, name);
  FILE* f = fopen(p, "rb");
  assert_non_null(f);
  char* b = calloc(1, 1 << 20);
  assert_non_null(b);
  size_t n = fread(b, 1, (1 << 20) - 1, f);
  fclose(f);
  b[n] = 0;
  return b;
}

/* Fails unless one line of log holds a, then b (NULL: only a) after it. */
static void assert_log_line(const char* log, const char* a, const char* b) {
  for (const char* at = log; (at = strstr(at, a)); at++) {
    const char* eol = strchr(at, '\n');
    const char* hit = b ? strstr(at + strlen(a), b) : at;
    if (hit && (!eol || hit < eol)) return;
  }
  fail_msg("no log line with '%s' ... '%s' in:\n%s", a, b ? b : "", log);
}

static void test_refusals(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  log_begin("refusals.log");
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  int port = nb_gateway_port(gw);
  char doc[1024];
  snprintf(doc, sizeof doc, doc_fmt, "quick", "dc-a", 1);

  /* plaintext client: the TLS server refuses the connection */
  nb_rpc_client_opts_t po = {0};
  po.allow_insecure = 1;
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  nb_rpc_client_t* plain = NULL;
  assert_int_equal(nb_rpc_client_create(target, &po, &plain), NB_OK);
  Nebula__V1__ListRequest lq = NEBULA__V1__LIST_REQUEST__INIT;
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(plain, "/nebula.v1.Gateway/List", &lq.base,
                                   &nebula__v1__list_reply__descriptor, &rep, 5000, 0),
                   NB_ERR_UNAVAILABLE);
  nb_rpc_client_destroy(plain);

  /* a user outside the ACL */
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("mallory", &tls, port);
  assert_int_equal(submit(cli, "mallory", doc, 0, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "user 'mallory' is not in this gateway's ACL"));
  fprintf(stderr, "refusal: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(), "PERMISSION_DENIED"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);

  /* bob is in the ACL, but not for dc-a */
  cli = client_as("bob", &tls, port);
  assert_int_equal(submit(cli, "bob", doc, 0, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "may not run jobs on cluster 'dc-a'"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);

  cli = client_as("alice", &tls, port);
  /* tampered descriptor */
  assert_int_equal(submit(cli, "alice", doc, 1, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "descriptor signature does not verify"));
  /* signed by someone else than the caller */
  assert_int_equal(submit(cli, "bob", doc, 0, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "signer certificate refused"));
  /* more workers than the ACL allows */
  char big[1024];
  snprintf(big, sizeof big, doc_fmt, "quick", "dc-a", 3);
  assert_int_equal(submit(cli, "alice", big, 0, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "at most 2 workers"));
  /* a job spanning a peer that does not answer (nothing listens there); federation itself is
   * tested in tests/unit/federation */
  const char* two =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"two\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {\"languages\": "
      "[\"en\"]}}, {\"id\": \"dc-b\", \"data\": {\"languages\": [\"de\"]}}]}}";
  assert_int_equal(submit(cli, "alice", two, 0, NULL), NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(nb_error_last(), "cluster 'dc-b' refused the job"));

  /* an invalid descriptor, correctly signed */
  char bad[1024];
  snprintf(bad, sizeof bad, doc_fmt, "Bad_Name", "dc-a", 1);
  assert_int_equal(submit(cli, "alice", bad, 0, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "$.metadata.name"));
  /* nothing was stored */
  lq.owner = (char*)"";
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/List", &lq.base,
                                   &nebula__v1__list_reply__descriptor, &rep, 10000, 0),
                   NB_OK);
  Nebula__V1__ListReply* lr = (Nebula__V1__ListReply*)rep;
  for (size_t i = 0; i < lr->n_jobs; i++) assert_true(strncmp(lr->jobs[i]->id, "Bad", 3));
  protobuf_c_message_free_unpacked(rep, NULL);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
  /* each refusal logged with the caller and the reason nebula_gateway_refusals_total counts */
  char* log = log_end("refusals.log");
  assert_log_line(log, "Submit refused: user 'mallory': reason acl: ", "not in this gateway's ACL");
  assert_log_line(log, "Submit refused: user 'bob': reason acl: ", "may not run jobs on cluster");
  assert_log_line(log,
                  "Submit refused: user 'alice': reason signature: ", "signature does not verify");
  assert_log_line(log,
                  "Submit refused: user 'alice': reason signature: ", "signer certificate refused");
  assert_log_line(log, "Submit refused: user 'alice': reason acl: ", "at most 2 workers");
  assert_log_line(
      log, "Submit refused: user 'alice': reason federation: ", "cluster 'dc-b' refused the job");
  assert_log_line(log, "federation Propose to cluster 'dc-b' for job two-", ": NB_ERR_UNAVAILABLE");
  assert_log_line(log, "Submit refused: user 'alice': reason descriptor: ", "$.metadata.name");
  assert_log_line(log, "NB INFO JOB ", "(metrics.c:");
  free(log);
}

/* One call with hand-made credentials from g_dir/<who>.{crt,key} (the wrapper refuses to load a
 * certificate without an identity): returns the gRPC status code, its details in `details`. */
static char* slurp_file(const char* path) {
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  char* b = calloc(1, 1 << 16);
  assert_non_null(b);
  assert_true(fread(b, 1, (1 << 16) - 1, f) > 0);
  fclose(f);
  return b;
}

static int raw_call(int port, const char* who, const char* method, const ProtobufCMessage* m,
                    char* details, size_t cap) {
  char p[512], target[64];
  snprintf(p, sizeof p, "%s/ca.crt", g_dir);
  char* ca = slurp_file(p);
  snprintf(p, sizeof p, "%s/%s.crt", g_dir, who);
  char* crt = slurp_file(p);
  snprintf(p, sizeof p, "%s/%s.key", g_dir, who);
  char* key = slurp_file(p);
  grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = crt};
  grpc_channel_credentials* creds = grpc_ssl_credentials_create_ex(ca, &pair, NULL, NULL);
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  grpc_channel* ch = grpc_channel_create(target, creds, NULL);
  grpc_completion_queue* cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice ms = grpc_slice_from_copied_string(method);
  gpr_timespec dl =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(10000, GPR_TIMESPAN));
  grpc_call* call = grpc_channel_create_call(ch, NULL, 0, cq, ms, NULL, dl, NULL);
  uint8_t buf[1024];
  assert_true(protobuf_c_message_get_packed_size(m) <= sizeof buf);
  size_t len = protobuf_c_message_pack(m, buf);
  grpc_slice s = grpc_slice_from_copied_buffer((const char*)buf, len);
  grpc_byte_buffer* req = grpc_raw_byte_buffer_create(&s, 1);
  grpc_byte_buffer* resp = NULL;
  grpc_metadata_array md, tmd;
  grpc_metadata_array_init(&md);
  grpc_metadata_array_init(&tmd);
  grpc_status_code code = GRPC_STATUS_UNKNOWN;
  grpc_slice det = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = req;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &resp;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.status = &code;
  ops[5].data.recv_status_on_client.status_details = &det;
  ops[5].data.recv_status_on_client.trailing_metadata = &tmd;
  assert_int_equal(grpc_call_start_batch(call, ops, 6, (void*)1, NULL), GRPC_CALL_OK);
  grpc_event ev =
      grpc_completion_queue_pluck(cq, (void*)1, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  assert_int_equal(ev.type, GRPC_OP_COMPLETE);
  snprintf(details, cap, "%.*s", (int)GRPC_SLICE_LENGTH(det),
           (const char*)GRPC_SLICE_START_PTR(det));
  if (resp) grpc_byte_buffer_destroy(resp);
  grpc_byte_buffer_destroy(req);
  grpc_slice_unref(s);
  grpc_slice_unref(ms);
  grpc_slice_unref(det);
  grpc_metadata_array_destroy(&md);
  grpc_metadata_array_destroy(&tmd);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  grpc_channel_destroy(ch);
  grpc_channel_credentials_release(creds);
  free(ca);
  free(crt);
  free(key);
  return (int)code;
}

/* The attack: a certificate the federation CA signed with CN=alice and no nebula URI SAN was
 * taken as the cluster "alice", i.e. an admin: List showed every user's jobs, Get and Logs read
 * another user's job. No URI, no identity: every call is refused naming what is missing. */
static void test_cn_only_refused(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  int port = nb_gateway_port(gw);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, port);
  char doc[1024];
  snprintf(doc, sizeof doc, doc_fmt, "quick", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  char id[64];
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);

  /* the wrapper refuses to present it at all */
  char ca[512], crt[512], key[512];
  path_of(ca, sizeof ca, "ca.crt");
  path_of(crt, sizeof crt, "cn-alice.crt");
  path_of(key, sizeof key, "cn-alice.key");
  nb_tls_files_t f = {ca, crt, key};
  nb_tls_t* bad = NULL;
  assert_int_equal(nb_tls_create(&f, &bad), NB_ERR_CRYPTO);
  assert_non_null(strstr(nb_error_last(), "states no nebula identity"));

  char det[1024];
  Nebula__V1__ListRequest lq = NEBULA__V1__LIST_REQUEST__INIT;
  lq.owner = (char*)"";
  assert_int_equal(raw_call(port, "cn-alice", "/nebula.v1.Gateway/List", &lq.base, det, sizeof det),
                   GRPC_STATUS_PERMISSION_DENIED);
  fprintf(stderr, "CN-only List: %s\n", det);
  assert_non_null(strstr(det, "certificate (CN 'alice') states no nebula identity"));
  assert_non_null(strstr(det, "nebula://user/NAME"));
  Nebula__V1__GetRequest gq = NEBULA__V1__GET_REQUEST__INIT;
  gq.job_id = id;
  assert_int_equal(raw_call(port, "cn-alice", "/nebula.v1.Gateway/Get", &gq.base, det, sizeof det),
                   GRPC_STATUS_PERMISSION_DENIED);
  assert_non_null(strstr(det, "states no nebula identity"));
  Nebula__V1__LogsRequest logq = NEBULA__V1__LOGS_REQUEST__INIT;
  logq.job_id = id;
  assert_int_equal(
      raw_call(port, "cn-alice", "/nebula.v1.Gateway/Logs", &logq.base, det, sizeof det),
      GRPC_STATUS_PERMISSION_DENIED);
  assert_non_null(strstr(det, "states no nebula identity"));
  /* the Federation API (peer gateways) the same */
  assert_int_equal(
      raw_call(port, "cn-alice", "/nebula.v1.Federation/Report", &gq.base, det, sizeof det),
      GRPC_STATUS_PERMISSION_DENIED);
  assert_non_null(strstr(det, "states no nebula identity"));
  /* the same key pair with its identity URI works: the refusal is the identity, not the TLS */
  assert_int_equal(raw_call(port, "alice", "/nebula.v1.Gateway/List", &lq.base, det, sizeof det),
                   GRPC_STATUS_OK);
  wait_state(cli, id, "succeeded");
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

/* Descriptor paths outside the job's folder and paths.allow: refused at submit, each named by its
 * JSON path, nothing stored or created (the attacks: another job's checkpoints, another user's
 * weights, /etc/shadow through the loader). Paths inside the allowed root are accepted. */
static void test_path_refusals(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  static const char* fmt =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
      "\"%s\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {%s\"languages\": "
      "[\"en\"]}}]%s}}";
  struct {
    const char *data, *rest, *field, *why;
  } bad[] = {
      {"", ", \"checkpoint\": {\"dir\": \"../victim-job/checkpoints\", \"keep\": 1}",
       "$.spec.checkpoint.dir: \"../victim-job/checkpoints\"", "\"..\" is not allowed"},
      {"", ", \"checkpoint\": {\"dir\": \"/tmp/elsewhere\"}", "$.spec.checkpoint.dir",
       "an absolute path is not allowed"},
      {"", ", \"model\": {\"base\": {\"checkpoint\": \"../victim-job/final.safetensors\"}}",
       "$.spec.model.base.checkpoint", "\"..\" is not allowed"},
      {"", ", \"model\": {\"base\": {\"checkpoint\": \"/etc/shadow\"}}",
       "$.spec.model.base.checkpoint: \"/etc/shadow\"",
       "outside the job's folder and the gateway's allowed roots"},
      {"\"dir\": \"/etc\", ", "", "$.spec.clusters[0].data.dir", "allowed roots"},
      {"",
       ", \"security\": {\"ca\": \"ca.crt\", \"cert\": \"/etc/passwd\", \"key\": \"/etc/shadow\"}",
       "$.spec.security.key", "allowed roots"},
  };
  char doc[2048], data[600];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(doc, sizeof doc, fmt, "quick-paths", bad[i].data, bad[i].rest);
    assert_int_equal(submit(cli, "alice", doc, 0, NULL), NB_ERR_PERMISSION);
    fprintf(stderr, "refusal: %s\n", nb_error_last());
    assert_non_null(strstr(nb_error_last(), "descriptor refused:"));
    assert_non_null(strstr(nb_error_last(), bad[i].field));
    assert_non_null(strstr(nb_error_last(), bad[i].why));
  }
  /* nothing stored, no folder created */
  Nebula__V1__ListRequest lq = NEBULA__V1__LIST_REQUEST__INIT;
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/List", &lq.base,
                                   &nebula__v1__list_reply__descriptor, &rep, 10000, 0),
                   NB_OK);
  Nebula__V1__ListReply* lr = (Nebula__V1__ListReply*)rep;
  for (size_t i = 0; i < lr->n_jobs; i++) assert_true(strncmp(lr->jobs[i]->id, "quick-paths", 11));
  protobuf_c_message_free_unpacked(rep, NULL);
  /* inside the allowed root: accepted and run */
  snprintf(data, sizeof data, "\"dir\": \"%s/data/quick\", ", g_dir);
  snprintf(doc, sizeof doc, fmt, "quick-allowed", data, ", \"checkpoint\": {\"dir\": \"ck\"}");
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  wait_state(cli, job->id, "succeeded");
  protobuf_c_message_free_unpacked(&job->base, NULL);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

static int read_pids(const char* id, pid_t* pids) {
  char p[1200];
  snprintf(p, sizeof p, "%s/%s/pids", g_cfg.work_dir, id);
  for (int tries = 0; tries < 500; tries++) {
    FILE* f = fopen(p, "r");
    int n = 0;
    if (f) {
      int v;
      while (n < 3 && fscanf(f, "%d", &v) == 1) pids[n++] = v;
      fclose(f);
    }
    if (n == 3) return n;
    nb_sleep_ns(20000000);
  }
  return 0;
}

static int pid_alive(pid_t pid) {
  char p[64], st = 0;
  snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
  FILE* f = fopen(p, "r");
  if (!f) return 0;
  int r = fscanf(f, "%*d (%*[^)]) %c", &st);
  fclose(f);
  return r == 1 && st != 'Z' && st != 'X';
}

static void cancel(nb_rpc_client_t* cli, const char* id, const char* expect_state) {
  Nebula__V1__Job* j = gwt_cancel(cli, id, 20000);
  assert_string_equal(j->state, expect_state);
  if (!strcmp(expect_state, "cancelled"))
    assert_string_equal(j->reason, "cancelled by alice: test");
  protobuf_c_message_free_unpacked(&j->base, NULL);
}

static void test_cancel_and_fail(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  log_begin("cancel.log");
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  char doc[1024], id[64];
  snprintf(doc, sizeof doc, doc_fmt, "sleepy", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  assert_true(job->pid > 0);
  pid_t pg = job->pid;
  protobuf_c_message_free_unpacked(&job->base, NULL);
  pid_t pids[3];
  assert_int_equal(read_pids(id, pids), 3);
  for (int i = 0; i < 3; i++) assert_true(pid_alive(pids[i]));
  cancel(cli, id, "cancelled");
  for (int i = 0; i < 3; i++) assert_false(pid_alive(pids[i]));
  assert_false(nb_launcher_group_alive(pg));
  cancel(cli, id, "cancelled"); /* idempotent */

  /* a job whose leader ends leaving processes behind: they are killed, the job succeeded */
  snprintf(doc, sizeof doc, doc_fmt, "stray", "dc-a", 1);
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  pg = job->pid;
  protobuf_c_message_free_unpacked(&job->base, NULL);
  assert_int_equal(read_pids(id, pids), 3);
  wait_state(cli, id, "succeeded");
  for (int i = 0; i < 100 && (pid_alive(pids[0]) || pid_alive(pids[1])); i++) nb_sleep_ns(10000000);
  assert_false(pid_alive(pids[0]));
  assert_false(pid_alive(pids[1]));
  assert_false(nb_launcher_group_alive(pg));

  snprintf(doc, sizeof doc, doc_fmt, "fail", "dc-a", 1);
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  wait_state(cli, id, "failed");
  job = get_job(cli, id);
  assert_int_equal(job->exit_code, 3);
  assert_non_null(strstr(job->reason, "exited with code 3"));
  protobuf_c_message_free_unpacked(&job->base, NULL);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
  /* each job's lifecycle: accepted, launched, finished with its code and state */
  char* log = log_end("cancel.log");
  char want[128];
  snprintf(want, sizeof want, "job %s accepted from user 'alice': ", id);
  assert_log_line(log, want, "1 cluster, 1 workers here");
  snprintf(want, sizeof want, "job %s launched: process ", id);
  assert_log_line(log, want, "(local launcher), 1 worker");
  snprintf(want, sizeof want, "job %s finished: process ", id);
  assert_log_line(log, want, ", exit code 3, failed: process ");
  assert_log_line(log, "job sleepy-", "finished: process ");
  assert_log_line(log, "job sleepy-", ", cancelled: cancelled by alice");
  assert_log_line(log, "job stray-", ", exit code 0, succeeded");
  free(log);
}

static void test_slots(void** state) {
  (void)state;
  nb_gateway_config_t c = g_cfg;
  c.slots = 2;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&c, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  char doc[1024], id[64];
  snprintf(doc, sizeof doc, doc_fmt, "sleepy", "dc-a", 2);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  snprintf(doc, sizeof doc, doc_fmt, "quick", "dc-a", 1);
  assert_int_equal(submit(cli, "alice", doc, 0, NULL), NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(nb_error_last(), "has 0 free worker slots of 2, the job needs 1"));
  pid_t pids[3];
  assert_int_equal(read_pids(id, pids), 3);
  cancel(cli, id, "cancelled");
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK); /* the slots are free again */
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  wait_state(cli, id, "succeeded");
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

/* One user's Watch streams cannot take every handler of the gateway: with
 * limits.calls_per_identity 3, alice's fourth call while three Watch streams are open is
 * RESOURCE_EXHAUSTED naming the limit; bob is served meanwhile; once a stream ends, alice is
 * served again. */
static void test_call_limits(void** state) {
  (void)state;
  nb_gateway_config_t c = g_cfg;
  c.calls_per_identity = 3;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&c, &gw), NB_OK);
  int port = nb_gateway_port(gw);
  nb_tls_t *tls = NULL, *tb = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, port);
  char doc[1024], id[64];
  snprintf(doc, sizeof doc, doc_fmt, "sleepy", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  pid_t pids[3];
  assert_int_equal(read_pids(id, pids), 3);
  /* three Watch streams of the running job, each seen to be served (its first event came) */
  nb_rpc_stream_t* ws[4] = {0};
  Nebula__V1__WatchRequest wr = NEBULA__V1__WATCH_REQUEST__INIT;
  wr.job_id = id;
  uint8_t buf[256];
  size_t len = nebula__v1__watch_request__pack(&wr, buf);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Watch", 30000, 0, &ws[i]), NB_OK);
    assert_int_equal(nb_rpc_stream_send(ws[i], buf, len), NB_OK);
    ProtobufCMessage* m = NULL;
    int end = 0;
    nb_status_t st =
        nb_rpc_stream_recv_pb(ws[i], &nebula__v1__job_event__descriptor, &m, &end, NB_RPC_INFINITE);
    if (i < 3) {
      assert_int_equal(st, NB_OK);
      assert_false(end);
      protobuf_c_message_free_unpacked(m, NULL);
      continue;
    }
    /* the fourth */
    assert_int_not_equal(st, NB_OK);
    fprintf(stderr, "limit: %s\n", nb_error_last());
    assert_non_null(strstr(nb_error_last(), "RESOURCE_EXHAUSTED"));
    assert_non_null(strstr(nb_error_last(),
                           "user 'alice' already has 3 calls in flight at "
                           "gateway 'dc-a', the limit per identity "
                           "(limits.calls_per_identity = 3)"));
  }
  /* a unary call of alice's too; another user is served */
  Nebula__V1__ListRequest lq = NEBULA__V1__LIST_REQUEST__INIT;
  ProtobufCMessage* rep = NULL;
  assert_int_not_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/List", &lq.base,
                                       &nebula__v1__list_reply__descriptor, &rep, 10000, 0),
                       NB_OK);
  assert_non_null(strstr(nb_error_last(), "RESOURCE_EXHAUSTED"));
  nb_rpc_client_t* bob = client_as("bob", &tb, port);
  assert_int_equal(nb_rpc_unary_pb(bob, "/nebula.v1.Gateway/List", &lq.base,
                                   &nebula__v1__list_reply__descriptor, &rep, 10000, 0),
                   NB_OK);
  protobuf_c_message_free_unpacked(rep, NULL);
  /* one stream ends: alice is served again (the handler notices the cancelled stream) */
  nb_rpc_stream_destroy(ws[0]);
  ws[0] = NULL;
  nb_status_t st = NB_ERR_INVALID;
  for (int k = 0; k < 500 && st != NB_OK; k++) {
    st = nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/List", &lq.base,
                         &nebula__v1__list_reply__descriptor, &rep, 10000, 0);
    if (st == NB_OK)
      protobuf_c_message_free_unpacked(rep, NULL);
    else
      nb_sleep_ns(20000000);
  }
  assert_int_equal(st, NB_OK);
  for (int i = 1; i < 4; i++) nb_rpc_stream_destroy(ws[i]);
  /* and cancels its job once the streams are gone */
  st = NB_ERR_INVALID;
  for (int k = 0; k < 500 && st != NB_OK; k++) {
    Nebula__V1__CancelRequest cr = NEBULA__V1__CANCEL_REQUEST__INIT;
    cr.job_id = id;
    st = nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Cancel", &cr.base, &nebula__v1__job__descriptor,
                         &rep, 10000, 0);
    if (st == NB_OK)
      protobuf_c_message_free_unpacked(rep, NULL);
    else
      nb_sleep_ns(20000000);
  }
  assert_int_equal(st, NB_OK);
  wait_state(cli, id, "cancelled");
  nb_rpc_client_destroy(bob);
  nb_tls_destroy(tb);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

/* Every payload of the job's events of one kind, one per line (caller frees). */
static char* watch_all(nb_rpc_client_t* cli, const char* id, const char* kind) {
  Nebula__V1__WatchRequest wr = NEBULA__V1__WATCH_REQUEST__INIT;
  wr.job_id = (char*)id;
  uint8_t buf[256];
  size_t len = nebula__v1__watch_request__pack(&wr, buf);
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Gateway/Watch", 30000, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, len), NB_OK);
  char* all = calloc(1, 1);
  size_t n = 0;
  for (int end = 0;;) {
    ProtobufCMessage* m = NULL;
    assert_int_equal(
        nb_rpc_stream_recv_pb(s, &nebula__v1__job_event__descriptor, &m, &end, NB_RPC_INFINITE),
        NB_OK);
    if (end) break;
    Nebula__V1__JobEvent* e = (Nebula__V1__JobEvent*)m;
    if (!strcmp(e->kind, kind)) {
      size_t k = strlen(e->payload_json);
      all = realloc(all, n + k + 2);
      memcpy(all + n, e->payload_json, k);
      n += k;
      all[n++] = '\n';
      all[n] = 0;
    }
    protobuf_c_message_free_unpacked(m, NULL);
  }
  nb_rpc_stream_destroy(s);
  return all;
}

/* run_as (a gateway started as root): the job runs as that user in a folder it may write but
 * whose gateway files it cannot replace; links it leaves to files only root may read (the
 * final model, summary.json, the status file) are not read, kept or written through. Skipped
 * when not root or without the user "nobody". */
static void test_run_as(void** state) {
  (void)state;
  struct passwd* pw = getpwnam("nobody");
  if (geteuid() != 0 || !pw) skip();
  uid_t nobody = pw->pw_uid;
  char secret[400], wd[400];
  snprintf(secret, sizeof secret, "%s/root-only", g_dir);
  FILE* f = fopen(secret, "w");
  assert_non_null(f);
  fputs("{\"root\": \"only\"}\n", f);
  fclose(f);
  assert_int_equal(chmod(secret, 0600), 0);
  setenv("NB_TEST_SECRET", secret, 1);
  assert_int_equal(chmod(g_dir, 0711), 0);
  nb_gateway_config_t c = g_cfg;
  snprintf(c.run_as, sizeof c.run_as, "nobody");
  snprintf(wd, sizeof wd, "%s/work-runas", g_dir);
  snprintf(c.work_dir, sizeof c.work_dir, "%s", wd);
  nb_gateway_t* gw = NULL;
  /* a work_dir the user cannot reach is refused, saying why */
  assert_int_equal(mkdir(wd, 0750), 0);
  assert_int_equal(nb_gateway_create(&c, &gw), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "must be searchable by others"));
  assert_int_equal(chmod(wd, 0751), 0);
  nb_gateway_config_t m = c;
  m.launcher.kind = NB_LAUNCHER_MPIRUN;
  assert_int_equal(nb_gateway_create(&m, &gw), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "launcher \"local\" only"));
  assert_int_equal(nb_gateway_create(&c, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  char doc[1024], id[64], p[1400];
  snprintf(doc, sizeof doc, doc_fmt, "runas", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  wait_state(cli, id, "succeeded");
  /* it ran as nobody, and its progress (a file of nobody's) was read */
  snprintf(p, sizeof p, "%s/%s/uid.txt", wd, id);
  f = fopen(p, "r");
  assert_non_null(f);
  unsigned u = 0;
  assert_int_equal(fscanf(f, "%u", &u), 1);
  fclose(f);
  assert_int_equal(u, (unsigned)nobody);
  assert_true(count_progress(cli, id) >= 1);
  /* it could not write next to its folder */
  snprintf(p, sizeof p, "%s/escaped", wd);
  assert_int_equal(access(p, F_OK), -1);
  /* the links to root's files were not kept as artifacts; rounds.tsv (its own file) was */
  /* the gateway publishes a job's outputs after it records the job's end: wait for them
   * (bounded only against a hang) */
  char* arts = watch_all(cli, id, "artifact");
  for (int i = 0; i < 600 && !strstr(arts, "rounds.tsv"); i++) {
    free(arts);
    nb_sleep_ns(50 * 1000000LL);
    arts = watch_all(cli, id, "artifact");
  }
  fprintf(stderr, "artifacts:\n%s", arts);
  assert_null(strstr(arts, "final.safetensors"));
  assert_null(strstr(arts, "summary.json"));
  assert_non_null(strstr(arts, "rounds.tsv"));
  free(arts);
  /* the report did not copy root's file; the status file was written afresh, not through the
   * link, and root's file is unchanged */
  char* rf = watch_find(cli, id, "report_failed");
  assert_non_null(rf);
  assert_non_null(strstr(rf, "summary.json"));
  free(rf);
  f = fopen(secret, "r");
  char back[64] = "";
  assert_non_null(fgets(back, sizeof back, f));
  fclose(f);
  assert_string_equal(back, "{\"root\": \"only\"}\n");
  snprintf(p, sizeof p, "%s/%s/exit_code", wd, id);
  struct stat sb;
  assert_int_equal(lstat(p, &sb), 0);
  assert_true(S_ISREG(sb.st_mode));
  assert_int_equal(sb.st_uid, 0);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
  assert_int_equal(chmod(g_dir, 0700), 0);
}

static void test_restart(void** state) {
  (void)state;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&g_cfg, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  char doc[1024], id1[64], id2[64];
  snprintf(doc, sizeof doc, doc_fmt, "sleepy", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id1, sizeof id1, "%s", job->id);
  pid_t pg1 = job->pid;
  protobuf_c_message_free_unpacked(&job->base, NULL);
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id2, sizeof id2, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  char id3[64];
  snprintf(doc, sizeof doc, doc_fmt, "slow", "dc-a", 1);
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id3, sizeof id3, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  pid_t pids[3];
  assert_int_equal(read_pids(id1, pids), 3);
  assert_int_equal(read_pids(id2, pids), 3);
  nb_sleep_ns(100000000); /* let the monitor record the progress lines */
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw); /* jobs keep running */
  assert_true(pid_alive(pg1));
  kill(-pg1, SIGKILL); /* job 1 dies while no gateway watches */
  for (int i = 0; i < 100 && nb_launcher_group_alive(pg1); i++) nb_sleep_ns(10000000);
  /* job 3 ends while no gateway watches (it waits for its release file, whatever the load):
   * its exit_code file appears */
  char exit_file[1200];
  snprintf(exit_file, sizeof exit_file, "%s/%s/release", g_cfg.work_dir, id3);
  FILE* rel = fopen(exit_file, "w");
  assert_non_null(rel);
  assert_int_equal(fclose(rel), 0);
  snprintf(exit_file, sizeof exit_file, "%s/%s/exit_code", g_cfg.work_dir, id3);
  for (int i = 0; i < 500 && access(exit_file, F_OK) != 0; i++) nb_sleep_ns(20000000);
  assert_int_equal(access(exit_file, F_OK), 0);

  nb_gateway_config_t two_slots = g_cfg;
  two_slots.slots = 2;
  assert_int_equal(nb_gateway_create(&two_slots, &gw), NB_OK);
  cli = client_as("alice", &tls, nb_gateway_port(gw));
  job = get_job(cli, id1);
  assert_string_equal(job->state, "failed");
  assert_non_null(strstr(job->reason, "is gone and left no exit status"));
  protobuf_c_message_free_unpacked(&job->base, NULL);
  /* the re-attached job holds its slot: 1 of 2 left */
  snprintf(doc, sizeof doc, doc_fmt, "quick", "dc-a", 2);
  assert_int_equal(submit(cli, "alice", doc, 0, NULL), NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(nb_error_last(), "has 1 free worker slots of 2"));
  job = get_job(cli, id3);
  assert_string_equal(job->state, "succeeded");
  assert_string_equal(job->reason, "finished while the gateway was down");
  assert_int_equal(job->exit_code, 0);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  job = get_job(cli, id2);
  assert_string_equal(job->state, "running");
  assert_true(job->pid > 0);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  assert_int_equal(read_pids(id2, pids), 3);
  cancel(cli, id2, "cancelled");
  for (int i = 0; i < 3; i++) assert_false(pid_alive(pids[i]));
  /* the progress line recorded before the restart is not recorded again */
  assert_int_equal(count_progress(cli, id2), 1);
  assert_int_equal(count_progress(cli, id1), 1);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

static void test_acl(void** state) {
  (void)state;
  nb_acl_t acl;
  memset(&acl, 0, sizeof acl);
  nb_acl_want_t w[2] = {{"dc-a", 1}, {"dc-b", 4}};
  assert_int_equal(nb_acl_check(&acl, "alice", w, 1), NB_ERR_PERMISSION); /* deny by default */
  const char* a[] = {"dc-a"};
  const char* any[] = {"*"};
  assert_int_equal(nb_acl_add(&acl, "alice", a, 1, 2), NB_OK);
  assert_int_equal(nb_acl_add(&acl, "*", any, 1, 1), NB_OK);
  assert_int_equal(nb_acl_check(&acl, "alice", w, 1), NB_OK);
  /* alice's own rule lacks dc-b, the wildcard rule allows 1 worker only */
  assert_int_equal(nb_acl_check(&acl, "alice", w, 2), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "user 'alice' may not run jobs on cluster 'dc-b'"));
  w[1].workers = 1;
  assert_int_equal(nb_acl_check(&acl, "alice", w, 2), NB_OK); /* the wildcard rule allows it */
  w[0].workers = 2;
  /* alice's rule allows dc-a with 2 but not dc-b, the wildcard dc-b but not 2 workers: one rule
     must allow the whole job */
  assert_int_equal(nb_acl_check(&acl, "alice", w, 2), NB_ERR_PERMISSION);
  assert_int_equal(nb_acl_check(&acl, "alice", w, 1), NB_OK);
  w[0].workers = 1;
  assert_int_equal(nb_acl_check(&acl, "carol", w, 2), NB_OK);
  assert_int_equal(nb_acl_add(&acl, "", a, 1, 0), NB_ERR_INVALID);
  assert_int_equal(nb_acl_add(&acl, "x", a, 0, 0), NB_ERR_INVALID);
  assert_int_equal(nb_acl_add(&acl, "x", a, 1, -1), NB_ERR_INVALID);
}

static void test_config(void** state) {
  (void)state;
  nb_gateway_config_t c;
  struct {
    const char* text;
    const char* msg;
  } bad[] = {
      {"{\"cluster_id\": \"dc-a\", \"tls\": {\"ca\": \"a\", \"cert\": \"b\", \"key\": "
       "\"c\"}, \"slots\": 3}",
       "config: slots: unknown key"},
      {"{\"cluster_id\": \"dc-a\", \"resources\": {\"slots\": 0}}",
       "config: resources.slots: expected 1..1048576, found 0"},
      {"{\"cluster_id\": \"dc-a\", \"resources\": {\"device\": \"tpu\"}}",
       "resources.device: expected \"cpu\" or \"cuda\""},
      {"{\"cluster_id\": \"dc-a\", \"launcher\": \"pbs\"}", "launcher 'pbs' is not available"},
      {"{\"cluster_id\": \"dc-a\"}", "tls.ca, tls.cert and tls.key are required"},
      {"{\"listen\": \"x\"}", "cluster_id is required"},
      {"{\"cluster_id\": \"dc-a\", \"acl\": [{\"user\": \"a\", \"clusterz\": []}]}",
       "acl[0].clusterz: unknown key"},
      {"{\"cluster_id\": \"dc-a\", \"command\": []}", "command: expected an array of 1..32"},
      {"{\"cluster_id\": 7}", "cluster_id: expected a string"},
      {"{\"cluster_id\": \"dc-a\",\n \"tls\": }", "line 2, column"},
      {"{\"tls\": 1}", "config: tls: expected an object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    nb_gateway_config_defaults(&c);
    assert_int_equal(nb_gateway_config_parse(bad[i].text, strlen(bad[i].text), NULL, &c),
                     NB_ERR_CONFIG);
    if (!strstr(nb_error_last(), bad[i].msg))
      fail_msg("config %zu: got '%s', want '%s'", i, nb_error_last(), bad[i].msg);
  }
  /* relative paths against the base folder; defaults kept */
  const char* ok =
      "{\"cluster_id\": \"dc-a\", \"tls\": {\"ca\": \"ca.crt\", \"cert\": "
      "\"/abs/c.crt\", \"key\": \"k.key\"}}";
  nb_gateway_config_defaults(&c);
  assert_int_equal(nb_gateway_config_parse(ok, strlen(ok), "/etc/nb", &c), NB_OK);
  assert_string_equal(c.tls_ca, "/etc/nb/ca.crt");
  assert_string_equal(c.tls_cert, "/abs/c.crt");
  assert_string_equal(c.work_dir, "/etc/nb/work");
  assert_int_equal(c.slots, 4);
  assert_int_equal(c.cancel_grace_ms, 5000);
  assert_int_equal(c.acl.n_rules, 0);
  assert_string_equal(c.command[1], "train");
  /* the parsed test config */
  assert_int_equal(g_cfg.n_peers, 1);
  assert_string_equal(g_cfg.peers[0].id, "dc-b");
  assert_int_equal(g_cfg.acl.n_rules, 3);
  assert_int_equal(g_cfg.acl.rules[0].max_workers, 2);
}

static void copy_file(const char* from, const char* to) {
  FILE* a = fopen(from, "rb");
  FILE* b = fopen(to, "wb");
  assert_non_null(a);
  assert_non_null(b);
  char buf[8192];
  for (size_t n; (n = fread(buf, 1, sizeof buf, a)) > 0;) assert_int_equal(fwrite(buf, 1, n, b), n);
  fclose(a);
  assert_int_equal(fclose(b), 0);
}

/* Runs sql on the store file directly (as a damaged or tampered store would be); closing the
 * only connection folds the WAL back into the file. */
static void sql_on(const char* db, const char* sql) {
  sqlite3* h = NULL;
  assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
  char* err = NULL;
  int rc = sqlite3_exec(h, sql, NULL, NULL, &err);
  if (rc != SQLITE_OK) fail_msg("%s: %s", sql, err ? err : "?");
  sqlite3_close(h);
}

static long sql_long(const char* db, const char* sql) {
  sqlite3* h = NULL;
  sqlite3_stmt* st = NULL;
  assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  long v = (long)sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(h);
  return v;
}

/* The store is checked before the gateway serves: a deleted or 0-byte jobs.db next to job
 * folders, a dropped events table and a job in an unknown state each refuse the start with a
 * message naming the problem (the store is not recreated, the folders are untouched); job folders
 * the store does not know are warned about; the restored store starts and serves the job. */
static void test_store_checks(void** state) {
  (void)state;
  nb_gateway_config_t cfg = g_cfg;
  snprintf(cfg.work_dir, sizeof cfg.work_dir, "%s/work-store", g_dir);
  cfg.store_path[0] = 0;
  nb_gateway_t* gw = NULL;
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_OK);
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, nb_gateway_port(gw));
  char doc[1024], id[64];
  snprintf(doc, sizeof doc, doc_fmt, "quick", "dc-a", 1);
  Nebula__V1__Job* job = NULL;
  assert_int_equal(submit(cli, "alice", doc, 0, &job), NB_OK);
  snprintf(id, sizeof id, "%s", job->id);
  protobuf_c_message_free_unpacked(&job->base, NULL);
  wait_state(cli, id, "succeeded");
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  tls = NULL;
  nb_gateway_destroy(gw);
  gw = NULL;

  char db[600], wal[610], shm[610], bak[600];
  snprintf(db, sizeof db, "%s/jobs.db", cfg.work_dir);
  snprintf(wal, sizeof wal, "%s-wal", db);
  snprintf(shm, sizeof shm, "%s-shm", db);
  snprintf(bak, sizeof bak, "%s/jobs.db.bak", g_dir);
  sql_on(db, "PRAGMA wal_checkpoint(TRUNCATE)");
  unlink(wal);
  unlink(shm);
  copy_file(db, bak);

  /* deleted: refused, and no empty store is created in its place */
  assert_int_equal(unlink(db), 0);
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_ERR_INTEGRITY);
  fprintf(stderr, "deleted store: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(), "is missing but work_dir"));
  assert_non_null(strstr(nb_error_last(), "holds 1 job folder (e.g. 'quick-"));
  assert_non_null(strstr(nb_error_last(), "restore jobs.db from a backup"));
  assert_null(gw);
  assert_int_equal(access(db, F_OK), -1);
  /* 0 bytes */
  FILE* f = fopen(db, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_ERR_INTEGRITY);
  assert_non_null(strstr(nb_error_last(), "is empty (0 bytes) but work_dir"));
  struct stat sb;
  assert_int_equal(stat(db, &sb), 0);
  assert_int_equal(sb.st_size, 0);

  /* the events table dropped (Watch would fail with INTERNAL on every job) */
  copy_file(bak, db);
  sql_on(db, "DROP TABLE events");
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_ERR_INTEGRITY);
  fprintf(stderr, "dropped table: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(), "table 'events' is missing"));
  assert_non_null(strstr(nb_error_last(), "refusing to start on job store"));
  /* a column gone */
  copy_file(bak, db);
  sql_on(db, "ALTER TABLE jobs DROP COLUMN reason");
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_ERR_INTEGRITY);
  assert_non_null(strstr(nb_error_last(), "table 'jobs' has no column 'reason'"));
  /* a state no version of nebula writes (it showed as "pending" and Watch never ended) */
  copy_file(bak, db);
  sql_on(db, "UPDATE jobs SET state = 9");
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_ERR_INTEGRITY);
  fprintf(stderr, "unknown state: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(), "has state 9, which is none of the 6 known states"));
  assert_non_null(strstr(nb_error_last(), id));
  copy_file(bak, db);
  sql_on(db, "UPDATE jobs SET state = 'running'");
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_ERR_INTEGRITY);
  assert_non_null(strstr(nb_error_last(), "has state of type text"));

  /* a damaged page (the jobs_by_owner index claims 9 cells): the file opens and plain reads
   * work, SQLite's integrity check does not */
  copy_file(bak, db);
  long page = sql_long(db, "PRAGMA page_size");
  long root = sql_long(db, "SELECT rootpage FROM sqlite_schema WHERE name = 'jobs_by_owner'");
  assert_true(page > 0 && root > 1);
  f = fopen(db, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, (root - 1) * page + 3, SEEK_SET), 0);
  assert_int_equal(fwrite("\x00\x09", 1, 2, f), 2);
  assert_int_equal(fclose(f), 0);
  assert_int_not_equal(nb_gateway_create(&cfg, &gw), NB_OK);
  fprintf(stderr, "damaged page: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(), "integrity check"));
  assert_non_null(strstr(nb_error_last(), "refusing to start on job store"));

  /* restored, plus a job folder the store does not know: starts (with a warning), serves */
  copy_file(bak, db);
  char ghost[700];
  snprintf(ghost, sizeof ghost, "%s/ghost-1", cfg.work_dir);
  assert_int_equal(mkdir(ghost, 0750), 0);
  snprintf(ghost, sizeof ghost, "%s/ghost-1/descriptor.json", cfg.work_dir);
  f = fopen(ghost, "w");
  assert_non_null(f);
  fputs("{}", f);
  fclose(f);
  assert_int_equal(nb_gateway_create(&cfg, &gw), NB_OK);
  cli = client_as("alice", &tls, nb_gateway_port(gw));
  job = get_job(cli, id);
  assert_string_equal(job->state, "succeeded");
  protobuf_c_message_free_unpacked(&job->base, NULL);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  nb_gateway_destroy(gw);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_acl),
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_submit_watch_logs),
      cmocka_unit_test(test_report),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_cn_only_refused),
      cmocka_unit_test(test_path_refusals),
      cmocka_unit_test(test_cancel_and_fail),
      cmocka_unit_test(test_slots),
      cmocka_unit_test(test_call_limits),
      cmocka_unit_test(test_run_as),
      cmocka_unit_test(test_restart),
      cmocka_unit_test(test_store_checks),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
