/* Causal self-attention split by heads (Megatron-LM's ParallelAttention):
 * this rank's q rows of q heads [q0, q0 + nq) and k, v rows of KV heads
 * [kv0, kv0 + nkv) are column-parallel (whole GQA groups stay on one rank),
 * o's columns of the same q heads are row-parallel. Forward: local
 * projections, RoPE and attention, then one all-reduce of the (b, t, C)
 * output; o's bias is added by the group's rank 0 before the sum, so once.
 * Backward: local until the input gradient, whose partial sums (q, k and v
 * of this rank's heads) are all-reduced once. With sequence parallelism
 * (sequence.c) its input and output are this rank's t / tp positions (and
 * so is the T it is reserved for): the input is gathered along t in forward
 * and again in backward, the output gradient in backward, and each
 * all-reduce is a reduce-scatter back to this rank's positions; q, k, v and
 * the attention output cover the whole sequence (T x tp).
 *
 * It lives inside a block, which keeps the input unchanged until the slot's
 * backward (so only a view of it is kept, this rank's positions under
 * sequence parallelism). Not here: the norms and the residual (the block),
 * replicated KV heads (refused by the wiring). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "tp/tp_internal.h"

typedef struct tp_attention {
    dsc_layer base;
    const dsc_tp_build_extra *tp;
    dsc_param *wq, *wk, *wv, *wo; /* (nq HS, C), (nkv HS, C) x2, (C, nq HS) */
    dsc_param *bq, *bk, *bv, *bo; /* (nq HS), (nkv HS) x2, (C) replicated; NULL without biases */
    int64_t C, NQ, NKV, HS;
    bool rope;
    float rope_theta;
    dsc_device device;
    int slots;
    dsc_tensor *in;        /* [slots] views of the block's input (B, T, C) */
    dsc_tensor *q, *k, *v; /* [slots] (B, Tf, nq, HS), (B, Tf, nkv, HS) x2; after RoPE (Tf: T x tp or T) */
    dsc_tensor *att, *lse; /* [slots] (B, Tf, nq, HS), (B, nq, Tf) */
    dsc_tensor *out, *din; /* [slots] (B, T, C) */
    dsc_tensor *scratch;   /* [4] datt, dq (B, Tf, nq HS); dk, dv (B, Tf, nkv HS) */
    dsc_tensor positions;  /* (Tf) i32, RoPE only */
    tp_seq seq;            /* sequence parallelism's buffers */
} tp_attention;

static void release(tp_attention *a) {
    free(a->in);
    a->in = NULL;
    dsc_buffers_free(&a->q, a->slots);
    dsc_buffers_free(&a->k, a->slots);
    dsc_buffers_free(&a->v, a->slots);
    dsc_buffers_free(&a->att, a->slots);
    dsc_buffers_free(&a->lse, a->slots);
    dsc_buffers_free(&a->out, a->slots);
    dsc_buffers_free(&a->din, a->slots);
    dsc_buffers_free(&a->scratch, 4);
    dsc_tensor_free(&a->positions);
    tp_seq_release(&a->seq);
    a->slots = 0;
}

static dsc_status reserve_positions(tp_attention *a, int64_t T) {
    DSC_TRY(dsc_tensor_alloc(&a->positions, DSC_DTYPE_I32, 1, (int64_t[]){T}, a->device, DSC_MEM_ACTIVATIONS));
    int32_t *pos = a->positions.data; /* CPU only (tp_extra_of) */
    for (int64_t i = 0; i < T; i++)
        pos[i] = (int32_t)i;
    return NULL;
}

static dsc_status attn_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    tp_attention *a = (tp_attention *)self;
    release(a);
    a->slots = slots;
    const int64_t Tf = tp_seq_full(a->tp, T);
    const int64_t q_shape[4] = {B, Tf, a->NQ, a->HS}, kv_shape[4] = {B, Tf, a->NKV, a->HS},
                  c_shape[3] = {B, T, a->C};
    a->in = calloc((size_t)slots, sizeof *a->in);
    dsc_status s = a->in ? NULL : dsc_error(DSC_ERR_NOMEM, "input views for %d slots", slots);
    if (!s) s = dsc_buffers_alloc(&a->q, slots, 4, q_shape, a->device);
    if (!s) s = dsc_buffers_alloc(&a->k, slots, 4, kv_shape, a->device);
    if (!s) s = dsc_buffers_alloc(&a->v, slots, 4, kv_shape, a->device);
    if (!s) s = dsc_buffers_alloc(&a->att, slots, 4, q_shape, a->device);
    if (!s) s = dsc_buffers_alloc(&a->lse, slots, 3, (int64_t[]){B, a->NQ, Tf}, a->device);
    if (!s) s = dsc_buffers_alloc(&a->out, slots, 3, c_shape, a->device);
    if (!s) s = dsc_buffers_alloc(&a->din, slots, 3, c_shape, a->device);
    if (!s) s = dsc_buffers_alloc(&a->scratch, 4, 4, q_shape, a->device); /* dk, dv fit: nkv <= nq */
    if (!s && a->rope) s = reserve_positions(a, Tf);
    if (!s) s = tp_seq_reserve(&a->seq, a->tp, B, Tf, a->C, a->device);
    if (s) release(a);
    return s;
}

typedef struct views {
    dsc_tensor q, k, v, att, lse, pos;
} views;

static views slot_views(const tp_attention *a, int slot, int64_t b, int64_t t) {
    const int64_t q_shape[4] = {b, t, a->NQ, a->HS}, kv_shape[4] = {b, t, a->NKV, a->HS};
    views w = {.q = tp_view(&a->q[slot], 4, q_shape),
               .k = tp_view(&a->k[slot], 4, kv_shape),
               .v = tp_view(&a->v[slot], 4, kv_shape),
               .att = tp_view(&a->att[slot], 4, q_shape),
               .lse = tp_view(&a->lse[slot], 3, (int64_t[]){b, a->NQ, t})};
    if (a->rope) w.pos = tp_view(&a->positions, 1, (int64_t[]){t});
    return w;
}

static dsc_status attn_forward(dsc_layer *self, int slot, const dsc_tensor *local, dsc_tensor *out,
                               dsc_micro_ctx *ctx) {
    (void)ctx;
    tp_attention *a = (tp_attention *)self;
    DSC_TRY(dsc_tensor_expect(local, "input", DSC_DTYPE_F32, 3, (const int64_t[]){-1, -1, a->C}));
    DSC_CHECK(local->shape[1] <= self->max_T, DSC_ERR_INVALID, "%lld positions exceed the reserved %lld",
              (long long)local->shape[1], (long long)self->max_T);
    dsc_tensor x;
    DSC_TRY(tp_seq_gather_input(a->tp, local, &x));
    const dsc_tensor *in = &x;
    const int64_t b = in->shape[0], t = in->shape[1];
    a->in[slot] = *local;
    views w = slot_views(a, slot, b, t);
    DSC_TRY(dsc_param_linear_forward(&w.q, in, a->wq, a->bq));
    DSC_TRY(dsc_param_linear_forward(&w.k, in, a->wk, a->bk));
    DSC_TRY(dsc_param_linear_forward(&w.v, in, a->wv, a->bv));
    if (a->rope) {
        DSC_TRY(dsc_kernel_rope(&w.q, &w.q, &w.pos, a->rope_theta, false));
        DSC_TRY(dsc_kernel_rope(&w.k, &w.k, &w.pos, a->rope_theta, false));
    }
    DSC_TRY(dsc_kernel_attention_forward(&w.att, &w.lse, &w.q, &w.k, &w.v));
    dsc_tensor partial;
    DSC_TRY(tp_seq_partial(a->tp, &a->out[slot], in->shape, &partial));
    DSC_TRY(dsc_param_linear_forward(&partial, &w.att, a->wo, a->tp->rank == 0 ? a->bo : NULL));
    return tp_seq_sum(a->tp, &partial, &a->out[slot], out);
}

static dsc_status attn_backward(dsc_layer *self, int slot, const dsc_tensor *dlocal, dsc_tensor *dx_out,
                                dsc_micro_ctx *ctx) {
    (void)ctx;
    tp_attention *a = (tp_attention *)self;
    DSC_CHECK(a->in[slot].data, DSC_ERR_INVALID, "backward without a forward");
    dsc_tensor dfull, xfull;
    DSC_TRY(tp_seq_gather_grad(a->tp, dlocal, &dfull));
    DSC_TRY(tp_seq_gather_input(a->tp, &a->in[slot], &xfull)); /* again: only this rank's positions were kept */
    const dsc_tensor *dy = &dfull, *x = &xfull;
    DSC_TRY(dsc_tensor_expect(dy, "output gradient", DSC_DTYPE_F32, 3, x->shape));
    const int64_t b = x->shape[0], t = x->shape[1];
    views w = slot_views(a, slot, b, t);
    const int64_t q_shape[4] = {b, t, a->NQ, a->HS}, kv_shape[4] = {b, t, a->NKV, a->HS};
    dsc_tensor datt = tp_view(&a->scratch[0], 4, q_shape), dq = tp_view(&a->scratch[1], 4, q_shape);
    dsc_tensor dk = tp_view(&a->scratch[2], 4, kv_shape), dv = tp_view(&a->scratch[3], 4, kv_shape);
    /* o's bias is replicated: every rank takes the whole gradient, sum(dy). */
    DSC_TRY(dsc_param_linear_backward(&datt, false, a->wo, a->bo, dy, &w.att));
    DSC_TRY(dsc_kernel_attention_backward(&dq, &dk, &dv, &datt, &w.q, &w.k, &w.v, &w.att, &w.lse));
    if (a->rope) {
        DSC_TRY(dsc_kernel_rope(&dq, &dq, &w.pos, a->rope_theta, true));
        DSC_TRY(dsc_kernel_rope(&dk, &dk, &w.pos, a->rope_theta, true));
    }
    dsc_tensor dx;
    DSC_TRY(tp_seq_partial(a->tp, &a->din[slot], x->shape, &dx));
    DSC_TRY(dsc_param_linear_backward(&dx, false, a->wq, a->bq, &dq, x));
    DSC_TRY(dsc_param_linear_backward(&dx, true, a->wk, a->bk, &dk, x));
    DSC_TRY(dsc_param_linear_backward(&dx, true, a->wv, a->bv, &dv, x));
    a->in[slot] = (dsc_tensor){0};
    return tp_seq_sum(a->tp, &dx, &a->din[slot], dx_out);
}

static void attn_destroy(dsc_layer *self) {
    release((tp_attention *)self);
    free(self);
}

static const dsc_layer_ops attn_ops = {.type = "tp_attention",
                                       .reserve = attn_reserve,
                                       .forward = attn_forward,
                                       .backward = attn_backward,
                                       .destroy = attn_destroy};

/* The same names, global shapes and initialisation as the dense attention
 * (runtime/nn/attention.c), each declared as this rank's piece. */
static dsc_status declare(tp_attention *a, const dsc_model_config *mc, dsc_param_store *store) {
    tp_param_list list = {.n = 0};
    const char *p = a->base.name;
    const dsc_tp_shard *sh = &a->tp->shard;
    const int64_t C = a->C, HS = a->HS, Q = (int64_t)mc->n_head * HS, KV = (int64_t)mc->n_kv_head * HS;
    const int64_t q0 = sh->q0 * HS, nq = a->NQ * HS, kv0 = sh->kv0 * HS, nkv = a->NKV * HS;
    const float std = mc->init_std, std_o = mc->init_std / sqrtf(2.0f * (float)mc->n_layer);
    const uint32_t nd = DSC_PARAM_NO_DECAY;
    DSC_TRY(
        tp_declare(&list, store, p, "q.weight", 2, (int64_t[]){Q, C}, 0, q0, nq, 0, DSC_INIT_NORMAL, std, &a->wq));
    DSC_TRY(tp_declare(&list, store, p, "k.weight", 2, (int64_t[]){KV, C}, 0, kv0, nkv, 0, DSC_INIT_NORMAL, std,
                       &a->wk));
    DSC_TRY(tp_declare(&list, store, p, "v.weight", 2, (int64_t[]){KV, C}, 0, kv0, nkv, 0, DSC_INIT_NORMAL, std,
                       &a->wv));
    DSC_TRY(tp_declare(&list, store, p, "o.weight", 2, (int64_t[]){C, Q}, 1, q0, nq, 0, DSC_INIT_NORMAL, std_o,
                       &a->wo));
    if (mc->qkv_bias) {
        DSC_TRY(
            tp_declare(&list, store, p, "q.bias", 1, (int64_t[]){Q}, 0, q0, nq, nd, DSC_INIT_ZEROS, 0, &a->bq));
        DSC_TRY(
            tp_declare(&list, store, p, "k.bias", 1, (int64_t[]){KV}, 0, kv0, nkv, nd, DSC_INIT_ZEROS, 0, &a->bk));
        DSC_TRY(
            tp_declare(&list, store, p, "v.bias", 1, (int64_t[]){KV}, 0, kv0, nkv, nd, DSC_INIT_ZEROS, 0, &a->bv));
    }
    if (mc->arch != DSC_ARCH_LLAMA && mc->arch != DSC_ARCH_MIXTRAL)
        DSC_TRY(tp_declare(&list, store, p, "o.bias", 1, (int64_t[]){C}, -1, 0, 0, nd, DSC_INIT_ZEROS, 0, &a->bo));
    return dsc_layer_set_params(&a->base, list.items, NULL, list.n);
}

dsc_status dsc_tp_attention_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    *out = NULL;
    const dsc_tp_build_extra *x;
    DSC_TRY(tp_extra_of(ctx, "tp_attention", &x));
    const dsc_model_config *mc = ctx->model;
    tp_attention *a = calloc(1, sizeof *a);
    DSC_CHECK(a, DSC_ERR_NOMEM, "attention of block %d", spec->block);
    a->base.ops = &attn_ops;
    snprintf(a->base.name, sizeof a->base.name, "layers.%d.attn", spec->block);
    a->tp = x;
    a->C = mc->d_model;
    a->HS = mc->d_model / mc->n_head;
    a->NQ = x->shard.nq;
    a->NKV = x->shard.nkv;
    a->rope = mc->arch == DSC_ARCH_LLAMA || mc->arch == DSC_ARCH_MIXTRAL;
    a->rope_theta = mc->rope_theta;
    a->device = ctx->device;
    /* per reserved token: q, att, k, v, lse of the whole sequence (tp tokens of it under sequence
     * parallelism), output and input gradient */
    a->base.activation_bytes_per_token =
        (int64_t)sizeof(float) * (tp_seq_full(x, 1) * (2 * a->NQ * a->HS + 2 * a->NKV * a->HS + a->NQ) + 2 * a->C);
    dsc_status s = declare(a, mc, ctx->params);
    if (s) {
        dsc_layer_destroy(&a->base);
        return s;
    }
    *out = &a->base;
    return NULL;
}
