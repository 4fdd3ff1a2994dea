/* Private hooks between model.c and lora.c (not a public interface): where an adapter plugs into
 * a linear projection of the forward and backward. */
#ifndef NB_TRAIN_MODEL_INTERNAL_H
#define NB_TRAIN_MODEL_INTERNAL_H

#include "train/lora.h"
#include "train/model.h"

/* The base weight of (layer, site): pointer into the parameter arena, shape (OC, IC). */
float* nb__model_site_weight(nb_model_t* m, int layer, int site, int* OC, int* IC);
void nb__model_attach_lora(nb_model_t* m, nb_lora_t* l); /* NULL detaches */

/* nb_model_generate_greedy with a switch, for tests and the decode benchmark: use_cache 1 is the
 * K/V-cached decoding that function uses; 0 is the reference that reruns the forward over the
 * whole window for every token. logits_out (max_new, vocab), nullable, receives the logits row
 * each emitted token was chosen from. Same statuses as nb_model_generate_greedy. */
nb_status_t nb__model_generate(nb_model_t* m, const int* prompt, int n_prompt, int max_new,
                               int stop_token, int use_cache, int* out, int* n_out,
                               float* logits_out);

/* out (N, OC) += scale * (inp A^T) B^T for the adapter at (layer, site), if any. */
nb_status_t nb__lora_forward(nb_lora_t* l, int layer, int site, const float* inp, float* out,
                             int N);
/* Accumulates adapter gradients and dinp (N, IC) += the adapter's share. */
void nb__lora_backward(nb_lora_t* l, int layer, int site, const float* inp, const float* dout,
                       float* dinp, int N);

#endif
