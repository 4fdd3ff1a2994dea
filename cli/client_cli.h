/* The client side of nebula.v1.Gateway on the command line: `nebula submit|get|list|watch|
 * cancel|logs`, and `nebula artifact put|ls` (Artifacts.Put, List). Each is a subcommand main
 * (cli/cli.h); exit codes are in docs/gateway.md. */
#ifndef NB_CLI_CLIENT_CLI_H
#define NB_CLI_CLIENT_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes beyond NB_EXIT_OK/FAIL/USAGE. */
enum {
  NB_EXIT_REFUSED = 3,       /* the gateway refused: certificate, signature, ACL, not your job */
  NB_EXIT_NOT_FOUND = 4,     /* no such job */
  NB_EXIT_UNREACHABLE = 5,   /* cannot reach the gateway (or it refused our TLS handshake) */
  NB_EXIT_INVALID = 6,       /* the gateway found the request or the descriptor invalid */
  NB_EXIT_JOB_FAILED = 10,   /* watch: the job ended failed */
  NB_EXIT_JOB_CANCELLED = 11 /* watch: the job ended cancelled */
};

int nb_submit_main(int argc, char** argv);
int nb_get_main(int argc, char** argv);
int nb_list_main(int argc, char** argv);
int nb_watch_main(int argc, char** argv);
int nb_cancel_main(int argc, char** argv);
int nb_logs_main(int argc, char** argv);
int nb_artifact_main(int argc, char** argv); /* nebula artifact put | ls */

#ifdef __cplusplus
}
#endif
#endif
