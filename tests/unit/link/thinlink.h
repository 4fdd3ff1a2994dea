/* Test helper: a thin WAN link between two endpoints on loopback, in the test process. Two
 * forwarding ports (one per direction of connection set-up) relay real TCP connections, and
 * every byte of one direction, whatever connection carries it, passes one FIFO queue of bounded
 * size drained at a fixed rate: the bottleneck queue of a slow link (tc tbf with a limit), where
 * a heartbeat's bytes wait behind bulk data. It is not a mock (the endpoints speak gRPC over
 * real sockets through it) and has no propagation delay. Header-only, like certs.h. */
#ifndef NB_TESTS_LINK_THINLINK_H
#define NB_TESTS_LINK_THINLINK_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"

#define TL_READ 16384
#define TL_MAX_CONNS 64

typedef struct tl_seg {
  int dst;    /* where the bytes go */
  size_t len; /* 0: the source closed, shut the destination's write side */
  struct tl_seg* next;
  uint8_t data[];
} tl_seg_t;

/* One direction of the link: the queue and the thread that drains it at `rate`. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tl_seg_t *head, *tail;
  size_t bytes, limit;
  double rate; /* bytes/s */
  uint64_t forwarded;
  int stop;
  pthread_t wire;
} tl_queue_t;

typedef struct thinlink thinlink_t;

typedef struct {
  thinlink_t* tl;
  int src, dst;
  tl_queue_t* q;
  pthread_t th;
} tl_pump_t;

/* A forwarding port: accepts on `port`, connects to 127.0.0.1:target; bytes from the accepted
 * side go through `up`, bytes back through `down`. */
typedef struct {
  thinlink_t* tl;
  int lfd, port, target;
  tl_queue_t *up, *down;
  pthread_t th;
} tl_port_t;

struct thinlink {
  tl_queue_t q[2]; /* 0: a -> b, 1: b -> a */
  tl_port_t port[2];
  pthread_mutex_t mu;
  tl_pump_t* pumps[2 * TL_MAX_CONNS];
  int fds[2 * TL_MAX_CONNS];
  int n_pumps, n_fds, stopping;
};

static void* tl_wire_main(void* arg) {
  tl_queue_t* q = arg;
  int64_t free_at = nb_now_ns();
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    if (q->stop) break;
    tl_seg_t* s = q->head;
    pthread_mutex_unlock(&q->mu);
    /* the segment leaves the queue once the link has serialised it at the rate */
    int64_t now = nb_now_ns();
    if (free_at < now) free_at = now;
    free_at += (int64_t)((double)s->len / q->rate * 1e9);
    if (free_at > now) nb_sleep_ns(free_at - now);
    if (s->len == 0) {
      shutdown(s->dst, SHUT_WR);
    } else {
      for (size_t off = 0; off < s->len;) {
        ssize_t w = send(s->dst, s->data + off, s->len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* the destination is gone: the bytes are lost */
        off += (size_t)w;
      }
    }
    pthread_mutex_lock(&q->mu);
    q->head = s->next;
    if (!q->head) q->tail = NULL;
    q->bytes -= s->len;
    q->forwarded += s->len;
    pthread_cond_broadcast(&q->cv);
    free(s);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void tl_enqueue(tl_queue_t* q, int dst, const uint8_t* data, size_t len) {
  tl_seg_t* s = malloc(sizeof *s + len);
  if (!s) abort();
  s->dst = dst;
  s->len = len;
  s->next = NULL;
  if (len) memcpy(s->data, data, len);
  pthread_mutex_lock(&q->mu);
  while (!q->stop && q->bytes > 0 && q->bytes + len > q->limit) pthread_cond_wait(&q->cv, &q->mu);
  if (q->stop) {
    pthread_mutex_unlock(&q->mu);
    free(s);
    return;
  }
  if (q->tail)
    q->tail->next = s;
  else
    q->head = s;
  q->tail = s;
  q->bytes += len;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

/* Reads one direction of one connection into its queue until the source closes. */
static void* tl_pump_main(void* arg) {
  tl_pump_t* p = arg;
  uint8_t buf[TL_READ];
  for (;;) {
    ssize_t n = recv(p->src, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    tl_enqueue(p->q, p->dst, buf, (size_t)n);
  }
  tl_enqueue(p->q, p->dst, NULL, 0);
  return NULL;
}

static void tl_start_pump(thinlink_t* tl, int src, int dst, tl_queue_t* q) {
  tl_pump_t* p = calloc(1, sizeof *p);
  if (!p) abort();
  *p = (tl_pump_t){.tl = tl, .src = src, .dst = dst, .q = q};
  pthread_mutex_lock(&tl->mu);
  if (tl->n_pumps < 2 * TL_MAX_CONNS && pthread_create(&p->th, NULL, tl_pump_main, p) == 0) {
    tl->pumps[tl->n_pumps++] = p;
  } else {
    free(p);
  }
  pthread_mutex_unlock(&tl->mu);
}

static void* tl_port_main(void* arg) {
  tl_port_t* pt = arg;
  for (;;) {
    int c = accept(pt->lfd, NULL, NULL);
    if (c < 0) {
      if (errno == EINTR) continue;
      break; /* the listening socket was shut down */
    }
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)pt->target)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || connect(s, (struct sockaddr*)&a, sizeof a) != 0) {
      close(c);
      if (s >= 0) close(s);
      continue;
    }
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_mutex_lock(&pt->tl->mu);
    int ok = !pt->tl->stopping && pt->tl->n_fds + 2 <= 2 * TL_MAX_CONNS;
    if (ok) {
      pt->tl->fds[pt->tl->n_fds++] = c;
      pt->tl->fds[pt->tl->n_fds++] = s;
    }
    pthread_mutex_unlock(&pt->tl->mu);
    if (!ok) {
      close(c);
      close(s);
      continue;
    }
    tl_start_pump(pt->tl, c, s, pt->up);
    tl_start_pump(pt->tl, s, c, pt->down);
  }
  return NULL;
}

static int tl_listen(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &al) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

/* Creates the link: rate_Bps and a queue of queue_bytes in each direction. Connections to
 * thinlink_port(tl, 0) reach 127.0.0.1:port_b (endpoint b), with their requests in the a -> b
 * queue; connections to thinlink_port(tl, 1) reach 127.0.0.1:port_a. Returns NULL on failure. */
static inline thinlink_t* thinlink_create(int port_a, int port_b, double rate_Bps,
                                          size_t queue_bytes) {
  thinlink_t* tl = calloc(1, sizeof *tl);
  if (!tl) return NULL;
  pthread_mutex_init(&tl->mu, NULL);
  for (int d = 0; d < 2; d++) {
    tl_queue_t* q = &tl->q[d];
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->limit = queue_bytes;
    q->rate = rate_Bps;
    if (pthread_create(&q->wire, NULL, tl_wire_main, q) != 0) abort();
  }
  /* port 0: a's clients -> b's server (requests a -> b); port 1: b's clients -> a's server */
  tl->port[0] = (tl_port_t){.tl = tl, .target = port_b, .up = &tl->q[0], .down = &tl->q[1]};
  tl->port[1] = (tl_port_t){.tl = tl, .target = port_a, .up = &tl->q[1], .down = &tl->q[0]};
  for (int i = 0; i < 2; i++) {
    tl->port[i].lfd = tl_listen(&tl->port[i].port);
    if (tl->port[i].lfd < 0 || pthread_create(&tl->port[i].th, NULL, tl_port_main, &tl->port[i]))
      abort();
  }
  return tl;
}

static inline int thinlink_port(const thinlink_t* tl, int i) {
  return tl->port[i].port;
}

/* Bytes that crossed direction d (0: a -> b) so far. */
static inline uint64_t thinlink_forwarded(thinlink_t* tl, int d) {
  pthread_mutex_lock(&tl->q[d].mu);
  uint64_t n = tl->q[d].forwarded;
  pthread_mutex_unlock(&tl->q[d].mu);
  return n;
}

/* Cuts every connection and frees everything. NULL ok. */
static inline void thinlink_destroy(thinlink_t* tl) {
  if (!tl) return;
  pthread_mutex_lock(&tl->mu);
  tl->stopping = 1;
  pthread_mutex_unlock(&tl->mu);
  for (int i = 0; i < 2; i++) {
    shutdown(tl->port[i].lfd, SHUT_RDWR);
    pthread_join(tl->port[i].th, NULL);
    close(tl->port[i].lfd);
  }
  for (int d = 0; d < 2; d++) { /* release pumps blocked on a full queue */
    pthread_mutex_lock(&tl->q[d].mu);
    tl->q[d].stop = 1;
    pthread_cond_broadcast(&tl->q[d].cv);
    pthread_mutex_unlock(&tl->q[d].mu);
  }
  /* ends the pumps' reads and a wire thread's blocked write */
  for (int i = 0; i < tl->n_fds; i++) shutdown(tl->fds[i], SHUT_RDWR);
  for (int d = 0; d < 2; d++) pthread_join(tl->q[d].wire, NULL);
  for (int i = 0; i < tl->n_pumps; i++) {
    pthread_join(tl->pumps[i]->th, NULL);
    free(tl->pumps[i]);
  }
  for (int i = 0; i < tl->n_fds; i++) close(tl->fds[i]);
  for (int d = 0; d < 2; d++) {
    for (tl_seg_t* s = tl->q[d].head; s;) {
      tl_seg_t* n = s->next;
      free(s);
      s = n;
    }
    pthread_cond_destroy(&tl->q[d].cv);
    pthread_mutex_destroy(&tl->q[d].mu);
  }
  pthread_mutex_destroy(&tl->mu);
  free(tl);
}

#endif
