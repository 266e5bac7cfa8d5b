/* CUDA device memory and copies for the CUDA backend, and the registration
 * of its table when the library loads. Every CUDA call is checked and turned
 * into a dsc_status naming the call and the device. */
#include <cuda_runtime.h>

#include "dsc/backend.h"

#define CUDA_TRY(call, index)                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess)                                                                       \
            return dsc_error(DSC_ERR_BACKEND, "%s on cuda:%d: %s", #call, (index), cudaGetErrorString(e_)); \
    } while (0)

static dsc_status cuda_alloc(void **ptr, size_t bytes, int index) {
    CUDA_TRY(cudaSetDevice(index), index);
    CUDA_TRY(cudaMalloc(ptr, bytes), index);
    CUDA_TRY(cudaMemset(*ptr, 0, bytes), index);
    return NULL;
}

static void cuda_free(void *ptr, int index) {
    cudaSetDevice(index);
    cudaFree(ptr);
}

static dsc_status cuda_to_host(void *dst, const void *src, size_t bytes, int index) {
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), index);
    return NULL;
}

static dsc_status cuda_from_host(void *dst, const void *src, size_t bytes, int index) {
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), index);
    return NULL;
}

static dsc_status cuda_device_copy(void *dst, const void *src, size_t bytes, int index) {
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), index);
    return NULL;
}

static dsc_status cuda_synchronize(int index) {
    CUDA_TRY(cudaSetDevice(index), index);
    CUDA_TRY(cudaDeviceSynchronize(), index);
    return NULL;
}

static int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

extern "C" const struct dsc_kernel_ops dsc_cuda_kernel_ops;

static const dsc_backend cuda_backend = {
    "cuda", cuda_alloc, cuda_free, cuda_to_host, cuda_from_host, cuda_device_copy, cuda_synchronize,
    cuda_device_count, &dsc_cuda_kernel_ops,
};

__attribute__((constructor)) static void register_cuda_backend(void) {
    dsc_backend_register(DSC_DEVICE_CUDA, &cuda_backend);
}
