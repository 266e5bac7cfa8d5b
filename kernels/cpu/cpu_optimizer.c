/* Optimizer updates on the CPU with torch.optim semantics:
 * AdamW  p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *        p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 * SGD    d = g + wd*p; buf = d on step 1, else momentum*buf + d; p -= lr*buf
 * (momentum 0: p -= lr*d, no buffer)
 * Lion   c = b1 m + (1-b1) g; p = p (1 - lr wd) - lr sign(c); m = b2 m + (1-b2) g
 * LAMB   m, v as Adam; u = m / (sqrt(v) + eps) + wd p (the caller applies the trust ratio)
 * One fused pass per update. */
#include <math.h>

#include "kernels/adamw_coeffs.h"
#include "kernels/cpu/cpu_kernels.h"

/* Adam's moment updates of element i, shared by AdamW and LAMB. */
static inline void adam_moments(float *m, float *v, float g, float beta1, float beta2) {
    *m = beta1 * *m + (1.0f - beta1) * g;
    *v = beta2 * *v + (1.0f - beta2) * g * g;
}

dsc_status dsc_cpu_adamw(const dsc_backend *backend, float *p, const float *g, float *m, float *v, int64_t n,
                         float lr, float beta1, float beta2, float eps, float wd, int64_t step) {
    (void)backend;
    dsc_adamw_coeffs c = dsc_adamw_coeffs_at(lr, beta1, beta2, wd, step);
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        adam_moments(&m[i], &v[i], g[i], beta1, beta2);
        p[i] = p[i] * c.decay - c.step_size * m[i] / (sqrtf(v[i]) / c.bc2_sqrt + eps);
    }
    return NULL;
}

dsc_status dsc_cpu_sgd(const dsc_backend *backend, float *p, const float *g, float *buf, int64_t n, float lr,
                       float momentum, float wd, int64_t step) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    bool first = step == 1;
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
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

dsc_status dsc_cpu_lion(const dsc_backend *backend, float *p, const float *g, float *m, int64_t n, float lr,
                        float beta1, float beta2, float wd) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    float decay = 1.0f - lr * wd;
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float c = beta1 * m[i] + (1.0f - beta1) * g[i];
        float sign = (float)((c > 0.0f) - (c < 0.0f));
        p[i] = p[i] * decay - lr * sign;
        m[i] = beta2 * m[i] + (1.0f - beta2) * g[i];
    }
    return NULL;
}

dsc_status dsc_cpu_lamb_direction(const dsc_backend *backend, float *u, const float *p, const float *g, float *m,
                                  float *v, int64_t n, float beta1, float beta2, float eps, float wd) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        adam_moments(&m[i], &v[i], g[i], beta1, beta2);
        u[i] = m[i] / (sqrtf(v[i]) + eps) + wd * p[i];
    }
    return NULL;
}
