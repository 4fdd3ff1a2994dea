/* The NCCL backend (GPU workers): one device per rank, NCCL's unique id broadcast over MPI, every
 * operation enqueued on the communicator's CUDA stream. Compiled only when NCCL is found; it
 * adds no kernels of its own (NCCL's ncclAvg does the averaging on the device). */
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/common.h"
#include "intra/intra_internal.h"
#include "kernels/device.h"

typedef struct {
  ncclComm_t nccl;
  cudaStream_t stream;
  int own_stream;
  int dev;
} nb__nccl_t;

#define NB__NCCL_CHECK(comm, call)                                                  \
  do {                                                                              \
    ncclResult_t nb__r = (call);                                                    \
    if (nb__r != ncclSuccess)                                                       \
      return nb_error(NB_ERR_NCCL, "%s: %s (%s)", #call, ncclGetErrorString(nb__r), \
                      (comm) ? ncclGetLastError(comm) : "");                        \
  } while (0)

#define NB__CUDA_CHECK(call)                                                    \
  do {                                                                          \
    cudaError_t nb__e = (call);                                                 \
    if (nb__e != cudaSuccess)                                                   \
      return nb_error(NB_ERR_CUDA, "%s: %s", #call, cudaGetErrorString(nb__e)); \
  } while (0)

static nb__nccl_t* nb__st(nb_comm_t* c) {
  return (nb__nccl_t*)c->be_state;
}

static ncclDataType_t nb__ntype(nb_comm_dtype_t dt) {
  switch (dt) {
    case NB_COMM_FP16:
      return ncclHalf;
    case NB_COMM_BF16:
      return ncclBfloat16;
    default:
      return ncclFloat;
  }
}

static ncclRedOp_t nb__nop(nb_comm_op_t op) {
  return op == NB_COMM_AVG ? ncclAvg : ncclSum;
}

void* nb__comm_nccl_handle(nb_comm_t* c) {
  return c->device == NB_COMM_DEVICE_GPU && c->be_state ? (void*)nb__st(c)->nccl : NULL;
}

/* Local part of set-up: device and stream. Agreed across ranks before NCCL is touched. */
static nb_status_t nb__nccl_local(nb_comm_t* c, nb__nccl_t* s, const nb_comm_config_t* cfg) {
  int ndev = nb_device_count();
  if (ndev <= 0) return nb_error(NB_ERR_UNSUPPORTED, "no CUDA device on this rank");
  s->dev = cfg->gpu >= 0 ? cfg->gpu : c->local_rank % ndev;
  if (s->dev >= ndev)
    return nb_error(NB_ERR_INVALID, "gpu %d asked for, but this rank sees %d device(s)", s->dev,
                    ndev);
  NB__CUDA_CHECK(cudaSetDevice(s->dev));
  if (cfg->stream) {
    s->stream = (cudaStream_t)cfg->stream;
  } else {
    /* A blocking stream: ordered after work on the legacy default stream (cudaMemcpy, kernels
     * launched without a stream), so inputs written that way are ready. */
    NB__CUDA_CHECK(cudaStreamCreate(&s->stream));
    s->own_stream = 1;
  }
  return NB_OK;
}

static nb_status_t nb__nccl_init(nb_comm_t* c, const nb_comm_config_t* cfg) {
  nb__nccl_t* s = NULL;
  NB_CHECK(NB_CALLOC(s, 1, "NCCL backend"));
  c->be_state = s;
  NB_CHECK(nb__comm_agree(c, nb__nccl_local(c, s, cfg), "NCCL device set-up"));
  c->stream = s->stream;
  struct {
    int st;
    ncclUniqueId id;
  } u = {0};
  if (c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&u.id);
    u.st = (int)r;
  }
  NB_MPI_CHECK(MPI_Bcast(&u, (int)sizeof u, MPI_BYTE, 0, c->mpi));
  if (u.st != ncclSuccess)
    return nb_error(NB_ERR_NCCL, "ncclGetUniqueId on rank 0: %s",
                    ncclGetErrorString((ncclResult_t)u.st));
  nb_status_t st = NB_OK;
  ncclResult_t r = ncclCommInitRank(&s->nccl, c->size, u.id, c->rank);
  if (r != ncclSuccess) {
    s->nccl = NULL;
    st = nb_error(NB_ERR_NCCL, "ncclCommInitRank(%d of %d, gpu %d): %s", c->rank, c->size, s->dev,
                  ncclGetErrorString(r));
  }
  NB_CHECK(nb__comm_agree(c, st, "NCCL communicator set-up"));
  NB_INFO(INTRA, "NCCL %d ranks, rank %d on gpu %d", c->size, c->rank, s->dev);
  return NB_OK;
}

static void nb__nccl_fini(nb_comm_t* c) {
  nb__nccl_t* s = nb__st(c);
  if (!s) return;
  if (s->stream) cudaStreamSynchronize(s->stream);
  if (s->nccl) ncclCommDestroy(s->nccl);
  if (s->own_stream && s->stream) cudaStreamDestroy(s->stream);
  nb_free(s);
  c->be_state = NULL;
}

/* Blocking: wait for the stream. Async: record an event the request waits for. */
static nb_status_t nb__nccl_done(nb_comm_t* c, nb_comm_request_t* req) {
  nb__nccl_t* s = nb__st(c);
  if (!req) {
    NB__CUDA_CHECK(cudaStreamSynchronize(s->stream));
    return NB_OK;
  }
  cudaEvent_t ev;
  NB__CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  req->event = ev;
  NB__CUDA_CHECK(cudaEventRecord(ev, s->stream));
  return NB_OK;
}

static nb_status_t nb__nccl_allreduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                                      nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t* req) {
  nb__nccl_t* s = nb__st(c);
  NB__NCCL_CHECK(s->nccl,
                 ncclAllReduce(send, recv, count, nb__ntype(dt), nb__nop(op), s->nccl, s->stream));
  return nb__nccl_done(c, req);
}

static nb_status_t nb__nccl_reduce_scatter(nb_comm_t* c, const void* send, void* recv, size_t rc,
                                           nb_comm_dtype_t dt, nb_comm_op_t op,
                                           nb_comm_request_t* req) {
  nb__nccl_t* s = nb__st(c);
  NB__NCCL_CHECK(s->nccl,
                 ncclReduceScatter(send, recv, rc, nb__ntype(dt), nb__nop(op), s->nccl, s->stream));
  return nb__nccl_done(c, req);
}

static nb_status_t nb__nccl_allgather(nb_comm_t* c, const void* send, void* recv, size_t sc,
                                      nb_comm_dtype_t dt, nb_comm_request_t* req) {
  nb__nccl_t* s = nb__st(c);
  NB__NCCL_CHECK(s->nccl, ncclAllGather(send, recv, sc, nb__ntype(dt), s->nccl, s->stream));
  return nb__nccl_done(c, req);
}

static nb_status_t nb__nccl_broadcast(nb_comm_t* c, const void* send, void* recv, size_t count,
                                      nb_comm_dtype_t dt, int root, nb_comm_request_t* req) {
  nb__nccl_t* s = nb__st(c);
  NB__NCCL_CHECK(s->nccl,
                 ncclBroadcast(send, recv, count, nb__ntype(dt), root, s->nccl, s->stream));
  return nb__nccl_done(c, req);
}

static nb_status_t nb__nccl_reduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                                   nb_comm_dtype_t dt, nb_comm_op_t op, int root) {
  nb__nccl_t* s = nb__st(c);
  NB__NCCL_CHECK(
      s->nccl, ncclReduce(send, recv, count, nb__ntype(dt), nb__nop(op), root, s->nccl, s->stream));
  return nb__nccl_done(c, NULL);
}

static nb_status_t nb__nccl_sync(nb_comm_t* c) {
  NB__CUDA_CHECK(cudaStreamSynchronize(nb__st(c)->stream));
  return NB_OK;
}

static nb_status_t nb__nccl_barrier(nb_comm_t* c) {
  NB_CHECK(nb__nccl_sync(c));
  NB_MPI_CHECK(MPI_Barrier(c->mpi));
  return NB_OK;
}

static nb_status_t nb__nccl_wait(nb_comm_request_t* req) {
  if (!req->event) return NB_OK;
  cudaEvent_t ev = (cudaEvent_t)req->event;
  cudaError_t e = cudaEventSynchronize(ev);
  cudaEventDestroy(ev);
  req->event = NULL;
  if (e != cudaSuccess)
    return nb_error(NB_ERR_CUDA, "cudaEventSynchronize: %s", cudaGetErrorString(e));
  return NB_OK;
}

static nb_status_t nb__nccl_test(nb_comm_request_t* req, int* done) {
  *done = 1;
  if (!req->event) return NB_OK;
  cudaError_t e = cudaEventQuery((cudaEvent_t)req->event);
  if (e == cudaErrorNotReady) {
    *done = 0;
    return NB_OK;
  }
  if (e != cudaSuccess) return nb_error(NB_ERR_CUDA, "cudaEventQuery: %s", cudaGetErrorString(e));
  return NB_OK;
}

const nb__comm_backend_t nb__comm_nccl_backend = {
    .name = "nccl",
    .init = nb__nccl_init,
    .fini = nb__nccl_fini,
    .allreduce = nb__nccl_allreduce,
    .reduce_scatter = nb__nccl_reduce_scatter,
    .allgather = nb__nccl_allgather,
    .broadcast = nb__nccl_broadcast,
    .reduce = nb__nccl_reduce,
    .barrier = nb__nccl_barrier,
    .sync = nb__nccl_sync,
    .wait = nb__nccl_wait,
    .test = nb__nccl_test,
    .max_count = (size_t)-1,
};
