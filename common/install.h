/* Where the files that come with this executable are: the emulated WAN's scripts and its delay
 * line, looked up relative to /proc/self/exe in the build tree's layout (<build>/nebula beside
 * <build>/deploy/wan/) and in the install tree's (<prefix>/bin/nebula, <prefix>/share/nebula/wan,
 * <prefix>/libexec/nebula), so that an out-of-tree build and an installed package find them
 * alike. It only finds files; running them is the caller's business. */
#ifndef NB_COMMON_INSTALL_H
#define NB_COMMON_INSTALL_H

#include <stddef.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The folder of the running executable (no trailing slash) into out (cap bytes).
 * NB_ERR_SYSTEM (/proc/self/exe unreadable), NB_ERR_INVALID (too long). */
nb_status_t nb_install_self_dir(char* out, size_t cap);

/* The folder of the WAN scripts (wan-up.sh and its siblings): $NB_WAN_DIR when set (then only
 * it), else <exe dir>/deploy/wan (a build tree), <exe dir>/<bin-to-data>/nebula/wan (an install
 * tree: ../share/nebula/wan), <exe dir>/../deploy/wan (a build folder inside the source tree).
 * out: cap bytes, the first folder holding a readable wan-up.sh. tried (tried_cap bytes, may be
 * NULL): every folder looked at, ", "-separated, for an error message. NB_ERR_NOT_FOUND. */
nb_status_t nb_install_wan_dir(char* out, size_t cap, char* tried, size_t tried_cap);

/* The delay line program (nb-delayline): $NB_DELAYLINE when set (then only it), else
 * <exe dir>/deploy/wan/nb-delayline (a build tree), <exe dir>/<bin-to-libexec>/nebula/nb-delayline
 * (an install tree: ../libexec/nebula), <wan_dir>/nb-delayline (wan_dir may be NULL), then
 * nb-delayline on PATH. out: the first executable one. tried as above. NB_ERR_NOT_FOUND. */
nb_status_t nb_install_delayline(const char* wan_dir, char* out, size_t cap, char* tried,
                                 size_t tried_cap);

#ifdef __cplusplus
}
#endif
#endif
