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
#include <unistd.h>

#include "common/common.h"

enum { NB__RP_COLS = 7 }; /* round loss bytes_sent density compute_s exchange_s global_xxh3 */
static const char* const nb__rp_cols[NB__RP_COLS] = {
    "round", "loss", "bytes_sent", "density", "compute_s", "exchange_s", "global_xxh3"};

typedef struct {
  const char* id;
  int n;          /* rows */
  double* v[6];   /* round loss bytes_sent density compute_s exchange_s */
  double* cum_cs; /* cumulative compute seconds */
  double* mbps;   /* bytes_sent / exchange_s per round, MB/s (0 when exchange_s is 0) */
  json_t* sum;
} nb__rp_cluster_t;

static void nb__rp_free(nb__rp_cluster_t* c) {
  for (int k = 0; k < 6; k++) nb_free(c->v[k]);
  nb_free(c->cum_cs);
  nb_free(c->mbps);
  json_decref(c->sum);
  memset(c, 0, sizeof *c);
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
    int nf = 0;
    for (char *save = NULL, *t = strtok_r(line, "\t", &save); t && nf < 64;
         t = strtok_r(NULL, "\t", &save))
      fields[nf++] = t;
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
      NB_CHECK_GOTO(nb_realloc((void**)&c->mbps, (size_t)rcap, sizeof(double), "report rows"), st,
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
    c->mbps[c->n] = c->v[5][c->n] > 0 ? c->v[2][c->n] / c->v[5][c->n] / 1e6 : 0;
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
  const char* extra; /* appended to the label, e.g. " compute" (constant text) */
  const double* x;
  const double* y;
  int n;
  int color;
  int dashed;
} nb__rp_series_t;

static void nb__rp_chart(FILE* f, const char* title, const char* xlabel, const char* ylabel,
                         const nb__rp_series_t* s, int ns) {
  const double W = 640, H = 300, L = 70, R = 150, T = 30, B = 45;
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
  if (x1 / 2 - x0 / 2 < 1e-12 * fmax(1, fabs(x1))) { /* one x: pad relative to its size */
    double d = fmax(fabs(x1) * 0.1, 0.5);
    x0 -= d, x1 += d;
  }
  if (y1 / 2 - y0 / 2 < 1e-12 * fmax(1, fabs(y1))) {
    double d = fmax(fabs(y1) * 0.1, 0.5);
    y0 -= d, y1 += d;
  }
  if (!isfinite(x0) || !isfinite(x1)) x0 = -DBL_MAX, x1 = DBL_MAX; /* padding overflowed */
  if (!isfinite(y0) || !isfinite(y1)) y0 = -DBL_MAX, y1 = DBL_MAX;
  double pw = W - L - R, ph = H - T - B;
#define NB__PX(v) (L + ((v) / 2 - x0 / 2) / (x1 / 2 - x0 / 2) * pw)
#define NB__PY(v) (T + ph - ((v) / 2 - y0 / 2) / (y1 / 2 - y0 / 2) * ph)
  fprintf(f,
          "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
          W, H, W, H);
  fprintf(f, "<text x=\"%.0f\" y=\"18\" font-size=\"14\" font-weight=\"bold\">", L);
  nb__rp_esc(f, title);
  fputs("</text>\n", f);
  fprintf(f,
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
          "stroke=\"#888\"/>\n",
          L, T, pw, ph);
  for (int k = 0; k <= 4; k++) {
    double a = k / 4.0, xv = x0 * (1 - a) + x1 * a, yv = y0 * (1 - a) + y1 * a; /* no overflow */
    double px = NB__PX(xv), py = NB__PY(yv);
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.4g</text>\n",
            px, T, px, T + ph, px, T + ph + 14, xv);
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n",
            L, py, L + pw, py, L - 4, py + 4, yv);
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">", L + pw / 2, H - 8);
  nb__rp_esc(f, xlabel);
  fprintf(
      f,
      "</text><text x=\"12\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 12 %.1f)\">",
      T + ph / 2, T + ph / 2);
  nb__rp_esc(f, ylabel);
  fputs("</text>\n", f);
  for (int i = 0; i < ns; i++) {
    const char* col = nb__rp_colors[s[i].color % 8];
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"", col,
            s[i].dashed ? " stroke-dasharray=\"5,3\"" : "");
    int drawn = 0, last = -1;
    for (int j = 0; j < s[i].n; j++) {
      double px = NB__PX(s[i].x[j]), py = NB__PY(s[i].y[j]);
      if (!isfinite(s[i].x[j]) || !isfinite(s[i].y[j]) || !isfinite(px) || !isfinite(py)) continue;
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
            "stroke-width=\"2\"%s/><text x=\"%.0f\" y=\"%.1f\">",
            L + pw + 10, ly, L + pw + 30, ly, col, s[i].dashed ? " stroke-dasharray=\"5,3\"" : "",
            L + pw + 34, ly + 4);
    nb__rp_esc(f, s[i].name);
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
  double ymax = fmin(100, fmax(10, ceil(vmax / 10) * 10));
  const double L = 50, R = 120, T = 30, B = 60, bw = 14, gap = 20, H = 300;
  double pw = fmax(nt * (4 * bw + gap) + gap, 330), W = L + pw + R, ph = H - T - B;
  fprintf(f,
          "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
          "<text x=\"%.0f\" y=\"18\" font-size=\"14\" font-weight=\"bold\">Translation quality: "
          "base vs final model</text>\n",
          W, H, W, H, L);
  for (int k = 0; k <= 4; k++) {
    double yv = ymax * k / 4, py = T + ph - yv / ymax * ph;
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n",
            L, py, L + pw, py, L - 4, py + 4, yv);
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
          "<text x=\"12\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 12 %.1f)\">"
          "score (0-100)</text>\n</svg></figure>\n",
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

static void nb__rp_html(FILE* f, const char* title, nb__rp_cluster_t* c, int n, int same,
                        nb__rp_series_t* s, const nb__rp_tr_t* tr, int ntr) {
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", f);
  nb__rp_esc(f, title);
  fputs(
      "</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:1000px}"
      "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
      "text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}"
      "figure{margin:1em 0}.bad{color:#b00}</style></head><body>\n<h1>",
      f);
  nb__rp_esc(f, title);
  fputs(
      "</h1>\n<h2>Results</h2>\n<table><tr><th>cluster</th><th>mode</th><th>values</th>"
      "<th>rounds</th><th>final loss</th><th>eval bpb</th><th>WAN MB</th><th>bits/param/sync</th>"
      "<th>density</th><th>utilization</th><th>wall s</th><th>decisions</th>"
      "<th>&theta;<sub>global</sub> xxh3</th></tr>\n",
      f);
  for (int i = 0; i < n; i++) {
    json_t* j = c[i].sum;
    fputs("<tr><td>", f);
    nb__rp_esc(f, c[i].id);
    fputs("</td><td>", f);
    nb__rp_esc(f, nb__rp_str(j, "mode"));
    fputs("</td><td>", f);
    nb__rp_esc(f, nb__rp_str(j, "values"));
    fprintf(f, "</td><td>%d</td>", c[i].n);
    nb__rp_cell(f, nb__rp_num(j, "final_train_loss"), "%.4f");
    nb__rp_cell(f, nb__rp_num(j, "final_eval_mean_bpb"), "%.4f");
    nb__rp_cell(f, nb__rp_num(j, "wan_bytes_sent") / 1e6, "%.3f");
    nb__rp_cell(f, nb__rp_num(j, "bits_per_param_per_sync"), "%.4f");
    nb__rp_cell(f, nb__rp_num(j, "density_mean"), "%.4f");
    nb__rp_cell(f, nb__rp_num(j, "compute_utilization"), "%.3f");
    nb__rp_cell(f, nb__rp_num(j, "wall_s"), "%.1f");
    fprintf(f, "<td>%zu</td><td><code>", json_array_size(json_object_get(j, "decisions")));
    nb__rp_esc(f, nb__rp_str(j, "global_xxh3"));
    fputs("</code></td></tr>\n", f);
  }
  fprintf(f, "</table>\n<p%s>&theta;<sub>global</sub> %s on every cluster.</p>\n",
          same ? "" : " class=\"bad\"", same ? "identical" : "NOT identical");
  /* per-language held-out bits per byte, when the summaries carry them */
  int any = 0;
  for (int i = 0; i < n; i++) any |= json_is_object(json_object_get(c[i].sum, "final_eval_bpb"));
  if (any) {
    fputs(
        "<h2>Held-out bits per byte</h2>\n<table><tr><th>cluster</th><th>language</th>"
        "<th>bpb</th></tr>\n",
        f);
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
  nb__rp_tr_html(f, tr, ntr, n);
  fputs("<h2>Charts</h2>\n", f);
  for (int i = 0; i < n; i++)
    s[i] = (nb__rp_series_t){c[i].id, "", c[i].cum_cs, c[i].v[1], c[i].n, i, 0};
  nb__rp_chart(f, "Training loss vs compute time", "cumulative compute seconds", "loss", s, n);
  for (int i = 0; i < n; i++)
    s[i] = (nb__rp_series_t){c[i].id, "", c[i].v[0], c[i].v[2], c[i].n, i, 0};
  nb__rp_chart(f, "WAN bytes sent per round", "round", "bytes", s, n);
  for (int i = 0; i < n; i++)
    s[i] = (nb__rp_series_t){c[i].id, "", c[i].v[0], c[i].mbps, c[i].n, i, 0};
  nb__rp_chart(f, "WAN goodput per round (bytes sent / exchange seconds)", "round", "MB/s", s, n);
  for (int i = 0; i < n; i++)
    s[i] = (nb__rp_series_t){c[i].id, "", c[i].v[0], c[i].v[3], c[i].n, i, 0};
  nb__rp_chart(f, "Density per round (scheduler decisions)", "round", "density", s, n);
  for (int i = 0; i < n; i++) {
    s[2 * i] = (nb__rp_series_t){c[i].id, " compute", c[i].v[0], c[i].v[4], c[i].n, i, 0};
    s[2 * i + 1] = (nb__rp_series_t){c[i].id, " exchange", c[i].v[0], c[i].v[5], c[i].n, i, 1};
  }
  nb__rp_chart(f, "Compute vs exchange seconds per round", "round", "seconds", s, 2 * n);
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
  NB_CHECK_GOTO(nb_calloc((void**)&s, 2 * (size_t)n, sizeof *s, "report series"), st, done);
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
  nb__rp_html(f, title, c, n, same, s, tr, ntr);
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
