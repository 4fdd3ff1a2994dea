/* The option parser of every `nebula` command (cli/) and benchmark (bench/): one table per
 * command that parses `--opt value` and `--opt=value` and prints `--help`. It sits in common/
 * so that both floors can use it. Not getopt: the table also carries each option's value type,
 * bounds and help line, so that a bad value gets one line naming the option, and `--help`
 * cannot drift from what is parsed. */
#ifndef NB_COMMON_OPTS_H
#define NB_COMMON_OPTS_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  NB_OPT_FLAG,   /* --name: *(int*)dst = 1 */
  NB_OPT_STR,    /* --name TEXT: *(const char**)dst = TEXT (borrowed from argv) */
  NB_OPT_LONG,   /* --name N: an integer >= min into *(long*)dst */
  NB_OPT_INT,    /* --name N: an integer in [min, max] (max 0: INT_MAX) into *(int*)dst */
  NB_OPT_DOUBLE, /* --name X: a number >= min (<= max when max > 0) into *(double*)dst */
  NB_OPT_LIST,   /* --name TEXT, repeated: ((const char**)dst)[(*count)++], at most max */
} nb_opt_kind_t;

typedef struct {
  const char* name; /* without the dashes: "steps"; NULL ends a table */
  nb_opt_kind_t kind;
  void* dst;
  const char* meta; /* the value's name in --help ("N"); NULL for flags */
  const char* help; /* its help; '\n' starts a continuation line */
  double min;       /* LONG and DOUBLE: the smallest value accepted */
  int* count;       /* LIST: how many were given */
  int max;          /* LIST: at most this many; else the largest value accepted (0: none) */
  char letter;      /* a one-letter alias, `-x` (0: none) */
} nb_opt_t;

typedef struct {
  const char* cmd;            /* "nebula train": prefixes every error line */
  const char* synopsis;       /* the "usage: ..." line(s), printed first by --help */
  const char* about;          /* what the command does (NULL: nothing), after a blank line */
  const char* epilog;         /* after the options (NULL: nothing) */
  const char* arg_name;       /* the one positional argument ("CONFIG"); NULL: none accepted */
  const char** arg;           /* where it goes (borrowed from argv) */
  const nb_opt_t* opts;       /* the table, ended by {NULL} */
  void (*more_help)(FILE* f); /* prints more after the epilog (NULL: nothing) */
} nb_cmd_spec_t;

/* One table entry on one line; the fields after help are designated:
 *   NB_OPTION("steps", NB_OPT_LONG, &steps, "N", "inner steps", .min = 1)
 * A table ends with NB_OPTION_END. */
#define NB_OPTION(n, k, d, m, h, ...) \
  { .name = (n), .kind = (k), .dst = (d), .meta = (m), .help = (h), __VA_ARGS__ }
#define NB_OPTION_END \
  { .name = NULL }

/* What nb_opts_parse returns: go on, or the exit status (the NB_EXIT_OK and NB_EXIT_USAGE of
 * cli/cli.h, which cli/cli.c checks are the same). */
enum { NB_OPTS_RUN = -1, NB_OPTS_EXIT_OK = 0, NB_OPTS_EXIT_USAGE = 2 };

/* Parses argv[1..argc) (argv[0] is the command's name) into the table's destinations;
 * `--opt=value` and `--opt value` are the same, `--` ends the options, "-" alone is a positional
 * argument. Returns NB_OPTS_RUN to go on, NB_OPTS_EXIT_OK after printing --help (or -h) on
 * stdout, NB_OPTS_EXIT_USAGE after one line on stderr, "<cmd>: <what> (see <cmd> --help)", that
 * names the bad option or argument (an unknown option with the closest known one, if any). Not
 * thread-safe (it writes the destinations). */
int nb_opts_parse(const nb_cmd_spec_t* spec, int argc, char** argv);

/* Prints the help: synopsis, about, one line per option from the table, epilog, more_help. */
void nb_opts_help(const nb_cmd_spec_t* spec, FILE* f);

/* One line "<cmd>: <what> (see <cmd> --help)" on stderr; returns NB_OPTS_EXIT_USAGE. */
int nb_opts_usage_error(const nb_cmd_spec_t* spec, const char* what);

/* The one of names[0..n) closest to s by edit distance, close enough to be a likely typo
 * (at most a third of its length, at least 2 edits allowed), or NULL: the "did you mean" of
 * unknown options and names. Returns a pointer into names (borrowed). */
const char* nb_opts_closest(const char* s, const char* const* names, size_t n);

#ifdef __cplusplus
}
#endif
#endif
