/* Persistent pthread pool behind nb_parallel_for: workers take chunk indices from an atomic
 * counter, and the caller waits for the last one. Between loops a worker (and the caller, for the
 * last chunk) first spins for up to NB__SPIN_S watching an atomic, then sleeps on a condition
 * variable: a training step runs a few hundred loops with microseconds between them, and a
 * wake-up through the scheduler for each cost more than the gaps (the way OpenMP runtimes wait).
 * Started once, lazily; the threads live until the process exits (they hold no resources worth
 * releasing). */
#include "train/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "common/common.h"

NB_PARAM_INT(TrainThreads, "NB_TRAIN_THREADS", 0, 0, 64,
             "threads for the training runtime's elementwise ops (0 = online CPUs)")

#define NB__SPIN_S 100e-6 /* how long a waiting thread spins before it sleeps */

typedef struct {
  pthread_mutex_t mu;   /* the condition variables' (a sleeper checks and waits under it) */
  pthread_mutex_t busy; /* held by the one caller running a loop */
  pthread_cond_t wake, done;
  atomic_ulong generation; /* one more per loop: workers watch it */
  int n_threads;           /* including the caller */
  atomic_int active;       /* workers still inside the current loop */
  void (*fn)(void*, size_t);
  void* ctx;
  size_t n_chunks;
  atomic_size_t next;
} nb__pool_t;

static nb__pool_t nb__pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
                              .busy = PTHREAD_MUTEX_INITIALIZER,
                              .wake = PTHREAD_COND_INITIALIZER,
                              .done = PTHREAD_COND_INITIALIZER};
static pthread_once_t nb__pool_once = PTHREAD_ONCE_INIT;

static void nb__run_chunks(nb__pool_t* p) {
  for (;;) {
    size_t i = atomic_fetch_add(&p->next, 1);
    if (i >= p->n_chunks) break;
    p->fn(p->ctx, i);
  }
}

static inline void nb__relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  sched_yield();
#endif
}

/* Spins until *a != v (generation) or up to NB__SPIN_S; returns the value last seen. */
static unsigned long nb__spin_change(atomic_ulong* a, unsigned long v) {
  double t0 = 0;
  for (unsigned i = 0;; i++) {
    unsigned long now = atomic_load_explicit(a, memory_order_acquire);
    if (now != v) return now;
    if ((i & 63) == 63) {
      double t = nb_now_s();
      if (t0 == 0)
        t0 = t;
      else if (t - t0 > NB__SPIN_S)
        return now;
    }
    nb__relax();
  }
}

static void* nb__worker(void* arg) {
  nb__pool_t* p = arg;
  unsigned long seen = 0;
  for (;;) {
    unsigned long g = nb__spin_change(&p->generation, seen);
    if (g == seen) { /* nothing came while spinning: sleep until the next loop */
      pthread_mutex_lock(&p->mu);
      while ((g = atomic_load(&p->generation)) == seen) pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    seen = g;
    nb__run_chunks(p);
    if (atomic_fetch_sub(&p->active, 1) == 1) { /* the last one out wakes a sleeping caller */
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
  return NULL;
}

/* A forked child has none of the parent's workers: it runs every loop inline from then on. */
static void nb__pool_after_fork(void) {
  pthread_mutex_init(&nb__pool.mu, NULL);
  pthread_mutex_init(&nb__pool.busy, NULL);
  pthread_cond_init(&nb__pool.wake, NULL);
  pthread_cond_init(&nb__pool.done, NULL);
  nb__pool.n_threads = 1;
}

static void nb__pool_start(void) {
  pthread_atfork(NULL, NULL, nb__pool_after_fork);
  long want = (long)nb_param_TrainThreads();
  if (want == 0) want = sysconf(_SC_NPROCESSORS_ONLN);
  if (want < 1) want = 1;
  if (want > 64) want = 64;
  int started = 1;
  for (long i = 1; i < want; i++) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, nb__worker, &nb__pool) == 0) started++;
    pthread_attr_destroy(&a);
  }
  nb__pool.n_threads = started;
  NB_INFO(TRAIN, "elementwise thread pool: %d threads", started);
}

int nb_parallel_threads(void) {
  pthread_once(&nb__pool_once, nb__pool_start);
  return nb__pool.n_threads;
}

void nb_parallel_for(size_t n_chunks, void (*fn)(void* ctx, size_t i), void* ctx) {
  nb__pool_t* p = &nb__pool;
  if (n_chunks == 0) return;
  if (n_chunks == 1 || nb_parallel_threads() <= 1 || pthread_mutex_trylock(&p->busy) != 0) {
    for (size_t i = 0; i < n_chunks; i++) fn(ctx, i);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->n_chunks = n_chunks;
  atomic_store(&p->next, 0);
  atomic_store(&p->active, p->n_threads - 1);
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release); /* publishes the above */
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  nb__run_chunks(p);
  double t0 = 0;
  for (unsigned i = 0; atomic_load_explicit(&p->active, memory_order_acquire) > 0; i++) {
    if ((i & 63) == 63) {
      double t = nb_now_s();
      if (t0 == 0) {
        t0 = t;
      } else if (t - t0 > NB__SPIN_S) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->active) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
        break;
      }
    }
    nb__relax();
  }
  pthread_mutex_unlock(&p->busy);
}
