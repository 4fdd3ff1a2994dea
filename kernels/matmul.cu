// CUDA dense layer through cuBLAS (row-major data seen as column-major transposes) plus small
// bias kernels. Holds the one process-wide cuBLAS handle the other .cu ops borrow.
#include "kernels/cublas_check.h"
#include "kernels/matmul.h"

static cublasHandle_t nb__handle = NULL;

extern "C" nb_status_t nb__cublas_get(void* stream, cublasHandle_t* out) {
  if (!nb__handle) NB_CUBLAS_CHECK(cublasCreate(&nb__handle));
  NB_CUBLAS_CHECK(cublasSetStream(nb__handle, (cudaStream_t)stream));
  *out = nb__handle;
  return NB_OK;
}

__global__ static void nb__bias_broadcast(float* out, const float* bias, int N, int OC) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (size_t)N * OC) out[i] = bias[i % OC];
}

__global__ static void nb__bias_backward(float* dbias, const float* dout, int N, int OC) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0.0f;
  for (int i = 0; i < N; i++) s += dout[(size_t)i * OC + o];
  dbias[o] += s;
}

extern "C" nb_status_t nb_matmul_forward_cuda(float* d_out, const float* d_inp,
                                              const float* d_weight, const float* d_bias, int N,
                                              int C, int OC, void* stream) {
  cublasHandle_t h;
  NB_CHECK(nb__cublas_get(stream, &h));
  float one = 1.0f, beta = 0.0f;
  if (d_bias) {
    size_t n = (size_t)N * OC;
    nb__bias_broadcast<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(d_out, d_bias,
                                                                                      N, OC);
    NB_CUDA_LAUNCH_CHECK();
    beta = 1.0f;
  }
  // column-major: out^T (OC, N) = W (OC, C) . inp^T (C, N)
  NB_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, d_weight, C, d_inp, C,
                              &beta, d_out, OC));
  return NB_OK;
}

extern "C" nb_status_t nb_matmul_backward_cuda(float* d_dinp, float* d_dweight, float* d_dbias,
                                               const float* d_dout, const float* d_inp,
                                               const float* d_weight, int N, int C, int OC,
                                               void* stream) {
  cublasHandle_t h;
  NB_CHECK(nb__cublas_get(stream, &h));
  float one = 1.0f;
  if (d_dinp)  // dinp^T (C, N) += W^T (C, OC) . dout^T (OC, N)
    NB_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, d_weight, C, d_dout,
                                OC, &one, d_dinp, C));
  if (d_dweight)  // dW^T (C, OC) += inp^T (C, N) . dout (N, OC)
    NB_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, d_inp, C, d_dout, OC,
                                &one, d_dweight, C));
  if (d_dbias) {
    nb__bias_backward<<<(OC + 255) / 256, 256, 0, (cudaStream_t)stream>>>(d_dbias, d_dout, N, OC);
    NB_CUDA_LAUNCH_CHECK();
  }
  return NB_OK;
}
