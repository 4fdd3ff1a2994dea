/* Row softmax, softmax cross-entropy and temperature-scaled KL divergence (for distillation),
 * forward and backward over logits (N, V). Targets < 0 are ignored (masked positions). */
#ifndef NB_KERNELS_CROSSENTROPY_H
#define NB_KERNELS_CROSSENTROPY_H

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* probs (N, V) = softmax(logits / temperature) row-wise (max-subtracted). All borrowed. */
void nb_softmax_forward(float* probs, const float* logits, int N, int V, float temperature);

/* probs = softmax(logits); losses[i] = -log probs[i, targets[i]], or 0 where targets[i] < 0.
 * Returns the number of counted rows. targets must be < V (the caller validates). */
int nb_crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets,
                            int N, int V);

/* Accumulating: dlogits[i] += dloss * (probs[i] - onehot(targets[i])) for counted rows. */
void nb_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss,
                              int N, int V);

/* Distillation term per row: losses[i] = T^2 * KL(softmax(teacher/T) || softmax(student/T)),
 * rows with mask[i] < 0 skipped (mask may be NULL = all rows). ps, pt (N, V) are written. */
void nb_kldiv_forward(float* losses, float* ps, float* pt, const float* student,
                      const float* teacher, const int* mask, int N, int V, float T);

/* Accumulating: dstudent[i] += dloss * T * (ps[i] - pt[i]) for counted rows. */
void nb_kldiv_backward(float* dstudent, const float* ps, const float* pt, const int* mask,
                       float dloss, int N, int V, float T);

/* CUDA versions; NB_ERR_UNSUPPORTED without CUDA, NB_ERR_CUDA on failure. */
nb_status_t nb_crossentropy_forward_cuda(float* d_losses, float* d_probs, const float* d_logits,
                                         const int* d_targets, int N, int V, void* stream);
nb_status_t nb_crossentropy_backward_cuda(float* d_dlogits, const float* d_probs,
                                          const int* d_targets, float dloss, int N, int V,
                                          void* stream);

#ifdef __cplusplus
}
#endif
#endif
