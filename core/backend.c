/* The backend registry: device type -> backend type table, and device ->
 * backend object. Core knows no backend; each backend type registers its
 * table when the library loads, so a build without CUDA simply has no CUDA
 * entry. A device's backend object (its context: stream, handles) is
 * created the first time the device is looked up, under a lock, and kept for
 * the process; later lookups read it without locking. */
#include "core/backend.h"

#include <pthread.h>
#include <stdatomic.h>

/* Devices of one type dsc can address (cuda:0 .. cuda:63). */
#define MAX_DEVICES 64

static const dsc_backend_iface *types[DSC_DEVICE_TYPE_COUNT];
static dsc_backend objects[DSC_DEVICE_TYPE_COUNT][MAX_DEVICES];
static atomic_bool created[DSC_DEVICE_TYPE_COUNT][MAX_DEVICES];
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

void dsc_backend_register(dsc_device_type type, const dsc_backend_iface *iface) {
    DSC_ASSERT((unsigned)type < DSC_DEVICE_TYPE_COUNT && iface);
    types[type] = iface;
}

/* Creates `object` unless another thread did; caller holds the lock. */
static dsc_status create(dsc_backend *object, atomic_bool *done, const dsc_backend_iface *iface,
                         dsc_device device) {
    if (atomic_load(done)) return NULL;
    *object = (dsc_backend){.iface = iface, .device = device};
    if (iface->init) {
        char name[32];
        DSC_TRY(dsc_error_wrap(iface->init(object), "creating the %s backend of %s", iface->name,
                               dsc_device_name(device, name, sizeof name)));
    }
    atomic_store_explicit(done, true, memory_order_release);
    return NULL;
}

dsc_status dsc_backend_get(dsc_device device, const dsc_backend **out) {
    *out = NULL;
    if ((unsigned)device.type >= DSC_DEVICE_TYPE_COUNT)
        return dsc_error(DSC_ERR_INVALID, "unknown device type %d", (int)device.type);
    const dsc_backend_iface *iface = types[device.type];
    char name[32];
    if (!iface)
        return dsc_error(DSC_ERR_UNSUPPORTED, "device %s requested but dsc was built without %s",
                         dsc_device_name(device, name, sizeof name),
                         device.type == DSC_DEVICE_CUDA ? "CUDA" : "it");
    int slot = 0;
    if (iface->device_count) {
        int n = iface->device_count();
        if (device.index < 0 || device.index >= n)
            return dsc_error(DSC_ERR_UNSUPPORTED, "device %s requested but %d %s device(s) are present",
                             dsc_device_name(device, name, sizeof name), n, iface->name);
        DSC_CHECK(device.index < MAX_DEVICES, DSC_ERR_UNSUPPORTED,
                  "device %s is beyond the %d devices dsc supports", dsc_device_name(device, name, sizeof name),
                  MAX_DEVICES);
        slot = device.index;
    } else {
        device.index = 0;
    }
    dsc_backend *object = &objects[device.type][slot];
    atomic_bool *done = &created[device.type][slot];
    if (!atomic_load_explicit(done, memory_order_acquire)) {
        pthread_mutex_lock(&create_lock);
        dsc_status s = create(object, done, iface, device);
        pthread_mutex_unlock(&create_lock);
        DSC_TRY(s);
    }
    *out = object;
    return NULL;
}

int dsc_cuda_device_count(void) {
    const dsc_backend_iface *cuda = types[DSC_DEVICE_CUDA];
    return cuda && cuda->device_count ? cuda->device_count() : 0;
}

dsc_status dsc_device_synchronize(dsc_device device) {
    const dsc_backend *backend;
    DSC_TRY(dsc_backend_get(device, &backend));
    return backend->iface->synchronize(backend);
}
