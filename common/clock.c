/* Clock wrappers over clock_gettime, the real nb_clock_t, and the virtual clock for tests. The
 * virtual clock never touches a waiter's mutex or condition from another thread: a waiter in
 * wait_until re-reads virtual time every millisecond of real time, so an advance needs no
 * lifetime contract with the objects that wait. */
#include "common/clock.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"

int64_t nb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void nb_cond_init_mono(pthread_cond_t* c) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(c, &a);
  pthread_condattr_destroy(&a);
}

int nb_cond_wait_until(pthread_cond_t* c, pthread_mutex_t* m, int64_t abs_ns) {
  struct timespec ts = {.tv_sec = abs_ns / 1000000000LL, .tv_nsec = abs_ns % 1000000000LL};
  return pthread_cond_timedwait(c, m, &ts);
}

double nb_now_s(void) {
  return (double)nb_now_ns() * 1e-9;
}

char* nb_duration_format(double s, char* buf, size_t cap) {
  if (!(s >= 0) || !isfinite(s) || s > 1e9) {
    snprintf(buf, cap, "?");
    return buf;
  }
  long t = lround(s);
  if (t < 60)
    snprintf(buf, cap, "%ld s", t);
  else if (t < 3600)
    snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
  else if (t < 86400)
    snprintf(buf, cap, "%ldh%02ldm", t / 3600, t % 3600 / 60);
  else
    snprintf(buf, cap, "%ldd%02ldh", t / 86400, t % 86400 / 3600);
  return buf;
}

int64_t nb_wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void nb_sleep_ns(int64_t ns) {
  if (ns <= 0) return;
  struct timespec req = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL}, rem;
  while (nanosleep(&req, &rem) != 0 && errno == EINTR) req = rem;
}

static struct timespec ts_of(int64_t ns) {
  if (ns < 0) ns = 0;
  return (struct timespec){.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
}

int nb_clock_cond_init(pthread_cond_t* cv) {
  pthread_condattr_t ca;
  int e = pthread_condattr_init(&ca);
  if (e) return e;
  e = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (!e) e = pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
  return e;
}

/* ---- the real clock ---- */

static int64_t real_now(void* ctx) {
  (void)ctx;
  return nb_now_ns();
}

static void real_sleep_until(void* ctx, int64_t deadline_ns) {
  (void)ctx;
  nb_sleep_ns(deadline_ns - nb_now_ns());
}

static void real_wait_until(void* ctx, pthread_cond_t* cv, pthread_mutex_t* mu,
                            int64_t deadline_ns) {
  (void)ctx;
  struct timespec ts = ts_of(deadline_ns);
  (void)pthread_cond_timedwait(cv, mu, &ts); /* timeout, signal or spurious: the caller re-checks */
}

static const nb_clock_t g_real = {
    .now_ns = real_now, .sleep_until = real_sleep_until, .wait_until = real_wait_until};

const nb_clock_t* nb_clock_real(void) {
  return &g_real;
}

/* ---- the virtual clock ---- */

typedef struct vwaiter {
  int64_t deadline;
  struct vwaiter* next;
} vwaiter_t;

struct nb_vclock {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every advance and every start and end of a wait */
  int64_t now;
  int auto_advance;
  uint64_t waits;
  vwaiter_t* waiting; /* threads waiting now; each node lives on its waiter's stack */
  nb_clock_t clk;
};

/* Caller holds vc->mu. */
static void vc_add(nb_vclock_t* vc, vwaiter_t* w, int64_t deadline) {
  w->deadline = deadline;
  w->next = vc->waiting;
  vc->waiting = w;
  vc->waits++;
  pthread_cond_broadcast(&vc->cv);
}

static void vc_remove(nb_vclock_t* vc, vwaiter_t* w) {
  for (vwaiter_t** p = &vc->waiting; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  pthread_cond_broadcast(&vc->cv);
}

/* Caller holds vc->mu. Returns 1 when the caller should wait for deadline, 0 when it has been
 * reached (in auto_advance mode, by moving the clock there). */
static int vc_must_wait(nb_vclock_t* vc, int64_t deadline) {
  if (vc->now >= deadline) return 0;
  if (!vc->auto_advance) return 1;
  vc->now = deadline;
  vc->waits++;
  pthread_cond_broadcast(&vc->cv);
  return 0;
}

static int64_t v_now(void* ctx) {
  nb_vclock_t* vc = ctx;
  pthread_mutex_lock(&vc->mu);
  int64_t t = vc->now;
  pthread_mutex_unlock(&vc->mu);
  return t;
}

static void v_sleep_until(void* ctx, int64_t deadline_ns) {
  nb_vclock_t* vc = ctx;
  pthread_mutex_lock(&vc->mu);
  if (vc_must_wait(vc, deadline_ns)) {
    vwaiter_t w;
    vc_add(vc, &w, deadline_ns);
    while (vc->now < deadline_ns) pthread_cond_wait(&vc->cv, &vc->mu);
    vc_remove(vc, &w);
  }
  pthread_mutex_unlock(&vc->mu);
}

static void v_wait_until(void* ctx, pthread_cond_t* cv, pthread_mutex_t* mu, int64_t deadline_ns) {
  nb_vclock_t* vc = ctx;
  vwaiter_t w;
  pthread_mutex_lock(&vc->mu); /* lock order: the caller's mu, then vc->mu */
  int must = vc_must_wait(vc, deadline_ns);
  if (must) vc_add(vc, &w, deadline_ns);
  pthread_mutex_unlock(&vc->mu);
  if (!must) return;
  for (;;) {
    /* One real millisecond at a time: a signal on cv ends the wait; a timeout re-reads the
     * virtual time. */
    struct timespec ts = ts_of(nb_now_ns() + 1000000);
    int e = pthread_cond_timedwait(cv, mu, &ts);
    pthread_mutex_lock(&vc->mu);
    int done = e != ETIMEDOUT || vc->now >= deadline_ns;
    if (done) vc_remove(vc, &w);
    pthread_mutex_unlock(&vc->mu);
    if (done) return;
  }
}

nb_status_t nb_vclock_create(int64_t start_ns, int auto_advance, nb_vclock_t** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "virtual clock: out is NULL");
  *out = NULL;
  nb_vclock_t* vc = NULL;
  NB_CHECK(nb_calloc((void**)&vc, 1, sizeof *vc, "virtual clock"));
  int e1 = pthread_mutex_init(&vc->mu, NULL);
  int e2 = nb_clock_cond_init(&vc->cv);
  if (e1 || e2) {
    if (!e1) pthread_mutex_destroy(&vc->mu);
    if (!e2) pthread_cond_destroy(&vc->cv);
    nb_free(vc);
    return nb_error(NB_ERR_SYSTEM, "virtual clock: cannot initialise mutex/condition (%d/%d)", e1,
                    e2);
  }
  vc->now = start_ns;
  vc->auto_advance = auto_advance != 0;
  vc->clk = (nb_clock_t){
      .now_ns = v_now, .sleep_until = v_sleep_until, .wait_until = v_wait_until, .ctx = vc};
  *out = vc;
  return NB_OK;
}

void nb_vclock_destroy(nb_vclock_t* vc) {
  if (!vc) return;
  pthread_cond_destroy(&vc->cv);
  pthread_mutex_destroy(&vc->mu);
  nb_free(vc);
}

const nb_clock_t* nb_vclock_clock(nb_vclock_t* vc) {
  return vc ? &vc->clk : NULL;
}

int64_t nb_vclock_now(nb_vclock_t* vc) {
  return v_now(vc);
}

void nb_vclock_advance(nb_vclock_t* vc, int64_t dt_ns) {
  if (!vc || dt_ns <= 0) return;
  pthread_mutex_lock(&vc->mu);
  vc->now += dt_ns;
  pthread_cond_broadcast(&vc->cv);
  pthread_mutex_unlock(&vc->mu);
}

uint64_t nb_vclock_waits(nb_vclock_t* vc) {
  pthread_mutex_lock(&vc->mu);
  uint64_t n = vc->waits;
  pthread_mutex_unlock(&vc->mu);
  return n;
}

int64_t nb_vclock_next_deadline(nb_vclock_t* vc) {
  pthread_mutex_lock(&vc->mu);
  int64_t d = -1;
  for (vwaiter_t* w = vc->waiting; w; w = w->next)
    if (d < 0 || w->deadline < d) d = w->deadline;
  pthread_mutex_unlock(&vc->mu);
  return d;
}

nb_status_t nb_vclock_wait_waits(nb_vclock_t* vc, uint64_t n, int64_t timeout_ms) {
  if (!vc) return nb_error(NB_ERR_INVALID, "virtual clock: NULL");
  struct timespec ts = ts_of(nb_now_ns() + timeout_ms * 1000000LL);
  nb_status_t st = NB_OK;
  pthread_mutex_lock(&vc->mu);
  while (vc->waits < n || !vc->waiting)
    if (pthread_cond_timedwait(&vc->cv, &vc->mu, &ts) == ETIMEDOUT) {
      st = nb_error(NB_ERR_TIMEOUT, "virtual clock: %llu waits begun, %s waiting, after %lld ms",
                    (unsigned long long)vc->waits, vc->waiting ? "some" : "none",
                    (long long)timeout_ms);
      break;
    }
  pthread_mutex_unlock(&vc->mu);
  return st;
}
