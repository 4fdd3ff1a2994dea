/* nb_report_write on synthetic cluster folders: self-contained HTML with SVG, escaping of
 * strings from the files, the job-level summary.json, precise errors for bad input, the
 * translation section (chrF/BLEU base vs final) with bad and missing fields, the held-out curve
 * (summary evals, curve.tsv by language, a bad curve.tsv), constant density, the configuration
 * block with and without the job's settings. A real run is in test_report_run.c, one in a
 * browser in test_report_browser.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "jobs/descriptor.h"
#include "report/report.h"

static const char* const nb__hdr =
    "round\tsteps\tsamples\tsamples_all\tloss\tmsg_bytes\tbytes_sent\tdensity\tcompute_s\t"
    "codec_s\texchange_s\tglobal_xxh3\n";

static void put(const char* dir, const char* sub, const char* name, const char* text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, sub);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/%s/%s", dir, sub, name);
  FILE* f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void cluster(const char* dir, const char* id, const char* mode, double loss0) {
  char buf[4096];
  int o = snprintf(buf, sizeof buf, "%s", nb__hdr);
  for (int r = 0; r < 5; r++)
    o += snprintf(buf + o, sizeof buf - (size_t)o,
                  "%d\t20\t160\t320\t%.4f\t%d\t%d\t%.3f\t%.2f\t0.01\t%.2f\t%016x\n", r,
                  loss0 - 0.3 * r, 10000 + 1000 * r, 10000 + 1000 * r, 0.03 + 0.01 * r,
                  2.0 + 0.1 * r, 0.2 - 0.01 * r, 0xabcu + (unsigned)r);
  put(dir, id, "rounds.tsv", buf);
  snprintf(buf, sizeof buf,
           "{\"cluster\":\"%s\",\"job\":\"synthetic-job\",\"mode\":\"%s\",\"values\":\"int8\","
           "\"rounds\":5,\"final_train_loss\":2.5,\"final_eval_mean_bpb\":3.9,"
           "\"final_eval_bpb\":{\"en\":3.9},\"wan_bytes_sent\":60000,"
           "\"bits_per_param_per_sync\":0.42,\"compute_utilization\":0.95,\"wall_s\":12.5,"
           "\"decisions\":[{\"round\":1,\"density\":0.04}],\"global_xxh3\":\"00000000deadbeef\"}",
           id, mode);
  put(dir, id, "summary.json", buf);
}

static char* slurp(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* s = calloc(1, (size_t)n + 1);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return s;
}

static int no_temp_left(const char* dir) {
  DIR* d = opendir(dir);
  struct dirent* e;
  int ok = 1;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp")) ok = 0;
  closedir(d);
  return ok;
}

static void rm_rf(const char* dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_report_ok(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  cluster(dir, "dc-a", "outer", 4.0);
  cluster(dir, "dc-b", "x<&>y", 3.5);
  const char* ids[] = {"dc-a", "dc-b"};
  assert_int_equal(nb_report_write(dir, ids, 2, "job \"<t>\""), NB_OK);
  char p[512];
  snprintf(p, sizeof p, "%s/report.html", dir);
  char* h = slurp(p);
  assert_non_null(h);
  assert_non_null(strstr(h, "<svg"));
  assert_non_null(strstr(h, "dc-a"));
  assert_non_null(strstr(h, "dc-b"));
  assert_null(strstr(h, "<script"));
  assert_null(strstr(h, "src=")); /* no external assets */
  assert_null(strstr(h, "href="));
  assert_non_null(strstr(h, "x&lt;&amp;&gt;y"));
  assert_null(strstr(h, "x<&>y"));
  assert_non_null(strstr(h, "job &quot;&lt;t&gt;&quot;"));
  assert_non_null(strstr(h, "<polyline"));
  assert_non_null(strstr(h, "kB/s"));
  assert_non_null(strstr(h, "identical on every cluster"));
  /* rounded ticks with units: bytes sent 10 000..14 000 per round */
  assert_non_null(strstr(h, ">10 kB</text>"));
  assert_non_null(strstr(h, ">14 kB</text>"));
  assert_null(strstr(h, "e+0"));
  /* units in the headers, the configuration block, a density that varies is charted */
  assert_non_null(strstr(h, "<th>final loss (nats)</th><th>eval (bits/byte)</th>"));
  assert_non_null(strstr(h, "<td>60 kB</td>")); /* WAN bytes with their unit */
  assert_non_null(strstr(h, "<h2>Configuration</h2>"));
  assert_non_null(strstr(h, "<th>nebula version</th><td>" NB_VERSION_STRING "</td>"));
  assert_non_null(strstr(h, " UTC</td>"));
  assert_non_null(strstr(h, "id=\"chart-density\""));
  assert_null(strstr(h, "density-constant"));
  assert_non_null(strstr(h, "No held-out evaluation was recorded."));
  assert_null(strstr(h, "Translation quality")); /* no translation scores, no section */
  free(h);
  snprintf(p, sizeof p, "%s/summary.json", dir);
  json_error_t je;
  json_t* s = json_load_file(p, 0, &je);
  assert_non_null(s);
  json_t* cl = json_object_get(s, "clusters");
  assert_int_equal(json_array_size(cl), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 0), "cluster")), "dc-a");
  assert_string_equal(json_string_value(json_object_get(json_array_get(cl, 1), "cluster")), "dc-b");
  assert_int_equal(json_integer_value(json_object_get(json_array_get(cl, 1), "rounds")), 5);
  assert_true(json_is_true(json_object_get(s, "theta_global_identical")));
  assert_int_equal(json_integer_value(json_object_get(s, "wan_bytes_total")), 120000);
  assert_true(json_is_null(json_object_get(json_array_get(cl, 0), "translation")));
  json_decref(s);
  assert_true(no_temp_left(dir));
  rm_rf(dir);
}

static void test_report_bad(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  cluster(dir, "dc-a", "outer", 4.0);
  cluster(dir, "dc-b", "outer", 4.0);
  const char* ids[] = {"dc-a", "dc-b"};
  /* truncated last row */
  char buf[1024];
  snprintf(buf, sizeof buf, "%s0\t20\t160\t320\t4.0\t1\t1\t0.03\t2\t0\t0.1\tab\n1\t20\t16",
           nb__hdr);
  put(dir, "dc-b", "rounds.tsv", buf);
  assert_int_equal(nb_report_write(dir, ids, 2, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "dc-b/rounds.tsv:3"));
  /* garbled number */
  snprintf(buf, sizeof buf, "%s0\t20\t160\t320\tfour\t1\t1\t0.03\t2\t0\t0.1\tab\n", nb__hdr);
  put(dir, "dc-b", "rounds.tsv", buf);
  assert_int_equal(nb_report_write(dir, ids, 2, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "dc-b/rounds.tsv:2"));
  assert_non_null(strstr(nb_error_last(), "loss"));
  /* no header */
  put(dir, "dc-b", "rounds.tsv", "");
  assert_int_equal(nb_report_write(dir, ids, 2, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "rounds.tsv"));
  /* garbled summary.json */
  cluster(dir, "dc-b", "outer", 4.0);
  put(dir, "dc-b", "summary.json", "{\"cluster\": \"dc-b\",\n  oops");
  assert_int_equal(nb_report_write(dir, ids, 2, NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "dc-b/summary.json:2"));
  /* a missing cluster folder */
  const char* ids3[] = {"dc-a", "dc-missing"};
  assert_int_equal(nb_report_write(dir, ids3, 2, NULL), NB_ERR_IO);
  assert_non_null(strstr(nb_error_last(), "dc-missing"));
  /* a missing run folder */
  char gone[600];
  snprintf(gone, sizeof gone, "%s/no-such-run", dir);
  assert_int_equal(nb_report_write(gone, ids, 2, NULL), NB_ERR_IO);
  assert_int_equal(nb_report_write(dir, ids, 0, NULL), NB_ERR_INVALID);
  char p[512];
  snprintf(p, sizeof p, "%s/report.html", dir);
  assert_int_not_equal(access(p, F_OK), 0); /* nothing written on failure */
  assert_true(no_temp_left(dir));
  rm_rf(dir);
}

/* Replaces the closing brace of dir/id/summary.json with `,"translation": <tr>}`. */
static void add_translation(const char* dir, const char* id, const char* tr) {
  char p[512], buf[4096];
  snprintf(p, sizeof p, "%s/%s/summary.json", dir, id);
  char* old = slurp(p);
  assert_non_null(old);
  size_t n = strlen(old);
  assert_true(n > 0 && old[n - 1] == '}');
  old[n - 1] = 0;
  snprintf(buf, sizeof buf, "%s,\"translation\":%s}", old, tr);
  free(old);
  put(dir, id, "summary.json", buf);
}

static void test_report_translation(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  cluster(dir, "dc-a", "outer", 4.0);
  cluster(dir, "dc-b", "outer", 4.0);
  cluster(dir, "dc-c", "outer", 4.0);
  cluster(dir, "dc-d", "outer", 4.0);
  add_translation(dir, "dc-a",
                  "{\"en-de\": {\"sentences\": 8, \"base\": {\"chrf\": 12.5, \"bleu\": 1.25},"
                  " \"final\": {\"chrf\": 31.75, \"bleu\": 6.5}, \"seconds\": 3.2},"
                  " \"en-<b>\": {\"sentences\": 8, \"base\": {\"chrf\": 10, \"bleu\": 0},"
                  " \"final\": {\"chrf\": 20, \"bleu\": 2}}}");
  /* bad fields: a string count, a string score, a score above 100, a missing side, a pair
   * that is not an object */
  add_translation(dir, "dc-b",
                  "{\"en-fr\": {\"sentences\": \"many\", \"base\": {\"chrf\": \"x\"},"
                  " \"final\": {\"chrf\": 150, \"bleu\": 3}}, \"en-ru\": 5,"
                  " \"en-zh\": {\"sentences\": 4}}");
  add_translation(dir, "dc-c", "\"oops\""); /* not an object: ignored */
  add_translation(dir, "dc-d", "null");
  const char* ids[] = {"dc-a", "dc-b", "dc-c", "dc-d"};
  assert_int_equal(nb_report_write(dir, ids, 4, NULL), NB_OK);

  char p[512];
  snprintf(p, sizeof p, "%s/report.html", dir);
  char* h = slurp(p);
  assert_non_null(h);
  char* sec = strstr(h, "Translation quality");
  assert_non_null(sec);
  assert_non_null(strstr(sec, "<td>12.50</td><td>31.75</td><td>+19.25</td>"));
  assert_non_null(strstr(sec, "<td>1.25</td><td>6.50</td><td>+5.25</td>"));
  assert_non_null(strstr(sec, "en-&lt;b&gt;"));
  assert_null(strstr(h, "en-<b>"));
  /* dc-b's en-fr: dashes for the bad count and scores, the good final BLEU kept */
  char* fr = strstr(sec, "<td>en-fr</td>");
  assert_non_null(fr);
  /* sentences, chrF base, final, delta, BLEU base: dashes; BLEU final 3.00; delta: dash */
  assert_non_null(strstr(fr,
                         "<td>&ndash;</td><td>&ndash;</td><td>&ndash;</td><td>&ndash;</td>"
                         "<td>&ndash;</td><td>3.00</td><td>&ndash;</td></tr>"));
  assert_null(strstr(sec, "150"));
  assert_null(strstr(sec, "<td>en-ru</td>"));
  assert_non_null(strstr(sec, "<td>en-zh</td><td>4</td>"));
  /* the bar chart: one bar per present score, in a self-contained SVG */
  char* chart = strstr(sec, "base vs final model</text>");
  assert_non_null(chart);
  int bars = 0;
  for (char* q = chart; (q = strstr(q, "<title>")); q++) bars++;
  assert_int_equal(bars, 4 + 4 + 1); /* en-de, en-<b>, en-fr's final BLEU */
  assert_non_null(strstr(chart, "<title>chrF final 31.75</title>"));
  assert_null(strstr(h, "<script"));
  free(h);

  snprintf(p, sizeof p, "%s/summary.json", dir);
  json_error_t je;
  json_t* s = json_load_file(p, 0, &je);
  assert_non_null(s);
  json_t* cl = json_object_get(s, "clusters");
  json_t* a = json_object_get(json_object_get(json_array_get(cl, 0), "translation"), "en-de");
  assert_int_equal(json_integer_value(json_object_get(a, "sentences")), 8);
  assert_true(json_real_value(json_object_get(json_object_get(a, "final"), "chrf")) == 31.75);
  assert_true(json_real_value(json_object_get(json_object_get(a, "base"), "bleu")) == 1.25);
  json_t* b = json_object_get(json_array_get(cl, 1), "translation");
  json_t* bf = json_object_get(b, "en-fr");
  assert_true(json_is_null(json_object_get(bf, "sentences")));
  assert_true(json_is_null(json_object_get(json_object_get(bf, "base"), "chrf")));
  assert_true(json_is_null(json_object_get(json_object_get(bf, "final"), "chrf")));
  assert_true(json_real_value(json_object_get(json_object_get(bf, "final"), "bleu")) == 3.0);
  assert_null(json_object_get(b, "en-ru"));
  assert_true(json_is_null(json_object_get(json_array_get(cl, 2), "translation")));
  assert_true(json_is_null(json_object_get(json_array_get(cl, 3), "translation")));
  json_decref(s);
  assert_true(no_temp_left(dir));
  rm_rf(dir);
}

/* Values each finite whose sums and spans overflow (compute seconds of 1e308 add up to inf,
 * losses of +-1e308 span inf): the report is written, no SVG coordinate is NaN or infinite, and
 * the points that cannot be placed are named in the legend instead of drawn as "-nan". */
static void test_report_overflow(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char buf[4096];
  int o = snprintf(buf, sizeof buf, "%s", nb__hdr);
  const char* loss[3] = {"1e308", "-1e308", "2.5"};
  for (int r = 0; r < 3; r++)
    o += snprintf(buf + o, sizeof buf - (size_t)o,
                  "%d\t20\t160\t320\t%s\t1000\t1000\t0.1\t1e308\t0.01\t1e-300\t%016x\n", r, loss[r],
                  0xabcu + (unsigned)r);
  put(dir, "dc-a", "rounds.tsv", buf);
  put(dir, "dc-a", "summary.json", "{\"cluster\":\"dc-a\",\"global_xxh3\":\"00\"}");
  const char* ids[] = {"dc-a"};
  assert_int_equal(nb_report_write(dir, ids, 1, NULL), NB_OK);
  char p[600];
  snprintf(p, sizeof p, "%s/report.html", dir);
  char* html = slurp(p);
  assert_non_null(html);
  /* every number inside an SVG attribute or points list is finite */
  for (const char* q = html; (q = strstr(q, "<svg")) != NULL; q++) {
    const char* end = strstr(q, "</svg>");
    assert_non_null(end);
    for (const char* c = q; c < end; c++) {
      if (*c == '>') { /* skip text content: labels may legitimately say anything */
        const char* lt = memchr(c, '<', (size_t)(end - c));
        if (!lt) break;
        c = lt;
      }
      if (!strncasecmp(c, "nan", 3) || !strncasecmp(c, "inf", 3))
        fail_msg("non-finite coordinate in the SVG: %.40s", c);
    }
  }
  assert_non_null(strstr(html, "not finite, not drawn"));
  free(html);
  rm_rf(dir);
}

/* Replaces the closing brace of dir/id/summary.json with `,<fields>}`. */
static void add_fields(const char* dir, const char* id, const char* fields) {
  char p[512], buf[8192];
  snprintf(p, sizeof p, "%s/%s/summary.json", dir, id);
  char* old = slurp(p);
  assert_non_null(old);
  size_t n = strlen(old);
  assert_true(n > 0 && old[n - 1] == '}');
  old[n - 1] = 0;
  snprintf(buf, sizeof buf, "%s,%s}", old, fields);
  free(old);
  put(dir, id, "summary.json", buf);
}

/* The text of report.html from its first occurrence of `from` to the next `to`, as a string
 * (caller frees); fails when either is missing. */
static char* section(const char* h, const char* from, const char* to) {
  const char* a = strstr(h, from);
  if (!a) fail_msg("report.html lacks %s", from);
  const char* b = strstr(a, to);
  if (!b) fail_msg("report.html lacks %s after %s", to, from);
  return strndup(a, (size_t)(b - a));
}

static int count(const char* h, const char* needle) {
  int k = 0;
  for (const char* q = h; (q = strstr(q, needle)); q += strlen(needle)) k++;
  return k;
}

/* The held-out curve: from a summary's "evals" plus the final evaluation (dc-a), from curve.tsv
 * with a line per language (dc-b); a curve.tsv that does not parse falls back to the summary
 * (dc-c). A density that never changes is one sentence, not a flat chart. */
static void test_report_curves(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  const char* ids[] = {"dc-a", "dc-b", "dc-c"};
  for (int i = 0; i < 3; i++) {
    char buf[4096];
    int o = snprintf(buf, sizeof buf, "%s", nb__hdr);
    for (int r = 0; r < 3; r++)
      o += snprintf(buf + o, sizeof buf - (size_t)o,
                    "%d\t4\t16\t32\t%.2f\t1500\t1600\t0.05\t0.02\t0.01\t0.03\t%016x\n", r,
                    5.4 - 0.3 * r, 0xabcu + (unsigned)r);
    put(dir, ids[i], "rounds.tsv", buf);
    snprintf(buf, sizeof buf,
             "{\"cluster\":\"%s\",\"job\":\"curves\",\"mode\":\"outer\",\"values\":\"int8\","
             "\"adaptive\":false,\"inner_steps\":12,\"final_eval_mean_bpb\":6.75,"
             "\"evals\":[{\"round\":1,\"step\":4,\"mean_bpb\":7.9},{\"round\":2,\"step\":8,"
             "\"mean_bpb\":7.25},{\"bad\":1}],\"global_xxh3\":\"00000000deadbeef\"}",
             ids[i]);
    put(dir, ids[i], "summary.json", buf);
  }
  put(dir, "dc-b", "curve.tsv",
      "step\tsamples\tseconds\ten\tde\tmean\n0\t0\t0.0\t8.0\t8.1\t8.05\n6\t24\t0.1\t7.5\t7.1\t7.3\n"
      "12\t48\t0.2\t7.0\tnan\t7.0\n");
  put(dir, "dc-c", "curve.tsv", "step\tmean\n0\tseven\n");
  assert_int_equal(nb_report_write(dir, ids, 3, NULL), NB_OK);
  char p[512];
  snprintf(p, sizeof p, "%s/report.html", dir);
  char* h = slurp(p);
  assert_non_null(h);
  char* ev = section(h, "<figure id=\"chart-eval\">", "</figure>");
  /* dc-a: mean; dc-b: mean, en, de; dc-c: mean (its curve.tsv was refused) */
  assert_int_equal(count(ev, "<polyline"), 5);
  assert_non_null(strstr(ev, ">dc-b de (1 not finite, not drawn)</text>"));
  assert_non_null(strstr(ev, ">dc-b en</text>"));
  assert_non_null(strstr(ev, ">dc-a mean</text>"));
  assert_non_null(strstr(ev, ">inner step</text>"));
  assert_non_null(strstr(ev, ">bits per byte (bits/byte)</text>"));
  /* x: steps 0..12 in whole steps; y: 6.75..8.1 in halves */
  assert_non_null(strstr(ev, "text-anchor=\"middle\">0</text>"));
  assert_non_null(strstr(ev, "text-anchor=\"middle\">12</text>"));
  assert_non_null(strstr(ev, "text-anchor=\"end\">6.5</text>"));
  assert_non_null(strstr(ev, "text-anchor=\"end\">8.5</text>"));
  /* dc-a's curve: steps 4, 8 and the final evaluation at step 12 (three points) */
  char* a = section(ev, "<polyline", "/>");
  int commas = count(a, ",");
  assert_int_equal(commas, 3);
  free(a);
  free(ev);
  /* constant density: said, not charted */
  assert_null(strstr(h, "chart-density"));
  assert_non_null(
      strstr(h, "Density was 0.05 on every round of every cluster (adaptive density off)"));
  /* everything but the generation time is the same when written again */
  char* first = section(h, "<!DOCTYPE", "<td class=\"generated\">");
  char* tail1 = strdup(strstr(strstr(h, "<td class=\"generated\">"), "</td>"));
  assert_int_equal(nb_report_write(dir, ids, 3, NULL), NB_OK);
  char* h2 = slurp(p);
  char* second = section(h2, "<!DOCTYPE", "<td class=\"generated\">");
  assert_string_equal(first, second);
  assert_string_equal(tail1, strstr(strstr(h2, "<td class=\"generated\">"), "</td>"));
  free(first);
  free(second);
  free(tail1);
  free(h2);
  free(h);
  rm_rf(dir);
}

/* A worker's summary with each language's point of every evaluation ("evals"[].bpb, and
 * final_eval_bpb for the final one): one curve per language beside the mean, a language missing
 * from one point (an evaluation that scored nothing) not drawn there. */
static void test_report_summary_langs(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  const char* ids[] = {"dc-a"};
  char buf[4096];
  int o = snprintf(buf, sizeof buf, "%s", nb__hdr);
  for (int r = 0; r < 3; r++)
    o += snprintf(buf + o, sizeof buf - (size_t)o,
                  "%d\t4\t16\t32\t%.2f\t1500\t1600\t0.05\t0.02\t0.01\t0.03\t%016x\n", r,
                  5.4 - 0.3 * r, 0xabcu + (unsigned)r);
  put(dir, "dc-a", "rounds.tsv", buf);
  put(dir, "dc-a", "summary.json",
      "{\"cluster\":\"dc-a\",\"job\":\"langs\",\"mode\":\"outer\",\"values\":\"int8\","
      "\"adaptive\":false,\"inner_steps\":12,\"final_eval_mean_bpb\":6.75,"
      "\"final_eval_bpb\":{\"en\":6.5,\"de\":7.0},"
      "\"evals\":[{\"round\":1,\"step\":4,\"mean_bpb\":7.9,\"bpb\":{\"en\":7.8,\"de\":8.0}},"
      "{\"round\":2,\"step\":8,\"mean_bpb\":7.25,\"bpb\":{\"en\":7.25}}],"
      "\"global_xxh3\":\"00000000deadbeef\"}");
  assert_int_equal(nb_report_write(dir, ids, 1, NULL), NB_OK);
  char p[512];
  snprintf(p, sizeof p, "%s/report.html", dir);
  char* h = slurp(p);
  assert_non_null(h);
  char* ev = section(h, "<figure id=\"chart-eval\">", "</figure>");
  assert_non_null(ev);
  /* the mean, en and de (de's line without step 8, where it has no value) */
  assert_int_equal(count(ev, "<polyline"), 3);
  assert_non_null(strstr(ev, ">dc-a mean</text>"));
  assert_non_null(strstr(ev, ">dc-a en</text>"));
  assert_non_null(strstr(ev, ">dc-a de (1 not finite, not drawn)</text>"));
  /* the points of the lines in order (mean, en, de): steps 4, 8 and the final evaluation at
   * 12, de without 8; y down to en's final 6.5 */
  const char* at = ev;
  int want[3] = {3, 3, 2};
  for (int k = 0; k < 3; k++) {
    at = strstr(at, "<polyline");
    char* pts = section(at, "points=\"", "\"/>");
    assert_int_equal(count(pts, ","), want[k]);
    free(pts);
    at++;
  }
  assert_non_null(strstr(ev, "text-anchor=\"end\">6.5</text>"));
  free(ev);
  free(h);
  rm_rf(dir);
}

/* With the job's settings the configuration block shows the model's shape, steps, compression
 * and link as the descriptor gives them. */
static void test_report_job_config(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  cluster(dir, "dc-a", "outer", 4.0);
  add_fields(dir, "dc-a", "\"ranks\":2,\"params_synced\":22080");
  static const char desc[] =
      "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\","
      " \"metadata\": {\"name\": \"cfg-job\"},"
      " \"spec\": {\"task\": \"pretrain\","
      "  \"clusters\": [{\"id\": \"dc-a\", \"workers\": 2, \"data\": {\"tier\": \"quick\","
      "   \"languages\": [\"en\", \"de\"]}}],"
      "  \"model\": {\"layers\": 2, \"width\": 64, \"heads\": 4, \"context\": 32},"
      "  \"training\": {\"batchSize\": 4, \"maxSteps\": 24},"
      "  \"sync\": {\"mode\": \"outer\", \"innerSteps\": 4},"
      "  \"compression\": {\"density\": {\"initial\": 0.05, \"min\": 0.001, \"max\": 0.1},"
      "   \"values\": \"int8\"},"
      "  \"link\": {\"rateMbit\": 50, \"delayMs\": 40}}}";
  nb_job_config_t* job = calloc(1, sizeof *job);
  assert_non_null(job);
  assert_int_equal(nb_descriptor_parse(desc, sizeof desc - 1, job, NULL), NB_OK);
  const char* ids[] = {"dc-a"};
  const nb_report_options_t o = {.job = job};
  assert_int_equal(nb_report_write_opts(dir, ids, 1, &o), NB_OK);
  char p[512];
  snprintf(p, sizeof p, "%s/report.html", dir);
  char* h = slurp(p);
  assert_non_null(h);
  char* cfg = section(h, "<h2>Configuration</h2>", "</table>");
  assert_non_null(strstr(cfg, "<td>cfg-job (pretrain)</td>"));
  assert_non_null(strstr(cfg, "<td>dc-a (2 ranks: en, de)</td>"));
  assert_non_null(strstr(cfg, "2 layers, width 64, 4 heads, context 32; 22.08k parameters"));
  assert_non_null(strstr(cfg, "24 steps per cluster, batch 4"));
  assert_non_null(strstr(cfg, "outer, 4 inner steps per round"));
  assert_non_null(strstr(cfg, "density 0.05 (0.001..0.1), adaptive on, int8 values"));
  assert_non_null(strstr(cfg, "50 Mbit/s cap per peer, 40 ms one-way delay"));
  free(cfg);
  free(h);
  /* the summaries' job name is the title when none is given; NULL options = nb_report_write */
  assert_int_equal(nb_report_write_opts(dir, ids, 1, NULL), NB_OK);
  h = slurp(p);
  assert_non_null(strstr(h, "<h1>synthetic-job</h1>"));
  assert_non_null(strstr(h, "the descriptor gives the shape"));
  free(h);
  free(job);
  rm_rf(dir);
}

/* Deterministic damage to the three files a report reads (a byte changed to a tab, newline,
 * digit, letter or NUL, a cut, a doubled line): every report either is written or fails with
 * NB_ERR_INVALID naming a file; a damaged curve.tsv never fails it (a warning). Under the
 * sanitizers this is the parsers' memory check. */
static void test_report_damaged(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  cluster(dir, "dc-a", "outer", 4.0);
  add_fields(dir, "dc-a", "\"inner_steps\":20,\"evals\":[{\"step\":10,\"mean_bpb\":7.5}]");
  static const char curve[] =
      "step\tsamples\tseconds\ten\tde\tmean\n0\t0\t0.0\t8.0\t8.1\t8.05\n"
      "10\t40\t0.1\t7.5\t7.1\t7.3\n20\t80\t0.2\t7.0\t6.9\t6.95\n";
  char p[512];
  const char* names[3] = {"rounds.tsv", "summary.json", "curve.tsv"};
  char* orig[3];
  for (int k = 0; k < 3; k++) {
    if (k == 2) put(dir, "dc-a", "curve.tsv", curve);
    snprintf(p, sizeof p, "%s/dc-a/%s", dir, names[k]);
    orig[k] = slurp(p);
    assert_non_null(orig[k]);
  }
  const char* ids[] = {"dc-a"};
  static const char subst[] = "\t\n7x.-e\0";
  uint32_t x = 12345;
  int ok = 0, bad = 0;
  for (int it = 0; it < 600; it++) {
    int k = it % 3;
    size_t n = strlen(orig[k]);
    char* m = calloc(1, 2 * n + 2);
    assert_non_null(m);
    memcpy(m, orig[k], n);
    size_t len = n;
    for (int e = 0; e < 1 + it % 4; e++) {
      x = x * 1103515245u + 12345u;
      size_t at = (x >> 8) % (len ? len : 1);
      switch ((x >> 4) % 4) {
        case 0:
          m[at] = subst[(x >> 20) % (sizeof subst - 1)];
          break;
        case 1:
          len = at;
          break; /* cut */
        case 2:  /* the rest of the line doubled */
        {
          const char* nl = memchr(m + at, '\n', len - at);
          size_t l = nl ? (size_t)(nl - (m + at)) + 1 : len - at;
          if (len + l <= 2 * n) memmove(m + at + l, m + at, len - at), len += l;
          break;
        }
        default:
          m[at] = (char)('0' + (x >> 24) % 10);
      }
    }
    snprintf(p, sizeof p, "%s/dc-a/%s", dir, names[k]);
    FILE* f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(m, 1, len, f), len);
    fclose(f);
    free(m);
    nb_status_t st = nb_report_write(dir, ids, 1, NULL);
    if (st == NB_OK) {
      ok++;
    } else {
      bad++;
      if (st != NB_ERR_INVALID)
        fail_msg("damaged %s: status %d: %s", names[k], st, nb_error_last());
      if (k == 2) fail_msg("a damaged curve.tsv failed the report: %s", nb_error_last());
      assert_non_null(strstr(nb_error_last(), names[k]));
    }
    put(dir, "dc-a", names[k], orig[k]); /* undo */
  }
  print_message("damaged inputs: %d reports written, %d refused\n", ok, bad);
  assert_true(ok > 0 && bad > 0);
  for (int k = 0; k < 3; k++) free(orig[k]);
  assert_true(no_temp_left(dir));
  rm_rf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_report_ok),          cmocka_unit_test(test_report_bad),
      cmocka_unit_test(test_report_translation), cmocka_unit_test(test_report_overflow),
      cmocka_unit_test(test_report_curves),      cmocka_unit_test(test_report_summary_langs),
      cmocka_unit_test(test_report_job_config),  cmocka_unit_test(test_report_damaged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
