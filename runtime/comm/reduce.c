/* reduce.c — elementwise sum / max of host buffers per dtype, and the final
 * division of an average. Plain loops the compiler vectorises; the ring
 * algorithms that call them are bound by memory bandwidth, not arithmetic.
 * Not here: any communication. */
#include "runtime/comm/reduce.h"

#include <stddef.h>

#define DEFINE_REDUCE(suffix, type)                                                                               \
    static void reduce_##suffix(type *out, const type *a, const type *b, int64_t n, dsc_reduce_op op) {           \
        if (op == DSC_REDUCE_OP_MAX)                                                                              \
            for (int64_t i = 0; i < n; i++)                                                                       \
                out[i] = a[i] > b[i] ? a[i] : b[i];                                                               \
        else                                                                                                      \
            for (int64_t i = 0; i < n; i++)                                                                       \
                out[i] = (type)(a[i] + b[i]);                                                                     \
    }                                                                                                             \
    static void divide_##suffix(type *data, int64_t n, int size) {                                                \
        for (int64_t i = 0; i < n; i++)                                                                           \
            data[i] = (type)(data[i] / (type)size);                                                               \
    }

DEFINE_REDUCE(f32, float)
DEFINE_REDUCE(i32, int32_t)
DEFINE_REDUCE(i64, int64_t)
DEFINE_REDUCE(u8, uint8_t)

typedef float (*to_f32_fn)(uint16_t);
typedef uint16_t (*from_f32_fn)(float);

static void reduce_half(uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n, dsc_reduce_op op,
                        to_f32_fn to, from_f32_fn from) {
    for (int64_t i = 0; i < n; i++) {
        float x = to(a[i]), y = to(b[i]);
        out[i] = from(op == DSC_REDUCE_OP_MAX ? (x > y ? x : y) : x + y);
    }
}

static void divide_half(uint16_t *data, int64_t n, int size, to_f32_fn to, from_f32_fn from) {
    for (int64_t i = 0; i < n; i++)
        data[i] = from(to(data[i]) / (float)size);
}

void dsc_comm_reduce_local(void *out, const void *a, const void *b, int64_t n, dsc_dtype dtype, dsc_reduce_op op) {
    switch (dtype) {
    case DSC_DTYPE_F32:
        reduce_f32(out, a, b, n, op);
        break;
    case DSC_DTYPE_I32:
        reduce_i32(out, a, b, n, op);
        break;
    case DSC_DTYPE_I64:
        reduce_i64(out, a, b, n, op);
        break;
    case DSC_DTYPE_U8:
        reduce_u8(out, a, b, n, op);
        break;
    case DSC_DTYPE_BF16:
        reduce_half(out, a, b, n, op, dsc_bf16_to_f32, dsc_f32_to_bf16);
        break;
    case DSC_DTYPE_F16:
        reduce_half(out, a, b, n, op, dsc_f16_to_f32, dsc_f32_to_f16);
        break;
    default:
        DSC_ASSERT(!"unknown dtype");
    }
}

void dsc_comm_reduce_finish(void *data, int64_t n, dsc_dtype dtype, dsc_reduce_op op, int size) {
    if (op != DSC_REDUCE_OP_AVG || size == 1) return;
    switch (dtype) {
    case DSC_DTYPE_F32:
        divide_f32(data, n, size);
        break;
    case DSC_DTYPE_I32:
        divide_i32(data, n, size);
        break;
    case DSC_DTYPE_I64:
        divide_i64(data, n, size);
        break;
    case DSC_DTYPE_U8:
        divide_u8(data, n, size);
        break;
    case DSC_DTYPE_BF16:
        divide_half(data, n, size, dsc_bf16_to_f32, dsc_f32_to_bf16);
        break;
    case DSC_DTYPE_F16:
        divide_half(data, n, size, dsc_f16_to_f32, dsc_f32_to_f16);
        break;
    default:
        DSC_ASSERT(!"unknown dtype");
    }
}
