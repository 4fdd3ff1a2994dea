/* security: the umbrella header of nebula's security layer — the federation PKI, sealing of
 * frame chunks, descriptor signatures and the `nebula certs` command. It adds nothing of its own;
 * include the specific header where only one part is needed. */
#ifndef NB_SECURITY_SECURITY_H
#define NB_SECURITY_SECURITY_H

#include "security/pki.h"
#include "security/seal.h"
#include "security/sign.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `nebula certs init|issue|show|verify`: the PKI from the command line (security/certs_cli.c).
 * Returns an exit status (0 ok, 1 failure, 2 usage error). */
int nb_certs_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif
#endif
