/* Axis ticks and number labels for the run report's charts and tables: "nice" steps (1, 2 or 5
 * times a power of ten), labels with only the digits the step needs, bytes in kB/MB/GB. Not a
 * plotting library: linear axes only, no dates, no logarithmic scales. */
#ifndef NB_REPORT_REPORT_AXIS_H
#define NB_REPORT_REPORT_AXIS_H

#include <stddef.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_REPORT_TICKS_MAX 12 /* ticks of one axis, at most */
#define NB_REPORT_LABEL_MAX 24 /* a tick label, with its NUL */

typedef enum {
  NB_REPORT_UNIT_NONE = 0,        /* a plain number: 0.6, 1.0; 20k, 1.5M from 10 000 up */
  NB_REPORT_UNIT_BYTES = 1,       /* decimal prefixes: 500 B, 100 kB, 1.5 MB, 2 GB */
  NB_REPORT_UNIT_BYTES_PER_S = 2, /* as bytes, with "/s": 50 kB/s */
} nb_report_unit_t;

typedef struct {
  double lo, hi; /* the axis' ends: its first and last tick; they hold the data (within a
                    billionth of a step: binary rounding of 0.045 / 0.005) */
  double step;   /* between two ticks */
  int n;         /* ticks, 2..NB_REPORT_TICKS_MAX */
  double v[NB_REPORT_TICKS_MAX];
  char label[NB_REPORT_TICKS_MAX][NB_REPORT_LABEL_MAX]; /* v[i] formatted for unit */
} nb_report_axis_t;

/* The ticks of an axis covering [lo, hi]: the smallest step of 1, 2 or 5 x 10^k that spans the
 * range in at most max_intervals intervals (2..10), ticks at whole multiples of it, from the
 * last multiple <= lo to the first >= hi. integer != 0: no step below 1 (rounds, steps). A range
 * of one value is widened around it (by a tenth of its size, or to [0, 1] for 0). Every label on
 * one axis shares the prefix of the largest tick ("0", "100 kB", "200 kB") and shows only the
 * decimals the step needs ("0.6", "0.8", "1.0"); no exponent notation below 10^21. Ranges that
 * overflow when rounded outward (near DBL_MAX) get two ticks at lo and hi, labelled to three
 * significant digits.
 * out: borrowed, filled. Returns NB_OK; NB_ERR_INVALID when lo or hi is not finite, lo > hi,
 * max_intervals is outside 2..10 or out is NULL. Thread-safe. */
nb_status_t nb_report_axis(double lo, double hi, nb_report_unit_t unit, int integer,
                           int max_intervals, nb_report_axis_t* out);

/* One value with its unit, the prefix chosen from the value itself, to `digits` significant
 * digits (1..15; clamped) without trailing zeros after the point: 10084 bytes at 3 digits →
 * "10.1 kB", 0.05 → "0.05", 453500 → "454k" (a plain number gets a prefix from 10 000 up).
 * buf: borrowed, cap bytes (NB_REPORT_LABEL_MAX fits every value). Returns buf, holding "" when
 * v is not finite (the caller shows a dash); NULL when buf is NULL or cap is 0. Thread-safe. */
const char* nb_report_format(double v, nb_report_unit_t unit, int digits, char* buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
