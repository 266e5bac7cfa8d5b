/* Public rotary position embedding (rotate-half pairing, as Llama / Hugging
 * Face): x, out (B, T, NH, HS) with HS even, positions (T) i32. */
#include "kernels/dispatch.h"

dsc_status dsc_kernel_rope(dsc_tensor *out, const dsc_tensor *x, const dsc_tensor *positions, float theta,
                           bool inverse) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_rope", KARG(out), KARG(x), KARG(positions)));
    const int64_t any[4] = {-1, -1, -1, -1};
    DSC_TRY(kernel_expect(&call, x, "x", DSC_DTYPE_F32, 4, any));
    DSC_TRY(kernel_expect_like(&call, out, "out", x, "x"));
    int64_t b = x->shape[0], t = x->shape[1], nh = x->shape[2], hs = x->shape[3];
    DSC_TRY(kernel_expect(&call, positions, "positions", DSC_DTYPE_I32, 1, &t));
    DSC_CHECK(hs % 2 == 0, DSC_ERR_INVALID, "dsc_kernel_rope: head size %lld is odd", (long long)hs);
    DSC_CHECK(theta > 0, DSC_ERR_INVALID, "dsc_kernel_rope: theta %g is not positive", (double)theta);
    return KERNEL_RUN(&call, rope, out->data, x->data, positions->data, b, t, nh, hs, theta, inverse);
}
