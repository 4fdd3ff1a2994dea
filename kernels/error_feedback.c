/* CPU reference of the error-feedback update (see error_feedback.h). Not threaded: the codec
 * has its own fused, multithreaded accumulate-and-select pass. */
#include "kernels/error_feedback.h"

void nb_ef_accumulate(float* residual, const float* update, size_t n) {
  for (size_t i = 0; i < n; i++) residual[i] += update[i];
}

void nb_ef_subtract_sent(float* residual, const uint32_t* idx, const float* sent, size_t k) {
  for (size_t j = 0; j < k; j++) residual[idx[j]] -= sent[j];
}

#ifndef NB_HAVE_CUDA
nb_status_t nb_ef_accumulate_cuda(float* d_residual, const float* d_update, size_t n,
                                  void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "%s: built without CUDA", __func__);
}
nb_status_t nb_ef_subtract_sent_cuda(float* d_residual, const uint32_t* d_idx, const float* d_sent,
                                     size_t k, void* stream) {
  return nb_error(NB_ERR_UNSUPPORTED, "%s: built without CUDA", __func__);
}
#endif
