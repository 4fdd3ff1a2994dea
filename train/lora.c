/* LoRA adapters: one parameter arena and one gradient arena for every A and B, hooked into the
 * model's linear projections through model_internal.h. The adapter path costs two thin sgemms
 * each way; the (N, r) intermediate x A^T is kept for the backward. */
#include "train/lora.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "train/model_internal.h"
#include "train/rng.h"

typedef struct {
  int layer, site, OC, IC;
  size_t a_view, b_view; /* indices into views */
  float* u;              /* (N, r) = inp A^T, for the backward */
} nb__adapter_t;

struct nb_lora {
  nb_lora_config_t cfg;
  nb_model_t* model;
  int attached;
  float scale;
  size_t n;
  float* params;
  float* grads;
  nb_tensor_view_t* views;
  size_t n_views;
  nb__adapter_t* ad;
  int n_ad;
  nb__adapter_t** by_site; /* [layer * NB_SITE_COUNT + site] or NULL */
  float* u_arena;
  float* du; /* (N, r) scratch */
  size_t cap_N;
};

static const char* const nb__site_names[NB_SITE_COUNT] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                          "mlp.c_proj"};

nb_status_t nb_lora_create(nb_model_t* m, const nb_lora_config_t* cfg, uint64_t seed,
                           nb_lora_t** out) {
  *out = NULL;
  if (!m || !cfg) return nb_error(NB_ERR_INVALID, "lora: NULL model or config");
  if (cfg->rank < 1 || cfg->rank > 4096)
    return nb_error(NB_ERR_INVALID, "lora: rank %d not in [1, 4096]", cfg->rank);
  if (cfg->sites == 0 || (cfg->sites >> NB_SITE_COUNT) != 0)
    return nb_error(NB_ERR_INVALID, "lora: site mask 0x%x selects no valid projection", cfg->sites);
  if (!(cfg->alpha > 0.0f)) return nb_error(NB_ERR_INVALID, "lora: alpha must be > 0");
  if (nb_model_is_sharded(m))
    return nb_error(NB_ERR_UNSUPPORTED,
                    "lora: adapters on a tensor-parallel shard or pipeline stage are not supported "
                    "yet");
  nb_status_t st = NB_OK;
  nb_lora_t* l = NULL;
  NB_CHECK(nb_calloc((void**)&l, 1, sizeof *l, "lora"));
  l->cfg = *cfg;
  l->model = m;
  l->scale = cfg->alpha / (float)cfg->rank;
  int L = nb_model_get_config(m)->n_layer, r = cfg->rank;
  int per = __builtin_popcount(cfg->sites);
  l->n_ad = L * per;
  NB_CHECK_GOTO(nb_calloc((void**)&l->ad, (size_t)l->n_ad, sizeof *l->ad, "lora adapters"), st,
                fail);
  NB_CHECK_GOTO(nb_calloc((void**)&l->views, 2 * (size_t)l->n_ad, sizeof *l->views, "lora views"),
                st, fail);
  NB_CHECK_GOTO(nb_calloc((void**)&l->by_site, (size_t)L * NB_SITE_COUNT, sizeof *l->by_site,
                          "lora site table"),
                st, fail);
  int k = 0;
  for (int layer = 0; layer < L; layer++)
    for (int s = 0; s < NB_SITE_COUNT; s++) {
      if (!(cfg->sites & (1u << s))) continue;
      nb__adapter_t* a = &l->ad[k++];
      a->layer = layer;
      a->site = s;
      (void)nb__model_site_weight(m, layer, s, &a->OC, &a->IC);
      for (int which = 0; which < 2; which++) {
        nb_tensor_view_t* v = &l->views[l->n_views];
        snprintf(v->name, sizeof v->name, "h.%d.%s.lora_%c", layer, nb__site_names[s],
                 which ? 'B' : 'A');
        v->offset = l->n;
        v->ndim = 2;
        v->shape[0] = which ? a->OC : r;
        v->shape[1] = which ? r : a->IC;
        v->numel = (size_t)v->shape[0] * v->shape[1];
        v->decay = 0;
        if (which)
          a->b_view = l->n_views;
        else
          a->a_view = l->n_views;
        l->n_views++;
        l->n += v->numel;
      }
      l->by_site[layer * NB_SITE_COUNT + s] = a;
    }
  NB_CHECK_GOTO(nb_aligned_alloc((void**)&l->params, l->n, sizeof(float), "lora parameters"), st,
                fail);
  NB_CHECK_GOTO(nb_calloc((void**)&l->grads, l->n, sizeof(float), "lora gradients"), st, fail);
  nb_rng_t rng;
  nb_rng_seed(&rng, seed);
  double sd = 1.0 / sqrt((double)r);
  for (int i = 0; i < l->n_ad; i++) {
    const nb_tensor_view_t* va = &l->views[l->ad[i].a_view];
    const nb_tensor_view_t* vb = &l->views[l->ad[i].b_view];
    for (size_t j = 0; j < va->numel; j++)
      l->params[va->offset + j] = (float)(sd * nb_rng_normal(&rng));
    memset(l->params + vb->offset, 0, vb->numel * sizeof(float));
  }
  nb__model_attach_lora(m, l);
  nb_model_set_frozen(m, 1);
  l->attached = 1;
  *out = l;
  return NB_OK;
fail:
  nb_lora_destroy(l);
  return st;
}

void nb_lora_destroy(nb_lora_t* l) {
  if (!l) return;
  if (l->attached) {
    nb__model_attach_lora(l->model, NULL);
    nb_model_set_frozen(l->model, 0);
  }
  nb_free(l->params);
  nb_free(l->grads);
  nb_free(l->views);
  nb_free(l->ad);
  nb_free(l->by_site);
  nb_free(l->u_arena);
  nb_free(l->du);
  nb_free(l);
}

const nb_lora_config_t* nb_lora_get_config(const nb_lora_t* l) {
  return &l->cfg;
}

float* nb_lora_params(nb_lora_t* l, size_t* n) {
  if (n) *n = l->n;
  return l->params;
}
float* nb_lora_grads(nb_lora_t* l, size_t* n) {
  if (n) *n = l->n;
  return l->grads;
}
void nb_lora_zero_grad(nb_lora_t* l) {
  memset(l->grads, 0, l->n * sizeof(float));
}
size_t nb_lora_num_tensors(const nb_lora_t* l) {
  return l->n_views;
}
const nb_tensor_view_t* nb_lora_tensor(const nb_lora_t* l, size_t i) {
  return i < l->n_views ? &l->views[i] : NULL;
}

nb_status_t nb__lora_forward(nb_lora_t* l, int layer, int site, const float* inp, float* out,
                             int N) {
  nb__adapter_t* a = l->by_site[layer * NB_SITE_COUNT + site];
  if (!a) return NB_OK;
  int r = l->cfg.rank;
  if ((size_t)N > l->cap_N) {
    nb_free(l->u_arena);
    nb_free(l->du);
    l->u_arena = l->du = NULL;
    l->cap_N = 0;
    NB_CHECK(nb_aligned_alloc((void**)&l->u_arena, (size_t)N * r * l->n_ad, sizeof(float),
                              "lora activations"));
    NB_CHECK(nb_aligned_alloc((void**)&l->du, (size_t)N * r, sizeof(float), "lora scratch"));
    l->cap_N = (size_t)N;
    for (int i = 0; i < l->n_ad; i++) l->ad[i].u = l->u_arena + (size_t)i * N * r;
  }
  const float* A = l->params + l->views[a->a_view].offset;  /* (r, IC) */
  const float* Bm = l->params + l->views[a->b_view].offset; /* (OC, r) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, r, a->IC, 1.0f, inp, a->IC, A, a->IC,
              0.0f, a->u, r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, a->OC, r, l->scale, a->u, r, Bm, r, 1.0f,
              out, a->OC);
  return NB_OK;
}

void nb__lora_backward(nb_lora_t* l, int layer, int site, const float* inp, const float* dout,
                       float* dinp, int N) {
  nb__adapter_t* a = l->by_site[layer * NB_SITE_COUNT + site];
  if (!a) return;
  int r = l->cfg.rank;
  const float* A = l->params + l->views[a->a_view].offset;
  const float* Bm = l->params + l->views[a->b_view].offset;
  float* dA = l->grads + l->views[a->a_view].offset;
  float* dB = l->grads + l->views[a->b_view].offset;
  /* dB += s dout^T u; du = s dout B; dA += du^T inp; dinp += du A */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, a->OC, r, N, l->scale, dout, a->OC, a->u, r,
              1.0f, dB, r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, a->OC, l->scale, dout, a->OC, Bm, r,
              0.0f, l->du, r);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, a->IC, N, 1.0f, l->du, r, inp, a->IC,
              1.0f, dA, a->IC);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, a->IC, r, 1.0f, l->du, r, A, a->IC,
              1.0f, dinp, a->IC);
}

nb_status_t nb_lora_merge(nb_lora_t* l) {
  if (!l->attached) return nb_error(NB_ERR_INVALID, "lora merge: adapters already merged");
  int r = l->cfg.rank;
  for (int i = 0; i < l->n_ad; i++) {
    nb__adapter_t* a = &l->ad[i];
    int OC, IC;
    float* W = nb__model_site_weight(l->model, a->layer, a->site, &OC, &IC);
    const float* A = l->params + l->views[a->a_view].offset;
    const float* Bm = l->params + l->views[a->b_view].offset;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, IC, r, l->scale, Bm, r, A, IC, 1.0f,
                W, IC);
  }
  nb__model_attach_lora(l->model, NULL);
  nb_model_set_frozen(l->model, 0);
  l->attached = 0;
  return NB_OK;
}
