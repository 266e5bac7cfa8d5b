/* Private to the CPU kernels, the precision module and the layers: f32 values rounded to bf16 /
 * fp16 and widened back, what storing a value in the reduced type and reading it again gives, and
 * that storing itself. */
#ifndef DSC_KERNELS_CPU_ROUND_H
#define DSC_KERNELS_CPU_ROUND_H

#include <stdint.h>

#include "dsc/tensor.h"

/* dst[i] = src[i] in `dtype` for i < n (dst == src, or no overlap): round to nearest even as
 * torch's .to(torch.bfloat16) / .half(), overflow to inf, fp16 subnormals kept, NaN stays NaN;
 * DSC_DTYPE_F32 copies. One thread: callers split long spans. */
void dsc_cpu_round_span(float *dst, const float *src, int64_t n, dsc_dtype dtype);
/* dst[i] = the 2-byte bits of src[i] rounded as dsc_cpu_round_span rounds (dtype bf16 / fp16);
 * widened back (dsc_cpu_widen_rows, cpu_simd.h) they are the rounded values. */
void dsc_cpu_pack_span(uint16_t *dst, const float *src, int64_t n, dsc_dtype dtype);

#endif
