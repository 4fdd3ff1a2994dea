/* Unit tests of security/seal: round trips, tampering of ciphertext, tag and header, replays,
 * keys of the wrong direction, job or epoch, nonce uniqueness and range checks, and concurrent
 * openers sharing one replay window. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "security/seal.h"

static uint8_t secret[NB_SEAL_SECRET_BYTES];

static int setup(void** state) {
  (void)state;
  return nb_seal_secret_generate(secret) == NB_OK ? 0 : -1;
}

static nb_seal_ctx_t* mk(const char* job, const char* local, const char* peer,
                         const nb_seal_opts_t* o) {
  nb_seal_ctx_t* c = NULL;
  nb_status_t st = nb_seal_ctx_create(secret, job, local, peer, o, &c);
  if (st != NB_OK) fail_msg("create: %s", nb_error_last());
  return c;
}

static const char hdr[] = "NBF1 hdr: round=3 chunk=7";
#define MARK "PAYLOAD-MARKER-0123456789"

static void fill(uint8_t* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
  if (n >= sizeof MARK) memcpy(p, MARK, sizeof MARK - 1);
}

static void test_roundtrip(void** state) {
  (void)state;
  nb_seal_ctx_t* a = mk("job-1", "dc-a", "dc-b", NULL);
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", NULL);
  const size_t sizes[] = {0, 1, 15, 16, 17, 1000, (size_t)1 << 20};
  uint8_t *plain, *sealed, *back;
  assert_int_equal(NB_ALLOC(plain, (1 << 20) + 64, "t"), NB_OK);
  assert_int_equal(NB_ALLOC(sealed, (1 << 20) + 64, "t"), NB_OK);
  assert_int_equal(NB_ALLOC(back, (1 << 20) + 64, "t"), NB_OK);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i], sl = 0, bl = 99;
    fill(plain, n, (unsigned)i);
    assert_int_equal(nb_seal_chunk(a, 1, i, hdr, sizeof hdr, plain, n, sealed, &sl), NB_OK);
    assert_int_equal(sl, n + NB_SEAL_TAG_BYTES);
    if (n >= sizeof MARK) assert_null(memmem(sealed, sl, MARK, sizeof MARK - 1));
    assert_int_equal(nb_open_chunk(b, 1, i, hdr, sizeof hdr, sealed, sl, back, &bl), NB_OK);
    assert_int_equal(bl, n);
    assert_memory_equal(back, plain, n);
    /* and the other direction, in place, without a header */
    memcpy(back, plain, n);
    assert_int_equal(nb_seal_chunk(b, 1, i, NULL, 0, back, n, back, &sl), NB_OK);
    assert_int_equal(nb_open_chunk(a, 1, i, NULL, 0, back, sl, back, &bl), NB_OK);
    assert_memory_equal(back, plain, n);
  }
  /* sealing is deterministic for one (key, round, chunk): a retransmission is byte-identical */
  size_t s1, s2;
  uint8_t x[64], y[64];
  assert_int_equal(nb_seal_chunk(a, 9, 9, hdr, sizeof hdr, plain, 40, x, &s1), NB_OK);
  assert_int_equal(nb_seal_chunk(a, 9, 9, hdr, sizeof hdr, plain, 40, y, &s2), NB_OK);
  assert_memory_equal(x, y, s1);
  /* and differs across chunks */
  assert_int_equal(nb_seal_chunk(a, 9, 10, hdr, sizeof hdr, plain, 40, y, &s2), NB_OK);
  assert_memory_not_equal(x, y, s1);
  nb_free(plain);
  nb_free(sealed);
  nb_free(back);
  nb_seal_ctx_destroy(a);
  nb_seal_ctx_destroy(b);
  nb_seal_ctx_destroy(NULL);
}

static void test_tamper(void** state) {
  (void)state;
  nb_seal_ctx_t* a = mk("job-1", "dc-a", "dc-b", NULL);
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", NULL);
  uint8_t plain[300], sealed[400], bad[400], out[400];
  char h[sizeof hdr];
  size_t sl, ol;
  fill(plain, sizeof plain, 5);
  assert_int_equal(nb_seal_chunk(a, 2, 0, hdr, sizeof hdr, plain, sizeof plain, sealed, &sl),
                   NB_OK);
  const size_t where[] = {0, 150, sizeof plain - 1, sizeof plain,
                          sl - 1}; /* ct, ct, ct, tag, tag */
  for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
    memcpy(bad, sealed, sl);
    bad[where[i]] ^= 0x01;
    memset(out, 0xAA, sizeof out);
    nb_error_clear();
    assert_int_equal(nb_open_chunk(b, 2, 0, hdr, sizeof hdr, bad, sl, out, &ol), NB_ERR_INTEGRITY);
    /* the message names the chunk and peer, never payload bytes */
    assert_non_null(strstr(nb_error_last(), "round 2, chunk 0"));
    assert_non_null(strstr(nb_error_last(), "dc-a"));
    assert_null(strstr(nb_error_last(), MARK));
    /* unauthenticated plaintext is not handed out */
    assert_null(memmem(out, sizeof plain, MARK, sizeof MARK - 1));
  }
  /* header (associated data) changed */
  memcpy(h, hdr, sizeof hdr);
  h[5] ^= 0x20;
  assert_int_equal(nb_open_chunk(b, 2, 0, h, sizeof h, sealed, sl, out, &ol), NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b, 2, 0, hdr, sizeof hdr - 1, sealed, sl, out, &ol),
                   NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b, 2, 0, NULL, 0, sealed, sl, out, &ol), NB_ERR_INTEGRITY);
  /* truncated, extended */
  assert_int_equal(nb_open_chunk(b, 2, 0, hdr, sizeof hdr, sealed, sl - 1, out, &ol),
                   NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b, 2, 0, hdr, sizeof hdr, sealed, 10, out, &ol), NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b, 2, 0, hdr, sizeof hdr, sealed, sl + 1, out, &ol),
                   NB_ERR_INTEGRITY);
  /* claimed under another (round, chunk) */
  assert_int_equal(nb_open_chunk(b, 2, 1, hdr, sizeof hdr, sealed, sl, out, &ol), NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b, 3, 0, hdr, sizeof hdr, sealed, sl, out, &ol), NB_ERR_INTEGRITY);
  /* failed attempts did not poison the replay window: the genuine chunk still opens */
  assert_int_equal(nb_open_chunk(b, 2, 0, hdr, sizeof hdr, sealed, sl, out, &ol), NB_OK);
  assert_memory_equal(out, plain, sizeof plain);
  nb_seal_ctx_destroy(a);
  nb_seal_ctx_destroy(b);
}

static void test_replay(void** state) {
  (void)state;
  nb_seal_opts_t o = {.replay_rounds = 3};
  nb_seal_ctx_t* a = mk("job-1", "dc-a", "dc-b", &o);
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", &o);
  uint8_t plain[64] = {1, 2, 3}, s[10][8][80], out[80];
  size_t sl, ol;
  for (int r = 0; r < 10; r++)
    for (int c = 0; c < 8; c++)
      assert_int_equal(nb_seal_chunk(a, r, c, hdr, sizeof hdr, plain, sizeof plain, s[r][c], &sl),
                       NB_OK);
  /* out of order within a round and across the window is fine */
  assert_int_equal(nb_open_chunk(b, 1, 5, hdr, sizeof hdr, s[1][5], sl, out, &ol), NB_OK);
  assert_int_equal(nb_open_chunk(b, 0, 0, hdr, sizeof hdr, s[0][0], sl, out, &ol), NB_OK);
  assert_int_equal(nb_open_chunk(b, 1, 0, hdr, sizeof hdr, s[1][0], sl, out, &ol), NB_OK);
  /* the same chunk again: replay */
  assert_int_equal(nb_open_chunk(b, 1, 5, hdr, sizeof hdr, s[1][5], sl, out, &ol), NB_ERR_EXISTS);
  assert_non_null(strstr(nb_error_last(), "already accepted"));
  assert_int_equal(nb_open_chunk(b, 0, 0, hdr, sizeof hdr, s[0][0], sl, out, &ol), NB_ERR_EXISTS);
  /* round 3 arrives: with a 3-round window, round 0 falls out; its unseen chunks are too old */
  assert_int_equal(nb_open_chunk(b, 3, 7, hdr, sizeof hdr, s[3][7], sl, out, &ol), NB_OK);
  assert_int_equal(nb_open_chunk(b, 0, 1, hdr, sizeof hdr, s[0][1], sl, out, &ol), NB_ERR_EXISTS);
  assert_non_null(strstr(nb_error_last(), "older than the replay window"));
  assert_int_equal(nb_open_chunk(b, 1, 5, hdr, sizeof hdr, s[1][5], sl, out, &ol), NB_ERR_EXISTS);
  assert_int_equal(nb_open_chunk(b, 1, 6, hdr, sizeof hdr, s[1][6], sl, out, &ol), NB_OK);
  /* a jump far ahead clears the old rounds; the slot of round 9 reused round 6's: no ghost bits */
  assert_int_equal(nb_open_chunk(b, 6, 2, hdr, sizeof hdr, s[6][2], sl, out, &ol), NB_OK);
  assert_int_equal(nb_open_chunk(b, 9, 3, hdr, sizeof hdr, s[9][3], sl, out, &ol), NB_OK);
  assert_int_equal(nb_open_chunk(b, 9, 2, hdr, sizeof hdr, s[9][2], sl, out, &ol), NB_OK);
  assert_int_equal(nb_open_chunk(b, 9, 3, hdr, sizeof hdr, s[9][3], sl, out, &ol), NB_ERR_EXISTS);
  assert_int_equal(nb_open_chunk(b, 6, 3, hdr, sizeof hdr, s[6][3], sl, out, &ol), NB_ERR_EXISTS);
  assert_int_equal(nb_open_chunk(b, 7, 0, hdr, sizeof hdr, s[7][0], sl, out, &ol), NB_OK);
  nb_seal_ctx_destroy(a);
  nb_seal_ctx_destroy(b);
}

static void test_wrong_keys(void** state) {
  (void)state;
  nb_seal_ctx_t* a = mk("job-1", "dc-a", "dc-b", NULL);
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", NULL);
  nb_seal_ctx_t* c = mk("job-1", "dc-c", "dc-a", NULL);  /* a third cluster of the same job */
  nb_seal_ctx_t* b2 = mk("job-2", "dc-b", "dc-a", NULL); /* same clusters, another job */
  uint8_t other[NB_SEAL_SECRET_BYTES];
  memcpy(other, secret, sizeof other);
  other[0] ^= 1;
  nb_seal_ctx_t* b3 = NULL;
  assert_int_equal(nb_seal_ctx_create(other, "job-1", "dc-b", "dc-a", NULL, &b3), NB_OK);
  uint8_t plain[100] = {7}, sealed[200], out[200];
  size_t sl, ol;
  assert_int_equal(nb_seal_chunk(a, 0, 0, hdr, sizeof hdr, plain, sizeof plain, sealed, &sl),
                   NB_OK);
  /* a's own output through a's receive key (the reverse direction): reflected chunk */
  assert_int_equal(nb_open_chunk(a, 0, 0, hdr, sizeof hdr, sealed, sl, out, &ol), NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(c, 0, 0, hdr, sizeof hdr, sealed, sl, out, &ol), NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b2, 0, 0, hdr, sizeof hdr, sealed, sl, out, &ol),
                   NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b3, 0, 0, hdr, sizeof hdr, sealed, sl, out, &ol),
                   NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b, 0, 0, hdr, sizeof hdr, sealed, sl, out, &ol), NB_OK);
  nb_seal_ctx_destroy(a);
  nb_seal_ctx_destroy(b);
  nb_seal_ctx_destroy(c);
  nb_seal_ctx_destroy(b2);
  nb_seal_ctx_destroy(b3);
}

static void test_epochs(void** state) {
  (void)state;
  nb_seal_opts_t restarted = {.local_epoch = 1};
  nb_seal_ctx_t* a1 = mk("job-1", "dc-a", "dc-b", &restarted);
  nb_seal_ctx_t* a0 = mk("job-1", "dc-a", "dc-b", NULL);
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", NULL);
  uint8_t plain[32] = {1}, s0[64], s1[64], out[64];
  size_t sl, ol;
  /* the same (round, chunk) sealed by two incarnations: different keys, different bytes */
  assert_int_equal(nb_seal_chunk(a0, 5, 0, NULL, 0, plain, sizeof plain, s0, &sl), NB_OK);
  assert_int_equal(nb_seal_chunk(a1, 5, 0, NULL, 0, plain, sizeof plain, s1, &sl), NB_OK);
  assert_memory_not_equal(s0, s1, sl);
  uint8_t n0[12], n1[12];
  assert_int_equal(nb_seal_nonce(a0, 1, 5, 0, n0), NB_OK);
  assert_int_equal(nb_seal_nonce(a1, 1, 5, 0, n1), NB_OK);
  assert_memory_not_equal(n0, n1, 4);
  assert_int_equal(nb_open_chunk(b, 5, 0, NULL, 0, s1, sl, out, &ol), NB_ERR_INTEGRITY);
  assert_int_equal(nb_open_chunk(b, 5, 0, NULL, 0, s0, sl, out, &ol), NB_OK);
  assert_int_equal(nb_seal_set_peer_epoch(b, 1), NB_OK);
  assert_int_equal(nb_open_chunk(b, 5, 0, NULL, 0, s1, sl, out, &ol), NB_OK); /* window reset */
  assert_int_equal(nb_open_chunk(b, 5, 0, NULL, 0, s1, sl, out, &ol), NB_ERR_EXISTS);
  assert_int_equal(nb_open_chunk(b, 5, 0, NULL, 0, s0, sl, out, &ol), NB_ERR_INTEGRITY);
  /* epochs never go back */
  assert_int_equal(nb_seal_set_peer_epoch(b, 1), NB_ERR_INVALID);
  assert_int_equal(nb_seal_set_peer_epoch(b, 0), NB_ERR_INVALID);
  nb_seal_ctx_destroy(a0);
  nb_seal_ctx_destroy(a1);
  nb_seal_ctx_destroy(b);
}

static int cmp12(const void* x, const void* y) {
  return memcmp(x, y, 12);
}

static void test_nonces(void** state) {
  (void)state;
  nb_seal_ctx_t* a = mk("job-1", "dc-a", "dc-b", NULL);
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", NULL);
  enum { R = 40, C = 50 };
  uint8_t(*n)[12] = malloc(sizeof(*n) * 2 * R * C);
  assert_non_null(n);
  size_t k = 0;
  for (int s = 0; s < 2; s++)
    for (uint64_t r = 0; r < R; r++)
      for (uint64_t c = 0; c < C; c++) {
        uint64_t rr = r < R - 2 ? r : (r == R - 2 ? 0xFFFFFFFFull : 0x100ull); /* field edges */
        assert_int_equal(nb_seal_nonce(s ? b : a, 1, rr, c, n[k]), NB_OK);
        /* what one side seals with is what the other opens with */
        uint8_t peer[12];
        assert_int_equal(nb_seal_nonce(s ? a : b, 0, rr, c, peer), NB_OK);
        assert_memory_equal(peer, n[k], 12);
        /* layout: sender field, then round and chunk big-endian */
        assert_int_equal(n[k][4], (uint8_t)(rr >> 24));
        assert_int_equal(n[k][7], (uint8_t)rr);
        assert_int_equal(n[k][11], (uint8_t)c);
        k++;
      }
  qsort(n, k, 12, cmp12);
  for (size_t i = 1; i < k; i++) assert_memory_not_equal(n[i - 1], n[i], 12);
  free(n);
  /* the two senders' fields differ */
  uint8_t x[12], y[12];
  assert_int_equal(nb_seal_nonce(a, 1, 0, 0, x), NB_OK);
  assert_int_equal(nb_seal_nonce(b, 1, 0, 0, y), NB_OK);
  assert_memory_not_equal(x, y, 4);
  /* values that would overflow the fields are refused, not wrapped */
  uint8_t p[4] = {0}, out[64];
  size_t ol;
  assert_int_equal(nb_seal_nonce(a, 1, 0x100000000ull, 0, x), NB_ERR_INVALID);
  assert_int_equal(nb_seal_nonce(a, 1, 0, 0x100000000ull, x), NB_ERR_INVALID);
  assert_int_equal(nb_seal_chunk(a, 0x100000000ull, 0, NULL, 0, p, 4, out, &ol), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "32-bit round field"));
  assert_int_equal(nb_seal_chunk(a, 0, 0x100000000ull, NULL, 0, p, 4, out, &ol), NB_ERR_INVALID);
  assert_int_equal(nb_seal_chunk(a, 0xFFFFFFFFull, 0, NULL, 0, p, 4, out, &ol), NB_OK);
  assert_int_equal(nb_open_chunk(b, 0x100000000ull, 0, NULL, 0, out, ol, out, &ol), NB_ERR_INVALID);
  nb_seal_ctx_destroy(a);
  nb_seal_ctx_destroy(b);
}

static void test_bad_args(void** state) {
  (void)state;
  nb_seal_ctx_t* c = (nb_seal_ctx_t*)1;
  uint8_t zero[NB_SEAL_SECRET_BYTES] = {0};
  assert_int_equal(nb_seal_ctx_create(zero, "j", "a", "b", NULL, &c), NB_ERR_INVALID);
  assert_null(c);
  assert_int_equal(nb_seal_ctx_create(secret, "j", "a", "a", NULL, &c), NB_ERR_INVALID);
  assert_int_equal(nb_seal_ctx_create(secret, "", "a", "b", NULL, &c), NB_ERR_INVALID);
  assert_int_equal(nb_seal_ctx_create(secret, "j", "a b", "b", NULL, &c), NB_ERR_INVALID);
  assert_int_equal(nb_seal_ctx_create(NULL, "j", "a", "b", NULL, &c), NB_ERR_INVALID);
  nb_seal_opts_t o = {.replay_rounds = 5000};
  assert_int_equal(nb_seal_ctx_create(secret, "j", "a", "b", &o, &c), NB_ERR_INVALID);
  uint8_t s2[NB_SEAL_SECRET_BYTES];
  assert_int_equal(nb_seal_secret_generate(s2), NB_OK);
  assert_memory_not_equal(s2, secret, sizeof s2);
  c = mk("j", "a", "b", NULL);
  uint8_t out[32];
  size_t ol;
  assert_int_equal(nb_seal_chunk(c, 0, 0, NULL, 5, out, 1, out, &ol), NB_ERR_INVALID);
  assert_int_equal(nb_open_chunk(c, 0, 0, NULL, 0, NULL, 20, out, &ol), NB_ERR_INVALID);
  nb_seal_ctx_destroy(c);
}

/* Several streams of one link open chunks concurrently into one replay window. */
typedef struct {
  nb_seal_ctx_t* b;
  uint8_t (*sealed)[48];
  size_t sl;
  int first, n, ok, dup;
} job_t;

static void* opener(void* arg) {
  job_t* j = arg;
  uint8_t out[48];
  size_t ol;
  for (int i = 0; i < j->n; i++) {
    int c = (j->first + i) % 256;
    nb_status_t st = nb_open_chunk(j->b, 4, (uint64_t)c, NULL, 0, j->sealed[c], j->sl, out, &ol);
    if (st == NB_OK)
      j->ok++;
    else if (st == NB_ERR_EXISTS)
      j->dup++;
  }
  return NULL;
}

static void test_concurrent_open(void** state) {
  (void)state;
  nb_seal_ctx_t* a = mk("job-1", "dc-a", "dc-b", NULL);
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", NULL);
  static uint8_t sealed[256][48];
  uint8_t plain[32] = {3};
  size_t sl = 0;
  for (int c = 0; c < 256; c++)
    assert_int_equal(nb_seal_chunk(a, 4, (uint64_t)c, NULL, 0, plain, sizeof plain, sealed[c], &sl),
                     NB_OK);
  /* 4 threads, each opening 128 chunks from a different start: every chunk is offered twice */
  job_t jobs[4];
  pthread_t th[4];
  for (int t = 0; t < 4; t++) {
    jobs[t] = (job_t){.b = b, .sealed = sealed, .sl = sl, .first = t * 64, .n = 128};
    assert_int_equal(pthread_create(&th[t], NULL, opener, &jobs[t]), 0);
  }
  int ok = 0, dup = 0;
  for (int t = 0; t < 4; t++) {
    pthread_join(th[t], NULL);
    ok += jobs[t].ok;
    dup += jobs[t].dup;
  }
  assert_int_equal(ok, 256);
  assert_int_equal(dup, 256);
  nb_seal_ctx_destroy(a);
  nb_seal_ctx_destroy(b);
}

/* Random bytes as sealed chunks: always an integrity failure, never a crash. */
static void test_garbage_chunks(void** state) {
  (void)state;
  nb_seal_ctx_t* b = mk("job-1", "dc-b", "dc-a", NULL);
  uint64_t x = 88172645463325252ull;
  uint8_t in[512], out[512];
  size_t ol;
  for (int it = 0; it < 500; it++) {
    size_t len = 0;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    len = x % sizeof in;
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      in[i] = (uint8_t)x;
    }
    assert_int_equal(nb_open_chunk(b, x % 4, x % 1000, in, len / 3, in, len, out, &ol),
                     NB_ERR_INTEGRITY);
  }
  nb_seal_ctx_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),      cmocka_unit_test(test_tamper),
      cmocka_unit_test(test_replay),         cmocka_unit_test(test_wrong_keys),
      cmocka_unit_test(test_epochs),         cmocka_unit_test(test_nonces),
      cmocka_unit_test(test_bad_args),       cmocka_unit_test(test_concurrent_open),
      cmocka_unit_test(test_garbage_chunks),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
