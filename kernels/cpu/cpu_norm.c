/* LayerNorm and RMSNorm on the CPU. Forward and the input gradient are
 * parallel over rows (RMSNorm's forward on the pool in its scope: cpu_pool.h); the weight/bias gradients are a
 * second pass parallel over channel blocks, so every accumulator has exactly one owner (no atomics, no per-thread
 * buffers). Statistics are computed in double: rows are long and a one-pass float variance loses digits. */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"

#define CHANNEL_BLOCK 64

dsc_status dsc_cpu_layernorm_forward(const dsc_backend *backend, float *out, float *mean, float *rstd,
                                     const float *x, const float *w, const float *b, int64_t n, int64_t c,
                                     float eps) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * c; /* (C) */
        float *o = out + r * c;      /* (C) */
        double sum = 0, sq = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < c; i++)
            sum += xr[i];
        double mu = c ? sum / (double)c : 0.0;
#pragma omp simd reduction(+ : sq)
        for (int64_t i = 0; i < c; i++)
            sq += (xr[i] - mu) * (xr[i] - mu);
        float m = (float)mu, s = (float)(1.0 / sqrt((c ? sq / (double)c : 0.0) + eps));
        for (int64_t i = 0; i < c; i++)
            o[i] = (xr[i] - m) * s * w[i] + (b ? b[i] : 0.0f);
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = s;
    }
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

typedef struct rmsnorm_job {
    float *out, *rstd;
    const float *x, *w;
    int64_t n, c;
    float eps;
} rmsnorm_job;

static void rmsnorm_row(const rmsnorm_job *J, int64_t r) {
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

static void rmsnorm_chunk(void *arg, int64_t ch) {
    const rmsnorm_job *J = arg;
    for (int64_t r = ch * NORM_POOL_ROWS; r < J->n && r < (ch + 1) * NORM_POOL_ROWS; r++)
        rmsnorm_row(J, r);
}

dsc_status dsc_cpu_rmsnorm_forward(const dsc_backend *backend, float *out, float *rstd, const float *x,
                                   const float *w, int64_t n, int64_t c, float eps) {
    (void)backend;
    rmsnorm_job J = {.out = out, .rstd = rstd, .x = x, .w = w, .n = n, .c = c, .eps = eps};
    if (dsc_cpu_pool_scope() && n * c > DSC_CPU_PARALLEL_MIN) { /* the prefill of the inference forward */
        dsc_cpu_pool_run(rmsnorm_chunk, &J, (n + NORM_POOL_ROWS - 1) / NORM_POOL_ROWS);
        return NULL;
    }
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t r = 0; r < n; r++)
        rmsnorm_row(&J, r);
    return NULL;
}

dsc_status dsc_cpu_rmsnorm_backward(const dsc_backend *backend, float *dx, float *dw, const float *dout,
                                    const float *x, const float *w, const float *rstd, int64_t n, int64_t c) {
    (void)backend;
    norm_input_grad(dx, dout, x, w, NULL, rstd, n, c);
    if (dw) norm_param_grads(dw, NULL, dout, x, NULL, rstd, n, c);
    return NULL;
}
