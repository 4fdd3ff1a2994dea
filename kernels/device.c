/* CPU side of device discovery: forwards to the CUDA file when it is built. */
#include "kernels/device.h"

#ifdef NB_HAVE_CUDA
int nb__cuda_device_count(void);
int nb_device_count(void) {
  return nb__cuda_device_count();
}
int nb_device_built_with_cuda(void) {
  return 1;
}
#else
int nb_device_count(void) {
  return 0;
}
int nb_device_built_with_cuda(void) {
  return 0;
}
#endif
