/* The feed-forward part of a block split by width (Megatron-LM's
 * ParallelMLP): fc (GELU) or gate and up (SwiGLU) are column-parallel over
 * this rank's columns [f0, f0 + nf), proj or down row-parallel over the same
 * columns. Forward: local up to one all-reduce of the (b, t, C) output (the
 * proj bias added once, by the group's rank 0); backward: local up to one
 * all-reduce of the input gradient. With sequence parallelism (sequence.c)
 * its input and output are this rank's t / tp positions (and so is the T it
 * is reserved for): the input is gathered along t in forward and again in
 * backward, the output gradient in backward, and each all-reduce is a
 * reduce-scatter; the hidden activations cover the whole sequence. proj's
 * bias gradient comes from the gathered output gradient, so it is whole on
 * every rank as before.
 *
 * It lives inside a block, which keeps the input (this rank's positions of
 * it) until the slot's backward.
 * Not here: MoE experts (moe/), the norms (the block). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "tp/tp_internal.h"

typedef struct tp_mlp {
    dsc_layer base;
    const dsc_tp_build_extra *tp;
    bool gated;       /* SwiGLU */
    dsc_param *w_in;  /* (nf, C): fc or gate */
    dsc_param *b_in;  /* (nf): fc bias, NULL for SwiGLU */
    dsc_param *w_up;  /* (nf, C): SwiGLU up */
    dsc_param *w_out; /* (C, nf): proj or down */
    dsc_param *b_out; /* (C) replicated: proj bias, NULL for SwiGLU */
    int64_t C, F;     /* F = nf */
    dsc_device device;
    int slots;
    dsc_tensor *in;             /* [slots] views of the block's input (B, T, C) */
    dsc_tensor *pre, *up, *act; /* [slots] (B, Tf, nf) (Tf: T x tp under sequence parallelism, else T) */
    dsc_tensor *out, *din;      /* [slots] (B, T, C) */
    dsc_tensor *scratch;        /* [3] (B, Tf, nf): dact, dpre, dup */
    tp_seq seq;                 /* sequence parallelism's buffers */
} tp_mlp;

static void release(tp_mlp *m) {
    free(m->in);
    m->in = NULL;
    dsc_buffers_free(&m->pre, m->slots);
    dsc_buffers_free(&m->up, m->slots);
    dsc_buffers_free(&m->act, m->slots);
    dsc_buffers_free(&m->out, m->slots);
    dsc_buffers_free(&m->din, m->slots);
    dsc_buffers_free(&m->scratch, 3);
    tp_seq_release(&m->seq);
    m->slots = 0;
}

static dsc_status mlp_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    tp_mlp *m = (tp_mlp *)self;
    release(m);
    m->slots = slots;
    const int64_t Tf = tp_seq_full(m->tp, T), f_shape[3] = {B, Tf, m->F}, c_shape[3] = {B, T, m->C};
    m->in = calloc((size_t)slots, sizeof *m->in);
    dsc_status s = m->in ? NULL : dsc_error(DSC_ERR_NOMEM, "input views for %d slots", slots);
    if (!s) s = dsc_buffers_alloc(&m->pre, slots, 3, f_shape, m->device);
    if (!s && m->gated) s = dsc_buffers_alloc(&m->up, slots, 3, f_shape, m->device);
    if (!s) s = dsc_buffers_alloc(&m->act, slots, 3, f_shape, m->device);
    if (!s) s = dsc_buffers_alloc(&m->out, slots, 3, c_shape, m->device);
    if (!s) s = dsc_buffers_alloc(&m->din, slots, 3, c_shape, m->device);
    if (!s) s = dsc_buffers_alloc(&m->scratch, 3, 3, f_shape, m->device);
    if (!s) s = tp_seq_reserve(&m->seq, m->tp, B, Tf, m->C, m->device);
    if (s) release(m);
    return s;
}

static dsc_status mlp_forward(dsc_layer *self, int slot, const dsc_tensor *local, dsc_tensor *out,
                              dsc_micro_ctx *ctx) {
    (void)ctx;
    tp_mlp *m = (tp_mlp *)self;
    DSC_TRY(dsc_tensor_expect(local, "input", DSC_DTYPE_F32, 3, (const int64_t[]){-1, -1, m->C}));
    dsc_tensor x;
    DSC_TRY(tp_seq_gather_input(m->tp, local, &x));
    const dsc_tensor *in = &x;
    const int64_t f_shape[3] = {in->shape[0], in->shape[1], m->F};
    m->in[slot] = *local;
    dsc_tensor pre = tp_view(&m->pre[slot], 3, f_shape), act = tp_view(&m->act[slot], 3, f_shape);
    if (m->gated) {
        dsc_tensor up = tp_view(&m->up[slot], 3, f_shape);
        DSC_TRY(dsc_param_linear_forward(&pre, in, m->w_in, NULL));
        DSC_TRY(dsc_param_linear_forward(&up, in, m->w_up, NULL));
        dsc_round_to_product_type(&pre); /* as the dense MLP's (fc's: by its kernel) */
        dsc_round_to_product_type(&up);
        DSC_TRY(dsc_kernel_swiglu_forward(&act, &pre, &up));
    } else {
        DSC_TRY(dsc_param_linear_gelu_forward(&act, &pre, in, m->w_in, m->b_in));
    }
    dsc_tensor partial;
    DSC_TRY(tp_seq_partial(m->tp, &m->out[slot], in->shape, &partial));
    DSC_TRY(dsc_param_linear_forward(&partial, &act, m->w_out, m->tp->rank == 0 ? m->b_out : NULL));
    return tp_seq_sum(m->tp, &partial, &m->out[slot], out);
}

static dsc_status mlp_backward(dsc_layer *self, int slot, const dsc_tensor *dlocal, dsc_tensor *din,
                               dsc_micro_ctx *ctx) {
    (void)ctx;
    tp_mlp *m = (tp_mlp *)self;
    DSC_CHECK(m->in[slot].data, DSC_ERR_INVALID, "backward without a forward");
    dsc_tensor dfull, xfull;
    DSC_TRY(tp_seq_gather_grad(m->tp, dlocal, &dfull));
    DSC_TRY(tp_seq_gather_input(m->tp, &m->in[slot], &xfull)); /* again: only this rank's positions were kept */
    const dsc_tensor *dout = &dfull, *in = &xfull;
    DSC_TRY(dsc_tensor_expect(dout, "output gradient", DSC_DTYPE_F32, 3, in->shape));
    const int64_t f_shape[3] = {in->shape[0], in->shape[1], m->F};
    dsc_tensor pre = tp_view(&m->pre[slot], 3, f_shape), act = tp_view(&m->act[slot], 3, f_shape);
    dsc_tensor dact = tp_view(&m->scratch[0], 3, f_shape), dpre = tp_view(&m->scratch[1], 3, f_shape);
    dsc_tensor dx;
    DSC_TRY(tp_seq_partial(m->tp, &m->din[slot], in->shape, &dx));
    DSC_TRY(dsc_param_linear_backward(&dact, false, m->w_out, m->b_out, dout, &act));
    if (m->gated) {
        dsc_tensor up = tp_view(&m->up[slot], 3, f_shape), dup = tp_view(&m->scratch[2], 3, f_shape);
        DSC_TRY(dsc_kernel_swiglu_backward(&dpre, &dup, &dact, &pre, &up));
        DSC_TRY(dsc_param_linear_backward(&dx, false, m->w_in, NULL, &dpre, in));
        DSC_TRY(dsc_param_linear_backward(&dx, true, m->w_up, NULL, &dup, in));
    } else {
        DSC_TRY(dsc_kernel_gelu_backward(&dpre, &dact, &pre));
        DSC_TRY(dsc_param_linear_backward(&dx, false, m->w_in, m->b_in, &dpre, in));
    }
    m->in[slot] = (dsc_tensor){0};
    return tp_seq_sum(m->tp, &dx, &m->din[slot], din);
}

static void mlp_destroy(dsc_layer *self) {
    release((tp_mlp *)self);
    free(self);
}

static const dsc_layer_ops mlp_ops = {.type = "tp_mlp",
                                      .reserve = mlp_reserve,
                                      .forward = mlp_forward,
                                      .backward = mlp_backward,
                                      .destroy = mlp_destroy};

/* The dense MLP's names, global shapes and initialisation (runtime/nn/mlp.c), as this rank's pieces. */
static dsc_status declare(tp_mlp *m, const dsc_model_config *mc, dsc_param_store *store) {
    tp_param_list list = {.n = 0};
    const char *p = m->base.name;
    const int64_t C = m->C, F = mc->d_ff, f0 = m->tp->shard.f0, nf = m->F;
    const float std = mc->init_std, std_out = mc->init_std / sqrtf(2.0f * (float)mc->n_layer);
    const uint32_t nd = DSC_PARAM_NO_DECAY;
    if (m->gated) {
        DSC_TRY(tp_declare(&list, store, p, "gate.weight", 2, (int64_t[]){F, C}, 0, f0, nf, 0, DSC_INIT_NORMAL,
                           std, &m->w_in));
        DSC_TRY(tp_declare(&list, store, p, "up.weight", 2, (int64_t[]){F, C}, 0, f0, nf, 0, DSC_INIT_NORMAL, std,
                           &m->w_up));
        DSC_TRY(tp_declare(&list, store, p, "down.weight", 2, (int64_t[]){C, F}, 1, f0, nf, 0, DSC_INIT_NORMAL,
                           std_out, &m->w_out));
    } else {
        DSC_TRY(tp_declare(&list, store, p, "fc.weight", 2, (int64_t[]){F, C}, 0, f0, nf, 0, DSC_INIT_NORMAL, std,
                           &m->w_in));
        DSC_TRY(
            tp_declare(&list, store, p, "fc.bias", 1, (int64_t[]){F}, 0, f0, nf, nd, DSC_INIT_ZEROS, 0, &m->b_in));
        DSC_TRY(tp_declare(&list, store, p, "proj.weight", 2, (int64_t[]){C, F}, 1, f0, nf, 0, DSC_INIT_NORMAL,
                           std_out, &m->w_out));
        DSC_TRY(tp_declare(&list, store, p, "proj.bias", 1, (int64_t[]){C}, -1, 0, 0, nd, DSC_INIT_ZEROS, 0,
                           &m->b_out));
    }
    return dsc_layer_set_params(&m->base, list.items, NULL, list.n);
}

dsc_status tp_mlp_create(const dsc_build_ctx *ctx, int block, dsc_layer **out) {
    *out = NULL;
    const dsc_tp_build_extra *x;
    DSC_TRY(tp_extra_of(ctx, "tp_block", &x));
    const dsc_model_config *mc = ctx->model;
    tp_mlp *m = calloc(1, sizeof *m);
    DSC_CHECK(m, DSC_ERR_NOMEM, "MLP of block %d", block);
    m->base.ops = &mlp_ops;
    snprintf(m->base.name, sizeof m->base.name, "layers.%d.mlp", block);
    m->tp = x;
    m->gated = mc->arch == DSC_ARCH_LLAMA || mc->arch == DSC_ARCH_MIXTRAL;
    m->C = mc->d_model;
    m->F = x->shard.nf;
    m->device = ctx->device;
    /* per reserved token: the hidden activations of the whole sequence, output and input gradient */
    m->base.activation_bytes_per_token =
        (int64_t)sizeof(float) * (tp_seq_full(x, 1) * (m->gated ? 3 : 2) * m->F + 2 * m->C);
    dsc_status s = declare(m, mc, ctx->params);
    if (s) {
        dsc_layer_destroy(&m->base);
        return s;
    }
    *out = &m->base;
    return NULL;
}
