/* nb_metrics_tool: scores a TSV of "hypothesis<TAB>reference" lines with our chrF and BLEU, or
 * prints the 13a tokenization of each line; used by the sacreBLEU comparison test. Not a
 * user-facing command (`nebula eval` is). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/metrics.h"

static int fail(const char* what, nb_status_t st) {
  fprintf(stderr, "nb_metrics_tool: %s: %s\n", what, nb_error_last());
  (void)st;
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "score") && strcmp(argv[1], "tokenize"))) {
    fprintf(stderr, "usage: nb_metrics_tool score|tokenize FILE.tsv\n");
    return 2;
  }
  FILE* f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  int tok = strcmp(argv[1], "tokenize") == 0;
  nb_chrf_stats_t chrf;
  nb_bleu_stats_t bleu;
  memset(&chrf, 0, sizeof(chrf));
  memset(&bleu, 0, sizeof(bleu));
  char* line = NULL;
  size_t cap = 0;
  ssize_t len;
  long lines = 0;
  while ((len = getline(&line, &cap, f)) >= 0) {
    if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
    char* tab = strchr(line, '\t');
    if (!tab) {
      fprintf(stderr, "nb_metrics_tool: line %ld has no tab\n", lines + 1);
      return 1;
    }
    *tab = '\0';
    const char *hyp = line, *ref = tab + 1;
    lines++;
    if (tok) {
      char *th = NULL, *tr = NULL;
      nb_status_t st = nb_metrics_tokenize_13a(hyp, &th);
      if (st == NB_OK) st = nb_metrics_tokenize_13a(ref, &tr);
      if (st != NB_OK) return fail("tokenize", st);
      printf("%s\t%s\n", th, tr);
      nb_free(th);
      nb_free(tr);
      continue;
    }
    nb_status_t st = nb_metrics_chrf_add(&chrf, hyp, ref);
    if (st != NB_OK) return fail("chrF", st);
    st = nb_metrics_bleu_add(&bleu, hyp, ref);
    if (st != NB_OK) return fail("BLEU", st);
  }
  free(line);
  fclose(f);
  if (!tok) {
    nb_bleu_result_t r_exp, r_none, r_floor;
    nb_metrics_bleu_score(&bleu, NB_BLEU_SMOOTH_EXP, &r_exp);
    nb_metrics_bleu_score(&bleu, NB_BLEU_SMOOTH_NONE, &r_none);
    nb_metrics_bleu_score(&bleu, NB_BLEU_SMOOTH_FLOOR, &r_floor);
    printf("lines %ld\nchrf %.10f\nbleu %.10f\nbleu_none %.10f\nbleu_floor %.10f\nbp %.10f\n",
           lines, nb_metrics_chrf_score(&chrf), r_exp.score, r_none.score, r_floor.score, r_exp.bp);
  }
  return 0;
}
