/* The MPI backend (CPU workers): each operation maps onto one MPI collective on our duplicate
 * communicator, blocking ones onto the blocking calls (their tuned algorithms) and the async
 * ones onto MPI_I*. fp16/bf16 sums use user-defined ops; no collective algorithm lives here. */
#include <limits.h>
#include <string.h>

#include "common/common.h"
#include "intra/half.h"
#include "intra/intra_internal.h"

/* Pairwise sums of 2-byte floats, computed in fp32 and rounded to nearest even. Because binary32
 * has at least 2p+2 bits for p = 11 (fp16) and p = 8 (bf16), the double rounding is innocuous:
 * each result is the correctly rounded IEEE sum, and a + b == b + a bit for bit (commutative). */
static void nb__op_sum_f16(void* in, void* inout, int* len, MPI_Datatype* type) {
  nb__sum_f16(in, inout, (size_t)*len, 1);
}

static void nb__op_sum_bf16(void* in, void* inout, int* len, MPI_Datatype* type) {
  nb__sum_bf16(in, inout, (size_t)*len, 1);
}

static MPI_Datatype nb__type(nb_comm_dtype_t dt) {
  return dt == NB_COMM_FP32 ? MPI_FLOAT : MPI_UINT16_T;
}

static MPI_Op nb__op(const nb_comm_t* c, nb_comm_dtype_t dt) {
  switch (dt) {
    case NB_COMM_FP16:
      return c->op_sum_f16;
    case NB_COMM_BF16:
      return c->op_sum_bf16;
    default:
      return MPI_SUM;
  }
}

static nb_status_t nb__mpi_init(nb_comm_t* c, const nb_comm_config_t* cfg) {
  NB_MPI_CHECK(MPI_Op_create(nb__op_sum_f16, 1, &c->op_sum_f16));
  NB_MPI_CHECK(MPI_Op_create(nb__op_sum_bf16, 1, &c->op_sum_bf16));
  return NB_OK;
}

static void nb__mpi_fini(nb_comm_t* c) {
  if (c->op_sum_f16 != MPI_OP_NULL) MPI_Op_free(&c->op_sum_f16);
  if (c->op_sum_bf16 != MPI_OP_NULL) MPI_Op_free(&c->op_sum_bf16);
}

/* Blocking: apply the post step now. Async: keep it for wait. */
static nb_status_t nb__done(nb_comm_request_t* req, const nb__comm_post_t* post) {
  if (req)
    req->post = *post;
  else
    nb__comm_post_apply(post);
  return NB_OK;
}

static nb_status_t nb__mpi_allreduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                                     nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t* req) {
  const void* sb = send == recv ? MPI_IN_PLACE : send;
  int n = (int)count;
  if (req)
    NB_MPI_CHECK(MPI_Iallreduce(sb, recv, n, nb__type(dt), nb__op(c, dt), c->mpi, &req->mreq));
  else
    NB_MPI_CHECK(MPI_Allreduce(sb, recv, n, nb__type(dt), nb__op(c, dt), c->mpi));
  nb__comm_post_t post = {.scale_buf = recv,
                          .scale_count = count,
                          .dt = dt,
                          .divisor = op == NB_COMM_AVG ? c->size : 1};
  return nb__done(req, &post);
}

static nb_status_t nb__mpi_reduce_scatter(nb_comm_t* c, const void* send, void* recv, size_t rc,
                                          nb_comm_dtype_t dt, nb_comm_op_t op,
                                          nb_comm_request_t* req) {
  size_t es = nb_comm_dtype_size(dt);
  int in_place = (const char*)recv == (const char*)send + es * rc * c->rank;
  /* MPI's in-place form leaves the block at the start of the buffer; NCCL's convention (which
   * we keep) has it at rank * rc, so it is moved there on completion. */
  void* rb = in_place ? (void*)send : recv;
  const void* sb = in_place ? MPI_IN_PLACE : send;
  int n = (int)rc;
  if (req)
    NB_MPI_CHECK(
        MPI_Ireduce_scatter_block(sb, rb, n, nb__type(dt), nb__op(c, dt), c->mpi, &req->mreq));
  else
    NB_MPI_CHECK(MPI_Reduce_scatter_block(sb, rb, n, nb__type(dt), nb__op(c, dt), c->mpi));
  nb__comm_post_t post = {.move_dst = recv,
                          .move_src = rb,
                          .move_bytes = in_place ? es * rc : 0,
                          .scale_buf = recv,
                          .scale_count = rc,
                          .dt = dt,
                          .divisor = op == NB_COMM_AVG ? c->size : 1};
  return nb__done(req, &post);
}

static nb_status_t nb__mpi_allgather(nb_comm_t* c, const void* send, void* recv, size_t sc,
                                     nb_comm_dtype_t dt, nb_comm_request_t* req) {
  size_t es = nb_comm_dtype_size(dt);
  int in_place = (const char*)send == (const char*)recv + es * sc * c->rank;
  const void* sb = in_place ? MPI_IN_PLACE : send;
  int n = (int)sc, sn = in_place ? 0 : n;
  MPI_Datatype t = nb__type(dt), st = in_place ? MPI_DATATYPE_NULL : t;
  if (req)
    NB_MPI_CHECK(MPI_Iallgather(sb, sn, st, recv, n, t, c->mpi, &req->mreq));
  else
    NB_MPI_CHECK(MPI_Allgather(sb, sn, st, recv, n, t, c->mpi));
  nb__comm_post_t post = {0};
  return nb__done(req, &post);
}

static nb_status_t nb__mpi_broadcast(nb_comm_t* c, const void* send, void* recv, size_t count,
                                     nb_comm_dtype_t dt, int root, nb_comm_request_t* req) {
  if (c->rank == root && send != recv) memcpy(recv, send, count * nb_comm_dtype_size(dt));
  int n = (int)count;
  if (req)
    NB_MPI_CHECK(MPI_Ibcast(recv, n, nb__type(dt), root, c->mpi, &req->mreq));
  else
    NB_MPI_CHECK(MPI_Bcast(recv, n, nb__type(dt), root, c->mpi));
  nb__comm_post_t post = {0};
  return nb__done(req, &post);
}

static nb_status_t nb__mpi_reduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                                  nb_comm_dtype_t dt, nb_comm_op_t op, int root) {
  int is_root = c->rank == root, n = (int)count;
  const void* sb = is_root && send == recv ? MPI_IN_PLACE : send;
  NB_MPI_CHECK(MPI_Reduce(sb, is_root ? recv : NULL, n, nb__type(dt), nb__op(c, dt), root, c->mpi));
  if (is_root) {
    nb__comm_post_t post = {.scale_buf = recv,
                            .scale_count = count,
                            .dt = dt,
                            .divisor = op == NB_COMM_AVG ? c->size : 1};
    nb__comm_post_apply(&post);
  }
  return NB_OK;
}

static nb_status_t nb__mpi_barrier(nb_comm_t* c) {
  NB_MPI_CHECK(MPI_Barrier(c->mpi));
  return NB_OK;
}

static nb_status_t nb__mpi_sync(nb_comm_t* c) {
  return NB_OK;
}

static nb_status_t nb__mpi_wait(nb_comm_request_t* req) {
  NB_MPI_CHECK(MPI_Wait(&req->mreq, MPI_STATUS_IGNORE));
  nb__comm_post_apply(&req->post);
  memset(&req->post, 0, sizeof req->post); /* applied exactly once */
  return NB_OK;
}

static nb_status_t nb__mpi_test(nb_comm_request_t* req, int* done) {
  NB_MPI_CHECK(MPI_Test(&req->mreq, done, MPI_STATUS_IGNORE));
  return NB_OK;
}

const nb__comm_backend_t nb__comm_mpi_backend = {
    .name = "mpi",
    .init = nb__mpi_init,
    .fini = nb__mpi_fini,
    .allreduce = nb__mpi_allreduce,
    .reduce_scatter = nb__mpi_reduce_scatter,
    .allgather = nb__mpi_allgather,
    .broadcast = nb__mpi_broadcast,
    .reduce = nb__mpi_reduce,
    .barrier = nb__mpi_barrier,
    .sync = nb__mpi_sync,
    .wait = nb__mpi_wait,
    .test = nb__mpi_test,
    .max_count = INT_MAX,
};
