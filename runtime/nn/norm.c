/* The normalisation component of blocks and the LM head: LayerNorm with
 * weight and bias for GPT, RMSNorm with weight only for Llama.
 *
 * It saves only the per-row statistics per slot; the owning layer keeps the
 * input and hands it back in backward. */
#include "dsc/kernels.h"
#include "runtime/nn/nn_internal.h"

dsc_status nn_norm_init(nn_norm *n, nn_param_list *list, dsc_param_store *store, const char *prefix,
                        const dsc_model_config *mc) {
    *n = (nn_norm){.eps = mc->norm_eps, .C = mc->d_model};
    const int64_t shape[1] = {mc->d_model};
    DSC_TRY(
        nn_declare(list, store, prefix, "weight", 1, shape, DSC_PARAM_NO_DECAY, DSC_INIT_ONES, 0.0f, &n->weight));
    if (!nn_arch_is_llama(mc))
        DSC_TRY(
            nn_declare(list, store, prefix, "bias", 1, shape, DSC_PARAM_NO_DECAY, DSC_INIT_ZEROS, 0.0f, &n->bias));
    return NULL;
}

void nn_norm_free(nn_norm *n) {
    dsc_buffers_free(&n->mean, n->slots);
    dsc_buffers_free(&n->rstd, n->slots);
    n->slots = 0;
}

dsc_status nn_norm_reserve(nn_norm *n, int slots, int64_t B, int64_t T, dsc_device device) {
    nn_norm_free(n);
    const int64_t shape[1] = {B * T};
    if (n->bias) DSC_TRY(dsc_buffers_alloc(&n->mean, slots, 1, shape, device));
    dsc_status s = dsc_buffers_alloc(&n->rstd, slots, 1, shape, device);
    if (s) {
        dsc_buffers_free(&n->mean, slots);
        return s;
    }
    n->slots = slots;
    return NULL;
}

int64_t nn_norm_saved_floats_per_token(const nn_norm *n) {
    return n->bias ? 2 : 1;
}

dsc_status nn_norm_forward(nn_norm *n, int slot, const dsc_tensor *x, dsc_tensor *out) {
    dsc_tensor x2 = nn_rows(x), out2 = nn_rows(out);
    const int64_t rows[1] = {x2.shape[0]};
    dsc_tensor rstd = nn_view(&n->rstd[slot], 1, rows);
    if (!n->bias) return dsc_kernel_rmsnorm_forward(&out2, &rstd, &x2, &n->weight->value, n->eps);
    dsc_tensor mean = nn_view(&n->mean[slot], 1, rows);
    return dsc_kernel_layernorm_forward(&out2, &mean, &rstd, &x2, &n->weight->value, &n->bias->value, n->eps);
}

dsc_status nn_norm_backward(nn_norm *n, int slot, const dsc_tensor *x, const dsc_tensor *dout, dsc_tensor *dx) {
    dsc_tensor x2 = nn_rows(x), dout2 = nn_rows(dout), dx2 = nn_rows(dx);
    const int64_t rows[1] = {x2.shape[0]};
    dsc_tensor rstd = nn_view(&n->rstd[slot], 1, rows);
    if (!n->bias)
        return dsc_kernel_rmsnorm_backward(&dx2, &n->weight->grad, &dout2, &x2, &n->weight->value, &rstd);
    dsc_tensor mean = nn_view(&n->mean[slot], 1, rows);
    return dsc_kernel_layernorm_backward(&dx2, &n->weight->grad, &n->bias->grad, &dout2, &x2, &n->weight->value,
                                         &mean, &rstd);
}
