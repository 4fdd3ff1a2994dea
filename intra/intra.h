/* intra: the intra-cluster communicator. One API over two engines, Horovod-style: NCCL for GPU
 * workers and MPI for CPU workers, chosen at run time from the job's device. It wraps the
 * engines' collectives; it does not implement collective algorithms of its own. */
#ifndef NB_INTRA_INTRA_H
#define NB_INTRA_INTRA_H

#include <stddef.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. Values are part of the cross-rank argument check; append only. */
typedef enum {
  NB_COMM_FP32 = 0, /* IEEE binary32 */
  NB_COMM_FP16 = 1, /* IEEE binary16 */
  NB_COMM_BF16 = 2, /* bfloat16 (upper half of a binary32) */
  NB_COMM_DTYPE_COUNT_
} nb_comm_dtype_t;

/* Reductions. AVG is the sum divided by the number of ranks. */
typedef enum { NB_COMM_SUM = 0, NB_COMM_AVG = 1, NB_COMM_OP_COUNT_ } nb_comm_op_t;

/* Where the buffers live, which selects the engine: CPU → MPI, GPU → NCCL. AUTO picks GPU when
 * this build has NCCL and the process sees a CUDA device, else CPU. */
typedef enum {
  NB_COMM_DEVICE_AUTO = 0,
  NB_COMM_DEVICE_CPU = 1,
  NB_COMM_DEVICE_GPU = 2
} nb_comm_device_t;

typedef struct nb_comm nb_comm_t;
typedef struct nb_comm_request nb_comm_request_t;

typedef struct {
  nb_comm_device_t device; /* default AUTO */
  /* Points to the MPI_Comm whose ranks form the cluster (borrowed, read at nb_comm_create);
   * NULL (what nb_comm_config_init sets) or MPI_COMM_NULL means MPI_COMM_WORLD. It is
   * duplicated: the caller keeps ownership of its own. A pointer, so that this header does not
   * pull in <mpi.h>: only intra/ and a caller that builds its own communicators see MPI. */
  const void* mpi_comm;
  /* GPU only: CUDA device ordinal; -1 (default) = node-local rank modulo the device count. */
  int gpu;
  /* GPU only: cudaStream_t to enqueue on (borrowed, must outlive the communicator); NULL
   * (default) = the communicator creates its own stream, which (being a blocking stream) is
   * ordered after work on the legacy default stream. Inputs produced on other streams must be
   * complete, or ordered before the call with an event, when a collective is called. */
  void* stream;
} nb_comm_config_t;

/* Fills *cfg with the defaults above. */
void nb_comm_config_init(nb_comm_config_t* cfg);

/* Initializes MPI (MPI_THREAD_SERIALIZED) unless the program already did; nb_comm_create calls
 * it. Returns NB_ERR_MPI if MPI cannot start. Not thread-safe; call from the main thread. */
nb_status_t nb_intra_init(int* argc, char*** argv);

/* The number of processes the launcher started for this job (OMPI_COMM_WORLD_SIZE under Open
 * MPI's mpirun, PMI_SIZE under other PMI launchers); 1 when the process was not launched by
 * one, or the variable is not a number. Reads only the environment: MPI need not be started.
 * Thread-safe. */
int nb_intra_launch_size(void);

/* Ends every process of the launch with exit code `code` (MPI_Abort), for a rank that fails
 * while the others wait in a collective: they would wait forever. Does not return. c may be
 * NULL (MPI started or not). */
void nb_comm_abort(nb_comm_t* c, int code);

/* Finalizes MPI if nb_intra_init started it and it is still running. Every communicator must
 * have been destroyed. Not thread-safe. */
void nb_intra_finalize(void);

/* Creates a communicator over the ranks of cfg->mpi_comm (NULL cfg = defaults). Collective: every
 * rank of that MPI communicator must call it. The GPU device is validated on every rank and the
 * outcome agreed, so a rank without a device makes every rank fail, not hang.
 *   out: receives the communicator (caller destroys it).
 * Returns NB_ERR_INVALID (bad config), NB_ERR_UNSUPPORTED (GPU asked for but this build has no
 * NCCL or this rank has no device), NB_ERR_MPI, NB_ERR_NCCL, NB_ERR_CUDA, NB_ERR_NOMEM. */
nb_status_t nb_comm_create(const nb_comm_config_t* cfg, nb_comm_t** out);

/* Splits c into sub-communicators (MPI_Comm_split): the ranks giving the same color form one,
 * ordered by key (then by rank in c), on c's device (a GPU one gets its own NCCL communicator).
 * Collective over c. For the grids of model parallelism: the tensor-parallel groups and the
 * data-parallel ones across them. NB_ERR_INVALID (color < 0, NULL out), NB_ERR_MPI, and the
 * errors of nb_comm_create. */
nb_status_t nb_comm_split(nb_comm_t* c, int color, int key, nb_comm_t** out);

/* Frees the communicator (NULL ok). Collective for NCCL communicators. Outstanding requests must
 * have been waited for. */
void nb_comm_destroy(nb_comm_t* c);

int nb_comm_rank(const nb_comm_t* c);
int nb_comm_size(const nb_comm_t* c);
/* The device the communicator runs on (CPU or GPU; never AUTO). */
nb_comm_device_t nb_comm_device(const nb_comm_t* c);
/* "mpi" or "nccl". */
const char* nb_comm_backend_name(const nb_comm_t* c);
/* GPU: the cudaStream_t the operations are enqueued on; CPU: NULL. Borrowed. */
void* nb_comm_stream(const nb_comm_t* c);
/* Size in bytes of one element (0 for an unknown dtype). */
size_t nb_comm_dtype_size(nb_comm_dtype_t dt);
const char* nb_comm_dtype_name(nb_comm_dtype_t dt);

/* ---- Collectives -------------------------------------------------------------------------
 * Common rules for every operation below:
 * - Collective: all ranks call the same operation in the same order, with the same count, dtype,
 *   op and root. Before each operation the arguments are checked on every rank and the outcome
 *   is agreed with one small MPI_Allreduce (disable with NB_INTRA_VALIDATE=0): a count mismatch,
 *   a NULL buffer with count > 0, an unknown dtype or op, or a bad root on ANY rank makes EVERY
 *   rank return NB_ERR_INVALID with a message naming the problem and the first rank that had it.
 * - Buffers are host memory on a CPU communicator and device memory on a GPU one; they are
 *   borrowed for the duration of the call (of the request, for the asynchronous forms).
 * - In place: allreduce with send == recv; reduce-scatter with recv == send + rank * recv_count;
 *   allgather with send == recv + rank * send_count (NCCL's conventions). In-place use must be
 *   the same on every rank. After an in-place reduce-scatter on a CPU communicator, the rest of
 *   the send buffer holds scratch values.
 * - fp16/bf16 sums on MPI use a commutative user-defined MPI_Op that adds element pairs in fp32
 *   and rounds to nearest even: every pairwise sum is the correctly rounded IEEE sum, so inputs
 *   whose partial sums are exact give bit-identical results at any rank count. A NaN sum is
 *   the canonical quiet NaN (0x7e00 / 0x7fc0).
 * - On GPU, the blocking forms synchronize the communicator's stream before returning.
 * - A communicator is used by one thread at a time (MPI_THREAD_SERIALIZED).
 * - count is in elements and must fit an int for MPI (NB_ERR_UNSUPPORTED above INT_MAX).
 * Returns NB_OK, NB_ERR_INVALID, NB_ERR_UNSUPPORTED, NB_ERR_MPI, NB_ERR_NCCL, NB_ERR_CUDA. */

/* recv[i] = op over ranks of send[i], i < count. */
nb_status_t nb_comm_allreduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                              nb_comm_dtype_t dt, nb_comm_op_t op);
/* recv (recv_count elements) = op over ranks of send[rank*recv_count ...], send holding
 * size*recv_count elements. */
nb_status_t nb_comm_reduce_scatter(nb_comm_t* c, const void* send, void* recv, size_t recv_count,
                                   nb_comm_dtype_t dt, nb_comm_op_t op);
/* recv[r*send_count ...] = send of rank r; recv holds size*send_count elements. */
nb_status_t nb_comm_allgather(nb_comm_t* c, const void* send, void* recv, size_t send_count,
                              nb_comm_dtype_t dt);
/* recv = root's send on every rank. send is read on root only; send == recv is in place. */
nb_status_t nb_comm_broadcast(nb_comm_t* c, const void* send, void* recv, size_t count,
                              nb_comm_dtype_t dt, int root);
/* Root's recv = op over ranks of send; recv is not touched on other ranks. send == recv on the
 * root is in place. */
nb_status_t nb_comm_reduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                           nb_comm_dtype_t dt, nb_comm_op_t op, int root);
/* ---- Point to point (pipeline parallelism: activations forward, their gradients back) ------
 * Not collective: the two ranks of each transfer call it, with the same count and dtype. One
 * call sends send_count elements to rank dest and receives recv_count from rank source at once
 * (MPI_Sendrecv: two neighbours that both send do not deadlock); dest or source -1 leaves that
 * side out. Blocking. CPU communicators only for now (NB_ERR_UNSUPPORTED on a GPU one).
 * NB_ERR_INVALID (a rank out of range or this rank, a NULL buffer with a count), NB_ERR_MPI. */
nb_status_t nb_comm_sendrecv(nb_comm_t* c, const void* send, size_t send_count, int dest,
                             void* recv, size_t recv_count, int source, nb_comm_dtype_t dt);
nb_status_t nb_comm_send(nb_comm_t* c, const void* send, size_t count, int dest,
                         nb_comm_dtype_t dt);
nb_status_t nb_comm_recv(nb_comm_t* c, void* recv, size_t count, int source, nb_comm_dtype_t dt);

/* Returns when every rank has entered it (GPU: after the stream has drained). */
nb_status_t nb_comm_barrier(nb_comm_t* c);

/* ---- Asynchronous forms ------------------------------------------------------------------
 * Same arguments and checks as the blocking forms (the check itself is blocking); the
 * operation is started (MPI_I* on CPU, enqueued on the stream on GPU) and *req receives a
 * request that nb_comm_wait completes and frees. Buffers must stay valid and untouched until
 * then. Requests complete in any order but must all be waited for before nb_comm_destroy. */
nb_status_t nb_comm_iallreduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                               nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t** req);
nb_status_t nb_comm_ireduce_scatter(nb_comm_t* c, const void* send, void* recv, size_t recv_count,
                                    nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t** req);
nb_status_t nb_comm_iallgather(nb_comm_t* c, const void* send, void* recv, size_t send_count,
                               nb_comm_dtype_t dt, nb_comm_request_t** req);
nb_status_t nb_comm_ibroadcast(nb_comm_t* c, const void* send, void* recv, size_t count,
                               nb_comm_dtype_t dt, int root, nb_comm_request_t** req);

/* Completes the request (applies the AVG division on MPI) and frees it; NULL is NB_OK. Returns
 * the operation's status. */
nb_status_t nb_comm_wait(nb_comm_request_t* req);
/* Sets *done to 1 if nb_comm_wait would not block now. Does not free the request. */
nb_status_t nb_comm_test(nb_comm_request_t* req, int* done);

/* ---- Hierarchical allreduce --------------------------------------------------------------
 * The allreduce of a cluster that is one of several: reduce inside the cluster, let the caller
 * combine the reduced data with the other clusters (the WAN step), then spread the result
 * inside the cluster. */

typedef enum {
  /* reduce-scatter: rank r owns shard r and runs the callback on it (the WAN step is spread
   * over every rank); then allgather. */
  NB_HIER_SHARDED = 0,
  /* reduce to rank 0, which runs the callback on the whole buffer; then broadcast. */
  NB_HIER_LEADER = 1,
} nb_hier_mode_t;

/* The inter-cluster step. Called with this cluster's reduced values (sum, or average with
 * NB_COMM_AVG) of elements [offset, offset + count) of the buffer, in place at `shard`; it must
 * leave there the values every rank of the cluster should end with (for example the sum over
 * all clusters). `shard` is device memory on a GPU communicator (the stream has been
 * synchronized). count may be 0. Return NB_OK or an error; any rank's error makes every rank's
 * nb_hier_allreduce return it (status of the lowest failing rank). */
typedef nb_status_t (*nb_hier_fn)(void* shard, size_t count, size_t offset, nb_comm_dtype_t dt,
                                  void* user);

/* In place on buf (count elements, same on every rank). Sharded mode: with s = count / size,
 * rank r owns [r*s, (r+1)*s); the last rank also owns the tail [size*s, count) (reduced with a
 * small allreduce), so the callback is called exactly once per rank and the shards tile the
 * buffer. Leader mode: the callback is called once, on rank 0, with offset 0 and count.
 * Returns what the collectives return, NB_ERR_INVALID for bad arguments (agreed as above), or
 * the callback's error. user is passed through (borrowed). */
nb_status_t nb_hier_allreduce(nb_comm_t* c, void* buf, size_t count, nb_comm_dtype_t dt,
                              nb_comm_op_t op, nb_hier_mode_t mode, nb_hier_fn fn, void* user);

/* ---- Helpers for 2-byte floats (host side), used by tests and the CPU reductions ---------- */
/* Round to nearest even; NaN stays NaN, overflow goes to infinity. */
unsigned short nb_comm_f32_to_f16(float f);
float nb_comm_f16_to_f32(unsigned short h);
unsigned short nb_comm_f32_to_bf16(float f);
float nb_comm_bf16_to_f32(unsigned short h);

#ifdef __cplusplus
}
#endif
#endif
