/* The CUDA backend's kernel table: each entry points at the operation's CUDA
 * implementation in this folder. */
#include "dsc/kernels.h"

extern "C" const struct dsc_kernel_ops dsc_cuda_kernel_ops = {};
