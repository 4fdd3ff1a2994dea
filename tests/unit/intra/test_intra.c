/* Tests of intra/: every collective for fp32/fp16/bf16 in place and out of place, the async
 * forms, the hierarchical allreduce with a simulated second cluster, and bad arguments that must
 * fail on every rank. Runs under mpirun (argv[1] = cpu or gpu); it is not a benchmark. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "intra/half.h" /* internal: the element-pair sums behind the MPI ops */
#include "intra/intra.h"
#include "kernels/device.h"

#ifdef NB_HAVE_NCCL
#include <cuda_runtime.h>
#endif

static nb_comm_t* g_comm;
static int g_gpu, g_rank, g_size;
static const nb_comm_dtype_t kDtypes[] = {NB_COMM_FP32, NB_COMM_FP16, NB_COMM_BF16};

/* ---- helpers -------------------------------------------------------------------------------- */

/* Every rank learns whether every rank passed, so a failure fails the test on all ranks at the
 * same point (no rank runs ahead into a collective the others never enter). */
static void agree(int ok, const char* what) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) fail_msg("%s failed on some rank (this rank: %s)", what, ok ? "ok" : "FAILED");
}

/* Inputs whose sums are exact in every dtype at any rank count: small integers times a power of
 * two chosen per element. */
static double val(int r, size_t i) {
  return (double)((int)((i * 3 + (size_t)r * 5) % 17) - 8) * ldexp(1.0, (int)(i % 5) - 2);
}

static uint32_t enc(nb_comm_dtype_t dt, double x) {
  float f = (float)x;
  uint32_t u;
  switch (dt) {
    case NB_COMM_FP16:
      return nb_comm_f32_to_f16(f);
    case NB_COMM_BF16:
      return nb_comm_f32_to_bf16(f);
    default:
      memcpy(&u, &f, 4);
      return u;
  }
}

static uint32_t get_bits(const void* buf, nb_comm_dtype_t dt, size_t i) {
  if (dt == NB_COMM_FP32) {
    uint32_t u;
    memcpy(&u, (const char*)buf + 4 * i, 4);
    return u;
  }
  return ((const uint16_t*)buf)[i];
}

static void put(void* buf, nb_comm_dtype_t dt, size_t i, double x) {
  uint32_t u = enc(dt, x);
  if (dt == NB_COMM_FP32)
    memcpy((char*)buf + 4 * i, &u, 4);
  else
    ((uint16_t*)buf)[i] = (uint16_t)u;
}

static double get(const void* buf, nb_comm_dtype_t dt, size_t i) {
  uint32_t u = get_bits(buf, dt, i);
  float f;
  switch (dt) {
    case NB_COMM_FP16:
      return nb_comm_f16_to_f32((uint16_t)u);
    case NB_COMM_BF16:
      return nb_comm_bf16_to_f32((uint16_t)u);
    default:
      memcpy(&f, &u, 4);
      return f;
  }
}

/* Host mirror + the buffer the communicator sees (the same pointer on CPU). */
typedef struct {
  void* h;
  void* d;
  size_t bytes;
} tbuf_t;

static void tb_alloc(tbuf_t* b, size_t bytes) {
  b->bytes = bytes;
  b->h = calloc(1, bytes ? bytes : 1);
  assert_non_null(b->h);
  b->d = b->h;
#ifdef NB_HAVE_NCCL
  if (g_gpu) {
    assert_int_equal(cudaMalloc(&b->d, bytes ? bytes : 1), cudaSuccess);
    assert_int_equal(cudaMemset(b->d, 0, bytes ? bytes : 1), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  }
#endif
}

static void tb_push(tbuf_t* b) {
#ifdef NB_HAVE_NCCL
  if (g_gpu) { /* from pageable memory the copy may still be in flight when cudaMemcpy returns */
    assert_int_equal(cudaMemcpy(b->d, b->h, b->bytes, cudaMemcpyHostToDevice), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  }
#endif
}

static void tb_pull(tbuf_t* b) {
#ifdef NB_HAVE_NCCL
  if (g_gpu) assert_int_equal(cudaMemcpy(b->h, b->d, b->bytes, cudaMemcpyDeviceToHost), 0);
#endif
}

static void tb_free(tbuf_t* b) {
#ifdef NB_HAVE_NCCL
  if (g_gpu) cudaFree(b->d);
#endif
  free(b->h);
}

/* Compares n elements of got (host) against expect(i); prints the first mismatch. */
static int check(const char* what, nb_comm_dtype_t dt, const void* got, size_t n,
                 double (*expect)(size_t i, void* ctx), void* ctx) {
  for (size_t i = 0; i < n; i++) {
    double e = expect(i, ctx);
    if (get_bits(got, dt, i) != enc(dt, e)) {
      fprintf(stderr, "rank %d: %s %s: element %zu is %g (bits %#x), expected %g (bits %#x)\n",
              g_rank, what, nb_comm_dtype_name(dt), i, get(got, dt, i), get_bits(got, dt, i), e,
              enc(dt, e));
      return 0;
    }
  }
  return 1;
}

typedef struct {
  size_t base; /* element offset into the per-rank pattern */
  int divide;  /* AVG: divide by the size */
  int rank;    /* for patterns of a single rank */
} ectx_t;

static double e_sum(size_t i, void* p) {
  const ectx_t* x = p;
  double s = 0;
  for (int r = 0; r < g_size; r++) s += val(r, x->base + i);
  return x->divide ? s / g_size : s;
}

static double e_rank(size_t i, void* p) {
  const ectx_t* x = p;
  return val(x->rank, x->base + i);
}

static double e_gather(size_t i, void* p) {
  size_t sc = *(const size_t*)p;
  return val((int)(i / sc), i % sc);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_half_conversions(void** state) {
  (void)state;
  /* Exact values, ties to even, overflow, subnormals, NaN. */
  assert_int_equal(nb_comm_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(nb_comm_f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(nb_comm_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(nb_comm_f32_to_f16(65520.0f), 0x7c00);            /* rounds up to Inf */
  assert_int_equal(nb_comm_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie → even (down) */
  assert_int_equal(nb_comm_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie → even (up) */
  assert_int_equal(nb_comm_f32_to_f16(0x1p-24f), 0x0001);            /* smallest subnormal */
  assert_int_equal(nb_comm_f32_to_f16(0x1p-26f), 0x0000);            /* below half of it */
  assert_int_equal(nb_comm_f32_to_f16(INFINITY), 0x7c00);
  assert_true((nb_comm_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (nb_comm_f32_to_f16(NAN) & 0x3ff));
  assert_true(nb_comm_f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(nb_comm_f16_to_f32(0x7bff) == 65504.0f);
  assert_true(isnan(nb_comm_f16_to_f32(0x7e00)));
  for (uint32_t h = 0; h < 0x10000; h++) { /* every finite half survives a round trip */
    if ((h & 0x7c00) == 0x7c00) continue;
    assert_int_equal(nb_comm_f32_to_f16(nb_comm_f16_to_f32((uint16_t)h)), h);
  }
  assert_int_equal(nb_comm_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(nb_comm_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie → even */
  assert_int_equal(nb_comm_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie → even */
  assert_true(isnan(nb_comm_bf16_to_f32(nb_comm_f32_to_bf16(NAN))));
  assert_true(nb_comm_bf16_to_f32(0xc040) == -3.0f);
}

/* The F16C / AVX2 sums give the same bits as the portable ones: every 2-byte value against a
 * set of partners (zeros, subnormals, the largest finite, infinities, NaNs, random values). */
static void test_half_sums(void** state) {
  (void)state;
  uint16_t partners[96] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff,
                           0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x3c00, 0xbc00, 0x7f80, 0xff80,
                           0x7fc0, 0x7f81, 0x0080, 0x007f, 0x7f7f, 0xff7f, 0x3f80, 0x3f81};
  uint32_t x = 12345;
  for (int i = 24; i < 96; i++) {
    x = x * 1664525u + 1013904223u;
    partners[i] = (uint16_t)(x >> 16);
  }
  const size_t n = 65536;
  uint16_t* a = malloc(n * 2);
  uint16_t* hw = malloc(n * 2);
  uint16_t* sw = malloc(n * 2);
  assert_non_null(a);
  assert_non_null(hw);
  assert_non_null(sw);
  for (size_t i = 0; i < n; i++) a[i] = (uint16_t)i;
  for (int dt = 0; dt < 2; dt++) {
    for (int p = 0; p < 96; p++) {
      for (size_t i = 0; i < n; i++) hw[i] = sw[i] = partners[p];
      if (dt == 0) {
        nb__sum_f16(a, hw, n, 1);
        nb__sum_f16(a, sw, n, 0);
      } else {
        nb__sum_bf16(a, hw, n, 1);
        nb__sum_bf16(a, sw, n, 0);
      }
      for (size_t i = 0; i < n; i++)
        if (hw[i] != sw[i])
          fail_msg("%s %#zx + %#x: vector path %#x, portable %#x", dt ? "bf16" : "fp16", i,
                   partners[p], hw[i], sw[i]);
    }
  }
  /* and the portable fp16 sum is the IEEE sum: exact cases and a rounding tie */
  uint16_t one = 0x3c00, tiny = 0x1000; /* 1.0 and 2^-11: 1 + 2^-11 ties to 1.0 */
  nb__sum_f16(&tiny, &one, 1, 0);
  assert_int_equal(one, 0x3c00);
  free(a);
  free(hw);
  free(sw);
}

static void test_create(void** state) {
  (void)state;
  int wr, ws;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  assert_int_equal(nb_comm_rank(g_comm), wr);
  assert_int_equal(nb_comm_size(g_comm), ws);
  assert_string_equal(nb_comm_backend_name(g_comm), g_gpu ? "nccl" : "mpi");
  assert_int_equal(nb_comm_device(g_comm), g_gpu ? NB_COMM_DEVICE_GPU : NB_COMM_DEVICE_CPU);
  assert_true(g_gpu ? nb_comm_stream(g_comm) != NULL : nb_comm_stream(g_comm) == NULL);
  assert_int_equal(nb_comm_barrier(g_comm), NB_OK);
  /* A second communicator over a sub-communicator (the even ranks, and the odd ones). */
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, wr % 2, wr, &half);
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.mpi_comm = &half;
  cfg.device = g_gpu ? NB_COMM_DEVICE_GPU : NB_COMM_DEVICE_CPU;
  nb_comm_t* sub = NULL;
  int ok = 0;
  if (!g_gpu) { /* NCCL would need one device per rank of each half as well */
    ok = nb_comm_create(&cfg, &sub) == NB_OK && nb_comm_size(sub) == (ws + 1 - wr % 2) / 2 &&
         nb_comm_rank(sub) == wr / 2;
    float x = 1.0f;
    ok = ok && nb_comm_allreduce(sub, &x, &x, 1, NB_COMM_FP32, NB_COMM_SUM) == NB_OK &&
         x == (float)nb_comm_size(sub);
    nb_comm_destroy(sub);
  } else {
    ok = 1;
  }
  MPI_Comm_free(&half);
  agree(ok, "communicator over a split MPI communicator");

  /* AUTO follows the machine: GPU only where NCCL is built and every rank sees a device. */
  nb_comm_t* autoc = NULL;
  ok = nb_comm_create(NULL, &autoc) == NB_OK;
  if (ok) {
    int expect_gpu = 0;
#ifdef NB_HAVE_NCCL
    expect_gpu = nb_device_count() > 0;
#endif
    int any_cpu = !expect_gpu, all_gpu = 0;
    MPI_Allreduce(&any_cpu, &all_gpu, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    all_gpu = !all_gpu;
    ok = nb_comm_device(autoc) == (all_gpu ? NB_COMM_DEVICE_GPU : NB_COMM_DEVICE_CPU) &&
         strcmp(nb_comm_backend_name(autoc), all_gpu ? "nccl" : "mpi") == 0;
  }
  nb_comm_destroy(autoc);
  agree(ok, "AUTO device choice");
}

static void test_allreduce(void** state) {
  (void)state;
  const size_t n = 1013;
  for (size_t d = 0; d < 3; d++) {
    nb_comm_dtype_t dt = kDtypes[d];
    size_t es = nb_comm_dtype_size(dt);
    for (int op = 0; op < 2; op++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        tbuf_t s, r;
        tb_alloc(&s, n * es);
        tb_alloc(&r, n * es);
        for (size_t i = 0; i < n; i++) put(s.h, dt, i, val(g_rank, i));
        tb_push(&s);
        void* out = inplace ? s.d : r.d;
        nb_status_t st = nb_comm_allreduce(g_comm, s.d, out, n, dt, (nb_comm_op_t)op);
        tbuf_t* res = inplace ? &s : &r;
        tb_pull(res);
        ectx_t x = {.base = 0, .divide = op == NB_COMM_AVG};
        int ok = st == NB_OK &&
                 check(inplace ? "allreduce in place" : "allreduce", dt, res->h, n, e_sum, &x);
        if (st != NB_OK) fprintf(stderr, "allreduce: %s\n", nb_error_last());
        tb_free(&s);
        tb_free(&r);
        agree(ok, "allreduce");
      }
    }
  }
}

static void test_reduce_scatter(void** state) {
  (void)state;
  const size_t rc = 301;
  for (size_t d = 0; d < 3; d++) {
    nb_comm_dtype_t dt = kDtypes[d];
    size_t es = nb_comm_dtype_size(dt), n = rc * (size_t)g_size;
    for (int op = 0; op < 2; op++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        tbuf_t s, r;
        tb_alloc(&s, n * es);
        tb_alloc(&r, rc * es);
        for (size_t i = 0; i < n; i++) put(s.h, dt, i, val(g_rank, i));
        tb_push(&s);
        char* out = inplace ? (char*)s.d + es * rc * g_rank : r.d;
        nb_status_t st = nb_comm_reduce_scatter(g_comm, s.d, out, rc, dt, (nb_comm_op_t)op);
        tb_pull(inplace ? &s : &r);
        const char* got = inplace ? (char*)s.h + es * rc * g_rank : r.h;
        ectx_t x = {.base = rc * (size_t)g_rank, .divide = op == NB_COMM_AVG};
        int ok = st == NB_OK && check("reduce-scatter", dt, got, rc, e_sum, &x);
        if (st != NB_OK) fprintf(stderr, "reduce-scatter: %s\n", nb_error_last());
        tb_free(&s);
        tb_free(&r);
        agree(ok, "reduce-scatter");
      }
    }
  }
}

static void test_allgather(void** state) {
  (void)state;
  size_t sc = 257;
  for (size_t d = 0; d < 3; d++) {
    nb_comm_dtype_t dt = kDtypes[d];
    size_t es = nb_comm_dtype_size(dt), n = sc * (size_t)g_size;
    for (int inplace = 0; inplace < 2; inplace++) {
      tbuf_t s, r;
      tb_alloc(&s, sc * es);
      tb_alloc(&r, n * es);
      for (size_t i = 0; i < sc; i++) put(s.h, dt, i, val(g_rank, i));
      /* in place: this rank's block already sits at rank * sc of the receive buffer */
      for (size_t i = 0; i < sc; i++) put((char*)r.h + es * sc * g_rank, dt, i, val(g_rank, i));
      tb_push(&s);
      tb_push(&r);
      const void* in = inplace ? (char*)r.d + es * sc * g_rank : s.d;
      nb_status_t st = nb_comm_allgather(g_comm, in, r.d, sc, dt);
      tb_pull(&r);
      int ok = st == NB_OK && check("allgather", dt, r.h, n, e_gather, &sc);
      if (st != NB_OK) fprintf(stderr, "allgather: %s\n", nb_error_last());
      tb_free(&s);
      tb_free(&r);
      agree(ok, "allgather");
    }
  }
}

static void test_broadcast_reduce(void** state) {
  (void)state;
  const size_t n = 555;
  for (size_t d = 0; d < 3; d++) {
    nb_comm_dtype_t dt = kDtypes[d];
    size_t es = nb_comm_dtype_size(dt);
    for (int root = 0; root<g_size; root += g_size> 1 ? g_size - 1 : 1) {
      for (int inplace = 0; inplace < 2; inplace++) {
        tbuf_t s, r;
        tb_alloc(&s, n * es);
        tb_alloc(&r, n * es);
        for (size_t i = 0; i < n; i++) put(s.h, dt, i, val(g_rank, i));
        tb_push(&s);
        nb_status_t st = nb_comm_broadcast(g_comm, s.d, inplace ? s.d : r.d, n, dt, root);
        tbuf_t* res = inplace ? &s : &r;
        tb_pull(res);
        ectx_t x = {.rank = root};
        int ok = st == NB_OK && check("broadcast", dt, res->h, n, e_rank, &x);
        /* reduce to the same root (AVG), in place on the root when inplace */
        for (size_t i = 0; i < n; i++) put(s.h, dt, i, val(g_rank, i));
        memset(r.h, 0, n * es);
        tb_push(&s);
        tb_push(&r);
        st = nb_comm_reduce(g_comm, s.d, inplace ? s.d : r.d, n, dt, NB_COMM_AVG, root);
        tb_pull(res);
        ectx_t y = {.divide = 1};
        if (g_rank == root)
          ok = ok && st == NB_OK && check("reduce", dt, res->h, n, e_sum, &y);
        else
          ok = ok && st == NB_OK;
        tb_free(&s);
        tb_free(&r);
        agree(ok, "broadcast / reduce");
      }
    }
  }
}

static void test_async(void** state) {
  (void)state;
  const size_t n = 4099, rc = 129, sc = 77;
  for (size_t d = 0; d < 3; d++) {
    nb_comm_dtype_t dt = kDtypes[d];
    size_t es = nb_comm_dtype_size(dt);
    tbuf_t a, b, g, bc, rs;
    tb_alloc(&a, n * es);
    tb_alloc(&b, rc * es);
    tb_alloc(&rs, rc * g_size * es);
    tb_alloc(&g, sc * g_size * es);
    tb_alloc(&bc, n * es);
    for (size_t i = 0; i < n; i++) put(a.h, dt, i, val(g_rank, i));
    for (size_t i = 0; i < rc * g_size; i++) put(rs.h, dt, i, val(g_rank, i));
    for (size_t i = 0; i < sc; i++) put((char*)g.h + es * sc * g_rank, dt, i, val(g_rank, i));
    for (size_t i = 0; i < n; i++) put(bc.h, dt, i, val(g_rank, i));
    tb_push(&a);
    tb_push(&rs);
    tb_push(&g);
    tb_push(&bc);
    /* Four operations in flight at once, completed in a different order than started. */
    nb_comm_request_t *r1 = NULL, *r2 = NULL, *r3 = NULL, *r4 = NULL;
    int ok = nb_comm_iallreduce(g_comm, a.d, a.d, n, dt, NB_COMM_AVG, &r1) == NB_OK;
    ok = ok && nb_comm_ireduce_scatter(g_comm, rs.d, b.d, rc, dt, NB_COMM_SUM, &r2) == NB_OK;
    ok = ok && nb_comm_iallgather(g_comm, (char*)g.d + es * sc * g_rank, g.d, sc, dt, &r3) == NB_OK;
    ok = ok && nb_comm_ibroadcast(g_comm, bc.d, bc.d, n, dt, 0, &r4) == NB_OK;
    int done = 0;
    for (int spin = 0; ok && !done && spin < 1000000; spin++) ok = nb_comm_test(r3, &done) == NB_OK;
    ok = ok && done;
    ok = ok && nb_comm_wait(r4) == NB_OK && nb_comm_wait(r2) == NB_OK &&
         nb_comm_wait(r3) == NB_OK && nb_comm_wait(r1) == NB_OK;
    if (!ok) fprintf(stderr, "async: %s\n", nb_error_last());
    tb_pull(&a);
    tb_pull(&b);
    tb_pull(&g);
    tb_pull(&bc);
    ectx_t avg = {.divide = 1}, rsx = {.base = rc * (size_t)g_rank}, b0 = {.rank = 0};
    size_t scv = sc;
    ok = ok && check("iallreduce", dt, a.h, n, e_sum, &avg);
    ok = ok && check("ireduce-scatter", dt, b.h, rc, e_sum, &rsx);
    ok = ok && check("iallgather", dt, g.h, sc * g_size, e_gather, &scv);
    ok = ok && check("ibroadcast", dt, bc.h, n, e_rank, &b0);
    tb_free(&a);
    tb_free(&b);
    tb_free(&g);
    tb_free(&bc);
    tb_free(&rs);
    agree(ok, "asynchronous collectives");
  }
  assert_int_equal(nb_comm_wait(NULL), NB_OK);
}

/* ---- hierarchical allreduce with a simulated second cluster -------------------------------- */

/* The peer cluster has as many ranks as ours, with its own inputs (ranks 100, 101, ...). The
 * callback plays its part of the WAN step: it adds the peer cluster's reduced values to ours,
 * so every element ends as the sum over both clusters. */
typedef struct {
  int calls;
  size_t offset, count;
  int fail_on_rank; /* -1: never fail */
  int avg;          /* AVG: the clusters' averages are averaged (equal cluster sizes) */
} peer_t;

static double peer_sum(size_t i) {
  double s = 0;
  for (int r = 0; r < g_size; r++) s += val(100 + r, i);
  return s;
}

static nb_status_t peer_cluster(void* shard, size_t count, size_t offset, nb_comm_dtype_t dt,
                                void* user) {
  peer_t* p = user;
  p->calls++;
  p->offset = offset;
  p->count = count;
  if (p->fail_on_rank == g_rank)
    return nb_error(NB_ERR_UNAVAILABLE, "simulated peer cluster unreachable");
  size_t es = nb_comm_dtype_size(dt);
  (void)es; /* used only by the GPU path */
  void* h = shard;
#ifdef NB_HAVE_NCCL
  if (g_gpu) {
    h = malloc(count * es + 1);
    cudaMemcpy(h, shard, count * es, cudaMemcpyDeviceToHost);
  }
#endif
  for (size_t i = 0; i < count; i++) {
    double mine = get(h, dt, i), peer = peer_sum(offset + i);
    put(h, dt, i, p->avg ? (mine + peer / g_size) / 2 : mine + peer);
  }
#ifdef NB_HAVE_NCCL
  if (g_gpu) {
    cudaMemcpy(shard, h, count * es, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    free(h);
  }
#endif
  return NB_OK;
}

static double e_two_clusters(size_t i, void* ctx) {
  ectx_t x = {0};
  int avg = *(const int*)ctx;
  return avg ? (e_sum(i, &x) / g_size + peer_sum(i) / g_size) / 2 : e_sum(i, &x) + peer_sum(i);
}

static void test_hier(void** state) {
  (void)state;
  /* 1003 is not a multiple of 2 or 4 (a tail on the last rank); 3 < 4 ranks (empty shards). */
  const size_t counts[] = {1003, 4096, 3};
  for (size_t d = 0; d < 3; d++) {
    nb_comm_dtype_t dt = kDtypes[d];
    size_t es = nb_comm_dtype_size(dt);
    for (int mode = 0; mode < 2; mode++) {
      for (size_t k = 0; k < 6; k++) {
        size_t n = counts[k % 3];
        int avg = k >= 3;
        tbuf_t b;
        tb_alloc(&b, n * es);
        for (size_t i = 0; i < n; i++) put(b.h, dt, i, val(g_rank, i));
        tb_push(&b);
        peer_t p = {.fail_on_rank = -1, .avg = avg};
        nb_status_t st = nb_hier_allreduce(g_comm, b.d, n, dt, avg ? NB_COMM_AVG : NB_COMM_SUM,
                                           (nb_hier_mode_t)mode, peer_cluster, &p);
        tb_pull(&b);
        int ok = st == NB_OK && check("hier allreduce", dt, b.h, n, e_two_clusters, &avg);
        if (st != NB_OK) fprintf(stderr, "hier: %s\n", nb_error_last());
        /* Who ran the callback on what: shards must tile [0, n) once; leader mode: rank 0. */
        long long mine[3] = {p.calls, (long long)p.offset, (long long)p.count};
        long long* all = calloc((size_t)g_size * 3, sizeof *all);
        MPI_Allgather(mine, 3, MPI_LONG_LONG, all, 3, MPI_LONG_LONG, MPI_COMM_WORLD);
        size_t next = 0;
        for (int r = 0; r < g_size; r++) {
          if (mode == NB_HIER_LEADER) {
            ok = ok && all[3 * r] == (r == 0) && (r || (all[1] == 0 && all[2] == (long long)n));
          } else {
            ok = ok && all[3 * r] == 1 && all[3 * r + 1] == (long long)next;
            next += (size_t)all[3 * r + 2];
          }
        }
        if (mode == NB_HIER_SHARDED) ok = ok && next == n;
        free(all);
        tb_free(&b);
        agree(ok, mode ? "hierarchical allreduce (leader)" : "hierarchical allreduce (sharded)");
      }
    }
  }
}

static void test_hier_callback_error(void** state) {
  (void)state;
  const size_t n = 64;
  for (int mode = 0; mode < 2; mode++) {
    tbuf_t b;
    tb_alloc(&b, n * 4);
    tb_push(&b);
    int failing = mode == NB_HIER_LEADER ? 0 : g_size - 1;
    peer_t p = {.fail_on_rank = failing};
    nb_status_t st = nb_hier_allreduce(g_comm, b.d, n, NB_COMM_FP32, NB_COMM_SUM,
                                       (nb_hier_mode_t)mode, peer_cluster, &p);
    char want[64];
    snprintf(want, sizeof want, "rank %d", failing);
    int ok = st == NB_ERR_UNAVAILABLE && strstr(nb_error_last(), "unreachable") &&
             (g_rank == failing || strstr(nb_error_last(), want));
    if (!ok)
      fprintf(stderr, "rank %d: callback error gave %s: %s\n", g_rank, nb_status_name(st),
              nb_error_last());
    tb_free(&b);
    agree(ok, "inter-cluster callback error reaches every rank");
  }
}

/* ---- bad arguments: an error on every rank, and the communicator still works after ------- */

static int still_works(void) {
  tbuf_t b;
  tb_alloc(&b, 8 * 4);
  for (size_t i = 0; i < 8; i++) put(b.h, NB_COMM_FP32, i, val(g_rank, i));
  tb_push(&b);
  nb_status_t st = nb_comm_allreduce(g_comm, b.d, b.d, 8, NB_COMM_FP32, NB_COMM_SUM);
  tb_pull(&b);
  ectx_t x = {0};
  int ok = st == NB_OK && check("allreduce after an error", NB_COMM_FP32, b.h, 8, e_sum, &x);
  tb_free(&b);
  return ok;
}

static int error_is(nb_status_t st, nb_status_t want, const char* needle) {
  int ok = st == want && strstr(nb_error_last(), needle) != NULL;
  if (!ok)
    fprintf(stderr, "rank %d: expected %s containing '%s', got %s: %s\n", g_rank,
            nb_status_name(want), needle, nb_status_name(st), nb_error_last());
  return ok;
}

static void test_bad_arguments(void** state) {
  (void)state;
  const size_t n = 100;
  tbuf_t s, r;
  tb_alloc(&s, 4 * n * (size_t)g_size);
  tb_alloc(&r, 4 * n * (size_t)g_size);
  int last = g_size - 1;

  /* count mismatch: the last rank passes one element more */
  size_t cnt = n + (g_rank == last);
  nb_status_t st = nb_comm_allreduce(g_comm, s.d, r.d, cnt, NB_COMM_FP32, NB_COMM_SUM);
  int ok = error_is(st, NB_ERR_INVALID, "count differs");
  agree(ok, "count mismatch is an error on every rank");
  agree(still_works(), "allreduce after a count mismatch");

  /* NULL buffer on the last rank only */
  st = nb_comm_allreduce(g_comm, g_rank == last ? NULL : s.d, r.d, n, NB_COMM_FP32, NB_COMM_SUM);
  char want[64];
  snprintf(want, sizeof want, "on rank %d", last);
  ok = error_is(st, NB_ERR_INVALID, "NULL send buffer") && strstr(nb_error_last(), want);
  agree(ok, "NULL buffer is an error on every rank");
  agree(still_works(), "allreduce after a NULL buffer");

  /* unknown dtype on rank 0 only, through every collective */
  nb_comm_dtype_t bad = g_rank == 0 ? (nb_comm_dtype_t)7 : NB_COMM_FP32;
  ok = error_is(nb_comm_allreduce(g_comm, s.d, r.d, n, bad, NB_COMM_SUM), NB_ERR_INVALID,
                "unknown dtype");
  ok &= error_is(nb_comm_reduce_scatter(g_comm, s.d, r.d, n, bad, NB_COMM_SUM), NB_ERR_INVALID,
                 "unknown dtype");
  ok &= error_is(nb_comm_allgather(g_comm, s.d, r.d, n, bad), NB_ERR_INVALID, "unknown dtype");
  ok &= error_is(nb_comm_broadcast(g_comm, s.d, r.d, n, bad, 0), NB_ERR_INVALID, "unknown dtype");
  ok &= error_is(nb_comm_reduce(g_comm, s.d, r.d, n, bad, NB_COMM_SUM, 0), NB_ERR_INVALID,
                 "unknown dtype");
  nb_comm_request_t* req = (nb_comm_request_t*)&ok; /* must be reset to NULL */
  ok &= error_is(nb_comm_iallreduce(g_comm, s.d, r.d, n, bad, NB_COMM_SUM, &req), NB_ERR_INVALID,
                 "unknown dtype") &&
        req == NULL;
  ok &= error_is(
      nb_hier_allreduce(g_comm, s.d, n, bad, NB_COMM_SUM, NB_HIER_SHARDED, peer_cluster, NULL),
      NB_ERR_INVALID, "unknown dtype");
  agree(ok, "unknown dtype is an error on every rank");

  /* a NULL request pointer on one rank (an asynchronous call) */
  req = NULL;
  ok = error_is(nb_comm_iallreduce(g_comm, s.d, r.d, n, NB_COMM_FP32, NB_COMM_SUM,
                                   g_rank == last ? NULL : &req),
                NB_ERR_INVALID, "NULL request pointer") &&
       req == NULL;
  agree(ok, "NULL request pointer is an error on every rank");

  /* unknown op, bad root, root mismatch, NULL callback, in-place use that differs */
  nb_comm_op_t bop = g_rank == last ? (nb_comm_op_t)9 : NB_COMM_SUM;
  ok = error_is(nb_comm_allreduce(g_comm, s.d, r.d, n, NB_COMM_FP32, bop), NB_ERR_INVALID,
                "unknown reduction op");
  ok &= error_is(nb_comm_broadcast(g_comm, s.d, r.d, n, NB_COMM_FP32, g_size), NB_ERR_INVALID,
                 "root out of range");
  if (g_size > 1)
    ok &= error_is(nb_comm_broadcast(g_comm, s.d, r.d, n, NB_COMM_FP32, g_rank == 0),
                   NB_ERR_INVALID, "root");
  ok &= error_is(nb_hier_allreduce(g_comm, s.d, n, NB_COMM_FP32, NB_COMM_SUM, NB_HIER_LEADER,
                                   g_rank == last ? NULL : peer_cluster, NULL),
                 NB_ERR_INVALID, "NULL inter-cluster callback");
  if (g_size > 1)
    ok &= error_is(
        nb_comm_allreduce(g_comm, s.d, g_rank == 0 ? s.d : r.d, n, NB_COMM_FP32, NB_COMM_SUM),
        NB_ERR_INVALID, "in place on some ranks");
  /* overlapping buffers that are not the in-place layout */
  ok &= error_is(nb_comm_allreduce(g_comm, s.d, (char*)s.d + 4, n, NB_COMM_FP32, NB_COMM_SUM),
                 NB_ERR_INVALID, "overlap");
  ok &= error_is(nb_comm_allreduce(NULL, s.d, r.d, n, NB_COMM_FP32, NB_COMM_SUM), NB_ERR_INVALID,
                 "communicator is NULL");
  agree(ok, "bad op / root / callback / in-place use are errors on every rank");

  /* the device asked for must exist everywhere; a CPU build has no GPU backend */
  if (!g_gpu && nb_device_count() == 0) {
    nb_comm_config_t cfg;
    nb_comm_config_init(&cfg);
    cfg.device = NB_COMM_DEVICE_GPU;
    nb_comm_t* c2 = (nb_comm_t*)&ok;
    ok = error_is(nb_comm_create(&cfg, &c2), NB_ERR_UNSUPPORTED, "gpu") && c2 == NULL;
    agree(ok, "a GPU communicator without a device fails on every rank");
  }
  if (g_size > 1) { /* ranks that ask for different devices */
    nb_comm_config_t cfg;
    nb_comm_config_init(&cfg);
    cfg.device = g_rank == last ? NB_COMM_DEVICE_AUTO : NB_COMM_DEVICE_CPU;
    nb_comm_t* c3 = NULL;
    ok = error_is(nb_comm_create(&cfg, &c3), NB_ERR_INVALID, "different devices") && c3 == NULL;
    agree(ok, "ranks asking for different devices fail on every rank");
  }
  if (!g_gpu) { /* MPI counts are int: a larger count is refused everywhere, nothing touched */
    ok = error_is(
        nb_comm_allreduce(g_comm, s.d, r.d, (size_t)INT32_MAX + 1, NB_COMM_FP32, NB_COMM_SUM),
        NB_ERR_UNSUPPORTED, "too large");
    agree(ok, "a count above INT_MAX is refused on every rank");
  }
  agree(still_works(), "allreduce after all the bad calls");
  /* zero counts are valid no-ops, NULL buffers allowed */
  ok = nb_comm_allreduce(g_comm, NULL, NULL, 0, NB_COMM_BF16, NB_COMM_AVG) == NB_OK;
  agree(ok, "zero-count allreduce");
  tb_free(&s);
  tb_free(&r);
}

int main(int argc, char** argv) {
  const char* dev = argc > 1 ? argv[1] : "cpu";
  g_gpu = strcmp(dev, "gpu") == 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_gpu) {
    int ndev = nb_device_count(), skip = ndev < 1 || ndev < g_size, any = 0;
    MPI_Allreduce(&skip, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
      if (g_rank == 0)
        printf("skipped: %d rank(s) need as many CUDA devices; this node has %d\n", g_size, ndev);
      MPI_Finalize();
      return NB_TEST_SKIP_CODE;
    }
  }
  nb_log_set_identity("test", g_rank);
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.device = g_gpu ? NB_COMM_DEVICE_GPU : NB_COMM_DEVICE_CPU;
  nb_status_t st = nb_comm_create(&cfg, &g_comm);
  if (st != NB_OK) {
    fprintf(stderr, "rank %d: nb_comm_create: %s\n", g_rank, nb_error_last());
    MPI_Finalize();
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_half_conversions),
      cmocka_unit_test(test_half_sums),
      cmocka_unit_test(test_create),
      cmocka_unit_test(test_allreduce),
      cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_allgather),
      cmocka_unit_test(test_broadcast_reduce),
      cmocka_unit_test(test_async),
      cmocka_unit_test(test_hier),
      cmocka_unit_test(test_hier_callback_error),
      cmocka_unit_test(test_bad_arguments),
  };
  int failed = cmocka_run_group_tests_name(g_gpu ? "intra_gpu" : "intra_cpu", tests, NULL, NULL);
  nb_comm_destroy(g_comm);
  MPI_Finalize();
  return failed ? 1 : 0;
}
