/* The option table parser of the `nebula` commands and benchmarks (common/opts.h). It knows
 * nothing of any one command; a command's table, synopsis and help live beside its main(). */
#include "common/opts.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const nb_opt_t* nb__opt_find(const nb_opt_t* t, const char* name, size_t len) {
  for (; t->name; t++)
    if (strlen(t->name) == len && strncmp(t->name, name, len) == 0) return t;
  return NULL;
}

static const nb_opt_t* nb__opt_letter(const nb_opt_t* t, char c) {
  for (; t->name; t++)
    if (t->letter && t->letter == c) return t;
  return NULL;
}

static int nb__opt_error(const nb_cmd_spec_t* s, const char* fmt, const char* a, const char* b) {
  fprintf(stderr, "%s: ", s->cmd);
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return NB_OPTS_EXIT_USAGE;
}

/* Stores value v of option o; returns NB_OPTS_RUN or NB_OPTS_EXIT_USAGE. */
static int nb__opt_set(const nb_cmd_spec_t* s, const nb_opt_t* o, const char* v) {
  char* end = NULL;
  errno = 0;
  switch (o->kind) {
    case NB_OPT_FLAG:
      *(int*)o->dst = 1;
      return NB_OPTS_RUN;
    case NB_OPT_STR:
      *(const char**)o->dst = v;
      return NB_OPTS_RUN;
    case NB_OPT_LIST:
      if (*o->count >= o->max) {
        fprintf(stderr, "%s: at most %d --%s\n", s->cmd, o->max, o->name);
        return NB_OPTS_EXIT_USAGE;
      }
      ((const char**)o->dst)[(*o->count)++] = v;
      return NB_OPTS_RUN;
    case NB_OPT_LONG: {
      long n = strtol(v, &end, 10);
      if (o->max > 0 && (*end || end == v || errno || (double)n < o->min || n > o->max)) {
        fprintf(stderr, "%s: --%s needs an integer in %.0f..%d, got '%s'\n", s->cmd, o->name,
                o->min, o->max, v);
        return NB_OPTS_EXIT_USAGE;
      }
      if (*end || end == v || errno || (double)n < o->min) {
        fprintf(stderr, "%s: --%s needs an integer >= %.0f, got '%s'\n", s->cmd, o->name, o->min,
                v);
        return NB_OPTS_EXIT_USAGE;
      }
      *(long*)o->dst = n;
      return NB_OPTS_RUN;
    }
    case NB_OPT_INT: {
      long n = strtol(v, &end, 10), hi = o->max > 0 ? o->max : INT_MAX;
      if (*end || end == v || errno || (double)n < o->min || n > hi) {
        fprintf(stderr, "%s: --%s needs an integer in %.0f..%ld, got '%s'\n", s->cmd, o->name,
                o->min, hi, v);
        return NB_OPTS_EXIT_USAGE;
      }
      *(int*)o->dst = (int)n;
      return NB_OPTS_RUN;
    }
    case NB_OPT_DOUBLE: {
      double x = strtod(v, &end);
      if (o->max > 0 && !(*end || end == v || !(x >= o->min) || !isfinite(x)) && x > o->max) {
        fprintf(stderr, "%s: --%s needs a number in [%g, %d], got '%s'\n", s->cmd, o->name, o->min,
                o->max, v);
        return NB_OPTS_EXIT_USAGE;
      }
      if (*end || end == v || !(x >= o->min) || !isfinite(x)) {
        fprintf(stderr, "%s: --%s needs a number >= %g, got '%s'\n", s->cmd, o->name, o->min, v);
        return NB_OPTS_EXIT_USAGE;
      }
      *(double*)o->dst = x;
      return NB_OPTS_RUN;
    }
  }
  return NB_OPTS_EXIT_USAGE;
}

int nb_opts_parse(const nb_cmd_spec_t* s, int argc, char** argv) {
  int options = 1;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (options && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
      nb_opts_help(s, stdout);
      return NB_OPTS_EXIT_OK;
    }
    if (options && strcmp(a, "--") == 0) {
      options = 0;
      continue;
    }
    if (!options || a[0] != '-' || a[1] == 0) {
      if (!s->arg_name) return nb__opt_error(s, "unexpected argument '%s' (see --help)", a, "");
      if (*s->arg) {
        fprintf(stderr, "%s: one %s only (got '%s' and '%s')\n", s->cmd, s->arg_name, *s->arg, a);
        return NB_OPTS_EXIT_USAGE;
      }
      *s->arg = a;
      continue;
    }
    const char* name = a[1] == '-' ? a + 2 : a + 1;
    const char* eq = a[1] == '-' ? strchr(name, '=') : NULL;
    const nb_opt_t* o = a[1] == '-'
                            ? nb__opt_find(s->opts, name, eq ? (size_t)(eq - name) : strlen(name))
                            : (a[2] == 0 ? nb__opt_letter(s->opts, a[1]) : NULL);
    if (!o) return nb__opt_error(s, "unknown option '%s' (see --help)", a, "");
    const char* v = eq ? eq + 1 : NULL;
    if (o->kind == NB_OPT_FLAG) {
      if (v) return nb__opt_error(s, "--%s takes no value (got '%s')", o->name, a);
    } else if (!v) {
      if (i + 1 >= argc) return nb__opt_error(s, "--%s needs a value (%s)", o->name, o->meta);
      v = argv[++i];
    }
    int rc = nb__opt_set(s, o, v);
    if (rc != NB_OPTS_RUN) return rc;
  }
  return NB_OPTS_RUN;
}

void nb_opts_help(const nb_cmd_spec_t* s, FILE* f) {
  fprintf(f, "%s\n", s->synopsis);
  if (s->about) fprintf(f, "\n%s\n", s->about);
  if (s->opts->name) fputc('\n', f);
  for (const nb_opt_t* o = s->opts; o->name; o++) {
    char head[64];
    char alias[8] = "";
    if (o->letter) snprintf(alias, sizeof alias, "-%c, ", o->letter);
    snprintf(head, sizeof head, "%s--%s%s%s", alias, o->name, o->meta ? " " : "",
             o->meta ? o->meta : "");
    fprintf(f, "  %-18s ", head);
    for (const char* p = o->help; *p; p++) {
      fputc(*p, f);
      if (*p == '\n') fprintf(f, "  %-18s ", "");
    }
    fputc('\n', f);
  }
  if (s->epilog) fprintf(f, "%s\n", s->epilog);
  if (s->more_help) s->more_help(f);
}

int nb_opts_usage_error(const nb_cmd_spec_t* s, const char* what) {
  fprintf(stderr, "%s: %s (see --help)\n", s->cmd, what);
  return NB_OPTS_EXIT_USAGE;
}
