// CUDA side of device discovery. A missing driver is "zero devices", not an error.
#include <cuda_runtime.h>

extern "C" int nb__cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}
