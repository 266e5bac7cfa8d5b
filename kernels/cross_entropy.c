/* Public fused softmax + cross-entropy over logits (N, V) with targets (N)
 * i32 (a negative target is ignored). Target ids >= V are reported by the
 * backends, which see the data. */
#include "kernels/dispatch.h"

static dsc_status cross_entropy_shapes(const kernel_call *call, const dsc_tensor *logits,
                                       const dsc_tensor *targets, int64_t *n, int64_t *v) {
    const int64_t any2[2] = {-1, -1};
    DSC_TRY(kernel_expect(call, logits, "logits", DSC_DTYPE_F32, 2, any2));
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
    return KERNEL_RUN(&call, cross_entropy_forward, losses->data, logits->data, targets->data, n, v);
}

dsc_status dsc_kernel_cross_entropy_backward(dsc_tensor *dlogits, const dsc_tensor *logits,
                                             const dsc_tensor *targets, float dloss) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_cross_entropy_backward", KARG(dlogits), KARG(logits), KARG(targets)));
    int64_t n, v;
    DSC_TRY(cross_entropy_shapes(&call, logits, targets, &n, &v));
    DSC_TRY(kernel_expect_like(&call, dlogits, "dlogits", logits, "logits"));
    return KERNEL_RUN(&call, cross_entropy_backward, dlogits->data, logits->data, targets->data, n, v, dloss);
}
