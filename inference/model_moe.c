/* The sparse feed-forward of a MoE layer for inference: router logits
 * (N, E), softmax over all E experts, the top-k probabilities (ties to the
 * lower expert id), combine weights by the model's rule, then
 * sum_k w_k * expert_k(x): SwiGLU experts (Mixtral, dsc mixtral) or GELU
 * experts with biases (dsc gpt-moe), plus the PR-MoE residual
 * out = c0 * moe + c1 * mlp(x), (c0, c1) = softmax(x @ Wc^T + bc), when the
 * model has one.
 *
 * Weights: Hugging Face renormalises over the chosen k (also for k = 1);
 * DeepSpeed's gates (dsc's moe/, docs/moe_gate.md) keep top-1's raw
 * probability and divide top-2 / top-k by max(sum, 2^-23). No capacity, no
 * drops: this equals training with moe.drop_tokens = false. moe/'s training
 * gate (dsc/moe_gate.h) is not used: it sizes expert capacity, assigns
 * slots and computes auxiliary losses for the all-to-all dispatch, none of
 * which inference needs, and its noise is training-only anyway. Under
 * tensor parallelism each expert's F is the rank's slice, the router is
 * whole, and the result is a partial sum (expert biases on TP rank 0 only)
 * that the forward all-reduces. Tokens are
 * grouped per expert so each expert runs as GEMMs over its own rows.
 * N tokens, E experts, K top-k, C width, F expert width. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "dsc/kernels.h"
#include "inference/model_internal.h"

bool dsc_model_is_moe_layer(const dsc_infer_model_config *mc, int32_t layer) {
    if (mc->n_experts <= 0) return false;
    return mc->moe_layer_freq <= 1 || layer % mc->moe_layer_freq == mc->moe_layer_freq - 1;
}

/* routes (N, K) and weights (N, K) from the router probabilities (N, E). */
static void route(const float *probs, int64_t N, int32_t E, int32_t K, dsc_moe_weighting how, int32_t *routes,
                  float *weights) {
    for (int64_t t = 0; t < N; t++) {
        const float *p = probs + t * E;
        int32_t *r = routes + t * K;
        float *w = weights + t * K;
        float sum = 0;
        for (int32_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                bool taken = false;
                for (int32_t j = 0; j < k; j++)
                    taken |= r[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            r[k] = best;
            w[k] = p[best];
            sum += p[best];
        }
        if (how == DSC_MOE_WEIGHTING_DEEPSPEED) {
            if (K == 1) continue;
            sum = fmaxf(sum, FLT_EPSILON);
        }
        for (int32_t k = 0; k < K; k++)
            w[k] /= sum;
    }
}

/* The expert parameters of one layer; biases absent (NULL data) for SwiGLU. */
typedef struct expert_params {
    dsc_tensor w1; /* (E, 2F, C) gate | up, or (E, F, C) fc */
    dsc_tensor b1; /* (E, F) */
    dsc_tensor w2; /* (E, C, F) */
    dsc_tensor b2; /* (E, C) */
} expert_params;

/* Expert e on its n gathered rows: s->moe (n, C) -> s->moe (n, C). */
static dsc_status expert_forward(const dsc_infer_model *m, const expert_params *x, int32_t e, int64_t n,
                                 dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->shard;
    int64_t C = mc->d_model, F = mc->d_ff;
    dsc_tensor a = dsc_model_view2(s->ff1, n, F), u = dsc_model_view2(s->ff2, n, F);
    dsc_tensor down = dsc_model_view2((float *)x->w2.data + (int64_t)e * C * F, C, F);
    if (mc->family == DSC_INFER_FAMILY_GPT) {
        dsc_tensor fc = dsc_model_view2((float *)x->w1.data + (int64_t)e * F * C, F, C);
        dsc_tensor b1 = dsc_tensor_view((float *)x->b1.data + (int64_t)e * F, DSC_DTYPE_F32, 1, &F, DSC_CPU);
        dsc_tensor b2 = dsc_tensor_view((float *)x->b2.data + (int64_t)e * C, DSC_DTYPE_F32, 1, &C, DSC_CPU);
        DSC_TRY(dsc_model_project(s->ff2, s->moe, n, &fc, &b1, 0, F));
        DSC_TRY(dsc_kernel_gelu_forward(&a, &u));
        /* The gathered input is no longer needed: the expert output reuses it. */
        return dsc_model_project(s->moe, s->ff1, n, &down, dsc_model_row_bias(m, &b2), 0, C);
    }
    dsc_tensor up_gate = dsc_model_view2((float *)x->w1.data + (int64_t)e * 2 * F * C, 2 * F, C);
    DSC_TRY(dsc_model_project(s->ff1, s->moe, n, &up_gate, NULL, 0, F));
    DSC_TRY(dsc_model_project(s->ff2, s->moe, n, &up_gate, NULL, F, F));
    DSC_TRY(dsc_kernel_swiglu_forward(&a, &a, &u));
    return dsc_model_project(s->moe, s->ff1, n, &down, NULL, 0, C);
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
    int32_t E = mc->n_experts, K = mc->top_k;
    int64_t C = mc->d_model;
    dsc_tensor router;
    expert_params x = {0};
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_ROUTER_W, &router));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE1_W, &x.w1));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE2_W, &x.w2));
    if (mc->family == DSC_INFER_FAMILY_GPT) {
        DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE1_B, &x.b1));
        DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE2_B, &x.b2));
    }
    DSC_TRY(dsc_model_project(s->router, h, N, &router, NULL, 0, E));
    dsc_tensor probs = dsc_model_view2(s->router, N, E);
    DSC_TRY(dsc_kernel_softmax(&probs, &probs));
    route(s->router, N, E, K, mc->moe_weighting, s->routes, s->weights);
    memset(out, 0, (size_t)(N * C) * sizeof *out);
    for (int32_t e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < N; t++)
            for (int32_t k = 0; k < K; k++)
                if (s->routes[t * K + k] == e) {
                    s->rows[n] = (int32_t)t;
                    memcpy(s->moe + n * C, h + t * C, (size_t)C * sizeof *h);
                    n++;
                }
        if (n == 0) continue;
        DSC_TRY(expert_forward(m, &x, e, n, s));
        for (int64_t i = 0; i < n; i++) {
            int64_t t = s->rows[i];
            float w = 0;
            for (int32_t k = 0; k < K; k++)
                if (s->routes[t * K + k] == e) w = s->weights[t * K + k];
            for (int64_t c = 0; c < C; c++)
                out[t * C + c] += w * s->moe[i * C + c];
        }
    }
    return mc->moe_residual ? residual(m, layer, N, h, out, s) : NULL;
}
