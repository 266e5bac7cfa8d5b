/* Public reductions and elementwise helpers over f32 tensors of any shape,
 * treated as flat vectors: sums (in double), scaling, axpy, add, zero and the
 * finiteness check used by loss scaling and gradient clipping. Results of
 * reductions are written to host memory whatever the device. */
#include "kernels/dispatch.h"

static dsc_status expect_f32(const kernel_call *call, const dsc_tensor *t, const char *name) {
    char a[96];
    DSC_CHECK(t->dtype == DSC_DTYPE_F32, DSC_ERR_INVALID, "%s argument %s: expected f32, got %s", call->op, name,
              dsc_tensor_describe(t, a, sizeof a));
    return NULL;
}

static dsc_status expect_numel(const kernel_call *call, const dsc_tensor *t, const char *name,
                               const dsc_tensor *like, const char *like_name) {
    DSC_TRY(expect_f32(call, t, name));
    char a[96], b[96];
    DSC_CHECK(dsc_tensor_numel(t) == dsc_tensor_numel(like), DSC_ERR_INVALID,
              "%s: %s %s and %s %s have different element counts", call->op, name,
              dsc_tensor_describe(t, a, sizeof a), like_name, dsc_tensor_describe(like, b, sizeof b));
    return NULL;
}

dsc_status dsc_kernel_sum_squares(double *out, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_sum_squares", KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    return KERNEL_RUN(&call, sum_squares, out, x->data, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_sum(double *out, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_sum", KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    return KERNEL_RUN(&call, sum, out, x->data, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_scale(dsc_tensor *x, float s) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_scale", KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    return KERNEL_RUN(&call, scale, x->data, s, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_axpy(dsc_tensor *y, float a, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_axpy", KARG(y), KARG(x)));
    DSC_TRY(expect_f32(&call, y, "y"));
    DSC_TRY(expect_numel(&call, x, "x", y, "y"));
    return KERNEL_RUN(&call, axpy, y->data, a, x->data, dsc_tensor_numel(y));
}

dsc_status dsc_kernel_add(dsc_tensor *out, const dsc_tensor *a, const dsc_tensor *b) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_add", KARG(out), KARG(a), KARG(b)));
    DSC_TRY(expect_f32(&call, out, "out"));
    DSC_TRY(expect_numel(&call, a, "a", out, "out"));
    DSC_TRY(expect_numel(&call, b, "b", out, "out"));
    return KERNEL_RUN(&call, add, out->data, a->data, b->data, dsc_tensor_numel(out));
}

dsc_status dsc_kernel_zero(dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_zero", KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    return KERNEL_RUN(&call, zero, x->data, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_all_finite(bool *out, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_all_finite", KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    return KERNEL_RUN(&call, all_finite, out, x->data, dsc_tensor_numel(x));
}
