/* Public elementwise activations (GELU, SiLU, SwiGLU) and the row softmax.
 * Elementwise operations accept any shape; companions must match it exactly. */
#include "kernels/dispatch.h"

static dsc_status expect_f32(const kernel_call *call, const dsc_tensor *t, const char *name) {
    char a[96];
    DSC_CHECK(t->dtype == DSC_DTYPE_F32, DSC_ERR_INVALID, "%s argument %s: expected f32, got %s", call->op, name,
              dsc_tensor_describe(t, a, sizeof a));
    return NULL;
}

dsc_status dsc_kernel_gelu_forward(dsc_tensor *out, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_gelu_forward", KARG(out), KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    DSC_TRY(kernel_expect_like(&call, out, "out", x, "x"));
    return KERNEL_RUN(&call, gelu_forward, out->data, x->data, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_gelu_backward(dsc_tensor *dx, const dsc_tensor *dout, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_gelu_backward", KARG(dx), KARG(dout), KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    DSC_TRY(kernel_expect_like(&call, dout, "dout", x, "x"));
    DSC_TRY(kernel_expect_like(&call, dx, "dx", x, "x"));
    return KERNEL_RUN(&call, gelu_backward, dx->data, dout->data, x->data, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_silu_forward(dsc_tensor *out, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_silu_forward", KARG(out), KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    DSC_TRY(kernel_expect_like(&call, out, "out", x, "x"));
    return KERNEL_RUN(&call, silu_forward, out->data, x->data, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_silu_backward(dsc_tensor *dx, const dsc_tensor *dout, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_silu_backward", KARG(dx), KARG(dout), KARG(x)));
    DSC_TRY(expect_f32(&call, x, "x"));
    DSC_TRY(kernel_expect_like(&call, dout, "dout", x, "x"));
    DSC_TRY(kernel_expect_like(&call, dx, "dx", x, "x"));
    return KERNEL_RUN(&call, silu_backward, dx->data, dout->data, x->data, dsc_tensor_numel(x));
}

dsc_status dsc_kernel_swiglu_forward(dsc_tensor *out, const dsc_tensor *gate, const dsc_tensor *up) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_swiglu_forward", KARG(out), KARG(gate), KARG(up)));
    DSC_TRY(expect_f32(&call, gate, "gate"));
    DSC_TRY(kernel_expect_like(&call, up, "up", gate, "gate"));
    DSC_TRY(kernel_expect_like(&call, out, "out", gate, "gate"));
    return KERNEL_RUN(&call, swiglu_forward, out->data, gate->data, up->data, dsc_tensor_numel(gate));
}

dsc_status dsc_kernel_swiglu_backward(dsc_tensor *dgate, dsc_tensor *dup, const dsc_tensor *dout,
                                      const dsc_tensor *gate, const dsc_tensor *up) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_swiglu_backward", KARG(dgate), KARG(dup), KARG(dout), KARG(gate),
                         KARG(up)));
    DSC_TRY(expect_f32(&call, gate, "gate"));
    DSC_TRY(kernel_expect_like(&call, up, "up", gate, "gate"));
    DSC_TRY(kernel_expect_like(&call, dout, "dout", gate, "gate"));
    DSC_TRY(kernel_expect_like(&call, dgate, "dgate", gate, "gate"));
    DSC_TRY(kernel_expect_like(&call, dup, "dup", gate, "gate"));
    return KERNEL_RUN(&call, swiglu_backward, dgate->data, dup->data, dout->data, gate->data, up->data,
                      dsc_tensor_numel(gate));
}

dsc_status dsc_kernel_softmax(dsc_tensor *out, const dsc_tensor *x) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_softmax", KARG(out), KARG(x)));
    int64_t n, c;
    DSC_TRY(kernel_expect_rows(&call, x, "x", &n, &c));
    DSC_TRY(kernel_expect_like(&call, out, "out", x, "x"));
    return KERNEL_RUN(&call, softmax, out->data, x->data, n, c);
}
