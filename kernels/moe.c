/* Public MoE row movement: the scatter of token rows into the experts'
 * buffer (dispatch), the weighted gather back (combine, and with weight 1
 * the dispatch's backward) and the combine's backward, all driven by one
 * (S, K) int32 table of destination rows (-1 = dropped route) that moe/
 * builds from the gate's routes. Route rows are checked by the backends,
 * which see the data. */
#include "kernels/dispatch.h"

/* S, K from dest; the token rows (S, M) and the expert rows (-1, M); w (S, K) when present. */
static dsc_status moe_shapes(const kernel_call *call, const dsc_tensor *tokens, const char *tokens_name,
                             const dsc_tensor *rows, const char *rows_name, const dsc_tensor *dest,
                             const dsc_tensor *w, const char *w_name, int64_t *s, int64_t *k, int64_t *m) {
    DSC_TRY(kernel_expect(call, dest, "dest", DSC_DTYPE_I32, 2, (const int64_t[]){-1, -1}));
    *s = dest->shape[0], *k = dest->shape[1];
    DSC_TRY(kernel_expect(call, tokens, tokens_name, DSC_DTYPE_F32, 2, (const int64_t[]){*s, -1}));
    *m = tokens->shape[1];
    DSC_TRY(kernel_expect(call, rows, rows_name, DSC_DTYPE_F32, 2, (const int64_t[]){-1, *m}));
    DSC_CHECK(rows->shape[0] <= INT32_MAX, DSC_ERR_INVALID, "%s: %s has %lld rows, more than an int32 route row",
              call->op, rows_name, (long long)rows->shape[0]);
    return kernel_expect(call, w, w_name, DSC_DTYPE_F32, 2, (const int64_t[]){*s, *k});
}

dsc_status dsc_kernel_moe_scatter(dsc_tensor *buf, const dsc_tensor *x, const dsc_tensor *dest) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_moe_scatter", KARG(buf), KARG(x), KARG(dest)));
    int64_t s, k, m;
    DSC_TRY(moe_shapes(&call, x, "x", buf, "buf", dest, NULL, "w", &s, &k, &m));
    return KERNEL_RUN(&call, moe_scatter, buf->data, buf->shape[0], x->data, dest->data, s, k, m);
}

dsc_status dsc_kernel_moe_gather(dsc_tensor *out, const dsc_tensor *y, const dsc_tensor *dest, const dsc_tensor *w,
                                 bool accumulate) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_moe_gather", KARG(out), KARG(y), KARG(dest), KOPT(w)));
    int64_t s, k, m;
    DSC_TRY(moe_shapes(&call, out, "out", y, "y", dest, w, "w", &s, &k, &m));
    return KERNEL_RUN(&call, moe_gather, out->data, y->data, y->shape[0], dest->data, kernel_f32(w), s, k, m,
                      accumulate);
}

dsc_status dsc_kernel_moe_combine_backward(dsc_tensor *dy, dsc_tensor *dw, const dsc_tensor *dout,
                                           const dsc_tensor *y, const dsc_tensor *dest, const dsc_tensor *w) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_moe_combine_backward", KARG(dy), KARG(dw), KARG(dout), KARG(y),
                         KARG(dest), KARG(w)));
    int64_t s, k, m;
    DSC_TRY(moe_shapes(&call, dout, "dout", y, "y", dest, w, "w", &s, &k, &m));
    DSC_TRY(kernel_expect_like(&call, dy, "dy", y, "y"));
    DSC_TRY(kernel_expect(&call, dw, "dw", DSC_DTYPE_F32, 2, (const int64_t[]){s, k}));
    return KERNEL_RUN(&call, moe_combine_backward, dy->data, dw->data, dy->shape[0], dout->data, y->data,
                      dest->data, w->data, s, k, m);
}
