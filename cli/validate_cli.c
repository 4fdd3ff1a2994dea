/* `nebula validate FILE [--json]`: runs the descriptor parser on a file (or stdin) and prints
 * the normalized descriptor or every error found. It never contacts a gateway. */
#include "cli/cli.h"
#include "common/opts.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "jobs/descriptor.h"

/* Reads all of stdin (bounded: one byte past the limit lets the parser report the size). */
static nb_status_t nb__read_stdin(char** out, size_t* len) {
  size_t cap = NB_DESCRIPTOR_MAX_BYTES + 1, n = 0;
  char* buf = NULL;
  NB_CHECK(nb_alloc((void**)&buf, cap, 1, "stdin"));
  size_t got;
  while (n < cap && (got = fread(buf + n, 1, cap - n, stdin)) > 0) n += got;
  if (ferror(stdin)) {
    nb_free(buf);
    return nb_error(NB_ERR_IO, "cannot read standard input");
  }
  *out = buf;
  *len = n;
  return NB_OK;
}

static int nb__print_json_result(const char* file, nb_status_t st, const char* normalized,
                                 const nb_descriptor_diag_t* diag) {
  json_t* o = json_object();
  json_object_set_new(o, "valid", json_boolean(st == NB_OK));
  json_object_set_new(o, "file", json_string(file));
  if (st == NB_OK) {
    json_t* cfg = json_loads(normalized, 0, NULL);
    json_object_set_new(o, "config", cfg ? cfg : json_null());
  } else {
    json_t* errs = json_array();
    for (int i = 0; i < diag->count; i++) {
      const nb_descriptor_error_t* e = &diag->errors[i];
      json_array_append_new(errs, json_pack("{s:s, s:s, s:i, s:i}", "path", e->path, "message",
                                            e->message, "line", e->line, "column", e->column));
    }
    json_object_set_new(o, "errors", errs);
    json_object_set_new(o, "dropped", json_integer(diag->dropped));
  }
  char* text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
  json_decref(o);
  if (!text) {
    fprintf(stderr, "nebula validate: out of memory\n");
    return NB_EXIT_FAIL;
  }
  printf("%s\n", text);
  free(text);
  return st == NB_OK ? NB_EXIT_OK : NB_EXIT_FAIL;
}

int nb_validate_main(int argc, char** argv) {
  const char* file = NULL;
  int json_flag = 0;
  char about[512];
  snprintf(about, sizeof about,
           "Checks a job descriptor (apiVersion %s, kind %s). When it is valid, prints it\n"
           "normalized: every field present, defaults filled in. Otherwise prints every error "
           "with\nthe JSON path of the field (or the line and column of a syntax error), what "
           "was\nexpected and what was found. FILE '-' reads standard input.",
           NB_DESCRIPTOR_API_VERSION, NB_DESCRIPTOR_KIND);
  // clang-format off: one option per entry
  const nb_opt_t opts[] = {
      {.name = "json",
       .kind = NB_OPT_FLAG,
       .dst = &json_flag,
       .help = "print one JSON object: {\"valid\", \"file\", \"config\"} or\n{\"valid\", \"file\", "
               "\"errors\": [{\"path\", \"message\", \"line\", \"column\"}]}"},
      {.name = NULL},
  };
  // clang-format on
  const nb_cmd_spec_t spec = {
      .cmd = "nebula validate",
      .synopsis = "usage: nebula validate FILE [--json]",
      .about = about,
      .epilog = "\nExit status: 0 valid, 1 invalid or unreadable, 2 usage error.",
      .arg_name = "FILE",
      .arg = &file,
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (!file) return nb_opts_usage_error(&spec, "missing FILE");
  bool as_json = json_flag != 0;

  nb_descriptor_diag_t* diag = NULL;
  if (nb_calloc((void**)&diag, 1, sizeof *diag, "diagnostics") != NB_OK) {
    fprintf(stderr, "nebula validate: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  nb_job_config_t* cfg = NULL;
  if (nb_calloc((void**)&cfg, 1, sizeof *cfg, "job config") != NB_OK) {
    nb_free(diag);
    fprintf(stderr, "nebula validate: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  nb_status_t st;
  int file_error = 0;
  if (strcmp(file, "-") == 0) {
    char* buf = NULL;
    size_t len = 0;
    st = nb__read_stdin(&buf, &len);
    if (st == NB_OK && len > NB_DESCRIPTOR_MAX_BYTES) { /* only one byte past it was read */
      nb_free(buf);
      st = nb_error(NB_ERR_CONFIG,
                    "standard input is larger than the descriptor limit of %u "
                    "bytes (1 MiB)",
                    NB_DESCRIPTOR_MAX_BYTES);
      snprintf(diag->errors[0].path, sizeof diag->errors[0].path, "$");
      snprintf(diag->errors[0].message, sizeof diag->errors[0].message, "%s", nb_error_last());
      diag->count = 1;
    } else if (st == NB_OK) {
      st = nb_descriptor_parse(buf, len, cfg, diag);
      nb_free(buf);
    } else {
      snprintf(diag->errors[0].path, sizeof diag->errors[0].path, "$");
      snprintf(diag->errors[0].message, sizeof diag->errors[0].message, "%s", nb_error_last());
      diag->count = 1;
    }
  } else if ((st = nb_cli_descriptor_precheck(file)) != NB_OK) {
    /* missing, unreadable, a folder, too large: the file's error, at no JSON path */
    file_error = 1;
    snprintf(diag->errors[0].message, sizeof diag->errors[0].message, "%s", nb_error_last());
    diag->count = 1;
  } else {
    st = nb_descriptor_load(file, cfg, diag);
  }

  char* normalized = NULL;
  if (st == NB_OK && nb_descriptor_to_json(cfg, &normalized) != NB_OK) {
    fprintf(stderr, "nebula validate: %s\n", nb_error_last());
    nb_free(cfg);
    nb_free(diag);
    return NB_EXIT_FAIL;
  }
  rc = NB_EXIT_FAIL;
  if (as_json) {
    rc = nb__print_json_result(file, st, normalized, diag);
  } else if (st == NB_OK) {
    printf("%s\n", normalized);
    rc = NB_EXIT_OK;
  } else if (file_error) {
    fprintf(stderr, "nebula validate: %s\n", diag->errors[0].message);
  } else {
    nb_descriptor_diag_print(stderr, file, diag);
    if (diag->dropped) fprintf(stderr, "%s: ... and %d more errors\n", file, diag->dropped);
    fprintf(stderr, "%s: invalid descriptor (%d error%s)\n", file, diag->count + diag->dropped,
            diag->count + diag->dropped == 1 ? "" : "s");
    rc = NB_EXIT_FAIL;
  }
  free(normalized);
  nb_free(cfg);
  nb_free(diag);
  return rc;
}
