/* Integration test on a real emulated WAN link (root only; exits 77 otherwise): TCP transfers
 * between the two namespaces feed the link estimator, the scheduler decides after each one, and
 * the tbf rate is halved halfway (wan-set.sh): the estimate and the chosen density must halve
 * within a few transfers. Then the rate limiter caps the sender below the link rate and the
 * measured goodput must match the cap. Plain TCP sockets stand in for the gRPC link here. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "inter/estimator.h"
#include "inter/ratelimit.h"
#include "inter/sched.h"

#define SKIP 77
#define XFER_BYTES (1u << 20)

extern char** environ;

static const char* g_dir; /* deploy/wan */
static char g_prefix[64];
static int g_port;
static int g_ls = -1; /* the server's listening socket, shut down to end a stuck accept */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

/* Runs a deploy/wan script with arguments (no shell); returns its exit code or -1. */
static int run_script(const char* script, const char* a1, const char* a2, const char* a3,
                      const char* a4, const char* a5, const char* a6) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", g_dir, script);
  char* argv[] = {path, (char*)a1, (char*)a2, (char*)a3, (char*)a4, (char*)a5, (char*)a6, NULL};
  pid_t pid;
  if (posix_spawn(&pid, path, NULL, NULL, argv, environ) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int enter_ns(const char* suffix) {
  char path[256];
  snprintf(path, sizeof path, "/run/netns/%s-%s", g_prefix, suffix);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, CLONE_NEWNET); /* this thread only */
  close(fd);
  return rc;
}

static int read_full(int fd, void* buf, size_t n) {
  char* p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void* buf, size_t n) {
  const char* p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Server in namespace b: for each message (8-byte length + payload) answer one byte; length 0
 * ends. */
static void* server(void* arg) {
  (void)arg;
  int ls = -1, cs = -1, port = -1;
  static char buf[1 << 16];
  if (enter_ns("b") == 0) {
    ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "169.254.100.2", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    if (ls >= 0 && bind(ls, (struct sockaddr*)&sa, sizeof sa) == 0 && listen(ls, 1) == 0 &&
        getsockname(ls, (struct sockaddr*)&sa, &sl) == 0)
      port = ntohs(sa.sin_port);
  }
  pthread_mutex_lock(&g_mu);
  g_ls = ls;
  g_port = port;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  if (port < 0) goto out;
  cs = accept(ls, NULL, NULL);
  for (;;) {
    uint64_t len;
    if (cs < 0 || read_full(cs, &len, sizeof len) != 0 || len == 0) break;
    while (len > 0) {
      size_t n = len < sizeof buf ? (size_t)len : sizeof buf;
      if (read_full(cs, buf, n) != 0) goto out;
      len -= n;
    }
    char ack = 1;
    if (write_full(cs, &ack, 1) != 0) break;
  }
out:
  if (cs >= 0) close(cs);
  if (ls >= 0) close(ls);
  return NULL;
}

typedef struct {
  int fd;
  nb_estimator_t* est;
  nb_ratelimit_t* rl; /* NULL = uncapped */
  int fail;
} client_t;

/* One transfer: length, payload (through the rate limiter when set), wait for the ack. */
static double transfer(client_t* c, uint64_t bytes) {
  static char buf[1 << 16];
  double t0 = nb_now_s();
  if (write_full(c->fd, &bytes, sizeof bytes) != 0) return -1;
  uint64_t left = bytes;
  while (left > 0) {
    size_t n = left < sizeof buf ? (size_t)left : sizeof buf;
    if (c->rl && nb_ratelimit_acquire(c->rl, n) != NB_OK) return -1;
    if (write_full(c->fd, buf, n) != 0) return -1;
    left -= n;
  }
  char ack;
  if (read_full(c->fd, &ack, 1) != 0) return -1;
  return nb_now_s() - t0;
}

static nb_sched_input_t sched_input(const nb_estimate_t* e, uint64_t round) {
  /* 20 steps of 50 ms, 10M params at 32+32 bits: about 0.05 density at 40 Mbit/s. */
  nb_sched_input_t in = {.round = round,
                         .step_compute_s = 0.05,
                         .steps = 20,
                         .n_params = 10000000,
                         .bits_per_value = 32,
                         .bits_per_index = 32,
                         .fanout = 1};
  nb_sched_input_from_estimate(&in, e);
  return in;
}

#define CHECK(cond, ...)            \
  do {                              \
    if (cond) {                     \
      printf("ok: " __VA_ARGS__);   \
    } else {                        \
      printf("FAIL: " __VA_ARGS__); \
      fails++;                      \
    }                               \
    printf("\n");                   \
  } while (0)

static void* client(void* arg) {
  client_t* c = arg;
  int fails = 0;
  char line[512];
  if (enter_ns("a") != 0) {
    c->fail = 1;
    return NULL;
  }
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
  inet_pton(AF_INET, "169.254.100.2", &sa.sin_addr);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr*)&sa, sizeof sa) != 0) {
    printf("FAIL: connect: %s\n", strerror(errno));
    c->fail = 1;
    return NULL;
  }
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  /* RTT: small request/ack exchanges. */
  for (int i = 0; i < 5; ++i) {
    double t = transfer(c, 8);
    if (t > 0) nb_estimator_add_rtt(c->est, t);
  }
  nb_sched_config_t cfg;
  nb_sched_config_default(&cfg);
  cfg.density_floor = 1e-4;
  cfg.density_ceiling = 0.5;
  cfg.hysteresis = 0.1;
  nb_sched_decision_t d, prev;
  int have_prev = 0;
  nb_estimate_t e;

  /* Phase 1: 40 Mbit/s. */
  for (int i = 0; i < 6; ++i) {
    double t = transfer(c, XFER_BYTES);
    if (t <= 0 || nb_estimator_add_transfer(c->est, XFER_BYTES, t, 1) != NB_OK) goto broken;
  }
  nb_estimator_get(c->est, &e);
  nb_sched_input_t in = sched_input(&e, 1);
  nb_sched_decide(&cfg, &in, NULL, &d);
  nb_sched_decision_format(&d, line, sizeof line);
  printf("40 Mbit/s: goodput %.2f Mbit/s, rtt %.2f ms (min %.2f)\n  %s\n", e.goodput_Bps * 8e-6,
         e.rtt_s * 1e3, e.rtt_min_s * 1e3, line);
  double g1 = e.goodput_Bps, d1 = d.density;
  CHECK(e.rtt_min_s >= 0.0199 && e.rtt_min_s < 0.035, "min RTT %.2f ms ~ 2 x 10 ms",
        e.rtt_min_s * 1e3);
  CHECK(g1 * 8e-6 > 30 && g1 * 8e-6 < 41, "goodput %.2f Mbit/s near 40", g1 * 8e-6);
  CHECK(d.reason == NB_SCHED_FIT, "reason %s is fit", nb_sched_reason_name(d.reason));
  prev = d;
  have_prev = 1;

  /* Phase 2: halve the link mid-run. */
  if (run_script("wan-set.sh", "--prefix", g_prefix, "--rate-mbit", "20", NULL, NULL) != 0) {
    printf("FAIL: wan-set.sh\n");
    goto broken;
  }
  int followed = -1;
  for (int i = 0; i < 6; ++i) {
    double t = transfer(c, XFER_BYTES);
    if (t <= 0 || nb_estimator_add_transfer(c->est, XFER_BYTES, t, 1) != NB_OK) goto broken;
    nb_estimator_get(c->est, &e);
    in = sched_input(&e, (uint64_t)(2 + i));
    nb_sched_decide(&cfg, &in, have_prev ? &prev : NULL, &d);
    prev = d;
    double sample = (double)XFER_BYTES / t;
    printf("  after halving, transfer %d: sample %.2f, estimate %.2f Mbit/s, density %.5f\n", i + 1,
           sample * 8e-6, e.goodput_Bps * 8e-6, d.density);
    if (followed < 0 && e.goodput_Bps < g1 * 0.62) followed = i + 1;
  }
  nb_sched_decision_format(&d, line, sizeof line);
  printf("20 Mbit/s: %s\n", line);
  CHECK(followed >= 1 && followed <= 4, "estimate followed the halved link after %d transfers",
        followed);
  CHECK(e.goodput_Bps / g1 > 0.4 && e.goodput_Bps / g1 < 0.62, "goodput ratio %.3f ~ 0.5",
        e.goodput_Bps / g1);
  CHECK(d.density / d1 > 0.4 && d.density / d1 < 0.62, "density ratio %.3f ~ 0.5", d.density / d1);

  /* Phase 3: an operator cap of 10 Mbit/s below the 20 Mbit/s link. */
  if (nb_ratelimit_create(1.25e6, 64 * 1024, &c->rl) != NB_OK) goto broken;
  double last = 0;
  for (int i = 0; i < 3; ++i) {
    double t = transfer(c, XFER_BYTES);
    if (t <= 0) goto broken;
    last = (double)XFER_BYTES / t;
  }
  CHECK(last * 8e-6 > 8.0 && last * 8e-6 < 10.6, "capped goodput %.2f Mbit/s ~ 10 (cap)",
        last * 8e-6);
  nb_ratelimit_destroy(c->rl);
  c->rl = NULL;

  uint64_t zero = 0;
  write_full(c->fd, &zero, sizeof zero);
  close(c->fd);
  c->fail = fails;
  return NULL;
broken:
  printf("FAIL: transfer broke: %s\n", strerror(errno));
  close(c->fd);
  c->fail = fails + 1;
  return NULL;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2) {
    fprintf(stderr, "usage: test_wan_adapt DEPLOY_WAN_DIR\n");
    return 2;
  }
  g_dir = argv[1];
  if (geteuid() != 0) {
    printf("skip: needs root\n");
    return SKIP;
  }
  if (access("/dev/net/tun", R_OK | W_OK) != 0) {
    printf("skip: no /dev/net/tun\n");
    return SKIP;
  }
  snprintf(g_prefix, sizeof g_prefix, "nbt-ad-%ld", (long)getpid());
  if (run_script("wan-up.sh", "--prefix", g_prefix, "--rate-mbit", "40", "--delay-ms", "10") != 0) {
    printf("skip: wan-up.sh failed (no network namespaces here?)\n");
    run_script("wan-down.sh", "--prefix", g_prefix, NULL, NULL, NULL, NULL);
    return SKIP;
  }
  pthread_t ts, tc;
  g_port = 0;
  client_t c = {.fd = -1};
  int fail = 1;
  if (nb_estimator_create(NULL, &c.est) != NB_OK) goto down;
  pthread_create(&ts, NULL, server, NULL);
  pthread_mutex_lock(&g_mu);
  while (g_port == 0) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  if (g_port > 0) {
    pthread_create(&tc, NULL, client, &c);
    pthread_join(tc, NULL);
    fail = c.fail;
    shutdown(g_ls, SHUT_RDWR); /* in case the client never connected */
  } else {
    printf("FAIL: server could not listen in the namespace\n");
  }
  pthread_join(ts, NULL);
down:
  nb_estimator_destroy(c.est);
  if (run_script("wan-down.sh", "--prefix", g_prefix, NULL, NULL, NULL, NULL) != 0) {
    printf("FAIL: wan-down.sh left something behind\n");
    fail = 1;
  }
  printf("%s\n", fail ? "FAILED" : "PASS");
  return fail ? 1 : 0;
}
