/* moe/gate.c — the MoE gate's public face: configuration and its checks,
 * the capacity formula, the result buffers, and the forward pass that runs
 * selection and dropping (gate_route.c) and then computes the combine
 * weights, the per-expert statistics, l_aux and the router z-loss.
 *
 * It does not compute router logits, move tokens, or communicate: the MoE
 * layer does, and agrees the no-drop capacity through the caller's hook.
 *
 * Dimension letters: S tokens, E experts, K routes per token, Cap capacity. */
#include <math.h>
#include <string.h>

#include "dsc/moe_gate.h"
#include "moe/gate_internal.h"

dsc_moe_gate_config dsc_moe_gate_config_default(void) {
    return (dsc_moe_gate_config){
        .k = 1,
        .weighting = DSC_MOE_WEIGHTING_DEEPSPEED,
        .capacity_factor = 1.0,
        .eval_capacity_factor = 1.0,
        .min_capacity = 4,
        .drop_tokens = true,
        .drop_policy = DSC_MOE_DROP_POLICY_PROBS,
        .noisy_gate_policy = DSC_MOE_NOISY_GATE_NONE,
        .use_rts = true,
        .top2_2nd_expert_sampling = true,
        .aux_loss_coef = 0.01,
        .z_loss_coef = 0.0,
    };
}

dsc_status dsc_moe_gate_config_validate(const dsc_moe_gate_config *cfg, int64_t num_experts) {
    DSC_CHECK(cfg, DSC_ERR_INVALID, "moe gate: config is NULL");
    DSC_CHECK(num_experts >= 1, DSC_ERR_INVALID, "moe gate: number of experts must be >= 1, got %lld",
              (long long)num_experts);
    DSC_CHECK(cfg->k >= 1, DSC_ERR_INVALID, "moe gate config: k must be >= 1, got %d", cfg->k);
    DSC_CHECK(cfg->k <= num_experts, DSC_ERR_INVALID, "moe gate config: k=%d exceeds the number of experts E=%lld",
              cfg->k, (long long)num_experts);
    DSC_CHECK(cfg->capacity_factor > 0 && isfinite(cfg->capacity_factor), DSC_ERR_INVALID,
              "moe gate config: capacity_factor must be a finite number > 0, got %g", cfg->capacity_factor);
    DSC_CHECK(cfg->eval_capacity_factor > 0 && isfinite(cfg->eval_capacity_factor), DSC_ERR_INVALID,
              "moe gate config: eval_capacity_factor must be a finite number > 0, got %g",
              cfg->eval_capacity_factor);
    DSC_CHECK(cfg->min_capacity >= 0, DSC_ERR_INVALID, "moe gate config: min_capacity must be >= 0, got %lld",
              (long long)cfg->min_capacity);
    DSC_CHECK(cfg->weighting >= DSC_MOE_WEIGHTING_RENORMALISED && cfg->weighting <= DSC_MOE_WEIGHTING_NONE,
              DSC_ERR_INVALID, "moe gate config: unknown weighting %d", (int)cfg->weighting);
    DSC_CHECK(cfg->drop_policy == DSC_MOE_DROP_POLICY_PROBS || cfg->drop_policy == DSC_MOE_DROP_POLICY_POSITION,
              DSC_ERR_INVALID, "moe gate config: unknown drop_policy %d", (int)cfg->drop_policy);
    DSC_CHECK(cfg->noisy_gate_policy >= DSC_MOE_NOISY_GATE_NONE &&
                  cfg->noisy_gate_policy <= DSC_MOE_NOISY_GATE_RSAMPLE,
              DSC_ERR_INVALID, "moe gate config: unknown noisy_gate_policy %d", (int)cfg->noisy_gate_policy);
    /* DeepSpeed silently ignores RSample for k >= 2; say so instead. */
    DSC_CHECK(cfg->noisy_gate_policy != DSC_MOE_NOISY_GATE_RSAMPLE || cfg->k == 1, DSC_ERR_INVALID,
              "moe gate config: noisy_gate_policy RSample applies to top-1 only, but k=%d", cfg->k);
    DSC_CHECK(isfinite(cfg->aux_loss_coef) && isfinite(cfg->z_loss_coef), DSC_ERR_INVALID,
              "moe gate config: aux_loss_coef (%g) and z_loss_coef (%g) must be finite", cfg->aux_loss_coef,
              cfg->z_loss_coef);
    return NULL;
}

int64_t dsc_moe_gate_capacity(const dsc_moe_gate_config *cfg, int64_t num_tokens, int64_t num_experts,
                              bool training) {
    /* DeepSpeed multiplies the factor by k in Python (double) and only then
     * makes it a float32 tensor; S/E is a Python float that torch rounds to
     * float32 for the product. Bit-exact capacities depend on this. */
    double factor = (training ? cfg->capacity_factor : cfg->eval_capacity_factor) * cfg->k;
    float f = (float)factor;
    float ratio = (float)((double)num_tokens / (double)num_experts);
    float product = ratio * f;
    int64_t capacity = (int64_t)ceilf(product);
    return capacity < cfg->min_capacity ? cfg->min_capacity : capacity;
}

/* Carves the next array of `bytes` from one allocation, 64-byte aligned. */
static void *carve(char *base, size_t *offset, size_t bytes) {
    *offset = (*offset + 63) & ~(size_t)63;
    void *p = base ? base + *offset : NULL;
    *offset += bytes;
    return p;
}

/* Lays out every array of the result inside `base` (NULL: only measures). */
static size_t layout(dsc_moe_gate_result *res, char *base) {
    size_t off = 0;
    size_t routes = (size_t)(res->max_tokens * res->k), E = (size_t)res->num_experts;
    res->expert = carve(base, &off, routes * sizeof(int32_t));
    res->slot = carve(base, &off, routes * sizeof(int32_t));
    res->weight = carve(base, &off, routes * sizeof(float));
    res->exp_counts = carve(base, &off, E * sizeof(int64_t));
    res->kept_counts = carve(base, &off, E * sizeof(int64_t));
    res->dropped_counts = carve(base, &off, E * sizeof(int64_t));
    res->mean_prob = carve(base, &off, E * sizeof(double));
    res->ce_counts = carve(base, &off, E * sizeof(int64_t));
    res->cursor = carve(base, &off, (E + 1) * sizeof(int64_t));
    res->route_prob = carve(base, &off, routes * sizeof(double));
    res->candidates = carve(base, &off, routes * sizeof(dsc_moe_gate_candidate));
    res->dest = carve(base, &off, routes * sizeof(int32_t));
    res->probs = carve(base, &off, (size_t)res->max_tokens * E * sizeof(double));
    res->lse = carve(base, &off, (size_t)res->max_tokens * sizeof(double));
    return off;
}

dsc_status dsc_moe_gate_result_alloc(dsc_moe_gate_result *res, int64_t max_tokens, int64_t num_experts, int k) {
    DSC_CHECK(res, DSC_ERR_INVALID, "moe gate result: NULL result");
    memset(res, 0, sizeof *res);
    DSC_CHECK(max_tokens >= 0 && num_experts >= 1 && k >= 1 && k <= num_experts, DSC_ERR_INVALID,
              "moe gate result: need max_tokens >= 0 and 1 <= k <= E, got max_tokens=%lld E=%lld k=%d",
              (long long)max_tokens, (long long)num_experts, k);
    DSC_CHECK(max_tokens * k <= INT32_MAX && num_experts <= INT32_MAX, DSC_ERR_INVALID,
              "moe gate result: %lld routes exceed the int32 route index", (long long)(max_tokens * k));
    DSC_CHECK(max_tokens <= INT32_MAX / num_experts, DSC_ERR_INVALID,
              "moe gate result: %lld tokens x %lld experts exceed the int32 probability table",
              (long long)max_tokens, (long long)num_experts);
    res->max_tokens = max_tokens;
    res->num_experts = num_experts;
    res->k = k;
    size_t bytes = layout(res, NULL);
    void *base = NULL;
    DSC_TRY(dsc_error_wrap(dsc_mem_alloc(&base, bytes, DSC_MEM_ACTIVATIONS, DSC_CPU),
                           "moe gate result for %lld tokens, %lld experts, k=%d", (long long)max_tokens,
                           (long long)num_experts, k));
    layout(res, base);
    res->bytes = bytes;
    return NULL;
}

void dsc_moe_gate_result_free(dsc_moe_gate_result *res) {
    if (!res || !res->expert) return;
    dsc_mem_free(res->expert, res->bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    memset(res, 0, sizeof *res);
}

static dsc_status check_forward_args(const dsc_moe_gate_config *cfg, const dsc_tensor *logits,
                                     const dsc_moe_gate_result *res) {
    DSC_CHECK(cfg && logits && res, DSC_ERR_INVALID, "moe gate forward: config, logits and result are required");
    DSC_TRY(dsc_tensor_expect(logits, "moe gate logits (S, E)", DSC_DTYPE_F32, 2, (const int64_t[]){-1, -1}));
    DSC_CHECK(logits->device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED, "moe gate: logits must be on the CPU");
    const int64_t S = logits->shape[0], E = logits->shape[1];
    DSC_TRY(dsc_moe_gate_config_validate(cfg, E));
    DSC_CHECK(res->expert && res->num_experts == E && res->k == cfg->k && S <= res->max_tokens, DSC_ERR_INVALID,
              "moe gate: result sized for up to %lld tokens, E=%lld, k=%d cannot hold S=%lld, E=%lld, k=%d",
              (long long)res->max_tokens, (long long)res->num_experts, res->k, (long long)S, (long long)E, cfg->k);
    /* DeepSpeed's top1gating asserts this in drop and no-drop mode alike. */
    DSC_CHECK(cfg->k > 1 || S >= cfg->min_capacity, DSC_ERR_INVALID,
              "moe gate: top-1 needs at least min_capacity=%lld tokens, got S=%lld (lower min_capacity)",
              (long long)cfg->min_capacity, (long long)S);
    return NULL;
}

/* Capacity of this pass: the configured one, or in no-drop mode the largest
 * expert load agreed over the group (top-1 clamps it to S, as DeepSpeed). */
static dsc_status pick_capacity(const dsc_moe_gate_config *cfg, bool training,
                                const dsc_moe_gate_capacity_hook *hook, const dsc_moe_gate_result *res,
                                int64_t *capacity) {
    const int64_t S = res->num_tokens, E = res->num_experts;
    if (cfg->drop_tokens) {
        *capacity = dsc_moe_gate_capacity(cfg, S, E, training);
        return NULL;
    }
    int64_t local = 0;
    for (int64_t e = 0; e < E; e++)
        local = res->exp_counts[e] > local ? res->exp_counts[e] : local;
    int64_t agreed = local;
    if (hook && hook->agree) {
        DSC_TRY(dsc_error_wrap(hook->agree(hook->user, &agreed), "moe gate: agreeing the no-drop capacity"));
        DSC_CHECK(agreed >= local, DSC_ERR_INVALID,
                  "moe gate: agreed no-drop capacity %lld is below this rank's largest expert load %lld",
                  (long long)agreed, (long long)local);
    }
    *capacity = cfg->k == 1 && agreed > S ? S : agreed;
    return NULL;
}

/* Combine weights (by cfg->weighting over the kept routes, after dropping), per-expert statistics, l_aux and the
 * z-loss. */
static void finish(const dsc_moe_gate_config *cfg, double lse_sq_sum, dsc_moe_gate_result *res) {
    const int64_t S = res->num_tokens, E = res->num_experts;
    const int K = cfg->k;
    for (int64_t e = 0; e < E; e++)
        res->kept_counts[e] = 0;
    res->dropped_tokens = 0;
    for (int64_t s = 0; s < S; s++) {
        const int32_t *slot = res->slot + s * K;
        const double *prob = res->route_prob + s * K;
        double kept_sum = 0;
        for (int r = 0; r < K; r++)
            kept_sum += slot[r] >= 0 ? prob[r] : 0.0;
        double denom = dsc_moe_gate_denom(cfg, kept_sum);
        bool any = false;
        for (int r = 0; r < K; r++) {
            bool kept = slot[r] >= 0;
            res->weight[s * K + r] = kept ? (float)(prob[r] / denom) : 0.0f;
            res->kept_counts[res->expert[s * K + r]] += kept;
            any |= kept;
        }
        res->dropped_tokens += !any;
    }
    double balance = 0;
    for (int64_t e = 0; e < E; e++) {
        res->dropped_counts[e] = res->exp_counts[e] - res->kept_counts[e];
        res->mean_prob[e] = S ? res->mean_prob[e] / S : 0.0;
        balance += S ? res->mean_prob[e] * ((double)res->ce_counts[e] / S) : 0.0;
    }
    res->l_aux = dsc_moe_gate_aux_scale(K, E) * balance;
    res->z_loss = S ? lse_sq_sum / S : 0.0;
    res->loss = cfg->aux_loss_coef * res->l_aux + cfg->z_loss_coef * res->z_loss;
}

/* Names the first token whose logits have no finite logsumexp (NaN, +Inf, or all -Inf). */
static dsc_status nonfinite_error(const dsc_tensor *logits) {
    const int64_t S = logits->shape[0], E = logits->shape[1];
    int64_t s = 0;
    for (double max, sum; s < S; s++)
        if (!isfinite(dsc_moe_gate_row_stats((const float *)logits->data + s * E, E, &max, &sum))) break;
    return dsc_error(DSC_ERR_NUMERIC, "moe gate: router logits of token %lld are not finite", (long long)s);
}

dsc_status dsc_moe_gate_forward(const dsc_moe_gate_config *cfg, const dsc_tensor *logits, bool training,
                                dsc_rng *rng, const dsc_moe_gate_capacity_hook *hook, dsc_moe_gate_result *res) {
    DSC_TRY(check_forward_args(cfg, logits, res));
    const int64_t S = logits->shape[0], E = logits->shape[1];
    const int K = cfg->k;
    /* DeepSpeed keeps random token selection and second-expert sampling on
     * in eval mode; dsc makes every random element training-only. */
    const bool rsample = training && cfg->noisy_gate_policy == DSC_MOE_NOISY_GATE_RSAMPLE;
    const bool sample2 = training && K == 2 && cfg->top2_2nd_expert_sampling;
    const bool rts = training && K == 1 && cfg->use_rts && cfg->drop_tokens;
    DSC_CHECK(rng || !(rsample || sample2 || rts), DSC_ERR_INVALID,
              "moe gate: %s is enabled for training but no RNG stream (DSC_RNG_GATE) was given",
              rsample   ? "noisy_gate_policy RSample"
              : sample2 ? "top2_2nd_expert_sampling"
                        : "use_rts");

    res->num_tokens = S;
    double lse_sq_sum;
    dsc_moe_gate_select(cfg, logits->data, rsample || sample2 ? rng : NULL, res, &lse_sq_sum);
    if (!isfinite(lse_sq_sum)) return nonfinite_error(logits);

    for (int64_t e = 0; e < E; e++)
        res->exp_counts[e] = res->ce_counts[e] = 0;
    for (int64_t i = 0; i < S * K; i++) {
        res->exp_counts[res->expert[i]]++;
        if (!dsc_moe_gate_first_choice_aux(K) || i % K == 0) res->ce_counts[res->expert[i]]++;
    }
    DSC_TRY(pick_capacity(cfg, training, hook, res, &res->capacity));
    dsc_moe_gate_drop(cfg, res->capacity, rts ? rng : NULL, res);
    finish(cfg, lse_sq_sum, res);
    return NULL;
}

dsc_status dsc_moe_gate_jitter(dsc_rng *rng, dsc_tensor *noise) {
    DSC_CHECK(rng && noise, DSC_ERR_INVALID, "moe gate jitter: rng and noise tensor are required");
    DSC_CHECK(noise->dtype == DSC_DTYPE_F32 && noise->device.type == DSC_DEVICE_CPU, DSC_ERR_INVALID,
              "moe gate jitter: noise must be an f32 CPU tensor");
    /* Switch Transformer's multiplicative jitter, as DeepSpeed: U[1-eps, 1+eps]. */
    const double eps = 1e-2;
    float *out = noise->data;
    for (int64_t i = 0; i < dsc_tensor_numel(noise); i++)
        out[i] = (float)(1.0 - eps + 2.0 * eps * dsc_rng_uniform(rng));
    return NULL;
}
