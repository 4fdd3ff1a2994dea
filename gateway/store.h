/* The gateway's job store: jobs, their state machine and their event log in one SQLite file in
 * WAL mode, so that they survive a restart and can be read while being written. It stores
 * descriptors as opaque JSON text; it does not parse, sign or schedule them. */
#ifndef NB_GATEWAY_STORE_H
#define NB_GATEWAY_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Schema version written to PRAGMA user_version by the newest migration. */
#define NB_JOB_STORE_SCHEMA_VERSION 3
#define NB_JOB_ID_MAX 64 /* job ids and owners are at most this many bytes, NUL included */

typedef struct nb_job_store nb_job_store_t;

/* Lifecycle: pending → proposed → running → succeeded | failed | cancelled. A job may also fail
 * or be cancelled before it runs (pending/proposed → failed | cancelled). The three end states
 * are final. Values are stored in the database: append only. */
typedef enum {
  NB_JOB_PENDING = 0,
  NB_JOB_PROPOSED = 1,
  NB_JOB_RUNNING = 2,
  NB_JOB_SUCCEEDED = 3,
  NB_JOB_FAILED = 4,
  NB_JOB_CANCELLED = 5
} nb_job_state_t;

#define NB_JOB_STATE_COUNT 6

typedef struct {
  char id[NB_JOB_ID_MAX];
  char owner[NB_JOB_ID_MAX * 4]; /* user identity from the client certificate */
  char* descriptor;              /* JSON text as submitted; owned, freed by nb_job_record_clear */
  nb_job_state_t state;
  int64_t created_ns, updated_ns; /* wall clock, ns since the Unix epoch */
  char* reason;                   /* why it failed / was cancelled ("" if none); owned */
} nb_job_record_t;

typedef struct {
  int64_t seq;     /* 1, 2, 3, ... per job */
  int64_t time_ns; /* wall clock */
  char kind[32];   /* "progress", "state", "log", ... */
  char* payload;   /* JSON text; owned, freed by nb_job_events_free */
} nb_job_event_t;

/* "pending", "proposed", ...; "unknown" for values out of range. */
const char* nb_job_state_name(nb_job_state_t s);
/* Parses a state name; returns NB_OK or NB_ERR_INVALID. */
nb_status_t nb_job_state_parse(const char* name, nb_job_state_t* out);
/* True when the lifecycle allows from → to. */
int nb_job_state_can_move(nb_job_state_t from, nb_job_state_t to);
/* True for succeeded, failed, cancelled. */
int nb_job_state_is_final(nb_job_state_t s);

/* Opens (creating if needed) the store at path and brings its schema up to
 * NB_JOB_STORE_SCHEMA_VERSION, each migration in its own transaction. Several handles, in one or
 * several processes, may have the same file open (WAL mode; writers wait up to 5 s for the lock).
 * path: borrowed. out: receives the handle; destroy with nb_job_store_close.
 * Returns NB_OK; NB_ERR_IO when the file cannot be opened or is not a database;
 * NB_ERR_UNSUPPORTED when its schema is newer than this build; NB_ERR_INVALID (NULL args). */
nb_status_t nb_job_store_open(const char* path, nb_job_store_t** out);

/* Closes the handle (NULL ok). */
void nb_job_store_close(nb_job_store_t* s);

/* Checks what the gateway relies on before it serves from the store: SQLite's integrity check,
 * the tables and columns of schema NB_JOB_STORE_SCHEMA_VERSION, and that every job has a known
 * state. Nothing is changed. Returns NB_OK; NB_ERR_INTEGRITY naming the first problem (the
 * integrity check's first complaint, a missing table or column, a job and its unknown state
 * number); NB_ERR_IO, NB_ERR_TIMEOUT (locked). Thread-safe per handle as the other calls. */
nb_status_t nb_job_store_check(nb_job_store_t* s);

/* The schema version found in the file (PRAGMA user_version). */
nb_status_t nb_job_store_schema_version(nb_job_store_t* s, int* out);

/* Adds a job in state pending. id: 1..63 bytes of [A-Za-z0-9._-]; owner: non-empty; descriptor:
 * valid JSON text (all borrowed). Returns NB_OK; NB_ERR_EXISTS when the id is taken;
 * NB_ERR_INVALID for a bad id, owner or JSON; NB_ERR_IO for database errors. */
nb_status_t nb_job_store_create(nb_job_store_t* s, const char* id, const char* owner,
                                const char* descriptor);

/* Fetches a job. out: filled, release with nb_job_record_clear. Returns NB_OK, NB_ERR_NOT_FOUND,
 * NB_ERR_IO, NB_ERR_NOMEM. */
nb_status_t nb_job_store_get(nb_job_store_t* s, const char* id, nb_job_record_t* out);

/* Moves a job to state `to` atomically (read, check, write in one immediate transaction, so two
 * handles racing for the same move cannot both win) and appends a "state" event recording it.
 * reason: borrowed, may be NULL; kept with the job. Returns NB_OK; NB_ERR_NOT_FOUND;
 * NB_ERR_INVALID when the lifecycle forbids the move (the message names both states);
 * NB_ERR_IO. */
nb_status_t nb_job_store_transition(nb_job_store_t* s, const char* id, nb_job_state_t to,
                                    const char* reason);

/* Lists jobs, oldest first. owner: NULL for all owners. state: a state, or -1 for all.
 * out/n: receive an array the caller frees with nb_job_records_free. Returns NB_OK, NB_ERR_IO,
 * NB_ERR_NOMEM. */
nb_status_t nb_job_store_list(nb_job_store_t* s, const char* owner, int state,
                              nb_job_record_t** out, size_t* n);

/* How many jobs are in state `state` (*out). Returns NB_OK, NB_ERR_INVALID, NB_ERR_IO. */
nb_status_t nb_job_store_count(nb_job_store_t* s, int state, int64_t* out);

/* Appends an event to a job's log. kind: 1..31 bytes; payload: valid JSON text (borrowed).
 * seq_out: optional, receives the event's sequence number (1 for the first). Returns NB_OK;
 * NB_ERR_NOT_FOUND (no such job); NB_ERR_INVALID (bad kind or JSON); NB_ERR_IO. */
nb_status_t nb_job_store_append_event(nb_job_store_t* s, const char* id, const char* kind,
                                      const char* payload, int64_t* seq_out);

/* Lists a job's events with seq > after_seq, in order, at most limit (0 = no limit).
 * out/n: receive an array freed with nb_job_events_free (n may be 0, *out then NULL).
 * Returns NB_OK; NB_ERR_NOT_FOUND (no such job); NB_ERR_IO; NB_ERR_NOMEM. */
nb_status_t nb_job_store_events(nb_job_store_t* s, const char* id, int64_t after_seq, size_t limit,
                                nb_job_event_t** out, size_t* n);

void nb_job_record_clear(nb_job_record_t* r);
void nb_job_records_free(nb_job_record_t* r, size_t n);
void nb_job_events_free(nb_job_event_t* e, size_t n);

/* A federated job's record (docs/gateway.md, Federation): its role at this gateway ("origin":
 * submitted here; "member": proposed by the origin), the origin's cluster id, the job secret
 * once committed, whether federation work remains (active: events to report, peers to cancel)
 * and the rest as JSON text (endpoints, per-cluster states, report position). */
typedef struct {
  char job_id[NB_JOB_ID_MAX];
  char role[16];
  char origin[NB_JOB_ID_MAX];
  uint8_t secret[32];
  int has_secret;
  int active;
  char* info; /* JSON object text; owned, freed by nb_job_fed_clear */
} nb_job_fed_t;

/* Inserts or replaces the federation record of an existing job (all fields written; info NULL
 * = "{}"). Returns NB_OK; NB_ERR_NOT_FOUND (no such job); NB_ERR_INVALID (bad id, role, JSON);
 * NB_ERR_IO. */
nb_status_t nb_job_store_fed_put(nb_job_store_t* s, const nb_job_fed_t* f);
/* The record of job id. out: release with nb_job_fed_clear. NB_ERR_NOT_FOUND when the job is
 * not federated. */
nb_status_t nb_job_store_fed_get(nb_job_store_t* s, const char* id, nb_job_fed_t* out);
/* Every record with active = 1, by job id. out: free with nb_job_feds_free. */
nb_status_t nb_job_store_fed_list_active(nb_job_store_t* s, nb_job_fed_t** out, size_t* n);
void nb_job_fed_clear(nb_job_fed_t* f); /* frees info and wipes the secret */
void nb_job_feds_free(nb_job_fed_t* f, size_t n);

/* Thread safety: a handle may be used by one thread at a time; use one handle per thread (they
 * may share the file). */

#ifdef __cplusplus
}
#endif
#endif
