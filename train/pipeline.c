/* train/pipeline: the 1F1B schedule of a pipeline stage (train/pipeline.h). */
#include "train/pipeline.h"

#include <math.h>
#include <string.h>

#include "common/common.h"

typedef struct {
  nb_model_t* m;
  const nb_pipeline_t* p;
  const int *tokens, *targets;
  int s, S, B, T, slots;
  size_t nact;   /* B * T * C: one activation or gradient */
  float *x, *dy; /* receive buffers: the previous stage's output, the next stage's gradient */
  double loss_sum;
} nb__pl_t;

static nb_status_t nb__pl_xfer(nb__pl_t* q, const float* send, int to, float* recv, int from) {
  if (to < 0 && from < 0) return NB_OK;
  nb_status_t st = q->p->sendrecv(q->p->ctx, send, to, recv, from, q->nact);
  if (st != NB_OK)
    return nb_error(st, "pipeline stage %d: transfer (to %d, from %d) failed: %s", q->s, to, from,
                    nb_error_last());
  return NB_OK;
}

/* Forward of micro-batch i in its slot, from x (NULL on the first stage). */
static nb_status_t nb__pl_forward(nb__pl_t* q, int i, const float* x) {
  size_t bt = (size_t)q->B * (size_t)q->T;
  NB_CHECK(nb_model_use_slot(q->m, i % q->slots));
  float loss = 0;
  NB_CHECK(nb_model_stage_forward(q->m, q->tokens + (size_t)i * bt,
                                  q->targets ? q->targets + (size_t)i * bt : NULL, x, q->B, q->T,
                                  &loss));
  q->loss_sum += loss;
  return NB_OK;
}

static nb_status_t nb__pl_backward(nb__pl_t* q, int i, const float* dy) {
  NB_CHECK(nb_model_use_slot(q->m, i % q->slots));
  return nb_model_stage_backward(q->m, dy);
}

static nb_status_t nb__pl_setup(nb__pl_t* q, nb_model_t* m, const nb_pipeline_t* p,
                                const int* tokens, const int* targets, int M, int B, int T) {
  memset(q, 0, sizeof *q);
  if (!m || !p || !p->sendrecv || !p->allreduce || !tokens || !targets || M < 1 || B < 1 || T < 1)
    return nb_error(NB_ERR_INVALID, "pipeline: need a stage, transfers, tokens, targets, M >= 1");
  q->m = m;
  q->p = p;
  q->tokens = tokens;
  q->targets = targets;
  q->s = nb_model_pp_stage(m);
  q->S = nb_model_pp_stages(m);
  q->B = B;
  q->T = T;
  q->nact = (size_t)B * (size_t)T * (size_t)nb_model_get_config(m)->n_embd;
  int need = q->S - q->s < M ? q->S - q->s : M; /* micro-batches in flight here at most */
  q->slots = need;
  NB_CHECK(nb_model_set_slots(m, need));
  NB_CHECK(nb_alloc((void**)&q->x, q->nact, sizeof(float), "pipeline activation"));
  NB_CHECK(nb_alloc((void**)&q->dy, q->nact, sizeof(float), "pipeline gradient"));
  return NB_OK;
}

static void nb__pl_free(nb__pl_t* q) {
  nb_free(q->x);
  nb_free(q->dy);
}

/* The 1F1B order of stage s of S over M micro-batches. */
static nb_status_t nb__pl_run(nb__pl_t* q, int M) {
  int s = q->s, S = q->S, last = s == S - 1;
  int prev = s > 0 ? s - 1 : -1, next = last ? -1 : s + 1;
  int warm = S - s - 1 < M ? S - s - 1 : M, rem = M - warm, f = 0, b = 0;
  float* x = s > 0 ? q->x : NULL;
  for (int k = 0; k < warm; k++) { /* forwards only: the pipeline fills */
    NB_CHECK(nb__pl_xfer(q, NULL, -1, x, prev));
    NB_CHECK(nb__pl_forward(q, f++, x));
    NB_CHECK(nb__pl_xfer(q, nb_model_stage_output(q->m), next, NULL, -1));
  }
  if (rem > 0) NB_CHECK(nb__pl_xfer(q, NULL, -1, x, prev));
  for (int k = 0; k < rem; k++) { /* one forward, one backward */
    NB_CHECK(nb__pl_forward(q, f++, x));
    const float* dy = NULL;
    if (!last) { /* our output forward, the gradient of an earlier one back */
      NB_CHECK(nb__pl_xfer(q, nb_model_stage_output(q->m), next, q->dy, next));
      dy = q->dy;
    }
    NB_CHECK(nb__pl_backward(q, b++, dy));
    if (k == rem - 1)
      NB_CHECK(nb__pl_xfer(q, nb_model_stage_dinput(q->m), prev, NULL, -1));
    else /* our input's gradient back, the next input in */
      NB_CHECK(nb__pl_xfer(q, nb_model_stage_dinput(q->m), prev, x, prev));
  }
  for (int k = 0; k < warm; k++) { /* backwards only: the pipeline drains */
    NB_CHECK(nb__pl_xfer(q, NULL, -1, q->dy, next));
    NB_CHECK(nb__pl_backward(q, b++, q->dy));
    NB_CHECK(nb__pl_xfer(q, nb_model_stage_dinput(q->m), prev, NULL, -1));
  }
  return NB_OK;
}

/* The loss of the last stage on every stage: the others add 0. */
static nb_status_t nb__pl_loss(nb__pl_t* q, int M, double* loss) {
  float l = q->s == q->S - 1 ? (float)(q->loss_sum / M) : 0.0f;
  NB_CHECK(q->p->allreduce(q->p->ctx, &l, 1));
  if (loss) *loss = l;
  return NB_OK;
}

nb_status_t nb_pipeline_step(nb_model_t* m, const nb_pipeline_t* p, const int* tokens,
                             const int* targets, int M, int B, int T, double* loss) {
  nb__pl_t q;
  nb_status_t st = nb__pl_setup(&q, m, p, tokens, targets, M, B, T);
  if (st == NB_OK) {
    nb_model_zero_grad(m);
    st = nb__pl_run(&q, M);
  }
  if (st == NB_OK && M > 1) {
    size_t n;
    float* g = nb_model_grads(m, &n);
    float inv = 1.0f / (float)M;
    for (size_t i = 0; i < n; i++) g[i] *= inv;
  }
  if (st == NB_OK) st = nb_model_pp_reduce_grads(m);
  if (st == NB_OK) st = nb__pl_loss(&q, M, loss);
  nb__pl_free(&q);
  return st;
}

nb_status_t nb_pipeline_forward(nb_model_t* m, const nb_pipeline_t* p, const int* tokens,
                                const int* targets, int B, int T, double* loss, int* scored) {
  nb__pl_t q;
  nb_status_t st = nb__pl_setup(&q, m, p, tokens, targets, 1, B, T);
  int s = q.s, last = s == q.S - 1;
  float* x = s > 0 ? q.x : NULL;
  if (st == NB_OK) st = nb__pl_xfer(&q, NULL, -1, x, s > 0 ? s - 1 : -1);
  if (st == NB_OK) st = nb__pl_forward(&q, 0, x);
  if (st == NB_OK) st = nb__pl_xfer(&q, nb_model_stage_output(m), last ? -1 : s + 1, NULL, -1);
  if (st == NB_OK) st = nb__pl_loss(&q, 1, loss);
  if (st == NB_OK && scored) {
    size_t bt = (size_t)B * (size_t)T;
    int c = 0;
    for (size_t i = 0; i < bt; i++) c += targets[i] >= 0;
    *scored = c;
  }
  nb__pl_free(&q);
  return st;
}

nb_status_t nb_pipeline_bits_per_byte(nb_model_t* m, const nb_pipeline_t* p, const uint8_t* text,
                                      size_t len, int B, int T, double* bpb, size_t* n_scored) {
  if (!m || !p || !text || !bpb || len < 2 || B < 1 || T < 1)
    return nb_error(NB_ERR_INVALID, "pipeline bits per byte: need a stage, >= 2 bytes, B, T >= 1");
  int *tok = NULL, *tgt = NULL;
  nb_status_t st = nb_alloc((void**)&tok, (size_t)B * T, sizeof(int), "eval tokens");
  if (st == NB_OK) st = nb_alloc((void**)&tgt, (size_t)B * T, sizeof(int), "eval targets");
  double nats = 0.0;
  size_t scored = 0, start = 0;
  while (st == NB_OK && start + 1 < len) {
    int rows = nb_model_text_windows(text, len, B, T, &start, tok, tgt), c = 0;
    double loss = 0;
    st = nb_pipeline_forward(m, p, tok, tgt, rows, T, &loss, &c);
    nats += loss * c;
    scored += (size_t)c;
  }
  if (st == NB_OK) {
    *bpb = scored ? nats / (double)scored / log(2.0) : 0;
    if (n_scored) *n_scored = scored;
  }
  nb_free(tok);
  nb_free(tgt);
  return st;
}
