/* Token (+ position) embedding on CUDA, and the id check shared with the
 * cross-entropy. The check runs on the device and copies back one small
 * struct, so a bad id is reported (by position) before anything is written;
 * that copy synchronises the stream. The backward scatter-adds with
 * atomicAdd, as repeated ids hit the same rows. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

static __global__ void check_ids_kernel(cuda_scratch *scratch, const int32_t *ids, int64_t n, int64_t limit,
                                        bool allow_negative) {
    GRID_STRIDE(i, n) {
        if (ids[i] >= limit || (!allow_negative && ids[i] < 0)) atomicMin(&scratch->first_bad, (int)i);
    }
}

static __global__ void reset_ids_kernel(cuda_scratch *scratch) {
    scratch->first_bad = INT32_MAX;
}

static __global__ void read_bad_id_kernel(cuda_scratch *scratch, const int32_t *ids) {
    if (scratch->first_bad != INT32_MAX) scratch->first_bad_id = ids[scratch->first_bad];
}

dsc_status dsc_cuda_check_ids(const dsc_backend *backend, const int32_t *ids, int64_t n, int64_t limit,
                              bool allow_negative, const char *what) {
    if (n == 0) return NULL;
    DSC_CHECK(n < INT32_MAX, DSC_ERR_UNSUPPORTED, "CUDA id check: %lld ids exceed 32-bit positions", (long long)n);
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    cuda_scratch *scratch = cx->scratch, result;
    reset_ids_kernel<<<1, 1, 0, cx->stream>>>(scratch);
    check_ids_kernel<<<cuda_blocks(n), CUDA_BLOCK, 0, cx->stream>>>(scratch, ids, n, limit, allow_negative);
    read_bad_id_kernel<<<1, 1, 0, cx->stream>>>(scratch, ids);
    CUDA_LAUNCHED(check_ids_kernel);
    CUDA_CALL(cudaMemcpyAsync(&result, scratch, sizeof result, cudaMemcpyDeviceToHost, cx->stream));
    CUDA_CALL(cudaStreamSynchronize(cx->stream));
    DSC_CHECK(result.first_bad == INT32_MAX, DSC_ERR_INVALID, "%s id %d at position %d is outside [0, %lld)", what,
              result.first_bad_id, result.first_bad, (long long)limit);
    return NULL;
}

static __global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const float *wte,
                                                const float *wpe, int64_t n, int64_t t, int64_t c) {
    GRID_STRIDE(idx, n * c) {
        int64_t i = idx / c, j = idx % c;
        out[idx] = wte[tokens[i] * c + j] + (wpe ? wpe[(i % t) * c + j] : 0.0f);
    }
}

static __global__ void embedding_backward_kernel(float *dwte, float *dwpe, const float *dout,
                                                 const int32_t *tokens, int64_t n, int64_t t, int64_t c) {
    GRID_STRIDE(idx, n * c) {
        int64_t i = idx / c, j = idx % c;
        atomicAdd(dwte + tokens[i] * c + j, dout[idx]);
        if (dwpe) atomicAdd(dwpe + (i % t) * c + j, dout[idx]);
    }
}

dsc_status dsc_cuda_embedding_forward(const dsc_backend *backend, float *out, const int32_t *tokens,
                                      const float *wte, const float *wpe, int64_t n, int64_t t, int64_t v,
                                      int64_t c) {
    DSC_TRY(dsc_cuda_check_ids(backend, tokens, n, v, false, "token"));
    LAUNCH_ELEMENTWISE(embedding_forward_kernel, backend, n * c, out, tokens, wte, wpe, n, t, c);
}

dsc_status dsc_cuda_embedding_backward(const dsc_backend *backend, float *dwte, float *dwpe, const float *dout,
                                       const int32_t *tokens, int64_t n, int64_t t, int64_t v, int64_t c) {
    DSC_TRY(dsc_cuda_check_ids(backend, tokens, n, v, false, "token"));
    LAUNCH_ELEMENTWISE(embedding_backward_kernel, backend, n * c, dwte, dwpe, dout, tokens, n, t, c);
}
