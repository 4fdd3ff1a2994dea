/* `nebula report DIR`: finds the cluster folders of a run and writes its report with
 * report/report.h. Only the command line; the report itself is report/report.c. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "common/opts.h"
#include "common/common.h"
#include "jobs/descriptor.h"
#include "report/report.h"

/* Copies the file src to dst (replaced). Returns 0, or -1 with errno set. */
static int nb__rp_copy(const char* src, const char* dst) {
  FILE* in = fopen(src, "rb");
  if (!in) return -1;
  FILE* out = fopen(dst, "wb");
  if (!out) {
    int e = errno;
    fclose(in);
    errno = e;
    return -1;
  }
  char buf[65536];
  size_t n;
  int rc = 0;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, n, out) != n) rc = -1;
  if (ferror(in)) rc = -1;
  fclose(in);
  if (fclose(out) != 0) rc = -1;
  return rc;
}

/* A `nebula train --out DIR` folder holds one cluster's rounds.tsv, summary.json and curve.tsv
 * itself, not in a cluster subfolder, and its summary.json is the run's own. Its report is laid
 * out as a gateway lays out a job's: DIR/report/<cluster>/ holds copies of the files, and the
 * report (report.html, the job-level summary.json) goes to DIR/report/. Writes the report's
 * folder into rdir; returns 0, 1 when DIR is no such folder, or NB_EXIT_FAIL after saying why. */
static int nb__rp_single(const char* dir, const nb_report_options_t* ro, char* rdir, size_t cap) {
  char rounds[4096], sum[4096], curve[4096], cdir[4096], p[4200];
  struct stat sb;
  if (snprintf(rounds, sizeof rounds, "%s/rounds.tsv", dir) >= (int)sizeof rounds ||
      snprintf(sum, sizeof sum, "%s/summary.json", dir) >= (int)sizeof sum ||
      stat(rounds, &sb) != 0 || !S_ISREG(sb.st_mode))
    return 1;
  json_error_t je;
  json_t* s = json_load_file(sum, 0, &je);
  const char* id = s ? json_string_value(json_object_get(s, "cluster")) : NULL;
  if (!id || !*id || strchr(id, '/') || id[0] == '.') {
    fprintf(
        stderr, "nebula report: %s holds rounds.tsv but %s %s\n", dir, sum,
        !s ? "cannot be read (a `nebula train` run writes it when it ends)" : "names no cluster");
    json_decref(s);
    return NB_EXIT_FAIL;
  }
  if ((size_t)snprintf(rdir, cap, "%s/report", dir) >= cap ||
      snprintf(cdir, sizeof cdir, "%s/%s", rdir, id) >= (int)sizeof cdir) {
    json_decref(s);
    fprintf(stderr, "nebula report: path too long: %s\n", dir);
    return NB_EXIT_FAIL;
  }
  int rc = 0;
  if ((mkdir(rdir, 0755) != 0 && errno != EEXIST) || (mkdir(cdir, 0755) != 0 && errno != EEXIST)) {
    fprintf(stderr, "nebula report: cannot create %s: %s\n", cdir, strerror(errno));
    rc = NB_EXIT_FAIL;
  }
  snprintf(p, sizeof p, "%s/rounds.tsv", cdir);
  if (!rc && nb__rp_copy(rounds, p) != 0) {
    fprintf(stderr, "nebula report: cannot copy %s to %s: %s\n", rounds, p, strerror(errno));
    rc = NB_EXIT_FAIL;
  }
  snprintf(p, sizeof p, "%s/summary.json", cdir);
  if (!rc && nb__rp_copy(sum, p) != 0) {
    fprintf(stderr, "nebula report: cannot copy %s to %s: %s\n", sum, p, strerror(errno));
    rc = NB_EXIT_FAIL;
  }
  /* the held-out curve by language (optional: a run folder of an older nebula lacks it) */
  snprintf(curve, sizeof curve, "%s/curve.tsv", dir);
  snprintf(p, sizeof p, "%s/curve.tsv", cdir);
  if (!rc && stat(curve, &sb) == 0 && nb__rp_copy(curve, p) != 0) {
    fprintf(stderr, "nebula report: cannot copy %s to %s: %s\n", curve, p, strerror(errno));
    rc = NB_EXIT_FAIL;
  } else if (!rc && stat(curve, &sb) != 0) {
    unlink(p); /* not a stale copy of an earlier report's */
  }
  const char* ids[1] = {id};
  if (!rc && nb_report_write_opts(rdir, ids, 1, ro) != NB_OK) {
    fprintf(stderr, "nebula report: %s\n", nb_error_last());
    rc = NB_EXIT_FAIL;
  }
  json_decref(s);
  return rc;
}

static int nb__rp_cmp(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

int nb_report_main(int argc, char** argv) {
  const char *dir = NULL, *title = NULL, *job_file = NULL;
  // clang-format off: one option per entry
  const nb_opt_t opts[] = {
      {.name = "title",
       .kind = NB_OPT_STR,
       .dst = &title,
       .meta = "TEXT",
       .help = "the report's title (default: the job's name)"},
      {.name = "job",
       .kind = NB_OPT_STR,
       .dst = &job_file,
       .meta = "FILE",
       .help = "the run's job descriptor (its model, steps, compression, link: the report's "
               "configuration)"},
      {.name = NULL},
  };
  // clang-format on
  const nb_cmd_spec_t spec = {
      .cmd = "nebula report",
      .synopsis = "usage: nebula report DIR [--title TEXT] [--job FILE]",
      .about =
          "Writes DIR/report.html (tables and SVG charts, self-contained) and DIR/summary.json\n"
          "from every subfolder of DIR that holds a rounds.tsv and summary.json (one per\n"
          "cluster of a `nebula run`; a curve.tsv beside them adds the held-out curve by\n"
          "language). A `nebula train --out DIR` folder, which holds them itself, gets its\n"
          "report in DIR/report/ (its own summary.json stays as it is).",
      .arg_name = "DIR",
      .arg = &dir,
      .opts = opts,
  };
  int prc = nb_opts_parse(&spec, argc, argv);
  if (prc != NB_OPTS_RUN) return prc;
  if (!dir) return nb_opts_usage_error(&spec, "missing DIR");
  nb_job_config_t* job = NULL;
  if (job_file) {
    nb_descriptor_diag_t* diag = NULL;
    if (nb_calloc((void**)&job, 1, sizeof *job, "job") != NB_OK ||
        nb_calloc((void**)&diag, 1, sizeof *diag, "diagnostics") != NB_OK) {
      fprintf(stderr, "nebula report: %s\n", nb_error_last());
      nb_free(job);
      return NB_EXIT_FAIL;
    }
    nb_status_t js = nb_descriptor_load(job_file, job, diag);
    if (js != NB_OK) nb_descriptor_diag_print(stderr, job_file, diag);
    nb_free(diag);
    if (js != NB_OK) {
      nb_free(job);
      return NB_EXIT_FAIL;
    }
  }
  const nb_report_options_t ro = {.title = title, .job = job};
  DIR* d = opendir(dir);
  if (!d) {
    fprintf(stderr, "nebula report: cannot open %s: %s\n", dir, strerror(errno));
    nb_free(job);
    return NB_EXIT_FAIL;
  }
  char** ids = NULL;
  int n = 0, cap = 0, rc = NB_EXIT_FAIL;
  struct dirent* e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[4096];
    struct stat sb;
    if (snprintf(p, sizeof p, "%s/%s/rounds.tsv", dir, e->d_name) >= (int)sizeof p ||
        stat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 8;
      if (nb_realloc((void**)&ids, (size_t)cap, sizeof *ids, "report ids") != NB_OK) goto out;
    }
    ids[n] = strdup(e->d_name);
    if (!ids[n]) goto out;
    n++;
  }
  if (n == 0) {
    char rdir[4096];
    int src = nb__rp_single(dir, &ro, rdir, sizeof rdir);
    if (src == 0) {
      printf("report: %s/report.html\n", rdir);
      rc = NB_EXIT_OK;
    } else if (src == 1) {
      fprintf(stderr,
              "nebula report: %s holds no rounds.tsv, nor a cluster folder with one (the output "
              "folder of `nebula run` or `nebula train`)\n",
              dir);
    }
    goto out;
  }
  qsort(ids, (size_t)n, sizeof *ids, nb__rp_cmp);
  if (nb_report_write_opts(dir, (const char* const*)ids, n, &ro) != NB_OK) {
    fprintf(stderr, "nebula report: %s\n", nb_error_last());
    goto out;
  }
  printf("report: %s/report.html\n", dir);
  rc = NB_EXIT_OK;
out:
  closedir(d);
  for (int i = 0; i < n; i++) free(ids[i]);
  nb_free(ids);
  nb_free(job);
  return rc;
}
