/* The vocabulary-parallel embedding (Megatron-LM's VocabParallelEmbedding):
 * this rank holds token rows [v0, v0 + nv) of "embed.wte.weight", writes
 * the rows of the tokens in its range and zeros for the rest, and one
 * all-reduce over the tensor group completes every row; GPT's learned
 * positions are replicated and added by the group's rank 0 before the sum
 * (exactly the rows' value plus the position's: the other ranks add zeros).
 * Backward needs no communication: each rank accumulates the rows it holds.
 * With sequence parallelism (sequence.c) the sum is a reduce-scatter to
 * this rank's positions, and backward first gathers the output gradient, so
 * the positions' gradient is whole on every rank.
 *
 * CPU tensors only (the wiring refuses others). Not here: the LM head that
 * shares the weight when embeddings are tied (layer_head.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp/tp_internal.h"

typedef struct tp_embedding {
    dsc_layer base;
    const dsc_tp_build_extra *tp;
    dsc_param *wte; /* (nv, C): rows [v0, v0 + nv) */
    dsc_param *wpe; /* (seq_len, C) replicated, NULL for Llama */
    int64_t C, V, seq_len;
    dsc_device device;
    int slots;
    int32_t *tokens;  /* (slots, B, T) copies of the slot's ids */
    dsc_tensor *out;  /* [slots] (B, T, C); (B, T / tp, C) under sequence parallelism */
    int64_t (*bt)[2]; /* [slots] (b, t) of the pending forward; b = 0 when none */
    tp_seq seq;       /* sequence parallelism's buffers */
} tp_embedding;

static void release(tp_embedding *e) {
    free(e->tokens);
    e->tokens = NULL;
    dsc_buffers_free(&e->out, e->slots);
    free(e->bt);
    e->bt = NULL;
    tp_seq_release(&e->seq);
    e->slots = 0;
}

static dsc_status emb_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    tp_embedding *e = (tp_embedding *)self;
    release(e);
    DSC_CHECK(T <= e->seq_len, DSC_ERR_INVALID, "sequence length %lld exceeds model.seq_len %lld", (long long)T,
              (long long)e->seq_len);
    e->slots = slots;
    e->tokens = calloc((size_t)(slots * B * T), sizeof *e->tokens);
    e->bt = calloc((size_t)slots, sizeof *e->bt);
    dsc_status s = e->tokens && e->bt ? NULL : dsc_error(DSC_ERR_NOMEM, "token copies for %d slots", slots);
    if (!s) s = dsc_buffers_alloc(&e->out, slots, 3, (int64_t[]){B, tp_seq_local(e->tp, T), e->C}, e->device);
    if (!s) s = tp_seq_reserve(&e->seq, e->tp, B, T, e->C, e->device);
    if (s) release(e);
    return s;
}

static dsc_status emb_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out,
                              dsc_micro_ctx *ctx) {
    (void)in;
    tp_embedding *e = (tp_embedding *)self;
    e->bt[slot][0] = 0; /* a failed forward leaves no pending backward */
    DSC_CHECK(ctx && ctx->tokens, DSC_ERR_INVALID, "no token ids (ctx->tokens)");
    const dsc_tensor *ids = ctx->tokens;
    DSC_TRY(dsc_tensor_expect(ids, "token ids", DSC_DTYPE_I32, 2, (int64_t[]){-1, -1}));
    DSC_CHECK(ids->device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED, "token ids on a device");
    const int64_t b = ids->shape[0], t = ids->shape[1], C = e->C, v0 = e->tp->shard.v0, nv = e->tp->shard.nv;
    DSC_CHECK(b >= 1 && b <= self->max_B && t >= 1 && t <= self->max_T, DSC_ERR_INVALID,
              "token ids (%lld, %lld) exceed the reserved micro-batch (%lld, %lld)", (long long)b, (long long)t,
              (long long)self->max_B, (long long)self->max_T);
    int32_t *tok = e->tokens + (size_t)slot * (size_t)(self->max_B * self->max_T);
    memcpy(tok, ids->data, (size_t)(b * t) * sizeof *tok);
    dsc_tensor full;
    DSC_TRY(tp_seq_partial(e->tp, &e->out[slot], (int64_t[]){b, t, C}, &full));
    float *o = full.data;
    const float *w = e->wte->value.data;
    for (int64_t i = 0; i < b * t; i++) {
        DSC_CHECK(tok[i] >= 0 && tok[i] < e->V, DSC_ERR_INVALID, "token id %d at (%lld, %lld) outside [0, %lld)",
                  tok[i], (long long)(i / t), (long long)(i % t), (long long)e->V);
        const int64_t r = tok[i] - v0;
        if (r >= 0 && r < nv)
            memcpy(o + i * C, w + r * C, (size_t)C * sizeof *o);
        else
            memset(o + i * C, 0, (size_t)C * sizeof *o);
    }
    if (e->wpe && e->tp->rank == 0) {
        const float *pe = e->wpe->value.data;
        for (int64_t i = 0; i < b * t; i++)
            for (int64_t c = 0; c < C; c++)
                o[i * C + c] += pe[(i % t) * C + c];
    }
    DSC_TRY(tp_seq_sum(e->tp, &full, &e->out[slot], out));
    e->bt[slot][0] = b;
    e->bt[slot][1] = t;
    return NULL;
}

static dsc_status emb_backward(dsc_layer *self, int slot, const dsc_tensor *dlocal, dsc_tensor *din,
                               dsc_micro_ctx *ctx) {
    (void)ctx;
    tp_embedding *e = (tp_embedding *)self;
    *din = (dsc_tensor){0};
    const int64_t b = e->bt[slot][0], t = e->bt[slot][1], C = e->C, v0 = e->tp->shard.v0, nv = e->tp->shard.nv;
    DSC_CHECK(b > 0, DSC_ERR_INVALID, "backward without a pending forward");
    DSC_CHECK(dlocal, DSC_ERR_INVALID, "no output gradient");
    dsc_tensor dfull;
    DSC_TRY(tp_seq_gather_grad(e->tp, dlocal, &dfull));
    const dsc_tensor *dout = &dfull;
    DSC_TRY(dsc_tensor_expect(dout, "output gradient", DSC_DTYPE_F32, 3, (int64_t[]){b, t, C}));
    const int32_t *tok = e->tokens + (size_t)slot * (size_t)(self->max_B * self->max_T);
    const float *g = dout->data;
    float *dw = e->wte->grad.data, *dpe = e->wpe ? e->wpe->grad.data : NULL;
    for (int64_t i = 0; i < b * t; i++) {
        const int64_t r = tok[i] - v0;
        for (int64_t c = 0; r >= 0 && r < nv && c < C; c++)
            dw[r * C + c] += g[i * C + c];
        for (int64_t c = 0; dpe && c < C; c++)
            dpe[(i % t) * C + c] += g[i * C + c];
    }
    e->bt[slot][0] = 0;
    return NULL;
}

static void emb_destroy(dsc_layer *self) {
    release((tp_embedding *)self);
    free(self);
}

static const dsc_layer_ops emb_ops = {.type = "tp_embedding",
                                      .reserve = emb_reserve,
                                      .forward = emb_forward,
                                      .backward = emb_backward,
                                      .destroy = emb_destroy};

dsc_status tp_embedding_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    (void)spec;
    *out = NULL;
    const dsc_tp_build_extra *x;
    DSC_TRY(tp_extra_of(ctx, "tp_embedding", &x));
    const dsc_model_config *mc = ctx->model;
    tp_embedding *e = calloc(1, sizeof *e);
    DSC_CHECK(e, DSC_ERR_NOMEM, "embedding layer");
    e->base.ops = &emb_ops;
    snprintf(e->base.name, sizeof e->base.name, "embed");
    e->tp = x;
    e->C = mc->d_model;
    e->V = mc->vocab_size;
    e->seq_len = mc->seq_len;
    e->device = ctx->device;
    e->base.activation_bytes_per_token = (int64_t)sizeof(float) * e->C + (int64_t)sizeof(int32_t);
    tp_param_list list = {.n = 0};
    const uint32_t tied = mc->tie_embeddings ? DSC_PARAM_TIED : 0;
    dsc_status s = tp_declare(&list, ctx->params, "embed", "wte.weight", 2, (int64_t[]){e->V, e->C}, 0,
                              x->shard.v0, x->shard.nv, tied, DSC_INIT_NORMAL, mc->init_std, &e->wte);
    if (!s && mc->arch != DSC_ARCH_LLAMA && mc->arch != DSC_ARCH_MIXTRAL)
        s = tp_declare(&list, ctx->params, "embed", "wpe.weight", 2, (int64_t[]){e->seq_len, e->C}, -1, 0, 0, 0,
                       DSC_INIT_NORMAL, mc->init_std, &e->wpe);
    if (!s) s = dsc_layer_set_params(&e->base, list.items, NULL, list.n);
    if (s) {
        dsc_layer_destroy(&e->base);
        return s;
    }
    *out = &e->base;
    return NULL;
}
