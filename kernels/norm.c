/* Public LayerNorm and RMSNorm, forward and backward. x may have any leading
 * dimensions; it is normalised over its last dimension C, so N = numel / C
 * rows. Statistics (mean, rstd) are (N) vectors; they may be NULL in forward
 * when no backward follows (inference). */
#include "kernels/dispatch.h"

/* Rows and channels of x, with out/dout shaped like x and weight/bias (C). */
static dsc_status norm_shapes(const kernel_call *call, const dsc_tensor *x, const dsc_tensor *like_x,
                              const char *like_x_name, const dsc_tensor *weight, const dsc_tensor *bias,
                              int64_t *n, int64_t *c) {
    DSC_TRY(kernel_expect_rows(call, x, "x", n, c));
    DSC_TRY(kernel_expect_like(call, like_x, like_x_name, x, "x"));
    DSC_TRY(kernel_expect(call, weight, "weight", DSC_DTYPE_F32, 1, c));
    DSC_TRY(kernel_expect(call, bias, "bias", DSC_DTYPE_F32, 1, c));
    return NULL;
}

dsc_status dsc_kernel_layernorm_forward(dsc_tensor *out, dsc_tensor *mean, dsc_tensor *rstd, const dsc_tensor *x,
                                        const dsc_tensor *weight, const dsc_tensor *bias, float eps) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_layernorm_forward", KARG(out), KOPT(mean), KOPT(rstd), KARG(x),
                         KARG(weight), KOPT(bias)));
    int64_t n, c;
    DSC_TRY(norm_shapes(&call, x, out, "out", weight, bias, &n, &c));
    DSC_TRY(kernel_expect(&call, mean, "mean", DSC_DTYPE_F32, 1, &n));
    DSC_TRY(kernel_expect(&call, rstd, "rstd", DSC_DTYPE_F32, 1, &n));
    DSC_CHECK(eps >= 0, DSC_ERR_INVALID, "dsc_kernel_layernorm_forward: eps %g is negative", (double)eps);
    return KERNEL_RUN(&call, layernorm_forward, out->data, kernel_f32(mean), kernel_f32(rstd), x->data,
                      weight->data, kernel_f32(bias), n, c, eps);
}

dsc_status dsc_kernel_layernorm_backward(dsc_tensor *dx, dsc_tensor *dweight, dsc_tensor *dbias,
                                         const dsc_tensor *dout, const dsc_tensor *x, const dsc_tensor *weight,
                                         const dsc_tensor *mean, const dsc_tensor *rstd) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_layernorm_backward", KARG(dx), KOPT(dweight), KOPT(dbias), KARG(dout),
                         KARG(x), KARG(weight), KARG(mean), KARG(rstd)));
    int64_t n, c;
    DSC_TRY(norm_shapes(&call, x, dout, "dout", weight, NULL, &n, &c));
    DSC_TRY(kernel_expect_like(&call, dx, "dx", x, "x"));
    DSC_TRY(kernel_expect(&call, dweight, "dweight", DSC_DTYPE_F32, 1, &c));
    DSC_TRY(kernel_expect(&call, dbias, "dbias", DSC_DTYPE_F32, 1, &c));
    DSC_TRY(kernel_expect(&call, mean, "mean", DSC_DTYPE_F32, 1, &n));
    DSC_TRY(kernel_expect(&call, rstd, "rstd", DSC_DTYPE_F32, 1, &n));
    return KERNEL_RUN(&call, layernorm_backward, dx->data, kernel_f32(dweight), kernel_f32(dbias), dout->data,
                      x->data, weight->data, mean->data, rstd->data, n, c);
}

dsc_status dsc_kernel_rmsnorm_forward(dsc_tensor *out, dsc_tensor *rstd, const dsc_tensor *x,
                                      const dsc_tensor *weight, float eps) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_rmsnorm_forward", KARG(out), KOPT(rstd), KARG(x), KARG(weight)));
    int64_t n, c;
    DSC_TRY(norm_shapes(&call, x, out, "out", weight, NULL, &n, &c));
    DSC_TRY(kernel_expect(&call, rstd, "rstd", DSC_DTYPE_F32, 1, &n));
    DSC_CHECK(eps >= 0, DSC_ERR_INVALID, "dsc_kernel_rmsnorm_forward: eps %g is negative", (double)eps);
    return KERNEL_RUN(&call, rmsnorm_forward, out->data, kernel_f32(rstd), x->data, weight->data, n, c, eps);
}

dsc_status dsc_kernel_rmsnorm_backward(dsc_tensor *dx, dsc_tensor *dweight, const dsc_tensor *dout,
                                       const dsc_tensor *x, const dsc_tensor *weight, const dsc_tensor *rstd) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_rmsnorm_backward", KARG(dx), KOPT(dweight), KARG(dout), KARG(x),
                         KARG(weight), KARG(rstd)));
    int64_t n, c;
    DSC_TRY(norm_shapes(&call, x, dout, "dout", weight, NULL, &n, &c));
    DSC_TRY(kernel_expect_like(&call, dx, "dx", x, "x"));
    DSC_TRY(kernel_expect(&call, dweight, "dweight", DSC_DTYPE_F32, 1, &c));
    DSC_TRY(kernel_expect(&call, rstd, "rstd", DSC_DTYPE_F32, 1, &n));
    return KERNEL_RUN(&call, rmsnorm_backward, dx->data, kernel_f32(dweight), dout->data, x->data, weight->data,
                      rstd->data, n, c);
}
