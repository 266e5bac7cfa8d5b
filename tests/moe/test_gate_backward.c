/* dsc_moe_gate_backward against central finite differences in double
 * precision, for top-1, top-2, top-k (both drop policies), no-drop mode and
 * a clamped top-2 denominator.
 *
 * The objective is restated here from the spec, independently of the
 * library: sum over kept routes of d_weight * weight + d_loss * (aux_coef *
 * l_aux + z_coef * z_loss), with the routing (experts, kept routes, counts)
 * taken from the forward pass and held fixed — what autograd differentiates
 * in DeepSpeed. The test also checks that moving any logit by +-DELTA (far
 * more than the finite-difference step) leaves the forward routing
 * unchanged, so the fixed-routing objective is the gate's real local
 * behaviour. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/moe_gate.h"
#include "test_mpi.h"

#define FD_STEP 1e-6
#define DELTA 1e-4f

typedef struct fd_case {
    const char *name;
    int64_t S, E;
    int k;
    double capacity_factor;
    bool drop_tokens;
    dsc_moe_drop_policy policy;
    uint64_t seed;
} fd_case;

/* Objective for logits z (S, E) in double with the routing of `res` fixed. */
static double objective(const dsc_moe_gate_config *cfg, const dsc_moe_gate_result *res, const double *z,
                        const float *dw, double d_loss) {
    const int64_t S = res->num_tokens, E = res->num_experts;
    const int K = cfg->k;
    double *me = calloc((size_t)E, sizeof *me), *ce = calloc((size_t)E, sizeof *ce);
    double *p = malloc(sizeof(double) * (size_t)E);
    double total = 0, lse_sq = 0;
    for (int64_t s = 0; s < S; s++) {
        double max = z[s * E];
        for (int64_t e = 1; e < E; e++)
            max = fmax(max, z[s * E + e]);
        double sum = 0;
        for (int64_t e = 0; e < E; e++)
            sum += exp(z[s * E + e] - max);
        for (int64_t e = 0; e < E; e++) {
            p[e] = exp(z[s * E + e] - max) / sum;
            me[e] += p[e] / S;
        }
        lse_sq += pow(max + log(sum), 2);
        double kept = 0;
        for (int r = 0; r < K; r++)
            kept += res->slot[s * K + r] >= 0 ? p[res->expert[s * K + r]] : 0;
        for (int r = 0; r < K; r++) {
            const int64_t i = s * K + r;
            if (res->slot[i] < 0) continue;
            const bool norm = cfg->weighting == DSC_MOE_WEIGHTING_RENORMALISED ||
                              (cfg->weighting == DSC_MOE_WEIGHTING_DEEPSPEED && K > 1);
            double w = norm ? p[res->expert[i]] / fmax(kept, 0x1p-23) : p[res->expert[i]];
            total += dw[i] * w;
        }
        /* ce counts choices before dropping: first choices for k <= 2, all k otherwise. */
        for (int r = 0; r < K; r++)
            if (K > 2 || r == 0) ce[res->expert[s * K + r]] += 1.0 / S;
    }
    double balance = 0;
    for (int64_t e = 0; e < E; e++)
        balance += me[e] * ce[e];
    double l_aux = (K <= 2 ? (double)E : (double)E / K) * balance;
    total += d_loss * (cfg->aux_loss_coef * l_aux + cfg->z_loss_coef * lse_sq / S);
    free(me);
    free(ce);
    free(p);
    return total;
}

static bool same_routing(const dsc_moe_gate_result *a, const dsc_moe_gate_result *b) {
    const size_t n = (size_t)(a->num_tokens * a->k) * sizeof(int32_t);
    return a->capacity == b->capacity && !memcmp(a->expert, b->expert, n) && !memcmp(a->slot, b->slot, n);
}

/* Compares the backward pass with finite differences for `logits` and returns the worst error. */
static double check_gradient(const char *name, const dsc_moe_gate_config *cfg, dsc_tensor *logits, dsc_rng *rng) {
    const int64_t S = logits->shape[0], E = logits->shape[1];
    const int K = cfg->k;
    dsc_moe_gate_result res, moved;
    assert_ok(dsc_moe_gate_result_alloc(&res, S, E, K));
    assert_ok(dsc_moe_gate_result_alloc(&moved, S, E, K));
    assert_ok(dsc_moe_gate_forward(cfg, logits, true, NULL, NULL, &res));

    dsc_tensor d_weight, d_logits;
    assert_ok(dsc_tensor_alloc(&d_weight, DSC_DTYPE_F32, 2, (const int64_t[]){S, K}, DSC_CPU, DSC_MEM_GRADS));
    assert_ok(dsc_tensor_alloc(&d_logits, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_GRADS));
    float *dw = d_weight.data;
    for (int64_t i = 0; i < S * K; i++)
        dw[i] = (float)dsc_rng_normal(rng);
    const double d_loss = 1.5;
    assert_ok(dsc_moe_gate_backward(cfg, logits, &res, &d_weight, d_loss, &d_logits));

    float *z32 = logits->data;
    double *z = malloc(sizeof(double) * (size_t)(S * E));
    for (int64_t i = 0; i < S * E; i++)
        z[i] = z32[i];
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < S * E; i++) {
        for (int sign = -1; sign <= 1; sign += 2) {
            const float keep = z32[i];
            z32[i] = keep + sign * DELTA;
            assert_ok(dsc_moe_gate_forward(cfg, logits, true, NULL, NULL, &moved));
            z32[i] = keep;
            if (!same_routing(&res, &moved))
                fail_msg("%s: moving logit %lld by %g changes the routing", name, (long long)i,
                         sign * (double)DELTA);
        }
        z[i] += FD_STEP;
        double up = objective(cfg, &res, z, dw, d_loss);
        z[i] -= 2 * FD_STEP;
        double down = objective(cfg, &res, z, dw, d_loss);
        z[i] += FD_STEP;
        double fd = (up - down) / (2 * FD_STEP);
        worst = fmax(worst, fabs(fd - ((float *)d_logits.data)[i]));
        largest = fmax(largest, fabs(fd));
    }
    int64_t dropped = 0;
    for (int64_t e = 0; e < E; e++)
        dropped += res.dropped_counts[e];
    printf("  %-26s capacity %3lld, %3lld routes dropped: max |grad| %.3f, max abs err %.2e\n", name,
           (long long)res.capacity, (long long)dropped, largest, worst);
    free(z);
    dsc_tensor_free(&d_weight);
    dsc_tensor_free(&d_logits);
    dsc_moe_gate_result_free(&res);
    dsc_moe_gate_result_free(&moved);
    return worst;
}

static const fd_case cases[] = {
    {"top1 drop", 24, 6, 1, 1.0, true, DSC_MOE_DROP_POLICY_PROBS, 101},
    {"top2 drop", 24, 6, 2, 0.6, true, DSC_MOE_DROP_POLICY_PROBS, 102},
    {"top2 no-drop", 20, 5, 2, 1.0, false, DSC_MOE_DROP_POLICY_PROBS, 103},
    {"top3 probs", 24, 6, 3, 0.6, true, DSC_MOE_DROP_POLICY_PROBS, 104},
    {"top4 position", 24, 6, 4, 0.7, true, DSC_MOE_DROP_POLICY_POSITION, 105},
    {"top3 no-drop", 16, 8, 3, 1.0, false, DSC_MOE_DROP_POLICY_PROBS, 106},
};

static void test_backward_matches_finite_differences(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const fd_case *fc = &cases[c];
        dsc_rng rng;
        dsc_rng_init(&rng, fc->seed, 0, DSC_RNG_GATE);
        dsc_tensor logits;
        assert_ok(
            dsc_tensor_alloc(&logits, DSC_DTYPE_F32, 2, (const int64_t[]){fc->S, fc->E}, DSC_CPU, DSC_MEM_OTHER));
        /* A per-expert bias makes some experts popular, so routes get dropped. */
        for (int64_t i = 0; i < fc->S * fc->E; i++)
            ((float *)logits.data)[i] = (float)(1.5 * dsc_rng_normal(&rng) + 0.5 * (double)(i % fc->E));
        dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
        cfg.k = fc->k;
        cfg.capacity_factor = fc->capacity_factor;
        cfg.min_capacity = 0;
        cfg.drop_tokens = fc->drop_tokens;
        cfg.drop_policy = fc->policy;
        cfg.use_rts = false;
        cfg.top2_2nd_expert_sampling = false;
        cfg.aux_loss_coef = 0.3; /* large enough that a wrong l_aux gradient shows */
        cfg.z_loss_coef = 0.05;
        /* Every weighting rule: DeepSpeed's, renormalised (also k = 1), raw probabilities. */
        const dsc_moe_weighting rules[] = {DSC_MOE_WEIGHTING_DEEPSPEED, DSC_MOE_WEIGHTING_RENORMALISED,
                                           DSC_MOE_WEIGHTING_NONE};
        const char *rule_names[] = {"", " renormalised", " raw"};
        for (int w = 0; w < 3; w++) {
            char name[64];
            snprintf(name, sizeof name, "%s%s", fc->name, rule_names[w]);
            cfg.weighting = rules[w];
            assert_true(check_gradient(name, &cfg, &logits, &rng) < 2e-7);
        }
        dsc_tensor_free(&logits);
    }
}

/* A token whose only kept route has p ~ e^-20 < float32 eps: the weight is
 * p / eps and its gradient must follow the clamp, not the quotient rule. */
static void test_backward_clamped_denominator(void **state) {
    (void)state;
    const float rows[] = {20, 0, -20, 20, -20, 0};
    dsc_tensor logits;
    assert_ok(dsc_tensor_alloc(&logits, DSC_DTYPE_F32, 2, (const int64_t[]){2, 3}, DSC_CPU, DSC_MEM_OTHER));
    memcpy(logits.data, rows, sizeof rows);
    dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
    cfg.k = 2;
    cfg.capacity_factor = 0.01;
    cfg.min_capacity = 1;
    cfg.top2_2nd_expert_sampling = false;
    cfg.z_loss_coef = 0.01;
    dsc_rng rng;
    dsc_rng_init(&rng, 5, 0, DSC_RNG_GATE);
    assert_true(check_gradient("top2 clamped denominator", &cfg, &logits, &rng) < 2e-7);
    dsc_tensor_free(&logits);
}

/* Without d_weight only the gate loss flows back; d_loss scales it linearly. */
static void test_backward_loss_only_scales(void **state) {
    (void)state;
    dsc_tensor logits, g1, g2;
    const int64_t S = 8, E = 4;
    assert_ok(dsc_tensor_alloc(&logits, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&g1, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_GRADS));
    assert_ok(dsc_tensor_alloc(&g2, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_GRADS));
    for (int64_t i = 0; i < S * E; i++)
        ((float *)logits.data)[i] = (float)sin((double)i);
    dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
    cfg.k = 2;
    cfg.top2_2nd_expert_sampling = false;
    cfg.z_loss_coef = 0.1;
    dsc_moe_gate_result res;
    assert_ok(dsc_moe_gate_result_alloc(&res, S, E, 2));
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res));
    assert_ok(dsc_moe_gate_backward(&cfg, &logits, &res, NULL, 1.0, &g1));
    assert_ok(dsc_moe_gate_backward(&cfg, &logits, &res, NULL, 4.0, &g2));
    double norm = 0;
    for (int64_t i = 0; i < S * E; i++) {
        const float a = ((float *)g1.data)[i], b = ((float *)g2.data)[i];
        assert_true(fabs(4.0 * a - b) <= 1e-6 * fabs(b) + 1e-12);
        norm += fabs(a);
    }
    assert_true(norm > 0);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
    dsc_tensor_free(&g1);
    dsc_tensor_free(&g2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_matches_finite_differences),
        cmocka_unit_test(test_backward_clamped_denominator),
        cmocka_unit_test(test_backward_loss_only_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
