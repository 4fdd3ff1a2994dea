/* api/ft: the exchange side of fault-tolerant rounds, shared by the public session (api/session.c)
 * and `nebula worker`: the hybrid's ft_exchange callback over the inter-cluster exchange (a peer
 * that does not deliver is left out, not an error), and pulling a live peer's published state
 * (a cluster that rejoins, or one found behind). Internal: not exported by libnebula. */
#ifndef NB_API_FT_H
#define NB_API_FT_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "inter/exchange.h"
#include "train/hybrid.h"

/* The context of nb_ft_exchange (cfg.exchange_ctx of the hybrid). */
typedef struct {
  nb_exchange_t* ex;
  size_t n_peers;    /* the exchange's peer count */
  double deadline_s; /* per exchange: a peer that has not delivered by then is left out */
  uint64_t received; /* bytes of peers' frames received, total (updated by every call) */
} nb_ft_link_t;

/* nb_hybrid_ft_exchange_fn over ctx (an nb_ft_link_t): one exchange of id `xround` with every
 * peer until the deadline; a peer that does not deliver (dead, slow, already past this round) is
 * left out (its entry NULL) and named in a warning, and the call returns NB_OK. A frame that
 * fails its checks or a transfer the peer refused is an error (NB_ERR_INTEGRITY,
 * NB_ERR_PERMISSION): never tolerated silently. */
nb_status_t nb_ft_exchange(void* ctx, uint64_t xround, const void* msg, size_t len,
                           nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent, uint64_t* ahead,
                           uint32_t* alive);

/* What to do with a pulled state (borrowed during the call): adopt it, or refuse it with a
 * status (then the next peer is asked; NB_ERR_INTEGRITY and NB_ERR_CONFIG end the pull). */
typedef nb_status_t (*nb_ft_adopt_fn)(void* ctx, const uint8_t* state, size_t len);

/* Pulls the published state of the first alive peer that serves one and hands it to adopt,
 * trying every peer every 250 ms until timeout_s has passed. *from (nullable): the peer's id
 * (borrowed from the exchange). NB_ERR_UNAVAILABLE when no peer served one in time; adopt's
 * NB_ERR_INTEGRITY or NB_ERR_CONFIG at once. */
nb_status_t nb_ft_pull(nb_exchange_t* ex, double timeout_s, nb_ft_adopt_fn adopt, void* ctx,
                       const char** from);

#endif
