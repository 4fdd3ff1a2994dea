/* `nebula env [NAME] [--json]`: the environment parameters linked into this binary (common/param.h)
 * with their values and sources, as a table, one parameter, or JSON. It reads; it sets nothing. */
#include "cli/cli.h"
#include "common/opts.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/common.h"

#define NB__ENV_MAX 512

typedef struct {
  const nb_param_t* p[NB__ENV_MAX];
  int n;
} nb__env_list_t;

static void nb__env_collect(const nb_param_t* p, void* ctx) {
  nb__env_list_t* l = ctx;
  if (l->n < NB__ENV_MAX) l->p[l->n++] = p;
}

static int nb__env_cmp(const void* a, const void* b) {
  return strcmp((*(const nb_param_t* const*)a)->env, (*(const nb_param_t* const*)b)->env);
}

static const char* nb__env_type(const nb_param_t* p) {
  return p->type == NB_PARAM_INT ? "integer" : p->type == NB_PARAM_DOUBLE ? "number" : "string";
}

static void nb__env_row(const nb_param_t* p) {
  printf("%-28s %-12s %-11s %s (default %s)\n", p->env, p->sval[0] ? p->sval : "-", p->source,
         p->desc, p->defval[0] ? p->defval : "empty");
}

/* One parameter as JSON: the value typed as the parameter is (the default stays its text). */
static json_t* nb__env_json(const nb_param_t* p) {
  json_t* o = json_object();
  json_object_set_new(o, "name", json_string(p->env));
  json_object_set_new(o, "type", json_string(nb__env_type(p)));
  json_object_set_new(o, "value",
                      p->type == NB_PARAM_INT      ? json_integer((json_int_t)p->ival)
                      : p->type == NB_PARAM_DOUBLE ? json_real(p->dval)
                                                   : json_string(p->sval));
  json_object_set_new(o, "source", json_string(p->source));
  json_object_set_new(o, "default", json_string(p->defval));
  if (p->type != NB_PARAM_STRING && p->min <= p->max) {
    int i = p->type == NB_PARAM_INT;
    json_object_set_new(o, "min", i ? json_integer((json_int_t)p->min) : json_real(p->min));
    json_object_set_new(o, "max", i ? json_integer((json_int_t)p->max) : json_real(p->max));
  }
  json_object_set_new(o, "description", json_string(p->desc));
  return o;
}

static int nb__env_print_json(json_t* o) {
  char* text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
  json_decref(o);
  if (!text) {
    fprintf(stderr, "nebula env: out of memory\n");
    return NB_EXIT_FAIL;
  }
  printf("%s\n", text);
  free(text);
  return NB_EXIT_OK;
}

int nb_env_main(int argc, char** argv) {
  const char* name = NULL;
  int as_json = 0;
  const nb_opt_t opts[] = {
      NB_OPTION("json", NB_OPT_FLAG, &as_json, NULL,
                "print JSON: an array of {name, type, value, source, default, [min, max],\n"
                "description}, or that one object with NAME"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula env",
      .synopsis = "usage: nebula env [NAME] [--json]",
      .about =
          "The environment parameters of this binary (docs/env.md): each one's value, where\n"
          "it came from (default or environment), its description and default. With NAME\n"
          "(e.g. NB_ZSTD_LEVEL), only that one.",
      .epilog = "\nExit status: 0 done, 1 no parameter NAME, 2 usage error.",
      .arg_name = "NAME",
      .arg = &name,
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  static nb__env_list_t l; /* static: a few kilobytes of pointers */
  l.n = 0;
  nb_param_foreach(nb__env_collect, &l);
  qsort(l.p, (size_t)l.n, sizeof l.p[0], nb__env_cmp);
  if (name) {
    const char* names[NB__ENV_MAX];
    for (int i = 0; i < l.n; i++) {
      if (strcasecmp(l.p[i]->env, name) == 0) {
        if (as_json) return nb__env_print_json(nb__env_json(l.p[i]));
        nb__env_row(l.p[i]);
        return NB_EXIT_OK;
      }
      names[i] = l.p[i]->env;
    }
    const char* hint = nb_opts_closest(name, names, (size_t)l.n);
    if (hint)
      fprintf(stderr, "nebula env: no parameter '%s'; did you mean '%s'? (see nebula env)\n", name,
              hint);
    else
      fprintf(stderr, "nebula env: no parameter '%s' (see nebula env)\n", name);
    return NB_EXIT_FAIL;
  }
  if (as_json) {
    json_t* a = json_array();
    for (int i = 0; i < l.n; i++) json_array_append_new(a, nb__env_json(l.p[i]));
    return nb__env_print_json(a);
  }
  printf("%-28s %-12s %-11s %s\n", "PARAMETER", "VALUE", "SOURCE", "DESCRIPTION");
  for (int i = 0; i < l.n; i++) nb__env_row(l.p[i]);
  return NB_EXIT_OK;
}
