/* Token-bucket rate limiter for the operator's bandwidth cap on a WAN link: callers acquire bytes
 * before sending them and sleep until the bucket allows it. Waiters are served in arrival order,
 * and the rate can change while they wait. It paces senders; it does not measure the link (see
 * inter/estimator.h) and does not queue or send data itself. */
#ifndef NB_INTER_RATELIMIT_H
#define NB_INTER_RATELIMIT_H

#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_ratelimit nb_ratelimit_t;

typedef struct {
  uint64_t bytes;     /* bytes granted so far */
  uint64_t acquires;  /* successful acquire calls */
  uint64_t waits;     /* acquire calls that had to sleep */
  double wait_s;      /* total time spent sleeping in acquire, all threads */
  double rate_Bps;    /* current rate in bytes/s (0 = unlimited) */
  double burst_bytes; /* current burst */
} nb_ratelimit_stats_t;

/* Creates a limiter. rate_Bps: bytes per second, 0 = unlimited. burst_bytes: bytes that may pass
 * at once after an idle period (the bucket starts full); 0 picks 10 ms at the rate, at least
 * 16 KiB (one smallest link chunk). Returns NB_ERR_INVALID for a negative, NaN or infinite rate or
 * burst, NB_ERR_NOMEM, NB_ERR_SYSTEM. *out is owned by the caller (nb_ratelimit_destroy). */
nb_status_t nb_ratelimit_create(double rate_Bps, double burst_bytes, nb_ratelimit_t** out);

/* As nb_ratelimit_create, on the time source clk (NULL = nb_clock_real()): the bucket refills
 * and waiters sleep on clk's time, and deadlines are on clk's scale, so tests can run the limiter
 * in virtual time (nb_vclock_t). clk is copied; its ctx is borrowed and must outlive the limiter.
 * Returns also NB_ERR_INVALID for a clock without now_ns or wait_until. */
nb_status_t nb_ratelimit_create_clock(double rate_Bps, double burst_bytes, const nb_clock_t* clk,
                                      nb_ratelimit_t** out);

/* Destroys the limiter. No thread may be inside acquire (cancel and join them first). NULL ok. */
void nb_ratelimit_destroy(nb_ratelimit_t* rl);

/* Changes the rate (and burst; burst_bytes 0 keeps the current burst, or picks the default when
 * the limiter was unlimited). Bytes already reserved by sleeping callers are paid at the new rate
 * from now on: waiters wake and recompute. Returns NB_ERR_INVALID for bad values. Thread-safe. */
nb_status_t nb_ratelimit_set_rate(nb_ratelimit_t* rl, double rate_Bps, double burst_bytes);

/* Takes `bytes` from the bucket, sleeping until they are available. A request larger than the
 * burst is allowed and waits (bytes - available) / rate. Returns NB_OK, NB_ERR_CANCELLED after
 * nb_ratelimit_cancel, NB_ERR_INVALID for rl NULL. Thread-safe; callers are served FIFO. */
nb_status_t nb_ratelimit_acquire(nb_ratelimit_t* rl, size_t bytes);

/* As nb_ratelimit_acquire, but gives up at deadline_ns (on the limiter's clock: nb_now_ns unless
 * created with another): returns NB_ERR_TIMEOUT at once, without reserving, when the wait
 * predicted at the current rate ends after the deadline; if the rate drops while waiting and the
 * deadline passes, returns NB_ERR_TIMEOUT and the reservation stays consumed (the limiter errs on
 * the slow side). */
nb_status_t nb_ratelimit_acquire_until(nb_ratelimit_t* rl, size_t bytes, int64_t deadline_ns);

/* Non-blocking: takes the bytes and returns 1 if they are available now, else 0 (nothing taken,
 * nothing reserved). Thread-safe. */
int nb_ratelimit_try_acquire(nb_ratelimit_t* rl, size_t bytes);

/* Wakes every waiter with NB_ERR_CANCELLED; later acquires fail the same way. For shutdown. */
void nb_ratelimit_cancel(nb_ratelimit_t* rl);

/* Current counters and settings. Thread-safe. */
void nb_ratelimit_stats(nb_ratelimit_t* rl, nb_ratelimit_stats_t* out);

#ifdef __cplusplus
}
#endif
#endif
