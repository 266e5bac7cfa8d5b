/* The CUDA backend: device memory and the CUDA kernel table. Only compiled
 * when dsc is built with nvcc. C linkage so the C side can call it. */
#ifndef DSC_KERNELS_CUDA_BACKEND_H
#define DSC_KERNELS_CUDA_BACKEND_H

#include "dsc/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

dsc_status dsc_cuda_backend_get(int index, const dsc_backend **out);
int dsc_cuda_count_devices(void);

#ifdef __cplusplus
}
#endif
#endif
