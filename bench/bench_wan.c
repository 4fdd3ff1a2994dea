/* `nebula bench wan`: moves M MiB of sealed frames over mTLS through inter/link across the
 * emulated WAN of deploy/wan (two network namespaces, tbf + delay line), with iperf3 measured on
 * the same link in the same run as the capacity baseline, and the same transfer on loopback
 * without and with TLS + sealing. It needs root (namespaces) and asserts nothing.
 *
 * The parent sets the link up, then runs itself twice under `ip netns exec`: a receiver
 * (--serve) in namespace b and a sender (--send) in namespace a, so that gRPC's threads live in
 * the namespace of their process. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/install.h"
#include "common/opts.h"
#include "inter/link.h"
#include "security/pki.h"
#include "security/seal.h"
#include "security/tls.h"

#define NB__BW_JOB "bench-wan"
#define NB__BW_PORT 7390
#define NB__BW_WARM_MIB 16

static char nb__bw_prefix[64];
static char nb__bw_wan_dir[PATH_MAX];
static char nb__bw_certs[PATH_MAX];
static pid_t nb__bw_kids[2] = {-1, -1};

#define NB__BW_SYNOPSIS                                                              \
  "usage: nebula bench wan [--rate-mbit R] [--delay-ms D] [--streams S] [--mib M]\n" \
  "                        [--iperf-s T] [--wan-dir DIR] [--json]\n"                 \
  "       nebula bench wan --loopback-only [--streams S] [--mib M] [--reps R]\n"     \
  "                        [--only plain|secure|tls|seal] [--json]"
#define NB__BW_ABOUT                                                                   \
  "Sets up an emulated WAN link (deploy/wan/wan-up.sh; default 100 Mbit/s each way,\n" \
  "25 ms one way), measures iperf3 on it, then moves M MiB (default 256) of sealed\n"  \
  "frames over mTLS through inter/link with S streams (default 4); also the same\n"    \
  "transfer on loopback without and with TLS+sealing. Needs root.\n"                   \
  "--loopback-only: only the loopback part (no namespaces, no root), R interleaved\n"  \
  "repetitions (default 5) of plain / mTLS+seal / mTLS only / seal only; --only V\n"   \
  "runs one variant alone (for perf record)."

/* ------------------------------------------------------------ helpers */

static void nb__bw_fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
  for (; i < n; i++) p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

static int nb__bw_secret_path(const char* dir, char* buf, size_t cap) {
  return snprintf(buf, cap, "%.3000s/job.secret", dir) < (int)cap ? 0 : -1;
}

/* CA + dc-a, dc-b (SANs: loopback and the two link addresses) + a job secret, in dir. */
static nb_status_t nb__bw_make_certs(const char* dir) {
  EVP_PKEY* ca_key = NULL;
  X509* ca = NULL;
  char path[PATH_MAX];
  nb_status_t st;
  NB_CHECK(nb_pki_ca_create("nebula bench CA", 1, &ca_key, &ca));
  snprintf(path, sizeof path, "%.3000s/ca.crt", dir);
  st = nb_pki_cert_write(path, ca, 1);
  static const char* const sans[] = {"IP:127.0.0.1", "IP:169.254.100.1", "IP:169.254.100.2"};
  static const char* const ids[] = {"dc-a", "dc-b"};
  for (int i = 0; st == NB_OK && i < 2; i++) {
    nb_pki_issue_opts_t o = {
        .kind = NB_PKI_CLUSTER, .name = ids[i], .sans = sans, .n_sans = 3, .days = 1};
    EVP_PKEY* k = NULL;
    X509* c = NULL;
    st = nb_pki_cert_issue(ca_key, ca, &o, &k, &c);
    snprintf(path, sizeof path, "%.3000s/%s.key", dir, ids[i]);
    if (st == NB_OK) st = nb_pki_key_write(path, k, 1);
    snprintf(path, sizeof path, "%.3000s/%s.crt", dir, ids[i]);
    if (st == NB_OK) st = nb_pki_cert_write(path, c, 1);
    EVP_PKEY_free(k);
    X509_free(c);
  }
  EVP_PKEY_free(ca_key);
  X509_free(ca);
  if (st != NB_OK) return st;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  NB_CHECK(nb_seal_secret_generate(secret));
  nb__bw_secret_path(dir, path, sizeof path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return NB_ERRNO("create job secret");
  ssize_t w = write(fd, secret, sizeof secret);
  close(fd);
  return w == (ssize_t)sizeof secret ? NB_OK : nb_error(NB_ERR_IO, "short write of %s", path);
}

static nb_status_t nb__bw_load(const char* dir, const char* id, nb_tls_t** tls,
                               uint8_t secret[NB_SEAL_SECRET_BYTES]) {
  char ca[PATH_MAX], crt[PATH_MAX], key[PATH_MAX], sp[PATH_MAX];
  snprintf(ca, sizeof ca, "%.3000s/ca.crt", dir);
  snprintf(crt, sizeof crt, "%.3000s/%s.crt", dir, id);
  snprintf(key, sizeof key, "%.3000s/%s.key", dir, id);
  nb_tls_files_t f = {.ca_path = ca, .cert_path = crt, .key_path = key};
  NB_CHECK(nb_tls_create(&f, tls));
  nb__bw_secret_path(dir, sp, sizeof sp);
  FILE* fp = fopen(sp, "rb");
  if (!fp) return NB_ERRNO("open job secret");
  size_t n = fread(secret, 1, NB_SEAL_SECRET_BYTES, fp);
  fclose(fp);
  return n == NB_SEAL_SECRET_BYTES ? NB_OK : nb_error(NB_ERR_IO, "short job secret");
}

static void nb__bw_rm_certs(const char* dir) {
  static const char* const files[] = {"ca.crt",   "dc-a.crt", "dc-a.key",
                                      "dc-b.crt", "dc-b.key", "job.secret"};
  char p[PATH_MAX];
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(p, sizeof p, "%.3000s/%s", dir, files[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* ------------------------------------------------ receiver and sender */

typedef struct {
  nb_link_rx_t* rx;
  nb_rpc_server_t* srv;
  nb_seal_ctx_t* seal;
} nb__bw_rx_t;

static nb_status_t nb__bw_rx_up(const char* listen, const nb_tls_t* tls, const uint8_t* secret,
                                nb__bw_rx_t* r) {
  memset(r, 0, sizeof *r);
  nb_link_rx_config_t rc = {.job_id = NB__BW_JOB,
                            .local_cluster = "dc-b",
                            .allow_plaintext = tls == NULL,
                            .allow_unsealed = secret == NULL};
  NB_CHECK(nb_link_rx_create(&rc, &r->rx));
  if (secret) NB_CHECK(nb_seal_ctx_create(secret, NB__BW_JOB, "dc-b", "dc-a", NULL, &r->seal));
  NB_CHECK(nb_link_rx_add_peer(r->rx, "dc-a", r->seal));
  nb_rpc_server_opts_t so = {.listen = listen, .tls = tls, .allow_insecure = tls == NULL};
  NB_CHECK(nb_rpc_server_create(&so, &r->srv));
  NB_CHECK(nb_link_rx_register(r->rx, r->srv));
  return nb_rpc_server_start(r->srv);
}

static void nb__bw_rx_down(nb__bw_rx_t* r) {
  nb_rpc_server_destroy(r->srv);
  nb_link_rx_destroy(r->rx);
  nb_seal_ctx_destroy(r->seal);
}

/* Waits for round `round` and checks its size. */
static nb_status_t nb__bw_rx_take(nb__bw_rx_t* r, uint64_t round, size_t want, int64_t wait_s) {
  uint8_t* f = NULL;
  size_t len = 0;
  NB_CHECK(nb_link_rx_take(r->rx, "dc-a", round, nb_now_ns() + wait_s * 1000000000LL, &f, &len));
  nb_free(f);
  return len == want ? NB_OK : nb_error(NB_ERR_INTERNAL, "received %zu bytes, sent %zu", len, want);
}

/* CPU seconds (user + system, all threads of this process) spent during the last measured
 * transfer: on loopback sender and receiver share the process, so this is the whole cost. */
static double nb__bw_cpu_s;

static double nb__bw_cpu_now(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

/* A warm-up frame (connections, TLS, TCP windows), then the measured one. */
static nb_status_t nb__bw_send(const char* target, const nb_tls_t* tls, const uint8_t* secret,
                               uint32_t streams, size_t bytes, nb_link_send_stats_t* out) {
  nb_seal_ctx_t* seal = NULL;
  nb_link_t* l = NULL;
  uint8_t* f = NULL;
  nb_status_t st;
  if (secret)
    NB_CHECK_GOTO(nb_seal_ctx_create(secret, NB__BW_JOB, "dc-a", "dc-b", NULL, &seal), st, out);
  nb_link_config_t lc = {.job_id = NB__BW_JOB,
                         .local_cluster = "dc-a",
                         .peer_cluster = "dc-b",
                         .target = target,
                         .tls = tls,
                         .allow_insecure = tls == NULL,
                         .seal = seal,
                         .allow_unsealed = seal == NULL,
                         .streams = streams};
  NB_CHECK_GOTO(nb_link_create(&lc, &l), st, out);
  NB_CHECK_GOTO(nb_alloc((void**)&f, bytes, 1, "bench frame"), st, out);
  nb__bw_fill(f, bytes, 42);
  size_t warm = (size_t)NB__BW_WARM_MIB << 20;
  if (warm > bytes) warm = bytes;
  NB_CHECK_GOTO(nb_link_send(l, 1, f, warm, NULL, 0, nb_now_ns() + 600000000000LL, NULL), st, out);
  double cpu0 = nb__bw_cpu_now();
  NB_CHECK_GOTO(nb_link_send(l, 2, f, bytes, NULL, 0, nb_now_ns() + 1800000000000LL, out), st, out);
  nb__bw_cpu_s = nb__bw_cpu_now() - cpu0;
out:
  nb_free(f);
  nb_link_destroy(l);
  nb_seal_ctx_destroy(seal);
  return st;
}

/* `--serve DIR LISTEN MIB`: the receiver in namespace b; prints READY, then OK per frame. */
static int nb__bw_serve(const char* dir, const char* listen, int mib) {
  nb_tls_t* tls = NULL;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  nb__bw_rx_t r;
  if (nb__bw_load(dir, "dc-b", &tls, secret) != NB_OK || nb__bw_rx_up(listen, tls, secret, &r)) {
    fprintf(stderr, "bench wan --serve: %s\n", nb_error_last());
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  size_t bytes = (size_t)mib << 20, warm = (size_t)NB__BW_WARM_MIB << 20;
  nb_status_t st = nb__bw_rx_take(&r, 1, warm < bytes ? warm : bytes, 600);
  if (st == NB_OK) st = nb__bw_rx_take(&r, 2, bytes, 1800);
  if (st != NB_OK)
    fprintf(stderr, "bench wan --serve: %s\n", nb_error_last());
  else
    printf("OK\n");
  fflush(stdout);
  nb_sleep_ns(200000000); /* let the last acks leave */
  nb__bw_rx_down(&r);
  nb_tls_destroy(tls);
  return st == NB_OK ? 0 : 1;
}

/* `--send DIR TARGET MIB STREAMS`: the sender in namespace a; prints "SENT seconds bytes". */
static int nb__bw_send_main(const char* dir, const char* target, int mib, int streams) {
  nb_tls_t* tls = NULL;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  nb_link_send_stats_t s;
  nb_status_t st = nb__bw_load(dir, "dc-a", &tls, secret);
  if (st == NB_OK) st = nb__bw_send(target, tls, secret, (uint32_t)streams, (size_t)mib << 20, &s);
  nb_tls_destroy(tls);
  if (st != NB_OK) {
    fprintf(stderr, "bench wan --send: %s\n", nb_error_last());
    return 1;
  }
  printf("SENT %.6f %llu %u\n", s.seconds, (unsigned long long)s.bytes, s.reconnects);
  return 0;
}

/* ------------------------------------------------------------- parent */

static void nb__bw_teardown(void) {
  for (int i = 0; i < 2; i++)
    if (nb__bw_kids[i] > 0) {
      kill(nb__bw_kids[i], SIGKILL);
      waitpid(nb__bw_kids[i], NULL, 0);
      nb__bw_kids[i] = -1;
    }
  if (nb__bw_prefix[0]) {
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "bash '%s/wan-down.sh' --prefix '%s' >/dev/null 2>&1", nb__bw_wan_dir,
             nb__bw_prefix);
    if (system(cmd) != 0) fprintf(stderr, "bench wan: wan-down.sh reported a problem\n");
    nb__bw_prefix[0] = 0;
  }
  if (nb__bw_certs[0]) {
    nb__bw_rm_certs(nb__bw_certs);
    nb__bw_certs[0] = 0;
  }
}

static void nb__bw_on_signal(int sig) {
  nb__bw_teardown();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Starts `ip netns exec NS <this program> bench wan ARGS...` with stdout on a pipe. */
static pid_t nb__bw_spawn(const char* ns, char* const* args, FILE** out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) _exit(127);
    exe[n] = 0;
    char* argv[16] = {"ip", "netns", "exec", (char*)ns, exe, "bench", "wan"};
    int k = 7;
    for (int i = 0; args[i] && k < 15; i++) argv[k++] = args[i];
    argv[k] = NULL;
    execvp("ip", argv);
    _exit(127);
  }
  close(fds[1]);
  *out = fdopen(fds[0], "r");
  return pid;
}

/* --wan-dir, else common/install.h's places (NB_WAN_DIR, the build and the install tree); the
 * delay line likewise (NB_DELAYLINE, beside this executable's build or install tree), handed to
 * the scripts as NB_DELAYLINE. 0, or -1 with the reason printed. */
static int nb__bw_find_wan_dir(const char* given) {
  char tried[2048], dl[PATH_MAX];
  if (given) {
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%.3000s/wan-up.sh", given);
    if (access(p, R_OK) != 0 || !realpath(given, nb__bw_wan_dir)) {
      fprintf(stderr, "nebula bench wan: --wan-dir %s holds no wan-up.sh\n", given);
      return -1;
    }
  } else if (nb_install_wan_dir(nb__bw_wan_dir, sizeof nb__bw_wan_dir, tried, sizeof tried) !=
             NB_OK) {
    fprintf(stderr,
            "nebula bench wan: the WAN scripts (wan-up.sh) are not in %s: %s; pass --wan-dir "
            "DIR or set NB_WAN_DIR\n",
            tried, nb_error_last());
    return -1;
  }
  if (nb_install_delayline(nb__bw_wan_dir, dl, sizeof dl, tried, sizeof tried) != NB_OK) {
    fprintf(stderr, "nebula bench wan: the delay line nb-delayline is not in %s: %s\n", tried,
            nb_error_last());
    return -1;
  }
  setenv("NB_DELAYLINE", dl, 1);
  return 0;
}

/* Reads the 4-stream (or S-stream) iperf3 figure from measure.sh --json. */
static double nb__bw_iperf(int streams, int secs) {
  char cmd[PATH_MAX + 256];
  snprintf(cmd, sizeof cmd,
           "bash '%s/measure.sh' --prefix '%s' --streams %d --time %d --omit 2 --pings 5 --json",
           nb__bw_wan_dir, nb__bw_prefix, streams, secs);
  FILE* p = popen(cmd, "r");
  if (!p) return -1;
  char buf[4096] = {0};
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  buf[n] = 0;
  pclose(p);
  char key[32];
  snprintf(key, sizeof key, "\"%d\":", streams);
  char* at = strstr(buf, "\"iperf3_mbit\"");
  at = at ? strstr(at, key) : NULL;
  return at ? strtod(at + strlen(key), NULL) : -1;
}

/* One transfer on loopback (median of reps) in Gbit/s. */
/* use_tls: mTLS on the connections; use_seal: AES-GCM on every chunk. */
static double nb__bw_loopback(int use_tls, int use_seal, uint32_t streams, size_t bytes, int reps,
                              double* cpu_s_per_gib) {
  nb_tls_t *ta = NULL, *tb = NULL;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  double g[8];
  int ok = 0;
  if ((use_tls || use_seal) && (nb__bw_load(nb__bw_certs, "dc-a", &ta, secret) != NB_OK ||
                                nb__bw_load(nb__bw_certs, "dc-b", &tb, secret) != NB_OK))
    goto out;
  if (!use_tls) {
    nb_tls_destroy(ta);
    nb_tls_destroy(tb);
    ta = tb = NULL;
  }
  for (int r = 0; r < reps; r++) {
    nb__bw_rx_t rx;
    if (nb__bw_rx_up("127.0.0.1:0", tb, use_seal ? secret : NULL, &rx) != NB_OK) goto out;
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", nb_rpc_server_port(rx.srv));
    nb_link_send_stats_t s;
    nb_status_t st = nb__bw_send(target, ta, use_seal ? secret : NULL, streams, bytes, &s);
    nb__bw_rx_down(&rx);
    if (st != NB_OK) goto out;
    g[ok++] = s.goodput_Bps * 8e-9;
    if (cpu_s_per_gib) *cpu_s_per_gib = nb__bw_cpu_s / ((double)bytes / (1u << 30));
  }
out:
  if (ok < reps) fprintf(stderr, "bench wan: loopback run failed: %s\n", nb_error_last());
  nb_tls_destroy(ta);
  nb_tls_destroy(tb);
  return ok ? nb_bench_median(g, (size_t)ok) : -1;
}

/* Interleaved (plain, mTLS+seal, mTLS only, seal only) x reps, first nv variants. The shared
 * machine's load drifts, and interleaving spreads it over every variant alike. Per variant: the
 * median, min and max goodput in Gbit/s and the median CPU seconds per GiB moved (-1 when every
 * run failed); ratio: the median over repetitions of secure / plain within one repetition. */
static const char* const nb__bw_variant[4] = {"plain", "secure", "tls", "seal"};
static int nb__bw_only = -1; /* --only V: run that variant alone (profiling) */

typedef struct {
  double med[4], lo[4], hi[4], cpu[4], ratio;
} nb__bw_lb_t;

static void nb__bw_loopback_set(int S, size_t bytes, int reps, int nv, nb__bw_lb_t* o) {
  enum { NB__LB_MAX_REPS = 64 };
  double v[4][NB__LB_MAX_REPS], c[4][NB__LB_MAX_REPS], pr[NB__LB_MAX_REPS];
  int nok[4] = {0, 0, 0, 0}, npr = 0;
  if (reps > NB__LB_MAX_REPS) reps = NB__LB_MAX_REPS;
  for (int r = 0; r < reps; r++) {
    double g_rep[4] = {-1, -1, -1, -1};
    for (int k = 0; k < nv; k++) {
      if (nb__bw_only >= 0 && k != nb__bw_only) continue;
      static const int tls_of[4] = {0, 1, 1, 0}, seal_of[4] = {0, 1, 0, 1};
      double cpu = -1;
      double g = nb__bw_loopback(tls_of[k], seal_of[k], (uint32_t)S, bytes, 1, &cpu);
      if (g > 0) {
        c[k][nok[k]] = cpu;
        v[k][nok[k]++] = g;
        g_rep[k] = g;
      }
    }
    if (g_rep[0] > 0 && g_rep[1] > 0) pr[npr++] = g_rep[1] / g_rep[0];
  }
  o->ratio = npr ? nb_bench_median(pr, (size_t)npr) : -1;
  for (int k = 0; k < 4; k++) {
    o->med[k] = o->lo[k] = o->hi[k] = o->cpu[k] = -1;
    if (k >= nv || !nok[k]) continue;
    o->lo[k] = o->hi[k] = v[k][0];
    for (int i = 1; i < nok[k]; i++) {
      if (v[k][i] < o->lo[k]) o->lo[k] = v[k][i];
      if (v[k][i] > o->hi[k]) o->hi[k] = v[k][i];
    }
    o->med[k] = nb_bench_median(v[k], (size_t)nok[k]);
    o->cpu[k] = nb_bench_median(c[k], (size_t)nok[k]);
  }
}

/* A temporary folder with the run's certificates, removed at exit or on a signal (with the
 * link, when one was made). Returns 0, or 1 after a message. */
static int nb__bw_setup(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(nb__bw_certs, sizeof nb__bw_certs, "%.3000s/nb-bench-wan-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(nb__bw_certs)) {
    nb__bw_certs[0] = 0;
    perror("nebula bench wan: mkdtemp");
    return 1;
  }
  atexit(nb__bw_teardown);
  signal(SIGINT, nb__bw_on_signal);
  signal(SIGTERM, nb__bw_on_signal);
  if (nb__bw_make_certs(nb__bw_certs) != NB_OK) {
    fprintf(stderr, "nebula bench wan: certificates: %s\n", nb_error_last());
    return 1;
  }
  return 0;
}

/* `--loopback-only`: the loopback comparison alone (no namespaces, no root). */
static int nb__bw_loopback_main(int S, int M, int reps, int json) {
  if (nb__bw_setup() != 0) return 1;
  nb__bw_lb_t o;
  nb__bw_loopback_set(S, (size_t)M << 20, reps, 4, &o);
  if (nb__bw_only >= 0) {
    int k = nb__bw_only;
    printf("%s: %.2f Gbit/s [%.2f, %.2f], %.3f CPU s/GiB\n", nb__bw_variant[k], o.med[k], o.lo[k],
           o.hi[k], o.cpu[k]);
    return o.med[k] > 0 ? 0 : 1;
  }
  if (o.med[0] <= 0 || o.med[1] <= 0) return 1;
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_int(&j, "streams", S);
    nb_json_int(&j, "mib", M);
    nb_json_int(&j, "reps", reps);
    static const char* const names[4] = {"plain", "secure", "tls_only", "seal_only"};
    char key[64];
    for (int k = 0; k < 4; k++) {
      snprintf(key, sizeof key, "loopback_%s_gbps", names[k]);
      nb_json_num(&j, key, o.med[k]);
      snprintf(key, sizeof key, "loopback_%s_min_gbps", names[k]);
      nb_json_num(&j, key, o.lo[k]);
      snprintf(key, sizeof key, "loopback_%s_max_gbps", names[k]);
      nb_json_num(&j, key, o.hi[k]);
      snprintf(key, sizeof key, "loopback_%s_cpu_s_per_gib", names[k]);
      nb_json_num(&j, key, o.cpu[k]);
    }
    nb_json_num(&j, "secure_over_plain", o.med[1] / o.med[0]);
    nb_json_num(&j, "secure_over_plain_paired", o.ratio);
    nb_json_num(&j, "plain_over_secure_cpu", o.cpu[0] / o.cpu[1]);
    nb_json_end(&j);
  } else {
    static const char* const names[4] = {"plain", "mTLS+seal", "mTLS only", "seal only"};
    printf("loopback, %d streams, %d MiB, medians of %d interleaved runs [min, max]:\n", S, M,
           reps);
    for (int k = 0; k < 4; k++)
      printf("  %-10s %6.2f Gbit/s [%5.2f, %5.2f]  (%.3f of plain)  %.3f CPU s/GiB (%.3f)\n",
             names[k], o.med[k], o.lo[k], o.hi[k], o.med[k] / o.med[0], o.cpu[k],
             o.cpu[k] / o.cpu[0]);
    printf("secure / plain = %.3f (median of per-repetition ratios %.3f; target >= 0.90)\n",
           o.med[1] / o.med[0], o.ratio);
    printf("CPU: plain / secure = %.3f\n", o.cpu[0] / o.cpu[1]);
  }
  return 0;
}

/* Step 3 of the WAN run: M MiB through inter/link over mTLS with sealing, from namespace ns_a
 * to ns_b over S streams. Returns 0 with the sender's seconds, bytes and reconnects, else 1. */
static int nb__bw_link_transfer(const char* ns_a, const char* ns_b, int S, int M, int json,
                                double* secs, unsigned long long* bytes, unsigned* reconnects) {
  if (!json) fprintf(stderr, "bench wan: %d MiB over %d streams through inter/link...\n", M, S);
  char mib_s[16], s_s[16], listen[64], target[64];
  snprintf(mib_s, sizeof mib_s, "%d", M);
  snprintf(s_s, sizeof s_s, "%d", S);
  snprintf(listen, sizeof listen, "169.254.100.2:%d", NB__BW_PORT);
  snprintf(target, sizeof target, "169.254.100.2:%d", NB__BW_PORT);
  char* serve_args[] = {"--serve", nb__bw_certs, listen, mib_s, NULL};
  FILE *srv_out = NULL, *snd_out = NULL;
  nb__bw_kids[0] = nb__bw_spawn(ns_b, serve_args, &srv_out);
  char line[256] = {0};
  if (nb__bw_kids[0] < 0 || !srv_out || !fgets(line, sizeof line, srv_out) ||
      strncmp(line, "READY", 5) != 0) {
    fprintf(stderr, "nebula bench wan: the receiver did not start\n");
    return 1;
  }
  char* send_args[] = {"--send", nb__bw_certs, target, mib_s, s_s, NULL};
  nb__bw_kids[1] = nb__bw_spawn(ns_a, send_args, &snd_out);
  line[0] = 0;
  int got = snd_out && fgets(line, sizeof line, snd_out) &&
            sscanf(line, "SENT %lf %llu %u", secs, bytes, reconnects) == 3;
  int wst = 0;
  if (nb__bw_kids[1] > 0) waitpid(nb__bw_kids[1], &wst, 0);
  nb__bw_kids[1] = -1;
  char ok[16] = {0};
  int rx_ok = srv_out && fgets(ok, sizeof ok, srv_out) && strncmp(ok, "OK", 2) == 0;
  if (nb__bw_kids[0] > 0) waitpid(nb__bw_kids[0], &wst, 0);
  nb__bw_kids[0] = -1;
  if (srv_out) fclose(srv_out);
  if (snd_out) fclose(snd_out);
  if (!got || !rx_ok || *secs <= 0) {
    fprintf(stderr, "nebula bench wan: the transfer over the link failed\n");
    return 1;
  }
  return 0;
}

/* The WAN run's results: JSON, or one line per measurement. */
static void nb__bw_print(int json, double rate, double delay, int S, int M, double iperf,
                         double goodput, double secs, unsigned reconnects, const nb__bw_lb_t* lb) {
  double plain = lb->med[0], secure = lb->med[1], tls_only = lb->med[2], seal_only = lb->med[3];
  double eff = goodput / iperf;
  if (json) {
    nb_json_obj_t j;
    nb_json_begin(&j, stdout);
    nb_json_num(&j, "rate_mbit", rate);
    nb_json_num(&j, "delay_ms", delay);
    nb_json_int(&j, "streams", S);
    nb_json_num(&j, "iperf3_mbit", iperf);
    nb_json_num(&j, "goodput_mbit", goodput);
    nb_json_num(&j, "efficiency", eff);
    nb_json_num(&j, "loopback_plain_gbps", plain);
    nb_json_num(&j, "loopback_secure_gbps", secure);
    nb_json_end(&j);
  } else {
    printf("link: %g Mbit/s each way, %g ms one way (RTT %g ms), %d streams, %d MiB\n", rate, delay,
           2 * delay, S, M);
    printf("iperf3 (-P %d):        %8.1f Mbit/s\n", S, iperf);
    printf("inter/link mTLS+seal:  %8.1f Mbit/s  (%.2f s, %u reconnects)\n", goodput, secs,
           reconnects);
    printf(
        "efficiency:            %8.3f  (goodput / iperf3; target >= 0.90 at 50 ms RTT, "
        ">= 0.85 at 200 ms)\n",
        eff);
    printf("loopback plain:        %8.2f Gbit/s\n", plain);
    printf("loopback mTLS+seal:    %8.2f Gbit/s  (secure / plain = %.3f; target >= 0.90)\n", secure,
           plain > 0 ? secure / plain : 0);
    printf("loopback mTLS only:    %8.2f Gbit/s  (%.3f of plain)\n", tls_only,
           plain > 0 ? tls_only / plain : 0);
    printf("loopback seal only:    %8.2f Gbit/s  (%.3f of plain)\n", seal_only,
           plain > 0 ? seal_only / plain : 0);
  }
}

int nb_bench_wan_main(int argc, char** argv) {
  if (argc >= 2 && !strcmp(argv[1], "--serve") && argc == 5)
    return nb__bw_serve(argv[2], argv[3], atoi(argv[4]));
  if (argc >= 2 && !strcmp(argv[1], "--send") && argc == 6)
    return nb__bw_send_main(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
  double rate = 100, delay = 25, streams = 4, mib = 256, iperf_s = 8, reps = 5;
  int json = 0, loopback_only = 0;
  const char *wan_dir = NULL, *only = NULL;
  const nb_opt_t opts[] = {
      NB_OPTION("rate-mbit", NB_OPT_DOUBLE, &rate, "R", "the link's rate each way, Mbit/s",
                .min = 1, .max = 10000),
      NB_OPTION("delay-ms", NB_OPT_DOUBLE, &delay, "D", "one-way delay, ms", .max = 10000),
      NB_OPTION("streams", NB_OPT_DOUBLE, &streams, "S", "parallel streams", .min = 1, .max = 64),
      NB_OPTION("mib", NB_OPT_DOUBLE, &mib, "M", "MiB moved", .min = 1, .max = 4096),
      NB_OPTION("iperf-s", NB_OPT_DOUBLE, &iperf_s, "T", "seconds of iperf3", .min = 3, .max = 600),
      NB_OPTION("reps", NB_OPT_DOUBLE, &reps, "R", "loopback repetitions", .min = 1, .max = 64),
      NB_OPTION("wan-dir", NB_OPT_STR, &wan_dir, "DIR", "the folder of wan-up.sh (deploy/wan)"),
      NB_OPTION("loopback-only", NB_OPT_FLAG, &loopback_only, NULL, "only the loopback part"),
      NB_OPTION("only", NB_OPT_STR, &only, "V", "one loopback variant: plain, secure, tls or seal"),
      NB_OPTION("json", NB_OPT_FLAG, &json, NULL, "print one JSON object"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula bench wan", .synopsis = NB__BW_SYNOPSIS, .about = NB__BW_ABOUT, .opts = opts};
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  for (int k = 0; only && k < 4; k++)
    if (!strcmp(only, nb__bw_variant[k])) nb__bw_only = k;
  if (only && nb__bw_only < 0)
    return nb_opts_usage_error(&spec, "--only takes plain, secure, tls or seal");
  if (loopback_only) return nb__bw_loopback_main((int)streams, (int)mib, (int)reps, json);
  if (geteuid() != 0) {
    fprintf(stderr,
            "nebula bench wan: needs root (it creates network namespaces with "
            "deploy/wan/wan-up.sh); run it with sudo\n");
    return 2;
  }
  if (nb__bw_find_wan_dir(wan_dir) != 0) return 2;
  int S = (int)streams, M = (int)mib;
  if (nb__bw_setup() != 0) return 1;
  /* 1. the link */
  snprintf(nb__bw_prefix, sizeof nb__bw_prefix, "nbbw-%d", (int)getpid());
  char cmd[PATH_MAX + 256];
  snprintf(cmd, sizeof cmd,
           "bash '%s/wan-up.sh' --prefix '%s' --rate-mbit %g --delay-ms %g >/dev/null",
           nb__bw_wan_dir, nb__bw_prefix, rate, delay);
  if (system(cmd) != 0) {
    fprintf(stderr, "nebula bench wan: wan-up.sh failed\n");
    nb__bw_prefix[0] = 0; /* wan-up.sh tears down what it made */
    return 1;
  }
  char ns_a[96], ns_b[96];
  snprintf(ns_a, sizeof ns_a, "%s-a", nb__bw_prefix);
  snprintf(ns_b, sizeof ns_b, "%s-b", nb__bw_prefix);
  /* 2. iperf3 on it, the capacity baseline */
  if (!json) fprintf(stderr, "bench wan: iperf3 -P %d for %g s on the link...\n", S, iperf_s);
  double iperf = nb__bw_iperf(S, (int)iperf_s);
  if (iperf <= 0) {
    fprintf(stderr, "nebula bench wan: iperf3 measurement failed\n");
    return 1;
  }
  /* 3. M MiB through inter/link over mTLS with sealing, namespace a -> b */
  double secs = 0;
  unsigned long long bytes = 0;
  unsigned reconnects = 0;
  if (nb__bw_link_transfer(ns_a, ns_b, S, M, json, &secs, &bytes, &reconnects) != 0) return 1;
  double goodput = (double)bytes * 8e-6 / secs;
  /* 4. tear the link down before the loopback runs, so they do not share the cores with it */
  char pfx[64];
  snprintf(pfx, sizeof pfx, "%s", nb__bw_prefix);
  snprintf(cmd, sizeof cmd, "bash '%s/wan-down.sh' --prefix '%s' >/dev/null 2>&1", nb__bw_wan_dir,
           pfx);
  if (system(cmd) == 0) nb__bw_prefix[0] = 0;
  /* 5. loopback: the same transfer without and with TLS + sealing */
  if (!json) fprintf(stderr, "bench wan: loopback plain vs mTLS+sealed...\n");
  nb__bw_lb_t lb;
  nb__bw_loopback_set(S, (size_t)M << 20, 5, json ? 2 : 4, &lb);
  nb__bw_print(json, rate, delay, S, M, iperf, goodput, secs, reconnects, &lb);
  return 0;
}
