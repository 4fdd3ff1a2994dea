/* `nebula bench` dispatch and small helpers shared by the benchmarks. */
#include "bench/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"

typedef struct {
  const char* name;
  const char* summary;
  int (*main)(int argc, char** argv);
} nb_bench_entry_t;

static const nb_bench_entry_t nb__benches[] = {
    {"seal", "AES-256-GCM sealing and opening of frame chunks vs memcpy", nb_bench_seal_main},
    {"rpc", "gRPC wrapper on loopback: plaintext vs mTLS goodput and RTT", nb_bench_rpc_main},
    {"train", "transformer training step vs the machine's sgemm rate", nb_bench_train_main},
    {"codec", "the update codec: wire size, encode/decode speed vs memcpy", nb_bench_codec_main},
    {"allreduce", "intra-cluster allreduce vs raw MPI/NCCL (mpirun)", nb_bench_allreduce_main},
    {"wan", "sealed mTLS frames over the emulated WAN vs iperf3; loopback cost", nb_bench_wan_main},
    {"e2e", "single vs dense vs nebula training of one job (nebula run)", nb_bench_e2e_main},
    {"pareto", "held-out loss vs bits per parameter, per codec point (nebula run)",
     nb_bench_pareto_main},
    {"decode", "greedy decoding: K/V cache vs full recompute, tokens/s", nb_bench_decode_main},
    {"sgemm", "square cblas_sgemm GFLOP/s of the OpenBLAS kernel loaded", nb_bench_sgemm_main},
    {"parallel", "one cluster's step: data vs tensor parallelism at 2 and 4 ranks (mpirun)",
     nb_bench_parallel_main},
    {"torch", "a PyTorch GPT: single vs DDP vs nebula's binding (bench/torch_e2e.py)",
     nb_bench_torch_main},
    {NULL, NULL, NULL},
};

static int nb__cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

double nb_bench_median(double* v, size_t n) {
  qsort(v, n, sizeof *v, nb__cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int nb_bench_parse_int_flags(const char* cmd, const char* synopsis, int argc, char** argv,
                             const nb_bench_int_flag_t* flags, int n, int* json) {
  nb_opt_t opts[24];
  int k = 0;
  for (int i = 0; i < n && k < 22; i++)
    opts[k++] = (nb_opt_t){.name = flags[i].name + 2,
                           .kind = NB_OPT_INT,
                           .dst = flags[i].dst,
                           .meta = "N",
                           .help = "an integer >= 1",
                           .min = 1};
  opts[k++] =
      (nb_opt_t){.name = "json", .kind = NB_OPT_FLAG, .dst = json, .help = "print one JSON object"};
  opts[k] = (nb_opt_t){.name = NULL};
  const nb_cmd_spec_t spec = {.cmd = cmd, .synopsis = synopsis, .opts = opts};
  return nb_opts_parse(&spec, argc, argv);
}

json_t* nb_bench_json_real(double v) {
  return isfinite(v) ? json_real(v) : json_null();
}

void nb_bench_json_print(FILE* f, json_t* o) {
  char* text = o ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
  json_decref(o);
  fprintf(f, "%s\n", text ? text : "null");
  free(text);
}

void nb_json_begin(nb_json_obj_t* j, FILE* f) {
  j->f = f;
  j->o = json_object();
}

void nb_json_num(nb_json_obj_t* j, const char* key, double v) {
  json_object_set_new(j->o, key, nb_bench_json_real(v));
}

void nb_json_int(nb_json_obj_t* j, const char* key, long long v) {
  json_object_set_new(j->o, key, json_integer((json_int_t)v));
}

void nb_json_str(nb_json_obj_t* j, const char* key, const char* v) {
  json_object_set_new(j->o, key, json_string(v ? v : ""));
}

void nb_json_end(nb_json_obj_t* j) {
  nb_bench_json_print(j->f, j->o);
  j->o = NULL;
}

int nb_bench_main(int argc, char** argv) {
  size_t count = 0;
  while (nb__benches[count].name) count++;
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    printf("usage: nebula bench <name> [options] [--json]\n\nbenchmarks:\n");
    for (size_t i = 0; i < count; i++)
      printf("  %-10s %s\n", nb__benches[i].name, nb__benches[i].summary);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < count; i++)
    if (strcmp(argv[1], nb__benches[i].name) == 0) return nb__benches[i].main(argc - 1, argv + 1);
  fprintf(stderr, "nebula bench: no benchmark named '%s' (see nebula bench --help)\n", argv[1]);
  return 2;
}
