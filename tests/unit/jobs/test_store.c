/* Unit tests of the SQLite job store: create/get/list, the lifecycle (every legal and illegal
 * move), the event log, persistence across reopen, schema migration and version checks, and two
 * handles (and two threads) on one file in WAL mode. Files live in a fresh temporary folder. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "gateway/store.h"

static char tmpdir[256];
static char dbpath[320];

static int setup(void** state) {
  (void)state;
  const char* base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmpdir, sizeof tmpdir, "%s/nb-store-XXXXXX", base);
  if (!mkdtemp(tmpdir)) return -1;
  snprintf(dbpath, sizeof dbpath, "%s/jobs.db", tmpdir);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  const char* suffix[] = {"", "-wal", "-shm", "-journal"};
  char p[400];
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s%s", dbpath, suffix[i]);
    unlink(p);
  }
  snprintf(p, sizeof p, "%s/garbage", tmpdir);
  unlink(p);
  rmdir(tmpdir);
  return 0;
}

static nb_job_store_t* open_store(void) {
  nb_job_store_t* s = NULL;
  nb_status_t st = nb_job_store_open(dbpath, &s);
  if (st != NB_OK) fprintf(stderr, "open: %s\n", nb_error_last());
  assert_int_equal(st, NB_OK);
  return s;
}

static void test_create_get_list(void** state) {
  (void)state;
  nb_job_store_t* s = open_store();
  int v = 0;
  assert_int_equal(nb_job_store_schema_version(s, &v), NB_OK);
  assert_int_equal(v, NB_JOB_STORE_SCHEMA_VERSION);
  assert_int_equal(nb_job_store_create(s, "job-1", "alice", "{\"a\": 1}"), NB_OK);
  assert_int_equal(nb_job_store_create(s, "job-2", "bob", "{}"), NB_OK);
  assert_int_equal(nb_job_store_create(s, "job-3", "alice", "[]"), NB_OK);
  assert_int_equal(nb_job_store_create(s, "job-1", "bob", "{}"), NB_ERR_EXISTS);
  assert_int_equal(nb_job_store_create(s, "bad id", "bob", "{}"), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_create(s, "", "bob", "{}"), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_create(s, "job-4", "", "{}"), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_create(s, "job-4", "bob", "{not json"), NB_ERR_INVALID);
  /* an id that would be SQL if it were pasted into a statement is just refused as an id */
  assert_int_equal(nb_job_store_create(s, "x'); DROP TABLE jobs;--", "bob", "{}"), NB_ERR_INVALID);

  nb_job_record_t r;
  assert_int_equal(nb_job_store_get(s, "job-1", &r), NB_OK);
  assert_string_equal(r.id, "job-1");
  assert_string_equal(r.owner, "alice");
  assert_string_equal(r.descriptor, "{\"a\": 1}");
  assert_int_equal(r.state, NB_JOB_PENDING);
  assert_true(r.created_ns > 0);
  assert_true(r.updated_ns == r.created_ns);
  assert_string_equal(r.reason, "");
  nb_job_record_clear(&r);
  assert_int_equal(nb_job_store_get(s, "nope", &r), NB_ERR_NOT_FOUND);

  nb_job_record_t* list = NULL;
  size_t n = 0;
  assert_int_equal(nb_job_store_list(s, NULL, -1, &list, &n), NB_OK);
  assert_int_equal(n, 3);
  assert_string_equal(list[0].id, "job-1");
  assert_string_equal(list[2].id, "job-3");
  nb_job_records_free(list, n);
  assert_int_equal(nb_job_store_list(s, "alice", -1, &list, &n), NB_OK);
  assert_int_equal(n, 2);
  assert_string_equal(list[1].id, "job-3");
  nb_job_records_free(list, n);
  assert_int_equal(nb_job_store_transition(s, "job-2", NB_JOB_PROPOSED, NULL), NB_OK);
  assert_int_equal(nb_job_store_list(s, NULL, NB_JOB_PROPOSED, &list, &n), NB_OK);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].id, "job-2");
  nb_job_records_free(list, n);
  assert_int_equal(nb_job_store_list(s, "carol", -1, &list, &n), NB_OK);
  assert_int_equal(n, 0);
  nb_job_records_free(list, n);
  nb_job_store_close(s);
}

static void test_lifecycle_table(void** state) {
  (void)state;
  /* allowed[from][to], written out by hand from the documented lifecycle */
  static const int allowed[6][6] = {
      /* to:     pend prop run succ fail canc */
      /* pend */ {0, 1, 0, 0, 1, 1},
      /* prop */ {0, 0, 1, 0, 1, 1},
      /* run  */ {0, 0, 0, 1, 1, 1},
      /* succ */ {0, 0, 0, 0, 0, 0},
      /* fail */ {0, 0, 0, 0, 0, 0},
      /* canc */ {0, 0, 0, 0, 0, 0},
  };
  for (int f = 0; f < 6; f++)
    for (int t = 0; t < 6; t++)
      assert_int_equal(!!nb_job_state_can_move((nb_job_state_t)f, (nb_job_state_t)t),
                       allowed[f][t]);
  nb_job_state_t st;
  assert_int_equal(nb_job_state_parse("running", &st), NB_OK);
  assert_int_equal(st, NB_JOB_RUNNING);
  assert_int_equal(nb_job_state_parse("runing", &st), NB_ERR_INVALID);
  assert_string_equal(nb_job_state_name(NB_JOB_CANCELLED), "cancelled");
  assert_true(nb_job_state_is_final(NB_JOB_FAILED));
  assert_false(nb_job_state_is_final(NB_JOB_RUNNING));
}

/* Drives one job along `path` in the store, checking every other move is refused on the way. */
static void test_transitions(void** state) {
  (void)state;
  nb_job_store_t* s = open_store();
  assert_int_equal(nb_job_store_create(s, "t1", "alice", "{}"), NB_OK);
  /* skipping proposed is refused, and the refusal names both states */
  assert_int_equal(nb_job_store_transition(s, "t1", NB_JOB_RUNNING, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "from pending to running"));
  assert_int_equal(nb_job_store_transition(s, "t1", NB_JOB_SUCCEEDED, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_transition(s, "t1", NB_JOB_PENDING, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_transition(s, "t1", NB_JOB_PROPOSED, NULL), NB_OK);
  assert_int_equal(nb_job_store_transition(s, "t1", NB_JOB_PROPOSED, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_transition(s, "t1", NB_JOB_RUNNING, "committed by dc-a, dc-b"),
                   NB_OK);
  assert_int_equal(nb_job_store_transition(s, "t1", NB_JOB_SUCCEEDED, NULL), NB_OK);
  for (int to = 0; to < NB_JOB_STATE_COUNT; to++)
    assert_int_equal(nb_job_store_transition(s, "t1", (nb_job_state_t)to, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_transition(s, "t1", (nb_job_state_t)17, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_transition(s, "ghost", NB_JOB_PROPOSED, NULL), NB_ERR_NOT_FOUND);

  nb_job_record_t r;
  assert_int_equal(nb_job_store_get(s, "t1", &r), NB_OK);
  assert_int_equal(r.state, NB_JOB_SUCCEEDED);
  assert_true(r.updated_ns >= r.created_ns);
  nb_job_record_clear(&r);

  /* failure keeps its reason */
  assert_int_equal(nb_job_store_create(s, "t2", "alice", "{}"), NB_OK);
  assert_int_equal(nb_job_store_transition(s, "t2", NB_JOB_FAILED, "peer dc-b refused: no slots"),
                   NB_OK);
  assert_int_equal(nb_job_store_get(s, "t2", &r), NB_OK);
  assert_int_equal(r.state, NB_JOB_FAILED);
  assert_string_equal(r.reason, "peer dc-b refused: no slots");
  nb_job_record_clear(&r);

  /* each accepted move left a "state" event; refused ones left none */
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  assert_int_equal(nb_job_store_events(s, "t1", 0, 0, &ev, &n), NB_OK);
  assert_int_equal(n, 3);
  assert_string_equal(ev[0].kind, "state");
  assert_non_null(strstr(ev[0].payload, "\"from\":\"pending\""));
  assert_non_null(strstr(ev[0].payload, "\"to\":\"proposed\""));
  assert_non_null(strstr(ev[1].payload, "committed by dc-a, dc-b"));
  assert_non_null(strstr(ev[2].payload, "\"to\":\"succeeded\""));
  nb_job_events_free(ev, n);
  nb_job_store_close(s);
}

static void test_events(void** state) {
  (void)state;
  nb_job_store_t* s = open_store();
  assert_int_equal(nb_job_store_create(s, "e1", "alice", "{}"), NB_OK);
  assert_int_equal(nb_job_store_create(s, "e2", "alice", "{}"), NB_OK);
  for (int i = 1; i <= 5; i++) {
    char payload[64];
    snprintf(payload, sizeof payload, "{\"step\": %d, \"loss\": %g}", i * 10, 5.0 / i);
    int64_t seq = 0;
    assert_int_equal(nb_job_store_append_event(s, "e1", "progress", payload, &seq), NB_OK);
    assert_int_equal(seq, i);
  }
  int64_t seq = 0;
  assert_int_equal(nb_job_store_append_event(s, "e2", "log", "\"hello\"", &seq), NB_OK);
  assert_int_equal(seq, 1); /* sequence numbers are per job */
  assert_int_equal(nb_job_store_append_event(s, "e1", "progress", "{bad", NULL), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_append_event(s, "e1", "", "{}", NULL), NB_ERR_INVALID);
  assert_int_equal(
      nb_job_store_append_event(s, "e1", "a-kind-name-that-is-far-too-long-to-keep", "{}", NULL),
      NB_ERR_INVALID);
  assert_int_equal(nb_job_store_append_event(s, "ghost", "log", "{}", NULL), NB_ERR_NOT_FOUND);

  nb_job_event_t* ev = NULL;
  size_t n = 0;
  assert_int_equal(nb_job_store_events(s, "e1", 0, 0, &ev, &n), NB_OK);
  assert_int_equal(n, 5);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(ev[i].seq, (int64_t)i + 1);
    assert_string_equal(ev[i].kind, "progress");
    assert_true(ev[i].time_ns > 0);
    if (i) assert_true(ev[i].time_ns >= ev[i - 1].time_ns);
  }
  assert_string_equal(ev[2].payload, "{\"step\": 30, \"loss\": 1.66667}");
  nb_job_events_free(ev, n);
  assert_int_equal(nb_job_store_events(s, "e1", 3, 0, &ev, &n), NB_OK);
  assert_int_equal(n, 2);
  assert_int_equal(ev[0].seq, 4);
  nb_job_events_free(ev, n);
  assert_int_equal(nb_job_store_events(s, "e1", 1, 2, &ev, &n), NB_OK);
  assert_int_equal(n, 2);
  assert_int_equal(ev[1].seq, 3);
  nb_job_events_free(ev, n);
  assert_int_equal(nb_job_store_events(s, "e1", 5, 0, &ev, &n), NB_OK);
  assert_int_equal(n, 0);
  assert_null(ev);
  assert_int_equal(nb_job_store_events(s, "ghost", 0, 0, &ev, &n), NB_ERR_NOT_FOUND);
  nb_job_store_close(s);
}

static void test_reopen_keeps_state(void** state) {
  (void)state;
  nb_job_store_t* s = open_store();
  assert_int_equal(nb_job_store_create(s, "r1", "alice", "{\"x\": true}"), NB_OK);
  assert_int_equal(nb_job_store_transition(s, "r1", NB_JOB_PROPOSED, NULL), NB_OK);
  assert_int_equal(nb_job_store_transition(s, "r1", NB_JOB_RUNNING, NULL), NB_OK);
  assert_int_equal(nb_job_store_append_event(s, "r1", "progress", "{\"round\": 3}", NULL), NB_OK);
  nb_job_store_close(s);

  s = open_store();
  nb_job_record_t r;
  assert_int_equal(nb_job_store_get(s, "r1", &r), NB_OK);
  assert_int_equal(r.state, NB_JOB_RUNNING);
  assert_string_equal(r.descriptor, "{\"x\": true}");
  nb_job_record_clear(&r);
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  assert_int_equal(nb_job_store_events(s, "r1", 0, 0, &ev, &n), NB_OK);
  assert_int_equal(n, 3); /* two state events and the progress event */
  assert_string_equal(ev[2].payload, "{\"round\": 3}");
  nb_job_events_free(ev, n);
  /* after a restart the gateway finds its live jobs and may fail them with a reason */
  nb_job_record_t* list = NULL;
  assert_int_equal(nb_job_store_list(s, NULL, NB_JOB_RUNNING, &list, &n), NB_OK);
  assert_int_equal(n, 1);
  nb_job_records_free(list, n);
  assert_int_equal(
      nb_job_store_transition(s, "r1", NB_JOB_FAILED, "gateway restarted: workers gone"), NB_OK);
  int64_t seq = 0;
  assert_int_equal(nb_job_store_append_event(s, "r1", "log", "{}", &seq), NB_OK);
  assert_int_equal(seq, 5); /* numbering continues across reopen */
  nb_job_store_close(s);

  /* the file is in WAL mode */
  sqlite3* db = NULL;
  assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
  sqlite3_stmt* st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  assert_string_equal((const char*)sqlite3_column_text(st, 0), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void exec_sql(const char* sql) {
  sqlite3* db = NULL;
  assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
  char* err = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &err);
  if (rc != SQLITE_OK) fprintf(stderr, "sql: %s\n", err);
  assert_int_equal(rc, SQLITE_OK);
  sqlite3_close(db);
}

static void test_migration_from_v1(void** state) {
  (void)state;
  /* A file as the first released schema wrote it, with a job in it. */
  exec_sql(
      "CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, descriptor TEXT NOT NULL,"
      " state INTEGER NOT NULL, created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL,"
      " reason TEXT NOT NULL DEFAULT '');"
      "CREATE TABLE events (job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
      " seq INTEGER NOT NULL, time_ns INTEGER NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,"
      " PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"
      "INSERT INTO jobs VALUES ('old', 'alice', '{}', 2, 1, 1, '');"
      "PRAGMA user_version = 1;");
  nb_job_store_t* s = open_store();
  int v = 0;
  assert_int_equal(nb_job_store_schema_version(s, &v), NB_OK);
  assert_int_equal(v, NB_JOB_STORE_SCHEMA_VERSION);
  nb_job_record_t r;
  assert_int_equal(nb_job_store_get(s, "old", &r), NB_OK);
  assert_int_equal(r.state, NB_JOB_RUNNING);
  nb_job_record_clear(&r);
  nb_job_store_close(s);
  /* migration 2 added the indexes */
  sqlite3* db = NULL;
  assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
  sqlite3_stmt* st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "SELECT count(*) FROM sqlite_master WHERE type = 'index' "
                                      "AND name IN ('jobs_by_owner', 'jobs_by_state')",
                                      -1, &st, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  assert_int_equal(sqlite3_column_int(st, 0), 2);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void test_newer_schema_and_garbage_refused(void** state) {
  (void)state;
  exec_sql("CREATE TABLE t (x); PRAGMA user_version = 99;");
  nb_job_store_t* s = NULL;
  assert_int_equal(nb_job_store_open(dbpath, &s), NB_ERR_UNSUPPORTED);
  assert_null(s);
  assert_non_null(strstr(nb_error_last(), "schema version 99"));

  char garbage[400];
  snprintf(garbage, sizeof garbage, "%s/garbage", tmpdir);
  FILE* f = fopen(garbage, "wb");
  for (int i = 0; i < 4096; i++) fputc((i * 7919) & 0xff, f);
  fclose(f);
  assert_int_equal(nb_job_store_open(garbage, &s), NB_ERR_IO);
  assert_null(s);
  assert_int_equal(nb_job_store_open("/nonexistent-dir/x/jobs.db", &s), NB_ERR_IO);
}

/* ---- two handles on one file ---- */

typedef struct {
  int worker;
  int wins;
  int appended;
} race_arg_t;

#define RACE_JOBS 20
#define RACE_EVENTS 40

static void* race_thread(void* p) {
  race_arg_t* a = p;
  nb_job_store_t* s = NULL;
  if (nb_job_store_open(dbpath, &s) != NB_OK) return NULL;
  for (int i = 0; i < RACE_JOBS; i++) {
    char id[32];
    snprintf(id, sizeof id, "race-%d", i);
    if (nb_job_store_transition(s, id, NB_JOB_PROPOSED, NULL) == NB_OK) a->wins++;
  }
  for (int i = 0; i < RACE_EVENTS; i++) {
    char payload[64];
    snprintf(payload, sizeof payload, "{\"worker\": %d, \"i\": %d}", a->worker, i);
    if (nb_job_store_append_event(s, "race-0", "progress", payload, NULL) == NB_OK) a->appended++;
  }
  nb_job_store_close(s);
  return NULL;
}

static void test_two_handles(void** state) {
  (void)state;
  nb_job_store_t* a = open_store();
  nb_job_store_t* b = open_store();
  /* a writes, b sees it at once */
  assert_int_equal(nb_job_store_create(a, "shared", "alice", "{}"), NB_OK);
  nb_job_record_t r;
  assert_int_equal(nb_job_store_get(b, "shared", &r), NB_OK);
  nb_job_record_clear(&r);
  assert_int_equal(nb_job_store_transition(b, "shared", NB_JOB_PROPOSED, NULL), NB_OK);
  assert_int_equal(nb_job_store_get(a, "shared", &r), NB_OK);
  assert_int_equal(r.state, NB_JOB_PROPOSED);
  nb_job_record_clear(&r);
  /* the same move from the other handle is now refused */
  assert_int_equal(nb_job_store_transition(a, "shared", NB_JOB_PROPOSED, NULL), NB_ERR_INVALID);
  for (int i = 0; i < RACE_JOBS; i++) {
    char id[32];
    snprintf(id, sizeof id, "race-%d", i);
    assert_int_equal(nb_job_store_create(a, id, "alice", "{}"), NB_OK);
  }
  nb_job_store_close(a);
  nb_job_store_close(b);

  /* two threads, one handle each, race for the same moves and append to one log */
  race_arg_t args[2] = {{0, 0, 0}, {1, 0, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, race_thread, &args[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  assert_int_equal(args[0].wins + args[1].wins, RACE_JOBS); /* each move won exactly once */
  assert_int_equal(args[0].appended, RACE_EVENTS);
  assert_int_equal(args[1].appended, RACE_EVENTS);

  nb_job_store_t* s = open_store();
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  assert_int_equal(nb_job_store_events(s, "race-0", 0, 0, &ev, &n), NB_OK);
  /* one state event + 80 progress events, numbered 1..81 without gaps or repeats */
  assert_int_equal(n, 1 + 2 * RACE_EVENTS);
  for (size_t i = 0; i < n; i++) assert_int_equal(ev[i].seq, (int64_t)i + 1);
  nb_job_events_free(ev, n);
  nb_job_store_close(s);
}

/* Federation records: put/get round trip (secret included), update, the active list, and a
 * record for an unknown job or with a bad role refused; they survive a reopen. */
static void test_federation_records(void** state) {
  (void)state;
  nb_job_store_t* s = open_store();
  assert_int_equal(nb_job_store_create(s, "fed-1", "alice", "{}"), NB_OK);
  assert_int_equal(nb_job_store_create(s, "fed-2", "alice", "{}"), NB_OK);
  nb_job_fed_t f;
  memset(&f, 0, sizeof f);
  snprintf(f.job_id, sizeof f.job_id, "fed-1");
  snprintf(f.role, sizeof f.role, "origin");
  snprintf(f.origin, sizeof f.origin, "dc-a");
  f.active = 1;
  f.info = (char*)"{\"clusters\": {}}";
  assert_int_equal(nb_job_store_fed_put(s, &f), NB_OK);
  nb_job_fed_t g;
  assert_int_equal(nb_job_store_fed_get(s, "fed-1", &g), NB_OK);
  assert_string_equal(g.role, "origin");
  assert_string_equal(g.origin, "dc-a");
  assert_int_equal(g.has_secret, 0);
  assert_non_null(strstr(g.info, "clusters"));
  nb_job_fed_clear(&g);
  for (int i = 0; i < 32; i++) f.secret[i] = (uint8_t)(i * 7);
  f.has_secret = 1;
  f.info = NULL;
  assert_int_equal(nb_job_store_fed_put(s, &f), NB_OK);
  snprintf(f.job_id, sizeof f.job_id, "fed-2");
  snprintf(f.role, sizeof f.role, "member");
  f.active = 0;
  assert_int_equal(nb_job_store_fed_put(s, &f), NB_OK);
  snprintf(f.job_id, sizeof f.job_id, "nope");
  assert_int_equal(nb_job_store_fed_put(s, &f), NB_ERR_NOT_FOUND);
  snprintf(f.job_id, sizeof f.job_id, "fed-2");
  snprintf(f.role, sizeof f.role, "boss");
  assert_int_equal(nb_job_store_fed_put(s, &f), NB_ERR_INVALID);
  assert_int_equal(nb_job_store_fed_get(s, "nope", &g), NB_ERR_NOT_FOUND);
  nb_job_store_close(s);
  s = open_store();
  assert_int_equal(nb_job_store_fed_get(s, "fed-1", &g), NB_OK);
  assert_int_equal(g.has_secret, 1);
  assert_int_equal(g.secret[31], (uint8_t)(31 * 7));
  assert_string_equal(g.info, "{}");
  nb_job_fed_clear(&g);
  nb_job_fed_t* all = NULL;
  size_t n = 0;
  assert_int_equal(nb_job_store_fed_list_active(s, &all, &n), NB_OK);
  assert_int_equal(n, 1);
  assert_string_equal(all[0].job_id, "fed-1");
  nb_job_feds_free(all, n);
  nb_job_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_create_get_list, setup, teardown),
      cmocka_unit_test(test_lifecycle_table),
      cmocka_unit_test_setup_teardown(test_transitions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reopen_keeps_state, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_from_v1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newer_schema_and_garbage_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_two_handles, setup, teardown),
      cmocka_unit_test_setup_teardown(test_federation_records, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
