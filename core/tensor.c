/* Tensor bookkeeping: dtypes, shapes, views, checked copies. Arithmetic on
 * tensors lives in kernels/, not here. */
#include "dsc/tensor.h"

#include "core/backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} dtype_info[DSC_DTYPE_COUNT] = {
    [DSC_DTYPE_F32] = {"f32", 4, true},  [DSC_DTYPE_BF16] = {"bf16", 2, true}, [DSC_DTYPE_F16] = {"f16", 2, true},
    [DSC_DTYPE_I32] = {"i32", 4, false}, [DSC_DTYPE_I64] = {"i64", 8, false},  [DSC_DTYPE_U8] = {"u8", 1, false},
};

size_t dsc_dtype_size(dsc_dtype dtype) {
    return (unsigned)dtype < DSC_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

const char *dsc_dtype_name(dsc_dtype dtype) {
    return (unsigned)dtype < DSC_DTYPE_COUNT ? dtype_info[dtype].name : "invalid";
}

bool dsc_dtype_is_float(dsc_dtype dtype) {
    return (unsigned)dtype < DSC_DTYPE_COUNT && dtype_info[dtype].is_float;
}

dsc_status dsc_dtype_from_name(const char *name, dsc_dtype *out) {
    for (int d = 0; d < DSC_DTYPE_COUNT; d++) {
        if (strcmp(name, dtype_info[d].name) == 0) {
            *out = (dsc_dtype)d;
            return NULL;
        }
    }
    return dsc_error(DSC_ERR_INVALID, "unknown dtype \"%s\" (expected f32, bf16, f16, i32, i64 or u8)", name);
}

int64_t dsc_tensor_numel(const dsc_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t dsc_tensor_nbytes(const dsc_tensor *t) {
    return (size_t)dsc_tensor_numel(t) * dsc_dtype_size(t->dtype);
}

static dsc_status check_shape(int ndim, const int64_t *shape) {
    DSC_CHECK(ndim >= 0 && ndim <= DSC_MAX_DIMS, DSC_ERR_INVALID, "tensor rank %d outside [0, %d]", ndim,
              DSC_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        DSC_CHECK(shape[i] >= 0, DSC_ERR_INVALID, "tensor dimension %d is negative (%lld)", i,
                  (long long)shape[i]);
    return NULL;
}

static const char *shape_text(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
    return buf;
}

dsc_status dsc_shape_nbytes(dsc_dtype dtype, int ndim, const int64_t *shape, size_t *out) {
    *out = 0;
    DSC_CHECK((unsigned)dtype < DSC_DTYPE_COUNT, DSC_ERR_INVALID, "invalid dtype %d", (int)dtype);
    DSC_TRY(check_shape(ndim, shape));
    int64_t numel = 1;
    size_t bytes;
    bool overflow = false;
    for (int i = 0; i < ndim; i++)
        overflow |= __builtin_mul_overflow(numel, shape[i], &numel);
    overflow |= numel < 0 || __builtin_mul_overflow((size_t)numel, dsc_dtype_size(dtype), &bytes);
    if (overflow) {
        char text[160];
        return dsc_error(DSC_ERR_INVALID, "tensor of shape %s %s: its size overflows",
                         shape_text(text, sizeof text, ndim, shape), dsc_dtype_name(dtype));
    }
    *out = bytes;
    return NULL;
}

dsc_status dsc_tensor_alloc(dsc_tensor *t, dsc_dtype dtype, int ndim, const int64_t *shape, dsc_device device,
                            dsc_mem_category category) {
    memset(t, 0, sizeof *t);
    size_t bytes;
    DSC_TRY(dsc_shape_nbytes(dtype, ndim, shape, &bytes));
    t->dtype = dtype;
    t->device = device;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->category = category;
    DSC_TRY(dsc_mem_alloc(&t->data, bytes, category, device));
    t->owner = true;
    return NULL;
}

void dsc_tensor_free(dsc_tensor *t) {
    if (t->owner) dsc_mem_free(t->data, dsc_tensor_nbytes(t), t->category, t->device);
    memset(t, 0, sizeof *t);
}

dsc_tensor dsc_tensor_view(void *data, dsc_dtype dtype, int ndim, const int64_t *shape, dsc_device device) {
    dsc_tensor t = {.data = data, .dtype = dtype, .device = device, .ndim = ndim, .category = DSC_MEM_OTHER};
    DSC_ASSERT(ndim >= 0 && ndim <= DSC_MAX_DIMS);
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    return t;
}

dsc_status dsc_tensor_reshape(const dsc_tensor *t, int ndim, const int64_t *shape, dsc_tensor *out) {
    size_t bytes;
    DSC_TRY(dsc_shape_nbytes(t->dtype, ndim, shape, &bytes));
    dsc_tensor v = dsc_tensor_view(t->data, t->dtype, ndim, shape, t->device);
    if (dsc_tensor_numel(&v) != dsc_tensor_numel(t)) {
        char a[96], b[96];
        return dsc_error(DSC_ERR_INVALID, "cannot reshape %s to %s: element counts differ",
                         dsc_tensor_describe(t, a, sizeof a), dsc_tensor_describe(&v, b, sizeof b));
    }
    *out = v;
    return NULL;
}

dsc_tensor dsc_tensor_rows(const dsc_tensor *t, int64_t row0, int64_t rows) {
    DSC_ASSERT(t->ndim >= 1 && row0 >= 0 && rows >= 0 && row0 + rows <= t->shape[0]);
    size_t row_bytes = t->shape[0] ? dsc_tensor_nbytes(t) / (size_t)t->shape[0] : 0;
    dsc_tensor v =
        dsc_tensor_view((char *)t->data + (size_t)row0 * row_bytes, t->dtype, t->ndim, t->shape, t->device);
    v.shape[0] = rows;
    return v;
}

bool dsc_tensor_same_shape(const dsc_tensor *a, const dsc_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *dsc_tensor_describe(const dsc_tensor *t, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < t->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    char dev[32];
    if (used < len)
        snprintf(buf + used, len - used, ") %s %s", dsc_dtype_name(t->dtype),
                 dsc_device_name(t->device, dev, sizeof dev));
    return buf;
}

dsc_status dsc_tensor_expect(const dsc_tensor *t, const char *what, dsc_dtype dtype, int ndim,
                             const int64_t *shape) {
    bool ok = t->dtype == dtype && t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] < 0 || shape[i] == t->shape[i];
    if (ok) return NULL;
    char want[128], have[96];
    size_t used = (size_t)snprintf(want, sizeof want, "(");
    for (int i = 0; i < ndim && used < sizeof want; i++) {
        if (shape[i] < 0)
            used += (size_t)snprintf(want + used, sizeof want - used, i ? ", *" : "*");
        else
            used += (size_t)snprintf(want + used, sizeof want - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    }
    if (used < sizeof want) snprintf(want + used, sizeof want - used, ") %s", dsc_dtype_name(dtype));
    return dsc_error(DSC_ERR_INVALID, "%s: expected shape %s, got %s", what, want,
                     dsc_tensor_describe(t, have, sizeof have));
}

static float load_float(const void *p, dsc_dtype dtype, int64_t i) {
    switch (dtype) {
    case DSC_DTYPE_BF16:
        return dsc_bf16_to_f32(((const uint16_t *)p)[i]);
    case DSC_DTYPE_F16:
        return dsc_f16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

static void store_float(void *p, dsc_dtype dtype, int64_t i, float x) {
    switch (dtype) {
    case DSC_DTYPE_BF16:
        ((uint16_t *)p)[i] = dsc_f32_to_bf16(x);
        break;
    case DSC_DTYPE_F16:
        ((uint16_t *)p)[i] = dsc_f32_to_f16(x);
        break;
    default:
        ((float *)p)[i] = x;
        break;
    }
}

static dsc_status copy_same_dtype(dsc_tensor *dst, const dsc_tensor *src) {
    size_t bytes = dsc_tensor_nbytes(src);
    const dsc_backend *backend;
    if (src->device.type == DSC_DEVICE_CPU && dst->device.type == DSC_DEVICE_CPU) {
        memmove(dst->data, src->data, bytes);
        return NULL;
    }
    if (src->device.type == DSC_DEVICE_CPU) {
        DSC_TRY(dsc_backend_get(dst->device, &backend));
        return backend->iface->memcpy_from_host(backend, dst->data, src->data, bytes);
    }
    DSC_TRY(dsc_backend_get(src->device, &backend));
    if (dst->device.type == DSC_DEVICE_CPU)
        return backend->iface->memcpy_to_host(backend, dst->data, src->data, bytes);
    DSC_CHECK(dst->device.index == src->device.index, DSC_ERR_UNSUPPORTED, "copy between cuda:%d and cuda:%d",
              src->device.index, dst->device.index);
    return backend->iface->memcpy_device(backend, dst->data, src->data, bytes);
}

dsc_status dsc_tensor_copy(dsc_tensor *dst, const dsc_tensor *src) {
    if (dsc_tensor_numel(dst) != dsc_tensor_numel(src)) {
        char a[96], b[96];
        return dsc_error(DSC_ERR_INVALID, "copy from %s into %s: element counts differ",
                         dsc_tensor_describe(src, a, sizeof a), dsc_tensor_describe(dst, b, sizeof b));
    }
    if (dst->dtype == src->dtype) return copy_same_dtype(dst, src);
    DSC_CHECK(dsc_dtype_is_float(dst->dtype) && dsc_dtype_is_float(src->dtype), DSC_ERR_UNSUPPORTED,
              "conversion from %s to %s", dsc_dtype_name(src->dtype), dsc_dtype_name(dst->dtype));
    DSC_CHECK(dst->device.type == DSC_DEVICE_CPU && src->device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
              "dtype conversion %s -> %s outside the CPU", dsc_dtype_name(src->dtype), dsc_dtype_name(dst->dtype));
    int64_t n = dsc_tensor_numel(src);
    for (int64_t i = 0; i < n; i++)
        store_float(dst->data, dst->dtype, i, load_float(src->data, src->dtype, i));
    return NULL;
}

uint16_t dsc_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dsc_bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t dsc_f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
    if (abs < 0x38800000u) {                                   /* subnormal or zero */
        float f;
        memcpy(&f, &abs, 4);
        /* f16 subnormals are multiples of 2^-24; nearbyintf rounds to nearest even. */
        return (uint16_t)(sign | (uint32_t)nearbyintf(f * 16777216.0f));
    }
    uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | ((mant_round - 0x38000000u) >> 13));
}

float dsc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= sign;
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t u = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
    memcpy(&f, &u, 4);
    return f;
}
