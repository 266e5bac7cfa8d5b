/* Flat-vector reductions and elementwise helpers on CUDA. Reductions
 * accumulate per block in double and combine with atomicAdd into the device
 * scratch, whose value is copied back to the host (a synchronisation). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

static __global__ void sum_kernel(cuda_scratch *scratch, const float *x, int64_t n, bool squares) {
    __shared__ double partial[CUDA_BLOCK];
    double acc = 0;
    GRID_STRIDE(i, n) acc += squares ? (double)x[i] * x[i] : (double)x[i];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = CUDA_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(&scratch->acc, partial[0]);
}

static __global__ void finite_kernel(cuda_scratch *scratch, const float *x, int64_t n) {
    GRID_STRIDE(i, n) {
        if (!isfinite(x[i])) scratch->flag = 1;
    }
}

/* Clears the scratch, runs a reduction into it and copies it back. */
/* kind: 0 sum, 1 sum of squares, 2 finiteness flag. */
static dsc_status reduce(const dsc_backend *backend, const float *x, int64_t n, int kind, cuda_scratch *result) {
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    cuda_scratch *scratch = cx->scratch;
    CUDA_CALL(cudaMemsetAsync(scratch, 0, sizeof *scratch, cx->stream));
    unsigned int blocks = cuda_blocks(n) < 1024 ? cuda_blocks(n) : 1024;
    if (kind == 2) {
        finite_kernel<<<blocks, CUDA_BLOCK, 0, cx->stream>>>(scratch, x, n);
        CUDA_LAUNCHED(finite_kernel);
    } else {
        sum_kernel<<<blocks, CUDA_BLOCK, 0, cx->stream>>>(scratch, x, n, kind == 1);
        CUDA_LAUNCHED(sum_kernel);
    }
    CUDA_CALL(cudaMemcpyAsync(result, scratch, sizeof *result, cudaMemcpyDeviceToHost, cx->stream));
    CUDA_CALL(cudaStreamSynchronize(cx->stream));
    return NULL;
}

dsc_status dsc_cuda_sum_squares(const dsc_backend *backend, double *out, const float *x, int64_t n) {
    cuda_scratch r = {};
    if (n > 0) DSC_TRY(reduce(backend, x, n, 1, &r));
    *out = r.acc;
    return NULL;
}

dsc_status dsc_cuda_sum(const dsc_backend *backend, double *out, const float *x, int64_t n) {
    cuda_scratch r = {};
    if (n > 0) DSC_TRY(reduce(backend, x, n, 0, &r));
    *out = r.acc;
    return NULL;
}

dsc_status dsc_cuda_all_finite(const dsc_backend *backend, bool *out, const float *x, int64_t n) {
    cuda_scratch r = {};
    if (n > 0) DSC_TRY(reduce(backend, x, n, 2, &r));
    *out = r.flag == 0;
    return NULL;
}

static __global__ void scale_kernel(float *x, float s, int64_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}
static __global__ void axpy_kernel(float *y, float a, const float *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] += a * x[i];
}
static __global__ void add_kernel(float *out, const float *a, const float *b, int64_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

dsc_status dsc_cuda_scale(const dsc_backend *backend, float *x, float s, int64_t n) {
    LAUNCH_ELEMENTWISE(scale_kernel, backend, n, x, s, n);
}
dsc_status dsc_cuda_axpy(const dsc_backend *backend, float *y, float a, const float *x, int64_t n) {
    LAUNCH_ELEMENTWISE(axpy_kernel, backend, n, y, a, x, n);
}
dsc_status dsc_cuda_add(const dsc_backend *backend, float *out, const float *a, const float *b, int64_t n) {
    LAUNCH_ELEMENTWISE(add_kernel, backend, n, out, a, b, n);
}

dsc_status dsc_cuda_zero(const dsc_backend *backend, float *x, int64_t n) {
    if (n == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    CUDA_CALL(cudaMemsetAsync(x, 0, (size_t)n * sizeof *x, cx->stream));
    return NULL;
}
