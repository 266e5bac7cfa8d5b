/* Allocation with per-category accounting. The counters are process-wide
 * atomics: a rank is a process, and OpenMP threads may allocate concurrently. */
#include "dsc/memory.h"

#include "core/backend.h"

#include <stdatomic.h>
#include <stdio.h>

static _Atomic int64_t current[DSC_MEM_CATEGORY_COUNT];
static _Atomic int64_t peak[DSC_MEM_CATEGORY_COUNT];
static _Atomic int64_t total_current;
static _Atomic int64_t total_peak;

static void raise_peak(_Atomic int64_t *p, int64_t value) {
    int64_t old = atomic_load(p);
    while (value > old && !atomic_compare_exchange_weak(p, &old, value)) {
    }
}

void dsc_mem_account(dsc_mem_category category, int64_t delta) {
    if ((unsigned)category >= DSC_MEM_CATEGORY_COUNT) category = DSC_MEM_OTHER;
    int64_t now = atomic_fetch_add(&current[category], delta) + delta;
    int64_t total = atomic_fetch_add(&total_current, delta) + delta;
    raise_peak(&peak[category], now);
    raise_peak(&total_peak, total);
}

dsc_status dsc_mem_alloc(void **ptr, size_t bytes, dsc_mem_category category, dsc_device device) {
    *ptr = NULL;
    const dsc_backend *backend;
    DSC_TRY(dsc_backend_get(device, &backend));
    /* An empty request still gets a real block (DSC_MEM_ALIGN bytes,
     * accounted as the 0 asked for): NULL is never handed out as success. */
    dsc_status s = backend->iface->mem_alloc(backend, ptr, bytes ? bytes : DSC_MEM_ALIGN);
    if (s) {
        char dev[32];
        return dsc_error_wrap(s, "allocating %zu bytes of %s on %s", bytes, dsc_mem_category_name(category),
                              dsc_device_name(device, dev, sizeof dev));
    }
    dsc_mem_account(category, (int64_t)bytes);
    return NULL;
}

void dsc_mem_free(void *ptr, size_t bytes, dsc_mem_category category, dsc_device device) {
    if (!ptr) return;
    const dsc_backend *backend;
    dsc_status s = dsc_backend_get(device, &backend);
    DSC_ASSERT(s == NULL); /* it was allocated there, so the backend exists */
    backend->iface->mem_free(backend, ptr);
    dsc_mem_account(category, -(int64_t)bytes);
}

void dsc_mem_get_stats(dsc_mem_stats *out) {
    for (int c = 0; c < DSC_MEM_CATEGORY_COUNT; c++) {
        out->current[c] = atomic_load(&current[c]);
        out->peak[c] = atomic_load(&peak[c]);
    }
    out->total_current = atomic_load(&total_current);
    out->total_peak = atomic_load(&total_peak);
}

void dsc_mem_reset_peaks(void) {
    for (int c = 0; c < DSC_MEM_CATEGORY_COUNT; c++)
        atomic_store(&peak[c], atomic_load(&current[c]));
    atomic_store(&total_peak, atomic_load(&total_current));
}

const char *dsc_mem_category_name(dsc_mem_category category) {
    static const char *names[] = {"params", "grads", "optimizer", "activations", "kv_cache", "comm", "other"};
    if ((unsigned)category >= DSC_MEM_CATEGORY_COUNT) return "unknown";
    return names[category];
}

const char *dsc_device_name(dsc_device device, char *buf, size_t len) {
    if (device.type == DSC_DEVICE_CUDA)
        snprintf(buf, len, "cuda:%d", device.index);
    else
        snprintf(buf, len, "cpu");
    return buf;
}
