/* common: the layer every module stands on — status codes, logging, environment parameters,
 * allocation, clocks and checksums. It depends on nothing else in nebula but the public header
 * include/nebula.h, the one definition of the status codes (itself self-contained). */
#ifndef NB_COMMON_COMMON_H
#define NB_COMMON_COMMON_H

#include "common/alloc.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/param.h"
#include "common/status.h"

#define NB_VERSION_STRING "0.1.0"

#endif
