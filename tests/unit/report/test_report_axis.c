/* The report's axis ticks and unit labels (report/report_axis.h): given ranges give exact label
 * lists (1, 2, 5 x 10^k steps, only the digits the step needs, bytes with decimal prefixes, no
 * exponent notation), single values and huge ranges are handled, bad arguments are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "report/report_axis.h"

/* The axis of [lo, hi] has exactly the labels of want (NULL-terminated), printed on mismatch. */
static void expect_ticks(double lo, double hi, nb_report_unit_t u, int integer, int max_iv,
                         const char* const* want) {
  nb_report_axis_t ax;
  assert_int_equal(nb_report_axis(lo, hi, u, integer, max_iv, &ax), NB_OK);
  int n = 0;
  while (want[n]) n++;
  char got[512] = "";
  for (int i = 0; i < ax.n; i++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s\"%s\"", i ? " " : "", ax.label[i]);
  if (ax.n != n) fail_msg("[%g, %g]: %d ticks %s, expected %d", lo, hi, ax.n, got, n);
  for (int i = 0; i < n; i++)
    if (strcmp(ax.label[i], want[i]) != 0)
      fail_msg("[%g, %g]: tick %d is \"%s\" (all: %s), expected \"%s\"", lo, hi, i, ax.label[i],
               got, want[i]);
  /* the axis covers the data, its ends are ticks, ticks are evenly spaced */
  assert_true(ax.lo <= lo + 1e-9 * ax.step && ax.hi >= hi - 1e-9 * ax.step);
  assert_true(ax.v[0] == ax.lo && ax.v[ax.n - 1] == ax.hi);
  for (int i = 1; i < ax.n; i++)
    assert_true(fabs(ax.v[i] - ax.v[i - 1] - ax.step) <= 1e-9 * fabs(ax.step));
}

static void test_ticks_plain(void** state) {
  (void)state;
  /* the loss axis: 0.6197..1.118 was labelled 0.6197, 0.8687, 1.118 */
  expect_ticks(0.6197, 1.118, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"0.6", "0.8", "1.0", "1.2", NULL});
  expect_ticks(4.385, 5.437, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"4.0", "4.5", "5.0", "5.5", NULL});
  expect_ticks(0, 1, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"0", "0.2", "0.4", "0.6", "0.8", "1.0", NULL});
  expect_ticks(0.001, 0.1, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"0", "0.02", "0.04", "0.06", "0.08", "0.10", NULL});
  expect_ticks(0.0454, 0.1278, NB_REPORT_UNIT_NONE, 0, 6,
               (const char*[]){"0.04", "0.06", "0.08", "0.10", "0.12", "0.14", NULL});
  expect_ticks(-0.3, 0.25, NB_REPORT_UNIT_NONE, 0, 6,
               (const char*[]){"-0.3", "-0.2", "-0.1", "0", "0.1", "0.2", "0.3", NULL});
  /* large plain numbers: a prefix from 10 000 up, never 4.535e+05 */
  expect_ticks(0, 453500, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"0", "100k", "200k", "300k", "400k", "500k", NULL});
  expect_ticks(1200, 4800, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"1000", "2000", "3000", "4000", "5000", NULL});
  expect_ticks(0, 2.5e6, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"0", "0.5M", "1.0M", "1.5M", "2.0M", "2.5M", NULL});
}

static void test_ticks_integer(void** state) {
  (void)state;
  /* rounds 1..6: no tick between two rounds */
  expect_ticks(1, 6, NB_REPORT_UNIT_NONE, 1, 6,
               (const char*[]){"1", "2", "3", "4", "5", "6", NULL});
  expect_ticks(1, 3, NB_REPORT_UNIT_NONE, 1, 6, (const char*[]){"1", "2", "3", NULL});
  expect_ticks(4, 24, NB_REPORT_UNIT_NONE, 1, 6,
               (const char*[]){"0", "5", "10", "15", "20", "25", NULL});
  /* one round: widened by one on either side */
  expect_ticks(1, 1, NB_REPORT_UNIT_NONE, 1, 6, (const char*[]){"0", "1", "2", NULL});
}

static void test_ticks_bytes(void** state) {
  (void)state;
  expect_ticks(0, 453500, NB_REPORT_UNIT_BYTES, 0, 5,
               (const char*[]){"0", "100 kB", "200 kB", "300 kB", "400 kB", "500 kB", NULL});
  expect_ticks(1493, 1962, NB_REPORT_UNIT_BYTES, 0, 5,
               (const char*[]){"1.4 kB", "1.6 kB", "1.8 kB", "2.0 kB", NULL});
  expect_ticks(0, 800, NB_REPORT_UNIT_BYTES, 0, 5,
               (const char*[]){"0", "200 B", "400 B", "600 B", "800 B", NULL});
  expect_ticks(0, 3.2e9, NB_REPORT_UNIT_BYTES, 0, 5,
               (const char*[]){"0", "1 GB", "2 GB", "3 GB", "4 GB", NULL});
  expect_ticks(
      2.75e7, 1.1e8, NB_REPORT_UNIT_BYTES_PER_S, 0, 5,
      (const char*[]){"20 MB/s", "40 MB/s", "60 MB/s", "80 MB/s", "100 MB/s", "120 MB/s", NULL});
}

static void test_ticks_edges(void** state) {
  (void)state;
  /* one value: a tenth of it either side, or [0, 1] for 0 */
  expect_ticks(0.05, 0.05, NB_REPORT_UNIT_NONE, 0, 5,
               (const char*[]){"0.045", "0.050", "0.055", NULL});
  expect_ticks(0, 0, NB_REPORT_UNIT_BYTES, 0, 5,
               (const char*[]){"0", "0.2 B", "0.4 B", "0.6 B", "0.8 B", "1.0 B", NULL});
  /* a span that overflows when rounded outward: two ticks at the ends, finite */
  nb_report_axis_t ax;
  assert_int_equal(nb_report_axis(-DBL_MAX, DBL_MAX, NB_REPORT_UNIT_NONE, 0, 5, &ax), NB_OK);
  assert_true(ax.n >= 2 && ax.n <= NB_REPORT_TICKS_MAX);
  for (int i = 0; i < ax.n; i++) assert_true(isfinite(ax.v[i]));
  assert_int_equal(nb_report_axis(1e300, 1e300, NB_REPORT_UNIT_NONE, 0, 5, &ax), NB_OK);
  for (int i = 0; i < ax.n; i++) assert_true(isfinite(ax.v[i]));
  /* a tiny span far from zero still gets distinct labels */
  assert_int_equal(nb_report_axis(1.0000001, 1.0000004, NB_REPORT_UNIT_NONE, 0, 5, &ax), NB_OK);
  for (int i = 1; i < ax.n; i++) assert_string_not_equal(ax.label[i], ax.label[i - 1]);
  /* refused */
  assert_int_equal(nb_report_axis(NAN, 1, NB_REPORT_UNIT_NONE, 0, 5, &ax), NB_ERR_INVALID);
  assert_int_equal(nb_report_axis(0, INFINITY, NB_REPORT_UNIT_NONE, 0, 5, &ax), NB_ERR_INVALID);
  assert_int_equal(nb_report_axis(2, 1, NB_REPORT_UNIT_NONE, 0, 5, &ax), NB_ERR_INVALID);
  assert_int_equal(nb_report_axis(0, 1, NB_REPORT_UNIT_NONE, 0, 1, &ax), NB_ERR_INVALID);
  assert_int_equal(nb_report_axis(0, 1, NB_REPORT_UNIT_NONE, 0, 11, &ax), NB_ERR_INVALID);
  assert_int_equal(nb_report_axis(0, 1, NB_REPORT_UNIT_NONE, 0, 5, NULL), NB_ERR_INVALID);
}

static void expect_fmt(double v, nb_report_unit_t u, int digits, const char* want) {
  char b[NB_REPORT_LABEL_MAX];
  const char* got = nb_report_format(v, u, digits, b, sizeof b);
  assert_ptr_equal(got, b);
  if (strcmp(b, want) != 0)
    fail_msg("format(%.17g, %d digits): \"%s\", expected \"%s\"", v, digits, b, want);
}

static void test_format(void** state) {
  (void)state;
  expect_fmt(10084, NB_REPORT_UNIT_BYTES, 3, "10.1 kB");
  expect_fmt(453500, NB_REPORT_UNIT_BYTES, 3, "454 kB");
  expect_fmt(999, NB_REPORT_UNIT_BYTES, 3, "999 B");
  expect_fmt(999960, NB_REPORT_UNIT_BYTES, 3, "1 MB"); /* not "1000 kB" */
  expect_fmt(1.5e9, NB_REPORT_UNIT_BYTES, 3, "1.5 GB");
  expect_fmt(0, NB_REPORT_UNIT_BYTES, 3, "0");
  expect_fmt(52000, NB_REPORT_UNIT_BYTES_PER_S, 3, "52 kB/s");
  expect_fmt(0.05, NB_REPORT_UNIT_NONE, 3, "0.05");
  expect_fmt(6.11312, NB_REPORT_UNIT_NONE, 4, "6.113");
  expect_fmt(22080, NB_REPORT_UNIT_NONE, 4, "22.08k");
  expect_fmt(9999, NB_REPORT_UNIT_NONE, 4, "9999");
  expect_fmt(99999, NB_REPORT_UNIT_NONE, 3, "100k");
  expect_fmt(-0.0001, NB_REPORT_UNIT_NONE, 1, "-0.0001");
  expect_fmt(1e300, NB_REPORT_UNIT_NONE, 3, "1e+300"); /* past every prefix: %g's form */
  char b[NB_REPORT_LABEL_MAX];
  assert_string_equal(nb_report_format(NAN, NB_REPORT_UNIT_BYTES, 3, b, sizeof b), "");
  assert_string_equal(nb_report_format(INFINITY, NB_REPORT_UNIT_NONE, 3, b, sizeof b), "");
  assert_null(nb_report_format(1, NB_REPORT_UNIT_NONE, 3, NULL, 8));
  assert_null(nb_report_format(1, NB_REPORT_UNIT_NONE, 3, b, 0));
  /* a short buffer is cut, still terminated */
  char tiny[4];
  assert_string_equal(nb_report_format(10084, NB_REPORT_UNIT_BYTES, 3, tiny, sizeof tiny), "10.");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ticks_plain), cmocka_unit_test(test_ticks_integer),
      cmocka_unit_test(test_ticks_bytes), cmocka_unit_test(test_ticks_edges),
      cmocka_unit_test(test_format),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
