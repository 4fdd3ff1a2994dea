/* One cluster leader for the namespace integration test: runs nb_exchange rounds with one peer
 * and checks every received frame byte for byte (frames are derived from (sender, round)).
 * Prints "ROUND r OK seconds" or "ROUND r FAIL STATUS seconds detail" per round.
 *   exchange_peer --make-certs DIR
 *   exchange_peer --certs DIR --self ID --listen ADDR --peer ID --target ADDR --rounds N --mib M
 * Exit: 0 all rounds OK, 3 a round failed, 1 set-up error. Not a product tool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../unit/link/certs.h"
#include "common/common.h"
#include "inter/exchange.h"

static uint8_t* frame_of(const char* who, uint64_t round, size_t len) {
  uint8_t* f = malloc(len);
  if (!f) abort();
  uint64_t x = nb_xxh3_64(who, strlen(who), round) | 1;
  for (size_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f[i] = (uint8_t)x;
  }
  return f;
}

int main(int argc, char** argv) {
  static const char* const ids[] = {"dc-a", "dc-b"};
  if (argc == 3 && strcmp(argv[1], "--make-certs") == 0) {
    uint8_t secret[NB_SEAL_SECRET_BYTES];
    char p[600];
    if (nb_test_certs_make(argv[2], ids, 2) != 0 || nb_seal_secret_generate(secret) != NB_OK)
      return 1;
    snprintf(p, sizeof p, "%s/job.secret", argv[2]);
    FILE* f = fopen(p, "wb");
    if (!f || fwrite(secret, 1, sizeof secret, f) != sizeof secret) return 1;
    fclose(f);
    return 0;
  }
  const char *dir = NULL, *self = NULL, *listen = NULL, *peer = NULL, *target = NULL;
  int rounds = 3, mib = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--certs"))
      dir = argv[i + 1];
    else if (!strcmp(argv[i], "--self"))
      self = argv[i + 1];
    else if (!strcmp(argv[i], "--listen"))
      listen = argv[i + 1];
    else if (!strcmp(argv[i], "--peer"))
      peer = argv[i + 1];
    else if (!strcmp(argv[i], "--target"))
      target = argv[i + 1];
    else if (!strcmp(argv[i], "--rounds"))
      rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mib"))
      mib = atoi(argv[i + 1]);
  }
  if (!dir || !self || !listen || !peer || !target || rounds < 1 || mib < 1) {
    fprintf(stderr, "exchange_peer: missing arguments\n");
    return 1;
  }
  nb_tls_t* tls = nb_test_tls_load(dir, self);
  uint8_t secret[NB_SEAL_SECRET_BYTES];
  char p[600];
  snprintf(p, sizeof p, "%s/job.secret", dir);
  FILE* f = fopen(p, "rb");
  if (!tls || !f || fread(secret, 1, sizeof secret, f) != sizeof secret) return 1;
  fclose(f);
  nb_exchange_config_t c = {.job_id = "job-ns",
                            .self = self,
                            .listen = listen,
                            .tls = tls,
                            .job_secret = secret,
                            .streams = 4};
  nb_exchange_t* ex = NULL;
  if (nb_exchange_create(&c, &ex) != NB_OK || nb_exchange_add_peer(ex, peer, target) != NB_OK) {
    fprintf(stderr, "exchange_peer %s: %s\n", self, nb_error_last());
    return 1;
  }
  int rc = 0;
  size_t len = (size_t)mib << 20;
  for (int r = 1; r <= rounds && rc == 0; r++) {
    uint8_t* mine = frame_of(self, (uint64_t)r, len);
    nb_exchange_result_t res[1];
    int64_t t0 = nb_now_ns();
    nb_status_t st = nb_exchange_round(ex, (uint64_t)r, mine, len, t0 + 60000000000LL, res);
    double secs = (nb_now_ns() - t0) * 1e-9;
    if (st == NB_OK) {
      uint8_t* want = frame_of(peer, (uint64_t)r, len);
      if (res[0].len != len || memcmp(res[0].frame, want, len) != 0) {
        printf("ROUND %d FAIL CONTENT %.3f frame of %s differs\n", r, secs, peer);
        rc = 3;
      } else {
        printf("ROUND %d OK %.3f\n", r, secs);
      }
      free(want);
    } else {
      printf("ROUND %d FAIL %s %.3f %s\n", r, nb_status_name(st), secs, res[0].detail);
      rc = 3;
    }
    fflush(stdout);
    nb_exchange_results_release(res, 1);
    free(mine);
  }
  nb_estimate_t e;
  nb_estimator_get(nb_link_estimator(nb_exchange_link(ex, 0)), &e);
  printf("ESTIMATE goodput_mbit=%.1f rtt_ms=%.1f\n", e.goodput_Bps * 8e-6, e.rtt_s * 1e3);
  nb_exchange_destroy(ex);
  nb_tls_destroy(tls);
  return rc;
}
