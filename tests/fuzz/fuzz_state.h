/* The session state file's fuzz entry (fuzz_state.c), shared by the libFuzzer target and the
 * replay test (state_replay.c). */
#ifndef NB_TESTS_FUZZ_STATE_H
#define NB_TESTS_FUZZ_STATE_H

#include <stddef.h>
#include <stdint.h>

#include <nebula.h>

/* Loads bytes[0..len) as a state file into the harness's session (made once: one cluster, an
 * fp32 tensor "w" of 3x4 and a bf16 tensor "h" of 5, started), as given and again with its
 * trailing XXH3-64 recomputed. Aborts when a load gives another status than NB_OK,
 * NB_ERR_INVALID, NB_ERR_CONFIG or NB_ERR_INTEGRITY, when a refused load changed theta_global
 * or the buffers, or when a loaded one left a non-finite value in them. Returns the second
 * load's status. */
nb_status_t nb_fuzz_state(const uint8_t* bytes, size_t len);

/* A valid state file of the harness's session (a round run first), malloc'd into *out. */
void nb_fuzz_state_seed(uint8_t** out, size_t* len);

#endif
