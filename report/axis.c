/* Nice axis ticks and unit labels for the run report (report/report_axis.h). Ticks are whole
 * multiples of the step, computed as index x step (never by accumulating), so that labels are
 * exact; the prefix and the decimals follow from the step's power of ten. */
#include "report/report_axis.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define NB__AX_PREFIX_MAX 6 /* k M G T P E */

/* Prefix letter of 10^(3e), and the unit's suffix. */
static const char* const nb__ax_prefix[NB__AX_PREFIX_MAX + 1] = {"", "k", "M", "G", "T", "P", "E"};

static const char* nb__ax_suffix(nb_report_unit_t u) {
  return u == NB_REPORT_UNIT_BYTES ? "B" : u == NB_REPORT_UNIT_BYTES_PER_S ? "B/s" : "";
}

/* The prefix exponent e (10^(3e)) for values up to maxabs in magnitude: bytes from 1000 up,
 * plain numbers from 10 000 up (a round count of 5000 reads better than "5k"). */
static int nb__ax_exp3(double maxabs, nb_report_unit_t u) {
  if (!(maxabs >= (u == NB_REPORT_UNIT_NONE ? 1e4 : 1e3))) return 0;
  int e = (int)floor(log10(maxabs) / 3 + 1e-9);
  return e < 0 ? 0 : e > NB__AX_PREFIX_MAX ? NB__AX_PREFIX_MAX : e;
}

/* "<number>[ ]<prefix><suffix>": bytes take a space ("100 kB"), plain numbers none ("20k"). */
static void nb__ax_put(char* buf, size_t cap, const char* num, int e, nb_report_unit_t u) {
  const char* suf = nb__ax_suffix(u);
  if (strcmp(num, "0") == 0 || (!*suf && e == 0))
    snprintf(buf, cap, "%s", num);
  else if (snprintf(buf, cap, "%s%s%s%s", num, *suf ? " " : "", nb__ax_prefix[e], suf) >= (int)cap)
    snprintf(buf, cap, "%s", num); /* no room for the unit: the bare number, never a cut one */
}

/* printf of v at d decimals, with "-0" (a tiny negative rounded away) written as "0". */
static void nb__ax_fixed(char* buf, size_t cap, double v, int d) {
  snprintf(buf, cap, "%.*f", d, v);
  const char* p = buf + (buf[0] == '-');
  if (buf[0] == '-' && strspn(p, "0.") == strlen(p)) memmove(buf, buf + 1, strlen(buf));
  if (strspn(buf, "0.") == strlen(buf)) snprintf(buf, cap, "0");
}

static int nb__ax_fallback(double lo, double hi, nb_report_unit_t u, nb_report_axis_t* out) {
  out->lo = lo, out->hi = hi, out->step = hi / 2 - lo / 2;
  out->n = 2;
  out->v[0] = lo, out->v[1] = hi;
  for (int i = 0; i < 2; i++) {
    char num[NB_REPORT_LABEL_MAX];
    snprintf(num, sizeof num, "%.3g", out->v[i]);
    nb__ax_put(out->label[i], sizeof out->label[i], num, 0, u);
  }
  return 0;
}

nb_status_t nb_report_axis(double lo, double hi, nb_report_unit_t unit, int integer,
                           int max_intervals, nb_report_axis_t* out) {
  if (!out || !isfinite(lo) || !isfinite(hi) || lo > hi || max_intervals < 2 || max_intervals > 10)
    return nb_error(NB_ERR_INVALID, "report axis: need finite lo <= hi and 2..10 intervals");
  memset(out, 0, sizeof *out);
  if (lo == hi) { /* one value: widen around it */
    double d = lo == 0 ? 1 : fabs(lo) * 0.1;
    if (integer && d < 1) d = 1;
    if (lo == 0 && !integer) {
      hi = 1;
    } else {
      lo = lo - d, hi = hi + d;
    }
    if (!isfinite(lo) || !isfinite(hi)) lo = fmax(lo, -DBL_MAX), hi = fmin(hi, DBL_MAX);
  }
  double half = hi / 2 - lo / 2; /* half the span: finite for any finite lo, hi */
  if (!(half > 0)) return nb__ax_fallback(lo, hi, unit, out), NB_OK;
  /* start one decade below the step that would give max_intervals, then 1, 2, 5, 10, ... */
  int k = (int)floor(log10(2 * (half / max_intervals))) - 1;
  if (integer && k < 0) k = 0;
  static const int mant[3] = {1, 2, 5};
  for (int tries = 0; tries < 12; tries++, k++) {
    for (int m = 0; m < 3; m++) {
      double step = mant[m] * pow(10, k);
      if (!isfinite(step) || step <= 0) continue;
      /* a billionth of a step of slack: 0.045 / 0.005 is 8.999999999999998 in binary */
      double i0 = floor(lo / step + 1e-9), i1 = ceil(hi / step - 1e-9);
      if (i1 - i0 > max_intervals) continue;
      if (i1 == i0) i1 = i0 + 1;
      double a = i0 * step, b = i1 * step;
      if (!isfinite(a) || !isfinite(b)) return nb__ax_fallback(lo, hi, unit, out), NB_OK;
      out->lo = a, out->hi = b, out->step = step;
      out->n = (int)(i1 - i0) + 1;
      double maxabs = fmax(fabs(a), fabs(b));
      int e = nb__ax_exp3(maxabs, unit);
      int d = 3 * e - k; /* decimals: the step is mant x 10^k, the label divides by 10^(3e) */
      if (d < 0) d = 0;
      if (d > 15 || maxabs >= 1e21) return nb__ax_fallback(lo, hi, unit, out), NB_OK;
      for (int i = 0; i < out->n; i++) {
        double v = (i0 + i) * step;
        if (fabs(v) < step * 1e-9) v = 0;
        out->v[i] = v;
        char num[NB_REPORT_LABEL_MAX];
        nb__ax_fixed(num, sizeof num, v / pow(10, 3 * e), d);
        nb__ax_put(out->label[i], sizeof out->label[i], num, e, unit);
      }
      return NB_OK;
    }
  }
  return nb__ax_fallback(lo, hi, unit, out), NB_OK;
}

const char* nb_report_format(double v, nb_report_unit_t unit, int digits, char* buf, size_t cap) {
  if (!buf || cap == 0) return NULL;
  buf[0] = 0;
  if (!isfinite(v)) return buf;
  if (digits < 1) digits = 1;
  if (digits > 15) digits = 15;
  double a = fabs(v);
  if (a >= 1e21) { /* beyond every prefix: what %g writes */
    char num[NB_REPORT_LABEL_MAX];
    snprintf(num, sizeof num, "%.*g", digits, v);
    nb__ax_put(buf, cap, num, 0, unit);
    return buf;
  }
  int e = nb__ax_exp3(a, unit);
  char num[48];
  for (;;) {
    double s = v / pow(10, 3 * e);
    int mag = s == 0 ? 0 : (int)floor(log10(fabs(s)));
    int d = digits - 1 - mag;
    if (d < 0) d = 0;
    if (d > 15) d = 15;
    nb__ax_fixed(num, sizeof num, s, d);
    /* 999.96 kB at 3 digits rounds to "1000": one prefix up reads "1 MB" */
    double back = fabs(strtod(num, NULL));
    if (back >= 1000 && e < NB__AX_PREFIX_MAX && nb__ax_exp3(back * pow(10, 3 * e), unit) > e) {
      e++;
      continue;
    }
    break;
  }
  if (strchr(num, '.')) { /* trailing zeros after the point go, and a bare point */
    size_t n = strlen(num);
    while (n > 0 && num[n - 1] == '0') num[--n] = 0;
    if (n > 0 && num[n - 1] == '.') num[--n] = 0;
  }
  nb__ax_put(buf, cap, num, e, unit);
  return buf;
}
