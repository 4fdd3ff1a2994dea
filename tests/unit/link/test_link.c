/* inter/link over loopback with real mTLS certificates (security/pki) and sealing: a multi-MiB
 * frame over 4 streams arrives byte-identical; the receiver's server is restarted mid-transfer
 * and the transfer resumes from the acknowledged chunks; a tampered chunk is an integrity error;
 * a replayed round is rejected; the operator cap holds; pings feed the estimator. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "certs.h"
#include "common/common.h"
#include "inter/link.h"
#include "inter/rpc.h"
#include "nebula/v1/exchange.pb-c.h"
#include "security/seal.h"

#define JOB "job-link"
static char g_dir[256];
static const char* const g_ids[] = {"dc-a", "dc-b", "dc-x"};
static nb_tls_t *g_tls_a, *g_tls_b, *g_tls_x;
static uint8_t g_secret[NB_SEAL_SECRET_BYTES];

/* The receiving side: dc-b's receiver, its seal context for dc-a, and a server (restartable). */
typedef struct {
  nb_link_rx_t* rx;
  nb_seal_ctx_t* seal_b; /* dc-b <-> dc-a, used by the receiver */
  nb_rpc_server_t* srv;
  int port;
  char target[64];
} rx_side_t;

static void server_start(rx_side_t* r, int port) {
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  nb_rpc_server_opts_t so = {.listen = listen, .tls = g_tls_b};
  for (int attempt = 0;; attempt++) { /* the old socket may linger for a moment */
    assert_int_equal(nb_rpc_server_create(&so, &r->srv), NB_OK);
    assert_int_equal(nb_link_rx_register(r->rx, r->srv), NB_OK);
    if (nb_rpc_server_start(r->srv) == NB_OK) break;
    nb_rpc_server_destroy(r->srv);
    r->srv = NULL;
    assert_true(attempt < 40);
    nb_sleep_ns(50000000);
  }
  r->port = nb_rpc_server_port(r->srv);
  snprintf(r->target, sizeof r->target, "127.0.0.1:%d", r->port);
}

static void rx_side_up(rx_side_t* r) {
  memset(r, 0, sizeof *r);
  nb_link_rx_config_t rc = {.job_id = JOB, .local_cluster = "dc-b"};
  assert_int_equal(nb_link_rx_create(&rc, &r->rx), NB_OK);
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-b", "dc-a", NULL, &r->seal_b), NB_OK);
  assert_int_equal(nb_link_rx_add_peer(r->rx, "dc-a", r->seal_b), NB_OK);
  server_start(r, 0);
}

static void rx_side_down(rx_side_t* r) {
  nb_rpc_server_destroy(r->srv);
  nb_link_rx_destroy(r->rx);
  nb_seal_ctx_destroy(r->seal_b);
}

/* A link dc-a -> dc-b; fixed: every chunk is `chunk` bytes (else chunks adapt to the rate). */
static nb_link_t* link_to_ex(const rx_side_t* r, nb_seal_ctx_t* seal, uint32_t streams,
                             size_t chunk, double cap, int fixed) {
  nb_link_config_t lc = {.job_id = JOB,
                         .local_cluster = "dc-a",
                         .peer_cluster = "dc-b",
                         .target = r->target,
                         .tls = g_tls_a,
                         .seal = seal,
                         .streams = streams,
                         .chunk_bytes = chunk,
                         .rate_cap_Bps = cap,
                         .fixed_chunks = fixed};
  nb_link_t* l = NULL;
  assert_int_equal(nb_link_create(&lc, &l), NB_OK);
  return l;
}

static nb_link_t* link_to(const rx_side_t* r, nb_seal_ctx_t* seal, uint32_t streams, size_t chunk,
                          double cap) {
  return link_to_ex(r, seal, streams, chunk, cap, 0);
}

static uint8_t* make_frame(size_t len, uint32_t seed) {
  uint8_t* f = malloc(len);
  assert_non_null(f);
  uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
  for (size_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f[i] = (uint8_t)x;
  }
  return f;
}

static int setup(void** state) {
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb-link-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) return -1;
  if (nb_test_certs_make(g_dir, g_ids, 3) != 0) return -1;
  g_tls_a = nb_test_tls_load(g_dir, "dc-a");
  g_tls_b = nb_test_tls_load(g_dir, "dc-b");
  g_tls_x = nb_test_tls_load(g_dir, "dc-x");
  if (!g_tls_a || !g_tls_b || !g_tls_x) return -1;
  return nb_seal_secret_generate(g_secret) == NB_OK ? 0 : -1;
}

static int teardown(void** state) {
  nb_tls_destroy(g_tls_a);
  nb_tls_destroy(g_tls_b);
  nb_tls_destroy(g_tls_x);
  nb_test_certs_remove(g_dir, g_ids, 3);
  return 0;
}

/* 12 MiB + a ragged tail over 4 streams of fixed 1 MiB chunks: byte-identical, estimator fed,
 * and the ack of every chunk counts as hearing from the peer. */
static void test_transfer_4_streams(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  nb_link_t* l = link_to_ex(&r, seal_a, 4, 1 << 20, 0, 1);
  assert_int_equal(nb_link_last_heard_ns(l), 0); /* nothing from dc-b yet */
  int64_t before = nb_now_ns();
  size_t len = (12u << 20) + 12345;
  uint8_t* f = make_frame(len, 1);
  nb_link_send_stats_t s;
  nb_status_t st = nb_link_send(l, 1, f, len, "hdr", 3, nb_now_ns() + 30000000000LL, &s);
  assert_int_equal(st, NB_OK);
  assert_int_equal(s.chunks, 13);
  assert_int_equal(s.chunk_bytes, 1 << 20);
  assert_int_equal(s.reconnects, 0);
  int64_t heard = nb_link_last_heard_ns(l);
  assert_true(heard > before && heard <= nb_now_ns()); /* the acks */
  uint8_t* got = NULL;
  size_t glen = 0;
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 1, nb_now_ns() + 5000000000LL, &got, &glen),
                   NB_OK);
  assert_int_equal(glen, len);
  assert_memory_equal(got, f, len);
  nb_free(got);
  /* taken once: a second take says so */
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 1, 0, &got, &glen), NB_ERR_NOT_FOUND);
  double rtt = 0;
  assert_int_equal(nb_link_ping(l, 2000, 0, &rtt), NB_OK);
  assert_true(rtt > 0);
  assert_true(nb_link_last_heard_ns(l) >= heard); /* the ping's answer */
  nb_estimate_t e;
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.transfer_samples, 1);
  assert_int_equal(e.streams, 4);
  assert_true(e.goodput_Bps > 0);
  assert_true(e.rtt_samples >= 1);
  nb_link_rx_stats_t rs;
  nb_link_rx_stats(r.rx, &rs);
  assert_int_equal(rs.chunks, 13);
  assert_int_equal(rs.frames, 1);
  assert_int_equal(rs.integrity_failures, 0);
  printf("12 MiB over 4 streams on loopback (mTLS + seal): %.3f s, %.0f Mbit/s\n", s.seconds,
         s.goodput_Bps * 8e-6);
  free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

typedef struct {
  rx_side_t* r;
  uint64_t after_chunks; /* cut once the receiver holds this many chunks */
  int restarted;
} restarter_t;

static void* restarter(void* arg) {
  restarter_t* t = arg;
  for (;;) {
    nb_link_rx_stats_t rs;
    nb_link_rx_stats(t->r->rx, &rs);
    if (rs.chunks >= t->after_chunks) break;
    nb_sleep_ns(1000000);
  }
  int port = t->r->port;
  nb_rpc_server_destroy(t->r->srv); /* every connection and call is cut */
  t->r->srv = NULL;
  nb_sleep_ns(200000000);
  server_start(t->r, port);
  t->restarted = 1;
  return NULL;
}

/* The receiver's server is destroyed mid-transfer and started again on the same port; the
 * transfer resumes from the acknowledged chunks and the frame is byte-identical. */
static void test_resume_after_drop(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  /* 16 MiB at a 4 MB/s cap in 64 chunks, cut once 8 arrived: 56 chunks (14 MB at the cap)
   * are still to come, whatever the machine's load */
  nb_link_t* l = link_to_ex(&r, seal_a, 4, 256 << 10, 4e6, 1);
  size_t len = 16u << 20;
  uint8_t* f = make_frame(len, 2);
  restarter_t t = {.r = &r, .after_chunks = 8};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, restarter, &t), 0);
  nb_link_send_stats_t s;
  nb_status_t st = nb_link_send(l, 5, f, len, NULL, 0, nb_now_ns() + 30000000000LL, &s);
  pthread_join(th, NULL);
  if (st != NB_OK) fail_msg("send: %s", nb_error_last());
  assert_true(t.restarted);
  assert_true(s.reconnects >= 1);   /* streams were dropped and reopened */
  assert_true(s.resumed_from >= 8); /* a reopened stream was told to start past the 8 held */
  assert_true(s.chunks_sent < 2 * s.chunks); /* resumed, not restarted from scratch */
  uint8_t* got = NULL;
  size_t glen = 0;
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 5, nb_now_ns() + 5000000000LL, &got, &glen),
                   NB_OK);
  assert_int_equal(glen, len);
  assert_memory_equal(got, f, len);
  nb_link_rx_stats_t rs;
  nb_link_rx_stats(r.rx, &rs);
  printf(
      "resume: %u chunks, %llu sent, resumed from chunk %u, %u reconnects, %llu opens, %llu "
      "duplicates\n",
      s.chunks, (unsigned long long)s.chunks_sent, s.resumed_from, s.reconnects,
      (unsigned long long)rs.opens, (unsigned long long)rs.duplicates);
  assert_true(rs.opens > 4);
  assert_int_equal(rs.integrity_failures, 0);
  nb_free(got);
  free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* ---- hand-driven Push streams (what a tampering or replaying middlebox would send) ---- */

static nb_rpc_stream_t* raw_open(nb_rpc_client_t* cli, uint64_t round, uint64_t size,
                                 uint32_t chunk, uint64_t hash, Nebula__V1__PushAck** ack) {
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, NB_LINK_METHOD_PUSH, 10000, NB_RPC_WAIT_FOR_READY, &s),
                   NB_OK);
  Nebula__V1__TransferKey key = NEBULA__V1__TRANSFER_KEY__INIT;
  key.job_id = (char*)JOB;
  key.sender = (char*)"dc-a";
  key.round = round;
  key.transfer_id = nb_link_transfer_id(round);
  Nebula__V1__PushOpen o = NEBULA__V1__PUSH_OPEN__INIT;
  o.key = &key;
  o.frame_size = size;
  o.chunk_size = chunk;
  o.chunk_count = (uint32_t)((size + chunk - 1) / chunk);
  o.frame_hash = hash;
  Nebula__V1__PushRequest req = NEBULA__V1__PUSH_REQUEST__INIT;
  req.kind_case = NEBULA__V1__PUSH_REQUEST__KIND_OPEN;
  req.open = &o;
  assert_int_equal(nb_rpc_stream_send_pb(s, &req.base), NB_OK);
  ProtobufCMessage* m = NULL;
  int end = 1;
  assert_int_equal(nb_rpc_stream_recv_pb(s, &nebula__v1__push_ack__descriptor, &m, &end, 5000),
                   NB_OK);
  assert_int_equal(end, 0);
  *ack = (Nebula__V1__PushAck*)m;
  return s;
}

static Nebula__V1__PushAck* raw_chunk(nb_rpc_stream_t* s, uint64_t round, uint32_t index,
                                      uint32_t chunk, const uint8_t* data, size_t len) {
  Nebula__V1__PushChunk c = NEBULA__V1__PUSH_CHUNK__INIT;
  c.transfer_id = nb_link_transfer_id(round);
  c.index = index;
  c.offset = (uint64_t)index * chunk;
  c.data.data = (uint8_t*)data;
  c.data.len = len;
  c.crc32 = nb_crc32(0, data, len);
  Nebula__V1__PushRequest req = NEBULA__V1__PUSH_REQUEST__INIT;
  req.kind_case = NEBULA__V1__PUSH_REQUEST__KIND_CHUNK;
  req.chunk = &c;
  assert_int_equal(nb_rpc_stream_send_pb(s, &req.base), NB_OK);
  ProtobufCMessage* m = NULL;
  int end = 1;
  assert_int_equal(nb_rpc_stream_recv_pb(s, &nebula__v1__push_ack__descriptor, &m, &end, 5000),
                   NB_OK);
  assert_int_equal(end, 0);
  return (Nebula__V1__PushAck*)m;
}

static size_t seal_chunk(nb_seal_ctx_t* seal, uint64_t round, uint32_t index, uint64_t size,
                         uint32_t chunk, const uint8_t* plain, size_t n, uint8_t* out) {
  uint8_t aad[64];
  uint32_t count = (uint32_t)((size + chunk - 1) / chunk);
  size_t alen =
      nb_link_chunk_aad(nb_link_transfer_id(round), size, chunk, count, NULL, 0, aad, sizeof aad);
  size_t out_len = 0;
  assert_int_equal(nb_seal_chunk(seal, round, index, aad, alen, plain, n, out, &out_len), NB_OK);
  return out_len;
}

#define RAW_CHUNK 4096u

/* A chunk whose ciphertext was changed in flight (crc32 recomputed, so only the seal can tell)
 * → STATUS_INTEGRITY, the call fails with DATA_LOSS, and the frame reports NB_ERR_INTEGRITY. */
static void test_tampered_chunk(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  nb_rpc_client_opts_t co = {.tls = g_tls_a, .expected_cluster = "dc-b"};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(r.target, &co, &cli), NB_OK);
  uint64_t size = 2 * RAW_CHUNK;
  uint8_t* f = make_frame(size, 3);
  uint8_t sealed[RAW_CHUNK + NB_SEAL_TAG_BYTES];
  Nebula__V1__PushAck* a = NULL;
  nb_rpc_stream_t* s = raw_open(cli, 11, size, RAW_CHUNK, nb_xxh3_64(f, size, 0), &a);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK);
  assert_int_equal(a->next_chunk, 0);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  size_t n = seal_chunk(seal_a, 11, 0, size, RAW_CHUNK, f, RAW_CHUNK, sealed);
  a = raw_chunk(s, 11, 0, RAW_CHUNK, sealed, n);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK);
  assert_int_equal(a->next_chunk, 1);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  n = seal_chunk(seal_a, 11, 1, size, RAW_CHUNK, f + RAW_CHUNK, RAW_CHUNK, sealed);
  sealed[100] ^= 0x01; /* one flipped bit */
  a = raw_chunk(s, 11, 1, RAW_CHUNK, sealed, n);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_INTEGRITY);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  assert_int_equal(nb_rpc_stream_finish(s), NB_ERR_INTEGRITY);
  nb_rpc_stream_destroy(s);
  uint8_t* got = NULL;
  size_t glen = 0;
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 11, nb_now_ns() + 1000000000LL, &got, &glen),
                   NB_ERR_INTEGRITY);
  /* the failure sticks: a reopened transfer is told INTEGRITY, not silently restarted */
  s = raw_open(cli, 11, size, RAW_CHUNK, nb_xxh3_64(f, size, 0), &a);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_INTEGRITY);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  nb_rpc_stream_destroy(s);
  nb_link_rx_stats_t rs;
  nb_link_rx_stats(r.rx, &rs);
  assert_true(rs.integrity_failures >= 1);

  /* A link whose round the receiver found corrupt gets NB_ERR_INTEGRITY, not a retry. */
  nb_link_t* l = link_to(&r, seal_a, 2, RAW_CHUNK, 0);
  assert_int_equal(nb_link_send(l, 11, f, size, NULL, 0, nb_now_ns() + 10000000000LL, NULL),
                   NB_ERR_INTEGRITY);
  /* A frame sealed under another job secret fails to open: integrity, round 12. */
  uint8_t other[NB_SEAL_SECRET_BYTES];
  assert_int_equal(nb_seal_secret_generate(other), NB_OK);
  nb_seal_ctx_t* wrong = NULL;
  assert_int_equal(nb_seal_ctx_create(other, JOB, "dc-a", "dc-b", NULL, &wrong), NB_OK);
  nb_link_t* l2 = link_to(&r, wrong, 2, RAW_CHUNK, 0);
  nb_status_t st = nb_link_send(l2, 12, f, size, NULL, 0, nb_now_ns() + 10000000000LL, NULL);
  assert_int_equal(st, NB_ERR_INTEGRITY);
  assert_non_null(strstr(nb_error_last(), "dc-b"));
  nb_link_destroy(l2);
  nb_seal_ctx_destroy(wrong);
  nb_link_destroy(l);
  free(f);
  nb_rpc_client_destroy(cli);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* A delivered round replayed (same open, captured chunk) is acknowledged as complete and never
 * delivered again, another transfer for it is rejected; a captured chunk spliced into another
 * round does not open; a resend inside a live transfer is dropped, not applied. */
static void test_replay_rejected(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  nb_rpc_client_opts_t co = {.tls = g_tls_a, .expected_cluster = "dc-b"};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(r.target, &co, &cli), NB_OK);
  uint64_t size = RAW_CHUNK;
  uint8_t* f = make_frame(size, 4);
  uint64_t h = nb_xxh3_64(f, size, 0);
  uint8_t captured[RAW_CHUNK + NB_SEAL_TAG_BYTES];
  size_t n = seal_chunk(seal_a, 7, 0, size, RAW_CHUNK, f, RAW_CHUNK, captured);
  Nebula__V1__PushAck* a = NULL;
  nb_rpc_stream_t* s = raw_open(cli, 7, size, RAW_CHUNK, h, &a);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  a = raw_chunk(s, 7, 0, RAW_CHUNK, captured, n);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_COMPLETE);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  nb_rpc_stream_destroy(s);
  uint8_t* got = NULL;
  size_t glen = 0;
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 7, nb_now_ns() + 1000000000LL, &got, &glen),
                   NB_OK);
  assert_memory_equal(got, f, size);
  nb_free(got);
  /* the same transfer again, after delivery (a sender resuming after a lost last ack, or a
   * replay): told it is complete, its chunk acked as complete, nothing delivered again */
  s = raw_open(cli, 7, size, RAW_CHUNK, h, &a);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_COMPLETE);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  a = raw_chunk(s, 7, 0, RAW_CHUNK, captured, n);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_COMPLETE);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  nb_rpc_stream_destroy(s);
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 7, 0, &got, &glen), NB_ERR_NOT_FOUND);
  /* another transfer for the delivered round (a different frame): rejected at open */
  uint64_t h2 = h ^ 1;
  s = raw_open(cli, 7, size, RAW_CHUNK, h2, &a);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_REJECTED);
  assert_non_null(strstr(a->detail, "another transfer"));
  protobuf_c_message_free_unpacked(&a->base, NULL);
  assert_int_equal(nb_rpc_stream_finish(s), NB_ERR_PERMISSION);
  nb_rpc_stream_destroy(s);
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 7, 0, &got, &glen), NB_ERR_NOT_FOUND);
  /* the captured chunk spliced into round 8: the nonce and AAD differ, it does not open */
  s = raw_open(cli, 8, size, RAW_CHUNK, h, &a);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  a = raw_chunk(s, 8, 0, RAW_CHUNK, captured, n);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_INTEGRITY);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  nb_rpc_stream_destroy(s);
  /* a link's send of the delivered round 7 (the same frame): complete at once, not redone */
  nb_link_t* l = link_to(&r, seal_a, 1, RAW_CHUNK, 0);
  assert_int_equal(nb_link_send(l, 7, f, size, NULL, 0, nb_now_ns() + 10000000000LL, NULL), NB_OK);
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 7, 0, &got, &glen), NB_ERR_NOT_FOUND);
  nb_link_destroy(l);
  /* inside a live transfer (round 9, 2 chunks) a chunk sent twice is dropped as a duplicate */
  uint8_t* f2 = make_frame(2 * RAW_CHUNK, 5);
  s = raw_open(cli, 9, 2 * RAW_CHUNK, RAW_CHUNK, nb_xxh3_64(f2, 2 * RAW_CHUNK, 0), &a);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  n = seal_chunk(seal_a, 9, 0, 2 * RAW_CHUNK, RAW_CHUNK, f2, RAW_CHUNK, captured);
  for (int k = 0; k < 2; k++) {
    a = raw_chunk(s, 9, 0, RAW_CHUNK, captured, n);
    assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_OK);
    assert_int_equal(a->next_chunk, 1);
    protobuf_c_message_free_unpacked(&a->base, NULL);
  }
  nb_rpc_stream_destroy(s);
  nb_link_rx_stats_t rs;
  nb_link_rx_stats(r.rx, &rs);
  assert_int_equal(rs.duplicates, 1);
  assert_true(rs.rejected >= 1); /* the other transfer for round 7 */
  free(f);
  free(f2);
  nb_rpc_client_destroy(cli);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* A restarted sender (a resumed or rejoined cluster) seals under a newer epoch, so its redone
 * rounds never reuse its earlier incarnation's key and nonces; the receiver adopts the newer
 * epoch from the PushOpen and refuses the older one from then on. */
static void test_sender_epoch(void** state) {
  (void)state;
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t *old = NULL, *now = NULL;
  assert_int_equal(
      nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", &(nb_seal_opts_t){.local_epoch = 2}, &old),
      NB_OK);
  assert_int_equal(
      nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", &(nb_seal_opts_t){.local_epoch = 4}, &now),
      NB_OK);
  size_t size = 3 * RAW_CHUNK;
  uint8_t* f = make_frame(size, 11);
  int64_t dl = nb_now_ns() + 10000000000LL;
  uint8_t* got = NULL;
  size_t glen = 0;
  nb_link_t* l = link_to(&r, old, 2, RAW_CHUNK, 0);
  assert_int_equal(nb_link_send(l, 1, f, size, NULL, 0, dl, NULL), NB_OK);
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 1, dl, &got, &glen), NB_OK);
  assert_memory_equal(got, f, size);
  nb_free(got);
  assert_int_equal(nb_seal_peer_epoch(r.seal_b), 2);
  nb_link_t* l2 = link_to(&r, now, 2, RAW_CHUNK, 0); /* the same cluster, restarted */
  assert_int_equal(nb_link_send(l2, 2, f, size, NULL, 0, dl, NULL), NB_OK);
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 2, dl, &got, &glen), NB_OK);
  assert_memory_equal(got, f, size);
  nb_free(got);
  assert_int_equal(nb_seal_peer_epoch(r.seal_b), 4);
  /* the earlier incarnation (or a replay of it) is refused now */
  assert_int_equal(nb_link_send(l, 3, f, size, NULL, 0, nb_now_ns() + 5000000000LL, NULL),
                   NB_ERR_PERMISSION);
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 3, 0, &got, &glen), NB_ERR_TIMEOUT); /* none */
  nb_link_destroy(l);
  nb_link_destroy(l2);
  free(f);
  nb_seal_ctx_destroy(old);
  nb_seal_ctx_destroy(now);
  rx_side_down(&r);
}

/* A sender whose certificate is another cluster than the `sender` it claims is refused. */
static void test_identity_mismatch(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  nb_rpc_client_opts_t co = {.tls = g_tls_x, .expected_cluster = "dc-b"};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(r.target, &co, &cli), NB_OK);
  Nebula__V1__PushAck* a = NULL;
  nb_rpc_stream_t* s = raw_open(cli, 1, 10, RAW_CHUNK, 0, &a); /* claims dc-a, is dc-x */
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_REJECTED);
  assert_non_null(strstr(a->detail, "dc-x"));
  protobuf_c_message_free_unpacked(&a->base, NULL);
  nb_rpc_stream_destroy(s);
  nb_rpc_client_destroy(cli);
  rx_side_down(&r);
}

/* The operator cap: every chunk's sealed bytes pass the link's bucket (whose pacing
 * tests/unit/wanlink checks), at the cap's rate, and the sends had to wait for it. */
static void test_rate_cap(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  double cap = 20e6;
  nb_link_t* l = link_to(&r, seal_a, 4, 256 << 10, cap);
  size_t len = 10u << 20;
  uint8_t* f = make_frame(len, 6);
  nb_link_send_stats_t s;
  assert_int_equal(nb_link_send(l, 3, f, len, NULL, 0, nb_now_ns() + 30000000000LL, &s), NB_OK);
  double expect = (len + (double)s.chunks * NB_SEAL_TAG_BYTES) / cap;
  printf("rate cap %.0f MB/s: %.3f s for %zu bytes (%.3f s at the cap), %.1f MB/s\n", cap / 1e6,
         s.seconds, len, expect, s.goodput_Bps / 1e6);
  nb_ratelimit_stats_t rl;
  nb_link_ratelimit_stats(l, &rl);
  assert_int_equal(s.chunk_bytes, 256 << 10); /* 20 MB/s x 1 s / 4 streams > 256 KiB */
  assert_int_equal(s.chunks, 40);
  assert_int_equal(s.chunks_sent, s.chunks); /* no resend */
  assert_true(rl.rate_Bps == cap);
  assert_int_equal(rl.acquires, s.chunks_sent);                        /* one per chunk */
  assert_int_equal(rl.bytes, len + s.chunks_sent * NB_SEAL_TAG_BYTES); /* its sealed bytes */
  assert_true(rl.waits >= 1); /* 10 MiB is far beyond the bucket's 64 KiB burst */
  uint8_t* got = NULL;
  size_t glen = 0;
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 3, nb_now_ns() + 2000000000LL, &got, &glen),
                   NB_OK);
  assert_memory_equal(got, f, len);
  nb_free(got);
  free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* Deadlines and cancellation: nobody listening → NB_ERR_TIMEOUT at the deadline;
 * nb_link_cancel from another thread → NB_ERR_CANCELLED promptly. */
typedef struct {
  nb_link_t* l;
  int cancelled;
} canceller_t;

static void* canceller(void* arg) {
  canceller_t* c = arg;
  nb_sleep_ns(300000000);
  __atomic_store_n(&c->cancelled, 1, __ATOMIC_SEQ_CST);
  nb_link_cancel(c->l);
  return NULL;
}

static void test_deadline_and_cancel(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  char target[64];
  snprintf(target, sizeof target, "%s", r.target);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  nb_link_t* l = link_to(&r, seal_a, 2, 64 << 10, 0);
  nb_rpc_server_destroy(r.srv); /* nobody listens any more */
  r.srv = NULL;
  uint8_t* f = make_frame(1 << 20, 7);
  int64_t deadline = nb_now_ns() + 700000000LL;
  assert_int_equal(nb_link_send(l, 2, f, 1 << 20, NULL, 0, deadline, NULL), NB_ERR_TIMEOUT);
  assert_true(nb_now_ns() >= deadline); /* it gave up at the deadline, not before */
  assert_true(nb_link_ping(l, 500, 0, NULL) != NB_OK);
  assert_int_equal(nb_link_last_heard_ns(l), 0); /* never heard from anyone */
  /* cancelled from another thread: CANCELLED, long before a generous deadline would fire */
  pthread_t th;
  canceller_t c = {.l = l};
  assert_int_equal(pthread_create(&th, NULL, canceller, &c), 0);
  assert_int_equal(nb_link_send(l, 2, f, 1 << 20, NULL, 0, nb_now_ns() + 600000000000LL, NULL),
                   NB_ERR_CANCELLED);
  assert_true(__atomic_load_n(&c.cancelled, __ATOMIC_SEQ_CST)); /* only after the cancel */
  pthread_join(th, NULL);
  assert_int_equal(nb_link_send(l, 2, f, 1 << 20, NULL, 0, 0, NULL), NB_ERR_CANCELLED);
  nb_link_resume(l);
  free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* Bandwidth probes pass the rate cap like data: a 1 MiB probe on a 2 MB/s cap never measures
 * more than the cap allows (the first 64 KiB ride the bucket's burst), nor more than the halved
 * cap once it is halved; its bytes are charged to the bucket; the estimator counts them as
 * probes; the probe thread keeps probing until stopped; bad sizes are refused. */
static void test_probe(void** state) {
  (void)state;
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  nb_link_t* l = link_to(&r, seal_a, 1, 1 << 20, 2e6);
  for (int i = 0; i < 3; i++) assert_int_equal(nb_link_ping(l, 2000, 0, NULL), NB_OK);
  double g1 = 0, g2 = 0;
  assert_int_equal(nb_link_probe(l, 1 << 20, 5000, &g1), NB_OK);
  assert_int_equal(nb_link_set_rate_cap(l, 1e6), NB_OK);
  nb_sleep_ns(100000000); /* let the bucket refill its burst, as between rounds */
  assert_int_equal(nb_link_probe(l, 1 << 20, 5000, &g2), NB_OK);
  printf("probes: %.2f MB/s on a 2 MB/s cap, %.2f MB/s on 1 MB/s\n", g1 * 1e-6, g2 * 1e-6);
  /* the bucket lets burst + rate x t through in t: a probe of B bytes measures at most
   * rate x B / (B - burst); load only makes it slower */
  double burst = 64 << 10, mib = 1 << 20;
  assert_true(g1 > 0 && g1 <= 2e6 * mib / (mib - burst) * 1.05);
  assert_true(g2 > 0 && g2 <= 1e6 * mib / (mib - burst) * 1.05);
  nb_ratelimit_stats_t rl;
  nb_link_ratelimit_stats(l, &rl);
  assert_int_equal(rl.bytes, 2u << 20); /* both probes were charged to the cap */
  nb_estimate_t e;
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 2);
  assert_int_equal(e.transfer_samples, 2);
  /* the thread: small probes every 50 ms (at most 25% of the time) until stopped */
  assert_int_equal(nb_link_set_rate_cap(l, 0), NB_OK);
  assert_int_equal(nb_link_probe_start(l, 4096, 50), NB_OK);
  for (int i = 0; i < 60000; i++) { /* 4 more probes (the guard only ends a hang) */
    nb_estimator_get(nb_link_estimator(l), &e);
    if (e.probe_samples >= 6) break;
    nb_sleep_ns(1000000);
  }
  nb_link_probe_stop(l);
  nb_estimator_get(nb_link_estimator(l), &e);
  uint64_t n = e.probe_samples;
  assert_true(n >= 6);
  nb_sleep_ns(200000000);
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, n); /* stopped */
  assert_int_equal(nb_link_probe(l, 0, 1000, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_link_probe(l, (5u << 20), 1000, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_link_probe_start(l, 4096, 5), NB_ERR_INVALID);
  assert_int_equal(nb_link_probe_start(l, 1024, 50), NB_OK); /* stopped by destroy */
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* Adaptive chunks: the rule, then links that use it. With a cap the chunk follows the cap;
 * without one the first send uses the smallest chunk, and the next one follows the goodput the
 * first measured. */
static void test_adaptive_chunks(void** state) {
  (void)state;
  const size_t kib = 1024, mib = 1 << 20;
  /* 0.5 Mbit/s, 4 streams, 1 s per chunk: 15.6 kB, raised to the 16 KiB floor */
  assert_int_equal(nb__link_chunk_for_rate(62500, 4, 1000, 16 * kib, mib), 16 * kib);
  /* 100 Mbit/s: 3.1 MB per stream-second, held to the configured 1 MiB */
  assert_int_equal(nb__link_chunk_for_rate(12.5e6, 4, 1000, 16 * kib, mib), mib);
  /* 8 Mbit/s, 4 streams, 1 s: 250000 bytes, in whole KiB */
  assert_int_equal(nb__link_chunk_for_rate(1e6, 4, 1000, 16 * kib, mib), 244 * kib);
  assert_int_equal(nb__link_chunk_for_rate(1e6, 2, 500, 16 * kib, mib), 244 * kib);
  assert_int_equal(nb__link_chunk_for_rate(1e6, 0, 1000, 16 * kib, mib), 976 * kib); /* 1 */
  assert_int_equal(nb__link_chunk_for_rate(1e6, 4, 0, 16 * kib, mib), mib);          /* fixed */
  assert_int_equal(nb__link_chunk_for_rate(0, 4, 1000, 16 * kib, mib), 16 * kib);    /* unknown */
  assert_int_equal(nb__link_chunk_for_rate(62500, 4, 1000, 16 * kib, 4 * kib), 4 * kib);

  /* Which sends measure the rate: a dense 430 kB frame on 100 Mbit/s 50 ms away (625 kB in
   * flight) is slow start, not rate; on 0.5 Mbit/s it is 69 bandwidth-delay products */
  assert_false(nb__link_send_measures_rate(430000, 12.5e6, 0.05));
  assert_true(nb__link_send_measures_rate(430000, 62500, 0.1));
  assert_true(nb__link_send_measures_rate(5000001, 12.5e6, 0.05)); /* 8 x 625 kB */
  assert_true(nb__link_send_measures_rate(430000, 0, 0.05));       /* no configured rate */
  assert_true(nb__link_send_measures_rate(430000, 12.5e6, 0));     /* no RTT yet */

  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  /* a 2 MB/s cap over 2 streams: 1 MB per stream-second -> 976 KiB chunks, no probe */
  nb_link_t* l = link_to(&r, seal_a, 2, 4 * mib, 2e6);
  assert_true(nb_link_rate_Bps(l) == 2e6);
  assert_int_equal(nb_link_chunk_bytes(l), 976 * kib);
  size_t len = 2 * mib + 5;
  uint8_t* f = make_frame(len, 21);
  nb_link_send_stats_t s;
  assert_int_equal(nb_link_send(l, 1, f, len, NULL, 0, nb_now_ns() + 60000000000LL, &s), NB_OK);
  assert_int_equal(s.chunk_bytes, 976 * kib);
  assert_int_equal(s.chunks, (len + 976 * kib - 1) / (976 * kib));
  nb_estimate_t e;
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 0);
  uint8_t* got = NULL;
  size_t glen = 0;
  assert_int_equal(nb_link_rx_take(r.rx, "dc-a", 1, nb_now_ns() + 60000000000LL, &got, &glen),
                   NB_OK);
  assert_int_equal(glen, len);
  assert_memory_equal(got, f, len);
  nb_free(got);
  /* the cap lowered to 100 kB/s: the next send cuts 48 KiB chunks (100 kB x 1 s / 2) */
  assert_int_equal(nb_link_set_rate_cap(l, 1e5), NB_OK);
  assert_int_equal(nb_link_chunk_bytes(l), 48 * kib);
  nb_link_destroy(l);

  /* no cap: the first send uses the smallest chunk and measures the rate; the next one cuts
   * its chunks from that measurement */
  l = link_to(&r, seal_a, 2, 256 * kib, 0);
  assert_true(nb_link_rate_Bps(l) == 0);
  assert_int_equal(nb_link_chunk_bytes(l), 16 * kib); /* unknown: the smallest */
  assert_int_equal(nb_link_send(l, 2, f, len, NULL, 0, nb_now_ns() + 60000000000LL, &s), NB_OK);
  assert_int_equal(s.chunk_bytes, 16 * kib);
  assert_int_equal(s.chunks, (len + 16 * kib - 1) / (16 * kib));
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.transfer_samples, 1);
  double rate = nb_link_rate_Bps(l); /* min(goodput estimate, this send's goodput) */
  assert_true(e.goodput_Bps > 0 && rate > 0 && rate <= e.goodput_Bps);
  assert_true(rate <= (double)len / s.seconds * 1.000001);
  size_t want = nb__link_chunk_for_rate(rate, 2, 1000, 16 * kib, 256 * kib);
  assert_int_equal(nb_link_chunk_bytes(l), want);
  assert_int_equal(nb_link_send(l, 3, f, len, NULL, 0, nb_now_ns() + 60000000000LL, &s), NB_OK);
  assert_int_equal(s.chunk_bytes, want);
  assert_int_equal(s.chunks, (len + want - 1) / want);
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 0);
  assert_int_equal(e.transfer_samples, 2);
  for (uint64_t rd = 2; rd <= 3; rd++) {
    assert_int_equal(nb_link_rx_take(r.rx, "dc-a", rd, nb_now_ns() + 60000000000LL, &got, &glen),
                     NB_OK);
    assert_memory_equal(got, f, len);
    nb_free(got);
  }
  /* the receiver heard dc-a: opens and chunks; the chunk size it saw is gone with the frame */
  nb_link_rx_peer_t rp;
  nb_error(NB_ERR_IO, "an earlier failure");
  assert_int_equal(nb_link_rx_peer(r.rx, "dc-a", &rp), NB_OK);
  assert_string_equal(nb_error_last(),
                      "an earlier failure"); /* a lookup that found it says nothing */
  assert_true(rp.last_heard_ns > 0 && rp.messages >= 3);
  assert_int_equal(rp.chunk_bytes, 0);
  assert_int_equal(nb_link_rx_peer(r.rx, "dc-z", &rp), NB_ERR_NOT_FOUND);
  assert_non_null(strstr(nb_error_last(), "'dc-z' is not a peer"));
  free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* The rate hint: the rate while nothing is measured or capped (the first chunks fit a thin
 * link); a frame too small for a transfer sample is timed as a probe, and the probe thread
 * leaves a link alone for NB_LINK_PROBE_IDLE_MS after a send. */
static void test_rate_hint_and_small_sends(void** state) {
  (void)state;
  const size_t kib = 1024;
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  nb_link_config_t lc = {.job_id = JOB,
                         .local_cluster = "dc-a",
                         .peer_cluster = "dc-b",
                         .target = r.target,
                         .tls = g_tls_a,
                         .seal = seal_a,
                         .streams = 2,
                         .chunk_bytes = 1 << 20,
                         .rate_hint_Bps = 1e5};
  nb_link_t* l = NULL;
  lc.rate_hint_Bps = -1;
  assert_int_equal(nb_link_create(&lc, &l), NB_ERR_INVALID);
  lc.rate_hint_Bps = 1e5;
  assert_int_equal(nb_link_create(&lc, &l), NB_OK);
  assert_true(nb_link_rate_Bps(l) == 1e5);
  assert_int_equal(nb_link_chunk_bytes(l), 48 * kib); /* 100 kB/s x 1 s over 2 streams */
  /* 20 KiB frames (0.2 s at the hinted rate): no transfer sample; the first send (its time has
   * the handshakes in it) measures nothing, the second is timed like a probe; then the estimate
   * rules */
  for (int i = 0; i < 3; i++) assert_int_equal(nb_link_ping(l, 2000, 0, NULL), NB_OK);
  size_t len = 20 * kib;
  uint8_t* f = make_frame(len, 5);
  nb_link_send_stats_t s;
  assert_int_equal(nb_link_send(l, 1, f, len, NULL, 0, nb_now_ns() + 60000000000LL, &s), NB_OK);
  nb_estimate_t e;
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 0);
  assert_true(nb_link_rate_Bps(l) == 1e5);
  assert_int_equal(nb_link_send(l, 2, f, len, NULL, 0, nb_now_ns() + 60000000000LL, &s), NB_OK);
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 1);
  assert_int_equal(e.transfer_samples, 1);
  assert_true(e.goodput_Bps > 0);
  double rate = nb_link_rate_Bps(l);
  assert_true(rate > 0 && rate <= e.goodput_Bps); /* measured: the hint is no longer used */
  /* the probe thread (every 50 ms) waits for an idle link: no probe right after the send */
  assert_int_equal(nb_link_probe_start(l, 4096, 50), NB_OK);
  nb_sleep_ns(300000000);
  nb_link_probe_stop(l);
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 1);
  for (uint64_t rd = 1; rd <= 2; rd++) {
    uint8_t* got = NULL;
    size_t glen = 0;
    assert_int_equal(nb_link_rx_take(r.rx, "dc-a", rd, nb_now_ns() + 60000000000LL, &got, &glen),
                     NB_OK);
    assert_int_equal(glen, len);
    assert_memory_equal(got, f, len);
    nb_free(got);
  }
  nb_link_destroy(l);
  /* hinted at 10 MB/s the same frames take 2 ms: their time is latency and CPU, no sample */
  lc.rate_hint_Bps = 1e7;
  assert_int_equal(nb_link_create(&lc, &l), NB_OK);
  for (uint64_t rd = 3; rd <= 4; rd++) {
    assert_int_equal(nb_link_send(l, rd, f, len, NULL, 0, nb_now_ns() + 60000000000LL, &s), NB_OK);
    uint8_t* got = NULL;
    size_t glen = 0;
    assert_int_equal(nb_link_rx_take(r.rx, "dc-a", rd, nb_now_ns() + 60000000000LL, &got, &glen),
                     NB_OK);
    nb_free(got);
  }
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 0);
  assert_int_equal(e.transfer_samples, 0);
  free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* The chunk messages the sender builds by hand (to seal straight into them) are byte-identical to
 * protobuf-c's packing of the same PushRequest, and protobuf-c reads them back. */
static void test_chunk_encoding(void** state) {
  (void)state;
  static const struct {
    uint64_t tid;
    uint32_t index;
    uint64_t offset;
    size_t len;
    uint32_t crc;
  } cases[] = {{0, 0, 0, 1, 0},
               {1, 0, 0, 16, 0},
               {0x123456789abcdefull, 7, 7u << 20, (1u << 20) + 16, 0},
               {42, 127, 128, 300, 0xffffffffu},
               {UINT64_MAX, UINT32_MAX, UINT64_MAX - 5, 5, 1}};
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    uint8_t* data = malloc(cases[k].len);
    assert_non_null(data);
    for (size_t i = 0; i < cases[k].len; i++) data[i] = (uint8_t)(i * 31 + k);
    Nebula__V1__PushChunk c = NEBULA__V1__PUSH_CHUNK__INIT;
    c.transfer_id = cases[k].tid;
    c.index = cases[k].index;
    c.offset = cases[k].offset;
    c.data.data = data;
    c.data.len = cases[k].len;
    c.crc32 = cases[k].crc;
    Nebula__V1__PushRequest req = NEBULA__V1__PUSH_REQUEST__INIT;
    req.kind_case = NEBULA__V1__PUSH_REQUEST__KIND_CHUNK;
    req.chunk = &c;
    size_t want = protobuf_c_message_get_packed_size(&req.base);
    uint8_t* ref = malloc(want);
    assert_non_null(ref);
    assert_int_equal(protobuf_c_message_pack(&req.base, ref), want);
    size_t at = 0;
    size_t n =
        nb__link_chunk_encode(NULL, c.transfer_id, c.index, c.offset, c.data.len, c.crc32, &at);
    assert_int_equal(n, want);
    uint8_t* mine = malloc(n);
    assert_non_null(mine);
    assert_int_equal(
        nb__link_chunk_encode(mine, c.transfer_id, c.index, c.offset, c.data.len, c.crc32, &at), n);
    assert_true(at + c.data.len <= n);
    memcpy(mine + at, data, c.data.len);
    assert_memory_equal(mine, ref, n);
    Nebula__V1__PushRequest* back = (Nebula__V1__PushRequest*)protobuf_c_message_unpack(
        &nebula__v1__push_request__descriptor, NULL, n, mine);
    assert_non_null(back);
    assert_int_equal(back->kind_case, NEBULA__V1__PUSH_REQUEST__KIND_CHUNK);
    assert_true(back->chunk->transfer_id == c.transfer_id && back->chunk->offset == c.offset);
    assert_int_equal(back->chunk->index, c.index);
    assert_int_equal(back->chunk->crc32, c.crc32);
    assert_int_equal(back->chunk->data.len, c.data.len);
    assert_memory_equal(back->chunk->data.data, data, c.data.len);
    protobuf_c_message_free_unpacked(&back->base, NULL);
    free(mine);
    free(ref);
    free(data);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_encoding),      cmocka_unit_test(test_transfer_4_streams),
      cmocka_unit_test(test_resume_after_drop),   cmocka_unit_test(test_tampered_chunk),
      cmocka_unit_test(test_replay_rejected),     cmocka_unit_test(test_sender_epoch),
      cmocka_unit_test(test_identity_mismatch),   cmocka_unit_test(test_rate_cap),
      cmocka_unit_test(test_deadline_and_cancel), cmocka_unit_test(test_probe),
      cmocka_unit_test(test_adaptive_chunks),     cmocka_unit_test(test_rate_hint_and_small_sends),
  };
  return cmocka_run_group_tests_name("link", tests, setup, teardown);
}
