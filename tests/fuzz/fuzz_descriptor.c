/* libFuzzer target for the job descriptor parser: any bytes must give either a config whose
 * normalized form parses back to the same text, or at least one located error. Never a crash.
 * Also linked into a plain replay driver (tests/unit/jobs/fuzz_replay.c) for the bad corpus. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs/descriptor.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static nb_job_config_t cfg, again;
  static nb_descriptor_diag_t diag;
  nb_status_t st = nb_descriptor_parse((const char*)data, size, &cfg, &diag);
  if (st != NB_OK) {
    /* A rejection always says where and why. */
    if (st != NB_ERR_CONFIG || diag.count < 1) abort();
    for (int i = 0; i < diag.count; i++)
      if (diag.errors[i].path[0] != '$' || diag.errors[i].message[0] == 0) abort();
    return 0;
  }
  char *j1 = NULL, *j2 = NULL;
  if (nb_descriptor_to_json(&cfg, &j1) != NB_OK) abort();
  if (nb_descriptor_parse(j1, strlen(j1), &again, &diag) != NB_OK) {
    fprintf(stderr, "normalized descriptor rejected: %s: %s\n", diag.errors[0].path,
            diag.errors[0].message);
    abort();
  }
  if (nb_descriptor_to_json(&again, &j2) != NB_OK || strcmp(j1, j2) != 0) abort();
  free(j1);
  free(j2);
  return 0;
}
