/* Checks of a command's input made before it is used, shared by the commands in cli/ (through
 * cli/cli.h) and the gateway's config reader (gateway/), which is why they live on the jobs/
 * floor below both. Named nb_cli_* for the command-line callers. Data checks only: nothing is
 * printed, the detail goes to nb_error(). */
#ifndef NB_JOBS_CLI_CHECKS_H
#define NB_JOBS_CLI_CHECKS_H

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks that addr is "HOST:PORT" ("[V6]:PORT"; a gRPC "dns:" / "ipv4:" / "ipv6:" prefix is
 * fine) with PORT decimal in 1..65535, or 0..65535 with allow_zero (a server's ":0", any free
 * port). gRPC itself takes "host:99999" as port 34463. "unix:" targets have no port and pass.
 * what names the setting in the message (borrowed). Returns NB_OK or NB_ERR_CONFIG. */
nb_status_t nb_cli_addr_check(const char* addr, int allow_zero, const char* what);

/* Before a descriptor file is read: a file that is missing or cannot be opened for reading is
 * NB_ERR_IO "cannot open PATH: <strerror>"; a folder, or a regular file over the 1 MiB
 * descriptor limit (whose reader stops one byte past it), is NB_ERR_CONFIG naming what is wrong
 * and its real size. Returns NB_OK, or one of those with that message. path: borrowed (NULL
 * passes). */
nb_status_t nb_cli_descriptor_precheck(const char* path);

#ifdef __cplusplus
}
#endif
#endif
