/* `nebula worker`: the command line of one cluster's leader. It parses the options into
 * nb_worker_opts_t and maps the run's outcome to an exit code; the program is worker/worker.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "worker/worker.h"

static void nb__worker_usage(FILE* f) {
  fprintf(
      f,
      "usage: nebula worker --job FILE --cluster ID [--out DIR] [--listen ADDR]\n"
      "                     [--peer ID=ADDR ...] [--pki DIR] [--secret-file F]\n"
      "                     [--data-dir DIR] [--steps N] [--resume] [--rejoin] [--insecure]\n"
      "\n"
      "Runs cluster ID of the job: inner training steps, then every round the pseudo-gradient\n"
      "is compressed, exchanged with every other cluster (--peer, one per cluster) and applied\n"
      "by the outer Nesterov step; the clusters check each round that they hold the same\n"
      "parameters. Writes DIR/rounds.tsv and DIR/summary.json (default runs/<job>/<cluster>).\n"
      "  --listen ADDR      our exchange server (default 127.0.0.1:0)\n"
      "  --pki DIR          federation PKI (DIR/ca.crt, DIR/clusters/<id>.{crt,key}): mTLS\n"
      "  --secret-file F    the job secret (32 bytes) that seals update frames\n"
      "  --insecure         allow plaintext links and unsealed frames (tests, baselines)\n"
      "  --no-rate-cap      ignore link.rateMbit (the link itself is shaped: nebula run's\n"
      "                     emulated WAN)\n"
      "  --data-dir DIR     data folder (mono/<lang>.txt); default the cluster's data.dir\n"
      "  --steps N          override training.maxSteps (inner steps per cluster)\n"
      "  --resume           continue from this cluster's last checkpoint (checkpoint.everyRounds;\n"
      "                     with sync.overlap the update in flight lands before each one)\n"
      "  --rejoin           a restarted cluster: pull the global state from a live peer and\n"
      "                     continue with the others (outer mode, with or without overlap;\n"
      "                     under mpirun the leader hands it to the other ranks)\n"
      "With several clusters, outer rounds are fault-tolerant (NB_FAULT_TOLERANT, default 1): a\n"
      "round counts on every cluster or on none, so a link down or a dead peer skips rounds\n"
      "instead of stopping the worker; with sync.overlap the round's exchange and vote run in\n"
      "the background and the decision lands sync.overlapSteps into the next round.\n");
}

int nb_worker_main(int argc, char** argv) {
  nb_worker_opts_t o;
  memset(&o, 0, sizeof o);
  o.listen = "127.0.0.1:0";
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    int v = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      nb__worker_usage(stdout);
      return NB_EXIT_OK;
    } else if (strcmp(a, "--insecure") == 0) {
      o.insecure = 1;
    } else if (strcmp(a, "--no-rate-cap") == 0) {
      o.no_rate_cap = 1;
    } else if (strcmp(a, "--resume") == 0) {
      o.resume = 1;
    } else if (strcmp(a, "--rejoin") == 0) {
      o.rejoin = 1;
    } else if (strcmp(a, "--job") == 0 && v) {
      o.job_file = argv[++i];
    } else if (strcmp(a, "--cluster") == 0 && v) {
      o.cluster = argv[++i];
    } else if (strcmp(a, "--out") == 0 && v) {
      o.out = argv[++i];
    } else if (strcmp(a, "--listen") == 0 && v) {
      o.listen = argv[++i];
    } else if (strcmp(a, "--pki") == 0 && v) {
      o.pki = argv[++i];
    } else if (strcmp(a, "--secret-file") == 0 && v) {
      o.secret_file = argv[++i];
    } else if (strcmp(a, "--data-dir") == 0 && v) {
      o.data_dir = argv[++i];
    } else if (strcmp(a, "--steps") == 0 && v) {
      char* end;
      o.steps = strtol(argv[++i], &end, 10);
      if (*end || end == argv[i] || o.steps < 1) {
        fprintf(stderr, "nebula worker: --steps needs an integer >= 1, got '%s'\n", argv[i]);
        return NB_EXIT_USAGE;
      }
    } else if (strcmp(a, "--peer") == 0 && v) {
      if (o.n_peers == NB_WORKER_MAX_PEERS) {
        fprintf(stderr, "nebula worker: at most %d --peer\n", NB_WORKER_MAX_PEERS);
        return NB_EXIT_USAGE;
      }
      o.peers[o.n_peers++] = argv[++i];
    } else {
      fprintf(stderr, "nebula worker: unknown option or missing value: '%s'\n", a);
      nb__worker_usage(stderr);
      return NB_EXIT_USAGE;
    }
  }
  if (!o.job_file || !o.cluster) {
    nb__worker_usage(stderr);
    return NB_EXIT_USAGE;
  }
  if (!o.pki && !o.insecure) {
    fprintf(stderr, "nebula worker: --pki DIR is required (or --insecure for a plaintext test)\n");
    return NB_EXIT_USAGE;
  }
  switch (nb_worker_run(&o)) {
    case NB_WORKER_DONE:
      return NB_EXIT_OK;
    case NB_WORKER_MISFIT:
      return NB_EXIT_USAGE;
    default:
      return NB_EXIT_FAIL;
  }
}
