/* Flat-vector reductions (in double) and elementwise helpers on the CPU. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

dsc_status dsc_cpu_sum_squares(const dsc_backend *backend, double *out, const float *x, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    double acc = 0;
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; i++)
        acc += (double)x[i] * x[i];
    *out = acc;
    return NULL;
}

dsc_status dsc_cpu_sum(const dsc_backend *backend, double *out, const float *x, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    double acc = 0;
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; i++)
        acc += x[i];
    *out = acc;
    return NULL;
}

dsc_status dsc_cpu_scale(const dsc_backend *backend, float *x, float s, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
    return NULL;
}

dsc_status dsc_cpu_axpy(const dsc_backend *backend, float *y, float a, const float *x, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
    return NULL;
}

dsc_status dsc_cpu_add(const dsc_backend *backend, float *out, const float *a, const float *b, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return NULL;
}

dsc_status dsc_cpu_all_finite(const dsc_backend *backend, bool *out, const float *x, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    int bad = 0;
    /* x - x is 0 for finite x and NaN for inf or NaN; no early exit keeps it a plain reduction. */
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) reduction(| : bad) schedule(static)
    for (int64_t i = 0; i < n; i++)
        bad |= !(x[i] - x[i] == 0.0f);
    *out = !bad;
    return NULL;
}

dsc_status dsc_cpu_zero(const dsc_backend *backend, float *x, int64_t n) {
    (void)backend;
    if (n > 0) memset(x, 0, (size_t)n * sizeof *x);
    return NULL;
}
