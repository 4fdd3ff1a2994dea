/* The run report (report/report.h): parses each cluster's rounds.tsv and summary.json, draws line
 * charts as inline SVG with a few lines of our own C, and writes report.html and a job-level
 * summary.json atomically. Not a general plotting library: linear axes, polylines, a legend. */
#include "report/report.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "jobs/descriptor.h"
#include "report/report_axis.h"

enum { NB__RP_COLS = 7 }; /* round loss bytes_sent density compute_s exchange_s global_xxh3 */
static const char* const nb__rp_cols[NB__RP_COLS] = {
    "round", "loss", "bytes_sent", "density", "compute_s", "exchange_s", "global_xxh3"};

enum { NB__RP_LANGS = 8 }; /* languages of one cluster's evaluation curve drawn, at most */

typedef struct {
  const char* id;
  int n;          /* rows */
  double* v[6];   /* round loss bytes_sent density compute_s exchange_s */
  double* cum_cs; /* cumulative compute seconds */
  double* bps;    /* bytes_sent / exchange_s per round, bytes/s (0 when exchange_s is 0) */
  double* x1;     /* round + 1: rounds counted from 1, as the logs and "rounds" count them */
  json_t* sum;
  /* the held-out evaluation curve: ne points (inner step, mean bits per byte), and per language
   * when the cluster has a curve.tsv */
  int ne, nl;
  double* ev_step;
  double* ev_mean;
  double* ev_lang[NB__RP_LANGS];
  char lang[NB__RP_LANGS][16];
} nb__rp_cluster_t;

static void nb__rp_free(nb__rp_cluster_t* c) {
  for (int k = 0; k < 6; k++) nb_free(c->v[k]);
  nb_free(c->cum_cs);
  nb_free(c->bps);
  nb_free(c->x1);
  nb_free(c->ev_step);
  nb_free(c->ev_mean);
  for (int k = 0; k < NB__RP_LANGS; k++) nb_free(c->ev_lang[k]);
  json_decref(c->sum);
  memset(c, 0, sizeof *c);
}

/* Splits a line of a .tsv at its tabs, in place: at most max fields into f; their count. */
static int nb__rp_split(char* line, char** f, int max) {
  int n = 0;
  for (char *save = NULL, *t = strtok_r(line, "\t", &save); t && n < max;
       t = strtok_r(NULL, "\t", &save))
    f[n++] = t;
  return n;
}

static nb_status_t nb__rp_read_rounds(const char* path, nb__rp_cluster_t* c) {
  FILE* f = fopen(path, "r");
  if (!f) return nb_error(NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  nb_status_t st = NB_OK;
  char* line = NULL;
  size_t cap = 0;
  int col[NB__RP_COLS], ncols = 0, lineno = 0, rcap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
    if (len == 0) continue;
    char* fields[64];
    int nf = nb__rp_split(line, fields, 64);
    if (lineno == 1) {
      ncols = nf;
      for (int k = 0; k < NB__RP_COLS; k++) {
        col[k] = -1;
        for (int j = 0; j < nf; j++)
          if (strcmp(fields[j], nb__rp_cols[k]) == 0) col[k] = j;
        if (col[k] < 0) {
          st = nb_error(NB_ERR_INVALID, "%s:1: header lacks column '%s'", path, nb__rp_cols[k]);
          goto out;
        }
      }
      continue;
    }
    if (nf != ncols) {
      st = nb_error(NB_ERR_INVALID, "%s:%d: %d fields, the header has %d", path, lineno, nf, ncols);
      goto out;
    }
    if (c->n == rcap) {
      rcap = rcap ? 2 * rcap : 64;
      for (int k = 0; k < 6; k++)
        NB_CHECK_GOTO(nb_realloc((void**)&c->v[k], (size_t)rcap, sizeof(double), "report rows"), st,
                      out);
      NB_CHECK_GOTO(nb_realloc((void**)&c->cum_cs, (size_t)rcap, sizeof(double), "report rows"), st,
                    out);
      NB_CHECK_GOTO(nb_realloc((void**)&c->bps, (size_t)rcap, sizeof(double), "report rows"), st,
                    out);
      NB_CHECK_GOTO(nb_realloc((void**)&c->x1, (size_t)rcap, sizeof(double), "report rows"), st,
                    out);
    }
    for (int k = 0; k < 6; k++) {
      const char* s = fields[col[k]];
      char* end = NULL;
      errno = 0;
      double d = strtod(s, &end);
      if (end == s || *end || errno || !isfinite(d)) {
        st = nb_error(NB_ERR_INVALID, "%s:%d: column '%s' is not a number", path, lineno,
                      nb__rp_cols[k]);
        goto out;
      }
      c->v[k][c->n] = d;
    }
    c->cum_cs[c->n] = c->v[4][c->n] + (c->n ? c->cum_cs[c->n - 1] : 0);
    c->bps[c->n] = c->v[5][c->n] > 0 ? c->v[2][c->n] / c->v[5][c->n] : 0;
    c->x1[c->n] = c->v[0][c->n] + 1;
    c->n++;
  }
  if (ferror(f)) {
    st = nb_error(NB_ERR_IO, "reading %s: %s", path, strerror(errno));
  } else if (lineno == 0) {
    st = nb_error(NB_ERR_INVALID, "%s:1: empty file (no header)", path);
  } else if (c->n == 0) {
    st = nb_error(NB_ERR_INVALID, "%s:%d: no rounds after the header", path, lineno);
  }
out:
  free(line);
  fclose(f);
  return st;
}

/* One point of the evaluation curve; lang: c->nl values, or NULL (NaN for every language). */
static nb_status_t nb__rp_ev_push(nb__rp_cluster_t* c, int* cap, double step, double mean,
                                  const double* lang) {
  if (c->ne == *cap) {
    *cap = *cap ? 2 * *cap : 16;
    NB_CHECK(nb_realloc((void**)&c->ev_step, (size_t)*cap, sizeof(double), "report curve"));
    NB_CHECK(nb_realloc((void**)&c->ev_mean, (size_t)*cap, sizeof(double), "report curve"));
    for (int k = 0; k < c->nl; k++)
      NB_CHECK(nb_realloc((void**)&c->ev_lang[k], (size_t)*cap, sizeof(double), "report curve"));
  }
  c->ev_step[c->ne] = step;
  c->ev_mean[c->ne] = mean;
  for (int k = 0; k < c->nl; k++) c->ev_lang[k][c->ne] = lang ? lang[k] : NAN;
  c->ne++;
  return NB_OK;
}

static void nb__rp_ev_clear(nb__rp_cluster_t* c) {
  nb_free(c->ev_step);
  nb_free(c->ev_mean);
  for (int k = 0; k < NB__RP_LANGS; k++) nb_free(c->ev_lang[k]), c->ev_lang[k] = NULL;
  c->ev_step = c->ev_mean = NULL;
  c->ne = c->nl = 0;
}

/* A number of a TSV field: finite, or "nan" (an evaluation that scored nothing) as NaN. */
static int nb__rp_field(const char* s, double* out) {
  char* end = NULL;
  errno = 0;
  double d = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || isinf(d)) return -1;
  *out = d;
  return 0;
}

/* path: a curve.tsv (`nebula train`: step, samples, seconds, one column per language, mean).
 * Sets c->ne = 0 and returns NB_OK when there is no such file; NB_ERR_INVALID (file and line
 * named) when it does not parse. Languages past NB__RP_LANGS are left out. */
static nb_status_t nb__rp_read_curve(const char* path, nb__rp_cluster_t* c) {
  FILE* f = fopen(path, "r");
  if (!f)
    return errno == ENOENT ? NB_OK
                           : nb_error(NB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  nb_status_t st = NB_OK;
  char* line = NULL;
  size_t cap = 0;
  int lineno = 0, ncols = 0, cstep = -1, cmean = -1, clang[NB__RP_LANGS], pcap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
    if (len == 0) continue;
    char* fields[64];
    int nf = nb__rp_split(line, fields, 64);
    if (lineno == 1) {
      ncols = nf;
      for (int j = 0; j < nf; j++) {
        if (strcmp(fields[j], "step") == 0)
          cstep = j;
        else if (strcmp(fields[j], "mean") == 0)
          cmean = j;
        else if (strcmp(fields[j], "samples") && strcmp(fields[j], "seconds") &&
                 c->nl < NB__RP_LANGS && strlen(fields[j]) < sizeof c->lang[0]) {
          clang[c->nl] = j;
          snprintf(c->lang[c->nl++], sizeof c->lang[0], "%s", fields[j]);
        }
      }
      if (cstep < 0 || cmean < 0) {
        st = nb_error(NB_ERR_INVALID, "%s:1: header lacks column '%s'", path,
                      cstep < 0 ? "step" : "mean");
        goto out;
      }
      continue;
    }
    double step, mean, lv[NB__RP_LANGS];
    int bad = nf != ncols || nb__rp_field(fields[cstep], &step) || !isfinite(step) ||
              nb__rp_field(fields[cmean], &mean);
    for (int k = 0; !bad && k < c->nl; k++) bad = nb__rp_field(fields[clang[k]], &lv[k]);
    if (bad) {
      st = nb_error(NB_ERR_INVALID, "%s:%d: expected %d numbers (step, ..., mean)", path, lineno,
                    ncols);
      goto out;
    }
    NB_CHECK_GOTO(nb__rp_ev_push(c, &pcap, step, mean, lv), st, out);
  }
  if (ferror(f)) st = nb_error(NB_ERR_IO, "reading %s: %s", path, strerror(errno));
out:
  free(line);
  fclose(f);
  if (st != NB_OK) nb__rp_ev_clear(c);
  return st;
}

/* The value of language `lang` in a {"lang": bpb} object: NaN when it is not there. */
static double nb__rp_lang_bpb(json_t* obj, const char* lang) {
  json_t* v = json_object_get(obj, lang);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

/* The curve from the summary: "evals" [{step, mean_bpb, bpb: {lang: x}}] (entries of another
 * shape are left out; "bpb", written by `nebula worker` since it records each language's point,
 * gives one curve per language, its languages in the order they first appear), then the final
 * evaluation (final_eval_mean_bpb, final_eval_bpb) at the last inner step when it lies beyond
 * them. Languages past NB__RP_LANGS are left out. */
static nb_status_t nb__rp_summary_curve(nb__rp_cluster_t* c) {
  int cap = 0;
  json_t* ev = json_object_get(c->sum, "evals");
  size_t i;
  json_t* e;
  json_array_foreach(ev, i, e) {
    const char* k;
    json_t* v;
    json_object_foreach(json_object_get(e, "bpb"), k, v) {
      int known = 0;
      for (int l = 0; l < c->nl && !known; l++) known = strcmp(c->lang[l], k) == 0;
      if (!known && c->nl < NB__RP_LANGS && strlen(k) < sizeof c->lang[0])
        snprintf(c->lang[c->nl++], sizeof c->lang[0], "%s", k);
    }
  }
  double last = -INFINITY, lv[NB__RP_LANGS];
  json_array_foreach(ev, i, e) {
    json_t* st = json_object_get(e, "step");
    json_t* m = json_object_get(e, "mean_bpb");
    if (!json_is_number(st) || !json_is_number(m)) continue;
    for (int l = 0; l < c->nl; l++) lv[l] = nb__rp_lang_bpb(json_object_get(e, "bpb"), c->lang[l]);
    NB_CHECK(nb__rp_ev_push(c, &cap, json_number_value(st), json_number_value(m), lv));
    last = fmax(last, json_number_value(st));
  }
  json_t* fin = json_object_get(c->sum, "final_eval_mean_bpb");
  json_t* steps = json_object_get(c->sum, "inner_steps");
  if (!json_is_number(steps)) steps = json_object_get(c->sum, "steps");
  if (json_is_number(fin) && json_is_number(steps) && json_number_value(steps) > last) {
    for (int l = 0; l < c->nl; l++)
      lv[l] = nb__rp_lang_bpb(json_object_get(c->sum, "final_eval_bpb"), c->lang[l]);
    NB_CHECK(nb__rp_ev_push(c, &cap, json_number_value(steps), json_number_value(fin), lv));
  }
  return NB_OK;
}

static nb_status_t nb__rp_read_cluster(const char* run_dir, const char* id, nb__rp_cluster_t* c) {
  char p[4096];
  c->id = id;
  if (!id || !*id || strchr(id, '/') || strcmp(id, "..") == 0)
    return nb_error(NB_ERR_INVALID, "bad cluster id '%s'", id ? id : "(null)");
  if (snprintf(p, sizeof p, "%s/%s/rounds.tsv", run_dir, id) >= (int)sizeof p)
    return nb_error(NB_ERR_INVALID, "path too long: %s/%s", run_dir, id);
  NB_CHECK(nb__rp_read_rounds(p, c));
  snprintf(p, sizeof p, "%s/%s/summary.json", run_dir, id);
  json_error_t je;
  c->sum = json_load_file(p, 0, &je);
  if (!c->sum) {
    if (access(p, R_OK) != 0) return nb_error(NB_ERR_IO, "cannot open %s: %s", p, strerror(errno));
    return nb_error(NB_ERR_INVALID, "%s:%d:%d: %s", p, je.line, je.column, je.text);
  }
  if (!json_is_object(c->sum)) return nb_error(NB_ERR_INVALID, "%s:1: not a JSON object", p);
  snprintf(p, sizeof p, "%s/%s/curve.tsv", run_dir, id);
  if (nb__rp_read_curve(p, c) != NB_OK)
    NB_WARN("report: %s; drawing the evaluations summary.json lists instead", nb_error_last());
  if (c->ne == 0) NB_CHECK(nb__rp_summary_curve(c));
  return NB_OK;
}

/* ---- HTML and SVG ---- */

static void nb__rp_esc(FILE* f, const char* s) {
  for (; s && *s; s++) {
    switch (*s) {
      case '&':
        fputs("&amp;", f);
        break;
      case '<':
        fputs("&lt;", f);
        break;
      case '>':
        fputs("&gt;", f);
        break;
      case '"':
        fputs("&quot;", f);
        break;
      case '\'':
        fputs("&#39;", f);
        break;
      default:
        fputc(*s, f);
    }
  }
}

static const char* const nb__rp_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                            "#9467bd", "#8c564b", "#e377c2", "#17becf"};

typedef struct {
  const char* name;  /* legend label (cluster id, escaped when drawn) */
  const char* extra; /* appended to the label after a space, e.g. "compute", "en"; or "" */
  const double* x;
  const double* y;
  int n;
  int color;
  int dashed;
} nb__rp_series_t;

/* What one line chart shows: its figure id, title, axis labels and units. */
typedef struct {
  const char* id; /* the figure's id attribute (constant text) */
  const char* title;
  const char* xlabel;
  const char* ylabel;
  nb_report_unit_t xu, yu;
  int xint; /* x holds whole numbers (rounds, steps): no tick between two of them */
} nb__rp_chart_t;

/* Width in pixels of ASCII text at the charts' 11 px sans-serif, rounded up: DejaVu Sans (what
 * headless Chromium draws) advances digits and most letters by 0.64 em, the point and the space
 * by 0.32 em. Used to keep axis labels clear of the tick labels and the legend inside the SVG. */
static double nb__rp_textw(const char* s) {
  double w = 0;
  for (; s && *s; s++) w += (*s == '.' || *s == ' ' || *s == ',') ? 3.6 : 7.2;
  return w;
}

static void nb__rp_chart(FILE* f, const nb__rp_chart_t* ch, const nb__rp_series_t* s, int ns) {
  const double W = 680, H = 300, T = 30, B = 45;
  /* Every value read is finite, but sums (cumulative compute seconds) and quotients can
   * overflow: such points are left out of the chart and said so in the legend, and the scale
   * works on halves so that a span of two huge values stays finite. No coordinate written is
   * ever NaN or infinite. */
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (int i = 0; i < ns; i++)
    for (int j = 0; j < s[i].n; j++) {
      if (!isfinite(s[i].x[j]) || !isfinite(s[i].y[j])) continue;
      x0 = fmin(x0, s[i].x[j]), x1 = fmax(x1, s[i].x[j]);
      y0 = fmin(y0, s[i].y[j]), y1 = fmax(y1, s[i].y[j]);
    }
  if (!(x0 <= x1)) x0 = 0, x1 = 1;
  if (!(y0 <= y1)) y0 = 0, y1 = 1;
  if (y0 > 0 && y0 < 0.5 * y1) y0 = 0;
  nb_report_axis_t ax, ay;
  (void)nb_report_axis(x0, x1, ch->xu, ch->xint, 6, &ax); /* valid: finite, x0 <= x1 */
  (void)nb_report_axis(y0, y1, ch->yu, 0, 5, &ay);
  /* the left margin holds the longest y tick label, a gap, then the rotated axis label */
  double tw = 0, lw = 0;
  for (int k = 0; k < ay.n; k++) tw = fmax(tw, nb__rp_textw(ay.label[k]));
  for (int i = 0; i < ns; i++) {
    char more[48] = "";
    int bad = 0;
    for (int j = 0; j < s[i].n; j++) bad += !isfinite(s[i].x[j]) || !isfinite(s[i].y[j]);
    if (bad) snprintf(more, sizeof more, " (%d not finite, not drawn)", bad);
    lw = fmax(lw, nb__rp_textw(s[i].name) + 3.6 + nb__rp_textw(s[i].extra) + nb__rp_textw(more));
  }
  double L = fmax(50, tw + 32), R = fmin(fmax(110, lw + 44), 300), pw = W - L - R, ph = H - T - B;
  double ylx = L - 5 - tw - 14; /* centre of the rotated y label: 8 px clear of the ticks */
#define NB__PX(v) (L + ((v) / 2 - ax.lo / 2) / (ax.hi / 2 - ax.lo / 2) * pw)
#define NB__PY(v) (T + ph - ((v) / 2 - ay.lo / 2) / (ay.hi / 2 - ay.lo / 2) * ph)
  fprintf(f,
          "<figure id=\"%s\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
          "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" "
          "font-size=\"11\">\n",
          ch->id, W, H, W, H);
  fprintf(f, "<text class=\"title\" x=\"%.0f\" y=\"18\" font-size=\"14\" font-weight=\"bold\">", L);
  nb__rp_esc(f, ch->title);
  fputs("</text>\n", f);
  fprintf(f,
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
          "stroke=\"#888\"/>\n",
          L, T, pw, ph);
  for (int k = 0; k < ax.n; k++) {
    double px = NB__PX(ax.v[k]);
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text class=\"tick x\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
            px, T, px, T + ph, px, T + ph + 18, ax.label[k]);
  }
  for (int k = 0; k < ay.n; k++) {
    double py = NB__PY(ay.v[k]);
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text class=\"tick y\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
            L, py, L + pw, py, L - 5, py + 4, ay.label[k]);
  }
  fprintf(f, "<text class=\"axis x\" x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">", L + pw / 2,
          H - 8);
  nb__rp_esc(f, ch->xlabel);
  fprintf(f,
          "</text><text class=\"axis y\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
          "transform=\"rotate(-90 %.1f %.1f)\">",
          ylx, T + ph / 2, ylx, T + ph / 2);
  nb__rp_esc(f, ch->ylabel);
  fputs("</text>\n", f);
  for (int i = 0; i < ns; i++) {
    const char* col = nb__rp_colors[s[i].color % 8];
    fprintf(
        f, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"",
        col, s[i].dashed ? "1.2" : "1.8", s[i].dashed ? " stroke-dasharray=\"5,3\"" : "");
    int drawn = 0, last = -1;
    for (int j = 0; j < s[i].n; j++) {
      if (!isfinite(s[i].x[j]) || !isfinite(s[i].y[j])) continue;
      double px = NB__PX(s[i].x[j]), py = NB__PY(s[i].y[j]);
      if (!isfinite(px) || !isfinite(py)) continue;
      fprintf(f, "%s%.1f,%.1f", drawn++ ? " " : "", px, py);
      last = j;
    }
    fputs("\"/>\n", f);
    if (drawn == 1)
      fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", NB__PX(s[i].x[last]),
              NB__PY(s[i].y[last]), col);
    double ly = T + 10 + 16 * i;
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"2\"%s/><text class=\"legend\" x=\"%.0f\" y=\"%.1f\">",
            L + pw + 10, ly, L + pw + 30, ly, col, s[i].dashed ? " stroke-dasharray=\"5,3\"" : "",
            L + pw + 34, ly + 4);
    nb__rp_esc(f, s[i].name);
    if (s[i].extra && *s[i].extra) fputc(' ', f);
    nb__rp_esc(f, s[i].extra);
    if (drawn < s[i].n) fprintf(f, " (%d not finite, not drawn)", s[i].n - drawn);
    fputs("</text>\n", f);
  }
#undef NB__PX
#undef NB__PY
  fputs("</svg></figure>\n", f);
}

static double nb__rp_num(json_t* o, const char* k) {
  json_t* v = json_object_get(o, k);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

static void nb__rp_cell(FILE* f, double v, const char* fmt) {
  fputs("<td>", f);
  if (isnan(v))
    fputs("&ndash;", f);
  else
    fprintf(f, fmt, v);
  fputs("</td>", f);
}

static const char* nb__rp_str(json_t* o, const char* k) {
  const char* s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

/* Escaped text, or a dash for an empty one. */
static void nb__rp_text(FILE* f, const char* s) {
  if (s && *s)
    nb__rp_esc(f, s);
  else
    fputs("&ndash;", f);
}

/* ---- translation quality (chrF/BLEU of the base and the final model per pair) ---- */

/* A score in [0, 100], else NaN (missing, not a number, out of range). */
static double nb__rp_score(json_t* o, const char* side, const char* metric) {
  double v = nb__rp_num(json_object_get(o, side), metric);
  return v >= 0 && v <= 100 ? v : NAN;
}

typedef struct {
  const char* cluster;
  const char* pair;
  double sentences;
  double v[4]; /* chrF base, chrF final, BLEU base, BLEU final */
} nb__rp_tr_t;

/* The well-formed "translation" entries of every cluster's summary: an object of pair → object;
 * anything else is skipped with a warning; missing or bad numbers stay NaN (shown as dashes). */
static nb_status_t nb__rp_tr_collect(nb__rp_cluster_t* c, int n, nb__rp_tr_t** out, int* count) {
  *out = NULL;
  *count = 0;
  int cap = 0;
  for (int i = 0; i < n; i++) {
    json_t* tr = json_object_get(c[i].sum, "translation");
    if (!tr || json_is_null(tr)) continue;
    if (!json_is_object(tr)) {
      NB_WARN("report: %s/summary.json: \"translation\" is not an object; ignored", c[i].id);
      continue;
    }
    const char* k;
    json_t* v;
    json_object_foreach(tr, k, v) {
      if (!json_is_object(v)) {
        NB_WARN("report: %s/summary.json: translation.%s is not an object; ignored", c[i].id, k);
        continue;
      }
      if (*count == cap) {
        cap = cap ? 2 * cap : 8;
        NB_CHECK(nb_realloc((void**)out, (size_t)cap, sizeof **out, "report translation"));
      }
      nb__rp_tr_t* e = &(*out)[(*count)++];
      e->cluster = c[i].id;
      e->pair = k;
      json_t* sn = json_object_get(v, "sentences");
      e->sentences =
          json_is_integer(sn) && json_integer_value(sn) >= 0 ? (double)json_integer_value(sn) : NAN;
      e->v[0] = nb__rp_score(v, "base", "chrf");
      e->v[1] = nb__rp_score(v, "final", "chrf");
      e->v[2] = nb__rp_score(v, "base", "bleu");
      e->v[3] = nb__rp_score(v, "final", "bleu");
    }
  }
  return NB_OK;
}

/* The job-level summary's copy of one cluster's translation scores (null when it has none). */
static json_t* nb__rp_tr_json(const nb__rp_tr_t* t, int nt, const char* cluster) {
  json_t* o = NULL;
  for (int i = 0; i < nt; i++) {
    if (strcmp(t[i].cluster, cluster)) continue;
    if (!o) o = json_object();
    json_t* e = json_object();
    json_object_set_new(
        e, "sentences",
        isnan(t[i].sentences) ? json_null() : json_integer((json_int_t)t[i].sentences));
    static const char* const side[2] = {"base", "final"};
    for (int k = 0; k < 2; k++) {
      json_t* m = json_object();
      json_object_set_new(m, "chrf", isnan(t[i].v[k]) ? json_null() : json_real(t[i].v[k]));
      json_object_set_new(m, "bleu", isnan(t[i].v[2 + k]) ? json_null() : json_real(t[i].v[2 + k]));
      json_object_set_new(e, side[k], m);
    }
    json_object_set_new(o, t[i].pair, e);
  }
  return o ? o : json_null();
}

/* A grouped bar chart: per pair, chrF and BLEU of the base model (light) and the final model. */
static void nb__rp_tr_chart(FILE* f, const nb__rp_tr_t* t, int nt, int label_cluster) {
  static const char* const col[4] = {"#9ecae1", "#1f77b4", "#fdd0a2", "#e6550d"};
  static const char* const name[4] = {"chrF base", "chrF final", "BLEU base", "BLEU final"};
  double vmax = 0;
  for (int i = 0; i < nt; i++)
    for (int k = 0; k < 4; k++)
      if (isfinite(t[i].v[k])) vmax = fmax(vmax, t[i].v[k]);
  nb_report_axis_t ay; /* scores are 0..100: the axis ends at 10 or more, at most 100 */
  (void)nb_report_axis(0, fmin(100, fmax(10, vmax)), NB_REPORT_UNIT_NONE, 0, 5, &ay);
  double ymax = ay.hi;
  const double L = 50, R = 120, T = 30, B = 60, bw = 14, gap = 20, H = 300;
  double pw = fmax(nt * (4 * bw + gap) + gap, 330), W = L + pw + R, ph = H - T - B;
  fprintf(f,
          "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
          "<text class=\"title\" x=\"%.0f\" y=\"18\" font-size=\"14\" font-weight=\"bold\">"
          "Translation quality: base vs final model</text>\n",
          W, H, W, H, L);
  for (int k = 0; k < ay.n; k++) {
    double py = T + ph - ay.v[k] / ymax * ph;
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text class=\"tick y\" x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
            L, py, L + pw, py, L - 5, py + 4, ay.label[k]);
  }
  fprintf(f,
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
          "stroke=\"#888\"/>\n",
          L, T, pw, ph);
  for (int i = 0; i < nt; i++) {
    double gx = L + gap + i * (4 * bw + gap);
    for (int k = 0; k < 4; k++) {
      if (!isfinite(t[i].v[k])) continue;
      double h = fmin(fmax(t[i].v[k], 0), ymax) / ymax * ph; /* scores are 0..100 */
      fprintf(f,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" fill=\"%s\">"
              "<title>%s %.2f</title></rect>\n",
              gx + k * bw, T + ph - h, bw - 1, h, col[k], name[k], t[i].v[k]);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">", gx + 2 * bw, T + ph + 14);
    nb__rp_esc(f, t[i].pair);
    fputs("</text>", f);
    if (label_cluster) {
      fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#555\">", gx + 2 * bw,
              T + ph + 28);
      nb__rp_esc(f, t[i].cluster);
      fputs("</text>", f);
    }
    fputs("\n", f);
  }
  for (int k = 0; k < 4; k++)
    fprintf(f,
            "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
            "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
            L + pw + 10, T + 4 + 18 * k, col[k], L + pw + 26, T + 14 + 18 * k, name[k]);
  fprintf(f,
          "<text class=\"axis y\" x=\"12\" y=\"%.1f\" text-anchor=\"middle\" "
          "transform=\"rotate(-90 12 %.1f)\">score (0-100)</text>\n</svg></figure>\n",
          T + ph / 2, T + ph / 2);
}

static void nb__rp_tr_html(FILE* f, const nb__rp_tr_t* t, int nt, int n_clusters) {
  if (nt == 0) return;
  fputs(
      "<h2>Translation quality</h2>\n<p>chrF and BLEU (0&ndash;100) of greedy translations of "
      "the test split, by the base model before fine-tuning and by the final model.</p>\n"
      "<table><tr><th>cluster</th><th>pair</th><th>sentences</th><th>chrF base</th>"
      "<th>chrF final</th><th>&Delta; chrF</th><th>BLEU base</th><th>BLEU final</th>"
      "<th>&Delta; BLEU</th></tr>\n",
      f);
  for (int i = 0; i < nt; i++) {
    fputs("<tr><td>", f);
    nb__rp_esc(f, t[i].cluster);
    fputs("</td><td>", f);
    nb__rp_esc(f, t[i].pair);
    fputs("</td>", f);
    nb__rp_cell(f, t[i].sentences, "%.0f");
    nb__rp_cell(f, t[i].v[0], "%.2f");
    nb__rp_cell(f, t[i].v[1], "%.2f");
    nb__rp_cell(f, t[i].v[1] - t[i].v[0], "%+.2f");
    nb__rp_cell(f, t[i].v[2], "%.2f");
    nb__rp_cell(f, t[i].v[3], "%.2f");
    nb__rp_cell(f, t[i].v[3] - t[i].v[2], "%+.2f");
    fputs("</tr>\n", f);
  }
  fputs("</table>\n", f);
  nb__rp_tr_chart(f, t, nt, n_clusters > 1);
}

/* A table cell holding a value with its unit ("10.1 kB"), or a dash for a missing one. */
static void nb__rp_cell_u(FILE* f, double v, nb_report_unit_t u, int digits) {
  char b[NB_REPORT_LABEL_MAX];
  nb_report_format(v, u, digits, b, sizeof b);
  fprintf(f, "<td>%s</td>", *b ? b : "&ndash;");
}

/* One row of the configuration block: a header, then text the caller writes (escaped). */
static void nb__rp_cfg_row(FILE* f, const char* name) {
  fprintf(f, "<tr><th>%s</th><td>", name);
}

static void nb__rp_bool(FILE* f, const char* what, json_t* v) {
  if (json_is_boolean(v)) fprintf(f, ", %s %s", what, json_is_true(v) ? "on" : "off");
}

/* The configuration block: from the job's settings when given, else what the summaries say;
 * the nebula version and the generation time (UTC) either way. */
static void nb__rp_config(FILE* f, const nb__rp_cluster_t* c, int n, const nb_job_config_t* job,
                          time_t now) {
  json_t* s0 = c[0].sum;
  char b[NB_REPORT_LABEL_MAX];
  fputs("<h2>Configuration</h2>\n<table class=\"config\">\n", f);
  nb__rp_cfg_row(f, "job");
  nb__rp_esc(f, job ? job->name : nb__rp_str(s0, "job"));
  const char* task = job ? nb_job_task_name(job->task) : nb__rp_str(s0, "task");
  if (*task) fputs(" (", f), nb__rp_esc(f, task), fputs(")", f);
  if (job && job->description[0]) fputs(": ", f), nb__rp_esc(f, job->description);
  fputs("</td></tr>\n", f);
  nb__rp_cfg_row(f, "clusters");
  for (int i = 0; i < n; i++) {
    const nb_job_cluster_t* jc = NULL;
    for (int k = 0; job && k < job->n_clusters; k++)
      if (strcmp(job->clusters[k].id, c[i].id) == 0) jc = &job->clusters[k];
    fputs(i ? "; " : "", f);
    nb__rp_esc(f, c[i].id);
    json_t* ranks = json_object_get(c[i].sum, "ranks");
    long w = jc ? jc->workers : json_is_integer(ranks) ? (long)json_integer_value(ranks) : 0;
    if (w > 0) fprintf(f, " (%ld rank%s", w, w == 1 ? "" : "s");
    int first = 1;
    if (jc) {
      for (int k = 0; k < jc->n_languages; k++, first = 0)
        fputs(first ? (w > 0 ? ": " : " (") : ", ", f), nb__rp_esc(f, jc->languages[k]);
      for (int k = 0; k < jc->n_pairs; k++, first = 0) {
        fputs(first ? (w > 0 ? ": " : " (") : ", ", f);
        nb__rp_esc(f, jc->pair_src[k]);
        fputs("-", f);
        nb__rp_esc(f, jc->pair_tgt[k]);
      }
    } else {
      const char* k;
      json_t* v;
      json_object_foreach(json_object_get(c[i].sum, "final_eval_bpb"), k, v) {
        fputs(first ? (w > 0 ? ": " : " (") : ", ", f), nb__rp_esc(f, k);
        first = 0;
      }
    }
    if (w > 0 || !first) fputs(")", f);
  }
  fputs("</td></tr>\n", f);
  json_t* np = json_object_get(s0, "params_synced");
  if (!json_is_integer(np)) np = json_object_get(s0, "params");
  nb__rp_cfg_row(f, "model");
  if (job)
    fprintf(f, "%d layer%s, width %d, %d heads, context %d; ", job->model.layers,
            job->model.layers == 1 ? "" : "s", job->model.width, job->model.heads,
            job->model.context);
  if (json_is_integer(np))
    fprintf(f, "%s parameters%s",
            nb_report_format((double)json_integer_value(np), NB_REPORT_UNIT_NONE, 4, b, sizeof b),
            job ? "" : " (the descriptor gives the shape: nebula report --job)");
  if (job && job->model.base_checkpoint[0])
    fputs("; from ", f), nb__rp_esc(f, job->model.base_checkpoint);
  if (job && job->training.lora.enabled) fprintf(f, "; LoRA rank %d", job->training.lora.rank);
  fputs("</td></tr>\n", f);
  nb__rp_cfg_row(f, "training");
  json_t* st = json_object_get(s0, "inner_steps");
  if (!json_is_integer(st)) st = json_object_get(s0, "steps");
  if (job) {
    const nb_job_training_t* t = &job->training;
    fprintf(f, "%lld steps per cluster, batch %d, lr %g, %d warm-up steps, seed %llu",
            (long long)t->max_steps, t->batch_size, t->optimizer.lr, t->optimizer.warmup_steps,
            (unsigned long long)t->seed);
    if (t->max_seconds > 0) fprintf(f, ", at most %g s", t->max_seconds);
    if (t->eval_every_rounds == 1)
      fputs("; evaluation every round", f);
    else
      fprintf(f, "; evaluation every %d rounds", t->eval_every_rounds);
  } else if (json_is_integer(st)) {
    fprintf(f, "%lld steps per cluster", (long long)json_integer_value(st));
  }
  fprintf(f, "%s%d round%s", job || json_is_integer(st) ? ", " : "", c[0].n,
          c[0].n == 1 ? "" : "s");
  fputs("</td></tr>\n", f);
  nb__rp_cfg_row(f, "sync");
  if (job) {
    fputs(nb_job_sync_name(job->sync.mode), f);
    if (job->sync.mode == NB_JOB_SYNC_OUTER) {
      if (job->sync.round_seconds > 0)
        fprintf(f, ", rounds of %g s", job->sync.round_seconds);
      else
        fprintf(f, ", %d inner steps per round", job->sync.inner_steps);
      fprintf(f, ", outer lr %g, momentum %g", job->sync.outer_lr, job->sync.outer_momentum);
    }
    fprintf(f, ", overlap %s", job->sync.overlap ? "on" : "off");
  } else {
    if (*nb__rp_str(s0, "mode"))
      nb__rp_esc(f, nb__rp_str(s0, "mode"));
    else
      fputs("&ndash;", f);
    nb__rp_bool(f, "overlap", json_object_get(s0, "overlap"));
  }
  fputs("</td></tr>\n", f);
  nb__rp_cfg_row(f, "compression");
  if (job) {
    const nb_job_compression_t* k = &job->compression;
    fprintf(f, "density %g (%g..%g), adaptive %s, %s values, zstd level %d, error feedback %s",
            k->density_initial, k->density_min, k->density_max, k->adaptive ? "on" : "off",
            nb_job_values_name(k->values), k->zstd_level, k->error_feedback ? "on" : "off");
  } else {
    if (*nb__rp_str(s0, "values"))
      nb__rp_esc(f, nb__rp_str(s0, "values")), fputs(" values", f);
    else
      fputs("&ndash;", f);
    nb__rp_bool(f, "adaptive density", json_object_get(s0, "adaptive"));
  }
  fputs("</td></tr>\n", f);
  nb__rp_cfg_row(f, "link");
  if (job) {
    if (job->link.rate_mbit > 0)
      fprintf(f, "%g Mbit/s cap per peer", job->link.rate_mbit);
    else
      fputs("uncapped", f);
    if (job->link.delay_ms > 0) fprintf(f, ", %g ms one-way delay", job->link.delay_ms);
    fprintf(f, ", %d stream%s, sealed frames %s", job->link.streams,
            job->link.streams == 1 ? "" : "s", job->security.seal ? "on" : "off");
  } else {
    fputs(json_is_true(json_object_get(s0, "tls")) ? "mTLS" : "no TLS recorded", f);
    nb__rp_bool(f, "sealed frames", json_object_get(s0, "sealed"));
  }
  fputs("</td></tr>\n", f);
  struct tm tm;
  char when[64] = "";
  if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  fprintf(f,
          "<tr><th>nebula version</th><td>%s</td></tr>\n"
          "<tr><th>generated</th><td class=\"generated\">%s</td></tr>\n</table>\n",
          NB_VERSION_STRING, when);
}

/* Whether every round of every cluster has one density; *per_cluster: whether each cluster has
 * one of its own. */
static int nb__rp_density_const(const nb__rp_cluster_t* c, int n, int* per_cluster) {
  int all = 1;
  *per_cluster = 1;
  for (int i = 0; i < n; i++)
    for (int j = 1; j < c[i].n; j++) {
      if (c[i].v[3][j] != c[i].v[3][0]) *per_cluster = 0;
      if (c[i].v[3][j] != c[0].v[3][0]) all = 0;
    }
  for (int i = 1; i < n; i++)
    if (c[i].v[3][0] != c[0].v[3][0]) all = 0;
  return all;
}

/* The held-out evaluation: the curve (bits per byte by inner step; per language, dashed, when
 * the clusters' curve.tsv has them and the legend has room) and the final values per language. */
static void nb__rp_eval_html(FILE* f, nb__rp_cluster_t* c, int n, nb__rp_series_t* s) {
  int ns = 0, nlang = 0, any = 0;
  for (int i = 0; i < n; i++) nlang += c[i].nl, any |= c[i].ne > 0;
  int langs = n + nlang <= 12;
  fputs("<h2>Held-out evaluation</h2>\n", f);
  if (any) {
    /* a colour per cluster when only means are drawn; with languages a colour per line (the
     * mean solid, languages dashed) so that two languages of one cluster stay apart */
    int per_line = langs && nlang > 0;
    for (int i = 0; i < n; i++) {
      if (c[i].ne == 0) continue;
      s[ns] = (nb__rp_series_t){c[i].id,           "mean", c[i].ev_step, c[i].ev_mean, c[i].ne,
                                per_line ? ns : i, 0};
      ns++;
      for (int k = 0; langs && k < c[i].nl; k++, ns++)
        s[ns] =
            (nb__rp_series_t){c[i].id, c[i].lang[k], c[i].ev_step, c[i].ev_lang[k], c[i].ne, ns, 1};
    }
    const nb__rp_chart_t ch = {"chart-eval",
                               "Held-out bits per byte vs inner step",
                               "inner step",
                               "bits per byte (bits/byte)",
                               NB_REPORT_UNIT_NONE,
                               NB_REPORT_UNIT_NONE,
                               1};
    nb__rp_chart(f, &ch, s, ns);
  } else {
    fputs("<p>No held-out evaluation was recorded.</p>\n", f);
  }
  int final = 0;
  for (int i = 0; i < n; i++) final |= json_is_object(json_object_get(c[i].sum, "final_eval_bpb"));
  if (!final) return;
  fputs("<table><tr><th>cluster</th><th>language</th><th>final bpb (bits/byte)</th></tr>\n", f);
  for (int i = 0; i < n; i++) {
    const char* k;
    json_t* v;
    json_object_foreach(json_object_get(c[i].sum, "final_eval_bpb"), k, v) {
      fputs("<tr><td>", f);
      nb__rp_esc(f, c[i].id);
      fputs("</td><td>", f);
      nb__rp_esc(f, k);
      fputs("</td>", f);
      nb__rp_cell(f, json_is_number(v) ? json_number_value(v) : NAN, "%.4f");
      fputs("</tr>\n", f);
    }
  }
  fputs("</table>\n", f);
}

static void nb__rp_html(FILE* f, const char* title, nb__rp_cluster_t* c, int n, int same,
                        nb__rp_series_t* s, const nb__rp_tr_t* tr, int ntr,
                        const nb_job_config_t* job, time_t now) {
  fputs(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width\"><title>",
      f);
  nb__rp_esc(f, title);
  /* laid out to fit a 1000 px window: a centred column, tables that wrap their headers and
   * scroll inside their own box if they ever must, charts that shrink with the page */
  fputs(
      "</title>\n<style>*{box-sizing:border-box}body{font-family:sans-serif;margin:0 auto;"
      "padding:1em 24px;max-width:960px}"
      ".scroll{max-width:100%;overflow-x:auto}table{border-collapse:collapse;margin:.5em 0;"
      "font-size:14px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
      "td{white-space:nowrap}th{background:#f4f4f4;font-weight:600}"
      "td:first-child{text-align:left}table.config th{text-align:left;white-space:nowrap}"
      "table.config td{text-align:left}code{word-break:break-all}"
      "figure{margin:1em 0}svg{max-width:100%;height:auto}.bad{color:#b00}"
      ".note{color:#444}</style></head><body>\n<h1>",
      f);
  nb__rp_esc(f, title);
  fputs("</h1>\n", f);
  nb__rp_config(f, c, n, job, now);
  fputs(
      "<h2>Results</h2>\n<div class=\"scroll\"><table class=\"results\"><tr><th>cluster</th>"
      "<th>mode</th><th>values</th><th>rounds</th><th>final loss (nats)</th>"
      "<th>eval (bits/byte)</th><th>WAN sent</th><th>bits/param per sync</th>"
      "<th>density (mean)</th><th>utilization</th><th>wall (s)</th><th>decisions</th></tr>\n",
      f);
  for (int i = 0; i < n; i++) {
    json_t* j = c[i].sum;
    fputs("<tr><td>", f);
    nb__rp_esc(f, c[i].id);
    fputs("</td><td>", f);
    nb__rp_text(f, nb__rp_str(j, "mode"));
    fputs("</td><td>", f);
    nb__rp_text(f, nb__rp_str(j, "values"));
    fprintf(f, "</td><td>%d</td>", c[i].n);
    nb__rp_cell(f, nb__rp_num(j, "final_train_loss"), "%.4f");
    nb__rp_cell(f, nb__rp_num(j, "final_eval_mean_bpb"), "%.4f");
    nb__rp_cell_u(f, nb__rp_num(j, "wan_bytes_sent"), NB_REPORT_UNIT_BYTES, 3);
    nb__rp_cell(f, nb__rp_num(j, "bits_per_param_per_sync"), "%.4f");
    nb__rp_cell(f, nb__rp_num(j, "density_mean"), "%.4g");
    nb__rp_cell(f, nb__rp_num(j, "compute_utilization"), "%.3f");
    nb__rp_cell(f, nb__rp_num(j, "wall_s"), "%.1f");
    fprintf(f, "<td>%zu</td></tr>\n", json_array_size(json_object_get(j, "decisions")));
  }
  fputs("</table></div>\n", f);
  fputs(
      "<p class=\"note\">final loss: the training cross-entropy at the end, in nats (natural "
      "log) per byte, the model's token; divided by ln 2 it is bits per byte. eval: the final "
      "held-out bits per byte (log base 2), mean over the cluster's languages.</p>\n",
      f);
  int hashes = 0;
  for (int i = 0; i < n; i++) hashes += *nb__rp_str(c[i].sum, "global_xxh3") != 0;
  if (hashes == 0) {
    fputs("<p>&theta;<sub>global</sub>: no cluster's summary records one (no exchange).</p>\n", f);
  } else if (same) {
    fputs("<p>&theta;<sub>global</sub> <code>", f);
    nb__rp_esc(f, nb__rp_str(c[0].sum, "global_xxh3"));
    fputs("</code> (xxh3) identical on every cluster.</p>\n", f);
  } else {
    fputs("<p class=\"bad\">&theta;<sub>global</sub> NOT identical on every cluster:", f);
    for (int i = 0; i < n; i++) {
      fputs(i ? ", " : " ", f);
      nb__rp_esc(f, c[i].id);
      fputs(" <code>", f);
      nb__rp_esc(
          f, *nb__rp_str(c[i].sum, "global_xxh3") ? nb__rp_str(c[i].sum, "global_xxh3") : "none");
      fputs("</code>", f);
    }
    fputs(" (xxh3).</p>\n", f);
  }
  nb__rp_eval_html(f, c, n, s);
  nb__rp_tr_html(f, tr, ntr, n);
  fputs("<h2>Charts</h2>\n", f);
  for (int i = 0; i < n; i++)
    s[i] = (nb__rp_series_t){c[i].id, "", c[i].cum_cs, c[i].v[1], c[i].n, i, 0};
  const nb__rp_chart_t loss = {"chart-loss",
                               "Training loss vs compute time",
                               "cumulative compute time (s)",
                               "loss (nats)",
                               NB_REPORT_UNIT_NONE,
                               NB_REPORT_UNIT_NONE,
                               0};
  nb__rp_chart(f, &loss, s, n);
  int wan = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < c[i].n; j++) wan |= c[i].v[2][j] != 0;
  if (wan) {
    for (int i = 0; i < n; i++)
      s[i] = (nb__rp_series_t){c[i].id, "", c[i].x1, c[i].v[2], c[i].n, i, 0};
    const nb__rp_chart_t bytes = {
        "chart-bytes",       "WAN bytes sent per round", "round", "bytes sent",
        NB_REPORT_UNIT_NONE, NB_REPORT_UNIT_BYTES,       1};
    nb__rp_chart(f, &bytes, s, n);
    for (int i = 0; i < n; i++)
      s[i] = (nb__rp_series_t){c[i].id, "", c[i].x1, c[i].bps, c[i].n, i, 0};
    const nb__rp_chart_t good = {"chart-goodput",
                                 "WAN goodput per round (bytes sent / exchange seconds)",
                                 "round",
                                 "goodput",
                                 NB_REPORT_UNIT_NONE,
                                 NB_REPORT_UNIT_BYTES_PER_S,
                                 1};
    nb__rp_chart(f, &good, s, n);
  } else {
    fputs(
        "<p id=\"no-wan\">No bytes were sent over the WAN in any round (no exchange): bytes, "
        "goodput and density are not charted.</p>\n",
        f);
  }
  int per = 0, all = wan && nb__rp_density_const(c, n, &per); /* without exchange: nothing */
  if (all) {
    json_t* ad = json_object_get(c[0].sum, "adaptive");
    fprintf(f,
            "<p id=\"density-constant\">Density was %g on every round of every cluster%s, so it "
            "is not charted.</p>\n",
            c[0].v[3][0],
            json_is_false(ad)  ? " (adaptive density off)"
            : json_is_true(ad) ? " (the adaptive scheduler kept it there)"
                               : "");
  } else if (wan && per) {
    fputs("<p id=\"density-constant\">Density was constant on each cluster:", f);
    for (int i = 0; i < n; i++) {
      fputs(i ? ", " : " ", f);
      nb__rp_esc(f, c[i].id);
      fprintf(f, " %g", c[i].v[3][0]);
    }
    fputs(" on every round, so it is not charted.</p>\n", f);
  } else if (wan) {
    for (int i = 0; i < n; i++)
      s[i] = (nb__rp_series_t){c[i].id, "", c[i].x1, c[i].v[3], c[i].n, i, 0};
    const nb__rp_chart_t dens = {"chart-density",
                                 "Density per round (scheduler decisions)",
                                 "round",
                                 "density (fraction kept)",
                                 NB_REPORT_UNIT_NONE,
                                 NB_REPORT_UNIT_NONE,
                                 1};
    nb__rp_chart(f, &dens, s, n);
  }
  for (int i = 0; i < n; i++) {
    s[2 * i] = (nb__rp_series_t){c[i].id, "compute", c[i].x1, c[i].v[4], c[i].n, i, 0};
    s[2 * i + 1] = (nb__rp_series_t){c[i].id, "exchange", c[i].x1, c[i].v[5], c[i].n, i, 1};
  }
  const nb__rp_chart_t secs = {"chart-seconds",
                               "Compute vs exchange time per round",
                               "round",
                               "time (s)",
                               NB_REPORT_UNIT_NONE,
                               NB_REPORT_UNIT_NONE,
                               1};
  nb__rp_chart(f, &secs, s, 2 * n);
  fputs("</body></html>\n", f);
}

/* Writes buf to dir/name through a temp file, fsync and rename; removes the temp on failure. */
static nb_status_t nb__rp_atomic(const char* dir, const char* name, const char* buf, size_t len) {
  char path[4096], tmp[4200];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    return nb_error(NB_ERR_INVALID, "path too long: %s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) return nb_error(NB_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  size_t off = 0;
  int ok = 1;
  while (ok && off < len) {
    ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      ok = 0;
    else
      off += (size_t)w;
  }
  int e = errno;
  if (ok && (fchmod(fd, 0644) != 0 || fsync(fd) != 0)) ok = 0, e = errno;
  if (close(fd) != 0 && ok) ok = 0, e = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
  if (!ok) {
    unlink(tmp);
    return nb_error(NB_ERR_IO, "writing %s: %s", path, strerror(e));
  }
  return NB_OK;
}

nb_status_t nb_report_write(const char* run_dir, const char* const* cluster_ids, int n,
                            const char* title) {
  const nb_report_options_t o = {.title = title};
  return nb_report_write_opts(run_dir, cluster_ids, n, &o);
}

nb_status_t nb_report_write_opts(const char* run_dir, const char* const* cluster_ids, int n,
                                 const nb_report_options_t* opts) {
  const char* title = opts ? opts->title : NULL;
  const nb_job_config_t* job = opts ? opts->job : NULL;
  if (!run_dir || !cluster_ids || n < 1 || n > 1024)
    return nb_error(NB_ERR_INVALID, "report: need a run folder and 1..1024 clusters (got %d)", n);
  nb_status_t st = NB_OK;
  nb__rp_cluster_t* c = NULL;
  nb__rp_series_t* s = NULL;
  nb__rp_tr_t* tr = NULL;
  int ntr = 0;
  json_t* out = NULL;
  char *html = NULL, *js = NULL;
  size_t hlen = 0;
  NB_CHECK(nb_calloc((void**)&c, (size_t)n, sizeof *c, "report clusters"));
  /* series of one chart: per cluster its mean and languages (eval), or compute and exchange */
  NB_CHECK_GOTO(nb_calloc((void**)&s, (1 + NB__RP_LANGS) * (size_t)n, sizeof *s, "report series"),
                st, done);
  for (int i = 0; i < n; i++)
    NB_CHECK_GOTO(nb__rp_read_cluster(run_dir, cluster_ids[i], &c[i]), st, done);
  NB_CHECK_GOTO(nb__rp_tr_collect(c, n, &tr, &ntr), st, done);
  if (!title || !*title)
    title = *nb__rp_str(c[0].sum, "job") ? nb__rp_str(c[0].sum, "job") : "nebula run";

  int same = 1;
  const char* first = NULL;
  double wan_total = 0;
  out = json_object();
  json_t* arr = json_array();
  json_object_set_new(out, "title", json_string(title));
  json_object_set_new(out, "clusters", arr);
  for (int i = 0; i < n; i++) {
    json_t* j = c[i].sum;
    const char* hx = json_string_value(json_object_get(j, "global_xxh3"));
    if (!hx || (first && strcmp(first, hx) != 0)) same = 0;
    if (hx && !first) first = hx;
    json_t* o = json_object();
    json_object_set_new(o, "cluster", json_string(c[i].id));
    json_object_set_new(o, "rounds", json_integer(c[i].n));
    static const char* const keys[] = {"final_train_loss",
                                       "final_eval_mean_bpb",
                                       "final_eval_bpb",
                                       "wan_bytes_sent",
                                       "bits_per_param_per_sync",
                                       "density_mean",
                                       "compute_utilization",
                                       "compute_s",
                                       "exchange_s",
                                       "wall_s",
                                       "global_xxh3"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      json_t* v = json_object_get(j, keys[k]);
      json_object_set(o, keys[k], v ? v : json_null());
    }
    json_object_set_new(o, "decisions",
                        json_integer((json_int_t)json_array_size(json_object_get(j, "decisions"))));
    json_object_set_new(o, "translation", nb__rp_tr_json(tr, ntr, c[i].id));
    double wb = nb__rp_num(j, "wan_bytes_sent");
    if (!isnan(wb)) wan_total += wb;
    json_array_append_new(arr, o);
  }
  json_object_set_new(out, "wan_bytes_total", json_integer((json_int_t)wan_total));
  json_object_set_new(out, "theta_global_identical", json_boolean(same));
  js = json_dumps(out, JSON_INDENT(2) | JSON_SORT_KEYS);
  if (!js) {
    st = nb_error(NB_ERR_NOMEM, "report: serializing summary.json");
    goto done;
  }

  FILE* f = open_memstream(&html, &hlen);
  if (!f) {
    st = nb_error(NB_ERR_NOMEM, "report: open_memstream");
    goto done;
  }
  nb__rp_html(f, title, c, n, same, s, tr, ntr, job, time(NULL));
  if (fclose(f) != 0) {
    st = nb_error(NB_ERR_NOMEM, "report: building report.html");
    goto done;
  }
  size_t jl = strlen(js);
  char* js2 = NULL;
  NB_CHECK_GOTO(nb_alloc((void**)&js2, jl + 2, 1, "report json"), st, done);
  memcpy(js2, js, jl);
  js2[jl] = '\n';
  st = nb__rp_atomic(run_dir, "summary.json", js2, jl + 1);
  nb_free(js2);
  if (st != NB_OK) goto done;
  st = nb__rp_atomic(run_dir, "report.html", html, hlen);
done:
  if (c)
    for (int i = 0; i < n; i++) nb__rp_free(&c[i]);
  nb_free(c);
  nb_free(s);
  nb_free(tr);
  json_decref(out);
  free(js);
  free(html);
  return st;
}
