/* inter/rpc: the one wrapper of gRPC C core in nebula, for every service (Exchange, Gateway,
 * Federation). Methods are strings ("/nebula.v1.Exchange/Ping"), messages are bytes or
 * protobuf-c messages. Handlers and client streams block with deadlines; gRPC's completion queues
 * stay inside. It is not a service layer: chunking, resume and sealing belong to inter/link.
 *
 * Server: one completion queue driven by one thread; each accepted call runs its handler on its
 * own thread, which reads and writes the call's messages with blocking calls. Client: one
 * channel (one TCP connection of its own) per nb_rpc_client_t; calls are unary or streams with
 * send/recv/finish. Every call may carry a deadline and wait for the channel to become ready. */
#ifndef NB_INTER_RPC_H
#define NB_INTER_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "security/tls.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_rpc_server nb_rpc_server_t;
typedef struct nb_rpc_call nb_rpc_call_t; /* one call on the server side */
typedef struct nb_rpc_client nb_rpc_client_t;
typedef struct nb_rpc_stream nb_rpc_stream_t; /* one call on the client side */

/* Timeouts are in milliseconds; this one means "no deadline". */
#define NB_RPC_INFINITE (-1)

/* Call flags. */
#define NB_RPC_WAIT_FOR_READY 1u /* queue the call until the channel connects (or the deadline) */

/* A received message. data/len stay valid until nb_rpc_msg_release. */
typedef struct {
  const uint8_t* data;
  size_t len;
  void* priv_;
} nb_rpc_msg_t;

/* Releases a received message (NULL or empty ok) and zeroes it. */
void nb_rpc_msg_release(nb_rpc_msg_t* msg);

/* What a method streams. It only documents intent and bounds the server's checks: a UNARY or
 * SERVER_STREAMING handler that sends nothing before returning NB_OK is a bug reported to the
 * client as INTERNAL, and so is a UNARY handler that sends two responses. */
typedef enum {
  NB_RPC_UNARY = 0,
  NB_RPC_SERVER_STREAMING = 1,
  NB_RPC_CLIENT_STREAMING = 2,
  NB_RPC_BIDI = 3,
} nb_rpc_kind_t;

/* ---------------------------------------------------------------- server */

/* A method handler. It runs on its own thread and reads the request(s) with nb_rpc_call_recv,
 * writes the response(s) with nb_rpc_call_send, and returns the call's status: NB_OK, or an
 * error whose nb_error_last() detail becomes the gRPC status message (the status code follows
 * the nb_status_t: INVALID → INVALID_ARGUMENT, PERMISSION → PERMISSION_DENIED, NOT_FOUND →
 * NOT_FOUND, TIMEOUT → DEADLINE_EXCEEDED, INTEGRITY → DATA_LOSS, UNAVAILABLE → UNAVAILABLE,
 * UNSUPPORTED → UNIMPLEMENTED, others → INTERNAL). It must return soon after any recv/send
 * returns NB_ERR_CANCELLED (client gone, deadline passed, or server shutting down), and must
 * check nb_rpc_call_cancelled() during long work of its own. */
typedef nb_status_t (*nb_rpc_handler_fn)(nb_rpc_call_t* call, void* user);

/* Runs before the handler of every call on a TLS server, on the handler's thread. peer: the
 * verified identity of the caller (borrowed). Return NB_OK to let the call through; any other
 * status refuses it with PERMISSION_DENIED and the nb_error_last() detail. */
typedef nb_status_t (*nb_rpc_authorize_fn)(const nb_tls_peer_t* peer, const char* method,
                                           void* user);

typedef struct {
  const char* listen;          /* "127.0.0.1:0", "[::1]:7000", "169.254.1.1:7000"; :0 = any port */
  const nb_tls_t* tls;         /* mTLS material (borrowed, only read during create); NULL means
                                  plaintext, which needs allow_insecure */
  nb_tls_source_t* tls_source; /* instead of tls: reloadable mTLS material, taken up at each
                                  new handshake (borrowed; must outlive the server) */
  int allow_insecure;          /* 1 = accept plaintext when tls and tls_source are NULL (tests) */
  nb_rpc_authorize_fn authorize; /* NULL: any certificate from the CA may call */
  void* authorize_user;
  size_t max_message_bytes; /* 0: NB_RPC_MAX_MESSAGE_MB */
  int max_calls;            /* concurrent calls (handler threads); 0: NB_RPC_MAX_CALLS */
} nb_rpc_server_opts_t;

/* Creates a server (not yet listening). opts: borrowed. out: set on NB_OK.
 * Returns NB_ERR_INVALID (no listen address; no tls without allow_insecure), NB_ERR_RPC,
 * NB_ERR_NOMEM. */
nb_status_t nb_rpc_server_create(const nb_rpc_server_opts_t* opts, nb_rpc_server_t** out);

/* Registers the handler of one full method name ("/pkg.Service/Method"; copied). Only before
 * nb_rpc_server_start. Calls to unregistered methods get UNIMPLEMENTED.
 * Returns NB_ERR_INVALID (bad name, after start), NB_ERR_EXISTS (registered twice), NB_ERR_NOMEM.
 */
nb_status_t nb_rpc_server_add_method(nb_rpc_server_t* srv, const char* method, nb_rpc_kind_t kind,
                                     nb_rpc_handler_fn fn, void* user);

/* Binds the listen address (SO_REUSEPORT off: a port in use is an error) and starts serving.
 * Returns NB_ERR_UNAVAILABLE when the address cannot be bound, NB_ERR_SYSTEM (thread). */
nb_status_t nb_rpc_server_start(nb_rpc_server_t* srv);

/* The bound TCP port after a successful start, else 0. */
int nb_rpc_server_port(const nb_rpc_server_t* srv);

/* Stops accepting, cancels every call in flight (handlers see NB_ERR_CANCELLED), waits for the
 * handlers to return, drains the completion queue and frees everything. NULL ok. Must not be
 * called from a handler. */
void nb_rpc_server_destroy(nb_rpc_server_t* srv);

/* Handler side. All of these are only valid inside the handler (or threads it joins before
 * returning). One recv and one send may be in progress at once (from two threads). */

/* Blocks until the next request message arrives. On NB_OK either *msg holds a message (release
 * it) and *end is 0, or the client has finished sending and *end is 1 (msg zeroed).
 * wait_ms bounds this wait (NB_RPC_INFINITE: until a message or the call ends): NB_ERR_TIMEOUT
 * means the call is still open and the same receive continues at the next recv (heartbeats).
 * Returns NB_ERR_CANCELLED when the call is gone, NB_ERR_INVALID when a recv is already running
 * on another thread. */
nb_status_t nb_rpc_call_recv(nb_rpc_call_t* call, nb_rpc_msg_t* msg, int* end, int64_t wait_ms);

/* nb_rpc_call_recv + protobuf-c unpack. *out: caller frees with protobuf_c_message_free_unpacked
 * (NULL at end of stream). Returns NB_ERR_CODEC when the bytes are not a `desc` message. */
nb_status_t nb_rpc_call_recv_pb(nb_rpc_call_t* call, const ProtobufCMessageDescriptor* desc,
                                ProtobufCMessage** out, int* end, int64_t wait_ms);

/* Sends one response message and blocks until gRPC's transport took it (not until the peer got
 * it). data: borrowed (copied). Returns NB_ERR_CANCELLED, NB_ERR_INVALID. */
nb_status_t nb_rpc_call_send(nb_rpc_call_t* call, const void* data, size_t len);
nb_status_t nb_rpc_call_send_pb(nb_rpc_call_t* call, const ProtobufCMessage* msg);

/* Cancels the call from any thread of the handler (for example a helper that saw the peer
 * stop answering): a recv or send blocked in another thread returns NB_ERR_CANCELLED. The
 * handler still returns normally. Thread-safe while the handler runs. */
void nb_rpc_call_cancel(nb_rpc_call_t* call);

/* 1 once the call is cancelled (client went away, deadline passed, server shutting down). */
int nb_rpc_call_cancelled(nb_rpc_call_t* call);

/* The verified identity of the caller (kind NONE on a plaintext server). Borrowed, valid for the
 * handler's lifetime. */
const nb_tls_peer_t* nb_rpc_call_peer(const nb_rpc_call_t* call);

/* Milliseconds left until the client's deadline (clamped at 0), or -1 when it set none. */
int64_t nb_rpc_call_deadline_left_ms(const nb_rpc_call_t* call);

/* The method name of the call, and the caller's address ("ipv4:127.0.0.1:45678"). Borrowed. */
const char* nb_rpc_call_method(const nb_rpc_call_t* call);
const char* nb_rpc_call_peer_address(const nb_rpc_call_t* call);

/* ---------------------------------------------------------------- client */

typedef struct {
  const nb_tls_t* tls; /* mTLS material (borrowed, read during create); NULL means
                          plaintext, which needs allow_insecure */
  int allow_insecure;
  const char* expected_cluster; /* with tls: the server must be this cluster (copied); NULL =
                                   any server certificate from the CA */
  const char* server_name;      /* with tls: name to check instead of the target's host */
  size_t max_message_bytes;     /* 0: NB_RPC_MAX_MESSAGE_MB */
  int keepalive_ms;             /* 0: NB_RPC_KEEPALIVE_MS; <0 disables keepalive pings */
} nb_rpc_client_opts_t;

/* Creates a channel to target ("127.0.0.1:7000", "[fd00::1]:7000"); it connects lazily, on
 * its own TCP connection (channels are not pooled), and reconnects by itself with a backoff of
 * at most NB_RPC_MAX_BACKOFF_MS. opts: borrowed. Returns NB_ERR_INVALID, NB_ERR_RPC,
 * NB_ERR_NOMEM. Thread-safe to use from many threads at once. */
nb_status_t nb_rpc_client_create(const char* target, const nb_rpc_client_opts_t* opts,
                                 nb_rpc_client_t** out);

/* Closes the channel. Every stream of it must be destroyed first. NULL ok. */
void nb_rpc_client_destroy(nb_rpc_client_t* cli);

/* Connection state of a client's channel (gRPC's connectivity states). */
typedef enum {
  NB_RPC_IDLE = 0,
  NB_RPC_CONNECTING = 1,
  NB_RPC_READY = 2,
  NB_RPC_TRANSIENT_FAILURE = 3,
  NB_RPC_SHUTDOWN = 4,
} nb_rpc_conn_state_t;

/* The channel's state now; with try_connect = 1 an idle channel starts connecting. */
nb_rpc_conn_state_t nb_rpc_client_state(nb_rpc_client_t* cli, int try_connect);

/* Connects (if idle) and waits until the channel is READY or timeout_ms passed. Returns NB_OK,
 * NB_ERR_TIMEOUT (still not connected; the state tells whether attempts are failing). Lets a
 * link open its S connections in parallel before it starts moving data. */
nb_status_t nb_rpc_client_wait_ready(nb_rpc_client_t* cli, int64_t timeout_ms);

/* One request, one response. req: borrowed. resp: filled on NB_OK (release it).
 * timeout_ms: the call's deadline (NB_RPC_INFINITE = none). flags: NB_RPC_WAIT_FOR_READY.
 * Returns NB_OK, or the server's status mapped back (see nb_rpc_handler_fn), NB_ERR_TIMEOUT
 * (deadline), NB_ERR_UNAVAILABLE (cannot connect now), NB_ERR_PERMISSION (the TLS handshake or
 * the server's authorization refused us), NB_ERR_CANCELLED, NB_ERR_RPC (others). The detail
 * names the method, the gRPC code and the server's message. */
nb_status_t nb_rpc_unary(nb_rpc_client_t* cli, const char* method, const void* req, size_t len,
                         nb_rpc_msg_t* resp, int64_t timeout_ms, unsigned flags);

/* nb_rpc_unary with protobuf-c messages. *resp: caller frees with
 * protobuf_c_message_free_unpacked. Returns NB_ERR_CODEC for an undecodable response. */
nb_status_t nb_rpc_unary_pb(nb_rpc_client_t* cli, const char* method, const ProtobufCMessage* req,
                            const ProtobufCMessageDescriptor* resp_desc, ProtobufCMessage** resp,
                            int64_t timeout_ms, unsigned flags);

/* Starts a streaming call (server-, client- or bidi-streaming). It does not wait for the
 * connection: errors show at the first send/recv. timeout_ms bounds the whole call.
 * out: destroy with nb_rpc_stream_destroy. One send and one recv may run at once (from two
 * threads); finish and destroy from one of them once the other is done. */
nb_status_t nb_rpc_stream_open(nb_rpc_client_t* cli, const char* method, int64_t timeout_ms,
                               unsigned flags, nb_rpc_stream_t** out);

/* Sends one message and blocks until the transport took it. data: borrowed (copied).
 * On failure the call is over and the status is the server's (or the deadline's). */
nb_status_t nb_rpc_stream_send(nb_rpc_stream_t* s, const void* data, size_t len);
nb_status_t nb_rpc_stream_send_pb(nb_rpc_stream_t* s, const ProtobufCMessage* msg);

/* A message buffer that the caller fills in place and hands to nb_rpc_stream_send_out, which
 * sends it without copying it (a gRPC slice underneath). For large messages that the caller
 * would otherwise build in a buffer of its own first (a sealed chunk is sealed straight into
 * it). */
typedef struct {
  uint8_t* data; /* len writable bytes */
  size_t len;
  void* priv_;
} nb_rpc_out_t;

/* Allocates len bytes (uninitialised). out: release with nb_rpc_out_release unless it is handed
 * to nb_rpc_stream_send_out. Returns NB_ERR_INVALID (NULL out), NB_ERR_NOMEM. Thread-safe. */
nb_status_t nb_rpc_out_alloc(size_t len, nb_rpc_out_t* out);

/* Frees a buffer that was not sent. NULL and released buffers ok. */
void nb_rpc_out_release(nb_rpc_out_t* m);

/* nb_rpc_stream_send of m->data[0..m->len) (len may have been lowered since the allocation,
 * not raised: NB_ERR_INVALID): takes m over in every case (m is emptied). */
nb_status_t nb_rpc_stream_send_out(nb_rpc_stream_t* s, nb_rpc_out_t* m);

/* Half-closes: tells the server no more messages follow. Idempotent. */
nb_status_t nb_rpc_stream_close_send(nb_rpc_stream_t* s);

/* Blocks until the next response message, the end of the stream (*end = 1, NB_OK: the server
 * finished with OK), or wait_ms passed (NB_ERR_TIMEOUT: the call is still alive and the same
 * receive continues at the next recv; NB_RPC_INFINITE waits up to the call's deadline).
 * Errors: the call's final status (see nb_rpc_unary). */
nb_status_t nb_rpc_stream_recv(nb_rpc_stream_t* s, nb_rpc_msg_t* msg, int* end, int64_t wait_ms);
nb_status_t nb_rpc_stream_recv_pb(nb_rpc_stream_t* s, const ProtobufCMessageDescriptor* desc,
                                  ProtobufCMessage** out, int* end, int64_t wait_ms);

/* Half-closes if needed, waits for the server's final status and returns it (NB_OK when the
 * server returned OK). Responses not yet received are discarded. */
nb_status_t nb_rpc_stream_finish(nb_rpc_stream_t* s);

/* The gRPC status code of a finished stream (-1 while unknown). */
int nb_rpc_stream_code(const nb_rpc_stream_t* s);

/* Cancels the call now, from any thread: a send or recv blocked in another thread returns
 * NB_ERR_CANCELLED (use it when a heartbeat says the peer is gone). The stream must still be
 * destroyed, once no other thread uses it. Thread-safe. */
void nb_rpc_stream_cancel(nb_rpc_stream_t* s);

/* Cancels the call if it is still running, drains it and frees it. NULL ok. */
void nb_rpc_stream_destroy(nb_rpc_stream_t* s);

/* gRPC status code ↔ nb_status_t, as used on both sides. */
int nb_rpc_code_from_status(nb_status_t st);
nb_status_t nb_rpc_status_from_code(int code);

#ifdef __cplusplus
}
#endif
#endif
