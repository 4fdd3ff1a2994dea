/* The decoder fuzz entry shared by the libFuzzer target and the corpus runner. */
#ifndef NB_TESTS_FUZZ_DECODE_H
#define NB_TESTS_FUZZ_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Decodes `data` as a frame (frame info, then decode-and-accumulate into a buffer of the n the
 * header declares, up to 2^20) and traps if a frame it accepts yields a non-finite value. */
nb_status_t nb_fuzz_decode(const uint8_t* data, size_t size);

/* The same on a copy whose checksum was recomputed, so that mutations of the payload reach the
 * section parsers instead of stopping at the checksum. */
void nb_fuzz_decode_resealed(const uint8_t* data, size_t size);

/* Encoder round trip driven by the bytes: byte 0 the value type (and bit 7: dense), byte 1 the
 * top-k chunk, byte 2 zstd and density, byte 3 the scale block, then fp32 values (NaN -> 0,
 * +-inf -> +-FLT_MAX). Traps unless the input encodes, decodes, every decoded value and the
 * residual are finite, and sent + residual == input up to one rounding. */
void nb_fuzz_encode(const uint8_t* data, size_t size);

#endif
