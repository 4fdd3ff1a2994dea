/* Model tests: whole-model gradients against finite differences of a double-precision reference
 * (plain, distillation, LoRA), input validation, causality, loss falling on a small multilingual
 * corpus, bit-identical runs from the same seed, and the optimizer's schedule/clipping/outer step.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/checksum.h"

#include "tests/unit/train/ref_model.h"
#include "train/bytedata.h"
#include "train/lora.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/rng.h"

static const char* corpus_path;

static double* arena_to_d(const float* p, size_t n) {
  double* d = malloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) d[i] = p[i];
  return d;
}

/* Central differences of ref_model_loss over every element of x (n), compared tensor by tensor
 * with the analytic gradient g. Returns 1 when every tensor is within tolerance. */
static int check_arena(ref_model_t* r, double* x, const float* g, size_t n_views,
                       const nb_tensor_view_t* (*view)(const void*, size_t), const void* owner) {
  int ok = 1;
  for (size_t vi = 0; vi < n_views; vi++) {
    const nb_tensor_view_t* v = view(owner, vi);
    double* fd = malloc(sizeof(double) * v->numel);
    for (size_t j = 0; j < v->numel; j++) {
      double* p = &x[v->offset + j];
      double save = *p, h = 1e-5;
      *p = save + h;
      double lp = ref_model_loss(r);
      *p = save - h;
      double lm = ref_model_loss(r);
      *p = save;
      fd[j] = (lp - lm) / (2 * h);
    }
    ok &= ref_compare(v->name, g + v->offset, fd, v->numel, 2e-4, 2e-3);
    free(fd);
  }
  return ok;
}
static const nb_tensor_view_t* model_view(const void* m, size_t i) {
  return nb_model_tensor(m, i);
}
static const nb_tensor_view_t* lora_view(const void* l, size_t i) {
  return nb_lora_tensor(l, i);
}

static void tiny_batch(int B, int T, int* tok, int* tgt) {
  nb_rng_t r;
  nb_rng_seed(&r, 99);
  for (int i = 0; i < B * T; i++) {
    tok[i] = (int)nb_rng_below(&r, NB_VOCAB);
    tgt[i] = (int)nb_rng_below(&r, NB_VOCAB);
  }
  tgt[1] = -1; /* a masked position */
}

static void test_model_gradcheck(void** state) {
  nb_model_config_t cfg = nb_model_config_make(2, 8, 2, 8);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&cfg, 7, &m), NB_OK);
  /* random LayerNorm/bias values so their gradients are exercised away from 1 / 0 */
  size_t n;
  float* p = nb_model_params(m, &n);
  nb_rng_t rng;
  nb_rng_seed(&rng, 5);
  for (size_t i = 0; i < n; i++) p[i] += (float)(0.1 * nb_rng_normal(&rng));
  int B = 2, T = 6, tok[12], tgt[12];
  tiny_batch(B, T, tok, tgt);
  float loss;
  assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss), NB_OK);
  nb_model_zero_grad(m);
  assert_int_equal(nb_model_backward(m), NB_OK);
  ref_model_t r = {m, arena_to_d(p, n), tok, tgt, B, T, 0, 1, NULL, NULL, NULL, 0};
  double ref = ref_model_loss(&r);
  printf("  loss %.7f ref %.7f (%zu parameters)\n", loss, ref, n);
  assert_true(fabs(loss - ref) < 1e-5 * fabs(ref));
  assert_true(
      check_arena(&r, r.p, nb_model_grads(m, NULL), nb_model_num_tensors(m), model_view, m));

  /* distillation: (1 - a) CE + a T^2 KL(teacher || student) */
  double* teacher = malloc(sizeof(double) * B * T * NB_VOCAB);
  float* teacher_f = malloc(sizeof(float) * B * T * NB_VOCAB);
  for (int i = 0; i < B * T * NB_VOCAB; i++) teacher[i] = teacher_f[i] = (float)nb_rng_normal(&rng);
  assert_int_equal(nb_model_forward_distill(m, tok, tgt, teacher_f, 0.6f, 2.0f, B, T, &loss),
                   NB_OK);
  nb_model_zero_grad(m);
  assert_int_equal(nb_model_backward(m), NB_OK);
  r.alpha = 0.6;
  r.temp = 2.0;
  r.teacher = teacher;
  ref = ref_model_loss(&r);
  printf("  distill loss %.7f ref %.7f\n", loss, ref);
  assert_true(fabs(loss - ref) < 1e-5 * fabs(ref));
  assert_true(
      check_arena(&r, r.p, nb_model_grads(m, NULL), nb_model_num_tensors(m), model_view, m));
  assert_int_equal(nb_model_forward_distill(m, tok, tgt, teacher_f, 1.5f, 2.0f, B, T, &loss),
                   NB_ERR_INVALID);
  free(teacher), free(teacher_f), free(r.p);
  nb_model_destroy(m);
}

/* A context past two attention blocks (64 rows each) and not a multiple of them: the loss against
 * the double reference, and the gradients of the tensors the attention feeds (qkv weight and
 * bias) and of the MLP's output projection against its finite differences. Its 130 rows split
 * each dense product into tasks (train/model.c nb__mm_tasks), so the weight gradients here are
 * partial products summed. */
static void test_model_long_context(void** state) {
  enum { B = 1, T = 130 };
  nb_model_config_t cfg = nb_model_config_make(1, 8, 2, T);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&cfg, 3, &m), NB_OK);
  size_t n;
  float* p = nb_model_params(m, &n);
  nb_rng_t rng;
  nb_rng_seed(&rng, 8);
  for (size_t i = 0; i < n; i++) p[i] += (float)(0.3 * nb_rng_normal(&rng));
  int tok[B * T], tgt[B * T];
  tiny_batch(B, T, tok, tgt);
  float loss;
  assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss), NB_OK);
  nb_model_zero_grad(m);
  assert_int_equal(nb_model_backward(m), NB_OK);
  ref_model_t r = {m, arena_to_d(p, n), tok, tgt, B, T, 0, 1, NULL, NULL, NULL, 0};
  double ref = ref_model_loss(&r);
  printf("  T=%d loss %.7f ref %.7f\n", T, loss, ref);
  assert_true(fabs(loss - ref) < 1e-5 * fabs(ref));
  const float* g = nb_model_grads(m, NULL);
  int checked = 0;
  for (size_t vi = 0; vi < nb_model_num_tensors(m); vi++) {
    const nb_tensor_view_t* v = nb_model_tensor(m, vi);
    if (!strstr(v->name, "c_attn") && !strstr(v->name, "mlp.c_proj")) continue;
    double* fd = malloc(sizeof(double) * v->numel);
    for (size_t j = 0; j < v->numel; j++) {
      double* x = &r.p[v->offset + j];
      double save = *x, h = 1e-5;
      *x = save + h;
      double lp = ref_model_loss(&r);
      *x = save - h;
      double lm = ref_model_loss(&r);
      *x = save;
      fd[j] = (lp - lm) / (2 * h);
    }
    assert_true(ref_compare(v->name, g + v->offset, fd, v->numel, 2e-4, 2e-3));
    free(fd);
    checked++;
  }
  assert_int_equal(checked, 4);
  free(r.p);
  nb_model_destroy(m);
}

static void test_lora(void** state) {
  nb_model_config_t cfg = nb_model_config_make(2, 8, 2, 8);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&cfg, 11, &m), NB_OK);
  size_t n;
  float* p = nb_model_params(m, &n);
  float* base = malloc(n * sizeof(float));
  memcpy(base, p, n * sizeof(float));
  int B = 2, T = 6, tok[12], tgt[12];
  tiny_batch(B, T, tok, tgt);
  float loss0, loss;
  assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss0), NB_OK);

  nb_lora_config_t lc = {4, 8.0f,
                         (1u << NB_SITE_QKV) | (1u << NB_SITE_FC_PROJ) | (1u << NB_SITE_FC)};
  nb_lora_t* lo;
  assert_int_equal(nb_lora_create(m, &lc, 3, &lo), NB_OK);
  size_t ln;
  float* lp = nb_lora_params(lo, &ln);
  assert_int_equal(nb_lora_num_tensors(lo), 2 * 2 * 3);
  /* B = 0 at creation: the adapted model equals the base */
  assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss), NB_OK);
  assert_true(loss == loss0);

  /* a few AdamW steps on the adapters only: the base stays bit-identical */
  nb_adamw_config_t oc = nb_adamw_config_default();
  oc.lr = 1e-2f;
  oc.warmup_steps = 0;
  nb_adamw_t* opt;
  assert_int_equal(nb_adamw_create(&oc, ln, &opt), NB_OK);
  nb_model_zero_grad(m);
  for (int s = 0; s < 5; s++) {
    assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss), NB_OK);
    nb_lora_zero_grad(lo);
    assert_int_equal(nb_model_backward(m), NB_OK);
    assert_int_equal(nb_adamw_step(opt, lp, nb_lora_grads(lo, NULL), NULL, NULL), NB_OK);
  }
  printf("  loss %.5f -> %.5f after 5 adapter steps\n", loss0, loss);
  assert_true(loss < loss0);
  assert_memory_equal(p, base, n * sizeof(float));
  const float* g = nb_model_grads(m, NULL);
  for (size_t i = 0; i < n; i++) assert_true(g[i] == 0.0f); /* frozen: no base gradient */

  /* adapter gradients vs finite differences of the double reference */
  assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss), NB_OK);
  nb_lora_zero_grad(lo);
  assert_int_equal(nb_model_backward(m), NB_OK);
  ref_model_t r = {
      m, arena_to_d(p, n), tok, tgt, B, T, 0, 1, NULL, lo, arena_to_d(lp, ln), lc.alpha / lc.rank};
  double ref = ref_model_loss(&r);
  printf("  adapted loss %.7f ref %.7f\n", loss, ref);
  assert_true(fabs(loss - ref) < 1e-5 * fabs(ref));
  assert_true(
      check_arena(&r, r.lp, nb_lora_grads(lo, NULL), nb_lora_num_tensors(lo), lora_view, lo));

  /* merged == unmerged forward */
  float* before = malloc(sizeof(float) * B * T * NB_VOCAB);
  memcpy(before, nb_model_logits(m), sizeof(float) * B * T * NB_VOCAB);
  assert_int_equal(nb_lora_merge(lo), NB_OK);
  assert_int_equal(nb_lora_merge(lo), NB_ERR_INVALID);
  assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss), NB_OK);
  const float* after = nb_model_logits(m);
  double worst = 0;
  for (int i = 0; i < B * T * NB_VOCAB; i++)
    if (fabs(after[i] - before[i]) > worst) worst = fabs(after[i] - before[i]);
  printf("  merged vs unmerged logits: max |diff| %.3e\n", worst);
  assert_true(worst < 1e-4);
  assert_memory_not_equal(p, base, n * sizeof(float));

  nb_lora_config_t bad = {0, 1.0f, 1};
  nb_lora_t* lo2;
  assert_int_equal(nb_lora_create(m, &bad, 1, &lo2), NB_ERR_INVALID);
  free(base), free(before), free(r.p), free(r.lp);
  nb_adamw_destroy(opt);
  nb_lora_destroy(lo);
  nb_model_destroy(m);
}

static void test_invalid_and_causal(void** state) {
  nb_model_config_t cfg = nb_model_config_make(1, 8, 2, 8);
  nb_model_t* m;
  cfg.n_head = 3;
  assert_int_equal(nb_model_create(&cfg, 1, &m), NB_ERR_INVALID);
  cfg.n_head = 2;
  assert_int_equal(nb_model_create(&cfg, 1, &m), NB_OK);
  int tok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, tgt[9] = {0};
  float loss;
  assert_int_equal(nb_model_forward(m, tok, tgt, 1, 9, &loss), NB_ERR_INVALID); /* T > ctx */
  tok[0] = NB_VOCAB;
  assert_int_equal(nb_model_forward(m, tok, tgt, 1, 4, &loss), NB_ERR_INVALID);
  tok[0] = 1;
  tgt[0] = -2;
  assert_int_equal(nb_model_forward(m, tok, tgt, 1, 4, &loss), NB_ERR_INVALID);
  assert_int_equal(nb_model_forward(m, tok, NULL, 1, 8, NULL), NB_OK);
  assert_int_equal(nb_model_backward(m), NB_ERR_INVALID); /* no targets */
  float* a = malloc(sizeof(float) * 8 * NB_VOCAB);
  memcpy(a, nb_model_logits(m), sizeof(float) * 8 * NB_VOCAB);
  tok[5] = 200; /* changing position 5 must not change logits at positions 0..4 */
  assert_int_equal(nb_model_forward(m, tok, NULL, 1, 8, NULL), NB_OK);
  assert_memory_equal(a, nb_model_logits(m), sizeof(float) * 5 * NB_VOCAB);
  assert_memory_not_equal(a + 5 * NB_VOCAB, nb_model_logits(m) + 5 * NB_VOCAB,
                          sizeof(float) * NB_VOCAB);
  free(a);
  nb_model_destroy(m);
}

/* Trains `steps` steps on the corpus; returns final params (caller frees) and loss curve ends. */
static float* train_run(uint64_t seed, int steps, float* first, float* last) {
  nb_model_config_t cfg = nb_model_config_make(2, 48, 4, 32);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&cfg, seed, &m), NB_OK);
  nb_bytedata_t* d;
  assert_int_equal(nb_bytedata_open(corpus_path, seed, &d), NB_OK);
  nb_adamw_config_t oc = nb_adamw_config_default();
  oc.lr = 3e-3f;
  oc.warmup_steps = 10;
  oc.total_steps = steps;
  size_t n;
  float* p = nb_model_params(m, &n);
  nb_adamw_t* opt;
  assert_int_equal(nb_adamw_create(&oc, n, &opt), NB_OK);
  enum { B = 8, T = 32 };
  int tok[B * T], tgt[B * T];
  double head = 0, tail = 0;
  for (int s = 0; s < steps; s++) {
    nb_bytedata_batch(d, B, T, tok, tgt);
    float loss;
    assert_int_equal(nb_model_forward(m, tok, tgt, B, T, &loss), NB_OK);
    nb_model_zero_grad(m);
    assert_int_equal(nb_model_backward(m), NB_OK);
    assert_int_equal(nb_adamw_step(opt, p, nb_model_grads(m, NULL), nb_model_decay_mask(m), NULL),
                     NB_OK);
    if (s < 5) head += loss / 5;
    if (s >= steps - 5) tail += loss / 5;
  }
  *first = (float)head;
  *last = (float)tail;
  float* out = malloc(n * sizeof(float));
  memcpy(out, p, n * sizeof(float));
  nb_adamw_destroy(opt);
  nb_bytedata_destroy(d);
  nb_model_destroy(m);
  return out;
}

/* Runs train_run in a child process with NB_TRAIN_THREADS=threads; returns the xxh3 of the
 * final parameters (the thread pool starts lazily, so each child builds its own). */
static uint64_t hash_in_child(const char* threads, int steps) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("NB_TRAIN_THREADS", threads, 1);
    float h, t;
    float* p = train_run(42, steps, &h, &t);
    nb_model_config_t cfg = nb_model_config_make(2, 48, 4, 32);
    nb_model_t* m;
    if (nb_model_create(&cfg, 42, &m) != NB_OK) _exit(1);
    uint64_t x = nb_xxh3_64(p, nb_model_num_params(m) * sizeof(float), 0);
    if (write(fd[1], &x, sizeof x) != (ssize_t)sizeof x) _exit(1);
    _exit(0);
  }
  close(fd[1]);
  uint64_t x = 0;
  assert_int_equal(read(fd[0], &x, sizeof x), sizeof x);
  close(fd[0]);
  int ws;
  waitpid(pid, &ws, 0);
  assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  return x;
}

static void test_threads_same_bits(void** state) {
  uint64_t a = hash_in_child("1", 20), b = hash_in_child("3", 20);
  printf("  parameter hash after 20 steps: 1 thread %016llx, 3 threads %016llx\n",
         (unsigned long long)a, (unsigned long long)b);
  assert_true(a == b);
  /* a child forked after this process's pool started runs inline (and does not hang) */
  float h, t;
  free(train_run(42, 2, &h, &t));
  uint64_t c = hash_in_child("3", 20);
  assert_true(c == a);
}

static void test_loss_falls_and_determinism(void** state) {
  float h1, t1, h2, t2, h3, t3;
  int steps = 150;
  float* a = train_run(42, steps, &h1, &t1);
  printf("  corpus loss: first 5 steps %.3f nats, last 5 steps %.3f nats (%d steps)\n", h1, t1,
         steps);
  assert_true(t1 < 0.6f * h1);
  float* b = train_run(42, steps, &h2, &t2);
  nb_model_config_t cfg = nb_model_config_make(2, 48, 4, 32);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&cfg, 42, &m), NB_OK);
  size_t n = nb_model_num_params(m);
  assert_memory_equal(a, b, n * sizeof(float)); /* same seed: same bits */
  assert_true(t1 == t2);
  float* c = train_run(43, 3, &h3, &t3);
  assert_memory_not_equal(a, c, n * sizeof(float));
  free(a), free(b), free(c);
  nb_model_destroy(m);
}

static void test_generate(void** state) {
  nb_model_config_t cfg = nb_model_config_make(1, 16, 2, 6);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&cfg, 8, &m), NB_OK);
  int prompt[3] = {'a', 'b', NB_TOKEN_SEP}, out[10], out2[10], n = 0, n2 = 0;
  assert_int_equal(nb_model_generate_greedy(m, prompt, 3, 10, -1, out, &n), NB_OK);
  assert_int_equal(n, 10); /* runs past ctx = 6 with a sliding window */
  assert_int_equal(nb_model_generate_greedy(m, prompt, 3, 10, -1, out2, &n2), NB_OK);
  assert_memory_equal(out, out2, sizeof out);
  /* the first token is the argmax of a plain forward's last row */
  assert_int_equal(nb_model_forward(m, prompt, NULL, 1, 3, NULL), NB_OK);
  const float* row = nb_model_logits(m) + 2 * NB_VOCAB;
  int best = 0;
  for (int j = 1; j < NB_VOCAB; j++)
    if (row[j] > row[best]) best = j;
  assert_int_equal(out[0], best);
  /* stopping on a token */
  assert_int_equal(nb_model_generate_greedy(m, prompt, 3, 10, out[0], out2, &n2), NB_OK);
  assert_int_equal(n2, 1);
  assert_int_equal(nb_model_generate_greedy(m, prompt, 0, 10, -1, out2, &n2), NB_ERR_INVALID);

  /* bits per byte: every byte but the first scored once; a fresh model is close to uniform */
  const uint8_t text[] =
      "Der schnelle braune Fuchs springt \xc3\xbc"
      "ber den faulen Hund.";
  size_t len = sizeof text - 1, scored = 0;
  double bpb = 0, bpb2 = 0;
  assert_int_equal(nb_model_bits_per_byte(m, text, len, 3, 6, &bpb, &scored), NB_OK);
  assert_int_equal(scored, len - 1);
  printf("  fresh model: %.4f bits per byte (uniform would be %.4f)\n", bpb, log2(NB_VOCAB));
  assert_true(fabs(bpb - log2(NB_VOCAB)) < 0.2);
  assert_int_equal(nb_model_bits_per_byte(m, text, len, 1, 6, &bpb2, NULL), NB_OK);
  assert_true(fabs(bpb - bpb2) < 1e-6); /* batching does not change the result */
  /* one window of exactly T + 1 bytes equals a plain forward's mean loss */
  int tk[6], tg[6];
  for (int i = 0; i < 6; i++) tk[i] = text[i], tg[i] = text[i + 1];
  float loss;
  assert_int_equal(nb_model_forward(m, tk, tg, 1, 6, &loss), NB_OK);
  assert_int_equal(nb_model_bits_per_byte(m, text, 7, 1, 6, &bpb, NULL), NB_OK);
  assert_true(fabs(bpb - loss / log(2.0)) < 1e-6);
  assert_int_equal(nb_model_bits_per_byte(m, text, 1, 1, 6, &bpb, NULL), NB_ERR_INVALID);
  nb_model_destroy(m);
}

static void test_optim(void** state) {
  nb_adamw_config_t c = nb_adamw_config_default();
  c.lr = 1.0f;
  c.min_lr_frac = 0.1f;
  c.warmup_steps = 10;
  c.total_steps = 110;
  assert_true(fabsf(nb_adamw_lr(&c, 0) - 0.1f) < 1e-6f);
  assert_true(fabsf(nb_adamw_lr(&c, 9) - 1.0f) < 1e-6f);
  assert_true(fabsf(nb_adamw_lr(&c, 10) - 1.0f) < 1e-6f);
  assert_true(fabsf(nb_adamw_lr(&c, 60) - 0.55f) < 1e-6f); /* half-way down the cosine */
  assert_true(fabsf(nb_adamw_lr(&c, 110) - 0.1f) < 1e-6f);
  assert_true(fabsf(nb_adamw_lr(&c, 1000) - 0.1f) < 1e-6f);
  for (long s = 11; s < 110; s++) assert_true(nb_adamw_lr(&c, s) <= nb_adamw_lr(&c, s - 1));

  /* clipping: norm 5 clipped to 1 */
  float g[2] = {3, 4}, p[2] = {0, 0};
  c.grad_clip = 1.0f;
  nb_adamw_t* o;
  assert_int_equal(nb_adamw_create(&c, 2, &o), NB_OK);
  double norm;
  assert_int_equal(nb_adamw_step(o, p, g, NULL, &norm), NB_OK);
  assert_true(fabs(norm - 5.0) < 1e-6);
  assert_true(fabsf(g[0] - 0.6f) < 1e-6f && fabsf(g[1] - 0.8f) < 1e-6f);
  assert_int_equal(nb_adamw_steps(o), 1);
  g[0] = NAN;
  assert_int_equal(nb_adamw_step(o, p, g, NULL, &norm), NB_ERR_INVALID);
  assert_int_equal(nb_adamw_steps(o), 1);
  nb_adamw_destroy(o);
  c.beta2 = 1.0f;
  assert_int_equal(nb_adamw_create(&c, 2, &o), NB_ERR_INVALID);

  /* outer Nesterov step */
  float th[2] = {1, 2}, d[2] = {0.5f, -1}, mo[2] = {0.2f, 0};
  nb_outer_step(th, d, mo, 0.7f, 0.9f, 2);
  /* mo = 0.9*0.2 + 0.5 = 0.68; th = 1 - 0.7*(0.5 + 0.9*0.68) */
  assert_true(fabsf(mo[0] - 0.68f) < 1e-6f && fabsf(mo[1] + 1.0f) < 1e-6f);
  assert_true(fabsf(th[0] - (1 - 0.7f * (0.5f + 0.9f * 0.68f))) < 1e-6f);
  assert_true(fabsf(th[1] - (2 - 0.7f * (-1 - 0.9f))) < 1e-6f);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CORPUS\n", argv[0]);
    return 2;
  }
  corpus_path = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_same_bits), /* first: before this process starts its pool */
      cmocka_unit_test(test_model_gradcheck),
      cmocka_unit_test(test_model_long_context),
      cmocka_unit_test(test_lora),
      cmocka_unit_test(test_invalid_and_causal),
      cmocka_unit_test(test_generate),
      cmocka_unit_test(test_optim),
      cmocka_unit_test(test_loss_falls_and_determinism),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
