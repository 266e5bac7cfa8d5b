/* LayerNorm and RMSNorm on the CPU. Forward and the input gradient are
 * parallel over rows (the forwards on the pool in its scope: cpu_pool.h);
 * the weight/bias gradients are a second pass parallel over channel blocks,
 * so every accumulator has exactly one owner (no atomics, no per-thread
 * buffers). Statistics are sums in double over one pass of the row: in
 * float a one-pass variance loses digits, in double it keeps them. */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"

#define CHANNEL_BLOCK 64

typedef struct norm_job {
    float *out, *mean, *rstd;
    const float *x, *w, *b; /* b: LayerNorm's bias or NULL */
    int64_t n, c;
    float eps;
} norm_job;

/* Row r of LayerNorm: its sum and sum of squares in one pass, in double (a row's variance is
 * then E[x^2] - mean^2 to ~1e-16 relative to E[x^2], far below f32's resolution). */
static void layernorm_row(const norm_job *J, int64_t r) {
    const int64_t c = J->c;
    const float *xr = J->x + r * c;
    float *o = J->out + r * c;
    double sum = 0, sq = 0;
#pragma omp simd reduction(+ : sum, sq)
    for (int64_t i = 0; i < c; i++) {
        sum += xr[i];
        sq += (double)xr[i] * xr[i];
    }
    double mu = c ? sum / (double)c : 0.0, var = c ? sq / (double)c - mu * mu : 0.0;
    float m = (float)mu, s = (float)(1.0 / sqrt((var > 0 ? var : 0.0) + J->eps));
    for (int64_t i = 0; i < c; i++)
        o[i] = (xr[i] - m) * s * J->w[i] + (J->b ? J->b[i] : 0.0f);
    if (J->mean) J->mean[r] = m;
    if (J->rstd) J->rstd[r] = s;
}

static void rmsnorm_row(const norm_job *J, int64_t r) {
    const int64_t c = J->c;
    const float *xr = J->x + r * c;
    float *o = J->out + r * c;
    double sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t i = 0; i < c; i++)
        sq += (double)xr[i] * xr[i];
    float s = (float)(1.0 / sqrt((c ? sq / (double)c : 0.0) + J->eps));
    for (int64_t i = 0; i < c; i++)
        o[i] = xr[i] * s * J->w[i];
    if (J->rstd) J->rstd[r] = s;
}

enum { NORM_POOL_ROWS = 16 }; /* rows per pool chunk */

static void layernorm_chunk(void *arg, int64_t ch) {
    for (int64_t r = ch * NORM_POOL_ROWS; r < ((norm_job *)arg)->n && r < (ch + 1) * NORM_POOL_ROWS; r++)
        layernorm_row(arg, r);
}

static void rmsnorm_chunk(void *arg, int64_t ch) {
    for (int64_t r = ch * NORM_POOL_ROWS; r < ((norm_job *)arg)->n && r < (ch + 1) * NORM_POOL_ROWS; r++)
        rmsnorm_row(arg, r);
}

/* Every row of J by `row`: on the pool in its scope (the inference prefill), else OpenMP's threads. */
static void norm_rows(const norm_job *J, void (*chunk)(void *, int64_t), void (*row)(const norm_job *, int64_t)) {
    if (dsc_cpu_pool_scope() && J->n * J->c > DSC_CPU_PARALLEL_MIN) {
        dsc_cpu_pool_run(chunk, (void *)J, (J->n + NORM_POOL_ROWS - 1) / NORM_POOL_ROWS);
        return;
    }
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(J->n * J->c)) schedule(static)
    for (int64_t r = 0; r < J->n; r++)
        row(J, r);
}

dsc_status dsc_cpu_layernorm_forward(const dsc_backend *backend, float *out, float *mean, float *rstd,
                                     const float *x, const float *w, const float *b, int64_t n, int64_t c,
                                     float eps) {
    (void)backend;
    norm_job J = {.out = out, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = b, .n = n, .c = c, .eps = eps};
    norm_rows(&J, layernorm_chunk, layernorm_row);
    return NULL;
}

/* dweight[c] += sum_r dout[r,c] * xhat[r,c] and dbias[c] += sum_r dout[r,c],
 * with xhat = (x - shift[r]) * rstd[r] (shift is the mean, or NULL for RMSNorm). */
static void norm_param_grads(float *dw, float *db, const float *dout, const float *x, const float *shift,
                             const float *rstd, int64_t n, int64_t c) {
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t c0 = 0; c0 < c; c0 += CHANNEL_BLOCK) {
        int64_t len = c - c0 < CHANNEL_BLOCK ? c - c0 : CHANNEL_BLOCK;
        float acc_w[CHANNEL_BLOCK] = {0}, acc_b[CHANNEL_BLOCK] = {0};
        for (int64_t r = 0; r < n; r++) {
            const float *xr = x + r * c + c0, *dr = dout + r * c + c0;
            float m = shift ? shift[r] : 0.0f, s = rstd[r];
            for (int64_t i = 0; i < len; i++) {
                acc_w[i] += dr[i] * (xr[i] - m) * s;
                acc_b[i] += dr[i];
            }
        }
        for (int64_t i = 0; i < len; i++) {
            if (dw) dw[c0 + i] += acc_w[i];
            if (db) db[c0 + i] += acc_b[i];
        }
    }
}

/* dx = rstd * (dnorm - shift_mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w.
 * LayerNorm subtracts mean(dnorm) (centered); RMSNorm does not. */
static void norm_input_grad(float *dx, const float *dout, const float *x, const float *w, const float *shift,
                            const float *rstd, int64_t n, int64_t c) {
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * c, *dr = dout + r * c;
        float *dxr = dx + r * c;
        float m = shift ? shift[r] : 0.0f, s = rstd[r];
        float sum_d = 0, sum_dx = 0;
#pragma omp simd reduction(+ : sum_d, sum_dx)
        for (int64_t i = 0; i < c; i++) {
            float dnorm = dr[i] * w[i];
            sum_d += dnorm;
            sum_dx += dnorm * (xr[i] - m) * s;
        }
        float mean_d = shift ? sum_d / (float)c : 0.0f, mean_dx = sum_dx / (float)c;
        for (int64_t i = 0; i < c; i++)
            dxr[i] = s * (dr[i] * w[i] - mean_d - (xr[i] - m) * s * mean_dx);
    }
}

dsc_status dsc_cpu_layernorm_backward(const dsc_backend *backend, float *dx, float *dw, float *db,
                                      const float *dout, const float *x, const float *w, const float *mean,
                                      const float *rstd, int64_t n, int64_t c) {
    (void)backend;
    norm_input_grad(dx, dout, x, w, mean, rstd, n, c);
    if (dw || db) norm_param_grads(dw, db, dout, x, mean, rstd, n, c);
    return NULL;
}

dsc_status dsc_cpu_rmsnorm_forward(const dsc_backend *backend, float *out, float *rstd, const float *x,
                                   const float *w, int64_t n, int64_t c, float eps) {
    (void)backend;
    norm_job J = {.out = out, .rstd = rstd, .x = x, .w = w, .n = n, .c = c, .eps = eps};
    norm_rows(&J, rmsnorm_chunk, rmsnorm_row);
    return NULL;
}

dsc_status dsc_cpu_rmsnorm_backward(const dsc_backend *backend, float *dx, float *dw, const float *dout,
                                    const float *x, const float *w, const float *rstd, int64_t n, int64_t c) {
    (void)backend;
    norm_input_grad(dx, dout, x, w, NULL, rstd, n, c);
    if (dw) norm_param_grads(dw, NULL, dout, x, NULL, rstd, n, c);
    return NULL;
}
