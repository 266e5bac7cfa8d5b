/* Argument checks and backend resolution shared by every public kernel
 * wrapper. Messages always start with the public function's name. */
#include "kernels/dispatch.h"

#include <stdio.h>

static bool same_device(dsc_device a, dsc_device b) {
    return a.type == b.type && a.index == b.index;
}

static _Thread_local dsc_kernels_progress_fn progress_fn;
static _Thread_local void *progress_arg;

void dsc_kernels_set_progress(dsc_kernels_progress_fn fn, void *arg) {
    progress_fn = fn;
    progress_arg = arg;
}

void dsc_kernels_get_progress(dsc_kernels_progress_fn *fn, void **arg) {
    *fn = progress_fn;
    *arg = progress_arg;
}

static _Thread_local dsc_dtype grad_dtype = DSC_DTYPE_F32;

dsc_dtype dsc_kernels_set_grad_dtype(dsc_dtype dtype) {
    dsc_dtype was = grad_dtype;
    grad_dtype = dtype == DSC_DTYPE_BF16 || dtype == DSC_DTYPE_F16 ? dtype : DSC_DTYPE_F32;
    return was;
}

dsc_dtype kernel_grad_dtype(void) {
    return grad_dtype;
}

dsc_status kernel_begin(kernel_call *call, const char *op, const kernel_arg *args, int count) {
    if (progress_fn) {
        dsc_kernels_progress_fn fn = progress_fn;
        progress_fn = NULL; /* kernels the callback runs do not re-enter it */
        fn(progress_arg);
        progress_fn = fn;
    }
    call->op = op;
    call->backend = NULL;
    call->ops = NULL;
    const kernel_arg *first = NULL;
    for (int i = 0; i < count; i++) {
        if (!args[i].t) {
            DSC_CHECK(args[i].optional, DSC_ERR_INVALID, "%s: argument %s is NULL", op, args[i].name);
            continue;
        }
        DSC_CHECK(args[i].t->data || dsc_tensor_numel(args[i].t) == 0, DSC_ERR_INVALID,
                  "%s: argument %s has no data", op, args[i].name);
        if (!first) {
            first = &args[i];
            continue;
        }
        if (!same_device(first->t->device, args[i].t->device)) {
            char a[32], b[32];
            return dsc_error(DSC_ERR_INVALID, "%s: argument %s is on %s but %s is on %s", op, args[i].name,
                             dsc_device_name(args[i].t->device, a, sizeof a), first->name,
                             dsc_device_name(first->t->device, b, sizeof b));
        }
    }
    DSC_CHECK(first, DSC_ERR_INVALID, "%s: no tensor arguments", op);
    dsc_status s = dsc_backend_get(first->t->device, &call->backend);
    if (s) return dsc_error_wrap(s, "%s", op);
    call->ops = call->backend->iface->kernels;
    return NULL;
}

dsc_status kernel_expect(const kernel_call *call, const dsc_tensor *t, const char *name, dsc_dtype dtype, int ndim,
                         const int64_t *shape) {
    if (!t) return NULL;
    char what[128];
    snprintf(what, sizeof what, "%s argument %s", call->op, name);
    return dsc_tensor_expect(t, what, dtype, ndim, shape);
}

dsc_status kernel_expect_like(const kernel_call *call, const dsc_tensor *t, const char *name,
                              const dsc_tensor *like, const char *like_name) {
    if (!t) return NULL;
    if (t->dtype == DSC_DTYPE_F32 && dsc_tensor_same_shape(t, like)) return NULL;
    char a[96], b[96];
    return dsc_error(DSC_ERR_INVALID, "%s argument %s: expected f32 with the shape of %s %s, got %s", call->op,
                     name, like_name, dsc_tensor_describe(like, b, sizeof b), dsc_tensor_describe(t, a, sizeof a));
}

dsc_status kernel_expect_rows(const kernel_call *call, const dsc_tensor *t, const char *name, int64_t *rows,
                              int64_t *cols) {
    return kernel_expect_rows_of(call, t, name, DSC_DTYPE_F32, rows, cols);
}

dsc_status kernel_expect_rows_of(const kernel_call *call, const dsc_tensor *t, const char *name, dsc_dtype dtype,
                                 int64_t *rows, int64_t *cols) {
    char a[96];
    DSC_CHECK(t->dtype == dtype && t->ndim >= 1, DSC_ERR_INVALID,
              "%s argument %s: expected a %s tensor with at least one dimension, got %s", call->op, name,
              dsc_dtype_name(dtype), dsc_tensor_describe(t, a, sizeof a));
    *cols = t->shape[t->ndim - 1];
    *rows = *cols ? dsc_tensor_numel(t) / *cols : 0;
    return NULL;
}

dsc_status kernel_unsupported(const kernel_call *call, const char *entry) {
    return dsc_error(DSC_ERR_UNSUPPORTED, "%s: the %s backend does not implement %s", call->op,
                     call->backend->iface->name, entry);
}

dsc_status kernel_wrap(const kernel_call *call, dsc_status s) {
    return dsc_error_wrap(s, "%s", call->op);
}
