/* Job descriptor parser and validator: jansson DOM → nb_job_config_t, with every error located by
 * its JSON path and phrased as "expected X, found Y". It does not check signatures, ACLs or that
 * files named in the descriptor exist (that is the gateway's and the runtime's business). */
#include "jobs/descriptor.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "common/common.h"
#include "jobs/cli_checks.h"

/* ---------------------------------------------------------------------------------------------
 * Names of the enumerations (index = enum value), shared by parser and printer. */

static const char* const nb__task_names[] = {"pretrain", "translation", NULL};
static const char* const nb__device_names[] = {"cpu", "cuda", NULL};
static const char* const nb__tier_names[] = {"quick", "full", NULL};
static const char* const nb__schedule_names[] = {"cosine", "constant", NULL};
static const char* const nb__sync_names[] = {"outer", "step", "dense", NULL};
static const char* const nb__values_names[] = {"fp32", "fp16", "bf16", "int8",
                                               "4bit", "2bit", "auto", NULL};
static const char* const nb__optimizer_names[] = {"adamw", NULL};
static const char* const nb__lora_target_names[] = {"qkv", "attnOut", "mlpUp", "mlpDown", NULL};
/* Languages the data pipeline produces (docs/data.md). */
/* A data label names a text source: mono/<label>.txt, pairs/<src>-<tgt>.*.tsv, the per-source
 * results. The corpus's language codes, or a name of the user's own corpus: 1..7 of [a-z0-9_]
 * starting with a letter (a file name's part that cannot leave its folder, and a pair's two
 * labels with their '-' fit the trainer's label). */
#define NB__LABEL_CHARS "1 to 7 of a-z, 0-9 and _, starting with a letter"
static bool nb__is_label(const char* s) {
  size_t n = s ? strlen(s) : 0;
  if (n < 1 || n >= NB_JOB_LANG_MAX || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (size_t i = 1; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
      return false;
  return true;
}

const char* nb_job_sync_name(nb_job_sync_t m) {
  return (unsigned)m < 3 ? nb__sync_names[m] : "?";
}
const char* nb_job_values_name(nb_job_values_t v) {
  return (unsigned)v < 7 ? nb__values_names[v] : "?";
}
const char* nb_job_task_name(nb_job_task_t t) {
  return (unsigned)t < 2 ? nb__task_names[t] : "?";
}
const char* nb_job_device_name(nb_job_device_t d) {
  return (unsigned)d < 2 ? nb__device_names[d] : "?";
}

/* ---------------------------------------------------------------------------------------------
 * Allowed fields of every object, in documentation order (also the order of the printer). */

static const char* const nb__top_keys[] = {"apiVersion", "kind", "metadata", "spec", NULL};
static const char* const nb__meta_keys[] = {"name", "description", NULL};
static const char* const nb__spec_keys[] = {"task",       "clusters",    "model", "training",
                                            "sync",       "compression", "link",  "security",
                                            "checkpoint", "program",     NULL};
static const char* const nb__cluster_keys[] = {
    "id", "workers", "device", "threadsPerWorker", "slowdown", "data", "metrics", "parallel", NULL};
static const char* const nb__parallel_keys[] = {"tensor", "pipeline", "microBatches", NULL};
static const char* const nb__metrics_keys[] = {"listen", NULL};
static const char* const nb__data_keys[] = {"tier", "dir", "languages", "pairs", NULL};
static const char* const nb__model_keys[] = {"layers", "width", "heads", "context", "base", NULL};
static const char* const nb__base_keys[] = {"checkpoint", "cluster", "sha256", NULL};
static const char* const nb__training_keys[] = {"seed",       "batchSize",    "maxSteps",
                                                "maxSeconds", "eval",         "optimizer",
                                                "lora",       "distillation", NULL};
static const char* const nb__eval_keys[] = {"everyRounds", "batches", "sentences", NULL};
static const char* const nb__opt_keys[] = {"name",     "lr",          "beta1",    "beta2",
                                           "eps",      "weightDecay", "gradClip", "warmupSteps",
                                           "schedule", "minLrRatio",  NULL};
static const char* const nb__lora_keys[] = {"enabled", "rank", "alpha", "targets", NULL};
static const char* const nb__distill_keys[] = {"enabled", "teacher", "alpha", "temperature", NULL};
static const char* const nb__sync_keys[] = {"mode",    "innerSteps",         "roundSeconds",
                                            "overlap", "overlapSteps",       "eager",
                                            "outer",   "peerTimeoutSeconds", NULL};
static const char* const nb__outer_keys[] = {"lr", "momentum", "nesterov", NULL};
static const char* const nb__comp_keys[] = {"density",       "adaptive",           "budgetFraction",
                                            "errorFeedback", "errorFeedbackDecay", "topkChunk",
                                            "values",        "zstdLevel",          NULL};
static const char* const nb__density_keys[] = {"initial", "min", "max", NULL};
static const char* const nb__link_keys[] = {"rateMbit", "delayMs", "streams", "chunkKib", NULL};
static const char* const nb__sec_keys[] = {"ca", "cert", "key", "seal", NULL};
static const char* const nb__ckpt_keys[] = {"everyRounds", "keep", "dir", NULL};
static const char* const nb__program_keys[] = {"command", "workDir", "files", NULL};
static const char* const nb__file_keys[] = {"artifact", "path", "cluster", "mode", NULL};

/* ---------------------------------------------------------------------------------------------
 * Walking context: the current JSON path and where errors go. */

typedef struct {
  nb_descriptor_diag_t* diag;
  char path[192];
  size_t plen;
  int errors; /* counted even when diag is NULL */
} nb__dctx_t;

static void nb__add_error(nb__dctx_t* c, const char* path, int line, int col, const char* msg) {
  if (c->errors++ == 0) nb_error(NB_ERR_CONFIG, "%s: %s", path, msg);
  nb_descriptor_diag_add(c->diag, path, line, col, msg);
}

static size_t nb__push(nb__dctx_t* c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t nb__push(nb__dctx_t* c, const char* fmt, ...) {
  size_t old = c->plen;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(c->path + old, sizeof c->path - old, fmt, ap);
  va_end(ap);
  if (n > 0) c->plen = old + (size_t)n < sizeof c->path ? old + (size_t)n : sizeof c->path - 1;
  return old;
}

static bool nb__is_ident(const char* k) {
  if (!(isalpha((unsigned char)*k) || *k == '_')) return false;
  for (; *k; k++)
    if (!(isalnum((unsigned char)*k) || *k == '_')) return false;
  return true;
}

/* Appends ".key" (or ["key"] with unprintable bytes replaced, for keys that are not names). */
static size_t nb__push_key(nb__dctx_t* c, const char* key) {
  if (nb__is_ident(key)) return nb__push(c, ".%s", key);
  char safe[48];
  size_t i = 0;
  for (; key[i] && i < sizeof safe - 4; i++) {
    unsigned char ch = (unsigned char)key[i];
    safe[i] = (ch < 0x20 || ch == '"' || ch == '\\' || ch >= 0x7f) ? '?' : (char)ch;
  }
  if (key[i]) memcpy(safe + i, "...", 3), i += 3;
  safe[i] = 0;
  return nb__push(c, "[\"%s\"]", safe);
}

static void nb__pop(nb__dctx_t* c, size_t old) {
  c->plen = old;
  c->path[old] = 0;
}

/* "string \"abc\"", "integer 3", "number 2.5", "an object", ... */
static void nb__describe(const json_t* v, char* buf, size_t n) {
  switch (json_typeof(v)) {
    case JSON_OBJECT:
      snprintf(buf, n, "an object");
      break;
    case JSON_ARRAY:
      snprintf(buf, n, "an array");
      break;
    case JSON_INTEGER:
      snprintf(buf, n, "integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
      break;
    case JSON_REAL:
      snprintf(buf, n, "number %.15g", json_real_value(v));
      break;
    case JSON_TRUE:
      snprintf(buf, n, "true");
      break;
    case JSON_FALSE:
      snprintf(buf, n, "false");
      break;
    case JSON_NULL:
      snprintf(buf, n, "null");
      break;
    case JSON_STRING: {
      const char* s = json_string_value(v);
      size_t len = json_string_length(v);
      char tmp[56];
      size_t j = 0;
      for (size_t i = 0; i < len && j < 40; i++) {
        unsigned char ch = (unsigned char)s[i];
        tmp[j++] = (ch < 0x20 || ch == '"' || ch == '\\' || ch == 0x7f) ? '?' : (char)ch;
      }
      tmp[j] = 0;
      snprintf(buf, n, "string \"%s%s\"", tmp, j < len ? "..." : "");
      break;
    }
  }
}

/* Records an error at the current path; when found is not NULL, appends ", found <found>". */
static void nb__err(nb__dctx_t* c, const json_t* found, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void nb__err(nb__dctx_t* c, const json_t* found, const char* fmt, ...) {
  char msg[384], what[80];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (found && n >= 0 && (size_t)n < sizeof msg) {
    nb__describe(found, what, sizeof what);
    snprintf(msg + n, sizeof msg - (size_t)n, ", found %s", what);
  }
  nb__add_error(c, c->path[0] ? c->path : "$", 0, 0, msg);
}

/* Error at an explicit path (cross-field checks). */
static void nb__err_at(nb__dctx_t* c, const char* path, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void nb__err_at(nb__dctx_t* c, const char* path, const char* fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  nb__add_error(c, path, 0, 0, msg);
}

/* ---------------------------------------------------------------------------------------------
 * "Did you mean": the allowed name closest by case-insensitive edit distance (common/opts.h). */

static const char* nb__closest(const char* s, const char* const* names) {
  size_t n = 0;
  while (names[n]) n++;
  return nb_opts_closest(s, names, n); /* case-insensitive, as the options' hints */
}

static void nb__join_names(const char* const* names, bool quoted, char* buf, size_t n) {
  size_t off = 0;
  buf[0] = 0;
  for (size_t i = 0; names[i] && off < n; i++) {
    int w = snprintf(buf + off, n - off, quoted ? "%s\"%s\"" : "%s%s", i ? ", " : "", names[i]);
    if (w < 0) break;
    off += (size_t)w;
  }
}

/* ---------------------------------------------------------------------------------------------
 * Typed field readers. Each returns true when the field is present (valid or not); on a valid
 * value it writes *out, otherwise it records an error and leaves *out (the default) alone. */

/* Checks that v is an object whose keys are all in allowed. Returns false (after an error) when v
 * is not an object. */
static bool nb__check_object(nb__dctx_t* c, json_t* v, const char* const* allowed) {
  if (!json_is_object(v)) {
    nb__err(c, v, "expected an object");
    return false;
  }
  const char* key;
  json_t* val;
  json_object_foreach(v, key, val) {
    bool ok = false;
    for (size_t i = 0; allowed[i] && !ok; i++) ok = strcmp(key, allowed[i]) == 0;
    if (ok) continue;
    size_t m = nb__push_key(c, key);
    const char* hint = nb__closest(key, allowed);
    if (hint) {
      nb__err(c, NULL, "unknown field; did you mean \"%s\"?", hint);
    } else {
      char list[256];
      nb__join_names(allowed, false, list, sizeof list);
      nb__err(c, NULL, "unknown field; expected one of: %s", list);
    }
    nb__pop(c, m);
  }
  return true;
}

static void nb__missing(nb__dctx_t* c, const char* key, const char* what) {
  size_t m = nb__push_key(c, key);
  nb__err(c, NULL, "required field is missing (expected %s)", what);
  nb__pop(c, m);
}

/* Object-valued field: pushes the key onto the path; the caller pops with *mark. Returns the
 * object when present and valid, NULL otherwise. */
static json_t* nb__enter(nb__dctx_t* c, json_t* obj, const char* key, const char* const* allowed,
                         size_t* mark) {
  *mark = nb__push_key(c, key);
  json_t* v = obj ? json_object_get(obj, key) : NULL;
  if (!v) return NULL;
  return nb__check_object(c, v, allowed) ? v : NULL;
}

static bool nb__get_int(nb__dctx_t* c, json_t* obj, const char* key, long long lo, long long hi,
                        long long* out) {
  json_t* v = obj ? json_object_get(obj, key) : NULL;
  if (!v) return false;
  size_t m = nb__push_key(c, key);
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    nb__err(c, v, "expected an integer in [%lld, %lld]", lo, hi);
  else
    *out = json_integer_value(v);
  nb__pop(c, m);
  return true;
}

static bool nb__get_i32(nb__dctx_t* c, json_t* obj, const char* key, int lo, int hi, int* out) {
  long long x = *out;
  bool present = nb__get_int(c, obj, key, lo, hi, &x);
  *out = (int)x;
  return present;
}

/* Holds every real to 15 significant digits, which is also how the printer writes it: parsing a
 * normalized descriptor gives back the same bits on every machine. */
static double nb__canon(double x) {
  char buf[40];
  snprintf(buf, sizeof buf, "%.15g", x);
  return strtod(buf, NULL);
}

enum { NB__CLOSED = 0, NB__LO_OPEN = 1, NB__HI_OPEN = 2 };

static bool nb__get_num(nb__dctx_t* c, json_t* obj, const char* key, double lo, double hi, int open,
                        double* out) {
  json_t* v = obj ? json_object_get(obj, key) : NULL;
  if (!v) return false;
  size_t m = nb__push_key(c, key);
  bool ok = json_is_number(v);
  double x = ok ? json_number_value(v) : 0;
  if (ok) {
    ok = isfinite(x) && ((open & NB__LO_OPEN) ? x > lo : x >= lo) &&
         ((open & NB__HI_OPEN) ? x < hi : x <= hi);
  }
  if (!ok)
    nb__err(c, v, "expected a number in %c%g, %g%c", (open & NB__LO_OPEN) ? '(' : '[', lo, hi,
            (open & NB__HI_OPEN) ? ')' : ']');
  else
    *out = nb__canon(x);
  nb__pop(c, m);
  return true;
}

static bool nb__get_bool(nb__dctx_t* c, json_t* obj, const char* key, bool* out) {
  json_t* v = obj ? json_object_get(obj, key) : NULL;
  if (!v) return false;
  size_t m = nb__push_key(c, key);
  if (!json_is_boolean(v))
    nb__err(c, v, "expected true or false");
  else
    *out = json_is_true(v);
  nb__pop(c, m);
  return true;
}

/* TEXT: free text (line breaks allowed); PATH: non-empty, no control characters; ARG: a word of
 * a command line, possibly empty, no control characters. */
typedef enum {
  NB__STR_TEXT,
  NB__STR_PATH,
  NB__STR_NAME,
  NB__STR_SHA256,
  NB__STR_ARG
} nb__str_kind_t;

static bool nb__valid_name(const char* s, size_t len) {
  if (len == 0 || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[len - 1]))
    return false;
  for (size_t i = 0; i < len; i++)
    if (!(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '-'))
      return false;
  return true;
}

static bool nb__valid_sha256(const char* s, size_t len) {
  if (len != 64) return false;
  for (size_t i = 0; i < len; i++)
    if (!(isdigit((unsigned char)s[i]) || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

/* Checks one string value v against kind, copying it into dst (cap bytes with NUL). The path of
 * v must already be on the context. Returns true when valid. */
static bool nb__take_str(nb__dctx_t* c, json_t* v, nb__str_kind_t kind, char* dst, size_t cap) {
  if (!json_is_string(v)) {
    nb__err(c, v, "expected a string");
    return false;
  }
  const char* s = json_string_value(v);
  size_t len = json_string_length(v);
  if (len >= cap) {
    nb__err(c, NULL, "expected a string of at most %zu bytes, found one of %zu bytes", cap - 1,
            len);
    return false;
  }
  switch (kind) {
    case NB__STR_NAME:
      if (!nb__valid_name(s, len)) {
        nb__err(c, v,
                "expected a name of lower-case letters, digits and '-' that starts and ends "
                "with a letter or digit");
        return false;
      }
      break;
    case NB__STR_SHA256:
      if (!nb__valid_sha256(s, len)) {
        nb__err(c, v, "expected 64 lower-case hexadecimal digits (a SHA-256)");
        return false;
      }
      break;
    case NB__STR_PATH:
      if (len == 0) {
        nb__err(c, v, "expected a non-empty path");
        return false;
      }
      /* fallthrough */
    case NB__STR_ARG:
    case NB__STR_TEXT:
      for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 && !(kind == NB__STR_TEXT && s[i] == '\n')) {
          nb__err(c, NULL, "expected a string without control characters, found one at byte %zu",
                  i);
          return false;
        }
      break;
  }
  memcpy(dst, s, len + 1);
  return true;
}

static bool nb__get_str(nb__dctx_t* c, json_t* obj, const char* key, nb__str_kind_t kind, char* dst,
                        size_t cap) {
  json_t* v = obj ? json_object_get(obj, key) : NULL;
  if (!v) return false;
  size_t m = nb__push_key(c, key);
  nb__take_str(c, v, kind, dst, cap);
  nb__pop(c, m);
  return true;
}

/* Matches v against names (the path of v must be on the context); returns the index or -1. */
static int nb__take_enum(nb__dctx_t* c, json_t* v, const char* const* names) {
  if (json_is_string(v)) {
    for (int i = 0; names[i]; i++)
      if (strcmp(json_string_value(v), names[i]) == 0) return i;
  }
  char list[160];
  nb__join_names(names, true, list, sizeof list);
  const char* hint = json_is_string(v) ? nb__closest(json_string_value(v), names) : NULL;
  if (hint) {
    char what[80];
    nb__describe(v, what, sizeof what);
    nb__err(c, NULL, "expected one of %s, found %s; did you mean \"%s\"?", list, what, hint);
  } else {
    nb__err(c, v, "expected one of %s", list);
  }
  return -1;
}

static bool nb__get_enum(nb__dctx_t* c, json_t* obj, const char* key, const char* const* names,
                         int* out) {
  json_t* v = obj ? json_object_get(obj, key) : NULL;
  if (!v) return false;
  size_t m = nb__push_key(c, key);
  int i = nb__take_enum(c, v, names);
  if (i >= 0) *out = i;
  nb__pop(c, m);
  return true;
}

/* Array-valued field: returns it (path pushed, pop with *mark) when it is an array of 1..max_n
 * elements, NULL otherwise (error recorded when present but wrong). */
static json_t* nb__enter_array(nb__dctx_t* c, json_t* obj, const char* key, size_t max_n,
                               size_t* mark) {
  *mark = nb__push_key(c, key);
  json_t* v = obj ? json_object_get(obj, key) : NULL;
  if (!v) return NULL;
  if (!json_is_array(v)) {
    nb__err(c, v, "expected an array of 1 to %zu elements", max_n);
    return NULL;
  }
  if (json_array_size(v) == 0 || json_array_size(v) > max_n) {
    nb__err(c, NULL, "expected an array of 1 to %zu elements, found %zu elements", max_n,
            json_array_size(v));
    return NULL;
  }
  return v;
}

/* ---------------------------------------------------------------------------------------------
 * The sections of a descriptor. */

typedef struct { /* which optional fields were written, for the cross-field checks */
  bool program;  /* spec.program is there: the built-in model's sections do not apply */
  bool inner_steps, round_seconds, overlap, overlap_steps, eager;
  bool lora_obj, distill_obj, warmup;
  bool has_languages[NB_JOB_MAX_CLUSTERS], has_pairs[NB_JOB_MAX_CLUSTERS];
} nb__seen_t;

static void nb__parse_data(nb__dctx_t* c, json_t* clobj, nb_job_cluster_t* cl, bool* has_langs,
                           bool* has_pairs, bool seen_program) {
  size_t mark;
  json_t* d = nb__enter(c, clobj, "data", nb__data_keys, &mark);
  if (!d) {
    if (clobj && !json_object_get(clobj, "data") && !seen_program) {
      nb__pop(c, mark);
      nb__missing(c, "data", "an object with \"languages\" or \"pairs\"");
      return;
    }
    nb__pop(c, mark);
    return;
  }
  int tier = (int)cl->data_tier;
  nb__get_enum(c, d, "tier", nb__tier_names, &tier);
  cl->data_tier = (nb_job_data_tier_t)tier;
  nb__get_str(c, d, "dir", NB__STR_PATH, cl->data_dir, sizeof cl->data_dir);

  size_t am;
  json_t* arr = nb__enter_array(c, d, "languages", NB_JOB_MAX_LANGS, &am);
  *has_langs = json_object_get(d, "languages") != NULL;
  if (arr) {
    for (size_t i = 0; i < json_array_size(arr); i++) {
      size_t em = nb__push(c, "[%zu]", i);
      json_t* v = json_array_get(arr, i);
      const char* lab = json_string_value(v);
      bool ok = nb__is_label(lab);
      if (!ok)
        nb__err(c, v,
                "expected a data label (" NB__LABEL_CHARS
                ": a language code of the corpus such "
                "as en, or a name of your own corpus, read from <data.dir>/mono/<label>.txt)");
      for (int k = 0; ok && k < cl->n_languages; k++)
        if (strcmp(cl->languages[k], lab) == 0) {
          nb__err(c, NULL, "duplicate language \"%s\"", lab);
          ok = false;
        }
      if (ok) snprintf(cl->languages[cl->n_languages++], NB_JOB_LANG_MAX, "%s", lab);
      nb__pop(c, em);
    }
  }
  nb__pop(c, am);

  arr = nb__enter_array(c, d, "pairs", NB_JOB_MAX_LANGS, &am);
  *has_pairs = json_object_get(d, "pairs") != NULL;
  if (arr) {
    for (size_t i = 0; i < json_array_size(arr); i++) {
      size_t em = nb__push(c, "[%zu]", i);
      json_t* v = json_array_get(arr, i);
      const char* s = json_string_value(v);
      const char* dash = s ? strchr(s, '-') : NULL;
      char src[NB_JOB_LANG_MAX] = {0}, tgt[NB_JOB_LANG_MAX] = {0};
      bool ok = dash && dash - s < NB_JOB_LANG_MAX && strlen(dash + 1) < NB_JOB_LANG_MAX;
      if (ok) {
        memcpy(src, s, (size_t)(dash - s));
        snprintf(tgt, sizeof tgt, "%s", dash + 1);
        ok = nb__is_label(src) && nb__is_label(tgt);
      }
      if (!ok) {
        nb__err(c, v, "expected a pair \"SRC-TGT\" of two data labels (each " NB__LABEL_CHARS ")");
      } else if (strcmp(src, tgt) == 0) {
        nb__err(c, v, "expected two different languages");
      } else {
        bool dup = false;
        for (int k = 0; k < cl->n_pairs && !dup; k++)
          dup = strcmp(cl->pair_src[k], src) == 0 && strcmp(cl->pair_tgt[k], tgt) == 0;
        if (dup) {
          nb__err(c, NULL, "duplicate pair \"%s\"", s);
        } else {
          snprintf(cl->pair_src[cl->n_pairs], NB_JOB_LANG_MAX, "%s", src);
          snprintf(cl->pair_tgt[cl->n_pairs++], NB_JOB_LANG_MAX, "%s", tgt);
        }
      }
      nb__pop(c, em);
    }
  }
  nb__pop(c, am);
  nb__pop(c, mark);
}

/* clusters[i].metrics: {"listen": "HOST:PORT"}, the leader's Prometheus endpoint. A TCP address
 * with a port in 0..65535 (the checks of the gateway's metrics.listen): a unix: target, a host
 * without a port or a port out of range is refused here, not when the job starts. */
static void nb__parse_metrics(nb__dctx_t* c, json_t* clobj, nb_job_cluster_t* cl) {
  size_t mark;
  json_t* m = nb__enter(c, clobj, "metrics", nb__metrics_keys, &mark);
  if (m) {
    json_t* v = json_object_get(m, "listen");
    size_t lm = nb__push_key(c, "listen");
    char addr[NB_JOB_ADDR_MAX];
    if (!v) { /* an object of unknown fields only has its did-you-mean already */
      nb__pop(c, lm);
      if (json_object_size(m) == 0)
        nb__missing(c, "listen", "a \"HOST:PORT\" address such as \"127.0.0.1:9465\"");
    } else if (nb__take_str(c, v, NB__STR_ARG, addr, sizeof addr)) {
      /* nb_cli_addr_check reports through nb_error: keep the descriptor's first error there */
      char first[512];
      snprintf(first, sizeof first, "%s", c->errors ? nb_error_last() : "");
      if (!strncmp(addr, "unix:", 5) || !strncmp(addr, "unix-abstract:", 14)) {
        nb__err(c, v, "expected HOST:PORT (TCP; Prometheus scrapes over HTTP), not a unix: target");
      } else if (nb_cli_addr_check(addr, 1, "listen") != NB_OK) {
        char why[384];
        const char* e = nb_error_last();
        snprintf(why, sizeof why, "%s", strncmp(e, "listen: ", 8) ? e : e + 8);
        if (c->errors) nb_error(NB_ERR_CONFIG, "%s", first);
        nb__err(c, NULL, "expected HOST:PORT: %s", why);
      } else {
        snprintf(cl->metrics_listen, sizeof cl->metrics_listen, "%s", addr);
      }
    }
    if (v) nb__pop(c, lm);
  }
  nb__pop(c, mark);
}

static void nb__parse_clusters(nb__dctx_t* c, json_t* spec, nb_job_config_t* cfg,
                               nb__seen_t* seen) {
  size_t mark;
  json_t* arr = nb__enter_array(c, spec, "clusters", NB_JOB_MAX_CLUSTERS, &mark);
  if (!arr) {
    if (spec && !json_object_get(spec, "clusters")) {
      nb__pop(c, mark);
      nb__missing(c, "clusters", "an array of 1 to 16 clusters");
      return;
    }
    nb__pop(c, mark);
    return;
  }
  cfg->n_clusters = (int)json_array_size(arr);
  for (size_t i = 0; i < json_array_size(arr); i++) {
    nb_job_cluster_t* cl = &cfg->clusters[i];
    nb_job_cluster_defaults(cl);
    size_t em = nb__push(c, "[%zu]", i);
    json_t* o = json_array_get(arr, i);
    if (nb__check_object(c, o, nb__cluster_keys)) {
      if (!nb__get_str(c, o, "id", NB__STR_NAME, cl->id, sizeof cl->id))
        nb__missing(c, "id", "a cluster name such as \"dc-a\"");
      nb__get_i32(c, o, "workers", 1, 4096, &cl->workers);
      int dev = (int)cl->device;
      nb__get_enum(c, o, "device", nb__device_names, &dev);
      cl->device = (nb_job_device_t)dev;
      nb__get_i32(c, o, "threadsPerWorker", 0, 1024, &cl->threads_per_worker);
      nb__get_num(c, o, "slowdown", 1, 1000, NB__CLOSED, &cl->slowdown);
      nb__parse_data(c, o, cl, &seen->has_languages[i], &seen->has_pairs[i], seen->program);
      nb__parse_metrics(c, o, cl);
      size_t pm;
      json_t* par = nb__enter(c, o, "parallel", nb__parallel_keys, &pm);
      if (par) {
        nb__get_i32(c, par, "tensor", 1, 256, &cl->tensor_parallel);
        nb__get_i32(c, par, "pipeline", 1, 256, &cl->pipeline_parallel);
        nb__get_i32(c, par, "microBatches", 1, 4096, &cl->micro_batches);
      }
      nb__pop(c, pm);
      /* the built-in model's settings of a cluster, with a program of the user's */
      static const char* const builtin[] = {"data", "threadsPerWorker", "slowdown", "parallel",
                                            NULL};
      for (int k = 0; seen->program && builtin[k]; k++) {
        if (!json_object_get(o, builtin[k])) continue;
        size_t bm = nb__push_key(c, builtin[k]);
        nb__err(c, NULL,
                "applies to the built-in model; a job with $.spec.program runs the user's own "
                "program (remove it)");
        nb__pop(c, bm);
      }
    }
    nb__pop(c, em);
  }
  nb__pop(c, mark);
}

static void nb__parse_model(nb__dctx_t* c, json_t* spec, nb_job_model_t* m) {
  size_t mark;
  json_t* o = nb__enter(c, spec, "model", nb__model_keys, &mark);
  if (o) {
    nb__get_i32(c, o, "layers", 1, 256, &m->layers);
    nb__get_i32(c, o, "width", 8, 16384, &m->width);
    nb__get_i32(c, o, "heads", 1, 256, &m->heads);
    nb__get_i32(c, o, "context", 8, 65536, &m->context);
    size_t bm;
    json_t* b = nb__enter(c, o, "base", nb__base_keys, &bm);
    if (b) {
      if (!nb__get_str(c, b, "checkpoint", NB__STR_PATH, m->base_checkpoint,
                       sizeof m->base_checkpoint))
        nb__missing(c, "checkpoint", "the path of a safetensors checkpoint");
      nb__get_str(c, b, "cluster", NB__STR_NAME, m->base_cluster, sizeof m->base_cluster);
      nb__get_str(c, b, "sha256", NB__STR_SHA256, m->base_sha256, sizeof m->base_sha256);
    }
    nb__pop(c, bm);
  }
  nb__pop(c, mark);
}

static void nb__parse_training(nb__dctx_t* c, json_t* spec, nb_job_training_t* t,
                               nb__seen_t* seen) {
  size_t mark, sm;
  json_t* o = nb__enter(c, spec, "training", nb__training_keys, &mark);
  if (o) {
    long long seed = (long long)t->seed, steps = t->max_steps;
    nb__get_int(c, o, "seed", 0, (long long)INT64_MAX, &seed);
    t->seed = (uint64_t)seed;
    nb__get_i32(c, o, "batchSize", 1, 65536, &t->batch_size);
    nb__get_int(c, o, "maxSteps", 1, 1000000000000LL, &steps);
    t->max_steps = steps;
    nb__get_num(c, o, "maxSeconds", 0, 1e7, NB__CLOSED, &t->max_seconds);

    json_t* s = nb__enter(c, o, "eval", nb__eval_keys, &sm);
    if (s) {
      nb__get_i32(c, s, "everyRounds", 0, 1000000, &t->eval_every_rounds);
      nb__get_i32(c, s, "batches", 1, 100000, &t->eval_batches);
      nb__get_i32(c, s, "sentences", 0, 1000000, &t->eval_sentences);
    }
    nb__pop(c, sm);

    nb_job_optimizer_t* op = &t->optimizer;
    s = nb__enter(c, o, "optimizer", nb__opt_keys, &sm);
    if (s) {
      int name = 0, sched = (int)op->schedule;
      nb__get_enum(c, s, "name", nb__optimizer_names, &name);
      nb__get_num(c, s, "lr", 0, 10, NB__LO_OPEN, &op->lr);
      nb__get_num(c, s, "beta1", 0, 1, NB__HI_OPEN, &op->beta1);
      nb__get_num(c, s, "beta2", 0, 1, NB__HI_OPEN, &op->beta2);
      nb__get_num(c, s, "eps", 0, 1, NB__LO_OPEN, &op->eps);
      nb__get_num(c, s, "weightDecay", 0, 10, NB__CLOSED, &op->weight_decay);
      nb__get_num(c, s, "gradClip", 0, 1e6, NB__CLOSED, &op->grad_clip);
      seen->warmup = nb__get_i32(c, s, "warmupSteps", 0, 1000000000, &op->warmup_steps);
      nb__get_enum(c, s, "schedule", nb__schedule_names, &sched);
      op->schedule = (nb_job_lr_schedule_t)sched;
      nb__get_num(c, s, "minLrRatio", 0, 1, NB__CLOSED, &op->min_lr_ratio);
    }
    nb__pop(c, sm);

    nb_job_lora_t* lo = &t->lora;
    s = nb__enter(c, o, "lora", nb__lora_keys, &sm);
    if (s) {
      seen->lora_obj = true;
      lo->enabled = true; /* writing the section turns it on unless "enabled": false */
      nb__get_bool(c, s, "enabled", &lo->enabled);
      nb__get_i32(c, s, "rank", 1, 1024, &lo->rank);
      nb__get_num(c, s, "alpha", 0, 10000, NB__LO_OPEN, &lo->alpha);
      size_t am;
      json_t* arr = nb__enter_array(c, s, "targets", 4, &am);
      if (arr) {
        unsigned mask = 0;
        for (size_t i = 0; i < json_array_size(arr); i++) {
          size_t em = nb__push(c, "[%zu]", i);
          int k = nb__take_enum(c, json_array_get(arr, i), nb__lora_target_names);
          if (k >= 0 && (mask & (1u << k)))
            nb__err(c, NULL, "duplicate target \"%s\"", nb__lora_target_names[k]);
          else if (k >= 0)
            mask |= 1u << k;
          nb__pop(c, em);
        }
        if (mask) lo->targets = mask;
      }
      nb__pop(c, am);
    }
    nb__pop(c, sm);

    nb_job_distill_t* di = &t->distill;
    s = nb__enter(c, o, "distillation", nb__distill_keys, &sm);
    if (s) {
      seen->distill_obj = true;
      di->enabled = true;
      nb__get_bool(c, s, "enabled", &di->enabled);
      nb__get_str(c, s, "teacher", NB__STR_PATH, di->teacher, sizeof di->teacher);
      nb__get_num(c, s, "alpha", 0, 1, NB__CLOSED, &di->alpha);
      nb__get_num(c, s, "temperature", 0, 100, NB__LO_OPEN, &di->temperature);
    }
    nb__pop(c, sm);
  }
  nb__pop(c, mark);
}

static void nb__parse_sync(nb__dctx_t* c, json_t* spec, nb_job_sync_cfg_t* s, nb__seen_t* seen) {
  size_t mark, om;
  json_t* o = nb__enter(c, spec, "sync", nb__sync_keys, &mark);
  if (o) {
    int mode = (int)s->mode;
    nb__get_enum(c, o, "mode", nb__sync_names, &mode);
    s->mode = (nb_job_sync_t)mode;
    seen->inner_steps = nb__get_i32(c, o, "innerSteps", 1, 1000000, &s->inner_steps);
    seen->round_seconds =
        nb__get_num(c, o, "roundSeconds", 0, 86400, NB__LO_OPEN, &s->round_seconds);
    seen->overlap = nb__get_bool(c, o, "overlap", &s->overlap);
    seen->overlap_steps = nb__get_i32(c, o, "overlapSteps", 0, 1000000, &s->overlap_steps);
    seen->eager = nb__get_bool(c, o, "eager", &s->eager);
    json_t* ou = nb__enter(c, o, "outer", nb__outer_keys, &om);
    if (ou) {
      nb__get_num(c, ou, "lr", 0, 10, NB__LO_OPEN, &s->outer_lr);
      nb__get_num(c, ou, "momentum", 0, 1, NB__HI_OPEN, &s->outer_momentum);
      nb__get_bool(c, ou, "nesterov", &s->outer_nesterov);
    }
    nb__pop(c, om);
    nb__get_num(c, o, "peerTimeoutSeconds", 0, 3600, NB__LO_OPEN, &s->peer_timeout_seconds);
  }
  nb__pop(c, mark);
}

static void nb__parse_compression(nb__dctx_t* c, json_t* spec, nb_job_compression_t* k) {
  size_t mark, dm;
  json_t* o = nb__enter(c, spec, "compression", nb__comp_keys, &mark);
  if (o) {
    json_t* d = nb__enter(c, o, "density", nb__density_keys, &dm);
    if (d) {
      nb__get_num(c, d, "initial", 0, 1, NB__LO_OPEN, &k->density_initial);
      nb__get_num(c, d, "min", 0, 1, NB__LO_OPEN, &k->density_min);
      nb__get_num(c, d, "max", 0, 1, NB__LO_OPEN, &k->density_max);
    }
    nb__pop(c, dm);
    nb__get_bool(c, o, "adaptive", &k->adaptive);
    nb__get_num(c, o, "budgetFraction", 0, 10, NB__LO_OPEN, &k->budget_fraction);
    nb__get_bool(c, o, "errorFeedback", &k->error_feedback);
    nb__get_num(c, o, "errorFeedbackDecay", 0, 1, NB__LO_OPEN, &k->error_feedback_decay);
    nb__get_i32(c, o, "topkChunk", 0, 65536, &k->topk_chunk);
    int v = (int)k->values;
    nb__get_enum(c, o, "values", nb__values_names, &v);
    k->values = (nb_job_values_t)v;
    nb__get_i32(c, o, "zstdLevel", NB_CODEC_ZSTD_LEVEL_MIN, NB_CODEC_ZSTD_LEVEL_MAX,
                &k->zstd_level);
  }
  nb__pop(c, mark);
}

/* Why s is not a relative path of '/'-separated components none of which is empty, "." or
 * "..", or NULL when it is one. */
static const char* nb__relpath_problem(const char* s) {
  if (s[0] == '/') return "must be relative (inside the program's workDir)";
  if (strchr(s, '\\')) return "must not hold a backslash";
  for (const char* q = s;;) {
    const char* e = strchr(q, '/');
    size_t n = e ? (size_t)(e - q) : strlen(q);
    if (n == 0) return "must not hold an empty component (\"//\" or a trailing '/')";
    if (n == 1 && q[0] == '.') return "must not hold a \".\" component";
    if (n == 2 && q[0] == '.' && q[1] == '.')
      return "must not hold \"..\" (the files stay inside the job's folder)";
    if (!e) return NULL;
    q = e + 1;
  }
}

/* spec.program.files[i]: one file the gateways put in the program's folder before launch, from
 * an artifact store (gateway/artifact.h: the same name rules, checked here again because this
 * layer sits below the gateway). */
static void nb__parse_program_file(nb__dctx_t* c, json_t* v, const nb_job_config_t* cfg,
                                   nb_job_program_t* p, int i) {
  if (!nb__check_object(c, v, nb__file_keys)) return;
  char* art = p->files[i].artifact;
  json_t* a = json_object_get(v, "artifact");
  size_t m = nb__push_key(c, "artifact");
  if (!a) {
    nb__pop(c, m);
    nb__missing(c, "artifact",
                "the name of an artifact you put (nebula artifact put), such as \"train.sh\", or "
                "\"sha256:<64 hex digits>\"");
  } else {
    if (nb__take_str(c, a, NB__STR_PATH, art, NB_JOB_ARTIFACT_MAX)) {
      if (!strncmp(art, "sha256:", 7)) {
        if (!nb__valid_sha256(art + 7, strlen(art + 7)))
          nb__err(c, a, "expected \"sha256:\" and 64 lower-case hexadecimal digits");
      } else {
        const char* why = nb__relpath_problem(art);
        if (why) nb__err(c, a, "an artifact name %s", why);
      }
    }
    nb__pop(c, m);
  }
  char* path = p->files[i].path;
  json_t* pv = json_object_get(v, "path");
  m = nb__push_key(c, "path");
  if (!pv) {
    nb__pop(c, m);
    nb__missing(c, "path", "where the file goes, relative to workDir, such as \"train.sh\"");
  } else {
    if (nb__take_str(c, pv, NB__STR_PATH, path, NB_JOB_PATH_MAX)) {
      const char* why = nb__relpath_problem(path);
      if (why) nb__err(c, pv, "%s", why);
      for (int k = 0; !why && k < i; k++) {
        const char* o = p->files[k].path;
        size_t lo = strlen(o), ln = strlen(path);
        if (!strcmp(o, path))
          nb__err(c, pv, "the same path as $.spec.program.files[%d].path", k);
        else if ((lo < ln && !strncmp(o, path, lo) && path[lo] == '/') ||
                 (ln < lo && !strncmp(o, path, ln) && o[ln] == '/'))
          nb__err(c, pv, "a file cannot lie inside $.spec.program.files[%d].path, nor hold it", k);
      }
    }
    nb__pop(c, m);
  }
  char* cl = p->files[i].cluster;
  json_t* cv = json_object_get(v, "cluster");
  m = nb__push_key(c, "cluster");
  if (cv && nb__take_str(c, cv, NB__STR_NAME, cl, NB_JOB_NAME_MAX)) {
    int in = 0;
    for (int k = 0; k < cfg->n_clusters; k++) in |= !strcmp(cfg->clusters[k].id, cl);
    if (!in) nb__err(c, cv, "expected the id of one of the job's clusters ($.spec.clusters)");
  }
  nb__pop(c, m);
  json_t* mv = json_object_get(v, "mode");
  m = nb__push_key(c, "mode");
  char mode[8];
  if (mv && nb__take_str(c, mv, NB__STR_ARG, mode, sizeof mode)) {
    size_t n = strlen(mode);
    int ok = n >= 3 && n <= 4;
    long bits = 0;
    for (size_t k = 0; ok && k < n; k++) {
      ok = mode[k] >= '0' && mode[k] <= '7';
      bits = bits * 8 + (mode[k] - '0');
    }
    if (!ok || bits > 0777 || !(bits & 0400))
      nb__err(c, mv,
              "expected permission bits as 3 or 4 octal digits such as \"0755\", at most "
              "\"0777\" and readable by the owner");
    else
      p->files[i].mode = (int)bits;
  }
  nb__pop(c, m);
}

/* spec.program: the user's command as an argv array (no shell) and the folder it runs in. */
static void nb__parse_program(nb__dctx_t* c, json_t* spec, const nb_job_config_t* cfg,
                              nb_job_program_t* p) {
  size_t mark, am;
  json_t* o = nb__enter(c, spec, "program", nb__program_keys, &mark);
  if (o) {
    json_t* arr = nb__enter_array(c, o, "command", NB_JOB_PROGRAM_MAX_ARGS, &am);
    if (!json_object_get(o, "command")) {
      nb__pop(c, am);
      nb__missing(c, "command",
                  "the program and its arguments as an array of strings, such as "
                  "[\"python3\", \"train.py\"]");
    } else {
      bool ok = arr != NULL;
      for (size_t i = 0; arr && i < json_array_size(arr); i++) {
        size_t em = nb__push(c, "[%zu]", i);
        ok &= nb__take_str(c, json_array_get(arr, i), i == 0 ? NB__STR_PATH : NB__STR_ARG,
                           p->argv[i], sizeof p->argv[i]);
        nb__pop(c, em);
      }
      if (ok) p->argc = (int)json_array_size(arr);
      nb__pop(c, am);
    }
    nb__get_str(c, o, "workDir", NB__STR_PATH, p->workdir, sizeof p->workdir);
    json_t* files = nb__enter_array(c, o, "files", NB_JOB_PROGRAM_MAX_FILES, &am);
    for (size_t i = 0; files && i < json_array_size(files); i++) {
      size_t em = nb__push(c, "[%zu]", i);
      nb__parse_program_file(c, json_array_get(files, i), cfg, p, (int)i);
      nb__pop(c, em);
    }
    if (files) p->n_files = (int)json_array_size(files);
    nb__pop(c, am);
  }
  nb__pop(c, mark);
}

static void nb__parse_rest(nb__dctx_t* c, json_t* spec, nb_job_config_t* cfg) {
  size_t mark;
  json_t* o = nb__enter(c, spec, "link", nb__link_keys, &mark);
  if (o) {
    nb__get_num(c, o, "rateMbit", 0, 1e6, NB__CLOSED, &cfg->link.rate_mbit);
    nb__get_num(c, o, "delayMs", 0, 10000, NB__CLOSED, &cfg->link.delay_ms);
    nb__get_i32(c, o, "streams", 1, 64, &cfg->link.streams);
    nb__get_i32(c, o, "chunkKib", 4, 65536, &cfg->link.chunk_kib);
  }
  nb__pop(c, mark);

  nb_job_security_t* se = &cfg->security;
  o = nb__enter(c, spec, "security", nb__sec_keys, &mark);
  if (o) {
    nb__get_str(c, o, "ca", NB__STR_PATH, se->ca, sizeof se->ca);
    nb__get_str(c, o, "cert", NB__STR_PATH, se->cert, sizeof se->cert);
    nb__get_str(c, o, "key", NB__STR_PATH, se->key, sizeof se->key);
    nb__get_bool(c, o, "seal", &se->seal);
  }
  nb__pop(c, mark);

  nb_job_checkpoint_t* ck = &cfg->checkpoint;
  o = nb__enter(c, spec, "checkpoint", nb__ckpt_keys, &mark);
  if (o) {
    nb__get_i32(c, o, "everyRounds", 0, 1000000, &ck->every_rounds);
    nb__get_i32(c, o, "keep", 0, 1000000, &ck->keep);
    nb__get_str(c, o, "dir", NB__STR_PATH, ck->dir, sizeof ck->dir);
  }
  nb__pop(c, mark);
}

/* Rules that tie fields together; run only on a structurally valid document so that no error is
 * a consequence of another. */
static void nb__cross_checks(nb__dctx_t* c, const nb_job_config_t* cfg, const nb__seen_t* seen) {
  char p[96], q[96];
  for (int i = 0; i < cfg->n_clusters; i++) {
    for (int j = 0; j < i; j++)
      if (strcmp(cfg->clusters[i].id, cfg->clusters[j].id) == 0) {
        snprintf(p, sizeof p, "$.spec.clusters[%d].id", i);
        nb__err_at(c, p, "duplicate cluster id \"%s\" (already used by $.spec.clusters[%d])",
                   cfg->clusters[i].id, j);
        break;
      }
    if (seen->program) continue; /* the program's data is its own business */
    snprintf(p, sizeof p, "$.spec.clusters[%d].data", i);
    bool translation = cfg->task == NB_JOB_TASK_TRANSLATION;
    if (translation && !seen->has_pairs[i])
      nb__err_at(c, p,
                 "task \"translation\" needs \"pairs\" (such as [\"en-de\"]) in every cluster");
    if (translation && seen->has_languages[i])
      nb__err_at(c, p, "task \"translation\" takes \"pairs\", not \"languages\"");
    if (!translation && !seen->has_languages[i])
      nb__err_at(c, p,
                 "task \"pretrain\" needs \"languages\" (such as [\"en\", \"de\"]) in "
                 "every cluster");
    if (!translation && seen->has_pairs[i])
      nb__err_at(c, p, "task \"pretrain\" takes \"languages\", not \"pairs\"");
  }
  const nb_job_model_t* m = &cfg->model;
  if (m->width % m->heads != 0)
    nb__err_at(c, "$.spec.model.heads", "width %d is not divisible by heads %d", m->width,
               m->heads);
  const nb_job_training_t* t = &cfg->training;
  for (int i = 0; i < cfg->n_clusters && !seen->program; i++) {
    const nb_job_cluster_t* cl = &cfg->clusters[i];
    int tp = cl->tensor_parallel, pp = cl->pipeline_parallel;
    snprintf(p, sizeof p, "$.spec.clusters[%d].parallel.tensor", i);
    if (m->heads % tp != 0)
      nb__err_at(c, p,
                 "tensor parallelism over %d ranks splits whole heads: heads %d is not "
                 "divisible by it",
                 tp, m->heads);
    if (tp > 1 && t->lora.enabled)
      nb__err_at(c, p,
                 "tensor parallelism trains the whole model: not with "
                 "$.spec.training.lora");
    if (tp > 1 && t->distill.enabled)
      nb__err_at(c, p,
                 "tensor parallelism is not built for distillation "
                 "($.spec.training.distillation)");
    snprintf(p, sizeof p, "$.spec.clusters[%d].parallel.pipeline", i);
    if (pp > m->layers)
      nb__err_at(c, p, "%d stages for %d layers ($.spec.model.layers): a stage needs a layer", pp,
                 m->layers);
    else if (m->layers % pp != 0)
      nb__err_at(c, p,
                 "%d layers ($.spec.model.layers) do not split into %d stages of whole layers",
                 m->layers, pp);
    else if (pp > 1 && (t->lora.enabled || t->distill.enabled))
      nb__err_at(c, p,
                 "pipeline parallelism trains the whole model: not with "
                 "$.spec.training.lora or distillation");
    snprintf(p, sizeof p, "$.spec.clusters[%d].parallel.microBatches", i);
    int mb = cl->micro_batches > 0 ? cl->micro_batches : pp;
    if (cl->micro_batches > 0 && pp == 1)
      nb__err_at(c, p, "applies to pipeline parallelism (parallel.pipeline above 1)");
    else if (pp > 1 && t->batch_size % mb != 0)
      nb__err_at(c, p, "%d micro-batches do not divide $.spec.training.batchSize %d%s", mb,
                 t->batch_size,
                 cl->micro_batches > 0 ? "" : " (the default is the pipeline degree)");
    snprintf(p, sizeof p, "$.spec.clusters[%d].workers", i);
    if (cl->workers % (tp * pp) != 0)
      nb__err_at(c, p,
                 "%d workers do not divide into replicas of tensor %d x pipeline %d "
                 "ranks (workers = data x tensor x pipeline)",
                 cl->workers, tp, pp);
  }
  bool has_base = m->base_checkpoint[0] != 0;
  if (t->lora.enabled && !has_base)
    nb__err_at(c, "$.spec.training.lora",
               "LoRA adapts a pretrained model: set $.spec.model.base.checkpoint");
  if (t->distill.enabled && !t->distill.teacher[0])
    nb__err_at(c, "$.spec.training.distillation.teacher",
               "distillation needs a teacher: a checkpoint path, or \"base\" for the base model");
  if (t->distill.enabled && strcmp(t->distill.teacher, "base") == 0 && !has_base)
    nb__err_at(c, "$.spec.training.distillation.teacher",
               "teacher \"base\" needs $.spec.model.base.checkpoint");
  if (t->optimizer.warmup_steps >= t->max_steps && seen->warmup)
    nb__err_at(c, "$.spec.training.optimizer.warmupSteps",
               "warm-up of %d steps must be shorter than $.spec.training.maxSteps (%lld)",
               t->optimizer.warmup_steps, (long long)t->max_steps);

  const nb_job_sync_cfg_t* s = &cfg->sync;
  if (seen->inner_steps && seen->round_seconds)
    nb__err_at(c, "$.spec.sync.roundSeconds",
               "a round is either innerSteps or roundSeconds, not both (remove one)");
  if (s->mode != NB_JOB_SYNC_OUTER) {
    const char* mode = nb_job_sync_name(s->mode);
    if (seen->overlap && s->overlap)
      nb__err_at(c, "$.spec.sync.overlap", "overlap applies to mode \"outer\", found mode \"%s\"",
                 mode);
    if (seen->overlap_steps)
      nb__err_at(c, "$.spec.sync.overlapSteps",
                 "overlapSteps applies to mode \"outer\" with overlap, found mode \"%s\"", mode);
    if (seen->eager)
      nb__err_at(c, "$.spec.sync.eager",
                 "eager applies to mode \"outer\" with overlap, found mode \"%s\"", mode);
    if (seen->inner_steps)
      nb__err_at(c, "$.spec.sync.innerSteps",
                 "innerSteps applies to mode \"outer\", found mode \"%s\" (it syncs every step)",
                 mode);
    if (seen->round_seconds)
      nb__err_at(c, "$.spec.sync.roundSeconds",
                 "roundSeconds applies to mode \"outer\", found mode \"%s\" (it syncs every step)",
                 mode);
  }

  const nb_job_compression_t* k = &cfg->compression;
  if (k->values == NB_JOB_VALUES_AUTO && !k->adaptive)
    nb__err_at(c, "$.spec.compression.values",
               "\"auto\" lets the adaptive scheduler pick the codec point each round: it needs "
               "$.spec.compression.adaptive true");
  if (k->topk_chunk != 0 && (k->topk_chunk < 16 || (k->topk_chunk & (k->topk_chunk - 1)) != 0))
    nb__err_at(c, "$.spec.compression.topkChunk",
               "chunk of %d coordinates: expected 0 (global top-k) or a power of two in [16, "
               "65536]",
               k->topk_chunk);
  if (k->density_min > k->density_max)
    nb__err_at(c, "$.spec.compression.density.min",
               "density floor %g is above the ceiling $.spec.compression.density.max (%g)",
               k->density_min, k->density_max);
  else if (k->density_initial < k->density_min || k->density_initial > k->density_max)
    nb__err_at(c, "$.spec.compression.density.initial",
               "initial density %g is outside [min %g, max %g]", k->density_initial, k->density_min,
               k->density_max);

  const nb_job_security_t* se = &cfg->security;
  if ((se->cert[0] != 0) != (se->key[0] != 0)) {
    snprintf(p, sizeof p, "$.spec.security.%s", se->cert[0] ? "key" : "cert");
    snprintf(q, sizeof q, "%s", se->cert[0] ? "cert" : "key");
    nb__err_at(c, p, "required when \"%s\" is given (a certificate and its key go together)", q);
  }
  if (se->cert[0] && !se->ca[0])
    nb__err_at(c, "$.spec.security.ca", "required when \"cert\" is given (the CA that signed it)");

  /* A program syncs through the public session: outer rounds of H steps it counts itself, no
   * overlapped round of the worker's kind (include/nebula.h); values "auto" as the worker's. */
  if (seen->program) {
    const char* why = "a job with $.spec.program syncs through the session of include/nebula.h";
    if (s->mode != NB_JOB_SYNC_OUTER)
      nb__err_at(c, "$.spec.sync.mode", "expected \"outer\": %s, which has outer rounds only", why);
    if (seen->round_seconds)
      nb__err_at(c, "$.spec.sync.roundSeconds",
                 "%s: a round is the program's innerSteps steps, not a time budget", why);
    if (s->overlap)
      nb__err_at(c, "$.spec.sync.overlap", "%s, which has no overlapped round (yet)", why);
  }
}

static void nb__parse_doc(nb__dctx_t* c, json_t* root, nb_job_config_t* cfg) {
  nb__seen_t seen;
  memset(&seen, 0, sizeof seen);
  snprintf(c->path, sizeof c->path, "$");
  c->plen = 1;
  if (!nb__check_object(c, root, nb__top_keys)) return;

  json_t* v = json_object_get(root, "apiVersion");
  size_t m = nb__push_key(c, "apiVersion");
  if (!v)
    nb__err(c, NULL, "required field is missing (expected \"%s\")", NB_DESCRIPTOR_API_VERSION);
  else if (!json_is_string(v) || strcmp(json_string_value(v), NB_DESCRIPTOR_API_VERSION) != 0)
    nb__err(c, v, "expected \"%s\"", NB_DESCRIPTOR_API_VERSION);
  nb__pop(c, m);
  v = json_object_get(root, "kind");
  m = nb__push_key(c, "kind");
  if (!v)
    nb__err(c, NULL, "required field is missing (expected \"%s\")", NB_DESCRIPTOR_KIND);
  else if (!json_is_string(v) || strcmp(json_string_value(v), NB_DESCRIPTOR_KIND) != 0)
    nb__err(c, v, "expected \"%s\"", NB_DESCRIPTOR_KIND);
  nb__pop(c, m);

  json_t* meta = nb__enter(c, root, "metadata", nb__meta_keys, &m);
  if (meta) {
    if (!nb__get_str(c, meta, "name", NB__STR_NAME, cfg->name, sizeof cfg->name))
      nb__missing(c, "name", "a job name such as \"pretrain-2dc\"");
    nb__get_str(c, meta, "description", NB__STR_TEXT, cfg->description, sizeof cfg->description);
  }
  nb__pop(c, m);
  if (!json_object_get(root, "metadata")) nb__missing(c, "metadata", "an object with \"name\"");

  json_t* spec = nb__enter(c, root, "spec", nb__spec_keys, &m);
  if (spec) {
    seen.program = json_object_get(spec, "program") != NULL;
    static const char* const builtin[] = {"task", "model", "training", "checkpoint", NULL};
    for (int k = 0; seen.program && builtin[k]; k++) {
      if (!json_object_get(spec, builtin[k])) continue;
      size_t bm = nb__push_key(c, builtin[k]);
      nb__err(c, NULL,
              "applies to the built-in model; a job with $.spec.program runs the user's own "
              "program (remove it)");
      nb__pop(c, bm);
    }
    int task = (int)cfg->task;
    nb__get_enum(c, spec, "task", nb__task_names, &task);
    cfg->task = (nb_job_task_t)task;
    nb__parse_clusters(c, spec, cfg, &seen);
    nb__parse_model(c, spec, &cfg->model);
    nb__parse_training(c, spec, &cfg->training, &seen);
    nb__parse_sync(c, spec, &cfg->sync, &seen);
    nb__parse_compression(c, spec, &cfg->compression);
    nb__parse_rest(c, spec, cfg);
    nb__parse_program(c, spec, cfg, &cfg->program);
  }
  nb__pop(c, m);
  if (!json_object_get(root, "spec")) nb__missing(c, "spec", "an object with \"clusters\"");

  /* The default warm-up shrinks to a tenth of a short run; a written one is checked instead. */
  if (!seen.warmup && cfg->training.optimizer.warmup_steps >= cfg->training.max_steps)
    cfg->training.optimizer.warmup_steps = (int)(cfg->training.max_steps / 10);
  if (c->errors == 0) nb__cross_checks(c, cfg, &seen);
}

nb_status_t nb_descriptor_parse(const char* text, size_t len, nb_job_config_t* out,
                                nb_descriptor_diag_t* diag) {
  if (!text || !out) return nb_error(NB_ERR_INVALID, "descriptor: NULL text or output");
  nb__dctx_t c;
  memset(&c, 0, sizeof c);
  c.diag = diag;
  if (diag) memset(diag, 0, sizeof *diag);
  nb_job_config_defaults(out);
  if (len > NB_DESCRIPTOR_MAX_BYTES) {
    char msg[128];
    snprintf(msg, sizeof msg, "descriptor of %zu bytes exceeds the limit of %u bytes", len,
             NB_DESCRIPTOR_MAX_BYTES);
    nb__add_error(&c, "$", 0, 0, msg);
    return NB_ERR_CONFIG;
  }
  json_error_t jerr;
  json_t* root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    char msg[256];
    snprintf(msg, sizeof msg, "syntax error: %s", jerr.text);
    nb__add_error(&c, "$", jerr.line > 0 ? jerr.line : 0, jerr.column > 0 ? jerr.column : 0, msg);
    return NB_ERR_CONFIG;
  }
  nb__parse_doc(&c, root, out);
  json_decref(root);
  return c.errors ? NB_ERR_CONFIG : NB_OK;
}

nb_status_t nb_descriptor_load(const char* path, nb_job_config_t* out, nb_descriptor_diag_t* diag) {
  if (!path || !out) return nb_error(NB_ERR_INVALID, "descriptor: NULL path or output");
  nb__dctx_t c;
  memset(&c, 0, sizeof c);
  c.diag = diag;
  if (diag) memset(diag, 0, sizeof *diag);
  char msg[384];
  FILE* f = fopen(path, "rb");
  if (!f) {
    snprintf(msg, sizeof msg, "cannot open %s: %s", path, strerror(errno));
    nb__add_error(&c, "$", 0, 0, msg);
    return NB_ERR_IO;
  }
  char* buf = NULL;
  nb_status_t st = nb_alloc((void**)&buf, NB_DESCRIPTOR_MAX_BYTES + 1, 1, "descriptor");
  if (st != NB_OK) {
    fclose(f);
    return st;
  }
  size_t n = fread(buf, 1, NB_DESCRIPTOR_MAX_BYTES + 1, f);
  bool rerr = ferror(f);
  fclose(f);
  if (rerr) {
    snprintf(msg, sizeof msg, "cannot read %s", path);
    nb__add_error(&c, "$", 0, 0, msg);
    st = NB_ERR_IO;
  } else {
    /* n == MAX+1 means "too large": nb_descriptor_parse reports it. */
    st = nb_descriptor_parse(buf, n, out, diag);
  }
  nb_free(buf);
  return st;
}

/* ---------------------------------------------------------------------------------------------
 * The normalized document. */

typedef struct {
  bool ok;
} nb__jb_t;

static json_t* nb__set(nb__jb_t* b, json_t* obj, const char* key, json_t* v) {
  if (!obj || !v || json_object_set_new(obj, key, v) != 0) {
    b->ok = false;
    return NULL;
  }
  return v;
}
static void nb__set_str(nb__jb_t* b, json_t* o, const char* k, const char* s) {
  nb__set(b, o, k, json_string(s));
}
static void nb__set_int(nb__jb_t* b, json_t* o, const char* k, long long x) {
  nb__set(b, o, k, json_integer(x));
}
static void nb__set_num(nb__jb_t* b, json_t* o, const char* k, double x) {
  nb__set(b, o, k, json_real(x));
}
static void nb__set_bool(nb__jb_t* b, json_t* o, const char* k, bool x) {
  nb__set(b, o, k, json_boolean(x));
}
static json_t* nb__set_obj(nb__jb_t* b, json_t* o, const char* k) {
  return nb__set(b, o, k, json_object());
}
static void nb__append_str(nb__jb_t* b, json_t* arr, const char* s) {
  if (!arr || json_array_append_new(arr, json_string(s)) != 0) b->ok = false;
}

nb_status_t nb_descriptor_to_json(const nb_job_config_t* cfg, char** out) {
  if (!cfg || !out) return nb_error(NB_ERR_INVALID, "descriptor: NULL config or output");
  *out = NULL;
  nb__jb_t b = {true};
  json_t* root = json_object();
  nb__set_str(&b, root, "apiVersion", NB_DESCRIPTOR_API_VERSION);
  nb__set_str(&b, root, "kind", NB_DESCRIPTOR_KIND);
  json_t* meta = nb__set_obj(&b, root, "metadata");
  nb__set_str(&b, meta, "name", cfg->name);
  if (cfg->description[0]) nb__set_str(&b, meta, "description", cfg->description);
  json_t* spec = nb__set_obj(&b, root, "spec");
  bool prog = cfg->program.argc > 0; /* no sections of the built-in model (the parser refuses) */
  if (!prog) nb__set_str(&b, spec, "task", nb_job_task_name(cfg->task));

  json_t* cls = nb__set(&b, spec, "clusters", json_array());
  for (int i = 0; i < cfg->n_clusters && b.ok; i++) {
    const nb_job_cluster_t* cl = &cfg->clusters[i];
    json_t* o = json_object();
    if (!o || json_array_append_new(cls, o) != 0) {
      b.ok = false;
      break;
    }
    nb__set_str(&b, o, "id", cl->id);
    nb__set_int(&b, o, "workers", cl->workers);
    nb__set_str(&b, o, "device", nb_job_device_name(cl->device));
    if (prog) {
      if (cl->metrics_listen[0])
        nb__set_str(&b, nb__set_obj(&b, o, "metrics"), "listen", cl->metrics_listen);
      continue;
    }
    nb__set_int(&b, o, "threadsPerWorker", cl->threads_per_worker);
    nb__set_num(&b, o, "slowdown", cl->slowdown);
    json_t* d = nb__set_obj(&b, o, "data");
    nb__set_str(&b, d, "tier", nb__tier_names[cl->data_tier]);
    if (cl->data_dir[0]) nb__set_str(&b, d, "dir", cl->data_dir);
    if (cfg->task == NB_JOB_TASK_PRETRAIN) {
      json_t* a = nb__set(&b, d, "languages", json_array());
      for (int k = 0; k < cl->n_languages; k++) nb__append_str(&b, a, cl->languages[k]);
    } else {
      json_t* a = nb__set(&b, d, "pairs", json_array());
      for (int k = 0; k < cl->n_pairs; k++) {
        char pair[2 * NB_JOB_LANG_MAX + 1];
        snprintf(pair, sizeof pair, "%s-%s", cl->pair_src[k], cl->pair_tgt[k]);
        nb__append_str(&b, a, pair);
      }
    }
    if (cl->metrics_listen[0])
      nb__set_str(&b, nb__set_obj(&b, o, "metrics"), "listen", cl->metrics_listen);
    if (cl->tensor_parallel > 1 || cl->pipeline_parallel > 1) {
      json_t* par = nb__set_obj(&b, o, "parallel");
      nb__set_int(&b, par, "tensor", cl->tensor_parallel);
      nb__set_int(&b, par, "pipeline", cl->pipeline_parallel);
      if (cl->micro_batches > 0) nb__set_int(&b, par, "microBatches", cl->micro_batches);
    }
  }

  const nb_job_model_t* m = &cfg->model;
  json_t* mo = prog ? NULL : nb__set_obj(&b, spec, "model");
  if (!prog) {
    nb__set_int(&b, mo, "layers", m->layers);
    nb__set_int(&b, mo, "width", m->width);
    nb__set_int(&b, mo, "heads", m->heads);
    nb__set_int(&b, mo, "context", m->context);
    if (m->base_checkpoint[0]) {
      json_t* base = nb__set_obj(&b, mo, "base");
      nb__set_str(&b, base, "checkpoint", m->base_checkpoint);
      if (m->base_cluster[0]) nb__set_str(&b, base, "cluster", m->base_cluster);
      if (m->base_sha256[0]) nb__set_str(&b, base, "sha256", m->base_sha256);
    }

    const nb_job_training_t* t = &cfg->training;
    json_t* tr = nb__set_obj(&b, spec, "training");
    nb__set_int(&b, tr, "seed", (long long)t->seed);
    nb__set_int(&b, tr, "batchSize", t->batch_size);
    nb__set_int(&b, tr, "maxSteps", (long long)t->max_steps);
    nb__set_num(&b, tr, "maxSeconds", t->max_seconds);
    json_t* ev = nb__set_obj(&b, tr, "eval");
    nb__set_int(&b, ev, "everyRounds", t->eval_every_rounds);
    nb__set_int(&b, ev, "batches", t->eval_batches);
    nb__set_int(&b, ev, "sentences", t->eval_sentences);
    const nb_job_optimizer_t* op = &t->optimizer;
    json_t* oo = nb__set_obj(&b, tr, "optimizer");
    nb__set_str(&b, oo, "name", "adamw");
    nb__set_num(&b, oo, "lr", op->lr);
    nb__set_num(&b, oo, "beta1", op->beta1);
    nb__set_num(&b, oo, "beta2", op->beta2);
    nb__set_num(&b, oo, "eps", op->eps);
    nb__set_num(&b, oo, "weightDecay", op->weight_decay);
    nb__set_num(&b, oo, "gradClip", op->grad_clip);
    nb__set_int(&b, oo, "warmupSteps", op->warmup_steps);
    nb__set_str(&b, oo, "schedule", nb__schedule_names[op->schedule]);
    nb__set_num(&b, oo, "minLrRatio", op->min_lr_ratio);
    json_t* lo = nb__set_obj(&b, tr, "lora");
    nb__set_bool(&b, lo, "enabled", t->lora.enabled);
    nb__set_int(&b, lo, "rank", t->lora.rank);
    nb__set_num(&b, lo, "alpha", t->lora.alpha);
    json_t* tg = nb__set(&b, lo, "targets", json_array());
    for (int k = 0; nb__lora_target_names[k]; k++)
      if (t->lora.targets & (1u << k)) nb__append_str(&b, tg, nb__lora_target_names[k]);
    json_t* di = nb__set_obj(&b, tr, "distillation");
    nb__set_bool(&b, di, "enabled", t->distill.enabled);
    if (t->distill.teacher[0]) nb__set_str(&b, di, "teacher", t->distill.teacher);
    nb__set_num(&b, di, "alpha", t->distill.alpha);
    nb__set_num(&b, di, "temperature", t->distill.temperature);
  }

  const nb_job_sync_cfg_t* s = &cfg->sync;
  json_t* sy = nb__set_obj(&b, spec, "sync");
  nb__set_str(&b, sy, "mode", nb_job_sync_name(s->mode));
  if (s->mode == NB_JOB_SYNC_OUTER) {
    if (s->round_seconds > 0)
      nb__set_num(&b, sy, "roundSeconds", s->round_seconds);
    else
      nb__set_int(&b, sy, "innerSteps", s->inner_steps);
    nb__set_bool(&b, sy, "overlap", s->overlap);
    if (s->overlap) nb__set_int(&b, sy, "overlapSteps", s->overlap_steps);
    if (s->overlap) nb__set_bool(&b, sy, "eager", s->eager);
  }
  json_t* ou = nb__set_obj(&b, sy, "outer");
  nb__set_num(&b, ou, "lr", s->outer_lr);
  nb__set_num(&b, ou, "momentum", s->outer_momentum);
  nb__set_bool(&b, ou, "nesterov", s->outer_nesterov);
  nb__set_num(&b, sy, "peerTimeoutSeconds", s->peer_timeout_seconds);

  const nb_job_compression_t* k = &cfg->compression;
  json_t* co = nb__set_obj(&b, spec, "compression");
  json_t* de = nb__set_obj(&b, co, "density");
  nb__set_num(&b, de, "initial", k->density_initial);
  nb__set_num(&b, de, "min", k->density_min);
  nb__set_num(&b, de, "max", k->density_max);
  nb__set_bool(&b, co, "adaptive", k->adaptive);
  nb__set_num(&b, co, "budgetFraction", k->budget_fraction);
  nb__set_bool(&b, co, "errorFeedback", k->error_feedback);
  nb__set_num(&b, co, "errorFeedbackDecay", k->error_feedback_decay);
  nb__set_int(&b, co, "topkChunk", k->topk_chunk);
  nb__set_str(&b, co, "values", nb_job_values_name(k->values));
  nb__set_int(&b, co, "zstdLevel", k->zstd_level);

  json_t* li = nb__set_obj(&b, spec, "link");
  nb__set_num(&b, li, "rateMbit", cfg->link.rate_mbit);
  nb__set_num(&b, li, "delayMs", cfg->link.delay_ms);
  nb__set_int(&b, li, "streams", cfg->link.streams);
  nb__set_int(&b, li, "chunkKib", cfg->link.chunk_kib);

  const nb_job_security_t* se = &cfg->security;
  json_t* sc = nb__set_obj(&b, spec, "security");
  if (se->ca[0]) nb__set_str(&b, sc, "ca", se->ca);
  if (se->cert[0]) nb__set_str(&b, sc, "cert", se->cert);
  if (se->key[0]) nb__set_str(&b, sc, "key", se->key);
  nb__set_bool(&b, sc, "seal", se->seal);

  if (!prog) {
    json_t* ck = nb__set_obj(&b, spec, "checkpoint");
    nb__set_int(&b, ck, "everyRounds", cfg->checkpoint.every_rounds);
    nb__set_int(&b, ck, "keep", cfg->checkpoint.keep);
    if (cfg->checkpoint.dir[0]) nb__set_str(&b, ck, "dir", cfg->checkpoint.dir);
  } else {
    json_t* po = nb__set_obj(&b, spec, "program");
    json_t* cmd = nb__set(&b, po, "command", json_array());
    for (int k2 = 0; k2 < cfg->program.argc; k2++) nb__append_str(&b, cmd, cfg->program.argv[k2]);
    if (cfg->program.workdir[0]) nb__set_str(&b, po, "workDir", cfg->program.workdir);
    json_t* fl = cfg->program.n_files ? nb__set(&b, po, "files", json_array()) : NULL;
    for (int k2 = 0; fl && k2 < cfg->program.n_files; k2++) {
      json_t* fo = json_object();
      if (!fo || json_array_append_new(fl, fo) != 0) {
        b.ok = false;
        break;
      }
      nb__set_str(&b, fo, "artifact", cfg->program.files[k2].artifact);
      nb__set_str(&b, fo, "path", cfg->program.files[k2].path);
      if (cfg->program.files[k2].cluster[0])
        nb__set_str(&b, fo, "cluster", cfg->program.files[k2].cluster);
      if (cfg->program.files[k2].mode) {
        char mode[8];
        snprintf(mode, sizeof mode, "%04o", (unsigned)cfg->program.files[k2].mode & 0777u);
        nb__set_str(&b, fo, "mode", mode);
      }
    }
  }

  char* text = b.ok ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) : NULL;
  json_decref(root);
  if (!text) return nb_error(NB_ERR_NOMEM, "descriptor: out of memory writing the normalized JSON");
  *out = text;
  return NB_OK;
}

const char* nb_descriptor_error_format(const nb_descriptor_error_t* e, char* buf, size_t n) {
  if (!buf || n == 0) return buf;
  if (e->line > 0)
    snprintf(buf, n, "line %d, column %d: %s", e->line, e->column, e->message);
  else
    snprintf(buf, n, "%s: %s", e->path, e->message);
  return buf;
}

void nb_descriptor_diag_add(nb_descriptor_diag_t* d, const char* path, int line, int column,
                            const char* msg) {
  if (!d) return;
  if (d->count >= NB_DESCRIPTOR_MAX_ERRORS) {
    d->dropped++;
    return;
  }
  nb_descriptor_error_t* e = &d->errors[d->count++];
  snprintf(e->path, sizeof e->path, "%s", path);
  snprintf(e->message, sizeof e->message, "%s", msg);
  e->line = line;
  e->column = column;
}

void nb_descriptor_diag_print(FILE* f, const char* file, const nb_descriptor_diag_t* d) {
  char line[640];
  for (int i = 0; i < d->count; i++)
    fprintf(f, "%s: %s\n", file, nb_descriptor_error_format(&d->errors[i], line, sizeof line));
}
