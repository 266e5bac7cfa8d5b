/* moe/gate_internal.h — what the gate's files share: the per-token softmax
 * both passes must evaluate identically, and the routing steps gate.c
 * orchestrates. Nothing here is visible outside moe/.
 *
 * Dimension letters: S tokens, E experts, K routes per token, Cap capacity. */
#ifndef DSC_MOE_GATE_INTERNAL_H
#define DSC_MOE_GATE_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "dsc/moe_gate.h"

/* Work (tokens x experts) above which the gate's per-token loops run on OpenMP threads
 * (decode-sized passes, and passes inside the inference pool scope, stay on the caller). */
#define DSC_MOE_GATE_PARALLEL_MIN 32768

/* DeepSpeed clamps the renormalisation denominator of top-2/top-k at
 * torch.finfo(float32).eps. */
#define DSC_MOE_GATE_DENOM_EPS 0x1p-23

/* Softmax of one row of logits in double: p[e] = exp(z[e] - *max) / *sum.
 * The forward and backward passes both call this, so they see bit-identical
 * probabilities. Returns logsumexp(z). */
static inline double dsc_moe_gate_row_stats(const float *z, int64_t num_experts, double *max, double *sum) {
    double m = z[0];
    for (int64_t e = 1; e < num_experts; e++)
        m = z[e] > m ? z[e] : m;
    double s = 0;
    for (int64_t e = 0; e < num_experts; e++)
        s += exp((double)z[e] - m);
    *max = m;
    *sum = s;
    return m + log(s);
}

static inline double dsc_moe_gate_prob(const float *z, int64_t e, double max, double sum) {
    return exp((double)z[e] - max) / sum;
}

/* Whether a route's combine weight is its probability divided by the sum
 * of the token's kept probabilities (clamped at DeepSpeed's eps), or the
 * probability itself. Forward and backward share the rule. */
static inline bool dsc_moe_gate_normalised(const dsc_moe_gate_config *cfg) {
    return cfg->weighting == DSC_MOE_WEIGHTING_RENORMALISED ||
           (cfg->weighting == DSC_MOE_WEIGHTING_DEEPSPEED && cfg->k > 1);
}

static inline double dsc_moe_gate_denom(const dsc_moe_gate_config *cfg, double kept_sum) {
    if (!dsc_moe_gate_normalised(cfg)) return 1.0;
    return kept_sum > DSC_MOE_GATE_DENOM_EPS ? kept_sum : DSC_MOE_GATE_DENOM_EPS;
}

/* Whether a variant balances on first choices only (DeepSpeed's top1gating
 * and top2gating) or on all k choices (topkgating). */
static inline bool dsc_moe_gate_first_choice_aux(int k) {
    return k <= 2;
}

/* Multiplier of sum_e me[e] * ce[e] in l_aux: E for top-1/top-2, E/k for top-k. */
static inline double dsc_moe_gate_aux_scale(int k, int64_t num_experts) {
    return dsc_moe_gate_first_choice_aux(k) ? (double)num_experts : (double)num_experts / k;
}

/* One route competing for a place at an over-full expert (priority rule). */
typedef struct dsc_moe_gate_candidate {
    double priority;
    int32_t token;
    int32_t route; /* index into the (S, K) route arrays */
} dsc_moe_gate_candidate;

/* Picks the K experts of every token into res->expert / res->route_prob
 * (route order: top-1; first then second; by descending probability) and
 * accumulates res->mean_prob (as sums) and the sum of squared logsumexps.
 * `rng` is non-NULL exactly when a Gumbel draw is wanted (RSample for k=1,
 * second-expert sampling for k=2). */
void dsc_moe_gate_select(const dsc_moe_gate_config *cfg, const float *logits, dsc_rng *rng,
                         dsc_moe_gate_result *res, double *lse_sq_sum);

/* Keeps at most `capacity` routes per expert and assigns slots (res->slot,
 * -1 when dropped). `rts` (k=1 only) draws random token priorities. */
void dsc_moe_gate_drop(const dsc_moe_gate_config *cfg, int64_t capacity, dsc_rng *rts, dsc_moe_gate_result *res);

#endif
