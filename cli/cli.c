/* Subcommand dispatch for the `nebula` binary. Adding a command: one line in nb__cmds. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "cli/client_cli.h"
#include "gateway/gateway.h"

_Static_assert((int)NB_OPTS_EXIT_OK == (int)NB_EXIT_OK &&
                   (int)NB_OPTS_EXIT_USAGE == (int)NB_EXIT_USAGE,
               "common/opts.h returns the exit codes of cli/cli.h");

static int nb__cmd_help(int argc, char** argv);

static int nb__cmd_version(int argc, char** argv) {
  printf("nebula %s\n", NB_VERSION_STRING);
  return NB_EXIT_OK;
}

static const nb_cli_cmd_t nb__cmds[] = {
    {"bench", "run a benchmark (nebula bench --help)", nb_bench_main},
    {"certs", "manage the federation PKI: CA, cluster and user certificates", nb_certs_main},
    {"gateway", "run this cluster's gateway daemon (--config FILE)", nb_gateway_main},
    {"env", "list the environment parameters and their values", nb_env_main},
    {"eval", "held-out bits per byte per language of a checkpoint", nb_eval_main},
    {"report", "write report.html and summary.json for a run folder", nb_report_main},
    {"run", "run every cluster of a job on this machine over loopback", nb_run_main},
    {"train", "train one cluster of a job descriptor in this process", nb_train_main},
    {"validate", "check a job descriptor and print it with defaults filled in", nb_validate_main},
    {"worker", "run one cluster's leader of a job (nebula run starts these)", nb_worker_main},
    {"version", "print the version", nb__cmd_version},
    {"submit", "sign a job descriptor and submit it to a gateway", nb_submit_main},
    {"get", "show a job", nb_get_main},
    {"list", "list jobs", nb_list_main},
    {"watch", "follow a job's progress until it ends", nb_watch_main},
    {"cancel", "cancel a job (stops every process of it)", nb_cancel_main},
    {"logs", "print a job's output (-f follows it)", nb_logs_main},
    {"artifact", "your files at your gateway: artifact put FILE [NAME], artifact ls",
     nb_artifact_main},
    {"help", "show this help", nb__cmd_help},
};

static int nb__cmd_help(int argc, char** argv) {
  printf("usage: nebula <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof nb__cmds / sizeof nb__cmds[0]; i++)
    printf("  %-10s %s\n", nb__cmds[i].name, nb__cmds[i].summary);
  printf("\nRun 'nebula <command> --help' for the options of a command.\n");
  return NB_EXIT_OK;
}

int nb_cli_main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    nb__cmd_help(argc, argv);
    return argc < 2 ? NB_EXIT_USAGE : NB_EXIT_OK;
  }
  if (strcmp(argv[1], "--version") == 0) return nb__cmd_version(argc, argv);
  for (size_t i = 0; i < sizeof nb__cmds / sizeof nb__cmds[0]; i++)
    if (strcmp(argv[1], nb__cmds[i].name) == 0) return nb__cmds[i].main(argc - 1, argv + 1);
  fprintf(stderr, "nebula: '%s' is not a command; see 'nebula help'\n", argv[1]);
  return NB_EXIT_USAGE;
}
