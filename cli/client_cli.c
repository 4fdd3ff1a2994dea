/* `nebula submit|get|list|watch|cancel|logs|artifact put`: a thin client of nebula.v1.Gateway
 * (and of Artifacts.Put) over mutual TLS with the user's certificate. It signs descriptors with the
 * user's key (security/sign) and prints; every decision is the gateway's. It does not talk to peers
 * or read the job store. */
#include "cli/client_cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/opts.h"
#include "inter/rpc.h"
#include "cli/cli.h"
#include "gateway/artifact.h"
#include "jobs/descriptor.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/pki.h"
#include "security/sign.h"
#include "security/tls.h"

NB_PARAM_STRING(ClientGateway, "NB_GATEWAY", "127.0.0.1:7070",
                "gateway address for nebula submit/get/list/watch/cancel/logs");
NB_PARAM_STRING(ClientCa, "NB_CA", "", "federation CA certificate (PEM) for the client commands");
NB_PARAM_STRING(ClientCert, "NB_CERT", "", "user certificate (PEM) for the client commands");
NB_PARAM_STRING(ClientKey, "NB_KEY", "", "user private key (PEM) for the client commands");

static const char* nb__safe(const char* s);

typedef struct {
  const char* cmd;
  const char* gateway;
  const char* ca;
  const char* cert;
  const char* key;
  const char* server_name;
  int json;
  int follow;
  const char* stream;
  const char* cluster; /* logs: whose output */
  const char* owner;
  const char* state;
  const char* reason;
  const char* arg; /* FILE or job id */
  int64_t timeout_ms;
} nb__copts_t;

static const char* nb__usage_line(const char* cmd) {
  if (!strcmp(cmd, "submit"))
    return "usage: nebula submit FILE [--json]\n  sign FILE with your key and "
           "submit it; prints the job id";
  if (!strcmp(cmd, "get")) return "usage: nebula get JOB [--json]\n  show one job";
  if (!strcmp(cmd, "artifact put"))
    return "usage: nebula artifact put FILE [NAME] [--json]\n  put FILE into your gateway's "
           "artifact store as <you>/NAME (default: FILE's base name),\n  for a job's "
           "spec.program.files to name; prints the name and its sha256\n  (largest file: the "
           "gateway's artifacts.max_put_bytes, 256 MiB by default)";
  if (!strcmp(cmd, "artifact ls"))
    return "usage: nebula artifact ls [PREFIX] [--json]\n  list your artifacts at your gateway "
           "(the files you put and your jobs' outputs),\n  those named <you>/PREFIX... only "
           "when given";
  if (!strcmp(cmd, "list"))
    return "usage: nebula list [--owner USER] [--state STATE] [--json]\n  list your jobs (all "
           "jobs for admins)";
  if (!strcmp(cmd, "watch"))
    return "usage: nebula watch JOB [--json]\n  follow a job's events until it ends: a live "
           "progress line on a terminal\n  (step, loss, WAN MB/s, density, ETA), plain lines "
           "otherwise";
  if (!strcmp(cmd, "cancel"))
    return "usage: nebula cancel JOB [--reason TEXT] [--json]\n  stop every process of the job "
           "(SIGTERM, then SIGKILL)";
  return "usage: nebula logs JOB [-f] [--stderr] [--cluster ID] [--json]\n  print the job's "
         "output; -f follows it until the job ends; --cluster: another cluster's part of a\n  "
         "federated job (asked at the gateway where it was submitted)";
}

#define NB__CLIENT_EPILOG                                                               \
  "\nexit status: 0 ok, 1 failure, 2 usage, 3 refused by the gateway, 4 no such job,\n" \
  "5 gateway unreachable, 6 invalid request or descriptor; watch: 10 the job failed,\n" \
  "11 the job was cancelled."

/* Parses the options of one client command (the connection's, shared by all, and its own);
 * returns -1 to continue, else an exit code. */
static int nb__parse(int argc, char** argv, nb__copts_t* o) {
  memset(o, 0, sizeof *o);
  o->cmd = argv[0];
  o->gateway = nb_param_ClientGateway();
  o->ca = nb_param_ClientCa();
  o->cert = nb_param_ClientCert();
  o->key = nb_param_ClientKey();
  double timeout_s = 30;
  int err_stream = 0;
  nb_opt_t opts[16] = {
      NB_OPTION("gateway", NB_OPT_STR, &o->gateway, "ADDR",
                "gateway address (NB_GATEWAY, default 127.0.0.1:7070)"),
      NB_OPTION("ca", NB_OPT_STR, &o->ca, "FILE", "federation CA certificate (NB_CA)"),
      NB_OPTION("cert", NB_OPT_STR, &o->cert, "FILE", "your user certificate (NB_CERT)"),
      NB_OPTION("key", NB_OPT_STR, &o->key, "FILE", "your private key (NB_KEY)"),
      NB_OPTION("server-name", NB_OPT_STR, &o->server_name, "N",
                "name to check in the gateway's certificate (default: the host)"),
      NB_OPTION("timeout", NB_OPT_DOUBLE, &timeout_s, "S",
                "give up after S seconds (default 30; watch/logs -f: none)"),
      NB_OPTION("json", NB_OPT_FLAG, &o->json, NULL, "print JSON"),
  };
  /* and each command's own */
  const nb_opt_t logs[] = {
      NB_OPTION("follow", NB_OPT_FLAG, &o->follow, NULL, "follow the output until the job ends",
                .letter = 'f'),
      NB_OPTION("stderr", NB_OPT_FLAG, &err_stream, NULL,
                "the job's standard error instead of its output"),
      NB_OPTION("cluster", NB_OPT_STR, &o->cluster, "ID",
                "another cluster's part of a federated job"),
      NB_OPTION_END,
  };
  const nb_opt_t list[] = {
      NB_OPTION("owner", NB_OPT_STR, &o->owner, "USER", "only this user's jobs (admins)"),
      NB_OPTION("state", NB_OPT_STR, &o->state, "STATE", "only jobs in this state"),
      NB_OPTION_END,
  };
  const nb_opt_t cancel[] = {
      NB_OPTION("reason", NB_OPT_STR, &o->reason, "TEXT", "why, stored with the job"),
      NB_OPTION_END,
  };
  const nb_opt_t* own = !strcmp(o->cmd, "logs")     ? logs
                        : !strcmp(o->cmd, "list")   ? list
                        : !strcmp(o->cmd, "cancel") ? cancel
                                                    : NULL;
  int n = 7;
  for (; own && own->name; own++) opts[n++] = *own;
  opts[n] = (nb_opt_t)NB_OPTION_END;
  char cmd[32];
  snprintf(cmd, sizeof cmd, "nebula %s", o->cmd);
  int is_list = !strcmp(o->cmd, "list");
  const nb_cmd_spec_t spec = {
      .cmd = cmd,
      .synopsis = nb__usage_line(o->cmd),
      .about = "connection: the flags override the environment",
      .epilog = NB__CLIENT_EPILOG,
      .arg_name = is_list                           ? NULL
                  : !strcmp(o->cmd, "submit")       ? "FILE"
                  : !strcmp(o->cmd, "artifact put") ? "FILE"
                  : !strcmp(o->cmd, "artifact ls")  ? "PREFIX"
                                                    : "JOB",
      .arg = &o->arg,
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (timeout_s <= 0) return nb_opts_usage_error(&spec, "--timeout takes seconds > 0");
  o->timeout_ms = (int64_t)(timeout_s * 1000);
  if (err_stream) o->stream = "stderr";
  if (o->reason && o->reason[0] == '-' && o->reason[1] == '-') { /* "--reason --json" */
    fprintf(stderr, "nebula cancel: --reason needs a text, not the option '%s'\n",
            nb__safe(o->reason));
    return NB_EXIT_USAGE;
  }
  if (!o->arg && !is_list && strcmp(o->cmd, "artifact ls") != 0) {
    char what[64];
    snprintf(what, sizeof what, "%s is required", spec.arg_name);
    return nb_opts_usage_error(&spec, what);
  }
  /* the file first: a missing descriptor is named as such, whatever else is missing */
  if (!strcmp(o->cmd, "submit")) {
    nb_status_t pst = nb_cli_descriptor_precheck(o->arg);
    if (pst != NB_OK) {
      fprintf(stderr, "nebula submit: %s\n", nb__safe(nb_error_last()));
      return pst == NB_ERR_IO ? NB_EXIT_FAIL : NB_EXIT_INVALID;
    }
  }
  if (nb_cli_addr_check(o->gateway, 0, "--gateway (or NB_GATEWAY)") != NB_OK) {
    fprintf(stderr, "nebula %s: %s\n", o->cmd, nb__safe(nb_error_last()));
    return NB_EXIT_USAGE;
  }
  if (!*o->ca || !*o->cert || !*o->key) {
    fprintf(stderr,
            "nebula %s: needs your credentials: --ca, --cert and --key (or NB_CA, NB_CERT, "
            "NB_KEY)\n",
            o->cmd);
    return NB_EXIT_USAGE;
  }
  return -1;
}

static int nb__exit_for(nb_status_t st) {
  switch (st) {
    case NB_OK:
      return NB_EXIT_OK;
    case NB_ERR_PERMISSION:
      return NB_EXIT_REFUSED;
    case NB_ERR_NOT_FOUND:
      return NB_EXIT_NOT_FOUND;
    case NB_ERR_UNAVAILABLE:
    case NB_ERR_TIMEOUT:
      return NB_EXIT_UNREACHABLE;
    case NB_ERR_INVALID:
    case NB_ERR_CONFIG:
    case NB_ERR_UNSUPPORTED:
      return NB_EXIT_INVALID;
    default:
      return NB_EXIT_FAIL;
  }
}

static int nb__fail(const nb__copts_t* o, nb_status_t st) {
  fprintf(stderr, "nebula %s: %s\n", o->cmd, nb__safe(nb_error_last()));
  /* inter/rpc turns a handshake that failed on a certificate (ours of the gateway's, or the
   * gateway's of ours) into NB_ERR_PERMISSION; the gateway never answered, so it is "gateway
   * unreachable" (5), not "refused by the gateway" (3), which is a decision the gateway made */
  if (st == NB_ERR_PERMISSION && strstr(nb_error_last(), "UNAVAILABLE (14)")) {
    fprintf(stderr,
            "nebula %s: the TLS handshake with %s failed: check --ca (the federation CA), "
            "--server-name, and that the gateway's certificate is from that CA\n",
            o->cmd, nb__safe(o->gateway));
    return NB_EXIT_UNREACHABLE;
  }
  return nb__exit_for(st);
}

typedef struct {
  nb_tls_t* tls;
  nb_rpc_client_t* cli;
} nb__conn_t;

static nb_status_t nb__connect(const nb__copts_t* o, nb__conn_t* c) {
  memset(c, 0, sizeof *c);
  nb_tls_files_t f = {o->ca, o->cert, o->key};
  NB_CHECK(nb_tls_create(&f, &c->tls));
  nb_rpc_client_opts_t co = {0};
  co.tls = c->tls;
  co.server_name = o->server_name;
  nb_status_t st = nb_rpc_client_create(o->gateway, &co, &c->cli);
  if (st != NB_OK) {
    nb_tls_destroy(c->tls);
    c->tls = NULL;
  }
  return st;
}

/* The start of every command but submit: its options, then the connection to the gateway.
 * Returns -1 to go on, else the exit code (a usage error, or the failure to connect). */
static int nb__start(int argc, char** argv, nb__copts_t* o, nb__conn_t* c) {
  int rc = nb__parse(argc, argv, o);
  if (rc >= 0) return rc;
  nb_status_t st = nb__connect(o, c);
  return st == NB_OK ? -1 : nb__fail(o, st);
}

static void nb__disconnect(nb__conn_t* c) {
  nb_rpc_client_destroy(c->cli);
  nb_tls_destroy(c->tls);
}

/* A command but submit: nb__start, then `run` on the connection, then the exit code (*ok, which
 * run may set, when it succeeds; else its error printed), then the connection closed. */
typedef nb_status_t (*nb__run_fn)(const nb__copts_t* o, nb__conn_t* c, int* ok);

static int nb__run(int argc, char** argv, nb__run_fn run) {
  nb__copts_t o;
  nb__conn_t c;
  int rc = nb__start(argc, argv, &o, &c);
  if (rc >= 0) return rc;
  int ok = NB_EXIT_OK;
  nb_status_t st = run(&o, &c, &ok);
  rc = st == NB_OK ? ok : nb__fail(&o, st);
  nb__disconnect(&c);
  return rc;
}

/* A server-streaming call: sends req (at most 512 bytes packed), then hands every message of
 * type desc to each(), until the stream ends; returns the call's status. */
static nb_status_t nb__stream(nb__conn_t* c, const char* method, int64_t timeout_ms,
                              const ProtobufCMessage* req, const ProtobufCMessageDescriptor* desc,
                              void (*each)(const ProtobufCMessage* m, void* ctx), void* ctx) {
  uint8_t buf[512];
  size_t len = protobuf_c_message_get_packed_size(req);
  if (len > sizeof buf) return nb_error(NB_ERR_INVALID, "job id too long");
  protobuf_c_message_pack(req, buf);
  nb_rpc_stream_t* s = NULL;
  nb_status_t st;
  NB_CHECK_GOTO(nb_rpc_stream_open(c->cli, method, timeout_ms, 0, &s), st, done);
  NB_CHECK_GOTO(nb_rpc_stream_send(s, buf, len), st, done);
  NB_CHECK_GOTO(nb_rpc_stream_close_send(s), st, done);
  for (;;) {
    ProtobufCMessage* m = NULL;
    int end = 0;
    st = nb_rpc_stream_recv_pb(s, desc, &m, &end, NB_RPC_INFINITE);
    if (st != NB_OK || end) break;
    each(m, ctx);
    fflush(stdout);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  if (st == NB_OK) st = nb_rpc_stream_finish(s);
done:
  nb_rpc_stream_destroy(s);
  return st;
}

static void nb__fmt_time(int64_t ns, char* buf, size_t n) {
  time_t t = (time_t)(ns / 1000000000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static json_t* nb__job_json(const Nebula__V1__Job* j) {
  json_t* o =
      json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:i}", "id", j->id, "name", j->name,
                "owner", j->owner, "cluster", j->cluster, "state", j->state, "reason", j->reason,
                "created_unix_ns", (json_int_t)j->created_unix_ns, "updated_unix_ns",
                (json_int_t)j->updated_unix_ns, "pid", (int)j->pid, "exit_code", (int)j->exit_code);
  if (o && j->n_clusters) {
    json_t* cl = json_array();
    for (size_t i = 0; i < j->n_clusters; i++) {
      const Nebula__V1__ClusterPart* p = j->clusters[i];
      json_array_append_new(cl, json_pack("{s:s, s:i, s:s, s:s, s:s}", "cluster", p->cluster,
                                          "workers", (int)p->workers, "state", p->state, "reason",
                                          p->reason, "endpoint", p->endpoint));
    }
    json_object_set_new(o, "clusters", cl);
  }
  if (o && j->report && *j->report) json_object_set_new(o, "report", json_string(j->report));
  return o;
}

/* s made safe for a terminal: control characters (C0, DEL, and C1 as UTF-8 U+0080..U+009F)
 * written as \xNN / \u00NN, so that a stored string (a cancel reason, a job's progress source)
 * cannot move the cursor, retitle the window or ring the bell. Returns one of a few rotating
 * buffers: valid for the next few calls (this CLI is single-threaded). */
static const char* nb__safe(const char* s) {
  static char bufs[8][2048];
  static int next;
  char* b = bufs[next++ % 8];
  size_t o = 0, cap = sizeof bufs[0];
  for (const unsigned char* p = (const unsigned char*)(s ? s : ""); *p && o + 8 < cap; p++) {
    if (*p < 0x20 || *p == 0x7f) {
      o += (size_t)snprintf(b + o, cap - o, "\\x%02x", *p);
    } else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
      o += (size_t)snprintf(b + o, cap - o, "\\u%04x", p[1]);
      p++;
    } else {
      b[o++] = (char)*p;
    }
  }
  b[o] = 0;
  return b;
}

static void nb__print_json(json_t* o) {
  char* t = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
  if (t) printf("%s\n", t);
  free(t);
  json_decref(o);
}

static void nb__print_job(const Nebula__V1__Job* j) {
  char c[32], u[32];
  nb__fmt_time(j->created_unix_ns, c, sizeof c);
  nb__fmt_time(j->updated_unix_ns, u, sizeof u);
  printf("id:        %s\nname:      %s\nowner:     %s\ncluster:   %s\nstate:     %s\n",
         nb__safe(j->id), nb__safe(j->name), nb__safe(j->owner), nb__safe(j->cluster),
         nb__safe(j->state));
  if (*j->reason) printf("reason:    %s\n", nb__safe(j->reason));
  printf("created:   %s\nupdated:   %s\n", c, u);
  if (j->pid > 0) printf("pid:       %d\n", (int)j->pid);
  if (j->exit_code >= 0) printf("exit code: %d\n", (int)j->exit_code);
  if (j->report && *j->report) printf("report:    %s\n", nb__safe(j->report));
  for (size_t i = 0; i < j->n_clusters; i++) {
    const Nebula__V1__ClusterPart* p = j->clusters[i];
    printf("%s %-8s  %d workers  %-10s%s%s\n",
           i ? "          " : "clusters: ", nb__safe(p->cluster), (int)p->workers,
           nb__safe(p->state), *p->reason ? "  " : "", nb__safe(p->reason));
  }
}

int nb_submit_main(int argc, char** argv) {
  nb__copts_t o;
  int rc = nb__parse(argc, argv, &o);
  if (rc >= 0) return rc;
  /* the descriptor bytes exactly as they are in the file: that is what is signed */
  FILE* f = fopen(o.arg, "rb");
  if (!f) {
    fprintf(stderr, "nebula submit: cannot open %s: %s\n", nb__safe(o.arg), strerror(errno));
    return NB_EXIT_FAIL;
  }
  struct stat fsb;
  if (fstat(fileno(f), &fsb) != 0 || !S_ISREG(fsb.st_mode)) {
    fprintf(stderr, "nebula submit: %s is %s, not a descriptor file\n", nb__safe(o.arg),
            S_ISDIR(fsb.st_mode) ? "a folder" : "not a regular file");
    fclose(f);
    return NB_EXIT_INVALID;
  }
  if (fsb.st_size > (off_t)NB_DESCRIPTOR_MAX_BYTES) {
    fprintf(stderr,
            "nebula submit: %s is %lld bytes, larger than the descriptor limit of %u "
            "bytes (1 MiB)\n",
            nb__safe(o.arg), (long long)fsb.st_size, NB_DESCRIPTOR_MAX_BYTES);
    fclose(f);
    return NB_EXIT_INVALID;
  }
  char* doc = NULL;
  size_t len = 0;
  nb_status_t st = nb_alloc((void**)&doc, NB_DESCRIPTOR_MAX_BYTES + 1, 1, "descriptor");
  if (st != NB_OK) {
    fclose(f);
    return nb__fail(&o, st);
  }
  len = fread(doc, 1, NB_DESCRIPTOR_MAX_BYTES + 1, f);
  int rerr = ferror(f);
  fclose(f);
  if (rerr || len == 0 || len > NB_DESCRIPTOR_MAX_BYTES) {
    nb_free(doc);
    if (rerr)
      fprintf(stderr, "nebula submit: cannot read %s\n", nb__safe(o.arg));
    else if (len == 0)
      fprintf(stderr,
              "nebula submit: %s is empty: a descriptor is a JSON document (see "
              "'nebula validate --help')\n",
              nb__safe(o.arg));
    else /* it grew while read */
      fprintf(stderr, "nebula submit: %s is larger than the descriptor limit of %u bytes (1 MiB)\n",
              nb__safe(o.arg), NB_DESCRIPTOR_MAX_BYTES);
    return rerr ? NB_EXIT_FAIL : NB_EXIT_INVALID;
  }
  EVP_PKEY* key = NULL;
  char* pem = NULL;
  X509* cert = NULL;
  uint8_t* sig = NULL;
  size_t sig_len = 0;
  nb__conn_t c = {0};
  ProtobufCMessage* rep = NULL;
  NB_CHECK_GOTO(nb_pki_key_load(o.key, &key), st, done);
  NB_CHECK_GOTO(nb_pki_cert_load(o.cert, &cert), st, done);
  NB_CHECK_GOTO(nb_pki_cert_to_pem(cert, &pem), st, done);
  NB_CHECK_GOTO(nb_sign_data(key, doc, len, &sig, &sig_len), st, done);
  NB_CHECK_GOTO(nb__connect(&o, &c), st, done);
  Nebula__V1__SubmitRequest req = NEBULA__V1__SUBMIT_REQUEST__INIT;
  req.descriptor.data = (uint8_t*)doc;
  req.descriptor.len = len;
  req.signature.data = sig;
  req.signature.len = sig_len;
  req.cert_pem = pem;
  NB_CHECK_GOTO(nb_rpc_unary_pb(c.cli, "/nebula.v1.Gateway/Submit", &req.base,
                                &nebula__v1__job__descriptor, &rep, o.timeout_ms, 0),
                st, done);
  Nebula__V1__Job* j = (Nebula__V1__Job*)rep;
  if (o.json)
    nb__print_json(nb__job_json(j));
  else
    printf("%s\n", j->id);
done:
  rc = st == NB_OK ? NB_EXIT_OK : nb__fail(&o, st);
  if (rep) protobuf_c_message_free_unpacked(rep, NULL);
  nb__disconnect(&c);
  nb_free(sig);
  nb_free(pem);
  if (cert) X509_free(cert);
  if (key) EVP_PKEY_free(key);
  nb_free(doc);
  return rc;
}

static nb_status_t nb__unary_job(const nb__copts_t* o, nb__conn_t* c, int cancel) {
  nb_status_t st = NB_OK;
  ProtobufCMessage* rep = NULL;
  if (cancel) {
    Nebula__V1__CancelRequest req = NEBULA__V1__CANCEL_REQUEST__INIT;
    req.job_id = (char*)o->arg;
    req.reason = (char*)(o->reason ? o->reason : "");
    st = nb_rpc_unary_pb(c->cli, "/nebula.v1.Gateway/Cancel", &req.base,
                         &nebula__v1__job__descriptor, &rep, o->timeout_ms, 0);
  } else {
    Nebula__V1__GetRequest req = NEBULA__V1__GET_REQUEST__INIT;
    req.job_id = (char*)o->arg;
    st = nb_rpc_unary_pb(c->cli, "/nebula.v1.Gateway/Get", &req.base, &nebula__v1__job__descriptor,
                         &rep, o->timeout_ms, 0);
  }
  if (st == NB_OK) {
    Nebula__V1__Job* j = (Nebula__V1__Job*)rep;
    if (o->json) {
      json_t* jj = nb__job_json(j);
      json_t* d = *j->descriptor ? json_loads(j->descriptor, 0, NULL) : NULL;
      if (d) json_object_set_new(jj, "descriptor", d);
      nb__print_json(jj);
    } else if (cancel) {
      printf("%s %s%s%s\n", nb__safe(j->id), nb__safe(j->state), *j->reason ? ": " : "",
             nb__safe(j->reason));
    } else {
      nb__print_job(j);
    }
    protobuf_c_message_free_unpacked(rep, NULL);
  }
  return st;
}

static nb_status_t nb__get(const nb__copts_t* o, nb__conn_t* c, int* ok) {
  return nb__unary_job(o, c, 0);
}
static nb_status_t nb__cancel(const nb__copts_t* o, nb__conn_t* c, int* ok) {
  return nb__unary_job(o, c, 1);
}
int nb_get_main(int argc, char** argv) {
  return nb__run(argc, argv, nb__get);
}
int nb_cancel_main(int argc, char** argv) {
  return nb__run(argc, argv, nb__cancel);
}

static nb_status_t nb__list(const nb__copts_t* o, nb__conn_t* c, int* ok) {
  Nebula__V1__ListRequest req = NEBULA__V1__LIST_REQUEST__INIT;
  req.owner = (char*)(o->owner ? o->owner : "");
  req.state = (char*)(o->state ? o->state : "");
  ProtobufCMessage* rep = NULL;
  nb_status_t st = nb_rpc_unary_pb(c->cli, "/nebula.v1.Gateway/List", &req.base,
                                   &nebula__v1__list_reply__descriptor, &rep, o->timeout_ms, 0);
  if (st == NB_OK) {
    Nebula__V1__ListReply* r = (Nebula__V1__ListReply*)rep;
    if (o->json) {
      json_t* a = json_array();
      for (size_t i = 0; i < r->n_jobs; i++) json_array_append_new(a, nb__job_json(r->jobs[i]));
      nb__print_json(a);
    } else {
      printf("%-32s %-10s %-12s %-20s %s\n", "ID", "STATE", "OWNER", "CREATED", "REASON");
      for (size_t i = 0; i < r->n_jobs; i++) {
        char t[32];
        nb__fmt_time(r->jobs[i]->created_unix_ns, t, sizeof t);
        printf("%-32s %-10s %-12s %-20s %s\n", nb__safe(r->jobs[i]->id),
               nb__safe(r->jobs[i]->state), nb__safe(r->jobs[i]->owner), t,
               nb__safe(r->jobs[i]->reason));
      }
    }
    protobuf_c_message_free_unpacked(rep, NULL);
  }
  return st;
}
int nb_list_main(int argc, char** argv) {
  return nb__run(argc, argv, nb__list);
}

static void nb__fmt_eta(double s, char* buf, size_t n) {
  if (s < 0) {
    snprintf(buf, n, "--");
    return;
  }
  long v = (long)(s + 0.5);
  if (v >= 3600)
    snprintf(buf, n, "%ldh%02ldm", v / 3600, (v / 60) % 60);
  else
    snprintf(buf, n, "%ldm%02lds", v / 60, v % 60);
}

/* One progress line: round, step, loss, WAN MB/s, density, ETA, each only where the event's
 * payload has it: a one-cluster `nebula train` job reports steps and held-out evaluations, no
 * sync rounds, and a row of "round 0 ... loss 0.0000 ... density 0" would say nothing true. */
static void nb__progress_line(const Nebula__V1__JobEvent* e, char* buf, size_t n) {
  json_t* p = json_loads(e->payload_json, 0, NULL);
  size_t o = 0;
#define NB__PL(...)                                                \
  do {                                                             \
    if (o < n) o += (size_t)snprintf(buf + o, n - o, __VA_ARGS__); \
  } while (0)
  buf[0] = 0;
  if (json_object_get(p, "round")) NB__PL("round %lld  ", (long long)e->round);
  if (e->max_steps > 0)
    NB__PL("step %lld/%lld (%3.0f%%)", (long long)e->step, (long long)e->max_steps,
           100.0 * (double)e->step / (double)e->max_steps);
  else
    NB__PL("step %lld", (long long)e->step);
  json_t* bpb = json_object_get(p, "eval_bpb");
  if (json_is_number(bpb)) NB__PL("  held-out %.4f bits/byte", json_number_value(bpb));
  if (json_object_get(p, "loss")) NB__PL("  loss %.4f", e->loss);
  if (json_object_get(p, "wan_mbps")) NB__PL("  WAN %.2f MB/s", e->wan_mbps / 8.0);
  if (json_object_get(p, "density")) NB__PL("  density %.4g", e->density);
  if (json_object_get(p, "eta_s") || json_object_get(p, "eta_seconds") || e->eta_seconds >= 0) {
    char eta[32];
    nb__fmt_eta(e->eta_seconds, eta, sizeof eta);
    NB__PL("  ETA %s", eta);
  }
  if (*e->source) NB__PL("  %s", nb__safe(e->source));
#undef NB__PL
  json_decref(p);
}

/* What watch prints with: its options, whether stdout is a terminal, whether a progress line is
 * on screen without its newline, and the job's last state. */
typedef struct {
  const nb__copts_t* o;
  int tty, live;
  char final_state[32];
} nb__watch_t;

static void nb__watch_event(const ProtobufCMessage* m, void* ctx) {
  nb__watch_t* w = ctx;
  const Nebula__V1__JobEvent* e = (const Nebula__V1__JobEvent*)m;
  if (!strcmp(e->kind, "state")) snprintf(w->final_state, sizeof w->final_state, "%s", e->state);
  char line[512], t[32];
  nb__fmt_time(e->time_unix_ns, t, sizeof t);
  if (w->o->json) {
    json_t* p = json_loads(e->payload_json, 0, NULL);
    json_t* j = json_pack("{s:s, s:I, s:I, s:s, s:o}", "job_id", e->job_id, "seq",
                          (json_int_t)e->seq, "time_unix_ns", (json_int_t)e->time_unix_ns, "kind",
                          e->kind, "payload", p ? p : json_null());
    char* txt = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (txt) printf("%s\n", txt);
    free(txt);
    json_decref(j);
  } else if (!strcmp(e->kind, "progress")) {
    nb__progress_line(e, line, sizeof line);
    if (w->tty) {
      printf("\r\033[K%s", line);
      w->live = 1;
    } else {
      printf("%s %s\n", t, line);
    }
  } else {
    if (w->live) printf("\n");
    w->live = 0;
    if (!strcmp(e->kind, "state"))
      printf("%s state %s%s%s\n", t, nb__safe(e->state), *e->reason ? ": " : "",
             nb__safe(e->reason));
    else
      printf("%s %s %s\n", t, nb__safe(e->kind), nb__safe(e->payload_json));
  }
}

static nb_status_t nb__watch(const nb__copts_t* o, nb__conn_t* c, int* ok) {
  nb__watch_t w = {.o = o, .tty = isatty(STDOUT_FILENO) && !o->json};
  Nebula__V1__WatchRequest req = NEBULA__V1__WATCH_REQUEST__INIT;
  req.job_id = (char*)o->arg;
  nb_status_t st = nb__stream(c, "/nebula.v1.Gateway/Watch", NB_RPC_INFINITE, &req.base,
                              &nebula__v1__job_event__descriptor, nb__watch_event, &w);
  if (w.live) printf("\n");
  if (!strcmp(w.final_state, "failed")) *ok = NB_EXIT_JOB_FAILED;
  if (!strcmp(w.final_state, "cancelled")) *ok = NB_EXIT_JOB_CANCELLED;
  return st;
}
int nb_watch_main(int argc, char** argv) {
  return nb__run(argc, argv, nb__watch);
}

static void nb__logs_chunk(const ProtobufCMessage* m, void* ctx) {
  const nb__copts_t* o = ctx;
  const Nebula__V1__LogChunk* ch = (const Nebula__V1__LogChunk*)m;
  if (o->json) {
    /* text as a JSON string when it is UTF-8, else base64 under "data_b64" */
    json_t* j = json_pack("{s:I, s:s%}", "offset", (json_int_t)ch->offset, "data",
                          (const char*)ch->data.data, ch->data.len);
    if (!j) {
      char* b64 = NULL;
      if (nb_b64_encode(ch->data.data, ch->data.len, &b64) == NB_OK)
        j = json_pack("{s:I, s:s}", "offset", (json_int_t)ch->offset, "data_b64", b64);
      nb_free(b64);
    }
    char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt) printf("%s\n", txt);
    free(txt);
    json_decref(j);
  } else {
    fwrite(ch->data.data, 1, ch->data.len, stdout);
  }
}

static nb_status_t nb__logs(const nb__copts_t* o, nb__conn_t* c, int* ok) {
  Nebula__V1__LogsRequest req = NEBULA__V1__LOGS_REQUEST__INIT;
  req.job_id = (char*)o->arg;
  req.follow = o->follow;
  req.stream = (char*)(o->stream ? o->stream : "stdout");
  req.cluster = (char*)(o->cluster ? o->cluster : "");
  return nb__stream(c, "/nebula.v1.Gateway/Logs", o->follow ? NB_RPC_INFINITE : o->timeout_ms,
                    &req.base, &nebula__v1__log_chunk__descriptor, nb__logs_chunk, (void*)o);
}
int nb_logs_main(int argc, char** argv) {
  return nb__run(argc, argv, nb__logs);
}

/* `nebula artifact ls [PREFIX]`. */
static int nb__artifact_ls(int argc, char** argv) {
  argv[0] = "artifact ls";
  nb__copts_t o;
  int rc = nb__parse(argc, argv, &o);
  if (rc >= 0) return rc;
  nb_tls_files_t f = {o.ca, o.cert, o.key};
  nb_tls_t* tls = NULL;
  nb_artifact_info_t* a = NULL;
  size_t n = 0;
  int more = 0;
  nb_status_t st = nb_tls_create(&f, &tls);
  if (st == NB_OK) {
    nb_artifact_upload_opts_t uo = {
        .target = o.gateway, .tls = tls, .server_name = o.server_name, .timeout_ms = o.timeout_ms};
    st = nb_artifact_list(&uo, o.arg, &a, &n, &more);
  }
  nb_tls_destroy(tls);
  if (st != NB_OK) return nb__fail(&o, st);
  if (o.json) {
    json_t* arr = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(arr, json_pack("{s:s, s:s, s:I}", "name", a[i].name, "sha256",
                                           a[i].sha256, "size", (json_int_t)a[i].size));
    nb__print_json(arr);
  } else {
    printf("%-64s %-12s %s\n", "NAME", "BYTES", "SHA256");
    for (size_t i = 0; i < n; i++)
      printf("%-64s %-12llu %s\n", nb__safe(a[i].name), (unsigned long long)a[i].size, a[i].sha256);
    if (more) printf("(more: give a PREFIX)\n");
  }
  nb_free(a);
  return NB_EXIT_OK;
}

/* `nebula artifact put FILE [NAME]`: NAME, the second word that is not an option or an option's
 * value, is taken out before the common parser (which knows one positional argument). */
int nb_artifact_main(int argc, char** argv) {
  if (argc >= 2 && !strcmp(argv[1], "ls")) return nb__artifact_ls(argc - 1, argv + 1);
  if (argc < 2 || strcmp(argv[1], "put") != 0) {
    fprintf(stderr,
            "usage: nebula artifact put FILE [NAME] | nebula artifact ls [PREFIX]  (--help on "
            "each)\n");
    return argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) ? NB_EXIT_OK
                                                                               : NB_EXIT_USAGE;
  }
  static const char* const valued[] = {"--gateway",     "--ca",      "--cert", "--key",
                                       "--server-name", "--timeout", NULL};
  char* args[64];
  int n = 0, pos = 0;
  const char* name = NULL;
  if (argc > 63) {
    fprintf(stderr, "nebula artifact put: too many arguments\n");
    return NB_EXIT_USAGE;
  }
  args[n++] = "artifact put";
  for (int i = 2; i < argc; i++) {
    int takes = 0;
    for (int k = 0; valued[k]; k++) takes |= !strcmp(argv[i], valued[k]);
    if (takes && i + 1 < argc) {
      args[n++] = argv[i];
      args[n++] = argv[++i];
      continue;
    }
    if (argv[i][0] == '-' || ++pos != 2) {
      args[n++] = argv[i];
      continue;
    }
    name = argv[i];
  }
  args[n] = NULL;
  nb__copts_t o;
  int rc = nb__parse(n, args, &o);
  if (rc >= 0) return rc;
  if (!name) {
    const char* sl = strrchr(o.arg, '/');
    name = sl ? sl + 1 : o.arg;
  }
  nb_tls_files_t f = {o.ca, o.cert, o.key};
  nb_tls_t* tls = NULL;
  nb_status_t st = nb_tls_create(&f, &tls);
  nb_artifact_info_t info;
  if (st == NB_OK) {
    nb_artifact_upload_opts_t uo = {.target = o.gateway,
                                    .tls = tls,
                                    .server_name = o.server_name,
                                    .file = o.arg,
                                    .name = name,
                                    .timeout_ms = o.timeout_ms};
    st = nb_artifact_upload(&uo, &info);
  }
  nb_tls_destroy(tls);
  if (st != NB_OK) return nb__fail(&o, st);
  if (o.json) {
    json_t* j = json_pack("{s:s, s:s, s:I}", "name", info.name, "sha256", info.sha256, "size",
                          (json_int_t)info.size);
    nb__print_json(j);
  } else {
    printf("%s sha256:%s %llu bytes\n", nb__safe(info.name), info.sha256,
           (unsigned long long)info.size);
  }
  return NB_EXIT_OK;
}
