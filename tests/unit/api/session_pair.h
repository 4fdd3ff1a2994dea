/* What the session tests share: the options of cluster "east" (index 0) or "west" (1) of one job
 * on loopback (plaintext gRPC, frames sealed with the job secret, a 10 s peer timeout), the
 * rendezvous that tells each side where the other listens, and the options of one cluster alone.
 * Through the public header only, as a user's program. */
#ifndef NB_TESTS_API_SESSION_PAIR_H
#define NB_TESTS_API_SESSION_PAIR_H

#include <stdio.h>

#include <nebula.h>

/* o: the defaults, then the fields above; the caller sets the job's own (lr, density, ...). */
static inline void pair_options(nb_session_options_t* o, const char* job, int index,
                                const uint8_t* secret) {
  nb_session_options_default(o);
  o->job_id = job;
  o->cluster_id = index == 0 ? "east" : "west";
  o->cluster_index = (uint32_t)index;
  o->n_clusters = 2;
  o->listen = "127.0.0.1:0";
  o->insecure = 1; /* loopback; the frames are still sealed with the job secret */
  o->job_secret = secret;
  o->peer_timeout_s = 10;
}

/* One cluster alone ("solo"): the defaults, plaintext and unsealed (nothing leaves the process). */
static inline void solo_options(nb_session_options_t* o, const char* job) {
  nb_session_options_default(o);
  o->job_id = job;
  o->cluster_id = "solo";
  o->insecure = 1;
  o->unsealed = 1;
}

/* east learns west's port and west east's; NB_OK or the first add_peer's status. */
static inline nb_status_t pair_connect(nb_session_t* east, nb_session_t* west) {
  char peer[64];
  snprintf(peer, sizeof peer, "west=127.0.0.1:%d", nb_session_port(west));
  nb_status_t st = nb_session_add_peer(east, peer);
  if (st != NB_OK) return st;
  snprintf(peer, sizeof peer, "east=127.0.0.1:%d", nb_session_port(east));
  return nb_session_add_peer(west, peer);
}

#endif
