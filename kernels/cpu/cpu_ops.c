/* The CPU backend's kernel table: each entry points at the operation's CPU
 * implementation in this folder. */
#include "dsc/kernels.h"

const struct dsc_kernel_ops dsc_cpu_kernel_ops = {0};
