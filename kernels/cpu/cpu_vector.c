/* Flat-vector reductions (in double) and elementwise helpers on the CPU (axpy, the inference
 * forward's residual add, on the pool in its scope: cpu_pool.h). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_simd.h"

#if defined(__x86_64__)
/* The sum of squares of x[0 .. n / 32 * 32) in four chains of 8 doubles, in GCC's vector
 * extensions compiled for AVX-512 and AVX2: the generic build's loop was one SSE2 chain, bound by
 * the add's latency at about a third of the memory rate (the gradient norm: 2.7 % of a GPT-2-small
 * step). */
typedef float f32x8 __attribute__((vector_size(32)));
typedef double f64x8 __attribute__((vector_size(64)));
#define SQUARES(name, isa)                                                                                        \
    __attribute__((target(isa))) static double name(const float *x, int64_t n, int64_t *done) {                   \
        f64x8 acc[4] = {{0}};                                                                                     \
        int64_t i = 0;                                                                                            \
        for (; i + 32 <= n; i += 32)                                                                              \
            for (int c = 0; c < 4; c++) {                                                                         \
                f32x8 v;                                                                                          \
                memcpy(&v, x + i + 8 * c, sizeof v);                                                              \
                f64x8 d = __builtin_convertvector(v, f64x8);                                                      \
                acc[c] += d * d;                                                                                  \
            }                                                                                                     \
        f64x8 s = (acc[0] + acc[1]) + (acc[2] + acc[3]);                                                          \
        *done = i;                                                                                                \
        return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));                                 \
    }
SQUARES(squares_avx512, "avx512f")
SQUARES(squares_avx2, "avx2")
#endif

/* The sum of x[i]^2 over one thread's piece, in double. */
static double squares(const float *x, int64_t n) {
    double acc = 0;
    int64_t i = 0;
#if defined(__x86_64__)
    if (dsc_cpu_simd_avx512())
        acc = squares_avx512(x, n, &i);
    else if (dsc_cpu_simd())
        acc = squares_avx2(x, n, &i);
#endif
    for (; i < n; i++)
        acc += (double)x[i] * x[i];
    return acc;
}

dsc_status dsc_cpu_sum_squares(const dsc_backend *backend, double *out, const float *x, int64_t n) {
    (void)backend;
    enum { PIECE = 1 << 15 };
    const int nt = dsc_kernels_get_num_threads();
    const int64_t pieces = (n + PIECE - 1) / PIECE;
    double acc = 0;
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n)) reduction(+ : acc) schedule(static)
    for (int64_t p = 0; p < pieces; p++)
        acc += squares(x + p * PIECE, n - p * PIECE < PIECE ? n - p * PIECE : PIECE);
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

typedef struct axpy_job {
    float *y;
    const float *x;
    float a;
    int64_t n;
} axpy_job;

enum { AXPY_CHUNK = 16384 }; /* floats per pool chunk */

static void axpy_chunk(void *arg, int64_t ch) {
    const axpy_job *J = arg;
    int64_t i0 = ch * AXPY_CHUNK, i1 = i0 + AXPY_CHUNK < J->n ? i0 + AXPY_CHUNK : J->n;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++)
        J->y[i] += J->a * J->x[i];
}

dsc_status dsc_cpu_axpy(const dsc_backend *backend, float *y, float a, const float *x, int64_t n) {
    (void)backend;
    if (dsc_cpu_pool_scope() && n > DSC_CPU_PARALLEL_MIN) { /* the residual adds of the inference prefill */
        axpy_job J = {.y = y, .x = x, .a = a, .n = n};
        dsc_cpu_pool_run(axpy_chunk, &J, (n + AXPY_CHUNK - 1) / AXPY_CHUNK);
        return NULL;
    }
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
