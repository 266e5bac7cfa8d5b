/* Public matrix products: GEMM (plain and batched) and the linear layer's
 * forward and backward, expressed as GEMMs. Shape checks live here; the
 * arithmetic lives in the backends. */
#include "kernels/dispatch.h"

dsc_status dsc_kernel_gemm(dsc_tensor *out, const dsc_tensor *a, const dsc_tensor *b, const dsc_tensor *bias,
                           bool trans_a, bool trans_b, float alpha, float beta) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_gemm", KARG(out), KARG(a), KARG(b), KOPT(bias)));
    DSC_CHECK(a->ndim == 2 || a->ndim == 3, DSC_ERR_INVALID,
              "dsc_kernel_gemm argument a: expected 2 or 3 dims, got %d", a->ndim);
    const int64_t any[3] = {-1, -1, -1};
    int nd = a->ndim, base = nd - 2; /* base: index of the row dimension */
    DSC_TRY(kernel_expect(&call, a, "a", DSC_DTYPE_F32, nd, any));
    DSC_TRY(kernel_expect(&call, b, "b", DSC_DTYPE_F32, nd, any));
    int64_t bt = nd == 3 ? a->shape[0] : 1;
    int64_t m = a->shape[base + trans_a], k = a->shape[base + !trans_a];
    int64_t n = b->shape[base + !trans_b];
    int64_t b_shape[3] = {bt, trans_b ? n : k, trans_b ? k : n};
    int64_t out_shape[3] = {bt, m, n};
    DSC_TRY(kernel_expect(&call, b, "b", DSC_DTYPE_F32, nd, b_shape + (3 - nd)));
    DSC_TRY(kernel_expect(&call, out, "out", DSC_DTYPE_F32, nd, out_shape + (3 - nd)));
    DSC_TRY(kernel_expect(&call, bias, "bias", DSC_DTYPE_F32, 1, &n));
    kernel_count_flops(2 * bt * m * n * k);
    return KERNEL_RUN(&call, gemm, out->data, a->data, b->data, kernel_f32(bias), bt, m, n, k, trans_a, trans_b,
                      alpha, beta);
}

/* Rows of x (..., C) and y (..., OC) must agree; both are flattened to 2-D. x is f32, y f32 or, where
 * the kernel takes it (y_narrow_ok), bf16 / f16. */
static dsc_status linear_rows(const kernel_call *call, const dsc_tensor *x, const char *x_name,
                              const dsc_tensor *y, const char *y_name, bool y_narrow_ok, int64_t c, int64_t oc,
                              int64_t *rows) {
    int64_t xc, yc, yrows;
    const bool narrow = y_narrow_ok && kernel_is_narrow(y->dtype);
    DSC_TRY(kernel_expect_rows(call, x, x_name, rows, &xc));
    DSC_TRY(kernel_expect_rows_of(call, y, y_name, narrow ? y->dtype : DSC_DTYPE_F32, &yrows, &yc));
    char a[96], b[96];
    DSC_CHECK(xc == c && yc == oc && x->ndim == y->ndim && yrows == *rows, DSC_ERR_INVALID,
              "%s: %s %s and %s %s do not fit a linear map from %lld to %lld features", call->op, x_name,
              dsc_tensor_describe(x, a, sizeof a), y_name, dsc_tensor_describe(y, b, sizeof b), (long long)c,
              (long long)oc);
    return NULL;
}

dsc_status dsc_kernel_linear_forward(dsc_tensor *y, const dsc_tensor *x, const dsc_tensor *w,
                                     const dsc_tensor *bias) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_linear_forward", KARG(y), KARG(x), KARG(w), KOPT(bias)));
    int64_t w_shape[2] = {-1, -1}, rows;
    DSC_TRY(kernel_expect(&call, w, "w", DSC_DTYPE_F32, 2, w_shape));
    int64_t oc = w->shape[0], c = w->shape[1];
    DSC_TRY(linear_rows(&call, x, "x", y, "y", true, c, oc, &rows));
    DSC_TRY(kernel_expect(&call, bias, "bias", DSC_DTYPE_F32, 1, &oc));
    kernel_count_flops(2 * rows * oc * c);
    if (kernel_is_narrow(y->dtype))
        return KERNEL_RUN(&call, linear_narrow_y, y->data, y->dtype, x->data, w->data, kernel_f32(bias), rows, oc,
                          c);
    return KERNEL_RUN(&call, gemm, y->data, x->data, w->data, kernel_f32(bias), 1, rows, oc, c, false, true, 1.0f,
                      0.0f);
}

dsc_status dsc_kernel_linear_gelu_forward(dsc_tensor *act, dsc_tensor *y, const dsc_tensor *x, const dsc_tensor *w,
                                          const dsc_tensor *bias) {
    kernel_call call;
    DSC_TRY(
        KERNEL_BEGIN(&call, "dsc_kernel_linear_gelu_forward", KARG(act), KARG(y), KARG(x), KARG(w), KOPT(bias)));
    int64_t w_shape[2] = {-1, -1}, rows;
    DSC_TRY(kernel_expect(&call, w, "w", DSC_DTYPE_F32, 2, w_shape));
    int64_t oc = w->shape[0], c = w->shape[1];
    DSC_TRY(linear_rows(&call, x, "x", y, "y", false, c, oc, &rows));
    DSC_TRY(kernel_expect_like(&call, act, "act", y, "y"));
    DSC_CHECK(act->data != y->data, DSC_ERR_INVALID,
              "dsc_kernel_linear_gelu_forward: act and y are one buffer; the backward needs y as it was");
    DSC_TRY(kernel_expect(&call, bias, "bias", DSC_DTYPE_F32, 1, &oc));
    kernel_count_flops(2 * rows * oc * c);
    return KERNEL_RUN(&call, linear_gelu, act->data, y->data, x->data, w->data, kernel_f32(bias), rows, oc, c);
}

/* The format a weight tensor's dtype stands for (u8: Q8_0), or DSC_WEIGHT_FORMAT_COUNT. */
static dsc_weight_format format_of(dsc_dtype dtype) {
    for (int f = 0; f < DSC_WEIGHT_FORMAT_COUNT; f++)
        if (dsc_weight_dtype((dsc_weight_format)f) == dtype) return (dsc_weight_format)f;
    return DSC_WEIGHT_FORMAT_COUNT;
}

dsc_status dsc_kernel_linear_forward_packed(dsc_tensor *y, const dsc_tensor *x, const dsc_tensor *w,
                                            const dsc_tensor *bias, dsc_tensor *workspace) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_linear_forward_packed", KARG(y), KARG(x), KARG(w), KOPT(bias),
                         KOPT(workspace)));
    dsc_weight_format f = format_of(w->dtype);
    DSC_CHECK(f != DSC_WEIGHT_FORMAT_COUNT && w->ndim == 2, DSC_ERR_INVALID,
              "dsc_kernel_linear_forward_packed argument w: expected a 2-D f32, bf16, f16 or u8 (Q8_0) weight, "
              "got %d-D %s",
              w->ndim, dsc_dtype_name(w->dtype));
    int64_t rows, c;
    DSC_TRY(kernel_expect_rows(&call, x, "x", &rows, &c));
    int64_t oc = w->shape[0], w_shape[2] = {oc, dsc_weight_cols(f, c)};
    DSC_CHECK(w_shape[1] > 0 || c == 0, DSC_ERR_INVALID,
              "dsc_kernel_linear_forward_packed: %lld input features do not fit format %s", (long long)c,
              dsc_weight_format_name(f));
    DSC_TRY(kernel_expect(&call, w, "w", w->dtype, 2, w_shape));
    DSC_TRY(linear_rows(&call, x, "x", y, "y", false, c, oc, &rows));
    DSC_TRY(kernel_expect(&call, bias, "bias", DSC_DTYPE_F32, 1, &oc));
    int64_t ws = 0, ws_rows, ws_cols;
    if (workspace) {
        DSC_TRY(kernel_expect_rows(&call, workspace, "workspace", &ws_rows, &ws_cols));
        ws = dsc_tensor_numel(workspace);
    }
    return KERNEL_RUN(&call, linear_packed, y->data, x->data, w->data, (int)f, kernel_f32(bias), rows, oc, c,
                      kernel_f32(workspace), ws);
}

dsc_status dsc_kernel_linear_backward(dsc_tensor *dx, dsc_tensor *dw, dsc_tensor *dbias, const dsc_tensor *dy,
                                      const dsc_tensor *x, const dsc_tensor *w) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_linear_backward", KOPT(dx), KOPT(dw), KOPT(dbias), KARG(dy), KARG(x),
                         KARG(w)));
    int64_t w_shape[2] = {-1, -1}, rows;
    DSC_TRY(kernel_expect(&call, w, "w", DSC_DTYPE_F32, 2, w_shape));
    int64_t oc = w->shape[0], c = w->shape[1];
    DSC_TRY(linear_rows(&call, x, "x", dy, "dy", true, c, oc, &rows));
    DSC_TRY(kernel_expect_like(&call, dx, "dx", x, "x"));
    DSC_TRY(kernel_expect_like(&call, dw, "dw", w, "w"));
    DSC_TRY(kernel_expect(&call, dbias, "dbias", DSC_DTYPE_F32, 1, &oc));
    kernel_count_flops(((dx != NULL) + (dw != NULL)) * 2 * rows * oc * c);
    if (kernel_is_narrow(dy->dtype)) {
        DSC_CHECK(!dbias, DSC_ERR_UNSUPPORTED,
                  "dsc_kernel_linear_backward: dbias from a %s dy (only f32 dy sums it)",
                  dsc_dtype_name(dy->dtype));
        return KERNEL_RUN(&call, linear_backward_narrow_dy, kernel_f32(dx), kernel_f32(dw), dy->data, dy->dtype,
                          x->data, w->data, rows, oc, c, kernel_grad_dtype());
    }
    /* dx (N, C) = dy (N, OC) @ w (OC, C) */
    if (dx)
        DSC_TRY(
            KERNEL_RUN(&call, gemm, dx->data, dy->data, w->data, NULL, 1, rows, c, oc, false, false, 1.0f, 0.0f));
    const dsc_dtype rounded = kernel_grad_dtype();
    if (rounded != DSC_DTYPE_F32 && (dw || dbias))
        return KERNEL_RUN(&call, linear_grads_rounded, kernel_f32(dw), kernel_f32(dbias), dy->data, x->data, rows,
                          oc, c, rounded);
    /* dw (OC, C) += dy^T (OC, N) @ x (N, C) */
    if (dw)
        DSC_TRY(
            KERNEL_RUN(&call, gemm, dw->data, dy->data, x->data, NULL, 1, oc, c, rows, true, false, 1.0f, 1.0f));
    if (dbias) DSC_TRY(KERNEL_RUN(&call, linear_backward_bias, dbias->data, dy->data, rows, oc));
    return NULL;
}
