/* Job descriptors: the versioned JSON document (`"apiVersion": "nebula/v1"`, `"kind":
 * "TrainingJob"`) a researcher submits, parsed with jansson and checked strictly into an
 * nb_job_config_t. Field reference: docs/descriptor.md. Signatures and ACLs live elsewhere. */
#ifndef NB_JOBS_DESCRIPTOR_H
#define NB_JOBS_DESCRIPTOR_H

#include <stddef.h>
#include <stdio.h>

#include "common/status.h"
#include "jobs/job_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_DESCRIPTOR_API_VERSION "nebula/v1"
#define NB_DESCRIPTOR_KIND "TrainingJob"
#define NB_DESCRIPTOR_MAX_BYTES (1u << 20) /* larger documents are refused unread */
#define NB_DESCRIPTOR_MAX_ERRORS 32

/* One problem found in a descriptor. */
typedef struct {
  char path[192]; /* JSON path of the field at fault: "$.spec.clusters[1].workers"; "$" = whole */
  char message[384]; /* what was expected and what was found */
  int line, column;  /* 1-based position for syntax errors; 0 when the parser had none */
} nb_descriptor_error_t;

/* Every problem found, in document order (structure first, then cross-field checks). */
typedef struct {
  int count;   /* entries used in errors[] */
  int dropped; /* further errors that did not fit */
  nb_descriptor_error_t errors[NB_DESCRIPTOR_MAX_ERRORS];
} nb_descriptor_diag_t;

/* Parses and validates a descriptor held in memory.
 * text: borrowed, len bytes, need not be NUL-terminated. out: filled with every setting, defaults
 * for what the document leaves out; undefined when the result is not NB_OK. diag: optional
 * (NULL ok), receives every error found.
 * Returns NB_OK; NB_ERR_CONFIG when the document is invalid (the first error is also in
 * nb_error_last()); NB_ERR_INVALID for NULL text/out. Thread-safe (no shared state). */
nb_status_t nb_descriptor_parse(const char* text, size_t len, nb_job_config_t* out,
                                nb_descriptor_diag_t* diag);

/* nb_descriptor_parse() on the contents of a file. Returns as nb_descriptor_parse(), plus
 * NB_ERR_IO when the file cannot be read and NB_ERR_CONFIG when it exceeds
 * NB_DESCRIPTOR_MAX_BYTES (both also reported in diag with path "$"). */
nb_status_t nb_descriptor_load(const char* path, nb_job_config_t* out, nb_descriptor_diag_t* diag);

/* The normalized descriptor of cfg: every field present, defaults written out, in the order of
 * docs/descriptor.md, indented with 2 spaces. Parsing it gives back cfg exactly (numbers are held
 * to 15 significant digits by the parser, which is also how they are printed).
 * out: receives a NUL-terminated string the caller frees with free().
 * Returns NB_OK, NB_ERR_NOMEM, NB_ERR_INVALID (NULL argument). Thread-safe. */
nb_status_t nb_descriptor_to_json(const nb_job_config_t* cfg, char** out);

/* Formats one error as a single line: "line 3, column 7: ..." for syntax errors, otherwise
 * "$.spec.x: ...". Writes at most n bytes into buf (borrowed) and returns buf. */
const char* nb_descriptor_error_format(const nb_descriptor_error_t* e, char* buf, size_t n);

/* Appends one error to d (path and msg are copied, truncated to fit; line and column 0 when
 * there is no position); once d holds NB_DESCRIPTOR_MAX_ERRORS it counts the error as dropped.
 * d: borrowed, NULL ignored. Not thread-safe on one d. */
void nb_descriptor_diag_add(nb_descriptor_diag_t* d, const char* path, int line, int column,
                            const char* msg);

/* Writes each error of d to f as "<file>: <error>", one line each (what the commands print for
 * a descriptor that does not load). file and d: borrowed. */
void nb_descriptor_diag_print(FILE* f, const char* file, const nb_descriptor_diag_t* d);

/* Names used in descriptors for the enumerations of job_config.h ("outer", "fp16", ...). */
const char* nb_job_sync_name(nb_job_sync_t m);
const char* nb_job_values_name(nb_job_values_t v);
const char* nb_job_task_name(nb_job_task_t t);
const char* nb_job_device_name(nb_job_device_t d);

#ifdef __cplusplus
}
#endif
#endif
