/* Persistent pthread pool behind nb_parallel_for: workers sleep on a condition variable, take
 * chunk indices from an atomic counter, and the caller waits for the last one. Started once,
 * lazily; the threads live until the process exits (they hold no resources worth releasing). */
#include "train/parallel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "common/common.h"

NB_PARAM_INT(TrainThreads, "NB_TRAIN_THREADS", 0, 0, 64,
             "threads for the training runtime's elementwise ops (0 = online CPUs)")

typedef struct {
  pthread_mutex_t mu;   /* guards generation/active and the condition variables */
  pthread_mutex_t busy; /* held by the one caller running a loop */
  pthread_cond_t wake, done;
  unsigned long generation;
  int n_threads; /* including the caller */
  int active;    /* workers still inside the current loop */
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

static void* nb__worker(void* arg) {
  nb__pool_t* p = arg;
  unsigned long seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
    seen = p->generation;
    pthread_mutex_unlock(&p->mu);
    nb__run_chunks(p);
    pthread_mutex_lock(&p->mu);
    if (--p->active == 0) pthread_cond_signal(&p->done);
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
  p->active = p->n_threads - 1;
  p->generation++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  nb__run_chunks(p);
  pthread_mutex_lock(&p->mu);
  while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_unlock(&p->busy);
}
