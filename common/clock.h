/* Clocks: monotonic for durations and deadlines, wall for timestamps in logs and reports. */
#ifndef NB_COMMON_CLOCK_H
#define NB_COMMON_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Nanoseconds from CLOCK_MONOTONIC. Never goes back. Thread-safe. */
int64_t nb_now_ns(void);
/* Seconds (double) from CLOCK_MONOTONIC. */
double nb_now_s(void);
/* Nanoseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t nb_wall_ns(void);
/* Sleeps at least ns nanoseconds (restarts on EINTR). */
void nb_sleep_ns(int64_t ns);

#ifdef __cplusplus
}
#endif
#endif
