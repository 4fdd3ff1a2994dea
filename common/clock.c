/* Clock wrappers over clock_gettime. */
#include "common/clock.h"

#include <errno.h>
#include <time.h>

int64_t nb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double nb_now_s(void) {
  return (double)nb_now_ns() * 1e-9;
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
