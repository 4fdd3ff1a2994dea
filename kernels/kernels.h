/* kernels: numeric ops. Each op has a readable CPU reference (<op>.c, always built) beside a
 * CUDA version (<op>.cu, built when CUDA is present) that tests compare against the reference. */
#ifndef NB_KERNELS_KERNELS_H
#define NB_KERNELS_KERNELS_H

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cpu_path.h"
#include "kernels/crossentropy.h"
#include "kernels/device.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/error_feedback.h"
#include "kernels/quantize.h"
#include "kernels/topk.h"

#endif
