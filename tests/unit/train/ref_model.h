/* Double-precision reference of the whole transformer (and its LoRA and distillation variants),
 * reading parameters through the model's tensor table: the oracle of the model gradient checks.
 * Tests only; naive loops. */
#ifndef NB_TESTS_REF_MODEL_H
#define NB_TESTS_REF_MODEL_H

#include <stdlib.h>

#include "tests/unit/ops/nb_ref.h"
#include "train/lora.h"
#include "train/model.h"

typedef struct {
  const nb_model_t* m;
  double* p; /* copy of the parameter arena, same layout */
  const int* tok;
  const int* tgt;
  int B, T;
  /* distillation (alpha 0 = plain cross-entropy) */
  double alpha, temp;
  const double* teacher; /* (B, T, V) */
  /* LoRA (NULL = none) */
  const nb_lora_t* lora;
  double* lp; /* copy of the adapter arena */
  double lscale;
} ref_model_t;

static const double* ref_t(const ref_model_t* r, const char* fmt, int l) {
  char name[64];
  snprintf(name, sizeof name, fmt, l);
  const nb_tensor_view_t* v = nb_model_find_tensor(r->m, name);
  if (!v) {
    fprintf(stderr, "ref model: no tensor %s\n", name);
    abort();
  }
  return r->p + v->offset;
}

/* out (N, OC) += lscale * (inp A^T) B^T for the adapter named prefix, if present. */
static void ref_lora(const ref_model_t* r, int l, const char* site, const double* inp, double* out,
                     int N) {
  if (!r->lora) return;
  char an[64], bn[64];
  snprintf(an, sizeof an, "h.%d.%s.lora_A", l, site);
  snprintf(bn, sizeof bn, "h.%d.%s.lora_B", l, site);
  const nb_tensor_view_t *va = NULL, *vb = NULL;
  for (size_t i = 0; i < nb_lora_num_tensors(r->lora); i++) {
    const nb_tensor_view_t* v = nb_lora_tensor(r->lora, i);
    if (strcmp(v->name, an) == 0) va = v;
    if (strcmp(v->name, bn) == 0) vb = v;
  }
  if (!va || !vb) return;
  int rk = va->shape[0], IC = va->shape[1], OC = vb->shape[0];
  double* u = malloc(sizeof(double) * N * rk);
  double* o = malloc(sizeof(double) * N * OC);
  ref_matmul(u, inp, r->lp + va->offset, NULL, N, IC, rk);
  ref_matmul(o, u, r->lp + vb->offset, NULL, N, rk, OC);
  for (int i = 0; i < N * OC; i++) out[i] += r->lscale * o[i];
  free(u);
  free(o);
}

static double ref_model_loss(void* ctx) {
  const ref_model_t* r = ctx;
  const nb_model_config_t* c = nb_model_get_config(r->m);
  int B = r->B, T = r->T, C = c->n_embd, V = c->vocab, N = B * T;
  double* x = malloc(sizeof(double) * N * C);
  double* h = malloc(sizeof(double) * N * C);
  double* qkv = malloc(sizeof(double) * N * 3 * C);
  double* y = malloc(sizeof(double) * N * C);
  double* f = malloc(sizeof(double) * N * 4 * C);
  double* g = malloc(sizeof(double) * N * 4 * C);
  double* logits = calloc((size_t)N * V, sizeof(double)); /* zeroed: -O3 can't see it filled */
  ref_embedding(x, r->tok, ref_t(r, "wte", 0), ref_t(r, "wpe", 0), B, T, C);
  for (int l = 0; l < c->n_layer; l++) {
    ref_layernorm(h, x, ref_t(r, "h.%d.ln_1.weight", l), ref_t(r, "h.%d.ln_1.bias", l), N, C);
    ref_matmul(qkv, h, ref_t(r, "h.%d.attn.c_attn.weight", l), ref_t(r, "h.%d.attn.c_attn.bias", l),
               N, C, 3 * C);
    ref_lora(r, l, "attn.c_attn", h, qkv, N);
    ref_attention(y, qkv, B, T, C, c->n_head);
    ref_matmul(h, y, ref_t(r, "h.%d.attn.c_proj.weight", l), ref_t(r, "h.%d.attn.c_proj.bias", l),
               N, C, C);
    ref_lora(r, l, "attn.c_proj", y, h, N);
    for (int i = 0; i < N * C; i++) x[i] += h[i];
    ref_layernorm(h, x, ref_t(r, "h.%d.ln_2.weight", l), ref_t(r, "h.%d.ln_2.bias", l), N, C);
    ref_matmul(f, h, ref_t(r, "h.%d.mlp.c_fc.weight", l), ref_t(r, "h.%d.mlp.c_fc.bias", l), N, C,
               4 * C);
    ref_lora(r, l, "mlp.c_fc", h, f, N);
    ref_gelu(g, f, (size_t)N * 4 * C);
    ref_matmul(h, g, ref_t(r, "h.%d.mlp.c_proj.weight", l), ref_t(r, "h.%d.mlp.c_proj.bias", l), N,
               4 * C, C);
    ref_lora(r, l, "mlp.c_proj", g, h, N);
    for (int i = 0; i < N * C; i++) x[i] += h[i];
  }
  ref_layernorm(h, x, ref_t(r, "ln_f.weight", 0), ref_t(r, "ln_f.bias", 0), N, C);
  ref_matmul(logits, h, ref_t(r, "wte", 0), NULL, N, C, V);
  double loss = ref_crossentropy(logits, r->tgt, N, V);
  if (r->alpha > 0) {
    int count = 0;
    for (int i = 0; i < N; i++) count += r->tgt[i] >= 0;
    loss = (1 - r->alpha) * loss +
           r->alpha * ref_kl(logits, r->teacher, r->tgt, N, V, r->temp) / count;
  }
  free(x), free(h), free(qkv), free(y), free(f), free(g), free(logits);
  return loss;
}

#endif
