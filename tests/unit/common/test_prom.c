/* common/prom.h: the exposition text (families, labels, escaping, values), refused names and
 * updates, updates from many threads summing exactly, and the HTTP listener on 127.0.0.1:0 read
 * by a real socket client: 200 with the text and its content type, 404, 405, 400 for a malformed
 * or oversized request, one answer per connection. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "common/prom.h"

static void test_format(void** state) {
  (void)state;
  nb_prom_t* p = NULL;
  assert_int_equal(nb_prom_create(&p), NB_OK);
  assert_int_equal(nb_prom_declare(p, "nb_things_total", NB_PROM_COUNTER, "Things seen.", NULL),
                   NB_OK);
  assert_int_equal(nb_prom_declare(p, "nb_jobs", NB_PROM_GAUGE, "Jobs by state.", "state"), NB_OK);
  assert_int_equal(
      nb_prom_declare(p, "nb_calls_total", NB_PROM_COUNTER, "Calls.", "method,outcome"), NB_OK);
  assert_int_equal(nb_prom_declare(p, "nb_ratio", NB_PROM_GAUGE, "A ratio.", ""), NB_OK);
  char* t = NULL;
  assert_int_equal(nb_prom_render(p, &t, NULL), NB_OK);
  /* unset families: without labels at 0, with labels no series */
  assert_string_equal(t,
                      "# HELP nb_things_total Things seen.\n# TYPE nb_things_total counter\n"
                      "nb_things_total 0\n"
                      "# HELP nb_jobs Jobs by state.\n# TYPE nb_jobs gauge\n"
                      "# HELP nb_calls_total Calls.\n# TYPE nb_calls_total counter\n"
                      "# HELP nb_ratio A ratio.\n# TYPE nb_ratio gauge\nnb_ratio 0\n");
  nb_free(t);
  assert_int_equal(nb_prom_add(p, "nb_things_total", NULL, 2), NB_OK);
  assert_int_equal(nb_prom_add(p, "nb_things_total", NULL, 3), NB_OK);
  assert_int_equal(nb_prom_set(p, "nb_jobs", (const char*[]){"running"}, 4), NB_OK);
  assert_int_equal(nb_prom_set(p, "nb_jobs", (const char*[]){"failed"}, 1), NB_OK);
  assert_int_equal(nb_prom_set(p, "nb_jobs", (const char*[]){"running"}, 3), NB_OK);
  assert_int_equal(nb_prom_add(p, "nb_calls_total", (const char*[]){"Propose", "ok"}, 1), NB_OK);
  assert_int_equal(nb_prom_add(p, "nb_calls_total", (const char*[]){"Propose", "UNAVAILABLE"}, 1),
                   NB_OK);
  assert_int_equal(nb_prom_add(p, "nb_calls_total", (const char*[]){"Propose", "ok"}, 1), NB_OK);
  assert_int_equal(nb_prom_set(p, "nb_ratio", NULL, 0.1), NB_OK);
  size_t len = 0;
  assert_int_equal(nb_prom_render(p, &t, &len), NB_OK);
  assert_int_equal(len, strlen(t));
  assert_string_equal(t,
                      "# HELP nb_things_total Things seen.\n# TYPE nb_things_total counter\n"
                      "nb_things_total 5\n"
                      "# HELP nb_jobs Jobs by state.\n# TYPE nb_jobs gauge\n"
                      "nb_jobs{state=\"running\"} 3\nnb_jobs{state=\"failed\"} 1\n"
                      "# HELP nb_calls_total Calls.\n# TYPE nb_calls_total counter\n"
                      "nb_calls_total{method=\"Propose\",outcome=\"ok\"} 2\n"
                      "nb_calls_total{method=\"Propose\",outcome=\"UNAVAILABLE\"} 1\n"
                      "# HELP nb_ratio A ratio.\n# TYPE nb_ratio gauge\n"
                      "nb_ratio 0.10000000000000001\n");
  nb_free(t);
  /* the values Prometheus spells in words */
  assert_int_equal(nb_prom_set(p, "nb_ratio", NULL, NAN), NB_OK);
  assert_int_equal(nb_prom_render(p, &t, NULL), NB_OK);
  assert_non_null(strstr(t, "\nnb_ratio NaN\n"));
  nb_free(t);
  assert_int_equal(nb_prom_set(p, "nb_ratio", NULL, -INFINITY), NB_OK);
  assert_int_equal(nb_prom_render(p, &t, NULL), NB_OK);
  assert_non_null(strstr(t, "\nnb_ratio -Inf\n"));
  nb_free(t);
  nb_prom_destroy(p);
}

static void test_escaping(void** state) {
  (void)state;
  nb_prom_t* p = NULL;
  assert_int_equal(nb_prom_create(&p), NB_OK);
  assert_int_equal(
      nb_prom_declare(p, "nb_esc", NB_PROM_GAUGE, "back\\slash and\nnewline \"q\"", "reason"),
      NB_OK);
  assert_int_equal(nb_prom_set(p, "nb_esc", (const char*[]){"a\"b\\c\nd}e,f=g"}, 1), NB_OK);
  char* t = NULL;
  assert_int_equal(nb_prom_render(p, &t, NULL), NB_OK);
  /* HELP: \ and newline escaped, " kept; label values also " */
  assert_string_equal(t,
                      "# HELP nb_esc back\\\\slash and\\nnewline \"q\"\n# TYPE nb_esc gauge\n"
                      "nb_esc{reason=\"a\\\"b\\\\c\\nd}e,f=g\"} 1\n");
  nb_free(t);
  nb_prom_destroy(p);
}

static void test_refusals(void** state) {
  (void)state;
  nb_prom_t* p = NULL;
  assert_int_equal(nb_prom_create(&p), NB_OK);
  const char* bad_names[] = {"", "1abc", "a-b", "a b", "é"};
  for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
    assert_int_equal(nb_prom_declare(p, bad_names[i], NB_PROM_GAUGE, "x", NULL), NB_ERR_INVALID);
    assert_non_null(strstr(nb_error_last(), "not a metric name"));
  }
  assert_int_equal(nb_prom_declare(p, NULL, NB_PROM_GAUGE, "x", NULL), NB_ERR_INVALID);
  assert_int_equal(nb_prom_declare(p, "ns:ok_name", NB_PROM_GAUGE, "x", NULL), NB_OK);
  assert_int_equal(nb_prom_declare(p, "l1", NB_PROM_GAUGE, "x", "a:b"), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "not a label name"));
  assert_int_equal(nb_prom_declare(p, "l2", NB_PROM_GAUGE, "x", "__name"), NB_ERR_INVALID);
  assert_int_equal(nb_prom_declare(p, "l3", NB_PROM_GAUGE, "x", "a,b,c"), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "more than 2 labels"));
  assert_int_equal(nb_prom_declare(p, "l4", NB_PROM_GAUGE, "x", "a,a"), NB_ERR_INVALID);
  assert_int_equal(nb_prom_declare(p, "l5", NB_PROM_GAUGE, "x", "a,"), NB_ERR_INVALID);
  assert_int_equal(nb_prom_declare(p, "l6", (nb_prom_type_t)7, "x", NULL), NB_ERR_INVALID);
  assert_int_equal(nb_prom_declare(p, "ns:ok_name", NB_PROM_COUNTER, "x", NULL), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "declared already"));

  assert_int_equal(nb_prom_declare(p, "c_total", NB_PROM_COUNTER, "x", "k"), NB_OK);
  assert_int_equal(nb_prom_add(p, "nope", NULL, 1), NB_ERR_NOT_FOUND);
  assert_non_null(strstr(nb_error_last(), "no family nope"));
  assert_int_equal(nb_prom_add(p, "c_total", NULL, 1), NB_ERR_INVALID);
  assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){NULL}, 1), NB_ERR_INVALID);
  assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){"v"}, -1), NB_ERR_INVALID);
  assert_non_null(strstr(nb_error_last(), "cannot add"));
  assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){"v"}, NAN), NB_ERR_INVALID);
  char longv[NB_PROM_MAX_VALUE + 2];
  memset(longv, 'x', sizeof longv - 1);
  longv[sizeof longv - 1] = 0;
  assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){longv}, 1), NB_ERR_INVALID);
  longv[NB_PROM_MAX_VALUE] = 0; /* exactly the limit: fine */
  assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){longv}, 1), NB_OK);
  /* a NULL registry is "metrics off" */
  assert_int_equal(nb_prom_add(NULL, "c_total", NULL, 1), NB_OK);
  assert_int_equal(nb_prom_set(NULL, "anything", NULL, 1), NB_OK);
  /* the series limit drops further values instead of growing without bound */
  char v[16];
  for (int i = 1; i < NB_PROM_MAX_SERIES; i++) {
    snprintf(v, sizeof v, "v%d", i);
    assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){v}, 1), NB_OK);
  }
  assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){"one-more"}, 1), NB_ERR_NOMEM);
  assert_int_equal(nb_prom_add(p, "c_total", (const char*[]){"v7"}, 1), NB_OK); /* existing */
  for (int i = 0; i < NB_PROM_MAX_FAMILIES; i++) {
    char n[32];
    snprintf(n, sizeof n, "fam_%d", i);
    nb_status_t st = nb_prom_declare(p, n, NB_PROM_GAUGE, "x", NULL);
    if (st != NB_OK) {
      assert_int_equal(st, NB_ERR_NOMEM);
      assert_int_equal(i, NB_PROM_MAX_FAMILIES - 2); /* ns:ok_name and c_total came first */
      break;
    }
  }
  nb_prom_destroy(p);
  nb_prom_destroy(NULL);
}

/* ---- threads ---- */

#define NB_T_THREADS 8
#define NB_T_ADDS 20000

typedef struct {
  nb_prom_t* p;
  int id;
} adder_t;

static void* adder(void* arg) {
  adder_t* a = arg;
  const char* lab[] = {a->id % 2 ? "odd" : "even"};
  for (int i = 0; i < NB_T_ADDS; i++) {
    if (nb_prom_add(a->p, "nb_adds_total", lab, 1) != NB_OK) return (void*)1;
    if (nb_prom_add(a->p, "nb_all_total", NULL, 0.5) != NB_OK) return (void*)1;
  }
  return NULL;
}

/* the value of the line that starts with `series ` in text, NAN when absent */
static double value_of(const char* text, const char* series) {
  size_t n = strlen(series);
  for (const char* l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, series, n) && l[n] == ' ') return strtod(l + n + 1, NULL);
  return NAN;
}

static void test_threads(void** state) {
  (void)state;
  nb_prom_t* p = NULL;
  assert_int_equal(nb_prom_create(&p), NB_OK);
  assert_int_equal(nb_prom_declare(p, "nb_adds_total", NB_PROM_COUNTER, "adds", "parity"), NB_OK);
  assert_int_equal(nb_prom_declare(p, "nb_all_total", NB_PROM_COUNTER, "all", NULL), NB_OK);
  pthread_t th[NB_T_THREADS];
  adder_t a[NB_T_THREADS];
  for (int i = 0; i < NB_T_THREADS; i++) {
    a[i] = (adder_t){p, i};
    assert_int_equal(pthread_create(&th[i], NULL, adder, &a[i]), 0);
  }
  /* renders while the adders run see monotone counts */
  double last = 0;
  for (int k = 0; k < 50; k++) {
    char* t = NULL;
    assert_int_equal(nb_prom_render(p, &t, NULL), NB_OK);
    double v = value_of(t, "nb_all_total");
    assert_false(isnan(v));
    assert_true(v >= last);
    last = v;
    nb_free(t);
  }
  for (int i = 0; i < NB_T_THREADS; i++) {
    void* rc = NULL;
    pthread_join(th[i], &rc);
    assert_null(rc);
  }
  char* t = NULL;
  assert_int_equal(nb_prom_render(p, &t, NULL), NB_OK);
  /* sums of integers and halves are exact in a double */
  assert_true(value_of(t, "nb_adds_total{parity=\"even\"}") == NB_T_THREADS / 2 * NB_T_ADDS);
  assert_true(value_of(t, "nb_adds_total{parity=\"odd\"}") == NB_T_THREADS / 2 * NB_T_ADDS);
  assert_true(value_of(t, "nb_all_total") == NB_T_THREADS * NB_T_ADDS * 0.5);
  nb_free(t);
  nb_prom_destroy(p);
}

/* ---- the HTTP listener ---- */

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr*)&sa, sizeof sa), 0);
  return fd;
}

/* Sends req (len bytes), reads to EOF: the server closes after one answer. Caller frees. */
static char* exchange(int port, const char* req, size_t len) {
  int fd = connect_to(port);
  size_t off = 0;
  while (off < len) {
    ssize_t w = send(fd, req + off, len - off, MSG_NOSIGNAL);
    if (w <= 0) break; /* an oversized request may be answered and closed before it is all sent */
    off += (size_t)w;
  }
  size_t cap = 1 << 16, n = 0;
  char* b = malloc(cap);
  assert_non_null(b);
  for (;;) {
    if (n + 1 == cap) b = realloc(b, cap *= 2);
    ssize_t r = recv(fd, b + n, cap - 1 - n, 0);
    if (r <= 0) break;
    n += (size_t)r;
  }
  b[n] = 0;
  close(fd);
  return b;
}

static char* get(int port, const char* req) {
  return exchange(port, req, strlen(req));
}

static int g_collects;

static void collect(nb_prom_t* p, void* user) {
  assert_ptr_equal(user, &g_collects);
  g_collects++;
  nb_prom_set(p, "nb_scrapes", NULL, g_collects);
}

static void test_http(void** state) {
  (void)state;
  nb_prom_t* p = NULL;
  assert_int_equal(nb_prom_create(&p), NB_OK);
  assert_int_equal(nb_prom_port(p), 0);
  assert_int_equal(nb_prom_declare(p, "nb_scrapes", NB_PROM_GAUGE, "scrapes so far", NULL), NB_OK);
  assert_int_equal(nb_prom_declare(p, "nb_jobs", NB_PROM_GAUGE, "jobs", "state"), NB_OK);
  assert_int_equal(nb_prom_set(p, "nb_jobs", (const char*[]){"running"}, 2), NB_OK);
  nb_prom_set_collect(p, collect, &g_collects);
  assert_int_equal(nb_prom_listen(p, "127.0.0.1:0"), NB_OK);
  int port = nb_prom_port(p);
  assert_true(port > 0);
  assert_int_equal(nb_prom_listen(p, "127.0.0.1:0"), NB_ERR_INVALID); /* once */

  char* r = get(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
  assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
  assert_non_null(strstr(r, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  assert_non_null(strstr(r, "\r\nConnection: close\r\n"));
  char* body = strstr(r, "\r\n\r\n");
  assert_non_null(body);
  body += 4;
  char* expect = NULL;
  assert_int_equal(nb_prom_render(p, &expect, NULL), NB_OK);
  assert_string_equal(body, expect);
  char cl[64];
  snprintf(cl, sizeof cl, "\r\nContent-Length: %zu\r\n", strlen(expect));
  assert_non_null(strstr(r, cl));
  assert_non_null(strstr(body, "nb_scrapes 1\n"));
  assert_non_null(strstr(body, "nb_jobs{state=\"running\"} 2\n"));
  nb_free(expect);
  free(r);
  /* a query string and HTTP/1.0 are fine; the collect callback ran once per scrape */
  r = get(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
  assert_non_null(strstr(r, "nb_scrapes 2\n"));
  free(r);

  r = get(port, "GET / HTTP/1.1\r\n\r\n");
  assert_non_null(strstr(r, "HTTP/1.1 404 Not Found\r\n"));
  free(r);
  r = get(port, "GET /metricsx HTTP/1.1\r\n\r\n");
  assert_non_null(strstr(r, "HTTP/1.1 404 Not Found\r\n"));
  free(r);
  r = get(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  assert_non_null(strstr(r, "HTTP/1.1 405 Method Not Allowed\r\n"));
  assert_non_null(strstr(r, "\r\nAllow: GET\r\n"));
  free(r);
  const char* bad[] = {"hello\r\n\r\n",
                       "GET\r\n\r\n",
                       "GET /metrics\r\n\r\n",
                       "GET /metrics FTP/1.0\r\n\r\n",
                       "GET metrics HTTP/1.1\r\n\r\n",
                       "get /metrics HTTP/1.1\r\n\r\n",
                       "GET/metrics HTTP/1.1\r\n\r\n",
                       "GET  /metrics HTTP/1.1\r\n\r\n",
                       "GET /metrics HTTP/1.1 x\r\n\r\n"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    r = get(port, bad[i]);
    assert_non_null(strstr(r, "HTTP/1.1 400 Bad Request\r\n"));
    assert_null(strstr(r, "nb_jobs")); /* nothing of the metrics */
    free(r);
  }
  /* a request with a NUL in its head */
  static const char nul[] = "GET /metrics HTTP/1.1\r\nX: a\0b\r\n\r\n";
  r = exchange(port, nul, sizeof nul - 1);
  assert_non_null(strstr(r, "HTTP/1.1 400 Bad Request\r\n"));
  free(r);
  /* a head that never ends within the limit */
  size_t big = NB_PROM_MAX_REQUEST * 2;
  char* huge = malloc(big + 1);
  assert_non_null(huge);
  memcpy(huge, "GET /metrics HTTP/1.1\r\nX-Pad: ", 30);
  memset(huge + 30, 'a', big - 30);
  huge[big] = 0;
  r = get(port, huge);
  assert_non_null(strstr(r, "HTTP/1.1 400 Bad Request\r\n"));
  free(r);
  free(huge);
  /* a client that connects and says nothing complete is closed: the next one is served */
  int idle = connect_to(port);
  assert_int_equal(send(idle, "GET /met", 8, 0), 8);
  r = get(port, "GET /metrics HTTP/1.1\r\n\r\n");
  assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
  free(r);
  char c;
  assert_true(recv(idle, &c, 1, 0) <= 0); /* closed unanswered */
  close(idle);
  /* a client that drips a byte at a time is cut off as well (the limit is on the whole head,
   * not on each read): it is closed unanswered long before its 40 bytes are out */
  int drip = connect_to(port);
  const char slow[] = "GET /metrics HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaa";
  size_t sent = 0;
  int closed = 0;
  for (; sent < sizeof slow - 1 && !closed; sent++) {
    if (send(drip, slow + sent, 1, MSG_NOSIGNAL) != 1) break;
    nb_sleep_ns(250000000); /* 40 x 0.25 s = 10 s, five times the server's 2 s */
    ssize_t got = recv(drip, &c, 1, MSG_DONTWAIT);
    closed = got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
  assert_true(closed || sent < sizeof slow - 1);
  close(drip);
  r = get(port, "GET /metrics HTTP/1.1\r\n\r\n"); /* and the endpoint serves again */
  assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
  free(r);
  nb_prom_destroy(p);
}

static void test_listen_errors(void** state) {
  (void)state;
  nb_prom_t *p = NULL, *q = NULL;
  assert_int_equal(nb_prom_create(&p), NB_OK);
  assert_int_equal(nb_prom_create(&q), NB_OK);
  const char* bad[] = {"",
                       "9464",
                       "127.0.0.1",
                       "127.0.0.1:",
                       "127.0.0.1:x",
                       "127.0.0.1:70000",
                       "127.0.0.1:-1",
                       "::1:9464",
                       "[::1]9464"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(nb_prom_listen(p, bad[i]), NB_ERR_INVALID);
    assert_non_null(strstr(nb_error_last(), "metrics: listen"));
  }
  assert_int_equal(nb_prom_listen(p, "no-such-host.invalid:0"), NB_ERR_UNAVAILABLE);
  assert_int_equal(nb_prom_listen(p, NULL), NB_ERR_INVALID);
  /* an empty host is loopback */
  assert_int_equal(nb_prom_listen(p, ":0"), NB_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", nb_prom_port(p));
  assert_int_equal(nb_prom_listen(q, addr), NB_ERR_UNAVAILABLE); /* in use */
  assert_non_null(strstr(nb_error_last(), "cannot listen on"));
  assert_int_equal(nb_prom_port(q), 0);
  char* r = get(nb_prom_port(p), "GET /metrics HTTP/1.1\r\n\r\n");
  assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
  free(r);
  nb_prom_destroy(q);
  nb_prom_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format),   cmocka_unit_test(test_escaping),
      cmocka_unit_test(test_refusals), cmocka_unit_test(test_threads),
      cmocka_unit_test(test_http),     cmocka_unit_test(test_listen_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
