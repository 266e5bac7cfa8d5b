/* Host memory for the CPU backend: aligned, zero-filled, and copies that are
 * plain memcpy; and the registration of the CPU table when the library loads.
 * The kernel table is defined with the kernels. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/backend.h"
#include "kernels/cpu/cpu_kernels.h"

/* Allocations of DSC_MEM_HUGE_MIN bytes or more start on a 2 MiB boundary, fill whole 2 MiB
 * pages and ask for transparent huge pages (Linux's common `madvise` mode gives them only when
 * asked): decode streams every weight once per token, and through 4 KiB pages every 4 KiB cost
 * a TLB miss; the f32 GEMV read 23 GB/s from 4 KiB pages and 27 from huge ones (2 threads,
 * Sapphire Rapids). Where the kernel has no huge pages the advice is a no-op. */
static size_t round_up(size_t bytes, size_t to) {
    return (bytes + to - 1) / to * to;
}

static dsc_status cpu_alloc(const dsc_backend *backend, void **ptr, size_t bytes) {
    (void)backend;
    *ptr = NULL;
    if (bytes > SIZE_MAX - DSC_MEM_HUGE_PAGE)
        return dsc_error(DSC_ERR_NOMEM, "host allocation of %zu bytes", bytes);
    const bool huge = bytes >= DSC_MEM_HUGE_MIN;
    const size_t align = huge ? DSC_MEM_HUGE_PAGE : DSC_MEM_ALIGN, rounded = round_up(bytes, align);
    *ptr = aligned_alloc(align, rounded);
    if (!*ptr) return dsc_error(DSC_ERR_NOMEM, "host allocation of %zu bytes failed", bytes);
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(*ptr, rounded, MADV_HUGEPAGE); /* advice: refused is as if not given */
#endif
    /* The pages are faulted in here, huge where granted, a 2 MiB page at a time over the kernels'
     * threads for a large allocation: on a VM each first touch is a fault in the guest and in the
     * host, and a model's buffers (GPT-2 with AdamW: 2.9 GB) took seconds on one thread.
     * Small ones stay out of OpenMP altogether: even a region whose `if` is false enters libgomp and
     * wakes its barrier with a futex call, which took most of a 1 KB all-reduce's time (its request
     * and counts are small allocations). */
    char *at = *ptr;
    if (!huge || dsc_cpu_pool_scope()) { /* the pool, when in its scope, owns the cores */
        memset(at, 0, rounded);
        return NULL;
    }
    const int64_t pages = (int64_t)(rounded / DSC_MEM_HUGE_PAGE);
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) schedule(static)
    for (int64_t p = 0; p < pages; p++)
        memset(at + (size_t)p * DSC_MEM_HUGE_PAGE, 0, DSC_MEM_HUGE_PAGE);
    memset(at + (size_t)pages * DSC_MEM_HUGE_PAGE, 0, rounded - (size_t)pages * DSC_MEM_HUGE_PAGE);
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
