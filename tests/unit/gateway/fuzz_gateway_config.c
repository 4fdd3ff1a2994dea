/* Fuzz target for the gateway config parser (gateway/gateway.c's option table): any bytes give
 * either a config that passes its own invariants or NB_ERR_CONFIG with a message starting with
 * "config". Never a crash. Built as a replay driver over config-corpus/ in every build, and as a
 * libFuzzer target with -DNB_FUZZ=ON and clang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tests/lib/corpus_walk.h"
#include "gateway/gateway.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static nb_gateway_config_t cfg;
  nb_gateway_config_defaults(&cfg);
  nb_status_t st = nb_gateway_config_parse((const char*)data, size, "/base", &cfg);
  if (st != NB_OK) {
    if (st != NB_ERR_CONFIG || strncmp(nb_error_last(), "config", 6) != 0) {
      fprintf(stderr, "bad rejection: %s: %s\n", nb_status_name(st), nb_error_last());
      abort();
    }
    return 0;
  }
  /* invariants of an accepted config */
  if (!cfg.cluster_id[0] || !cfg.tls_ca[0] || !cfg.tls_cert[0] || !cfg.tls_key[0]) abort();
  if (cfg.slots < 1 || cfg.n_command < 1 || cfg.n_command > NB_GW_MAX_ARGS) abort();
  if (cfg.acl.n_rules < 0 || cfg.acl.n_rules > NB_ACL_MAX_RULES) abort();
  if (cfg.exchange_port_lo != 0 && (cfg.exchange_port_lo < 1024 || cfg.exchange_port_hi > 65535 ||
                                    cfg.exchange_port_lo > cfg.exchange_port_hi))
    abort();
  if (!cfg.exchange_host[0] ||
      (!strcmp(cfg.exchange_host, "0.0.0.0") && !cfg.exchange_advertise[0]))
    abort();
  nb_acl_want_t w = {cfg.cluster_id, 1};
  nb_status_t a = nb_acl_check(&cfg.acl, "alice", &w, 1);
  if (a != NB_OK && a != NB_ERR_PERMISSION) abort();
  return 0;
}

#ifndef NB_FUZZ_LIBFUZZER
/* files named good*.json must be accepted, all others refused */
static int replay(void* ctx, const char* name, const uint8_t* buf, size_t len) {
  int* accepted = ctx;
  nb_gateway_config_t c;
  nb_gateway_config_defaults(&c);
  int ok = nb_gateway_config_parse((const char*)buf, len, "/base", &c) == NB_OK;
  if (ok != (strncmp(name, "good", 4) == 0)) {
    fprintf(stderr, "%s: %s (%s)\n", name, ok ? "accepted" : "refused", ok ? "" : nb_error_last());
    return -1;
  }
  if (!ok) printf("%-26s %s\n", name, nb_error_last());
  *accepted += ok;
  LLVMFuzzerTestOneInput(buf, len);
  return 0;
}

int main(int argc, char** argv) {
  int n = 0, accepted = 0;
  if (nb_corpus_walk((const char* const*)argv + 1, argc - 1, replay, &accepted, &n) != 0) return 1;
  printf("replayed %d configs (%d accepted)\n", n, accepted);
  return n ? 0 : 1;
}
#endif
