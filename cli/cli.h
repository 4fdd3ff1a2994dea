/* The `nebula` command line: git-style subcommands. Each subcommand is a function with the
 * signature of main() that returns an exit status (0 ok, 1 failure, 2 usage error). This is the
 * top floor: nothing below cli/ includes this header. */
#ifndef NB_CLI_CLI_H
#define NB_CLI_CLI_H

#include "jobs/cli_checks.h" /* nb_cli_addr_check, nb_cli_descriptor_precheck */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char* name;                   /* "bench" */
  const char* summary;                /* one line for `nebula help` */
  int (*main)(int argc, char** argv); /* argv[0] is the subcommand name */
} nb_cli_cmd_t;

/* Exit codes shared by every subcommand. */
enum { NB_EXIT_OK = 0, NB_EXIT_FAIL = 1, NB_EXIT_USAGE = 2 };

/* The `nebula` binary: dispatches argv[1] to its subcommand (cli/cli.c, linked into the
 * executable together with bench/). */
int nb_cli_main(int argc, char** argv);

/* The subcommands of this folder; argv[0] is the subcommand's name. */
int nb_train_main(int argc, char** argv);    /* nebula train */
int nb_eval_main(int argc, char** argv);     /* nebula eval */
int nb_validate_main(int argc, char** argv); /* nebula validate */
int nb_worker_main(int argc, char** argv);   /* nebula worker */
int nb_run_main(int argc, char** argv);      /* nebula run */
int nb_report_main(int argc, char** argv);   /* nebula report */
int nb_certs_main(int argc, char** argv);    /* nebula certs */
int nb_gateway_main(int argc, char** argv);  /* nebula gateway: the daemon until a signal */
int nb_env_main(int argc, char** argv);      /* nebula env */

#ifdef __cplusplus
}
#endif
#endif
