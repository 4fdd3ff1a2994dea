/* nb_session_save / nb_session_load through libnebula.so and <nebula.h> only. Two clusters
 * (threads, loopback) run 3 rounds, each saves its state, and 2 more rounds give the hashes to
 * reach; then two new sessions (other starting values) load those files and run the same 2
 * rounds: the same hashes, round for round, on both. The update is a deterministic function of
 * the buffers, and the codec is lossy (top-k, int8) with momentum, so the hashes agree only if
 * theta_global, the momentum, the residuals and the round counter all came back. Then a
 * corrupted, a truncated, a missing, another cluster's and another table's file are refused
 * naming what is wrong, and the session is unchanged (it still runs a round in agreement).
 * Last, files whose checksum is right but whose table is malformed (what a forged or buggy file
 * looks like: XXH3 is a checksum, not a MAC) reach the table's parser and are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <nebula.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "session_pair.h"

#define NW 200
#define NB 8
#define SAVE_AT 3
#define MORE 2

typedef struct {
  int index;
  float w[NW];
  float b[NB];
  int64_t b_len;
  nb_session_t* s;
  const char* load; /* NULL: phase 1 (run, save at SAVE_AT); else load this file after start */
  char path[512];   /* where phase 1 saves */
  nb_status_t st;
  char msg[512];
  uint64_t saved_hash;
  uint64_t hash[MORE];
} side_t;

static char dir[256];

static const uint8_t secret[32] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3,
                                   2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5};

static void side_open(side_t* sd, int index, const char* job, float seed) {
  memset(sd, 0, sizeof *sd);
  sd->index = index;
  sd->b_len = NB;
  for (int i = 0; i < NW; i++) sd->w[i] = seed * (float)sin(0.1 * i + index);
  for (int i = 0; i < NB; i++) sd->b[i] = seed * (float)i;
  nb_session_options_t o;
  /* a resumed run is another job: its frames are sealed under new keys */
  pair_options(&o, job, index, secret);
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.6f;
  o.density = 0.2;
  o.values = "int8";
  assert_int_equal(nb_session_open(&o, &sd->s), NB_OK);
  int64_t ws[2] = {10, 20};
  assert_int_equal(nb_session_register(sd->s, "w", sd->w, ws, 2), NB_OK);
  assert_int_equal(nb_session_register(sd->s, "b", sd->b, &sd->b_len, 1), NB_OK);
}

static void sides_connect(side_t* a, side_t* b) {
  assert_int_equal(pair_connect(a->s, b->s), NB_OK);
}

/* The cluster's inner steps of round r: deterministic in its buffers, its index and r. */
static void side_train(side_t* sd, int r) {
  for (int i = 0; i < NW; i++)
    sd->w[i] += 0.05f * (float)cos(0.3 * i + r) * (1.0f + sd->index) - 0.02f * sd->w[i];
  for (int i = 0; i < NB; i++) sd->b[i] -= 0.01f * (float)(i + r + sd->index);
}

static nb_status_t side_fail(side_t* sd, nb_status_t st) {
  sd->st = st;
  snprintf(sd->msg, sizeof sd->msg, "%s", nb_error_last());
  return st;
}

static void* side_main(void* arg) {
  side_t* sd = arg;
  nb_status_t st = nb_session_start(sd->s);
  int r0 = 0;
  if (st == NB_OK && sd->load) {
    st = nb_session_load(sd->s, sd->load);
    r0 = SAVE_AT;
  }
  if (st != NB_OK) return (void*)(intptr_t)side_fail(sd, st);
  for (int r = r0; r < SAVE_AT + MORE; r++) {
    if (r == SAVE_AT) {
      if (!sd->load && (st = nb_session_save(sd->s, sd->path)) != NB_OK)
        return (void*)(intptr_t)side_fail(sd, st);
      sd->saved_hash = nb_session_global_hash(sd->s);
    }
    side_train(sd, r);
    nb_session_round_t out;
    st = nb_session_round(sd->s, 32, &out);
    if (st != NB_OK) return (void*)(intptr_t)side_fail(sd, st);
    if ((int)out.round != r) return (void*)(intptr_t)side_fail(sd, NB_ERR_INTERNAL);
    if (r >= SAVE_AT) sd->hash[r - SAVE_AT] = out.global_hash;
  }
  return NULL;
}

static void run_pair(side_t* sd) {
  pthread_t th[2];
  for (int c = 0; c < 2; c++) assert_int_equal(pthread_create(&th[c], NULL, side_main, &sd[c]), 0);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++)
    if (sd[c].st != NB_OK) fail_msg("cluster %d: %s", c, sd[c].msg);
}

static void* round_main(void* arg) {
  side_t* sd = arg;
  nb_status_t st = nb_session_round(sd->s, 32, NULL);
  if (st == NB_OK) st = nb_session_finish(sd->s);
  if (st != NB_OK) side_fail(sd, st);
  return NULL;
}

static void copy_file(const char* from, const char* to, long keep, long flip_at) {
  FILE* f = fopen(from, "rb");
  assert_non_null(f);
  static uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_true(n > 0 && n < sizeof buf);
  if (keep >= 0 && (size_t)keep < n) n = (size_t)keep;
  if (flip_at >= 0) buf[flip_at] ^= 0x10;
  f = fopen(to, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
}

/* Every refusal leaves the session as it was: the same hash, the same buffers. */
static void expect_refused(side_t* sd, const char* path, nb_status_t want, const char* says) {
  uint64_t h = nb_session_global_hash(sd->s);
  float w[NW];
  memcpy(w, sd->w, sizeof w);
  assert_int_equal(nb_session_load(sd->s, path), want);
  print_message("%s: %s\n", path, nb_error_last());
  assert_non_null(strstr(nb_error_last(), says));
  assert_int_equal(nb_session_global_hash(sd->s), h);
  assert_memory_equal(sd->w, w, sizeof w);
}

static side_t a[2], b[2];

static void test_save_load_resume(void** state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/nb_test_ckpt_XXXXXX");
  assert_non_null(mkdtemp(dir));
  for (int c = 0; c < 2; c++) {
    side_open(&a[c], c, "api-ckpt", 1.0f);
    snprintf(a[c].path, sizeof a[c].path, "%s/state-%d.bin", dir, c);
  }
  sides_connect(&a[0], &a[1]);
  run_pair(a);
  assert_int_equal(a[0].saved_hash, a[1].saved_hash);
  for (int c = 0; c < 2; c++) {
    for (int k = 0; k < MORE; k++) assert_int_equal(a[c].hash[k], a[0].hash[k]);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", a[c].path);
    assert_int_equal(access(tmp, F_OK), -1); /* renamed into place */
  }
  for (int c = 0; c < 2; c++) nb_session_close(a[c].s);

  /* the resumed run: other starting values, the saved state on both, the same two rounds */
  for (int c = 0; c < 2; c++) {
    side_open(&b[c], c, "api-ckpt-resumed", -3.0f);
    b[c].load = a[c].path;
  }
  assert_true(memcmp(a[0].w, b[0].w, sizeof a[0].w) != 0);
  sides_connect(&b[0], &b[1]);
  run_pair(b);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(b[c].saved_hash, a[c].saved_hash);
    for (int k = 0; k < MORE; k++) {
      print_message("cluster %d round %d: %016llx (saved run %016llx)\n", c, SAVE_AT + k,
                    (unsigned long long)b[c].hash[k], (unsigned long long)a[c].hash[k]);
      assert_int_equal(b[c].hash[k], a[c].hash[k]);
    }
    assert_memory_equal(b[c].w, a[c].w, sizeof a[c].w);
    assert_memory_equal(b[c].b, a[c].b, sizeof a[c].b);
  }

  /* refusals, on b[0] (cluster 0 of 2, the table w 10x20, b 8) */
  char bad[600];
  snprintf(bad, sizeof bad, "%s/flipped.bin", dir);
  copy_file(a[0].path, bad, -1, 64 + 4 * 17); /* a byte of theta_global */
  expect_refused(&b[0], bad, NB_ERR_INTEGRITY, "checksum");
  copy_file(a[0].path, bad, -1, 64 + 12 * (NW + NB) + 30); /* a byte of the saved table */
  expect_refused(&b[0], bad, NB_ERR_INTEGRITY, "checksum");
  snprintf(bad, sizeof bad, "%s/short.bin", dir);
  copy_file(a[0].path, bad, 1000, -1);
  expect_refused(&b[0], bad, NB_ERR_INVALID, "truncated");
  copy_file(a[0].path, bad, 10, -1);
  expect_refused(&b[0], bad, NB_ERR_INVALID, "not a round state");
  snprintf(bad, sizeof bad, "%s/none.bin", dir);
  expect_refused(&b[0], bad, NB_ERR_NOT_FOUND, "none.bin");
  expect_refused(&b[0], a[1].path, NB_ERR_CONFIG, "cluster 1 of 2's, we are 0 of 2");

  /* after the refusals both still agree on the next round and the final check */
  pthread_t th[2];
  for (int c = 0; c < 2; c++) assert_int_equal(pthread_create(&th[c], NULL, round_main, &b[c]), 0);
  for (int c = 0; c < 2; c++) pthread_join(th[c], NULL);
  for (int c = 0; c < 2; c++)
    if (b[c].st != NB_OK) fail_msg("cluster %d: %s", c, b[c].msg);
  assert_int_equal(nb_session_global_hash(b[0].s), nb_session_global_hash(b[1].s));
  for (int c = 0; c < 2; c++) nb_session_close(b[c].s);
}

/* One-cluster sessions: a file of another table (a shape, a dtype, a name, a tensor more) is
 * refused naming the tensor; save and load before start are refused. */
static void test_other_table(void** state) {
  (void)state;
  nb_session_options_t o;
  nb_session_options_default(&o);
  o.job_id = "api-ckpt-solo";
  o.cluster_id = "solo";
  o.insecure = o.unsealed = 1;
  static float v[12], u[4];
  static uint16_t vh[12];
  int64_t s12[1] = {12}, s34[2] = {3, 4}, s4[1] = {4};
  nb_session_t* s = NULL;
  char path[600];
  snprintf(path, sizeof path, "%s/solo.bin", dir);
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  assert_int_equal(nb_session_register(s, "v", v, s12, 1), NB_OK);
  assert_int_equal(nb_session_save(s, path), NB_ERR_INVALID); /* before start */
  assert_int_equal(nb_session_load(s, path), NB_ERR_INVALID);
  assert_int_equal(nb_session_start(s), NB_OK);
  v[0] = 1;
  assert_int_equal(nb_session_round(s, 1, NULL), NB_OK);
  assert_int_equal(nb_session_save(s, path), NB_OK);
  assert_int_equal(nb_session_load(s, path), NB_OK); /* its own state: fine */
  nb_session_close(s);

  struct {
    const char* name;
    void* data;
    nb_dtype_t dtype;
    int64_t* shape;
    int ndim;
    int extra; /* also register u */
    const char* says;
  } cases[] = {
      {"v", v, NB_DTYPE_FP32, s34, 2, 0, "tensor 0 differs: 'v' (3x4) here, 'v' (12)"},
      {"v", vh, NB_DTYPE_BF16, s12, 1, 0, "tensor 0 'v' is bf16 here, fp32 in"},
      {"x", v, NB_DTYPE_FP32, s12, 1, 0, "tensor 0 differs: 'x' (12) here, 'v' (12)"},
      {"v", v, NB_DTYPE_FP32, s12, 1, 1, "tensor 1 'u' is registered here but not in"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(nb_session_open(&o, &s), NB_OK);
    assert_int_equal(nb_session_register_dtype(s, cases[i].name, cases[i].data, cases[i].dtype,
                                               cases[i].shape, cases[i].ndim),
                     NB_OK);
    if (cases[i].extra) assert_int_equal(nb_session_register(s, "u", u, s4, 1), NB_OK);
    assert_int_equal(nb_session_start(s), NB_OK);
    uint64_t h = nb_session_global_hash(s);
    assert_int_equal(nb_session_load(s, path), NB_ERR_CONFIG);
    print_message("%s\n", nb_error_last());
    assert_non_null(strstr(nb_error_last(), cases[i].says));
    assert_int_equal(nb_session_global_hash(s), h);
    nb_session_close(s);
  }
  /* the other settings of the job count too */
  o.outer_lr = 0.5f;
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  assert_int_equal(nb_session_register(s, "v", v, s12, 1), NB_OK);
  assert_int_equal(nb_session_start(s), NB_OK);
  assert_int_equal(nb_session_load(s, path), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "outer_lr"));
  nb_session_close(s);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}
static void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The state file's layout (docs/hybrid.md): a 64-byte header (the extension's length at 56),
 * theta_global, momentum, residual (n floats each), the extension (our table), an XXH3-64. */
static void test_forged_tables(void** state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/nb_test_forge_XXXXXX");
  assert_non_null(mkdtemp(dir));
  nb_session_options_t o;
  nb_session_options_default(&o);
  o.job_id = "api-ckpt-forge";
  o.cluster_id = "solo";
  o.insecure = o.unsealed = 1;
  static float v[12];
  int64_t s12[1] = {12};
  nb_session_t* s = NULL;
  char path[600], bad[600];
  snprintf(path, sizeof path, "%s/state.bin", dir);
  snprintf(bad, sizeof bad, "%s/forged.bin", dir);
  assert_int_equal(nb_session_open(&o, &s), NB_OK);
  assert_int_equal(nb_session_register(s, "v", v, s12, 1), NB_OK);
  assert_int_equal(nb_session_start(s), NB_OK);
  v[3] = 2;
  assert_int_equal(nb_session_round(s, 1, NULL), NB_OK);
  assert_int_equal(nb_session_save(s, path), NB_OK);
  static uint8_t file[4096], f2[4096];
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  size_t len = fread(file, 1, sizeof file, f);
  fclose(f);
  const size_t body = 64 + 3 * 12 * 4, ext = body; /* the table starts after the residual */
  /* the table: 40 bytes of header, then "v": its name's length, name, dtype, ndim, one dim */
  assert_int_equal(get64(file + 56), 40 + 4 + 1 + 4 + 4 + 8);
  assert_int_equal(len, body + 61 + 8);
  assert_int_equal(XXH3_64bits(file, len - 8), get64(file + len - 8)); /* the layout holds */
  struct {
    size_t at;      /* where in the extension to write */
    int width;      /* 4 or 8 bytes; 0: the extension is `value` bytes long instead */
    uint64_t value; /* what to write */
    const char* says;
  } cases[] = {
      {0, 4, 0x12345678u, "no tensor table"},
      {4, 4, 1, "version 1, ours 2"},
      {0, 0, 20, "short tensor table"},             /* the table cut after 20 bytes */
      {40, 4, 0xffffffffu, "malformed tensor 0"},   /* the name's length */
      {40, 4, 2, "malformed tensor 0"},             /* a name a byte longer: what follows shifts */
      {20, 4, 1000, "malformed tensor 1"},          /* more tensors than there are */
      {49, 4, 9, "malformed tensor 0"},             /* ndim 9 (after the name "v" and the dtype) */
      {45, 4, 7, "is fp32 here, an unknown dtype"}, /* dtype 7 (after the name "v") */
      {32, 8, 13, "malformed tensor table"},        /* another float count */
      {16, 4, 1, "malformed tensor table"},         /* the values flag in a saved table */
      {0, 0, 65, "malformed tensor table"},         /* 4 trailing bytes */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    memcpy(f2, file, len);
    size_t n = len;
    if (cases[i].width == 0) { /* the extension's new length; the checksum moves */
      size_t ext_len = (size_t)cases[i].value;
      memset(f2 + body + (len - body - 8), 0, 8);
      put64(f2 + 56, ext_len);
      n = body + ext_len + 8;
    } else if (cases[i].width == 4) {
      put32(f2 + ext + cases[i].at, (uint32_t)cases[i].value);
    } else {
      put64(f2 + ext + cases[i].at, cases[i].value);
    }
    put64(f2 + n - 8, XXH3_64bits(f2, n - 8));
    f = fopen(bad, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(f2, 1, n, f), n);
    fclose(f);
    uint64_t h = nb_session_global_hash(s);
    nb_status_t st = nb_session_load(s, bad);
    print_message("case %zu: %s: %s\n", i, nb_status_name(st), nb_error_last());
    assert_true(st == NB_ERR_INVALID || st == NB_ERR_CONFIG);
    assert_non_null(strstr(nb_error_last(), cases[i].says));
    assert_int_equal(nb_session_global_hash(s), h);
  }
  assert_int_equal(nb_session_load(s, path), NB_OK); /* the real one still loads */
  nb_session_close(s);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_save_load_resume),
      cmocka_unit_test(test_other_table),
      cmocka_unit_test(test_forged_tables),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
