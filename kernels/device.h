/* Device discovery for the CUDA side of kernels/: how many GPUs this process can use. Builds
 * without CUDA, and machines without a driver, report zero devices; nothing here aborts. */
#ifndef NB_KERNELS_DEVICE_H
#define NB_KERNELS_DEVICE_H

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices: 0 when built without CUDA or when no driver/device is present
 * (cudaGetDeviceCount error 35 and friends are not errors here). Thread-safe. */
int nb_device_count(void);

/* True when this build contains the CUDA kernels. */
int nb_device_built_with_cuda(void);

/* Exit code a `gpu`-labelled test returns when it must skip (CTest SKIP_RETURN_CODE). */
#define NB_TEST_SKIP_CODE 77

#ifdef __cplusplus
}
#endif
#endif
