/* CUDA device memory and copies for the CUDA backend, and the registration
 * of its table when the library loads. Zero-fill and copies go to the
 * device's compute stream, so they are ordered with the kernels; a copy that
 * involves the host is complete when it returns. Every CUDA call is checked
 * and turned into a dsc_status naming the call and the device. */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"

#define CUDA_TRY(call, backend)                                                                                   \
    do {                                                                                                          \
        cudaError_t e_ = (call);                                                                                  \
        if (e_ != cudaSuccess)                                                                                    \
            return dsc_error(DSC_ERR_BACKEND, "%s on cuda:%d: %s", #call, (backend)->device.index,                \
                             cudaGetErrorString(e_));                                                             \
    } while (0)

static dsc_status cuda_alloc(const dsc_backend *backend, void **ptr, size_t bytes) {
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    CUDA_TRY(cudaMalloc(ptr, bytes), backend);
    CUDA_TRY(cudaMemsetAsync(*ptr, 0, bytes, cx->stream), backend);
    return NULL;
}

static void cuda_free(const dsc_backend *backend, void *ptr) {
    cudaSetDevice(backend->device.index);
    cudaFree(ptr);
}

static dsc_status copy(const dsc_backend *backend, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, cx->stream), backend);
    if (kind != cudaMemcpyDeviceToDevice) CUDA_TRY(cudaStreamSynchronize(cx->stream), backend);
    return NULL;
}

static dsc_status cuda_to_host(const dsc_backend *backend, void *dst, const void *src, size_t bytes) {
    return copy(backend, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static dsc_status cuda_from_host(const dsc_backend *backend, void *dst, const void *src, size_t bytes) {
    return copy(backend, dst, src, bytes, cudaMemcpyHostToDevice);
}

static dsc_status cuda_device_copy(const dsc_backend *backend, void *dst, const void *src, size_t bytes) {
    return copy(backend, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

static dsc_status cuda_synchronize(const dsc_backend *backend) {
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    CUDA_TRY(cudaStreamSynchronize(cx->stream), backend);
    return NULL;
}

static int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

extern "C" const struct dsc_kernel_ops dsc_cuda_kernel_ops;

static const dsc_backend_iface cuda_iface = {
    "cuda",       cuda_device_count, dsc_cuda_context_create, cuda_alloc,       cuda_free,
    cuda_to_host, cuda_from_host,    cuda_device_copy,        cuda_synchronize, &dsc_cuda_kernel_ops,
};

__attribute__((constructor)) static void register_cuda_backend(void) {
    dsc_backend_register(DSC_DEVICE_CUDA, &cuda_iface);
}
