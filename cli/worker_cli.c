/* `nebula worker`: the command line of one cluster's leader. It parses the options into
 * nb_worker_opts_t and maps the run's outcome to an exit code; the program is worker/worker.c. */
#include <string.h>

#include "cli/cli.h"
#include "common/opts.h"
#include "worker/worker.h"

int nb_worker_main(int argc, char** argv) {
  nb_worker_opts_t o;
  memset(&o, 0, sizeof o);
  o.listen = "127.0.0.1:0";
  // clang-format off: one option per entry
  const nb_opt_t opts[] = {
      {.name = "job",
       .kind = NB_OPT_STR,
       .dst = &o.job_file,
       .meta = "FILE",
       .help = "the job descriptor (required)"},
      {.name = "cluster",
       .kind = NB_OPT_STR,
       .dst = &o.cluster,
       .meta = "ID",
       .help = "which cluster of the job this is (required)"},
      {.name = "out",
       .kind = NB_OPT_STR,
       .dst = &o.out,
       .meta = "DIR",
       .help = "output folder (default runs/<job>/<cluster>)"},
      {.name = "listen",
       .kind = NB_OPT_STR,
       .dst = &o.listen,
       .meta = "ADDR",
       .help = "our exchange server (default 127.0.0.1:0)"},
      {.name = "peer",
       .kind = NB_OPT_LIST,
       .dst = (void*)o.peers,
       .meta = "ID=ADDR",
       .count = &o.n_peers,
       .max = NB_WORKER_MAX_PEERS,
       .help = "another cluster's exchange, one per cluster"},
      {.name = "pki",
       .kind = NB_OPT_STR,
       .dst = &o.pki,
       .meta = "DIR",
       .help = "federation PKI (DIR/ca.crt, DIR/clusters/<id>.{crt,key}): mTLS"},
      {.name = "secret-file",
       .kind = NB_OPT_STR,
       .dst = &o.secret_file,
       .meta = "F",
       .help = "the job secret (32 bytes) that seals update frames"},
      {.name = "insecure",
       .kind = NB_OPT_FLAG,
       .dst = &o.insecure,
       .help = "allow plaintext links and unsealed frames (tests, baselines)"},
      {.name = "no-rate-cap",
       .kind = NB_OPT_FLAG,
       .dst = &o.no_rate_cap,
       .help = "ignore link.rateMbit (the link itself is shaped: nebula run's\nemulated WAN)"},
      {.name = "data-dir",
       .kind = NB_OPT_STR,
       .dst = &o.data_dir,
       .meta = "DIR",
       .help = "data folder (mono/<lang>.txt); default the cluster's data.dir"},
      {.name = "steps",
       .kind = NB_OPT_LONG,
       .dst = &o.steps,
       .meta = "N",
       .min = 1,
       .help = "override training.maxSteps (inner steps per cluster)"},
      {.name = "resume",
       .kind = NB_OPT_FLAG,
       .dst = &o.resume,
       .help = "continue from this cluster's last checkpoint (checkpoint.everyRounds;\n"
               "with sync.overlap the update in flight lands before each one)"},
      {.name = "rejoin",
       .kind = NB_OPT_FLAG,
       .dst = &o.rejoin,
       .help = "a restarted cluster: pull the global state from a live peer and\n"
               "continue with the others (outer mode, with or without overlap;\n"
               "under mpirun the leader hands it to the other ranks)"},
      {.name = NULL},
  };
  // clang-format on
  const nb_cmd_spec_t spec = {
      .cmd = "nebula worker",
      .synopsis =
          "usage: nebula worker --job FILE --cluster ID [--out DIR] [--listen ADDR]\n"
          "                     [--peer ID=ADDR ...] [--pki DIR] [--secret-file F]\n"
          "                     [--data-dir DIR] [--steps N] [--resume] [--rejoin] "
          "[--insecure]",
      .about =
          "Runs cluster ID of the job: inner training steps, then every round the pseudo-gradient\n"
          "is compressed, exchanged with every other cluster (--peer, one per cluster) and "
          "applied\n"
          "by the outer Nesterov step; the clusters check each round that they hold the same\n"
          "parameters. Writes DIR/rounds.tsv and DIR/summary.json (default runs/<job>/<cluster>).",
      .epilog =
          "With several clusters, outer rounds are fault-tolerant (NB_FAULT_TOLERANT, default 1): "
          "a\n"
          "round counts on every cluster or on none, so a link down or a dead peer skips rounds\n"
          "instead of stopping the worker; with sync.overlap the round's exchange and vote run in\n"
          "the background and the decision lands sync.overlapSteps into the next round.",
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (!o.job_file || !o.cluster)
    return nb_opts_usage_error(&spec, "--job and --cluster are required");
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
