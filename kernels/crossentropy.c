/* CPU reference softmax / cross-entropy / KL. Log-sum-exp with the row max subtracted; sums in
 * double so that long rows stay accurate. No label smoothing. */
#include "kernels/crossentropy.h"

#include <math.h>

void nb_softmax_forward(float* probs, const float* logits, int N, int V, float temperature) {
  float inv_t = 1.0f / temperature;
  for (int i = 0; i < N; i++) {
    const float* x = logits + (size_t)i * V;
    float* p = probs + (size_t)i * V;
    float mx = x[0];
    for (int j = 1; j < V; j++)
      if (x[j] > mx) mx = x[j];
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
      p[j] = expf((x[j] - mx) * inv_t);
      sum += p[j];
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < V; j++) p[j] *= inv;
  }
}

int nb_crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets,
                            int N, int V) {
  nb_softmax_forward(probs, logits, N, V, 1.0f);
  int count = 0;
  for (int i = 0; i < N; i++) {
    int t = targets[i];
    if (t < 0) {
      losses[i] = 0.0f;
      continue;
    }
    float p = probs[(size_t)i * V + t];
    losses[i] = -logf(p > 1e-30f ? p : 1e-30f);
    count++;
  }
  return count;
}

void nb_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss,
                              int N, int V) {
  for (int i = 0; i < N; i++) {
    int t = targets[i];
    if (t < 0) continue;
    const float* p = probs + (size_t)i * V;
    float* d = dlogits + (size_t)i * V;
    for (int j = 0; j < V; j++) d[j] += dloss * p[j];
    d[t] -= dloss;
  }
}

void nb_kldiv_forward(float* losses, float* ps, float* pt, const float* student,
                      const float* teacher, const int* mask, int N, int V, float T) {
  nb_softmax_forward(ps, student, N, V, T);
  nb_softmax_forward(pt, teacher, N, V, T);
  for (int i = 0; i < N; i++) {
    if (mask && mask[i] < 0) {
      losses[i] = 0.0f;
      continue;
    }
    const float* s = ps + (size_t)i * V;
    const float* t = pt + (size_t)i * V;
    double kl = 0.0;
    for (int j = 0; j < V; j++)
      if (t[j] > 0.0f)
        kl += (double)t[j] * (log((double)t[j]) - log(s[j] > 1e-30f ? s[j] : 1e-30f));
    losses[i] = (float)(kl * T * T);
  }
}

void nb_kldiv_backward(float* dstudent, const float* ps, const float* pt, const int* mask,
                       float dloss, int N, int V, float T) {
  for (int i = 0; i < N; i++) {
    if (mask && mask[i] < 0) continue;
    const float* s = ps + (size_t)i * V;
    const float* t = pt + (size_t)i * V;
    float* d = dstudent + (size_t)i * V;
    for (int j = 0; j < V; j++) d[j] += dloss * T * (s[j] - t[j]);
  }
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_crossentropy_forward_cuda(float* d_losses, float* d_probs, const float* d_logits,
                                         const int* d_targets, int N, int V, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "crossentropy: built without CUDA");
}
nb_status_t nb_crossentropy_backward_cuda(float* d_dlogits, const float* d_probs,
                                          const int* d_targets, float dloss, int N, int V,
                                          void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "crossentropy: built without CUDA");
}
#endif
