/* dsc/tensor.h — a typed, shaped view of contiguous row-major memory.
 *
 * A dsc_tensor is a plain struct (callers may put it on the stack or inside
 * layers); `owner` says whether dsc_tensor_free releases the data. There are
 * no strides: contiguous row-major is all dsc needs, and kernels stay simple.
 *
 * Thread-safety: functions on distinct tensors are safe from any thread;
 * nothing here locks a tensor that two threads write. */
#ifndef DSC_TENSOR_H
#define DSC_TENSOR_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/memory.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_dtype {
    DSC_DTYPE_F32 = 0,
    DSC_DTYPE_BF16,
    DSC_DTYPE_F16,
    DSC_DTYPE_I32,
    DSC_DTYPE_I64,
    DSC_DTYPE_U8,
    DSC_DTYPE_COUNT
} dsc_dtype;

#define DSC_MAX_DIMS 6

typedef struct dsc_tensor {
    void *data;
    dsc_dtype dtype;
    dsc_device device;
    int ndim;
    int64_t shape[DSC_MAX_DIMS];
    dsc_mem_category category;
    bool owner;
} dsc_tensor;

DSC_API size_t dsc_dtype_size(dsc_dtype dtype);
DSC_API const char *dsc_dtype_name(dsc_dtype dtype); /* "f32", "bf16", ... */
DSC_API dsc_status dsc_dtype_from_name(const char *name, dsc_dtype *out);
DSC_API bool dsc_dtype_is_float(dsc_dtype dtype);

/* Bytes of a (dtype, shape) tensor, computed with overflow checks: an error
 * naming the shape when the rank or a dimension is invalid or the element
 * count or byte size does not fit int64_t / size_t. */
DSC_API dsc_status dsc_shape_nbytes(dsc_dtype dtype, int ndim, const int64_t *shape, size_t *out);

/* Allocates a zero-filled tensor. `shape` has `ndim` entries, each >= 0, and
 * its byte size must fit (dsc_shape_nbytes); a tensor with no elements still
 * gets a valid, non-NULL pointer. */
DSC_API dsc_status dsc_tensor_alloc(dsc_tensor *t, dsc_dtype dtype, int ndim, const int64_t *shape,
                                    dsc_device device, dsc_mem_category category);
/* Releases owned data and resets the struct to empty; safe on empty tensors. */
DSC_API void dsc_tensor_free(dsc_tensor *t);

/* A non-owning view of existing memory. */
DSC_API dsc_tensor dsc_tensor_view(void *data, dsc_dtype dtype, int ndim, const int64_t *shape, dsc_device device);
/* The same memory with another shape of equal element count. */
DSC_API dsc_status dsc_tensor_reshape(const dsc_tensor *t, int ndim, const int64_t *shape, dsc_tensor *out);
/* Rows [row0, row0+rows) of the first dimension, as a view. */
DSC_API dsc_tensor dsc_tensor_rows(const dsc_tensor *t, int64_t row0, int64_t rows);

DSC_API int64_t dsc_tensor_numel(const dsc_tensor *t);
DSC_API size_t dsc_tensor_nbytes(const dsc_tensor *t);
DSC_API bool dsc_tensor_same_shape(const dsc_tensor *a, const dsc_tensor *b);
/* "(4, 16) f32 cpu" into buf. */
DSC_API const char *dsc_tensor_describe(const dsc_tensor *t, char *buf, size_t len);

/* Checks dtype, rank and shape (-1 in `shape` matches any extent); the error
 * names `what` and shows expected vs actual. */
DSC_API dsc_status dsc_tensor_expect(const dsc_tensor *t, const char *what, dsc_dtype dtype, int ndim,
                                     const int64_t *shape);

/* Copies src into dst (same shape); converts dtype between f32/bf16/f16 on the CPU. */
DSC_API dsc_status dsc_tensor_copy(dsc_tensor *dst, const dsc_tensor *src);

/* Scalar conversions for half types (round to nearest even). */
DSC_API uint16_t dsc_f32_to_bf16(float x);
DSC_API float dsc_bf16_to_f32(uint16_t x);
DSC_API uint16_t dsc_f32_to_f16(float x);
DSC_API float dsc_f16_to_f32(uint16_t x);

#ifdef __cplusplus
}
#endif
#endif
