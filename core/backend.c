/* The backend registry: maps a device type to its function table. Core knows
 * no backend; each backend target (kernels/cpu, kernels/cuda) registers its
 * table when the library is loaded, so a build without CUDA simply has no
 * CUDA entry. Lookups never allocate. */
#include "dsc/backend.h"

static const dsc_backend *registry[DSC_DEVICE_TYPE_COUNT];

void dsc_backend_register(dsc_device_type type, const dsc_backend *backend) {
    DSC_ASSERT((unsigned)type < DSC_DEVICE_TYPE_COUNT && backend);
    registry[type] = backend;
}

dsc_status dsc_backend_get(dsc_device device, const dsc_backend **out) {
    *out = NULL;
    if ((unsigned)device.type >= DSC_DEVICE_TYPE_COUNT)
        return dsc_error(DSC_ERR_INVALID, "unknown device type %d", (int)device.type);
    const dsc_backend *backend = registry[device.type];
    char name[32];
    if (!backend)
        return dsc_error(DSC_ERR_UNSUPPORTED, "device %s requested but dsc was built without %s",
                         dsc_device_name(device, name, sizeof name), device.type == DSC_DEVICE_CUDA ? "CUDA" : "it");
    if (backend->device_count) {
        int n = backend->device_count();
        if (device.index < 0 || device.index >= n)
            return dsc_error(DSC_ERR_UNSUPPORTED, "device %s requested but %d %s device(s) are present",
                             dsc_device_name(device, name, sizeof name), n, backend->name);
    }
    *out = backend;
    return NULL;
}

int dsc_cuda_device_count(void) {
    const dsc_backend *cuda = registry[DSC_DEVICE_CUDA];
    return cuda && cuda->device_count ? cuda->device_count() : 0;
}
