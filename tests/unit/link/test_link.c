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

static nb_link_t* link_to(const rx_side_t* r, nb_seal_ctx_t* seal, uint32_t streams, size_t chunk,
                          double cap) {
  nb_link_config_t lc = {.job_id = JOB,
                         .local_cluster = "dc-a",
                         .peer_cluster = "dc-b",
                         .target = r->target,
                         .tls = g_tls_a,
                         .seal = seal,
                         .streams = streams,
                         .chunk_bytes = chunk,
                         .rate_cap_Bps = cap};
  nb_link_t* l = NULL;
  assert_int_equal(nb_link_create(&lc, &l), NB_OK);
  return l;
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

/* 12 MiB + a ragged tail over 4 streams of 1 MiB chunks: byte-identical, estimator fed. */
static void test_transfer_4_streams(void** state) {
  rx_side_t r;
  rx_side_up(&r);
  nb_seal_ctx_t* seal_a = NULL;
  assert_int_equal(nb_seal_ctx_create(g_secret, JOB, "dc-a", "dc-b", NULL, &seal_a), NB_OK);
  nb_link_t* l = link_to(&r, seal_a, 4, 1 << 20, 0);
  size_t len = (12u << 20) + 12345;
  uint8_t* f = make_frame(len, 1);
  nb_link_send_stats_t s;
  nb_status_t st = nb_link_send(l, 1, f, len, "hdr", 3, nb_now_ns() + 30000000000LL, &s);
  assert_int_equal(st, NB_OK);
  assert_int_equal(s.chunks, 13);
  assert_int_equal(s.reconnects, 0);
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
  assert_true(rtt > 0 && rtt < 2.0);
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
  int64_t after_ns;
  int restarted;
} restarter_t;

static void* restarter(void* arg) {
  restarter_t* t = arg;
  nb_sleep_ns(t->after_ns);
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
  /* 16 MiB at an 8 MB/s cap: about 2.1 s, cut after 0.5 s */
  nb_link_t* l = link_to(&r, seal_a, 4, 256 << 10, 8e6);
  size_t len = 16u << 20;
  uint8_t* f = make_frame(len, 2);
  restarter_t t = {.r = &r, .after_ns = 500000000};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, restarter, &t), 0);
  nb_link_send_stats_t s;
  nb_status_t st = nb_link_send(l, 5, f, len, NULL, 0, nb_now_ns() + 30000000000LL, &s);
  pthread_join(th, NULL);
  if (st != NB_OK) fail_msg("send: %s", nb_error_last());
  assert_true(t.restarted);
  assert_true(s.reconnects >= 1);            /* streams were dropped and reopened */
  assert_true(s.resumed_from > 0);           /* a reopened stream was told to start past chunk 0 */
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

/* A delivered round replayed (same open, captured chunk) is rejected; a captured chunk spliced
 * into another round does not open; a resend inside a live transfer is dropped, not applied. */
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
  /* the same transfer again, after delivery: rejected at open */
  s = raw_open(cli, 7, size, RAW_CHUNK, h, &a);
  assert_int_equal(a->status, NEBULA__V1__PUSH_ACK__STATUS__STATUS_REJECTED);
  assert_non_null(strstr(a->detail, "replay"));
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
  /* a link's send of the delivered round 7 is refused too (PERMISSION), not redone */
  nb_link_t* l = link_to(&r, seal_a, 1, RAW_CHUNK, 0);
  assert_int_equal(nb_link_send(l, 7, f, size, NULL, 0, nb_now_ns() + 10000000000LL, NULL),
                   NB_ERR_PERMISSION);
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
  assert_true(rs.rejected >= 2);
  free(f);
  free(f2);
  nb_rpc_client_destroy(cli);
  nb_seal_ctx_destroy(seal_a);
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

/* The operator cap: 10 MiB at 20 MB/s takes about 0.52 s, never much less. */
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
  double expect = (len + 40 * NB_SEAL_TAG_BYTES) / cap;
  printf("rate cap %.0f MB/s: %.3f s for %zu bytes (expected %.3f s), %.1f MB/s\n", cap / 1e6,
         s.seconds, len, expect, s.goodput_Bps / 1e6);
  assert_true(s.seconds >= 0.9 * expect);       /* the cap holds (the burst is 10 ms) */
  assert_true(s.seconds <= 2.0 * expect + 0.3); /* and costs little beyond it */
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
static void* canceller(void* arg) {
  nb_sleep_ns(300000000);
  nb_link_cancel(arg);
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
  int64_t t0 = nb_now_ns();
  assert_int_equal(nb_link_send(l, 2, f, 1 << 20, NULL, 0, t0 + 700000000LL, NULL), NB_ERR_TIMEOUT);
  double took = (nb_now_ns() - t0) * 1e-9;
  assert_true(took >= 0.65 && took < 2.0);
  assert_true(nb_link_ping(l, 500, 0, NULL) != NB_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, canceller, l), 0);
  t0 = nb_now_ns();
  assert_int_equal(nb_link_send(l, 2, f, 1 << 20, NULL, 0, 0, NULL), NB_ERR_CANCELLED);
  took = (nb_now_ns() - t0) * 1e-9;
  pthread_join(th, NULL);
  assert_true(took < 1.5);
  assert_int_equal(nb_link_send(l, 2, f, 1 << 20, NULL, 0, 0, NULL), NB_ERR_CANCELLED);
  nb_link_resume(l);
  free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal_a);
  rx_side_down(&r);
}

/* Bandwidth probes pass the rate cap like data: on a 2 MB/s cap a 1 MiB probe measures about
 * 2 MB/s (the first 64 KiB ride the bucket's burst), and about 1 MB/s once the cap is halved;
 * the estimator counts them as probes; the probe thread keeps probing until stopped; bad sizes
 * are refused. */
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
  assert_true(g1 > 1.6e6 && g1 < 2.4e6);
  assert_true(g2 / g1 > 0.4 && g2 / g1 < 0.6);
  nb_estimate_t e;
  nb_estimator_get(nb_link_estimator(l), &e);
  assert_int_equal(e.probe_samples, 2);
  assert_int_equal(e.transfer_samples, 2);
  /* the thread: small probes every 50 ms (at most 25% of the time) until stopped */
  assert_int_equal(nb_link_set_rate_cap(l, 0), NB_OK);
  assert_int_equal(nb_link_probe_start(l, 4096, 50), NB_OK);
  nb_sleep_ns(600000000);
  nb_link_probe_stop(l);
  nb_estimator_get(nb_link_estimator(l), &e);
  uint64_t n = e.probe_samples;
  assert_true(n >= 4);
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
      cmocka_unit_test(test_chunk_encoding),
      cmocka_unit_test(test_transfer_4_streams),
      cmocka_unit_test(test_resume_after_drop),
      cmocka_unit_test(test_tampered_chunk),
      cmocka_unit_test(test_replay_rejected),
      cmocka_unit_test(test_identity_mismatch),
      cmocka_unit_test(test_rate_cap),
      cmocka_unit_test(test_deadline_and_cancel),
      cmocka_unit_test(test_probe),
  };
  return cmocka_run_group_tests_name("link", tests, setup, teardown);
}
