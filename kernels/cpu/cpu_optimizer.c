/* Optimizer updates on the CPU with torch.optim semantics:
 * AdamW  p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *        p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 * SGD    d = g + wd*p; buf = d on step 1, else momentum*buf + d; p -= lr*buf
 * (momentum 0: p -= lr*d, no buffer). One fused pass per update. */
#include <math.h>

#include "kernels/adamw_coeffs.h"
#include "kernels/cpu/cpu_kernels.h"

dsc_status dsc_cpu_adamw(const dsc_backend *backend, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                         float beta2, float eps, float wd, int64_t step) {
    (void)backend;
    dsc_adamw_coeffs c = dsc_adamw_coeffs_at(lr, beta1, beta2, wd, step);
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (n > DSC_CPU_PARALLEL_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * c.decay - c.step_size * mi / (sqrtf(vi) / c.bc2_sqrt + eps);
    }
    return NULL;
}

dsc_status dsc_cpu_sgd(const dsc_backend *backend, float *p, const float *g, float *buf, int64_t n, float lr, float momentum, float wd,
                       int64_t step) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    bool first = step == 1;
#pragma omp parallel for simd num_threads(nt) if (n > DSC_CPU_PARALLEL_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float d = g[i] + wd * p[i];
        if (buf) {
            d = first ? d : momentum * buf[i] + d;
            buf[i] = d;
        }
        p[i] -= lr * d;
    }
    return NULL;
}
