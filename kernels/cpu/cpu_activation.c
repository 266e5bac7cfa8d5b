/* Elementwise activations (GELU tanh form, SiLU, SwiGLU) and the row softmax
 * on the CPU. One pass each, parallel over elements (rows for softmax). */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_simd.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

static inline float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* tanh through expf, which glibc computes several times faster than tanhf;
 * saturates correctly at both ends (exp overflow gives -1, underflow +1). */
static inline float fast_tanh(float u) {
    return 2.0f / (1.0f + expf(-2.0f * u)) - 1.0f;
}

dsc_status dsc_cpu_gelu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        out[i] = 0.5f * xi * (1.0f + fast_tanh(GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi)));
    }
    return NULL;
}

dsc_status dsc_cpu_gelu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                 int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float th = fast_tanh(GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * xi * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * xi * xi);
        dx[i] = grad * dout[i];
    }
    return NULL;
}

dsc_status dsc_cpu_silu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] * sigmoid(x[i]);
    return NULL;
}

/* d silu(x) / dx = s + x * s * (1 - s), s = sigmoid(x). */
static inline float silu_grad(float x) {
    float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

dsc_status dsc_cpu_silu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                 int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++)
        dx[i] = dout[i] * silu_grad(x[i]);
    return NULL;
}

typedef struct swiglu_job {
    float *out;
    const float *gate, *up;
    int64_t n;
} swiglu_job;

enum { SWIGLU_CHUNK = 16384 };

static void swiglu_range(void *arg, int64_t ch) {
    const swiglu_job *J = arg;
    int64_t i0 = ch * SWIGLU_CHUNK, i1 = i0 + SWIGLU_CHUNK < J->n ? i0 + SWIGLU_CHUNK : J->n;
    dsc_cpu_swiglu_rows(J->out + i0, J->gate + i0, J->up + i0, i1 - i0);
}

dsc_status dsc_cpu_swiglu_forward(const dsc_backend *backend, float *out, const float *gate, const float *up,
                                  int64_t n) {
    (void)backend;
    swiglu_job J = {.out = out, .gate = gate, .up = up, .n = n};
    int64_t chunks = (n + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK;
    if (dsc_cpu_pool_scope() && n > DSC_CPU_PARALLEL_MIN) { /* the prefill of the inference forward */
        dsc_cpu_pool_run(swiglu_range, &J, chunks);
        return NULL;
    }
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t ch = 0; ch < chunks; ch++)
        swiglu_range(&J, ch);
    return NULL;
}

dsc_status dsc_cpu_swiglu_backward(const dsc_backend *backend, float *dgate, float *dup, const float *dout,
                                   const float *gate, const float *up, int64_t n) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for simd num_threads(nt) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], d = dout[i];
        dup[i] = d * g * sigmoid(g);
        dgate[i] = d * up[i] * silu_grad(g);
    }
    return NULL;
}

dsc_status dsc_cpu_softmax(const dsc_backend *backend, float *out, const float *x, int64_t n, int64_t c) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * c; /* (C); may alias out */
        float *o = out + r * c;
        float mx = -INFINITY;
        for (int64_t i = 0; i < c; i++)
            mx = xr[i] > mx ? xr[i] : mx;
        float sum = 0;
        for (int64_t i = 0; i < c; i++) {
            o[i] = expf(xr[i] - mx);
            sum += o[i];
        }
        float inv = 1.0f / sum;
        for (int64_t i = 0; i < c; i++)
            o[i] *= inv;
    }
    return NULL;
}
