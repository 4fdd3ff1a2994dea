/* AES-256-GCM sealing of frame chunks with HKDF-derived per-job, per-direction keys, nonces from
 * (sender, round, chunk) and a replay window. One EVP_CIPHER_CTX per direction is initialised
 * with its key once and reused for every chunk (only the nonce changes). Not a frame format. */
#include "security/seal.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <string.h>

#include "common/common.h"
#include "security/openssl_init.h"
#include "security/pki.h"

NB_PARAM_INT(
    SealReplayRounds, "NB_SEAL_REPLAY_ROUNDS", 8, 1, 1024,
    "rounds of sealed chunks remembered per peer to reject replays; older ones are refused")
NB_PARAM_INT(SealMaxChunks, "NB_SEAL_MAX_CHUNKS", 16777216, 1, 4294967296.0,
             "chunks per round a sealed frame may have (bounds the replay window's memory)")

#define NB__OKM_BYTES 36
#define NB__JOB_ID_MAX 255
#define NB__PIECE ((size_t)1 << 30) /* EVP takes int lengths */

typedef struct {
  uint64_t round;
  int used;
  uint64_t* bits; /* accepted chunk indices */
  size_t nwords;
} nb__rwin_slot_t;

struct nb_seal_ctx {
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  char job_id[NB__JOB_ID_MAX + 1];
  char local[NB_PKI_NAME_MAX + 1];
  char peer[NB_PKI_NAME_MAX + 1];
  uint64_t max_chunks;

  pthread_mutex_t send_mu;
  EVP_CIPHER_CTX* send;
  uint8_t send_tag[4];
  uint32_t local_epoch;

  pthread_mutex_t recv_mu;
  EVP_CIPHER_CTX* recv;
  uint8_t recv_tag[4];
  uint32_t peer_epoch;
  /* replay window over rounds: slots indexed round % nslots, max_round the newest accepted */
  nb__rwin_slot_t* slots;
  uint32_t nslots;
  int have_round;
  uint64_t max_round;
};

nb_status_t nb_seal_secret_generate(uint8_t secret[NB_SEAL_SECRET_BYTES]) {
  if (!secret) return nb_error(NB_ERR_INVALID, "NULL secret");
  if (RAND_bytes(secret, NB_SEAL_SECRET_BYTES) != 1)
    return nb__ossl_error(NB_ERR_CRYPTO, "RAND_bytes for the job secret");
  return NB_OK;
}

/* HKDF-SHA256 of the direction sender -> receiver (layout in seal.h). */
static nb_status_t nb__derive(const nb_seal_ctx_t* c, const char* sender, const char* receiver,
                              uint32_t epoch, uint8_t okm[NB__OKM_BYTES]) {
  uint8_t salt[16 + NB__JOB_ID_MAX];
  uint8_t info[16 + 2 * (NB_PKI_NAME_MAX + 1) + 4];
  size_t sl = 0, il = 0;
  static const char sp[] = "nebula/v1 job ", ip[] = "nebula/v1 seal";
  memcpy(salt, sp, sizeof sp - 1);
  sl = sizeof sp - 1;
  memcpy(salt + sl, c->job_id, strlen(c->job_id));
  sl += strlen(c->job_id);
  memcpy(info, ip, sizeof ip); /* with its NUL */
  il = sizeof ip;
  size_t n = strlen(sender);
  memcpy(info + il, sender, n + 1);
  il += n + 1;
  n = strlen(receiver);
  memcpy(info + il, receiver, n + 1);
  il += n + 1;
  info[il++] = (uint8_t)(epoch >> 24);
  info[il++] = (uint8_t)(epoch >> 16);
  info[il++] = (uint8_t)(epoch >> 8);
  info[il++] = (uint8_t)epoch;

  nb_status_t st = NB_OK;
  EVP_KDF* kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
  EVP_KDF_CTX* kctx = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char*)"SHA256", 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void*)c->secret, NB_SEAL_SECRET_BYTES),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt, sl),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, il), OSSL_PARAM_construct_end()};
  if (!kctx || EVP_KDF_derive(kctx, okm, NB__OKM_BYTES, params) != 1)
    st = nb__ossl_error(NB_ERR_CRYPTO, "HKDF-SHA256 key derivation");
  EVP_KDF_CTX_free(kctx);
  EVP_KDF_free(kdf);
  return st;
}

/* (Re)keys one direction's cipher context; the key bytes are cleansed before returning. */
static nb_status_t nb__key_dir(nb_seal_ctx_t* c, int sending, uint32_t epoch) {
  uint8_t okm[NB__OKM_BYTES];
  nb_status_t st = sending ? nb__derive(c, c->local, c->peer, epoch, okm)
                           : nb__derive(c, c->peer, c->local, epoch, okm);
  if (st != NB_OK) return st;
  EVP_CIPHER* aes = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
  int ok = aes != NULL;
  /* a new epoch re-keys a context in use: reset it first, or OpenSSL keeps the previous key's
   * cipher state (LeakSanitizer saw it when a receiver adopted a restarted sender's epoch) */
  if (ok) ok = EVP_CIPHER_CTX_reset(sending ? c->send : c->recv);
  if (ok)
    ok = sending ? EVP_EncryptInit_ex2(c->send, aes, okm, NULL, NULL)
                 : EVP_DecryptInit_ex2(c->recv, aes, okm, NULL, NULL);
  EVP_CIPHER_free(aes); /* the context keeps its own reference */
  if (ok) memcpy(sending ? c->send_tag : c->recv_tag, okm + 32, 4);
  OPENSSL_cleanse(okm, sizeof okm);
  if (!ok) return nb__ossl_error(NB_ERR_CRYPTO, "initialising AES-256-GCM");
  return NB_OK;
}

static nb_status_t nb__check_name(const char* s, const char* what) {
  nb_status_t st = nb_pki_name_check(s, what);
  return st;
}

nb_status_t nb_seal_ctx_create(const uint8_t job_secret[NB_SEAL_SECRET_BYTES], const char* job_id,
                               const char* local_cluster, const char* peer_cluster,
                               const nb_seal_opts_t* opts, nb_seal_ctx_t** out) {
  nb_openssl_init();
  if (!out) return nb_error(NB_ERR_INVALID, "NULL output");
  *out = NULL;
  if (!job_secret) return nb_error(NB_ERR_INVALID, "NULL job secret");
  uint8_t any = 0;
  for (int i = 0; i < NB_SEAL_SECRET_BYTES; i++) any |= job_secret[i];
  if (!any) return nb_error(NB_ERR_INVALID, "job secret is all zeros (never generated?)");
  if (!job_id || !job_id[0] || strlen(job_id) > NB__JOB_ID_MAX)
    return nb_error(NB_ERR_INVALID, "job id must be 1..%d bytes", NB__JOB_ID_MAX);
  NB_CHECK(nb__check_name(local_cluster, "local cluster id"));
  NB_CHECK(nb__check_name(peer_cluster, "peer cluster id"));
  if (strcmp(local_cluster, peer_cluster) == 0)
    return nb_error(NB_ERR_INVALID,
                    "local and peer cluster are both '%s': both directions would share a key",
                    local_cluster);
  nb_seal_opts_t o = {0};
  if (opts) o = *opts;
  uint32_t rounds = o.replay_rounds ? o.replay_rounds : (uint32_t)nb_param_SealReplayRounds();
  if (rounds > 1024)
    return nb_error(NB_ERR_INVALID, "replay window of %u rounds (max 1024)", rounds);

  nb_seal_ctx_t* c = NULL;
  NB_CHECK(NB_CALLOC(c, 1, "sealing context"));
  nb_status_t st = NB_OK;
  memcpy(c->secret, job_secret, NB_SEAL_SECRET_BYTES);
  snprintf(c->job_id, sizeof c->job_id, "%s", job_id);
  snprintf(c->local, sizeof c->local, "%s", local_cluster);
  snprintf(c->peer, sizeof c->peer, "%s", peer_cluster);
  c->max_chunks = (uint64_t)nb_param_SealMaxChunks();
  c->local_epoch = o.local_epoch;
  c->peer_epoch = o.peer_epoch;
  c->nslots = rounds;
  pthread_mutex_init(&c->send_mu, NULL);
  pthread_mutex_init(&c->recv_mu, NULL);
  NB_CHECK_GOTO(NB_CALLOC(c->slots, rounds, "replay window"), st, fail);
  c->send = EVP_CIPHER_CTX_new();
  c->recv = EVP_CIPHER_CTX_new();
  if (!c->send || !c->recv) {
    st = nb__ossl_error(NB_ERR_NOMEM, "EVP_CIPHER_CTX_new");
    goto fail;
  }
  NB_CHECK_GOTO(nb__key_dir(c, 1, c->local_epoch), st, fail);
  NB_CHECK_GOTO(nb__key_dir(c, 0, c->peer_epoch), st, fail);
  NB_INFO(SEC, "sealing context for job '%s': %s <-> %s (epochs %u/%u, replay window %u rounds)",
          c->job_id, c->local, c->peer, c->local_epoch, c->peer_epoch, c->nslots);
  *out = c;
  return NB_OK;
fail:
  nb_seal_ctx_destroy(c);
  return st;
}

static void nb__rwin_clear(nb_seal_ctx_t* c) {
  for (uint32_t i = 0; c->slots && i < c->nslots; i++) {
    nb_free(c->slots[i].bits);
    memset(&c->slots[i], 0, sizeof c->slots[i]);
  }
  c->have_round = 0;
  c->max_round = 0;
}

void nb_seal_ctx_destroy(nb_seal_ctx_t* c) {
  if (!c) return;
  EVP_CIPHER_CTX_free(c->send); /* clears the expanded key schedule */
  EVP_CIPHER_CTX_free(c->recv);
  nb__rwin_clear(c);
  nb_free(c->slots);
  pthread_mutex_destroy(&c->send_mu);
  pthread_mutex_destroy(&c->recv_mu);
  OPENSSL_cleanse(c, sizeof *c);
  nb_free(c);
}

static nb_status_t nb__range(const nb_seal_ctx_t* c, uint64_t round, uint64_t chunk) {
  if (round > NB_SEAL_MAX_ROUND)
    return nb_error(NB_ERR_INVALID,
                    "round %llu does not fit the 32-bit round field of the nonce (start a new job "
                    "secret)",
                    (unsigned long long)round);
  if (chunk > NB_SEAL_MAX_CHUNK)
    return nb_error(NB_ERR_INVALID, "chunk %llu does not fit the 32-bit chunk field of the nonce",
                    (unsigned long long)chunk);
  if (chunk >= c->max_chunks)
    return nb_error(NB_ERR_INVALID, "chunk %llu >= NB_SEAL_MAX_CHUNKS (%llu)",
                    (unsigned long long)chunk, (unsigned long long)c->max_chunks);
  return NB_OK;
}

static void nb__nonce(const uint8_t tag[4], uint64_t round, uint64_t chunk, uint8_t n[12]) {
  memcpy(n, tag, 4);
  for (int i = 0; i < 4; i++) {
    n[4 + i] = (uint8_t)(round >> (24 - 8 * i));
    n[8 + i] = (uint8_t)(chunk >> (24 - 8 * i));
  }
}

nb_status_t nb_seal_nonce(const nb_seal_ctx_t* c, int sending, uint64_t round, uint64_t chunk,
                          uint8_t nonce[NB_SEAL_NONCE_BYTES]) {
  if (!c || !nonce) return nb_error(NB_ERR_INVALID, "NULL argument");
  NB_CHECK(nb__range(c, round, chunk));
  nb__nonce(sending ? c->send_tag : c->recv_tag, round, chunk, nonce);
  return NB_OK;
}

/* Feeds len bytes through EVP in pieces that fit an int. */
static int nb__update(EVP_CIPHER_CTX* e, int enc, uint8_t* out, const uint8_t* in, size_t len) {
  while (len) {
    int piece = (int)(len < NB__PIECE ? len : NB__PIECE), w = 0;
    int ok =
        enc ? EVP_EncryptUpdate(e, out, &w, in, piece) : EVP_DecryptUpdate(e, out, &w, in, piece);
    if (!ok || w != piece) return 0;
    if (out) out += piece;
    in += piece;
    len -= (size_t)piece;
  }
  return 1;
}

nb_status_t nb_seal_chunk(nb_seal_ctx_t* c, uint64_t round, uint64_t chunk, const void* aad,
                          size_t aad_len, const void* plain, size_t len, void* out,
                          size_t* out_len) {
  if (!c || !out || !out_len || (len && !plain) || (aad_len && !aad))
    return nb_error(NB_ERR_INVALID, "NULL argument to nb_seal_chunk");
  NB_CHECK(nb__range(c, round, chunk));
  if (len > NB_SEAL_MAX_CHUNK_BYTES)
    return nb_error(NB_ERR_INVALID, "chunk of %zu bytes is larger than the sealing limit", len);
  uint8_t iv[NB_SEAL_NONCE_BYTES];
  uint8_t* o = out;
  int w = 0, ok;
  pthread_mutex_lock(&c->send_mu);
  nb__nonce(c->send_tag, round, chunk, iv);
  ok = EVP_EncryptInit_ex2(c->send, NULL, NULL, iv, NULL) &&
       nb__update(c->send, 1, NULL, aad, aad_len) && nb__update(c->send, 1, o, plain, len) &&
       EVP_EncryptFinal_ex(c->send, o + len, &w) && w == 0 &&
       EVP_CIPHER_CTX_ctrl(c->send, EVP_CTRL_GCM_GET_TAG, NB_SEAL_TAG_BYTES, o + len) == 1;
  pthread_mutex_unlock(&c->send_mu);
  if (!ok) return nb__ossl_error(NB_ERR_CRYPTO, "AES-256-GCM sealing");
  *out_len = len + NB_SEAL_TAG_BYTES;
  return NB_OK;
}

/* Replay check and record; called with recv_mu held, after the tag verified. */
static nb_status_t nb__rwin_accept(nb_seal_ctx_t* c, uint64_t round, uint64_t chunk) {
  if (c->have_round && round + c->nslots <= c->max_round)
    return nb_error(NB_ERR_EXISTS,
                    "chunk (round %llu, chunk %llu) from '%s' is older than the replay window "
                    "(newest round %llu, window %u rounds): refused as a replay",
                    (unsigned long long)round, (unsigned long long)chunk, c->peer,
                    (unsigned long long)c->max_round, c->nslots);
  nb__rwin_slot_t* s = &c->slots[round % c->nslots];
  if (!s->used || s->round != round) { /* the slot held a round now outside the window */
    if (s->bits) memset(s->bits, 0, s->nwords * sizeof *s->bits);
    s->used = 1;
    s->round = round;
  }
  size_t word = (size_t)(chunk / 64);
  uint64_t bit = (uint64_t)1 << (chunk % 64);
  if (word < s->nwords && (s->bits[word] & bit))
    return nb_error(NB_ERR_EXISTS,
                    "chunk (round %llu, chunk %llu) from '%s' was already accepted: refused as a "
                    "replay",
                    (unsigned long long)round, (unsigned long long)chunk, c->peer);
  if (word >= s->nwords) {
    size_t nw = s->nwords ? s->nwords : 16;
    while (nw <= word) nw *= 2;
    NB_CHECK(nb_realloc((void**)&s->bits, nw, sizeof *s->bits, "replay window"));
    memset(s->bits + s->nwords, 0, (nw - s->nwords) * sizeof *s->bits);
    s->nwords = nw;
  }
  s->bits[word] |= bit;
  if (!c->have_round || round > c->max_round) c->max_round = round;
  c->have_round = 1;
  return NB_OK;
}

nb_status_t nb_open_chunk(nb_seal_ctx_t* c, uint64_t round, uint64_t chunk, const void* aad,
                          size_t aad_len, const void* sealed, size_t sealed_len, void* out,
                          size_t* out_len) {
  if (!c || !out || !out_len || !sealed || (aad_len && !aad))
    return nb_error(NB_ERR_INVALID, "NULL argument to nb_open_chunk");
  NB_CHECK(nb__range(c, round, chunk));
  if (sealed_len < NB_SEAL_TAG_BYTES) {
    NB_WARN(
        "sealed chunk (round %llu, chunk %llu) from cluster '%s' is %zu bytes, shorter than "
        "its tag: dropped",
        (unsigned long long)round, (unsigned long long)chunk, c->peer, sealed_len);
    return nb_error(NB_ERR_INTEGRITY,
                    "sealed chunk (round %llu, chunk %llu) from '%s' is truncated (%zu bytes)",
                    (unsigned long long)round, (unsigned long long)chunk, c->peer, sealed_len);
  }
  size_t len = sealed_len - NB_SEAL_TAG_BYTES;
  if (len > NB_SEAL_MAX_CHUNK_BYTES)
    return nb_error(NB_ERR_INVALID, "chunk of %zu bytes is larger than the sealing limit", len);
  const uint8_t* in = sealed;
  uint8_t tag[NB_SEAL_TAG_BYTES];
  memcpy(tag, in + len, sizeof tag); /* before an in-place decryption can overwrite it */
  uint8_t iv[NB_SEAL_NONCE_BYTES];
  int w = 0;
  nb_status_t st = NB_OK;
  pthread_mutex_lock(&c->recv_mu);
  nb__nonce(c->recv_tag, round, chunk, iv);
  int ok = EVP_DecryptInit_ex2(c->recv, NULL, NULL, iv, NULL) &&
           nb__update(c->recv, 0, NULL, aad, aad_len) && nb__update(c->recv, 0, out, in, len) &&
           EVP_CIPHER_CTX_ctrl(c->recv, EVP_CTRL_GCM_SET_TAG, NB_SEAL_TAG_BYTES, tag) == 1;
  if (ok && EVP_DecryptFinal_ex(c->recv, (uint8_t*)out + len, &w) > 0 && w == 0) {
    st = nb__rwin_accept(c, round, chunk);
    if (st != NB_OK) NB_INFO(SEC, "%s", nb_error_last());
  } else {
    ERR_clear_error();
    OPENSSL_cleanse(out, len); /* never hand out unauthenticated plaintext */
    st = nb_error(NB_ERR_INTEGRITY,
                  "sealed chunk (round %llu, chunk %llu, %zu bytes) from cluster '%s' to '%s' "
                  "failed authentication: tampered or truncated data or header, or a key of "
                  "another job, direction or epoch",
                  (unsigned long long)round, (unsigned long long)chunk, sealed_len, c->peer,
                  c->local);
    NB_WARN("%s; the chunk is dropped, not retried", nb_error_last());
  }
  pthread_mutex_unlock(&c->recv_mu);
  if (st == NB_OK) *out_len = len;
  return st;
}

uint32_t nb_seal_local_epoch(const nb_seal_ctx_t* c) {
  return c ? c->local_epoch : 0;
}

uint32_t nb_seal_peer_epoch(nb_seal_ctx_t* c) {
  if (!c) return 0;
  pthread_mutex_lock(&c->recv_mu);
  uint32_t e = c->peer_epoch;
  pthread_mutex_unlock(&c->recv_mu);
  return e;
}

nb_status_t nb_seal_set_peer_epoch(nb_seal_ctx_t* c, uint32_t epoch) {
  if (!c) return nb_error(NB_ERR_INVALID, "NULL context");
  pthread_mutex_lock(&c->recv_mu);
  nb_status_t st = NB_OK;
  if (epoch <= c->peer_epoch) {
    st = nb_error(NB_ERR_INVALID, "peer '%s' epoch %u is not newer than the current epoch %u",
                  c->peer, epoch, c->peer_epoch);
  } else {
    st = nb__key_dir(c, 0, epoch);
    if (st == NB_OK) {
      c->peer_epoch = epoch;
      nb__rwin_clear(c);
      NB_INFO(SEC, "peer '%s' moved to sealing epoch %u", c->peer, epoch);
    }
  }
  pthread_mutex_unlock(&c->recv_mu);
  return st;
}
