/* Prometheus metrics: a registry of counters and gauges with labels, rendered in the text
 * exposition format 0.0.4, and a small HTTP/1.1 listener that serves it at GET /metrics (the
 * gateway's and a cluster leader's endpoint, docs/operations.md). It is not a client library of
 * Prometheus (no histograms, no summaries, no push) and not a general HTTP server: one request
 * per connection, answered in turn, from one thread.
 *
 * Thread safety: every function but nb_prom_destroy may be called from any thread while the
 * registry lives; updates and scrapes take one lock (held only to copy numbers, never across
 * I/O). nb_prom_destroy stops the listener (joining its thread) and must be called once, when no
 * other thread uses the registry. A NULL registry is accepted by the update functions and does
 * nothing, so that code which reports metrics does not test whether they are on. */
#ifndef NB_COMMON_PROM_H
#define NB_COMMON_PROM_H

#include <stddef.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_prom nb_prom_t;

typedef enum { NB_PROM_COUNTER = 0, NB_PROM_GAUGE = 1 } nb_prom_type_t;

#define NB_PROM_MAX_LABELS 2     /* label names of one family */
#define NB_PROM_MAX_FAMILIES 64  /* families of one registry */
#define NB_PROM_MAX_SERIES 256   /* label value combinations of one family */
#define NB_PROM_MAX_VALUE 128    /* bytes of one label value, NUL excluded */
#define NB_PROM_MAX_REQUEST 8192 /* bytes of a request's head; a longer one is refused (400) */

/* Creates an empty registry. out: receives it, freed with nb_prom_destroy. Returns NB_OK,
 * NB_ERR_INVALID (NULL out), NB_ERR_NOMEM. */
nb_status_t nb_prom_create(nb_prom_t** out);

/* Declares a family. name: [a-zA-Z_:][a-zA-Z0-9_:]* (a counter's conventionally ends in
 * "_total"); help: one line of text (escaped on output); labels: NULL or "" for none, or a comma
 * list of up to NB_PROM_MAX_LABELS names [a-zA-Z_][a-zA-Z0-9_]* not starting with "__" (e.g.
 * "method,outcome"). All borrowed (copied). A family without labels is shown at 0 until it is
 * set; one with labels shows only the series that were updated. Returns NB_OK; NB_ERR_INVALID
 * (a bad name or label, the name declared already); NB_ERR_NOMEM (NB_PROM_MAX_FAMILIES). */
nb_status_t nb_prom_declare(nb_prom_t* p, const char* name, nb_prom_type_t type, const char* help,
                            const char* labels);

/* Adds v to the series of family `name` with the given label values (one per label name, in
 * order; NULL when the family has none), creating it at 0 first. A counter refuses v < 0 or
 * non-finite v. values: borrowed, each at most NB_PROM_MAX_VALUE bytes, any bytes but NUL
 * (escaped on output). p NULL: does nothing, NB_OK. Returns NB_OK; NB_ERR_NOT_FOUND (no such
 * family); NB_ERR_INVALID (a value too long, a counter decreased); NB_ERR_NOMEM (the family has
 * NB_PROM_MAX_SERIES series already: the update is dropped). */
nb_status_t nb_prom_add(nb_prom_t* p, const char* name, const char* const* values, double v);

/* Sets the series to v (as nb_prom_add). Also allowed on a counter, for a total kept elsewhere
 * that only grows (bytes a component counts itself); NaN and infinities are shown as
 * Prometheus spells them. Returns as nb_prom_add. */
nb_status_t nb_prom_set(nb_prom_t* p, const char* name, const char* const* values, double v);

/* Called on the listener's thread at the start of every scrape, before rendering, with no lock
 * held: the place to set gauges that are read from elsewhere (a count of jobs in the store). It
 * may call nb_prom_set / nb_prom_add. fn NULL: none. Call before nb_prom_listen. */
typedef void (*nb_prom_collect_fn)(nb_prom_t* p, void* user);
void nb_prom_set_collect(nb_prom_t* p, nb_prom_collect_fn fn, void* user);

/* The registry in the text exposition format 0.0.4 (families in declaration order, series in
 * creation order). out: NUL-terminated, the caller frees it with nb_free; len: optional, its
 * length. The collect callback is not called. Returns NB_OK, NB_ERR_INVALID, NB_ERR_NOMEM. */
nb_status_t nb_prom_render(nb_prom_t* p, char** out, size_t* len);

/* Starts serving the registry over HTTP/1.1 on addr, "HOST:PORT" ("127.0.0.1:9464",
 * "[::1]:9464"; an empty host is 127.0.0.1, loopback: give "0.0.0.0:PORT" to serve every
 * interface; port 0 picks a free one). GET /metrics (any query string) answers 200 with
 * Content-Type text/plain; version=0.0.4; another path 404; another method 405; a malformed or
 * oversized request (NB_PROM_MAX_REQUEST) 400; each connection is closed after one answer, and
 * one that has not sent its whole request head within 2 s is closed unanswered. At most once per
 * registry. Returns NB_OK; NB_ERR_INVALID (a malformed address, already listening);
 * NB_ERR_UNAVAILABLE (address in use, or not one of this host's); NB_ERR_SYSTEM. */
nb_status_t nb_prom_listen(nb_prom_t* p, const char* addr);

/* The bound port, 0 when not listening. */
int nb_prom_port(const nb_prom_t* p);

/* Internal, for tests and the fuzz target: the status the listener answers to a request head
 * of n bytes (any bytes): 200 (GET /metrics), 404, 405 or 400. Thread-safe. */
int nb__prom_request_status(const char* head, size_t n);

/* Stops the listener (waits for its thread) and frees the registry. NULL ok. */
void nb_prom_destroy(nb_prom_t* p);

#ifdef __cplusplus
}
#endif
#endif
