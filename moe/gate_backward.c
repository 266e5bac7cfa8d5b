/* moe/gate_backward.c — gradient of the router logits through the gate.
 *
 * What autograd computes for DeepSpeed's gating functions, with the routing
 * held fixed: the combine weight of a kept route is its softmax probability
 * or that probability renormalised over the token's kept routes
 * (cfg->weighting; denominator clamped at float32 eps); l_aux depends on the
 * logits only through the mean probabilities me (ce, the masks, the capacity
 * and the counts are constants); the z-loss is mean(logsumexp^2). Selection,
 * dropping and slots have no gradient; this file does not revisit them.
 *
 * Dimension letters: S tokens, E experts, K routes per token. */
#include <math.h>

#include "moe/gate_internal.h"

static dsc_status check_backward_args(const dsc_moe_gate_config *cfg, const dsc_tensor *logits,
                                      const dsc_moe_gate_result *res, const dsc_tensor *d_weight, double d_loss,
                                      const dsc_tensor *d_logits) {
    DSC_CHECK(cfg && logits && res && d_logits, DSC_ERR_INVALID,
              "moe gate backward: config, logits, result and d_logits are required");
    DSC_CHECK(res->expert && cfg->k == res->k, DSC_ERR_INVALID,
              "moe gate backward: the result does not come from a forward with k=%d", cfg->k);
    const int64_t S = res->num_tokens, E = res->num_experts;
    DSC_TRY(dsc_tensor_expect(logits, "moe gate logits (S, E)", DSC_DTYPE_F32, 2, (const int64_t[]){S, E}));
    DSC_TRY(dsc_tensor_expect(d_logits, "moe gate d_logits (S, E)", DSC_DTYPE_F32, 2, (const int64_t[]){S, E}));
    if (d_weight) {
        DSC_TRY(dsc_tensor_expect(d_weight, "moe gate d_weight (S, K)", DSC_DTYPE_F32, 2,
                                  (const int64_t[]){S, cfg->k}));
        DSC_CHECK(d_weight->device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
                  "moe gate: d_weight must be on the CPU");
    }
    DSC_CHECK(logits->device.type == DSC_DEVICE_CPU && d_logits->device.type == DSC_DEVICE_CPU,
              DSC_ERR_UNSUPPORTED, "moe gate: logits and d_logits must be on the CPU");
    DSC_CHECK(isfinite(d_loss), DSC_ERR_INVALID, "moe gate backward: d_loss must be finite, got %g", d_loss);
    return NULL;
}

/* Token s's row of d_logits; its probabilities, each evaluated once, go to res->probs (the forward's
 * table, rewritten with the same values). */
static void token_backward(const dsc_moe_gate_config *cfg, const float *logits, const dsc_moe_gate_result *res,
                           const float *dw, double aux, double zc, float *d_logits, int64_t s) {
    const int64_t E = res->num_experts;
    const int K = cfg->k;
    const float *z = logits + s * E; // (E)
    float *dz = d_logits + s * E;    // (E)
    double *pe = res->probs + s * E; // (E)
    const int32_t *expert = res->expert + s * K;
    const int32_t *slot = res->slot + s * K;
    const double *prob = res->route_prob + s * K;
    const float *dws = dw ? dw + s * K : NULL;
    double max, sum;
    double lse = dsc_moe_gate_row_stats(z, E, &max, &sum);
    for (int64_t e = 0; e < E; e++)
        pe[e] = dsc_moe_gate_prob(z, e, max, sum);

    /* Weight gradient on the kept routes' probabilities: w_r = p_r / D with
     * D = max(sum of kept p, eps) gives dp_r = (dw_r - sum_j dw_j w_j) / D
     * while D is not clamped, dp_r = dw_r / eps when it is; unnormalised weights have D = 1. */
    double kept_sum = 0, dw_dot_w = 0;
    for (int r = 0; r < K; r++)
        kept_sum += slot[r] >= 0 ? prob[r] : 0.0;
    const bool normalised = dsc_moe_gate_normalised(cfg);
    const bool clamped = normalised && kept_sum < DSC_MOE_GATE_DENOM_EPS;
    const double denom = dsc_moe_gate_denom(cfg, kept_sum);
    if (normalised && !clamped && dws)
        for (int r = 0; r < K; r++)
            dw_dot_w += slot[r] >= 0 ? dws[r] * prob[r] / denom : 0.0;
    double p_dot_dp = 0; /* sum_e p_e * dp_e */
    for (int r = 0; r < K; r++)
        if (slot[r] >= 0 && dws) p_dot_dp += prob[r] * (dws[r] - dw_dot_w) / denom;
    for (int64_t e = 0; e < E; e++)
        p_dot_dp += pe[e] * aux * res->ce_counts[e];

    /* Softmax backward dz_e = p_e * (dp_e - sum_j p_j dp_j), plus the z-loss term. */
    for (int64_t e = 0; e < E; e++) {
        double dp = aux * res->ce_counts[e];
        for (int r = 0; r < K; r++)
            if (expert[r] == e && slot[r] >= 0 && dws) dp += (dws[r] - dw_dot_w) / denom;
        dz[e] = (float)(pe[e] * (dp - p_dot_dp + zc * lse));
    }
}

dsc_status dsc_moe_gate_backward(const dsc_moe_gate_config *cfg, const dsc_tensor *logits,
                                 const dsc_moe_gate_result *res, const dsc_tensor *d_weight, double d_loss,
                                 dsc_tensor *d_logits) {
    DSC_TRY(check_backward_args(cfg, logits, res, d_weight, d_loss, d_logits));
    const int64_t S = res->num_tokens, E = res->num_experts;
    const int K = cfg->k;
    if (S == 0) return NULL;
    const float *dw = d_weight ? d_weight->data : NULL; // (S, K)
    /* d l_aux / d p[s][e] = scale * ce[e] / S with ce[e] = ce_counts[e] / S. */
    const double aux = d_loss * cfg->aux_loss_coef * dsc_moe_gate_aux_scale(K, E) / ((double)S * (double)S);
    /* d z_loss / d logits[s][e] = 2 * lse[s] * p[s][e] / S. */
    const double zc = d_loss * cfg->z_loss_coef * 2.0 / (double)S;
#pragma omp parallel for schedule(static) if (S * E > DSC_MOE_GATE_PARALLEL_MIN)
    for (int64_t s = 0; s < S; s++)
        token_backward(cfg, logits->data, res, dw, aux, zc, d_logits->data, s);
    return NULL;
}
