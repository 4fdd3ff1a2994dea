/* `nebula report DIR`: finds the cluster folders of a run and writes its report with
 * report/report.h. Only the command line; the report itself is report/report.c. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/common.h"
#include "report/report.h"

static int nb__rp_cmp(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

int nb_report_main(int argc, char** argv) {
  const char *dir = NULL, *title = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf(
          "usage: nebula report DIR [--title TEXT]\n"
          "Writes DIR/report.html (tables and SVG charts, self-contained) and DIR/summary.json\n"
          "from every subfolder of DIR that holds a rounds.tsv and summary.json (one per\n"
          "cluster of a `nebula run`).\n");
      return NB_EXIT_OK;
    } else if (strcmp(argv[i], "--title") == 0 && i + 1 < argc) {
      title = argv[++i];
    } else if (argv[i][0] != '-' && !dir) {
      dir = argv[i];
    } else {
      fprintf(stderr, "nebula report: unexpected argument '%s' (see --help)\n", argv[i]);
      return NB_EXIT_USAGE;
    }
  }
  if (!dir) {
    fprintf(stderr, "usage: nebula report DIR [--title TEXT]\n");
    return NB_EXIT_USAGE;
  }
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
