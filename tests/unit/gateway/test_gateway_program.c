/* Gateway jobs that run the user's own program (spec.program) instead of the built-in worker:
 * two in-process gateways (dc-a with the local launcher, dc-b with mpirun) over mutual TLS on
 * loopback, the program a small C one on libnebula (user_program.c). A job of dc-a only, a
 * two-cluster job (the same θ_global on both, progress of both at the origin), a program that
 * exits 3 (the job failed with that code), cancel (its processes gone), and a command outside
 * the allowed roots (refused at Submit). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "gateway/gateway.h"
#include "gateway/launcher.h"
#include "gateway/store.h"
#include "inter/rpc.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/tls.h"
#include "tests/lib/gw_testlib.h"

static char g_dir[256];
static char g_prog[1024];     /* the user program, absolute */
static char g_prog_dir[1024]; /* its folder: the gateways' paths.allow */
static int g_port[2];
static nb_gateway_config_t g_cfg[2];
static nb_gateway_t* g_gw[2];
static const char* g_ids[2] = {"dc-a", "dc-b"};

/* dc-a runs jobs with the local launcher, dc-b with mpirun; both allow the program's folder. */
static void make_config(int i) {
  char cfg[8192];
  snprintf(cfg, sizeof cfg,
           "{\"cluster_id\": \"%s\", \"listen\": \"127.0.0.1:%d\",\n"
           " \"tls\": {\"ca\": \"ca.crt\", \"cert\": \"%s.crt\", \"key\": \"%s.key\"},\n"
           " \"peers\": {\"%s\": \"127.0.0.1:%d\"}, \"launcher\": \"%s\",\n"
           " \"resources\": {\"slots\": 4}, \"work_dir\": \"work-%s\",\n"
           " \"acl\": [{\"user\": \"alice\"}], \"paths\": {\"allow\": [\"%s\"]},\n"
           " \"federation_timeout_ms\": 5000, \"cancel_grace_ms\": 2000, \"poll_ms\": 20}",
           g_ids[i], g_port[i], g_ids[i], g_ids[i], g_ids[1 - i], g_port[1 - i],
           i == 0 ? "local" : "mpirun", g_ids[i], g_prog_dir);
  gwt_parse_config(g_dir, cfg, &g_cfg[i]);
}

static int setup(void** state) {
  (void)state;
  gwt_make_dir(g_dir, sizeof g_dir, "nb_prog");
  const char* users[] = {"alice"};
  gwt_make_pki(g_dir, g_ids, 2, users, 1, NULL, NULL);
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

static nb_rpc_client_t* client(nb_tls_t** tls_out) {
  return gwt_client(g_dir, "alice", g_port[0], tls_out);
}

/* A job running the user program on dc-a (and dc-b when both), with extra words after it. */
static void job_doc(char* buf, size_t cap, const char* name, int both, const char* command) {
  snprintf(buf, cap,
           "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\", \"metadata\": {\"name\": "
           "\"%s\"}, \"spec\": {\"clusters\": [{\"id\": \"dc-a\"}%s],"
           " \"program\": {\"command\": [%s], \"workDir\": \"run\"},"
           " \"sync\": {\"innerSteps\": 8, \"outer\": {\"lr\": 0.5, \"momentum\": 0.5}},"
           " \"compression\": {\"density\": {\"initial\": 0.05}, \"values\": \"fp16\"}}}",
           name, both ? ", {\"id\": \"dc-b\", \"workers\": 2}" : "", command);
}

static nb_status_t submit(nb_rpc_client_t* cli, const char* doc, char* id_out, size_t id_cap) {
  return gwt_submit_id(cli, g_dir, "alice", doc, 0, 30000, id_out, id_cap);
}

/* A file of the job's folder at gateway i, read whole (static buffer). */
static const char* job_file(int i, const char* id, const char* name) {
  static char buf[1 << 17];
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

/* "global XXXX" of the leader's output at gateway i, into out. */
static void global_hash(int i, const char* id, char* out, size_t cap) {
  const char* log = job_file(i, id, "stdout.log");
  const char* g = strstr(log, "global ");
  assert_non_null(g);
  snprintf(out, cap, "%.16s", g + 7);
}

static char g_cmd[1200];

/* One cluster: the program sees its session in NEBULA_*, runs in its workDir, its output is the
 * job's log, its rounds are progress events, exit 0 is succeeded. */
static void test_one_cluster(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client(&tls);
  char doc[8192], id[128];
  snprintf(g_cmd, sizeof g_cmd, "\"%s\", \"--rounds\", \"3\"", g_prog);
  job_doc(doc, sizeof doc, "prog-one", 0, g_cmd);
  assert_int_equal(submit(cli, doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 30);
  char want[PATH_MAX + 200];
  const char* log = job_file(0, id, "stdout.log");
  snprintf(want, sizeof want, "env NEBULA_JOB_ID=%s\n", id);
  assert_non_null(strstr(log, want));
  assert_non_null(strstr(log, "env NEBULA_CLUSTER_ID=dc-a\n"));
  assert_non_null(strstr(log, "env NEBULA_N_CLUSTERS=1\n"));
  assert_non_null(strstr(log, "env NEBULA_CLUSTER_INDEX=0\n"));
  assert_non_null(strstr(log, "env NEBULA_PEERS=\n"));
  assert_non_null(strstr(log, "env NEBULA_LISTEN=127.0.0.1:"));
  assert_non_null(strstr(log, "env NEBULA_INNER_STEPS=8\n"));
  assert_non_null(strstr(log, "env NEBULA_OUTER_LR=0.5\n"));
  assert_non_null(strstr(log, "env NEBULA_OUTER_MOMENTUM=0.5\n"));
  assert_non_null(strstr(log, "env NEBULA_DENSITY=0.05\n"));
  assert_non_null(strstr(log, "env NEBULA_VALUES=fp16\n"));
  assert_non_null(strstr(log, "env NEBULA_PKI_DIR="));
  assert_non_null(strstr(log, "/job.secret\n"));
  assert_non_null(strstr(log, "secret file mode 600 size 32\n"));
  snprintf(want, sizeof want, "cwd %s/%s/run\n", g_cfg[0].work_dir, id);
  char real[PATH_MAX];
  if (realpath(g_cfg[0].work_dir, real)) snprintf(want, sizeof want, "cwd %s/%s/run\n", real, id);
  assert_non_null(strstr(log, want));
  assert_non_null(strstr(log, "done 3 rounds, global "));
  /* the secret's bytes are nowhere in what the program was given */
  assert_null(strstr(log, "NEBULA_JOB_SECRET="));
  /* each round is a progress event through the session; no run report of the built-in model */
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "progress", "\"source\":\"dc-a\""), 3);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "progress", "\"round\":3"), 1);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "report", NULL), 0);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "report_failed", NULL), 0);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "exit", "\"exit_code\":0"), 1);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* Two clusters: dc-a (local) and dc-b (mpirun, 2 ranks) agree through their gateways on the
 * exchange endpoints, reach each other, and hold the same θ_global; dc-b's rounds and state
 * reach the origin. */
static void test_two_clusters(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client(&tls);
  char doc[8192], id[128];
  snprintf(g_cmd, sizeof g_cmd, "\"%s\", \"--rounds\", \"4\"", g_prog);
  job_doc(doc, sizeof doc, "prog-two", 1, g_cmd);
  assert_int_equal(submit(cli, doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_SUCCEEDED, 60);
  gwt_wait_state(&g_cfg[1], id, NB_JOB_SUCCEEDED, 10);
  char ha[32], hb[32];
  global_hash(0, id, ha, sizeof ha);
  global_hash(1, id, hb, sizeof hb);
  assert_string_equal(ha, hb);
  const char* la = job_file(0, id, "stdout.log");
  assert_non_null(strstr(la, "env NEBULA_N_CLUSTERS=2\n"));
  assert_non_null(strstr(la, "env NEBULA_CLUSTER_INDEX=0\n"));
  assert_non_null(strstr(la, "env NEBULA_PEERS=dc-b=127.0.0.1:"));
  const char* lb = job_file(1, id, "stdout.log");
  /* under mpirun every rank gets the session's environment; rank 0 leads */
  assert_non_null(strstr(lb, "rank 0 env NEBULA_CLUSTER_INDEX=1\n"));
  assert_non_null(strstr(lb, "rank 1 env NEBULA_CLUSTER_INDEX=1\n"));
  assert_non_null(strstr(lb, "rank 1 env NEBULA_PEERS=dc-a=127.0.0.1:"));
  assert_non_null(strstr(lb, "rank 1 secret file mode 600 size 32\n"));
  assert_non_null(strstr(lb, "done 4 rounds"));
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "progress", "\"cluster\":\"dc-b\""), 4);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "progress", "\"source\":\"dc-a\""), 4);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "cluster_state", "\"to\":\"succeeded\""), 2);
  assert_int_equal(gwt_count_events(&g_cfg[1], id, "exit", "\"ranks\":[0,0]"), 1);
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "report", NULL), 0);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* A program that exits 3: the job failed, the reason and the exit event say 3, its stderr is in
 * the job's log. */
static void test_exit_code(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client(&tls);
  char doc[8192], id[128], why[1024];
  snprintf(g_cmd, sizeof g_cmd, "\"%s\", \"--exit\", \"3\"", g_prog);
  job_doc(doc, sizeof doc, "prog-fails", 0, g_cmd);
  assert_int_equal(submit(cli, doc, id, sizeof id), NB_OK);
  gwt_wait_state(&g_cfg[0], id, NB_JOB_FAILED, 30);
  gwt_job_state(&g_cfg[0], id, why, sizeof why);
  assert_non_null(strstr(why, "exited with code 3"));
  assert_int_equal(gwt_count_events(&g_cfg[0], id, "exit", "\"exit_code\":3"), 1);
  assert_non_null(strstr(job_file(0, id, "stderr.log"), "exiting with 3 as asked"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* Cancel of a two-cluster program job at the origin: both clusters' processes are gone when it
 * answers. */
static void test_cancel(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client(&tls);
  char doc[8192], id[128];
  snprintf(g_cmd, sizeof g_cmd, "\"%s\", \"--sleep\", \"600\"", g_prog);
  job_doc(doc, sizeof doc, "prog-cancel", 1, g_cmd);
  assert_int_equal(submit(cli, doc, id, sizeof id), NB_OK);
  pid_t pa, pb;
  gwt_wait_launched(g_cfg, id, &pa, &pb);
  Nebula__V1__Job* j = gwt_cancel(cli, id, 30000);
  assert_string_equal(j->state, "cancelled");
  protobuf_c_message_free_unpacked(&j->base, NULL);
  assert_false(nb_launcher_group_alive(pa));
  assert_false(nb_launcher_group_alive(pb));
  assert_int_equal(gwt_job_state(&g_cfg[1], id, NULL, 0), NB_JOB_CANCELLED);
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

/* A program outside the job's folder and paths.allow is refused at Submit, naming the field. */
static void test_refused_path(void** state) {
  (void)state;
  nb_tls_t* tls = NULL;
  nb_rpc_client_t* cli = client(&tls);
  char doc[8192];
  job_doc(doc, sizeof doc, "prog-refused", 0, "\"/bin/sh\", \"-c\", \"id\"");
  assert_int_equal(submit(cli, doc, NULL, 0), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "$.spec.program.command[0]: \"/bin/sh\" is outside"));
  job_doc(doc, sizeof doc, "prog-refused", 0, "\"sh\", \"-c\", \"id\"");
  char* wd = strstr(doc, "\"run\"");
  assert_non_null(wd);
  memcpy(wd, "\"/tm\"", 5);
  assert_int_equal(submit(cli, doc, NULL, 0), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "$.spec.program.workDir"));
  nb_rpc_client_destroy(cli);
  nb_tls_destroy(tls);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s USER_PROGRAM\n", argv[0]);
    return 2;
  }
  char prog[PATH_MAX];
  if (!realpath(argv[1], prog) || strlen(prog) >= sizeof g_prog) {
    fprintf(stderr, "%s: %s\n", argv[1], strerror(errno));
    return 2;
  }
  memcpy(g_prog, prog, strlen(prog) + 1);
  snprintf(g_prog_dir, sizeof g_prog_dir, "%s", g_prog);
  char* slash = strrchr(g_prog_dir, '/');
  if (slash) *slash = 0;
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_cluster, setup, teardown),
      cmocka_unit_test_setup_teardown(test_two_clusters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exit_code, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refused_path, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
