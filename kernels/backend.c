/* The backend registry: maps a device to its function table. The CPU table
 * is always present; the CUDA table exists when dsc is built with nvcc. */
#include "dsc/backend.h"

#include "kernels/cpu/cpu_backend.h"
#ifdef DSC_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

dsc_status dsc_backend_get(dsc_device device, const dsc_backend **out) {
    switch (device.type) {
    case DSC_DEVICE_CPU: *out = &dsc_cpu_backend; return NULL;
    case DSC_DEVICE_CUDA:
#ifdef DSC_HAVE_CUDA
        return dsc_cuda_backend_get(device.index, out);
#else
        *out = NULL;
        return dsc_error(DSC_ERR_UNSUPPORTED, "device cuda:%d requested but dsc was built without CUDA",
                         device.index);
#endif
    }
    *out = NULL;
    return dsc_error(DSC_ERR_INVALID, "unknown device type %d", (int)device.type);
}

int dsc_cuda_device_count(void) {
#ifdef DSC_HAVE_CUDA
    return dsc_cuda_count_devices();
#else
    return 0;
#endif
}
