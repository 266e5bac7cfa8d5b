/* The embedding layer, first of every model: token embeddings (wte) plus, for
 * GPT, learned position embeddings (wpe); Llama adds positions later, with
 * RoPE inside attention.
 *
 * It reads token ids from ctx->tokens (ids outside [0, V) are an error naming
 * the id), keeps a copy per slot for backward, and has no input gradient.
 * Tied with the LM head through the shared name "embed.wte.weight". */
#include <stdio.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "runtime/nn/nn_internal.h"

typedef struct embedding_layer {
    dsc_layer base;
    dsc_param *wte; /* (V, C) */
    dsc_param *wpe; /* (seq_len, C), NULL for Llama */
    int64_t C, seq_len;
    dsc_device device;
    int nslots;
    dsc_tensor *tokens; /* [slots] (B, T) i32 copy of the slot's ids */
    dsc_tensor *out;    /* [slots] (B, T, C) */
    int64_t (*bt)[2];   /* [slots] (b, t) of the pending forward; b = 0 when none */
} embedding_layer;

static void release(embedding_layer *e) {
    for (int i = 0; e->tokens && i < e->nslots; i++)
        dsc_tensor_free(&e->tokens[i]);
    free(e->tokens);
    e->tokens = NULL;
    dsc_buffers_free(&e->out, e->nslots);
    free(e->bt);
    e->bt = NULL;
    e->nslots = 0;
}

static dsc_status embedding_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    embedding_layer *e = (embedding_layer *)self;
    release(e);
    DSC_CHECK(T <= e->seq_len, DSC_ERR_INVALID, "sequence length %lld exceeds model.seq_len %lld", (long long)T,
              (long long)e->seq_len);
    e->nslots = slots;
    e->tokens = calloc((size_t)slots, sizeof *e->tokens);
    e->bt = calloc((size_t)slots, sizeof *e->bt);
    dsc_status s = e->tokens && e->bt ? NULL : dsc_error(DSC_ERR_NOMEM, "slot tables of %d entries", slots);
    for (int i = 0; i < slots && !s; i++)
        s = dsc_tensor_alloc(&e->tokens[i], DSC_DTYPE_I32, 2, (int64_t[]){B, T}, e->device, DSC_MEM_ACTIVATIONS);
    if (!s) s = dsc_buffers_alloc(&e->out, slots, 3, (int64_t[]){B, T, e->C}, e->device);
    if (s) release(e);
    return s;
}

static dsc_status embedding_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out,
                                    dsc_micro_ctx *ctx) {
    (void)in;
    embedding_layer *e = (embedding_layer *)self;
    e->bt[slot][0] = 0; /* a failed forward leaves no pending backward */
    DSC_CHECK(ctx && ctx->tokens, DSC_ERR_INVALID, "no token ids (ctx->tokens)");
    const dsc_tensor *ids = ctx->tokens;
    DSC_TRY(dsc_tensor_expect(ids, "token ids", DSC_DTYPE_I32, 2, (int64_t[]){-1, -1}));
    const int64_t b = ids->shape[0], t = ids->shape[1];
    DSC_CHECK(b >= 1 && b <= self->max_B && t >= 1 && t <= self->max_T, DSC_ERR_INVALID,
              "token ids (%lld, %lld) exceed the reserved micro-batch (%lld, %lld)", (long long)b, (long long)t,
              (long long)self->max_B, (long long)self->max_T);
    dsc_tensor tokens = nn_view(&e->tokens[slot], 2, ids->shape);
    DSC_TRY(dsc_tensor_copy(&tokens, ids));
    dsc_tensor o = nn_view(&e->out[slot], 3, (int64_t[]){b, t, e->C});
    DSC_TRY(dsc_kernel_embedding_forward(&o, &tokens, &e->wte->value, e->wpe ? &e->wpe->value : NULL));
    e->bt[slot][0] = b;
    e->bt[slot][1] = t;
    *out = o;
    return NULL;
}

static dsc_status embedding_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                     dsc_micro_ctx *ctx) {
    (void)ctx;
    embedding_layer *e = (embedding_layer *)self;
    *din = (dsc_tensor){0};
    DSC_CHECK(e->bt[slot][0] > 0, DSC_ERR_INVALID, "backward without a pending forward");
    DSC_CHECK(dout, DSC_ERR_INVALID, "no output gradient");
    DSC_TRY(dsc_tensor_expect(dout, "output gradient", DSC_DTYPE_F32, 3,
                              (int64_t[]){e->bt[slot][0], e->bt[slot][1], e->C}));
    dsc_tensor tokens = nn_view(&e->tokens[slot], 2, e->bt[slot]);
    DSC_TRY(dsc_kernel_embedding_backward(&e->wte->grad, e->wpe ? &e->wpe->grad : NULL, dout, &tokens));
    e->bt[slot][0] = 0;
    return NULL;
}

static void embedding_destroy(dsc_layer *self) {
    release((embedding_layer *)self);
    free(self);
}

static const dsc_layer_ops embedding_ops = {.type = "embedding",
                                            .reserve = embedding_reserve,
                                            .forward = embedding_forward,
                                            .backward = embedding_backward,
                                            .destroy = embedding_destroy};

dsc_status nn_embedding_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    (void)spec;
    *out = NULL;
    const dsc_model_config *mc = ctx->model;
    embedding_layer *e = calloc(1, sizeof *e);
    DSC_CHECK(e, DSC_ERR_NOMEM, "embedding layer");
    e->base.ops = &embedding_ops;
    snprintf(e->base.name, sizeof e->base.name, "embed");
    e->C = mc->d_model;
    e->seq_len = mc->seq_len;
    e->device = ctx->device;
    e->base.activation_bytes_per_token = (int64_t)sizeof(float) * e->C + (int64_t)sizeof(int32_t);
    nn_param_list list = {.n = 0};
    const uint32_t tied = mc->tie_embeddings ? DSC_PARAM_TIED : 0;
    /* the lookup rounds the rows it reads under bf16; the backward scatters dout into the gradients,
     * rounding each row's sum under reduced-type gradients */
    const uint32_t lookup =
        DSC_PARAM_USE_ROUNDED_BY_KERNELS | DSC_PARAM_USE_FORWARD_ONLY | DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS;
    dsc_status s = nn_declare_used(&list, ctx->params, "embed", "wte.weight", 2, (int64_t[]){mc->vocab_size, e->C},
                                   tied, lookup, DSC_INIT_NORMAL, mc->init_std, &e->wte);
    if (!s && !nn_arch_is_llama(mc))
        s = nn_declare_used(&list, ctx->params, "embed", "wpe.weight", 2, (int64_t[]){e->seq_len, e->C}, 0, lookup,
                            DSC_INIT_NORMAL, mc->init_std, &e->wpe);
    if (!s) s = nn_set_params(&e->base, &list);
    if (s) {
        dsc_layer_destroy(&e->base);
        return s;
    }
    *out = &e->base;
    return NULL;
}
