/* The communicator's front: creation and backend choice, the cross-rank argument check that
 * turns a bad argument on one rank into an error on every rank, and the hierarchical
 * allreduce. The collectives themselves are the engines' (mpi_backend.c, nccl_backend.c). */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "intra/half.h"
#include "intra/intra_internal.h"
#include "kernels/device.h"

NB_PARAM_INT(IntraValidate, "NB_INTRA_VALIDATE", 1, 0, 1,
             "check collective arguments across ranks before each operation (0 = off)")

static int nb__intra_started_mpi = 0;

/* ---- MPI plumbing ------------------------------------------------------------------------ */

nb_status_t nb__mpi_error(int rc, const char* what) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
  return nb_error(NB_ERR_MPI, "%s failed: %s", what, text);
}

nb_status_t nb_intra_init(int* argc, char*** argv) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) return nb_error(NB_ERR_MPI, "MPI was already finalized; it cannot restart");
  if (inited) return NB_OK;
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) return nb__mpi_error(rc, "MPI_Init_thread");
  nb__intra_started_mpi = 1;
  if (provided < MPI_THREAD_SERIALIZED)
    NB_WARN(
        "MPI provides thread level %d < MPI_THREAD_SERIALIZED; use communicators from the "
        "main thread only",
        provided);
  return NB_OK;
}

void nb_intra_finalize(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (nb__intra_started_mpi && inited && !finalized) MPI_Finalize();
  nb__intra_started_mpi = 0;
}

nb_status_t nb__comm_agree(nb_comm_t* c, nb_status_t st, const char* what) {
  int mine = st == NB_OK ? c->size : c->rank, first = c->size;
  NB_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->mpi));
  if (first == c->size) return NB_OK;
  struct {
    int st;
    char msg[512];
  } e = {0};
  if (c->rank == first) {
    e.st = (int)st;
    snprintf(e.msg, sizeof e.msg, "%s", nb_error_last());
  }
  NB_MPI_CHECK(MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, c->mpi));
  if (c->rank == first) return st;
  return nb_error((nb_status_t)e.st, "%s failed on rank %d: %s", what, first, e.msg);
}

/* ---- dtypes and 2-byte floats ------------------------------------------------------------ */

size_t nb_comm_dtype_size(nb_comm_dtype_t dt) {
  switch (dt) {
    case NB_COMM_FP32:
      return 4;
    case NB_COMM_FP16:
    case NB_COMM_BF16:
      return 2;
    default:
      return 0;
  }
}

const char* nb_comm_dtype_name(nb_comm_dtype_t dt) {
  switch (dt) {
    case NB_COMM_FP32:
      return "fp32";
    case NB_COMM_FP16:
      return "fp16";
    case NB_COMM_BF16:
      return "bf16";
    default:
      return "unknown";
  }
}

unsigned short nb_comm_f32_to_f16(float f) {
  return nb__f32_to_f16(f);
}
float nb_comm_f16_to_f32(unsigned short h) {
  return nb__f16_to_f32(h);
}
unsigned short nb_comm_f32_to_bf16(float f) {
  return nb__f32_to_bf16(f);
}
float nb_comm_bf16_to_f32(unsigned short h) {
  return nb__bf16_to_f32(h);
}

void nb__comm_post_apply(const nb__comm_post_t* p) {
  if (p->move_bytes && p->move_dst != p->move_src) memmove(p->move_dst, p->move_src, p->move_bytes);
  if (p->divisor <= 1 || !p->scale_count) return;
  const float d = (float)p->divisor;
  if (p->dt == NB_COMM_FP32) {
    float* x = p->scale_buf;
    for (size_t i = 0; i < p->scale_count; i++) x[i] /= d;
  } else if (p->dt == NB_COMM_FP16) {
    unsigned short* x = p->scale_buf;
    for (size_t i = 0; i < p->scale_count; i++) x[i] = nb__f32_to_f16(nb__f16_to_f32(x[i]) / d);
  } else if (p->dt == NB_COMM_BF16) {
    unsigned short* x = p->scale_buf;
    for (size_t i = 0; i < p->scale_count; i++) x[i] = nb__f32_to_bf16(nb__bf16_to_f32(x[i]) / d);
  }
}

int nb_intra_launch_size(void) {
  const char* ws = getenv("OMPI_COMM_WORLD_SIZE");
  if (!ws) ws = getenv("PMI_SIZE");
  long n = ws ? strtol(ws, NULL, 10) : 1; /* like atoi: leading digits count */
  return n > 1 && n <= INT_MAX ? (int)n : 1;
}

void nb_comm_abort(nb_comm_t* c, int code) {
  (void)c; /* every rank of the launch waits: take them all down, not only c's group */
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) exit(code);
  MPI_Abort(MPI_COMM_WORLD, code);
  exit(code); /* MPI_Abort does not return; this keeps the promise if an MPI does */
}

/* ---- creation ------------------------------------------------------------------------------ */

void nb_comm_config_init(nb_comm_config_t* cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->device = NB_COMM_DEVICE_AUTO;
  cfg->mpi_comm = NULL;
  cfg->gpu = -1;
  cfg->stream = NULL;
}

static int nb__gpu_usable(void) {
#ifdef NB_HAVE_NCCL
  return nb_device_count() > 0;
#else
  return 0;
#endif
}

nb_status_t nb_comm_split(nb_comm_t* c, int color, int key, nb_comm_t** out) {
  if (!c || !out || color < 0)
    return nb_error(NB_ERR_INVALID, "nb_comm_split: %s",
                    !c     ? "NULL communicator"
                    : !out ? "out is NULL"
                           : "color must be >= 0");
  *out = NULL;
  MPI_Comm sub = MPI_COMM_NULL;
  int rc = MPI_Comm_split(c->mpi, color, key, &sub);
  if (rc != MPI_SUCCESS) return nb__mpi_error(rc, "MPI_Comm_split");
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.device = c->device;
  cfg.mpi_comm = &sub;
  nb_status_t st = nb_comm_create(&cfg, out); /* duplicates sub */
  MPI_Comm_free(&sub);
  return st;
}

nb_status_t nb_comm_create(const nb_comm_config_t* cfg_in, nb_comm_t** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "nb_comm_create: out is NULL");
  *out = NULL;
  nb_comm_config_t cfg;
  if (cfg_in)
    cfg = *cfg_in;
  else
    nb_comm_config_init(&cfg);
  NB_CHECK(nb_intra_init(NULL, NULL));

  nb_status_t st = NB_OK;
  nb_comm_t* c = NULL;
  NB_CHECK(NB_CALLOC(c, 1, "communicator"));
  c->mpi = MPI_COMM_NULL;
  c->op_sum_f16 = c->op_sum_bf16 = MPI_OP_NULL;
  c->validate = (int)nb_param_IntraValidate();

  MPI_Comm parent = cfg.mpi_comm ? *(const MPI_Comm*)cfg.mpi_comm : MPI_COMM_NULL;
  if (parent == MPI_COMM_NULL) parent = MPI_COMM_WORLD;
  int rc = MPI_Comm_dup(parent, &c->mpi);
  if (rc != MPI_SUCCESS) {
    st = nb__mpi_error(rc, "MPI_Comm_dup");
    goto fail;
  }
  /* Errors come back as codes, so a failing collective is a status, not an abort. */
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  {
    MPI_Comm node = MPI_COMM_NULL;
    rc = MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) {
      st = nb__mpi_error(rc, "MPI_Comm_split_type");
      goto fail;
    }
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_free(&node);
  }

  /* Device choice, agreed: AUTO takes the GPU only if every rank can. */
  if (cfg.device != NB_COMM_DEVICE_AUTO && cfg.device != NB_COMM_DEVICE_CPU &&
      cfg.device != NB_COMM_DEVICE_GPU)
    st = nb_error(NB_ERR_INVALID, "nb_comm_create: unknown device %d", (int)cfg.device);
  int gpu_ok = nb__gpu_usable(), all_gpu = 0;
  int mine[3] = {gpu_ok, (int)cfg.device, -(int)cfg.device}, agreed[3];
  rc = MPI_Allreduce(mine, agreed, 3, MPI_INT, MPI_MIN, c->mpi);
  if (rc != MPI_SUCCESS) {
    st = nb__mpi_error(rc, "MPI_Allreduce(device)");
    goto fail;
  }
  all_gpu = agreed[0];
  if (st == NB_OK && agreed[1] != -agreed[2])
    st = nb_error(NB_ERR_INVALID, "nb_comm_create: ranks asked for different devices (%d and %d)",
                  agreed[1], -agreed[2]);
  if (cfg.device == NB_COMM_DEVICE_AUTO)
    cfg.device = all_gpu ? NB_COMM_DEVICE_GPU : NB_COMM_DEVICE_CPU;
  if (st == NB_OK && cfg.device == NB_COMM_DEVICE_GPU && !gpu_ok) {
#ifdef NB_HAVE_NCCL
    st = nb_error(NB_ERR_UNSUPPORTED, "device gpu asked for, but this rank sees no CUDA device");
#else
    st = nb_error(NB_ERR_UNSUPPORTED, "device gpu asked for, but this build has no NCCL");
#endif
  }
  NB_CHECK_GOTO(nb__comm_agree(c, st, "nb_comm_create"), st, fail);
  c->device = cfg.device;
#ifdef NB_HAVE_NCCL
  c->be = c->device == NB_COMM_DEVICE_GPU ? &nb__comm_nccl_backend : &nb__comm_mpi_backend;
#else
  c->be = &nb__comm_mpi_backend;
#endif
  NB_CHECK_GOTO(c->be->init(c, &cfg), st, fail);
  NB_INFO(INTRA, "communicator: rank %d of %d (node-local %d), device %s, backend %s", c->rank,
          c->size, c->local_rank, c->device == NB_COMM_DEVICE_GPU ? "gpu" : "cpu", c->be->name);
  *out = c;
  return NB_OK;
fail:
  if (c->be) c->be->fini(c);
  if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
  nb_free(c);
  return st;
}

void nb_comm_destroy(nb_comm_t* c) {
  if (!c) return;
  if (c->be) c->be->fini(c);
  if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
  nb_free(c);
}

int nb_comm_rank(const nb_comm_t* c) {
  return c->rank;
}
int nb_comm_size(const nb_comm_t* c) {
  return c->size;
}
nb_comm_device_t nb_comm_device(const nb_comm_t* c) {
  return c->device;
}
const char* nb_comm_backend_name(const nb_comm_t* c) {
  return c->be->name;
}
void* nb_comm_stream(const nb_comm_t* c) {
  return c->device == NB_COMM_DEVICE_GPU ? c->stream : NULL;
}

/* ---- the cross-rank argument check --------------------------------------------------------- */

typedef enum {
  NB__COLL_ALLREDUCE = 1,
  NB__COLL_REDUCE_SCATTER,
  NB__COLL_ALLGATHER,
  NB__COLL_BROADCAST,
  NB__COLL_REDUCE,
  NB__COLL_HIER,
} nb__coll_t;

static const char* nb__coll_name(nb__coll_t k) {
  static const char* names[] = {"?",         "allreduce", "reduce-scatter",        "allgather",
                                "broadcast", "reduce",    "hierarchical allreduce"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* Reasons a rank rejects its own arguments; each maps to a message and a status. */
typedef enum {
  NB__BAD_NONE = 0,
  NB__BAD_NULL_SEND,
  NB__BAD_NULL_RECV,
  NB__BAD_DTYPE,
  NB__BAD_OP,
  NB__BAD_ROOT,
  NB__BAD_TOO_BIG,
  NB__BAD_NULL_FN,
  NB__BAD_MODE,
  NB__BAD_OVERLAP,
  NB__BAD_NULL_REQ,
  NB__BAD_NOMEM,
  NB__BAD_COUNT_,
} nb__bad_t;

static const char* nb__bad_text(nb__bad_t b) {
  switch (b) {
    case NB__BAD_NULL_SEND:
      return "NULL send buffer with a non-zero count";
    case NB__BAD_NULL_RECV:
      return "NULL receive buffer with a non-zero count";
    case NB__BAD_DTYPE:
      return "unknown dtype";
    case NB__BAD_OP:
      return "unknown reduction op";
    case NB__BAD_ROOT:
      return "root out of range";
    case NB__BAD_TOO_BIG:
      return "count too large for the engine (MPI counts are int)";
    case NB__BAD_NULL_FN:
      return "NULL inter-cluster callback";
    case NB__BAD_MODE:
      return "unknown hierarchical mode";
    case NB__BAD_OVERLAP:
      return "send and receive buffers overlap without being in place";
    case NB__BAD_NULL_REQ:
      return "NULL request pointer for an asynchronous call";
    case NB__BAD_NOMEM:
      return "out of memory for the request";
    default:
      return "invalid argument";
  }
}

typedef struct {
  nb__coll_t coll;
  const void* send;
  void* recv;
  size_t count;      /* the count argument */
  size_t send_elems; /* elements read from send (for null/overlap checks) */
  size_t recv_elems;
  int need_send, need_recv;
  int dt, op, root; /* op/root: -1 when the collective has none */
  int in_place;     /* -1 when in-place use need not match across ranks */
  int extra_bad;    /* a reason found by the caller (NB__BAD_*) */
} nb__args_t;

/* The arguments in the common case: `count` elements read from send and written to recv on
 * every rank, no root, in place when send is recv. Each collective then sets what differs. */
static nb__args_t nb__args(nb__coll_t coll, const void* send, void* recv, size_t count,
                           nb_comm_dtype_t dt, int op) {
  return (nb__args_t){.coll = coll,
                      .send = send,
                      .recv = recv,
                      .count = count,
                      .send_elems = count,
                      .recv_elems = count,
                      .need_send = 1,
                      .need_recv = 1,
                      .dt = (int)dt,
                      .op = op,
                      .root = -1,
                      .in_place = send == recv};
}

static int nb__overlap(const void* a, size_t an, const void* b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return an && bn && x < y + bn && y < x + an;
}

static nb_status_t nb__bad_status(nb__bad_t b) {
  return b == NB__BAD_TOO_BIG ? NB_ERR_UNSUPPORTED
         : b == NB__BAD_NOMEM ? NB_ERR_NOMEM
                              : NB_ERR_INVALID;
}

static nb__bad_t nb__local_check(const nb_comm_t* c, const nb__args_t* a) {
  if (c->next_bad) return (nb__bad_t)c->next_bad;
  if (a->extra_bad) return (nb__bad_t)a->extra_bad;
  if (a->dt < 0 || a->dt >= NB_COMM_DTYPE_COUNT_) return NB__BAD_DTYPE;
  if (a->op != -1 && (a->op < 0 || a->op >= NB_COMM_OP_COUNT_)) return NB__BAD_OP;
  if (a->root != -1 && (a->root < 0 || a->root >= c->size)) return NB__BAD_ROOT;
  if (a->need_send && a->send_elems && !a->send) return NB__BAD_NULL_SEND;
  if (a->need_recv && a->recv_elems && !a->recv) return NB__BAD_NULL_RECV;
  if (a->count > c->be->max_count) return NB__BAD_TOO_BIG;
  if (a->in_place == 0 && a->need_send && a->need_recv) {
    size_t es = nb_comm_dtype_size((nb_comm_dtype_t)a->dt);
    if (nb__overlap(a->send, a->send_elems * es, a->recv, a->recv_elems * es))
      return NB__BAD_OVERLAP;
  }
  return NB__BAD_NONE;
}

/* Agreement vector, all reduced with MAX: [0] = (size - first bad rank) * 64 + reason, then
 * pairs (x, -x) so that one MAX gives both the largest and the smallest value of x. */
enum { NB__AG_BAD = 0, NB__AG_PAIRS = 1, NB__AG_NPAIRS = 6, NB__AG_LEN = 1 + 2 * NB__AG_NPAIRS };

static nb_status_t nb__validate(nb_comm_t* c, const nb__args_t* a) {
  nb__bad_t bad = nb__local_check(c, a);
  c->next_bad = 0;
  if (!c->validate) {
    if (bad == NB__BAD_NONE) return NB_OK;
    return nb_error(nb__bad_status(bad), "%s: %s", nb__coll_name(a->coll), nb__bad_text(bad));
  }
  int64_t v[NB__AG_LEN], r[NB__AG_LEN];
  v[NB__AG_BAD] = bad ? (int64_t)(c->size - c->rank) * 64 + (int64_t)bad : 0;
  int64_t x[NB__AG_NPAIRS] = {
      (int64_t)a->coll,
      a->count > (size_t)INT64_MAX ? INT64_MAX : (int64_t)a->count,
      a->dt,
      a->op,
      a->root,
      a->in_place,
  };
  for (int i = 0; i < NB__AG_NPAIRS; i++) {
    v[NB__AG_PAIRS + 2 * i] = x[i];
    v[NB__AG_PAIRS + 2 * i + 1] = -x[i];
  }
  NB_MPI_CHECK(MPI_Allreduce(v, r, NB__AG_LEN, MPI_INT64_T, MPI_MAX, c->mpi));
  const char* coll = nb__coll_name(a->coll);
  int64_t mx[NB__AG_NPAIRS], mn[NB__AG_NPAIRS];
  for (int i = 0; i < NB__AG_NPAIRS; i++) {
    mx[i] = r[NB__AG_PAIRS + 2 * i];
    mn[i] = -r[NB__AG_PAIRS + 2 * i + 1];
  }
  if (mx[0] != mn[0])
    return nb_error(NB_ERR_INVALID, "%s: ranks called different collectives (%s and %s)", coll,
                    nb__coll_name((nb__coll_t)mn[0]), nb__coll_name((nb__coll_t)mx[0]));
  if (r[NB__AG_BAD]) {
    int first = c->size - (int)(r[NB__AG_BAD] / 64);
    nb__bad_t why = (nb__bad_t)(r[NB__AG_BAD] % 64);
    return nb_error(nb__bad_status(why), "%s: %s on rank %d; every rank fails this call", coll,
                    nb__bad_text(why), first);
  }
  if (mx[1] != mn[1])
    return nb_error(NB_ERR_INVALID,
                    "%s: count differs across ranks (smallest %lld, largest %lld elements)", coll,
                    (long long)mn[1], (long long)mx[1]);
  if (mx[2] != mn[2])
    return nb_error(NB_ERR_INVALID, "%s: dtype differs across ranks (%s and %s)", coll,
                    nb_comm_dtype_name((nb_comm_dtype_t)mn[2]),
                    nb_comm_dtype_name((nb_comm_dtype_t)mx[2]));
  if (mx[3] != mn[3])
    return nb_error(NB_ERR_INVALID, "%s: reduction op differs across ranks", coll);
  if (mx[4] != mn[4])
    return nb_error(NB_ERR_INVALID, "%s: root (or mode) differs across ranks (%lld and %lld)", coll,
                    (long long)mn[4], (long long)mx[4]);
  if (mx[5] != mn[5])
    return nb_error(NB_ERR_INVALID, "%s: in place on some ranks and not on others", coll);
  return NB_OK;
}

/* ---- collectives ------------------------------------------------------------------------- */

static nb_status_t nb__finish(nb_comm_t* c, nb_comm_request_t* r, nb_comm_request_t** out,
                              nb_status_t st) {
  if (st != NB_OK || !r) {
    nb_free(r);
    return st != NB_OK ? st : nb_error(NB_ERR_INTERNAL, "asynchronous call without a request");
  }
  *out = r;
  return NB_OK;
}

/* A request for an asynchronous call. A NULL `out` or a failed allocation is not returned at
 * once (the other ranks would wait in the collective): it is recorded as this rank's bad
 * argument for the check that follows, which fails the call on every rank. */
static nb_comm_request_t* nb__new_req(nb_comm_t* c, nb_comm_request_t** out) {
  nb_comm_request_t* r = NULL;
  if (!out) {
    c->next_bad = NB__BAD_NULL_REQ;
    return NULL;
  }
  *out = NULL;
  if (nb_calloc((void**)&r, 1, sizeof *r, "collective request") != NB_OK) {
    c->next_bad = NB__BAD_NOMEM;
    return NULL;
  }
  r->c = c;
  r->mreq = MPI_REQUEST_NULL;
  return r;
}

static nb_status_t nb__allreduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                                 nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t* req) {
  nb__args_t a = nb__args(NB__COLL_ALLREDUCE, send, recv, count, dt, (int)op);
  NB_CHECK(nb__validate(c, &a));
  if (!count) return NB_OK;
  return c->be->allreduce(c, send, recv, count, dt, op, req);
}

static nb_status_t nb__reduce_scatter(nb_comm_t* c, const void* send, void* recv, size_t rc,
                                      nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t* req) {
  size_t es = nb_comm_dtype_size(dt), total = 0;
  int bad = nb_mul_overflow(rc, (size_t)c->size, &total) ? NB__BAD_TOO_BIG : 0;
  int in_place = send && recv && es && (const char*)recv == (const char*)send + es * rc * c->rank;
  nb__args_t a = nb__args(NB__COLL_REDUCE_SCATTER, send, recv, rc, dt, (int)op);
  a.send_elems = total; /* every rank's block */
  a.in_place = in_place;
  a.extra_bad = bad;
  NB_CHECK(nb__validate(c, &a));
  if (!rc) return NB_OK;
  return c->be->reduce_scatter(c, send, recv, rc, dt, op, req);
}

static nb_status_t nb__allgather(nb_comm_t* c, const void* send, void* recv, size_t sc,
                                 nb_comm_dtype_t dt, nb_comm_request_t* req) {
  size_t es = nb_comm_dtype_size(dt), total = 0;
  int bad = nb_mul_overflow(sc, (size_t)c->size, &total) ? NB__BAD_TOO_BIG : 0;
  int in_place = send && recv && es && (const char*)send == (const char*)recv + es * sc * c->rank;
  nb__args_t a = nb__args(NB__COLL_ALLGATHER, send, recv, sc, dt, -1);
  a.recv_elems = total; /* every rank's block */
  a.in_place = in_place;
  a.extra_bad = bad;
  NB_CHECK(nb__validate(c, &a));
  if (!sc) return NB_OK;
  return c->be->allgather(c, send, recv, sc, dt, req);
}

static nb_status_t nb__broadcast(nb_comm_t* c, const void* send, void* recv, size_t count,
                                 nb_comm_dtype_t dt, int root, nb_comm_request_t* req) {
  int is_root = root == c->rank;
  size_t es = nb_comm_dtype_size(dt);
  /* in-place use may differ between the root and the others: not agreed on. */
  nb__args_t b = nb__args(NB__COLL_BROADCAST, send, recv, count, dt, -1);
  b.need_send = is_root;
  b.root = root;
  b.in_place = -1;
  if (is_root && send != recv && es && nb__overlap(send, count * es, recv, count * es))
    b.extra_bad = NB__BAD_OVERLAP;
  NB_CHECK(nb__validate(c, &b));
  if (!count) return NB_OK;
  return c->be->broadcast(c, send, recv, count, dt, root, req);
}

nb_status_t nb_comm_allreduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                              nb_comm_dtype_t dt, nb_comm_op_t op) {
  if (!c) return nb_error(NB_ERR_INVALID, "allreduce: communicator is NULL");
  return nb__allreduce(c, send, recv, count, dt, op, NULL);
}

nb_status_t nb_comm_reduce_scatter(nb_comm_t* c, const void* send, void* recv, size_t recv_count,
                                   nb_comm_dtype_t dt, nb_comm_op_t op) {
  if (!c) return nb_error(NB_ERR_INVALID, "reduce-scatter: communicator is NULL");
  return nb__reduce_scatter(c, send, recv, recv_count, dt, op, NULL);
}

nb_status_t nb_comm_allgather(nb_comm_t* c, const void* send, void* recv, size_t send_count,
                              nb_comm_dtype_t dt) {
  if (!c) return nb_error(NB_ERR_INVALID, "allgather: communicator is NULL");
  return nb__allgather(c, send, recv, send_count, dt, NULL);
}

nb_status_t nb_comm_broadcast(nb_comm_t* c, const void* send, void* recv, size_t count,
                              nb_comm_dtype_t dt, int root) {
  if (!c) return nb_error(NB_ERR_INVALID, "broadcast: communicator is NULL");
  return nb__broadcast(c, send, recv, count, dt, root, NULL);
}

nb_status_t nb_comm_reduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                           nb_comm_dtype_t dt, nb_comm_op_t op, int root) {
  if (!c) return nb_error(NB_ERR_INVALID, "reduce: communicator is NULL");
  int is_root = root == c->rank;
  nb__args_t a = nb__args(NB__COLL_REDUCE, send, recv, count, dt, (int)op);
  a.need_recv = is_root;
  a.root = root;
  a.in_place = -1;
  if (is_root && send != recv) a.in_place = 0; /* overlap check on the root */
  nb__args_t b = a;
  if (b.in_place == 0) {
    b.in_place = -1;
    size_t es = nb_comm_dtype_size(dt);
    if (es && nb__overlap(send, count * es, recv, count * es)) b.extra_bad = NB__BAD_OVERLAP;
  }
  NB_CHECK(nb__validate(c, &b));
  if (!count) return NB_OK;
  return c->be->reduce(c, send, recv, count, dt, op, root);
}

nb_status_t nb_comm_sendrecv(nb_comm_t* c, const void* send, size_t send_count, int dest,
                             void* recv, size_t recv_count, int source, nb_comm_dtype_t dt) {
  if (!c) return nb_error(NB_ERR_INVALID, "sendrecv: communicator is NULL");
  if (c->device != NB_COMM_DEVICE_CPU)
    return nb_error(NB_ERR_UNSUPPORTED, "sendrecv: point to point runs on CPU communicators only");
  size_t es = nb_comm_dtype_size(dt);
  if (es == 0) return nb_error(NB_ERR_INVALID, "sendrecv: unknown dtype %d", (int)dt);
  if (dest < -1 || dest >= c->size || dest == c->rank || source < -1 || source >= c->size ||
      source == c->rank)
    return nb_error(NB_ERR_INVALID, "sendrecv: rank %d: peers %d and %d must be other ranks of %d",
                    c->rank, dest, source, c->size);
  if ((dest >= 0 && send_count && !send) || (source >= 0 && recv_count && !recv))
    return nb_error(NB_ERR_INVALID, "sendrecv: NULL buffer");
  if (send_count * es > INT_MAX || recv_count * es > INT_MAX)
    return nb_error(NB_ERR_UNSUPPORTED, "sendrecv: more than INT_MAX bytes");
  int rc = MPI_Sendrecv(send, dest >= 0 ? (int)(send_count * es) : 0, MPI_BYTE,
                        dest >= 0 ? dest : MPI_PROC_NULL, 0x6e62, recv,
                        source >= 0 ? (int)(recv_count * es) : 0, MPI_BYTE,
                        source >= 0 ? source : MPI_PROC_NULL, 0x6e62, c->mpi, MPI_STATUS_IGNORE);
  return rc == MPI_SUCCESS ? NB_OK : nb__mpi_error(rc, "MPI_Sendrecv");
}

nb_status_t nb_comm_send(nb_comm_t* c, const void* send, size_t count, int dest,
                         nb_comm_dtype_t dt) {
  return nb_comm_sendrecv(c, send, count, dest, NULL, 0, -1, dt);
}

nb_status_t nb_comm_recv(nb_comm_t* c, void* recv, size_t count, int source, nb_comm_dtype_t dt) {
  return nb_comm_sendrecv(c, NULL, 0, -1, recv, count, source, dt);
}

nb_status_t nb_comm_barrier(nb_comm_t* c) {
  if (!c) return nb_error(NB_ERR_INVALID, "barrier: communicator is NULL");
  return c->be->barrier(c);
}

nb_status_t nb_comm_iallreduce(nb_comm_t* c, const void* send, void* recv, size_t count,
                               nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t** req) {
  if (!c) return nb_error(NB_ERR_INVALID, "allreduce: communicator is NULL");
  nb_comm_request_t* r = nb__new_req(c, req);
  return nb__finish(c, r, req, nb__allreduce(c, send, recv, count, dt, op, r));
}

nb_status_t nb_comm_ireduce_scatter(nb_comm_t* c, const void* send, void* recv, size_t recv_count,
                                    nb_comm_dtype_t dt, nb_comm_op_t op, nb_comm_request_t** req) {
  if (!c) return nb_error(NB_ERR_INVALID, "reduce-scatter: communicator is NULL");
  nb_comm_request_t* r = nb__new_req(c, req);
  return nb__finish(c, r, req, nb__reduce_scatter(c, send, recv, recv_count, dt, op, r));
}

nb_status_t nb_comm_iallgather(nb_comm_t* c, const void* send, void* recv, size_t send_count,
                               nb_comm_dtype_t dt, nb_comm_request_t** req) {
  if (!c) return nb_error(NB_ERR_INVALID, "allgather: communicator is NULL");
  nb_comm_request_t* r = nb__new_req(c, req);
  return nb__finish(c, r, req, nb__allgather(c, send, recv, send_count, dt, r));
}

nb_status_t nb_comm_ibroadcast(nb_comm_t* c, const void* send, void* recv, size_t count,
                               nb_comm_dtype_t dt, int root, nb_comm_request_t** req) {
  if (!c) return nb_error(NB_ERR_INVALID, "broadcast: communicator is NULL");
  nb_comm_request_t* r = nb__new_req(c, req);
  return nb__finish(c, r, req, nb__broadcast(c, send, recv, count, dt, root, r));
}

nb_status_t nb_comm_wait(nb_comm_request_t* req) {
  if (!req) return NB_OK;
  nb_status_t st = req->c->be->wait(req);
  nb_free(req);
  return st;
}

nb_status_t nb_comm_test(nb_comm_request_t* req, int* done) {
  if (!done) return nb_error(NB_ERR_INVALID, "nb_comm_test: done is NULL");
  if (!req) {
    *done = 1;
    return NB_OK;
  }
  return req->c->be->test(req, done);
}

/* ---- hierarchical allreduce ---------------------------------------------------------------- */

nb_status_t nb_hier_allreduce(nb_comm_t* c, void* buf, size_t count, nb_comm_dtype_t dt,
                              nb_comm_op_t op, nb_hier_mode_t mode, nb_hier_fn fn, void* user) {
  if (!c) return nb_error(NB_ERR_INVALID, "hierarchical allreduce: communicator is NULL");
  int bad = !fn                                                   ? NB__BAD_NULL_FN
            : (mode != NB_HIER_SHARDED && mode != NB_HIER_LEADER) ? NB__BAD_MODE
                                                                  : 0;
  nb__args_t a = nb__args(NB__COLL_HIER, buf, buf, count, dt, (int)op); /* in place */
  a.root = (int)mode;
  a.extra_bad = bad;
  /* root carries the mode so that ranks disagreeing on it fail; it is in range by then. */
  if (!bad && (int)mode >= c->size) a.root = -1;
  {
    int saved = c->validate;
    c->validate = 1; /* the mode and callback checks always run across ranks */
    nb_status_t st = nb__validate(c, &a);
    c->validate = saved;
    NB_CHECK(st);
  }
  const size_t es = nb_comm_dtype_size(dt);
  nb_status_t cb = NB_OK;

  if (mode == NB_HIER_LEADER) {
    if (count) NB_CHECK(c->be->reduce(c, buf, buf, count, dt, op, 0));
    if (c->rank == 0) {
      NB_CHECK(c->be->sync(c));
      cb = fn(buf, count, 0, dt, user);
    }
    NB_CHECK(nb__comm_agree(c, cb, "inter-cluster step"));
    if (count) NB_CHECK(c->be->broadcast(c, buf, buf, count, dt, 0, NULL));
    return NB_OK;
  }

  const size_t n = (size_t)c->size, s = count / n, tail = count - s * n;
  char* base = buf;
  if (s) NB_CHECK(c->be->reduce_scatter(c, buf, base + es * s * c->rank, s, dt, op, NULL));
  if (tail) NB_CHECK(c->be->allreduce(c, base + es * s * n, base + es * s * n, tail, dt, op, NULL));
  NB_CHECK(c->be->sync(c));
  size_t off = s * (size_t)c->rank, mine = s + (c->rank == c->size - 1 ? tail : 0);
  cb = fn(base + es * off, mine, off, dt, user);
  NB_CHECK(nb__comm_agree(c, cb, "inter-cluster step"));
  if (s) NB_CHECK(c->be->allgather(c, base + es * off, buf, s, dt, NULL));
  if (tail)
    NB_CHECK(
        c->be->broadcast(c, base + es * s * n, base + es * s * n, tail, dt, c->size - 1, NULL));
  return NB_OK;
}
