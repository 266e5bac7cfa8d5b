/* The sparse feed-forward of a MoE layer for inference: router logits
 * (N, E), then moe/'s dropless routing (dsc/moe_dropless.h: the training
 * gate with no capacity, combine weights by the model's rule, rows packed
 * by expert, all-to-all-v over the expert-parallel group) calling back into
 * this file for each expert this rank holds: SwiGLU experts (Mixtral, dsc
 * mixtral, Qwen2-MoE) or GELU experts with biases (dsc gpt-moe); then
 * Qwen2-MoE's shared expert, out += sigmoid(x . g) * swiglu_shared(x), and
 * the PR-MoE residual out = c0 * moe + c1 * mlp(x), (c0, c1) =
 * softmax(x @ Wc^T + bc), when the model has them.
 *
 * Weights: Hugging Face renormalises over the chosen k (also for k = 1);
 * DeepSpeed's gates (docs/moe_gate.md) keep top-1's raw probability and
 * divide top-2 / top-k by max(sum, 2^-23); nothing is dropped, which equals
 * training with moe.drop_tokens = false. Under tensor parallelism each
 * expert's F is the rank's slice, the router is whole, and the result is a
 * partial sum (expert biases on TP rank 0 only) that the forward
 * all-reduces. Under expert parallelism the rank holds experts
 * [expert0, expert0 + n_local_experts) and the routing returns every
 * token's output on every rank of the group.
 * N tokens, E experts, K top-k, C width, F expert width. */
#include <math.h>
#include <string.h>

#include "dsc/kernels.h"
#include "inference/model_internal.h"

bool dsc_model_is_moe_layer(const dsc_infer_model_config *mc, int32_t layer) {
    if (mc->n_experts <= 0) return false;
    return mc->moe_layer_freq <= 1 || layer % mc->moe_layer_freq == mc->moe_layer_freq - 1;
}

int32_t dsc_model_local_experts(const dsc_infer_model_config *mc) {
    return mc->n_local_experts > 0 ? mc->n_local_experts : mc->n_experts;
}

/* The expert parameters of one layer; biases absent (NULL data) for SwiGLU. */
typedef struct expert_params {
    dsc_tensor w1; /* (E, 2F, C) gate | up, or (E, F, C) fc */
    dsc_tensor b1; /* (E, F) */
    dsc_tensor w2; /* (E, C, F) */
    dsc_tensor b2; /* (E, C) */
} expert_params;

/* What the routing's callback needs: the model, the layer's experts, scratch. */
typedef struct expert_call {
    const dsc_infer_model *m;
    expert_params x;
    dsc_forward_scratch *s;
} expert_call;

/* One SwiGLU feed-forward on n rows (n, C), overwritten with its output:
 * up_gate (2F, C) rows gate | up, down (C, F). A routed or the shared expert. */
static dsc_status swiglu(const dsc_infer_model *m, const float *up_gate, const float *down, int64_t F, int64_t n,
                         float *rows, dsc_forward_scratch *s) {
    int64_t C = m->shard.d_model;
    dsc_tensor a = dsc_model_view2(s->ff1, n, F), u = dsc_model_view2(s->ff2, n, F);
    dsc_tensor w1 = dsc_model_view2((float *)up_gate, 2 * F, C), w2 = dsc_model_view2((float *)down, C, F);
    DSC_TRY(dsc_model_project(s->ff1, rows, n, &w1, NULL, 0, F));
    DSC_TRY(dsc_model_project(s->ff2, rows, n, &w1, NULL, F, F));
    DSC_TRY(dsc_kernel_swiglu_forward(&a, &a, &u));
    return dsc_model_project(rows, s->ff1, n, &w2, NULL, 0, C);
}

/* Global expert e on its n rows (n, C), overwritten with its output. */
static dsc_status expert_forward(void *user, int32_t expert, int64_t n, float *rows) {
    const expert_call *c = user;
    const dsc_infer_model *m = c->m;
    const expert_params *x = &c->x;
    dsc_forward_scratch *s = c->s;
    const dsc_infer_model_config *mc = &m->shard;
    int64_t C = mc->d_model, F = dsc_dim_value(mc, DSC_DIM_FE), e = expert - mc->expert0;
    const float *down = (const float *)x->w2.data + e * C * F;
    if (mc->family != DSC_INFER_FAMILY_GPT)
        return swiglu(m, (const float *)x->w1.data + e * 2 * F * C, down, F, n, rows, s);
    dsc_tensor a = dsc_model_view2(s->ff1, n, F), u = dsc_model_view2(s->ff2, n, F);
    dsc_tensor fc = dsc_model_view2((float *)x->w1.data + e * F * C, F, C),
               w2 = dsc_model_view2((float *)down, C, F);
    dsc_tensor b1 = dsc_tensor_view((float *)x->b1.data + e * F, DSC_DTYPE_F32, 1, &F, DSC_CPU);
    dsc_tensor b2 = dsc_tensor_view((float *)x->b2.data + e * C, DSC_DTYPE_F32, 1, &C, DSC_CPU);
    DSC_TRY(dsc_model_project(s->ff2, rows, n, &fc, &b1, 0, F));
    DSC_TRY(dsc_kernel_gelu_forward(&a, &u));
    return dsc_model_project(rows, s->ff1, n, &w2, dsc_model_row_bias(m, &b2), 0, C);
}

/* Qwen2-MoE's shared expert: out (N, C) += sigmoid(h . g) * swiglu(h). Its
 * output goes to s->moe, free once the routed experts ran. */
static dsc_status shared_expert(const dsc_infer_model *m, int32_t layer, int64_t N, const float *h, float *out,
                                dsc_forward_scratch *s) {
    int64_t C = m->shard.d_model;
    dsc_tensor w1, w2, g;
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_SHARED1_W, &w1));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_SHARED2_W, &w2));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_SHARED_GATE_W, &g));
    memcpy(s->moe, h, (size_t)(N * C) * sizeof *h);
    DSC_TRY(swiglu(m, w1.data, w2.data, dsc_dim_value(&m->shard, DSC_DIM_FS), N, s->moe, s));
    const float *gv = g.data;
    for (int64_t t = 0; t < N; t++) {
        double z = 0;
        for (int64_t c = 0; c < C; c++)
            z += (double)h[t * C + c] * gv[c];
        const float gate = (float)(1.0 / (1.0 + exp(-z)));
        for (int64_t c = 0; c < C; c++)
            out[t * C + c] += gate * s->moe[t * C + c];
    }
    return NULL;
}

/* PR-MoE: out (N, C) = c0 * out + c1 * mlp(h). The dense MLP's output goes
 * to s->moe, the coefficients to s->ff2, both free once the experts ran. */
static dsc_status residual(const dsc_infer_model *m, int32_t layer, int64_t N, const float *h, float *out,
                           dsc_forward_scratch *s) {
    int64_t C = m->cfg.d_model;
    dsc_tensor wc, bc;
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE_COEF_W, &wc));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE_COEF_B, &bc));
    DSC_TRY(dsc_model_dense_mlp(m, layer, N, h, s->moe, s));
    DSC_TRY(dsc_model_project(s->ff2, h, N, &wc, &bc, 0, 2));
    dsc_tensor coef = dsc_model_view2(s->ff2, N, 2);
    DSC_TRY(dsc_kernel_softmax(&coef, &coef));
    for (int64_t t = 0; t < N; t++)
        for (int64_t c = 0; c < C; c++)
            out[t * C + c] = s->ff2[2 * t] * out[t * C + c] + s->ff2[2 * t + 1] * s->moe[t * C + c];
    return NULL;
}

dsc_status dsc_model_moe(const dsc_infer_model *m, int32_t layer, int64_t N, const float *h, float *out,
                         dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->shard;
    dsc_tensor router;
    expert_call call = {.m = m, .s = s};
    expert_params *x = &call.x;
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_ROUTER_W, &router));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE1_W, &x->w1));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE2_W, &x->w2));
    if (mc->family == DSC_INFER_FAMILY_GPT) {
        DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE1_B, &x->b1));
        DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE2_B, &x->b2));
    }
    DSC_TRY(dsc_model_project(s->router, h, N, &router, NULL, 0, mc->n_experts));
    DSC_TRY(dsc_error_wrap(dsc_moe_dropless_forward(s->moe_route, s->router, h, N, expert_forward, &call, out),
                           "MoE layer %d", layer));
    if (mc->d_ff_shared > 0) DSC_TRY(shared_expert(m, layer, N, h, out, s));
    return mc->moe_residual ? residual(m, layer, N, h, out, s) : NULL;
}
