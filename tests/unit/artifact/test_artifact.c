/* gateway/artifact: the store (put, lookup, dedupe, bad names, reopen) and fetches from a real
 * mutual-TLS server on 127.0.0.1:0 with certificates from security/pki: byte-identical copies,
 * resume after the server stopped mid-transfer, a wrong job secret, a refused cluster, unknown
 * names and jobs, and a damaged object on the server. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "gateway/artifact.h"
#include "gateway/artifact_internal.h"
#include "nebula/v1/artifact.pb-c.h"
#include "security/seal.h"
#include "tests/unit/link/certs.h"

#define JOB "job-1"
/* Real-time bound on waiting for a transfer to get somewhere: only a hang reaches it. */
#define HANG_NS (30 * 1000000000LL)
static char g_dir[256];
static const char* const g_ids[] = {"dc-a", "dc-b", "dc-c"};
static nb_tls_t *g_tls_a, *g_tls_b, *g_tls_c;
static uint8_t g_secret[32];

/* The gateway's answer: job-1 involves dc-a and dc-b; no other job exists. */
/* The jobs the server knows: JOB of alice (base "pre/final.safetensors"), job-4 of alice (no
 * base), job-5 of alice naming bob's model as its base, job-b of bob. dc-b takes part in each. */
static nb_status_t job_of(void* user, const char* job_id, const char* peer,
                          nb_artifact_job_t* out) {
  (void)user;
  static const struct {
    const char *id, *owner, *base;
  } jobs[] = {{JOB, "alice", "pre/final.safetensors"},
              {"job-4", "alice", ""},
              {"job-5", "alice", "bob/secret/final.safetensors"},
              {"job-b", "bob", ""}};
  for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
    if (strcmp(job_id, jobs[i].id)) continue;
    if (strcmp(peer, "dc-b")) return nb_error(NB_ERR_PERMISSION, "'%s' is not in the job", peer);
    memcpy(out->secret, g_secret, 32);
    snprintf(out->owner, sizeof out->owner, "%s", jobs[i].owner);
    snprintf(out->base, sizeof out->base, "%s", jobs[i].base);
    return NB_OK;
  }
  return nb_error(NB_ERR_NOT_FOUND, "no job '%s'", job_id);
}

static int rm_one(const char* p, const struct stat* sb, int f, struct FTW* ftw) {
  (void)sb, (void)f, (void)ftw;
  return remove(p);
}

static void path_of(char* buf, size_t n, const char* rel) {
  snprintf(buf, n, "%s/%s", g_dir, rel);
}

/* Writes n pseudo-random bytes (seeded) to dir/rel. */
static void write_file(const char* rel, size_t n, unsigned seed) {
  char p[512];
  path_of(p, sizeof p, rel);
  FILE* f = fopen(p, "wb");
  assert_non_null(f);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    fputc((int)(x & 0xff), f);
  }
  assert_int_equal(fclose(f), 0);
}

static uint8_t* slurp(const char* path, size_t* n) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t* b = malloc((size_t)len + 1);
  assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void assert_same_file(const char* a, const char* b) {
  size_t na = 0, nb = 0;
  uint8_t* x = slurp(a, &na);
  uint8_t* y = slurp(b, &nb);
  assert_non_null(x);
  assert_non_null(y);
  assert_int_equal(na, nb);
  assert_memory_equal(x, y, na);
  free(x);
  free(y);
}

static void sha256_hex(const char* path, char hex[65]) {
  size_t n = 0;
  uint8_t* b = slurp(path, &n);
  assert_non_null(b);
  uint8_t d[32];
  unsigned dl = 0;
  assert_int_equal(EVP_Digest(b, n, d, &dl, EVP_sha256(), NULL), 1);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
  free(b);
}

static off_t file_size(const char* path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? sb.st_size : -1;
}

/* Waits until `path` holds at least `bytes` (or HANG_NS pass); returns its size then. */
static off_t wait_size(const char* path, off_t bytes) {
  int64_t end = nb_now_ns() + HANG_NS;
  while (file_size(path) < bytes && nb_now_ns() < end) nb_sleep_ns(2 * 1000000);
  return file_size(path);
}

static void set_params(const char* chunk_kib, const char* rate, const char* retries) {
  if (chunk_kib)
    setenv("NB_ARTIFACT_CHUNK_KIB", chunk_kib, 1);
  else
    unsetenv("NB_ARTIFACT_CHUNK_KIB");
  if (rate)
    setenv("NB_ARTIFACT_RATE_MBPS", rate, 1);
  else
    unsetenv("NB_ARTIFACT_RATE_MBPS");
  if (retries)
    setenv("NB_ARTIFACT_RETRIES", retries, 1);
  else
    unsetenv("NB_ARTIFACT_RETRIES");
  setenv("NB_ARTIFACT_CONNECT_MS", "10000", 1);
  nb_param_reset_all();
}

static int setup(void** state) {
  (void)state;
  const char* t = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/nb_art.XXXXXX", t && *t ? t : "/tmp");
  assert_non_null(mkdtemp(g_dir));
  assert_int_equal(nb_test_certs_make(g_dir, g_ids, 3), 0);
  g_tls_a = nb_test_tls_load(g_dir, "dc-a");
  g_tls_b = nb_test_tls_load(g_dir, "dc-b");
  g_tls_c = nb_test_tls_load(g_dir, "dc-c");
  assert_non_null(g_tls_a);
  assert_non_null(g_tls_b);
  assert_non_null(g_tls_c);
  assert_int_equal(nb_seal_secret_generate(g_secret), NB_OK);
  return 0;
}

static int teardown(void** state) {
  (void)state;
  nb_tls_destroy(g_tls_a);
  nb_tls_destroy(g_tls_b);
  nb_tls_destroy(g_tls_c);
  nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

/* ------------------------------------------------------------------ store */

static void test_store(void** state) {
  (void)state;
  char sdir[512], src[512], hex[65];
  path_of(sdir, sizeof sdir, "store-s");
  nb_artifact_store_t* s = NULL;
  assert_int_equal(nb_artifact_store_open(sdir, &s), NB_OK);
  write_file("s1.bin", 100000, 1);
  write_file("s2.bin", 5000, 2);
  path_of(src, sizeof src, "s1.bin");
  sha256_hex(src, hex);

  nb_artifact_info_t a, b, c;
  assert_int_equal(nb_artifact_put(s, "job-1/ckpt.bin", NULL, NULL, src, &a), NB_OK);
  assert_string_equal(a.sha256, hex);
  assert_int_equal(a.size, 100000);
  assert_same_file(a.path, src);
  /* the same content under another name is kept once */
  assert_int_equal(nb_artifact_put(s, "job-1/copy.bin", NULL, NULL, src, &b), NB_OK);
  assert_string_equal(b.path, a.path);
  char odir[600];
  snprintf(odir, sizeof odir, "%s/objects/%.2s", sdir, hex);
  int files = 0;
  DIR* d = opendir(odir);
  assert_non_null(d);
  for (struct dirent* e; (e = readdir(d));) files += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(files, 1);
  /* by name and by hash (upper-case hex accepted) */
  assert_int_equal(nb_artifact_lookup(s, "job-1/copy.bin", &c), NB_OK);
  assert_string_equal(c.sha256, hex);
  assert_int_equal(c.size, 100000);
  char key[80];
  snprintf(key, sizeof key, "sha256:%s", hex);
  for (char* p = key + 7; *p; p++)
    if (*p >= 'a' && *p <= 'f') *p = (char)(*p - 'a' + 'A');
  assert_int_equal(nb_artifact_lookup(s, key, &c), NB_OK);
  assert_string_equal(c.sha256, hex);
  assert_string_equal(c.name, "job-1/ckpt.bin");
  /* a name given again points to the new content */
  path_of(src, sizeof src, "s2.bin");
  assert_int_equal(nb_artifact_put(s, "job-1/copy.bin", NULL, NULL, src, &b), NB_OK);
  assert_int_equal(nb_artifact_lookup(s, "job-1/copy.bin", &c), NB_OK);
  assert_int_equal(c.size, 5000);
  assert_string_not_equal(c.sha256, hex);
  /* an empty file is an artifact too */
  write_file("empty.bin", 0, 3);
  path_of(src, sizeof src, "empty.bin");
  assert_int_equal(nb_artifact_put(s, "job-1/empty", NULL, NULL, src, &c), NB_OK);
  assert_string_equal(c.sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");

  /* bad names */
  char longname[400];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  const char* bad[] = {"",
                       "/etc/passwd",
                       "job/../x",
                       "..",
                       "job/./x",
                       "job//x",
                       "job/",
                       "a\x01"
                       "b",
                       "a\\b",
                       "sha256:abc",
                       longname};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(nb_artifact_put(s, bad[i], NULL, NULL, src, NULL), NB_ERR_INVALID);
    assert_true(strlen(nb_error_last()) > 0);
  }
  assert_int_equal(nb_artifact_put(s, NULL, NULL, NULL, src, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_artifact_lookup(s, "job/../x", &c), NB_ERR_INVALID);
  assert_int_equal(nb_artifact_lookup(s, "sha256:xyz", &c), NB_ERR_INVALID);
  /* unknown name, unknown hash, missing source */
  assert_int_equal(nb_artifact_lookup(s, "job-1/nope", &c), NB_ERR_NOT_FOUND);
  assert_int_equal(
      nb_artifact_lookup(
          s, "sha256:0000000000000000000000000000000000000000000000000000000000000000", &c),
      NB_ERR_NOT_FOUND);
  path_of(src, sizeof src, "no-such-file");
  assert_int_equal(nb_artifact_put(s, "job-1/x", NULL, NULL, src, NULL), NB_ERR_IO);
  assert_non_null(strstr(nb_error_last(), "no-such-file"));
  nb_artifact_store_close(s);
  /* temp folder is left empty, and names survive a reopen */
  char tdir[600];
  snprintf(tdir, sizeof tdir, "%s/tmp", sdir);
  d = opendir(tdir);
  assert_non_null(d);
  files = 0;
  for (struct dirent* e; (e = readdir(d));) files += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(files, 0);
  assert_int_equal(nb_artifact_store_open(sdir, &s), NB_OK);
  assert_int_equal(nb_artifact_lookup(s, "job-1/ckpt.bin", &c), NB_OK);
  assert_string_equal(c.sha256, hex);
  nb_artifact_store_close(s);
  assert_int_equal(nb_artifact_store_open(NULL, &s), NB_ERR_INVALID);
}

/* ------------------------------------------------------------------ service */

typedef struct {
  nb_artifact_store_t* store;
  nb_rpc_server_t* srv;
  char target[64];
} server_t;

static void server_start(server_t* sv, const char* store_rel) {
  char sdir[512];
  path_of(sdir, sizeof sdir, store_rel);
  if (!sv->store) assert_int_equal(nb_artifact_store_open(sdir, &sv->store), NB_OK);
  nb_rpc_server_opts_t o = {.listen = "127.0.0.1:0", .tls = g_tls_a};
  assert_int_equal(nb_rpc_server_create(&o, &sv->srv), NB_OK);
  assert_int_equal(nb_artifact_service_add(sv->srv, sv->store, job_of, NULL), NB_OK);
  assert_int_equal(nb_artifact_service_add(sv->srv, sv->store, job_of, NULL), NB_ERR_EXISTS);
  assert_int_equal(nb_rpc_server_start(sv->srv), NB_OK);
  snprintf(sv->target, sizeof sv->target, "127.0.0.1:%d", nb_rpc_server_port(sv->srv));
}

static void server_stop(server_t* sv) {
  nb_rpc_server_destroy(sv->srv);
  sv->srv = NULL;
}

static nb_artifact_fetch_opts_t fetch_opts(const server_t* sv, const nb_tls_t* tls,
                                           const char* name, const char* dest) {
  nb_artifact_fetch_opts_t o = {.target = sv->target,
                                .tls = tls,
                                .expected_cluster = "dc-a",
                                .job_id = JOB,
                                .secret = g_secret,
                                .name = name,
                                .dest = dest,
                                .timeout_ms = 20000};
  return o;
}

static void test_fetch(void** state) {
  (void)state;
  set_params("256", NULL, NULL);
  server_t sv = {0};
  server_start(&sv, "store-f");
  char src[512], dest[512], part[600];
  write_file("f.bin", 3 * 1024 * 1024 + 123, 4);
  path_of(src, sizeof src, "f.bin");
  nb_artifact_info_t put;
  assert_int_equal(
      nb_artifact_put(sv.store, "alice/job-1/model.safetensors", "alice", JOB, src, &put), NB_OK);

  path_of(dest, sizeof dest, "fetched.bin");
  nb_artifact_fetch_opts_t o = fetch_opts(&sv, g_tls_b, "job-1/model.safetensors", dest);
  nb_artifact_info_t got;
  uint64_t s0 = nb_artifact_sent_bytes();
  int64_t t0 = nb_now_ns();
  assert_int_equal(nb_artifact_fetch(&o, &got), NB_OK);
  double secs = (double)(nb_now_ns() - t0) / 1e9;
  print_message(
      "fetched %llu bytes (256 KiB sealed chunks, mTLS, loopback) in %.3f s: %.1f MB/s "
      "including connect, resolve and the final SHA-256\n",
      (unsigned long long)put.size, secs, (double)put.size / secs / 1e6);
  assert_same_file(dest, src);
  assert_string_equal(got.sha256, put.sha256);
  assert_int_equal(got.size, put.size);
  assert_int_equal(nb_artifact_sent_bytes() - s0, put.size);
  snprintf(part, sizeof part, "%s.part", dest);
  assert_int_equal(file_size(part), -1);
  /* the same content already in place is not fetched again */
  s0 = nb_artifact_sent_bytes();
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_OK);
  assert_int_equal(nb_artifact_sent_bytes(), s0);
  /* by hash, and an empty artifact */
  char byhash[80], dest2[512];
  snprintf(byhash, sizeof byhash, "sha256:%s", put.sha256);
  path_of(dest2, sizeof dest2, "byhash.bin");
  o = fetch_opts(&sv, g_tls_b, byhash, dest2);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_OK);
  assert_same_file(dest2, src);
  write_file("empty.bin", 0, 5);
  path_of(src, sizeof src, "empty.bin");
  assert_int_equal(nb_artifact_put(sv.store, "alice/job-1/empty", "alice", JOB, src, NULL), NB_OK);
  path_of(dest2, sizeof dest2, "empty-fetched.bin");
  o = fetch_opts(&sv, g_tls_b, "job-1/empty", dest2);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_OK);
  assert_int_equal(file_size(dest2), 0);

  /* wrong job secret: the first chunk's tag fails; nothing lands at dest */
  uint8_t wrong[32];
  memcpy(wrong, g_secret, 32);
  wrong[7] ^= 1;
  path_of(dest2, sizeof dest2, "wrong.bin");
  o = fetch_opts(&sv, g_tls_b, "job-1/model.safetensors", dest2);
  o.secret = wrong;
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_INTEGRITY);
  assert_int_equal(file_size(dest2), -1);
  /* a cluster outside the job */
  o = fetch_opts(&sv, g_tls_c, "job-1/model.safetensors", dest2);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_PERMISSION);
  assert_non_null(strstr(nb_error_last(), "dc-c"));
  /* unknown name, unknown job */
  o = fetch_opts(&sv, g_tls_b, "job-1/nope", dest2);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  o = fetch_opts(&sv, g_tls_b, "job-1/model.safetensors", dest2);
  o.job_id = "job-9";
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  /* the server must be the expected cluster */
  o = fetch_opts(&sv, g_tls_b, "job-1/model.safetensors", dest2);
  o.expected_cluster = "dc-c";
  o.timeout_ms = 3000;
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_PERMISSION);
  assert_int_equal(file_size(dest2), -1);
  /* bad options */
  o = fetch_opts(&sv, g_tls_b, "../x", dest2);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_INVALID);
  o = fetch_opts(&sv, g_tls_b, "job-1/model.safetensors", NULL);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_INVALID);

  server_stop(&sv);
  nb_artifact_store_close(sv.store);
}

typedef struct {
  nb_artifact_fetch_opts_t o;
  nb_status_t st;
} fetch_job_t;

static void* fetch_thread(void* arg) {
  fetch_job_t* j = arg;
  j->st = nb_artifact_fetch(&j->o, NULL);
  return NULL;
}

static void test_resume(void** state) {
  (void)state;
  /* 64 KiB chunks at 4 Mbit/s (500 kB/s), no reconnect: the stop ends the first fetch. The stop
   * comes once 512 KiB have landed; the other 2.5 MB need 5 s more at the cap, however fast the
   * machine is, so the stop cannot miss the transfer. */
  set_params("64", "4", "0");
  server_t sv = {0};
  server_start(&sv, "store-r");
  const size_t size = 3 * 1024 * 1024 + 777;
  char src[512], dest[512], part[600];
  write_file("r.bin", size, 6);
  path_of(src, sizeof src, "r.bin");
  assert_int_equal(nb_artifact_put(sv.store, "alice/job-1/big", "alice", JOB, src, NULL), NB_OK);
  path_of(dest, sizeof dest, "resumed.bin");
  snprintf(part, sizeof part, "%s.part", dest);

  fetch_job_t j = {.o = fetch_opts(&sv, g_tls_b, "job-1/big", dest)};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, fetch_thread, &j), 0);
  assert_true(wait_size(part, 512 * 1024) >= 512 * 1024);
  server_stop(&sv);
  pthread_join(th, NULL);
  assert_int_equal(j.st, NB_ERR_UNAVAILABLE);
  off_t have = file_size(part);
  print_message("stopped the server with %lld of %zu bytes in %s\n", (long long)have, size,
                "dest.part");
  assert_true(have >= 512 * 1024);
  assert_true((size_t)have < size);
  assert_int_equal(file_size(dest), -1);

  /* restarted (another port, no cap): the second fetch sends only what is missing */
  set_params("64", NULL, "0");
  server_start(&sv, "store-r");
  j.o = fetch_opts(&sv, g_tls_b, "job-1/big", dest);
  uint64_t s0 = nb_artifact_sent_bytes();
  assert_int_equal(nb_artifact_fetch(&j.o, NULL), NB_OK);
  uint64_t resent = nb_artifact_sent_bytes() - s0;
  print_message("resumed: %llu bytes sent the second time of %zu\n", (unsigned long long)resent,
                size);
  assert_int_equal(resent, size - (size_t)have);
  assert_same_file(dest, src);
  assert_int_equal(file_size(part), -1);

  /* a stale .part that is not a prefix of the artifact: caught by the hash, fetched afresh */
  write_file("resumed2.bin.part", 1000, 99);
  path_of(dest, sizeof dest, "resumed2.bin");
  j.o = fetch_opts(&sv, g_tls_b, "job-1/big", dest);
  assert_int_equal(nb_artifact_fetch(&j.o, NULL), NB_OK);
  assert_same_file(dest, src);

  /* with reconnects allowed, a stop and a restart on the same port inside one fetch */
  set_params("64", "8", "20");
  int port = nb_rpc_server_port(sv.srv);
  server_stop(&sv);
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  nb_rpc_server_opts_t so = {.listen = listen, .tls = g_tls_a};
  assert_int_equal(nb_rpc_server_create(&so, &sv.srv), NB_OK);
  assert_int_equal(nb_artifact_service_add(sv.srv, sv.store, job_of, NULL), NB_OK);
  assert_int_equal(nb_rpc_server_start(sv.srv), NB_OK);
  path_of(dest, sizeof dest, "resumed3.bin");
  snprintf(part, sizeof part, "%s.part", dest);
  j.o = fetch_opts(&sv, g_tls_b, "job-1/big", dest);
  s0 = nb_artifact_sent_bytes();
  assert_int_equal(pthread_create(&th, NULL, fetch_thread, &j), 0);
  wait_size(part, 512 * 1024); /* if the fetch ends first, the checks below still hold */
  server_stop(&sv);
  nb_sleep_ns(300 * 1000000); /* a stopped server for a while; any length will do */
  assert_int_equal(nb_rpc_server_create(&so, &sv.srv), NB_OK);
  assert_int_equal(nb_artifact_service_add(sv.srv, sv.store, job_of, NULL), NB_OK);
  assert_int_equal(nb_rpc_server_start(sv.srv), NB_OK);
  pthread_join(th, NULL);
  assert_int_equal(j.st, NB_OK);
  assert_same_file(dest, src);
  resent = nb_artifact_sent_bytes() - s0;
  print_message("one fetch across a restart: %llu bytes sent for %zu\n", (unsigned long long)resent,
                size);
  /* at most the chunks in flight at the stop are sent twice */
  assert_true(resent < size + 8 * 64 * 1024);

  /* a whole-transfer deadline far shorter than the capped transfer (1 Mbit/s: 25 s; a slower
   * machine only makes it longer): NB_ERR_TIMEOUT, .part kept */
  server_stop(&sv);
  set_params("64", "1", "0");
  server_start(&sv, "store-r");
  path_of(dest, sizeof dest, "timeout.bin");
  snprintf(part, sizeof part, "%s.part", dest);
  j.o = fetch_opts(&sv, g_tls_b, "job-1/big", dest);
  j.o.timeout_ms = 5000;
  assert_int_equal(nb_artifact_fetch(&j.o, NULL), NB_ERR_TIMEOUT);
  assert_int_equal(file_size(dest), -1);
  assert_true(file_size(part) > 0);

  server_stop(&sv);
  nb_artifact_store_close(sv.store);
  set_params(NULL, NULL, NULL);
}

/* Who may fetch what: artifacts are owned (user, job) and names are per user. The attacks of the
 * red team, each refused with its message: another user's output by its old-style name, by its
 * full name, by hash; another user's model named as a base; a job of the same user that does not
 * name the model; and two users' jobs of the same name, which no longer share an artifact name. */
/* A store written before names had owners: opening it adds the columns; its names keep their
 * objects (lookup) but belong to nobody, and a put gives a name its owner. */
static void test_store_upgrade(void** state) {
  (void)state;
  char sdir[512], db[600], src[512];
  path_of(sdir, sizeof sdir, "store-old");
  assert_int_equal(mkdir(sdir, 0755), 0);
  snprintf(db, sizeof db, "%s/names.db", sdir);
  sqlite3* h = NULL;
  assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
  assert_int_equal(
      sqlite3_exec(h,
                   "CREATE TABLE names (name TEXT PRIMARY KEY, sha256 TEXT NOT NULL, "
                   "size INTEGER NOT NULL, updated_ns INTEGER NOT NULL);"
                   "INSERT INTO names VALUES('old-job/final.safetensors', "
                   "'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', "
                   "0, 1);",
                   NULL, NULL, NULL),
      SQLITE_OK);
  sqlite3_close(h);
  nb_artifact_store_t* s = NULL;
  assert_int_equal(nb_artifact_store_open(sdir, &s), NB_OK);
  write_file("empty-old", 0, 1);
  path_of(src, sizeof src, "empty-old");
  /* the recorded name's object (the empty file) is put under a new, owned name */
  assert_int_equal(nb_artifact_put(s, "alice/new/final.safetensors", "alice", "job-n", src, NULL),
                   NB_OK);
  nb_artifact_info_t i;
  assert_int_equal(nb_artifact_lookup(s, "old-job/final.safetensors", &i), NB_OK);
  assert_string_equal(i.owner, "");
  assert_int_equal(nb_artifact_lookup(s, "alice/new/final.safetensors", &i), NB_OK);
  assert_string_equal(i.owner, "alice");
  assert_string_equal(i.job, "job-n");
  nb_artifact_store_close(s);
  /* and it opens again */
  assert_int_equal(nb_artifact_store_open(sdir, &s), NB_OK);
  nb_artifact_store_close(s);
}

static void test_entitlement(void** state) {
  (void)state;
  server_t sv = {0};
  server_start(&sv, "store-e");
  char src[512], dest[512], hex_bob[65], hex_alice[65];
  write_file("bob-secret.bin", 40000, 21);
  path_of(src, sizeof src, "bob-secret.bin");
  sha256_hex(src, hex_bob);
  assert_int_equal(
      nb_artifact_put(sv.store, "bob/secret/final.safetensors", "bob", "job-b", src, NULL), NB_OK);
  /* bob's and alice's jobs both named "pre": two names, two owners */
  assert_int_equal(
      nb_artifact_put(sv.store, "bob/pre/final.safetensors", "bob", "job-b", src, NULL), NB_OK);
  write_file("alice-pre.bin", 30000, 22);
  path_of(src, sizeof src, "alice-pre.bin");
  sha256_hex(src, hex_alice);
  assert_int_equal(
      nb_artifact_put(sv.store, "alice/pre/final.safetensors", "alice", "job-p", src, NULL), NB_OK);
  /* a name outside its owner's namespace is refused at put */
  assert_int_equal(
      nb_artifact_put(sv.store, "bob/x/final.safetensors", "alice", "job-p", src, NULL),
      NB_ERR_INVALID);
  path_of(dest, sizeof dest, "ent.bin");
  char key[80];

  /* JOB (alice) asks for bob's output by the name of his job, and by its full name */
  nb_artifact_fetch_opts_t o = fetch_opts(&sv, g_tls_b, "secret/final.safetensors", dest);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  fprintf(stderr, "refused: %s\n", nb_error_last());
  assert_non_null(strstr(
      nb_error_last(), "no artifact 'secret/final.safetensors' in the namespace of user 'alice'"));
  o = fetch_opts(&sv, g_tls_b, "bob/secret/final.safetensors", dest);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  assert_non_null(strstr(nb_error_last(), "other users' artifacts are not served"));
  /* ... and by hash */
  snprintf(key, sizeof key, "sha256:%s", hex_bob);
  o = fetch_opts(&sv, g_tls_b, key, dest);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  fprintf(stderr, "refused: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(), "that job 'job-1' of user 'alice' may fetch here"));
  /* ... and by a Fetch of the hash straight away, without Resolve */
  {
    nb_rpc_client_opts_t co = {0};
    co.tls = g_tls_b;
    nb_rpc_client_t* cli = NULL;
    assert_int_equal(nb_rpc_client_create(sv.target, &co, &cli), NB_OK);
    Nebula__V1__FetchRequest fr = NEBULA__V1__FETCH_REQUEST__INIT;
    fr.job_id = (char*)JOB;
    fr.sha256 = hex_bob;
    uint8_t buf[256];
    size_t len = nebula__v1__fetch_request__pack(&fr, buf);
    nb_rpc_stream_t* fs = NULL;
    assert_int_equal(nb_rpc_stream_open(cli, "/nebula.v1.Artifacts/Fetch", 10000, 0, &fs), NB_OK);
    assert_int_equal(nb_rpc_stream_send(fs, buf, len), NB_OK);
    nb_rpc_msg_t m = {0};
    int end = 0;
    nb_status_t rs = nb_rpc_stream_recv(fs, &m, &end, NB_RPC_INFINITE);
    fprintf(stderr, "Fetch refused: %s\n", nb_error_last());
    assert_int_equal(rs, NB_ERR_NOT_FOUND);
    assert_int_equal(m.len, 0);
    assert_non_null(strstr(nb_error_last(), "that job 'job-1' of user 'alice' may fetch here"));
    nb_rpc_stream_destroy(fs);
    nb_rpc_client_destroy(cli);
  }
  /* job-5 of alice names bob's model as its base: still bob's */
  o = fetch_opts(&sv, g_tls_b, "bob/secret/final.safetensors", dest);
  o.job_id = "job-5";
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  assert_int_equal(file_size(dest), -1);

  /* JOB names "pre/final.safetensors": it gets alice's "pre", never bob's of the same name */
  o = fetch_opts(&sv, g_tls_b, "pre/final.safetensors", dest);
  nb_artifact_info_t got;
  assert_int_equal(nb_artifact_fetch(&o, &got), NB_OK);
  assert_string_equal(got.sha256, hex_alice);
  assert_string_equal(got.name, "alice/pre/final.safetensors");
  unlink(dest);
  /* the full name of one's own artifact works too, and so does the hash */
  o = fetch_opts(&sv, g_tls_b, "alice/pre/final.safetensors", dest);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_OK);
  unlink(dest);
  snprintf(key, sizeof key, "sha256:%s", hex_alice);
  o = fetch_opts(&sv, g_tls_b, key, dest);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_OK);
  unlink(dest);
  /* job-4 of alice does not name it: refused, with the reason */
  o = fetch_opts(&sv, g_tls_b, "pre/final.safetensors", dest);
  o.job_id = "job-4";
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_PERMISSION);
  fprintf(stderr, "refused: %s\n", nb_error_last());
  assert_non_null(strstr(nb_error_last(),
                         "job 'job-4' of user 'alice' may not fetch artifact "
                         "'pre/final.safetensors'"));
  /* bob's own job reads its own output; the hash that alice could not have is fine for bob */
  o = fetch_opts(&sv, g_tls_b, "secret/final.safetensors", dest);
  o.job_id = "job-b";
  assert_int_equal(nb_artifact_fetch(&o, &got), NB_OK);
  assert_string_equal(got.sha256, hex_bob);
  unlink(dest);
  /* a name kept without an owner (before owners were recorded) is served to nobody */
  assert_int_equal(nb_artifact_put(sv.store, "job-1/legacy", NULL, NULL, src, NULL), NB_OK);
  o = fetch_opts(&sv, g_tls_b, "job-1/legacy", dest);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_NOT_FOUND);
  server_stop(&sv);
  nb_artifact_store_close(sv.store);
}

static void test_corrupt(void** state) {
  (void)state;
  set_params("64", NULL, "0");
  server_t sv = {0};
  server_start(&sv, "store-c");
  char src[512], dest[512], part[600];
  write_file("c.bin", 300000, 7);
  path_of(src, sizeof src, "c.bin");
  nb_artifact_info_t put;
  assert_int_equal(nb_artifact_put(sv.store, "alice/job-1/adapter", "alice", JOB, src, &put),
                   NB_OK);
  /* flip one byte of the stored object in place (same size) */
  int fd = open(put.path, O_RDWR);
  assert_true(fd >= 0);
  uint8_t b = 0;
  assert_int_equal(pread(fd, &b, 1, 123456), 1);
  b ^= 0x40;
  assert_int_equal(pwrite(fd, &b, 1, 123456), 1);
  close(fd);
  path_of(dest, sizeof dest, "corrupt.bin");
  snprintf(part, sizeof part, "%s.part", dest);
  nb_artifact_fetch_opts_t o = fetch_opts(&sv, g_tls_b, "job-1/adapter", dest);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_INTEGRITY);
  assert_non_null(strstr(nb_error_last(), "SHA-256"));
  assert_int_equal(file_size(dest), -1);
  assert_int_equal(file_size(part), -1);
  /* a truncated object is refused by the server */
  assert_int_equal(truncate(put.path, 1000), 0);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_ERR_INTEGRITY);
  assert_int_equal(file_size(dest), -1);
  /* putting the file again heals the store */
  assert_int_equal(nb_artifact_put(sv.store, "alice/job-1/adapter", "alice", JOB, src, NULL),
                   NB_OK);
  assert_int_equal(nb_artifact_fetch(&o, NULL), NB_OK);
  assert_same_file(dest, src);
  server_stop(&sv);
  nb_artifact_store_close(sv.store);
  set_params(NULL, NULL, NULL);
}

/* ------------------------------------------------------------------ chunks on the wire */

static void rx_init(nb__artifact_rx_t* rx, const char* self, const char* sha, uint64_t size) {
  memset(rx, 0, sizeof *rx);
  rx->secret = g_secret;
  rx->job_id = JOB;
  rx->self = self;
  snprintf(rx->sha256, sizeof rx->sha256, "%s", sha);
  rx->size = size;
}

/* Every single-byte change and every truncation of a sealed chunk is refused with
 * NB_ERR_INTEGRITY; so are a replay, a chunk out of order, another receiver, another job. */
static void test_chunk_tamper(void** state) {
  (void)state;
  const char* sha = "5d41402abc4b2a76b9719d911017c592aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  enum { N = 700, SIZE = 1400 };
  uint8_t tid[NB__ARTIFACT_TID_BYTES], data[SIZE], buf[N + NB_SEAL_TAG_BYTES];
  uint8_t m0[N + 512], m1[N + 512], bad[N + 512];
  size_t l0 = 0, l1 = 0;
  for (int i = 0; i < SIZE; i++) data[i] = (uint8_t)(i * 7 + 3);
  memset(tid, 0x5a, sizeof tid);
  nb_seal_ctx_t* tx = NULL;
  assert_int_equal(nb__artifact_seal_ctx(g_secret, JOB, tid, "dc-b", 1, &tx), NB_OK);
  memcpy(buf, data, N);
  assert_int_equal(nb__artifact_chunk_pack(tx, tid, sha, SIZE, 0, 0, buf, N, m0, sizeof m0, &l0),
                   NB_OK);
  memcpy(buf, data + N, N);
  assert_int_equal(nb__artifact_chunk_pack(tx, tid, sha, SIZE, N, 1, buf, N, m1, sizeof m1, &l1),
                   NB_OK);
  assert_true(l0 > N + NB_SEAL_TAG_BYTES);
  assert_null(memmem(m0, l0, data, 32)); /* the plaintext is not on the wire */

  nb__artifact_rx_t rx;
  const uint8_t* plain = NULL;
  size_t pl = 0;
  uint64_t at = 0;
  /* the genuine pair, in order */
  rx_init(&rx, "dc-b", sha, SIZE);
  assert_int_equal(nb__artifact_rx_chunk(&rx, m0, l0, &plain, &pl, &at), NB_OK);
  assert_int_equal(pl, N);
  assert_int_equal(at, 0);
  assert_memory_equal(plain, data, N);
  /* a replay of chunk 0 is not the next chunk */
  assert_int_equal(nb__artifact_rx_chunk(&rx, m0, l0, &plain, &pl, &at), NB_ERR_INTEGRITY);
  assert_int_equal(nb__artifact_rx_chunk(&rx, m1, l1, &plain, &pl, &at), NB_OK);
  assert_int_equal(at, N);
  assert_memory_equal(plain, data + N, N);
  assert_int_equal(rx.off, SIZE);
  nb__artifact_rx_clear(&rx);
  /* out of order, another receiver, another job, another object */
  rx_init(&rx, "dc-b", sha, SIZE);
  assert_int_equal(nb__artifact_rx_chunk(&rx, m1, l1, &plain, &pl, &at), NB_ERR_INTEGRITY);
  nb__artifact_rx_clear(&rx);
  rx_init(&rx, "dc-c", sha, SIZE);
  assert_int_equal(nb__artifact_rx_chunk(&rx, m0, l0, &plain, &pl, &at), NB_ERR_INTEGRITY);
  nb__artifact_rx_clear(&rx);
  rx_init(&rx, "dc-b", sha, SIZE);
  rx.job_id = "job-2";
  assert_int_equal(nb__artifact_rx_chunk(&rx, m0, l0, &plain, &pl, &at), NB_ERR_INTEGRITY);
  nb__artifact_rx_clear(&rx);
  rx_init(&rx, "dc-b", "0000000000000000000000000000000000000000000000000000000000000000", SIZE);
  assert_int_equal(nb__artifact_rx_chunk(&rx, m0, l0, &plain, &pl, &at), NB_ERR_INTEGRITY);
  nb__artifact_rx_clear(&rx);
  /* every byte flipped (two ways), every truncation */
  int refused = 0;
  for (size_t i = 0; i < l0; i++)
    for (int k = 0; k < 2; k++) {
      memcpy(bad, m0, l0);
      bad[i] ^= k ? 0x80 : 0x01;
      rx_init(&rx, "dc-b", sha, SIZE);
      nb_status_t st = nb__artifact_rx_chunk(&rx, bad, l0, &plain, &pl, &at);
      if (st != NB_ERR_INTEGRITY) fail_msg("byte %zu ^ %d accepted (%d)", i, k ? 0x80 : 1, st);
      refused++;
      nb__artifact_rx_clear(&rx);
    }
  for (size_t n = 0; n < l0; n++) {
    rx_init(&rx, "dc-b", sha, SIZE);
    assert_int_equal(nb__artifact_rx_chunk(&rx, m0, n, &plain, &pl, &at), NB_ERR_INTEGRITY);
    nb__artifact_rx_clear(&rx);
    refused++;
  }
  print_message("%d tampered or truncated chunks refused\n", refused);
  nb_seal_ctx_destroy(tx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_store),         cmocka_unit_test(test_fetch),
      cmocka_unit_test(test_resume),        cmocka_unit_test(test_corrupt),
      cmocka_unit_test(test_chunk_tamper),  cmocka_unit_test(test_entitlement),
      cmocka_unit_test(test_store_upgrade),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
