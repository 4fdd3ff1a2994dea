/* A small nebula.v1.Exchange server for interop tests: it serves Ping over mutual TLS through
 * inter/rpc, prints "PORT <n>" on stdout once listening, and stops cleanly when its stdin
 * closes (so it never outlives the test that started it). Not a product server. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "nebula/v1/exchange.pb-c.h"
#include "security/tls.h"

static nb_status_t authorize(const nb_tls_peer_t* peer, const char* method, void* user) {
  return nb_tls_peer_check_cluster(peer, (const char*)user);
}

static nb_status_t h_ping(nb_rpc_call_t* call, void* user) {
  const nb_tls_t* tls = user;
  int64_t now = (int64_t)nb_wall_ns();
  ProtobufCMessage* in = NULL;
  int end;
  NB_CHECK(
      nb_rpc_call_recv_pb(call, &nebula__v1__ping_request__descriptor, &in, &end, NB_RPC_INFINITE));
  if (end) return nb_error(NB_ERR_INVALID, "Ping without a request");
  Nebula__V1__PingRequest* req = (Nebula__V1__PingRequest*)in;
  nb_status_t st = NB_OK;
  if (req->reply_size > (16u << 20)) {
    st = nb_error(NB_ERR_INVALID, "reply_size %u is over 16 MiB", req->reply_size);
  } else {
    Nebula__V1__PingReply rep = NEBULA__V1__PING_REPLY__INIT;
    rep.seq = req->seq;
    rep.echo_sent_unix_ns = req->sent_unix_ns;
    rep.recv_unix_ns = now;
    rep.responder = (char*)nb_tls_self(tls)->name;
    rep.payload_size_seen = (uint32_t)req->payload.len;
    uint8_t* pl = calloc(1, (size_t)req->reply_size + 1);
    if (pl == NULL) {
      st = nb_error(NB_ERR_NOMEM, "ping reply");
    } else {
      for (uint32_t i = 0; i < req->reply_size; i++) pl[i] = (uint8_t)i;
      rep.payload.data = pl;
      rep.payload.len = req->reply_size;
      st = nb_rpc_call_send_pb(call, &rep.base);
      free(pl);
    }
  }
  protobuf_c_message_free_unpacked(in, NULL);
  return st;
}

int main(int argc, char** argv) {
  const char *ca = NULL, *cert = NULL, *key = NULL, *expect = NULL, *listen = "127.0.0.1:0";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--ca"))
      ca = argv[i + 1];
    else if (!strcmp(argv[i], "--cert"))
      cert = argv[i + 1];
    else if (!strcmp(argv[i], "--key"))
      key = argv[i + 1];
    else if (!strcmp(argv[i], "--expect-cluster"))
      expect = argv[i + 1];
    else if (!strcmp(argv[i], "--listen"))
      listen = argv[i + 1];
  }
  if (!ca || !cert || !key || !expect) {
    fprintf(stderr, "usage: %s --ca F --cert F --key F --expect-cluster ID [--listen ADDR]\n",
            argv[0]);
    return 2;
  }
  nb_tls_files_t f = {.ca_path = ca, .cert_path = cert, .key_path = key};
  nb_tls_t* tls = NULL;
  nb_rpc_server_t* srv = NULL;
  nb_status_t st = nb_tls_create(&f, &tls);
  if (st == NB_OK) {
    nb_rpc_server_opts_t o = {
        .listen = listen, .tls = tls, .authorize = authorize, .authorize_user = (void*)expect};
    st = nb_rpc_server_create(&o, &srv);
  }
  if (st == NB_OK)
    st = nb_rpc_server_add_method(srv, "/nebula.v1.Exchange/Ping", NB_RPC_UNARY, h_ping, tls);
  if (st == NB_OK) st = nb_rpc_server_start(srv);
  if (st != NB_OK) {
    fprintf(stderr, "rpc_test_server: %s: %s\n", nb_status_name(st), nb_error_last());
    nb_rpc_server_destroy(srv);
    nb_tls_destroy(tls);
    return 1;
  }
  printf("PORT %d\n", nb_rpc_server_port(srv));
  fflush(stdout);
  char buf[256];
  while (fread(buf, 1, sizeof buf, stdin) > 0) {
  }
  nb_rpc_server_destroy(srv);
  nb_tls_destroy(tls);
  return 0;
}
