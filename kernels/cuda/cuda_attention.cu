/* Causal grouped-query attention and RoPE on CUDA. The forward for head
 * sizes 64 and 128 is a tiled flash-attention kernel (64-query blocks, 64-key
 * tiles in shared memory, online softmax); other head sizes (<= MAX_HS) use
 * one warp per query row whose lanes split the head dimension, visiting keys
 * in order. Neither stores a score matrix. The backward (warp per query row)
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

__global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                                         int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs, float scale) {
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

__global__ void attention_backward_kernel(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                          const float *k, const float *v, const float *out, const float *lse,
                                          int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs, float scale) {
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

/* Forward for head sizes 64 and 128, flash-attention style: a block owns 64
 * query rows of one (b, head) and walks 64-key tiles staged in shared memory
 * (keys transposed so the score loop reads them as float4). 256 threads form
 * a 16 x 16 grid; thread (ty, tx) computes a 4 x 4 block of the score tile and
 * owns rows 4ty..4ty+3, columns tx*HS/16.. of the output. Row statistics are
 * reduced across the 16 threads of a row group (one half-warp). */
#define FA_TILE 64
#define FA_THREADS 256

__device__ __forceinline__ float half_warp_max(float x) {
    for (int o = 8; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float half_warp_sum(float x) {
    for (int o = 8; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

template <int HS>
__global__ void __launch_bounds__(FA_THREADS)
    attention_forward_tiled_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                                   int64_t t, int64_t nh, int64_t nkv, float scale) {
    constexpr int COLS = HS / 16; /* output columns per thread */
    extern __shared__ float4 smem4[];
    float *qs = (float *)smem4;    /* (64, HS) scaled queries */
    float *kt = qs + FA_TILE * HS; /* (HS, 64) keys, transposed */
    float *vs = kt + HS * FA_TILE; /* (64, HS) values */
    float *ps = vs + FA_TILE * HS; /* (64, 64) probabilities */
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int64_t i0 = (int64_t)blockIdx.x * FA_TILE, bi = blockIdx.y / nh, h = blockIdx.y % nh;
    int64_t q_stride = nh * HS, kv_stride = nkv * HS;
    const float *qb = q + bi * t * q_stride + h * HS;
    const float *kb = k + bi * t * kv_stride + (h / (nh / nkv)) * HS;
    const float *vb = v + bi * t * kv_stride + (h / (nh / nkv)) * HS;
    for (int idx = tid; idx < FA_TILE * HS; idx += FA_THREADS) {
        int64_t i = i0 + idx / HS;
        qs[idx] = i < t ? qb[i * q_stride + idx % HS] * scale : 0.0f;
    }
    float o[4][COLS], m[4], l[4];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        m[a] = -INFINITY, l[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < COLS; c++)
            o[a][c] = 0.0f;
    }
    int64_t last = (i0 + FA_TILE < t ? i0 + FA_TILE : t) - 1;
    /* Tiles are aligned, so every key tile j0 <= i0 holds key j0 <= i for each row. */
    for (int64_t j0 = 0; j0 <= last; j0 += FA_TILE) {
        __syncthreads(); /* the previous tile is consumed */
        for (int idx = tid; idx < FA_TILE * HS; idx += FA_THREADS) {
            int c = idx / HS, d = idx % HS;
            bool in = j0 + c < t;
            kt[d * FA_TILE + c] = in ? kb[(j0 + c) * kv_stride + d] : 0.0f;
            vs[idx] = in ? vb[(j0 + c) * kv_stride + d] : 0.0f;
        }
        __syncthreads();
        float s[4][4] = {};
        for (int d = 0; d < HS; d++) {
            float4 kk = *(const float4 *)(kt + d * FA_TILE + tx * 4);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float qa = qs[(ty * 4 + a) * HS + d];
                s[a][0] += qa * kk.x, s[a][1] += qa * kk.y, s[a][2] += qa * kk.z, s[a][3] += qa * kk.w;
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int64_t i = i0 + ty * 4 + a;
            float mx = -INFINITY;
#pragma unroll
            for (int bb = 0; bb < 4; bb++) {
                if (j0 + tx * 4 + bb > i) s[a][bb] = -INFINITY; /* causal mask */
                mx = fmaxf(mx, s[a][bb]);
            }
            float m_new = fmaxf(m[a], half_warp_max(mx)), corr = expf(m[a] - m_new), sum = 0;
#pragma unroll
            for (int bb = 0; bb < 4; bb++) {
                float p = expf(s[a][bb] - m_new);
                sum += p;
                ps[(ty * 4 + a) * FA_TILE + tx * 4 + bb] = p;
            }
            l[a] = l[a] * corr + half_warp_sum(sum);
            m[a] = m_new;
#pragma unroll
            for (int c = 0; c < COLS; c++)
                o[a][c] *= corr;
        }
        __syncthreads();
        for (int c = 0; c < FA_TILE; c++) {
            float pa[4];
#pragma unroll
            for (int a = 0; a < 4; a++)
                pa[a] = ps[(ty * 4 + a) * FA_TILE + c];
#pragma unroll
            for (int c4 = 0; c4 < COLS / 4; c4++) {
                float4 vv = *(const float4 *)(vs + c * HS + tx * COLS + c4 * 4);
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    o[a][c4 * 4] += pa[a] * vv.x, o[a][c4 * 4 + 1] += pa[a] * vv.y;
                    o[a][c4 * 4 + 2] += pa[a] * vv.z, o[a][c4 * 4 + 3] += pa[a] * vv.w;
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int64_t i = i0 + ty * 4 + a;
        if (i >= t) continue;
        float *orow = out + (bi * t + i) * q_stride + h * HS + tx * COLS;
#pragma unroll
        for (int c = 0; c < COLS; c++)
            orow[c] = o[a][c] / l[a];
        if (tx == 0) lse[(bi * nh + h) * t + i] = m[a] + logf(l[a]);
    }
}

/* Launches the tiled forward for head size HS (opting in to its shared memory). */
template <int HS>
static dsc_status attention_forward_tiled(float *out, float *lse, const float *q, const float *k, const float *v,
                                          int64_t b, int64_t t, int64_t nh, int64_t nkv) {
    size_t smem = (size_t)(3 * FA_TILE * HS + FA_TILE * FA_TILE) * sizeof(float);
    CUDA_CALL(cudaFuncSetAttribute(attention_forward_tiled_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem));
    dim3 grid((unsigned int)((t + FA_TILE - 1) / FA_TILE), (unsigned int)(b * nh));
    attention_forward_tiled_kernel<HS>
        <<<grid, FA_THREADS, smem>>>(out, lse, q, k, v, t, nh, nkv, 1.0f / sqrtf((float)HS));
    CUDA_LAUNCHED(attention_forward_tiled_kernel);
    return NULL;
}

static dsc_status check_head_size(int64_t hs) {
    DSC_CHECK(hs <= 32 * MAX_DIMS_PER_LANE, DSC_ERR_UNSUPPORTED,
              "CUDA attention supports head sizes up to %d, got %lld", 32 * MAX_DIMS_PER_LANE, (long long)hs);
    return NULL;
}

dsc_status dsc_cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                      int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs) {
    DSC_TRY(check_head_size(hs));
    if (b * t * nh == 0) return NULL;
    int device;
    DSC_TRY(dsc_cuda_enter(out, &device));
    if (b * nh <= 65535 && hs == 64) return attention_forward_tiled<64>(out, lse, q, k, v, b, t, nh, nkv);
    if (b * nh <= 65535 && hs == 128) return attention_forward_tiled<128>(out, lse, q, k, v, b, t, nh, nkv);
    attention_forward_kernel<<<cuda_warp_blocks(b * nh * t), CUDA_BLOCK>>>(out, lse, q, k, v, b, t, nh, nkv, hs,
                                                                           1.0f / sqrtf((float)hs));
    CUDA_LAUNCHED(attention_forward_kernel);
    return NULL;
}

dsc_status dsc_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                       const float *k, const float *v, const float *out, const float *lse,
                                       int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs) {
    DSC_TRY(check_head_size(hs));
    if (b * t * nh == 0) return NULL;
    int device;
    DSC_TRY(dsc_cuda_enter(dq, &device));
    size_t kv_bytes = (size_t)(b * t * nkv * hs) * sizeof(float);
    CUDA_CALL(cudaMemsetAsync(dk, 0, kv_bytes));
    CUDA_CALL(cudaMemsetAsync(dv, 0, kv_bytes));
    attention_backward_kernel<<<cuda_warp_blocks(b * nh * t), CUDA_BLOCK>>>(
        dq, dk, dv, dout, q, k, v, out, lse, b, t, nh, nkv, hs, 1.0f / sqrtf((float)hs));
    CUDA_LAUNCHED(attention_backward_kernel);
    return NULL;
}

/* One thread per rotated pair; angles in double (positions reach 1e5 and more). */
__global__ void rope_kernel(float *out, const float *x, const int32_t *pos, int64_t b, int64_t t, int64_t nh,
                            int64_t hs, double theta, double sign) {
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

dsc_status dsc_cuda_rope(float *out, const float *x, const int32_t *pos, int64_t b, int64_t t, int64_t nh,
                         int64_t hs, float theta, bool inverse) {
    LAUNCH_ELEMENTWISE(rope_kernel, out, b * t * nh * (hs / 2), out, x, pos, b, t, nh, hs, (double)theta,
                       inverse ? -1.0 : 1.0);
}
