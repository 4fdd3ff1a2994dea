/* The nebula.v1.Exchange/Push wire protocol driven through inter/rpc with protobuf-c messages:
 * open → ack(next_chunk) → chunks with per-chunk acks → COMPLETE, and a resume after the stream
 * is cut mid-transfer. The receiver here is a minimal model for the test, not inter/exchange. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "nebula/v1/exchange.pb-c.h"

#define M_PUSH "/nebula.v1.Exchange/Push"
#define CHUNK 4096u
#define NCHUNK 40u

/* Receiver state of one transfer (the test moves one frame). */
static struct {
  pthread_mutex_t mu;
  uint64_t transfer_id;
  uint32_t next; /* chunks [0, next) stored */
  uint32_t count;
  uint64_t size, hash;
  uint8_t frame[CHUNK * NCHUNK];
  int opens;
} g_rx = {.mu = PTHREAD_MUTEX_INITIALIZER};

static nb_status_t send_ack(nb_rpc_call_t* call, uint64_t id, uint32_t next,
                            Nebula__V1__PushAck__Status status, const char* detail) {
  Nebula__V1__PushAck ack = NEBULA__V1__PUSH_ACK__INIT;
  ack.transfer_id = id;
  ack.next_chunk = next;
  ack.status = status;
  ack.detail = (char*)(detail ? detail : "");
  return nb_rpc_call_send_pb(call, &ack.base);
}

static nb_status_t h_push(nb_rpc_call_t* call, void* user) {
  for (;;) {
    ProtobufCMessage* in = NULL;
    int end;
    NB_CHECK(nb_rpc_call_recv_pb(call, &nebula__v1__push_request__descriptor, &in, &end,
                                 NB_RPC_INFINITE));
    if (end) return NB_OK;
    Nebula__V1__PushRequest* req = (Nebula__V1__PushRequest*)in;
    nb_status_t st = NB_OK;
    pthread_mutex_lock(&g_rx.mu);
    if (req->kind_case == NEBULA__V1__PUSH_REQUEST__KIND_OPEN && req->open->key != NULL) {
      Nebula__V1__PushOpen* o = req->open;
      if (o->key->transfer_id != g_rx.transfer_id) { /* a new transfer */
        g_rx.transfer_id = o->key->transfer_id;
        g_rx.next = 0;
      }
      g_rx.count = o->chunk_count;
      g_rx.size = o->frame_size;
      g_rx.hash = o->frame_hash;
      g_rx.opens++;
      uint32_t next = g_rx.next;
      pthread_mutex_unlock(&g_rx.mu);
      st = send_ack(call, o->key->transfer_id, next, NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK, NULL);
    } else if (req->kind_case == NEBULA__V1__PUSH_REQUEST__KIND_CHUNK) {
      Nebula__V1__PushChunk* c = req->chunk;
      Nebula__V1__PushAck__Status status = NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK;
      if (c->index == g_rx.next && c->data.len <= CHUNK &&
          c->offset + c->data.len <= sizeof g_rx.frame) {
        if (nb_crc32(0, c->data.data, c->data.len) != c->crc32) {
          status = NEBULA__V1__PUSH_ACK__STATUS__STATUS_INTEGRITY;
        } else {
          memcpy(g_rx.frame + c->offset, c->data.data, c->data.len);
          g_rx.next++;
        }
      } /* else: out of order; the ack tells the sender where to continue */
      if (g_rx.next == g_rx.count && nb_xxh3_64(g_rx.frame, g_rx.size, 0) == g_rx.hash)
        status = NEBULA__V1__PUSH_ACK__STATUS__STATUS_COMPLETE;
      uint32_t next = g_rx.next;
      uint64_t id = g_rx.transfer_id;
      pthread_mutex_unlock(&g_rx.mu);
      st = send_ack(call, id, next, status, NULL);
    } else {
      pthread_mutex_unlock(&g_rx.mu);
      st = nb_error(NB_ERR_INVALID, "PushRequest without open or chunk");
    }
    protobuf_c_message_free_unpacked(in, NULL);
    NB_CHECK(st);
  }
}

static uint8_t g_frame[CHUNK * NCHUNK];

static Nebula__V1__PushAck* recv_ack(nb_rpc_stream_t* s) {
  ProtobufCMessage* out = NULL;
  int end = 1;
  assert_int_equal(nb_rpc_stream_recv_pb(s, &nebula__v1__push_ack__descriptor, &out, &end, 5000),
                   NB_OK);
  assert_int_equal(end, 0);
  return (Nebula__V1__PushAck*)out;
}

/* Opens the transfer on a new stream; returns the stream and the chunk to start from. */
static nb_rpc_stream_t* open_transfer(nb_rpc_client_t* cli, uint32_t* start) {
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, M_PUSH, 10000, NB_RPC_WAIT_FOR_READY, &s), NB_OK);
  Nebula__V1__TransferKey key = NEBULA__V1__TRANSFER_KEY__INIT;
  key.job_id = (char*)"job-1";
  key.sender = (char*)"dc-b";
  key.round = 3;
  key.transfer_id = 0xfeed;
  Nebula__V1__PushOpen o = NEBULA__V1__PUSH_OPEN__INIT;
  o.key = &key;
  o.frame_size = sizeof g_frame;
  o.chunk_size = CHUNK;
  o.chunk_count = NCHUNK;
  o.frame_hash = nb_xxh3_64(g_frame, sizeof g_frame, 0);
  Nebula__V1__PushRequest req = NEBULA__V1__PUSH_REQUEST__INIT;
  req.kind_case = NEBULA__V1__PUSH_REQUEST__KIND_OPEN;
  req.open = &o;
  assert_int_equal(nb_rpc_stream_send_pb(s, &req.base), NB_OK);
  Nebula__V1__PushAck* ack = recv_ack(s);
  assert_int_equal(ack->transfer_id, 0xfeed);
  *start = ack->next_chunk;
  protobuf_c_message_free_unpacked(&ack->base, NULL);
  return s;
}

/* Sends chunks [from, to) and reads one ack per chunk; returns the last ack's status. */
static int send_chunks(nb_rpc_stream_t* s, uint32_t from, uint32_t to, uint32_t* acked) {
  int status = -1;
  for (uint32_t i = from; i < to; i++) {
    Nebula__V1__PushChunk c = NEBULA__V1__PUSH_CHUNK__INIT;
    c.transfer_id = 0xfeed;
    c.index = i;
    c.offset = (uint64_t)i * CHUNK;
    c.data.data = g_frame + c.offset;
    c.data.len = CHUNK;
    c.crc32 = nb_crc32(0, c.data.data, c.data.len);
    Nebula__V1__PushRequest req = NEBULA__V1__PUSH_REQUEST__INIT;
    req.kind_case = NEBULA__V1__PUSH_REQUEST__KIND_CHUNK;
    req.chunk = &c;
    assert_int_equal(nb_rpc_stream_send_pb(s, &req.base), NB_OK);
    Nebula__V1__PushAck* ack = recv_ack(s);
    *acked = ack->next_chunk;
    status = ack->status;
    protobuf_c_message_free_unpacked(&ack->base, NULL);
  }
  return status;
}

static void test_push_resume(void** state) {
  for (size_t i = 0; i < sizeof g_frame; i++) g_frame[i] = (uint8_t)(i * 2654435761u >> 13);
  nb_rpc_server_opts_t so = {.listen = "127.0.0.1:0", .allow_insecure = 1};
  nb_rpc_server_t* srv = NULL;
  assert_int_equal(nb_rpc_server_create(&so, &srv), NB_OK);
  assert_int_equal(nb_rpc_server_add_method(srv, M_PUSH, NB_RPC_BIDI, h_push, NULL), NB_OK);
  assert_int_equal(nb_rpc_server_start(srv), NB_OK);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", nb_rpc_server_port(srv));
  nb_rpc_client_opts_t co = {.allow_insecure = 1};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(target, &co, &cli), NB_OK);

  uint32_t start = 99, acked = 0;
  nb_rpc_stream_t* s = open_transfer(cli, &start);
  assert_int_equal(start, 0); /* a new transfer */
  assert_int_equal(send_chunks(s, 0, 17, &acked), NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK);
  assert_int_equal(acked, 17);
  nb_rpc_stream_destroy(s); /* the connection "drops": the call is cancelled mid-transfer */

  s = open_transfer(cli, &start);
  assert_int_equal(start, 17); /* resume from the last acknowledged chunk */
  assert_int_equal(send_chunks(s, start, NCHUNK, &acked),
                   NEBULA__V1__PUSH_ACK__STATUS__STATUS_COMPLETE);
  assert_int_equal(acked, NCHUNK);
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);
  assert_int_equal(g_rx.opens, 2);
  assert_memory_equal(g_rx.frame, g_frame, sizeof g_frame); /* byte-identical */

  nb_rpc_client_destroy(cli);
  nb_rpc_server_destroy(srv);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_push_resume)};
  return cmocka_run_group_tests_name("push_proto", tests, NULL, NULL);
}
