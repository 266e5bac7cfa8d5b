/* The dense feed-forward layer of a block: GELU MLP (fc, proj) for GPT or
 * SwiGLU (gate, up, down) for Llama.
 *
 * It is a layer, not a component, because the block runs its feed-forward
 * part through the layer API (moe/ plugs in a MoE layer instead). It lives
 * only inside a block, which keeps the input unchanged until the slot's
 * backward and consumes the output and input gradient at once; so the layer
 * keeps a view of its input instead of a copy, and its output and input
 * gradient, like its backward's temporaries, live in the layers' workspace
 * (nn_work_at), one for the model.
 *
 * Under bf16 / fp16 products (mixed precision) the first products' outputs
 * (fc; gate and up) are rounded to the type before the activation reads them,
 * as a bf16 / fp16 model's linears store them (dsc_round_to_product_type; fc's
 * by its fused kernel). So everything a slot keeps for its backward holds
 * values of the type, and under dsc_layer_set_saved_dtype (bf16 / fp16) it is
 * kept in 2 bytes, changing nothing but the memory: the forward computes in
 * the workspace (act in the dact buffer, fc or gate in dpre, up in dup) and
 * stores rounded; the backward widens act into dpre for the second product's
 * backward, then fc or gate into dpre and up into dup, which the activation's
 * backward overwrites in place with their gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "runtime/nn/nn_internal.h"

typedef struct mlp_layer {
    dsc_layer base;
    bool gated;       /* SwiGLU */
    dsc_param *w_in;  /* (F, C): fc or gate */
    dsc_param *b_in;  /* (F): fc bias, NULL for SwiGLU */
    dsc_param *w_up;  /* (F, C): SwiGLU up, NULL for GELU */
    dsc_param *w_out; /* (C, F): proj or down */
    dsc_param *b_out; /* (C): proj bias, NULL for SwiGLU */
    int64_t C, F;
    dsc_device device;
    dsc_dtype saved; /* the type pre, up and act are kept in (f32, or bf16 / fp16 under mixed precision) */
    int nslots;      /* slots currently allocated */
    dsc_tensor *in;  /* [slots] views of the input the block keeps */
    dsc_tensor *pre; /* [slots] (B, T, F): fc output, or gate for SwiGLU */
    dsc_tensor *up;  /* [slots] (B, T, F): SwiGLU only */
    dsc_tensor *act; /* [slots] (B, T, F): gelu(pre) or silu(gate) * up */
    bool holds_work; /* a hold on the workspace (NN_WORK_MLP, NN_WORK_MLP_IO) */
} mlp_layer;

/* dact and dpre, plus dup for SwiGLU */
static int scratch_count(const mlp_layer *m) {
    return m->gated ? 3 : 2;
}

static void release(mlp_layer *m) {
    int slots = m->nslots;
    m->nslots = 0;
    free(m->in);
    m->in = NULL;
    dsc_buffers_free(&m->pre, slots);
    dsc_buffers_free(&m->up, slots);
    dsc_buffers_free(&m->act, slots);
    if (m->holds_work) nn_work_drop();
    m->holds_work = false;
}

static dsc_status mlp_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    mlp_layer *m = (mlp_layer *)self;
    release(m);
    m->nslots = slots; /* release() on failure frees what was allocated so far */
    const int64_t f_shape[3] = {B, T, m->F};
    m->in = calloc((size_t)slots, sizeof *m->in);
    nn_work_hold();
    m->holds_work = true;
    dsc_status s = m->in ? NULL : dsc_error(DSC_ERR_NOMEM, "input views for %d slots", slots);
    if (!s) s = nn_buffers_alloc_as(&m->pre, slots, 3, f_shape, m->device, m->saved);
    if (!s && m->gated) s = nn_buffers_alloc_as(&m->up, slots, 3, f_shape, m->device, m->saved);
    if (!s) s = nn_buffers_alloc_as(&m->act, slots, 3, f_shape, m->device, m->saved);
    if (!s) s = nn_work_grow(NN_WORK_MLP, scratch_count(m), B * T * m->F, m->device);
    if (!s) s = nn_work_grow(NN_WORK_MLP_IO, 2, B * T * m->C, m->device);
    if (s) release(m);
    return s;
}

/* Slot buffer `kept` viewed as `shape`, and where the forward computes it in f32: itself, or
 * workspace buffer `work` where the slot keeps it in 2 bytes. */
static dsc_tensor computed_at(const dsc_tensor *kept, int work, const int64_t *shape, dsc_tensor *kept_view) {
    *kept_view = nn_view(kept, 3, shape);
    return kept->dtype == DSC_DTYPE_F32 ? *kept_view : nn_work_at(work, 3, shape);
}

static dsc_status mlp_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out,
                              dsc_micro_ctx *ctx) {
    (void)ctx;
    mlp_layer *m = (mlp_layer *)self;
    DSC_TRY(nn_check_input(self, in, m->C));
    const int64_t f_shape[3] = {in->shape[0], in->shape[1], m->F};
    m->in[slot] = *in;
    dsc_tensor pre_kept, act_kept, up_kept;
    dsc_tensor pre = computed_at(&m->pre[slot], NN_WORK_MLP + 1, f_shape, &pre_kept),
               act = computed_at(&m->act[slot], NN_WORK_MLP, f_shape, &act_kept);
    *out = nn_work_at(NN_WORK_MLP_IO, 3, in->shape);
    if (m->gated) {
        dsc_tensor up = computed_at(&m->up[slot], NN_WORK_MLP + 2, f_shape, &up_kept);
        DSC_TRY(dsc_param_linear_forward(&pre, in, m->w_in, NULL));
        DSC_TRY(dsc_param_linear_forward(&up, in, m->w_up, NULL));
        dsc_round_to_product_type(&pre);
        dsc_round_to_product_type(&up);
        DSC_TRY(dsc_kernel_swiglu_forward(&act, &pre, &up));
        nn_keep(up_kept, &up);
    } else {
        DSC_TRY(dsc_param_linear_gelu_forward(&act, &pre, in, m->w_in, m->b_in));
    }
    nn_keep(pre_kept, &pre);
    nn_keep(act_kept, &act);
    return dsc_param_linear_forward(out, &act, m->w_out, m->b_out);
}

static dsc_status mlp_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                               dsc_micro_ctx *ctx) {
    (void)ctx;
    mlp_layer *m = (mlp_layer *)self;
    const dsc_tensor *in = &m->in[slot];
    DSC_CHECK(in->data, DSC_ERR_INVALID, "backward without a forward");
    DSC_TRY(dsc_tensor_expect(dout, "output gradient", DSC_DTYPE_F32, 3, in->shape));
    const int64_t f_shape[3] = {in->shape[0], in->shape[1], m->F};
    dsc_tensor pre_kept = nn_view(&m->pre[slot], 3, f_shape), act_kept = nn_view(&m->act[slot], 3, f_shape);
    dsc_tensor dact = nn_work_at(NN_WORK_MLP, 3, f_shape), dpre = nn_work_at(NN_WORK_MLP + 1, 3, f_shape);
    *din = nn_work_at(NN_WORK_MLP_IO + 1, 3, in->shape);
    const dsc_tensor act = nn_widened(&act_kept, dpre);
    DSC_TRY(dsc_param_linear_backward(&dact, false, m->w_out, m->b_out, dout, &act));
    const dsc_tensor pre = nn_widened(&pre_kept, dpre); /* act is read: dpre is free again */
    if (m->gated) {
        dsc_tensor dup = nn_work_at(NN_WORK_MLP + 2, 3, f_shape), up_kept = nn_view(&m->up[slot], 3, f_shape);
        const dsc_tensor up = nn_widened(&up_kept, dup);
        DSC_TRY(dsc_kernel_swiglu_backward(&dpre, &dup, &dact, &pre, &up));
        DSC_TRY(dsc_param_linear_backward(din, false, m->w_in, NULL, &dpre, in));
        DSC_TRY(dsc_param_linear_backward(din, true, m->w_up, NULL, &dup, in));
    } else {
        DSC_TRY(dsc_kernel_gelu_backward(&dpre, &dact, &pre));
        DSC_TRY(dsc_param_linear_backward(din, false, m->w_in, m->b_in, &dpre, in));
    }
    m->in[slot] = (dsc_tensor){0};
    return NULL;
}

static void mlp_destroy(dsc_layer *self) {
    release((mlp_layer *)self);
    free(self);
}

static void mlp_release(dsc_layer *self) {
    release((mlp_layer *)self);
}

static void activation_bytes(mlp_layer *m) {
    const int64_t kept = m->saved == DSC_DTYPE_F32 ? 4 : 2; /* pre, act and SwiGLU's up */
    m->base.activation_bytes_per_token = kept * (m->gated ? 3 : 2) * m->F;
}

static void mlp_set_saved_dtype(dsc_layer *self, dsc_dtype dtype) {
    mlp_layer *m = (mlp_layer *)self;
    m->saved = nn_saved_dtype(dtype, m->device);
    activation_bytes(m);
}

static const dsc_layer_ops mlp_ops = {.type = "mlp",
                                      .reserve = mlp_reserve,
                                      .forward = mlp_forward,
                                      .backward = mlp_backward,
                                      .destroy = mlp_destroy,
                                      .release = mlp_release,
                                      .set_saved_dtype = mlp_set_saved_dtype};

static dsc_status declare(mlp_layer *m, nn_param_list *list, dsc_param_store *store, const dsc_model_config *mc) {
    const char *prefix = m->base.name;
    const int64_t C = m->C, F = m->F;
    const float std = mc->init_std, std_out = mc->init_std / sqrtf(2.0f * (float)mc->n_layer);
    const uint32_t nd = DSC_PARAM_NO_DECAY, b = DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS,
                   w = DSC_PARAM_USE_ROUNDED_BY_KERNELS | b;
    if (m->gated) {
        DSC_TRY(nn_declare_used(list, store, prefix, "gate.weight", 2, (int64_t[]){F, C}, 0, w, DSC_INIT_NORMAL,
                                std, &m->w_in));
        DSC_TRY(nn_declare_used(list, store, prefix, "up.weight", 2, (int64_t[]){F, C}, 0, w, DSC_INIT_NORMAL, std,
                                &m->w_up));
        return nn_declare_used(list, store, prefix, "down.weight", 2, (int64_t[]){C, F}, 0, w, DSC_INIT_NORMAL,
                               std_out, &m->w_out);
    }
    DSC_TRY(nn_declare_used(list, store, prefix, "fc.weight", 2, (int64_t[]){F, C}, 0, w, DSC_INIT_NORMAL, std,
                            &m->w_in));
    DSC_TRY(
        nn_declare_used(list, store, prefix, "fc.bias", 1, (int64_t[]){F}, nd, b, DSC_INIT_ZEROS, 0, &m->b_in));
    DSC_TRY(nn_declare_used(list, store, prefix, "proj.weight", 2, (int64_t[]){C, F}, 0, w, DSC_INIT_NORMAL,
                            std_out, &m->w_out));
    return nn_declare_used(list, store, prefix, "proj.bias", 1, (int64_t[]){C}, nd, b, DSC_INIT_ZEROS, 0,
                           &m->b_out);
}

dsc_status nn_mlp_create(const dsc_model_config *mc, dsc_param_store *store, dsc_device device, int block,
                         dsc_layer **out) {
    *out = NULL;
    mlp_layer *m = calloc(1, sizeof *m);
    DSC_CHECK(m, DSC_ERR_NOMEM, "MLP layer of block %d", block);
    m->base.ops = &mlp_ops;
    m->base.input_read_by_products_only = true; /* fc (gate and up): the view it keeps is read by them alone */
    snprintf(m->base.name, sizeof m->base.name, "layers.%d.mlp", block);
    m->gated = nn_arch_is_llama(mc);
    m->C = mc->d_model;
    m->F = mc->d_ff;
    m->device = device;
    m->saved = DSC_DTYPE_F32;
    activation_bytes(m);
    nn_param_list list = {.n = 0};
    dsc_status s = declare(m, &list, store, mc);
    if (!s) s = nn_set_params(&m->base, &list);
    if (s) {
        dsc_layer_destroy(&m->base);
        return s;
    }
    *out = &m->base;
    return NULL;
}
