/* Private to the CPU kernels and the precision module: f32 values rounded to bf16 / fp16 and
 * widened back, what storing a value in the reduced type and reading it again gives. */
#ifndef DSC_KERNELS_CPU_ROUND_H
#define DSC_KERNELS_CPU_ROUND_H

#include <stdint.h>

#include "dsc/tensor.h"

/* dst[i] = src[i] in `dtype` for i < n (dst == src, or no overlap): round to nearest even as
 * torch's .to(torch.bfloat16) / .half(), overflow to inf, fp16 subnormals kept, NaN stays NaN;
 * DSC_DTYPE_F32 copies. One thread: callers split long spans. */
void dsc_cpu_round_span(float *dst, const float *src, int64_t n, dsc_dtype dtype);

#endif
