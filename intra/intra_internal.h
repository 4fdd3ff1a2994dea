/* Internal to intra/: the communicator's fields and the table every backend (MPI, NCCL) fills.
 * Not a public header; nothing outside intra/ includes it. */
#ifndef NB_INTRA_INTRA_INTERNAL_H
#define NB_INTRA_INTRA_INTERNAL_H

#include <mpi.h>

#include "intra/intra.h"

typedef struct nb__comm_backend nb__comm_backend_t;

struct nb_comm {
  MPI_Comm mpi; /* our duplicate of the caller's communicator (errors return, never abort) */
  int rank, size;
  int local_rank; /* rank among the processes of this node */
  nb_comm_device_t device;
  const nb__comm_backend_t* be;
  void* be_state;
  MPI_Op op_sum_f16, op_sum_bf16; /* user-defined commutative sums over 2-byte types */
  int validate;
  int next_bad; /* a bad argument found before the check (NULL request pointer) */
  void* stream; /* GPU: the cudaStream_t operations are enqueued on */
};

/* Work left for completion time (MPI): move a result into place, then divide for AVG. */
typedef struct {
  void* move_dst;
  const void* move_src;
  size_t move_bytes;
  void* scale_buf;
  size_t scale_count;
  nb_comm_dtype_t dt;
  int divisor; /* 0 or 1: nothing to do */
} nb__comm_post_t;

struct nb_comm_request {
  nb_comm_t* c;
  MPI_Request mreq;
  void* event; /* cudaEvent_t on GPU */
  nb__comm_post_t post;
};

/* Each operation starts the collective. req == NULL: blocking (return when complete); else
 * fill *req so that wait/test complete it. Arguments have been validated. */
struct nb__comm_backend {
  const char* name;
  nb_status_t (*init)(nb_comm_t* c, const nb_comm_config_t* cfg);
  void (*fini)(nb_comm_t* c);
  nb_status_t (*allreduce)(nb_comm_t* c, const void* send, void* recv, size_t count,
                           nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t* req);
  nb_status_t (*reduce_scatter)(nb_comm_t* c, const void* send, void* recv, size_t recv_count,
                                nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t* req);
  nb_status_t (*allgather)(nb_comm_t* c, const void* send, void* recv, size_t send_count,
                           nb_comm_dtype_t dt, nb_comm_request_t* req);
  nb_status_t (*broadcast)(nb_comm_t* c, const void* send, void* recv, size_t count,
                           nb_comm_dtype_t dt, int root, nb_comm_request_t* req);
  nb_status_t (*reduce)(nb_comm_t* c, const void* send, void* recv, size_t count,
                        nb_comm_dtype_t dt, nb_comm_op_t op, int root);
  nb_status_t (*barrier)(nb_comm_t* c);
  /* Waits for everything enqueued so far (GPU stream); no-op on CPU. */
  nb_status_t (*sync)(nb_comm_t* c);
  nb_status_t (*wait)(nb_comm_request_t* req);
  nb_status_t (*test)(nb_comm_request_t* req, int* done);
  size_t max_count; /* largest element count one call accepts */
};

extern const nb__comm_backend_t nb__comm_mpi_backend;
#ifdef NB_HAVE_NCCL
extern const nb__comm_backend_t nb__comm_nccl_backend;
/* The ncclComm_t of a GPU communicator (for the benchmark's raw baseline); NULL on CPU. */
void* nb__comm_nccl_handle(nb_comm_t* c);
#endif

/* MPI return code → NB_ERR_MPI with MPI's error text. */
nb_status_t nb__mpi_error(int rc, const char* what);
#define NB_MPI_CHECK(call)                                          \
  do {                                                              \
    int nb__rc = (call);                                            \
    if (nb__rc != MPI_SUCCESS) return nb__mpi_error(nb__rc, #call); \
  } while (0)

/* Agrees on a status across the communicator: every rank returns the error of the lowest rank
 * that failed (its message is re-created on the other ranks), or NB_OK. Blocking, collective. */
nb_status_t nb__comm_agree(nb_comm_t* c, nb_status_t st, const char* what);

/* Applies a post step on host memory (move, then AVG division). */
void nb__comm_post_apply(const nb__comm_post_t* p);

#endif
