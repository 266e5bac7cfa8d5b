/* Shared plumbing of the public kernel wrappers: resolving the backend from
 * the arguments' device, checking arguments with messages that name the
 * operation and the argument, and calling a table entry or reporting that the
 * backend lacks it. It does not know any single operation's shapes. */
#ifndef DSC_KERNELS_DISPATCH_H
#define DSC_KERNELS_DISPATCH_H

#include "core/backend.h"
#include "dsc/kernels.h"

/* One argument of a kernel call; optional arguments may be NULL. */
typedef struct kernel_arg {
    const char *name;
    const dsc_tensor *t;
    bool optional;
} kernel_arg;

/* Argument entries named after the variable: required and optional. */
// clang-format off
#define KARG(t) {#t, (t), false}
#define KOPT(t) {#t, (t), true}
// clang-format on

/* The resolved call: operation name, the backend object of the arguments'
 * device and its operation table. */
typedef struct kernel_call {
    const char *op;
    const dsc_backend *backend;
    const struct dsc_kernel_ops *ops;
} kernel_call;

/* Adds n to the count dsc_kernel_flop_count reports (flop_count.c). */
void kernel_count_flops(int64_t n);

/* The calling thread's dsc_kernels_set_grad_dtype. */
dsc_dtype kernel_grad_dtype(void);

/* Checks that required arguments are present and that all present arguments
 * live on one device, then resolves that device's backend. */
dsc_status kernel_begin(kernel_call *call, const char *op, const kernel_arg *args, int count);
#define KERNEL_BEGIN(call, op, ...)                                                                               \
    kernel_begin((call), (op), (const kernel_arg[]){__VA_ARGS__},                                                 \
                 (int)(sizeof((const kernel_arg[]){__VA_ARGS__}) / sizeof(kernel_arg)))

/* dsc_tensor_expect with "op argument NAME" as the subject; NULL t passes. */
dsc_status kernel_expect(const kernel_call *call, const dsc_tensor *t, const char *name, dsc_dtype dtype, int ndim,
                         const int64_t *shape);
/* t is f32 and has exactly the shape of `like`; NULL t passes. */
dsc_status kernel_expect_like(const kernel_call *call, const dsc_tensor *t, const char *name,
                              const dsc_tensor *like, const char *like_name);
/* t is f32 with at least one dimension; *rows = numel / last dimension, *cols = last dimension. */
dsc_status kernel_expect_rows(const kernel_call *call, const dsc_tensor *t, const char *name, int64_t *rows,
                              int64_t *cols);
/* The same for a tensor of `dtype`. */
dsc_status kernel_expect_rows_of(const kernel_call *call, const dsc_tensor *t, const char *name, dsc_dtype dtype,
                                 int64_t *rows, int64_t *cols);
/* A 2-byte floating-point type (bf16 / f16), which some kernels also take. */
static inline bool kernel_is_narrow(dsc_dtype dtype) {
    return dtype == DSC_DTYPE_BF16 || dtype == DSC_DTYPE_F16;
}

/* The error for a table entry the backend does not provide. */
dsc_status kernel_unsupported(const kernel_call *call, const char *entry);
/* Prefixes a backend failure with the operation's name. */
dsc_status kernel_wrap(const kernel_call *call, dsc_status s);

/* Calls table entry `entry` of the resolved backend (which it receives as
 * its first argument), or reports it missing. */
#define KERNEL_RUN(call, entry, ...)                                                                              \
    ((call)->ops->entry ? kernel_wrap((call), (call)->ops->entry((call)->backend, __VA_ARGS__))                   \
                        : kernel_unsupported((call), #entry))

/* Data pointers of (possibly NULL) tensors. */
static inline float *kernel_f32(const dsc_tensor *t) {
    return t ? (float *)t->data : NULL;
}
static inline int32_t *kernel_i32(const dsc_tensor *t) {
    return t ? (int32_t *)t->data : NULL;
}

#endif
