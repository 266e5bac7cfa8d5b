/* Shared pieces of the CUDA kernels: error-check macros that turn CUDA and
 * cuBLAS failures into statuses naming the call or kernel, the per-device
 * context behind a CUDA backend object (compute stream, cuBLAS handle and a
 * small result scratch, created once with the object), launch-size helpers
 * and warp/block reductions. It holds no operation. */
#ifndef DSC_KERNELS_CUDA_COMMON_CUH
#define DSC_KERNELS_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/backend.h"
#include "dsc/kernels.h"

#define CUDA_CALL(call)                                                                                           \
    do {                                                                                                          \
        cudaError_t e_ = (call);                                                                                  \
        if (e_ != cudaSuccess) return dsc_error(DSC_ERR_BACKEND, "%s: %s", #call, cudaGetErrorString(e_));        \
    } while (0)

/* After a launch: a bad configuration or an earlier asynchronous fault. */
#define CUDA_LAUNCHED(kernel)                                                                                     \
    do {                                                                                                          \
        cudaError_t e_ = cudaGetLastError();                                                                      \
        if (e_ != cudaSuccess)                                                                                    \
            return dsc_error(DSC_ERR_BACKEND, "CUDA kernel %s: %s", #kernel, cudaGetErrorString(e_));             \
    } while (0)

#define CUBLAS_CALL(call)                                                                                         \
    do {                                                                                                          \
        cublasStatus_t e_ = (call);                                                                               \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                                          \
            return dsc_error(DSC_ERR_BACKEND, "%s: %s", #call, cublasGetStatusString(e_));                        \
    } while (0)

/* Results that reductions and id checks copy back to the host. */
typedef struct cuda_scratch {
    double acc;       /* sum or sum of squares */
    int flag;         /* set when a non-finite value was seen */
    int first_bad;    /* smallest position of an out-of-range id, INT32_MAX when none */
    int first_bad_id; /* the id found there */
} cuda_scratch;

/* The context of one device (dsc_backend.ctx). Every kernel, copy and
 * cuBLAS call of the backend goes to `stream`. */
typedef struct cuda_context {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas; /* bound to stream */
    cuda_scratch *scratch;
} cuda_context;

/* Creates backend->ctx and backend->stream for backend->device (the init entry of the CUDA table). */
dsc_status dsc_cuda_context_create(dsc_backend *backend);
/* Makes the backend's device current and returns its context. */
dsc_status dsc_cuda_enter(const dsc_backend *backend, cuda_context **cx);

#define CUDA_BLOCK 256
#define WARPS_PER_BLOCK (CUDA_BLOCK / 32)

/* Blocks for one thread per element, capped so grid-stride loops cover the rest. */
static inline unsigned int cuda_blocks(int64_t n) {
    int64_t b = (n + CUDA_BLOCK - 1) / CUDA_BLOCK;
    return (unsigned int)(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}
/* Blocks for one warp per row. */
static inline unsigned int cuda_warp_blocks(int64_t rows) {
    return (unsigned int)((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
}

/* Rows per block of a column reduction: enough blocks to fill the GPU, at most 65535 chunks. */
static inline int64_t cuda_row_chunk(int64_t rows) {
    int64_t chunk = 256;
    while ((rows + chunk - 1) / chunk > 65535)
        chunk *= 2;
    return chunk;
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum (or max) over a block of CUDA_BLOCK threads; every thread gets the result. */
__device__ __forceinline__ float block_reduce(float x, bool is_max) {
    __shared__ float partial[WARPS_PER_BLOCK];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = is_max ? warp_max(x) : warp_sum(x);
    __syncthreads(); /* partial may still be read by a previous call */
    if (lane == 0) partial[warp] = x;
    __syncthreads();
    x = lane < WARPS_PER_BLOCK ? partial[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(x) : warp_sum(x);
}

#define GRID_STRIDE(i, n)                                                                                         \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* Enters the backend's device and launches an elementwise kernel over n elements on its stream. */
#define LAUNCH_ELEMENTWISE(kernel, backend, n, ...)                                                               \
    do {                                                                                                          \
        if ((n) == 0) return NULL;                                                                                \
        cuda_context *cx_;                                                                                        \
        DSC_TRY(dsc_cuda_enter((backend), &cx_));                                                                 \
        kernel<<<cuda_blocks(n), CUDA_BLOCK, 0, cx_->stream>>>(__VA_ARGS__);                                      \
        CUDA_LAUNCHED(kernel);                                                                                    \
        return NULL;                                                                                              \
    } while (0)

#endif
