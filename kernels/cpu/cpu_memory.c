/* Host memory for the CPU backend: aligned, zero-filled, and copies that are
 * plain memcpy; and the registration of the CPU table when the library loads.
 * The kernel table is defined with the kernels. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"

static dsc_status cpu_alloc(const dsc_backend *backend, void **ptr, size_t bytes) {
    (void)backend;
    *ptr = NULL;
    if (bytes > SIZE_MAX - DSC_MEM_ALIGN) return dsc_error(DSC_ERR_NOMEM, "host allocation of %zu bytes", bytes);
    size_t rounded = (bytes + DSC_MEM_ALIGN - 1) / DSC_MEM_ALIGN * DSC_MEM_ALIGN;
    *ptr = aligned_alloc(DSC_MEM_ALIGN, rounded);
    if (!*ptr) return dsc_error(DSC_ERR_NOMEM, "host allocation of %zu bytes failed", bytes);
    memset(*ptr, 0, rounded);
    return NULL;
}

static void cpu_free(const dsc_backend *backend, void *ptr) {
    (void)backend;
    free(ptr);
}

static dsc_status cpu_copy(const dsc_backend *backend, void *dst, const void *src, size_t bytes) {
    (void)backend;
    memmove(dst, src, bytes);
    return NULL;
}

static dsc_status cpu_synchronize(const dsc_backend *backend) {
    (void)backend;
    return NULL;
}

extern const struct dsc_kernel_ops dsc_cpu_kernel_ops;

static const dsc_backend_iface cpu_iface = {
    .name = "cpu",
    .mem_alloc = cpu_alloc,
    .mem_free = cpu_free,
    .memcpy_to_host = cpu_copy,
    .memcpy_from_host = cpu_copy,
    .memcpy_device = cpu_copy,
    .synchronize = cpu_synchronize,
    .kernels = &dsc_cpu_kernel_ops,
};

__attribute__((constructor)) static void register_cpu_backend(void) {
    dsc_backend_register(DSC_DEVICE_CPU, &cpu_iface);
}
