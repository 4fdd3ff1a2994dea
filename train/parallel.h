/* A small persistent thread pool for the training runtime's elementwise work (GELU, LayerNorm,
 * softmax, AdamW). Work is split into a FIXED number of chunks chosen by the caller, never by
 * the thread count, so results are bit-identical whatever NB_TRAIN_THREADS says. Not a general
 * task scheduler: one parallel loop at a time; a concurrent caller runs its loop inline, and so
 * does a process forked after the pool started (it has no workers). */
#ifndef NB_TRAIN_PARALLEL_H
#define NB_TRAIN_PARALLEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls fn(ctx, i) for every i in [0, n_chunks), spread over the pool (the caller's thread takes
 * part) and returns when all are done. fn must only touch data owned by chunk i. Falls back to a
 * plain loop when the pool has one thread, could not start, or is busy. Thread-safe. */
void nb_parallel_for(size_t n_chunks, void (*fn)(void* ctx, size_t i), void* ctx);

/* Threads the pool uses (NB_TRAIN_THREADS, 0 = online CPUs, capped at 64). */
int nb_parallel_threads(void);

/* Splits [0, n) into `chunks` nearly equal parts: part i is [*b, *e). */
static inline void nb_parallel_range(size_t n, size_t chunks, size_t i, size_t* b, size_t* e) {
  *b = n * i / chunks;
  *e = n * (i + 1) / chunks;
}

#ifdef __cplusplus
}
#endif
#endif
