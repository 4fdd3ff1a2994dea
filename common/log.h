/* Logging with levels and subsystems, NCCL-style: NB_WARN always prints; NB_INFO and NB_TRACE
 * print when NB_DEBUG=INFO|TRACE and the subsystem is enabled by NB_DEBUG_SUBSYS (a comma list,
 * default ALL; a leading ^ excludes). Lines go to stderr (or NB_DEBUG_FILE) prefixed with
 * "host:pid [cluster/rank]", or with NB_LOG_FORMAT=json as one JSON object per line
 * (docs/operations.md, *Logs*). Never log keys, tokens or payload bytes. */
#ifndef NB_COMMON_LOG_H
#define NB_COMMON_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  NB_LOG_NONE = 0,
  NB_LOG_WARN = 1,
  NB_LOG_INFO = 2,
  NB_LOG_TRACE = 3,
} nb_log_level_t;

/* Subsystems: one bit each; names as accepted by NB_DEBUG_SUBSYS. */
typedef enum {
  NB_SUB_INIT = 1u << 0,   /* INIT */
  NB_SUB_ENV = 1u << 1,    /* ENV: parameters and their sources */
  NB_SUB_CODEC = 1u << 2,  /* CODEC */
  NB_SUB_WIRE = 1u << 3,   /* WIRE: links, chunks, streams */
  NB_SUB_RPC = 1u << 4,    /* RPC: gRPC calls */
  NB_SUB_SEC = 1u << 5,    /* SEC: certificates, sealing (never key material) */
  NB_SUB_INTRA = 1u << 6,  /* INTRA: collectives */
  NB_SUB_TRAIN = 1u << 7,  /* TRAIN */
  NB_SUB_SCHED = 1u << 8,  /* SCHED: the adaptive scheduler */
  NB_SUB_JOB = 1u << 9,    /* JOB: descriptors, gateway, launchers */
  NB_SUB_DATA = 1u << 10,  /* DATA */
  NB_SUB_BENCH = 1u << 11, /* BENCH */
  NB_SUB_ALL = 0xffffffffu,
} nb_log_sub_t;

/* Sets the "[cluster/rank]" part of every line. cluster is copied (up to 31 bytes). */
void nb_log_set_identity(const char* cluster, int rank);

/* True when a message of this level and subsystem would be printed. Reads the environment on
 * first use. Thread-safe. */
int nb_log_enabled(nb_log_level_t level, uint32_t sub);

/* Prints one line (a trailing newline is added). Thread-safe: lines do not interleave. */
void nb_log(nb_log_level_t level, uint32_t sub, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* For tests: re-read NB_DEBUG / NB_DEBUG_SUBSYS / NB_DEBUG_FILE / NB_LOG_FORMAT now. */
void nb_log_reload(void);

/* Checks the logger's environment that has a fixed set of values: NB_LOG_FORMAT must be empty,
 * "text" or "json" (any case). A program's main calls it first and stops on an error; the
 * logger itself falls back to text (with one WARN) for a value it does not know. Returns NB_OK
 * or NB_ERR_CONFIG, the message naming the variable, its value and what is accepted. */
nb_status_t nb_log_check_env(void);

/* One log line's parts, as nb_log_format_json takes them. Strings borrowed; cluster NULL: no
 * identity set (cluster and rank left out). */
typedef struct {
  int64_t wall_ns; /* Unix time in nanoseconds */
  nb_log_level_t level;
  uint32_t sub; /* its subsystem; left out for NB_LOG_WARN */
  const char* host;
  int pid;
  const char* cluster;
  int rank;
  const char* file; /* base name */
  int line;
  const char* msg; /* any bytes up to NUL: control characters, quotes, invalid UTF-8 */
} nb_log_record_t;

/* The JSON line of r into out (cap bytes, at least 256): {"ts":"2026-01-02T03:04:05.678Z",
 * "level":"INFO","sub":"JOB","host":..,"pid":..,"cluster":..,"rank":..,"file":..,"line":..,
 * "msg":..} and a newline, NUL-terminated. Strings are escaped so that any input gives valid
 * JSON: '"', '\\' and control characters escaped, bytes that are not UTF-8 replaced by U+FFFD;
 * msg is cut at a character when the line would not fit. Returns the length written (without
 * the NUL), 0 when cap < 256. Thread-safe. */
size_t nb_log_format_json(const nb_log_record_t* r, char* out, size_t cap);

#define NB_WARN(...) nb_log(NB_LOG_WARN, NB_SUB_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define NB_INFO(sub, ...)                                                 \
  do {                                                                    \
    if (nb_log_enabled(NB_LOG_INFO, NB_SUB_##sub))                        \
      nb_log(NB_LOG_INFO, NB_SUB_##sub, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define NB_TRACE(sub, ...)                                                 \
  do {                                                                     \
    if (nb_log_enabled(NB_LOG_TRACE, NB_SUB_##sub))                        \
      nb_log(NB_LOG_TRACE, NB_SUB_##sub, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
