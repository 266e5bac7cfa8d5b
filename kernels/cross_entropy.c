/* Public fused softmax + cross-entropy over logits (N, V) (f32, or bf16 / f16
 * where the backend takes them) with targets (N) i32 (a negative target is ignored). Target ids >= V are reported
 * by the backends, which see the data. */
#include "kernels/dispatch.h"

/* logits (N, V) f32, bf16 or f16; targets (N) i32. */
static dsc_status cross_entropy_shapes(const kernel_call *call, const dsc_tensor *logits,
                                       const dsc_tensor *targets, int64_t *n, int64_t *v) {
    const int64_t any2[2] = {-1, -1};
    DSC_TRY(kernel_expect(call, logits, "logits", kernel_is_narrow(logits->dtype) ? logits->dtype : DSC_DTYPE_F32,
                          2, any2));
    *n = logits->shape[0], *v = logits->shape[1];
    DSC_TRY(kernel_expect(call, targets, "targets", DSC_DTYPE_I32, 1, n));
    return NULL;
}

dsc_status dsc_kernel_cross_entropy_forward(dsc_tensor *losses, const dsc_tensor *logits,
                                            const dsc_tensor *targets) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_cross_entropy_forward", KARG(losses), KARG(logits), KARG(targets)));
    int64_t n, v;
    DSC_TRY(cross_entropy_shapes(&call, logits, targets, &n, &v));
    DSC_TRY(kernel_expect(&call, losses, "losses", DSC_DTYPE_F32, 1, &n));
    if (kernel_is_narrow(logits->dtype))
        return KERNEL_RUN(&call, cross_entropy_forward_narrow, losses->data, logits->data, logits->dtype,
                          targets->data, n, v);
    return KERNEL_RUN(&call, cross_entropy_forward, losses->data, logits->data, targets->data, n, v);
}

dsc_status dsc_kernel_cross_entropy_backward(dsc_tensor *dlogits, const dsc_tensor *logits,
                                             const dsc_tensor *targets, float dloss) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_cross_entropy_backward", KARG(dlogits), KARG(logits), KARG(targets)));
    int64_t n, v;
    DSC_TRY(cross_entropy_shapes(&call, logits, targets, &n, &v));
    DSC_TRY(kernel_expect(&call, dlogits, "dlogits", logits->dtype, 2, logits->shape));
    if (kernel_is_narrow(logits->dtype))
        return KERNEL_RUN(&call, cross_entropy_backward_narrow, dlogits->data, logits->data, logits->dtype,
                          targets->data, n, v, dloss);
    return KERNEL_RUN(&call, cross_entropy_backward, dlogits->data, logits->data, targets->data, n, v, dloss);
}
