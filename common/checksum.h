/* Checksums through libraries where one has them: XXH3-64 (libxxhash) for frames and fast
 * content hashes, CRC-32 (zlib) where a format mandates it. CRC-32C is the one written here: no
 * library linked has it (zlib's is IEEE; Debian's abseil predates absl::crc32c). Not
 * cryptographic: integrity against an attacker is the job of security/ (AES-GCM tags, SHA-256). */
#ifndef NB_COMMON_CHECKSUM_H
#define NB_COMMON_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XXH3 64-bit hash of len bytes with a seed. data may be NULL when len is 0. Thread-safe. */
uint64_t nb_xxh3_64(const void* data, size_t len, uint64_t seed);

/* Streaming XXH3-64: init, update over pieces, digest (same result as one-shot). */
typedef struct nb_xxh3_state nb_xxh3_state_t;
nb_xxh3_state_t* nb_xxh3_create(uint64_t seed); /* NULL on out of memory; caller destroys */
void nb_xxh3_update(nb_xxh3_state_t* s, const void* data, size_t len);
uint64_t nb_xxh3_digest(const nb_xxh3_state_t* s);
void nb_xxh3_destroy(nb_xxh3_state_t* s);

/* CRC-32 (IEEE, zlib's crc32), continuing from crc (start with 0). */
uint32_t nb_crc32(uint32_t crc, const void* data, size_t len);

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as in iSCSI, ext4 and TFRecord),
 * continuing from crc (start with 0): nb_crc32c(0, "123456789", 9) = 0xE3069283. Table-driven,
 * one byte at a time: for file formats, not for bulk data. Thread-safe. */
uint32_t nb_crc32c(uint32_t crc, const void* data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
