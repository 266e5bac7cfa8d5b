/* The CPU backend's function table (memory half and kernel table). */
#ifndef DSC_KERNELS_CPU_BACKEND_H
#define DSC_KERNELS_CPU_BACKEND_H

#include "dsc/backend.h"

extern const dsc_backend dsc_cpu_backend;

#endif
