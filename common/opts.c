/* The option table parser of the `nebula` commands and benchmarks (common/opts.h). It knows
 * nothing of any one command; a command's table, synopsis and help live beside its main(). */
#include "common/opts.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
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

/* One line on stderr, "<cmd>: <what> (see <cmd> --help)": a usage error names what is wrong and
 * where the help is, never the whole help. */
static int nb__opt_fail(const nb_cmd_spec_t* s, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int nb__opt_fail(const nb_cmd_spec_t* s, const char* fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s (see %s --help)\n", s->cmd, what, s->cmd);
  return NB_OPTS_EXIT_USAGE;
}

static size_t nb__edit_distance(const char* a, const char* b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return (size_t)-1;
  size_t row[64];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t sub = diag + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
      size_t del = row[j] + 1, ins = row[j - 1] + 1;
      row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      diag = up;
    }
  }
  return row[lb];
}

const char* nb_opts_closest(const char* s, const char* const* names, size_t n) {
  const char* best = NULL;
  size_t bestd = (size_t)-1;
  for (size_t i = 0; i < n; i++) {
    size_t d = nb__edit_distance(s, names[i]), len = strlen(names[i]);
    size_t limit = len / 3 > 2 ? len / 3 : 2;
    if (d < bestd && d <= limit && d < len) best = names[i], bestd = d;
  }
  return best;
}

/* The table's option closest to the unknown `name` (len bytes), or NULL. */
static const char* nb__opt_hint(const nb_opt_t* t, const char* name, size_t len) {
  char want[64];
  const char* names[128];
  size_t n = 0;
  if (len >= sizeof want) return NULL;
  memcpy(want, name, len);
  want[len] = 0;
  for (; t->name && n < sizeof names / sizeof names[0]; t++) names[n++] = t->name;
  return nb_opts_closest(want, names, n);
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
        return nb__opt_fail(s, "at most %d --%s", o->max, o->name);
      }
      ((const char**)o->dst)[(*o->count)++] = v;
      return NB_OPTS_RUN;
    case NB_OPT_LONG: {
      long n = strtol(v, &end, 10);
      if (o->max > 0 && (*end || end == v || errno || (double)n < o->min || n > o->max)) {
        return nb__opt_fail(s, "--%s needs an integer in %.0f..%d, got '%s'", o->name, o->min,
                            o->max, v);
      }
      if (*end || end == v || errno || (double)n < o->min) {
        return nb__opt_fail(s, "--%s needs an integer >= %.0f, got '%s'", o->name, o->min, v);
      }
      *(long*)o->dst = n;
      return NB_OPTS_RUN;
    }
    case NB_OPT_INT: {
      long n = strtol(v, &end, 10), hi = o->max > 0 ? o->max : INT_MAX;
      if (*end || end == v || errno || (double)n < o->min || n > hi) {
        return nb__opt_fail(s, "--%s needs an integer in %.0f..%ld, got '%s'", o->name, o->min, hi,
                            v);
      }
      *(int*)o->dst = (int)n;
      return NB_OPTS_RUN;
    }
    case NB_OPT_DOUBLE: {
      double x = strtod(v, &end);
      if (o->max > 0 && !(*end || end == v || !(x >= o->min) || !isfinite(x)) && x > o->max) {
        return nb__opt_fail(s, "--%s needs a number in [%g, %d], got '%s'", o->name, o->min, o->max,
                            v);
      }
      if (*end || end == v || !(x >= o->min) || !isfinite(x)) {
        return nb__opt_fail(s, "--%s needs a number >= %g, got '%s'", o->name, o->min, v);
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
      if (!s->arg_name) return nb__opt_fail(s, "unexpected argument '%s'", a);
      if (*s->arg)
        return nb__opt_fail(s, "one %s only (got '%s' and '%s')", s->arg_name, *s->arg, a);
      *s->arg = a;
      continue;
    }
    const char* name = a[1] == '-' ? a + 2 : a + 1;
    const char* eq = a[1] == '-' ? strchr(name, '=') : NULL;
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const nb_opt_t* o = a[1] == '-' ? nb__opt_find(s->opts, name, len)
                                    : (a[2] == 0 ? nb__opt_letter(s->opts, a[1]) : NULL);
    if (!o) {
      const char* hint = a[1] == '-' ? nb__opt_hint(s->opts, name, len) : NULL;
      if (hint)
        return nb__opt_fail(s, "unknown option '%.*s'; did you mean '--%s'?", (int)(name - a + len),
                            a, hint);
      return nb__opt_fail(s, "unknown option '%.*s'", (int)(name - a + len), a);
    }
    const char* v = eq ? eq + 1 : NULL;
    if (o->kind == NB_OPT_FLAG) {
      if (v) return nb__opt_fail(s, "--%s takes no value (got '%s')", o->name, a);
    } else if (!v) {
      if (i + 1 >= argc) return nb__opt_fail(s, "--%s needs a value (%s)", o->name, o->meta);
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
  return nb__opt_fail(s, "%s", what);
}
