/* LayerNorm and RMSNorm on CUDA. Forward and the input gradient use one warp
 * per row; weight/bias gradients are a second kernel over (32-channel, row
 * chunk) tiles whose partial sums meet through atomicAdd (so their summation
 * order, unlike the CPU's, is not fixed). A NULL `shift` (mean) selects RMSNorm. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

static __global__ void norm_forward_kernel(float *out, float *mean, float *rstd, const float *x, const float *w,
                                           const float *b, int64_t n, int64_t c, float eps, bool centre) {
    int64_t row = blockIdx.x * (int64_t)WARPS_PER_BLOCK + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n) return;
    const float *xr = x + row * c; /* (C) */
    float mu = 0;
    if (centre) {
        float sum = 0;
        for (int64_t i = lane; i < c; i += 32)
            sum += xr[i];
        mu = warp_sum(sum) / (float)c;
    }
    float sq = 0;
    for (int64_t i = lane; i < c; i += 32)
        sq += (xr[i] - mu) * (xr[i] - mu);
    float s = rsqrtf(warp_sum(sq) / (float)c + eps);
    for (int64_t i = lane; i < c; i += 32)
        out[row * c + i] = (xr[i] - mu) * s * w[i] + (b ? b[i] : 0.0f);
    if (lane == 0) {
        if (mean) mean[row] = mu;
        if (rstd) rstd[row] = s;
    }
}

/* dx = rstd * (dnorm - mean(dnorm) [LayerNorm only] - xhat * mean(dnorm * xhat)), dnorm = dout * w. */
static __global__ void norm_input_grad_kernel(float *dx, const float *dout, const float *x, const float *w,
                                              const float *shift, const float *rstd, int64_t n, int64_t c) {
    int64_t row = blockIdx.x * (int64_t)WARPS_PER_BLOCK + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n) return;
    const float *xr = x + row * c, *dr = dout + row * c;
    float m = shift ? shift[row] : 0.0f, s = rstd[row];
    float sum_d = 0, sum_dx = 0;
    for (int64_t i = lane; i < c; i += 32) {
        float dnorm = dr[i] * w[i];
        sum_d += dnorm;
        sum_dx += dnorm * (xr[i] - m) * s;
    }
    float mean_d = shift ? warp_sum(sum_d) / (float)c : 0.0f, mean_dx = warp_sum(sum_dx) / (float)c;
    for (int64_t i = lane; i < c; i += 32)
        dx[row * c + i] = s * (dr[i] * w[i] - mean_d - (xr[i] - m) * s * mean_dx);
}

/* dw[c] += sum_r dout[r,c] * xhat[r,c]; db[c] += sum_r dout[r,c]. A block owns 32
 * channels of one chunk of rows (blockIdx.y); its 8 warps split the chunk and
 * combine in shared memory, and chunks meet through atomicAdd. */
static __global__ void norm_param_grad_kernel(float *dw, float *db, const float *dout, const float *x,
                                              const float *shift, const float *rstd, int64_t n, int64_t c,
                                              int64_t chunk) {
    __shared__ float part_w[WARPS_PER_BLOCK][33], part_b[WARPS_PER_BLOCK][33];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int64_t col = blockIdx.x * 32 + lane, r0 = blockIdx.y * chunk, r1 = r0 + chunk < n ? r0 + chunk : n;
    float acc_w = 0, acc_b = 0;
    if (col < c)
        for (int64_t r = r0 + warp; r < r1; r += WARPS_PER_BLOCK) {
            float d = dout[r * c + col];
            acc_w += d * (x[r * c + col] - (shift ? shift[r] : 0.0f)) * rstd[r];
            acc_b += d;
        }
    part_w[warp][lane] = acc_w;
    part_b[warp][lane] = acc_b;
    __syncthreads();
    if (warp != 0 || col >= c) return;
    for (int i = 1; i < WARPS_PER_BLOCK; i++)
        acc_w += part_w[i][lane], acc_b += part_b[i][lane];
    if (dw) atomicAdd(dw + col, acc_w);
    if (db) atomicAdd(db + col, acc_b);
}

static dsc_status norm_forward(const dsc_backend *backend, float *out, float *mean, float *rstd, const float *x,
                               const float *w, const float *b, int64_t n, int64_t c, float eps, bool centre) {
    if (n == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    norm_forward_kernel<<<cuda_warp_blocks(n), CUDA_BLOCK, 0, cx->stream>>>(out, mean, rstd, x, w, b, n, c, eps,
                                                                            centre);
    CUDA_LAUNCHED(norm_forward_kernel);
    return NULL;
}

static dsc_status norm_backward(const dsc_backend *backend, float *dx, float *dw, float *db, const float *dout,
                                const float *x, const float *w, const float *shift, const float *rstd, int64_t n,
                                int64_t c) {
    if (n == 0 || c == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    norm_input_grad_kernel<<<cuda_warp_blocks(n), CUDA_BLOCK, 0, cx->stream>>>(dx, dout, x, w, shift, rstd, n, c);
    CUDA_LAUNCHED(norm_input_grad_kernel);
    if (dw || db) {
        int64_t chunk = cuda_row_chunk(n);
        dim3 grid((unsigned int)((c + 31) / 32), (unsigned int)((n + chunk - 1) / chunk));
        norm_param_grad_kernel<<<grid, CUDA_BLOCK, 0, cx->stream>>>(dw, db, dout, x, shift, rstd, n, c, chunk);
        CUDA_LAUNCHED(norm_param_grad_kernel);
    }
    return NULL;
}

dsc_status dsc_cuda_layernorm_forward(const dsc_backend *backend, float *out, float *mean, float *rstd,
                                      const float *x, const float *w, const float *b, int64_t n, int64_t c,
                                      float eps) {
    return norm_forward(backend, out, mean, rstd, x, w, b, n, c, eps, true);
}

dsc_status dsc_cuda_layernorm_backward(const dsc_backend *backend, float *dx, float *dw, float *db,
                                       const float *dout, const float *x, const float *w, const float *mean,
                                       const float *rstd, int64_t n, int64_t c) {
    return norm_backward(backend, dx, dw, db, dout, x, w, mean, rstd, n, c);
}

dsc_status dsc_cuda_rmsnorm_forward(const dsc_backend *backend, float *out, float *rstd, const float *x,
                                    const float *w, int64_t n, int64_t c, float eps) {
    return norm_forward(backend, out, NULL, rstd, x, w, NULL, n, c, eps, false);
}

dsc_status dsc_cuda_rmsnorm_backward(const dsc_backend *backend, float *dx, float *dw, const float *dout,
                                     const float *x, const float *w, const float *rstd, int64_t n, int64_t c) {
    return norm_backward(backend, dx, dw, NULL, dout, x, w, NULL, rstd, n, c);
}
