/* GEMM on CUDA through cuBLAS (strided-batched, FP32 math, no TF32) plus the
 * bias broadcast and the bias gradient. Row-major operands are passed to
 * column-major cuBLAS by computing out^T = op(b)^T op(a)^T, i.e. swapping
 * the operands, which needs no transposed copies. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

static __global__ void add_bias_kernel(float *out, const float *bias, int64_t rows, int64_t n) {
    GRID_STRIDE(i, rows * n) out[i] += bias[i % n];
}

/* dbias[c] += sum_r dy[r, c]: a block owns 32 columns of one chunk of rows;
 * its 8 warps split the chunk, combine in shared memory, and chunks meet
 * through atomicAdd. */
static __global__ void bias_grad_kernel(float *dbias, const float *dy, int64_t n, int64_t oc, int64_t chunk) {
    __shared__ float partial[WARPS_PER_BLOCK][33];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int64_t c = blockIdx.x * 32 + lane, r0 = blockIdx.y * chunk, r1 = r0 + chunk < n ? r0 + chunk : n;
    float acc = 0;
    if (c < oc)
        for (int64_t r = r0 + warp; r < r1; r += WARPS_PER_BLOCK)
            acc += dy[r * oc + c];
    partial[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && c < oc) {
        for (int w = 1; w < WARPS_PER_BLOCK; w++)
            acc += partial[w][lane];
        atomicAdd(dbias + c, acc);
    }
}

dsc_status dsc_cuda_gemm(const dsc_backend *backend, float *out, const float *a, const float *b, const float *bias,
                         int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
                         float beta) {
    if (batch == 0 || m == 0 || n == 0) return NULL;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return dsc_error(DSC_ERR_UNSUPPORTED,
                         "cublasSgemmStridedBatched: extents (%lld, %lld, %lld) exceed 32 bits", (long long)m,
                         (long long)n, (long long)k);
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    int lda = (int)(trans_a ? m : k), ldb = (int)(trans_b ? k : n); /* row lengths as stored */
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    CUBLAS_CALL(cublasSgemmStridedBatched(cx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, b,
                                          ldb, k * n, a, lda, m * k, &beta, out, (int)n, m * n, (int)batch));
    if (bias) {
        add_bias_kernel<<<cuda_blocks(batch * m * n), CUDA_BLOCK, 0, cx->stream>>>(out, bias, batch * m, n);
        CUDA_LAUNCHED(add_bias_kernel);
    }
    return NULL;
}

dsc_status dsc_cuda_linear_backward_bias(const dsc_backend *backend, float *dbias, const float *dy, int64_t n,
                                         int64_t oc) {
    if (oc == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    if (n == 0) return NULL;
    int64_t chunk = cuda_row_chunk(n);
    dim3 grid((unsigned int)((oc + 31) / 32), (unsigned int)((n + chunk - 1) / chunk));
    bias_grad_kernel<<<grid, CUDA_BLOCK, 0, cx->stream>>>(dbias, dy, n, oc, chunk);
    CUDA_LAUNCHED(bias_grad_kernel);
    return NULL;
}
