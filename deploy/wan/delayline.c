/* nb-delayline: a userspace one-way delay line between two TAP devices, each in its own network
 * namespace, for emulating a long WAN link on a kernel without netem. It holds every frame for the
 * configured delay in a bounded FIFO per direction (tail drop when full) and forwards it unchanged.
 * It is not a shaper: rate limiting is done by tbf on the TAP devices (see wan-up.sh). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define DL_MAX_FRAME 65536 /* read buffer: anything longer than the slot is counted as oversize */
#define DL_BATCH 64 /* frames read per wake-up per device, so one side cannot starve the other */

typedef struct {
  int64_t release_ns; /* CLOCK_MONOTONIC time at which the frame leaves */
  uint32_t len;
} dl_hdr_t;

/* One direction: frames read from `in` wait in a ring of fixed-size slots, then go to `out`. */
typedef struct {
  const char* name; /* "a->b" */
  int in, out;
  unsigned char* slots; /* nslots * slot_size bytes */
  dl_hdr_t* hdr;
  size_t nslots, slot_size, head, count;
  int64_t delay_ns;
  uint64_t frames, bytes, drop_full, drop_oversize, drop_cut, tx_err, max_depth;
  int64_t max_late_ns; /* worst lateness of a release against its due time */
} dl_dir_t;

static int64_t dl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void dl_usage(FILE* f) {
  fprintf(
      f,
      "usage: nb-delayline --ns-a NS --tap-a DEV --ns-b NS --tap-b DEV --delay-ms D\n"
      "                    [--delay-ba-ms D] [--mtu N] [--queue-frames N] [--pidfile F]\n"
      "                    [--realtime]\n"
      "Forwards Ethernet frames between TAP device DEV-a (in network namespace NS-a) and DEV-b\n"
      "(in NS-b), holding each frame D milliseconds (fractions allowed) in each direction.\n"
      "NS is a name under /run/netns or a path; \"-\" means the current namespace.\n"
      "--delay-ba-ms sets the b->a delay when it differs from a->b.\n"
      "--queue-frames bounds each direction's queue (default 16384); frames arriving at a full\n"
      "queue are dropped and counted. SIGTERM/SIGINT: print statistics and exit 0.\n"
      "SIGUSR1: print statistics and continue. SIGRTMIN: cut the link (every frame is\n"
      "dropped, in both directions, like a cable cut: endpoints see silence, not errors).\n"
      "SIGRTMIN+1: restore it. --realtime: run at SCHED_FIFO priority 10 (falls back to nice "
      "-10).\n");
}

/* Opens TAP device `dev` inside namespace `ns` ("-" = current) and returns its fd, or -1. The
 * calling thread returns to `home_ns` afterwards; the fd stays bound to the device. */
static int dl_open_tap(const char* ns, const char* dev, int home_ns) {
  int nsfd = -1, fd = -1;
  if (strcmp(ns, "-") != 0) {
    char path[512];
    if (strchr(ns, '/'))
      snprintf(path, sizeof path, "%s", ns);
    else
      snprintf(path, sizeof path, "/run/netns/%s", ns);
    nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) {
      fprintf(stderr, "nb-delayline: cannot open namespace %s: %s\n", path, strerror(errno));
      return -1;
    }
    if (setns(nsfd, CLONE_NEWNET) != 0) {
      fprintf(stderr, "nb-delayline: setns(%s): %s (root needed)\n", path, strerror(errno));
      close(nsfd);
      return -1;
    }
  }
  fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "nb-delayline: open /dev/net/tun: %s\n", strerror(errno));
  } else {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", dev);
    if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
      fprintf(stderr, "nb-delayline: TUNSETIFF %s in %s: %s\n", dev, ns, strerror(errno));
      close(fd);
      fd = -1;
    }
  }
  if (nsfd >= 0) {
    if (setns(home_ns, CLONE_NEWNET) != 0) {
      fprintf(stderr, "nb-delayline: cannot return to the original namespace: %s\n",
              strerror(errno));
      if (fd >= 0) close(fd);
      fd = -1;
    }
    close(nsfd);
  }
  return fd;
}

static int dl_dir_init(dl_dir_t* d, const char* name, int in, int out, size_t nslots,
                       size_t slot_size, int64_t delay_ns) {
  memset(d, 0, sizeof *d);
  d->name = name;
  d->in = in;
  d->out = out;
  d->nslots = nslots;
  d->slot_size = slot_size;
  d->delay_ns = delay_ns;
  d->slots = malloc(nslots * slot_size);
  d->hdr = calloc(nslots, sizeof *d->hdr);
  if (!d->slots || !d->hdr) {
    fprintf(stderr, "nb-delayline: cannot allocate %zu x %zu bytes for %s\n", nslots, slot_size,
            name);
    return -1;
  }
  return 0;
}

/* Reads up to DL_BATCH frames from d->in into the queue. Returns -1 on a fatal read error. */
static int dl_ingest(dl_dir_t* d, unsigned char* scratch, int cut) {
  for (int i = 0; i < DL_BATCH; ++i) {
    ssize_t n = read(d->in, scratch, DL_MAX_FRAME);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return 0;
      if (errno == EIO) return 0; /* device down: nothing to read now */
      fprintf(stderr, "nb-delayline: read (%s): %s\n", d->name, strerror(errno));
      return -1;
    }
    if (n == 0) return 0;
    int64_t now = dl_now_ns();
    if (cut) {
      d->drop_cut++;
      continue;
    }
    if ((size_t)n > d->slot_size) {
      d->drop_oversize++;
      continue;
    }
    if (d->count == d->nslots) {
      d->drop_full++;
      continue;
    }
    size_t tail = (d->head + d->count) % d->nslots;
    memcpy(d->slots + tail * d->slot_size, scratch, (size_t)n);
    d->hdr[tail].len = (uint32_t)n;
    d->hdr[tail].release_ns = now + d->delay_ns;
    d->count++;
    if (d->count > d->max_depth) d->max_depth = d->count;
  }
  return 0;
}

/* Writes every frame whose release time has come. */
static void dl_release(dl_dir_t* d, int64_t now) {
  while (d->count > 0 && d->hdr[d->head].release_ns <= now) {
    dl_hdr_t* h = &d->hdr[d->head];
    int64_t late = now - h->release_ns;
    if (late > d->max_late_ns) d->max_late_ns = late;
    ssize_t w = write(d->out, d->slots + d->head * d->slot_size, h->len);
    if (w == (ssize_t)h->len) {
      d->frames++;
      d->bytes += h->len;
    } else {
      d->tx_err++; /* device down or full: the frame is lost, as on a real link */
    }
    d->head = (d->head + 1) % d->nslots;
    d->count--;
  }
}

static void dl_stats(FILE* f, const dl_dir_t* d, int n) {
  for (int i = 0; i < n; ++i)
    fprintf(f,
            "nb-delayline: %s frames=%llu bytes=%llu drop_full=%llu drop_oversize=%llu "
            "drop_cut=%llu tx_err=%llu max_depth=%llu max_late_us=%.1f queued=%zu\n",
            d[i].name, (unsigned long long)d[i].frames, (unsigned long long)d[i].bytes,
            (unsigned long long)d[i].drop_full, (unsigned long long)d[i].drop_oversize,
            (unsigned long long)d[i].drop_cut, (unsigned long long)d[i].tx_err,
            (unsigned long long)d[i].max_depth, (double)d[i].max_late_ns / 1e3, d[i].count);
  fflush(f);
}

static int dl_parse_ms(const char* s, const char* what, int64_t* out_ns) {
  char* end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end != '\0' || !(v >= 0.0) || v > 60000.0) {
    fprintf(stderr, "nb-delayline: %s must be a number of milliseconds in [0, 60000], got '%s'\n",
            what, s);
    return -1;
  }
  *out_ns = (int64_t)(v * 1e6 + 0.5);
  return 0;
}

static int dl_parse_size(const char* s, const char* what, long lo, long hi, long* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "nb-delayline: %s must be an integer in [%ld, %ld], got '%s'\n", what, lo, hi,
            s);
    return -1;
  }
  *out = v;
  return 0;
}

int main(int argc, char** argv) {
  const char *ns_a = NULL, *ns_b = NULL, *tap_a = NULL, *tap_b = NULL, *pidfile = NULL;
  int64_t delay_ab = -1, delay_ba = -1;
  long mtu = 1500, nslots = 16384;
  int realtime = 0;
  static const struct option opts[] = {
      {"ns-a", required_argument, 0, 'A'},     {"ns-b", required_argument, 0, 'B'},
      {"tap-a", required_argument, 0, 'a'},    {"tap-b", required_argument, 0, 'b'},
      {"delay-ms", required_argument, 0, 'd'}, {"delay-ba-ms", required_argument, 0, 'r'},
      {"mtu", required_argument, 0, 'm'},      {"queue-frames", required_argument, 0, 'q'},
      {"pidfile", required_argument, 0, 'p'},  {"realtime", no_argument, 0, 't'},
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case 'A':
        ns_a = optarg;
        break;
      case 'B':
        ns_b = optarg;
        break;
      case 'a':
        tap_a = optarg;
        break;
      case 'b':
        tap_b = optarg;
        break;
      case 'd':
        if (dl_parse_ms(optarg, "--delay-ms", &delay_ab)) return 2;
        break;
      case 'r':
        if (dl_parse_ms(optarg, "--delay-ba-ms", &delay_ba)) return 2;
        break;
      case 'm':
        if (dl_parse_size(optarg, "--mtu", 68, 9000, &mtu)) return 2;
        break;
      case 't':
        realtime = 1;
        break;
      case 'q':
        if (dl_parse_size(optarg, "--queue-frames", 16, 1 << 20, &nslots)) return 2;
        break;
      case 'p':
        pidfile = optarg;
        break;
      case 'h':
        dl_usage(stdout);
        return 0;
      default:
        dl_usage(stderr);
        return 2;
    }
  }
  if (optind != argc || !ns_a || !ns_b || !tap_a || !tap_b || delay_ab < 0) {
    fprintf(stderr, "nb-delayline: --ns-a, --ns-b, --tap-a, --tap-b and --delay-ms are required\n");
    dl_usage(stderr);
    return 2;
  }
  if (strlen(tap_a) >= IFNAMSIZ || strlen(tap_b) >= IFNAMSIZ) {
    fprintf(stderr, "nb-delayline: device names must be shorter than %d bytes\n", IFNAMSIZ);
    return 2;
  }
  if (delay_ba < 0) delay_ba = delay_ab;
  if (realtime) {
    /* A delay line that is not scheduled for a while releases frames late and lets the TAP rings
     * overflow; on a busy machine a modest real-time priority keeps it on time. It sleeps in
     * epoll between frames, and the kernel's RT throttling bounds it if the link is saturated. */
    struct sched_param sp = {.sched_priority = 10};
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
      fprintf(stderr, "nb-delayline: no real-time priority (%s); using nice -10\n",
              strerror(errno));
      errno = 0;
      if (nice(-10) == -1 && errno != 0)
        fprintf(stderr, "nb-delayline: nice -10 failed too (%s)\n", strerror(errno));
    }
  }

  /* Signals arrive through a signalfd so the loop sees them in order with I/O. */
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGUSR1);
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGRTMIN);
  sigaddset(&mask, SIGRTMIN + 1);
  if (sigprocmask(SIG_BLOCK, &mask, NULL) != 0) {
    perror("nb-delayline: sigprocmask");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  int rc = 1, cut = 0, home = -1, fa = -1, fb = -1, sfd = -1, tfd = -1, ep = -1;
  unsigned char* scratch = NULL;
  dl_dir_t dir[2];
  memset(dir, 0, sizeof dir);

  home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) {
    perror("nb-delayline: open /proc/self/ns/net");
    goto out;
  }
  fa = dl_open_tap(ns_a, tap_a, home);
  if (fa < 0) goto out;
  fb = dl_open_tap(ns_b, tap_b, home);
  if (fb < 0) goto out;

  /* A slot holds one frame: MTU + Ethernet header + one VLAN tag. */
  size_t slot = (size_t)mtu + 18;
  if (dl_dir_init(&dir[0], "a->b", fa, fb, (size_t)nslots, slot, delay_ab) ||
      dl_dir_init(&dir[1], "b->a", fb, fa, (size_t)nslots, slot, delay_ba))
    goto out;
  scratch = malloc(DL_MAX_FRAME);
  sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  ep = epoll_create1(EPOLL_CLOEXEC);
  if (!scratch || sfd < 0 || tfd < 0 || ep < 0) {
    perror("nb-delayline: setup");
    goto out;
  }
  int fds[4] = {fa, fb, sfd, tfd};
  for (int i = 0; i < 4; ++i) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
      perror("nb-delayline: epoll_ctl");
      goto out;
    }
  }
  if (pidfile) {
    /* Written only once both devices are attached: its presence means "forwarding". */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", pidfile);
    FILE* pf = fopen(tmp, "w");
    if (!pf || fprintf(pf, "%ld\n", (long)getpid()) < 0 || fclose(pf) != 0 ||
        rename(tmp, pidfile) != 0) {
      fprintf(stderr, "nb-delayline: cannot write pidfile %s: %s\n", pidfile, strerror(errno));
      goto out;
    }
  }
  fprintf(stdout,
          "nb-delayline: forwarding %s/%s <-> %s/%s, delay a->b %.3f ms, b->a %.3f ms, "
          "queue %ld frames of %zu bytes per direction\n",
          ns_a, tap_a, ns_b, tap_b, (double)delay_ab / 1e6, (double)delay_ba / 1e6, nslots, slot);
  fflush(stdout);

  int64_t armed = -1; /* release time the timer is set for, -1 = disarmed */
  for (;;) {
    struct epoll_event evs[8];
    int n = epoll_wait(ep, evs, 8, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      perror("nb-delayline: epoll_wait");
      goto out;
    }
    for (int i = 0; i < n; ++i) {
      uint32_t which = evs[i].data.u32;
      if (which == 0 || which == 1) {
        if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
          fprintf(stderr, "nb-delayline: device %s went away\n", which == 0 ? tap_a : tap_b);
          goto out;
        }
        if (dl_ingest(&dir[which], scratch, cut) != 0) goto out;
      } else if (which == 2) {
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
          if (si.ssi_signo == SIGUSR1) {
            dl_stats(stdout, dir, 2);
          } else if ((int)si.ssi_signo == SIGRTMIN || (int)si.ssi_signo == SIGRTMIN + 1) {
            cut = (int)si.ssi_signo == SIGRTMIN;
            if (cut) {
              /* Frames already in flight are lost too, as on a cut cable. */
              for (int d = 0; d < 2; ++d) {
                dir[d].drop_cut += dir[d].count;
                dir[d].count = 0;
              }
            }
            fprintf(stdout, "nb-delayline: link %s\n", cut ? "cut" : "restored");
            fflush(stdout);
          } else {
            dl_stats(stdout, dir, 2);
            rc = 0;
            goto out;
          }
        }
      } else {
        uint64_t ticks;
        while (read(tfd, &ticks, sizeof ticks) == (ssize_t)sizeof ticks) {
        }
        armed = -1;
      }
    }
    int64_t now = dl_now_ns();
    dl_release(&dir[0], now);
    dl_release(&dir[1], now);
    /* Arm the timer for the earliest frame still waiting. */
    int64_t next = -1;
    for (int d = 0; d < 2; ++d)
      if (dir[d].count > 0 && (next < 0 || dir[d].hdr[dir[d].head].release_ns < next))
        next = dir[d].hdr[dir[d].head].release_ns;
    if (next != armed) {
      struct itimerspec its;
      memset(&its, 0, sizeof its);
      if (next >= 0) {
        if (next <= 0) next = 1;
        its.it_value.tv_sec = next / 1000000000LL;
        its.it_value.tv_nsec = next % 1000000000LL;
      }
      if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) != 0) {
        perror("nb-delayline: timerfd_settime");
        goto out;
      }
      armed = next;
    }
  }

out:
  if (ep >= 0) close(ep);
  if (tfd >= 0) close(tfd);
  if (sfd >= 0) close(sfd);
  if (fa >= 0) close(fa);
  if (fb >= 0) close(fb);
  if (home >= 0) close(home);
  if (pidfile && rc == 0) unlink(pidfile);
  for (int d = 0; d < 2; ++d) {
    free(dir[d].slots);
    free(dir[d].hdr);
  }
  free(scratch);
  return rc;
}
