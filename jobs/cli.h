/* The `nebula` command line: git-style subcommands. Each subcommand is a function with the
 * signature of main() that returns an exit status (0 ok, 1 failure, 2 usage error). */
#ifndef NB_JOBS_CLI_H
#define NB_JOBS_CLI_H

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

int nb_cli_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif
#endif
