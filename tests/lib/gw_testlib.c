/* See gw_testlib.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "security/pki.h"
#include "security/sign.h"
#include "tests/lib/gw_testlib.h"

void gwt_make_dir(char* dir, size_t cap, const char* prefix) {
  const char* t = getenv("TMPDIR");
  snprintf(dir, cap, "%s/%s.XXXXXX", t && *t ? t : "/tmp", prefix);
  assert_non_null(mkdtemp(dir));
}

static int rm_one(const char* p, const struct stat* sb, int f, struct FTW* ftw) {
  (void)sb, (void)f, (void)ftw;
  return remove(p);
}

void gwt_remove_dir(const char* dir) {
  nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void gwt_reap(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int gwt_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr*)&a, sizeof a), 0);
  socklen_t l = sizeof a;
  assert_int_equal(getsockname(fd, (struct sockaddr*)&a, &l), 0);
  close(fd);
  return ntohs(a.sin_port);
}

void gwt_parse_config(const char* dir, const char* json, nb_gateway_config_t* cfg) {
  nb_gateway_config_defaults(cfg);
  assert_int_equal(nb_gateway_config_parse(json, strlen(json), dir, cfg), NB_OK);
}

/* The gateways a failed wait describes (gwt_start_pair's pair; else only the one waited on). */
static const nb_gateway_config_t* gwt_known[2];

void gwt_start_pair(int port[2], nb_gateway_config_t cfg[2], nb_gateway_t* gw[2],
                    void (*make_config)(int i)) {
  gwt_known[0] = &cfg[0];
  gwt_known[1] = &cfg[1];
  port[0] = gwt_free_port();
  port[1] = gwt_free_port();
  for (int i = 0; i < 2; i++) {
    make_config(i);
    assert_int_equal(nb_gateway_create(&cfg[i], &gw[i]), NB_OK);
  }
}

void gwt_stop_pair(nb_gateway_t* gw[2]) {
  gwt_known[0] = gwt_known[1] = NULL;
  for (int i = 0; i < 2; i++) {
    nb_gateway_destroy(gw[i]);
    gw[i] = NULL;
  }
}

void gwt_write_pair(const char* dir, EVP_PKEY* k, X509* c, const char* name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s.key", dir, name);
  assert_int_equal(nb_pki_key_write(p, k, 1), NB_OK);
  snprintf(p, sizeof p, "%s/%s.crt", dir, name);
  assert_int_equal(nb_pki_cert_write(p, c, 1), NB_OK);
  EVP_PKEY_free(k);
  X509_free(c);
}

void gwt_make_pki(const char* dir, const char* const* clusters, int n_clusters,
                  const char* const* users, int n_users, EVP_PKEY** ca_key_out, X509** ca_out) {
  EVP_PKEY *ca_key, *k;
  X509 *ca, *c;
  assert_int_equal(nb_pki_ca_create(NULL, 0, &ca_key, &ca), NB_OK);
  const char* sans[] = {"IP:127.0.0.1"};
  for (int i = 0; i < n_clusters; i++) {
    nb_pki_issue_opts_t o = {
        .kind = NB_PKI_CLUSTER, .name = clusters[i], .sans = sans, .n_sans = 1};
    assert_int_equal(nb_pki_cert_issue(ca_key, ca, &o, &k, &c), NB_OK);
    gwt_write_pair(dir, k, c, clusters[i]);
  }
  for (int i = 0; i < n_users; i++) {
    nb_pki_issue_opts_t u = {.kind = NB_PKI_USER, .name = users[i]};
    assert_int_equal(nb_pki_cert_issue(ca_key, ca, &u, &k, &c), NB_OK);
    gwt_write_pair(dir, k, c, users[i]);
  }
  char p[512];
  snprintf(p, sizeof p, "%s/ca.crt", dir);
  assert_int_equal(nb_pki_cert_write(p, ca, 1), NB_OK);
  if (ca_key_out && ca_out) {
    *ca_key_out = ca_key;
    *ca_out = ca;
  } else {
    EVP_PKEY_free(ca_key);
    X509_free(ca);
  }
}

nb_rpc_client_t* gwt_client(const char* dir, const char* user, int port, nb_tls_t** tls_out) {
  char ca[512], crt[512], key[512], target[64];
  snprintf(ca, sizeof ca, "%s/ca.crt", dir);
  snprintf(crt, sizeof crt, "%s/%s.crt", dir, user);
  snprintf(key, sizeof key, "%s/%s.key", dir, user);
  nb_tls_files_t f = {ca, crt, key};
  assert_int_equal(nb_tls_create(&f, tls_out), NB_OK);
  nb_rpc_client_opts_t o = {0};
  o.tls = *tls_out;
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(target, &o, &cli), NB_OK);
  return cli;
}

nb_status_t gwt_submit(nb_rpc_client_t* cli, const char* dir, const char* signer, const char* doc,
                       int tamper, int64_t timeout_ms, Nebula__V1__Job** out) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s.key", dir, signer);
  EVP_PKEY* key = NULL;
  assert_int_equal(nb_pki_key_load(p, &key), NB_OK);
  uint8_t* sig = NULL;
  size_t sig_len = 0;
  assert_int_equal(nb_sign_data(key, doc, strlen(doc), &sig, &sig_len), NB_OK);
  EVP_PKEY_free(key);
  snprintf(p, sizeof p, "%s/%s.crt", dir, signer);
  FILE* f = fopen(p, "r");
  assert_non_null(f);
  char pem[8192] = {0};
  assert_true(fread(pem, 1, sizeof pem - 1, f) > 0);
  fclose(f);
  char* body = strdup(doc);
  assert_non_null(body);
  if (tamper) body[strlen(body) - 20] ^= 1;
  Nebula__V1__SubmitRequest req = NEBULA__V1__SUBMIT_REQUEST__INIT;
  req.descriptor.data = (uint8_t*)body;
  req.descriptor.len = strlen(body);
  req.signature.data = sig;
  req.signature.len = sig_len;
  req.cert_pem = pem;
  ProtobufCMessage* rep = NULL;
  nb_status_t st = nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Submit", &req.base,
                                   &nebula__v1__job__descriptor, &rep, timeout_ms, 0);
  free(body);
  nb_free(sig);
  if (out)
    *out = (Nebula__V1__Job*)rep;
  else if (rep)
    protobuf_c_message_free_unpacked(rep, NULL);
  return st;
}

nb_status_t gwt_submit_id(nb_rpc_client_t* cli, const char* dir, const char* signer,
                          const char* doc, int tamper, int64_t timeout_ms, char* id, size_t cap) {
  Nebula__V1__Job* job = NULL;
  nb_status_t st = gwt_submit(cli, dir, signer, doc, tamper, timeout_ms, &job);
  if (job && id) snprintf(id, cap, "%s", job->id);
  if (job) protobuf_c_message_free_unpacked(&job->base, NULL);
  return st;
}

nb_job_store_t* gwt_open_store(const nb_gateway_config_t* cfg) {
  char p[1200];
  snprintf(p, sizeof p, "%s/jobs.db", cfg->work_dir);
  nb_job_store_t* st = NULL;
  assert_int_equal(nb_job_store_open(p, &st), NB_OK);
  return st;
}

nb_job_state_t gwt_job_state(const nb_gateway_config_t* cfg, const char* id, char* why,
                             size_t cap) {
  nb_job_store_t* st = gwt_open_store(cfg);
  nb_job_record_t rec = {0};
  nb_status_t s = nb_job_store_get(st, id, &rec);
  nb_job_store_close(st);
  nb_job_state_t r = s == NB_OK ? rec.state : (nb_job_state_t)-1;
  if (why) snprintf(why, cap, "%s", s == NB_OK && rec.reason ? rec.reason : "");
  nb_job_record_clear(&rec);
  return r;
}

void gwt_wait_state(const nb_gateway_config_t* cfg, const char* id, nb_job_state_t want,
                    int seconds) {
  nb_job_state_t s = (nb_job_state_t)-1;
  char why[1024] = "";
  for (int k = 0; k < seconds * 20; k++) {
    s = gwt_job_state(cfg, id, why, sizeof why);
    if (s == want) return;
    if ((int)s >= 0 && nb_job_state_is_final(s)) break;
    nb_sleep_ns(50000000);
  }
  fprintf(stderr, "ERROR: job %s at %s never reached %s (is %s: %s)\n", id, cfg->cluster_id,
          nb_job_state_name(want), nb_job_state_name(s), why);
  int dumped = 0;
  for (int i = 0; i < 2; i++)
    if (gwt_known[i]) {
      gwt_dump_job(gwt_known[i], id);
      dumped |= gwt_known[i] == cfg;
    }
  if (!dumped) gwt_dump_job(cfg, id);
  fail_msg("job %s at %s never reached %s", id, cfg->cluster_id, nb_job_state_name(want));
}

/* The last max bytes of file dir/name on stderr, under a header; nothing when it is absent. */
static void gwt_dump_tail(const char* dir, const char* name, long max) {
  char p[1400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE* f = fopen(p, "r");
  if (!f) return;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, size > max ? size - max : 0, SEEK_SET);
  fprintf(stderr, "---- %s (%ld bytes%s)\n", p, size, size > max ? ", the end" : "");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stderr);
  fprintf(stderr, "\n");
  fclose(f);
}

void gwt_dump_job(const nb_gateway_config_t* cfg, const char* id) {
  char dir[1200];
  snprintf(dir, sizeof dir, "%s/%s", cfg->work_dir, id);
  char why[1024] = "";
  nb_job_state_t s = gwt_job_state(cfg, id, why, sizeof why);
  fprintf(stderr, "==== job %s at %s: %s%s%s\n", id, cfg->cluster_id,
          (int)s >= 0 ? nb_job_state_name(s) : "unknown", why[0] ? ": " : "", why);
  nb_job_store_t* st = gwt_open_store(cfg);
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  if (nb_job_store_events(st, id, 0, 0, &ev, &n) == NB_OK)
    for (size_t k = n > 40 ? n - 40 : 0; k < n; k++)
      fprintf(stderr, "event %lld %s %s\n", (long long)ev[k].seq, ev[k].kind, ev[k].payload);
  nb_job_events_free(ev, n);
  nb_job_store_close(st);
  /* the launched process and its children, as /proc has them (a wait that never ends) */
  pid_t pid = gwt_event_pid(cfg, id, "launch");
  for (int depth = 0; pid > 0 && depth < 4; depth++) {
    char p[128], stat[512] = "", wchan[128] = "", kids[256] = "";
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE* f = fopen(p, "r");
    if (f) {
      if (!fgets(stat, sizeof stat, f)) stat[0] = 0;
      fclose(f);
    }
    snprintf(p, sizeof p, "/proc/%d/wchan", (int)pid);
    if ((f = fopen(p, "r"))) {
      if (!fgets(wchan, sizeof wchan, f)) wchan[0] = 0;
      fclose(f);
    }
    snprintf(p, sizeof p, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    if ((f = fopen(p, "r"))) {
      if (!fgets(kids, sizeof kids, f)) kids[0] = 0;
      fclose(f);
    }
    stat[strcspn(stat, "\n")] = 0;
    fprintf(stderr, "process %d: %s wchan %s children [%s]\n", (int)pid, stat[0] ? stat : "(gone)",
            wchan, kids);
    pid = (pid_t)atoi(kids);
  }
  gwt_dump_tail(dir, "stdout.log", 4096);
  gwt_dump_tail(dir, "stderr.log", 8192);
  gwt_dump_tail(dir, "exit_code", 64);
  for (int r = 0; r < 4; r++) {
    char name[64];
    snprintf(name, sizeof name, "ranks/%d/stderr.log", r);
    gwt_dump_tail(dir, name, 8192);
    snprintf(name, sizeof name, "ranks/%d/exit_code", r);
    gwt_dump_tail(dir, name, 64);
  }
}

int gwt_count_events(const nb_gateway_config_t* cfg, const char* id, const char* kind,
                     const char* needle) {
  nb_job_store_t* st = gwt_open_store(cfg);
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  int c = 0;
  if (nb_job_store_events(st, id, 0, 0, &ev, &n) == NB_OK)
    for (size_t k = 0; k < n; k++)
      if ((!kind || !strcmp(ev[k].kind, kind)) && (!needle || strstr(ev[k].payload, needle))) c++;
  nb_job_events_free(ev, n);
  nb_job_store_close(st);
  return c;
}

pid_t gwt_event_pid(const nb_gateway_config_t* cfg, const char* id, const char* kind) {
  nb_job_store_t* st = gwt_open_store(cfg);
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  pid_t pid = 0;
  if (nb_job_store_events(st, id, 0, 0, &ev, &n) == NB_OK)
    for (size_t k = 0; k < n; k++) {
      if (strcmp(ev[k].kind, kind)) continue;
      json_t* j = json_loads(ev[k].payload, 0, NULL);
      pid = (pid_t)json_integer_value(json_object_get(j, "pid"));
      json_decref(j);
    }
  nb_job_events_free(ev, n);
  nb_job_store_close(st);
  return pid;
}

Nebula__V1__Job* gwt_cancel(nb_rpc_client_t* cli, const char* id, int64_t timeout_ms) {
  Nebula__V1__CancelRequest cr = NEBULA__V1__CANCEL_REQUEST__INIT;
  cr.job_id = (char*)id;
  cr.reason = (char*)"test";
  ProtobufCMessage* rep = NULL;
  assert_int_equal(nb_rpc_unary_pb(cli, "/nebula.v1.Gateway/Cancel", &cr.base,
                                   &nebula__v1__job__descriptor, &rep, timeout_ms, 0),
                   NB_OK);
  return (Nebula__V1__Job*)rep;
}

void gwt_wait_launched(const nb_gateway_config_t cfg[2], const char* id, pid_t* pa, pid_t* pb) {
  *pa = *pb = 0;
  for (int k = 0; k < 400 && (!*pa || !*pb); k++) {
    *pa = gwt_event_pid(&cfg[0], id, "launch");
    *pb = gwt_event_pid(&cfg[1], id, "launch");
    nb_sleep_ns(25000000);
  }
  assert_true(*pa > 0 && *pb > 0);
}
