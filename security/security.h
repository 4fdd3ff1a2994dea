/* security: the umbrella header of nebula's security layer — the federation PKI, sealing of
 * frame chunks and descriptor signatures (the `nebula certs` command is cli/certs_cli.c). It adds
 * nothing of its own; include the specific header where only one part is needed. */
#ifndef NB_SECURITY_SECURITY_H
#define NB_SECURITY_SECURITY_H

#include "security/pki.h"
#include "security/seal.h"
#include "security/sign.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
