/* dsc/moe_gate.h — the Mixture-of-Experts gate: from router logits to routes.
 *
 * Given router logits (S, E) the gate picks K experts per token (top-1,
 * top-2 or general top-k), computes each expert's capacity, drops the routes
 * that do not fit, assigns every kept route a slot in its expert's buffer,
 * and returns the combine weights, the pre-drop expert counts, the
 * load-balancing loss l_aux and the router z-loss. With every random element
 * off it reproduces DeepSpeed's top1gating / top2gating / topkgating
 * (deepspeed/moe/sharded_moe.py) exactly; where DeepSpeed leaves a choice to
 * tie order dsc is deterministic (lower token index first, then lower expert
 * index). docs/moe_gate.md states every rule.
 *
 * The gate does not compute the router linear layer (x @ Wg^T), does not move
 * tokens and does not talk to other ranks: the MoE layer does those, and
 * agrees a no-drop capacity over its expert-parallel group through the hook
 * below.
 *
 * Dimension letters: S tokens on this rank, E experts, K routes per token,
 * Cap expert capacity, M model width. */
#ifndef DSC_MOE_GATE_H
#define DSC_MOE_GATE_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/config.h"
#include "dsc/rng.h"
#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The policy enums are the job config's (dsc/config.h: dsc_moe_drop_policy,
 * dsc_moe_noisy_gate), one type each, so a file may include both headers:
 *   DSC_MOE_DROP_POLICY_PROBS     k >= 3: keep the Cap routes with the highest gate probability
 *   DSC_MOE_DROP_POLICY_POSITION  k >= 3: keep the first Cap routes in token order
 *   DSC_MOE_NOISY_GATE_JITTER     multiply the gate input by U[0.99, 1.01] (the layer applies it)
 *   DSC_MOE_NOISY_GATE_RSAMPLE    top-1 only: expert = argmax(logits + Gumbel noise) */

/* Combine weights of the k chosen experts from the gate probabilities p:
 * one rule for training (dsc's gates) and serving (each model's). */
typedef enum dsc_moe_weighting {
    DSC_MOE_WEIGHTING_RENORMALISED = 0, /* Hugging Face Mixtral: p / sum of the kept routes' p, also for k = 1 */
    DSC_MOE_WEIGHTING_DEEPSPEED,        /* k = 1: p itself (top1gating); k >= 2: p / max(sum, 2^-23) */
    DSC_MOE_WEIGHTING_NONE              /* p itself for every k (Qwen2-MoE with norm_topk_prob = false) */
} dsc_moe_weighting;

typedef struct dsc_moe_gate_config {
    int k;                                /* routes per token, 1 <= k <= E */
    dsc_moe_weighting weighting;          /* DeepSpeed's by default */
    double capacity_factor;               /* training mode */
    double eval_capacity_factor;          /* eval mode */
    int64_t min_capacity;                 /* lower bound of the configured capacity (drop mode) */
    bool drop_tokens;                     /* false: capacity = largest expert load, nothing dropped */
    dsc_moe_drop_policy drop_policy;      /* k >= 3 only */
    dsc_moe_noisy_gate noisy_gate_policy; /* training only */
    bool use_rts;                         /* top-1, training: random token selection at a full expert */
    bool top2_2nd_expert_sampling;        /* top-2, training: Gumbel-sample the second expert */
    double aux_loss_coef;                 /* weight of l_aux in the gate loss */
    double z_loss_coef;                   /* weight of the router z-loss (0 = off) */
} dsc_moe_gate_config;

/* DeepSpeed's MoE defaults: k=1, capacity factors 1.0, min_capacity 4,
 * drop_tokens, probs policy, no noise, use_rts and second-expert sampling on,
 * DeepSpeed's weighting;
 * aux_loss_coef 0.01 (Megatron-DeepSpeed's recommendation), z-loss off. */
DSC_API dsc_moe_gate_config dsc_moe_gate_config_default(void);

/* Checks the configuration against E experts; the error names the field. */
DSC_API dsc_status dsc_moe_gate_config_validate(const dsc_moe_gate_config *cfg, int64_t num_experts);

/* Configured capacity in drop mode for S tokens and E experts:
 * ceil(S/E * f) computed in float32 as DeepSpeed does, f = the capacity
 * factor (eval factor when !training) times 1 (k=1), 2 (k=2) or k (k>=3),
 * raised to min_capacity. The config must be valid. */
DSC_API int64_t dsc_moe_gate_capacity(const dsc_moe_gate_config *cfg, int64_t num_tokens, int64_t num_experts,
                                      bool training);

/* Routes of one forward pass, token-major. Allocate with
 * dsc_moe_gate_result_alloc for the largest S you will pass; a forward with
 * fewer tokens uses the first rows. */
typedef struct dsc_moe_gate_result {
    int64_t num_tokens;      /* S of the last forward */
    int64_t num_experts;     /* E */
    int k;                   /* K */
    int64_t capacity;        /* Cap: slots per expert */
    int32_t *expert;         /* (S, K) chosen expert of each route, also for dropped routes */
    int32_t *slot;           /* (S, K) slot in the expert's buffer, -1 when dropped */
    float *weight;           /* (S, K) combine weight, 0 when dropped */
    int64_t *exp_counts;     /* (E) routes chosen per expert before dropping */
    int64_t *kept_counts;    /* (E) routes kept per expert */
    int64_t *dropped_counts; /* (E) routes dropped per expert */
    int64_t dropped_tokens;  /* tokens with no kept route (they pass through the residual only) */
    double *mean_prob;       /* (E) mean gate probability over tokens (l_aux's me) */
    double l_aux;            /* load-balancing loss, DeepSpeed's formula for the variant */
    double z_loss;           /* mean over tokens of logsumexp(logits)^2 */
    double loss;             /* aux_loss_coef * l_aux + z_loss_coef * z_loss */
    /* Private to the gate: sizes and workspace. */
    int64_t max_tokens;
    int64_t *ce_counts; /* (E) the counts l_aux uses (first choices for k <= 2) */
    int64_t *cursor;    /* (E+1) bucket offsets and running positions */
    double *route_prob; /* (S, K) gate probability of each route */
    void *candidates;   /* (S*K) sort workspace of the priority drop rule */
    int32_t *dest;      /* (S, K) row of each route in the MoE layer's expert buffer, -1 dropped */
    double *probs;      /* (S, E) softmax of each token's logits, each evaluated once per pass */
    double *lse;        /* (S) logsumexp of each token's logits */
    size_t bytes;
} dsc_moe_gate_result;

DSC_API dsc_status dsc_moe_gate_result_alloc(dsc_moe_gate_result *res, int64_t max_tokens, int64_t num_experts,
                                             int k);
DSC_API void dsc_moe_gate_result_free(dsc_moe_gate_result *res);

/* No-drop mode: called with the local largest expert load in *capacity; it
 * must replace it with the capacity agreed over the expert-parallel group
 * (all-reduce MAX, then rounded up to the tensor-parallel size where
 * DeepSpeed does), which must not be smaller than the local value. */
typedef struct dsc_moe_gate_capacity_hook {
    dsc_status (*agree)(void *user, int64_t *capacity);
    void *user;
} dsc_moe_gate_capacity_hook;

/* Routes the tokens of `logits` (S, E) f32 on the CPU into `res`.
 * `training` selects the capacity factor and enables the random elements
 * (RSample, random token selection, second-expert sampling), which draw
 * from `rng` (a DSC_RNG_GATE stream); rng may be NULL when none is enabled.
 * `hook` may be NULL (single rank: the local load is the capacity). */
DSC_API dsc_status dsc_moe_gate_forward(const dsc_moe_gate_config *cfg, const dsc_tensor *logits, bool training,
                                        dsc_rng *rng, const dsc_moe_gate_capacity_hook *hook,
                                        dsc_moe_gate_result *res);

/* Gradient of the router logits, overwriting d_logits (S, E) f32, for
 *   objective = sum over kept routes of d_weight * weight + d_loss * res->loss.
 * d_weight (S, K) f32 is the gradient of the combine weights (entries of
 * dropped routes are ignored; NULL means zero); d_loss is the gradient of the
 * objective with respect to the gate loss (1 unless it is scaled). Masks,
 * capacity, counts and routing are constants, as under autograd in DeepSpeed:
 * l_aux gets gradient only through the mean gate probabilities. `res` must
 * come from dsc_moe_gate_forward on the same logits and config. */
DSC_API dsc_status dsc_moe_gate_backward(const dsc_moe_gate_config *cfg, const dsc_tensor *logits,
                                         const dsc_moe_gate_result *res, const dsc_tensor *d_weight, double d_loss,
                                         dsc_tensor *d_logits);

/* Fills `noise` (any shape, f32 CPU) with multiplicative jitter factors
 * U[0.99, 1.01]. The layer calls it when noisy_gate_policy is JITTER and it
 * is training, computes logits = (x * noise) @ Wg^T, and keeps `noise` for
 * the backward pass (dx = (d_logits @ Wg) * noise). */
DSC_API dsc_status dsc_moe_gate_jitter(dsc_rng *rng, dsc_tensor *noise);

#ifdef __cplusplus
}
#endif
#endif
