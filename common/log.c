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
NB_PARAM_STRING(LogFormat, "NB_LOG_FORMAT", "text",
                "log line format: text (host:pid [cluster/rank] ...) or json (one JSON object per "
                "line: ts, level, sub, host, pid, cluster, rank, file, line, msg)")

static pthread_mutex_t nb__log_mu = PTHREAD_MUTEX_INITIALIZER;
static int nb__log_loaded;
static nb_log_level_t nb__log_level = NB_LOG_WARN;
static uint32_t nb__log_subs = NB_SUB_ALL;
static FILE* nb__log_out;
static char nb__log_host[64];
static char nb__log_ident[48];
static char nb__log_cluster[32];
static int nb__log_rank, nb__log_has_ident;
static int nb__log_json;
static char nb__log_bad_format[64]; /* an NB_LOG_FORMAT not understood: warned once, then "" */

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
  const char* fmt = getenv("NB_LOG_FORMAT");
  nb__log_json = fmt && strcasecmp(fmt, "json") == 0;
  nb__log_bad_format[0] = 0;
  if (fmt && *fmt && !nb__log_json && strcasecmp(fmt, "text") != 0)
    snprintf(nb__log_bad_format, sizeof nb__log_bad_format, "%s", fmt);
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
  snprintf(nb__log_cluster, sizeof nb__log_cluster, "%s", cluster ? cluster : "-");
  nb__log_rank = rank;
  nb__log_has_ident = 1;
  pthread_mutex_unlock(&nb__log_mu);
}

int nb_log_enabled(nb_log_level_t level, uint32_t sub) {
  if (!__atomic_load_n(&nb__log_loaded, __ATOMIC_ACQUIRE)) nb_log_reload();
  return level <= nb__log_level && (level == NB_LOG_WARN || (nb__log_subs & sub));
}

nb_status_t nb_log_check_env(void) {
  const char* fmt = getenv("NB_LOG_FORMAT");
  if (!fmt || !*fmt || !strcasecmp(fmt, "text") || !strcasecmp(fmt, "json")) return NB_OK;
  return nb_error(NB_ERR_CONFIG, "NB_LOG_FORMAT=%.64s: expected text or json", fmt);
}

/* ---- JSON lines ---------------------------------------------------------------------------- */

/* Appends to a fixed buffer; a piece that does not fit whole is not appended and sets full. */
typedef struct {
  char* p;
  size_t n, cap; /* cap: room for text, the NUL excluded */
  int full;
} nb__jbuf_t;

static void nb__jput(nb__jbuf_t* b, const char* s, size_t len) {
  if (b->full || len > b->cap - b->n) {
    b->full = 1;
    return;
  }
  memcpy(b->p + b->n, s, len);
  b->n += len;
}

static void nb__jputs(nb__jbuf_t* b, const char* s) {
  nb__jput(b, s, strlen(s));
}

/* The length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0. */
static size_t nb__utf8_len(const unsigned char* s) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else
    return 0;
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  return n;
}

/* A JSON string of s; reserve: bytes kept free after it (the rest of the line). Stops at the
 * last whole character that fits. */
static void nb__jstr(nb__jbuf_t* b, const char* s, size_t reserve) {
  nb__jput(b, "\"", 1);
  if (b->full) return;
  size_t cap = b->cap;
  /* room for the closing quote and the reserve; none left: the string stays empty */
  b->cap = cap >= b->n + 1 + reserve ? cap - 1 - reserve : b->n;
  const unsigned char* p = (const unsigned char*)(s ? s : "");
  while (*p && !b->full) {
    unsigned char c = *p;
    char esc[8];
    size_t len = nb__utf8_len(p);
    if (len == 0) {
      nb__jput(b, "\\ufffd", 6); /* not UTF-8: one replacement per byte */
      p++;
      continue;
    }
    if (len > 1) {
      nb__jput(b, (const char*)p, len);
      p += len;
      continue;
    }
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      nb__jput(b, esc, 2);
    } else if (c == '\n') {
      nb__jput(b, "\\n", 2);
    } else if (c == '\t') {
      nb__jput(b, "\\t", 2);
    } else if (c == '\r') {
      nb__jput(b, "\\r", 2);
    } else if (c < 0x20 || c == 0x7f) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      nb__jput(b, esc, 6);
    } else {
      nb__jput(b, (const char*)p, 1);
    }
    p++;
  }
  b->full = 0; /* a cut string still closes */
  b->cap = cap;
  nb__jput(b, "\"", 1);
}

size_t nb_log_format_json(const nb_log_record_t* r, char* out, size_t cap) {
  if (!out || cap < 256) return 0;
  nb__jbuf_t b = {.p = out, .cap = cap - 1};
  char num[96];
  time_t sec = (time_t)(r->wall_ns / 1000000000);
  long ms = (long)(r->wall_ns % 1000000000 / 1000000);
  if (ms < 0) sec--, ms += 1000;
  struct tm tm;
  gmtime_r(&sec, &tm);
  snprintf(num, sizeof num, "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\"",
           tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms,
           r->level == NB_LOG_WARN   ? "WARN"
           : r->level == NB_LOG_INFO ? "INFO"
                                     : "TRACE");
  nb__jputs(&b, num);
  if (r->level != NB_LOG_WARN) {
    nb__jputs(&b, ",\"sub\":");
    nb__jstr(&b, nb__sub_name(r->sub), 0);
  }
  /* the fixed fields stay short: the message gets what is left */
  nb__jputs(&b, ",\"host\":");
  nb__jstr(&b, r->host, 200);
  snprintf(num, sizeof num, ",\"pid\":%d", r->pid);
  nb__jputs(&b, num);
  if (r->cluster) {
    nb__jputs(&b, ",\"cluster\":");
    nb__jstr(&b, r->cluster, 160);
    snprintf(num, sizeof num, ",\"rank\":%d", r->rank);
    nb__jputs(&b, num);
  }
  nb__jputs(&b, ",\"file\":");
  nb__jstr(&b, r->file, 120);
  snprintf(num, sizeof num, ",\"line\":%d,\"msg\":", r->line);
  nb__jputs(&b, num);
  nb__jstr(&b, r->msg, 3);
  nb__jputs(&b, "}\n");
  out[b.n] = 0;
  return b.n;
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
  pthread_mutex_lock(&nb__log_mu);
  if (nb__log_bad_format[0]) { /* nb_log_check_env stops a program first; a library user: once */
    fprintf(nb__log_out,
            "NB WARN NB_LOG_FORMAT=%s: expected text or json; logging as text (common/log.c)\n",
            nb__log_bad_format);
    nb__log_bad_format[0] = 0;
  }
  if (nb__log_json) {
    /* every byte of msg may grow to 6 in JSON */
    static char line_buf[6 * sizeof msg + 1024];
    nb_log_record_t r = {
        .wall_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec,
        .level = level,
        .sub = sub,
        .host = nb__log_host,
        .pid = (int)getpid(),
        .cluster = nb__log_has_ident ? nb__log_cluster : NULL,
        .rank = nb__log_rank,
        .file = base,
        .line = line,
        .msg = msg,
    };
    size_t n = nb_log_format_json(&r, line_buf, sizeof line_buf);
    fwrite(line_buf, 1, n, nb__log_out);
  } else {
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char* lvl = level == NB_LOG_WARN ? "WARN" : level == NB_LOG_INFO ? "INFO" : "TRACE";
    fprintf(nb__log_out, "%02d:%02d:%02d.%03ld %s:%d [%s] NB %s %s%s%s (%s:%d)\n", tm.tm_hour,
            tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, nb__log_host, (int)getpid(),
            nb__log_ident[0] ? nb__log_ident : "-", lvl,
            level == NB_LOG_WARN ? "" : nb__sub_name(sub), level == NB_LOG_WARN ? "" : " ", msg,
            base, line);
  }
  fflush(nb__log_out);
  pthread_mutex_unlock(&nb__log_mu);
}
