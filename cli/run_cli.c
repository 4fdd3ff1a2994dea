/* `nebula run JOB.json`: every cluster of a job on this machine, without gateways: a PKI and a
 * job secret in the run folder, one `nebula worker` (or mpirun) per cluster, either each of two
 * clusters in its own network namespace behind the emulated WAN link of deploy/wan (root; rate
 * and one-way delay from the job's link) or on a free loopback port (the link's rate cap only),
 * their logs streamed with a [cluster] prefix, every child stopped on the first failure or on
 * SIGINT/SIGTERM, the link torn down, and a summary table. Not here: more than two clusters in
 * namespaces (deploy/wan builds one pair), gateways. A job whose descriptor names the user's
 * program (spec.program) runs that command per cluster instead of the worker, with the NEBULA_*
 * environment of jobs/job_program.h (the gateway's), and its table comes from progress.jsonl. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/opts.h"
#include "common/common.h"
#include "common/install.h"
#include "jobs/descriptor.h"
#include "jobs/job_paths.h"
#include "jobs/job_program.h"
#include "report/report.h"
#include "security/pki.h"
#include "security/seal.h"

static volatile sig_atomic_t nb__run_stop = 0;
static void nb__run_on_signal(int sig) {
  nb__run_stop = sig;
}

typedef struct {
  char id[NB_JOB_NAME_MAX];
  int port;
  pid_t pid;
  int done, status;
  char dir[NB_JOB_PATH_MAX + 80];
  char log[NB_JOB_PATH_MAX + 96];
  long log_off;
  char partial[1024];
  size_t partial_len;
  int restarts; /* times restarted with --rejoin after being killed */
} nb__run_child_t;

NB_PARAM_INT(RunRestarts, "NB_RUN_RESTARTS", 2, 0, 100,
             "nebula run: times a cluster killed by a signal is restarted with --rejoin")

static int nb__run_mkdir(const char* p, mode_t mode) {
  return mkdir(p, mode) != 0 && errno != EEXIST ? -1 : 0;
}

/* Creates the missing parents of path (like mkdir -p of its dirname). */
static int nb__run_mkparents(const char* path) {
  char tmp[NB_JOB_PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char* q = tmp + 1; *q; q++) {
    if (*q != '/') continue;
    *q = '\0';
    if (nb__run_mkdir(tmp, 0755) != 0) return -1;
    *q = '/';
  }
  return 0;
}

/* Distinct free loopback ports: all sockets stay bound until every port is chosen. */
static int nb__run_ports(int n, int* ports) {
  int fds[NB_JOB_MAX_CLUSTERS], rc = 0;
  for (int i = 0; i < n; i++) fds[i] = -1;
  for (int i = 0; i < n && rc == 0; i++) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fds[i] < 0 || bind(fds[i], (struct sockaddr*)&a, sizeof a) != 0 ||
        getsockname(fds[i], (struct sockaddr*)&a, &al) != 0)
      rc = -1;
    else
      ports[i] = ntohs(a.sin_port);
  }
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  return rc;
}

/* Prints the complete new lines of a child's log with its cluster as prefix. */
static void nb__run_pump(nb__run_child_t* c, int flush) {
  FILE* f = fopen(c->log, "r");
  if (!f) return;
  if (fseek(f, c->log_off, SEEK_SET) == 0) {
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
      c->log_off += (long)got;
      for (size_t i = 0; i < got; i++) {
        if (buf[i] == '\n' || c->partial_len == sizeof c->partial - 1) {
          printf("[%s] %.*s\n", c->id, (int)c->partial_len, c->partial);
          c->partial_len = 0;
          if (buf[i] == '\n') continue;
        }
        c->partial[c->partial_len++] = buf[i];
      }
    }
  }
  fclose(f);
  if (flush && c->partial_len) {
    printf("[%s] %.*s\n", c->id, (int)c->partial_len, c->partial);
    c->partial_len = 0;
  }
  fflush(stdout);
}

static void nb__run_kill_all(nb__run_child_t* ch, int n) {
  for (int i = 0; i < n; i++)
    if (ch[i].pid > 0 && !ch[i].done) {
      kill(-ch[i].pid, SIGTERM); /* the child's process group: mpirun and its ranks */
      kill(ch[i].pid, SIGTERM);
    }
  double t0 = nb_now_s();
  for (;;) {
    int left = 0;
    for (int i = 0; i < n; i++) {
      if (ch[i].pid <= 0 || ch[i].done) continue;
      if (waitpid(ch[i].pid, &ch[i].status, WNOHANG) == ch[i].pid)
        ch[i].done = 1;
      else
        left++;
    }
    if (!left) return;
    if (nb_now_s() - t0 > 3) {
      for (int i = 0; i < n; i++)
        if (ch[i].pid > 0 && !ch[i].done) {
          kill(-ch[i].pid, SIGKILL);
          kill(ch[i].pid, SIGKILL);
          waitpid(ch[i].pid, &ch[i].status, 0);
          ch[i].done = 1;
        }
      return;
    }
    nb_sleep_ns(50000000);
  }
}

/* The emulated WAN link of a namespace run (deploy/wan): prefix, scripts, addresses. */
typedef struct {
  int on, up;
  char prefix[32];
  char dir[4096]; /* deploy/wan */
  const char* addr[2];
  char ns[2][48];
} nb__run_wan_t;

/* Finds the WAN scripts and, for a link with a delay, the delay line (common/install.h: the
 * build tree's layout and the install tree's, relative to this executable, or $NB_WAN_DIR and
 * $NB_DELAYLINE); the delay line goes to the scripts as NB_DELAYLINE. 0, or -1 with why (what
 * is missing and where it was looked for). */
static int nb__run_wan_find(int need_delayline, nb__run_wan_t* w, char* why, size_t cap) {
  char tried[2048], dl[4096];
  if (nb_install_wan_dir(w->dir, sizeof w->dir, tried, sizeof tried) != NB_OK) {
    snprintf(why, cap, "the WAN scripts (wan-up.sh) are not in %s: %s", tried, nb_error_last());
    return -1;
  }
  if (!need_delayline) return 0;
  if (nb_install_delayline(w->dir, dl, sizeof dl, tried, sizeof tried) != NB_OK) {
    snprintf(why, cap, "the delay line nb-delayline is not in %s: %s", tried, nb_error_last());
    return -1;
  }
  setenv("NB_DELAYLINE", dl, 1);
  return 0;
}

/* Runs deploy/wan/<script> with args in its own process group (a Ctrl-C meant for us must not
 * cut a set-up or tear-down short), output appended to log. Returns its exit status, -1. */
static int nb__run_wan_script(const nb__run_wan_t* w, const char* script, const char* const* args,
                              const char* log) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", w->dir, script);
  const char* av[16];
  int k = 0;
  av[k++] = "bash";
  av[k++] = path;
  for (int i = 0; args[i] && k < 15; i++) av[k++] = args[i];
  av[k] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execvp("bash", (char* const*)av);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Brings the link up: rate each way = link.rateMbit (0 = unshaped), one-way delay link.delayMs. */
static int nb__run_wan_up(nb__run_wan_t* w, const nb_job_config_t* job, const char* log) {
  char rate[32], delay[32];
  snprintf(rate, sizeof rate, "%g", job->link.rate_mbit > 0 ? job->link.rate_mbit : 0.0);
  snprintf(delay, sizeof delay, "%g", job->link.delay_ms > 0 ? job->link.delay_ms : 0.0);
  const char* args[] = {"--prefix", w->prefix, "--rate-mbit", rate, "--delay-ms", delay, NULL};
  w->up = 1; /* from here on, tear down whatever happens (wan-down is idempotent) */
  int rc = nb__run_wan_script(w, "wan-up.sh", args, log);
  if (rc != 0) {
    fprintf(stderr, "nebula run: the emulated WAN link did not come up (exit %d; see %s)\n", rc,
            log);
    return -1;
  }
  printf("nebula run: WAN link %s: %s (%s) <-> %s (%s), %s Mbit/s each way, %s ms one way\n",
         w->prefix, w->ns[0], w->addr[0], w->ns[1], w->addr[1], rate, delay);
  return 0;
}

static void nb__run_wan_down(nb__run_wan_t* w, const char* log) {
  if (!w->up) return;
  const char* args[] = {"--prefix", w->prefix, NULL};
  int rc = nb__run_wan_script(w, "wan-down.sh", args, log);
  if (rc != 0)
    fprintf(stderr,
            "nebula run: tearing down the WAN link %s failed (exit %d; see %s); run "
            "%s/wan-down.sh --prefix %s\n",
            w->prefix, rc, log, w->dir, w->prefix);
  else
    printf("nebula run: WAN link %s torn down\n", w->prefix);
  w->up = 0;
}

/* In the child: moves this process into network namespace ns (a name under /run/netns). */
static int nb__run_enter_ns(const char* ns) {
  char p[128];
  snprintf(p, sizeof p, "/run/netns/%s", ns);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc;
}

static int nb__run_setup_security(const char* dir, const nb_job_config_t* job,
                                  const nb__run_wan_t* wan, char* pki, size_t pki_cap,
                                  char* secret_path, size_t sp_cap) {
  if (snprintf(pki, pki_cap, "%s/pki", dir) >= (int)pki_cap ||
      snprintf(secret_path, sp_cap, "%s/job.secret", dir) >= (int)sp_cap) {
    fprintf(stderr, "nebula run: --out path too long\n");
    return -1;
  }
  if (nb_pki_dir_init(pki, "nebula run CA", 30, 1) != NB_OK) {
    fprintf(stderr, "nebula run: creating the PKI in %s: %s\n", pki, nb_error_last());
    return -1;
  }
  for (int i = 0; i < job->n_clusters; i++) {
    /* the address the cluster's server binds: its namespace's, or loopback */
    char san[64];
    snprintf(san, sizeof san, "IP:%s", wan->on ? wan->addr[i] : "127.0.0.1");
    const char* sans[] = {san};
    nb_pki_issue_opts_t o = {
        .kind = NB_PKI_CLUSTER, .name = job->clusters[i].id, .sans = sans, .n_sans = 1, .days = 30};
    if (nb_pki_dir_issue(pki, &o, 1) != NB_OK) {
      fprintf(stderr, "nebula run: certificate of %s: %s\n", job->clusters[i].id, nb_error_last());
      return -1;
    }
  }
  if (!job->security.seal) return 0;
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  if (nb_seal_secret_generate(secret) != NB_OK) {
    fprintf(stderr, "nebula run: job secret: %s\n", nb_error_last());
    return -1;
  }
  unlink(secret_path);
  int fd = open(secret_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  int ok = fd >= 0 && write(fd, secret, sizeof secret) == (ssize_t)sizeof secret;
  if (fd >= 0 && close(fd) != 0) ok = 0;
  memset(secret, 0, sizeof secret);
  if (!ok) {
    fprintf(stderr, "nebula run: cannot write %s: %s\n", secret_path, strerror(errno));
    return -1;
  }
  return 0;
}

/* What starting (or restarting) one cluster's worker needs. */
typedef struct {
  const char* exe;
  const char* file;
  const nb_job_config_t* job;
  nb__run_child_t* ch;
  int n;
  const nb__run_wan_t* wan;
  const char* pki;
  const char* secret;
  const char* steps;
  const char* data_dir;
  int resume;
  const int* use_mpi;
  int total_ranks;
  const char* job_dir; /* absolute: the descriptor's folder (a program job's paths are in it) */
} nb__run_spawn_t;

/* Starts cluster i's worker (mpirun with its ranks, or one process) in its own process group,
 * its output into its worker.log. rejoin: a restart after the worker was killed: --rejoin
 * instead of --resume, and the log is appended to. 0, or -1 with the reason printed. */
static int nb__run_spawn(const nb__run_spawn_t* s, int i, int rejoin) {
  const nb_job_config_t* job = s->job;
  const nb__run_wan_t* wan_p = s->wan;
  nb__run_child_t* ch = s->ch;
  const char* exe = s->exe;
  const int* use_mpi = s->use_mpi;
  int n = s->n;
  char listen[64], peer_args[NB_JOB_MAX_CLUSTERS][NB_JOB_NAME_MAX + 32];
  const char* av[96];
  int k = 0;
  snprintf(listen, sizeof listen, "%s:%d", wan_p->on ? wan_p->addr[i] : "127.0.0.1", ch[i].port);
  char np[16];
  snprintf(np, sizeof np, "%d", job->clusters[i].workers);
  if (use_mpi[i]) {
    static const char* const mpi[] = {
        "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to",           "none", "--mca",
        "btl",    "self,vader",          "--mca",           "mpi_yield_when_idle", "1",    "-np"};
    for (size_t m = 0; m < sizeof mpi / sizeof mpi[0]; m++) av[k++] = mpi[m];
    av[k++] = np;
    av[k++] = exe;
  } else {
    av[k++] = "nebula";
  }
  av[k++] = "worker";
  av[k++] = "--job";
  av[k++] = s->file;
  av[k++] = "--cluster";
  av[k++] = ch[i].id;
  av[k++] = "--out";
  av[k++] = ch[i].dir;
  av[k++] = "--listen";
  av[k++] = listen;
  av[k++] = "--pki";
  av[k++] = s->pki;
  if (job->security.seal) {
    av[k++] = "--secret-file";
    av[k++] = s->secret;
  }
  if (s->steps) {
    av[k++] = "--steps";
    av[k++] = s->steps;
  }
  if (s->data_dir) {
    av[k++] = "--data-dir";
    av[k++] = s->data_dir;
  }
  if (rejoin)
    av[k++] = "--rejoin";
  else if (s->resume)
    av[k++] = "--resume";
  if (wan_p->on) av[k++] = "--no-rate-cap"; /* tbf on the emulated link is the cap */
  for (int j = 0; j < n; j++) {
    if (j == i) continue;
    snprintf(peer_args[j], sizeof peer_args[j], "%s=%s:%d", ch[j].id,
             wan_p->on ? wan_p->addr[j] : "127.0.0.1", ch[j].port);
    av[k++] = "--peer";
    av[k++] = peer_args[j];
  }
  av[k] = NULL;
  /* a job that runs the user's program: its command with the NEBULA_* environment instead */
  char* penv[NB_JOB_PROGRAM_MAX_ENV + 1];
  int n_penv = 0;
  char pcmd[NB_JOB_PATH_MAX * 2 + 2], pdir[NB_JOB_PATH_MAX * 2 + 2];
  const char* pav[NB_JOB_PROGRAM_MAX_ARGS + 1];
  const nb_job_program_t* pg = &job->program;
  if (pg->argc > 0) {
    char progress[sizeof ch[i].dir + 32];
    snprintf(progress, sizeof progress, "%s/%s", ch[i].dir, NB_JOB_PROGRESS_FILE);
    const char* peers[NB_JOB_MAX_CLUSTERS];
    int np_ = 0;
    for (int j = 0; j < n; j++)
      if (j != i) peers[np_++] = peer_args[j];
    nb_job_program_site_t site = {.job_id = job->name,
                                  .cluster_id = ch[i].id,
                                  .cluster_index = i,
                                  .listen = listen,
                                  .peers = peers,
                                  .n_peers = np_,
                                  .pki_dir = s->pki,
                                  .secret_file = s->secret,
                                  .progress_file = progress};
    if (nb_job_program_env(job, &site, penv, NB_JOB_PROGRAM_MAX_ENV + 1, &n_penv) != NB_OK) {
      fprintf(stderr, "nebula run: %s: %s\n", ch[i].id, nb_error_last());
      return -1;
    }
    /* a command word that is a path, and workDir, are the job folder's (as for a gateway) */
    int rel = strchr(pg->argv[0], '/') && pg->argv[0][0] != '/';
    snprintf(pcmd, sizeof pcmd, "%s%s%s", rel ? s->job_dir : "", rel ? "/" : "", pg->argv[0]);
    snprintf(pdir, sizeof pdir, "%s%s%s", s->job_dir, pg->workdir[0] ? "/" : "", pg->workdir);
    pav[0] = pcmd;
    for (int a = 1; a < pg->argc; a++) pav[a] = pg->argv[a];
    pav[pg->argc] = NULL;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    nb_job_program_env_free(penv, n_penv);
    fprintf(stderr, "nebula run: fork: %s\n", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    /* the child dies with us, whatever kills us (mpirun gets SIGTERM: it stops its ranks) */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, use_mpi[i] ? SIGTERM : SIGKILL);
    if (getppid() == 1) _exit(127);
    int fd = open(ch[i].log, O_WRONLY | O_CREAT | (rejoin ? O_APPEND : O_TRUNC), 0644);
    if (fd < 0) _exit(127);
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    signal(SIGINT, SIG_IGN); /* the parent decides; it sends SIGTERM */
    if (wan_p->on && nb__run_enter_ns(wan_p->ns[i]) != 0) {
      fprintf(stderr, "nebula run: cannot enter network namespace %s: %s\n", wan_p->ns[i],
              strerror(errno));
      _exit(127);
    }
    /* share the cores among the clusters unless the job or the user says otherwise */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char th[24];
    snprintf(th, sizeof th, "%ld", cores / s->total_ranks > 1 ? cores / s->total_ranks : 1);
    if (job->clusters[i].threads_per_worker > 0)
      snprintf(th, sizeof th, "%d", job->clusters[i].threads_per_worker);
    setenv("NB_TRAIN_THREADS", th, 0);
    setenv("OPENBLAS_NUM_THREADS", th, 0);
    if (pg->argc > 0) {
      setenv("OMP_NUM_THREADS", th, 0); /* PyTorch's intra-op threads */
      for (int e = 0; e < n_penv; e++)  /* NEBULA_METRICS_LISTEN of our own wins over the key */
        if (strncmp(penv[e], "NEBULA_METRICS_LISTEN=", 22) || !getenv("NEBULA_METRICS_LISTEN"))
          putenv(penv[e]);
      if (chdir(pdir) != 0) {
        fprintf(stderr, "nebula run: %s: cannot enter the program's folder %s: %s\n", ch[i].id,
                pdir, strerror(errno));
        _exit(127);
      }
      execvp(pav[0], (char* const*)pav);
      fprintf(stderr, "nebula run: %s: cannot run %s: %s\n", ch[i].id, pav[0], strerror(errno));
      _exit(127);
    }
    if (use_mpi[i])
      execvp("mpirun", (char* const*)av);
    else
      execv(exe, (char* const*)av);
    fprintf(stderr, "nebula run: exec: %s\n", strerror(errno));
    _exit(127);
  }
  nb_job_program_env_free(penv, n_penv);
  ch[i].pid = pid;
  ch[i].done = 0;
  return 0;
}

/* A cluster's worker killed by a signal (not by us) is restarted with --rejoin: one process
 * (--rejoin does not run under mpirun yet), another cluster still training to pull the state
 * from, and restarts left. The worker refuses --rejoin itself where the job's rounds are not
 * fault-tolerant; the run then fails as for any other exit. */
static int nb__run_restartable(const nb__run_spawn_t* s, int i) {
  const nb__run_child_t* c = &s->ch[i];
  if (s->job->program.argc > 0 || !WIFSIGNALED(c->status) || WTERMSIG(c->status) == SIGTERM ||
      WTERMSIG(c->status) == SIGINT || s->use_mpi[i] || c->restarts >= nb_param_RunRestarts())
    return 0; /* SIGTERM / SIGINT: somebody meant it to stop */
  for (int j = 0; j < s->n; j++)
    if (j != i && !s->ch[j].done) return 1;
  return 0;
}

static int nb__run_table(nb__run_child_t* ch, int n, double wall) {
  printf("\n%-10s %6s %8s %10s %12s %9s %8s %8s  %s\n", "cluster", "rounds", "eval_bpb", "wan_MB",
         "bits/param", "util", "wall_s", "rtt_ms", "theta_global");
  char first[24] = "";
  int same = 1;
  for (int i = 0; i < n; i++) {
    char p[NB_JOB_PATH_MAX + 128];
    snprintf(p, sizeof p, "%s/summary.json", ch[i].dir);
    json_error_t je;
    json_t* s = json_load_file(p, 0, &je);
    if (!s) {
      printf("%-10s (no summary: %s)\n", ch[i].id, je.text);
      same = 0;
      continue;
    }
    const char* hx = json_string_value(json_object_get(s, "global_xxh3"));
    /* the link's smoothed RTT as the scheduler saw it last ("-" without adaptive decisions) */
    json_t* dec = json_object_get(s, "decisions");
    size_t nd = json_array_size(dec);
    char rtt[24] = "-";
    if (nd > 0)
      snprintf(rtt, sizeof rtt, "%.1f",
               1e3 * json_number_value(json_object_get(json_array_get(dec, nd - 1), "rtt_s")));
    printf("%-10s %6lld %8.4f %10.3f %12.4f %9.3f %8.1f %8s  %s\n", ch[i].id,
           (long long)json_integer_value(json_object_get(s, "rounds")),
           json_real_value(json_object_get(s, "final_eval_mean_bpb")),
           (double)json_integer_value(json_object_get(s, "wan_bytes_sent")) / 1e6,
           json_real_value(json_object_get(s, "bits_per_param_per_sync")),
           json_real_value(json_object_get(s, "compute_utilization")),
           json_real_value(json_object_get(s, "wall_s")), rtt, hx ? hx : "?");
    if (!hx || (first[0] && strcmp(first, hx) != 0)) same = 0;
    if (hx && !first[0]) snprintf(first, sizeof first, "%s", hx);
    json_decref(s);
  }
  printf("%s; total wall %.1f s\n",
         same ? "theta_global identical on every cluster" : "theta_global NOT identical", wall);
  return same;
}

/* A program job's table: each cluster's rounds, WAN bytes and last theta_global hash, from the
 * lines libnebula appended to its progress file. 1 when every cluster ended on one hash. */
static int nb__run_program_table(nb__run_child_t* ch, int n, double wall) {
  printf("\n%-10s %6s %10s  %s\n", "cluster", "rounds", "wan_MB", "theta_global");
  char first[24] = "";
  int same = 1;
  for (int i = 0; i < n; i++) {
    char p[NB_JOB_PATH_MAX + 128], line[1024], hx[24] = "";
    snprintf(p, sizeof p, "%s/%s", ch[i].dir, NB_JOB_PROGRESS_FILE);
    FILE* f = fopen(p, "re");
    long rounds = 0;
    double bytes = 0;
    while (f && fgets(line, sizeof line, f)) {
      json_t* o = json_loads(line, 0, NULL);
      if (!o) continue;
      rounds++;
      bytes += (double)json_integer_value(json_object_get(o, "bytes_sent"));
      const char* h = json_string_value(json_object_get(o, "global_xxh3"));
      snprintf(hx, sizeof hx, "%s", h ? h : "");
      json_decref(o);
    }
    if (f) fclose(f);
    printf("%-10s %6ld %10.3f  %s\n", ch[i].id, rounds, bytes / 1e6, hx[0] ? hx : "-");
    if (!hx[0] || (first[0] && strcmp(first, hx) != 0)) same = 0;
    if (hx[0] && !first[0]) snprintf(first, sizeof first, "%s", hx);
  }
  printf("%s; total wall %.1f s\n",
         same ? "theta_global identical on every cluster"
              : "theta_global NOT identical (or a cluster reported no round)",
         wall);
  return same;
}

/* One `nebula run`: its options, the job, the children and what the phases below set up. */
typedef struct {
  const char *file, *out, *data_dir;
  long steps;
  char steps_text[24]; /* what each worker gets as --steps; empty: none */
  int resume, no_mpi, force_netns, force_loop;
  nb__run_wan_t wan;
  char wanlog[NB_JOB_PATH_MAX + 16];
  nb_job_config_t* job;
  nb_descriptor_diag_t* diag;
  nb__run_child_t* ch;
  int n;
  char dir[NB_JOB_PATH_MAX];
  char exe[4096];
  char job_dir[4096]; /* the descriptor's folder, absolute */
  char pki[NB_JOB_PATH_MAX + 16], secret[NB_JOB_PATH_MAX + 16];
  int use_mpi[NB_JOB_MAX_CLUSTERS], total_ranks;
  nb__run_spawn_t sp;
  double t0;
} nb__run_t;

static int nb__run_load(nb__run_t* r) {
  if (nb_calloc((void**)&r->job, 1, sizeof *r->job, "job") != NB_OK ||
      nb_calloc((void**)&r->diag, 1, sizeof *r->diag, "diag") != NB_OK ||
      nb_calloc((void**)&r->ch, NB_JOB_MAX_CLUSTERS, sizeof *r->ch, "children") != NB_OK) {
    fprintf(stderr, "nebula run: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (nb_cli_descriptor_precheck(r->file) != NB_OK) {
    fprintf(stderr, "nebula run: %s\n", nb_error_last());
    return NB_EXIT_USAGE;
  }
  if (nb_descriptor_load(r->file, r->job, r->diag) != NB_OK) {
    nb_descriptor_diag_print(stderr, r->file, r->diag);
    fprintf(stderr, "nebula run: %s: invalid descriptor\n", r->file);
    return NB_EXIT_USAGE;
  }
  if (r->job->program.argc > 0 && (r->steps > 0 || r->data_dir || r->resume || r->no_mpi)) {
    fprintf(stderr,
            "nebula run: %s: $.spec.program: --steps, --data-dir, --resume and --no-mpi are the "
            "built-in worker's; this job runs the user's own program (give it its options in "
            "spec.program.command)\n",
            r->file);
    return NB_EXIT_USAGE;
  }
  if (nb_job_paths_confine_env(r->job) != NB_OK) { /* run by a gateway: paths stay in the job */
    fprintf(stderr, "nebula run: %s: %s\n", r->file, nb_error_last());
    return NB_EXIT_FAIL;
  }
  r->n = r->job->n_clusters;
  return NB_EXIT_OK;
}

/* Namespaces behind the emulated WAN (as root, two clusters, a delay or --netns), or loopback. */
static int nb__run_choose_net(nb__run_t* r) {
  nb__run_wan_t* wan = &r->wan;
  if (!(r->force_netns || (!r->force_loop && geteuid() == 0 && r->job->link.delay_ms > 0)))
    return NB_EXIT_OK;
  const char* why = NULL;
  char missing[4096];
  int not_found = 0;
  if (geteuid() != 0)
    why = "needs root";
  else if (r->n != 2)
    why = "the emulated WAN link of deploy/wan joins exactly two clusters";
  else if (nb__run_wan_find(r->job->link.delay_ms > 0, wan, missing, sizeof missing) != 0)
    why = missing, not_found = 1;
  if (why && r->force_netns) {
    fprintf(stderr, "nebula run: --netns: %s\n", why);
    return NB_EXIT_USAGE;
  }
  if (not_found) {
    /* the job asks for a delay that loopback would not have: running it anyway would measure
     * another link than the one asked for */
    fprintf(stderr,
            "nebula run: %s asks for a link with link.delayMs %g, but the WAN emulator is "
            "missing: %s.\nInstall it (make install puts the scripts in "
            "PREFIX/share/nebula/wan and nb-delayline in PREFIX/libexec/nebula), set "
            "NB_WAN_DIR (and NB_DELAYLINE), or pass --loopback to run over loopback without "
            "the delay.\n",
            r->file, r->job->link.delay_ms, why);
    return NB_EXIT_FAIL;
  }
  if (why) {
    printf("nebula run: namespaces not used (%s); running over loopback\n", why);
    return NB_EXIT_OK;
  }
  wan->on = 1;
  snprintf(wan->prefix, sizeof wan->prefix, "nbr-%ld", (long)getpid());
  snprintf(wan->ns[0], sizeof wan->ns[0], "%s-a", wan->prefix);
  snprintf(wan->ns[1], sizeof wan->ns[1], "%s-b", wan->prefix);
  wan->addr[0] = "169.254.100.1"; /* deploy/wan/lib.sh: NB_WAN_ADDR_A, _B */
  wan->addr[1] = "169.254.100.2";
  snprintf(r->wanlog, sizeof r->wanlog, "%s/wan.log", r->dir);
  return NB_EXIT_OK;
}

/* The run folder, this executable, the network, the PKI and secret, ports and child folders. */
static int nb__run_prepare(nb__run_t* r) {
  const nb_job_config_t* job = r->job;
  if ((r->out ? snprintf(r->dir, sizeof r->dir, "%s", r->out)
              : snprintf(r->dir, sizeof r->dir, "runs/%s", job->name)) >= (int)sizeof r->dir) {
    fprintf(stderr, "nebula run: --out path too long\n");
    return NB_EXIT_USAGE;
  }
  if (nb__run_mkparents(r->dir) != 0 || nb__run_mkdir(r->dir, 0700) != 0) {
    fprintf(stderr, "nebula run: cannot create %s: %s\n", r->dir, strerror(errno));
    return NB_EXIT_FAIL;
  }
  /* a user's program runs in the job's folder: the paths its environment names (PKI, secret,
   * progress file) must not be relative to ours */
  char abs[PATH_MAX];
  if (job->program.argc > 0) {
    if (!realpath(r->dir, abs) || strlen(abs) >= sizeof r->dir) {
      fprintf(stderr, "nebula run: cannot resolve %s: %s\n", r->dir, strerror(errno));
      return NB_EXIT_FAIL;
    }
    memcpy(r->dir, abs, strlen(abs) + 1);
  }
  ssize_t el = readlink("/proc/self/exe", r->exe, sizeof r->exe - 1);
  if (el <= 0) {
    fprintf(stderr, "nebula run: cannot find this executable: %s\n", strerror(errno));
    return NB_EXIT_FAIL;
  }
  r->exe[el] = 0;
  char fcopy[4096];
  snprintf(fcopy, sizeof fcopy, "%s", r->file);
  char* sl = strrchr(fcopy, '/');
  if (sl) *sl = 0;
  if (!realpath(sl ? (fcopy[0] ? fcopy : "/") : ".", r->job_dir)) {
    fprintf(stderr, "nebula run: %s: cannot resolve its folder: %s\n", r->file, strerror(errno));
    return NB_EXIT_FAIL;
  }
  /* spec.program.files come from a gateway's artifact store; on one machine they are the
   * user's own files, expected where the job would have them */
  for (int i = 0; i < job->program.n_files; i++) {
    const nb_job_program_t* pg = &job->program;
    char fp[4096 + 2 * NB_JOB_PATH_MAX + 4];
    snprintf(fp, sizeof fp, "%s/%s%s%s", r->job_dir, pg->workdir, pg->workdir[0] ? "/" : "",
             pg->files[i].path);
    if (access(fp, R_OK) != 0) {
      fprintf(stderr,
              "nebula run: %s: $.spec.program.files[%d]: %s: %s (nebula run does not fetch "
              "artifacts: put the file '%s' there, or submit the job to a gateway)\n",
              r->file, i, fp, strerror(errno), pg->files[i].artifact);
      return NB_EXIT_FAIL;
    }
  }
  int rc = nb__run_choose_net(r);
  if (rc != NB_EXIT_OK) return rc;
  if (nb__run_setup_security(r->dir, job, &r->wan, r->pki, sizeof r->pki, r->secret,
                             sizeof r->secret) != 0)
    return NB_EXIT_FAIL;
  int ports[NB_JOB_MAX_CLUSTERS];
  if (nb__run_ports(r->n, ports) != 0) {
    fprintf(stderr, "nebula run: no free loopback port: %s\n", strerror(errno));
    return NB_EXIT_FAIL;
  }
  for (int i = 0; i < r->n; i++) {
    nb__run_child_t* c = &r->ch[i];
    snprintf(c->id, sizeof c->id, "%s", job->clusters[i].id);
    c->port = ports[i];
    snprintf(c->dir, sizeof c->dir, "%s/%s", r->dir, c->id);
    snprintf(c->log, sizeof c->log, "%s/worker.log", c->dir);
    if (nb__run_mkdir(c->dir, 0755) != 0) {
      fprintf(stderr, "nebula run: cannot create %s: %s\n", c->dir, strerror(errno));
      return NB_EXIT_FAIL;
    }
  }
  return NB_EXIT_OK;
}

/* The banner, signal handlers, the emulated link, mpirun or not per cluster, and the workers. */
static int nb__run_launch(nb__run_t* r) {
  const nb_job_config_t* job = r->job;
  if (r->wan.on)
    printf(
        "nebula run: job %s, %d clusters in network namespaces behind an emulated WAN link; "
        "logs and results in %s\n",
        job->name, r->n, r->dir);
  else
    printf("nebula run: job %s, %d clusters on loopback%s; logs and results in %s\n", job->name,
           r->n, job->link.rate_mbit > 0 ? " (rate cap applied, no delay emulation)" : "", r->dir);
  if (job->link.rate_mbit > 0)
    printf(
        "nebula run: link cap %.1f Mbit/s per peer%s\n", job->link.rate_mbit,
        job->link.delay_ms > 0 && !r->wan.on ? "; link.delayMs needs the namespaces (root)" : "");
  fflush(stdout);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = nb__run_on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  if (r->wan.on && (nb__run_wan_up(&r->wan, job, r->wanlog) != 0 || nb__run_stop)) {
    if (nb__run_stop) fprintf(stderr, "nebula run: interrupted while the link came up\n");
    return NB_EXIT_FAIL;
  }
  int have_mpirun = system("command -v mpirun >/dev/null 2>&1") == 0;
  for (int i = 0; i < r->n; i++) {
    int w = job->clusters[i].workers;
    r->use_mpi[i] = w > 1 && !r->no_mpi && have_mpirun && job->program.argc == 0;
    if (job->program.argc > 0) {
      printf("nebula run: %s: the job's program %s%s\n", job->clusters[i].id, job->program.argv[0],
             w > 1 ? " (one process: it starts its own ranks, e.g. torchrun)" : "");
      r->total_ranks++;
      continue;
    }
    r->total_ranks += r->use_mpi[i] ? w : 1;
    if (w > 1 && !r->use_mpi[i])
      printf("nebula run: %s: %d workers as accumulated micro-batches in one process%s\n",
             job->clusters[i].id, w, have_mpirun ? "" : " (no mpirun found)");
    else if (r->use_mpi[i])
      printf("nebula run: %s: %d ranks under mpirun\n", job->clusters[i].id, w);
  }
  r->sp = (nb__run_spawn_t){r->exe,         r->file,   job,
                            r->ch,          r->n,      &r->wan,
                            r->pki,         r->secret, r->steps_text[0] ? r->steps_text : NULL,
                            r->data_dir,    r->resume, r->use_mpi,
                            r->total_ranks, r->job_dir};
  r->t0 = nb_now_s();
  for (int i = 0; i < r->n; i++) {
    if (nb__run_spawn(&r->sp, i, 0) != 0) {
      nb__run_kill_all(r->ch, r->n);
      return NB_EXIT_FAIL;
    }
  }
  return NB_EXIT_OK;
}

/* Waits for every worker, restarting one killed by a signal (--rejoin) while others train;
 * returns the first that failed, or -1. */
static int nb__run_wait(nb__run_t* r) {
  nb__run_child_t* ch = r->ch;
  int failed = -1;
  for (;;) {
    int left = 0;
    for (int i = 0; i < r->n; i++) {
      if (ch[i].done) continue;
      pid_t w = waitpid(ch[i].pid, &ch[i].status, WNOHANG);
      if (w == ch[i].pid) {
        ch[i].done = 1;
        nb__run_pump(&ch[i], 1);
        if (nb__run_restartable(&r->sp, i) && !nb__run_stop) {
          ch[i].restarts++;
          fprintf(stderr,
                  "nebula run: cluster %s killed by signal %d; restarting it with --rejoin "
                  "(restart %d of %d)\n",
                  ch[i].id, WTERMSIG(ch[i].status), ch[i].restarts, (int)nb_param_RunRestarts());
          if (nb__run_spawn(&r->sp, i, 1) == 0) {
            left++;
            continue;
          }
        }
        if (!(WIFEXITED(ch[i].status) && WEXITSTATUS(ch[i].status) == 0) && failed < 0) failed = i;
      } else {
        left++;
      }
      nb__run_pump(&ch[i], ch[i].done);
    }
    if (!left || failed >= 0 || nb__run_stop) return failed;
    nb_sleep_ns(200000000);
  }
}

/* After the workers: on a failure or an interrupt, stop every worker and say why; otherwise
 * the summary table and the run report. */
static int nb__run_conclude(nb__run_t* r, int failed) {
  nb__run_child_t* ch = r->ch;
  if (failed >= 0 || nb__run_stop) {
    nb__run_kill_all(ch, r->n);
    for (int i = 0; i < r->n; i++) nb__run_pump(&ch[i], 1);
    if (nb__run_stop)
      fprintf(stderr, "nebula run: interrupted; every worker stopped\n");
    else if (WIFEXITED(ch[failed].status))
      fprintf(stderr, "nebula run: cluster %s failed (exit %d; see %s); every worker stopped\n",
              ch[failed].id, WEXITSTATUS(ch[failed].status), ch[failed].log);
    else
      fprintf(stderr, "nebula run: cluster %s killed by signal %d (see %s); every worker stopped\n",
              ch[failed].id, WTERMSIG(ch[failed].status), ch[failed].log);
    return NB_EXIT_FAIL;
  }
  if (r->job->program.argc > 0) /* the program's own outputs are its; no run report */
    return nb__run_program_table(ch, r->n, nb_now_s() - r->t0) ? NB_EXIT_OK : NB_EXIT_FAIL;
  int rc = nb__run_table(ch, r->n, nb_now_s() - r->t0) ? NB_EXIT_OK : NB_EXIT_FAIL;
  const char** ids = NULL;
  if (nb_calloc((void**)&ids, (size_t)r->n, sizeof *ids, "report ids") == NB_OK) {
    for (int i = 0; i < r->n; i++) ids[i] = ch[i].id;
    nb_report_options_t ro = {.title = r->job->name, .job = r->job};
    if (nb_report_write_opts(r->dir, ids, r->n, &ro) == NB_OK)
      printf("report: %s/report.html\n", r->dir);
    else
      NB_WARN("nebula run: no report: %s", nb_error_last());
    nb_free(ids);
  }
  return rc;
}

int nb_run_main(int argc, char** argv) {
  nb__run_t* r = NULL;
  if (nb_calloc((void**)&r, 1, sizeof *r, "run") != NB_OK) {
    fprintf(stderr, "nebula run: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  // clang-format off: one option per entry
  const nb_opt_t opts[] = {
      {.name = "out",
       .kind = NB_OPT_STR,
       .dst = &r->out,
       .meta = "DIR",
       .help = "run folder (default runs/<job>)"},
      {.name = "netns",
       .kind = NB_OPT_FLAG,
       .dst = &r->force_netns,
       .help = "namespaces even without a delay (error if not possible)"},
      {.name = "loopback",
       .kind = NB_OPT_FLAG,
       .dst = &r->force_loop,
       .help = "loopback even as root with a delay (without it, a delay whose emulator\n"
               "is missing is an error)"},
      {.name = "steps",
       .kind = NB_OPT_LONG,
       .dst = &r->steps,
       .meta = "N",
       .min = 1,
       .help = "override training.maxSteps (inner steps per cluster)"},
      {.name = "data-dir",
       .kind = NB_OPT_STR,
       .dst = &r->data_dir,
       .meta = "DIR",
       .help = "data folder for every cluster (mono/<lang>.txt)"},
      {.name = "resume",
       .kind = NB_OPT_FLAG,
       .dst = &r->resume,
       .help = "continue every cluster from its newest checkpoint in DIR"},
      {.name = "no-mpi",
       .kind = NB_OPT_FLAG,
       .dst = &r->no_mpi,
       .help = "one process per cluster even with several workers (they are then\naccumulated "
               "micro-batches); default: mpirun -np WORKERS"},
      {.name = NULL},
  };
  // clang-format on
  const nb_cmd_spec_t spec = {
      .cmd = "nebula run",
      .synopsis =
          "usage: nebula run JOB.json [--out DIR] [--steps N] [--data-dir DIR] [--resume] "
          "[--no-mpi]\n                           [--netns | --loopback]",
      .about =
          "Starts every cluster of the job on this machine (one 'nebula worker' each, with\n"
          "mutual TLS and sealed frames), streams their logs, waits, and prints a summary.\n"
          "As root, a two-cluster job whose link has a delay runs each cluster in its own\n"
          "network namespace behind the emulated WAN link of deploy/wan (link.rateMbit each "
          "way,\nlink.delayMs one way; an error when the emulator is not found beside this "
          "binary,\nunless --loopback), torn down at the end; otherwise over loopback with "
          "the\nlink's rate cap. DIR (default runs/<job>) receives pki/, job.secret and one "
          "folder\nper cluster with worker.log, rounds.tsv, summary.json.\n"
          "A job with spec.program runs that command per cluster instead (in the descriptor's\n"
          "folder, with the NEBULA_* environment a gateway sets; its output in worker.log, one\n"
          "line per round in progress.jsonl).",
      .epilog =
          "A one-process cluster whose worker is killed by a signal (other than TERM/INT) "
          "while\nanother cluster trains is restarted with --rejoin, up to NB_RUN_RESTARTS "
          "(2) times.",
      .arg_name = "JOB",
      .arg = &r->file,
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc == NB_OPTS_RUN && !r->file) rc = nb_opts_usage_error(&spec, "missing JOB.json");
  if (rc == NB_OPTS_RUN && r->force_netns && r->force_loop) {
    fprintf(stderr, "nebula run: --netns and --loopback exclude each other\n");
    rc = NB_EXIT_USAGE;
  }
  if (rc == NB_OPTS_RUN) {
    if (r->steps > 0) snprintf(r->steps_text, sizeof r->steps_text, "%ld", r->steps);
    rc = nb__run_load(r);
    if (rc == NB_EXIT_OK) rc = nb__run_prepare(r);
    if (rc == NB_EXIT_OK) rc = nb__run_launch(r);
    if (rc == NB_EXIT_OK) rc = nb__run_conclude(r, nb__run_wait(r));
  }
  if (r->wan.up) {
    if (r->ch) nb__run_kill_all(r->ch, r->n); /* nothing of ours may stay inside the namespaces */
    nb__run_wan_down(&r->wan, r->wanlog);
  }
  nb_free(r->ch);
  nb_free(r->diag);
  nb_free(r->job);
  nb_free(r);
  return rc;
}
