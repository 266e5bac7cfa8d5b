/* Public token (+ position) embedding, forward and scatter-add backward.
 * tokens (B, T) i32; wte (V, C); wpe (Tmax, C) or NULL with T <= Tmax;
 * out (B, T, C). Token ids are checked by the backends, which see the data. */
#include "kernels/dispatch.h"

/* B, T from tokens; checks the table, the optional position table and rows of C. */
static dsc_status embedding_shapes(const kernel_call *call, const dsc_tensor *rows, const char *rows_name,
                                   const dsc_tensor *tokens, const dsc_tensor *wte, const char *wte_name,
                                   const dsc_tensor *wpe, const char *wpe_name, int64_t *b, int64_t *t, int64_t *v,
                                   int64_t *c) {
    const int64_t any2[2] = {-1, -1};
    DSC_TRY(kernel_expect(call, tokens, "tokens", DSC_DTYPE_I32, 2, any2));
    DSC_TRY(kernel_expect(call, wte, wte_name, DSC_DTYPE_F32, 2, any2));
    *b = tokens->shape[0], *t = tokens->shape[1], *v = wte->shape[0], *c = wte->shape[1];
    int64_t rows_shape[3] = {*b, *t, *c};
    DSC_TRY(kernel_expect(call, rows, rows_name, DSC_DTYPE_F32, 3, rows_shape));
    int64_t wpe_shape[2] = {-1, *c};
    DSC_TRY(kernel_expect(call, wpe, wpe_name, DSC_DTYPE_F32, 2, wpe_shape));
    DSC_CHECK(!wpe || wpe->shape[0] >= *t, DSC_ERR_INVALID, "%s: sequence length %lld exceeds the %lld rows of %s",
              call->op, (long long)*t, (long long)wpe->shape[0], wpe_name);
    return NULL;
}

dsc_status dsc_kernel_embedding_forward(dsc_tensor *out, const dsc_tensor *tokens, const dsc_tensor *wte,
                                        const dsc_tensor *wpe) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_embedding_forward", KARG(out), KARG(tokens), KARG(wte), KOPT(wpe)));
    int64_t b, t, v, c;
    DSC_TRY(embedding_shapes(&call, out, "out", tokens, wte, "wte", wpe, "wpe", &b, &t, &v, &c));
    return KERNEL_RUN(&call, embedding_forward, out->data, tokens->data, wte->data, kernel_f32(wpe), b * t, t, v,
                      c);
}

dsc_status dsc_kernel_embedding_backward(dsc_tensor *dwte, dsc_tensor *dwpe, const dsc_tensor *dout,
                                         const dsc_tensor *tokens) {
    kernel_call call;
    DSC_TRY(
        KERNEL_BEGIN(&call, "dsc_kernel_embedding_backward", KARG(dwte), KOPT(dwpe), KARG(dout), KARG(tokens)));
    int64_t b, t, v, c;
    DSC_TRY(embedding_shapes(&call, dout, "dout", tokens, dwte, "dwte", dwpe, "dwpe", &b, &t, &v, &c));
    const dsc_dtype rounded = kernel_grad_dtype();
    if (rounded != DSC_DTYPE_F32)
        return KERNEL_RUN(&call, embedding_backward_rounded, dwte->data, kernel_f32(dwpe), dout->data,
                          tokens->data, b * t, t, v, c, rounded);
    return KERNEL_RUN(&call, embedding_backward, dwte->data, kernel_f32(dwpe), dout->data, tokens->data, b * t, t,
                      v, c);
}
