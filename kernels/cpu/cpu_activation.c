/* Elementwise activations (GELU tanh form, SiLU, SwiGLU) and the row softmax
 * on the CPU. One pass each, parallel over elements (rows for softmax). */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_simd.h"

static inline float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* One elementwise job in chunks of ACT_CHUNK: the threads of the inference forward's pool when
 * it runs one (its prefill), OpenMP's otherwise. */
typedef struct act_job {
    float *out[2];      /* outputs, in the order of the kernel's row function */
    const float *in[3]; /* inputs, likewise */
    int64_t n;
} act_job;

enum { ACT_CHUNK = 16384 };

static void act_run(void (*range)(void *, int64_t), act_job *J) {
    int64_t chunks = (J->n + ACT_CHUNK - 1) / ACT_CHUNK;
    if (dsc_cpu_pool_scope() && J->n > DSC_CPU_PARALLEL_MIN) {
        dsc_cpu_pool_run(range, J, chunks);
        return;
    }
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(J->n)) schedule(static)
    for (int64_t ch = 0; ch < chunks; ch++)
        range(J, ch);
}

static int64_t chunk_len(const act_job *J, int64_t ch) {
    int64_t i0 = ch * ACT_CHUNK;
    return i0 + ACT_CHUNK < J->n ? ACT_CHUNK : J->n - i0;
}

static void gelu_range(void *arg, int64_t ch) {
    const act_job *J = arg;
    int64_t i0 = ch * ACT_CHUNK;
    dsc_cpu_gelu_rows(J->out[0] + i0, J->in[0] + i0, chunk_len(J, ch));
}

static void gelu_grad_range(void *arg, int64_t ch) {
    const act_job *J = arg;
    int64_t i0 = ch * ACT_CHUNK;
    dsc_cpu_gelu_grad_rows(J->out[0] + i0, J->in[0] + i0, J->in[1] + i0, chunk_len(J, ch));
}

dsc_status dsc_cpu_gelu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n) {
    (void)backend;
    act_run(gelu_range, &(act_job){.out = {out}, .in = {x}, .n = n});
    return NULL;
}

dsc_status dsc_cpu_gelu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                 int64_t n) {
    (void)backend;
    act_run(gelu_grad_range, &(act_job){.out = {dx}, .in = {dout, x}, .n = n});
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

static void swiglu_range(void *arg, int64_t ch) {
    const act_job *J = arg;
    int64_t i0 = ch * ACT_CHUNK;
    dsc_cpu_swiglu_rows(J->out[0] + i0, J->in[0] + i0, J->in[1] + i0, chunk_len(J, ch));
}

dsc_status dsc_cpu_swiglu_forward(const dsc_backend *backend, float *out, const float *gate, const float *up,
                                  int64_t n) {
    (void)backend;
    act_run(swiglu_range, &(act_job){.out = {out}, .in = {gate, up}, .n = n});
    return NULL;
}

static void swiglu_grad_range(void *arg, int64_t ch) {
    const act_job *J = arg;
    int64_t i0 = ch * ACT_CHUNK;
    dsc_cpu_swiglu_grad_rows(J->out[0] + i0, J->out[1] + i0, J->in[0] + i0, J->in[1] + i0, J->in[2] + i0,
                             chunk_len(J, ch));
}

dsc_status dsc_cpu_swiglu_backward(const dsc_backend *backend, float *dgate, float *dup, const float *dout,
                                   const float *gate, const float *up, int64_t n) {
    (void)backend;
    act_run(swiglu_grad_range, &(act_job){.out = {dgate, dup}, .in = {dout, gate, up}, .n = n});
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
