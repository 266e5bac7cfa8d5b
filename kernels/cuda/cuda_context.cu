/* The context of a CUDA backend object: one compute stream, one cuBLAS
 * handle bound to it and one small scratch struct per device, created when
 * the device's backend object is created (core/backend.c, once per device,
 * under the registry's lock) and kept until the process exits (the only
 * allocations the CUDA kernels ever cause). Kernels run on the device of the
 * backend object they are given, which comes from the tensors' device field;
 * nothing here inspects a pointer. */
#include <stdlib.h>

#include "dsc/memory.h"
#include "kernels/cuda/cuda_common.cuh"

/* The stream is created blocking (not cudaStreamNonBlocking): work that still
 * goes to the legacy default stream (cudaFree, other libraries) stays ordered
 * with it. Communication streams are ordered by events (docs/kernels.md). */
static dsc_status create(cuda_context *cx) {
    CUDA_CALL(cudaSetDevice(cx->device));
    CUDA_CALL(cudaStreamCreate(&cx->stream));
    CUBLAS_CALL(cublasCreate(&cx->blas));
    CUBLAS_CALL(cublasSetStream(cx->blas, cx->stream));
    CUDA_CALL(cudaMalloc((void **)&cx->scratch, sizeof(cuda_scratch)));
    dsc_mem_account(DSC_MEM_OTHER, (int64_t)sizeof(cuda_scratch));
    return NULL;
}

static void destroy(cuda_context *cx) {
    if (cx->scratch) {
        cudaFree(cx->scratch);
        dsc_mem_account(DSC_MEM_OTHER, -(int64_t)sizeof(cuda_scratch));
    }
    if (cx->blas) cublasDestroy(cx->blas);
    if (cx->stream) cudaStreamDestroy(cx->stream);
    free(cx);
}

dsc_status dsc_cuda_context_create(dsc_backend *backend) {
    cuda_context *cx = (cuda_context *)calloc(1, sizeof *cx);
    if (!cx) return dsc_error(DSC_ERR_NOMEM, "allocating the CUDA context of cuda:%d", backend->device.index);
    cx->device = backend->device.index;
    dsc_status s = create(cx);
    if (s) {
        destroy(cx);
        return s;
    }
    backend->ctx = cx;
    backend->stream = cx->stream;
    return NULL;
}

dsc_status dsc_cuda_enter(const dsc_backend *backend, cuda_context **cx) {
    *cx = (cuda_context *)backend->ctx;
    CUDA_CALL(cudaSetDevice((*cx)->device));
    return NULL;
}
