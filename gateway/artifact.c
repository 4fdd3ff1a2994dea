/* Artifacts: a content-addressed store on disk (objects named by SHA-256, a SQLite index of
 * names), the nebula.v1.Artifacts service that serves it in sealed chunks and takes users' own
 * files (Put, List), and the resumable client fetch and the upload. It is not a general file
 * server nor a transport: inter/rpc carries the calls and security/seal the keys; which cluster
 * takes part in which job, and who may put, are the gateway's callbacks, and what a job is
 * entitled to (its owner's outputs, base and program files, gateway/artifact.h) is decided here. */
#include "gateway/artifact.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "inter/ratelimit.h"
#include "gateway/artifact_internal.h"
#include "nebula/v1/artifact.pb-c.h"
#include "security/seal.h"

NB_PARAM_INT(ArtifactChunkKib, "NB_ARTIFACT_CHUNK_KIB", 1024, 1, 8192,
             "plaintext KiB per sealed chunk that the Artifacts service sends")
NB_PARAM_DOUBLE(ArtifactRateMbps, "NB_ARTIFACT_RATE_MBPS", 0, 0, 1e6,
                "cap on what one gateway's Artifacts service sends, Mbit/s (0 = none)")
NB_PARAM_INT(ArtifactRetries, "NB_ARTIFACT_RETRIES", 5, 0, 1000,
             "times a fetch reconnects and resumes after a dropped connection")
NB_PARAM_INT(ArtifactConnectMs, "NB_ARTIFACT_CONNECT_MS", 5000, 100, 600000,
             "how long a fetch waits for the peer gateway's channel to connect, per attempt")

#define NB__SHA_BYTES 32
#define NB__TRANSFER_ID_BYTES NB__ARTIFACT_TID_BYTES
#define NB__SENDER "nebula.artifacts" /* the sending side of every artifact key */
#define NB__M_RESOLVE "/nebula.v1.Artifacts/Resolve"
#define NB__M_FETCH "/nebula.v1.Artifacts/Fetch"
#define NB__M_PUT "/nebula.v1.Artifacts/Put"
#define NB__M_LIST "/nebula.v1.Artifacts/List"
#define NB__LIST_MAX 1000
#define NB__IO_BUF ((size_t)1 << 20)

typedef struct nb__svc {
  nb_artifact_store_t* store;
  nb_artifact_job_fn job_fn;
  void* job_user;
  nb_ratelimit_t* rl; /* NULL: no cap */
  void* put;          /* an nb__put_svc_t kept here (nb_artifact_put_service_add), or NULL */
  struct nb__svc* next;
} nb__svc_t;

#define NB__DIR_MAX 768 /* store folder: leaves room for objects/xx/<64 hex> in 1024 bytes */

struct nb_artifact_store {
  char dir[NB__DIR_MAX];
  sqlite3* db;
  pthread_mutex_t mu;              /* guards db and svcs */
  nb__svc_t* svcs;                 /* services added to servers: freed with the store */
  _Atomic uint64_t sent, received; /* plaintext bytes its services sent, fetches counted here */
};

static _Atomic uint64_t nb__sent_bytes;

uint64_t nb_artifact_sent_bytes(void) {
  return atomic_load(&nb__sent_bytes);
}

void nb_artifact_store_bytes(nb_artifact_store_t* store, uint64_t* received, uint64_t* sent) {
  if (received) *received = store ? atomic_load(&store->received) : 0;
  if (sent) *sent = store ? atomic_load(&store->sent) : 0;
}

/* ------------------------------------------------------------------ names and hashes */

nb_status_t nb_artifact_name_check(const char* name) {
  if (!name || !*name) return nb_error(NB_ERR_INVALID, "artifact name is empty");
  size_t n = strlen(name);
  if (n >= NB_ARTIFACT_NAME_MAX)
    return nb_error(NB_ERR_INVALID, "artifact name is %zu bytes (at most %d)", n,
                    NB_ARTIFACT_NAME_MAX - 1);
  if (name[0] == '/') return nb_error(NB_ERR_INVALID, "artifact name '%s' is absolute", name);
  if (!strncmp(name, "sha256:", 7))
    return nb_error(NB_ERR_INVALID, "artifact name '%s' looks like a content hash", name);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    if (c < 0x20 || c == 0x7f)
      return nb_error(NB_ERR_INVALID, "artifact name has a control character (0x%02x) at byte %zu",
                      c, i);
    if (c == '\\')
      return nb_error(NB_ERR_INVALID, "artifact name '%s' has a backslash at byte %zu", name, i);
  }
  for (const char* p = name;;) { /* each '/'-separated component */
    const char* e = strchr(p, '/');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == 0)
      return nb_error(NB_ERR_INVALID, "artifact name '%s' has an empty path component", name);
    if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
      return nb_error(NB_ERR_INVALID, "artifact name '%s' has a '%.*s' component", name, (int)len,
                      p);
    if (!e) break;
    p = e + 1;
  }
  return NB_OK;
}

/* Lower-cases a 64-digit hex hash into out (65 bytes). */
static nb_status_t nb__hash_check(const char* hex, char out[NB_ARTIFACT_HASH_HEX]) {
  if (!hex || strlen(hex) != 64)
    return nb_error(NB_ERR_INVALID, "a SHA-256 is 64 hex digits, got '%.80s'", hex ? hex : "");
  for (int i = 0; i < 64; i++) {
    char c = hex[i];
    if (c >= 'A' && c <= 'F') c = (char)(c - 'A' + 'a');
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return nb_error(NB_ERR_INVALID, "SHA-256 '%.64s' has a non-hex digit at %d", hex, i);
    out[i] = c;
  }
  out[64] = 0;
  return NB_OK;
}

static void nb__hex(const uint8_t* b, size_t n, char* out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) out[2 * i] = d[b[i] >> 4], out[2 * i + 1] = d[b[i] & 15];
  out[2 * n] = 0;
}

/* SHA-256 of the whole file at fd (read from offset 0) into hex; *size gets the bytes read. */
static nb_status_t nb__hash_fd(int fd, const char* what, char hex[NB_ARTIFACT_HASH_HEX],
                               uint64_t* size) {
  uint8_t* buf = NULL;
  NB_CHECK(nb_alloc((void**)&buf, 1, NB__IO_BUF, "hash buffer"));
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  nb_status_t st = NB_OK;
  uint64_t total = 0;
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    st = nb_error(NB_ERR_CRYPTO, "SHA-256 init failed");
    goto out;
  }
  for (;;) {
    ssize_t r = pread(fd, buf, NB__IO_BUF, (off_t)total);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      st = nb_error(NB_ERR_IO, "reading %s: %s", what, strerror(errno));
      goto out;
    }
    if (r == 0) break;
    if (EVP_DigestUpdate(md, buf, (size_t)r) != 1) {
      st = nb_error(NB_ERR_CRYPTO, "SHA-256 update failed");
      goto out;
    }
    total += (uint64_t)r;
  }
  uint8_t dg[NB__SHA_BYTES];
  unsigned dl = 0;
  if (EVP_DigestFinal_ex(md, dg, &dl) != 1 || dl != NB__SHA_BYTES) {
    st = nb_error(NB_ERR_CRYPTO, "SHA-256 final failed");
    goto out;
  }
  nb__hex(dg, NB__SHA_BYTES, hex);
  if (size) *size = total;
out:
  EVP_MD_CTX_free(md);
  nb_free(buf);
  return st;
}

static nb_status_t nb__write_all(int fd, const void* p, size_t n, uint64_t off, const char* what) {
  const uint8_t* b = p;
  while (n) {
    ssize_t w = pwrite(fd, b, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return nb_error(NB_ERR_IO, "writing %s: %s", what, strerror(errno));
    b += w, n -= (size_t)w, off += (uint64_t)w;
  }
  return NB_OK;
}

/* fsync of the folder that holds path, so that a rename in it is durable. */
static nb_status_t nb__fsync_parent(const char* path) {
  char d[PATH_MAX];
  snprintf(d, sizeof d, "%s", path);
  char* s = strrchr(d, '/');
  if (s == d)
    s[1] = 0;
  else if (s)
    *s = 0;
  else
    snprintf(d, sizeof d, ".");
  int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return nb_error(NB_ERR_IO, "opening folder %s: %s", d, strerror(errno));
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  if (rc != 0) return nb_error(NB_ERR_IO, "fsync of folder %s: %s", d, strerror(e));
  return NB_OK;
}

static nb_status_t nb__mkdir(const char* path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return nb_error(NB_ERR_IO, "creating folder %s: %s", path, strerror(errno));
  return NB_OK;
}

/* ------------------------------------------------------------------ store */

static nb_status_t nb__object_path(const nb_artifact_store_t* s, const char* hex, char* buf,
                                   size_t cap) {
  int n = snprintf(buf, cap, "%s/objects/%.2s/%s", s->dir, hex, hex);
  if (n < 0 || (size_t)n >= cap)
    return nb_error(NB_ERR_INVALID, "artifact store path '%s' is too long", s->dir);
  return NB_OK;
}

static nb_status_t nb__sql(nb_artifact_store_t* s, int rc, const char* what) {
  return nb_error(NB_ERR_IO, "artifact store %s: %s: %s", s->dir, what,
                  rc == SQLITE_OK ? "?" : sqlite3_errmsg(s->db));
}

nb_status_t nb_artifact_store_open(const char* dir, nb_artifact_store_t** out) {
  if (!dir || !*dir || !out) return nb_error(NB_ERR_INVALID, "artifact store: NULL argument");
  *out = NULL;
  if (strlen(dir) >= NB__DIR_MAX)
    return nb_error(NB_ERR_INVALID, "artifact store path '%s' is too long", dir);
  nb_artifact_store_t* s = NULL;
  NB_CHECK(nb_calloc((void**)&s, 1, sizeof *s, "artifact store"));
  snprintf(s->dir, sizeof s->dir, "%s", dir);
  pthread_mutex_init(&s->mu, NULL);
  char p[PATH_MAX];
  nb_status_t st = nb__mkdir(dir);
  snprintf(p, sizeof p, "%s/objects", dir);
  if (st == NB_OK) st = nb__mkdir(p);
  snprintf(p, sizeof p, "%s/tmp", dir);
  if (st == NB_OK) st = nb__mkdir(p);
  if (st != NB_OK) goto fail;
  snprintf(p, sizeof p, "%s/names.db", dir);
  int rc = sqlite3_open_v2(
      p, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL);
  if (rc != SQLITE_OK) {
    st = nb_error(NB_ERR_IO, "artifact store: cannot open %s: %s", p,
                  s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
    goto fail;
  }
  sqlite3_busy_timeout(s->db, 5000);
  char* err = NULL;
  rc = sqlite3_exec(s->db,
                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"
                    "CREATE TABLE IF NOT EXISTS names (name TEXT PRIMARY KEY, sha256 TEXT NOT "
                    "NULL, size INTEGER NOT NULL, updated_ns INTEGER NOT NULL);"
                    "CREATE INDEX IF NOT EXISTS names_sha ON names(sha256);",
                    NULL, NULL, &err);
  if (rc != SQLITE_OK) {
    st = nb_error(NB_ERR_IO, "artifact store %s: schema: %s", dir, err ? err : "?");
    sqlite3_free(err);
    goto fail;
  }
  /* owner and job of each name (added later: names kept before have none and are not served) */
  sqlite3_stmt* probe = NULL;
  if (sqlite3_prepare_v2(s->db, "SELECT owner, job FROM names LIMIT 0", -1, &probe, NULL) !=
      SQLITE_OK) {
    rc = sqlite3_exec(s->db,
                      "ALTER TABLE names ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
                      "ALTER TABLE names ADD COLUMN job TEXT NOT NULL DEFAULT '';",
                      NULL, NULL, &err);
    if (rc != SQLITE_OK) {
      st = nb_error(NB_ERR_IO, "artifact store %s: adding owners: %s", dir, err ? err : "?");
      sqlite3_free(err);
      goto fail;
    }
  }
  sqlite3_finalize(probe);
  *out = s;
  return NB_OK;
fail:
  nb_artifact_store_close(s);
  return st;
}

void nb_artifact_store_close(nb_artifact_store_t* store) {
  if (!store) return;
  while (store->svcs) {
    nb__svc_t* n = store->svcs->next;
    nb_ratelimit_destroy(store->svcs->rl);
    nb_free(store->svcs->put);
    nb_free(store->svcs);
    store->svcs = n;
  }
  if (store->db) sqlite3_close(store->db);
  pthread_mutex_destroy(&store->mu);
  nb_free(store);
}

/* Copies the open file `in` (named `src` in errors) into `fd` (named `dst`) while hashing it:
 * *total bytes, hex their SHA-256. The descriptors stay the caller's. */
static nb_status_t nb__copy_hashing(int in, const char* src, int fd, const char* dst,
                                    char hex[NB_ARTIFACT_HASH_HEX], uint64_t* total) {
  uint8_t* buf = NULL;
  EVP_MD_CTX* md = NULL;
  nb_status_t st = NB_OK;
  *total = 0;
  NB_CHECK_GOTO(nb_alloc((void**)&buf, 1, NB__IO_BUF, "artifact copy buffer"), st, out);
  md = EVP_MD_CTX_new();
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    st = nb_error(NB_ERR_CRYPTO, "SHA-256 init failed");
    goto out;
  }
  for (;;) {
    ssize_t r = read(in, buf, NB__IO_BUF);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      st = nb_error(NB_ERR_IO, "reading %s: %s", src, strerror(errno));
      goto out;
    }
    if (r == 0) break;
    if (EVP_DigestUpdate(md, buf, (size_t)r) != 1) {
      st = nb_error(NB_ERR_CRYPTO, "SHA-256 update failed");
      goto out;
    }
    NB_CHECK_GOTO(nb__write_all(fd, buf, (size_t)r, *total, dst), st, out);
    *total += (uint64_t)r;
  }
  uint8_t dg[NB__SHA_BYTES];
  unsigned dl = 0;
  if (EVP_DigestFinal_ex(md, dg, &dl) != 1) {
    st = nb_error(NB_ERR_CRYPTO, "SHA-256 final failed");
    goto out;
  }
  nb__hex(dg, NB__SHA_BYTES, hex);
out:
  EVP_MD_CTX_free(md);
  nb_free(buf);
  return st;
}

/* Copies src into a temp file of the store while hashing it; fsyncs it. */
static nb_status_t nb__ingest(nb_artifact_store_t* s, const char* file, char* tmp, size_t tmp_cap,
                              char hex[NB_ARTIFACT_HASH_HEX], uint64_t* size) {
  int in = open(file, O_RDONLY | O_CLOEXEC);
  if (in < 0) return nb_error(NB_ERR_IO, "artifact source %s: %s", file, strerror(errno));
  snprintf(tmp, tmp_cap, "%s/tmp/put.XXXXXX", s->dir);
  int fd = mkostemp(tmp, O_CLOEXEC);
  nb_status_t st = NB_OK;
  if (fd < 0) {
    st = nb_error(NB_ERR_IO, "artifact store temp file %s: %s", tmp, strerror(errno));
    tmp[0] = 0;
    goto out;
  }
  NB_CHECK_GOTO(nb__copy_hashing(in, file, fd, tmp, hex, size), st, out);
  if (fchmod(fd, 0644) != 0 || fsync(fd) != 0)
    st = nb_error(NB_ERR_IO, "fsync of %s: %s", tmp, strerror(errno));
out:
  if (fd >= 0 && close(fd) != 0 && st == NB_OK)
    st = nb_error(NB_ERR_IO, "closing %s: %s", tmp, strerror(errno));
  close(in);
  return st;
}

nb_status_t nb_artifact_put(nb_artifact_store_t* store, const char* name, const char* owner,
                            const char* job, const char* file, nb_artifact_info_t* out) {
  if (!store || !file) return nb_error(NB_ERR_INVALID, "artifact put: NULL argument");
  NB_CHECK(nb_artifact_name_check(name));
  if (!owner) owner = "";
  if (!job) job = "";
  size_t on = strlen(owner);
  if (on >= NB_ARTIFACT_ID_MAX || strlen(job) >= NB_ARTIFACT_ID_MAX || strchr(owner, '/'))
    return nb_error(NB_ERR_INVALID, "artifact put: bad owner or job id");
  if (on && (strncmp(name, owner, on) != 0 || name[on] != '/'))
    return nb_error(NB_ERR_INVALID, "artifact name '%s' is not in the namespace of its owner '%s'",
                    name, owner);
  char tmp[PATH_MAX] = "", hex[NB_ARTIFACT_HASH_HEX], obj[sizeof out->path], d[PATH_MAX];
  uint64_t size = 0;
  nb_status_t st = nb__ingest(store, file, tmp, sizeof tmp, hex, &size);
  if (st != NB_OK) goto fail;
  NB_CHECK_GOTO(nb__object_path(store, hex, obj, sizeof obj), st, fail);
  snprintf(d, sizeof d, "%s/objects/%.2s", store->dir, hex);
  NB_CHECK_GOTO(nb__mkdir(d), st, fail);
  /* Renaming over an object already held is harmless (same bytes) and heals a damaged copy. */
  if (rename(tmp, obj) != 0) {
    st = nb_error(NB_ERR_IO, "artifact store: rename %s -> %s: %s", tmp, obj, strerror(errno));
    goto fail;
  }
  tmp[0] = 0;
  NB_CHECK_GOTO(nb__fsync_parent(obj), st, fail);

  pthread_mutex_lock(&store->mu);
  sqlite3_stmt* q = NULL;
  int rc = sqlite3_prepare_v2(store->db,
                              "INSERT INTO names(name, sha256, size, updated_ns, owner, job) "
                              "VALUES(?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
                              "sha256 = excluded.sha256, size = excluded.size, "
                              "updated_ns = excluded.updated_ns, owner = excluded.owner, "
                              "job = excluded.job",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, hex, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, (sqlite3_int64)size);
    sqlite3_bind_int64(q, 4, (sqlite3_int64)nb_wall_ns());
    sqlite3_bind_text(q, 5, owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, job, -1, SQLITE_STATIC);
    rc = sqlite3_step(q) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
  }
  if (rc != SQLITE_OK) st = nb__sql(store, rc, "recording a name");
  sqlite3_finalize(q);
  pthread_mutex_unlock(&store->mu);
  if (st != NB_OK) goto fail;
  NB_INFO(JOB, "artifact '%s' = sha256:%s (%llu bytes)", name, hex, (unsigned long long)size);
  if (out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    memcpy(out->sha256, hex, sizeof out->sha256);
    out->size = size;
    snprintf(out->path, sizeof out->path, "%s", obj);
    snprintf(out->owner, sizeof out->owner, "%s", owner);
    snprintf(out->job, sizeof out->job, "%s", job);
  }
  return NB_OK;
fail:
  if (tmp[0]) unlink(tmp);
  return st;
}

/* Whether the job (j, job_id) may have the object of one name row. NULL j: anyone (lookup). */
typedef struct {
  const nb_artifact_job_t* j;
  const char* job_id;
} nb__who_t;

/* "<owner>/<name>", or name itself when it is already in owner's namespace (second candidate). */
static int nb__in_namespace(const char* name, const char* owner) {
  size_t n = strlen(owner);
  return n && !strncmp(name, owner, n) && name[n] == '/';
}

static int nb__entitled(const nb__who_t* w, const nb_artifact_info_t* o) {
  if (!w || !w->j) return 1;
  const nb_artifact_job_t* j = w->j;
  if (!o->owner[0] || strcmp(o->owner, j->owner) != 0) return 0; /* another user's, or nobody's */
  if (w->job_id && o->job[0] && !strcmp(o->job, w->job_id)) return 1;    /* its own output */
  if (j->base_sha256[0] && !strcmp(o->sha256, j->base_sha256)) return 1; /* the pinned base */
  if (j->base[0]) {
    char q[NB_ARTIFACT_NAME_MAX * 2];
    snprintf(q, sizeof q, "%s/%s", j->owner, j->base);
    if (!strcmp(o->name, q)) return 1;
    if (nb__in_namespace(j->base, j->owner) && !strcmp(o->name, j->base)) return 1;
  }
  for (int k = 0; k < j->n_files && k < NB_ARTIFACT_JOB_FILES; k++) { /* its program's files */
    const char* f = j->files[k];
    if (!strncmp(f, "sha256:", 7)) {
      if (!strcasecmp(f + 7, o->sha256)) return 1;
      continue;
    }
    char q[NB_ARTIFACT_NAME_MAX * 2];
    snprintf(q, sizeof q, "%s/%s", j->owner, f);
    if (!strcmp(o->name, q)) return 1;
    if (nb__in_namespace(f, j->owner) && !strcmp(o->name, f)) return 1;
  }
  return 0;
}

/* The first name row (by name, or every row holding the hash, in name order) that w may have.
 * *seen: rows found at all (entitled or not). */
static nb_status_t nb__find(nb_artifact_store_t* store, const char* name, const char* hex,
                            const nb__who_t* w, nb_artifact_info_t* out, int* seen) {
  nb_status_t st = NB_OK;
  int found = 0;
  *seen = 0;
  pthread_mutex_lock(&store->mu);
  sqlite3_stmt* q = NULL;
  int rc =
      sqlite3_prepare_v2(store->db,
                         hex ? "SELECT name, sha256, size, owner, job FROM names WHERE "
                               "sha256 = ? ORDER BY name"
                             : "SELECT name, sha256, size, owner, job FROM names WHERE name = ?",
                         -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(q, 1, hex ? hex : name, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      nb_artifact_info_t r;
      memset(&r, 0, sizeof r);
      snprintf(r.name, sizeof r.name, "%s", (const char*)sqlite3_column_text(q, 0));
      snprintf(r.sha256, sizeof r.sha256, "%s", (const char*)sqlite3_column_text(q, 1));
      int64_t size = sqlite3_column_int64(q, 2);
      r.size = size >= 0 ? (uint64_t)size : 0;
      const unsigned char* ow = sqlite3_column_text(q, 3);
      const unsigned char* jb = sqlite3_column_text(q, 4);
      snprintf(r.owner, sizeof r.owner, "%s", ow ? (const char*)ow : "");
      snprintf(r.job, sizeof r.job, "%s", jb ? (const char*)jb : "");
      (*seen)++;
      if (nb__entitled(w, &r)) {
        *out = r;
        found = 1;
        break;
      }
    }
    rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
  }
  if (rc != SQLITE_OK) st = nb__sql(store, rc, "looking up a name");
  sqlite3_finalize(q);
  pthread_mutex_unlock(&store->mu);
  NB_CHECK(st);
  return found ? NB_OK : NB_ERR_NOT_FOUND;
}

/* The object of a found row: its path, and that it is still there. */
static nb_status_t nb__object_of(nb_artifact_store_t* store, int by_hash, nb_artifact_info_t* out) {
  NB_CHECK(nb__object_path(store, out->sha256, out->path, sizeof out->path));
  struct stat sb;
  if (stat(out->path, &sb) != 0)
    return nb_error(NB_ERR_NOT_FOUND, "artifact object sha256:%s is not in this store%s",
                    out->sha256, by_hash ? "" : " (its name is recorded but the object is gone)");
  return NB_OK;
}

nb_status_t nb_artifact_lookup(nb_artifact_store_t* store, const char* name_or_hash,
                               nb_artifact_info_t* out) {
  if (!store || !name_or_hash || !out)
    return nb_error(NB_ERR_INVALID, "artifact lookup: NULL argument");
  memset(out, 0, sizeof *out);
  char hex[NB_ARTIFACT_HASH_HEX] = "";
  int by_hash = !strncmp(name_or_hash, "sha256:", 7);
  if (by_hash)
    NB_CHECK(nb__hash_check(name_or_hash + 7, hex));
  else
    NB_CHECK(nb_artifact_name_check(name_or_hash));
  int seen = 0;
  nb_status_t st =
      nb__find(store, by_hash ? NULL : name_or_hash, by_hash ? hex : NULL, NULL, out, &seen);
  if (st == NB_ERR_NOT_FOUND && !by_hash)
    return nb_error(NB_ERR_NOT_FOUND, "no artifact named '%s' in this store", name_or_hash);
  if (st == NB_ERR_NOT_FOUND) {
    /* an object held without a name: served by hash with its file's size */
    memset(out, 0, sizeof *out);
    memcpy(out->sha256, hex, sizeof out->sha256);
    NB_CHECK(nb__object_of(store, 1, out));
    struct stat sb;
    if (stat(out->path, &sb) == 0) out->size = (uint64_t)sb.st_size;
    snprintf(out->name, sizeof out->name, "sha256:%s", hex);
    return NB_OK;
  }
  NB_CHECK(st);
  return nb__object_of(store, by_hash, out);
}

/* What job (j, job_id) may have under name_or_hash: a hash among the objects it is entitled to; a
 * name in its owner's namespace ("<owner>/<name>" first, then the name itself when it already
 * starts with "<owner>/") that it is entitled to. Refusals say why without revealing whether
 * another user holds such a name or hash. */
static nb_status_t nb__lookup_for(nb_artifact_store_t* store, const char* name_or_hash,
                                  const nb_artifact_job_t* j, const char* job_id,
                                  nb_artifact_info_t* out) {
  memset(out, 0, sizeof *out);
  nb__who_t w = {j, job_id};
  int seen = 0;
  if (!strncmp(name_or_hash, "sha256:", 7)) {
    char hex[NB_ARTIFACT_HASH_HEX];
    NB_CHECK(nb__hash_check(name_or_hash + 7, hex));
    nb_status_t st = nb__find(store, NULL, hex, &w, out, &seen);
    if (st == NB_ERR_NOT_FOUND)
      return nb_error(NB_ERR_NOT_FOUND,
                      "no artifact sha256:%s that job '%s' of user '%s' may fetch here (a job may "
                      "fetch its own outputs, the base checkpoint and the program files it names, "
                      "of the same user)",
                      hex, job_id, j->owner);
    NB_CHECK(st);
    return nb__object_of(store, 1, out);
  }
  NB_CHECK(nb_artifact_name_check(name_or_hash));
  char cand[2][NB_ARTIFACT_NAME_MAX * 2];
  int nc = 0;
  snprintf(cand[nc++], sizeof cand[0], "%s/%s", j->owner, name_or_hash);
  if (nb__in_namespace(name_or_hash, j->owner))
    snprintf(cand[nc++], sizeof cand[0], "%s", name_or_hash);
  int any = 0;
  for (int i = 0; i < nc; i++) {
    if (strlen(cand[i]) >= NB_ARTIFACT_NAME_MAX) continue;
    nb_status_t st = nb__find(store, cand[i], NULL, &w, out, &seen);
    any += seen;
    if (st == NB_OK) return nb__object_of(store, 0, out);
    if (st != NB_ERR_NOT_FOUND) return st;
  }
  if (any)
    return nb_error(NB_ERR_PERMISSION,
                    "job '%s' of user '%s' may not fetch artifact '%s': a job may fetch its own "
                    "outputs, the base checkpoint and the program files it names",
                    job_id, j->owner, name_or_hash);
  return nb_error(NB_ERR_NOT_FOUND,
                  "no artifact '%s' in the namespace of user '%s' (names are "
                  "<user>/<job>/<path>, or <user>/<name> for a file the user put; other users' "
                  "artifacts are not served)",
                  name_or_hash, j->owner);
}

/* ------------------------------------------------------------------ sealing */

nb_status_t nb__artifact_seal_ctx(const uint8_t secret[32], const char* job_id,
                                  const uint8_t tid[NB__TRANSFER_ID_BYTES], const char* receiver,
                                  int sending, nb_seal_ctx_t** out) {
  if (!secret || !job_id || !tid || !receiver || !out)
    return nb_error(NB_ERR_INVALID, "artifact key: NULL argument");
  char label[300], th[2 * NB__TRANSFER_ID_BYTES + 1];
  nb__hex(tid, NB__TRANSFER_ID_BYTES, th);
  int n = snprintf(label, sizeof label, "artifact/%s/%s", th, job_id);
  if (n < 0 || n > 255)
    return nb_error(NB_ERR_INVALID, "job id '%.40s...' is too long for an artifact key", job_id);
  return nb_seal_ctx_create(secret, label, sending ? NB__SENDER : receiver,
                            sending ? receiver : NB__SENDER, NULL, out);
}

nb_status_t nb__artifact_chunk_pack(nb_seal_ctx_t* seal, const uint8_t tid[NB__TRANSFER_ID_BYTES],
                                    const char* sha256, uint64_t size, uint64_t offset,
                                    uint64_t index, uint8_t* buf, size_t len, uint8_t* out,
                                    size_t cap, size_t* out_len) {
  if (len > UINT32_MAX || cap < len + NB_SEAL_TAG_BYTES + NB__ARTIFACT_HDR_MAX + 16)
    return nb_error(NB_ERR_INVALID, "artifact chunk of %zu bytes does not fit %zu", len, cap);
  Nebula__V1__ArtifactChunkHeader h = NEBULA__V1__ARTIFACT_CHUNK_HEADER__INIT;
  h.sha256 = (char*)sha256;
  h.size = size;
  h.offset = offset;
  h.length = (uint32_t)len;
  h.index = index;
  h.transfer_id.data = (uint8_t*)tid;
  h.transfer_id.len = NB__TRANSFER_ID_BYTES;
  uint8_t hdr[NB__ARTIFACT_HDR_MAX];
  size_t hl = nebula__v1__artifact_chunk_header__get_packed_size(&h);
  if (hl > sizeof hdr) return nb_error(NB_ERR_INVALID, "chunk header of %zu bytes", hl);
  nebula__v1__artifact_chunk_header__pack(&h, hdr);
  size_t sl = 0;
  NB_CHECK(nb_seal_chunk(seal, 0, index, hdr, hl, buf, len, buf, &sl)); /* in place */
  Nebula__V1__ArtifactChunk c = NEBULA__V1__ARTIFACT_CHUNK__INIT;
  c.header.data = hdr;
  c.header.len = hl;
  c.sealed.data = buf;
  c.sealed.len = sl;
  if (nebula__v1__artifact_chunk__get_packed_size(&c) > cap)
    return nb_error(NB_ERR_INVALID, "artifact chunk message does not fit %zu bytes", cap);
  *out_len = nebula__v1__artifact_chunk__pack(&c, out);
  return NB_OK;
}

nb_status_t nb__artifact_rx_chunk(nb__artifact_rx_t* rx, const uint8_t* msg, size_t len,
                                  const uint8_t** plain, size_t* plen, uint64_t* at) {
  nb_status_t st = NB_OK;
  Nebula__V1__ArtifactChunk* c = nebula__v1__artifact_chunk__unpack(NULL, len, msg);
  Nebula__V1__ArtifactChunkHeader* h =
      c ? nebula__v1__artifact_chunk_header__unpack(NULL, c->header.len, c->header.data) : NULL;
  if (!h || h->transfer_id.len != NB__TRANSFER_ID_BYTES || strcmp(h->sha256, rx->sha256) ||
      h->size != rx->size || h->offset != rx->off || h->index != rx->index ||
      (uint64_t)h->length + NB_SEAL_TAG_BYTES != c->sealed.len || h->length > rx->size - rx->off) {
    st = nb_error(NB_ERR_INTEGRITY,
                  "artifact sha256:%.16s...: chunk %llu is not the next one (expected offset "
                  "%llu)",
                  rx->sha256, (unsigned long long)rx->index, (unsigned long long)rx->off);
  } else if (rx->index == 0) {
    memcpy(rx->tid, h->transfer_id.data, sizeof rx->tid);
    nb_seal_ctx_destroy(rx->seal);
    rx->seal = NULL;
    st = nb__artifact_seal_ctx(rx->secret, rx->job_id, rx->tid, rx->self, 0, &rx->seal);
  } else if (memcmp(rx->tid, h->transfer_id.data, sizeof rx->tid)) {
    st = nb_error(NB_ERR_INTEGRITY, "artifact chunk %llu belongs to another transfer",
                  (unsigned long long)rx->index);
  }
  if (st == NB_OK && (h->length > rx->cap || !rx->plain)) {
    size_t want = h->length ? h->length : 1;
    if (rx->plain) OPENSSL_cleanse(rx->plain, rx->cap);
    st = nb_realloc((void**)&rx->plain, want, 1, "artifact chunk");
    if (st == NB_OK) rx->cap = want;
  }
  size_t pl = 0;
  if (st == NB_OK)
    st = nb_open_chunk(rx->seal, 0, rx->index, c->header.data, c->header.len, c->sealed.data,
                       c->sealed.len, rx->plain, &pl);
  if (st == NB_ERR_EXISTS)
    st = nb_error(NB_ERR_INTEGRITY, "artifact chunk %llu replayed", (unsigned long long)rx->index);
  if (st == NB_OK) {
    *plain = rx->plain;
    *plen = pl;
    *at = rx->off;
    rx->off += pl;
    rx->index++;
  }
  if (h) nebula__v1__artifact_chunk_header__free_unpacked(h, NULL);
  if (c) nebula__v1__artifact_chunk__free_unpacked(c, NULL);
  return st;
}

void nb__artifact_rx_clear(nb__artifact_rx_t* rx) {
  if (!rx) return;
  nb_seal_ctx_destroy(rx->seal);
  if (rx->plain) OPENSSL_cleanse(rx->plain, rx->cap);
  nb_free(rx->plain);
  rx->seal = NULL;
  rx->plain = NULL;
  rx->cap = 0;
  rx->index = 0;
}

/* ------------------------------------------------------------------ service */

/* The calling cluster and the job's secret, or why the call is refused. */
static nb_status_t nb__authorize(nb__svc_t* svc, nb_rpc_call_t* call, const char* job_id,
                                 const char** peer_out, nb_artifact_job_t* job) {
  memset(job, 0, sizeof *job);
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind != NB_TLS_PEER_CLUSTER)
    return nb_error(NB_ERR_PERMISSION, "artifacts are served to cluster certificates only");
  if (!job_id || !*job_id) return nb_error(NB_ERR_INVALID, "job_id is empty");
  nb_status_t st = svc->job_fn(svc->job_user, job_id, p->name, job);
  if (st == NB_OK && !job->owner[0])
    st = nb_error(NB_ERR_PERMISSION, "job '%s' has no owner", job_id);
  if (st != NB_OK) {
    OPENSSL_cleanse(job, sizeof *job);
    if (st != NB_ERR_NOT_FOUND) st = NB_ERR_PERMISSION;
    return nb_error(st, "cluster '%s' may not fetch artifacts of job '%s'", p->name, job_id);
  }
  *peer_out = p->name;
  return NB_OK;
}

static nb_status_t nb__h_resolve(nb_rpc_call_t* call, void* user) {
  nb__svc_t* svc = user;
  Nebula__V1__ResolveRequest* req = NULL;
  int end = 0;
  NB_CHECK(nb_rpc_call_recv_pb(call, &nebula__v1__resolve_request__descriptor,
                               (ProtobufCMessage**)&req, &end, NB_RPC_INFINITE));
  if (!req) return nb_error(NB_ERR_INVALID, "Resolve: no request");
  nb_artifact_job_t* job = NULL;
  const char* peer = NULL;
  nb_status_t st = nb_calloc((void**)&job, 1, sizeof *job, "artifact job");
  if (st == NB_OK) st = nb__authorize(svc, call, req->job_id, &peer, job);
  if (job) OPENSSL_cleanse(job->secret, sizeof job->secret);
  nb_artifact_info_t info;
  if (st == NB_OK)
    st = nb__lookup_for(svc->store, req->name ? req->name : "", job, req->job_id, &info);
  nb_free(job);
  if (st == NB_OK) {
    Nebula__V1__ArtifactInfo m = NEBULA__V1__ARTIFACT_INFO__INIT;
    m.name = info.name;
    m.sha256 = info.sha256;
    m.size = info.size;
    st = nb_rpc_call_send_pb(call, &m.base);
    NB_INFO(JOB, "Resolve '%s' for cluster '%s' (job %s): sha256:%s", req->name, peer, req->job_id,
            info.sha256);
  }
  protobuf_c_message_free_unpacked(&req->base, NULL);
  return st;
}

static nb_status_t nb__h_fetch(nb_rpc_call_t* call, void* user) {
  nb__svc_t* svc = user;
  Nebula__V1__FetchRequest* req = NULL;
  int end = 0, fd = -1;
  uint8_t tid[NB__TRANSFER_ID_BYTES];
  nb_artifact_job_t job;
  uint8_t *plain = NULL, *msg = NULL;
  size_t msg_cap = 0;
  nb_seal_ctx_t* seal = NULL;
  const char* peer = NULL;
  NB_CHECK(nb_rpc_call_recv_pb(call, &nebula__v1__fetch_request__descriptor,
                               (ProtobufCMessage**)&req, &end, NB_RPC_INFINITE));
  if (!req) return nb_error(NB_ERR_INVALID, "Fetch: no request");
  nb_status_t st = nb__authorize(svc, call, req->job_id, &peer, &job);
  if (st != NB_OK) goto out;
  char hex[NB_ARTIFACT_HASH_HEX], key[80];
  NB_CHECK_GOTO(nb__hash_check(req->sha256, hex), st, out);
  snprintf(key, sizeof key, "sha256:%s", hex);
  nb_artifact_info_t info;
  NB_CHECK_GOTO(nb__lookup_for(svc->store, key, &job, req->job_id, &info), st, out);
  fd = open(info.path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0) {
    st = nb_error(NB_ERR_NOT_FOUND, "artifact object sha256:%s: %s", hex, strerror(errno));
    goto out;
  }
  if ((uint64_t)sb.st_size != info.size) {
    NB_WARN(
        "artifact object %s is %lld bytes, recorded as %llu: the store is damaged; put the "
        "file again",
        info.path, (long long)sb.st_size, (unsigned long long)info.size);
    st = nb_error(NB_ERR_INTEGRITY, "artifact sha256:%s is damaged on the serving gateway", hex);
    goto out;
  }
  if (req->offset > info.size) {
    st = nb_error(NB_ERR_INVALID, "offset %llu is past the end of sha256:%s (%llu bytes)",
                  (unsigned long long)req->offset, hex, (unsigned long long)info.size);
    goto out;
  }
  if (RAND_bytes(tid, sizeof tid) != 1) {
    st = nb_error(NB_ERR_CRYPTO, "RAND_bytes failed");
    goto out;
  }
  NB_CHECK_GOTO(nb__artifact_seal_ctx(job.secret, req->job_id, tid, peer, 1, &seal), st, out);
  OPENSSL_cleanse(&job, sizeof job);
  size_t cb = (size_t)nb_param_ArtifactChunkKib() * 1024;
  NB_CHECK_GOTO(nb_alloc((void**)&plain, 1, cb + NB_SEAL_TAG_BYTES, "artifact chunk"), st, out);
  msg_cap = cb + NB_SEAL_TAG_BYTES + NB__ARTIFACT_HDR_MAX + 16;
  NB_CHECK_GOTO(nb_alloc((void**)&msg, 1, msg_cap, "artifact message"), st, out);
  uint64_t off = req->offset, index = 0;
  do {
    if (nb_rpc_call_cancelled(call)) {
      st = nb_error(NB_ERR_CANCELLED, "Fetch of sha256:%s cancelled", hex);
      goto out;
    }
    size_t len = info.size - off < cb ? (size_t)(info.size - off) : cb;
    for (size_t got = 0; got < len;) {
      ssize_t r = pread(fd, plain + got, len - got, (off_t)(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        st = nb_error(NB_ERR_INTEGRITY, "artifact sha256:%s: short read at %llu (%s)", hex,
                      (unsigned long long)(off + got), r < 0 ? strerror(errno) : "end of file");
        goto out;
      }
      got += (size_t)r;
    }
    size_t ml = 0;
    NB_CHECK_GOTO(nb__artifact_chunk_pack(seal, tid, hex, info.size, off, index, plain, len, msg,
                                          msg_cap, &ml),
                  st, out);
    /* the cap is paid in pieces so that a cancelled call (server shutting down, client gone)
     * does not sleep through a whole large chunk at a low rate */
    for (size_t paid = 0; svc->rl && paid < ml; paid += 64 * 1024) {
      if (nb_rpc_call_cancelled(call)) {
        st = nb_error(NB_ERR_CANCELLED, "Fetch of sha256:%s cancelled", hex);
        goto out;
      }
      size_t piece = ml - paid < 64 * 1024 ? ml - paid : 64 * 1024;
      NB_CHECK_GOTO(nb_ratelimit_acquire(svc->rl, piece), st, out);
    }
    NB_CHECK_GOTO(nb_rpc_call_send(call, msg, ml), st, out);
    atomic_fetch_add(&nb__sent_bytes, (uint64_t)len);
    atomic_fetch_add(&svc->store->sent, (uint64_t)len);
    off += len;
    index++;
  } while (off < info.size);
  NB_INFO(JOB, "Fetch sha256:%s to cluster '%s' (job %s): %llu bytes from %llu in %llu chunks", hex,
          peer, req->job_id, (unsigned long long)(info.size - req->offset),
          (unsigned long long)req->offset, (unsigned long long)index);
out:
  OPENSSL_cleanse(&job, sizeof job);
  if (fd >= 0) close(fd);
  if (plain) OPENSSL_cleanse(plain, (size_t)nb_param_ArtifactChunkKib() * 1024);
  nb_free(plain);
  nb_free(msg);
  nb_seal_ctx_destroy(seal);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  return st;
}

nb_status_t nb_artifact_service_add(nb_rpc_server_t* srv, nb_artifact_store_t* store,
                                    nb_artifact_job_fn job_fn, void* job_user) {
  if (!srv || !store || !job_fn)
    return nb_error(NB_ERR_INVALID, "artifact service: NULL server, store or job callback");
  nb__svc_t* svc = NULL;
  NB_CHECK(nb_calloc((void**)&svc, 1, sizeof *svc, "artifact service"));
  svc->store = store;
  svc->job_fn = job_fn;
  svc->job_user = job_user;
  nb_status_t st = NB_OK;
  double mbps = nb_param_ArtifactRateMbps();
  if (mbps > 0) NB_CHECK_GOTO(nb_ratelimit_create(mbps * 1e6 / 8, 0, &svc->rl), st, fail);
  NB_CHECK_GOTO(nb_rpc_server_add_method(srv, NB__M_RESOLVE, NB_RPC_UNARY, nb__h_resolve, svc), st,
                fail);
  NB_CHECK_GOTO(
      nb_rpc_server_add_method(srv, NB__M_FETCH, NB_RPC_SERVER_STREAMING, nb__h_fetch, svc), st,
      fail);
  pthread_mutex_lock(&store->mu);
  svc->next = store->svcs;
  store->svcs = svc;
  pthread_mutex_unlock(&store->mu);
  return NB_OK;
fail:
  /* A method registered before the failure keeps a pointer to svc: keep it with the store. */
  pthread_mutex_lock(&store->mu);
  svc->next = store->svcs;
  store->svcs = svc;
  pthread_mutex_unlock(&store->mu);
  return st;
}

/* ------------------------------------------------------------------ put, copy out */

typedef struct {
  nb_artifact_store_t* store;
  uint64_t max_bytes;
  nb_artifact_user_fn may_put;
  void* may_put_user;
} nb__put_svc_t;

/* 1 when some name of the store is owned by `user`. */
static int nb__owner_known(nb_artifact_store_t* store, const char* user) {
  int yes = 0;
  pthread_mutex_lock(&store->mu);
  sqlite3_stmt* q = NULL;
  if (sqlite3_prepare_v2(store->db, "SELECT 1 FROM names WHERE owner = ? LIMIT 1", -1, &q, NULL) ==
      SQLITE_OK) {
    sqlite3_bind_text(q, 1, user, -1, SQLITE_STATIC);
    yes = sqlite3_step(q) == SQLITE_ROW;
  }
  sqlite3_finalize(q);
  pthread_mutex_unlock(&store->mu);
  return yes;
}

/* The stored name of a user's Put: "<user>/<name>", or name itself when it already is in the
 * user's namespace; a name that starts with another user's namespace is refused. */
static nb_status_t nb__put_name(nb_artifact_store_t* store, const char* user, const char* name,
                                char full[NB_ARTIFACT_NAME_MAX]) {
  if (nb_artifact_name_check(name) != NB_OK)
    return nb_error_wrap(NB_ERR_INVALID, "Put: artifact name '%.255s'", name);
  if (nb__in_namespace(name, user)) {
    snprintf(full, NB_ARTIFACT_NAME_MAX, "%s", name);
    return NB_OK;
  }
  const char* sl = strchr(name, '/');
  if (sl) {
    char first[NB_ARTIFACT_ID_MAX];
    size_t n = (size_t)(sl - name);
    if (n < sizeof first) {
      memcpy(first, name, n);
      first[n] = 0;
      if (nb__owner_known(store, first))
        return nb_error(NB_ERR_PERMISSION,
                        "user '%s' may not put artifact '%s': '%s/' is the namespace of user "
                        "'%s'; a user puts only into its own ('%s/...')",
                        user, name, first, first, user);
    }
  }
  if (snprintf(full, NB_ARTIFACT_NAME_MAX, "%s/%s", user, name) >= NB_ARTIFACT_NAME_MAX)
    return nb_error(NB_ERR_INVALID, "Put: artifact name '%s/%s' is longer than %d bytes", user,
                    name, NB_ARTIFACT_NAME_MAX - 1);
  return NB_OK;
}

/* The caller of Put or List (`what`): a user certificate whose name the gateway's rule allows. */
static nb_status_t nb__store_caller(nb_rpc_call_t* call, const nb__put_svc_t* svc, const char* what,
                                    const char** who) {
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind != NB_TLS_PEER_USER || !p->name[0] || strchr(p->name, '/') ||
      strlen(p->name) >= NB_ARTIFACT_ID_MAX)
    return nb_error(NB_ERR_PERMISSION, "artifacts are %s by users (a user certificate) only",
                    !strcmp(what, "put") ? "put" : "listed");
  if (svc->may_put && svc->may_put(svc->may_put_user, p->name) != NB_OK)
    return nb_error_wrap(NB_ERR_PERMISSION, "user '%s' may not %s artifacts here", p->name, what);
  *who = p->name;
  return NB_OK;
}

static nb_status_t nb__h_put(nb_rpc_call_t* call, void* user) {
  nb__put_svc_t* svc = user;
  const char* who;
  NB_CHECK(nb__store_caller(call, svc, "put", &who));
  Nebula__V1__PutChunk* m = NULL;
  int end = 0, fd = -1;
  char tmp[PATH_MAX] = "", full[NB_ARTIFACT_NAME_MAX], want[NB_ARTIFACT_HASH_HEX], hex[65];
  EVP_MD_CTX* md = NULL;
  uint64_t size = 0, got = 0;
  nb_status_t st = nb_rpc_call_recv_pb(call, &nebula__v1__put_chunk__descriptor,
                                       (ProtobufCMessage**)&m, &end, NB_RPC_INFINITE);
  if (st != NB_OK) return st;
  if (!m) return nb_error(NB_ERR_INVALID, "Put: no request");
  NB_CHECK_GOTO(nb__put_name(svc->store, who, m->name ? m->name : "", full), st, out);
  if (nb__hash_check(m->sha256, want) != NB_OK) {
    st = nb_error_wrap(NB_ERR_INVALID, "Put of '%s': sha256", full);
    goto out;
  }
  size = m->size;
  if (size > svc->max_bytes) {
    st =
        nb_error(NB_ERR_INVALID,
                 "Put of '%s': %llu bytes is more than this gateway takes (artifacts.max_put_bytes "
                 "= %llu)",
                 full, (unsigned long long)size, (unsigned long long)svc->max_bytes);
    goto out;
  }
  snprintf(tmp, sizeof tmp, "%s/tmp/upload.XXXXXX", svc->store->dir);
  fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) {
    st = nb_error(NB_ERR_IO, "artifact store temp file %s: %s", tmp, strerror(errno));
    tmp[0] = 0;
    goto out;
  }
  md = EVP_MD_CTX_new();
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    st = nb_error(NB_ERR_CRYPTO, "SHA-256 init failed");
    goto out;
  }
  for (;;) {
    if (m->data.len > size - got) {
      st = nb_error(NB_ERR_INVALID, "Put of '%s': more bytes than the announced %llu", full,
                    (unsigned long long)size);
      goto out;
    }
    if (m->data.len) {
      if (EVP_DigestUpdate(md, m->data.data, m->data.len) != 1) {
        st = nb_error(NB_ERR_CRYPTO, "SHA-256 update failed");
        goto out;
      }
      NB_CHECK_GOTO(nb__write_all(fd, m->data.data, m->data.len, got, tmp), st, out);
      got += m->data.len;
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
    m = NULL;
    NB_CHECK_GOTO(nb_rpc_call_recv_pb(call, &nebula__v1__put_chunk__descriptor,
                                      (ProtobufCMessage**)&m, &end, NB_RPC_INFINITE),
                  st, out);
    if (end || !m) break;
  }
  if (got != size) {
    st = nb_error(NB_ERR_INVALID, "Put of '%s': %llu bytes arrived of the announced %llu", full,
                  (unsigned long long)got, (unsigned long long)size);
    goto out;
  }
  uint8_t dg[NB__SHA_BYTES];
  unsigned dl = 0;
  if (EVP_DigestFinal_ex(md, dg, &dl) != 1) {
    st = nb_error(NB_ERR_CRYPTO, "SHA-256 final failed");
    goto out;
  }
  nb__hex(dg, NB__SHA_BYTES, hex);
  if (strcmp(hex, want) != 0) {
    st = nb_error(NB_ERR_INTEGRITY,
                  "Put of '%s': the bytes that arrived have sha256 %s, not the announced %s; "
                  "nothing stored",
                  full, hex, want);
    goto out;
  }
  if (fsync(fd) != 0) {
    st = nb_error(NB_ERR_IO, "fsync of %s: %s", tmp, strerror(errno));
    goto out;
  }
  close(fd);
  fd = -1;
  nb_artifact_info_t info;
  NB_CHECK_GOTO(nb_artifact_put(svc->store, full, who, "", tmp, &info), st, out);
  Nebula__V1__ArtifactInfo r = NEBULA__V1__ARTIFACT_INFO__INIT;
  r.name = info.name;
  r.sha256 = info.sha256;
  r.size = info.size;
  st = nb_rpc_call_send_pb(call, &r.base);
  NB_INFO(JOB, "Put '%s' by user '%s': sha256:%s (%llu bytes)", full, who, info.sha256,
          (unsigned long long)info.size);
out:
  if (fd >= 0) close(fd);
  if (tmp[0]) unlink(tmp);
  EVP_MD_CTX_free(md);
  if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
  return st;
}

static nb_status_t nb__h_list(nb_rpc_call_t* call, void* user) {
  nb__put_svc_t* svc = user;
  const char* who;
  NB_CHECK(nb__store_caller(call, svc, "list", &who));
  Nebula__V1__ListArtifactsRequest* req = NULL;
  int end = 0;
  NB_CHECK(nb_rpc_call_recv_pb(call, &nebula__v1__list_artifacts_request__descriptor,
                               (ProtobufCMessage**)&req, &end, NB_RPC_INFINITE));
  if (!req) return nb_error(NB_ERR_INVALID, "List: no request");
  char pre[NB_ARTIFACT_NAME_MAX * 2];
  snprintf(pre, sizeof pre, "%s/%s", who, req->prefix ? req->prefix : "");
  protobuf_c_message_free_unpacked(&req->base, NULL);
  Nebula__V1__ArtifactInfo* items = NULL;
  Nebula__V1__ArtifactInfo** ptrs = NULL;
  char(*names)[NB_ARTIFACT_NAME_MAX + NB_ARTIFACT_HASH_HEX] = NULL;
  nb_status_t st = nb_calloc((void**)&items, NB__LIST_MAX, sizeof *items, "artifact list");
  if (st == NB_OK) st = nb_calloc((void**)&ptrs, NB__LIST_MAX, sizeof *ptrs, "artifact list");
  if (st == NB_OK) st = nb_calloc((void**)&names, NB__LIST_MAX, sizeof *names, "artifact list");
  size_t n = 0;
  int more = 0;
  if (st == NB_OK) {
    pthread_mutex_lock(&svc->store->mu);
    sqlite3_stmt* q = NULL;
    /* substr, not LIKE: a name may hold '%' or '_' */
    int rc = sqlite3_prepare_v2(svc->store->db,
                                "SELECT name, sha256, size FROM names WHERE owner = ? AND "
                                "substr(name, 1, ?) = ? ORDER BY name LIMIT ?",
                                -1, &q, NULL);
    if (rc == SQLITE_OK) {
      sqlite3_bind_text(q, 1, who, -1, SQLITE_STATIC);
      sqlite3_bind_int(q, 2, (int)strlen(pre));
      sqlite3_bind_text(q, 3, pre, -1, SQLITE_STATIC);
      sqlite3_bind_int(q, 4, NB__LIST_MAX + 1);
      while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (n == NB__LIST_MAX) {
          more = 1;
          break;
        }
        const unsigned char* nm = sqlite3_column_text(q, 0);
        const unsigned char* hx = sqlite3_column_text(q, 1);
        snprintf(names[n], NB_ARTIFACT_NAME_MAX, "%s", nm ? (const char*)nm : "");
        snprintf(names[n] + NB_ARTIFACT_NAME_MAX, NB_ARTIFACT_HASH_HEX, "%s",
                 hx ? (const char*)hx : "");
        nebula__v1__artifact_info__init(&items[n]);
        items[n].name = names[n];
        items[n].sha256 = names[n] + NB_ARTIFACT_NAME_MAX;
        int64_t size = sqlite3_column_int64(q, 2);
        items[n].size = size > 0 ? (uint64_t)size : 0;
        ptrs[n] = &items[n];
        n++;
      }
      rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc != SQLITE_OK) st = nb__sql(svc->store, rc, "listing names");
    sqlite3_finalize(q);
    pthread_mutex_unlock(&svc->store->mu);
  }
  if (st == NB_OK) {
    Nebula__V1__ArtifactList r = NEBULA__V1__ARTIFACT_LIST__INIT;
    r.n_artifacts = n;
    r.artifacts = ptrs;
    r.truncated = more;
    st = nb_rpc_call_send_pb(call, &r.base);
  }
  nb_free(names);
  nb_free(ptrs);
  nb_free(items);
  return st;
}

nb_status_t nb_artifact_put_service_add(nb_rpc_server_t* srv, nb_artifact_store_t* store,
                                        uint64_t max_bytes, nb_artifact_user_fn may_put,
                                        void* may_put_user) {
  if (!srv || !store) return nb_error(NB_ERR_INVALID, "artifact put service: NULL argument");
  nb__put_svc_t* svc = NULL;
  NB_CHECK(nb_calloc((void**)&svc, 1, sizeof *svc, "artifact put service"));
  svc->store = store;
  svc->max_bytes = max_bytes ? max_bytes : NB_ARTIFACT_PUT_MAX_DEFAULT;
  svc->may_put = may_put;
  svc->may_put_user = may_put_user;
  /* kept with the store, as the other services are (the handler holds a pointer to it) */
  nb__svc_t* keep = NULL;
  nb_status_t st = nb_calloc((void**)&keep, 1, sizeof *keep, "artifact put service");
  if (st != NB_OK) {
    nb_free(svc);
    return st;
  }
  keep->put = svc;
  pthread_mutex_lock(&store->mu);
  keep->next = store->svcs;
  store->svcs = keep;
  pthread_mutex_unlock(&store->mu);
  NB_CHECK(nb_rpc_server_add_method(srv, NB__M_PUT, NB_RPC_CLIENT_STREAMING, nb__h_put, svc));
  return nb_rpc_server_add_method(srv, NB__M_LIST, NB_RPC_UNARY, nb__h_list, svc);
}

nb_status_t nb_artifact_copy_out(nb_artifact_store_t* store, const char* name_or_hash,
                                 const char* owner, const char* dest, nb_artifact_info_t* out) {
  if (!store || !name_or_hash || !owner || !owner[0] || !dest)
    return nb_error(NB_ERR_INVALID, "artifact copy: NULL argument");
  nb_artifact_job_t* j = NULL;
  NB_CHECK(nb_calloc((void**)&j, 1, sizeof *j, "artifact job"));
  snprintf(j->owner, sizeof j->owner, "%s", owner);
  snprintf(j->files[0], sizeof j->files[0], "%s", name_or_hash);
  j->n_files = 1;
  nb_artifact_info_t info;
  nb_status_t st = nb__lookup_for(store, name_or_hash, j, "", &info);
  nb_free(j);
  if (st == NB_ERR_NOT_FOUND && !strncmp(name_or_hash, "sha256:", 7))
    return nb_error(NB_ERR_NOT_FOUND, "no artifact %.80s of user '%s' in this store", name_or_hash,
                    owner);
  NB_CHECK(st);
  char part[PATH_MAX], hex[NB_ARTIFACT_HASH_HEX];
  if (snprintf(part, sizeof part, "%s.part", dest) >= (int)sizeof part)
    return nb_error(NB_ERR_INVALID, "artifact copy: %s is too long", dest);
  int in = open(info.path, O_RDONLY | O_CLOEXEC);
  if (in < 0) return nb_error(NB_ERR_IO, "artifact object %s: %s", info.path, strerror(errno));
  unlink(part);
  int fd = open(part, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  uint64_t total = 0;
  if (fd < 0) {
    st = nb_error(NB_ERR_IO, "creating %s: %s", part, strerror(errno));
    goto out;
  }
  NB_CHECK_GOTO(nb__copy_hashing(in, info.path, fd, part, hex, &total), st, out);
  if (total != info.size || strcmp(hex, info.sha256) != 0) {
    NB_WARN("artifact object %s does not hold sha256:%s: the store is damaged; put the file again",
            info.path, info.sha256);
    st = nb_error(NB_ERR_INTEGRITY, "artifact '%s' (sha256:%s) is damaged in this store", info.name,
                  info.sha256);
    goto out;
  }
  if (fsync(fd) != 0) {
    st = nb_error(NB_ERR_IO, "fsync of %s: %s", part, strerror(errno));
    goto out;
  }
  if (close(fd) != 0) {
    fd = -1;
    st = nb_error(NB_ERR_IO, "closing %s: %s", part, strerror(errno));
    goto out;
  }
  fd = -1;
  if (rename(part, dest) != 0) {
    st = nb_error(NB_ERR_IO, "rename %s -> %s: %s", part, dest, strerror(errno));
    goto out;
  }
  NB_CHECK_GOTO(nb__fsync_parent(dest), st, out);
  if (out) *out = info;
out:
  if (fd >= 0) close(fd);
  if (st != NB_OK) unlink(part);
  close(in);
  return st;
}

/* ------------------------------------------------------------------ client */

typedef struct {
  const nb_artifact_fetch_opts_t* o;
  const char* self;    /* our cluster id */
  int64_t deadline_ns; /* 0: none */
  char part[PATH_MAX];
} nb__fetch_t;

static int64_t nb__left_ms(const nb__fetch_t* f) {
  if (!f->deadline_ns) return NB_RPC_INFINITE;
  int64_t l = (f->deadline_ns - nb_now_ns()) / 1000000;
  return l > 0 ? l : 0;
}

static nb_status_t nb__connect(const nb__fetch_t* f, nb_rpc_client_t** cli) {
  nb_rpc_client_opts_t co = {0};
  co.tls = f->o->tls;
  co.expected_cluster = f->o->expected_cluster;
  co.server_name = f->o->server_name;
  NB_CHECK(nb_rpc_client_create(f->o->target, &co, cli));
  int64_t wait = nb_param_ArtifactConnectMs(), left = nb__left_ms(f);
  if (left != NB_RPC_INFINITE && left < wait) wait = left;
  if (nb_rpc_client_wait_ready(*cli, wait) != NB_OK) {
    /* A refused certificate looks like a channel that never connects: one call without
     * wait-for-ready tells the TLS verdict (PERMISSION) from an absent peer. */
    nb_rpc_msg_t m = {0};
    nb_status_t why = nb_rpc_unary(*cli, NB__M_RESOLVE, "", 0, &m, 2000, 0);
    nb_rpc_msg_release(&m);
    if (why != NB_ERR_PERMISSION && why != NB_ERR_UNAVAILABLE && why != NB_ERR_TIMEOUT)
      return NB_OK; /* the server answered after all (an empty request is refused as INVALID) */
    nb_rpc_client_destroy(*cli);
    *cli = NULL;
    if (why == NB_ERR_PERMISSION)
      return nb_error_wrap(why, "artifact fetch: %s refused the TLS handshake", f->o->target);
    if (nb__left_ms(f) == 0)
      return nb_error(NB_ERR_TIMEOUT, "artifact fetch from %s: timed out connecting", f->o->target);
    return nb_error(NB_ERR_UNAVAILABLE, "artifact fetch: cannot connect to %s within %lld ms",
                    f->o->target, (long long)wait);
  }
  return NB_OK;
}

static nb_status_t nb__resolve(const nb__fetch_t* f, nb_rpc_client_t* cli,
                               nb_artifact_info_t* info) {
  Nebula__V1__ResolveRequest req = NEBULA__V1__RESOLVE_REQUEST__INIT;
  req.name = (char*)f->o->name;
  req.job_id = (char*)f->o->job_id;
  Nebula__V1__ArtifactInfo* rep = NULL;
  NB_CHECK(nb_rpc_unary_pb(cli, NB__M_RESOLVE, &req.base, &nebula__v1__artifact_info__descriptor,
                           (ProtobufCMessage**)&rep, nb__left_ms(f), NB_RPC_WAIT_FOR_READY));
  memset(info, 0, sizeof *info);
  nb_status_t st = nb__hash_check(rep->sha256, info->sha256);
  if (st == NB_OK) {
    snprintf(info->name, sizeof info->name, "%s", rep->name);
    info->size = rep->size;
    snprintf(info->path, sizeof info->path, "%s", f->o->dest);
  } else {
    st = nb_error_wrap(NB_ERR_REMOTE, "Resolve of '%s' at %s", f->o->name, f->o->target);
  }
  protobuf_c_message_free_unpacked(&rep->base, NULL);
  return st;
}

/* One Fetch call from the current end of the .part file. *start: where it began; *moved: bytes
 * written. */
static nb_status_t nb__fetch_once(const nb__fetch_t* f, nb_rpc_client_t* cli,
                                  const nb_artifact_info_t* info, uint64_t* start,
                                  uint64_t* moved) {
  nb_status_t st = NB_OK;
  nb_rpc_stream_t* s = NULL;
  nb__artifact_rx_t rx = {.secret = f->o->secret, .job_id = f->o->job_id, .self = f->self};
  memcpy(rx.sha256, info->sha256, sizeof rx.sha256);
  rx.size = info->size;
  int fd = open(f->part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return nb_error(NB_ERR_IO, "opening %s: %s", f->part, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    st = nb_error(NB_ERR_IO, "stat of %s: %s", f->part, strerror(errno));
    goto out;
  }
  rx.off = (uint64_t)sb.st_size;
  if (rx.off > info->size) { /* not a prefix of this artifact */
    if (ftruncate(fd, 0) != 0) {
      st = nb_error(NB_ERR_IO, "truncating %s: %s", f->part, strerror(errno));
      goto out;
    }
    rx.off = 0;
  }
  *start = rx.off;
  if (rx.off == info->size) goto out; /* nothing left to move */
  if (rx.off)
    NB_INFO(JOB, "resuming %s at %llu of %llu bytes", f->part, (unsigned long long)rx.off,
            (unsigned long long)info->size);
  Nebula__V1__FetchRequest req = NEBULA__V1__FETCH_REQUEST__INIT;
  req.job_id = (char*)f->o->job_id;
  req.sha256 = (char*)info->sha256;
  req.offset = rx.off;
  NB_CHECK_GOTO(nb_rpc_stream_open(cli, NB__M_FETCH, nb__left_ms(f), 0, &s), st, out);
  NB_CHECK_GOTO(nb_rpc_stream_send_pb(s, &req.base), st, out);
  NB_CHECK_GOTO(nb_rpc_stream_close_send(s), st, out);
  for (;;) {
    nb_rpc_msg_t msg = {0};
    int end = 0;
    NB_CHECK_GOTO(nb_rpc_stream_recv(s, &msg, &end, NB_RPC_INFINITE), st, out);
    if (end) break;
    const uint8_t* plain = NULL;
    size_t pl = 0;
    uint64_t at = 0;
    st = nb__artifact_rx_chunk(&rx, msg.data, msg.len, &plain, &pl, &at);
    nb_rpc_msg_release(&msg);
    if (st == NB_ERR_INTEGRITY)
      st = nb_error_wrap(st, "artifact '%s' from %s (wrong job secret?)", f->o->name, f->o->target);
    if (st == NB_OK) st = nb__write_all(fd, plain, pl, at, f->part);
    if (st != NB_OK) goto out;
    *moved += pl;
    if (f->o->account) atomic_fetch_add(&f->o->account->received, (uint64_t)pl);
  }
  if (rx.off != info->size)
    st = nb_error(NB_ERR_UNAVAILABLE, "artifact stream from %s ended at %llu of %llu bytes",
                  f->o->target, (unsigned long long)rx.off, (unsigned long long)info->size);
out:
  if (st == NB_OK && fsync(fd) != 0)
    st = nb_error(NB_ERR_IO, "fsync of %s: %s", f->part, strerror(errno));
  close(fd);
  if (s) {
    if (st == NB_OK) st = nb_rpc_stream_finish(s);
    nb_rpc_stream_destroy(s);
  }
  nb__artifact_rx_clear(&rx);
  return st;
}

/* Hash of an existing file, or NB_ERR_NOT_FOUND. */
static nb_status_t nb__file_hash(const char* path, char hex[NB_ARTIFACT_HASH_HEX], uint64_t* size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? NB_ERR_NOT_FOUND
                           : nb_error(NB_ERR_IO, "opening %s: %s", path, strerror(errno));
  nb_status_t st = nb__hash_fd(fd, path, hex, size);
  close(fd);
  return st;
}

static int nb__retryable(nb_status_t st) {
  return st == NB_ERR_UNAVAILABLE || st == NB_ERR_CANCELLED || st == NB_ERR_RPC;
}

nb_status_t nb_artifact_fetch(const nb_artifact_fetch_opts_t* opts, nb_artifact_info_t* out) {
  if (!opts || !opts->target || !opts->tls || !opts->job_id || !*opts->job_id || !opts->secret ||
      !opts->name || !opts->dest || !*opts->dest)
    return nb_error(NB_ERR_INVALID,
                    "artifact fetch: target, tls, job_id, secret, name and "
                    "dest are required");
  if (strncmp(opts->name, "sha256:", 7)) NB_CHECK(nb_artifact_name_check(opts->name));
  nb__fetch_t f = {.o = opts};
  const nb_tls_peer_t* self = nb_tls_self(opts->tls);
  if (!self || self->kind != NB_TLS_PEER_CLUSTER)
    return nb_error(NB_ERR_INVALID, "artifact fetch needs a cluster certificate");
  f.self = self->name;
  if (opts->timeout_ms > 0) f.deadline_ns = nb_now_ns() + opts->timeout_ms * 1000000;
  int n = snprintf(f.part, sizeof f.part, "%s.part", opts->dest);
  if (n < 0 || (size_t)n >= sizeof f.part)
    return nb_error(NB_ERR_INVALID, "artifact destination '%s' is too long", opts->dest);

  nb_artifact_info_t info;
  nb_rpc_client_t* cli = NULL;
  nb_status_t st = nb__connect(&f, &cli);
  if (st == NB_OK) st = nb__resolve(&f, cli, &info);
  if (st != NB_OK) goto out;

  char have[NB_ARTIFACT_HASH_HEX];
  uint64_t have_size = 0;
  struct stat sb;
  if (stat(opts->dest, &sb) == 0 && (uint64_t)sb.st_size == info.size &&
      nb__file_hash(opts->dest, have, &have_size) == NB_OK && !strcmp(have, info.sha256)) {
    NB_INFO(JOB, "%s already holds sha256:%s: not fetched again", opts->dest, info.sha256);
    goto done;
  }

  int retries = (int)nb_param_ArtifactRetries(), fresh = 0;
  int64_t backoff_ms = 100;
  for (int attempt = 0;; attempt++) {
    uint64_t moved = 0, start = 0;
    if (!cli) st = nb__connect(&f, &cli);
    if (st == NB_OK) st = nb__fetch_once(&f, cli, &info, &start, &moved);
    if (st == NB_OK) {
      st = nb__file_hash(f.part, have, &have_size);
      if (st == NB_OK && (have_size != info.size || strcmp(have, info.sha256))) {
        /* A stale .part (another content) resumes into a wrong file: start over once. */
        unlink(f.part);
        if (start > 0 && !fresh) {
          NB_WARN("%s did not hash to sha256:%s; fetching it again from the start", f.part,
                  info.sha256);
          fresh = 1;
          continue;
        }
        st = nb_error(NB_ERR_INTEGRITY,
                      "artifact '%s' from %s: SHA-256 of the received %llu bytes is %s, expected "
                      "%s",
                      opts->name, opts->target, (unsigned long long)have_size, have, info.sha256);
      }
      break;
    }
    if (st == NB_ERR_TIMEOUT || (f.deadline_ns && nb__left_ms(&f) == 0)) {
      st = nb_error_wrap(NB_ERR_TIMEOUT, "artifact fetch of '%s'", opts->name);
      break;
    }
    if (!nb__retryable(st) || attempt >= retries) {
      if (nb__retryable(st))
        st = nb_error_wrap(NB_ERR_UNAVAILABLE, "after %d attempts", attempt + 1);
      break;
    }
    NB_WARN("artifact fetch of '%s' from %s dropped (%s); resuming in %lld ms", opts->name,
            opts->target, nb_error_last(), (long long)backoff_ms);
    nb_rpc_client_destroy(cli);
    cli = NULL;
    nb_sleep_ns(backoff_ms * 1000000);
    if (backoff_ms < 2000) backoff_ms *= 2;
    st = NB_OK;
  }
  if (st != NB_OK) goto out;
  if (rename(f.part, opts->dest) != 0) {
    st = nb_error(NB_ERR_IO, "rename %s -> %s: %s", f.part, opts->dest, strerror(errno));
    goto out;
  }
  NB_CHECK_GOTO(nb__fsync_parent(opts->dest), st, out);
done:
  if (out) *out = info;
out:
  nb_rpc_client_destroy(cli);
  return st;
}

/* ------------------------------------------------------------------ upload (Put's client) */

nb_status_t nb_artifact_upload(const nb_artifact_upload_opts_t* o, nb_artifact_info_t* out) {
  if (!o || !o->target || !o->tls || !o->file || !o->name)
    return nb_error(NB_ERR_INVALID, "artifact upload: NULL argument");
  int fd = open(o->file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nb_error(NB_ERR_IO, "cannot open %s: %s", o->file, strerror(errno));
  char hex[NB_ARTIFACT_HASH_HEX];
  uint64_t size = 0;
  nb_rpc_client_t* cli = NULL;
  nb_rpc_stream_t* s = NULL;
  uint8_t* buf = NULL;
  nb_status_t st;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = nb_error(NB_ERR_IO, "%s is not a regular file", o->file);
    goto out;
  }
  NB_CHECK_GOTO(nb__hash_fd(fd, o->file, hex, &size), st, out);
  NB_CHECK_GOTO(nb_alloc((void**)&buf, 1, NB__IO_BUF, "upload buffer"), st, out);
  nb_rpc_client_opts_t co = {0};
  co.tls = o->tls;
  co.server_name = o->server_name;
  NB_CHECK_GOTO(nb_rpc_client_create(o->target, &co, &cli), st, out);
  NB_CHECK_GOTO(nb_rpc_stream_open(cli, NB__M_PUT,
                                   o->timeout_ms > 0 ? o->timeout_ms : NB_RPC_INFINITE, 0, &s),
                st, out);
  uint64_t off = 0;
  do {
    size_t want = size - off < NB__IO_BUF ? (size_t)(size - off) : NB__IO_BUF, got = 0;
    while (got < want) {
      ssize_t r = pread(fd, buf + got, want - got, (off_t)(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        st = nb_error(NB_ERR_IO, "reading %s: %s", o->file, r < 0 ? strerror(errno) : "shrank");
        goto out;
      }
      got += (size_t)r;
    }
    Nebula__V1__PutChunk m = NEBULA__V1__PUT_CHUNK__INIT;
    if (off == 0) {
      m.name = (char*)o->name;
      m.size = size;
      m.sha256 = hex;
    }
    m.data.data = buf;
    m.data.len = got;
    NB_CHECK_GOTO(nb_rpc_stream_send_pb(s, &m.base), st, fail_call);
    off += got;
  } while (off < size);
  NB_CHECK_GOTO(nb_rpc_stream_close_send(s), st, fail_call);
  Nebula__V1__ArtifactInfo* r = NULL;
  int end = 0;
  st = nb_rpc_stream_recv_pb(s, &nebula__v1__artifact_info__descriptor, (ProtobufCMessage**)&r,
                             &end, NB_RPC_INFINITE);
  if (st == NB_OK && (end || !r)) st = nb_rpc_stream_finish(s);
  if (st == NB_OK && !r) st = nb_error(NB_ERR_RPC, "Put: no reply");
  if (st != NB_OK) goto fail_call;
  if (out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", r->name ? r->name : "");
    snprintf(out->sha256, sizeof out->sha256, "%s", r->sha256 ? r->sha256 : "");
    out->size = r->size;
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  st = nb_rpc_stream_finish(s);
  goto out;
fail_call:
  /* a send that failed: the server's status says why (its refusal, not "stream broken") */
  if (s) {
    nb_status_t fs = nb_rpc_stream_finish(s);
    if (fs != NB_OK) st = fs;
  }
out:
  nb_rpc_stream_destroy(s);
  nb_rpc_client_destroy(cli);
  nb_free(buf);
  close(fd);
  return st;
}

nb_status_t nb_artifact_list(const nb_artifact_upload_opts_t* o, const char* prefix,
                             nb_artifact_info_t** out, size_t* n, int* truncated) {
  if (!o || !o->target || !o->tls || !out || !n)
    return nb_error(NB_ERR_INVALID, "artifact list: NULL argument");
  *out = NULL;
  *n = 0;
  if (truncated) *truncated = 0;
  nb_rpc_client_t* cli = NULL;
  nb_rpc_client_opts_t co = {0};
  co.tls = o->tls;
  co.server_name = o->server_name;
  NB_CHECK(nb_rpc_client_create(o->target, &co, &cli));
  Nebula__V1__ListArtifactsRequest req = NEBULA__V1__LIST_ARTIFACTS_REQUEST__INIT;
  req.prefix = (char*)(prefix ? prefix : "");
  ProtobufCMessage* rep = NULL;
  nb_status_t st =
      nb_rpc_unary_pb(cli, NB__M_LIST, &req.base, &nebula__v1__artifact_list__descriptor, &rep,
                      o->timeout_ms > 0 ? o->timeout_ms : NB_RPC_INFINITE, 0);
  if (st == NB_OK) {
    Nebula__V1__ArtifactList* r = (Nebula__V1__ArtifactList*)rep;
    nb_artifact_info_t* a = NULL;
    if (r->n_artifacts) st = nb_calloc((void**)&a, r->n_artifacts, sizeof *a, "artifact list");
    for (size_t i = 0; st == NB_OK && i < r->n_artifacts; i++) {
      snprintf(a[i].name, sizeof a[i].name, "%s", r->artifacts[i]->name);
      snprintf(a[i].sha256, sizeof a[i].sha256, "%s", r->artifacts[i]->sha256);
      a[i].size = r->artifacts[i]->size;
    }
    if (st == NB_OK) {
      *out = a;
      *n = r->n_artifacts;
      if (truncated) *truncated = r->truncated;
    }
  }
  if (rep) protobuf_c_message_free_unpacked(rep, NULL);
  nb_rpc_client_destroy(cli);
  return st;
}
