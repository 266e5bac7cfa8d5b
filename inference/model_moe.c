/* The Mixtral sparse feed-forward for inference, with Hugging Face's
 * routing: router logits (N, E), softmax over all E experts, the top-k
 * probabilities (ties to the lower expert id), renormalised to sum 1 over
 * the chosen k, then sum_k w_k * down(silu(gate(x)) * up(x)) of expert k.
 * No capacity, no drops. moe/'s training gate (dsc/moe_gate.h) is not used:
 * it sizes expert capacity, assigns slots and computes auxiliary losses
 * for the all-to-all dispatch, none of which inference needs, and its top-2
 * is DeepSpeed's rather than this renormalised top-k. Tokens are grouped
 * per expert so each expert runs as two GEMMs over its own rows.
 * N tokens, E experts, K top-k, C width, F expert width. */
#include <math.h>
#include <string.h>

#include "dsc/kernels.h"
#include "inference/model_internal.h"

/* routes (N, K) and weights (N, K) from the router probabilities (N, E). */
static void route(const float *probs, int64_t N, int32_t E, int32_t K, int32_t *routes, float *weights) {
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
        for (int32_t k = 0; k < K; k++)
            w[k] /= sum;
    }
}

dsc_status dsc_model_moe(const dsc_infer_model *m, int32_t layer, int64_t N, const float *h, float *out,
                         dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->cfg;
    int32_t E = mc->n_experts, K = mc->top_k;
    int64_t C = mc->d_model, F = mc->d_ff;
    dsc_tensor router, w1, w2;
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_ROUTER_W, &router));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE1_W, &w1));
    DSC_TRY(dsc_infer_model_param(m, layer, DSC_PARAM_ROLE_MOE2_W, &w2));
    DSC_TRY(dsc_model_project(s->router, h, N, &router, NULL, 0, E));
    dsc_tensor probs = dsc_model_view2(s->router, N, E);
    DSC_TRY(dsc_kernel_softmax(&probs, &probs));
    route(s->router, N, E, K, s->routes, s->weights);
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
        dsc_tensor up_gate = dsc_model_view2((float *)w1.data + (int64_t)e * 2 * F * C, 2 * F, C);
        dsc_tensor down = dsc_model_view2((float *)w2.data + (int64_t)e * C * F, C, F);
        DSC_TRY(dsc_model_project(s->ff1, s->moe, n, &up_gate, NULL, 0, F));
        DSC_TRY(dsc_model_project(s->ff2, s->moe, n, &up_gate, NULL, F, F));
        dsc_tensor a = dsc_model_view2(s->ff1, n, F), u = dsc_model_view2(s->ff2, n, F);
        DSC_TRY(dsc_kernel_swiglu_forward(&a, &a, &u));
        /* The gathered input is no longer needed: the expert output reuses it. */
        DSC_TRY(dsc_model_project(s->moe, s->ff1, n, &down, NULL, 0, C));
        for (int64_t i = 0; i < n; i++) {
            int64_t t = s->rows[i];
            float w = 0;
            for (int32_t k = 0; k < K; k++)
                if (s->routes[t * K + k] == e) w = s->weights[t * K + k];
            for (int64_t c = 0; c < C; c++)
                out[t * C + c] += w * s->moe[i * C + c];
        }
    }
    return NULL;
}
