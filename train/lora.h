/* LoRA adapters on chosen linear projections of a model: W x + (alpha / r) B A x with the base
 * frozen. The adapters' parameters and gradients are each one flat buffer (what fine-tuning
 * ships over the WAN). Not QLoRA, no dropout on the adapter path. */
#ifndef NB_TRAIN_LORA_H
#define NB_TRAIN_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int rank;       /* r >= 1 */
  float alpha;    /* scale = alpha / r */
  unsigned sites; /* bitmask of (1u << NB_SITE_*); 0 is invalid */
} nb_lora_config_t;

typedef struct nb_lora nb_lora_t;
/* Thread safety: adapters belong to their model; use both from one thread at a time. */

/* Creates adapters for every layer x chosen site, attaches them to m (borrowed; must outlive the
 * adapters) and freezes m's base (nb_model_set_frozen). A ~ N(0, 1/r), B = 0, so the attached
 * model starts equal to the base. Tensor names "h.<l>.<site>.lora_A" (r, in) and ".lora_B"
 * (out, r). NB_ERR_INVALID (rank, sites, a model that already has adapters), NB_ERR_NOMEM. */
nb_status_t nb_lora_create(nb_model_t* m, const nb_lora_config_t* cfg, uint64_t seed,
                           nb_lora_t** out);
/* Detaches (if still attached), unfreezes the base, frees. NULL ok. */
void nb_lora_destroy(nb_lora_t* l);

/* The configuration the adapters were created with. */
const nb_lora_config_t* nb_lora_get_config(const nb_lora_t* l);

/* The adapters' flat parameter and gradient buffers (owned by l). */
float* nb_lora_params(nb_lora_t* l, size_t* n);
float* nb_lora_grads(nb_lora_t* l, size_t* n);
void nb_lora_zero_grad(nb_lora_t* l);
size_t nb_lora_num_tensors(const nb_lora_t* l);
const nb_tensor_view_t* nb_lora_tensor(const nb_lora_t* l, size_t i);

/* W += (alpha / r) B A for every adapter, then detaches them and unfreezes the base: the model's
 * forward is then the adapted one without the adapter path. NB_ERR_INVALID when already merged. */
nb_status_t nb_lora_merge(nb_lora_t* l);

#ifdef __cplusplus
}
#endif
#endif
