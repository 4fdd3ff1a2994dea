/* Clocks: monotonic for durations and deadlines, wall for timestamps in logs and reports, and an
 * injectable time source (nb_clock_t) for code that waits, with a virtual clock that tests set and
 * advance. The virtual clock is for tests and simulations; it is not a scheduler. */
#ifndef NB_COMMON_CLOCK_H
#define NB_COMMON_CLOCK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nanoseconds from CLOCK_MONOTONIC. Never goes back. Thread-safe. */
int64_t nb_now_ns(void);

/* A condition variable whose timed waits run on nb_now_ns's clock (CLOCK_MONOTONIC), and a wait
 * on one until abs_ns of that clock; the wait returns pthread_cond_timedwait's result (0 when
 * woken, ETIMEDOUT at the deadline). */
void nb_cond_init_mono(pthread_cond_t* c);
int nb_cond_wait_until(pthread_cond_t* c, pthread_mutex_t* m, int64_t abs_ns);
/* Seconds (double) from CLOCK_MONOTONIC. */
double nb_now_s(void);
/* Nanoseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t nb_wall_ns(void);
/* Sleeps at least ns nanoseconds (restarts on EINTR). */
void nb_sleep_ns(int64_t ns);
/* A duration for people, into buf (cap bytes, at least 16): "42 s", "3m05s", "2h07m", "3d04h";
 * "?" when s is negative or not finite (an ETA not known yet). Returns buf. */
char* nb_duration_format(double s, char* buf, size_t cap);

/* A time source for code that reads the time and waits for it: components that take one
 * (nb_ratelimit_create_clock, nb_estimator_create_clock) use it for every reading and every timed
 * wait, so a test can run them in virtual time. All three callbacks get `ctx`; all are
 * thread-safe. Times are nanoseconds on the clock's own monotonic scale. */
typedef struct nb_clock {
  /* The current time. Never goes back. */
  int64_t (*now_ns)(void* ctx);
  /* Blocks until the clock reaches deadline_ns (returns at once if it has). */
  void (*sleep_until)(void* ctx, int64_t deadline_ns);
  /* As pthread_cond_timedwait with an absolute deadline on this clock: called with mu locked,
   * releases it while waiting and returns with it locked, once cv is signalled, the clock has
   * reached deadline_ns, or spuriously; the caller re-checks its condition. cv must have been
   * initialised by nb_clock_cond_init. */
  void (*wait_until)(void* ctx, pthread_cond_t* cv, pthread_mutex_t* mu, int64_t deadline_ns);
  void* ctx;
} nb_clock_t;

/* The real clock: CLOCK_MONOTONIC (nb_now_ns), nanosleep, pthread_cond_timedwait. A static
 * object, never freed. */
const nb_clock_t* nb_clock_real(void);

/* Initialises cv for nb_clock_t.wait_until on any clock (CLOCK_MONOTONIC attribute). Returns
 * 0 or the pthread error number. */
int nb_clock_cond_init(pthread_cond_t* cv);

/* ---- virtual clock, for tests ---- */
typedef struct nb_vclock nb_vclock_t;

/* Creates a virtual clock reading start_ns. auto_advance 0: time moves only by
 * nb_vclock_advance, and a waiter sleeps until another thread advances to its deadline (or, in
 * wait_until, until its cv is signalled; such a waiter re-reads the virtual time every
 * millisecond of real time, so an advance never touches the waiter's mutex). auto_advance 1: a wait
 * for a future time moves the clock to that time and returns at once, so single-threaded code runs
 * through its waits instantly and the clock then reads exactly the time the waits added up to.
 * Returns NB_ERR_INVALID (out NULL), NB_ERR_NOMEM, NB_ERR_SYSTEM. *out is owned by the caller
 * (nb_vclock_destroy). */
nb_status_t nb_vclock_create(int64_t start_ns, int auto_advance, nb_vclock_t** out);

/* No thread may be waiting on it, and nothing that holds its nb_clock_t may use it later. NULL
 * ok. */
void nb_vclock_destroy(nb_vclock_t* vc);

/* The nb_clock_t that reads this clock; borrowed, valid until nb_vclock_destroy. */
const nb_clock_t* nb_vclock_clock(nb_vclock_t* vc);

/* Current virtual time. Thread-safe. */
int64_t nb_vclock_now(nb_vclock_t* vc);

/* Moves the clock forward by dt_ns (>= 0; negative is ignored) and wakes the waiters whose
 * deadline it reaches. Thread-safe. */
void nb_vclock_advance(nb_vclock_t* vc, int64_t dt_ns);

/* Waits that have begun on this clock so far (sleep_until and wait_until calls for a time in the
 * future; in auto_advance mode, each jump). Thread-safe. */
uint64_t nb_vclock_waits(nb_vclock_t* vc);

/* The earliest deadline among threads waiting on the clock now, or -1 when none waits.
 * Thread-safe. */
int64_t nb_vclock_next_deadline(nb_vclock_t* vc);

/* Blocks until at least n waits have begun (nb_vclock_waits >= n) and a thread is waiting now:
 * how a test knows that the thread it started has reached its wait. timeout_ms is real time and
 * only bounds a hang: returns NB_ERR_TIMEOUT when it passes, else NB_OK. Thread-safe. */
nb_status_t nb_vclock_wait_waits(nb_vclock_t* vc, uint64_t n, int64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
