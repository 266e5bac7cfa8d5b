/* Fused softmax + cross-entropy on CUDA: one block per row (V is large), the
 * row's max and sum of exponentials by block reductions. The backward
 * recomputes them, so dlogits may overwrite logits. Negative targets are
 * ignored; ids >= V are reported before any launch writes. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

/* Max and sum of exp(x - max) over one row, shared by the whole block. */
__device__ void row_stats(const float *x, int64_t v, float *mx_out, float *sum_out) {
    float mx = -INFINITY, sum = 0;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
        mx = fmaxf(mx, x[j]);
    mx = block_reduce(mx, true);
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
        sum += expf(x[j] - mx);
    *sum_out = block_reduce(sum, false);
    *mx_out = mx;
}

static __global__ void cross_entropy_forward_kernel(float *losses, const float *logits, const int32_t *targets,
                                                    int64_t v) {
    int64_t i = blockIdx.x;
    if (targets[i] < 0) {
        if (threadIdx.x == 0) losses[i] = 0.0f;
        return;
    }
    float mx, sum;
    row_stats(logits + i * v, v, &mx, &sum);
    if (threadIdx.x == 0) losses[i] = logf(sum) + mx - logits[i * v + targets[i]];
}

static __global__ void cross_entropy_backward_kernel(float *dlogits, const float *logits, const int32_t *targets,
                                                     int64_t v, float dloss) {
    int64_t i = blockIdx.x;
    const float *row = logits + i * v; /* may alias d */
    float *d = dlogits + i * v;
    int32_t target = targets[i];
    if (target < 0) {
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
            d[j] = 0.0f;
        return;
    }
    float mx, sum;
    row_stats(row, v, &mx, &sum);
    float inv = dloss / sum;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
        d[j] = expf(row[j] - mx) * inv - (j == target ? dloss : 0.0f);
}

dsc_status dsc_cuda_cross_entropy_forward(const dsc_backend *backend, float *losses, const float *logits,
                                          const int32_t *targets, int64_t n, int64_t v) {
    DSC_TRY(dsc_cuda_check_ids(backend, targets, n, v, true, "target"));
    if (n == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    DSC_CHECK(n <= INT32_MAX, DSC_ERR_UNSUPPORTED, "CUDA cross-entropy: %lld rows exceed the grid", (long long)n);
    cross_entropy_forward_kernel<<<(unsigned int)n, CUDA_BLOCK, 0, cx->stream>>>(losses, logits, targets, v);
    CUDA_LAUNCHED(cross_entropy_forward_kernel);
    return NULL;
}

dsc_status dsc_cuda_cross_entropy_backward(const dsc_backend *backend, float *dlogits, const float *logits,
                                           const int32_t *targets, int64_t n, int64_t v, float dloss) {
    DSC_TRY(dsc_cuda_check_ids(backend, targets, n, v, true, "target"));
    if (n == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    DSC_CHECK(n <= INT32_MAX, DSC_ERR_UNSUPPORTED, "CUDA cross-entropy: %lld rows exceed the grid", (long long)n);
    cross_entropy_backward_kernel<<<(unsigned int)n, CUDA_BLOCK, 0, cx->stream>>>(dlogits, logits, targets, v,
                                                                                  dloss);
    CUDA_LAUNCHED(cross_entropy_backward_kernel);
    return NULL;
}
