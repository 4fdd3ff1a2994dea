/* Prometheus metrics (common/prom.h): the registry, the text exposition format 0.0.4, and the
 * one-thread HTTP/1.1 listener behind GET /metrics. Not here: which metrics a daemon exports
 * (gateway/metrics.c, worker/worker.c) or any other HTTP feature (keep-alive, chunking, gzip). */
#include "common/prom.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

typedef struct {
  char* values[NB_PROM_MAX_LABELS]; /* owned */
  double v;
} nb__prom_series_t;

typedef struct {
  char name[128];
  char help[256];
  nb_prom_type_t type;
  int n_labels;
  char labels[NB_PROM_MAX_LABELS][64];
  nb__prom_series_t* series;
  int n_series, cap_series;
  int warned; /* NB_PROM_MAX_SERIES was reached (said once) */
} nb__prom_family_t;

struct nb_prom {
  pthread_mutex_t mu; /* families and their series */
  nb__prom_family_t fam[NB_PROM_MAX_FAMILIES];
  int n_fam;
  nb_prom_collect_fn collect;
  void* collect_user;
  /* the listener: set by nb_prom_listen before its thread starts */
  int lfd, wake[2], port, started;
  pthread_t th;
};

/* ---- names, escaping, rendering -------------------------------------------------------------- */

static int nb__prom_name_ok(const char* s, int label) {
  if (!s || !*s || strlen(s) >= (label ? 64 : 128)) return 0;
  if (label && s[0] == '_' && s[1] == '_') return 0; /* reserved by Prometheus */
  for (const char* c = s; *c; c++) {
    int alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
    int digit = *c >= '0' && *c <= '9';
    if (!(alpha || (c > s && digit) || (!label && *c == ':'))) return 0;
  }
  return 1;
}

typedef struct {
  char* b;
  size_t n, cap;
  int oom;
} nb__prom_buf_t;

static void nb__prom_put(nb__prom_buf_t* o, const char* s, size_t n) {
  if (o->oom) return;
  if (o->n + n + 1 > o->cap) {
    size_t cap = o->cap ? o->cap : 4096;
    while (o->n + n + 1 > cap) cap *= 2;
    if (nb_realloc((void**)&o->b, cap, 1, "metrics text") != NB_OK) {
      o->oom = 1;
      return;
    }
    o->cap = cap;
  }
  memcpy(o->b + o->n, s, n);
  o->n += n;
  o->b[o->n] = 0;
}

static void nb__prom_puts(nb__prom_buf_t* o, const char* s) {
  nb__prom_put(o, s, strlen(s));
}

/* HELP text escapes \ and newline; a label value also ". */
static void nb__prom_escaped(nb__prom_buf_t* o, const char* s, int quote) {
  for (const char* c = s; *c; c++) {
    if (*c == '\\')
      nb__prom_puts(o, "\\\\");
    else if (*c == '\n')
      nb__prom_puts(o, "\\n");
    else if (quote && *c == '"')
      nb__prom_puts(o, "\\\"");
    else
      nb__prom_put(o, c, 1);
  }
}

/* A sample value as the format spells it: Go's ParseFloat reads %.17g back exactly. */
static void nb__prom_value(nb__prom_buf_t* o, double v) {
  char num[40];
  if (isnan(v))
    snprintf(num, sizeof num, "NaN");
  else if (isinf(v))
    snprintf(num, sizeof num, "%s", v > 0 ? "+Inf" : "-Inf");
  else
    snprintf(num, sizeof num, "%.17g", v);
  nb__prom_puts(o, num);
}

static void nb__prom_family_text(nb__prom_buf_t* o, const nb__prom_family_t* f) {
  nb__prom_puts(o, "# HELP ");
  nb__prom_puts(o, f->name);
  nb__prom_puts(o, " ");
  nb__prom_escaped(o, f->help, 0);
  nb__prom_puts(o, "\n# TYPE ");
  nb__prom_puts(o, f->name);
  nb__prom_puts(o, f->type == NB_PROM_COUNTER ? " counter\n" : " gauge\n");
  if (f->n_labels == 0 && f->n_series == 0) { /* shown at 0 until set */
    nb__prom_puts(o, f->name);
    nb__prom_puts(o, " 0\n");
    return;
  }
  for (int s = 0; s < f->n_series; s++) {
    nb__prom_puts(o, f->name);
    for (int l = 0; l < f->n_labels; l++) {
      nb__prom_puts(o, l ? "," : "{");
      nb__prom_puts(o, f->labels[l]);
      nb__prom_puts(o, "=\"");
      nb__prom_escaped(o, f->series[s].values[l], 1);
      nb__prom_puts(o, "\"");
    }
    nb__prom_puts(o, f->n_labels ? "} " : " ");
    nb__prom_value(o, f->series[s].v);
    nb__prom_puts(o, "\n");
  }
}

nb_status_t nb_prom_render(nb_prom_t* p, char** out, size_t* len) {
  if (!p || !out) return nb_error(NB_ERR_INVALID, "metrics: NULL argument");
  *out = NULL;
  nb__prom_buf_t o = {0};
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->n_fam; i++) nb__prom_family_text(&o, &p->fam[i]);
  pthread_mutex_unlock(&p->mu);
  if (!o.oom && !o.b) nb__prom_put(&o, "", 0); /* an empty registry: "" */
  if (o.oom) {
    nb_free(o.b);
    return nb_error(NB_ERR_NOMEM, "metrics: out of memory rendering the exposition");
  }
  *out = o.b;
  if (len) *len = o.n;
  return NB_OK;
}

/* ---- the registry -------------------------------------------------------------------------- */

nb_status_t nb_prom_create(nb_prom_t** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "metrics: NULL argument");
  nb_prom_t* p = NULL;
  NB_CHECK(nb_calloc((void**)&p, 1, sizeof *p, "metrics registry"));
  pthread_mutex_init(&p->mu, NULL);
  p->lfd = p->wake[0] = p->wake[1] = -1;
  *out = p;
  return NB_OK;
}

nb_status_t nb_prom_declare(nb_prom_t* p, const char* name, nb_prom_type_t type, const char* help,
                            const char* labels) {
  if (!p) return nb_error(NB_ERR_INVALID, "metrics: NULL registry");
  if (!nb__prom_name_ok(name, 0))
    return nb_error(NB_ERR_INVALID,
                    "metrics: '%s' is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, < 128 bytes)",
                    name ? name : "(null)");
  if (type != NB_PROM_COUNTER && type != NB_PROM_GAUGE)
    return nb_error(NB_ERR_INVALID, "metrics: %s: type %d is neither counter nor gauge", name,
                    (int)type);
  nb__prom_family_t f;
  memset(&f, 0, sizeof f);
  snprintf(f.name, sizeof f.name, "%s", name);
  snprintf(f.help, sizeof f.help, "%s", help ? help : "");
  f.type = type;
  for (const char* l = labels && *labels ? labels : NULL; l;) {
    const char* comma = strchr(l, ',');
    size_t n = comma ? (size_t)(comma - l) : strlen(l);
    if (f.n_labels == NB_PROM_MAX_LABELS)
      return nb_error(NB_ERR_INVALID, "metrics: %s: more than %d labels ('%s')", name,
                      NB_PROM_MAX_LABELS, labels);
    if (n >= sizeof f.labels[0])
      return nb_error(NB_ERR_INVALID, "metrics: %s: a label name of %zu bytes", name, n);
    memcpy(f.labels[f.n_labels], l, n);
    f.labels[f.n_labels][n] = 0;
    if (!nb__prom_name_ok(f.labels[f.n_labels], 1))
      return nb_error(NB_ERR_INVALID,
                      "metrics: %s: '%s' is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, not __*)",
                      name, f.labels[f.n_labels]);
    for (int k = 0; k < f.n_labels; k++)
      if (!strcmp(f.labels[k], f.labels[f.n_labels]))
        return nb_error(NB_ERR_INVALID, "metrics: %s: label '%s' twice", name, f.labels[k]);
    f.n_labels++;
    l = comma ? comma + 1 : NULL;
  }
  nb_status_t st = NB_OK;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->n_fam && st == NB_OK; i++)
    if (!strcmp(p->fam[i].name, name))
      st = nb_error(NB_ERR_INVALID, "metrics: %s is declared already", name);
  if (st == NB_OK && p->n_fam == NB_PROM_MAX_FAMILIES)
    st = nb_error(NB_ERR_NOMEM, "metrics: %s: a registry holds at most %d families", name,
                  NB_PROM_MAX_FAMILIES);
  if (st == NB_OK) p->fam[p->n_fam++] = f;
  pthread_mutex_unlock(&p->mu);
  return st;
}

/* The series of f with these values, created at 0 when absent (under p->mu). */
static nb_status_t nb__prom_series(nb__prom_family_t* f, const char* const* values,
                                   nb__prom_series_t** out) {
  for (int s = 0; s < f->n_series; s++) {
    int same = 1;
    for (int l = 0; l < f->n_labels && same; l++) same = !strcmp(f->series[s].values[l], values[l]);
    if (same) {
      *out = &f->series[s];
      return NB_OK;
    }
  }
  if (f->n_series == NB_PROM_MAX_SERIES) {
    if (!f->warned)
      NB_WARN(
          "metrics: %s has %d series, the most one family keeps: further label values are "
          "dropped (a label that takes unbounded values is a bug to report)",
          f->name, NB_PROM_MAX_SERIES);
    f->warned = 1;
    return nb_error(NB_ERR_NOMEM, "metrics: %s: more than %d series", f->name, NB_PROM_MAX_SERIES);
  }
  if (f->n_series == f->cap_series) {
    int cap = f->cap_series ? f->cap_series * 2 : 4;
    NB_CHECK(nb_realloc((void**)&f->series, (size_t)cap, sizeof *f->series, "metrics series"));
    f->cap_series = cap;
  }
  nb__prom_series_t* s = &f->series[f->n_series];
  memset(s, 0, sizeof *s);
  for (int l = 0; l < f->n_labels; l++) {
    size_t n = strlen(values[l]);
    nb_status_t st = nb_alloc((void**)&s->values[l], n + 1, 1, "metrics label");
    if (st != NB_OK) {
      for (int k = 0; k < l; k++) nb_free(s->values[k]);
      return st;
    }
    memcpy(s->values[l], values[l], n + 1);
  }
  f->n_series++;
  *out = s;
  return NB_OK;
}

static nb_status_t nb__prom_update(nb_prom_t* p, const char* name, const char* const* values,
                                   double v, int add) {
  if (!p) return NB_OK;
  if (!name) return nb_error(NB_ERR_INVALID, "metrics: NULL name");
  nb_status_t st = NB_OK;
  pthread_mutex_lock(&p->mu);
  nb__prom_family_t* f = NULL;
  for (int i = 0; i < p->n_fam && !f; i++)
    if (!strcmp(p->fam[i].name, name)) f = &p->fam[i];
  if (!f) {
    st = nb_error(NB_ERR_NOT_FOUND, "metrics: no family %s", name);
    goto out;
  }
  if (f->n_labels > 0 && !values) {
    st = nb_error(NB_ERR_INVALID, "metrics: %s needs %d label values", name, f->n_labels);
    goto out;
  }
  for (int l = 0; l < f->n_labels; l++)
    if (!values[l] || strlen(values[l]) > NB_PROM_MAX_VALUE) {
      st = nb_error(NB_ERR_INVALID, "metrics: %s: label %s: %s", name, f->labels[l],
                    values[l] ? "value longer than NB_PROM_MAX_VALUE bytes" : "NULL value");
      goto out;
    }
  if (add && f->type == NB_PROM_COUNTER && !(v >= 0 && isfinite(v))) {
    st = nb_error(NB_ERR_INVALID, "metrics: counter %s: cannot add %g", name, v);
    goto out;
  }
  nb__prom_series_t* s = NULL;
  st = nb__prom_series(f, values, &s);
  if (st == NB_OK) s->v = add ? s->v + v : v;
out:
  pthread_mutex_unlock(&p->mu);
  return st;
}

nb_status_t nb_prom_add(nb_prom_t* p, const char* name, const char* const* values, double v) {
  return nb__prom_update(p, name, values, v, 1);
}

nb_status_t nb_prom_set(nb_prom_t* p, const char* name, const char* const* values, double v) {
  return nb__prom_update(p, name, values, v, 0);
}

void nb_prom_set_collect(nb_prom_t* p, nb_prom_collect_fn fn, void* user) {
  if (!p) return;
  p->collect = fn;
  p->collect_user = user;
}

/* ---- the HTTP listener --------------------------------------------------------------------- */

static void nb__prom_send_all(int fd, const char* b, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; /* the scraper went away or stalled past SO_SNDTIMEO */
    b += w;
    n -= (size_t)w;
  }
}

static void nb__prom_reply(int fd, const char* status, const char* type, const char* body,
                           size_t n) {
  char head[256];
  int h = snprintf(head, sizeof head,
                   "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                   "Connection: close\r\n\r\n",
                   status, type, n, strncmp(status, "405", 3) ? "" : "Allow: GET\r\n");
  nb__prom_send_all(fd, head, (size_t)h);
  nb__prom_send_all(fd, body, n);
}

#define NB__PROM_CLIENT_MS 2000 /* what one connection may take to send its head, in all */

/* Waits until fd is readable before deadline (nb_now_ns). 1: readable, 0: not in time. */
static int nb__prom_readable(int fd, int64_t deadline) {
  for (;;) {
    int64_t left = (deadline - nb_now_ns()) / 1000000;
    if (left <= 0) return 0;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int r = poll(&pf, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    return r > 0;
  }
}

/* Reads a request head (up to the blank line) before deadline: a client that drips bytes is cut
 * off as one that sends none. Returns its length, 0 when the peer sent nothing complete in time
 * (closed unanswered), -1 when it is longer than the limit or holds a NUL. */
static ssize_t nb__prom_read_head(int fd, char* buf, size_t cap, int64_t deadline) {
  size_t n = 0;
  while (n < cap - 1) {
    if (!nb__prom_readable(fd, deadline)) return 0;
    ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    n += (size_t)r;
    buf[n] = 0;
    if (strstr(buf, "\r\n\r\n") || strstr(buf, "\n\n")) return (ssize_t)n;
    if (memchr(buf, 0, n)) return -1; /* NUL in a request head: malformed */
  }
  return -1;
}

int nb__prom_request_status(const char* head, size_t n) {
  /* request line: METHOD SP TARGET SP HTTP/1.D CRLF (or LF), strictly: one space each, no
   * control byte or NUL anywhere in the head */
  if (!head || n == 0 || n > NB_PROM_MAX_REQUEST || memchr(head, 0, n)) return 400;
  size_t i = 0, m = 0;
  while (i < n && head[i] >= 'A' && head[i] <= 'Z' && m < 16) i++, m++;
  if (m == 0 || m == 16 || i >= n || head[i] != ' ') return 400;
  size_t method_len = m, t0 = ++i;
  while (i < n && head[i] != ' ' && (unsigned char)head[i] > 0x20 && head[i] != 0x7f) i++;
  size_t target_len = i - t0;
  if (target_len == 0 || target_len > 1024 || head[t0] != '/' || i >= n || head[i] != ' ')
    return 400;
  i++;
  if (n - i < 8 || memcmp(head + i, "HTTP/1.", 7) || head[i + 7] < '0' || head[i + 7] > '9')
    return 400;
  i += 8;
  if (!(i < n && head[i] == '\n') && !(i + 1 < n && head[i] == '\r' && head[i + 1] == '\n'))
    return 400;
  if (method_len != 3 || memcmp(head, "GET", 3)) return 405;
  size_t path_len = 0;
  while (path_len < target_len && head[t0 + path_len] != '?') path_len++;
  if (path_len != 8 || memcmp(head + t0, "/metrics", 8)) return 404;
  return 200;
}

static void nb__prom_serve_one(nb_prom_t* p, int fd) {
  struct timeval tv = {.tv_sec = 2, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  static const char plain[] = "text/plain; charset=utf-8";
  char req[NB_PROM_MAX_REQUEST + 1];
  ssize_t n = nb__prom_read_head(fd, req, sizeof req, nb_now_ns() + NB__PROM_CLIENT_MS * 1000000ll);
  if (n == 0) return;
  int code = n < 0 ? 400 : nb__prom_request_status(req, (size_t)n);
  if (code == 400) {
    static const char bad[] = "bad request: expected GET /metrics HTTP/1.1\n";
    nb__prom_reply(fd, "400 Bad Request", plain, bad, sizeof bad - 1);
    return;
  }
  if (code == 405) {
    static const char body[] = "method not allowed: only GET\n";
    nb__prom_reply(fd, "405 Method Not Allowed", plain, body, sizeof body - 1);
    return;
  }
  if (code == 404) {
    static const char body[] = "not found: the metrics are at /metrics\n";
    nb__prom_reply(fd, "404 Not Found", plain, body, sizeof body - 1);
    return;
  }
  if (p->collect) p->collect(p, p->collect_user);
  char* text = NULL;
  size_t len = 0;
  if (nb_prom_render(p, &text, &len) != NB_OK) {
    static const char body[] = "out of memory\n";
    nb__prom_reply(fd, "500 Internal Server Error", plain, body, sizeof body - 1);
    return;
  }
  nb__prom_reply(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", text, len);
  nb_free(text);
}

static void* nb__prom_main(void* arg) {
  nb_prom_t* p = arg;
  for (;;) {
    struct pollfd pf[2] = {{.fd = p->lfd, .events = POLLIN}, {.fd = p->wake[0], .events = POLLIN}};
    int r = poll(pf, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || pf[1].revents) break;
    if (!(pf[0].revents & POLLIN)) continue;
    int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue; /* the client left before accept, or out of descriptors for now */
    nb__prom_serve_one(p, fd);
    /* a lingering close: what the client still sends (the rest of an oversized request) is
     * read and dropped until it closes, so that the answer is not lost to a reset */
    shutdown(fd, SHUT_WR);
    char junk[4096];
    size_t drained = 0;
    ssize_t got = 1;
    int64_t deadline = nb_now_ns() + NB__PROM_CLIENT_MS * 1000000ll;
    while (drained < 65536 && got > 0 && nb__prom_readable(fd, deadline)) {
      got = recv(fd, junk, sizeof junk, 0);
      if (got > 0) drained += (size_t)got;
    }
    close(fd);
  }
  return NULL;
}

/* "HOST:PORT" / "[V6]:PORT" into host and port text. */
static nb_status_t nb__prom_split(const char* addr, char* host, size_t hcap, char* port,
                                  size_t pcap) {
  const char* colon;
  if (addr[0] == '[') {
    const char* close = strchr(addr, ']');
    if (!close || close[1] != ':')
      return nb_error(NB_ERR_INVALID, "metrics: listen '%s': expected [V6ADDR]:PORT", addr);
    if ((size_t)(close - addr - 1) >= hcap)
      return nb_error(NB_ERR_INVALID, "metrics: listen '%s': host too long", addr);
    memcpy(host, addr + 1, (size_t)(close - addr - 1));
    host[close - addr - 1] = 0;
    colon = close + 1;
  } else {
    colon = strrchr(addr, ':');
    if (!colon || memchr(addr, ':', (size_t)(colon - addr)))
      return nb_error(NB_ERR_INVALID, "metrics: listen '%s': expected HOST:PORT", addr);
    if ((size_t)(colon - addr) >= hcap)
      return nb_error(NB_ERR_INVALID, "metrics: listen '%s': host too long", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
  }
  const char* ps = colon + 1;
  char* end = NULL;
  errno = 0;
  long v = strtol(ps, &end, 10);
  if (!*ps || *end || errno || v < 0 || v > 65535 || strlen(ps) >= pcap)
    return nb_error(NB_ERR_INVALID, "metrics: listen '%s': port '%s' is not 0..65535", addr, ps);
  snprintf(port, pcap, "%ld", v);
  if (!*host) snprintf(host, hcap, "127.0.0.1");
  return NB_OK;
}

nb_status_t nb_prom_listen(nb_prom_t* p, const char* addr) {
  if (!p || !addr) return nb_error(NB_ERR_INVALID, "metrics: NULL argument");
  if (p->started) return nb_error(NB_ERR_INVALID, "metrics: already listening on port %d", p->port);
  char host[256], port[8];
  NB_CHECK(nb__prom_split(addr, host, sizeof host, port, sizeof port));
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int gr = getaddrinfo(host, port, &hints, &ai);
  if (gr != 0)
    return nb_error(NB_ERR_UNAVAILABLE, "metrics: listen '%s': host '%s': %s", addr, host,
                    gai_strerror(gr));
  nb_status_t st = NB_OK;
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  int one = 1;
  if (fd < 0) {
    st = nb_error(NB_ERR_SYSTEM, "metrics: socket: %s", strerror(errno));
    goto fail;
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    int e = errno;
    st = nb_error(
        e == EADDRINUSE || e == EADDRNOTAVAIL || e == EACCES ? NB_ERR_UNAVAILABLE : NB_ERR_SYSTEM,
        "metrics: cannot listen on %s: %s", addr, strerror(e));
    goto fail;
  }
  if (listen(fd, 16) != 0) {
    st = nb_error(NB_ERR_SYSTEM, "metrics: listen on %s: %s", addr, strerror(errno));
    goto fail;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr*)&ss, &sl) != 0) {
    st = nb_error(NB_ERR_SYSTEM, "metrics: getsockname: %s", strerror(errno));
    goto fail;
  }
  p->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6*)&ss)->sin6_port
                                           : ((struct sockaddr_in*)&ss)->sin_port);
  if (pipe2(p->wake, O_CLOEXEC) != 0) {
    p->wake[0] = p->wake[1] = -1;
    st = nb_error(NB_ERR_SYSTEM, "metrics: pipe: %s", strerror(errno));
    goto fail;
  }
  p->lfd = fd;
  fd = -1;
  if (pthread_create(&p->th, NULL, nb__prom_main, p) != 0) {
    st = nb_error(NB_ERR_SYSTEM, "metrics: cannot start the listener thread");
    goto fail;
  }
  p->started = 1;
  freeaddrinfo(ai);
  NB_INFO(INIT, "metrics at http://%s%s%s:%d/metrics", strchr(host, ':') ? "[" : "", host,
          strchr(host, ':') ? "]" : "", p->port);
  return NB_OK;
fail:
  if (fd >= 0) close(fd);
  if (p->lfd >= 0) close(p->lfd);
  for (int i = 0; i < 2; i++)
    if (p->wake[i] >= 0) close(p->wake[i]);
  p->lfd = p->wake[0] = p->wake[1] = -1;
  p->port = 0;
  freeaddrinfo(ai);
  return st;
}

int nb_prom_port(const nb_prom_t* p) {
  return p && p->started ? p->port : 0;
}

void nb_prom_destroy(nb_prom_t* p) {
  if (!p) return;
  if (p->started) {
    ssize_t w;
    do w = write(p->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(p->th, NULL);
  }
  if (p->lfd >= 0) close(p->lfd);
  for (int i = 0; i < 2; i++)
    if (p->wake[i] >= 0) close(p->wake[i]);
  for (int i = 0; i < p->n_fam; i++) {
    for (int s = 0; s < p->fam[i].n_series; s++)
      for (int l = 0; l < p->fam[i].n_labels; l++) nb_free(p->fam[i].series[s].values[l]);
    nb_free(p->fam[i].series);
  }
  pthread_mutex_destroy(&p->mu);
  nb_free(p);
}
