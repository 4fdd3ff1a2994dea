/* The logger behind NB_WARN / NB_INFO / NB_TRACE. Configuration comes from the environment once;
 * it is deliberately not a general logging framework (no sinks, no rotation). */
#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/param.h"

/* The logger's own variables, declared in the registry so that `nebula env` lists them. They are
 * read here with getenv, not through nb_param_*: a parameter's first read logs its value, and
 * the logger reading its level through the registry would take the registry's lock twice. */
NB_PARAM_STRING(LogLevel, "NB_DEBUG", "WARN", "log level: NONE, WARN, INFO or TRACE")
NB_PARAM_STRING(LogSubsys, "NB_DEBUG_SUBSYS", "ALL",
                "subsystems logged at INFO/TRACE: comma list of INIT ENV CODEC WIRE RPC SEC INTRA "
                "TRAIN SCHED JOB DATA BENCH; a leading ^ excludes")
NB_PARAM_STRING(LogFile, "NB_DEBUG_FILE", "", "append log lines to this file (empty: stderr)")

static pthread_mutex_t nb__log_mu = PTHREAD_MUTEX_INITIALIZER;
static int nb__log_loaded;
static nb_log_level_t nb__log_level = NB_LOG_WARN;
static uint32_t nb__log_subs = NB_SUB_ALL;
static FILE* nb__log_out;
static char nb__log_host[64];
static char nb__log_ident[48];

static const struct {
  const char* name;
  uint32_t bit;
} nb__subs[] = {
    {"INIT", NB_SUB_INIT},   {"ENV", NB_SUB_ENV}, {"CODEC", NB_SUB_CODEC}, {"WIRE", NB_SUB_WIRE},
    {"RPC", NB_SUB_RPC},     {"SEC", NB_SUB_SEC}, {"INTRA", NB_SUB_INTRA}, {"TRAIN", NB_SUB_TRAIN},
    {"SCHED", NB_SUB_SCHED}, {"JOB", NB_SUB_JOB}, {"DATA", NB_SUB_DATA},   {"BENCH", NB_SUB_BENCH},
    {"ALL", NB_SUB_ALL},
};

static const char* nb__sub_name(uint32_t bit) {
  for (size_t i = 0; i < sizeof nb__subs / sizeof nb__subs[0]; i++)
    if (nb__subs[i].bit == bit) return nb__subs[i].name;
  return "";
}

static uint32_t nb__parse_subs(const char* s) {
  int exclude = s[0] == '^';
  if (exclude) s++;
  uint32_t mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  char* save = NULL;
  for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    for (size_t i = 0; i < sizeof nb__subs / sizeof nb__subs[0]; i++)
      if (strcasecmp(tok, nb__subs[i].name) == 0) mask |= nb__subs[i].bit;
  }
  return exclude ? ~mask : mask;
}

static void nb__log_load_locked(void) {
  const char* lv = getenv("NB_DEBUG");
  nb__log_level = NB_LOG_WARN;
  if (lv) {
    if (strcasecmp(lv, "NONE") == 0)
      nb__log_level = NB_LOG_NONE;
    else if (strcasecmp(lv, "INFO") == 0)
      nb__log_level = NB_LOG_INFO;
    else if (strcasecmp(lv, "TRACE") == 0)
      nb__log_level = NB_LOG_TRACE;
  }
  const char* subs = getenv("NB_DEBUG_SUBSYS");
  nb__log_subs = subs && *subs ? nb__parse_subs(subs) : NB_SUB_ALL;
  if (nb__log_out && nb__log_out != stderr) fclose(nb__log_out);
  nb__log_out = stderr;
  const char* file = getenv("NB_DEBUG_FILE");
  if (file && *file) {
    FILE* f = fopen(file, "a");
    if (f) nb__log_out = f;
  }
  if (gethostname(nb__log_host, sizeof nb__log_host) != 0) strcpy(nb__log_host, "?");
  nb__log_host[sizeof nb__log_host - 1] = '\0';
  char* dot = strchr(nb__log_host, '.');
  if (dot) *dot = '\0';
  nb__log_loaded = 1;
}

void nb_log_reload(void) {
  pthread_mutex_lock(&nb__log_mu);
  nb__log_load_locked();
  pthread_mutex_unlock(&nb__log_mu);
}

void nb_log_set_identity(const char* cluster, int rank) {
  pthread_mutex_lock(&nb__log_mu);
  snprintf(nb__log_ident, sizeof nb__log_ident, "%.31s/%d", cluster ? cluster : "-", rank);
  pthread_mutex_unlock(&nb__log_mu);
}

int nb_log_enabled(nb_log_level_t level, uint32_t sub) {
  if (!__atomic_load_n(&nb__log_loaded, __ATOMIC_ACQUIRE)) nb_log_reload();
  return level <= nb__log_level && (level == NB_LOG_WARN || (nb__log_subs & sub));
}

void nb_log(nb_log_level_t level, uint32_t sub, const char* file, int line, const char* fmt, ...) {
  if (!nb_log_enabled(level, sub)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  pthread_mutex_lock(&nb__log_mu);
  const char* lvl = level == NB_LOG_WARN ? "WARN" : level == NB_LOG_INFO ? "INFO" : "TRACE";
  fprintf(nb__log_out, "%02d:%02d:%02d.%03ld %s:%d [%s] NB %s %s%s%s (%s:%d)\n", tm.tm_hour,
          tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, nb__log_host, (int)getpid(),
          nb__log_ident[0] ? nb__log_ident : "-", lvl,
          level == NB_LOG_WARN ? "" : nb__sub_name(sub), level == NB_LOG_WARN ? "" : " ", msg, base,
          line);
  fflush(nb__log_out);
  pthread_mutex_unlock(&nb__log_mu);
}
