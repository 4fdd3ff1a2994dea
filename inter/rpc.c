/* inter/rpc: gRPC C core behind blocking calls. The server runs one completion queue on one
 * thread and one thread per handler; each server call is a small state machine of four op slots
 * (recv, send, status, close) whose completions the queue thread posts under the call's mutex.
 * Clients use one pluck queue per call so that a sender and a receiver can block at once.
 * It deliberately has no service logic, no retries and no chunking. */
#include "inter/rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

NB_PARAM_INT(RpcMaxMessageMb, "NB_RPC_MAX_MESSAGE_MB", 64, 1, 2047,
             "largest gRPC message sent or received, in MiB (frames travel in smaller chunks)")
NB_PARAM_INT(RpcKeepaliveMs, "NB_RPC_KEEPALIVE_MS", 10000, 1000, 3600000,
             "interval of HTTP/2 keepalive pings on idle client connections")
NB_PARAM_INT(RpcKeepaliveTimeoutMs, "NB_RPC_KEEPALIVE_TIMEOUT_MS", 5000, 500, 600000,
             "a keepalive ping unanswered this long drops the connection")
NB_PARAM_INT(RpcMaxBackoffMs, "NB_RPC_MAX_BACKOFF_MS", 1000, 100, 120000,
             "longest wait between reconnection attempts of a client channel")
NB_PARAM_INT(RpcShutdownGraceMs, "NB_RPC_SHUTDOWN_GRACE_MS", 500, 0, 60000,
             "rpc: how long a closing server lets calls under way finish before cancelling them")
NB_PARAM_INT(RpcMaxCalls, "NB_RPC_MAX_CALLS", 64, 1, 4096,
             "concurrent calls (handler threads) per server; more get RESOURCE_EXHAUSTED")

/* ------------------------------------------------------------------ shared helpers */

/* gRPC's own log lines (ERROR and above by default, GRPC_VERBOSITY raises it) go through
 * nebula's log, with its prefix: errors as warnings, the rest as RPC traces. */
static void nb__rpc_gpr_log(gpr_log_func_args* a) {
  if (a->severity == GPR_LOG_SEVERITY_ERROR)
    nb_log(NB_LOG_WARN, NB_SUB_RPC, a->file, a->line, "grpc: %s", a->message);
  else if (nb_log_enabled(NB_LOG_TRACE, NB_SUB_RPC))
    nb_log(NB_LOG_TRACE, NB_SUB_RPC, a->file, a->line, "grpc: %s", a->message);
}

static pthread_once_t nb__rpc_once = PTHREAD_ONCE_INIT;
static void nb__rpc_once_fn(void) {
  gpr_set_log_function(nb__rpc_gpr_log);
}

/* grpc_init with nebula's log hooked in; each successful create pairs it with one
 * grpc_shutdown_blocking in destroy. */
static void nb__rpc_grpc_init(void) {
  pthread_once(&nb__rpc_once, nb__rpc_once_fn);
  grpc_init();
}

static uint64_t nb__rpc_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static gpr_timespec nb__rpc_deadline(int64_t timeout_ms) {
  if (timeout_ms < 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

static size_t nb__rpc_max_msg(size_t requested) {
  size_t v = requested ? requested : (size_t)nb_param_RpcMaxMessageMb() << 20;
  return v > (size_t)INT32_MAX ? (size_t)INT32_MAX : v;
}

void nb_rpc_msg_release(nb_rpc_msg_t* msg) {
  if (msg == NULL) return;
  if (msg->priv_ != NULL) {
    grpc_slice* s = msg->priv_;
    grpc_slice_unref(*s);
    free(s);
  }
  memset(msg, 0, sizeof *msg);
}

/* Moves a received byte buffer into msg (one contiguous slice) and destroys the buffer. */
static nb_status_t nb__rpc_take_buffer(grpc_byte_buffer* bb, nb_rpc_msg_t* msg) {
  memset(msg, 0, sizeof *msg);
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, bb)) {
    grpc_byte_buffer_destroy(bb);
    return nb_error(NB_ERR_CODEC, "received message could not be decompressed");
  }
  grpc_slice* s = malloc(sizeof *s);
  if (s == NULL) {
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(bb);
    return nb_error(NB_ERR_NOMEM, "received message");
  }
  *s = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  grpc_byte_buffer_destroy(bb);
  msg->data = GRPC_SLICE_START_PTR(*s);
  msg->len = GRPC_SLICE_LENGTH(*s);
  msg->priv_ = s;
  return NB_OK;
}

static nb_status_t nb__rpc_unpack(const nb_rpc_msg_t* m, const ProtobufCMessageDescriptor* desc,
                                  ProtobufCMessage** out) {
  *out = protobuf_c_message_unpack(desc, NULL, m->len, m->data);
  if (*out == NULL)
    return nb_error(NB_ERR_CODEC, "message of %zu bytes is not a valid %s", m->len, desc->name);
  return NB_OK;
}

/* A protobuf-c message packed straight into a byte buffer (one copy, no temporary). */
static nb_status_t nb__rpc_pack(const ProtobufCMessage* msg, grpc_byte_buffer** out) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  grpc_slice s = grpc_slice_malloc(n);
  size_t w = protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  if (w != n) {
    grpc_slice_unref(s);
    return nb_error(NB_ERR_INTERNAL, "protobuf-c packed %zu of %zu bytes", w, n);
  }
  *out = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return NB_OK;
}

static grpc_byte_buffer* nb__rpc_copy_buffer(const void* data, size_t len) {
  grpc_slice s = grpc_slice_from_copied_buffer(data, len);
  grpc_byte_buffer* bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

int nb_rpc_code_from_status(nb_status_t st) {
  switch (st) {
    case NB_OK:
      return GRPC_STATUS_OK;
    case NB_ERR_INVALID:
    case NB_ERR_CODEC:
    case NB_ERR_CONFIG:
      return GRPC_STATUS_INVALID_ARGUMENT;
    case NB_ERR_PERMISSION:
      return GRPC_STATUS_PERMISSION_DENIED;
    case NB_ERR_NOT_FOUND:
      return GRPC_STATUS_NOT_FOUND;
    case NB_ERR_EXISTS:
      return GRPC_STATUS_ALREADY_EXISTS;
    case NB_ERR_TIMEOUT:
      return GRPC_STATUS_DEADLINE_EXCEEDED;
    case NB_ERR_INTEGRITY:
      return GRPC_STATUS_DATA_LOSS;
    case NB_ERR_UNAVAILABLE:
      return GRPC_STATUS_UNAVAILABLE;
    case NB_ERR_UNSUPPORTED:
      return GRPC_STATUS_UNIMPLEMENTED;
    case NB_ERR_CANCELLED:
      return GRPC_STATUS_CANCELLED;
    case NB_ERR_NOMEM:
      return GRPC_STATUS_RESOURCE_EXHAUSTED;
    default:
      return GRPC_STATUS_INTERNAL;
  }
}

nb_status_t nb_rpc_status_from_code(int code) {
  switch (code) {
    case GRPC_STATUS_OK:
      return NB_OK;
    case GRPC_STATUS_CANCELLED:
      return NB_ERR_CANCELLED;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
      return NB_ERR_INVALID;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
      return NB_ERR_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND:
      return NB_ERR_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS:
      return NB_ERR_EXISTS;
    case GRPC_STATUS_PERMISSION_DENIED:
    case GRPC_STATUS_UNAUTHENTICATED:
      return NB_ERR_PERMISSION;
    case GRPC_STATUS_UNIMPLEMENTED:
      return NB_ERR_UNSUPPORTED;
    case GRPC_STATUS_DATA_LOSS:
      return NB_ERR_INTEGRITY;
    case GRPC_STATUS_UNAVAILABLE:
      return NB_ERR_UNAVAILABLE;
    default:
      return NB_ERR_REMOTE;
  }
}

static const char* nb__rpc_code_name(int code) {
  static const char* names[] = {"OK",
                                "CANCELLED",
                                "UNKNOWN",
                                "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED",
                                "NOT_FOUND",
                                "ALREADY_EXISTS",
                                "PERMISSION_DENIED",
                                "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION",
                                "ABORTED",
                                "OUT_OF_RANGE",
                                "UNIMPLEMENTED",
                                "INTERNAL",
                                "UNAVAILABLE",
                                "DATA_LOSS",
                                "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? names[code] : "?";
}

/* A client-side final status → nb_status_t with the detail recorded. A TLS handshake that
 * failed on a certificate reaches the client as UNAVAILABLE; it is not transient, so it becomes
 * NB_ERR_PERMISSION. */
static nb_status_t nb__rpc_client_error(const char* method, int code, grpc_slice details) {
  char det[384];
  size_t n = GRPC_SLICE_LENGTH(details);
  if (n >= sizeof det) n = sizeof det - 1;
  memcpy(det, GRPC_SLICE_START_PTR(details), n);
  det[n] = '\0';
  nb_status_t st = nb_rpc_status_from_code(code);
  /* Only certificate verdicts count: "handshaker shutdown" (a connect timeout) and "Socket
   * closed" stay UNAVAILABLE, they can be transient. */
  if (code == GRPC_STATUS_UNAVAILABLE &&
      (strstr(det, "SSL_ERROR_SSL") || strstr(det, "ertificate") ||
       strstr(det, "Verify peer callback")))
    st = NB_ERR_PERMISSION;
  return nb_error(st, "rpc %s: %s (%d): %s", method, nb__rpc_code_name(code), code,
                  det[0] ? det : "no detail");
}

/* Channel/server arguments. keys are string literals; gRPC copies the array. */
typedef struct {
  grpc_arg a[12];
  size_t n;
} nb__rpc_args_t;

static void nb__rpc_arg_int(nb__rpc_args_t* args, const char* key, int v) {
  grpc_arg* a = &args->a[args->n++];
  a->type = GRPC_ARG_INTEGER;
  a->key = (char*)key;
  a->value.integer = v;
}

static void nb__rpc_arg_str(nb__rpc_args_t* args, const char* key, const char* v) {
  grpc_arg* a = &args->a[args->n++];
  a->type = GRPC_ARG_STRING;
  a->key = (char*)key;
  a->value.string = (char*)v;
}

/* ------------------------------------------------------------------ server */

enum {
  NB__OP_ACCEPT,
  NB__OP_SHUTDOWN,
  NB__OP_RECV,
  NB__OP_SEND,
  NB__OP_STATUS,
  NB__OP_CLOSE,
  NB__OP_REJECT
};

struct nb_rpc_call;
typedef struct {
  int kind;
  struct nb_rpc_call* call;
  int started, done, ok;
} nb__rpc_op_t;

typedef struct nb__rpc_method {
  char* name;
  nb_rpc_kind_t kind;
  nb_rpc_handler_fn fn;
  void* user;
  struct nb__rpc_method* next;
} nb__rpc_method_t;

struct nb_rpc_call {
  nb_rpc_server_t* srv;
  grpc_call* call;
  grpc_call_details details;
  grpc_metadata_array req_md;
  nb__rpc_op_t op_accept, op_recv, op_send, op_status, op_close, op_reject;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int cancelled; /* written by gRPC when op_close completes */
  grpc_byte_buffer* recv_bb;
  grpc_byte_buffer* send_bb;
  grpc_slice status_details;
  int md_sent;
  int recv_busy, send_busy; /* a thread is inside recv/send */
  int recv_pending;         /* a receive timed out but its op is still running */
  int sends;
  const nb__rpc_method_t* method;
  char method_name[256];
  char peer_addr[128];
  nb_tls_peer_t peer;
  pthread_t thread;
  struct nb_rpc_call* next_zombie;
};

struct nb_rpc_server {
  grpc_server* server;
  grpc_completion_queue* cq;
  char* listen;
  int tls;
  nb_rpc_authorize_fn authorize;
  void* authorize_user;
  int max_calls;
  int port;
  int started;
  pthread_t cq_thread;
  nb__rpc_method_t* methods;
  nb__rpc_op_t op_shutdown;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int shutting_down, shutdown_seen;
  int pending_requests;        /* request_call issued, not yet completed */
  int live_calls;              /* accepted calls not yet fully released */
  struct nb_rpc_call* zombies; /* handler threads that finished, to join */
};

static void nb__rpc_call_free(struct nb_rpc_call* c) {
  if (c == NULL) return;
  grpc_call_details_destroy(&c->details);
  grpc_metadata_array_destroy(&c->req_md);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

static void nb__rpc_reap(nb_rpc_server_t* srv) {
  pthread_mutex_lock(&srv->mu);
  struct nb_rpc_call* z = srv->zombies;
  srv->zombies = NULL;
  pthread_mutex_unlock(&srv->mu);
  while (z != NULL) {
    struct nb_rpc_call* next = z->next_zombie;
    pthread_join(z->thread, NULL);
    nb__rpc_call_free(z);
    z = next;
  }
}

/* Asks gRPC for the next incoming call (any method). Called with srv->mu held. */
static void nb__rpc_request_call(nb_rpc_server_t* srv) {
  struct nb_rpc_call* c = calloc(1, sizeof *c);
  if (c == NULL) {
    NB_WARN("rpc: out of memory preparing for the next call; the server stops accepting calls");
    return;
  }
  c->srv = srv;
  pthread_mutex_init(&c->mu, NULL);
  nb_cond_init_mono(&c->cv);
  grpc_call_details_init(&c->details);
  grpc_metadata_array_init(&c->req_md);
  nb__rpc_op_t* ops[] = {&c->op_accept, &c->op_recv,  &c->op_send,
                         &c->op_status, &c->op_close, &c->op_reject};
  int kinds[] = {NB__OP_ACCEPT, NB__OP_RECV,  NB__OP_SEND,
                 NB__OP_STATUS, NB__OP_CLOSE, NB__OP_REJECT};
  for (size_t i = 0; i < 6; i++) {
    ops[i]->kind = kinds[i];
    ops[i]->call = c;
  }
  grpc_call_error e = grpc_server_request_call(srv->server, &c->call, &c->details, &c->req_md,
                                               srv->cq, srv->cq, &c->op_accept);
  if (e != GRPC_CALL_OK) {
    NB_WARN("rpc: grpc_server_request_call failed (%d); the server stops accepting calls", e);
    nb__rpc_call_free(c);
    return;
  }
  srv->pending_requests++;
}

/* Answers a call without running a handler (unknown method, too many calls, shutting down). The
 * queue thread frees it when the batch completes. */
static void nb__rpc_reject(struct nb_rpc_call* c, grpc_status_code code, const char* msg) {
  c->status_details = grpc_slice_from_copied_string(msg);
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[1].data.send_status_from_server.status = code;
  ops[1].data.send_status_from_server.status_details = &c->status_details;
  ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[2].data.recv_close_on_server.cancelled = &c->cancelled;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, 3, &c->op_reject, NULL);
  if (e != GRPC_CALL_OK) {
    /* Nothing was queued: release right here. */
    grpc_slice_unref(c->status_details);
    grpc_call_unref(c->call);
    nb_rpc_server_t* srv = c->srv;
    nb__rpc_call_free(c);
    pthread_mutex_lock(&srv->mu);
    srv->live_calls--;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
  }
}

/* Waits for one op slot of a server call to complete. */
static int nb__rpc_call_wait(struct nb_rpc_call* c, nb__rpc_op_t* op) {
  pthread_mutex_lock(&c->mu);
  while (!op->done) pthread_cond_wait(&c->cv, &c->mu);
  int ok = op->ok;
  op->started = op->done = 0;
  pthread_mutex_unlock(&c->mu);
  return ok;
}

static nb_status_t nb__rpc_call_start(struct nb_rpc_call* c, nb__rpc_op_t* op, const grpc_op* ops,
                                      size_t n) {
  pthread_mutex_lock(&c->mu);
  op->started = 1;
  op->done = 0;
  pthread_mutex_unlock(&c->mu);
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, op, NULL);
  if (e != GRPC_CALL_OK) {
    pthread_mutex_lock(&c->mu);
    op->started = 0;
    pthread_mutex_unlock(&c->mu);
    return nb_error(NB_ERR_RPC, "rpc %s: starting a batch failed (grpc_call_error %d)",
                    c->method_name, e);
  }
  return NB_OK;
}

/* Waits for the receive slot until deadline_ns (monotonic; <0 = forever). 1 = completed. */
static int nb__rpc_call_wait_until(struct nb_rpc_call* c, nb__rpc_op_t* op, int64_t deadline_ns,
                                   int* ok) {
  pthread_mutex_lock(&c->mu);
  while (!op->done) {
    if (deadline_ns < 0) {
      pthread_cond_wait(&c->cv, &c->mu);
    } else {
      struct timespec ts = {.tv_sec = deadline_ns / 1000000000,
                            .tv_nsec = deadline_ns % 1000000000};
      if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT && !op->done) {
        pthread_mutex_unlock(&c->mu);
        return 0;
      }
    }
  }
  *ok = op->ok;
  op->started = op->done = 0;
  pthread_mutex_unlock(&c->mu);
  return 1;
}

nb_status_t nb_rpc_call_recv(nb_rpc_call_t* c, nb_rpc_msg_t* msg, int* end, int64_t wait_ms) {
  if (c == NULL || msg == NULL || end == NULL)
    return nb_error(NB_ERR_INVALID, "nb_rpc_call_recv: NULL argument");
  memset(msg, 0, sizeof *msg);
  *end = 0;
  pthread_mutex_lock(&c->mu);
  int busy = c->recv_busy;
  c->recv_busy = 1;
  pthread_mutex_unlock(&c->mu);
  if (busy) return nb_error(NB_ERR_INVALID, "rpc %s: two receives at once", c->method_name);
  nb_status_t st = NB_OK;
  if (!c->recv_pending) { /* else a receive that timed out earlier is still running */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_bb;
    c->recv_bb = NULL;
    st = nb__rpc_call_start(c, &c->op_recv, &op, 1);
    if (st == NB_OK) c->recv_pending = 1;
  }
  if (st == NB_OK) {
    int ok = 0;
    int64_t until = wait_ms < 0 ? -1 : (int64_t)nb__rpc_mono_ns() + wait_ms * 1000000;
    if (!nb__rpc_call_wait_until(c, &c->op_recv, until, &ok)) {
      st = nb_error(NB_ERR_TIMEOUT, "rpc %s: no message within %lld ms (call still open)",
                    c->method_name, (long long)wait_ms);
    } else {
      c->recv_pending = 0;
      grpc_byte_buffer* bb = c->recv_bb;
      c->recv_bb = NULL;
      if (!ok) {
        if (bb) grpc_byte_buffer_destroy(bb);
        st = nb_error(NB_ERR_CANCELLED, "rpc %s: call cancelled while receiving", c->method_name);
      } else if (bb == NULL) {
        *end = 1;
      } else {
        st = nb__rpc_take_buffer(bb, msg);
      }
    }
  }
  pthread_mutex_lock(&c->mu);
  c->recv_busy = 0;
  pthread_mutex_unlock(&c->mu);
  return st;
}

nb_status_t nb_rpc_call_recv_pb(nb_rpc_call_t* c, const ProtobufCMessageDescriptor* desc,
                                ProtobufCMessage** out, int* end, int64_t wait_ms) {
  if (desc == NULL || out == NULL)
    return nb_error(NB_ERR_INVALID, "nb_rpc_call_recv_pb: NULL argument");
  *out = NULL;
  nb_rpc_msg_t m;
  NB_CHECK(nb_rpc_call_recv(c, &m, end, wait_ms));
  if (*end) return NB_OK;
  nb_status_t st = nb__rpc_unpack(&m, desc, out);
  nb_rpc_msg_release(&m);
  return st;
}

static nb_status_t nb__rpc_call_send_bb(nb_rpc_call_t* c, grpc_byte_buffer* bb) {
  pthread_mutex_lock(&c->mu);
  int busy = c->send_busy, first = 0;
  if (!busy) {
    c->send_busy = 1;
    first = !c->md_sent;
    c->md_sent = 1;
  }
  pthread_mutex_unlock(&c->mu);
  if (busy) {
    grpc_byte_buffer_destroy(bb);
    return nb_error(NB_ERR_INVALID, "rpc %s: two sends at once", c->method_name);
  }
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (first) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = bb;
  nb_status_t st = nb__rpc_call_start(c, &c->op_send, ops, n);
  if (st == NB_OK && !nb__rpc_call_wait(c, &c->op_send))
    st = nb_error(NB_ERR_CANCELLED, "rpc %s: call cancelled while sending", c->method_name);
  grpc_byte_buffer_destroy(bb);
  pthread_mutex_lock(&c->mu);
  c->send_busy = 0;
  if (st == NB_OK) c->sends++;
  pthread_mutex_unlock(&c->mu);
  return st;
}

nb_status_t nb_rpc_call_send(nb_rpc_call_t* c, const void* data, size_t len) {
  if (c == NULL || (data == NULL && len > 0))
    return nb_error(NB_ERR_INVALID, "nb_rpc_call_send: NULL argument");
  if (c->method->kind == NB_RPC_UNARY || c->method->kind == NB_RPC_CLIENT_STREAMING) {
    if (c->sends > 0)
      return nb_error(NB_ERR_INVALID, "rpc %s: a second response on a single-response method",
                      c->method_name);
  }
  return nb__rpc_call_send_bb(c, nb__rpc_copy_buffer(data, len));
}

nb_status_t nb_rpc_call_send_pb(nb_rpc_call_t* c, const ProtobufCMessage* msg) {
  if (c == NULL || msg == NULL)
    return nb_error(NB_ERR_INVALID, "nb_rpc_call_send_pb: NULL argument");
  if ((c->method->kind == NB_RPC_UNARY || c->method->kind == NB_RPC_CLIENT_STREAMING) &&
      c->sends > 0)
    return nb_error(NB_ERR_INVALID, "rpc %s: a second response on a single-response method",
                    c->method_name);
  grpc_byte_buffer* bb = NULL;
  NB_CHECK(nb__rpc_pack(msg, &bb));
  return nb__rpc_call_send_bb(c, bb);
}

void nb_rpc_call_cancel(nb_rpc_call_t* c) {
  if (c != NULL && c->call != NULL) grpc_call_cancel(c->call, NULL);
}

int nb_rpc_call_cancelled(nb_rpc_call_t* c) {
  pthread_mutex_lock(&c->mu);
  int r = c->op_close.done && c->cancelled;
  pthread_mutex_unlock(&c->mu);
  return r;
}

int64_t nb_rpc_call_deadline_left_ms(const nb_rpc_call_t* c) {
  gpr_timespec dl = gpr_convert_clock_type(c->details.deadline, GPR_CLOCK_MONOTONIC);
  if (gpr_time_cmp(dl, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0) return -1;
  gpr_timespec left = gpr_time_sub(dl, gpr_now(GPR_CLOCK_MONOTONIC));
  int64_t ms = (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
  return ms < 0 ? 0 : ms;
}

const nb_tls_peer_t* nb_rpc_call_peer(const nb_rpc_call_t* c) {
  return &c->peer;
}
const char* nb_rpc_call_method(const nb_rpc_call_t* c) {
  return c->method_name;
}
const char* nb_rpc_call_peer_address(const nb_rpc_call_t* c) {
  return c->peer_addr;
}

static void* nb__rpc_handler_main(void* arg) {
  struct nb_rpc_call* c = arg;
  nb_rpc_server_t* srv = c->srv;
  nb_status_t st = NB_OK;
  char detail[512] = "";

  grpc_op close_op;
  memset(&close_op, 0, sizeof close_op);
  close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  close_op.data.recv_close_on_server.cancelled = &c->cancelled;
  int close_started = nb__rpc_call_start(c, &c->op_close, &close_op, 1) == NB_OK;

  if (srv->tls) {
    st = nb_tls_peer_from_call(c->call, &c->peer);
    if (st == NB_OK && srv->authorize != NULL)
      st = srv->authorize(&c->peer, c->method_name, srv->authorize_user);
    if (st != NB_OK) {
      NB_WARN("rpc: refused %s from %s (%s): %s", c->method_name, c->peer_addr,
              c->peer.name[0] ? c->peer.name : "no identity", nb_error_last());
      snprintf(detail, sizeof detail, "%s", nb_error_last());
      st = NB_ERR_PERMISSION;
    }
  }
  if (st == NB_OK) {
    nb_error_clear();
    st = c->method->fn(c, c->method->user);
    if (st != NB_OK) {
      snprintf(detail, sizeof detail, "%s", nb_error_last());
      NB_INFO(RPC, "rpc %s from %s: handler returned %s: %s", c->method_name, c->peer_addr,
              nb_status_name(st), detail);
    } else if (c->sends == 0 &&
               (c->method->kind == NB_RPC_UNARY || c->method->kind == NB_RPC_CLIENT_STREAMING)) {
      st = NB_ERR_INTERNAL;
      snprintf(detail, sizeof detail, "handler of %s returned OK without a response",
               c->method_name);
      NB_WARN("rpc: %s", detail);
    }
  }

  /* The final status (with initial metadata if no message was sent). */
  c->status_details = grpc_slice_from_copied_string(detail);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)nb_rpc_code_from_status(st);
  ops[n++].data.send_status_from_server.status_details = &c->status_details;
  if (nb__rpc_call_start(c, &c->op_status, ops, n) == NB_OK) nb__rpc_call_wait(c, &c->op_status);
  if (close_started) nb__rpc_call_wait(c, &c->op_close);
  if (c->recv_pending) { /* the call is over: a receive left running completes now */
    nb__rpc_call_wait(c, &c->op_recv);
    if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
  }
  grpc_slice_unref(c->status_details);
  grpc_call_unref(c->call);
  c->call = NULL;

  pthread_mutex_lock(&srv->mu);
  c->next_zombie = srv->zombies;
  srv->zombies = c;
  srv->live_calls--;
  pthread_cond_broadcast(&srv->cv);
  pthread_mutex_unlock(&srv->mu);
  return NULL;
}

static void nb__rpc_on_accept(nb_rpc_server_t* srv, struct nb_rpc_call* c, int ok) {
  pthread_mutex_lock(&srv->mu);
  srv->pending_requests--;
  if (!ok) { /* the server is shutting down: no call came */
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    nb__rpc_call_free(c);
    return;
  }
  int shutting = srv->shutting_down;
  if (!shutting) nb__rpc_request_call(srv);
  int too_many = srv->live_calls >= srv->max_calls;
  srv->live_calls++;
  pthread_mutex_unlock(&srv->mu);
  nb__rpc_reap(srv);

  size_t mlen = GRPC_SLICE_LENGTH(c->details.method);
  if (mlen >= sizeof c->method_name) mlen = sizeof c->method_name - 1;
  memcpy(c->method_name, GRPC_SLICE_START_PTR(c->details.method), mlen);
  c->method_name[mlen] = '\0';
  char* peer = grpc_call_get_peer(c->call);
  snprintf(c->peer_addr, sizeof c->peer_addr, "%s", peer ? peer : "?");
  gpr_free(peer);

  for (const nb__rpc_method_t* m = srv->methods; m; m = m->next)
    if (strlen(m->name) == GRPC_SLICE_LENGTH(c->details.method) &&
        memcmp(m->name, GRPC_SLICE_START_PTR(c->details.method), strlen(m->name)) == 0)
      c->method = m;
  if (shutting) {
    nb__rpc_reject(c, GRPC_STATUS_UNAVAILABLE, "server shutting down");
  } else if (c->method == NULL) {
    NB_INFO(RPC, "rpc: unknown method %s from %s", c->method_name, c->peer_addr);
    nb__rpc_reject(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method");
  } else if (too_many) {
    NB_WARN(
        "rpc: %d calls in flight, refusing %s from %s; raise NB_RPC_MAX_CALLS if this is "
        "expected",
        srv->max_calls, c->method_name, c->peer_addr);
    nb__rpc_reject(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "too many calls in flight");
  } else if (pthread_create(&c->thread, NULL, nb__rpc_handler_main, c) != 0) {
    NB_WARN("rpc: cannot start a handler thread for %s", c->method_name);
    nb__rpc_reject(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "no handler thread");
  }
}

static void* nb__rpc_cq_main(void* arg) {
  nb_rpc_server_t* srv = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    nb__rpc_op_t* op = ev.tag;
    if (op->kind == NB__OP_SHUTDOWN) {
      pthread_mutex_lock(&srv->mu);
      srv->shutdown_seen = 1;
      pthread_cond_broadcast(&srv->cv);
      pthread_mutex_unlock(&srv->mu);
    } else if (op->kind == NB__OP_ACCEPT) {
      nb__rpc_on_accept(srv, op->call, ev.success);
    } else if (op->kind == NB__OP_REJECT) {
      struct nb_rpc_call* c = op->call;
      grpc_slice_unref(c->status_details);
      grpc_call_unref(c->call);
      nb__rpc_call_free(c);
      pthread_mutex_lock(&srv->mu);
      srv->live_calls--;
      pthread_cond_broadcast(&srv->cv);
      pthread_mutex_unlock(&srv->mu);
    } else {
      struct nb_rpc_call* c = op->call;
      pthread_mutex_lock(&c->mu);
      op->done = 1;
      op->ok = ev.success;
      pthread_cond_broadcast(&c->cv);
      pthread_mutex_unlock(&c->mu);
    }
  }
  return NULL;
}

nb_status_t nb_rpc_server_create(const nb_rpc_server_opts_t* opts, nb_rpc_server_t** out) {
  if (opts == NULL || out == NULL || opts->listen == NULL || opts->listen[0] == '\0')
    return nb_error(NB_ERR_INVALID, "nb_rpc_server_create: no listen address");
  *out = NULL;
  if (opts->tls == NULL && opts->tls_source == NULL && !opts->allow_insecure)
    return nb_error(NB_ERR_INVALID, "server on %s: no TLS material and plaintext not allowed",
                    opts->listen);
  if (opts->tls != NULL && opts->tls_source != NULL)
    return nb_error(NB_ERR_INVALID, "server on %s: tls and tls_source exclude each other",
                    opts->listen);
  nb_rpc_server_t* srv = calloc(1, sizeof *srv);
  if (srv == NULL) return nb_error(NB_ERR_NOMEM, "rpc server");
  srv->listen = strdup(opts->listen);
  if (srv->listen == NULL) {
    free(srv);
    return nb_error(NB_ERR_NOMEM, "rpc server");
  }
  nb__rpc_grpc_init();
  pthread_mutex_init(&srv->mu, NULL);
  nb_cond_init_mono(&srv->cv); /* the shutdown's grace is a timed wait */
  srv->op_shutdown.kind = NB__OP_SHUTDOWN;
  srv->authorize = opts->authorize;
  srv->authorize_user = opts->authorize_user;
  srv->max_calls = opts->max_calls > 0 ? opts->max_calls : (int)nb_param_RpcMaxCalls();

  size_t maxmsg = nb__rpc_max_msg(opts->max_message_bytes);
  nb__rpc_args_t args = {.n = 0};
  nb__rpc_arg_int(&args, GRPC_ARG_ALLOW_REUSEPORT, 0);
  nb__rpc_arg_int(&args, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)maxmsg);
  nb__rpc_arg_int(&args, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)maxmsg);
  /* Accept our clients' keepalive pings (every NB_RPC_KEEPALIVE_MS, even when idle) instead of
   * answering them with GOAWAY too_many_pings. */
  nb__rpc_arg_int(&args, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  nb__rpc_arg_int(&args, GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  nb__rpc_arg_int(&args, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  nb__rpc_arg_int(&args, GRPC_ARG_KEEPALIVE_TIME_MS, (int)nb_param_RpcKeepaliveMs());
  nb__rpc_arg_int(&args, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, (int)nb_param_RpcKeepaliveTimeoutMs());
  grpc_channel_args cargs = {.num_args = args.n, .args = args.a};
  srv->server = grpc_server_create(&cargs, NULL);
  srv->cq = grpc_completion_queue_create_for_next(NULL);
  if (srv->server == NULL || srv->cq == NULL) {
    nb_rpc_server_destroy(srv);
    return nb_error(NB_ERR_RPC, "grpc_server_create failed");
  }
  grpc_server_register_completion_queue(srv->server, srv->cq, NULL);

  grpc_server_credentials* creds = NULL;
  nb_status_t st = NB_OK;
  if (opts->tls_source != NULL) {
    st = nb_tls_source_server_credentials(opts->tls_source, &creds);
    srv->tls = 1;
  } else if (opts->tls != NULL) {
    st = nb_tls_server_credentials(opts->tls, &creds);
    srv->tls = 1;
  } else {
    creds = grpc_insecure_server_credentials_create();
    NB_WARN("rpc: server on %s runs WITHOUT TLS (allowed for tests and benchmarks only)",
            opts->listen);
  }
  if (st == NB_OK) {
    srv->port = grpc_server_add_http2_port(srv->server, srv->listen, creds);
    if (srv->port <= 0)
      st = nb_error(NB_ERR_UNAVAILABLE, "cannot listen on %s (address in use or not local?)",
                    srv->listen);
  }
  if (creds) grpc_server_credentials_release(creds);
  if (st != NB_OK) {
    srv->port = 0;
    nb_rpc_server_destroy(srv);
    return st;
  }
  *out = srv;
  return NB_OK;
}

nb_status_t nb_rpc_server_add_method(nb_rpc_server_t* srv, const char* method, nb_rpc_kind_t kind,
                                     nb_rpc_handler_fn fn, void* user) {
  if (srv == NULL || method == NULL || fn == NULL || method[0] != '/' ||
      strchr(method + 1, '/') == NULL || strlen(method) >= sizeof(((nb_rpc_call_t*)0)->method_name))
    return nb_error(NB_ERR_INVALID, "method name '%s' is not '/package.Service/Method'",
                    method ? method : "(null)");
  if (srv->started) return nb_error(NB_ERR_INVALID, "method %s added after start", method);
  for (nb__rpc_method_t* m = srv->methods; m; m = m->next)
    if (strcmp(m->name, method) == 0) return nb_error(NB_ERR_EXISTS, "method %s twice", method);
  nb__rpc_method_t* m = calloc(1, sizeof *m);
  if (m == NULL || (m->name = strdup(method)) == NULL) {
    free(m);
    return nb_error(NB_ERR_NOMEM, "rpc method");
  }
  m->kind = kind;
  m->fn = fn;
  m->user = user;
  m->next = srv->methods;
  srv->methods = m;
  return NB_OK;
}

nb_status_t nb_rpc_server_start(nb_rpc_server_t* srv) {
  if (srv == NULL || srv->started) return nb_error(NB_ERR_INVALID, "server missing or started");
  grpc_server_start(srv->server);
  srv->started = 1;
  pthread_mutex_lock(&srv->mu);
  nb__rpc_request_call(srv);
  int pending = srv->pending_requests;
  pthread_mutex_unlock(&srv->mu);
  if (pthread_create(&srv->cq_thread, NULL, nb__rpc_cq_main, srv) != 0) {
    /* destroy() shuts the started server down and drains the queue inline */
    return nb_error(NB_ERR_SYSTEM, "cannot start the server's queue thread");
  }
  srv->started = 2;
  if (pending == 0) return nb_error(NB_ERR_RPC, "server on %s cannot accept calls", srv->listen);
  NB_INFO(RPC, "rpc: serving on %s (port %d, %s)", srv->listen, srv->port,
          srv->tls ? "mTLS" : "plaintext");
  return NB_OK;
}

int nb_rpc_server_port(const nb_rpc_server_t* srv) {
  return srv && srv->started == 2 ? srv->port : 0;
}

/* Drains a completion queue that no thread serves (after a failed start): every requested call
 * fails, then the queue reports its shutdown. */
static void nb__rpc_drain_inline(nb_rpc_server_t* srv) {
  grpc_completion_queue_shutdown(srv->cq);
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    nb__rpc_op_t* op = ev.tag;
    if (ev.type == GRPC_OP_COMPLETE && op->kind == NB__OP_ACCEPT) {
      if (ev.success) grpc_call_unref(op->call->call);
      nb__rpc_call_free(op->call);
    }
  }
}

/* Waits up to grace_ms for the server's live calls to end. */
static void nb__rpc_grace(nb_rpc_server_t* srv, int64_t grace_ms) {
  int64_t dl = nb_now_ns() + grace_ms * 1000000LL;
  pthread_mutex_lock(&srv->mu);
  while (srv->live_calls > 0)
    if (nb_cond_wait_until(&srv->cv, &srv->mu, dl) != 0) break;
  pthread_mutex_unlock(&srv->mu);
}

void nb_rpc_server_destroy(nb_rpc_server_t* srv) {
  if (srv == NULL) return;
  if (srv->started) {
    pthread_mutex_lock(&srv->mu);
    srv->shutting_down = 1;
    pthread_mutex_unlock(&srv->mu);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->op_shutdown);
    /* calls under way get a grace to finish before they are cancelled: the last answer of a
     * job (the ack of a peer's final frame) must still reach the peer when we close right
     * after it was handled */
    if (srv->started == 2) nb__rpc_grace(srv, nb_param_RpcShutdownGraceMs());
    grpc_server_cancel_all_calls(srv->server);
    if (srv->started == 2) {
      pthread_mutex_lock(&srv->mu);
      while (!srv->shutdown_seen || srv->pending_requests > 0 || srv->live_calls > 0)
        pthread_cond_wait(&srv->cv, &srv->mu);
      pthread_mutex_unlock(&srv->mu);
      grpc_completion_queue_shutdown(srv->cq);
      pthread_join(srv->cq_thread, NULL);
    } else {
      nb__rpc_drain_inline(srv);
    }
    nb__rpc_reap(srv);
    grpc_server_destroy(srv->server);
    srv->server = NULL;
  } else if (srv->server != NULL && srv->cq != NULL) {
    /* Never started: gRPC still wants a shutdown once a port was added. */
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->op_shutdown);
    nb__rpc_drain_inline(srv);
    grpc_server_destroy(srv->server);
    srv->server = NULL;
  } else {
    if (srv->server) grpc_server_destroy(srv->server);
    srv->server = NULL;
    if (srv->cq) nb__rpc_drain_inline(srv);
  }
  if (srv->server) grpc_server_destroy(srv->server);
  if (srv->cq) grpc_completion_queue_destroy(srv->cq);
  while (srv->methods) {
    nb__rpc_method_t* m = srv->methods;
    srv->methods = m->next;
    free(m->name);
    free(m);
  }
  pthread_mutex_destroy(&srv->mu);
  pthread_cond_destroy(&srv->cv);
  free(srv->listen);
  free(srv);
  grpc_shutdown_blocking();
}

/* ------------------------------------------------------------------ client */

struct nb_rpc_client {
  grpc_channel* ch;
  char* target;
};

nb_status_t nb_rpc_client_create(const char* target, const nb_rpc_client_opts_t* opts,
                                 nb_rpc_client_t** out) {
  if (target == NULL || target[0] == '\0' || opts == NULL || out == NULL)
    return nb_error(NB_ERR_INVALID, "nb_rpc_client_create: no target");
  *out = NULL;
  if (opts->tls == NULL && !opts->allow_insecure)
    return nb_error(NB_ERR_INVALID, "client to %s: no TLS material and plaintext not allowed",
                    target);
  nb_rpc_client_t* cli = calloc(1, sizeof *cli);
  if (cli == NULL || (cli->target = strdup(target)) == NULL) {
    free(cli);
    return nb_error(NB_ERR_NOMEM, "rpc client");
  }
  nb__rpc_grpc_init();
  size_t maxmsg = nb__rpc_max_msg(opts->max_message_bytes);
  nb__rpc_args_t args = {.n = 0};
  nb__rpc_arg_int(&args, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)maxmsg);
  nb__rpc_arg_int(&args, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)maxmsg);
  /* Each client is its own TCP connection: a link opens S of them to fill a long fat pipe. */
  nb__rpc_arg_int(&args, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  nb__rpc_arg_int(&args, GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  /* In gRPC 1.51 this "min backoff" is the connect timeout (TCP + TLS handshake): keep it
   * generous, a short one fails every handshake on a long-RTT link or a loaded host. */
  nb__rpc_arg_int(&args, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10000);
  nb__rpc_arg_int(&args, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, (int)nb_param_RpcMaxBackoffMs());
  if (opts->keepalive_ms >= 0) {
    int ka = opts->keepalive_ms > 0 ? opts->keepalive_ms : (int)nb_param_RpcKeepaliveMs();
    nb__rpc_arg_int(&args, GRPC_ARG_KEEPALIVE_TIME_MS, ka);
    nb__rpc_arg_int(&args, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, (int)nb_param_RpcKeepaliveTimeoutMs());
    nb__rpc_arg_int(&args, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    nb__rpc_arg_int(&args, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  if (opts->tls != NULL && opts->server_name != NULL)
    nb__rpc_arg_str(&args, GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, opts->server_name);
  grpc_channel_args cargs = {.num_args = args.n, .args = args.a};

  grpc_channel_credentials* creds = NULL;
  nb_status_t st = NB_OK;
  if (opts->tls != NULL)
    st = nb_tls_channel_credentials(opts->tls, opts->expected_cluster, &creds);
  else
    creds = grpc_insecure_credentials_create();
  if (st == NB_OK) {
    cli->ch = grpc_channel_create(target, creds, &cargs);
    if (cli->ch == NULL) st = nb_error(NB_ERR_RPC, "cannot create a channel to %s", target);
  }
  if (creds) grpc_channel_credentials_release(creds);
  if (st != NB_OK) {
    nb_rpc_client_destroy(cli);
    return st;
  }
  *out = cli;
  return NB_OK;
}

void nb_rpc_client_destroy(nb_rpc_client_t* cli) {
  if (cli == NULL) return;
  if (cli->ch) grpc_channel_destroy(cli->ch);
  free(cli->target);
  free(cli);
  grpc_shutdown_blocking();
}

nb_rpc_conn_state_t nb_rpc_client_state(nb_rpc_client_t* cli, int try_connect) {
  if (cli == NULL || cli->ch == NULL) return NB_RPC_SHUTDOWN;
  return (nb_rpc_conn_state_t)grpc_channel_check_connectivity_state(cli->ch, try_connect);
}

nb_status_t nb_rpc_client_wait_ready(nb_rpc_client_t* cli, int64_t timeout_ms) {
  if (cli == NULL) return nb_error(NB_ERR_INVALID, "nb_rpc_client_wait_ready: NULL");
  gpr_timespec until = nb__rpc_deadline(timeout_ms);
  grpc_completion_queue* cq = grpc_completion_queue_create_for_pluck(NULL);
  char tag;
  grpc_connectivity_state s = grpc_channel_check_connectivity_state(cli->ch, 1);
  int timed_out = 0;
  while (s != GRPC_CHANNEL_READY && s != GRPC_CHANNEL_SHUTDOWN && !timed_out) {
    grpc_channel_watch_connectivity_state(cli->ch, s, until, cq, &tag);
    grpc_event ev =
        grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    timed_out = !ev.success; /* the watch reports failure when the deadline came first */
    s = grpc_channel_check_connectivity_state(cli->ch, 1);
  }
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  if (s == GRPC_CHANNEL_READY) return NB_OK;
  return nb_error(NB_ERR_TIMEOUT, "channel to %s not ready within %lld ms (state %d)", cli->target,
                  (long long)timeout_ms, (int)s);
}

/* Client call tags: the address of one of these. */
enum { NB__T_MD, NB__T_INIT_MD, NB__T_SEND, NB__T_CLOSE, NB__T_RECV, NB__T_STATUS, NB__T_COUNT };

struct nb_rpc_stream {
  grpc_call* call;
  grpc_completion_queue* cq;
  char method[256];
  char tags[NB__T_COUNT];   /* addresses used as tags */
  int pending[NB__T_COUNT]; /* batch started, completion not plucked yet */
  pthread_mutex_t status_mu;
  int status_done;
  grpc_status_code code;
  grpc_slice details;
  grpc_metadata_array init_md, trail_md;
  grpc_byte_buffer* recv_bb;
  int half_closed;
  int send_busy, recv_busy;
  pthread_mutex_t mu; /* guards the busy flags and pending[] */
};

/* Plucks one tag; 1 = completed (ok in *ok), 0 = the wait ran out. */
static int nb__rpc_pluck(nb_rpc_stream_t* s, int t, gpr_timespec until, int* ok) {
  grpc_event ev = grpc_completion_queue_pluck(s->cq, &s->tags[t], until, NULL);
  if (ev.type == GRPC_QUEUE_TIMEOUT) return 0;
  *ok = ev.type == GRPC_OP_COMPLETE && ev.success;
  pthread_mutex_lock(&s->mu);
  s->pending[t] = 0;
  pthread_mutex_unlock(&s->mu);
  return 1;
}

static nb_status_t nb__rpc_stream_batch(nb_rpc_stream_t* s, int t, const grpc_op* ops, size_t n) {
  pthread_mutex_lock(&s->mu);
  s->pending[t] = 1;
  pthread_mutex_unlock(&s->mu);
  grpc_call_error e = grpc_call_start_batch(s->call, ops, n, &s->tags[t], NULL);
  if (e != GRPC_CALL_OK) {
    pthread_mutex_lock(&s->mu);
    s->pending[t] = 0;
    pthread_mutex_unlock(&s->mu);
    return nb_error(NB_ERR_RPC, "rpc %s: starting a batch failed (grpc_call_error %d)", s->method,
                    e);
  }
  return NB_OK;
}

/* Waits for the final status (once; other threads wait on the mutex) and maps it. */
static nb_status_t nb__rpc_stream_status(nb_rpc_stream_t* s) {
  pthread_mutex_lock(&s->status_mu);
  if (!s->status_done) {
    int ok = 0;
    nb__rpc_pluck(s, NB__T_STATUS, gpr_inf_future(GPR_CLOCK_MONOTONIC), &ok);
    s->status_done = 1;
  }
  pthread_mutex_unlock(&s->status_mu);
  if (s->code == GRPC_STATUS_OK) return NB_OK;
  return nb__rpc_client_error(s->method, s->code, s->details);
}

nb_status_t nb_rpc_stream_open(nb_rpc_client_t* cli, const char* method, int64_t timeout_ms,
                               unsigned flags, nb_rpc_stream_t** out) {
  if (cli == NULL || method == NULL || out == NULL || method[0] != '/')
    return nb_error(NB_ERR_INVALID, "nb_rpc_stream_open: bad argument");
  *out = NULL;
  nb_rpc_stream_t* s = calloc(1, sizeof *s);
  if (s == NULL) return nb_error(NB_ERR_NOMEM, "rpc stream");
  snprintf(s->method, sizeof s->method, "%s", method);
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->status_mu, NULL);
  grpc_metadata_array_init(&s->init_md);
  grpc_metadata_array_init(&s->trail_md);
  s->code = (grpc_status_code)-1;
  s->details = grpc_empty_slice();
  s->cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice m = grpc_slice_from_copied_string(method);
  s->call = grpc_channel_create_call(cli->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, m, NULL,
                                     nb__rpc_deadline(timeout_ms), NULL);
  grpc_slice_unref(m);
  nb_status_t st = NB_OK;
  if (s->call == NULL) {
    st = nb_error(NB_ERR_RPC, "rpc %s: cannot create the call", method);
    goto fail;
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_INITIAL_METADATA;
  op.flags = (flags & NB_RPC_WAIT_FOR_READY) ? GRPC_INITIAL_METADATA_WAIT_FOR_READY : 0;
  NB_CHECK_GOTO(nb__rpc_stream_batch(s, NB__T_MD, &op, 1), st, fail);
  /* Always receive the server's initial metadata: gRPC holds the final status back until it
   * was, so a caller that never reads (finish right after sending) would wait for the deadline. */
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_INITIAL_METADATA;
  op.data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
  NB_CHECK_GOTO(nb__rpc_stream_batch(s, NB__T_INIT_MD, &op, 1), st, fail);
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &s->trail_md;
  op.data.recv_status_on_client.status = &s->code;
  op.data.recv_status_on_client.status_details = &s->details;
  NB_CHECK_GOTO(nb__rpc_stream_batch(s, NB__T_STATUS, &op, 1), st, fail);
  *out = s;
  return NB_OK;
fail:
  nb_rpc_stream_destroy(s);
  return st;
}

static nb_status_t nb__rpc_stream_send_bb(nb_rpc_stream_t* s, grpc_byte_buffer* bb) {
  pthread_mutex_lock(&s->mu);
  int bad = s->send_busy || s->half_closed;
  if (!bad) s->send_busy = 1;
  pthread_mutex_unlock(&s->mu);
  if (bad) {
    grpc_byte_buffer_destroy(bb);
    return nb_error(NB_ERR_INVALID, "rpc %s: send after close_send or two sends at once",
                    s->method);
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = bb;
  nb_status_t st = nb__rpc_stream_batch(s, NB__T_SEND, &op, 1);
  int ok = 0;
  if (st == NB_OK) nb__rpc_pluck(s, NB__T_SEND, gpr_inf_future(GPR_CLOCK_MONOTONIC), &ok);
  grpc_byte_buffer_destroy(bb);
  if (st == NB_OK && !ok) {
    st = nb__rpc_stream_status(s);
    if (st == NB_OK)
      st = nb_error(NB_ERR_REMOTE, "rpc %s: server finished before our send", s->method);
  }
  pthread_mutex_lock(&s->mu);
  s->send_busy = 0;
  pthread_mutex_unlock(&s->mu);
  return st;
}

nb_status_t nb_rpc_stream_send(nb_rpc_stream_t* s, const void* data, size_t len) {
  if (s == NULL || (data == NULL && len > 0))
    return nb_error(NB_ERR_INVALID, "nb_rpc_stream_send: NULL argument");
  return nb__rpc_stream_send_bb(s, nb__rpc_copy_buffer(data, len));
}

nb_status_t nb_rpc_stream_send_pb(nb_rpc_stream_t* s, const ProtobufCMessage* msg) {
  if (s == NULL || msg == NULL) return nb_error(NB_ERR_INVALID, "nb_rpc_stream_send_pb: NULL");
  grpc_byte_buffer* bb = NULL;
  NB_CHECK(nb__rpc_pack(msg, &bb));
  return nb__rpc_stream_send_bb(s, bb);
}

nb_status_t nb_rpc_out_alloc(size_t len, nb_rpc_out_t* out) {
  if (out == NULL) return nb_error(NB_ERR_INVALID, "nb_rpc_out_alloc: NULL out");
  memset(out, 0, sizeof *out);
  grpc_slice* sl = malloc(sizeof *sl);
  if (sl == NULL) return nb_error(NB_ERR_NOMEM, "rpc message of %zu bytes", len);
  *sl = grpc_slice_malloc(len);
  out->data = GRPC_SLICE_START_PTR(*sl);
  out->len = len;
  out->priv_ = sl;
  return NB_OK;
}

void nb_rpc_out_release(nb_rpc_out_t* m) {
  if (m == NULL || m->priv_ == NULL) return;
  grpc_slice* sl = m->priv_;
  grpc_slice_unref(*sl);
  free(sl);
  memset(m, 0, sizeof *m);
}

nb_status_t nb_rpc_stream_send_out(nb_rpc_stream_t* s, nb_rpc_out_t* m) {
  if (s == NULL || m == NULL || m->priv_ == NULL) {
    nb_rpc_out_release(m);
    return nb_error(NB_ERR_INVALID, "nb_rpc_stream_send_out: NULL argument");
  }
  grpc_slice* sl = m->priv_;
  if (m->len > GRPC_SLICE_LENGTH(*sl)) {
    nb_rpc_out_release(m);
    return nb_error(NB_ERR_INVALID, "nb_rpc_stream_send_out: len grew after allocation");
  }
  if (m->len < GRPC_SLICE_LENGTH(*sl)) *sl = grpc_slice_sub_no_ref(*sl, 0, m->len);
  grpc_byte_buffer* bb = grpc_raw_byte_buffer_create(sl, 1); /* its own reference */
  nb_rpc_out_release(m);
  return nb__rpc_stream_send_bb(s, bb);
}

nb_status_t nb_rpc_stream_close_send(nb_rpc_stream_t* s) {
  if (s == NULL) return nb_error(NB_ERR_INVALID, "nb_rpc_stream_close_send: NULL");
  pthread_mutex_lock(&s->mu);
  int bad = s->send_busy, already = s->half_closed;
  if (!bad) s->half_closed = 1;
  pthread_mutex_unlock(&s->mu);
  if (already) return NB_OK;
  if (bad) return nb_error(NB_ERR_INVALID, "rpc %s: close_send during a send", s->method);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  NB_CHECK(nb__rpc_stream_batch(s, NB__T_CLOSE, &op, 1));
  int ok = 0;
  nb__rpc_pluck(s, NB__T_CLOSE, gpr_inf_future(GPR_CLOCK_MONOTONIC), &ok);
  /* A failed half-close means the call is over; its status tells why at recv/finish. */
  return NB_OK;
}

nb_status_t nb_rpc_stream_recv(nb_rpc_stream_t* s, nb_rpc_msg_t* msg, int* end, int64_t wait_ms) {
  if (s == NULL || msg == NULL || end == NULL)
    return nb_error(NB_ERR_INVALID, "nb_rpc_stream_recv: NULL argument");
  memset(msg, 0, sizeof *msg);
  *end = 0;
  pthread_mutex_lock(&s->mu);
  int busy = s->recv_busy, pending = s->pending[NB__T_RECV];
  if (!busy) s->recv_busy = 1;
  pthread_mutex_unlock(&s->mu);
  if (busy) return nb_error(NB_ERR_INVALID, "rpc %s: two receives at once", s->method);
  nb_status_t st = NB_OK;
  if (!pending) { /* else: a receive that timed out earlier is still running; wait for it */
    grpc_op ops[1];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &s->recv_bb;
    s->recv_bb = NULL;
    NB_CHECK_GOTO(nb__rpc_stream_batch(s, NB__T_RECV, ops, n), st, out);
  }
  int ok = 0;
  if (!nb__rpc_pluck(s, NB__T_RECV, nb__rpc_deadline(wait_ms), &ok)) {
    st = nb_error(NB_ERR_TIMEOUT, "rpc %s: no message within %lld ms (call still open)", s->method,
                  (long long)wait_ms);
    goto out;
  }
  grpc_byte_buffer* bb = s->recv_bb;
  s->recv_bb = NULL;
  if (bb != NULL && ok) {
    st = nb__rpc_take_buffer(bb, msg);
  } else {
    if (bb) grpc_byte_buffer_destroy(bb);
    st = nb__rpc_stream_status(s); /* stream over: OK means a clean end */
    if (st == NB_OK) *end = 1;
  }
out:
  pthread_mutex_lock(&s->mu);
  s->recv_busy = 0;
  pthread_mutex_unlock(&s->mu);
  return st;
}

nb_status_t nb_rpc_stream_recv_pb(nb_rpc_stream_t* s, const ProtobufCMessageDescriptor* desc,
                                  ProtobufCMessage** out, int* end, int64_t wait_ms) {
  if (desc == NULL || out == NULL) return nb_error(NB_ERR_INVALID, "nb_rpc_stream_recv_pb: NULL");
  *out = NULL;
  nb_rpc_msg_t m;
  NB_CHECK(nb_rpc_stream_recv(s, &m, end, wait_ms));
  if (*end) return NB_OK;
  nb_status_t st = nb__rpc_unpack(&m, desc, out);
  nb_rpc_msg_release(&m);
  return st;
}

nb_status_t nb_rpc_stream_finish(nb_rpc_stream_t* s) {
  if (s == NULL) return nb_error(NB_ERR_INVALID, "nb_rpc_stream_finish: NULL");
  nb_rpc_stream_close_send(s);
  return nb__rpc_stream_status(s);
}

int nb_rpc_stream_code(const nb_rpc_stream_t* s) {
  return s && s->status_done ? (int)s->code : -1;
}

void nb_rpc_stream_cancel(nb_rpc_stream_t* s) {
  if (s != NULL && s->call != NULL) grpc_call_cancel(s->call, NULL);
}

void nb_rpc_stream_destroy(nb_rpc_stream_t* s) {
  if (s == NULL) return;
  if (s->call != NULL) {
    if (!s->status_done) grpc_call_cancel(s->call, NULL);
    for (int t = 0; t < NB__T_COUNT; t++) {
      if (!s->pending[t]) continue;
      int ok;
      nb__rpc_pluck(s, t, gpr_inf_future(GPR_CLOCK_MONOTONIC), &ok);
    }
    if (s->recv_bb) grpc_byte_buffer_destroy(s->recv_bb);
    grpc_call_unref(s->call);
  }
  if (s->cq != NULL) {
    /* Every started batch was plucked above: the queue is empty and reports its shutdown. */
    grpc_completion_queue_shutdown(s->cq);
    while (
        grpc_completion_queue_pluck(s->cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
        GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
  }
  grpc_metadata_array_destroy(&s->init_md);
  grpc_metadata_array_destroy(&s->trail_md);
  grpc_slice_unref(s->details);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->status_mu);
  free(s);
}

nb_status_t nb_rpc_unary(nb_rpc_client_t* cli, const char* method, const void* req, size_t len,
                         nb_rpc_msg_t* resp, int64_t timeout_ms, unsigned flags) {
  if (resp == NULL || (req == NULL && len > 0))
    return nb_error(NB_ERR_INVALID, "nb_rpc_unary: NULL argument");
  memset(resp, 0, sizeof *resp);
  nb_rpc_stream_t* s = NULL;
  NB_CHECK(nb_rpc_stream_open(cli, method, timeout_ms, flags, &s));
  /* One batch for the whole exchange: send, half-close, receive. */
  grpc_byte_buffer* bb = nb__rpc_copy_buffer(req, len);
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_MESSAGE;
  ops[0].data.send_message.send_message = bb;
  ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[2].op = GRPC_OP_RECV_MESSAGE;
  ops[2].data.recv_message.recv_message = &s->recv_bb;
  s->half_closed = 1;
  nb_status_t st = nb__rpc_stream_batch(s, NB__T_RECV, ops, 3);
  int ok = 0;
  if (st == NB_OK) nb__rpc_pluck(s, NB__T_RECV, gpr_inf_future(GPR_CLOCK_MONOTONIC), &ok);
  grpc_byte_buffer_destroy(bb);
  grpc_byte_buffer* rb = s->recv_bb;
  s->recv_bb = NULL;
  if (st == NB_OK) st = nb__rpc_stream_status(s);
  if (st == NB_OK && rb == NULL)
    st = nb_error(NB_ERR_REMOTE, "rpc %s: server returned OK without a response", method);
  if (st == NB_OK) {
    st = nb__rpc_take_buffer(rb, resp);
    rb = NULL;
  }
  if (rb) grpc_byte_buffer_destroy(rb);
  nb_rpc_stream_destroy(s);
  return st;
}

nb_status_t nb_rpc_unary_pb(nb_rpc_client_t* cli, const char* method, const ProtobufCMessage* req,
                            const ProtobufCMessageDescriptor* resp_desc, ProtobufCMessage** resp,
                            int64_t timeout_ms, unsigned flags) {
  if (req == NULL || resp_desc == NULL || resp == NULL)
    return nb_error(NB_ERR_INVALID, "nb_rpc_unary_pb: NULL argument");
  *resp = NULL;
  size_t n = protobuf_c_message_get_packed_size(req);
  uint8_t* buf = NULL;
  NB_CHECK(nb_alloc((void**)&buf, n ? n : 1, 1, "rpc request"));
  protobuf_c_message_pack(req, buf);
  nb_rpc_msg_t m;
  nb_status_t st = nb_rpc_unary(cli, method, buf, n, &m, timeout_ms, flags);
  nb_free(buf);
  if (st != NB_OK) return st;
  st = nb__rpc_unpack(&m, resp_desc, resp);
  nb_rpc_msg_release(&m);
  return st;
}
