/* Job store on SQLite: WAL journal, versioned schema (PRAGMA user_version + ordered migrations),
 * every statement prepared with bound parameters. It is not a queue or a scheduler: callers decide
 * what to run; the store only keeps the record and refuses moves the lifecycle forbids. */
#include "gateway/store.h"

#include <jansson.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

struct nb_job_store {
  sqlite3* db;
};

/* Migration i takes the schema from version i to i+1. Append only: a released migration is never
 * edited, so every file converges on the same schema whatever version it started from. */
static const char* const nb__migrations[NB_JOB_STORE_SCHEMA_VERSION] = {
    /* 0 → 1: jobs and their event log. */
    "CREATE TABLE jobs ("
    "  id TEXT PRIMARY KEY,"
    "  owner TEXT NOT NULL,"
    "  descriptor TEXT NOT NULL,"
    "  state INTEGER NOT NULL,"
    "  created_ns INTEGER NOT NULL,"
    "  updated_ns INTEGER NOT NULL,"
    "  reason TEXT NOT NULL DEFAULT '');"
    "CREATE TABLE events ("
    "  job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  time_ns INTEGER NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  payload TEXT NOT NULL,"
    "  PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"
    "PRAGMA user_version = 1;",
    /* 1 → 2: list by owner and find live jobs after a restart without scanning. */
    "CREATE INDEX jobs_by_owner ON jobs(owner, created_ns);"
    "CREATE INDEX jobs_by_state ON jobs(state);"
    "PRAGMA user_version = 2;",
    /* 2 → 3: a federated job's role here, its origin, its secret and its federation info. */
    "CREATE TABLE federation ("
    "  job_id TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,"
    "  role TEXT NOT NULL,"
    "  origin TEXT NOT NULL,"
    "  secret BLOB,"
    "  active INTEGER NOT NULL DEFAULT 1,"
    "  info TEXT NOT NULL DEFAULT '{}') WITHOUT ROWID;"
    "CREATE INDEX federation_active ON federation(active);"
    "PRAGMA user_version = 3;",
};

static const char* const nb__state_names[NB_JOB_STATE_COUNT] = {
    "pending", "proposed", "running", "succeeded", "failed", "cancelled"};

const char* nb_job_state_name(nb_job_state_t s) {
  return (unsigned)s < NB_JOB_STATE_COUNT ? nb__state_names[s] : "unknown";
}

nb_status_t nb_job_state_parse(const char* name, nb_job_state_t* out) {
  for (int i = 0; name && i < NB_JOB_STATE_COUNT; i++)
    if (strcmp(name, nb__state_names[i]) == 0) {
      *out = (nb_job_state_t)i;
      return NB_OK;
    }
  return nb_error(NB_ERR_INVALID, "unknown job state \"%s\"", name ? name : "(null)");
}

int nb_job_state_is_final(nb_job_state_t s) {
  return s == NB_JOB_SUCCEEDED || s == NB_JOB_FAILED || s == NB_JOB_CANCELLED;
}

int nb_job_state_can_move(nb_job_state_t from, nb_job_state_t to) {
  switch (from) {
    case NB_JOB_PENDING:
      return to == NB_JOB_PROPOSED || to == NB_JOB_FAILED || to == NB_JOB_CANCELLED;
    case NB_JOB_PROPOSED:
      return to == NB_JOB_RUNNING || to == NB_JOB_FAILED || to == NB_JOB_CANCELLED;
    case NB_JOB_RUNNING:
      return to == NB_JOB_SUCCEEDED || to == NB_JOB_FAILED || to == NB_JOB_CANCELLED;
    default:
      return 0;
  }
}

/* ---------------------------------------------------------------------------------------------
 * SQLite helpers. */

static nb_status_t nb__sql_error(sqlite3* db, int rc, const char* what) {
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED)
    return nb_error(NB_ERR_TIMEOUT, "job store: %s: the database stayed locked: %s", what,
                    sqlite3_errmsg(db));
  return nb_error(NB_ERR_IO, "job store: %s: %s", what,
                  db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
}

static nb_status_t nb__prepare(sqlite3* db, const char* sql, sqlite3_stmt** st) {
  int rc = sqlite3_prepare_v2(db, sql, -1, st, NULL);
  return rc == SQLITE_OK ? NB_OK : nb__sql_error(db, rc, "prepare");
}

/* Runs a fixed script statement by statement (each prepared, stepped to completion). */
static nb_status_t nb__exec_script(sqlite3* db, const char* sql, const char* what) {
  const char* tail = sql;
  while (tail && *tail) {
    sqlite3_stmt* st = NULL;
    int rc = sqlite3_prepare_v2(db, tail, -1, &st, &tail);
    if (rc != SQLITE_OK) return nb__sql_error(db, rc, what);
    if (!st) break; /* only whitespace or comments left */
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return nb__sql_error(db, rc, what);
  }
  return NB_OK;
}

static nb_status_t nb__begin(sqlite3* db) {
  return nb__exec_script(db, "BEGIN IMMEDIATE", "begin");
}
static nb_status_t nb__commit(sqlite3* db) {
  return nb__exec_script(db, "COMMIT", "commit");
}
static void nb__rollback(sqlite3* db) {
  if (!sqlite3_get_autocommit(db)) (void)nb__exec_script(db, "ROLLBACK", "rollback");
}

static nb_status_t nb__user_version(sqlite3* db, int* out) {
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(db, "PRAGMA user_version", &st));
  int rc = sqlite3_step(st);
  nb_status_t s = NB_OK;
  if (rc == SQLITE_ROW)
    *out = sqlite3_column_int(st, 0);
  else
    s = nb__sql_error(db, rc, "read the schema version");
  sqlite3_finalize(st);
  return s;
}

static nb_status_t nb__migrate(sqlite3* db) {
  int v = 0;
  NB_CHECK(nb__user_version(db, &v));
  if (v > NB_JOB_STORE_SCHEMA_VERSION)
    return nb_error(NB_ERR_UNSUPPORTED,
                    "job store: schema version %d is newer than this nebula understands (%d); "
                    "use a newer nebula",
                    v, NB_JOB_STORE_SCHEMA_VERSION);
  while (v < NB_JOB_STORE_SCHEMA_VERSION) {
    nb_status_t st = nb__begin(db);
    if (st != NB_OK) return st;
    /* Another handle may have migrated while we waited for the lock. */
    st = nb__user_version(db, &v);
    if (st == NB_OK && v < NB_JOB_STORE_SCHEMA_VERSION) {
      NB_INFO(JOB, "job store: migrating schema %d -> %d", v, v + 1);
      st = nb__exec_script(db, nb__migrations[v], "migrate");
    }
    if (st == NB_OK) st = nb__commit(db);
    if (st != NB_OK) {
      nb__rollback(db);
      return nb_error_wrap(st, "job store: migration from schema %d", v);
    }
    NB_CHECK(nb__user_version(db, &v));
  }
  return NB_OK;
}

nb_status_t nb_job_store_open(const char* path, nb_job_store_t** out) {
  if (!path || !out) return nb_error(NB_ERR_INVALID, "job store: NULL path or output");
  *out = NULL;
  nb_job_store_t* s = NULL;
  NB_CHECK(nb_calloc((void**)&s, 1, sizeof *s, "job store"));
  nb_status_t st = NB_OK;
  int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  if (rc != SQLITE_OK) {
    st = nb_error(NB_ERR_IO, "job store: cannot open %s: %s", path,
                  s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
    goto fail;
  }
  sqlite3_busy_timeout(s->db, 5000);
  sqlite3_extended_result_codes(s->db, 0);
  /* WAL: readers never block the writer and a second handle (a CLI reading while the gateway
   * writes) sees committed state. synchronous=FULL: a committed transition survives power loss. */
  st = nb__exec_script(s->db,
                       "PRAGMA journal_mode = WAL;"
                       "PRAGMA synchronous = FULL;"
                       "PRAGMA foreign_keys = ON;",
                       "configure");
  if (st != NB_OK) {
    st = nb_error_wrap(st, "job store %s", path);
    goto fail;
  }
  st = nb__migrate(s->db);
  if (st != NB_OK) goto fail;
  *out = s;
  return NB_OK;
fail:
  nb_job_store_close(s);
  return st;
}

void nb_job_store_close(nb_job_store_t* s) {
  if (!s) return;
  sqlite3_close_v2(s->db); /* all statements are finalized before each function returns */
  nb_free(s);
}

static nb_status_t nb__check_id(const char* id);

/* What each table of the current schema must have (the indexes are the integrity check's). */
static const struct {
  const char* table;
  const char* columns[8];
} nb__schema[] = {
    {"jobs", {"id", "owner", "descriptor", "state", "created_ns", "updated_ns", "reason", NULL}},
    {"events", {"job_id", "seq", "time_ns", "kind", "payload", NULL}},
    {"federation", {"job_id", "role", "origin", "secret", "active", "info", NULL}},
};

nb_status_t nb_job_store_check(nb_job_store_t* s) {
  if (!s) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db, "PRAGMA integrity_check(8)", &st));
  int rc, ok = 0, rows = 0;
  char why[256] = "";
  nb_status_t r = NB_OK;
  /* "ok", or the complaints, after a "*** in database main ***" line in newer SQLite */
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char* line = (const char*)sqlite3_column_text(st, 0);
    rows++;
    if (line && !strcmp(line, "ok")) {
      ok = 1;
    } else if (line && !why[0]) {
      if (!strncmp(line, "***", 3)) line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "";
      size_t j = 0; /* one line, printable: it may quote names from the file */
      for (; line[j] && line[j] != '\n' && j + 1 < sizeof why; j++)
        why[j] = (line[j] >= 0x20 && line[j] < 0x7f) ? line[j] : '?';
      why[j] = 0;
    }
  }
  if (rc != SQLITE_DONE)
    r = nb__sql_error(s->db, rc, "integrity check");
  else if (!ok || rows != 1)
    r = nb_error(NB_ERR_INTEGRITY, "job store: SQLite's integrity check fails: %s",
                 why[0] ? why : "(no detail)");
  sqlite3_finalize(st);
  NB_CHECK(r);
  for (size_t t = 0; t < sizeof nb__schema / sizeof nb__schema[0]; t++) {
    /* table_info takes no bound parameter; the names are ours, not the file's */
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA table_info(%s)", nb__schema[t].table);
    NB_CHECK(nb__prepare(s->db, sql, &st));
    unsigned have = 0;
    int ncols = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      const char* name = (const char*)sqlite3_column_text(st, 1);
      ncols++;
      for (int c = 0; name && nb__schema[t].columns[c]; c++)
        if (!strcmp(name, nb__schema[t].columns[c])) have |= 1u << c;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return nb__sql_error(s->db, rc, "read the schema");
    if (ncols == 0)
      return nb_error(NB_ERR_INTEGRITY,
                      "job store: table '%s' is missing (schema version %d has jobs, events and "
                      "federation)",
                      nb__schema[t].table, NB_JOB_STORE_SCHEMA_VERSION);
    for (int c = 0; nb__schema[t].columns[c]; c++)
      if (!(have & (1u << c)))
        return nb_error(NB_ERR_INTEGRITY, "job store: table '%s' has no column '%s'",
                        nb__schema[t].table, nb__schema[t].columns[c]);
  }
  NB_CHECK(nb__prepare(s->db,
                       "SELECT id, state, typeof(state) FROM jobs WHERE typeof(state) <> 'integer' "
                       "OR state < 0 OR state >= ?1 LIMIT 1",
                       &st));
  sqlite3_bind_int(st, 1, NB_JOB_STATE_COUNT);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    const char* id = (const char*)sqlite3_column_text(st, 0);
    char safe[NB_JOB_ID_MAX], state[48];
    snprintf(safe, sizeof safe, "%s", id && nb__check_id(id) == NB_OK ? id : "?");
    if (sqlite3_column_type(st, 1) == SQLITE_INTEGER)
      snprintf(state, sizeof state, "%lld", (long long)sqlite3_column_int64(st, 1));
    else /* never the file's text itself */
      snprintf(state, sizeof state, "of type %.10s", (const char*)sqlite3_column_text(st, 2));
    nb_error_clear();
    r = nb_error(NB_ERR_INTEGRITY,
                 "job store: job '%s' has state %s, which is none of the %d known states "
                 "(0 pending .. 5 cancelled)",
                 safe, state, NB_JOB_STATE_COUNT);
  } else if (rc != SQLITE_DONE) {
    r = nb__sql_error(s->db, rc, "check the job states");
  }
  sqlite3_finalize(st);
  return r;
}

nb_status_t nb_job_store_schema_version(nb_job_store_t* s, int* out) {
  if (!s || !out) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  return nb__user_version(s->db, out);
}

/* ---------------------------------------------------------------------------------------------
 * Jobs. */

static nb_status_t nb__check_id(const char* id) {
  if (!id || !*id) return nb_error(NB_ERR_INVALID, "job store: empty job id");
  size_t n = strlen(id);
  if (n >= NB_JOB_ID_MAX)
    return nb_error(NB_ERR_INVALID, "job store: job id of %zu bytes (at most %d)", n,
                    NB_JOB_ID_MAX - 1);
  for (size_t i = 0; i < n; i++) {
    char ch = id[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-';
    if (!ok)
      return nb_error(NB_ERR_INVALID, "job store: job id has a bad character at byte %zu", i);
  }
  return NB_OK;
}

static nb_status_t nb__check_json(const char* text, const char* what) {
  json_error_t e;
  json_t* j = text ? json_loads(text, JSON_DECODE_ANY, &e) : NULL;
  if (!j)
    return nb_error(NB_ERR_INVALID, "job store: %s is not valid JSON%s%s", what, text ? ": " : "",
                    text ? e.text : "");
  json_decref(j);
  return NB_OK;
}

static nb_status_t nb__bind_text(sqlite3* db, sqlite3_stmt* st, int i, const char* v) {
  int rc = v ? sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, i);
  return rc == SQLITE_OK ? NB_OK : nb__sql_error(db, rc, "bind");
}

nb_status_t nb_job_store_create(nb_job_store_t* s, const char* id, const char* owner,
                                const char* descriptor) {
  if (!s) return nb_error(NB_ERR_INVALID, "job store: NULL handle");
  NB_CHECK(nb__check_id(id));
  if (!owner || !*owner || strlen(owner) >= sizeof(((nb_job_record_t*)0)->owner))
    return nb_error(NB_ERR_INVALID, "job store: owner must be 1..%zu bytes",
                    sizeof(((nb_job_record_t*)0)->owner) - 1);
  NB_CHECK(nb__check_json(descriptor, "descriptor"));
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db,
                       "INSERT INTO jobs (id, owner, descriptor, state, created_ns, updated_ns) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                       &st));
  int64_t now = nb_wall_ns();
  nb_status_t r = nb__bind_text(s->db, st, 1, id);
  if (r == NB_OK) r = nb__bind_text(s->db, st, 2, owner);
  if (r == NB_OK) r = nb__bind_text(s->db, st, 3, descriptor);
  if (r == NB_OK) {
    sqlite3_bind_int(st, 4, NB_JOB_PENDING);
    sqlite3_bind_int64(st, 5, now);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_CONSTRAINT)
      r = nb_error(NB_ERR_EXISTS, "job store: job \"%s\" already exists", id);
    else if (rc != SQLITE_DONE)
      r = nb__sql_error(s->db, rc, "create job");
  }
  sqlite3_finalize(st);
  return r;
}

static nb_status_t nb__dup(const unsigned char* text, char** out) {
  const char* t = text ? (const char*)text : "";
  size_t n = strlen(t);
  NB_CHECK(nb_alloc((void**)out, n + 1, 1, "job store text"));
  memcpy(*out, t, n + 1);
  return NB_OK;
}

/* Reads the current row of a statement selecting
 * id, owner, descriptor, state, created_ns, updated_ns, reason. */
static nb_status_t nb__read_record(sqlite3_stmt* st, nb_job_record_t* r) {
  memset(r, 0, sizeof *r);
  snprintf(r->id, sizeof r->id, "%s", (const char*)sqlite3_column_text(st, 0));
  snprintf(r->owner, sizeof r->owner, "%s", (const char*)sqlite3_column_text(st, 1));
  r->state = (nb_job_state_t)sqlite3_column_int(st, 3);
  r->created_ns = sqlite3_column_int64(st, 4);
  r->updated_ns = sqlite3_column_int64(st, 5);
  nb_status_t s = nb__dup(sqlite3_column_text(st, 2), &r->descriptor);
  if (s == NB_OK) s = nb__dup(sqlite3_column_text(st, 6), &r->reason);
  if (s != NB_OK) nb_job_record_clear(r);
  return s;
}

void nb_job_record_clear(nb_job_record_t* r) {
  if (!r) return;
  nb_free(r->descriptor);
  nb_free(r->reason);
  r->descriptor = r->reason = NULL;
}

void nb_job_records_free(nb_job_record_t* r, size_t n) {
  if (!r) return;
  for (size_t i = 0; i < n; i++) nb_job_record_clear(&r[i]);
  nb_free(r);
}

nb_status_t nb_job_store_get(nb_job_store_t* s, const char* id, nb_job_record_t* out) {
  if (!s || !id || !out) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db,
                       "SELECT id, owner, descriptor, state, created_ns, updated_ns, reason "
                       "FROM jobs WHERE id = ?1",
                       &st));
  nb_status_t r = nb__bind_text(s->db, st, 1, id);
  if (r == NB_OK) {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
      r = nb__read_record(st, out);
    else if (rc == SQLITE_DONE)
      r = nb_error(NB_ERR_NOT_FOUND, "job store: no job \"%s\"", id);
    else
      r = nb__sql_error(s->db, rc, "get job");
  }
  sqlite3_finalize(st);
  return r;
}

nb_status_t nb_job_store_list(nb_job_store_t* s, const char* owner, int state,
                              nb_job_record_t** out, size_t* n) {
  if (!s || !out || !n) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  *out = NULL;
  *n = 0;
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db,
                       "SELECT id, owner, descriptor, state, created_ns, updated_ns, reason "
                       "FROM jobs WHERE (?1 IS NULL OR owner = ?1) AND (?2 < 0 OR state = ?2) "
                       "ORDER BY created_ns, rowid",
                       &st));
  nb_job_record_t* recs = NULL;
  size_t cnt = 0, cap = 0;
  nb_status_t r = nb__bind_text(s->db, st, 1, owner);
  if (r == NB_OK) sqlite3_bind_int(st, 2, state);
  int rc;
  while (r == NB_OK && (rc = sqlite3_step(st)) != SQLITE_DONE) {
    if (rc != SQLITE_ROW) {
      r = nb__sql_error(s->db, rc, "list jobs");
      break;
    }
    if (cnt == cap) {
      size_t ncap = cap ? cap * 2 : 8;
      r = nb_realloc((void**)&recs, ncap, sizeof *recs, "job list");
      if (r != NB_OK) break;
      cap = ncap;
    }
    r = nb__read_record(st, &recs[cnt]);
    if (r == NB_OK) cnt++;
  }
  sqlite3_finalize(st);
  if (r != NB_OK) {
    nb_job_records_free(recs, cnt);
    return r;
  }
  *out = recs;
  *n = cnt;
  return NB_OK;
}

nb_status_t nb_job_store_count(nb_job_store_t* s, int state, int64_t* out) {
  if (!s || !out) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  *out = 0;
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db, "SELECT COUNT(*) FROM jobs WHERE state = ?1", &st));
  sqlite3_bind_int(st, 1, state);
  int rc = sqlite3_step(st);
  nb_status_t r = NB_OK;
  if (rc == SQLITE_ROW)
    *out = sqlite3_column_int64(st, 0);
  else
    r = nb__sql_error(s->db, rc, "count jobs");
  sqlite3_finalize(st);
  return r;
}

/* Inside an open transaction: appends one event and returns its seq. */
static nb_status_t nb__append_event_locked(sqlite3* db, const char* id, const char* kind,
                                           const char* payload, int64_t* seq_out) {
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(db,
                       "INSERT INTO events (job_id, seq, time_ns, kind, payload) "
                       "SELECT ?1, COALESCE(MAX(seq), 0) + 1, ?2, ?3, ?4 FROM events "
                       "WHERE job_id = ?1 RETURNING seq",
                       &st));
  nb_status_t r = nb__bind_text(db, st, 1, id);
  if (r == NB_OK) r = nb__bind_text(db, st, 3, kind);
  if (r == NB_OK) r = nb__bind_text(db, st, 4, payload);
  if (r == NB_OK) {
    sqlite3_bind_int64(st, 2, nb_wall_ns());
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      if (seq_out) *seq_out = sqlite3_column_int64(st, 0);
      rc = sqlite3_step(st);
    }
    if (rc != SQLITE_DONE) r = nb__sql_error(db, rc, "append event");
  }
  sqlite3_finalize(st);
  return r;
}

/* Inside an open transaction: the job's state, or NB_ERR_NOT_FOUND. */
static nb_status_t nb__job_state_locked(sqlite3* db, const char* id, nb_job_state_t* out) {
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(db, "SELECT state FROM jobs WHERE id = ?1", &st));
  nb_status_t r = nb__bind_text(db, st, 1, id);
  if (r == NB_OK) {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
      *out = (nb_job_state_t)sqlite3_column_int(st, 0);
    else if (rc == SQLITE_DONE)
      r = nb_error(NB_ERR_NOT_FOUND, "job store: no job \"%s\"", id);
    else
      r = nb__sql_error(db, rc, "read job state");
  }
  sqlite3_finalize(st);
  return r;
}

nb_status_t nb_job_store_transition(nb_job_store_t* s, const char* id, nb_job_state_t to,
                                    const char* reason) {
  if (!s || !id) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  if ((unsigned)to >= NB_JOB_STATE_COUNT)
    return nb_error(NB_ERR_INVALID, "job store: state %d is not a job state", (int)to);
  if (!reason) reason = "";
  json_t* ev =
      json_pack("{s:s, s:s, s:s}", "from", "", "to", nb_job_state_name(to), "reason", reason);
  if (!ev) return nb_error(NB_ERR_INVALID, "job store: reason is not valid UTF-8");
  char* payload = NULL;
  sqlite3_stmt* st = NULL;
  nb_job_state_t from = NB_JOB_PENDING;
  nb_status_t r = nb__begin(s->db);
  if (r != NB_OK) goto out;
  r = nb__job_state_locked(s->db, id, &from);
  if (r != NB_OK) goto out;
  if (!nb_job_state_can_move(from, to)) {
    r = nb_error(NB_ERR_INVALID, "job store: job \"%s\" cannot move from %s to %s", id,
                 nb_job_state_name(from), nb_job_state_name(to));
    goto out;
  }
  r = nb__prepare(s->db, "UPDATE jobs SET state = ?2, updated_ns = ?3, reason = ?4 WHERE id = ?1",
                  &st);
  if (r != NB_OK) goto out;
  r = nb__bind_text(s->db, st, 1, id);
  if (r == NB_OK) r = nb__bind_text(s->db, st, 4, reason);
  if (r == NB_OK) {
    sqlite3_bind_int(st, 2, (int)to);
    sqlite3_bind_int64(st, 3, nb_wall_ns());
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) r = nb__sql_error(s->db, rc, "update job state");
  }
  sqlite3_finalize(st);
  if (r != NB_OK) goto out;
  json_object_set_new(ev, "from", json_string(nb_job_state_name(from)));
  payload = json_dumps(ev, JSON_COMPACT);
  if (!payload) {
    r = nb_error(NB_ERR_NOMEM, "job store: state event");
    goto out;
  }
  r = nb__append_event_locked(s->db, id, "state", payload, NULL);
  if (r == NB_OK) r = nb__commit(s->db);
out:
  if (r != NB_OK) nb__rollback(s->db);
  free(payload);
  json_decref(ev);
  return r;
}

/* ---------------------------------------------------------------------------------------------
 * Events. */

nb_status_t nb_job_store_append_event(nb_job_store_t* s, const char* id, const char* kind,
                                      const char* payload, int64_t* seq_out) {
  if (!s || !id) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  if (!kind || !*kind || strlen(kind) >= sizeof(((nb_job_event_t*)0)->kind))
    return nb_error(NB_ERR_INVALID, "job store: event kind must be 1..%zu bytes",
                    sizeof(((nb_job_event_t*)0)->kind) - 1);
  NB_CHECK(nb__check_json(payload, "event payload"));
  nb_status_t r = nb__begin(s->db);
  nb_job_state_t state;
  if (r == NB_OK) r = nb__job_state_locked(s->db, id, &state);
  if (r == NB_OK) r = nb__append_event_locked(s->db, id, kind, payload, seq_out);
  if (r == NB_OK) r = nb__commit(s->db);
  if (r != NB_OK) nb__rollback(s->db);
  return r;
}

void nb_job_events_free(nb_job_event_t* e, size_t n) {
  if (!e) return;
  for (size_t i = 0; i < n; i++) nb_free(e[i].payload);
  nb_free(e);
}

nb_status_t nb_job_store_events(nb_job_store_t* s, const char* id, int64_t after_seq, size_t limit,
                                nb_job_event_t** out, size_t* n) {
  if (!s || !id || !out || !n) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  *out = NULL;
  *n = 0;
  /* Read the job and its events in one snapshot. */
  nb_status_t r = nb__exec_script(s->db, "BEGIN", "begin");
  if (r != NB_OK) return r;
  nb_job_state_t state;
  r = nb__job_state_locked(s->db, id, &state);
  sqlite3_stmt* st = NULL;
  if (r == NB_OK)
    r = nb__prepare(s->db,
                    "SELECT seq, time_ns, kind, payload FROM events WHERE job_id = ?1 AND seq > ?2 "
                    "ORDER BY seq LIMIT ?3",
                    &st);
  nb_job_event_t* evs = NULL;
  size_t cnt = 0, cap = 0;
  if (r == NB_OK) r = nb__bind_text(s->db, st, 1, id);
  if (r == NB_OK) {
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int64(st, 3, limit ? (sqlite3_int64)limit : -1);
    int rc;
    while ((rc = sqlite3_step(st)) != SQLITE_DONE) {
      if (rc != SQLITE_ROW) {
        r = nb__sql_error(s->db, rc, "list events");
        break;
      }
      if (cnt == cap) {
        size_t ncap = cap ? cap * 2 : 16;
        r = nb_realloc((void**)&evs, ncap, sizeof *evs, "event list");
        if (r != NB_OK) break;
        cap = ncap;
      }
      nb_job_event_t* e = &evs[cnt];
      memset(e, 0, sizeof *e);
      e->seq = sqlite3_column_int64(st, 0);
      e->time_ns = sqlite3_column_int64(st, 1);
      snprintf(e->kind, sizeof e->kind, "%s", (const char*)sqlite3_column_text(st, 2));
      r = nb__dup(sqlite3_column_text(st, 3), &e->payload);
      if (r != NB_OK) break;
      cnt++;
    }
  }
  sqlite3_finalize(st);
  nb__rollback(s->db); /* read-only transaction: nothing to keep */
  if (r != NB_OK) {
    nb_job_events_free(evs, cnt);
    return r;
  }
  *out = evs;
  *n = cnt;
  return NB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Federation records. */

void nb_job_fed_clear(nb_job_fed_t* f) {
  if (!f) return;
  nb_free(f->info);
  f->info = NULL;
  explicit_bzero(f->secret, sizeof f->secret);
}

void nb_job_feds_free(nb_job_fed_t* f, size_t n) {
  if (!f) return;
  for (size_t i = 0; i < n; i++) nb_job_fed_clear(&f[i]);
  nb_free(f);
}

nb_status_t nb_job_store_fed_put(nb_job_store_t* s, const nb_job_fed_t* f) {
  if (!s || !f) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  NB_CHECK(nb__check_id(f->job_id));
  if (strcmp(f->role, "origin") && strcmp(f->role, "member"))
    return nb_error(NB_ERR_INVALID, "job store: federation role must be origin or member, not '%s'",
                    f->role);
  const char* info = f->info ? f->info : "{}";
  NB_CHECK(nb__check_json(info, "federation info"));
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db,
                       "INSERT INTO federation (job_id, role, origin, secret, active, info) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(job_id) DO UPDATE SET "
                       "role = ?2, origin = ?3, secret = ?4, active = ?5, info = ?6",
                       &st));
  nb_status_t r = nb__bind_text(s->db, st, 1, f->job_id);
  if (r == NB_OK) r = nb__bind_text(s->db, st, 2, f->role);
  if (r == NB_OK) r = nb__bind_text(s->db, st, 3, f->origin);
  if (r == NB_OK) r = nb__bind_text(s->db, st, 6, info);
  if (r == NB_OK) {
    if (f->has_secret)
      sqlite3_bind_blob(st, 4, f->secret, (int)sizeof f->secret, SQLITE_TRANSIENT);
    else
      sqlite3_bind_null(st, 4);
    sqlite3_bind_int(st, 5, f->active ? 1 : 0);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_CONSTRAINT)
      r = nb_error(NB_ERR_NOT_FOUND, "job store: no job \"%s\" for its federation record",
                   f->job_id);
    else if (rc != SQLITE_DONE)
      r = nb__sql_error(s->db, rc, "put federation record");
  }
  sqlite3_finalize(st);
  return r;
}

static nb_status_t nb__read_fed(sqlite3_stmt* st, nb_job_fed_t* f) {
  memset(f, 0, sizeof *f);
  snprintf(f->job_id, sizeof f->job_id, "%s", (const char*)sqlite3_column_text(st, 0));
  snprintf(f->role, sizeof f->role, "%s", (const char*)sqlite3_column_text(st, 1));
  snprintf(f->origin, sizeof f->origin, "%s", (const char*)sqlite3_column_text(st, 2));
  if (sqlite3_column_type(st, 3) == SQLITE_BLOB &&
      sqlite3_column_bytes(st, 3) == (int)sizeof f->secret) {
    memcpy(f->secret, sqlite3_column_blob(st, 3), sizeof f->secret);
    f->has_secret = 1;
  }
  f->active = sqlite3_column_int(st, 4);
  return nb__dup(sqlite3_column_text(st, 5), &f->info);
}

nb_status_t nb_job_store_fed_get(nb_job_store_t* s, const char* id, nb_job_fed_t* out) {
  if (!s || !id || !out) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db,
                       "SELECT job_id, role, origin, secret, active, info FROM federation "
                       "WHERE job_id = ?1",
                       &st));
  nb_status_t r = nb__bind_text(s->db, st, 1, id);
  if (r == NB_OK) {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
      r = nb__read_fed(st, out);
    else if (rc == SQLITE_DONE)
      r = nb_error(NB_ERR_NOT_FOUND, "job store: job \"%s\" is not federated", id);
    else
      r = nb__sql_error(s->db, rc, "get federation record");
  }
  sqlite3_finalize(st);
  return r;
}

nb_status_t nb_job_store_fed_list_active(nb_job_store_t* s, nb_job_fed_t** out, size_t* n) {
  if (!s || !out || !n) return nb_error(NB_ERR_INVALID, "job store: NULL argument");
  *out = NULL;
  *n = 0;
  sqlite3_stmt* st = NULL;
  NB_CHECK(nb__prepare(s->db,
                       "SELECT job_id, role, origin, secret, active, info FROM federation "
                       "WHERE active = 1 ORDER BY job_id",
                       &st));
  nb_job_fed_t* v = NULL;
  size_t cnt = 0, cap = 0;
  nb_status_t r = NB_OK;
  int rc;
  while ((rc = sqlite3_step(st)) != SQLITE_DONE) {
    if (rc != SQLITE_ROW) {
      r = nb__sql_error(s->db, rc, "list federation records");
      break;
    }
    if (cnt == cap) {
      size_t ncap = cap ? cap * 2 : 8;
      r = nb_realloc((void**)&v, ncap, sizeof *v, "federation list");
      if (r != NB_OK) break;
      cap = ncap;
    }
    r = nb__read_fed(st, &v[cnt]);
    if (r != NB_OK) break;
    cnt++;
  }
  sqlite3_finalize(st);
  if (r != NB_OK) {
    nb_job_feds_free(v, cnt);
    return r;
  }
  *out = v;
  *n = cnt;
  return NB_OK;
}
