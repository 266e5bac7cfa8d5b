/* moe/gate_route.c — the discrete half of the gate: which experts each token
 * picks, and which of those routes fit into the experts' capacity and in
 * which slot.
 *
 * The rules are DeepSpeed's (sharded_moe.py), restated in docs/moe_gate.md,
 * with its tie order made deterministic: lower expert index first among equal
 * probabilities, lower token index first among equal priorities. Nothing
 * here computes weights or losses (gate.c) or gradients (gate_backward.c).
 *
 * Dimension letters: S tokens, E experts, K routes per token, Cap capacity. */
#include <math.h>
#include <stdlib.h>

#include "moe/gate_internal.h"

/* Standard Gumbel noise; u = 0 is redrawn so the value stays finite. */
static double gumbel(dsc_rng *rng) {
    double u;
    do {
        u = dsc_rng_uniform(rng);
    } while (u == 0.0);
    return -log(-log(u));
}

/* The expert with the largest probability p[e] that is not among taken[0..ntaken),
 * the lowest index on ties (torch.argmax returns the first maximum). */
static int32_t best_by_prob(const double *p, int64_t num_experts, const int32_t *taken, int ntaken) {
    int32_t best = -1;
    double best_p = 0;
    for (int64_t e = 0; e < num_experts; e++) {
        bool is_taken = false;
        for (int r = 0; r < ntaken; r++)
            is_taken |= taken[r] == e;
        if (is_taken) continue;
        if (best < 0 || p[e] > best_p) {
            best = (int32_t)e;
            best_p = p[e];
        }
    }
    return best;
}

/* argmax over e != exclude of z[e] (+ Gumbel noise when rng is given):
 * DeepSpeed's RSample choice (exclude = -1) and its top-2 second choice,
 * both of which rank logits rather than probabilities. One draw per expert. */
static int32_t best_by_logit(const float *z, int64_t num_experts, int32_t exclude, dsc_rng *rng) {
    int32_t best = -1;
    double best_v = 0;
    for (int64_t e = 0; e < num_experts; e++) {
        double v = (double)z[e] + (rng ? gumbel(rng) : 0.0);
        if (e == exclude) continue;
        if (best < 0 || v > best_v) {
            best = (int32_t)e;
            best_v = v;
        }
    }
    return best;
}

/* Token s: its probabilities (each evaluated once, as dsc_moe_gate_prob), logsumexp and K experts. */
static void select_token(const dsc_moe_gate_config *cfg, const float *logits, dsc_rng *rng,
                         dsc_moe_gate_result *res, int64_t s) {
    const int64_t E = res->num_experts;
    const int K = cfg->k;
    const float *z = logits + s * E; // (E)
    double *p = res->probs + s * E;  // (E)
    int32_t *expert = res->expert + s * K;
    double max, sum;
    res->lse[s] = dsc_moe_gate_row_stats(z, E, &max, &sum);
    for (int64_t e = 0; e < E; e++)
        p[e] = dsc_moe_gate_prob(z, e, max, sum);
    if (K == 1 && rng) {
        expert[0] = best_by_logit(z, E, -1, rng);
    } else if (K == 2) {
        expert[0] = best_by_prob(p, E, NULL, 0);
        expert[1] = best_by_logit(z, E, expert[0], rng);
    } else {
        for (int r = 0; r < K; r++)
            expert[r] = best_by_prob(p, E, expert, r);
    }
    for (int r = 0; r < K; r++)
        res->route_prob[s * K + r] = p[expert[r]];
}

void dsc_moe_gate_select(const dsc_moe_gate_config *cfg, const float *logits, dsc_rng *rng,
                         dsc_moe_gate_result *res, double *lse_sq_sum) {
    const int64_t S = res->num_tokens, E = res->num_experts;
    /* Tokens are independent but for the RNG's draw order: without draws they run in parallel. The sums below
     * stay in token order, so every bit is the same either way. */
#pragma omp parallel for schedule(static) if (!rng && S * E > DSC_MOE_GATE_PARALLEL_MIN)
    for (int64_t s = 0; s < S; s++)
        select_token(cfg, logits, rng, res, s);
    for (int64_t e = 0; e < E; e++)
        res->mean_prob[e] = 0;
    double lse_sq = 0;
    for (int64_t s = 0; s < S; s++) {
        lse_sq += res->lse[s] * res->lse[s];
        const double *p = res->probs + s * E;
        for (int64_t e = 0; e < E; e++)
            res->mean_prob[e] += p[e];
    }
    *lse_sq_sum = lse_sq;
}

/* Position rule: walk the routes in a fixed order, number each expert's routes
 * 0, 1, 2, ... and keep those numbered below the capacity. Token-major order is
 * top-1 without random token selection and top-k "position"; route-major order
 * (every first choice before every second choice) is top-2. */
static void drop_by_position(dsc_moe_gate_result *res, int64_t capacity, bool route_major) {
    const int64_t S = res->num_tokens, E = res->num_experts;
    const int K = res->k;
    for (int64_t e = 0; e < E; e++)
        res->cursor[e] = 0;
    for (int64_t outer = 0; outer < (route_major ? K : S); outer++) {
        for (int64_t inner = 0; inner < (route_major ? S : K); inner++) {
            int64_t i = route_major ? inner * K + outer : outer * K + inner;
            int64_t loc = res->cursor[res->expert[i]]++;
            res->slot[i] = loc < capacity ? (int32_t)loc : -1;
        }
    }
}

/* Higher priority first, then lower token index. */
static int by_priority(const void *pa, const void *pb) {
    const dsc_moe_gate_candidate *a = pa, *b = pb;
    if (a->priority != b->priority) return a->priority > b->priority ? -1 : 1;
    return (a->token > b->token) - (a->token < b->token);
}

static int by_token(const void *pa, const void *pb) {
    const dsc_moe_gate_candidate *a = pa, *b = pb;
    return (a->token > b->token) - (a->token < b->token);
}

/* Priority rule: at an over-full expert keep the `capacity` routes of highest
 * priority (top-k "probs": the gate probability; top-1 with random token
 * selection: a U(0,1) draw per route in token order), then number the kept
 * routes in token order. */
static void drop_by_priority(dsc_moe_gate_result *res, int64_t capacity, dsc_rng *rts) {
    const int64_t S = res->num_tokens, E = res->num_experts;
    const int K = res->k;
    dsc_moe_gate_candidate *cand = res->candidates; // (S*K) bucketed by expert, token order inside a bucket
    res->cursor[0] = 0;
    for (int64_t e = 0; e < E; e++)
        res->cursor[e + 1] = res->cursor[e] + res->exp_counts[e];
    for (int64_t i = 0; i < S * K; i++) {
        dsc_moe_gate_candidate *c = &cand[res->cursor[res->expert[i]]++];
        c->token = (int32_t)(i / K);
        c->route = (int32_t)i;
        c->priority = rts ? dsc_rng_uniform(rts) : res->route_prob[i];
    }
    /* Each cursor[e] now ends bucket e. */
    for (int64_t e = 0; e < E; e++) {
        int64_t n = res->exp_counts[e];
        dsc_moe_gate_candidate *bucket = cand + res->cursor[e] - n;
        int64_t kept = n;
        if (n > capacity) {
            qsort(bucket, (size_t)n, sizeof *bucket, by_priority);
            qsort(bucket, (size_t)capacity, sizeof *bucket, by_token);
            for (int64_t j = capacity; j < n; j++)
                res->slot[bucket[j].route] = -1;
            kept = capacity;
        }
        for (int64_t j = 0; j < kept; j++)
            res->slot[bucket[j].route] = (int32_t)j;
    }
}

void dsc_moe_gate_drop(const dsc_moe_gate_config *cfg, int64_t capacity, dsc_rng *rts, dsc_moe_gate_result *res) {
    if (cfg->k == 1) {
        if (rts)
            drop_by_priority(res, capacity, rts);
        else
            drop_by_position(res, capacity, false);
    } else if (cfg->k == 2) {
        drop_by_position(res, capacity, true);
    } else if (cfg->drop_policy == DSC_MOE_DROP_POLICY_PROBS) {
        drop_by_priority(res, capacity, NULL);
    } else {
        drop_by_position(res, capacity, false);
    }
}
