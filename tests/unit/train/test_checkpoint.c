/* Checkpoint tests: bit-exact round trip (model and LoRA adapters), atomic replacement, and a
 * corpus of corrupted files (truncated, bad header length, bad JSON, bad dtype, bad shape,
 * offsets out of bounds / overlapping / leaving gaps, checksum missing or wrong, tensor set or
 * config not matching the model), each rejected with a message naming the problem. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "train/lora.h"
#include "train/model.h"

static char dir[256];

static char* path_in(const char* name) {
  static char p[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

static uint8_t* slurp(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t* b = malloc(*len + 1);
  assert_int_equal(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

static nb_model_t* small_model(uint64_t seed) {
  nb_model_config_t cfg = nb_model_config_make(2, 16, 2, 12);
  nb_model_t* m;
  assert_int_equal(nb_model_create(&cfg, seed, &m), NB_OK);
  return m;
}

static void test_round_trip(void** state) {
  nb_model_t* m = small_model(3);
  size_t n;
  float* p = nb_model_params(m, &n);
  p[0] = -0.0f; /* odd bit patterns survive */
  p[1] = 1e-40f;
  assert_int_equal(nb_checkpoint_save(path_in("a.safetensors"), m, 17), NB_OK);
  /* overwrite in place: the rename replaces the file and leaves no temporary behind */
  assert_int_equal(nb_checkpoint_save(path_in("a.safetensors"), m, 18), NB_OK);
  DIR* d = opendir(dir);
  struct dirent* e;
  int files = 0;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') files++;
  closedir(d);
  assert_int_equal(files, 1);

  nb_model_t* r;
  long step = 0;
  assert_int_equal(nb_checkpoint_load(path_in("a.safetensors"), &r, &step), NB_OK);
  assert_int_equal(step, 18);
  assert_memory_equal(nb_model_get_config(r), nb_model_get_config(m), sizeof(nb_model_config_t));
  assert_int_equal(nb_model_num_params(r), n);
  assert_memory_equal(nb_model_params(r, NULL), p, n * sizeof(float));

  nb_model_t* other = small_model(4);
  assert_memory_not_equal(nb_model_params(other, NULL), p, n * sizeof(float));
  assert_int_equal(nb_checkpoint_load_into(path_in("a.safetensors"), other, NULL), NB_OK);
  assert_memory_equal(nb_model_params(other, NULL), p, n * sizeof(float));

  /* metadata */
  nb_ckpt_t* c;
  assert_int_equal(nb_checkpoint_open(path_in("a.safetensors"), &c), NB_OK);
  assert_string_equal(nb_checkpoint_meta(c, "format"), "nebula-ckpt-1");
  assert_string_equal(nb_checkpoint_meta(c, "n_embd"), "16");
  assert_int_equal(strlen(nb_checkpoint_meta(c, "sha256")), 64);
  assert_int_equal(nb_checkpoint_num_tensors(c), nb_model_num_tensors(m));
  nb_checkpoint_close(c);

  /* optimizer state */
  nb_adamw_config_t oc = nb_adamw_config_default();
  nb_adamw_t *o1, *o2;
  assert_int_equal(nb_adamw_create(&oc, n, &o1), NB_OK);
  assert_int_equal(nb_adamw_create(&oc, n, &o2), NB_OK);
  float* g = nb_model_grads(m, NULL);
  for (size_t i = 0; i < n; i++) g[i] = (float)((i % 7) - 3) * 0.01f;
  for (int s = 0; s < 3; s++) assert_int_equal(nb_adamw_step(o1, p, g, NULL, NULL), NB_OK);
  assert_int_equal(nb_checkpoint_save_optim(path_in("o.safetensors"), m, o1), NB_OK);
  assert_int_equal(nb_checkpoint_load_optim_into(path_in("o.safetensors"), m, o2), NB_OK);
  assert_int_equal(nb_adamw_steps(o2), 3);
  assert_memory_equal(nb_adamw_state(o1, NULL), nb_adamw_state(o2, NULL), 2 * n * sizeof(float));
  assert_int_equal(nb_checkpoint_load_optim_into(path_in("a.safetensors"), m, o2), NB_ERR_INVALID);
  nb_adamw_destroy(o1);
  nb_adamw_destroy(o2);
  unlink(path_in("o.safetensors"));

  /* LoRA adapters */
  nb_lora_config_t lc = {2, 4.0f, 1u << NB_SITE_QKV};
  nb_lora_t *l1, *l2;
  assert_int_equal(nb_lora_create(m, &lc, 9, &l1), NB_OK);
  size_t ln;
  float* lp = nb_lora_params(l1, &ln);
  for (size_t i = 0; i < ln; i++) lp[i] = (float)i * 0.25f - 3.0f;
  assert_int_equal(nb_checkpoint_save_lora(path_in("l.safetensors"), l1, 5), NB_OK);
  assert_int_equal(nb_lora_create(r, &lc, 10, &l2), NB_OK);
  assert_int_equal(nb_checkpoint_load_lora_into(path_in("l.safetensors"), l2, &step), NB_OK);
  assert_int_equal(step, 5);
  assert_memory_equal(nb_lora_params(l2, NULL), lp, ln * sizeof(float));
  /* adapters of another configuration are refused */
  nb_lora_destroy(l2);
  nb_lora_config_t lc2 = {2, 8.0f, 1u << NB_SITE_QKV};
  assert_int_equal(nb_lora_create(r, &lc2, 10, &l2), NB_OK);
  assert_int_equal(nb_checkpoint_load_lora_into(path_in("l.safetensors"), l2, &step),
                   NB_ERR_INVALID);
  printf("  %s\n", nb_error_last());
  /* a model checkpoint is not an adapter checkpoint */
  assert_int_equal(nb_checkpoint_load_lora_into(path_in("a.safetensors"), l2, NULL),
                   NB_ERR_INVALID);
  printf("  %s\n", nb_error_last());
  nb_lora_destroy(l1);
  nb_lora_destroy(l2);
  unlink(path_in("l.safetensors"));
  nb_model_destroy(other);
  nb_model_destroy(r);
  nb_model_destroy(m);
}

/* ---- corrupted corpus ---- */

static uint8_t* good;
static size_t good_len;
static uint64_t good_hl;

/* Rebuilds a file from a JSON header (re-encoded) and the good data section. */
static void write_with_header(const char* name, json_t* hdr, size_t data_len) {
  char* text = json_dumps(hdr, JSON_COMPACT);
  size_t tl = strlen(text);
  FILE* f = fopen(path_in(name), "wb");
  uint8_t lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (uint8_t)((uint64_t)tl >> (8 * i));
  fwrite(lb, 1, 8, f);
  fwrite(text, 1, tl, f);
  fwrite(good + 8 + good_hl, 1, data_len, f);
  fclose(f);
  free(text);
}

static json_t* good_header(void) {
  json_error_t e;
  json_t* h = json_loadb((const char*)good + 8, good_hl, 0, &e);
  assert_non_null(h);
  return h;
}

static void write_bytes(const char* name, const uint8_t* b, size_t n) {
  FILE* f = fopen(path_in(name), "wb");
  fwrite(b, 1, n, f);
  fclose(f);
}

static void expect_reject(const char* name, nb_status_t want, const char* needle) {
  nb_model_t* m = small_model(1);
  float* before = malloc(nb_model_num_params(m) * sizeof(float));
  memcpy(before, nb_model_params(m, NULL), nb_model_num_params(m) * sizeof(float));
  nb_status_t st = nb_checkpoint_load_into(path_in(name), m, NULL);
  const char* msg = nb_error_last();
  printf("  %-22s -> %s: %s\n", name, nb_status_name(st), msg);
  assert_int_equal(st, want);
  assert_non_null(strstr(msg, needle));
  assert_memory_equal(before, nb_model_params(m, NULL), nb_model_num_params(m) * sizeof(float));
  free(before);
  nb_model_destroy(m);
  unlink(path_in(name));
}

static void test_corrupt_corpus(void** state) {
  nb_model_t* m = small_model(1);
  assert_int_equal(nb_checkpoint_save(path_in("good.safetensors"), m, 1), NB_OK);
  good = slurp(path_in("good.safetensors"), &good_len);
  good_hl = 0;
  for (int i = 0; i < 8; i++) good_hl |= (uint64_t)good[i] << (8 * i);
  size_t data_len = good_len - 8 - good_hl;
  uint8_t* b = malloc(good_len + 64);

  /* truncated */
  write_bytes("trunc4", good, 4);
  expect_reject("trunc4", NB_ERR_INVALID, "truncated");
  write_bytes("trunc_header", good, 8 + good_hl / 2);
  expect_reject("trunc_header", NB_ERR_INVALID, "header length");
  write_bytes("trunc_data", good, good_len - 1);
  expect_reject("trunc_data", NB_ERR_INVALID, "out of bounds");
  write_bytes("empty", good, 0);
  expect_reject("empty", NB_ERR_INVALID, "truncated");

  /* header length */
  memcpy(b, good, good_len);
  b[7] = 0x7f;
  write_bytes("hl_huge", b, good_len);
  expect_reject("hl_huge", NB_ERR_INVALID, "header length");
  memset(b, 0, 8);
  write_bytes("hl_zero", b, good_len);
  expect_reject("hl_zero", NB_ERR_INVALID, "header length");

  /* bad JSON */
  memcpy(b, good, good_len);
  b[8 + good_hl / 2] = '\x01';
  write_bytes("json_garbage", b, good_len);
  expect_reject("json_garbage", NB_ERR_INVALID, "not valid JSON");
  memcpy(b, good, good_len);
  b[8] = '[';
  write_bytes("json_bracket", b, good_len);
  expect_reject("json_bracket", NB_ERR_INVALID, "JSON");

  json_t* h;
  /* not an object */
  h = json_array();
  write_with_header("json_array", h, data_len);
  json_decref(h);
  expect_reject("json_array", NB_ERR_INVALID, "not an object");

  /* bad dtype */
  h = good_header();
  json_object_set_new(json_object_get(h, "wpe"), "dtype", json_string("F16"));
  write_with_header("dtype_f16", h, data_len);
  json_decref(h);
  expect_reject("dtype_f16", NB_ERR_INVALID, "dtype 'F16'");
  h = good_header();
  json_object_set_new(json_object_get(h, "wpe"), "dtype", json_integer(3));
  write_with_header("dtype_int", h, data_len);
  json_decref(h);
  expect_reject("dtype_int", NB_ERR_INVALID, "dtype");

  /* shape inconsistent with the byte span */
  h = good_header();
  json_array_set_new(json_object_get(json_object_get(h, "wpe"), "shape"), 0, json_integer(13));
  write_with_header("shape_span", h, data_len);
  json_decref(h);
  expect_reject("shape_span", NB_ERR_INVALID, "span");
  h = good_header();
  json_array_set_new(json_object_get(json_object_get(h, "wpe"), "shape"), 0, json_integer(-12));
  write_with_header("shape_negative", h, data_len);
  json_decref(h);
  expect_reject("shape_negative", NB_ERR_INVALID, "non-negative");

  /* shape consistent on disk but not what the model has: swap two same-size tensors' shapes */
  h = good_header();
  json_t* e = json_object_get(h, "h.0.attn.c_proj.weight"); /* (16, 16) */
  json_t* sh = json_array();
  json_array_append_new(sh, json_integer(256));
  json_object_set_new(e, "shape", sh);
  write_with_header("shape_model", h, data_len);
  json_decref(h);
  expect_reject("shape_model", NB_ERR_INVALID, "shape mismatch");

  /* offsets */
  h = good_header();
  json_t* off = json_object_get(json_object_get(h, "ln_f.bias"), "data_offsets");
  json_int_t b0 = json_integer_value(json_array_get(off, 0));
  json_array_set_new(off, 0, json_integer(b0 + 4096));
  json_array_set_new(off, 1, json_integer(b0 + 4096 + 64));
  write_with_header("offsets_oob", h, data_len);
  json_decref(h);
  expect_reject("offsets_oob", NB_ERR_INVALID, "out of bounds");
  h = good_header();
  off = json_object_get(json_object_get(h, "ln_f.bias"), "data_offsets");
  json_array_set_new(off, 0, json_integer(0));
  json_array_set_new(off, 1, json_integer(64));
  write_with_header("offsets_overlap", h, data_len);
  json_decref(h);
  expect_reject("offsets_overlap", NB_ERR_INVALID, "overlaps");
  h = good_header();
  off = json_object_get(json_object_get(h, "ln_f.bias"), "data_offsets");
  json_array_set_new(off, 0, json_integer(3));
  write_with_header("offsets_backwards", h, data_len);
  json_decref(h);
  expect_reject("offsets_backwards", NB_ERR_INVALID, "data_offsets");
  h = good_header();
  json_object_set_new(json_object_get(h, "wpe"), "data_offsets", json_string("0-10"));
  write_with_header("offsets_type", h, data_len);
  json_decref(h);
  expect_reject("offsets_type", NB_ERR_INVALID, "data_offsets");
  h = good_header();
  json_object_del(h, "ln_f.bias"); /* its bytes become a gap at the end */
  write_with_header("tensor_missing", h, data_len);
  json_decref(h);
  expect_reject("tensor_missing", NB_ERR_INVALID, "cover");

  /* checksum */
  memcpy(b, good, good_len);
  b[good_len - 3] ^= 0x10;
  write_bytes("checksum_flip", b, good_len);
  expect_reject("checksum_flip", NB_ERR_INTEGRITY, "checksum mismatch");
  h = good_header();
  json_object_del(json_object_get(h, "__metadata__"), "sha256");
  write_with_header("checksum_missing", h, data_len);
  json_decref(h);
  expect_reject("checksum_missing", NB_ERR_INTEGRITY, "sha256");
  h = good_header();
  json_object_set_new(json_object_get(h, "__metadata__"), "step", json_integer(3));
  write_with_header("meta_not_string", h, data_len);
  json_decref(h);
  expect_reject("meta_not_string", NB_ERR_INVALID, "not a string");

  /* valid files that do not fit the model */
  nb_model_config_t cfg = nb_model_config_make(1, 16, 2, 12);
  nb_model_t* m1;
  assert_int_equal(nb_model_create(&cfg, 1, &m1), NB_OK);
  assert_int_equal(nb_checkpoint_save(path_in("other_config"), m1, 1), NB_OK);
  expect_reject("other_config", NB_ERR_INVALID, "differs from the model");
  nb_model_destroy(m1);
  {
    size_t nv = nb_model_num_tensors(m);
    nb_ckpt_tensor_t* t = calloc(nv, sizeof *t);
    for (size_t i = 0; i < nv; i++) {
      const nb_tensor_view_t* v = nb_model_tensor(m, i);
      t[i].name = v->name;
      t[i].ndim = v->ndim;
      t[i].shape[0] = v->shape[0];
      t[i].shape[1] = v->shape[1];
      t[i].data = nb_model_params(m, NULL) + v->offset;
    }
    const char* meta[] = {"n_layer", "2",  "n_embd", "16",  "n_head", "2",
                          "ctx",     "12", "vocab",  "259", "step",   "1"};
    t[nv - 1].name = "ln_f.bogus";
    assert_int_equal(nb_checkpoint_write(path_in("unexpected"), t, nv, meta, 6), NB_OK);
    expect_reject("unexpected", NB_ERR_INVALID, "unexpected tensor ln_f.bogus");
    assert_int_equal(nb_checkpoint_write(path_in("missing"), t, nv - 1, meta, 6), NB_OK);
    expect_reject("missing", NB_ERR_INVALID, "missing tensor ln_f.bias");
    t[3].shape[0] = 8; /* h.0.ln_1.bias (16) written as (8, 2): consistent bytes, wrong shape */
    t[3].ndim = 2;
    t[3].shape[1] = 2;
    t[nv - 1].name = "ln_f.bias";
    assert_int_equal(nb_checkpoint_write(path_in("reshaped"), t, nv, meta, 6), NB_OK);
    expect_reject("reshaped", NB_ERR_INVALID, "shape mismatch for h.0.ln_1.bias");
    t[3].name = "bad\xff"; /* so are names that are not UTF-8 */
    assert_int_equal(nb_checkpoint_write(path_in("utf8"), t, nv, meta, 6), NB_ERR_INVALID);
    t[3].name = t[4].name; /* and duplicate names */
    assert_int_equal(nb_checkpoint_write(path_in("dup"), t, nv, meta, 6), NB_ERR_INVALID);
    free(t);
  }
  /* non-finite values, correctly checksummed: NaN, +Inf and -Inf each refused naming the tensor */
  {
    float* w = nb_model_params(m, NULL);
    const nb_tensor_view_t* wpe = NULL;
    const nb_tensor_view_t* lnb = NULL;
    for (size_t i = 0; i < nb_model_num_tensors(m); i++) {
      if (!strcmp(nb_model_tensor(m, i)->name, "wpe")) wpe = nb_model_tensor(m, i);
      if (!strcmp(nb_model_tensor(m, i)->name, "ln_f.bias")) lnb = nb_model_tensor(m, i);
    }
    assert_non_null(wpe);
    assert_non_null(lnb);
    float keep = w[wpe->offset + 5];
    w[wpe->offset + 5] = NAN;
    assert_int_equal(nb_checkpoint_save(path_in("nan_wpe"), m, 1), NB_OK);
    w[wpe->offset + 5] = keep;
    expect_reject("nan_wpe", NB_ERR_INVALID,
                  "tensor wpe holds a non-finite value (NaN or infinity) at element 5");
    keep = w[lnb->offset + lnb->numel - 1];
    w[lnb->offset + lnb->numel - 1] = INFINITY;
    assert_int_equal(nb_checkpoint_save(path_in("inf_ln_f"), m, 1), NB_OK);
    w[lnb->offset + lnb->numel - 1] = -INFINITY;
    assert_int_equal(nb_checkpoint_save(path_in("ninf_ln_f"), m, 1), NB_OK);
    w[lnb->offset + lnb->numel - 1] = keep;
    expect_reject("inf_ln_f", NB_ERR_INVALID, "tensor ln_f.bias holds a non-finite value");
    expect_reject("ninf_ln_f", NB_ERR_INVALID, "tensor ln_f.bias holds a non-finite value");
    /* a hostile tensor name is not echoed as it is (no terminal control bytes) */
    float bad[2] = {1.0f, NAN};
    nb_ckpt_tensor_t t = {.name = "x\x1b[2J\ty", .ndim = 1, .shape = {2}, .data = bad};
    const char* meta[] = {"step", "1"};
    assert_int_equal(nb_checkpoint_write(path_in("nan_name"), &t, 1, meta, 1), NB_OK);
    size_t n = 0;
    uint8_t* img = slurp(path_in("nan_name"), &n);
    nb_ckpt_t* c = NULL;
    assert_int_equal(nb_checkpoint_parse(img, n, "nan_name", &c), NB_ERR_INVALID);
    assert_null(c);
    printf("  %-22s -> %s\n", "nan_name", nb_error_last());
    assert_non_null(strstr(nb_error_last(), "tensor x??2J?y holds a non-finite value"));
    assert_null(strchr(nb_error_last(), '\x1b'));
    free(img);
    unlink(path_in("nan_name"));
    /* and the model it was loaded into is untouched (expect_reject checked), the good file loads */
    assert_int_equal(nb_checkpoint_load_into(path_in("good.safetensors"), m, NULL), NB_OK);
  }
  /* not there at all */
  assert_int_equal(nb_checkpoint_load_into(path_in("absent"), m, NULL), NB_ERR_IO);

  free(b);
  free(good);
  unlink(path_in("good.safetensors"));
  nb_model_destroy(m);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/nb_ckpt_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_corrupt_corpus),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(path_in("a.safetensors"));
  rmdir(dir);
  return rc;
}
