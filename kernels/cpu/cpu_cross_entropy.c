/* Fused softmax + cross-entropy on the CPU, parallel over rows. The backward
 * recomputes each row's log-sum-exp rather than keeping probabilities, so
 * dlogits may overwrite logits in place. A negative target ignores its row.
 *
 * A row (the vocabulary, 50257 floats for GPT-2: 200 KB, cache-resident) is
 * read once for its maximum, then once through the vectorised exponential
 * (dsc_cpu_exp_shift_sum, AVX2 where the CPU has it); the backward writes
 * exp(x - max) into dlogits in that pass and scales it in a last one. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_simd.h"

enum { EXP_CHUNK = 1024 }; /* floats staged on the stack by the forward, which leaves logits unchanged */

static float row_max(const float *x, int64_t v) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* Sum of exp(x - shift) over a row without changing it. */
static float exp_sum(const float *x, int64_t v, float shift) {
    float buf[EXP_CHUNK], sum = 0.0f;
    for (int64_t j0 = 0; j0 < v; j0 += EXP_CHUNK) {
        int64_t n = v - j0 < EXP_CHUNK ? v - j0 : EXP_CHUNK;
        memcpy(buf, x + j0, (size_t)n * sizeof *buf);
        sum += dsc_cpu_exp_shift_sum(buf, n, shift);
    }
    return sum;
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
        float mx = row_max(row, v);
        losses[i] = logf(exp_sum(row, v, mx)) + mx - row[targets[i]];
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
        float mx = row_max(row, v);
        if (d != row) memmove(d, row, (size_t)v * sizeof *d);
        float inv = dloss / dsc_cpu_exp_shift_sum(d, v, mx);
#pragma omp simd
        for (int64_t j = 0; j < v; j++)
            d[j] *= inv;
        d[targets[i]] -= dloss;
    }
    return NULL;
}
