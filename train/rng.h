/* Deterministic PRNG for initialisation and data order: splitmix64 seeding a xoshiro256**
 * stream. Same seed, same numbers on every machine; not cryptographic. */
#ifndef NB_TRAIN_RNG_H
#define NB_TRAIN_RNG_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint64_t s[4];
} nb_rng_t;

static inline uint64_t nb__splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Seeds the stream; every seed (0 included) gives a valid state. */
static inline void nb_rng_seed(nb_rng_t* r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = nb__splitmix64(&seed);
}

static inline uint64_t nb_rng_u64(nb_rng_t* r) {
  uint64_t* s = r->s;
  uint64_t x = s[1] * 5;
  uint64_t res = ((x << 7) | (x >> 57)) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = (s[3] << 45) | (s[3] >> 19);
  return res;
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double nb_rng_uniform(nb_rng_t* r) {
  return (double)(nb_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n), n > 0 (multiply-shift; bias below 2^-32 for n < 2^32). */
static inline uint64_t nb_rng_below(nb_rng_t* r, uint64_t n) {
  return (uint64_t)(((unsigned __int128)nb_rng_u64(r) * n) >> 64);
}

/* Standard normal by Box-Muller in double (one value per call; the pair's twin is dropped to
 * keep the stream position independent of call history). */
static inline double nb_rng_normal(nb_rng_t* r) {
  double u1 = nb_rng_uniform(r), u2 = nb_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#ifdef __cplusplus
}
#endif
#endif
