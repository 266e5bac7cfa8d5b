/* Optimizer updates on CUDA with torch.optim semantics (see cpu_optimizer.c
 * for the formulas): AdamW, SGD, Lion and the first half of Lamb; bias
 * corrections are computed once on the host. Lion's sign is taken of a
 * momentum computed without contraction (as the CPU's loop computes it), so
 * the two backends step the same way even where it is near 0. */
#include "kernels/adamw_coeffs.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n, float beta1,
                                    float beta2, float eps, float decay, float step_size, float bc2_sqrt) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

static __global__ void sgd_kernel(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                                  float wd, bool first) {
    GRID_STRIDE(i, n) {
        float d = g[i] + wd * p[i];
        if (buf) {
            d = first ? d : momentum * buf[i] + d;
            buf[i] = d;
        }
        p[i] -= lr * d;
    }
}

static __global__ void lion_kernel(float *p, const float *g, float *m, int64_t n, float lr, float beta1,
                                   float beta2, float decay) {
    GRID_STRIDE(i, n) {
        float gi = g[i], mi = m[i];
        float c = __fadd_rn(__fmul_rn(beta1, mi), __fmul_rn(1.0f - beta1, gi));
        float sign = (float)((c > 0.0f) - (c < 0.0f));
        p[i] = p[i] * decay - lr * sign;
        m[i] = beta2 * mi + (1.0f - beta2) * gi;
    }
}

/* u may alias g: each element is read before it is written, by the same thread. */
static __global__ void lamb_direction_kernel(float *u, const float *p, const float *g, float *m, float *v,
                                             int64_t n, float beta1, float beta2, float eps, float wd) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        u[i] = mi / (sqrtf(vi) + eps) + wd * p[i];
    }
}

dsc_status dsc_cuda_adamw(const dsc_backend *backend, float *p, const float *g, float *m, float *v, int64_t n,
                          float lr, float beta1, float beta2, float eps, float wd, int64_t step) {
    dsc_adamw_coeffs c = dsc_adamw_coeffs_at(lr, beta1, beta2, wd, step);
    LAUNCH_ELEMENTWISE(adamw_kernel, backend, n, p, g, m, v, n, beta1, beta2, eps, c.decay, c.step_size,
                       c.bc2_sqrt);
}

dsc_status dsc_cuda_sgd(const dsc_backend *backend, float *p, const float *g, float *buf, int64_t n, float lr,
                        float momentum, float wd, int64_t step) {
    LAUNCH_ELEMENTWISE(sgd_kernel, backend, n, p, g, buf, n, lr, momentum, wd, step == 1);
}

dsc_status dsc_cuda_lion(const dsc_backend *backend, float *p, const float *g, float *m, int64_t n, float lr,
                         float beta1, float beta2, float wd) {
    LAUNCH_ELEMENTWISE(lion_kernel, backend, n, p, g, m, n, lr, beta1, beta2, 1.0f - lr * wd);
}

dsc_status dsc_cuda_lamb_direction(const dsc_backend *backend, float *u, const float *p, const float *g, float *m,
                                   float *v, int64_t n, float beta1, float beta2, float eps, float wd) {
    LAUNCH_ELEMENTWISE(lamb_direction_kernel, backend, n, u, p, g, m, v, n, beta1, beta2, eps, wd);
}
