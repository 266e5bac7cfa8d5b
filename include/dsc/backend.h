/* dsc/backend.h — a compute device as a table of functions.
 *
 * One table per device type (CPU always, CUDA when built). Each backend
 * registers its table when the library loads; dsc_backend_get finds it by
 * device, so the rest of dsc never branches on the device type. The memory
 * half of the table serves the allocator; `kernels` points to the operation
 * table declared in dsc/kernels.h. The registry is process-global, written
 * only while the library loads and read-only afterwards, so lookups are
 * thread-safe. */
#ifndef DSC_BACKEND_H
#define DSC_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "dsc/memory.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dsc_kernel_ops;

typedef struct dsc_backend {
    const char *name;
    /* Zero-filled, DSC_MEM_ALIGN-aligned memory on device `index`. */
    dsc_status (*mem_alloc)(void **ptr, size_t bytes, int index);
    void (*mem_free)(void *ptr, int index);
    /* Copies between this device and the host or within the device. */
    dsc_status (*memcpy_to_host)(void *dst, const void *src, size_t bytes, int index);
    dsc_status (*memcpy_from_host)(void *dst, const void *src, size_t bytes, int index);
    dsc_status (*memcpy_device)(void *dst, const void *src, size_t bytes, int index);
    dsc_status (*synchronize)(int index);
    /* Devices of this type present; NULL when any index is accepted (cpu). */
    int (*device_count)(void);
    const struct dsc_kernel_ops *kernels;
} dsc_backend;

/* Installs the table for `type`; called by each backend when the library loads. */
void dsc_backend_register(dsc_device_type type, const dsc_backend *backend);

/* The backend for `device`; an error names the device when it is not built in
 * or not present. */
dsc_status dsc_backend_get(dsc_device device, const dsc_backend **out);

/* Number of CUDA devices visible (0 when CUDA is not built or none is present). */
int dsc_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
