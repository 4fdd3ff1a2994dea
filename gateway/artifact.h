/* Artifacts: files (checkpoints, adapters) that move between the gateways of a federation, named
 * by content. A store keeps each file once under its SHA-256 and maps names
 * ("<user>/<job>/<path>") to hashes, each name owned by the user and the job that produced it;
 * the service nebula.v1.Artifacts lets a peer gateway resolve a name and fetch the bytes in
 * chunks sealed with the job's key, resuming a broken transfer where it stopped. It is not a
 * general file server: only what a gateway put in its store can be fetched, only by a cluster
 * the job involves, and only what that job is entitled to (its own outputs, or the base
 * checkpoint it names when the same user owns it). */
#ifndef NB_GATEWAY_ARTIFACT_H
#define NB_GATEWAY_ARTIFACT_H

#include <stdint.h>

#include "common/status.h"
#include "inter/rpc.h"
#include "security/tls.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_ARTIFACT_NAME_MAX 256
#define NB_ARTIFACT_HASH_HEX 65  /* 64 hex digits + NUL */
#define NB_ARTIFACT_ID_MAX 64    /* user names and job ids, NUL included */
#define NB_ARTIFACT_JOB_FILES 16 /* files a job names besides its base (spec.program.files) */
#define NB_ARTIFACT_PUT_MAX_DEFAULT ((uint64_t)256 << 20) /* a Put's size limit by default */

typedef struct nb_artifact_store nb_artifact_store_t;

typedef struct {
  char name[NB_ARTIFACT_NAME_MAX];   /* "<user>/<job-name>/<relative path>" */
  char sha256[NB_ARTIFACT_HASH_HEX]; /* lower-case hex of the content's SHA-256 */
  uint64_t size;                     /* bytes */
  char path[1024];                   /* where the content lies in this store */
  char owner[NB_ARTIFACT_ID_MAX];    /* the user who owns the name; "" = nobody (never served) */
  char job[NB_ARTIFACT_ID_MAX];      /* the job id that produced it; "" = none recorded */
} nb_artifact_info_t;

/* Opens (creating it if needed) the store in dir. out: set on NB_OK; close with
 * nb_artifact_store_close. Returns NB_ERR_INVALID, NB_ERR_IO, NB_ERR_NOMEM. Thread-safe: one
 * store may be used from several threads at once. */
nb_status_t nb_artifact_store_open(const char* dir, nb_artifact_store_t** out);
void nb_artifact_store_close(nb_artifact_store_t* store); /* NULL ok */

/* Adds the content of file under name (hashing it; content already held is kept once; a name
 * given again points to the new content and its new owner and job). The store's copy is complete
 * before the name refers to it (temp + fsync + rename). owner, job: the user and job id that own
 * the name (borrowed); a name of an owner must lie in that owner's namespace ("<owner>/...").
 * NULL or "" for owner: a name nobody owns, which the service never serves. out: may be NULL.
 * Returns NB_ERR_INVALID (bad name: empty, too long, absolute, "..", control characters; a name
 * outside the owner's namespace), NB_ERR_IO, NB_ERR_NOMEM. */
nb_status_t nb_artifact_put(nb_artifact_store_t* store, const char* name, const char* owner,
                            const char* job, const char* file, nb_artifact_info_t* out);

/* Looks up a name, or a content hash written "sha256:<hex>" (the first name holding it, with its
 * owner and job). No entitlement check: that is the service's. Returns NB_ERR_NOT_FOUND. */
nb_status_t nb_artifact_lookup(nb_artifact_store_t* store, const char* name_or_hash,
                               nb_artifact_info_t* out);

/* What the service needs to know of the job a call is for. */
typedef struct {
  uint8_t secret[32];                     /* the job's secret: the key of the transfer */
  char owner[NB_ARTIFACT_ID_MAX];         /* the user who owns the job */
  char base[NB_ARTIFACT_NAME_MAX];        /* the base checkpoint it names ("" = none), as written */
  char base_sha256[NB_ARTIFACT_HASH_HEX]; /* its pinned hash ("" = not pinned) */
  int n_files;                            /* the files of its program (spec.program.files) */
  char files[NB_ARTIFACT_JOB_FILES][NB_ARTIFACT_NAME_MAX]; /* as written: name or sha256:<hex> */
} nb_artifact_job_t;

/* How the service learns about job_id: fills *out if the calling cluster (the verified identity
 * of the peer) takes part in that job; NB_ERR_PERMISSION or NB_ERR_NOT_FOUND otherwise. Called
 * on a handler thread.
 *
 * The job is then entitled to an object only if the object is owned by the job's owner and is
 * either the job's own output (recorded with job_id), its base: named by `base` (taken in the
 * owner's namespace: "<owner>/<base>", or `base` itself when it already starts with
 * "<owner>/"), or with the hash `base_sha256`, or one of its `files` (named the same way, or
 * "sha256:<hex>"). A name is resolved in the owner's namespace
 * first; a name of another user is never served (NB_ERR_NOT_FOUND), nor a hash held only by
 * objects the job is not entitled to. */
typedef nb_status_t (*nb_artifact_job_fn)(void* user, const char* job_id, const char* peer_cluster,
                                          nb_artifact_job_t* out);

/* Adds the methods of nebula.v1.Artifacts (Resolve, Fetch) to srv, before it starts. store and
 * job_user must outlive the server. Returns NB_ERR_INVALID, NB_ERR_EXISTS, NB_ERR_NOMEM. */
nb_status_t nb_artifact_service_add(nb_rpc_server_t* srv, nb_artifact_store_t* store,
                                    nb_artifact_job_fn job_fn, void* job_user);

/* Adds nebula.v1.Artifacts/Put and List to srv, before it starts. List answers a user (the same
 * checks as Put's caller) the names it owns here. Put: a caller with a user certificate puts a
 * file of at most max_bytes (0 = NB_ARTIFACT_PUT_MAX_DEFAULT) into store under
 * "<user>/<name>", owned by that user and no job. The bytes go to a temp file of the store; the
 * name is recorded (nb_artifact_put) only once the announced size and SHA-256 match. A name
 * whose first component is another user that owns names here is refused (PERMISSION_DENIED):
 * a user puts only into its own namespace. may_put (NULL = every user certificate of the CA) is
 * asked first, on the handler thread, whether user `name` may put here at all (NB_OK, else its
 * error reaches the caller as PERMISSION_DENIED). store and may_put_user must outlive the
 * server. Returns
 * NB_ERR_INVALID, NB_ERR_EXISTS, NB_ERR_NOMEM. */
typedef nb_status_t (*nb_artifact_user_fn)(void* user, const char* name);
nb_status_t nb_artifact_put_service_add(nb_rpc_server_t* srv, nb_artifact_store_t* store,
                                        uint64_t max_bytes, nb_artifact_user_fn may_put,
                                        void* may_put_user);

/* Copies an artifact of `owner` out of this store into dest (a job's file taken from its own
 * gateway's store): name_or_hash is looked up in owner's namespace ("<owner>/<name>", or the
 * name itself when it starts with "<owner>/") or as "sha256:<hex>" among owner's names; other
 * users' names are never found. The copy goes to "<dest>.part", its SHA-256 is checked, fsynced
 * and renamed to dest. out: may be NULL. Returns NB_ERR_NOT_FOUND (naming it), NB_ERR_INTEGRITY
 * (the store's object is damaged), NB_ERR_INVALID, NB_ERR_IO. Thread-safe. */
nb_status_t nb_artifact_copy_out(nb_artifact_store_t* store, const char* name_or_hash,
                                 const char* owner, const char* dest, nb_artifact_info_t* out);

typedef struct {
  const char* target;           /* host:port of the peer gateway */
  const nb_tls_t* tls;          /* our cluster's mTLS material (borrowed) */
  const char* expected_cluster; /* the peer must be this cluster; NULL = any from the CA */
  const char* server_name;      /* NULL = the target's host */
  const char* job_id;           /* the job the transfer is for: selects the sealing key */
  const uint8_t* secret;        /* that job's 32-byte secret */
  const char* name;             /* artifact name at the peer, or "sha256:<hex>" */
  const char* dest;             /* final path; a partial "<dest>.part" is resumed */
  int64_t timeout_ms;           /* whole transfer; 0 = no limit */
  nb_artifact_store_t* account; /* NULL, or the bytes received are added to its totals
                                   (nb_artifact_store_bytes); must outlive the fetch */
} nb_artifact_fetch_opts_t;

/* Fetches an artifact from a peer gateway into opts->dest: resolves it, receives sealed
 * chunks (a bad tag is NB_ERR_INTEGRITY, never retried silently), resumes after a dropped
 * connection from the bytes already in "<dest>.part", checks the SHA-256 of the whole file
 * and only then renames it into place. A dest that already holds the same content is not
 * fetched again. out: may be NULL. Returns NB_ERR_NOT_FOUND, NB_ERR_PERMISSION,
 * NB_ERR_INTEGRITY, NB_ERR_UNAVAILABLE, NB_ERR_TIMEOUT, NB_ERR_IO. */
nb_status_t nb_artifact_fetch(const nb_artifact_fetch_opts_t* opts, nb_artifact_info_t* out);

typedef struct {
  const char* target;      /* host:port of the user's own gateway */
  const nb_tls_t* tls;     /* the user's mTLS material (a user certificate; borrowed) */
  const char* server_name; /* NULL = the target's host */
  const char* file;        /* what to put */
  const char* name;        /* in the user's namespace: "train.sh" is "<user>/train.sh" */
  int64_t timeout_ms;      /* whole call; 0 = no limit */
} nb_artifact_upload_opts_t;

/* The client of Artifacts.Put: hashes file, then sends it in 1 MiB chunks with its size and
 * SHA-256; out (may be NULL) gets the name, hash and size the gateway recorded. A file that
 * changes while sent is refused by the gateway (its hash no longer matches). Returns
 * NB_ERR_IO (the file), NB_ERR_PERMISSION (not a user of that gateway, another user's
 * namespace), NB_ERR_INVALID (bad name, over the gateway's size limit), NB_ERR_INTEGRITY,
 * NB_ERR_UNAVAILABLE, NB_ERR_TIMEOUT. */
nb_status_t nb_artifact_upload(const nb_artifact_upload_opts_t* opts, nb_artifact_info_t* out);

/* The client of Artifacts.List: the names of the caller's namespace at its gateway (at most
 * 1000, name order) whose name starts with "<user>/<prefix>" (prefix NULL or "" = all).
 * *out: an array of *n entries (name, sha256, size) the caller frees with nb_free; *truncated:
 * more exist (may be NULL). opts->file and opts->name are not used. Returns
 * NB_ERR_PERMISSION, NB_ERR_UNAVAILABLE, NB_ERR_TIMEOUT, NB_ERR_NOMEM. */
nb_status_t nb_artifact_list(const nb_artifact_upload_opts_t* opts, const char* prefix,
                             nb_artifact_info_t** out, size_t* n, int* truncated);

/* NB_OK when name is a valid artifact name ("<job>/<path>": 1..255 bytes, relative, no empty,
 * "." or ".." component, no control character or backslash, not starting with "sha256:"), else
 * NB_ERR_INVALID naming the problem. Thread-safe. */
nb_status_t nb_artifact_name_check(const char* name);

/* The plaintext bytes this store's services have sent to peer gateways (*sent) and the fetches
 * naming it as their account have received (*received), since it was opened. Either pointer may
 * be NULL; a NULL store gives 0. Thread-safe. */
void nb_artifact_store_bytes(nb_artifact_store_t* store, uint64_t* received, uint64_t* sent);

/* Plaintext bytes that the Artifacts services of this process have sent so far (all servers,
 * all calls): lets tests and benchmarks see how much a resumed transfer re-sent. Thread-safe. */
uint64_t nb_artifact_sent_bytes(void);

#ifdef __cplusplus
}
#endif

#endif /* NB_GATEWAY_ARTIFACT_H */
