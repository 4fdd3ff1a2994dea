/* The `nebula` command line: git-style subcommands. Each subcommand is a function with the
 * signature of main() that returns an exit status (0 ok, 1 failure, 2 usage error). */
#ifndef NB_JOBS_CLI_H
#define NB_JOBS_CLI_H

#include "common/status.h"

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

/* Checks that addr is "HOST:PORT" ("[V6]:PORT"; a gRPC "dns:" / "ipv4:" / "ipv6:" prefix is
 * fine) with PORT decimal in 1..65535, or 0..65535 with allow_zero (a server's ":0", any free
 * port). gRPC itself takes "host:99999" as port 34463. "unix:" targets have no port and pass.
 * what names the setting in the message (borrowed). Returns NB_OK or NB_ERR_CONFIG. */
nb_status_t nb_cli_addr_check(const char* addr, int allow_zero, const char* what);

/* Before a descriptor file is read: a folder, or a regular file over the 1 MiB descriptor limit
 * (whose reader stops one byte past it), is named with what is wrong and its real size.
 * Returns NB_OK or NB_ERR_CONFIG with that message; a file that cannot be stat'ed passes (the
 * reader names the error). path: borrowed. */
nb_status_t nb_cli_descriptor_precheck(const char* path);

#ifdef __cplusplus
}
#endif
#endif
