/* `nebula bench allreduce`: nebula's allreduce against the engine called directly (raw
 * MPI_Allreduce on CPU, raw ncclAllReduce on GPU) on the same warm buffers in the same run,
 * interleaved, reporting bus bandwidth as nccl-tests does. Run under mpirun; not a test. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/opts.h"
#include "intra/intra.h"

#ifdef NB_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
void* nb__comm_nccl_handle(nb_comm_t* c); /* intra's own accessor, for the raw baseline */
#endif

#define NB__AR_USAGE                                                                          \
  "usage: mpirun -np N nebula bench allreduce [--mib M] [--iters K] [--device cpu|gpu|auto] " \
  "[--json]\n"                                                                                \
  "  fp32 sum of M MiB (default 64) per rank; K timed iterations of each (default 40)"

typedef struct {
  nb_comm_t* c;
  int gpu;
  void *send, *recv;
  size_t count;
} nb__ar_t;

static nb_status_t nb__ar_raw(nb__ar_t* b) {
#ifdef NB_HAVE_NCCL
  if (b->gpu) {
    cudaStream_t s = (cudaStream_t)nb_comm_stream(b->c);
    ncclResult_t r = ncclAllReduce(b->send, b->recv, b->count, ncclFloat, ncclSum,
                                   (ncclComm_t)nb__comm_nccl_handle(b->c), s);
    if (r != ncclSuccess) return nb_error(NB_ERR_NCCL, "ncclAllReduce: %s", ncclGetErrorString(r));
    if (cudaStreamSynchronize(s) != cudaSuccess)
      return nb_error(NB_ERR_CUDA, "cudaStreamSynchronize failed");
    return NB_OK;
  }
#endif
  int rc = MPI_Allreduce(b->send, b->recv, (int)b->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? NB_OK : nb_error(NB_ERR_MPI, "MPI_Allreduce failed (%d)", rc);
}

static nb_status_t nb__ar_nebula(nb__ar_t* b) {
  return nb_comm_allreduce(b->c, b->send, b->recv, b->count, NB_COMM_FP32, NB_COMM_SUM);
}

/* One timed batch, as nccl-tests times: barrier, k calls back to back, then the slowest rank's
 * time divided by k. Back-to-back calls let each call absorb the previous one's rank skew, as
 * in a training loop, instead of starting every call from a barrier. */
static nb_status_t nb__ar_time(nb__ar_t* b, nb_status_t (*fn)(nb__ar_t*), int k, double* sec) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = nb_now_s();
  for (int i = 0; i < k; i++) NB_CHECK(fn(b));
  double dt = (nb_now_s() - t0) / k;
  MPI_Allreduce(&dt, sec, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return NB_OK;
}

static nb_status_t nb__ar_alloc(nb__ar_t* b, void** p, size_t bytes) {
#ifdef NB_HAVE_NCCL
  if (b->gpu) {
    if (cudaMalloc(p, bytes) != cudaSuccess) return nb_error(NB_ERR_CUDA, "cudaMalloc failed");
    if (cudaMemset(*p, 0, bytes) != cudaSuccess) return nb_error(NB_ERR_CUDA, "cudaMemset");
    return NB_OK;
  }
#endif
  NB_CHECK(nb_aligned_alloc(p, bytes, 1, "allreduce benchmark buffer"));
  float* f = *p;
  for (size_t i = 0; i < bytes / 4; i++) f[i] = (float)(i % 1024); /* first touch, here */
  return NB_OK;
}

static void nb__ar_free(nb__ar_t* b, void* p) {
#ifdef NB_HAVE_NCCL
  if (b->gpu) {
    cudaFree(p);
    return;
  }
#endif
  nb_free(p);
}

int nb_bench_allreduce_main(int argc, char** argv) {
  double mib = 64;
  int iters = 0, json = 0; /* 0: 40 for buffers of 1 MiB and more, else 400 */
  nb_comm_device_t device = NB_COMM_DEVICE_AUTO;
  const char* dev = NULL;
  const nb_opt_t opts[] = {
      NB_OPTION("mib", NB_OPT_DOUBLE, &mib, "M", "MiB per rank, > 0 (default 64)", .max = 8192),
      NB_OPTION("iters", NB_OPT_INT, &iters, "K", "timed iterations (default 40; 400 below 1 MiB)"),
      NB_OPTION("device", NB_OPT_STR, &dev, "D", "cpu, gpu or auto (default auto)"),
      NB_OPTION("json", NB_OPT_FLAG, &json, NULL, "print one JSON object"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula bench allreduce", .synopsis = NB__AR_USAGE, .opts = opts};
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  if (dev)
    device = !strcmp(dev, "gpu")   ? NB_COMM_DEVICE_GPU
             : !strcmp(dev, "cpu") ? NB_COMM_DEVICE_CPU
                                   : NB_COMM_DEVICE_AUTO;
  if (iters == 0) iters = mib >= 1 ? 40 : 400;
  if (!(mib > 0)) return nb_opts_usage_error(&spec, "--mib must be > 0");
  nb_status_t st = nb_intra_init(NULL, NULL);
  if (st != NB_OK) {
    fprintf(stderr, "bench allreduce: %s\n", nb_error_last());
    return 1;
  }
  nb__ar_t b = {0};
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.device = device;
  int rank = 0, size = 1, ret = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double *t_nb = NULL, *t_raw = NULL;
  NB_CHECK_GOTO(nb_comm_create(&cfg, &b.c), st, out);
  b.gpu = nb_comm_device(b.c) == NB_COMM_DEVICE_GPU;
  b.count = (size_t)(mib * 1024 * 1024) / 4;
  size_t bytes = b.count * 4;
  NB_CHECK_GOTO(nb__ar_alloc(&b, &b.send, bytes), st, out);
  NB_CHECK_GOTO(nb__ar_alloc(&b, &b.recv, bytes), st, out);
  /* iters calls of each, in batches of k, the batches interleaved (alternating which goes
   * first) so that both see the same machine. */
  int k = bytes >= (1u << 20) ? 2 : 50, batches = (iters + k - 1) / k;
  NB_CHECK_GOTO(NB_ALLOC(t_nb, (size_t)batches, "timings"), st, out);
  NB_CHECK_GOTO(NB_ALLOC(t_raw, (size_t)batches, "timings"), st, out);
  double dummy;
  for (int w = 0; w < 2; w++) { /* warm-up: first touches, engine buffers, NCCL channels */
    NB_CHECK_GOTO(nb__ar_time(&b, nb__ar_raw, 2, &dummy), st, out);
    NB_CHECK_GOTO(nb__ar_time(&b, nb__ar_nebula, 2, &dummy), st, out);
  }
  for (int it = 0; it < batches; it++) {
    if (it % 2 == 0) {
      NB_CHECK_GOTO(nb__ar_time(&b, nb__ar_raw, k, &t_raw[it]), st, out);
      NB_CHECK_GOTO(nb__ar_time(&b, nb__ar_nebula, k, &t_nb[it]), st, out);
    } else {
      NB_CHECK_GOTO(nb__ar_time(&b, nb__ar_nebula, k, &t_nb[it]), st, out);
      NB_CHECK_GOTO(nb__ar_time(&b, nb__ar_raw, k, &t_raw[it]), st, out);
    }
  }
  double tn = nb_bench_median(t_nb, (size_t)batches);
  double tr = nb_bench_median(t_raw, (size_t)batches);
  /* nccl-tests: algbw = bytes / time; busbw = algbw * 2 (n - 1) / n for allreduce. */
  double factor = 2.0 * (size - 1) / size;
  double busbw = (double)bytes / tn / 1e9 * factor, raw_busbw = (double)bytes / tr / 1e9 * factor;
  double vs_raw = tr / tn; /* = busbw / raw_busbw, and defined at 1 rank too */
  if (rank == 0) {
    if (json) {
      nb_json_obj_t j;
      nb_json_begin(&j, stdout);
      nb_json_int(&j, "ranks", size);
      nb_json_int(&j, "bytes", (long long)bytes);
      nb_json_num(&j, "busbw_gbps", busbw);
      nb_json_num(&j, "raw_busbw_gbps", raw_busbw);
      nb_json_num(&j, "vs_raw", vs_raw);
      nb_json_end(&j);
    } else {
      printf(
          "allreduce fp32 sum, %zu bytes, %d ranks, backend %s, %d calls each (median of %d "
          "batches of %d)\n",
          bytes, size, nb_comm_backend_name(b.c), batches * k, batches, k);
      const char* raw_name = b.gpu ? "raw ncclAllReduce" : "raw MPI_Allreduce";
      printf("  %-18s %12.1f us  algbw %8.3f GB/s  busbw %8.3f GB/s\n", "nebula allreduce",
             tn * 1e6, (double)bytes / tn / 1e9, busbw);
      printf("  %-18s %12.1f us  algbw %8.3f GB/s  busbw %8.3f GB/s\n", raw_name, tr * 1e6,
             (double)bytes / tr / 1e9, raw_busbw);
      printf("  vs_raw %.3f (1.0 = parity)\n", vs_raw);
    }
    fflush(stdout);
  }
  ret = 0;
out:
  if (st != NB_OK) fprintf(stderr, "bench allreduce (rank %d): %s\n", rank, nb_error_last());
  nb_free(t_nb);
  nb_free(t_raw);
  if (b.send) nb__ar_free(&b, b.send);
  if (b.recv) nb__ar_free(&b, b.recv);
  nb_comm_destroy(b.c);
  nb_intra_finalize();
  return ret;
}
