/* Fused softmax + cross-entropy on the CPU, parallel over rows. The backward
 * recomputes each row's log-sum-exp rather than keeping probabilities, so
 * dlogits may overwrite logits in place. A negative target ignores its row. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

/* Maximum and sum of exp(x - max) of one row. */
static void row_stats(const float *x, int64_t v, float *max_out, float *sum_out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    double sum = 0;
    for (int64_t j = 0; j < v; j++)
        sum += expf(x[j] - mx);
    *max_out = mx;
    *sum_out = (float)sum;
}

dsc_status dsc_cpu_cross_entropy_forward(const dsc_backend *backend, float *losses, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t v) {
    (void)backend;
    DSC_TRY(dsc_cpu_check_ids(targets, n, v, true, "target"));
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * v)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        if (targets[i] < 0) {
            losses[i] = 0.0f;
            continue;
        }
        const float *row = logits + i * v; /* (V) */
        float mx, sum;
        row_stats(row, v, &mx, &sum);
        losses[i] = logf(sum) + mx - row[targets[i]];
    }
    return NULL;
}

dsc_status dsc_cpu_cross_entropy_backward(const dsc_backend *backend, float *dlogits, const float *logits,
                                          const int32_t *targets, int64_t n, int64_t v, float dloss) {
    (void)backend;
    DSC_TRY(dsc_cpu_check_ids(targets, n, v, true, "target"));
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * v)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *row = logits + i * v; /* (V), may alias d */
        float *d = dlogits + i * v;
        if (targets[i] < 0) {
            memset(d, 0, (size_t)v * sizeof *d);
            continue;
        }
        float mx, sum;
        row_stats(row, v, &mx, &sum);
        float inv = dloss / sum;
        for (int64_t j = 0; j < v; j++)
            d[j] = expf(row[j] - mx) * inv;
        d[targets[i]] -= dloss;
    }
    return NULL;
}
