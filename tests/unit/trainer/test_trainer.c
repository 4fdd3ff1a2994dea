/* Tests of the single-cluster training loop (train/trainer.h) and `nebula train` / `nebula eval`
 * on a tiny committed corpus (60 lines each of en, de, ru, zh; 60 + 12 en-de and en-ru pairs,
 * a few test pairs of each). Tiny model
 * so the whole file runs in seconds. argv[1] = data folder, argv[2] = the nebula binary. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/translate.h"

static const char* g_data;
static const char* g_nebula;

#define NB__TAG_STEPS 200 /* training steps of the two-pair language check */

static void tiny_config(nb_train_config_t* c) {
  nb_train_config_defaults(c);
  c->model = nb_model_config_make(2, 32, 2, 32);
  c->seed = 7;
  c->batch_size = 4;
  c->max_steps = 40;
  c->optim.lr = 3e-3f;
  c->optim.warmup_steps = 5;
  c->optim.total_steps = 0; /* = max_steps */
  c->heldout_permille = 150;
  c->eval_every = 0;
  c->eval_batches = 2;
  static const char* langs[] = {"en", "de", "ru", "zh"};
  c->n_sources = 4;
  for (int i = 0; i < 4; i++) {
    snprintf(c->sources[i].label, sizeof c->sources[i].label, "%s", langs[i]);
    snprintf(c->sources[i].path, sizeof c->sources[i].path, "%s/mono/%s.txt", g_data, langs[i]);
  }
}

static char* make_tmpdir(void) {
  static char buf[8][64];
  static int k = 0;
  char* d = buf[k++ % 8];
  snprintf(d, 64, "/tmp/nb_trainer_test.XXXXXX");
  assert_non_null(mkdtemp(d));
  return d;
}

static void rm_rf(const char* d) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  assert_int_equal(system(cmd), 0);
}

/* Training loss falls; the held-out bits per byte of every language fall from about log2(259). */
static void test_loss_falls_and_eval_per_language(void** state) {
  (void)state;
  nb_train_config_t c;
  tiny_config(&c);
  c.max_steps = 150;
  c.batch_size = 8;
  c.optim.lr = 1e-2f;
  nb_trainer_t* t;
  assert_int_equal(nb_trainer_create(&c, &t), NB_OK);
  nb_train_eval_t e0, e1;
  assert_int_equal(nb_trainer_eval(t, &e0), NB_OK);
  assert_int_equal(e0.n, 4);
  for (int i = 0; i < 4; i++) {
    assert_string_equal(e0.label[i], c.sources[i].label);
    assert_true(e0.scored[i] > 100);
    assert_true(fabs(e0.bpb[i] - log2(259.0)) < 0.3); /* a fresh model is near uniform */
  }
  double first = 0, last = 0, l;
  for (int s = 0; s < 150; s++) {
    assert_int_equal(nb_trainer_steps(t, 1, &l), NB_OK);
    if (s < 5) first += l / 5;
    if (s >= 145) last += l / 5;
  }
  print_message("loss first %.3f last %.3f\n", first, last);
  assert_true(last < 0.7 * first);
  assert_int_equal(nb_trainer_eval(t, &e1), NB_OK);
  for (int i = 0; i < 4; i++)
    print_message("%s: %.3f -> %.3f bits/byte\n", e1.label[i], e0.bpb[i], e1.bpb[i]);
  for (int i = 0; i < 4; i++) assert_true(e1.bpb[i] < e0.bpb[i] - 1.5);
  assert_true(e1.mean_bpb < e0.mean_bpb);
  /* evaluating changes nothing: same figures twice */
  nb_train_eval_t e2;
  assert_int_equal(nb_trainer_eval(t, &e2), NB_OK);
  assert_memory_equal(e1.bpb, e2.bpb, sizeof e1.bpb);
  /* a round as a wall-time budget: at least one step; k_max bounds it */
  long k = 0;
  assert_int_equal(nb_trainer_steps_budget(t, 1000, 0.0, &k, NULL), NB_OK);
  assert_int_equal(k, 1);
  assert_int_equal(nb_trainer_steps_budget(t, 3, 1e9, &k, NULL), NB_OK);
  assert_int_equal(k, 3);
  assert_int_equal(nb_trainer_steps_budget(t, 0, 1.0, &k, NULL), NB_ERR_INVALID);
  assert_int_equal(nb_trainer_step(t), 154);
  assert_int_equal(nb_trainer_samples(t), 154 * 8);
  nb_trainer_destroy(t);
}

/* Every training window is a piece of the training text, and no held-out segment is in it. */
static void test_heldout_never_trained_on(void** state) {
  (void)state;
  nb_train_config_t c;
  tiny_config(&c);
  nb_trainer_t* t;
  assert_int_equal(nb_trainer_create(&c, &t), NB_OK);
  int total_held = 0;
  for (int i = 0; i < 4; i++) {
    size_t tl, hl;
    const uint8_t* tr = nb_trainer_train_text(t, i, &tl);
    const uint8_t* he = nb_trainer_heldout_text(t, i, &hl);
    assert_non_null(tr);
    assert_non_null(he);
    /* every line classified by the rule, and no held-out line inside the training text */
    for (size_t a = 0; a < hl;) {
      const uint8_t* nl = memchr(he + a, '\n', hl - a);
      size_t n = (size_t)(nl - (he + a));
      assert_true(nb_train_is_heldout(he + a, n, c.heldout_permille));
      assert_null(memmem(tr, tl, he + a, n));
      total_held++;
      a += n + 1;
    }
    for (size_t a = 0; a < tl;) {
      const uint8_t* nl = memchr(tr + a, '\n', tl - a);
      size_t n = (size_t)(nl - (tr + a));
      assert_false(nb_train_is_heldout(tr + a, n, c.heldout_permille));
      a += n + 1;
    }
  }
  assert_true(total_held >= 8); /* 15% of 240 lines: the slice is not empty */
  const int B = c.batch_size, T = c.model.ctx;
  int tok[4 * 32], tgt[4 * 32];
  uint8_t w[33];
  for (long s = 0; s < 200; s++) {
    nb_trainer_batch(t, s, 0, tok, tgt);
    for (int r = 0; r < B; r++) {
      int n = 0;
      for (int j = 0; j < T && tok[r * T + j] < 256; j++) w[n++] = (uint8_t)tok[r * T + j];
      int found = 0;
      for (int i = 0; i < 4 && !found; i++) {
        size_t tl;
        const uint8_t* tr = nb_trainer_train_text(t, i, &tl);
        found = memmem(tr, tl, w, (size_t)n) != NULL;
      }
      assert_true(found);
    }
  }
  /* the batches are a pure function of (seed, step): same step, same batch */
  int tok2[4 * 32], tgt2[4 * 32];
  nb_trainer_batch(t, 3, 0, tok, tgt);
  nb_trainer_batch(t, 3, 0, tok2, tgt2);
  assert_memory_equal(tok, tok2, sizeof tok);
  assert_memory_equal(tgt, tgt2, sizeof tgt);
  nb_trainer_destroy(t);
}

static int stop_at_13(void* ctx, const nb_train_progress_t* p) {
  (void)ctx;
  return p->event == NB_TRAIN_EVENT_STEP && p->step == 13;
}

/* Stopped at step 13 and resumed from the checkpoint: the same bits as 30 steps in one go. */
static void test_checkpoint_resume_bit_exact(void** state) {
  (void)state;
  nb_train_config_t c;
  tiny_config(&c);
  c.max_steps = 30;
  c.micro_batches = 2;
  nb_trainer_t* a;
  assert_int_equal(nb_trainer_create(&c, &a), NB_OK);
  assert_int_equal(nb_trainer_run(a, NULL), NB_OK);

  char* dir = make_tmpdir();
  snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s/ck", dir);
  c.checkpoint_every = 5;
  c.checkpoint_keep = 2;
  c.progress = stop_at_13;
  nb_trainer_t* b;
  assert_int_equal(nb_trainer_create(&c, &b), NB_OK);
  assert_int_equal(nb_trainer_run(b, NULL), NB_ERR_CANCELLED);
  assert_int_equal(nb_trainer_step(b), 13);
  nb_trainer_destroy(b);
  char p[256];
  struct stat sb;
  snprintf(p, sizeof p, "%s/ck/step-13/model.safetensors", dir);
  assert_int_equal(stat(p, &sb), 0);
  snprintf(p, sizeof p, "%s/ck/step-5", dir); /* pruned: keep 2 (step-10, step-13) */
  assert_int_not_equal(stat(p, &sb), 0);
  snprintf(p, sizeof p, "%s/ck/step-10/optim.safetensors", dir);
  assert_int_equal(stat(p, &sb), 0);

  c.progress = NULL;
  c.resume = 1;
  assert_int_equal(nb_trainer_create(&c, &b), NB_OK);
  assert_int_equal(nb_trainer_step(b), 13);
  assert_int_equal(nb_trainer_samples(b), 13 * 8);
  assert_int_equal(nb_trainer_run(b, NULL), NB_OK);
  assert_int_equal(nb_trainer_step(b), 30);
  size_t na, nb;
  float* pa = nb_trainer_sync_params(a, &na);
  float* pb = nb_trainer_sync_params(b, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(pa, pb, na * sizeof(float));
  assert_int_equal(nb_trainer_samples(a), nb_trainer_samples(b));
  nb_trainer_destroy(b);

  /* resuming with another seed is refused with a clear message */
  c.seed = 8;
  assert_int_equal(nb_trainer_create(&c, &b), NB_ERR_CONFIG);
  assert_non_null(strstr(nb_error_last(), "seed"));
  nb_trainer_destroy(a);
  rm_rf(dir);
}

static int g_hook_calls;
static size_t g_hook_n;
static nb_status_t count_hook(void* ctx, float* g, size_t n) {
  (void)ctx;
  (void)g;
  g_hook_calls++;
  g_hook_n = n;
  return NB_OK;
}

/* LoRA: only the adapters change; they are the synced buffer; the grad hook sees them; resume
 * is bit-exact. Distillation from the base runs. */
static void test_lora_trains_only_adapters(void** state) {
  (void)state;
  char* dir = make_tmpdir();
  char base[128];
  snprintf(base, sizeof base, "%s/base.safetensors", dir);
  nb_train_config_t c;
  tiny_config(&c);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&c.model, 3, &m), NB_OK);
  assert_int_equal(nb_checkpoint_save(base, m, 0), NB_OK);
  size_t n;
  float* p0 = nb_model_params(m, &n);

  snprintf(c.init_checkpoint, sizeof c.init_checkpoint, "%s", base);
  c.lora_enabled = 1;
  c.lora.rank = 4;
  c.lora.sites = (1u << NB_SITE_QKV) | (1u << NB_SITE_FC);
  c.grad_hook = count_hook;
  g_hook_calls = 0;
  nb_trainer_t* t;
  assert_int_equal(nb_trainer_create(&c, &t), NB_OK);
  size_t nl;
  float* lp = nb_trainer_sync_params(t, &nl);
  size_t nl2;
  assert_ptr_equal(lp, nb_lora_params(nb_trainer_lora(t), &nl2));
  assert_int_equal(nl, nl2);
  assert_true(nl < n / 4);
  float* before = malloc(nl * sizeof(float));
  memcpy(before, lp, nl * sizeof(float));
  nb_train_eval_t e0, e1;
  assert_int_equal(nb_trainer_eval(t, &e0), NB_OK);
  assert_int_equal(nb_trainer_steps(t, 15, NULL), NB_OK);
  assert_int_equal(g_hook_calls, 15);
  assert_int_equal(g_hook_n, nl);
  assert_memory_equal(nb_model_params(nb_trainer_model(t), NULL), p0, n * sizeof(float));
  assert_memory_not_equal(before, lp, nl * sizeof(float));
  assert_int_equal(nb_trainer_eval(t, &e1), NB_OK);
  assert_true(e1.mean_bpb < e0.mean_bpb);
  /* set_sync_params writes the buffer; a wrong size is refused */
  assert_int_equal(nb_trainer_set_sync_params(t, before, nl), NB_OK);
  assert_memory_equal(before, lp, nl * sizeof(float));
  assert_int_equal(nb_trainer_set_sync_params(t, before, nl - 1), NB_ERR_INVALID);
  free(before);
  nb_trainer_destroy(t);

  /* LoRA resume: stopped at 13, resumed to 20 == 20 in one go (adapters and base) */
  c.grad_hook = NULL;
  c.max_steps = 20;
  nb_trainer_t *a, *b;
  assert_int_equal(nb_trainer_create(&c, &a), NB_OK);
  assert_int_equal(nb_trainer_run(a, NULL), NB_OK);
  snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s/ck", dir);
  c.progress = stop_at_13;
  assert_int_equal(nb_trainer_create(&c, &b), NB_OK);
  assert_int_equal(nb_trainer_run(b, NULL), NB_ERR_CANCELLED);
  nb_trainer_destroy(b);
  c.progress = NULL;
  c.resume = 1;
  assert_int_equal(nb_trainer_create(&c, &b), NB_OK);
  assert_int_equal(nb_trainer_step(b), 13);
  assert_int_equal(nb_trainer_run(b, NULL), NB_OK);
  size_t n1, n2;
  float* l1 = nb_trainer_sync_params(a, &n1);
  float* l2 = nb_trainer_sync_params(b, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(l1, l2, n1 * sizeof(float));
  assert_memory_equal(nb_model_params(nb_trainer_model(b), NULL), p0, n * sizeof(float));
  nb_trainer_destroy(a);
  nb_trainer_destroy(b);

  /* distillation from the base as teacher: runs, finite loss, and differs from plain CE */
  tiny_config(&c);
  snprintf(c.init_checkpoint, sizeof c.init_checkpoint, "%s", base);
  snprintf(c.teacher_checkpoint, sizeof c.teacher_checkpoint, "%s", base);
  c.distill_alpha = 0.5f;
  double ld, lc;
  assert_int_equal(nb_trainer_create(&c, &a), NB_OK);
  assert_int_equal(nb_trainer_steps(a, 3, &ld), NB_OK);
  nb_trainer_destroy(a);
  c.teacher_checkpoint[0] = 0;
  assert_int_equal(nb_trainer_create(&c, &a), NB_OK);
  assert_int_equal(nb_trainer_steps(a, 3, &lc), NB_OK);
  nb_trainer_destroy(a);
  assert_true(isfinite(ld) && ld != lc);
  nb_model_destroy(m);
  rm_rf(dir);
}

/* Translation pairs: "source SEP target EOS", scored only on target and EOS; dev split held out. */
static void test_pairs_format(void** state) {
  (void)state;
  nb_train_config_t c;
  tiny_config(&c);
  c.model = nb_model_config_make(2, 32, 2, 160);
  c.data_kind = NB_TRAIN_DATA_PAIRS;
  c.n_sources = 1;
  snprintf(c.sources[0].label, sizeof c.sources[0].label, "en-de");
  snprintf(c.sources[0].path, sizeof c.sources[0].path, "%s/pairs/en-de.train.tsv", g_data);
  snprintf(c.sources[0].dev_path, sizeof c.sources[0].dev_path, "%s/pairs/en-de.dev.tsv", g_data);
  nb_trainer_t* t;
  assert_int_equal(nb_trainer_create(&c, &t), NB_OK);
  size_t hl;
  nb_trainer_heldout_text(t, 0, &hl);
  assert_true(hl > 500); /* the dev file */
  int T = 160, tok[4 * 160], tgt[4 * 160];
  nb_trainer_batch(t, 0, 0, tok, tgt);
  for (int r = 0; r < 4; r++) {
    int* k = tok + r * T;
    int* g = tgt + r * T;
    int sep = -1, eos = -1;
    for (int j = 0; j < T; j++) {
      if (k[j] == NB_TOKEN_SEP && sep < 0) sep = j;
      if (k[j] == NB_TOKEN_EOS && eos < 0) eos = j;
    }
    assert_true(sep > 0);
    assert_true(eos > sep + 1);
    for (int j = 0; j < sep; j++) assert_int_equal(g[j], -1); /* source not scored */
    for (int j = sep; j < eos; j++) assert_int_equal(g[j], k[j + 1]);
    assert_int_equal(g[eos - 1], NB_TOKEN_EOS);
    for (int j = eos; j < T; j++) assert_int_equal(g[j], -1);
    for (int j = 0; j < sep; j++) assert_true(k[j] != '\t');
  }
  nb_train_eval_t e;
  assert_int_equal(nb_trainer_eval(t, &e), NB_OK);
  assert_true(e.scored[0] > 100 && isfinite(e.bpb[0]));
  assert_int_equal(nb_trainer_steps(t, 2, NULL), NB_OK);
  nb_trainer_destroy(t);
  /* de-en: the same file read swapped */
  snprintf(c.sources[0].label, sizeof c.sources[0].label, "de-en");
  c.sources[0].swap = 1;
  assert_int_equal(nb_trainer_create(&c, &t), NB_OK);
  nb_trainer_destroy(t);
}

static void expect_config_error(nb_train_config_t* c, nb_status_t want, const char* needle) {
  nb_trainer_t* t = (nb_trainer_t*)0x1;
  nb_status_t st = nb_trainer_create(c, &t);
  if (st != want || !strstr(nb_error_last(), needle))
    fail_msg("want %s with \"%s\", got %s: %s", nb_status_name(want), needle, nb_status_name(st),
             nb_error_last());
}

static void test_bad_config(void** state) {
  (void)state;
  nb_train_config_t c;
  tiny_config(&c);
  c.batch_size = 0;
  expect_config_error(&c, NB_ERR_CONFIG, "batch_size");
  tiny_config(&c);
  c.seq_len = 33;
  expect_config_error(&c, NB_ERR_CONFIG, "seq_len");
  tiny_config(&c);
  c.model.n_head = 3;
  expect_config_error(&c, NB_ERR_CONFIG, "model");
  tiny_config(&c);
  c.n_sources = 0;
  expect_config_error(&c, NB_ERR_CONFIG, "n_sources");
  tiny_config(&c);
  snprintf(c.sources[1].label, sizeof c.sources[1].label, "en");
  expect_config_error(&c, NB_ERR_CONFIG, "repeats");
  tiny_config(&c);
  c.resume = 1;
  expect_config_error(&c, NB_ERR_CONFIG, "checkpoint_dir");
  tiny_config(&c);
  c.lora_enabled = 1;
  c.lora.sites = 0;
  expect_config_error(&c, NB_ERR_CONFIG, "lora sites");
  tiny_config(&c);
  c.slowdown = 0.5;
  expect_config_error(&c, NB_ERR_CONFIG, "slowdown");
  tiny_config(&c);
  c.optim.lr = -1;
  expect_config_error(&c, NB_ERR_CONFIG, "lr");
  tiny_config(&c);
  snprintf(c.sources[2].path, sizeof c.sources[2].path, "%s/mono/xx.txt", g_data);
  expect_config_error(&c, NB_ERR_IO, "xx.txt");
  tiny_config(&c); /* a mono file as pairs: no tab-separated lines */
  c.data_kind = NB_TRAIN_DATA_PAIRS;
  expect_config_error(&c, NB_ERR_INVALID, "pairs");
  tiny_config(&c);
  snprintf(c.init_checkpoint, sizeof c.init_checkpoint, "%s/mono/en.txt", g_data);
  expect_config_error(&c, NB_ERR_INVALID, "en.txt");
}

static int has_cyrillic(const char* s) {
  for (const unsigned char* p = (const unsigned char*)s; *p; p++)
    if ((p[0] == 0xD0 || p[0] == 0xD1) && (p[1] & 0xC0) == 0x80) return 1;
  return 0;
}

static void pair_source(nb_train_source_t* s, const char* label, const char* file, int swap) {
  snprintf(s->label, sizeof s->label, "%s", label);
  snprintf(s->path, sizeof s->path, "%s/pairs/%s.train.tsv", g_data, file);
  snprintf(s->dev_path, sizeof s->dev_path, "%s/pairs/%s.dev.tsv", g_data, file);
  s->swap = swap;
}

/* The target-language tag: every training row of a pair is "<2tgt>" source SEP ..., with tgt the
 * label's target (the swapped ru-en gets "<2en>"), and its prefix up to SEP is the decoding
 * prompt of train/translate for the same source, byte for byte. A label that is not "src-tgt"
 * is refused. */
static void test_pairs_tag_matches_prompt(void** state) {
  (void)state;
  nb_train_config_t c;
  tiny_config(&c);
  c.model = nb_model_config_make(2, 32, 2, 160);
  c.data_kind = NB_TRAIN_DATA_PAIRS;
  c.n_sources = 2;
  pair_source(&c.sources[0], "en-de", "en-de", 0);
  pair_source(&c.sources[1], "ru-en", "en-ru", 1);
  nb_trainer_t* t;
  assert_int_equal(nb_trainer_create(&c, &t), NB_OK);
  enum { B = 4, T = 160 };
  int tok[B * T], tgt[B * T], seen_de = 0, seen_en = 0;
  for (long step = 0; step < 4; step++) {
    nb_trainer_batch(t, step, 0, tok, tgt);
    for (int r = 0; r < B; r++) {
      const int* k = tok + r * T;
      const int* g = tgt + r * T;
      char tag[8] = {0}, src[T + 1] = {0}, lang[4] = {0};
      for (int j = 0; j < 5; j++) tag[j] = (char)k[j];
      int sep = 5;
      while (sep < T && k[sep] != NB_TOKEN_SEP) sep++;
      assert_true(sep < T && sep > 5);
      for (int j = 5; j < sep; j++) {
        assert_true(k[j] >= 0 && k[j] < 256);
        src[j - 5] = (char)k[j];
      }
      for (int j = 0; j < sep; j++) assert_int_equal(g[j], -1); /* tag, source: not scored */
      if (strcmp(tag, "<2de>") == 0) {
        snprintf(lang, sizeof lang, "de");
        seen_de++;
        assert_false(has_cyrillic(src)); /* English source */
      } else if (strcmp(tag, "<2en>") == 0) {
        snprintf(lang, sizeof lang, "en");
        seen_en++;
        assert_true(has_cyrillic(src)); /* ru-en: the Russian side is the source */
      } else {
        fail_msg("row %d does not start with a target tag: '%s'", r, tag);
      }
      int* prompt = NULL;
      int n = 0;
      assert_int_equal(nb_translate_prompt(&c.model, lang, src, &prompt, &n), NB_OK);
      assert_int_equal(n, sep + 1);
      assert_memory_equal(prompt, k, (size_t)n * sizeof(int));
      nb_free(prompt);
    }
  }
  assert_true(seen_de > 0 && seen_en > 0);
  nb_trainer_destroy(t);
  snprintf(c.sources[1].label, sizeof c.sources[1].label, "ruen");
  expect_config_error(&c, NB_ERR_INVALID, "src-tgt");
}

/* P(the first target byte is a Cyrillic lead byte, 0xD0 or 0xD1) after the prompt of `src` with
 * the tag of `lang`: the model's next-byte distribution at the separator. */
static double cyrillic_first_prob(nb_model_t* m, const char* lang, const char* src) {
  int* prompt = NULL;
  int n = 0;
  assert_int_equal(nb_translate_prompt(nb_model_get_config(m), lang, src, &prompt, &n), NB_OK);
  assert_int_equal(nb_model_forward(m, prompt, NULL, 1, n, NULL), NB_OK);
  int V = nb_model_get_config(m)->vocab;
  const float* z = nb_model_logits(m) + (size_t)(n - 1) * (size_t)V;
  double mx = z[0], sum = 0;
  for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
  for (int v = 0; v < V; v++) sum += exp((double)z[v] - mx);
  nb_free(prompt);
  return (exp((double)z[0xD0] - mx) + exp((double)z[0xD1] - mx)) / sum;
}

/* Two pairs sharing the English source side: with the tag, a tiny model trained for a few seconds
 * puts its first target byte in Cyrillic when asked for "<2ru>" and not when asked for "<2de>",
 * for the same English test sentences (without a tag the prompt would be identical and so would
 * the distribution). Asserted as a relation of probabilities averaged over the test sentences, with
 * a margin: the factor between the tags must exceed 4, while six OpenBLAS kernels (Prescott to
 * Cooperlake, each training its own trajectory) gave mean log ratios of 2.4-3.6 (factors 11-36)
 * and ratios of the means of 16-71;
 * what greedy decoding then writes depends on that rounding, so it is printed here and asserted
 * only in the `quality` run (NB_TEST_QUALITY=1, ctest label quality, not part of `make test`). */
static void test_pairs_tag_picks_language(void** state) {
  (void)state;
  nb_train_config_t c;
  tiny_config(&c);
  c.model = nb_model_config_make(2, 48, 2, 96);
  c.data_kind = NB_TRAIN_DATA_PAIRS;
  c.n_sources = 2;
  c.batch_size = 8;
  c.max_steps = NB__TAG_STEPS;
  c.optim.lr = 1e-2f;
  c.optim.warmup_steps = 10;
  pair_source(&c.sources[0], "en-de", "en-de", 0);
  pair_source(&c.sources[1], "en-ru", "en-ru", 0);
  nb_trainer_t* t;
  assert_int_equal(nb_trainer_create(&c, &t), NB_OK);
  assert_int_equal(nb_trainer_steps(t, NB__TAG_STEPS, NULL), NB_OK);
  nb_model_t* m = nb_trainer_model(t);
  const char* quality = getenv("NB_TEST_QUALITY");
  int check_text = quality && *quality && strcmp(quality, "0") != 0;
  int n = 0, text_ok = 0;
  double log_ratio = 0, p_ru_sum = 0, p_de_sum = 0;
  static const char* files[] = {"en-de", "en-ru"};
  for (int fi = 0; fi < 2; fi++) {
    char path[512];
    snprintf(path, sizeof path, "%s/pairs/%s.test.tsv", g_data, files[fi]);
    FILE* f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    while (fgets(line, sizeof line, f)) {
      char* tab = strchr(line, '\t');
      if (!tab) continue;
      *tab = '\0';
      double p_ru = cyrillic_first_prob(m, "ru", line), p_de = cyrillic_first_prob(m, "de", line);
      p_ru_sum += p_ru;
      p_de_sum += p_de;
      log_ratio += log((p_ru + 1e-12) / (p_de + 1e-12));
      char *de = NULL, *ru = NULL;
      assert_int_equal(nb_translate_greedy(m, "de", line, 12, &de), NB_OK);
      assert_int_equal(nb_translate_greedy(m, "ru", line, 12, &ru), NB_OK);
      print_message("%s\n  <2de> %s (P(cyrillic) %.4f)\n  <2ru> %s (P(cyrillic) %.4f)\n", line, de,
                    p_de, ru, p_ru);
      text_ok += !has_cyrillic(de) && has_cyrillic(ru);
      nb_free(de);
      nb_free(ru);
      n++;
    }
    fclose(f);
  }
  assert_true(n >= 8);
  log_ratio /= n;
  print_message(
      "%d sentences: mean P(cyrillic first) %.4f with <2ru>, %.4f with <2de>; mean log "
      "ratio %.2f (asserted > %.2f); greedy text right for %d\n",
      n, p_ru_sum / n, p_de_sum / n, log_ratio, log(4.0), text_ok);
  assert_true(log_ratio > log(4.0));
  assert_true(p_ru_sum > 4 * p_de_sum);
  if (check_text) assert_int_equal(text_ok, n);
  nb_trainer_destroy(t);
}

static char* slurp(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* `nebula train` end to end on a tiny descriptor: summary.json, curve.tsv; then `nebula eval`. */
static void test_cli_train_and_eval(void** state) {
  (void)state;
  char* dir = make_tmpdir();
  char cfg[128], cmd[2048], p[256];
  snprintf(cfg, sizeof cfg, "%s/job.json", dir);
  FILE* f = fopen(cfg, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"apiVersion\": \"nebula/v1\", \"kind\": \"TrainingJob\",\n"
          " \"metadata\": {\"name\": \"tiny\"},\n"
          " \"spec\": {\"clusters\": [{\"id\": \"dc-a\", \"data\": {\"dir\": \"%s\",\n"
          "   \"languages\": [\"en\", \"ru\", \"zh\"]}}],\n"
          "  \"model\": {\"layers\": 1, \"width\": 32, \"heads\": 2, \"context\": 32},\n"
          "  \"training\": {\"batchSize\": 4, \"maxSteps\": 1000, \"eval\": {\"everyRounds\": 1,"
          " \"batches\": 1}},\n"
          "  \"sync\": {\"innerSteps\": 5}, \"checkpoint\": {\"everyRounds\": 2, \"keep\": 1}}}\n",
          g_data);
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "NB_JOB_PROGRESS='%s/progress.jsonl' '%s' train '%s' --steps 20 --out '%s/out' --json "
           "> '%s/stdout' 2> '%s/stderr'",
           dir, g_nebula, cfg, dir, dir, dir);
  int rc = system(cmd);
  if (rc != 0) {
    snprintf(p, sizeof p, "%s/stderr", dir);
    fail_msg("nebula train failed (%d): %s", rc, slurp(p));
  }
  { /* --json: the progress lines on stderr, each with the step of the total and an ETA */
    snprintf(p, sizeof p, "%s/stderr", dir);
    char* err = slurp(p);
    assert_non_null(err);
    assert_non_null(strstr(err, "step      5/20  loss "));
    const char* last = strstr(err, "step     20/20  loss ");
    assert_non_null(last);
    const char* eta = strstr(last, "  eta ");
    assert_non_null(eta);
    assert_true(strncmp(eta, "  eta 0 s\n", 10) == 0); /* nothing left at the last step */
  }
  snprintf(p, sizeof p, "%s/out/summary.json", dir);
  json_error_t je;
  json_t* s = json_load_file(p, 0, &je);
  assert_non_null(s);
  assert_int_equal(json_integer_value(json_object_get(s, "steps")), 20);
  json_t* ev = json_object_get(s, "final_eval_bpb");
  assert_true(json_is_object(ev));
  assert_int_equal(json_object_size(ev), 3);
  double en = json_real_value(json_object_get(ev, "en"));
  assert_true(en > 0.5 && en < 8.0);
  assert_true(json_real_value(json_object_get(s, "tokens_per_s")) > 0);
  char real_data[PATH_MAX];
  assert_non_null(realpath(g_data, real_data));
  assert_string_equal(json_string_value(json_object_get(s, "data_dir")), real_data);
  json_decref(s);
  snprintf(p, sizeof p, "%s/stdout", dir);
  s = json_load_file(p, 0, &je); /* --json: the same summary on stdout */
  assert_non_null(s);
  json_decref(s);
  /* The gateway's progress contract: one JSON object per line, the last one at step 20. */
  snprintf(p, sizeof p, "%s/progress.jsonl", dir);
  FILE* pf = fopen(p, "r");
  assert_non_null(pf);
  char line[512];
  int n_progress = 0;
  long last_step = -1;
  while (fgets(line, sizeof line, pf)) {
    json_t* o = json_loads(line, 0, &je);
    assert_non_null(o);
    assert_int_equal(json_integer_value(json_object_get(o, "max_steps")), 20);
    last_step = (long)json_integer_value(json_object_get(o, "step"));
    json_decref(o);
    n_progress++;
  }
  fclose(pf);
  assert_true(n_progress >= 4);
  assert_int_equal(last_step, 20);

  snprintf(p, sizeof p, "%s/out/curve.tsv", dir);
  char* curve = slurp(p);
  assert_non_null(curve);
  assert_true(strncmp(curve, "step\tsamples\tseconds\ten\tru\tzh\tmean\n", 35) == 0);
  int lines = 0;
  for (char* q = curve; *q; q++) lines += *q == '\n';
  assert_int_equal(lines, 1 + 5); /* header; steps 0, 5, 10, 15, 20 */
  assert_non_null(strstr(curve, "\n20\t80\t"));
  snprintf(p, sizeof p, "%s/out/checkpoints/LATEST", dir);
  assert_string_equal(slurp(p), "step-20\n");

  snprintf(
      cmd, sizeof cmd,
      "'%s' eval '%s/out/final.safetensors' --data-dir '%s' --langs en,de --batches 1 --batch 4 "
      "--json > '%s/eval.json' 2> '%s/stderr'",
      g_nebula, dir, g_data, dir, dir);
  rc = system(cmd);
  if (rc != 0) {
    snprintf(p, sizeof p, "%s/stderr", dir);
    fail_msg("nebula eval failed (%d): %s", rc, slurp(p));
  }
  snprintf(p, sizeof p, "%s/eval.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  assert_int_equal(json_integer_value(json_object_get(s, "step")), 20);
  json_t* b = json_object_get(s, "bits_per_byte");
  assert_true(json_real_value(json_object_get(b, "de")) > 0.5);
  json_decref(s);

  /* `nebula report` of a train --out folder: its report in out/report/, the run's own
   * summary.json left as it is */
  snprintf(cmd, sizeof cmd, "'%s' report '%s/out' > '%s/stdout' 2> '%s/stderr'", g_nebula, dir, dir,
           dir);
  rc = system(cmd);
  if (rc != 0) {
    snprintf(p, sizeof p, "%s/stderr", dir);
    fail_msg("nebula report of a train folder failed (%d): %s", rc, slurp(p));
  }
  snprintf(p, sizeof p, "%s/out/report/report.html", dir);
  char* html = slurp(p);
  assert_non_null(html);
  assert_non_null(strstr(html, "<svg"));
  assert_non_null(strstr(html, "dc-a"));
  snprintf(p, sizeof p, "%s/out/report/summary.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  json_decref(s);
  snprintf(p, sizeof p, "%s/out/summary.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  assert_int_equal(json_integer_value(json_object_get(s, "steps")), 20); /* still train's */
  json_decref(s);

  /* without --data-dir, from a folder with no data/ of its own: the data the run trained on,
   * as its summary.json records it, not data/quick of the current folder */
  snprintf(cmd, sizeof cmd,
           "cd '%s/out' && '%s' eval final.safetensors --langs en --batches 1 --batch 4 --json "
           "> '%s/eval.json' 2> '%s/stderr'",
           dir, g_nebula, dir, dir);
  rc = system(cmd);
  if (rc != 0) {
    snprintf(p, sizeof p, "%s/stderr", dir);
    fail_msg("nebula eval without --data-dir failed (%d): %s", rc, slurp(p));
  }
  snprintf(p, sizeof p, "%s/eval.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  assert_string_equal(json_string_value(json_object_get(s, "data_dir")), real_data);
  assert_true(json_real_value(json_object_get(json_object_get(s, "bits_per_byte"), "en")) > 0.5);
  json_decref(s);
  /* a checkpoint of the run's checkpoints/ folder finds it too */
  snprintf(cmd, sizeof cmd,
           "cd '%s' && '%s' eval out/checkpoints/step-20/model.safetensors --langs en --batches 1 "
           "--batch 4 > /dev/null 2> '%s/stderr'",
           dir, g_nebula, dir);
  rc = system(cmd);
  if (rc != 0) {
    snprintf(p, sizeof p, "%s/stderr", dir);
    fail_msg("nebula eval of a step checkpoint without --data-dir failed (%d): %s", rc, slurp(p));
  }

  /* translation of the test split: greedy decoding scored with chrF and BLEU */
  snprintf(cmd, sizeof cmd,
           "'%s' eval '%s/out/final.safetensors' --data-dir '%s' --pairs en-de --translate 3 "
           "--batches 1 --batch 4 --json > '%s/eval.json' 2> '%s/stderr'",
           g_nebula, dir, g_data, dir, dir);
  rc = system(cmd);
  if (rc != 0) {
    snprintf(p, sizeof p, "%s/stderr", dir);
    fail_msg("nebula eval --translate failed (%d): %s", rc, slurp(p));
  }
  snprintf(p, sizeof p, "%s/eval.json", dir);
  s = json_load_file(p, 0, &je);
  assert_non_null(s);
  json_t* tr = json_object_get(json_object_get(s, "translation"), "en-de");
  assert_non_null(tr);
  assert_int_equal(json_integer_value(json_object_get(tr, "sentences")), 3);
  double chrf = json_real_value(json_object_get(tr, "chrf"));
  double bleu = json_real_value(json_object_get(tr, "bleu"));
  assert_true(chrf >= 0 && chrf <= 100 && bleu >= 0 && bleu <= 100);
  json_decref(s);
  /* --translate without --pairs is a usage error */
  snprintf(cmd, sizeof cmd, "'%s' eval '%s/out/final.safetensors' --translate 3 2> /dev/null",
           g_nebula, dir);
  assert_int_equal(WEXITSTATUS(system(cmd)), 2);

  /* a bad descriptor and a bad option fail with the right status */
  snprintf(cmd, sizeof cmd, "'%s' train '%s/stdout' 2> /dev/null", g_nebula, dir);
  assert_int_equal(WEXITSTATUS(system(cmd)), 1);
  snprintf(cmd, sizeof cmd, "'%s' train '%s' --steps 0 2> /dev/null", g_nebula, cfg);
  assert_int_equal(WEXITSTATUS(system(cmd)), 2);
  rm_rf(dir);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s DATA_DIR NEBULA [TEST_NAME]\n", argv[0]);
    return 1;
  }
  g_data = argv[1];
  g_nebula = argv[2];
  if (argc > 3) cmocka_set_test_filter(argv[3]); /* one test by name (the quality run) */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_falls_and_eval_per_language),
      cmocka_unit_test(test_heldout_never_trained_on),
      cmocka_unit_test(test_checkpoint_resume_bit_exact),
      cmocka_unit_test(test_lora_trains_only_adapters),
      cmocka_unit_test(test_pairs_format),
      cmocka_unit_test(test_pairs_tag_matches_prompt),
      cmocka_unit_test(test_pairs_tag_picks_language),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_cli_train_and_eval),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
