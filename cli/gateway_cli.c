/* `nebula gateway --config FILE [--check | --check-config]`: runs this cluster's gateway daemon
 * (gateway/gateway.h) until SIGINT/SIGTERM, reloading its certificates on SIGHUP, or probes a
 * running one's health service. Only the command line is here: flags, signals and exit codes. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>

#include "cli/cli.h"
#include "common/common.h"
#include "common/opts.h"
#include "gateway/gateway.h"

static void nb__gateway_more_help(FILE* f) {
  fputc('\n', f);
  nb_gateway_config_help(f);
  fprintf(f,
          "\nExit status: 0 stopped by a signal (--check: SERVING), 1 failure (--check: not "
          "serving,\nor nothing answers), 2 usage error.\n");
}

/* --check: one health Check; exit 0 only for SERVING. */
static int nb__gateway_check(const nb_gateway_config_t* cfg, const char* address,
                             const char* service, long timeout_s) {
  char target[NB_GW_STR];
  int status = 0;
  nb_status_t st = nb_gateway_health_check(cfg, address, service, timeout_s * 1000, &status, target,
                                           sizeof target);
  const char* what = *service ? service : cfg->cluster_id;
  if (st != NB_OK) {
    fprintf(stderr, "nebula gateway --check: %s at %s: %s\n", what, target, nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (status != 1) {
    fprintf(stderr, "nebula gateway --check: %s at %s is %s\n", what, target,
            nb_gateway_health_name(status));
    return NB_EXIT_FAIL;
  }
  printf("%s at %s: %s\n", what, target, nb_gateway_health_name(status));
  return NB_EXIT_OK;
}

int nb_gateway_main(int argc, char** argv) {
  const char *path = NULL, *address = NULL, *service = "";
  int check = 0, check_config = 0;
  long timeout_s = 5;
  const nb_opt_t opts[] = {
      NB_OPTION("config", NB_OPT_STR, &path, "FILE", "JSON config (keys below)"),
      NB_OPTION("check", NB_OPT_FLAG, &check, NULL,
                "ask the gateway of this config whether it serves (grpc.health.v1 Check over\n"
                "mutual TLS with the config's tls.*), print the answer, exit 0 if SERVING"),
      NB_OPTION("address", NB_OPT_STR, &address, "HOST:PORT",
                "with --check: the address to ask (default: listen, a wildcard host as\n"
                "loopback)"),
      NB_OPTION("service", NB_OPT_STR, &service, "NAME",
                "with --check: the service to ask about (default \"\": the gateway)"),
      NB_OPTION("timeout", NB_OPT_LONG, &timeout_s, "S", "with --check: seconds to wait (5)"),
      NB_OPTION("check-config", NB_OPT_FLAG, &check_config, NULL,
                "read and check the config, print it, and exit"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula gateway",
      .synopsis =
          "usage: nebula gateway --config FILE [--check [--address HOST:PORT] "
          "[--service NAME]\n                      [--timeout S] | --check-config]",
      .about =
          "Runs this cluster's gateway: the nebula.v1.Gateway API over mutual TLS, the job "
          "store\nand the launcher. Stops on SIGINT/SIGTERM; running jobs keep running and "
          "are\nre-attached at the next start. SIGHUP re-reads tls.ca, tls.cert and tls.key: "
          "new TLS\nconnections get the new pair if it checks out, else the old one stays "
          "(logged).\nPrints 'listening on ADDR port PORT' once serving.",
      .opts = opts,
      .more_help = nb__gateway_more_help,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (!path) return nb_opts_usage_error(&spec, "--config FILE is required");
  if (check && check_config)
    return nb_opts_usage_error(&spec, "--check and --check-config exclude each other");
  if (!check && (address || *service))
    return nb_opts_usage_error(&spec, "--address and --service go with --check");
  if (timeout_s < 1 || timeout_s > 3600)
    return nb_opts_usage_error(&spec, "--timeout: expected 1..3600 seconds");
  nb_gateway_config_t cfg;
  nb_gateway_config_defaults(&cfg);
  if (nb_gateway_config_load(path, &cfg) != NB_OK) {
    fprintf(stderr, "nebula gateway: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (check) return nb__gateway_check(&cfg, address, service, timeout_s);
  if (check_config) {
    printf("cluster_id %s\nlisten %s\nwork_dir %s\nacl rules %d\npeers %d\n", cfg.cluster_id,
           cfg.listen, cfg.work_dir, cfg.acl.n_rules, cfg.n_peers);
    return NB_EXIT_OK;
  }
  /* A gateway logs its jobs' lifecycle (accepted, federation calls, launched, finished,
   * refusals) unless NB_DEBUG says otherwise; its jobs' processes keep their own default. */
  if (!getenv("NB_DEBUG")) {
    setenv("NB_DEBUG", "INFO", 1);
    int subs = getenv("NB_DEBUG_SUBSYS") != NULL;
    if (!subs) setenv("NB_DEBUG_SUBSYS", "JOB", 1);
    nb_log_reload();
    unsetenv("NB_DEBUG");
    if (!subs) unsetenv("NB_DEBUG_SUBSYS");
  }
  nb_log_set_identity(cfg.cluster_id, -1);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  /* every thread inherits it: no handler runs anywhere; sigwait below receives the signals
   * on this thread, where reloading the certificates may take locks and read files */
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  nb_gateway_t* gw = NULL;
  if (nb_gateway_create(&cfg, &gw) != NB_OK) {
    fprintf(stderr, "nebula gateway: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (cfg.acl.n_rules == 0)
    NB_WARN("gateway %s: the ACL is empty, so nobody may submit jobs; add \"acl\" rules to %s",
            cfg.cluster_id, path);
  if (cfg.n_peers > 0)
    NB_INFO(JOB, "gateway %s: %d peers configured for federation", cfg.cluster_id, cfg.n_peers);
  printf("listening on %s port %d\n", cfg.listen, nb_gateway_port(gw));
  fflush(stdout);
  int sig = 0;
  for (;;) {
    if (sigwait(&set, &sig) != 0) continue;
    if (sig != SIGHUP) break;
    nb_gateway_reload_tls(gw); /* logs the outcome; a failure keeps the previous pair */
  }
  NB_WARN("gateway %s: stopping on signal %d; running jobs keep running", cfg.cluster_id, sig);
  nb_gateway_drain(gw); /* health: NOT_SERVING until the server is gone */
  nb_gateway_destroy(gw);
  return NB_EXIT_OK;
}
