/* inter: the umbrella header of nebula's WAN layer — the gRPC wrapper, links to peer clusters,
 * the per-round exchange, and the transport-independent pacing, estimation and scheduling. It
 * adds nothing of its own; include the specific header where only one part is needed. */
#ifndef NB_INTER_INTER_H
#define NB_INTER_INTER_H

#include "inter/estimator.h"
#include "inter/exchange.h"
#include "inter/link.h"
#include "inter/ratelimit.h"
#include "inter/rpc.h"
#include "inter/sched.h"

#endif
