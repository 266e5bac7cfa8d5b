/* Per-device state of the CUDA backend: one cuBLAS handle and one small
 * scratch struct per device, created lazily under a lock the first time a
 * kernel on that device needs them and kept until the process exits (the only
 * allocations the CUDA kernels ever cause). Kernels run on the device that
 * holds their data, found from the output pointer. */
#include <pthread.h>

#include "dsc/memory.h"
#include "kernels/cuda/cuda_common.cuh"

#define MAX_DEVICES 64

static struct {
    cublasHandle_t blas;
    cuda_scratch *scratch;
} contexts[MAX_DEVICES];
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;

dsc_status dsc_cuda_enter(const void *ptr, int *device) {
    cudaPointerAttributes attr;
    CUDA_CALL(cudaPointerGetAttributes(&attr, ptr));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return dsc_error(DSC_ERR_INVALID, "CUDA kernel argument %p is not device memory", ptr);
    if (attr.device < 0 || attr.device >= MAX_DEVICES)
        return dsc_error(DSC_ERR_UNSUPPORTED, "cuda:%d is beyond the %d devices dsc supports", attr.device,
                         MAX_DEVICES);
    *device = attr.device;
    CUDA_CALL(cudaSetDevice(attr.device));
    return NULL;
}

/* Creates what is missing for `device` (current already); caller holds the lock. */
static dsc_status create_context(int device) {
    if (!contexts[device].blas) CUBLAS_CALL(cublasCreate(&contexts[device].blas));
    if (!contexts[device].scratch) {
        CUDA_CALL(cudaMalloc((void **)&contexts[device].scratch, sizeof(cuda_scratch)));
        dsc_mem_account(DSC_MEM_OTHER, (int64_t)sizeof(cuda_scratch));
    }
    return NULL;
}

dsc_status dsc_cuda_blas(int device, cublasHandle_t *out) {
    pthread_mutex_lock(&contexts_lock);
    dsc_status s = create_context(device);
    *out = contexts[device].blas;
    pthread_mutex_unlock(&contexts_lock);
    return dsc_error_wrap(s, "creating the CUDA context of cuda:%d", device);
}

dsc_status dsc_cuda_scratch(int device, cuda_scratch **out) {
    pthread_mutex_lock(&contexts_lock);
    dsc_status s = create_context(device);
    *out = contexts[device].scratch;
    pthread_mutex_unlock(&contexts_lock);
    return dsc_error_wrap(s, "creating the CUDA context of cuda:%d", device);
}
