/* Causal grouped-query attention and RoPE on CUDA. Head sizes 64 and 128 go
 * to the tiled kernels of cuda_flash_attention.cu when the device has the
 * shared memory; every other head size (<= MAX_HS) uses the kernels here: one
 * warp per query row whose lanes split the head dimension, visiting keys in
 * order with an online softmax, so no score matrix is stored. Their backward
 * recomputes probabilities from the saved log-sum-exp; dq is owned by its
 * warp, dk and dv gather contributions from many rows and heads through
 * atomicAdd (so they are zeroed first and summed in a nondeterministic order).
 * Layout: q, out, dq (B, T, NH, HS); k, v, dk, dv (B, T, NKV, HS); lse (B, NH, T). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

#define MAX_DIMS_PER_LANE 8

/* Indices of the query row handled by this warp. */
struct attn_row {
    int64_t q_off, kv_base, lse_off; /* offsets of q row, key row 0 of the kv head, lse entry */
    int64_t i;                       /* query position */
};

__device__ __forceinline__ bool attn_locate(attn_row *r, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                                            int64_t hs) {
    int64_t row = blockIdx.x * (int64_t)WARPS_PER_BLOCK + threadIdx.x / 32;
    if (row >= b * nh * t) return false;
    int64_t i = row % t, h = (row / t) % nh, bi = row / (t * nh);
    r->i = i;
    r->q_off = ((bi * t + i) * nh + h) * hs;
    r->kv_base = bi * t * nkv * hs + (h / (nh / nkv)) * hs;
    r->lse_off = (bi * nh + h) * t + i;
    return true;
}

static __global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k,
                                                const float *v, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                                                int64_t hs, float scale) {
    attn_row r;
    if (!attn_locate(&r, b, t, nh, nkv, hs)) return;
    int lane = threadIdx.x % 32;
    int64_t kv_stride = nkv * hs;
    float qd[MAX_DIMS_PER_LANE], acc[MAX_DIMS_PER_LANE];
#pragma unroll
    for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
        int64_t d = lane + 32 * u;
        qd[u] = d < hs ? q[r.q_off + d] * scale : 0.0f;
        acc[u] = 0.0f;
    }
    float m = -INFINITY, l = 0;
    for (int64_t j = 0; j <= r.i; j++) {
        const float *kj = k + r.kv_base + j * kv_stride, *vj = v + r.kv_base + j * kv_stride;
        float s = 0;
#pragma unroll
        for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
            int64_t d = lane + 32 * u;
            if (d < hs) s += qd[u] * kj[d];
        }
        s = warp_sum(s);
        float m_new = fmaxf(m, s), corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
            int64_t d = lane + 32 * u;
            if (d < hs) acc[u] = acc[u] * corr + p * vj[d];
        }
        m = m_new;
    }
#pragma unroll
    for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
        int64_t d = lane + 32 * u;
        if (d < hs) out[r.q_off + d] = acc[u] / l;
    }
    if (lane == 0) lse[r.lse_off] = m + logf(l);
}

static __global__ void attention_backward_kernel(float *dq, float *dk, float *dv, const float *dout,
                                                 const float *q, const float *k, const float *v, const float *out,
                                                 const float *lse, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                                                 int64_t hs, float scale) {
    attn_row r;
    if (!attn_locate(&r, b, t, nh, nkv, hs)) return;
    int lane = threadIdx.x % 32;
    int64_t kv_stride = nkv * hs;
    float qd[MAX_DIMS_PER_LANE], dod[MAX_DIMS_PER_LANE], dqd[MAX_DIMS_PER_LANE];
    float d_i = 0;
#pragma unroll
    for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
        int64_t d = lane + 32 * u;
        qd[u] = d < hs ? q[r.q_off + d] : 0.0f;
        dod[u] = d < hs ? dout[r.q_off + d] : 0.0f;
        d_i += d < hs ? dod[u] * out[r.q_off + d] : 0.0f;
        dqd[u] = 0.0f;
    }
    d_i = warp_sum(d_i); /* sum_j p_ij dp_ij */
    float lse_i = lse[r.lse_off];
    for (int64_t j = 0; j <= r.i; j++) {
        const float *kj = k + r.kv_base + j * kv_stride, *vj = v + r.kv_base + j * kv_stride;
        float s = 0, dp = 0;
#pragma unroll
        for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
            int64_t d = lane + 32 * u;
            if (d < hs) s += qd[u] * kj[d], dp += dod[u] * vj[d];
        }
        float p = expf(warp_sum(s) * scale - lse_i);
        float ds = p * (warp_sum(dp) - d_i) * scale;
        float *dkj = dk + r.kv_base + j * kv_stride, *dvj = dv + r.kv_base + j * kv_stride;
#pragma unroll
        for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
            int64_t d = lane + 32 * u;
            if (d < hs) {
                dqd[u] += ds * kj[d];
                atomicAdd(dkj + d, ds * qd[u]);
                atomicAdd(dvj + d, p * dod[u]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < MAX_DIMS_PER_LANE; u++) {
        int64_t d = lane + 32 * u;
        if (d < hs) dq[r.q_off + d] = dqd[u];
    }
}

static dsc_status check_head_size(int64_t hs) {
    DSC_CHECK(hs <= 32 * MAX_DIMS_PER_LANE, DSC_ERR_UNSUPPORTED,
              "CUDA attention supports head sizes up to %d, got %lld", 32 * MAX_DIMS_PER_LANE, (long long)hs);
    return NULL;
}

dsc_status dsc_cuda_attention_forward(const dsc_backend *backend, float *out, float *lse, const float *q,
                                      const float *k, const float *v, int64_t b, int64_t t, int64_t nh,
                                      int64_t nkv, int64_t hs) {
    DSC_TRY(check_head_size(hs));
    if (b * t * nh == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    bool done;
    DSC_TRY(dsc_cuda_flash_attention_forward(backend, out, lse, q, k, v, b, t, nh, nkv, hs, &done));
    if (done) return NULL;
    attention_forward_kernel<<<cuda_warp_blocks(b * nh * t), CUDA_BLOCK, 0, cx->stream>>>(
        out, lse, q, k, v, b, t, nh, nkv, hs, 1.0f / sqrtf((float)hs));
    CUDA_LAUNCHED(attention_forward_kernel);
    return NULL;
}

dsc_status dsc_cuda_attention_backward(const dsc_backend *backend, float *dq, float *dk, float *dv,
                                       const float *dout, const float *q, const float *k, const float *v,
                                       const float *out, const float *lse, int64_t b, int64_t t, int64_t nh,
                                       int64_t nkv, int64_t hs) {
    DSC_TRY(check_head_size(hs));
    if (b * t * nh == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    bool done;
    DSC_TRY(
        dsc_cuda_flash_attention_backward(backend, dq, dk, dv, dout, q, k, v, out, lse, b, t, nh, nkv, hs, &done));
    if (done) return NULL;
    size_t kv_bytes = (size_t)(b * t * nkv * hs) * sizeof(float);
    CUDA_CALL(cudaMemsetAsync(dk, 0, kv_bytes, cx->stream));
    CUDA_CALL(cudaMemsetAsync(dv, 0, kv_bytes, cx->stream));
    attention_backward_kernel<<<cuda_warp_blocks(b * nh * t), CUDA_BLOCK, 0, cx->stream>>>(
        dq, dk, dv, dout, q, k, v, out, lse, b, t, nh, nkv, hs, 1.0f / sqrtf((float)hs));
    CUDA_LAUNCHED(attention_backward_kernel);
    return NULL;
}

/* One thread per rotated pair; angles in double (positions reach 1e5 and more). */
static __global__ void rope_kernel(float *out, const float *x, const int32_t *pos, int64_t b, int64_t t,
                                   int64_t nh, int64_t hs, double theta, double sign) {
    int64_t half = hs / 2;
    GRID_STRIDE(idx, b * t * nh * half) {
        int64_t i = idx % half, row = idx / half, ti = (row / nh) % t;
        double angle = (double)pos[ti] * pow(theta, -2.0 * (double)i / (double)hs);
        float c = (float)cos(angle), s = (float)(sign * sin(angle));
        float x1 = x[row * hs + i], x2 = x[row * hs + half + i]; /* may alias out */
        out[row * hs + i] = x1 * c - x2 * s;
        out[row * hs + half + i] = x2 * c + x1 * s;
    }
}

dsc_status dsc_cuda_rope(const dsc_backend *backend, float *out, const float *x, const int32_t *pos, int64_t b,
                         int64_t t, int64_t nh, int64_t hs, float theta, bool inverse) {
    LAUNCH_ELEMENTWISE(rope_kernel, backend, b * t * nh * (hs / 2), out, x, pos, b, t, nh, hs, (double)theta,
                       inverse ? -1.0 : 1.0);
}
