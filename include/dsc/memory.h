/* dsc/memory.h — allocation with per-category accounting.
 *
 * Every byte dsc allocates for tensors goes through dsc_mem_alloc with a
 * category, so memory claims (ZeRO's formulas, KV-cache budgets) are proven
 * from counters rather than estimated. Counters are per process (= per rank)
 * and track current and peak bytes per category and in total. Callers pass
 * the size and category back on free, as ggml-style explicit ownership.
 *
 * Thread-safety: the counters are process-global atomics, so allocation,
 * accounting and dsc_mem_get_stats are safe from any thread (a snapshot is
 * not atomic across categories). Allocation on a device creates its backend
 * object on first use, under the registry's lock (core/backend.h). */
#ifndef DSC_MEMORY_H
#define DSC_MEMORY_H

#include "dsc/api.h"
#include <stddef.h>
#include <stdint.h>

#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_mem_category {
    DSC_MEM_PARAMS = 0,
    DSC_MEM_GRADS,
    DSC_MEM_OPTIM, /* optimizer state (Adam moments, master copies) */
    DSC_MEM_ACTIVATIONS,
    DSC_MEM_KV_CACHE,
    DSC_MEM_COMM, /* communication / bucket buffers */
    DSC_MEM_OTHER,
    DSC_MEM_CATEGORY_COUNT
} dsc_mem_category;

typedef enum dsc_device_type { DSC_DEVICE_CPU = 0, DSC_DEVICE_CUDA = 1, DSC_DEVICE_TYPE_COUNT } dsc_device_type;

typedef struct dsc_device {
    dsc_device_type type;
    int index; /* cuda:N; 0 for cpu */
} dsc_device;

#define DSC_CPU ((dsc_device){DSC_DEVICE_CPU, 0})

typedef struct dsc_mem_stats {
    int64_t current[DSC_MEM_CATEGORY_COUNT];
    int64_t peak[DSC_MEM_CATEGORY_COUNT];
    int64_t total_current;
    int64_t total_peak;
} dsc_mem_stats;

/* Alignment of every allocation (bytes); fits AVX-512 and CUDA's 256-byte rule. */
#define DSC_MEM_ALIGN 256
/* Host allocations of at least DSC_MEM_HUGE_MIN bytes are DSC_MEM_HUGE_PAGE-aligned, rounded up
 * to whole huge pages and advised to be backed by transparent huge pages (fewer TLB misses for
 * the weights decode streams); the accounting counts the bytes asked for. */
#define DSC_MEM_HUGE_PAGE ((size_t)2 << 20)
#define DSC_MEM_HUGE_MIN (2 * DSC_MEM_HUGE_PAGE)

/* Zero-filled allocation of `bytes` on `device`, counted under `category`.
 * On success *ptr is never NULL, even for 0 bytes. */
DSC_API dsc_status dsc_mem_alloc(void **ptr, size_t bytes, dsc_mem_category category, dsc_device device);
DSC_API void dsc_mem_free(void *ptr, size_t bytes, dsc_mem_category category, dsc_device device);

/* For memory obtained elsewhere (e.g. a library's buffers) that should still be counted. */
DSC_API void dsc_mem_account(dsc_mem_category category, int64_t delta_bytes);

DSC_API void dsc_mem_get_stats(dsc_mem_stats *out);
DSC_API void dsc_mem_reset_peaks(void);
DSC_API const char *dsc_mem_category_name(dsc_mem_category category);
DSC_API const char *dsc_device_name(dsc_device device, char *buf, size_t len); /* "cpu", "cuda:1" */

/* Number of CUDA devices visible (0 when CUDA is not built or none is present). */
DSC_API int dsc_cuda_device_count(void);
/* Waits until all work queued on `device` is done (nothing to wait for on the CPU). */
DSC_API dsc_status dsc_device_synchronize(dsc_device device);

#ifdef __cplusplus
}
#endif
#endif
