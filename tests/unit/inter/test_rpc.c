/* Unit tests of inter/rpc over plaintext loopback: unary, server-, client- and bidi-streaming
 * round trips, deadlines, wait-for-ready, shutdown with calls in flight, garbage and oversized
 * input. mTLS is tested in tests/unit/tls. Deadlines run on the real clock, so verdicts rest on
 * statuses and order (DEADLINE_EXCEEDED, CANCELLED, which receive ended how), never on how long
 * something took; HANG_MS bounds waits that only a hang would exhaust. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/common.h"
#include "inter/rpc.h"
#include "nebula/v1/exchange.pb-c.h"

#define M_UNARY "/test.Echo/Unary"
#define M_SLOW "/test.Echo/Slow"
#define M_SSTREAM "/test.Echo/ServerStream"
#define M_CSTREAM "/test.Echo/ClientStream"
#define M_BIDI "/test.Echo/Bidi"
#define M_BLOCK "/test.Echo/Block"
#define M_FAIL "/test.Echo/Fail"
#define M_PING "/nebula.v1.Exchange/Ping"

/* Outer bound (real time) for calls and waits that should end long before it: reaching it means
 * a hang, never a slow machine. */
#define HANG_MS 30000

/* Polls until *v >= want or HANG_MS pass; returns the last value seen. */
static int wait_atomic(atomic_int* v, int want) {
  int64_t end = nb_now_ns() + HANG_MS * 1000000LL;
  int got;
  while ((got = atomic_load(v)) < want && nb_now_ns() < end) nb_sleep_ns(1000000);
  return got;
}

typedef struct {
  void* (*fn)(void*);
  void* arg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
} bounded_t;

static void* bounded_main(void* p) {
  bounded_t* b = p;
  b->fn(b->arg);
  pthread_mutex_lock(&b->mu);
  b->done = 1;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

/* Runs fn(arg) on a thread and returns 1 once it returned, 0 if it is still running after
 * HANG_MS (a hang: the thread is left behind and the test fails). */
static int returns(void* (*fn)(void*), void* arg) {
  static bounded_t b; /* static: a hung thread may still touch it after we return */
  memset(&b, 0, sizeof b);
  b.fn = fn;
  b.arg = arg;
  pthread_mutex_init(&b.mu, NULL);
  nb_clock_cond_init(&b.cv);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, bounded_main, &b), 0);
  struct timespec ts;
  int64_t end = nb_now_ns() + HANG_MS * 1000000LL;
  ts.tv_sec = end / 1000000000LL;
  ts.tv_nsec = end % 1000000000LL;
  pthread_mutex_lock(&b.mu);
  while (!b.done)
    if (pthread_cond_timedwait(&b.cv, &b.mu, &ts) != 0) break;
  int done = b.done;
  pthread_mutex_unlock(&b.mu);
  if (!done) return 0;
  pthread_join(t, NULL);
  pthread_cond_destroy(&b.cv);
  pthread_mutex_destroy(&b.mu);
  return 1;
}

static atomic_int g_slow_started;
static atomic_int g_slow_cancelled;
static atomic_int g_block_entered;
static atomic_int g_block_returned;

static nb_status_t h_unary(nb_rpc_call_t* call, void* user) {
  nb_rpc_msg_t m;
  int end;
  NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
  if (end) return nb_error(NB_ERR_INVALID, "no request");
  nb_status_t st = nb_rpc_call_send(call, m.data, m.len);
  nb_rpc_msg_release(&m);
  return st;
}

static nb_status_t h_slow(nb_rpc_call_t* call, void* user) {
  nb_rpc_msg_t m;
  int end;
  NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
  nb_rpc_msg_release(&m);
  atomic_fetch_add(&g_slow_started, 1);
  /* answers only after HANG_MS: a caller with a shorter deadline must see it expire */
  int64_t until = nb_now_ns() + HANG_MS * 1000000LL;
  while (nb_now_ns() < until) {
    if (nb_rpc_call_cancelled(call)) {
      atomic_fetch_add(&g_slow_cancelled, 1);
      return nb_error(NB_ERR_CANCELLED, "client gone");
    }
    nb_sleep_ns(1000000);
  }
  return nb_rpc_call_send(call, "late", 4);
}

static nb_status_t h_sstream(nb_rpc_call_t* call, void* user) {
  nb_rpc_msg_t m;
  int end;
  NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
  if (end || m.len != 4) {
    nb_rpc_msg_release(&m);
    return nb_error(NB_ERR_INVALID, "want a 4-byte count");
  }
  uint32_t n;
  memcpy(&n, m.data, 4);
  nb_rpc_msg_release(&m);
  for (uint32_t i = 0; i < n; i++) NB_CHECK(nb_rpc_call_send(call, &i, sizeof i));
  return NB_OK;
}

static nb_status_t h_cstream(nb_rpc_call_t* call, void* user) {
  uint64_t count = 0, bytes = 0;
  for (;;) {
    nb_rpc_msg_t m;
    int end;
    NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
    if (end) break;
    count++;
    bytes += m.len;
    nb_rpc_msg_release(&m);
  }
  uint64_t r[2] = {count, bytes};
  return nb_rpc_call_send(call, r, sizeof r);
}

static nb_status_t h_bidi(nb_rpc_call_t* call, void* user) {
  for (;;) {
    nb_rpc_msg_t m;
    int end;
    NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
    if (end) return NB_OK;
    nb_status_t st = nb_rpc_call_send(call, m.data, m.len);
    nb_rpc_msg_release(&m);
    NB_CHECK(st);
  }
}

static nb_status_t h_block(nb_rpc_call_t* call, void* user) {
  atomic_fetch_add(&g_block_entered, 1);
  nb_rpc_msg_t m;
  int end;
  nb_status_t st;
  while ((st = nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE)) == NB_OK && !end)
    nb_rpc_msg_release(&m);
  atomic_fetch_add(&g_block_returned, 1);
  return st;
}

/* Sends "tick" whenever no message came within 50 ms, echoes messages. */
static nb_status_t h_tick(nb_rpc_call_t* call, void* user) {
  for (;;) {
    nb_rpc_msg_t m;
    int end;
    nb_status_t st = nb_rpc_call_recv(call, &m, &end, 50);
    if (st == NB_ERR_TIMEOUT) {
      NB_CHECK(nb_rpc_call_send(call, "tick", 4));
      continue;
    }
    NB_CHECK(st);
    if (end) return NB_OK;
    st = nb_rpc_call_send(call, m.data, m.len);
    nb_rpc_msg_release(&m);
    NB_CHECK(st);
  }
}

/* Returns while its receive is still running: the wrapper must finish it. */
static nb_status_t h_leave_pending(nb_rpc_call_t* call, void* user) {
  nb_rpc_msg_t m;
  int end;
  nb_status_t st = nb_rpc_call_recv(call, &m, &end, 10);
  if (st == NB_OK && !end) nb_rpc_msg_release(&m);
  return st == NB_ERR_TIMEOUT ? NB_OK : nb_error(NB_ERR_INTERNAL, "expected a timeout");
}

/* Answers with the deadline it sees (ms left, -1 for none) and the peer address. */
static nb_status_t h_deadline(nb_rpc_call_t* call, void* user) {
  nb_rpc_msg_t m;
  int end;
  NB_CHECK(nb_rpc_call_recv(call, &m, &end, NB_RPC_INFINITE));
  nb_rpc_msg_release(&m);
  char out[160];
  int n = snprintf(out, sizeof out, "%lld %s", (long long)nb_rpc_call_deadline_left_ms(call),
                   nb_rpc_call_peer_address(call));
  return nb_rpc_call_send(call, out, (size_t)n);
}

static nb_status_t h_cancel_self(nb_rpc_call_t* call, void* user) {
  /* cancels its own call, as a helper thread would; the recv then fails at once */
  nb_rpc_call_cancel(call);
  nb_rpc_msg_t m;
  int end;
  nb_status_t st = nb_rpc_call_recv(call, &m, &end, HANG_MS);
  if (st == NB_OK && !end) nb_rpc_msg_release(&m);
  return st == NB_ERR_CANCELLED ? NB_OK : nb_error(NB_ERR_INTERNAL, "recv after cancel: %d", st);
}

static nb_status_t h_fail(nb_rpc_call_t* call, void* user) {
  return nb_error(NB_ERR_NOT_FOUND, "round %d is not here", 42);
}

static nb_status_t h_ping(nb_rpc_call_t* call, void* user) {
  ProtobufCMessage* in = NULL;
  int end;
  NB_CHECK(
      nb_rpc_call_recv_pb(call, &nebula__v1__ping_request__descriptor, &in, &end, NB_RPC_INFINITE));
  if (end) return nb_error(NB_ERR_INVALID, "no ping");
  Nebula__V1__PingRequest* req = (Nebula__V1__PingRequest*)in;
  Nebula__V1__PingReply rep = NEBULA__V1__PING_REPLY__INIT;
  rep.seq = req->seq;
  rep.echo_sent_unix_ns = req->sent_unix_ns;
  rep.responder = (char*)"test";
  rep.payload_size_seen = (uint32_t)req->payload.len;
  uint8_t* pl = calloc(1, req->reply_size + 1);
  rep.payload.data = pl;
  rep.payload.len = req->reply_size;
  nb_status_t st = nb_rpc_call_send_pb(call, &rep.base);
  free(pl);
  protobuf_c_message_free_unpacked(in, NULL);
  return st;
}

static nb_status_t start_server(const char* listen, size_t max_msg, int max_calls,
                                nb_rpc_server_t** out) {
  nb_rpc_server_opts_t o = {
      .listen = listen, .allow_insecure = 1, .max_message_bytes = max_msg, .max_calls = max_calls};
  nb_rpc_server_t* srv = NULL;
  NB_CHECK(nb_rpc_server_create(&o, &srv));
  nb_rpc_server_add_method(srv, M_UNARY, NB_RPC_UNARY, h_unary, NULL);
  nb_rpc_server_add_method(srv, M_SLOW, NB_RPC_UNARY, h_slow, NULL);
  nb_rpc_server_add_method(srv, M_SSTREAM, NB_RPC_SERVER_STREAMING, h_sstream, NULL);
  nb_rpc_server_add_method(srv, M_CSTREAM, NB_RPC_CLIENT_STREAMING, h_cstream, NULL);
  nb_rpc_server_add_method(srv, M_BIDI, NB_RPC_BIDI, h_bidi, NULL);
  nb_rpc_server_add_method(srv, M_BLOCK, NB_RPC_BIDI, h_block, NULL);
  nb_rpc_server_add_method(srv, M_FAIL, NB_RPC_UNARY, h_fail, NULL);
  nb_rpc_server_add_method(srv, "/test.Echo/Tick", NB_RPC_BIDI, h_tick, NULL);
  nb_rpc_server_add_method(srv, "/test.Echo/Deadline", NB_RPC_UNARY, h_deadline, NULL);
  nb_rpc_server_add_method(srv, "/test.Echo/CancelSelf", NB_RPC_UNARY, h_cancel_self, NULL);
  nb_rpc_server_add_method(srv, "/test.Echo/LeavePending", NB_RPC_BIDI, h_leave_pending, NULL);
  nb_rpc_server_add_method(srv, M_PING, NB_RPC_UNARY, h_ping, NULL);
  nb_status_t st = nb_rpc_server_start(srv);
  if (st != NB_OK) {
    nb_rpc_server_destroy(srv);
    return st;
  }
  *out = srv;
  return NB_OK;
}

static nb_rpc_client_t* connect_to(int port) {
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  nb_rpc_client_opts_t o = {.allow_insecure = 1};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(target, &o, &cli), NB_OK);
  return cli;
}

typedef struct {
  nb_rpc_server_t* srv;
  nb_rpc_client_t* cli;
} fx_t;

static int fx_setup(void** state) {
  static fx_t fx;
  if (start_server("127.0.0.1:0", 0, 0, &fx.srv) != NB_OK) return -1;
  fx.cli = connect_to(nb_rpc_server_port(fx.srv));
  *state = &fx;
  return 0;
}

static int fx_teardown(void** state) {
  fx_t* fx = *state;
  nb_rpc_client_destroy(fx->cli);
  nb_rpc_server_destroy(fx->srv);
  return 0;
}

static void test_unary_roundtrip(void** state) {
  fx_t* fx = *state;
  nb_rpc_msg_t r;
  assert_int_equal(nb_rpc_unary(fx->cli, M_UNARY, "hello", 5, &r, HANG_MS, NB_RPC_WAIT_FOR_READY),
                   NB_OK);
  assert_int_equal(r.len, 5);
  assert_memory_equal(r.data, "hello", 5);
  nb_rpc_msg_release(&r);
  assert_null(r.data);

  /* empty request, then 3 MiB (default limits are larger) with a pattern */
  assert_int_equal(nb_rpc_unary(fx->cli, M_UNARY, NULL, 0, &r, HANG_MS, 0), NB_OK);
  assert_int_equal(r.len, 0);
  nb_rpc_msg_release(&r);
  size_t n = 3u << 20;
  uint8_t* big = malloc(n);
  for (size_t i = 0; i < n; i++) big[i] = (uint8_t)(i * 131 + 7);
  assert_int_equal(nb_rpc_unary(fx->cli, M_UNARY, big, n, &r, HANG_MS, 0), NB_OK);
  assert_int_equal(r.len, n);
  assert_memory_equal(r.data, big, n);
  nb_rpc_msg_release(&r);
  free(big);
}

static void test_unary_protobuf(void** state) {
  fx_t* fx = *state;
  Nebula__V1__PingRequest req = NEBULA__V1__PING_REQUEST__INIT;
  uint8_t probe[1000] = {1};
  req.seq = 77;
  req.sent_unix_ns = 123456789;
  req.payload.data = probe;
  req.payload.len = sizeof probe;
  req.reply_size = 2048;
  ProtobufCMessage* out = NULL;
  assert_int_equal(nb_rpc_unary_pb(fx->cli, M_PING, &req.base, &nebula__v1__ping_reply__descriptor,
                                   &out, HANG_MS, 0),
                   NB_OK);
  Nebula__V1__PingReply* rep = (Nebula__V1__PingReply*)out;
  assert_int_equal(rep->seq, 77);
  assert_int_equal(rep->echo_sent_unix_ns, 123456789);
  assert_int_equal(rep->payload_size_seen, 1000);
  assert_int_equal(rep->payload.len, 2048);
  assert_string_equal(rep->responder, "test");
  protobuf_c_message_free_unpacked(out, NULL);

  /* bytes that are not a PingRequest: the handler's strict decode refuses them */
  nb_rpc_msg_t r;
  assert_int_equal(nb_rpc_unary(fx->cli, M_PING, "\xff\xff\xff", 3, &r, HANG_MS, 0),
                   NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "not a valid nebula.v1.PingRequest"));
}

static void test_server_streaming(void** state) {
  fx_t* fx = *state;
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(fx->cli, M_SSTREAM, HANG_MS, 0, &s), NB_OK);
  uint32_t n = 200;
  assert_int_equal(nb_rpc_stream_send(s, &n, 4), NB_OK);
  assert_int_equal(nb_rpc_stream_close_send(s), NB_OK);
  assert_int_equal(nb_rpc_stream_close_send(s), NB_OK); /* idempotent */
  for (uint32_t i = 0;; i++) {
    nb_rpc_msg_t m;
    int end;
    assert_int_equal(nb_rpc_stream_recv(s, &m, &end, NB_RPC_INFINITE), NB_OK);
    if (end) {
      assert_int_equal(i, n);
      break;
    }
    uint32_t v;
    assert_int_equal(m.len, 4);
    memcpy(&v, m.data, 4);
    assert_int_equal(v, i);
    nb_rpc_msg_release(&m);
  }
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  assert_int_equal(nb_rpc_stream_code(s), 0);
  nb_rpc_stream_destroy(s);
}

static void test_client_streaming(void** state) {
  fx_t* fx = *state;
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(fx->cli, M_CSTREAM, HANG_MS, 0, &s), NB_OK);
  uint8_t buf[4096];
  memset(buf, 0xab, sizeof buf);
  uint64_t total = 0;
  for (int i = 0; i < 64; i++) {
    assert_int_equal(nb_rpc_stream_send(s, buf, (size_t)i * 64), NB_OK);
    total += (uint64_t)i * 64;
  }
  assert_int_equal(nb_rpc_stream_close_send(s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, buf, 1), NB_ERR_INVALID); /* after close_send */
  nb_rpc_msg_t m;
  int end;
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, NB_RPC_INFINITE), NB_OK);
  assert_int_equal(end, 0);
  uint64_t r[2];
  assert_int_equal(m.len, sizeof r);
  memcpy(r, m.data, sizeof r);
  assert_int_equal(r[0], 64);
  assert_int_equal(r[1], total);
  nb_rpc_msg_release(&m);
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, NB_RPC_INFINITE), NB_OK);
  assert_int_equal(end, 1);
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);
}

typedef struct {
  nb_rpc_stream_t* s;
  int n;
  nb_status_t st;
} sender_t;

static void* sender_main(void* arg) {
  sender_t* a = arg;
  for (int i = 0; i < a->n && a->st == NB_OK; i++) a->st = nb_rpc_stream_send(a->s, &i, sizeof i);
  if (a->st == NB_OK) a->st = nb_rpc_stream_close_send(a->s);
  return NULL;
}

static void test_bidi_concurrent(void** state) {
  fx_t* fx = *state;
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(fx->cli, M_BIDI, HANG_MS, 0, &s), NB_OK);
  /* ping-pong first */
  for (int i = 0; i < 10; i++) {
    nb_rpc_msg_t m;
    int end;
    assert_int_equal(nb_rpc_stream_send(s, &i, sizeof i), NB_OK);
    assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
    assert_int_equal(end, 0);
    assert_memory_equal(m.data, &i, sizeof i);
    nb_rpc_msg_release(&m);
  }
  /* then a sender thread and this receiver at once */
  sender_t a = {.s = s, .n = 500, .st = NB_OK};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, sender_main, &a), 0);
  int got = 0;
  for (;;) {
    nb_rpc_msg_t m;
    int end;
    assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
    if (end) break;
    int v;
    memcpy(&v, m.data, sizeof v);
    assert_int_equal(v, got);
    got++;
    nb_rpc_msg_release(&m);
  }
  pthread_join(t, NULL);
  assert_int_equal(a.st, NB_OK);
  assert_int_equal(got, 500);
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);
}

/* nb_rpc_out_t: a buffer filled in place is sent as is (also after lowering len), small and
 * large; raising len is refused and the buffer is still released. */
static void test_send_out(void** state) {
  fx_t* fx = *state;
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(fx->cli, M_BIDI, HANG_MS, 0, &s), NB_OK);
  static const size_t sizes[] = {5, 300, (1u << 20) + 7};
  for (size_t k = 0; k < 3; k++) {
    nb_rpc_out_t o;
    assert_int_equal(nb_rpc_out_alloc(sizes[k] + 10, &o), NB_OK);
    assert_int_equal(o.len, sizes[k] + 10);
    for (size_t i = 0; i < o.len; i++) o.data[i] = (uint8_t)(i * 7 + k);
    o.len = sizes[k];
    assert_int_equal(nb_rpc_stream_send_out(s, &o), NB_OK);
    assert_null(o.priv_);
    nb_rpc_msg_t m;
    int end;
    assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
    assert_int_equal(end, 0);
    assert_int_equal(m.len, sizes[k]);
    for (size_t i = 0; i < m.len; i++) assert_int_equal(m.data[i], (uint8_t)(i * 7 + k));
    nb_rpc_msg_release(&m);
  }
  nb_rpc_out_t o;
  assert_int_equal(nb_rpc_out_alloc(16, &o), NB_OK);
  o.len = 17;
  assert_int_equal(nb_rpc_stream_send_out(s, &o), NB_ERR_INVALID);
  assert_null(o.priv_);
  assert_int_equal(nb_rpc_out_alloc(16, &o), NB_OK);
  nb_rpc_out_release(&o);
  nb_rpc_out_release(&o); /* released twice: no-op */
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);
}

static void test_deadlines(void** state) {
  fx_t* fx = *state;
  atomic_store(&g_slow_started, 0);
  atomic_store(&g_slow_cancelled, 0);
  nb_rpc_msg_t r;
  /* The handler would answer after HANG_MS: the 1 s deadline ends the call first, with
   * DEADLINE_EXCEEDED, after the request reached the handler (a loopback delivery that took 1 s
   * would be a stall, not load). */
  assert_int_equal(nb_rpc_unary(fx->cli, M_SLOW, "x", 1, &r, 1000, 0), NB_ERR_TIMEOUT);
  assert_non_null(strstr(nb_error_last(), "DEADLINE_EXCEEDED"));
  assert_int_equal(atomic_load(&g_slow_started), 1);
  /* the handler sees the cancellation and stops */
  assert_int_equal(wait_atomic(&g_slow_cancelled, 1), 1);

  /* a receive with a shorter wait than the call's times out while the call lives on: the call
   * has no deadline, so only the receive's wait can have ended it */
  nb_rpc_stream_t* s = NULL;
  nb_rpc_msg_t m;
  int end;
  assert_int_equal(nb_rpc_stream_open(fx->cli, M_BLOCK, NB_RPC_INFINITE, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, 50), NB_ERR_TIMEOUT);
  assert_int_equal(nb_rpc_stream_code(s), -1);
  assert_int_equal(nb_rpc_stream_close_send(s), NB_OK); /* the handler ends, the call with it */
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
  assert_int_equal(end, 1);
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);

  /* the call's own deadline ends a receive that would wait forever: NB_ERR_TIMEOUT, status 4 */
  assert_int_equal(nb_rpc_stream_open(fx->cli, M_BLOCK, 300, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, NB_RPC_INFINITE), NB_ERR_TIMEOUT);
  assert_int_equal(nb_rpc_stream_code(s), 4);
  assert_int_equal(nb_rpc_stream_finish(s), NB_ERR_TIMEOUT);
  nb_rpc_stream_destroy(s);
}

static void test_recv_wait_then_message(void** state) {
  fx_t* fx = *state;
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(fx->cli, M_BIDI, NB_RPC_INFINITE, 0, &s), NB_OK);
  nb_rpc_msg_t m;
  int end;
  /* nothing was sent: only the 30 ms wait can end this receive (the call has no deadline) */
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, 30), NB_ERR_TIMEOUT);
  int v = 9;
  assert_int_equal(nb_rpc_stream_send(s, &v, sizeof v), NB_OK);
  /* the receive that timed out continues and gets the echo */
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
  assert_int_equal(end, 0);
  assert_memory_equal(m.data, &v, sizeof v);
  nb_rpc_msg_release(&m);
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);
}

static void test_server_recv_wait(void** state) {
  fx_t* fx = *state;
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(fx->cli, "/test.Echo/Tick", HANG_MS, 0, &s), NB_OK);
  nb_rpc_msg_t m;
  int end;
  /* the handler's bounded receive times out and it sends a tick while the call stays open */
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
  assert_int_equal(end, 0);
  assert_memory_equal(m.data, "tick", 4);
  nb_rpc_msg_release(&m);
  assert_int_equal(nb_rpc_stream_send(s, "hello", 5), NB_OK);
  int seen = 0;
  for (int i = 0; i < 1000 && !seen; i++) {
    assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
    assert_int_equal(end, 0);
    seen = m.len == 5 && memcmp(m.data, "hello", 5) == 0;
    nb_rpc_msg_release(&m);
  }
  assert_true(seen);
  assert_int_equal(nb_rpc_stream_close_send(s), NB_OK);
  for (end = 0; !end;) {
    assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
    nb_rpc_msg_release(&m);
  }
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);

  /* a handler that returns with its receive still running */
  assert_int_equal(nb_rpc_stream_open(fx->cli, "/test.Echo/LeavePending", HANG_MS, 0, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_recv(s, &m, &end, HANG_MS), NB_OK);
  assert_int_equal(end, 1);
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK);
  nb_rpc_stream_destroy(s);
}

/* The reply of /test.Echo/Deadline as a C string. */
static void reply_text(nb_rpc_msg_t* r, char* out, size_t cap) {
  size_t n = r->len < cap - 1 ? r->len : cap - 1;
  memcpy(out, r->data, n);
  out[n] = '\0';
  nb_rpc_msg_release(r);
}

static void test_handler_sees_deadline(void** state) {
  fx_t* fx = *state;
  nb_rpc_msg_t r;
  char text[160];
  /* the handler sees the caller's deadline: finite, and no later than the one set plus gRPC's
   * rounding of the transmitted timeout (up, in 100 ms steps at this size; 1 s allowed); more
   * than half of it left means it is this call's 60 s and not some default, unless the machine
   * stalled for 30 s */
  assert_int_equal(nb_rpc_unary(fx->cli, "/test.Echo/Deadline", "x", 1, &r, 2 * HANG_MS, 0), NB_OK);
  reply_text(&r, text, sizeof text);
  long long left = atoll(text);
  printf("handler saw %lld ms left of a %d ms deadline\n", left, 2 * HANG_MS);
  assert_true(left > HANG_MS && left <= 2 * HANG_MS + 1000);
  assert_non_null(strstr(text, "127.0.0.1"));
  assert_int_equal(nb_rpc_unary(fx->cli, "/test.Echo/Deadline", "x", 1, &r, NB_RPC_INFINITE, 0),
                   NB_OK);
  reply_text(&r, text, sizeof text);
  assert_int_equal(atoll(text), -1);
}

static void test_ipv6_loopback(void** state) {
  nb_rpc_server_t* srv = NULL;
  if (start_server("[::1]:0", 0, 0, &srv) != NB_OK) {
    skip(); /* no IPv6 loopback on this host */
    return;
  }
  char target[64];
  snprintf(target, sizeof target, "[::1]:%d", nb_rpc_server_port(srv));
  nb_rpc_client_opts_t o = {.allow_insecure = 1};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create(target, &o, &cli), NB_OK);
  nb_rpc_msg_t r;
  char text[160];
  assert_int_equal(nb_rpc_unary(cli, "/test.Echo/Deadline", "x", 1, &r, HANG_MS, 0), NB_OK);
  reply_text(&r, text, sizeof text);
  assert_non_null(strstr(text, "ipv6:"));
  nb_rpc_client_destroy(cli);
  nb_rpc_server_destroy(srv);
}

static void test_errors_mapped(void** state) {
  fx_t* fx = *state;
  nb_rpc_msg_t r;
  assert_int_equal(nb_rpc_unary(fx->cli, M_FAIL, "x", 1, &r, HANG_MS, 0), NB_ERR_NOT_FOUND);
  assert_non_null(strstr(nb_error_last(), "round 42 is not here"));
  assert_int_equal(nb_rpc_unary(fx->cli, "/test.Echo/Nope", "x", 1, &r, HANG_MS, 0),
                   NB_ERR_UNSUPPORTED);
  /* server-streaming handler that rejects its input */
  assert_int_equal(nb_rpc_unary(fx->cli, M_SSTREAM, "xy", 2, &r, HANG_MS, 0), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "4-byte count"));
  /* the server still serves */
  assert_int_equal(nb_rpc_unary(fx->cli, M_UNARY, "ok", 2, &r, HANG_MS, 0), NB_OK);
  nb_rpc_msg_release(&r);
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr*)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr*)&a, &l), 0);
  close(fd);
  return ntohs(a.sin_port);
}

typedef struct {
  nb_rpc_client_t* cli;
  nb_status_t st;
} late_t;

static void* late_call(void* arg) {
  late_t* a = arg;
  nb_rpc_msg_t r;
  a->st = nb_rpc_unary(a->cli, M_UNARY, "late", 4, &r, HANG_MS, NB_RPC_WAIT_FOR_READY);
  if (a->st == NB_OK) nb_rpc_msg_release(&r);
  return NULL;
}

static void test_wait_for_ready(void** state) {
  int port = free_port();
  nb_rpc_client_t* cli = connect_to(port);
  /* without wait-for-ready a dead server fails fast */
  nb_rpc_msg_t r;
  /* UNAVAILABLE, not DEADLINE_EXCEEDED: it did not wait out its deadline */
  assert_int_equal(nb_rpc_unary(cli, M_UNARY, "x", 1, &r, HANG_MS, 0), NB_ERR_UNAVAILABLE);
  /* the channel reports its state and waiting for READY times out while nobody listens */
  assert_int_not_equal(nb_rpc_client_state(cli, 1), NB_RPC_READY);
  assert_int_equal(nb_rpc_client_wait_ready(cli, 200), NB_ERR_TIMEOUT);
  /* with it, the call waits for a server that starts late */
  late_t a = {.cli = cli, .st = NB_ERR_INTERNAL};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, late_call, &a), 0);
  nb_sleep_ns(400 * 1000 * 1000); /* lets the call start waiting first; passes either way */
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  nb_rpc_server_t* srv = NULL;
  assert_int_equal(start_server(listen, 0, 0, &srv), NB_OK);
  pthread_join(t, NULL);
  assert_int_equal(a.st, NB_OK);
  assert_int_equal(nb_rpc_client_wait_ready(cli, HANG_MS), NB_OK);
  assert_int_equal(nb_rpc_client_state(cli, 0), NB_RPC_READY);
  /* SO_REUSEPORT is off: a second server cannot take the same port */
  nb_rpc_server_t* srv2 = NULL;
  assert_int_equal(start_server(listen, 0, 0, &srv2), NB_ERR_UNAVAILABLE);
  assert_null(srv2);
  nb_rpc_client_destroy(cli);
  nb_rpc_server_destroy(srv);
}

typedef struct {
  nb_rpc_stream_t* s;
  nb_status_t st;
} blocked_t;

static void* blocked_recv(void* arg) {
  blocked_t* b = arg;
  nb_rpc_msg_t m;
  int end = 0;
  b->st = nb_rpc_stream_recv(b->s, &m, &end, NB_RPC_INFINITE);
  if (b->st == NB_OK && !end) nb_rpc_msg_release(&m);
  return NULL;
}

static void* destroy_server(void* srv) {
  nb_rpc_server_destroy(srv);
  return NULL;
}

static void test_shutdown_in_flight(void** state) {
  nb_rpc_server_t* srv = NULL;
  assert_int_equal(start_server("127.0.0.1:0", 0, 0, &srv), NB_OK);
  nb_rpc_client_t* cli = connect_to(nb_rpc_server_port(srv));
  atomic_store(&g_block_entered, 0);
  atomic_store(&g_block_returned, 0);
  enum { N = 4 };
  blocked_t b[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    b[i].st = NB_OK;
    assert_int_equal(
        nb_rpc_stream_open(cli, M_BLOCK, NB_RPC_INFINITE, NB_RPC_WAIT_FOR_READY, &b[i].s), NB_OK);
    int v = i;
    assert_int_equal(nb_rpc_stream_send(b[i].s, &v, sizeof v), NB_OK);
    assert_int_equal(pthread_create(&t[i], NULL, blocked_recv, &b[i]), 0);
  }
  assert_int_equal(wait_atomic(&g_block_entered, N), N);
  assert_true(returns(destroy_server, srv)); /* handlers are blocked in recv: it ends them */
  assert_int_equal(atomic_load(&g_block_returned), N);
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    assert_int_not_equal(b[i].st, NB_OK); /* the client sees the call end, not a hang */
    nb_rpc_stream_destroy(b[i].s);
  }
  nb_rpc_client_destroy(cli);
}

/* Starts a receive that would wait forever, cancels the stream from this thread, and joins. */
static void* cancel_blocked(void* arg) {
  blocked_t* b = arg;
  pthread_t t;
  if (pthread_create(&t, NULL, blocked_recv, b) != 0) return NULL;
  nb_sleep_ns(20 * 1000 * 1000); /* most runs cancel a receive already blocked; either is fine */
  nb_rpc_stream_cancel(b->s);
  pthread_join(t, NULL);
  return NULL;
}

static void test_cancel_from_other_thread(void** state) {
  atomic_store(&g_block_entered, 0);
  nb_rpc_server_t* srv = NULL;
  assert_int_equal(start_server("127.0.0.1:0", 0, 0, &srv), NB_OK);
  nb_rpc_client_t* cli = connect_to(nb_rpc_server_port(srv));
  /* client: a receive blocked in another thread is released by nb_rpc_stream_cancel */
  blocked_t b = {.st = NB_OK};
  assert_int_equal(nb_rpc_stream_open(cli, M_BLOCK, NB_RPC_INFINITE, NB_RPC_WAIT_FOR_READY, &b.s),
                   NB_OK);
  assert_int_equal(nb_rpc_stream_send(b.s, "a", 1), NB_OK);
  assert_int_equal(wait_atomic(&g_block_entered, 1), 1); /* the server side is up */
  assert_true(returns(cancel_blocked, &b));
  assert_int_equal(b.st, NB_ERR_CANCELLED);
  assert_int_equal(nb_rpc_stream_code(b.s), 1);
  nb_rpc_stream_destroy(b.s);
  /* server: a handler cancels its own call; the client sees CANCELLED */
  nb_rpc_msg_t r;
  assert_int_equal(nb_rpc_unary(cli, "/test.Echo/CancelSelf", "x", 1, &r, HANG_MS, 0),
                   NB_ERR_CANCELLED);
  nb_rpc_server_destroy(srv); /* the blocked handler ends too */
  nb_rpc_client_destroy(cli);
}

static void test_max_calls(void** state) {
  nb_rpc_server_t* srv = NULL;
  assert_int_equal(start_server("127.0.0.1:0", 0, 1, &srv), NB_OK);
  nb_rpc_client_t* cli = connect_to(nb_rpc_server_port(srv));
  atomic_store(&g_block_entered, 0);
  nb_rpc_stream_t* s = NULL;
  assert_int_equal(nb_rpc_stream_open(cli, M_BLOCK, HANG_MS, NB_RPC_WAIT_FOR_READY, &s), NB_OK);
  assert_int_equal(nb_rpc_stream_send(s, "a", 1), NB_OK);
  assert_int_equal(wait_atomic(&g_block_entered, 1), 1);
  nb_rpc_msg_t r;
  assert_int_equal(nb_rpc_unary(cli, M_UNARY, "x", 1, &r, HANG_MS, 0), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "RESOURCE_EXHAUSTED"));
  assert_int_equal(nb_rpc_stream_finish(s), NB_OK); /* half-close ends the blocked handler */
  nb_rpc_stream_destroy(s);
  /* the slot is free again (the handler thread may need a moment to be released) */
  nb_status_t st = NB_ERR_INTERNAL;
  int64_t until = nb_now_ns() + HANG_MS * 1000000LL;
  while ((st = nb_rpc_unary(cli, M_UNARY, "x", 1, &r, HANG_MS, 0)) == NB_ERR_INVALID &&
         nb_now_ns() < until)
    nb_sleep_ns(5000000); /* RESOURCE_EXHAUSTED until the slot is released */
  assert_int_equal(st, NB_OK);
  nb_rpc_msg_release(&r);
  nb_rpc_client_destroy(cli);
  nb_rpc_server_destroy(srv);
}

static void raw_send(int port, const void* data, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(connect(fd, (struct sockaddr*)&a, sizeof a), 0);
  ssize_t w = send(fd, data, len, MSG_NOSIGNAL);
  (void)w;
  /* read whatever comes back (GOAWAY, alert) until the server closes or 1 s passes */
  struct timeval tv = {.tv_sec = 1};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[512];
  while (recv(fd, buf, sizeof buf, 0) > 0) {
  }
  close(fd);
}

static void test_garbage_and_oversized(void** state) {
  nb_rpc_server_t* srv = NULL;
  assert_int_equal(start_server("127.0.0.1:0", 64 * 1024, 0, &srv), NB_OK);
  int port = nb_rpc_server_port(srv);
  uint8_t junk[8192];
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < sizeof junk; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    junk[i] = (uint8_t)x;
  }
  raw_send(port, junk, sizeof junk);
  raw_send(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
  /* a valid HTTP/2 preface followed by a frame header claiming 16 MiB of junk */
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  uint8_t h2[24 + 9 + 64];
  memcpy(h2, preface, 24);
  memcpy(h2 + 24, "\xff\xff\xff\x00\x00\x00\x00\x00\x01", 9);
  memcpy(h2 + 33, junk, 64);
  raw_send(port, h2, sizeof h2);

  nb_rpc_client_t* cli = connect_to(port);
  nb_rpc_msg_t r;
  /* bigger than the server's 64 KiB receive limit: refused, not crashed */
  size_t n = 1u << 20;
  uint8_t* big = calloc(1, n);
  assert_int_equal(nb_rpc_unary(cli, M_UNARY, big, n, &r, HANG_MS, NB_RPC_WAIT_FOR_READY),
                   NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "RESOURCE_EXHAUSTED"));
  free(big);
  /* the next good client is served */
  nb_rpc_client_t* cli2 = connect_to(port);
  assert_int_equal(nb_rpc_unary(cli2, M_UNARY, "fine", 4, &r, HANG_MS, NB_RPC_WAIT_FOR_READY),
                   NB_OK);
  assert_memory_equal(r.data, "fine", 4);
  nb_rpc_msg_release(&r);
  assert_int_equal(nb_rpc_unary(cli, M_UNARY, "fine", 4, &r, HANG_MS, NB_RPC_WAIT_FOR_READY),
                   NB_OK);
  nb_rpc_msg_release(&r);
  nb_rpc_client_destroy(cli2);
  nb_rpc_client_destroy(cli);
  nb_rpc_server_destroy(srv);
}

static void test_bad_arguments(void** state) {
  nb_rpc_server_opts_t o = {.listen = "127.0.0.1:0"};
  nb_rpc_server_t* srv = NULL;
  assert_int_equal(nb_rpc_server_create(&o, &srv), NB_ERR_INVALID); /* no TLS, not allowed */
  assert_null(srv);
  nb_rpc_client_opts_t co = {0};
  nb_rpc_client_t* cli = NULL;
  assert_int_equal(nb_rpc_client_create("127.0.0.1:1", &co, &cli), NB_ERR_INVALID);
  o.allow_insecure = 1;
  assert_int_equal(nb_rpc_server_create(&o, &srv), NB_OK);
  assert_int_equal(nb_rpc_server_add_method(srv, "NoSlash", NB_RPC_UNARY, h_unary, NULL),
                   NB_ERR_INVALID);
  assert_int_equal(nb_rpc_server_add_method(srv, M_UNARY, NB_RPC_UNARY, h_unary, NULL), NB_OK);
  assert_int_equal(nb_rpc_server_add_method(srv, M_UNARY, NB_RPC_UNARY, h_unary, NULL),
                   NB_ERR_EXISTS);
  nb_rpc_server_destroy(srv); /* never started */
  assert_int_equal(nb_rpc_code_from_status(NB_ERR_INTEGRITY), 15);
  assert_int_equal(nb_rpc_status_from_code(4), NB_ERR_TIMEOUT);
}

int main(void) {
  const struct CMUnitTest shared[] = {
      cmocka_unit_test(test_unary_roundtrip),  cmocka_unit_test(test_unary_protobuf),
      cmocka_unit_test(test_server_streaming), cmocka_unit_test(test_client_streaming),
      cmocka_unit_test(test_bidi_concurrent),  cmocka_unit_test(test_send_out),
      cmocka_unit_test(test_deadlines),        cmocka_unit_test(test_recv_wait_then_message),
      cmocka_unit_test(test_server_recv_wait), cmocka_unit_test(test_handler_sees_deadline),
      cmocka_unit_test(test_errors_mapped),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(test_wait_for_ready),
      cmocka_unit_test(test_shutdown_in_flight),
      cmocka_unit_test(test_max_calls),
      cmocka_unit_test(test_garbage_and_oversized),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_ipv6_loopback),
      cmocka_unit_test(test_cancel_from_other_thread),
  };
  int fails = cmocka_run_group_tests_name("rpc_shared_server", shared, fx_setup, fx_teardown);
  fails += cmocka_run_group_tests_name("rpc_own_server", own, NULL, NULL);
  return fails ? 1 : 0;
}
