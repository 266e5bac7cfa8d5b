/* MoE row movement on CUDA: dispatch (scatter of token rows into the
 * experts' buffer), combine (weighted gather, one block per token, the K
 * routes accumulated in registers) and the combine's backward (one block per
 * route: the scaled row and its dot product). Route rows (-1 = dropped) are
 * checked on the device first, as token ids are. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

/* Block r copies token r / k's row to dest[r]. */
static __global__ void moe_scatter_kernel(float *buf, const float *x, const int32_t *dest, int64_t k, int64_t m) {
    const int64_t r = blockIdx.x;
    const int32_t d = dest[r];
    if (d < 0) return;
    const float *src = x + (r / k) * m;
    for (int64_t c = threadIdx.x; c < m; c += blockDim.x)
        buf[d * m + c] = src[c];
}

/* Block s writes out[s] (+)= sum over kept routes of w * y[dest]. */
static __global__ void moe_gather_kernel(float *out, const float *y, const int32_t *dest, const float *w,
                                         int64_t k, int64_t m, bool accumulate) {
    const int64_t s = blockIdx.x;
    for (int64_t c = threadIdx.x; c < m; c += blockDim.x) {
        float acc = accumulate ? out[s * m + c] : 0.0f;
        for (int64_t r = 0; r < k; r++) {
            const int32_t d = dest[s * k + r];
            if (d >= 0) acc = fmaf(w ? w[s * k + r] : 1.0f, y[d * m + c], acc);
        }
        out[s * m + c] = acc;
    }
}

/* Block r: dy[dest[r]] = w[r] * dout[r / k], dw[r] = dout[r / k] . y[dest[r]]. */
static __global__ void moe_combine_backward_kernel(float *dy, float *dw, const float *dout, const float *y,
                                                   const int32_t *dest, const float *w, int64_t k, int64_t m) {
    const int64_t r = blockIdx.x;
    const int32_t d = dest[r];
    if (d < 0) {
        if (threadIdx.x == 0) dw[r] = 0.0f;
        return;
    }
    const float *g = dout + (r / k) * m;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < m; c += blockDim.x) {
        dy[d * m + c] = w[r] * g[c];
        dot = fmaf(g[c], y[d * m + c], dot);
    }
    dot = block_reduce(dot, false);
    if (threadIdx.x == 0) dw[r] = dot;
}

static dsc_status routes_fit(int64_t routes) {
    DSC_CHECK(routes <= 2147483647, DSC_ERR_UNSUPPORTED, "CUDA MoE rows: %lld routes exceed one grid",
              (long long)routes);
    return NULL;
}

dsc_status dsc_cuda_moe_scatter(const dsc_backend *backend, float *buf, int64_t rows, const float *x,
                                const int32_t *dest, int64_t s, int64_t k, int64_t m) {
    DSC_TRY(routes_fit(s * k));
    DSC_TRY(dsc_cuda_check_ids(backend, dest, s * k, rows, true, "route row"));
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    if (s * k == 0 || m == 0) return NULL;
    moe_scatter_kernel<<<(unsigned int)(s * k), CUDA_BLOCK, 0, cx->stream>>>(buf, x, dest, k, m);
    CUDA_LAUNCHED(moe_scatter_kernel);
    return NULL;
}

dsc_status dsc_cuda_moe_gather(const dsc_backend *backend, float *out, const float *y, int64_t rows,
                               const int32_t *dest, const float *w, int64_t s, int64_t k, int64_t m,
                               bool accumulate) {
    DSC_TRY(routes_fit(s * k));
    DSC_TRY(dsc_cuda_check_ids(backend, dest, s * k, rows, true, "route row"));
    if (s == 0 || m == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    moe_gather_kernel<<<(unsigned int)s, CUDA_BLOCK, 0, cx->stream>>>(out, y, dest, w, k, m, accumulate);
    CUDA_LAUNCHED(moe_gather_kernel);
    return NULL;
}

dsc_status dsc_cuda_moe_combine_backward(const dsc_backend *backend, float *dy, float *dw, int64_t rows,
                                         const float *dout, const float *y, const int32_t *dest, const float *w,
                                         int64_t s, int64_t k, int64_t m) {
    DSC_TRY(routes_fit(s * k));
    DSC_TRY(dsc_cuda_check_ids(backend, dest, s * k, rows, true, "route row"));
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    if (s * k == 0) return NULL;
    moe_combine_backward_kernel<<<(unsigned int)(s * k), CUDA_BLOCK, 0, cx->stream>>>(dy, dw, dout, y, dest, w, k,
                                                                                      m);
    CUDA_LAUNCHED(moe_combine_backward_kernel);
    return NULL;
}
