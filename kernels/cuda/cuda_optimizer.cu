/* Optimizer updates on CUDA with torch.optim semantics (see cpu_optimizer.c
 * for the formulas); bias corrections are computed once on the host. */
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
