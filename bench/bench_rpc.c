/* `nebula bench rpc`: loopback cost of the gRPC wrapper — client-streaming goodput and unary
 * round trip, plaintext as the baseline and mutual TLS against it, in the same run. It does not
 * measure WAN behaviour (that is `nebula bench wan`) and asserts nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "inter/rpc.h"

#define NB__BR_SINK "/nebula.bench.Rpc/Sink"
#define NB__BR_ECHO "/nebula.bench.Rpc/Echo"

static nb_status_t nb__br_sink(nb_rpc_call_t* call, void* user) {
  uint64_t bytes = 0;
  for (;;) {
    nb_rpc_msg_t m;
    int end;
    NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
    if (end) break;
    bytes += m.len;
    nb_rpc_msg_release(&m);
  }
  return nb_rpc_call_send(call, &bytes, sizeof bytes);
}

static nb_status_t nb__br_echo(nb_rpc_call_t* call, void* user) {
  nb_rpc_msg_t m;
  int end;
  NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
  if (end) return nb_error(NB_ERR_INVALID, "no request");
  nb_status_t st = nb_rpc_call_send(call, m.data, m.len);
  nb_rpc_msg_release(&m);
  return st;
}

typedef struct {
  double gbps;   /* median streaming goodput, Gbit/s */
  double rtt_us; /* median unary round trip, µs */
} nb__br_result_t;

/* One server + one client (TLS when both tls pointers are set); reps timed transfers of mib MiB
 * in chunk_kib messages after a warm-up. */
static nb_status_t nb__br_run(const nb_tls_t* stls, const nb_tls_t* ctls, int mib, int chunk_kib,
                              int reps, nb__br_result_t* out) {
  nb_status_t st = NB_OK;
  nb_rpc_server_t* srv = NULL;
  nb_rpc_client_t* cli = NULL;
  uint8_t* buf = NULL;
  size_t chunk = (size_t)chunk_kib << 10;
  size_t nmsg = ((size_t)mib << 20) / chunk;
  double g[16], r[64];
  nb_rpc_server_opts_t so = {.listen = "127.0.0.1:0", .tls = stls, .allow_insecure = !stls};
  NB_CHECK_GOTO(nb_rpc_server_create(&so, &srv), st, fail);
  NB_CHECK_GOTO(
      nb_rpc_server_add_method(srv, NB__BR_SINK, NB_RPC_CLIENT_STREAMING, nb__br_sink, NULL), st,
      fail);
  NB_CHECK_GOTO(nb_rpc_server_add_method(srv, NB__BR_ECHO, NB_RPC_UNARY, nb__br_echo, NULL), st,
                fail);
  NB_CHECK_GOTO(nb_rpc_server_start(srv), st, fail);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", nb_rpc_server_port(srv));
  nb_rpc_client_opts_t co = {.tls = ctls, .allow_insecure = !ctls};
  NB_CHECK_GOTO(nb_rpc_client_create(target, &co, &cli), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&buf, chunk, 1, "bench chunk"), st, fail);
  memset(buf, 0x5a, chunk);

  nb_rpc_msg_t m;
  for (int i = 0; i < 64 + 8; i++) { /* 8 warm-up calls, then 64 timed */
    uint64_t t0 = nb_now_ns();
    NB_CHECK_GOTO(nb_rpc_unary(cli, NB__BR_ECHO, "x", 1, &m, 10000, NB_RPC_WAIT_FOR_READY), st,
                  fail);
    nb_rpc_msg_release(&m);
    if (i >= 8) r[i - 8] = (double)(nb_now_ns() - t0) / 1e3;
  }
  for (int rep = 0; rep < reps + 1; rep++) { /* the first transfer warms buffers and windows */
    nb_rpc_stream_t* s = NULL;
    uint64_t t0 = nb_now_ns();
    NB_CHECK_GOTO(nb_rpc_stream_open(cli, NB__BR_SINK, 600000, 0, &s), st, fail);
    for (size_t i = 0; i < nmsg && st == NB_OK; i++) st = nb_rpc_stream_send(s, buf, chunk);
    if (st == NB_OK) st = nb_rpc_stream_close_send(s);
    int end = 0;
    if (st == NB_OK) st = nb_rpc_stream_recv(s, &m, &end, NB_RPC_INFINITE);
    if (st == NB_OK && !end) nb_rpc_msg_release(&m);
    if (st == NB_OK) st = nb_rpc_stream_finish(s);
    nb_rpc_stream_destroy(s);
    if (st != NB_OK) goto fail;
    if (rep > 0) g[rep - 1] = (double)nmsg * (double)chunk * 8.0 / ((double)(nb_now_ns() - t0));
  }
  out->gbps = nb_bench_median(g, (size_t)reps);
  out->rtt_us = nb_bench_median(r, 64);
fail:
  nb_free(buf);
  nb_rpc_client_destroy(cli);
  nb_rpc_server_destroy(srv);
  return st;
}

int nb_bench_rpc_main(int argc, char** argv) {
  const char* certs = NULL;
  int mib = 256, chunk_kib = 1024, reps = 3, json = 0;
  const nb_opt_t opts[] = {
      NB_OPTION("certs", NB_OPT_STR, &certs, "DIR",
                "ca.pem, server.pem/.key and client.pem/.key of one federation;\nwithout it only "
                "plaintext runs"),
      NB_OPTION("mib", NB_OPT_INT, &mib, "M", "MiB moved per repetition (default 256)", .min = 1),
      NB_OPTION("chunk-kib", NB_OPT_INT, &chunk_kib, "K", "message size in KiB (default 1024)",
                .min = 1, .max = 16384),
      NB_OPTION("reps", NB_OPT_INT, &reps, "R", "repetitions, the median is shown (default 3)",
                .min = 1, .max = 16),
      NB_OPTION("json", NB_OPT_FLAG, &json, NULL, "print one JSON object"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula bench rpc",
      .synopsis =
          "usage: nebula bench rpc [--certs DIR] [--mib M] [--chunk-kib K] [--reps R] "
          "[--json]",
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  nb__br_result_t plain = {0}, tls = {0};
  nb_status_t st = nb__br_run(NULL, NULL, mib, chunk_kib, reps, &plain);
  nb_tls_t *stls = NULL, *ctls = NULL;
  if (st == NB_OK && certs != NULL) {
    char p[5][512];
    const char* names[5] = {"ca.pem", "server.pem", "server.key", "client.pem", "client.key"};
    for (int i = 0; i < 5; i++) snprintf(p[i], sizeof p[i], "%s/%s", certs, names[i]);
    nb_tls_files_t sf = {p[0], p[1], p[2]}, cf = {p[0], p[3], p[4]};
    st = nb_tls_create(&sf, &stls);
    if (st == NB_OK) st = nb_tls_create(&cf, &ctls);
    if (st == NB_OK) st = nb__br_run(stls, ctls, mib, chunk_kib, reps, &tls);
  }
  nb_tls_destroy(stls);
  nb_tls_destroy(ctls);
  if (st != NB_OK) {
    fprintf(stderr, "bench rpc: %s: %s\n", nb_status_name(st), nb_error_last());
    return 1;
  }
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_int(&j, "mib", mib);
    nb_json_int(&j, "chunk_kib", chunk_kib);
    nb_json_num(&j, "plain_gbps", plain.gbps);
    nb_json_num(&j, "plain_unary_rtt_us", plain.rtt_us);
    if (certs) {
      nb_json_num(&j, "mtls_gbps", tls.gbps);
      nb_json_num(&j, "mtls_unary_rtt_us", tls.rtt_us);
      nb_json_num(&j, "mtls_over_plain", tls.gbps / plain.gbps);
    }
    nb_json_end(&j);
    return 0;
  }
  printf("rpc loopback, %d MiB in %d KiB messages, median of %d:\n", mib, chunk_kib, reps);
  printf("  plaintext  %7.2f Gbit/s   unary round trip %7.1f us\n", plain.gbps, plain.rtt_us);
  if (certs)
    printf("  mTLS       %7.2f Gbit/s   unary round trip %7.1f us   goodput %.2fx plaintext\n",
           tls.gbps, tls.rtt_us, tls.gbps / plain.gbps);
  return 0;
}
