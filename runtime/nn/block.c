/* The pre-norm transformer block: x + attn(norm1(x)), then + ffn(norm2(.)),
 * with optional activation checkpointing.
 *
 * Without checkpointing every slot keeps its intermediates. With it, a slot
 * keeps only its input, output and input gradient; the intermediates (h1,
 * resid, h2, the components' and the ffn's saved tensors) exist only while
 * the block runs: reserved with one slot at the start of its forward and of
 * its backward (which first re-runs the forward) and freed at the end, so a
 * model of L checkpointed blocks holds one block's intermediates at a time
 * instead of L (a sub-layer without dsc_layer_release, such as the MoE layer
 * or tp/'s attention, keeps its one slot reserved). This trades an allocation
 * per block run for the memory; the recompute costs one more forward per
 * backward. The kernels
 * are deterministic and the recompute replays the layer stream (ctx->rng)
 * from where the slot's forward found it, so the recomputed activations
 * (random gate noise included), and hence the gradients, are bitwise those of
 * the plain path; the recompute's reported losses (ctx->aux_loss) are
 * dropped, as the forward reported them already. The block does not know what its ffn
 * is (dense MLP here, MoE in moe/), nor, when the build context brings an
 * attention factory, what its attention is (split by heads in tp/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "runtime/nn/nn_internal.h"

typedef struct block_layer {
    dsc_layer base;
    nn_norm norm1, norm2;
    nn_attention attn;
    dsc_layer *attn_layer; /* the build context's attention (tp/), replacing attn; NULL: attn */
    dsc_layer *ffn;
    bool checkpoint;
    int64_t C;
    dsc_device device;
    int nslots, inner_slots; /* allocated: per-slot buffers, and component slots (0 or 1 when checkpointing) */
    int64_t B, T;            /* reserved micro-batch */
    dsc_tensor *x;           /* [slots] (B, T, C) the input as the block computes with it (stream_dtype) */
    dsc_tensor *out;         /* [slots] (B, T, C) */
    dsc_tensor *din;         /* [slots] (B, T, C) */
    int64_t (*bt)[2];        /* [slots] (b, t) of the slot's micro-batch; b = 0 when no forward is pending */
    dsc_rng *rng_at;         /* [slots] ctx->rng as the slot's forward found it (checkpointing only) */
    dsc_tensor *h1;          /* [inner] (B, T, C) norm1(x) */
    dsc_tensor *resid;       /* [inner] (B, T, C) x + attn(h1) (stream_dtype) */
    dsc_tensor *h2;          /* [inner] (B, T, C) norm2(resid) */
    /* The types h1 and h2 are kept in: 2 bytes under mixed precision on the CPU where only products
     * read them after the forward (h1 by the block's own attention, h2 by an ffn that says so:
     * input_read_by_products_only), widened into NN_WORK_BLOCK_IN for the backward; else f32. */
    dsc_dtype h1_dtype, h2_dtype;
    /* The type x and resid are kept in: 2 bytes under mixed precision on the CPU, where they hold
     * values of the product type (below) and only the norms' backward reads them, widened into the
     * workspace; else f32. */
    dsc_dtype stream_dtype;
    bool holds_work; /* a hold on the workspace (NN_WORK_BLOCK: attention output or dh; dresid) */
} block_layer;

/* A sub-layer whose activations follow the block's intermediates: with
 * checkpointing only when it can release them. */
static bool follows_inner(const block_layer *k, const dsc_layer *sub) {
    return !k->checkpoint || sub->ops->release;
}

/* Frees the intermediates (and, when checkpointing, the sub-layers' activations they can release). */
static void inner_free(block_layer *k) {
    dsc_buffers_free(&k->h1, k->inner_slots);
    dsc_buffers_free(&k->resid, k->inner_slots);
    dsc_buffers_free(&k->h2, k->inner_slots);
    nn_norm_free(&k->norm1);
    nn_norm_free(&k->norm2);
    if (!k->attn_layer) nn_attention_free(&k->attn);
    if (k->checkpoint && k->attn_layer) dsc_layer_release(k->attn_layer);
    if (k->checkpoint) dsc_layer_release(k->ffn);
    k->inner_slots = 0;
}

/* Reserves the intermediates for `inner` component slots. */
static dsc_status inner_reserve(block_layer *k, int inner) {
    const int64_t B = k->B, T = k->T, shape[3] = {B, T, k->C};
    k->inner_slots = inner;
    dsc_status s = nn_buffers_alloc_as(&k->h1, inner, 3, shape, k->device, k->h1_dtype);
    if (!s) s = nn_buffers_alloc_as(&k->resid, inner, 3, shape, k->device, k->stream_dtype);
    if (!s) s = nn_buffers_alloc_as(&k->h2, inner, 3, shape, k->device, k->h2_dtype);
    if (!s) s = nn_norm_reserve(&k->norm1, inner, B, T, k->device);
    if (!s && !k->attn_layer) s = nn_attention_reserve(&k->attn, inner, B, T, k->device);
    if (!s && k->attn_layer && follows_inner(k, k->attn_layer)) s = dsc_layer_reserve(k->attn_layer, inner, B, T);
    if (!s) s = nn_norm_reserve(&k->norm2, inner, B, T, k->device);
    if (!s && follows_inner(k, k->ffn)) s = dsc_layer_reserve(k->ffn, inner, B, T);
    if (s) inner_free(k);
    return s;
}

static void release(block_layer *k) {
    dsc_buffers_free(&k->x, k->nslots);
    dsc_buffers_free(&k->out, k->nslots);
    dsc_buffers_free(&k->din, k->nslots);
    free(k->bt);
    k->bt = NULL;
    free(k->rng_at);
    k->rng_at = NULL;
    inner_free(k);
    if (k->holds_work) nn_work_drop();
    k->holds_work = false;
    k->nslots = 0;
}

static dsc_status block_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    block_layer *k = (block_layer *)self;
    release(k);
    const int64_t shape[3] = {B, T, k->C};
    k->nslots = slots;
    nn_work_hold();
    k->holds_work = true;
    k->B = B;
    k->T = T;
    k->bt = calloc((size_t)slots, sizeof *k->bt);
    k->rng_at = calloc((size_t)slots, sizeof *k->rng_at);
    dsc_status s = k->bt && k->rng_at ? NULL : dsc_error(DSC_ERR_NOMEM, "slot table of %d entries", slots);
    if (!s) s = nn_buffers_alloc_as(&k->x, slots, 3, shape, k->device, k->stream_dtype);
    if (!s) s = dsc_buffers_alloc(&k->out, slots, 3, shape, k->device);
    if (!s) s = dsc_buffers_alloc(&k->din, slots, 3, shape, k->device);
    if (!s) s = nn_work_grow(NN_WORK_BLOCK, 2, B * T * k->C, k->device);
    if (!s && (k->h1_dtype != DSC_DTYPE_F32 || k->h2_dtype != DSC_DTYPE_F32 || k->stream_dtype != DSC_DTYPE_F32))
        s = nn_work_grow(NN_WORK_BLOCK_IN, 1, B * T * k->C, k->device);
    if (!s && !k->checkpoint) s = inner_reserve(k, slots);
    /* Checkpointing: a sub-layer that cannot release keeps its one slot for the block's lifetime. */
    if (!s && k->attn_layer && !follows_inner(k, k->attn_layer)) s = dsc_layer_reserve(k->attn_layer, 1, B, T);
    if (!s && !follows_inner(k, k->ffn)) s = dsc_layer_reserve(k->ffn, 1, B, T);
    if (s) release(k);
    return s;
}

/* Where norm1's or norm2's output is computed and read in f32, and the backward's x (`kept`, its
 * slot buffer, or the workspace where the slot keeps it in 2 bytes). */
static dsc_tensor f32_at(const dsc_tensor *kept, const int64_t *shape) {
    return kept->dtype == DSC_DTYPE_F32 ? nn_view(kept, 3, shape) : nn_work_at(NN_WORK_BLOCK_IN, 3, shape);
}

/* The f32 values of `kept` (slot cs's h1 or h2, or x) back at f32_at for a backward: widened into the
 * workspace where they are kept in 2 bytes, exactly the values the forward's products multiplied. */
static void widen_kept(const dsc_tensor *kept, const int64_t *shape) {
    dsc_tensor wide = f32_at(kept, shape), narrow = nn_view(kept, 3, shape);
    if (kept->dtype != DSC_DTYPE_F32) nn_saved_load(&wide, &narrow);
}

/* f32 `value` kept in slot buffer `kept`, rounded where that is 2-byte. */
static void keep(const dsc_tensor *kept, const dsc_tensor *value) {
    nn_keep(nn_view(kept, 3, value->shape), value);
}

/* The block's forward on component slot `cs` from input x into out (which may be the workspace's
 * NN_WORK_BLOCK: the attention's output is read by then). Under bf16 / fp16 products the residual
 * sum is rounded to the type, as a bf16 / fp16 model stores it; where the slot keeps it in 2 bytes
 * it is computed in the attention output's place. */
static dsc_status run_forward(block_layer *k, int cs, const dsc_tensor *x, dsc_tensor *out, dsc_micro_ctx *ctx) {
    dsc_tensor h1 = f32_at(&k->h1[cs], x->shape), resid_kept = nn_view(&k->resid[cs], 3, x->shape);
    dsc_tensor a = nn_work_at(NN_WORK_BLOCK, 3, x->shape);
    DSC_TRY(nn_norm_forward(&k->norm1, cs, x, &h1));
    if (k->attn_layer)
        DSC_TRY(dsc_layer_forward(k->attn_layer, cs, &h1, &a, ctx));
    else
        DSC_TRY(nn_attention_forward(&k->attn, cs, &h1, &a));
    keep(&k->h1[cs], &h1);
    dsc_tensor resid = resid_kept.dtype == DSC_DTYPE_F32 ? resid_kept : a;
    DSC_TRY(dsc_kernel_add(&resid, x, &a));
    dsc_round_to_product_type(&resid);
    nn_keep(resid_kept, &resid);
    dsc_tensor h2 = f32_at(&k->h2[cs], x->shape); /* may be h1's workspace: h1 is kept */
    DSC_TRY(nn_norm_forward(&k->norm2, cs, &resid, &h2));
    dsc_tensor m;
    DSC_TRY(dsc_layer_forward(k->ffn, cs, &h2, &m, ctx));
    keep(&k->h2[cs], &h2);
    return dsc_kernel_add(out, &resid, &m);
}

/* The checkpointed forward again, inside backward: same random draws, losses not reported twice. */
static dsc_status recompute(block_layer *k, int slot, const dsc_tensor *x, dsc_tensor *out, dsc_micro_ctx *ctx) {
    dsc_rng stream = {{0}};
    if (ctx->rng) {
        stream = *ctx->rng;
        *ctx->rng = k->rng_at[slot];
    }
    const double aux = ctx->aux_loss;
    dsc_status s = run_forward(k, 0, x, out, ctx);
    ctx->aux_loss = aux;
    if (ctx->rng) *ctx->rng = stream;
    return s;
}

static dsc_status block_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out,
                                dsc_micro_ctx *ctx) {
    block_layer *k = (block_layer *)self;
    DSC_TRY(nn_check_input(self, in, k->C));
    k->bt[slot][0] = 0; /* a failed forward leaves no pending backward */
    /* The input rounded to the product type (the runners round between layers already), in the
     * slot's copy or, where that is 2-byte, in the workspace's NN_WORK_BLOCK + 1 for the forward. */
    dsc_tensor x_kept = nn_view(&k->x[slot], 3, in->shape), o = nn_view(&k->out[slot], 3, in->shape);
    dsc_tensor x = x_kept.dtype == DSC_DTYPE_F32 ? x_kept : nn_work_at(NN_WORK_BLOCK + 1, 3, in->shape);
    DSC_TRY(nn_copy_rounded(&x, in));
    nn_keep(x_kept, &x);
    if (ctx->rng) k->rng_at[slot] = *ctx->rng;
    if (k->checkpoint) {
        DSC_TRY(inner_reserve(k, 1));
        dsc_status s = run_forward(k, 0, &x, &o, ctx);
        inner_free(k);
        DSC_TRY(s);
    } else {
        DSC_TRY(run_forward(k, slot, &x, &o, ctx));
    }
    k->bt[slot][0] = in->shape[0];
    k->bt[slot][1] = in->shape[1];
    *out = o;
    return NULL;
}

static dsc_status backward_slot(block_layer *k, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                dsc_micro_ctx *ctx);

static dsc_status block_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                 dsc_micro_ctx *ctx) {
    block_layer *k = (block_layer *)self;
    DSC_CHECK(k->bt[slot][0] > 0, DSC_ERR_INVALID, "backward without a pending forward");
    if (!k->checkpoint) return backward_slot(k, slot, dout, din, ctx);
    DSC_TRY(inner_reserve(k, 1));
    dsc_status s = backward_slot(k, slot, dout, din, ctx);
    inner_free(k);
    return s;
}

/* The backward of `slot` with its intermediates present (recomputed first
 * when checkpointing). */
static dsc_status backward_slot(block_layer *k, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                dsc_micro_ctx *ctx) {
    const int64_t shape[3] = {k->bt[slot][0], k->bt[slot][1], k->C};
    DSC_TRY(dsc_tensor_expect(dout, "output gradient", DSC_DTYPE_F32, 3, shape));
    const int cs = k->checkpoint ? 0 : slot;
    dsc_tensor x_kept = nn_view(&k->x[slot], 3, shape), dx = nn_view(&k->din[slot], 3, shape);
    dsc_tensor resid_kept = nn_view(&k->resid[cs], 3, shape);
    dsc_tensor dh = nn_work_at(NN_WORK_BLOCK, 3, shape), dresid = nn_work_at(NN_WORK_BLOCK + 1, 3, shape);
    if (k->checkpoint) { /* dh is free until the attention backward, dresid until norm2's */
        const dsc_tensor x = nn_widened(&x_kept, dresid);
        DSC_TRY(recompute(k, slot, &x, &dh, ctx));
    }
    widen_kept(&k->h2[cs], shape); /* where the view the ffn kept of its input points */
    dsc_tensor dm;
    DSC_TRY(dsc_layer_backward(k->ffn, cs, dout, &dm, ctx));
    const dsc_tensor resid = nn_widened(&resid_kept, dh);
    DSC_TRY(nn_norm_backward(&k->norm2, cs, &resid, &dm, &dresid));
    DSC_TRY(dsc_kernel_add(&dresid, &dresid, dout));
    if (k->attn_layer)
        DSC_TRY(dsc_layer_backward(k->attn_layer, cs, &dresid, &dh, ctx));
    else {
        widen_kept(&k->h1[cs], shape); /* after the ffn's backward: h1 and h2 may share the workspace */
        dsc_tensor h1 = f32_at(&k->h1[cs], shape);
        DSC_TRY(nn_attention_backward(&k->attn, cs, &h1, &dresid, &dh));
    }
    widen_kept(&k->x[slot], shape); /* h1 is read: its workspace takes x */
    const dsc_tensor x = f32_at(&k->x[slot], shape);
    DSC_TRY(nn_norm_backward(&k->norm1, cs, &x, &dh, &dx));
    DSC_TRY(dsc_kernel_add(&dx, &dx, &dresid));
    k->bt[slot][0] = 0;
    *din = dx;
    return NULL;
}

static void block_destroy(dsc_layer *self) {
    block_layer *k = (block_layer *)self;
    release(k);
    dsc_layer_destroy(k->attn_layer);
    dsc_layer_destroy(k->ffn);
    free(k);
}

/* Per slot: the input (stream_dtype), output and input gradient, plus (without checkpointing) h1, resid, h2
 * and what the components and ffn save. */
static void activation_bytes(block_layer *k) {
    const dsc_layer *attn = k->attn_layer;
    const int64_t stream = (int64_t)dsc_dtype_size(k->stream_dtype);
    int64_t per_token = k->C * (stream + 2 * (int64_t)sizeof(float));
    if (!k->checkpoint)
        per_token += k->C * (stream + (int64_t)(dsc_dtype_size(k->h1_dtype) + dsc_dtype_size(k->h2_dtype))) +
                     (nn_norm_saved_floats_per_token(&k->norm1) + nn_norm_saved_floats_per_token(&k->norm2)) *
                         (int64_t)sizeof(float) +
                     k->ffn->activation_bytes_per_token +
                     (attn ? attn->activation_bytes_per_token : nn_attention_saved_bytes_per_token(&k->attn));
    k->base.activation_bytes_per_token = per_token;
}

static void block_set_saved_dtype(dsc_layer *self, dsc_dtype dtype) {
    block_layer *k = (block_layer *)self;
    const dsc_dtype narrow = nn_saved_dtype(dtype, k->device);
    k->h1_dtype = k->attn_layer ? DSC_DTYPE_F32 : narrow;
    k->h2_dtype = k->ffn->input_read_by_products_only ? narrow : DSC_DTYPE_F32;
    k->stream_dtype = narrow;
    k->attn.saved = narrow;
    if (k->attn_layer) dsc_layer_set_saved_dtype(k->attn_layer, dtype);
    dsc_layer_set_saved_dtype(k->ffn, dtype);
    activation_bytes(k);
}

static const dsc_layer_ops block_ops = {.type = "block",
                                        .reserve = block_reserve,
                                        .forward = block_forward,
                                        .backward = block_backward,
                                        .destroy = block_destroy,
                                        .set_saved_dtype = block_set_saved_dtype};

/* A sub-layer's parameters and their uses copied to the block's lists. */
static void append_params(dsc_param **params, uint32_t *uses, const dsc_layer *sub) {
    if (!sub || sub->n_params == 0) return;
    memcpy(params, sub->params, (size_t)sub->n_params * sizeof *params);
    memcpy(uses, sub->param_uses, (size_t)sub->n_params * sizeof *uses);
}

static dsc_status declare(block_layer *k, const dsc_model_config *mc, dsc_param_store *store) {
    nn_param_list list = {.n = 0};
    char prefix[sizeof k->base.name + 8];
    snprintf(prefix, sizeof prefix, "%s.norm1", k->base.name);
    DSC_TRY(nn_norm_init(&k->norm1, &list, store, prefix, mc));
    snprintf(prefix, sizeof prefix, "%s.attn", k->base.name);
    if (!k->attn_layer) DSC_TRY(nn_attention_init(&k->attn, &list, store, prefix, mc));
    snprintf(prefix, sizeof prefix, "%s.norm2", k->base.name);
    DSC_TRY(nn_norm_init(&k->norm2, &list, store, prefix, mc));
    /* The ffn's list has no fixed bound (a MoE layer holds every local expert's tensors). */
    const int n_attn = k->attn_layer ? k->attn_layer->n_params : 0, n = list.n + n_attn + k->ffn->n_params;
    dsc_param **all = malloc((size_t)n * sizeof *all);
    uint32_t *uses = malloc((size_t)n * sizeof *uses);
    dsc_status s = all && uses ? NULL : dsc_error(DSC_ERR_NOMEM, "%s: parameter list of %d", k->base.name, n);
    if (!s) {
        memcpy(all, list.items, (size_t)list.n * sizeof *all);
        memcpy(uses, list.uses, (size_t)list.n * sizeof *uses);
        append_params(all + list.n, uses + list.n, k->attn_layer);
        append_params(all + list.n + n_attn, uses + list.n + n_attn, k->ffn);
        s = dsc_layer_set_params(&k->base, all, uses, n);
    }
    free(all);
    free(uses);
    return s;
}

dsc_layer *dsc_block_ffn(const dsc_layer *layer) {
    return layer && layer->ops == &block_ops ? ((const block_layer *)layer)->ffn : NULL;
}

dsc_status dsc_block_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer *ffn,
                            dsc_layer **out) {
    *out = NULL;
    const dsc_model_config *mc = ctx->model;
    dsc_status s = NULL;
    if (spec->block < 0 || spec->block >= mc->n_layer)
        s = dsc_error(DSC_ERR_INVALID, "block index %d outside [0, %d) (model.n_layer)", spec->block, mc->n_layer);
    if (!s && !ffn) s = nn_mlp_create(mc, ctx->params, ctx->device, spec->block, &ffn);
    dsc_layer *attn = NULL;
    if (!s && ctx->attention) s = ctx->attention(spec, ctx, &attn);
    block_layer *k = s ? NULL : calloc(1, sizeof *k);
    if (!s && !k) s = dsc_error(DSC_ERR_NOMEM, "block %d", spec->block);
    if (s) {
        dsc_layer_destroy(attn);
        dsc_layer_destroy(ffn);
        return s;
    }
    k->attn_layer = attn;
    k->base.ops = &block_ops;
    snprintf(k->base.name, sizeof k->base.name, "layers.%d", spec->block);
    k->ffn = ffn;
    k->checkpoint = mc->activation_checkpointing;
    k->C = mc->d_model;
    k->device = ctx->device;
    s = declare(k, mc, ctx->params);
    if (s) {
        dsc_layer_destroy(&k->base);
        return s;
    }
    activation_bytes(k);
    *out = &k->base;
    return NULL;
}
