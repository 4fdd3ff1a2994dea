/* api/ft: fault-tolerant rounds over the exchange (api/ft.h). */
#include "api/ft.h"

#include <string.h>

#include "inter/link.h"

nb_status_t nb_ft_exchange(void* ctx, uint64_t xround, const void* msg, size_t len,
                           nb_hybrid_msg_t* peers, size_t n_peers, uint64_t* sent, uint64_t* ahead,
                           uint32_t* alive) {
  nb_ft_link_t* x = ctx;
  if (n_peers != x->n_peers || n_peers > NB_HYBRID_MAX_CLUSTERS - 1)
    return nb_error(NB_ERR_INTERNAL,
                    "fault-tolerant exchange: %zu peers expected, exchange has %zu", n_peers,
                    x->n_peers);
  nb_exchange_result_t res[NB_HYBRID_MAX_CLUSTERS - 1];
  memset(res, 0, sizeof res);
  int64_t deadline = nb_now_ns() + (int64_t)(x->deadline_s * 1e9);
  nb_status_t st = nb_exchange_round_early(x->ex, xround, msg, len, deadline, res);
  if (st == NB_ERR_INVALID || st == NB_ERR_NOMEM) return st;
  uint64_t bytes = 0, newest = 0;
  uint32_t up = 0;
  nb_status_t fatal = NB_OK;
  for (size_t i = 0; i < n_peers; i++) {
    bytes += res[i].send.bytes;
    /* an unavailable or slow peer costs a round; a frame that fails its checks or a refused
     * transfer is never tolerated silently */
    if (fatal == NB_OK && (res[i].status == NB_ERR_INTEGRITY || res[i].status == NB_ERR_PERMISSION))
      fatal = nb_error(res[i].status, "exchange %llu: peer %s: %s", (unsigned long long)xround,
                       res[i].peer, res[i].detail);
    if (res[i].newest > xround && res[i].newest > newest) newest = res[i].newest;
    if (res[i].status == NB_OK) {
      peers[i].data = res[i].frame;
      peers[i].len = res[i].len;
      x->received += res[i].len;
      res[i].frame = NULL;
    } else {
      peers[i].data = NULL;
      peers[i].len = 0;
      NB_WARN("exchange %llu (round %llu): peer %s left out: %s (%s)", (unsigned long long)xround,
              (unsigned long long)(xround >= 2 ? (xround - 2) / 2 : 0), res[i].peer, res[i].detail,
              nb_status_name(res[i].status));
    }
    if (nb_exchange_peer_alive(x->ex, i)) up++;
  }
  if (fatal != NB_OK) {
    for (size_t i = 0; i < n_peers; i++) {
      nb_free(peers[i].data);
      peers[i].data = NULL;
    }
  }
  nb_exchange_results_release(res, n_peers);
  if (sent) *sent = bytes;
  if (ahead) *ahead = newest;
  if (alive) *alive = up;
  return fatal;
}

nb_status_t nb_ft_pull(nb_exchange_t* ex, double timeout_s, nb_ft_adopt_fn adopt, void* ctx,
                       const char** from) {
  double until = nb_now_s() + timeout_s;
  size_t np = nb_exchange_peer_count(ex);
  nb_status_t st = nb_error(NB_ERR_UNAVAILABLE, "no peer to pull the global state from");
  while (nb_now_s() < until) {
    for (size_t i = 0; i < np; i++) {
      if (!nb_exchange_peer_alive(ex, i)) continue;
      uint8_t* b = NULL;
      size_t len = 0;
      st = nb_exchange_pull(ex, i, 10000, &b, &len, NULL);
      if (st == NB_OK) {
        st = adopt(ctx, b, len);
        nb_free(b);
        if (st == NB_OK) {
          if (from) *from = nb_link_peer(nb_exchange_link(ex, i));
          return NB_OK;
        }
      }
      NB_WARN("pulling the global state from %s: %s", nb_link_peer(nb_exchange_link(ex, i)),
              nb_error_last());
      if (st == NB_ERR_INTEGRITY || st == NB_ERR_CONFIG) return st;
    }
    nb_sleep_ns(250000000LL);
  }
  return st;
}
