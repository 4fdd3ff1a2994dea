/* Federation between two in-process gateways (dc-a, dc-b) over mutual TLS on loopback, running
 * real `nebula worker` / `nebula train` processes on a tiny model: a 2-cluster job submitted at
 * dc-a runs on both (same final θ_global hash, dc-b's events at dc-a), a peer whose ACL refuses
 * aborts it with nothing launched, cancel at the origin stops every worker, the origin restarted
 * mid-job keeps following it, and a job for dc-b only is forwarded there. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "gateway/artifact.h"
#include "gateway/gateway.h"
#include "gateway/launcher.h"
#include "gateway/store.h"
#include "nebula/v1/federation.pb-c.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/tls.h"
#include "tests/lib/gw_testlib.h"

static char g_dir[256];
static const char* g_nebula;
static char g_data[1024];
static const char* g_data_b; /* dc-b's data folder when not g_data */
static int g_port[2];
static nb_gateway_config_t g_cfg[2];
static nb_gateway_t* g_gw[2];
static const char* g_ids[2] = {"dc-a", "dc-b"};

/* dc-a lets alice and bob run anywhere; dc-b only alice. */
static void make_config(int i) {
  const char* acl =
      i == 0 ? "[{\"user\": \"alice\"}, {\"user\": \"bob\"}]" : "[{\"user\": \"alice\"}]";
  char cfg[8192];
  snprintf(
      cfg, sizeof cfg,
      "{\"cluster_id\": \"%s\", \"listen\": \"127.0.0.1:%d\",\n"
      " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"%s.crt\", \"key\": \"%s.key\"},\n"
      " \"peers\": {\"%s\": \"127.0.0.1:%d\"},\n"
      " \"command\": [\"%s\", \"train\", \"{descriptor}\", \"--out\", \"{jobdir}/out\"],\n"
      " \"worker_command\": [\"%s\", \"worker\", \"--job\", \"{descriptor}\", \"--cluster\",\n"
      "   \"{cluster}\", \"--out\", \"{jobdir}/out\", \"--listen\", \"{listen}\", \"{peers}\",\n"
      "   \"--pki\", \"{pki}\", \"--secret-file\", \"{secret_file}\"],\n"
      " \"resources\": {\"slots\": 2}, \"work_dir\": \"work-%s\", \"acl\": %s,\n"
      " \"paths\": {\"allow\": [\"%s\"]},\n"
      " \"federation_timeout_ms\": 5000, \"cancel_grace_ms\": 2000, \"poll_ms\": 20}",
      g_ids[i], g_port[i], g_ids[i], g_ids[i], g_ids[1 - i], g_port[1 - i], g_nebula, g_nebula,
      g_ids[i], acl, g_data);
  gwt_parse_config(g_dir, cfg, &g_cfg[i]);
}

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_fed");
  const char* clusters[] = {"dc-a", "dc-b", "dc-c"}; /* dc-c: from the CA, but nobody's peer */
  const char* users[] = {"alice", "bob"};
  gwt_make_pki(g_dir, clusters, 3, users, 2, NULL, NULL);
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

/* The gateways' lifecycle lines (NB_DEBUG=INFO, subsystem JOB) as JSON lines into
 * g_dir/gateways.log, set before the gateways start; the workers they launch inherit it and
 * append their own. */
static int setup_logged(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_fed");
  char p[512];
  snprintf(p, sizeof p, "%s/gateways.log", g_dir);
  setenv("NB_DEBUG", "INFO", 1);
  setenv("NB_DEBUG_SUBSYS", "JOB", 1);
  setenv("NB_LOG_FORMAT", "json", 1);
  setenv("NB_DEBUG_FILE", p, 1);
  nb_log_reload();
  const char* clusters[] = {"dc-a", "dc-b", "dc-c"};
  const char* users[] = {"alice", "bob"};
  gwt_make_pki(g_dir, clusters, 3, users, 2, NULL, NULL);
  gwt_start_pair(g_port, g_cfg, g_gw, make_config);
  return 0;
}

static int teardown_logged(void** state) {
  gwt_stop_pair(g_gw); /* before the logger goes back to stderr: no thread logs any more */
  unsetenv("NB_DEBUG");
  unsetenv("NB_DEBUG_SUBSYS");
  unsetenv("NB_LOG_FORMAT");
  unsetenv("NB_DEBUG_FILE");
  nb_log_reload();
  return teardown(state);
}

/* g_dir/gateways.log: every line must be one JSON object; their "msg" fields joined by newlines
 * into *msgs, the raw bytes into *raw (*raw_len bytes). The caller frees both. */
static void read_gateway_log(char** msgs, char** raw, size_t* raw_len) {
  char p[512];
  snprintf(p, sizeof p, "%s/gateways.log", g_dir);
  FILE* f = fopen(p, "rb");
  assert_non_null(f);
  size_t cap = 1 << 16, n = 0, mn = 0;
  char* buf = malloc(cap);
  size_t k;
  while ((k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += k;
    if (n + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  buf[n] = 0;
  char* out = malloc(n + 1);
  out[0] = 0;
  int lines = 0;
  for (char *line = buf, *nl; line < buf + n; line = nl + 1) {
    nl = memchr(line, '\n', (size_t)(buf + n - line));
    assert_non_null(nl); /* every line ends with a newline */
    json_error_t err;
    json_t* j = json_loadb(line, (size_t)(nl - line), 0, &err);
    if (!j)
      fail_msg("gateway log line %d is not JSON: %s: %.*s", lines + 1, err.text, (int)(nl - line),
               line);
    const char* m = json_string_value(json_object_get(j, "msg"));
    assert_non_null(m);
    mn += (size_t)sprintf(out + mn, "%s\n", m);
    json_decref(j);
    lines++;
  }
  assert_true(lines > 0);
  *msgs = out;
  *raw = buf;
  *raw_len = n;
}

/* The 32 bytes of job id's secret (cluster i's job.secret) appear in raw neither as bytes nor
 * in hex (either case) nor in base64. */
static void assert_secret_not_logged(int i, const char* id, const char* raw, size_t raw_len) {
  char p[800];
  snprintf(p, sizeof p, "%s/%s/job.secret", g_cfg[i].work_dir, id);
  uint8_t secret[32];
  FILE* f = fopen(p, "rb");
  assert_non_null(f);
  assert_int_equal(fread(secret, 1, sizeof secret, f), sizeof secret);
  fclose(f);
  char hex[65], HEX[65], b64[64];
  for (int b = 0; b < 32; b++) {
    snprintf(hex + 2 * b, 3, "%02x", secret[b]);
    snprintf(HEX + 2 * b, 3, "%02X", secret[b]);
  }
  EVP_EncodeBlock((unsigned char*)b64, secret, sizeof secret);
  assert_null(memmem(raw, raw_len, secret, sizeof secret));
  assert_null(memmem(raw, raw_len, hex, 64));
  assert_null(memmem(raw, raw_len, HEX, 64));
  assert_null(memmem(raw, raw_len, b64, strlen(b64)));
  assert_null(memmem(raw, raw_len, hex, 16)); /* not even a prefix */
}

/* Fails unless msgs holds a line containing every one of the NULL-terminated parts, in order. */
static void assert_line(const char* msgs, ...) {
  va_list ap;
  for (const char* line = msgs; *line;) {
    const char* end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char one[2048];
    snprintf(one, sizeof one, "%.*s", (int)len, line);
    const char* at = one;
    va_start(ap, msgs);
    for (const char* part; at && (part = va_arg(ap, const char*));) {
      at = strstr(at, part);
      if (at) at += strlen(part);
    }
    va_end(ap);
    if (at) return;
    line += len + (end ? 1 : 0);
  }
  va_start(ap, msgs);
  char want[1024] = "";
  for (const char* part; (part = va_arg(ap, const char*));)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s ... ", part);
  va_end(ap);
  fail_msg("no gateway log line with: %s\nlog:\n%s", want, msgs);
}

static nb_rpc_client_t* client_as(const char* user, nb_tls_t** tls_out, int gw) {
  return gwt_client(g_dir, user, g_port[gw], tls_out);
}

/* A tiny pretraining job on the named clusters (one worker each). */
static void job_doc(char* buf, size_t cap, const char* name, int with_a, int with_b, long steps) {
  char cl[2048] = "";
  size_t o = 0;
  const char* lang[2] = {"de", "ru"};
  for (int i = 0; i < 2; i++) {
    if (!(i == 0 ? with_a : with_b)) continue;
    o += (size_t)snprintf(cl + o, sizeof cl - o,
                          "%s{\"id\": \"%s\", \"workers\": 1, \"data\": {\"tier\": \"quick\", "
                          "\"dir\": \"%s\", \"languages\": [\"en\", \"%s\"]}}",
                          o ? ", " : "", g_ids[i], i == 1 && g_data_b ? g_data_b : g_data, lang[i]);
  }
  snprintf(buf, cap,
           "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
           "\"%s\"}, \"spec\": {\"task\": \"pretrain\", \"clusters\": [%s],"
           " \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, \"context\": 32},"
           " \"training\": {\"seed\": 5, \"batchSize\": 4, \"maxSteps\": %ld,"
           "  \"eval\": {\"batches\": 1}, \"optimizer\": {\"lr\": 0.003, \"warmupSteps\": 2}},"
           " \"sync\": {\"mode\": \"outer\", \"innerSteps\": 4},"
           " \"compression\": {\"density\": {\"initial\": 0.05, \"min\": 0.001, \"max\": 0.1},"
           "  \"values\": \"int8\"}, \"link\": {\"rateMbit\": 50}}}",
           name, cl, steps);
}

static nb_status_t submit(nb_rpc_client_t* cli, const char* signer, const char* doc, char* id_out,
                          size_t id_cap) {
  return gwt_submit_id(cli, g_dir, signer, doc, 0, 30000, id_out, id_cap);
}

static void read_hash(int i, const char* id, char* out, size_t cap) {
  char p[800];
  snprintf(p, sizeof p, "%s/%s/out/summary.json", g_cfg[i].work_dir, id);
  json_t* j = json_load_file(p, 0, NULL);
  assert_non_null(j);
  const char* h = json_string_value(json_object_get(j, "global_xxh3"));
  assert_non_null(h);
  snprintf(out, cap, "%s", h);
  json_decref(j);
}

/* Whether any process of group pg lives (zombies waiting for their reaper excluded). */
static int group_alive(pid_t pg) {
  return pg > 0 && nb_launcher_group_alive(pg);
}

static json_t* last_event(int i, const char* id, const char* kind, const char* needle);
static json_t* wait_report(int i, const char* id, int n, const char* const* clusters);
static void get_report(nb_rpc_client_t* cli, const char* id, char* out, size_t cap);

/* A 2-cluster job submitted at dc-a runs on both: succeeded at both, dc-b's events at dc-a, the
 * same final θ_global hash, the job secret in a 0600 file. */
/* Logs of job id through method at cli (Gateway/Logs or Federation/Logs), cluster's output
 * (NULL: the gateway's own) concatenated into out. Returns the call's status. */
static nb_status_t read_logs(nb_rpc_client_t* cli, const char* method, const char* id,
                             const char* cluster, char* out, size_t cap) {
  Nebula__V1__LogsRequest req = NEBULA__V1__LOGS_REQUEST__INIT;
  req.job_id = (char*)id;
  req.cluster = (char*)(cluster ? cluster : "");
  nb_rpc_stream_t* s = NULL;
  size_t len = 0;
  out[0] = 0;
  nb_status_t st = nb_rpc_stream_open(cli, method, 10000, 0, &s);
  if (st == NB_OK) st = nb_rpc_stream_send_pb(s, &req.base);
  if (st == NB_OK) st = nb_rpc_stream_close_send(s);
  while (st == NB_OK) {
    ProtobufCMessage* m = NULL;
    int end = 0;
    st = nb_rpc_stream_recv_pb(s, &nebula__v1__log_chunk__descriptor, &m, &end, NB_RPC_INFINITE);
    if (st != NB_OK || end) break;
    Nebula__V1__LogChunk* c = (Nebula__V1__LogChunk*)m;
    size_t k = c->data.len < cap - 1 - len ? c->data.len : cap - 1 - len;
    memcpy(out + len, c->data.data, k);
    len += k;
    out[len] = 0;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  if (st == NB_OK) st = nb_rpc_stream_finish(s);
  nb_rpc_stream_destroy(s);
  return st;
}

static void test_two_clusters(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-two", 1, 1, 8);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  gwt_wait_state(&g_cfg[1], id, NB_JOB_SUCCEEDED, 10);
  /* dc-b's progress and states are at the origin, tagged with the cluster */
  assert_true(gwt_count_events(&g_cfg[0], id, "progress", "\"cluster\":\"dc-b\"") >= 2);
  assert_true(gwt_count_events(&g_cfg[0], id, "progress", "\"source\":\"dc-a\"") >= 2);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "cluster_state", "\"to\":\"succeeded\""), 2);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "cluster_launch", "\"cluster\":\"dc-b\""), 1);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "launch", NULL), 1);
  char ha[64], hb[64];
  read_hash(0, id, ha, sizeof ha);
  read_hash(1, id, hb, sizeof hb);
  assert_string_equal(ha, hb);
  /* the run report at the origin covers both clusters, dc-b's files fetched from its gateway */
  const char* both[] = {"dc-a", "dc-b"};
  json_t* rs = wait_report(0, id, 2, both);
  assert_true(json_is_true(json_object_get(rs, "theta_global_identical")));
  for (size_t i = 0; i < 2; i++)
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(rs, "clusters"), i), "global_xxh3")),
                        ha);
  json_decref(rs);
  char p[800], rp[800];
  snprintf(p, sizeof p, "%s/%s/report", g_cfg[1].work_dir, id);
  assert_int_equal(access(p, F_OK), -1); /* only the origin writes one */
  get_report(cli, id, rp, sizeof rp);
  snprintf(p, sizeof p, "%s/%s/report/report.html", g_cfg[0].work_dir, id);
  assert_string_equal(rp, p);
  /* Get at the origin shows each cluster's part */
  Nebula__V1__GetRequest gr = NEBULA__V1__GET_REQUEST__INIT;
  gr.job_id = id;
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Get", &gr.base,
                                   &nebula__v1__job__descriptor, &rep, 10000, 0),
                   NB_OK);
  Nebula__V1__Job* j = (Nebula__V1__Job*)rep;
  assert_string_equal(j->state, "succeeded");
  assert_int_equal(j->n_clusters, 2);
  for (size_t i = 0; i < 2; i++) {
    assert_string_equal(j->clusters[i]->state, "succeeded");
    assert_int_equal(j->clusters[i]->workers, 1);
    assert_non_null(strstr(j->clusters[i]->endpoint, "127.0.0.1:"));
  }
  protobuf_c_message_free_unpacked(rep, NULL);
  /* the origin relays dc-b's output from dc-b's gateway; its own without --cluster */
  static char logs[1 << 16];
  assert_int_equal(read_logs(cli, "/nebula.v1.Gateway/Logs", id, "dc-b", logs, sizeof logs), NB_OK);
  assert_non_null(strstr(logs, "cluster dc-b (1 of 2)"));
  assert_int_equal(read_logs(cli, "/nebula.v1.Gateway/Logs", id, NULL, logs, sizeof logs), NB_OK);
  assert_non_null(strstr(logs, "cluster dc-a (0 of 2)"));
  assert_int_equal(read_logs(cli, "/nebula.v1.Gateway/Logs", id, "dc-x", logs, sizeof logs),
                   NB_ERR_NOT_FOUND);
  assert_non_null(strstr(nb_error_last(), "has no cluster 'dc-x'"));
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s/job.secret", g_cfg[1].work_dir, id);
  assert_int_equal(stat(p, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  assert_int_equal(sb.st_size, 32);
  /* the store that keeps the secret too, with its WAL */
  const char* sfx[] = {"", "-wal"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/jobs.db%s", g_cfg[1].work_dir, sfx[i]);
    if (stat(p, &sb) == 0) assert_int_equal(sb.st_mode & 0777, 0600);
  }
  /* the lifecycle in the gateways' log (both write to one file here), never the secret */
  char *msgs, *raw;
  size_t raw_len;
  read_gateway_log(&msgs, &raw, &raw_len);
  assert_line(msgs, "job ", id, " accepted from user 'alice': 2 clusters, 1 workers here", NULL);
  assert_line(msgs, "federation Propose to cluster 'dc-b' for job ", id, ": ok", NULL);
  assert_line(msgs, "job ", id, " proposed by dc-a for user alice", NULL);
  assert_line(msgs, "federation Commit to cluster 'dc-b' for job ", id, ": ok", NULL);
  assert_line(msgs, "federation Commit from cluster 'dc-a' for job ", id, ": ok", NULL);
  int launched = 0, finished = 0;
  char want[256];
  snprintf(want, sizeof want, "job %s launched: process ", id);
  for (const char* q = msgs; (q = strstr(q, want)); q++) launched++;
  snprintf(want, sizeof want, "job %s finished: ", id);
  for (const char* q = msgs; (q = strstr(q, want)); q++) finished++;
  assert_int_equal(launched, 2); /* one per cluster */
  assert_int_equal(finished, 2);
  assert_line(msgs, "job ", id, " finished: ", ", exit code 0, succeeded", NULL);
  assert_secret_not_logged(0, id, raw, raw_len);
  assert_secret_not_logged(1, id, raw, raw_len);
  free(msgs);
  free(raw);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* bob may run at dc-a but dc-b's ACL does not know him: Submit fails naming dc-b and why, the
 * job is failed at dc-a, nothing was launched anywhere and dc-b kept nothing. */
static void test_peer_refuses(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("bob", &tls, 0);
  char doc[4096];
  job_doc(doc, sizeof doc, "fed-refused", 1, 1, 8);
  assert_int_equal(submit(cli, "bob", doc, NULL, 0), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "cluster 'dc-b' refused the job"));
  assert_non_null(strstr(nb_error_last(), "user 'bob' is not in this gateway's ACL"));
  nb_job_store_t* st = gwt_open_store(&g_cfg[0]);
  nb_job_record_t* recs = NULL;
  size_t n = 0;
  assert_int_equal(nb_job_store_list(st, "bob", -1, &recs, &n), NB_OK);
  assert_int_equal(n, 1);
  assert_int_equal(recs[0].state, NB_JOB_FAILED);
  assert_non_null(strstr(recs[0].reason, "cluster 'dc-b' refused"));
  char id[128];
  snprintf(id, sizeof id, "%s", recs[0].id);
  nb_job_records_free(recs, n);
  nb_job_store_close(st);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "launch", NULL), 0);
  assert_int_equal(gwt_job_state(&g_cfg[1], id, NULL, 0), (nb_job_state_t)-1);
  /* a cluster that is not a peer of dc-a */
  char alien[4096];
  job_doc(alien, sizeof alien, "fed-alien", 1, 1, 8);
  char* b = strstr(alien, "\"dc-b\"");
  memcpy(b, "\"dc-c\"", 6);
  assert_int_equal(submit(cli, "bob", alien, NULL, 0), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "cluster 'dc-c', which is not a peer of gateway 'dc-a'"));
  char p[1200];
  snprintf(p, sizeof p, "%s/%s/out", g_cfg[0].work_dir, id);
  assert_int_equal(access(p, F_OK), -1);
  /* each refusal in the log with the caller's identity and the reason of
   * nebula_gateway_refusals_total, and the peer's side of it */
  char *msgs, *raw;
  size_t raw_len;
  read_gateway_log(&msgs, &raw, &raw_len);
  assert_line(msgs,
              "Submit refused: user 'bob': reason federation: ", "cluster 'dc-b' refused the job",
              NULL);
  assert_line(msgs, "Submit refused: user 'bob': reason unknown_cluster: ",
              "cluster 'dc-c', which is not a peer", NULL);
  assert_line(msgs, "federation Propose to cluster 'dc-b' for job ", id,
              ": NB_ERR_PERMISSION: ", NULL);
  free(msgs);
  free(raw);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* Cancel at the origin: every worker on both clusters is gone when Cancel answers. */
static void test_cancel(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-cancel", 1, 1, 200000);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  pid_t pa, pb;
  gwt_wait_launched(g_cfg, id, &pa, &pb);
  assert_true(group_alive(pa));
  assert_true(group_alive(pb));
  Nebula__V1__Job* j = gwt_cancel(cli, id, 30000);
  assert_string_equal(j->state, "cancelled");
  protobuf_c_message_free_unpacked(&j->base, NULL);
  assert_false(group_alive(pa));
  assert_false(group_alive(pb));
  assert_int_equal(gwt_job_state(&g_cfg[1], id, NULL, 0), NB_JOB_CANCELLED);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* Cancel at the origin while dc-b's gateway is down: cancelled at dc-a (its worker gone), the
 * call says dc-b is not reached yet; once dc-b's gateway is back the origin's retry stops dc-b's
 * worker too. */
static void test_cancel_peer_down(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-cancel-down", 1, 1, 200000);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  pid_t pa, pb;
  gwt_wait_launched(g_cfg, id, &pa, &pb);
  nb_gateway_destroy(g_gw[1]);
  g_gw[1] = NULL;
  Nebula__V1__CancelRequest cr = NEBULA__V1__CANCEL_REQUEST__INIT;
  cr.job_id = id;
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Cancel", &cr.base,
                                   &nebula__v1__job__descriptor, &rep, 30000, 0),
                   NB_ERR_UNAVAILABLE);
  assert_non_null(strstr(nb_error_last(), "not yet on every cluster"));
  assert_int_equal(gwt_job_state(&g_cfg[0], id, NULL, 0), NB_JOB_CANCELLED);
  assert_false(group_alive(pa));
  assert_true(group_alive(pb));
  assert_int_equal(nb_gateway_create(&g_cfg[1], &g_gw[1]), NB_OK);
  gwt_wait_state(&g_cfg[1], id, NB_JOB_CANCELLED, 30);
  for (int k = 0; k < 200 && group_alive(pb); k++) nb_sleep_ns(25000000);
  assert_false(group_alive(pb));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* dc-b's worker fails (its data folder is missing): the job fails at the origin naming dc-b, and
 * dc-a's worker, still waiting for its peer, is stopped. */
static void test_peer_fails(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  g_data_b = "no-data-here"; /* inside the job's folder, so allowed, and missing */
  job_doc(doc, sizeof doc, "fed-fails", 1, 1, 200000);
  g_data_b = NULL;
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[1], id, NB_JOB_FAILED, 30);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_FAILED, 30);
  nb_job_store_t* st = gwt_open_store(&g_cfg[0]);
  nb_job_record_t rec = {0};
  assert_int_equal(nb_job_store_get(st, id, &rec), NB_OK);
  assert_non_null(strstr(rec.reason, "cluster 'dc-b' failed: process"));
  nb_job_record_clear(&rec);
  nb_job_store_close(st);
  pid_t pa = gwt_event_pid(&g_cfg[0], id, "launch");
  assert_true(pa > 0);
  for (int k = 0; k < 200 && group_alive(pa); k++) nb_sleep_ns(25000000);
  assert_false(group_alive(pa));
  for (int k = 0;
       k < 200 && !gwt_count_events(&g_cfg[0], id, "cluster_state", "\"cluster\":\"dc-a\""); k++)
    nb_sleep_ns(25000000);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "cluster_state", "\"cluster\":\"dc-a\""), 1);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* Federation calls only from the cluster certificates of configured peers, each about its own
 * role in a job; artifacts only for clusters of a committed federated job. */
static void test_federation_auth(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-auth", 1, 0, 8);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK); /* a local job */
  Nebula__V1__ReportRequest rr = NEBULA__V1__REPORT_REQUEST__INIT;
  rr.job_id = id;
  rr.cluster = (char*)"dc-b";
  ProtobufCMessage* rep = NULL;
  /* a user certificate */
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Federation/Report", &rr.base,
                                   &nebula__v1__report_reply__descriptor, &rep, 10000, 0),
                   NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "the Federation API is for peer gateways"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  /* a cluster of the CA that is not a peer */
  cli = client_as("dc-c", &tls, 0);
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Federation/Report", &rr.base,
                                   &nebula__v1__report_reply__descriptor, &rep, 10000, 0),
                   NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "cluster 'dc-c' is not a peer of gateway 'dc-a'"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  /* the peer, about a job that is not federated, and claiming to be another cluster */
  cli = client_as("dc-b", &tls, 0);
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Federation/Report", &rr.base,
                                   &nebula__v1__report_reply__descriptor, &rep, 10000, 0),
                   NB_ERR_NOT_FOUND);
  rr.cluster = (char*)"dc-a";
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Federation/Report", &rr.base,
                                   &nebula__v1__report_reply__descriptor, &rep, 10000, 0),
                   NB_ERR_PERMISSION);
  /* the peer asking for the output of a job here that is not federated */
  static char logs[4096];
  assert_int_equal(read_logs(cli, "/nebula.v1.Federation/Logs", id, NULL, logs, sizeof logs),
                   NB_ERR_NOT_FOUND);
  /* the peer committing a job it is not the origin of */
  uint8_t secret[32] = {0};
  Nebula__V1__CommitRequest cr = NEBULA__V1__COMMIT_REQUEST__INIT;
  cr.job_id = id;
  cr.secret.data = secret;
  cr.secret.len = sizeof secret;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Federation/Commit", &cr.base,
                                   &nebula__v1__federation_ack__descriptor, &rep, 10000, 0),
                   NB_ERR_NOT_FOUND);
  nb_rpc_client_destroy(cli);
  /* an artifact of a job that is not federated cannot be fetched, whatever the secret */
  char target[64], dest[1200];
  snprintf(target, sizeof target, "127.0.0.1:%d", g_port[0]);
  snprintf(dest, sizeof dest, "%s/stolen", g_dir);
  nb_artifact_fetch_opts_t o = {.target = target,
                                .tls = tls,
                                .expected_cluster = "dc-a",
                                .job_id = id,
                                .secret = secret,
                                .name = "fed-auth/final.safetensors",
                                .dest = dest,
                                .timeout_ms = 10000};
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  assert_int_equal(access(dest, F_OK), -1);
  nb_tls_destroy(tls);
}

/* The attack: a member reported an event with a huge seq; the origin took it as acked, skipped
 * the member's real later events as already stored, and the job stayed running there forever.
 * The origin refuses a batch with a seq more than 1000 ahead of the last accepted one, or one
 * going backwards, tells the sender why, stores nothing, and the job ends normally. */
static void test_report_seq(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-seq", 1, 1, 8);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);

  cli = client_as("dc-b", &tls, 0); /* the member's own certificate */
  Nebula__V1__ReportEvent ev[2] = {NEBULA__V1__REPORT_EVENT__INIT, NEBULA__V1__REPORT_EVENT__INIT};
  Nebula__V1__ReportEvent* evp[2] = {&ev[0], &ev[1]};
  ev[0].kind = ev[1].kind = (char*)"progress";
  ev[0].payload_json = ev[1].payload_json = (char*)"{\"forged\": 1}";
  Nebula__V1__ReportRequest rr = NEBULA__V1__REPORT_REQUEST__INIT;
  rr.job_id = id;
  rr.cluster = (char*)"dc-b";
  rr.events = evp;
  ProtobufCMessage* rep = NULL;
  ev[0].seq = INT64_C(1) << 60;
  rr.n_events = 1;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Federation/Report", &rr.base,
                                   &nebula__v1__report_reply__descriptor, &rep, 10000, 0),
                   NB_ERR_INVALID);
  fprintf(stderr, "forged seq: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(), "INVALID_ARGUMENT"));
  assert_non_null(strstr(nb_error_last(), "is more than 1000 ahead of seq"));
  assert_non_null(strstr(nb_error_last(), "nothing stored"));
  /* within the gap but going backwards (a real 8-step job has far fewer than 400 events) */
  ev[0].seq = 500;
  ev[1].seq = 400;
  rr.n_events = 2;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Federation/Report", &rr.base,
                                   &nebula__v1__report_reply__descriptor, &rep, 10000, 0),
                   NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "event seq 400 does not follow seq 500"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);

  /* the member's real events still arrive: the job ends at the origin, nothing forged stored */
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "cluster_state", "\"to\":\"succeeded\""), 2);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "progress", "forged"), 0);
}

/* A member gateway stops mid-job and starts again: it re-attaches to its worker, reports the rest
 * and the job ends succeeded at the origin. */
static void test_member_restart(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-mrestart", 1, 1, 160);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
  for (int k = 0; k < 400 && !gwt_event_pid(&g_cfg[1], id, "launch"); k++) nb_sleep_ns(25000000);
  nb_gateway_destroy(g_gw[1]);
  g_gw[1] = NULL;
  nb_sleep_ns(1000000000LL);
  assert_int_equal(nb_gateway_create(&g_cfg[1], &g_gw[1]), NB_OK);
  gwt_wait_state(&g_cfg[1], id, NB_JOB_SUCCEEDED, 60);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 30);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "cluster_state", "\"to\":\"succeeded\""), 2);
}

/* The origin gateway stops mid-job and starts again: the job is still followed, dc-b's reports
 * (retried meanwhile) arrive, and it ends succeeded at both. */
static void test_origin_restart(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-restart", 1, 1, 160);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  nb_rpc_client_destroy(cli);
  for (int k = 0; k < 400 && !gwt_event_pid(&g_cfg[1], id, "launch"); k++) nb_sleep_ns(25000000);
  nb_gateway_destroy(g_gw[0]);
  g_gw[0] = NULL;
  nb_sleep_ns(1500000000LL);
  assert_int_equal(gwt_job_state(&g_cfg[0], id, NULL, 0), NB_JOB_RUNNING);
  assert_int_equal(nb_gateway_create(&g_cfg[0], &g_gw[0]), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  gwt_wait_state(&g_cfg[1], id, NB_JOB_SUCCEEDED, 10);
  for (int k = 0;
       k < 100 && gwt_count_events(&g_cfg[0], id, "cluster_state", "\"to\":\"succeeded\"") < 2; k++)
    nb_sleep_ns(20000000);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "cluster_state", "\"to\":\"succeeded\""), 2);
  assert_true(gwt_count_events(&g_cfg[0], id, "progress", "\"cluster\":\"dc-b\"") >= 6);
  char ha[64], hb[64];
  read_hash(0, id, ha, sizeof ha);
  read_hash(1, id, hb, sizeof hb);
  assert_string_equal(ha, hb);
  /* the restarted origin still writes the run report */
  const char* both[] = {"dc-a", "dc-b"};
  json_t* rs = wait_report(0, id, 2, both);
  assert_true(json_is_true(json_object_get(rs, "theta_global_identical")));
  json_decref(rs);
  nb_tls_destroy(tls);
}

/* A job naming dc-b only, submitted at dc-a: forwarded, runs at dc-b (`nebula train`), followed
 * at dc-a, where nothing runs. */
static void test_forward(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[4096], id[128];
  job_doc(doc, sizeof doc, "fed-forward", 0, 1, 8);
  assert_int_equal(submit(cli, "alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  assert_int_equal(gwt_job_state(&g_cfg[1], id, NULL, 0), NB_JOB_SUCCEEDED);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "launch", NULL), 0);
  assert_int_equal(gwt_count_events(&g_cfg[1], id, "launch", NULL), 1);
  assert_true(gwt_count_events(&g_cfg[0], id, "progress", "\"cluster\":\"dc-b\"") >= 1);
  char p[800];
  snprintf(p, sizeof p, "%s/%s/out", g_cfg[0].work_dir, id);
  assert_int_equal(access(p, F_OK), -1);
  /* the report at dc-a: dc-b's `nebula train` run, fetched from dc-b */
  const char* only_b[] = {"dc-b"};
  json_t* rs = wait_report(0, id, 1, only_b);
  json_decref(rs);
  char rp[800];
  get_report(cli, id, rp, sizeof rp);
  assert_non_null(strstr(rp, "/report/report.html"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* The last payload of an event of `kind` at gateway i containing needle, parsed (NULL if none). */
static json_t* last_event(int i, const char* id, const char* kind, const char* needle) {
  nb_job_store_t* st = gwt_open_store(&g_cfg[i]);
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  json_t* j = NULL;
  if (nb_job_store_events(st, id, 0, 0, &ev, &n) == NB_OK) {
    for (size_t k = 0; k < n; k++) {
      if (strcmp(ev[k].kind, kind) || (needle && !strstr(ev[k].payload, needle))) continue;
      json_decref(j);
      j = json_loads(ev[k].payload, 0, NULL);
    }
  }
  nb_job_events_free(ev, n);
  nb_job_store_close(st);
  return j;
}

/* Waits for the run report of job id at gateway i (its "report" event) and checks it: the
 * event's path, report.html with the clusters' names and charts, report/<cluster>/ holding each
 * cluster's rounds.tsv and summary.json, and summary.json naming exactly `clusters` in order.
 * Returns the parsed summary.json (the caller decrefs). */
static json_t* wait_report(int i, const char* id, int n, const char* const* clusters) {
  json_t* ev = NULL;
  for (int k = 0; k < 600 && !ev; k++) {
    ev = last_event(i, id, "report", NULL);
    if (!ev) nb_sleep_ns(50000000);
  }
  if (!ev) {
    json_t* f = last_event(i, id, "report_failed", NULL);
    fail_msg("no run report for %s at %s: %s", id, g_ids[i],
             f ? json_string_value(json_object_get(f, "reason")) : "(no report_failed event)");
  }
  char dir[800], p[900];
  snprintf(dir, sizeof dir, "%s/%s/report", g_cfg[i].work_dir, id);
  snprintf(p, sizeof p, "%s/report.html", dir);
  assert_string_equal(json_string_value(json_object_get(ev, "path")), p);
  assert_int_equal((int)json_array_size(json_object_get(ev, "clusters")), n);
  json_decref(ev);
  FILE* f = fopen(p, "r");
  assert_non_null(f);
  static char html[1 << 20];
  size_t len = fread(html, 1, sizeof html - 1, f);
  html[len] = 0;
  fclose(f);
  assert_non_null(strstr(html, "<svg"));
  for (int c = 0; c < n; c++) {
    assert_non_null(strstr(html, clusters[c]));
    const char* files[] = {"rounds.tsv", "summary.json"};
    for (int k = 0; k < 2; k++) {
      snprintf(p, sizeof p, "%s/%s/%s", dir, clusters[c], files[k]);
      assert_int_equal(access(p, R_OK), 0);
    }
  }
  snprintf(p, sizeof p, "%s/summary.json", dir);
  json_t* s = json_load_file(p, 0, NULL);
  assert_non_null(s);
  json_t* cl = json_object_get(s, "clusters");
  assert_int_equal((int)json_array_size(cl), n);
  for (int c = 0; c < n; c++) {
    json_t* e = json_array_get(cl, (size_t)c);
    assert_string_equal(json_string_value(json_object_get(e, "cluster")), clusters[c]);
    assert_true(json_integer_value(json_object_get(e, "rounds")) >= 1);
  }
  return s;
}

/* Get's report path for job id ("" when none). */
static void get_report(nb_rpc_client_t* cli, const char* id, char* out, size_t cap) {
  Nebula__V1__GetRequest gr = NEBULA__V1__GET_REQUEST__INIT;
  gr.job_id = (char*)id;
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Get", &gr.base,
                                   &nebula__v1__job__descriptor, &rep, 10000, 0),
                   NB_OK);
  snprintf(out, cap, "%s", ((Nebula__V1__Job*)rep)->report);
  protobuf_c_message_free_unpacked(rep, NULL);
}

/* The remote fine-tune: a model pretrained at dc-a becomes an artifact there; a LoRA job for
 * dc-b submitted at dc-a names it (cluster dc-a, pinned by hash); dc-b fetches it by hash
 * before launch, trains from it, and its outputs become artifacts at dc-b. */
static void test_remote_finetune(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client_as("alice", &tls, 0);
  char doc[8192], pre[128], tune[128];
  job_doc(doc, sizeof doc, "fed-pre", 1, 0, 8);
  assert_int_equal(submit(cli, "alice", doc, pre, sizeof pre), NB_OK);
  gwt_wait_state(&g_cfg[0], pre, NB_JOB_SUCCEEDED, 60);
  json_t* art = NULL;
  for (int k = 0; k < 200 && !art; k++) {
    art = last_event(0, pre, "artifact", "\"alice/fed-pre/final.safetensors\"");
    if (!art) nb_sleep_ns(25000000);
  }
  assert_non_null(art);
  char hash[80];
  snprintf(hash, sizeof hash, "%s", json_string_value(json_object_get(art, "sha256")));
  json_decref(art);
  assert_int_equal(strlen(hash), 64);
  snprintf(doc, sizeof doc,
           "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
           "\"fed-tune\"}, \"spec\": {\"task\": \"pretrain\", \"clusters\": [{\"id\": \"dc-b\", "
           "\"workers\": 1, \"data\": {\"tier\": \"quick\", \"dir\": \"%s\", \"languages\": "
           "[\"en\", \"ru\"]}}],"
           " \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, \"context\": 32,"
           "  \"base\": {\"checkpoint\": \"fed-pre/final.safetensors\", \"cluster\": \"dc-a\","
           "  \"sha256\": \"%s\"}},"
           " \"training\": {\"seed\": 7, \"batchSize\": 4, \"maxSteps\": 8,"
           "  \"eval\": {\"batches\": 1}, \"optimizer\": {\"lr\": 0.003, \"warmupSteps\": 2},"
           "  \"lora\": {\"rank\": 4, \"alpha\": 8}}}}",
           g_data, hash);
  assert_int_equal(submit(cli, "alice", doc, tune, sizeof tune), NB_OK);
  gwt_wait_state(&g_cfg[0], tune, NB_JOB_SUCCEEDED, 60);
  assert_int_equal(gwt_job_state(&g_cfg[1], tune, NULL, 0), NB_JOB_SUCCEEDED);
  /* fetched by hash at dc-b, before its launch; reported to the origin */
  json_t* f = last_event(1, tune, "fetch", NULL);
  assert_non_null(f);
  assert_string_equal(json_string_value(json_object_get(f, "sha256")), hash);
  assert_string_equal(json_string_value(json_object_get(f, "from")), "dc-a");
  json_decref(f);
  assert_int_equal(gwt_count_events(&g_cfg[0], tune, "cluster_fetch", hash), 1);
  char p[1200];
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s/fed-pre/final.safetensors", g_cfg[1].work_dir, tune);
  assert_int_equal(stat(p, &sb), 0);
  assert_true(sb.st_size > 1000);
  /* nothing ran at dc-a for it; dc-b's outputs are artifacts there, announced to the origin */
  assert_int_equal(gwt_count_events(&g_cfg[0], tune, "launch", NULL), 0);
  for (int k = 0;
       k < 200 && !gwt_count_events(&g_cfg[0], tune, "cluster_artifact", "fed-tune/final"); k++)
    nb_sleep_ns(25000000);
  assert_int_equal(
      gwt_count_events(&g_cfg[0], tune, "cluster_artifact", "\"alice/fed-tune/final.safetensors\""),
      1);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* Artifacts are owned per user: alice and bob each pretrain a job named "dup-pre" at dc-a. A
 * fine-tune of alice's for dc-b that names "dup-pre/final.safetensors" trains from alice's model,
 * never bob's; naming bob's model by its full name, or pinning its hash, is refused before
 * anything runs, with the reason from dc-a. */
static void finetune_doc(char* doc, size_t cap, const char* name, const char* base,
                         const char* sha) {
  char pin[128] = "";
  if (sha) snprintf(pin, sizeof pin, ", \"sha256\": \"%s\"", sha);
  snprintf(doc, cap,
           "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
           "\"%s\"}, \"spec\": {\"task\": \"pretrain\", \"clusters\": [{\"id\": \"dc-b\", "
           "\"workers\": 1, \"data\": {\"tier\": \"quick\", \"dir\": \"%s\", \"languages\": "
           "[\"en\", \"ru\"]}}],"
           " \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, \"context\": 32,"
           "  \"base\": {\"checkpoint\": \"%s\", \"cluster\": \"dc-a\"%s}},"
           " \"training\": {\"seed\": 7, \"batchSize\": 4, \"maxSteps\": 4,"
           "  \"eval\": {\"batches\": 1}, \"optimizer\": {\"lr\": 0.003, \"warmupSteps\": 1}}}}",
           name, g_data, base, pin);
}

static void pretrain_hash(nb_rpc_client_t* cli, const char* user, long steps, char* hash,
                          size_t cap) {
  char doc[8192], id[128], needle[128];
  job_doc(doc, sizeof doc, "dup-pre", 1, 0, steps);
  assert_int_equal(submit(cli, user, doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  snprintf(needle, sizeof needle, "\"%s/dup-pre/final.safetensors\"", user);
  json_t* art = NULL;
  for (int k = 0; k < 200 && !art; k++) {
    art = last_event(0, id, "artifact", needle);
    if (!art) nb_sleep_ns(25000000);
  }
  assert_non_null(art);
  snprintf(hash, cap, "%s", json_string_value(json_object_get(art, "sha256")));
  json_decref(art);
  assert_int_equal(strlen(hash), 64);
}

static void test_artifact_owners(void** state) {
  (void)state;
  nb_tls_t *ta = NULL, *tb = NULL;
  nb_rpc_client_t* alice = client_as("alice", &ta, 0);
  nb_rpc_client_t* bob = client_as("bob", &tb, 0);
  char h_alice[80], h_bob[80], doc[8192], id[128];
  pretrain_hash(bob, "bob", 6, h_bob, sizeof h_bob); /* other steps: other bytes */
  pretrain_hash(alice, "alice", 4, h_alice, sizeof h_alice);
  assert_string_not_equal(h_alice, h_bob);
  /* the same name, two owners: alice's unpinned fine-tune gets her own model */
  finetune_doc(doc, sizeof doc, "own-tune", "dup-pre/final.safetensors", NULL);
  assert_int_equal(submit(alice, "alice", doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  json_t* f = last_event(1, id, "fetch", NULL);
  assert_non_null(f);
  assert_string_equal(json_string_value(json_object_get(f, "sha256")), h_alice);
  json_decref(f);
  /* bob's model by its full name: refused by dc-a, nothing launched at dc-b */
  finetune_doc(doc, sizeof doc, "steal-name", "bob/dup-pre/final.safetensors", NULL);
  assert_int_not_equal(submit(alice, "alice", doc, id, sizeof id), NB_OK);
  fprintf(stderr, "refused: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(),
                         "no artifact 'bob/dup-pre/final.safetensors' in the "
                         "namespace of user 'alice'"));
  /* bob's model by its hash */
  finetune_doc(doc, sizeof doc, "steal-hash", "dup-pre/final.safetensors", h_bob);
  assert_int_not_equal(submit(alice, "alice", doc, id, sizeof id), NB_OK);
  fprintf(stderr, "refused: %s\n", nb_error_last());
  char want[200];
  snprintf(want, sizeof want, "no artifact sha256:%s that job", h_bob);
  assert_non_null(strstr(nb_error_last(), want));
  /* bob's model never reached dc-b */
  char p[1200];
  DIR* d = opendir(g_cfg[1].work_dir);
  struct dirent* e;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, "steal-", 6)) continue;
    snprintf(p, sizeof p, "%s/%s/dup-pre/final.safetensors", g_cfg[1].work_dir, e->d_name);
    assert_int_equal(access(p, F_OK), -1);
  }
  if (d) closedir(d);
  nb_rpc_client_destroy(alice);
  nb_rpc_client_destroy(bob);
  nb_tls_destroy(ta);
  nb_tls_destroy(tb);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NEBULA DATA_DIR\n", argv[0]);
    return 2;
  }
  static char nebula[PATH_MAX];
  if (!realpath(argv[1], nebula)) {
    fprintf(stderr, "%s: %s\n", argv[1], strerror(errno));
    return 2;
  }
  g_nebula = nebula;
  char data[PATH_MAX];
  if (!realpath(argv[2], data) || strlen(data) >= sizeof g_data) {
    fprintf(stderr, "%s: %s\n", argv[2], strerror(errno));
    return 2;
  }
  memcpy(g_data, data, strlen(data) + 1); /* length checked above */
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_two_clusters, setup_logged, teardown_logged),
      cmocka_unit_test_setup_teardown(test_peer_refuses, setup_logged, teardown_logged),
      cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel_peer_down, setup, teardown),
      cmocka_unit_test_setup_teardown(test_peer_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_federation_auth, setup, teardown),
      cmocka_unit_test_setup_teardown(test_report_seq, setup, teardown),
      cmocka_unit_test_setup_teardown(test_origin_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_member_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_forward, setup, teardown),
      cmocka_unit_test_setup_teardown(test_remote_finetune, setup, teardown),
      cmocka_unit_test_setup_teardown(test_artifact_owners, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
