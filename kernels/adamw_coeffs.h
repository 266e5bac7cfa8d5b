/* The per-step scalars of the AdamW update (see cpu_optimizer.c for the
 * formula), computed once on the host in double precision and shared by the
 * CPU and CUDA kernels so both backends round them the same way. Plain C
 * that also compiles as CUDA host code; not the per-element update. */
#ifndef DSC_KERNELS_ADAMW_COEFFS_H
#define DSC_KERNELS_ADAMW_COEFFS_H

#include <math.h>
#include <stdint.h>

typedef struct dsc_adamw_coeffs {
    float decay;     /* 1 - lr * wd (decoupled weight decay) */
    float step_size; /* lr / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
} dsc_adamw_coeffs;

static inline dsc_adamw_coeffs dsc_adamw_coeffs_at(float lr, float beta1, float beta2, float wd, int64_t step) {
    float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    dsc_adamw_coeffs c = {1.0f - lr * wd, lr / bc1, (float)sqrt(1.0 - pow((double)beta2, (double)step))};
    return c;
}

#endif
