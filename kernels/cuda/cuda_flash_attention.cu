/* Tiled ("flash") causal attention on CUDA for head sizes 64 and 128, in
 * FP32 on the CUDA cores. Both passes work on 64 x 64 tiles staged in shared
 * memory with 256 threads as a 16 x 16 grid: thread (ty, tx) computes a 4 x 4
 * block of a (64, 64) score tile (rows 4ty.., columns 4tx..) and a 4 x HS/16
 * block of a (64, HS) product. Keys and values are also kept transposed so
 * that every inner loop reads shared memory as float4 without bank conflicts.
 * Row statistics are reduced over the 16 threads of a row group (a half-warp).
 * The entry points report `done = false` when the head size or the device's
 * shared memory does not fit, and the warp-per-row kernels take over.
 * Layout: q, out, dq (B, T, NH, HS); k, v, dk, dv (B, T, NKV, HS); lse (B, NH, T). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

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

/* acc[a][bb] += sum_d rows[(4ty + a) * HS + d] * cols_t[d * 64 + 4tx + bb]: a 4 x 4 block of rows @ cols^T. */
template <int HS>
__device__ __forceinline__ void tile_scores(float acc[4][4], const float *rows, const float *cols_t, int ty,
                                            int tx) {
    for (int d = 0; d < HS; d++) {
        float4 c = *(const float4 *)(cols_t + d * FA_TILE + tx * 4);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            float r = rows[(ty * 4 + a) * HS + d];
            acc[a][0] += r * c.x, acc[a][1] += r * c.y, acc[a][2] += r * c.z, acc[a][3] += r * c.w;
        }
    }
}

/* acc[a][c] += sum_n w[n][4ty + a] * x[n][tx*HS/16 + c] (transposed == true: w^T @ x) or
 * sum_n w[4ty + a][n] * x[n][tx*HS/16 + c] (w @ x), with w (64, 64) and x (64, HS). */
template <int HS, bool transposed>
__device__ __forceinline__ void tile_product(float acc[4][HS / 16], const float *w, const float *x, int ty,
                                             int tx) {
    constexpr int COLS = HS / 16;
    for (int n = 0; n < FA_TILE; n++) {
        float wa[4];
#pragma unroll
        for (int a = 0; a < 4; a++)
            wa[a] = transposed ? w[n * FA_TILE + ty * 4 + a] : w[(ty * 4 + a) * FA_TILE + n];
#pragma unroll
        for (int c4 = 0; c4 < COLS / 4; c4++) {
            float4 xv = *(const float4 *)(x + n * HS + tx * COLS + c4 * 4);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                acc[a][c4 * 4] += wa[a] * xv.x, acc[a][c4 * 4 + 1] += wa[a] * xv.y;
                acc[a][c4 * 4 + 2] += wa[a] * xv.z, acc[a][c4 * 4 + 3] += wa[a] * xv.w;
            }
        }
    }
}

/* Forward: a block owns 64 query rows of one (b, head) and walks the 64-key
 * tiles up to the diagonal with an online softmax; output rows stay in registers. */
template <int HS>
static __global__ void __launch_bounds__(FA_THREADS)
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
        tile_scores<HS>(s, qs, kt, ty, tx);
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
        tile_product<HS, false>(o, ps, vs, ty, tx);
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

/* Backward, FlashAttention-2 style: a block owns one 64-key tile of one (b,
 * kv head), keeps its dk, dv in registers and visits every query tile at or
 * after the diagonal, for every query head of the group. Per query tile it
 * recomputes p from lse, forms ds = p (dp - D) scale with D_i = dout_i . out_i,
 * accumulates dv += p^T dout and dk += ds^T q, and adds ds k into dq with
 * atomicAdd (dq is zeroed first). dk, dv have one owner: plain stores. */
template <int HS>
static __global__ void __launch_bounds__(FA_THREADS)
    attention_backward_tiled_kernel(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse, int64_t t,
                                    int64_t nh, int64_t nkv, float scale) {
    constexpr int COLS = HS / 16;
    extern __shared__ float4 smem4[];
    float *ks = (float *)smem4;          /* (64, HS) keys */
    float *kt = ks + FA_TILE * HS;       /* (HS, 64) keys, transposed */
    float *vt = kt + HS * FA_TILE;       /* (HS, 64) values, transposed */
    float *qs = vt + HS * FA_TILE;       /* (64, HS) queries of the current tile */
    float *dos = qs + FA_TILE * HS;      /* (64, HS) output gradients of the current tile */
    float *ps = dos + FA_TILE * HS;      /* (64, 64) probabilities */
    float *dss = ps + FA_TILE * FA_TILE; /* (64, 64) score gradients */
    float *row_lse = dss + FA_TILE * FA_TILE, *row_d = row_lse + FA_TILE; /* (64) each */
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int64_t j0 = (int64_t)blockIdx.x * FA_TILE, bi = blockIdx.y / nkv, kvh = blockIdx.y % nkv, group = nh / nkv;
    int64_t q_stride = nh * HS, kv_stride = nkv * HS;
    const float *kb = k + bi * t * kv_stride + kvh * HS, *vb = v + bi * t * kv_stride + kvh * HS;
    for (int idx = tid; idx < FA_TILE * HS; idx += FA_THREADS) {
        int c = idx / HS, d = idx % HS;
        bool in = j0 + c < t;
        float kv = in ? kb[(j0 + c) * kv_stride + d] : 0.0f;
        ks[idx] = kv;
        kt[d * FA_TILE + c] = kv;
        vt[d * FA_TILE + c] = in ? vb[(j0 + c) * kv_stride + d] : 0.0f;
    }
    float dka[4][COLS] = {}, dva[4][COLS] = {};
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        const float *qb = q + bi * t * q_stride + h * HS, *dob = dout + bi * t * q_stride + h * HS;
        const float *ob = out + bi * t * q_stride + h * HS;
        for (int64_t i0 = j0; i0 < t; i0 += FA_TILE) {
            __syncthreads(); /* the previous query tile is consumed */
            for (int idx = tid; idx < FA_TILE * HS; idx += FA_THREADS) {
                int64_t i = i0 + idx / HS;
                qs[idx] = i < t ? qb[i * q_stride + idx % HS] : 0.0f;
                dos[idx] = i < t ? dob[i * q_stride + idx % HS] : 0.0f;
            }
            /* D_i over the 16 threads of row group ty; rows past T get lse = inf, so p = 0. */
#pragma unroll
            for (int a = 0; a < 4; a++) {
                int64_t i = i0 + ty * 4 + a;
                float part = 0;
                if (i < t)
                    for (int c = 0; c < COLS; c++)
                        part += dob[i * q_stride + tx * COLS + c] * ob[i * q_stride + tx * COLS + c];
                part = half_warp_sum(part);
                if (tx == 0) {
                    row_d[ty * 4 + a] = part;
                    row_lse[ty * 4 + a] = i < t ? lse[(bi * nh + h) * t + i] : INFINITY;
                }
            }
            __syncthreads();
            float s[4][4] = {}, dp[4][4] = {};
            tile_scores<HS>(s, qs, kt, ty, tx);
            tile_scores<HS>(dp, dos, vt, ty, tx);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                int r = ty * 4 + a;
#pragma unroll
                for (int bb = 0; bb < 4; bb++) {
                    bool visible = j0 + tx * 4 + bb <= i0 + r; /* causal */
                    float p = visible ? expf(s[a][bb] * scale - row_lse[r]) : 0.0f;
                    ps[r * FA_TILE + tx * 4 + bb] = p;
                    dss[r * FA_TILE + tx * 4 + bb] = p * (dp[a][bb] - row_d[r]) * scale;
                }
            }
            __syncthreads();
            tile_product<HS, true>(dva, ps, dos, ty, tx);
            tile_product<HS, true>(dka, dss, qs, ty, tx);
            float dqa[4][COLS] = {};
            tile_product<HS, false>(dqa, dss, ks, ty, tx);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                int64_t i = i0 + ty * 4 + a;
                if (i >= t) continue;
                float *dqrow = dq + (bi * t + i) * q_stride + h * HS + tx * COLS;
#pragma unroll
                for (int c = 0; c < COLS; c++)
                    atomicAdd(dqrow + c, dqa[a][c]);
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int64_t j = j0 + ty * 4 + a;
        if (j >= t) continue;
        int64_t off = (bi * t + j) * kv_stride + kvh * HS + tx * COLS;
#pragma unroll
        for (int c = 0; c < COLS; c++) {
            dk[off + c] = dka[a][c];
            dv[off + c] = dva[a][c];
        }
    }
}

/* Opts `kernel` in to `smem` bytes of shared memory; false when the device has less. */
template <typename K> static bool fits_shared_memory(K kernel, size_t smem) {
    int device, limit;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
        (size_t)limit < smem)
        return false;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess;
}

template <int HS>
static dsc_status forward(cudaStream_t stream, float *out, float *lse, const float *q, const float *k,
                          const float *v, int64_t b, int64_t t, int64_t nh, int64_t nkv, bool *done) {
    size_t smem = (size_t)(3 * FA_TILE * HS + FA_TILE * FA_TILE) * sizeof(float);
    *done = fits_shared_memory(attention_forward_tiled_kernel<HS>, smem);
    if (!*done) return NULL;
    dim3 grid((unsigned int)((t + FA_TILE - 1) / FA_TILE), (unsigned int)(b * nh));
    attention_forward_tiled_kernel<HS>
        <<<grid, FA_THREADS, smem, stream>>>(out, lse, q, k, v, t, nh, nkv, 1.0f / sqrtf((float)HS));
    CUDA_LAUNCHED(attention_forward_tiled_kernel);
    return NULL;
}

template <int HS>
static dsc_status backward(cudaStream_t stream, float *dq, float *dk, float *dv, const float *dout, const float *q,
                           const float *k, const float *v, const float *out, const float *lse, int64_t b,
                           int64_t t, int64_t nh, int64_t nkv, bool *done) {
    size_t smem = (size_t)(5 * FA_TILE * HS + 2 * FA_TILE * FA_TILE + 2 * FA_TILE) * sizeof(float);
    *done = fits_shared_memory(attention_backward_tiled_kernel<HS>, smem);
    if (!*done) return NULL;
    CUDA_CALL(cudaMemsetAsync(dq, 0, (size_t)(b * t * nh * HS) * sizeof(float), stream));
    dim3 grid((unsigned int)((t + FA_TILE - 1) / FA_TILE), (unsigned int)(b * nkv));
    attention_backward_tiled_kernel<HS><<<grid, FA_THREADS, smem, stream>>>(dq, dk, dv, dout, q, k, v, out, lse, t,
                                                                            nh, nkv, 1.0f / sqrtf((float)HS));
    CUDA_LAUNCHED(attention_backward_tiled_kernel);
    return NULL;
}

dsc_status dsc_cuda_flash_attention_forward(const dsc_backend *backend, float *out, float *lse, const float *q,
                                            const float *k, const float *v, int64_t b, int64_t t, int64_t nh,
                                            int64_t nkv, int64_t hs, bool *done) {
    *done = false;
    if (b * nh > 65535) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    if (hs == 64) return forward<64>(cx->stream, out, lse, q, k, v, b, t, nh, nkv, done);
    if (hs == 128) return forward<128>(cx->stream, out, lse, q, k, v, b, t, nh, nkv, done);
    return NULL;
}

dsc_status dsc_cuda_flash_attention_backward(const dsc_backend *backend, float *dq, float *dk, float *dv,
                                             const float *dout, const float *q, const float *k, const float *v,
                                             const float *out, const float *lse, int64_t b, int64_t t, int64_t nh,
                                             int64_t nkv, int64_t hs, bool *done) {
    *done = false;
    if (b * nkv > 65535) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    if (hs == 64) return backward<64>(cx->stream, dq, dk, dv, dout, q, k, v, out, lse, b, t, nh, nkv, done);
    if (hs == 128) return backward<128>(cx->stream, dq, dk, dv, dout, q, k, v, out, lse, b, t, nh, nkv, done);
    return NULL;
}
