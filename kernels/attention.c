/* Public causal self-attention (grouped-query), forward and backward. The
 * backends never materialise the (T, T) score matrix; this file only checks
 * the layout: q, out (B, T, NH, HS); k, v (B, T, NKV, HS); lse (B, NH, T). */
#include "kernels/dispatch.h"

/* Reads B, T, NH, HS from q and NKV from k, and checks k, v, lse against them. */
static dsc_status attention_shapes(const kernel_call *call, const dsc_tensor *q, const dsc_tensor *k,
                                   const dsc_tensor *v, const dsc_tensor *lse, int64_t dims[5]) {
    const int64_t any[4] = {-1, -1, -1, -1};
    DSC_TRY(kernel_expect(call, q, "q", DSC_DTYPE_F32, 4, any));
    int64_t b = q->shape[0], t = q->shape[1], nh = q->shape[2], hs = q->shape[3];
    int64_t kv_shape[4] = {b, t, -1, hs};
    DSC_TRY(kernel_expect(call, k, "k", DSC_DTYPE_F32, 4, kv_shape));
    int64_t nkv = k->shape[2];
    kv_shape[2] = nkv;
    DSC_TRY(kernel_expect(call, v, "v", DSC_DTYPE_F32, 4, kv_shape));
    DSC_CHECK(nkv > 0 && nh % nkv == 0, DSC_ERR_INVALID,
              "%s: %lld query heads are not a multiple of %lld key/value heads", call->op, (long long)nh,
              (long long)nkv);
    DSC_CHECK(hs > 0, DSC_ERR_INVALID, "%s: head size is 0", call->op);
    int64_t lse_shape[3] = {b, nh, t};
    DSC_TRY(kernel_expect(call, lse, "lse", DSC_DTYPE_F32, 3, lse_shape));
    dims[0] = b, dims[1] = t, dims[2] = nh, dims[3] = nkv, dims[4] = hs;
    return NULL;
}

/* The FLOPs of one causal (T x T) x (T x hs) product over every head: the
 * keys j <= i of each query i, a multiply-add each. dims: b, t, nh, nkv, hs. */
static int64_t causal_products(const int64_t *d) {
    return 2 * d[0] * d[2] * (d[1] * (d[1] + 1) / 2) * d[4];
}

dsc_status dsc_kernel_attention_forward(dsc_tensor *out, dsc_tensor *lse, const dsc_tensor *q, const dsc_tensor *k,
                                        const dsc_tensor *v) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_attention_forward", KARG(out), KARG(lse), KARG(q), KARG(k), KARG(v)));
    int64_t d[5];
    DSC_TRY(attention_shapes(&call, q, k, v, lse, d));
    DSC_TRY(kernel_expect_like(&call, out, "out", q, "q"));
    kernel_count_flops(2 * causal_products(d)); /* q k^T, then p v */
    return KERNEL_RUN(&call, attention_forward, out->data, lse->data, q->data, k->data, v->data, d[0], d[1], d[2],
                      d[3], d[4]);
}

dsc_status dsc_kernel_attention_backward(dsc_tensor *dq, dsc_tensor *dk, dsc_tensor *dv, const dsc_tensor *dout,
                                         const dsc_tensor *q, const dsc_tensor *k, const dsc_tensor *v,
                                         const dsc_tensor *out, const dsc_tensor *lse) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_attention_backward", KARG(dq), KARG(dk), KARG(dv), KARG(dout), KARG(q),
                         KARG(k), KARG(v), KARG(out), KARG(lse)));
    int64_t d[5];
    DSC_TRY(attention_shapes(&call, q, k, v, lse, d));
    DSC_TRY(kernel_expect_like(&call, out, "out", q, "q"));
    DSC_TRY(kernel_expect_like(&call, dout, "dout", q, "q"));
    DSC_TRY(kernel_expect_like(&call, dq, "dq", q, "q"));
    DSC_TRY(kernel_expect_like(&call, dk, "dk", k, "k"));
    DSC_TRY(kernel_expect_like(&call, dv, "dv", v, "v"));
    kernel_count_flops(5 * causal_products(d)); /* q k^T again, dO v^T, p^T dO, dS k, dS^T q */
    return KERNEL_RUN(&call, attention_backward, dq->data, dk->data, dv->data, dout->data, q->data, k->data,
                      v->data, out->data, lse->data, d[0], d[1], d[2], d[3], d[4]);
}
