/* `nebula report DIR`: finds the cluster folders of a run and writes its report with
 * report/report.h. Only the command line; the report itself is report/report.c. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/opts.h"
#include "common/common.h"
#include "report/report.h"

static int nb__rp_cmp(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

int nb_report_main(int argc, char** argv) {
  const char *dir = NULL, *title = NULL;
  // clang-format off: one option per entry
  const nb_opt_t opts[] = {
      {.name = "title",
       .kind = NB_OPT_STR,
       .dst = &title,
       .meta = "TEXT",
       .help = "the report's title (default: the job's name)"},
      {.name = NULL},
  };
  // clang-format on
  const nb_cmd_spec_t spec = {
      .cmd = "nebula report",
      .synopsis = "usage: nebula report DIR [--title TEXT]",
      .about =
          "Writes DIR/report.html (tables and SVG charts, self-contained) and DIR/summary.json\n"
          "from every subfolder of DIR that holds a rounds.tsv and summary.json (one per\n"
          "cluster of a `nebula run`).",
      .arg_name = "DIR",
      .arg = &dir,
      .opts = opts,
  };
  int prc = nb_opts_parse(&spec, argc, argv);
  if (prc != NB_OPTS_RUN) return prc;
  if (!dir) return nb_opts_usage_error(&spec, "missing DIR");
  DIR* d = opendir(dir);
  if (!d) {
    fprintf(stderr, "nebula report: cannot open %s: %s\n", dir, strerror(errno));
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
    fprintf(stderr, "nebula report: no cluster folder (with rounds.tsv) under %s\n", dir);
    goto out;
  }
  qsort(ids, (size_t)n, sizeof *ids, nb__rp_cmp);
  if (nb_report_write(dir, (const char* const*)ids, n, title) != NB_OK) {
    fprintf(stderr, "nebula report: %s\n", nb_error_last());
    goto out;
  }
  printf("report: %s/report.html\n", dir);
  rc = NB_EXIT_OK;
out:
  closedir(d);
  for (int i = 0; i < n; i++) free(ids[i]);
  nb_free(ids);
  return rc;
}
