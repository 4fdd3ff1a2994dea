/* `nebula gateway --config FILE [--check]`: runs this cluster's gateway daemon (gateway/gateway.h)
 * until SIGINT/SIGTERM. Only the command line is here: flags, signals and exit codes. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>

#include "cli/cli.h"
#include "common/common.h"
#include "common/opts.h"
#include "gateway/gateway.h"

static void nb__gateway_more_help(FILE* f) {
  fputc('\n', f);
  nb_gateway_config_help(f);
  fprintf(f, "\nExit status: 0 stopped by a signal, 1 failure, 2 usage error.\n");
}

int nb_gateway_main(int argc, char** argv) {
  const char* path = NULL;
  int check = 0;
  const nb_opt_t opts[] = {
      NB_OPTION("config", NB_OPT_STR, &path, "FILE", "JSON config (keys below)"),
      NB_OPTION("check", NB_OPT_FLAG, &check, NULL,
                "read and check the config, print it, and exit"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula gateway",
      .synopsis = "usage: nebula gateway --config FILE [--check]",
      .about =
          "Runs this cluster's gateway: the nebula.v1.Gateway API over mutual TLS, the job "
          "store\nand the launcher. Stops on SIGINT/SIGTERM; running jobs keep running and "
          "are\nre-attached at the next start. Prints 'listening on ADDR port PORT' once "
          "serving.",
      .opts = opts,
      .more_help = nb__gateway_more_help,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (!path) return nb_opts_usage_error(&spec, "--config FILE is required");
  nb_gateway_config_t cfg;
  nb_gateway_config_defaults(&cfg);
  if (nb_gateway_config_load(path, &cfg) != NB_OK) {
    fprintf(stderr, "nebula gateway: %s\n", nb_error_last());
    return NB_EXIT_FAIL;
  }
  if (check) {
    printf("cluster_id %s\nlisten %s\nwork_dir %s\nacl rules %d\npeers %d\n", cfg.cluster_id,
           cfg.listen, cfg.work_dir, cfg.acl.n_rules, cfg.n_peers);
    return NB_EXIT_OK;
  }
  nb_log_set_identity(cfg.cluster_id, -1);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread inherits it; sigwait below */
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
  sigwait(&set, &sig);
  NB_WARN("gateway %s: stopping on signal %d; running jobs keep running", cfg.cluster_id, sig);
  nb_gateway_destroy(gw);
  return NB_EXIT_OK;
}
