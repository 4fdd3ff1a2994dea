/* Benchmarks behind `nebula bench <name>`. Each measures speed against a baseline taken in the
 * same run and prints ratios (never asserts on absolute time); --json prints one object. */
#ifndef NB_BENCH_BENCH_H
#define NB_BENCH_BENCH_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `nebula bench NAME [options]`: dispatches to the benchmark. */
int nb_bench_main(int argc, char** argv);

/* `nebula bench seal`: AES-256-GCM chunk sealing throughput vs memcpy (bench_seal.c). */
int nb_bench_seal_main(int argc, char** argv);
/* `nebula bench rpc` (bench_rpc.c): loopback goodput and RTT of inter/rpc, plain vs mTLS. */
int nb_bench_rpc_main(int argc, char** argv);
/* `nebula bench train`: transformer training-step throughput vs cblas_sgemm (bench_train.c). */
int nb_bench_train_main(int argc, char** argv);

int nb_bench_codec_main(int argc, char** argv); /* `nebula bench codec` (bench_codec.c) */
/* `nebula bench allreduce` (bench_allreduce.c). */
int nb_bench_allreduce_main(int argc, char** argv);
/* `nebula bench wan` (bench_wan.c): inter/link over the emulated WAN vs iperf3, and loopback. */
int nb_bench_wan_main(int argc, char** argv);
/* `nebula bench e2e` (bench_e2e.c): single vs dense vs nebula on one job via `nebula run` */
int nb_bench_e2e_main(int argc, char** argv);
/* `nebula bench pareto` (bench_pareto.c): loss ratio vs bits per parameter per codec point */
int nb_bench_pareto_main(int argc, char** argv);
/* `nebula bench decode` (bench_decode.c): greedy decoding, K/V cache vs full recompute. */
int nb_bench_decode_main(int argc, char** argv);
/* `nebula bench sgemm` (bench_sgemm.c): square cblas_sgemm GFLOP/s of the loaded kernel. */
int nb_bench_sgemm_main(int argc, char** argv);

/* Best GFLOP/s of reps n x n x n cblas_sgemm calls after one warm-up; 0 when out of memory. */
double nb_bench_sgemm_gflops(int n, int reps);
/* Runs `nebula bench sgemm --n n` twice per OpenBLAS core type this CPU can run
 * (nb_blas_candidates; the types in turn, best of the two), each in a child process with
 * OPENBLAS_CORETYPE set and `threads` OpenBLAS threads. Returns a new JSON array of {coretype,
 * core, gflops} (gflops null when that type did not run: OpenBLAS without that kernel, a failed
 * child); *best receives the highest rate (0 when none ran) and *best_core its type (static; ""
 * when none). */
json_t* nb_bench_sgemm_candidates(int n, int threads, double* best, const char** best_core);
/* (Off x86 there are no types to choose from: one row of the loaded kernel, in this process.) */
/* `nebula bench parallel` (bench_parallel.c): data vs tensor parallelism at 2 and 4 ranks */
int nb_bench_parallel_main(int argc, char** argv);
/* `nebula bench torch` (bench_torch.c: runs bench/torch_e2e.py) */
int nb_bench_torch_main(int argc, char** argv);

/* Median of n samples (the array is reordered). n must be > 0. */
double nb_bench_median(double* v, size_t n);

/* One flag of a benchmark that takes a positive integer ("--layers": with its dashes). */
typedef struct {
  const char* name;
  int* dst;
} nb_bench_int_flag_t;

/* Parses argv[1..] with common/opts.h: "--json" sets *json, every flag of the table takes an
 * integer >= 1 (`--layers 4` or `--layers=4`). cmd ("nebula bench train") starts each error
 * line; synopsis is what --help prints above the flags. Returns NB_OPTS_RUN to go on, else the
 * exit status: 0 after --help, 2 after one line naming the bad flag. */
int nb_bench_parse_int_flags(const char* cmd, const char* synopsis, int argc, char** argv,
                             const nb_bench_int_flag_t* flags, int n, int* json);

/* The --json output of a benchmark: one object built with jansson and printed by nb_json_end,
 * so that it always parses; a number that is not finite (a ratio over a zero, a NaN of a run
 * that did not happen) is null, as JSON has no NaN. */
typedef struct {
  FILE* f;
  json_t* o;
} nb_json_obj_t;
void nb_json_begin(nb_json_obj_t* j, FILE* f);
void nb_json_num(nb_json_obj_t* j, const char* key, double v);
void nb_json_int(nb_json_obj_t* j, const char* key, long long v);
void nb_json_str(nb_json_obj_t* j, const char* key, const char* v);
void nb_json_end(nb_json_obj_t* j);

/* A number for a benchmark's JSON: null when not finite. New reference. */
json_t* nb_bench_json_real(double v);
/* Prints o (stolen) on f as one line of JSON, 6 significant digits for reals. */
void nb_bench_json_print(FILE* f, json_t* o);

#ifdef __cplusplus
}
#endif
#endif
