/* Checksum wrappers over libxxhash and zlib, and CRC-32C, which neither has. */
#include "common/checksum.h"

#include <limits.h>
#include <pthread.h>
#include <xxhash.h>
#include <zlib.h>

uint64_t nb_xxh3_64(const void* data, size_t len, uint64_t seed) {
  return XXH3_64bits_withSeed(data, len, seed);
}

struct nb_xxh3_state {
  XXH3_state_t* st;
};

nb_xxh3_state_t* nb_xxh3_create(uint64_t seed) {
  XXH3_state_t* st = XXH3_createState();
  if (!st) return NULL;
  XXH3_64bits_reset_withSeed(st, seed);
  return (nb_xxh3_state_t*)st;
}

void nb_xxh3_update(nb_xxh3_state_t* s, const void* data, size_t len) {
  XXH3_64bits_update((XXH3_state_t*)s, data, len);
}

uint64_t nb_xxh3_digest(const nb_xxh3_state_t* s) {
  return XXH3_64bits_digest((const XXH3_state_t*)s);
}

void nb_xxh3_destroy(nb_xxh3_state_t* s) {
  if (s) XXH3_freeState((XXH3_state_t*)s);
}

uint32_t nb_crc32(uint32_t crc, const void* data, size_t len) {
  const unsigned char* p = data;
  uLong c = crc;
  while (len > 0) {
    uInt piece = len > UINT_MAX ? UINT_MAX : (uInt)len;
    c = crc32(c, p, piece);
    p += piece;
    len -= piece;
  }
  return (uint32_t)c;
}

/* CRC-32C's byte table, built once (256 entries of the reflected polynomial). */
static uint32_t nb__crc32c_table[256];
static pthread_once_t nb__crc32c_once = PTHREAD_ONCE_INIT;

static void nb__crc32c_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    nb__crc32c_table[i] = c;
  }
}

uint32_t nb_crc32c(uint32_t crc, const void* data, size_t len) {
  pthread_once(&nb__crc32c_once, nb__crc32c_init);
  const unsigned char* p = data;
  uint32_t c = ~crc;
  for (size_t i = 0; i < len; i++) c = nb__crc32c_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}
