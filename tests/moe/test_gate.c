/* The MoE gate on hand-computed cases: top-1, top-2 and top-k routing with
 * capacity overflow, min_capacity, ties, a top-2 second choice dropped while
 * the first is kept, no-drop mode and its capacity hook, eval mode, the
 * float32 capacity formula, l_aux and the z-loss; the random elements
 * (random token selection, RSample, second-expert sampling, jitter) by their
 * invariants and distributions under fixed seeds; and argument validation.
 *
 * Most cases give logits as log-probabilities, so each token's softmax is
 * the probability row written in the test and the expected weights and
 * l_aux can be worked out by hand (the arithmetic is in the comments). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/moe_gate.h"
#include "test_mpi.h"

/* Logits (S, E) = log(p) for a row-major table of probabilities. */
static dsc_tensor logits_from_probs(int64_t S, int64_t E, const double *p) {
    dsc_tensor t;
    assert_ok(dsc_tensor_alloc(&t, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_OTHER));
    for (int64_t i = 0; i < S * E; i++)
        ((float *)t.data)[i] = (float)log(p[i]);
    return t;
}

static dsc_tensor logits_constant(int64_t S, int64_t E, float value) {
    dsc_tensor t;
    assert_ok(dsc_tensor_alloc(&t, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_OTHER));
    for (int64_t i = 0; i < S * E; i++)
        ((float *)t.data)[i] = value;
    return t;
}

/* DeepSpeed's gate with every random element off. */
static dsc_moe_gate_config plain(int k, double capacity_factor, int64_t min_capacity) {
    dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
    cfg.k = k;
    cfg.capacity_factor = capacity_factor;
    cfg.min_capacity = min_capacity;
    cfg.use_rts = false;
    cfg.top2_2nd_expert_sampling = false;
    return cfg;
}

static void run_gate(const dsc_moe_gate_config *cfg, const dsc_tensor *logits, bool training,
                     dsc_moe_gate_result *res) {
    assert_ok(dsc_moe_gate_result_alloc(res, logits->shape[0], logits->shape[1], cfg->k));
    assert_ok(dsc_moe_gate_forward(cfg, logits, training, NULL, NULL, res));
}

/* Compares every route (S*K of them) with the expected expert, slot and weight. */
static void expect_routes(const dsc_moe_gate_result *res, const int *expert, const int *slot,
                          const double *weight) {
    for (int64_t i = 0; i < res->num_tokens * res->k; i++) {
        if (res->expert[i] != expert[i] || res->slot[i] != slot[i] || fabs(res->weight[i] - weight[i]) > 1e-6)
            fail_msg("route %lld/%lld: got (%d, %d, %.7f), expected (%d, %d, %.7f)", (long long)(i / res->k),
                     (long long)(i % res->k), res->expert[i], res->slot[i], res->weight[i], expert[i], slot[i],
                     weight[i]);
    }
}

static void expect_counts(const int64_t *got, const int64_t *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(got[i], want[i]);
}

/* Top-1, S=6, E=3, capacity ceil(6/3 * 1.0) = 2. Expert 0 is chosen by
 * tokens 0, 2, 3: token 3 finds it full and is dropped (weight 0); kept
 * weights are the raw probabilities. me = (2.65, 1.75, 1.60)/6, ce = (3, 2,
 * 1)/6, l_aux = 3 * (2.65*3 + 1.75*2 + 1.6)/36 = 1.0875. */
static const double top1_probs[] = {
    0.5,  0.25, 0.25, /* -> 0 */
    0.25, 0.5,  0.25, /* -> 1 */
    0.6,  0.2,  0.2,  /* -> 0 */
    0.7,  0.1,  0.2,  /* -> 0, dropped */
    0.2,  0.2,  0.6,  /* -> 2 */
    0.4,  0.5,  0.1,  /* -> 1 */
};

static void test_top1_drops_tokens_at_full_expert(void **state) {
    (void)state;
    dsc_tensor logits = logits_from_probs(6, 3, top1_probs);
    dsc_moe_gate_config cfg = plain(1, 1.0, 0);
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 2);
    expect_routes(&res, (const int[]){0, 1, 0, 0, 2, 1}, (const int[]){0, 0, 1, -1, 0, 1},
                  (const double[]){0.5, 0.5, 0.6, 0.0, 0.6, 0.5});
    expect_counts(res.exp_counts, (const int64_t[]){3, 2, 1}, 3);
    expect_counts(res.kept_counts, (const int64_t[]){2, 2, 1}, 3);
    expect_counts(res.dropped_counts, (const int64_t[]){1, 0, 0}, 3);
    assert_int_equal(res.dropped_tokens, 1);
    assert_true(fabs(res.mean_prob[0] - 2.65 / 6) < 1e-7);
    assert_true(fabs(res.l_aux - 1.0875) < 1e-6);
    assert_true(fabs(res.loss - 0.01 * 1.0875) < 1e-8); /* default aux_loss_coef 0.01, z-loss off */
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

/* Equal logits: every token picks expert 0 (lower expert index), and a full
 * expert keeps the lower token indices. min_capacity raises the capacity. */
static void test_top1_ties_and_min_capacity(void **state) {
    (void)state;
    dsc_tensor logits = logits_constant(4, 2, 0.0f);
    dsc_moe_gate_config cfg = plain(1, 1.0, 0);
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 2); /* ceil(4/2 * 1.0) */
    expect_routes(&res, (const int[]){0, 0, 0, 0}, (const int[]){0, 1, -1, -1}, (const double[]){0.5, 0.5, 0, 0});
    assert_true(fabs(res.l_aux - 1.0) < 1e-9); /* 2 * (0.5 * 1 + 0.5 * 0) */
    dsc_moe_gate_result_free(&res);

    cfg.min_capacity = 3;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 3);
    expect_routes(&res, (const int[]){0, 0, 0, 0}, (const int[]){0, 1, 2, -1}, (const double[]){0.5, 0.5, 0.5, 0});
    dsc_moe_gate_result_free(&res);

    /* DeepSpeed's top-1 asserts S >= min_capacity; dsc reports it. */
    cfg.min_capacity = 5;
    assert_ok(dsc_moe_gate_result_alloc(&res, 4, 2, 1));
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "top-1 needs at least min_capacity=5 tokens, got S=4");
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

static void test_capacity_formula_in_float32(void **state) {
    (void)state;
    dsc_moe_gate_config cfg = plain(1, 1.2, 0);
    /* float32(10/3) * float32(1.2) = 3.99999976 -> 4; in double it is 4.0000000000000009 -> 5. */
    assert_int_equal(dsc_moe_gate_capacity(&cfg, 10, 3, true), 4);
    /* k * factor is formed in double first, as DeepSpeed does in Python:
     * float32(3.5999999999999996) * float32(35/6) -> 21 (float32(1.2) * 3 would give 22). */
    cfg.k = 3;
    assert_int_equal(dsc_moe_gate_capacity(&cfg, 35, 6, true), 21);
    cfg.k = 2;
    cfg.capacity_factor = 1.0;
    assert_int_equal(dsc_moe_gate_capacity(&cfg, 8, 4, true), 4); /* top-2 doubles the factor */
    cfg.eval_capacity_factor = 0.25;
    assert_int_equal(dsc_moe_gate_capacity(&cfg, 8, 4, false), 1);
    cfg.min_capacity = 3;
    assert_int_equal(dsc_moe_gate_capacity(&cfg, 8, 4, false), 3);
    cfg.k = 1;
    cfg.capacity_factor = 4.0;
    cfg.min_capacity = 0;
    assert_int_equal(dsc_moe_gate_capacity(&cfg, 4, 2, true), 8); /* may exceed S */
}

/* Top-2, S=6, E=3, capacity ceil(6/3 * 0.2) = 1 raised to min_capacity 2.
 * First choices: tokens 0, 1, 5 -> expert 0; 2, 3 -> 1; 4 -> 2 (n1 = 3, 2, 1).
 * Second choices start after all first choices of their expert: loc2 = n1[e] + rank.
 *   token 0: (0 loc 0) kept, (1 loc 2+0) dropped  -> lone first route, weight 1
 *   token 1: (0 loc 1) kept, (2 loc 1+0) kept     -> 0.5/0.9 and 0.4/0.9
 *   token 2: (1 loc 0) kept, (0 loc 3+0) dropped
 *   token 3: (1 loc 1) kept, (2 loc 1+1) dropped
 *   token 4: (2 loc 0) kept, (1 loc 2+1) dropped
 *   token 5: (0 loc 2) dropped, (1 loc 2+2) dropped -> both dropped, weights 0
 * me = (2.15, 2.05, 1.8)/6, ce (first choices) = (3, 2, 1)/6,
 * l_aux = 3 * (2.15*3 + 2.05*2 + 1.8)/36 = 12.35/12. */
static const double top2_probs[] = {
    0.6, 0.3, 0.1, 0.5, 0.1, 0.4, 0.3, 0.6, 0.1, 0.2, 0.5, 0.3, 0.1, 0.2, 0.7, 0.45, 0.35, 0.2,
};

static void test_top2_second_choice_dropped_first_kept(void **state) {
    (void)state;
    dsc_tensor logits = logits_from_probs(6, 3, top2_probs);
    dsc_moe_gate_config cfg = plain(2, 0.2, 2);
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 2);
    expect_routes(&res, (const int[]){0, 1, 0, 2, 1, 0, 1, 2, 2, 1, 0, 1},
                  (const int[]){0, -1, 1, 1, 0, -1, 1, -1, 0, -1, -1, -1},
                  (const double[]){1, 0, 0.5 / 0.9, 0.4 / 0.9, 1, 0, 1, 0, 1, 0, 0, 0});
    expect_counts(res.exp_counts, (const int64_t[]){4, 5, 3}, 3);
    expect_counts(res.kept_counts, (const int64_t[]){2, 2, 2}, 3);
    assert_int_equal(res.dropped_tokens, 1);
    assert_true(fabs(res.l_aux - 12.35 / 12) < 1e-6);
    dsc_moe_gate_result_free(&res);

    /* No-drop: capacity = largest pre-drop load (5), every route kept at its location. */
    cfg.drop_tokens = false;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 5);
    expect_routes(&res, (const int[]){0, 1, 0, 2, 1, 0, 1, 2, 2, 1, 0, 1},
                  (const int[]){0, 2, 1, 1, 0, 3, 1, 2, 0, 3, 2, 4},
                  (const double[]){0.6 / 0.9, 0.3 / 0.9, 0.5 / 0.9, 0.4 / 0.9, 0.6 / 0.9, 0.3 / 0.9, 0.5 / 0.8,
                                   0.3 / 0.8, 0.7 / 0.9, 0.2 / 0.9, 0.45 / 0.8, 0.35 / 0.8});
    expect_counts(res.kept_counts, res.exp_counts, 3);
    assert_int_equal(res.dropped_tokens, 0);
    assert_true(fabs(res.l_aux - 12.35 / 12) < 1e-6); /* l_aux does not depend on dropping */
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

/* The second expert is the best of the rest by logits, lower index on ties. */
static void test_top2_second_choice_ties(void **state) {
    (void)state;
    dsc_tensor logits = logits_from_probs(1, 4, (const double[]){0.1, 0.5, 0.2, 0.2});
    dsc_moe_gate_config cfg = plain(2, 1.0, 4);
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    expect_routes(&res, (const int[]){1, 2}, (const int[]){0, 0}, (const double[]){0.5 / 0.7, 0.2 / 0.7});
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

/* Top-3 of E=4, S=4, capacity ceil(4/4 * 3 * 0.1) = 1 raised to min_capacity 3.
 * Routes by descending probability (token 2 has a tie: experts 0 and 3, lower first):
 *   token 0: 0 (.4), 1 (.3), 2 (.2)     token 1: 3 (.4), 2 (.3), 1 (.2)
 *   token 2: 0 (.35), 3 (.35), 2 (.25)  token 3: 0 (.4), 2 (.35), 1 (.15)
 * Only expert 2 overflows (4 routes). "probs" keeps tokens 3, 1, 2 (0.35, 0.3,
 * 0.25) and drops token 0 (0.2); "position" keeps the first three tokens and
 * drops token 3. l_aux = (4/3) * (1.25*3 + 0.7*3 + 1.1*4 + 0.95*2)/16 = 1.0125. */
static const double top3_probs[] = {
    0.4, 0.3, 0.2, 0.1, 0.1, 0.2, 0.3, 0.4, 0.35, 0.05, 0.25, 0.35, 0.4, 0.15, 0.35, 0.1,
};

static void test_topk_drop_policies(void **state) {
    (void)state;
    dsc_tensor logits = logits_from_probs(4, 4, top3_probs);
    dsc_moe_gate_config cfg = plain(3, 0.1, 3);
    const int experts[] = {0, 1, 2, 3, 2, 1, 0, 3, 2, 0, 2, 1};
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 3);
    expect_routes(&res, experts, (const int[]){0, 0, -1, 0, 0, 1, 1, 1, 1, 2, 2, 2},
                  (const double[]){0.4 / 0.7, 0.3 / 0.7, 0, 0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.35 / 0.95,
                                   0.35 / 0.95, 0.25 / 0.95, 0.4 / 0.9, 0.35 / 0.9, 0.15 / 0.9});
    expect_counts(res.exp_counts, (const int64_t[]){3, 3, 4, 2}, 4);
    expect_counts(res.kept_counts, (const int64_t[]){3, 3, 3, 2}, 4);
    assert_true(fabs(res.l_aux - 1.0125) < 1e-6);
    dsc_moe_gate_result_free(&res);

    cfg.drop_policy = DSC_MOE_DROP_POLICY_POSITION;
    run_gate(&cfg, &logits, true, &res);
    expect_routes(&res, experts, (const int[]){0, 0, 0, 0, 1, 1, 1, 1, 2, 2, -1, 2},
                  (const double[]){0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.35 / 0.95,
                                   0.35 / 0.95, 0.25 / 0.95, 0.4 / 0.55, 0, 0.15 / 0.55});
    assert_true(fabs(res.l_aux - 1.0125) < 1e-6);
    dsc_moe_gate_result_free(&res);

    /* No-drop: capacity 4 (expert 2's load); slots are token order for either policy. */
    cfg.drop_tokens = false;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 4);
    expect_routes(&res, experts, (const int[]){0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 2},
                  (const double[]){0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.35 / 0.95,
                                   0.35 / 0.95, 0.25 / 0.95, 0.4 / 0.9, 0.35 / 0.9, 0.15 / 0.9});
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

/* Equal gates everywhere: each token takes experts 0, 1, 2 (lower index
 * first) and the "probs" rule keeps the lower token indices. */
static void test_topk_ties(void **state) {
    (void)state;
    dsc_tensor logits = logits_constant(4, 4, 0.5f);
    dsc_moe_gate_config cfg = plain(3, 0.1, 3);
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    const double third = 1.0 / 3;
    expect_routes(&res, (const int[]){0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2},
                  (const int[]){0, 0, 0, 1, 1, 1, 2, 2, 2, -1, -1, -1},
                  (const double[]){third, third, third, third, third, third, third, third, third, 0, 0, 0});
    assert_int_equal(res.dropped_tokens, 1);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

typedef struct agree_state {
    int64_t seen;   /* local load the gate reported */
    int64_t answer; /* what the "group" agreed */
    bool fail;
} agree_state;

static dsc_status agree_max(void *user, int64_t *capacity) {
    agree_state *a = user;
    a->seen = *capacity;
    if (a->fail) return dsc_error(DSC_ERR_COMM, "MPI_Allreduce failed");
    *capacity = a->answer;
    return NULL;
}

/* No-drop top-1 on the 6-token case: local largest load 3 goes to the hook;
 * its answer is the capacity (clamped to S for top-1); an answer below the
 * local load or a failing hook is an error. */
static void test_no_drop_capacity_hook(void **state) {
    (void)state;
    dsc_tensor logits = logits_from_probs(6, 3, top1_probs);
    dsc_moe_gate_config cfg = plain(1, 1.0, 0);
    cfg.drop_tokens = false;
    dsc_moe_gate_result res;
    assert_ok(dsc_moe_gate_result_alloc(&res, 6, 3, 1));
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res));
    assert_int_equal(res.capacity, 3);
    expect_routes(&res, (const int[]){0, 1, 0, 0, 2, 1}, (const int[]){0, 0, 1, 2, 0, 1},
                  (const double[]){0.5, 0.5, 0.6, 0.7, 0.6, 0.5});

    agree_state a = {.answer = 5};
    dsc_moe_gate_capacity_hook hook = {agree_max, &a};
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, NULL, &hook, &res));
    assert_int_equal(a.seen, 3);
    assert_int_equal(res.capacity, 5);
    a.answer = 9;
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, NULL, &hook, &res));
    assert_int_equal(res.capacity, 6); /* top-1 clamps to S */
    a.answer = 2;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, &hook, &res), DSC_ERR_INVALID,
               "agreed no-drop capacity 2 is below this rank's largest expert load 3");
    a.fail = true;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, &hook, &res), DSC_ERR_COMM,
               "agreeing the no-drop capacity: MPI_Allreduce failed");
    dsc_moe_gate_result_free(&res);

    /* Top-2 does not clamp to S. */
    cfg.k = 2;
    a = (agree_state){.answer = 9};
    assert_ok(dsc_moe_gate_result_alloc(&res, 6, 3, 2));
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, NULL, &hook, &res));
    assert_int_equal(res.capacity, 9);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

static void test_eval_mode_uses_eval_capacity_factor(void **state) {
    (void)state;
    dsc_tensor logits = logits_from_probs(6, 3, top1_probs);
    dsc_moe_gate_config cfg = plain(1, 1.0, 0);
    cfg.eval_capacity_factor = 2.0;
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, false, &res);
    assert_int_equal(res.capacity, 4);
    assert_int_equal(res.dropped_tokens, 0);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

/* z-loss = mean over tokens of logsumexp^2; rows (1, 1) and (2, 2) give
 * ((1 + ln 2)^2 + (2 + ln 2)^2) / 2. loss = aux * l_aux + z * z_loss. */
static void test_z_loss_and_gate_loss(void **state) {
    (void)state;
    dsc_tensor logits = logits_constant(2, 2, 1.0f);
    ((float *)logits.data)[2] = ((float *)logits.data)[3] = 2.0f;
    dsc_moe_gate_config cfg = plain(2, 1.0, 0);
    cfg.aux_loss_coef = 0.5;
    cfg.z_loss_coef = 0.25;
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    const double want = (pow(1 + log(2.0), 2) + pow(2 + log(2.0), 2)) / 2;
    assert_true(fabs(res.z_loss - want) < 1e-9);
    assert_true(fabs(res.l_aux - 1.0) < 1e-9); /* 2 * (0.5 * 1 + 0.5 * 0) */
    assert_true(fabs(res.loss - (0.5 * 1.0 + 0.25 * want)) < 1e-9);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

/* Top-2 where a token's first route is dropped and its kept second route has
 * p ~ e^-20 < float32 eps: DeepSpeed divides by eps, not by p, so the lone
 * route's weight is p / eps rather than 1. */
static void test_top2_clamped_denominator(void **state) {
    (void)state;
    const float rows[] = {20, 0, -20, 20, -20, 0};
    dsc_tensor logits;
    assert_ok(dsc_tensor_alloc(&logits, DSC_DTYPE_F32, 2, (const int64_t[]){2, 3}, DSC_CPU, DSC_MEM_OTHER));
    memcpy(logits.data, rows, sizeof rows);
    dsc_moe_gate_config cfg = plain(2, 0.01, 1);
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 1);
    /* Token 0 keeps both routes (expert 1's second-choice location is 0). */
    const double p2 = exp(-20.0) / (1 + exp(-20.0) + exp(-40.0));
    expect_routes(&res, (const int[]){0, 1, 0, 2}, (const int[]){0, 0, -1, 0},
                  (const double[]){1 / (1 + exp(-20.0)), exp(-20.0) / (1 + exp(-20.0)), 0, p2 / 0x1p-23});
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
}

/* Random token selection: an over-full expert keeps `capacity` random tokens
 * (not the first ones), slots stay dense in token order, and a seed
 * reproduces the choice. Eval mode is deterministic (dsc's rule). */
static void test_random_token_selection(void **state) {
    (void)state;
    dsc_tensor logits = logits_constant(64, 2, 0.0f); /* everyone picks expert 0 */
    dsc_moe_gate_config cfg = plain(1, 1.0, 0);
    cfg.use_rts = true;
    dsc_moe_gate_result a, b;
    assert_ok(dsc_moe_gate_result_alloc(&a, 64, 2, 1));
    assert_ok(dsc_moe_gate_result_alloc(&b, 64, 2, 1));
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &a), DSC_ERR_INVALID,
               "use_rts is enabled for training but no RNG stream");
    dsc_rng r1, r2;
    dsc_rng_init(&r1, 7, 0, DSC_RNG_GATE);
    dsc_rng_init(&r2, 7, 0, DSC_RNG_GATE);
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, &r1, NULL, &a));
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, &r2, NULL, &b));
    assert_int_equal(a.capacity, 32);
    assert_int_equal(a.kept_counts[0], 32);
    int next_slot = 0, late_kept = 0;
    for (int s = 0; s < 64; s++) {
        assert_int_equal(a.slot[s], b.slot[s]);
        if (a.slot[s] >= 0) assert_int_equal(a.slot[s], next_slot++);
        late_kept += s >= 32 && a.slot[s] >= 0;
    }
    assert_true(late_kept > 0);
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, false, NULL, NULL, &a));
    for (int s = 0; s < 64; s++)
        assert_int_equal(a.slot[s], s < 32 ? s : -1);
    dsc_moe_gate_result_free(&a);
    dsc_moe_gate_result_free(&b);
    dsc_tensor_free(&logits);
}

/* Gumbel-max sampling: RSample picks expert 1 with probability softmax = 0.75
 * for logits (0, ln 3) and keeps the noise-free probability as weight; top-2
 * sampling picks the second expert of (.5, .3, .2) as 1 with probability
 * .3/.5 = 0.6. Seeds are fixed, so the frequencies are deterministic. */
static void test_gumbel_sampling(void **state) {
    (void)state;
    enum { S = 4000 };
    dsc_rng rng;
    dsc_rng_init(&rng, 11, 0, DSC_RNG_GATE);
    dsc_moe_gate_result res;

    double *p = malloc(sizeof(double) * S * 3);
    for (int s = 0; s < S; s++)
        p[2 * s] = 0.25, p[2 * s + 1] = 0.75;
    dsc_tensor logits = logits_from_probs(S, 2, p);
    dsc_moe_gate_config cfg = plain(1, 1.0, 0);
    cfg.drop_tokens = false;
    cfg.noisy_gate_policy = DSC_MOE_NOISY_GATE_RSAMPLE;
    assert_ok(dsc_moe_gate_result_alloc(&res, S, 2, 1));
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, &rng, NULL, &res));
    double freq = (double)res.exp_counts[1] / S;
    printf("  RSample frequency of expert 1: %.4f (softmax 0.75)\n", freq);
    assert_true(fabs(freq - 0.75) < 0.03);
    for (int s = 0; s < S; s++)
        assert_true(fabs(res.weight[s] - (res.expert[s] ? 0.75 : 0.25)) < 1e-6);
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, false, NULL, NULL, &res)); /* eval: plain argmax */
    assert_int_equal(res.exp_counts[1], S);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);

    for (int s = 0; s < S; s++)
        p[3 * s] = 0.5, p[3 * s + 1] = 0.3, p[3 * s + 2] = 0.2;
    logits = logits_from_probs(S, 3, p);
    cfg = plain(2, 1.0, 0);
    cfg.drop_tokens = false;
    cfg.top2_2nd_expert_sampling = true;
    assert_ok(dsc_moe_gate_result_alloc(&res, S, 3, 2));
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, &rng, NULL, &res));
    assert_int_equal(res.exp_counts[0], S); /* the first choice is never sampled */
    freq = (double)res.exp_counts[1] / S;
    printf("  second-expert sampling frequency of expert 1: %.4f (0.6)\n", freq);
    assert_true(fabs(freq - 0.6) < 0.03);
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, false, NULL, NULL, &res));
    assert_int_equal(res.exp_counts[1], S);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
    free(p);
}

static void test_jitter_noise(void **state) {
    (void)state;
    dsc_tensor noise;
    assert_ok(dsc_tensor_alloc(&noise, DSC_DTYPE_F32, 2, (const int64_t[]){100, 50}, DSC_CPU, DSC_MEM_OTHER));
    dsc_rng rng;
    dsc_rng_init(&rng, 3, 0, DSC_RNG_GATE);
    assert_ok(dsc_moe_gate_jitter(&rng, &noise));
    double sum = 0, lo = 2, hi = 0;
    for (int i = 0; i < 5000; i++) {
        double v = ((float *)noise.data)[i];
        sum += v;
        lo = fmin(lo, v);
        hi = fmax(hi, v);
    }
    assert_true(lo >= 0.99f && hi <= 1.01f && hi - lo > 0.019);
    assert_true(fabs(sum / 5000 - 1.0) < 1e-3);
    dsc_tensor_free(&noise);
}

static void test_invalid_arguments(void **state) {
    (void)state;
    dsc_tensor logits = logits_constant(4, 3, 0.0f);
    dsc_moe_gate_result res;
    assert_ok(dsc_moe_gate_result_alloc(&res, 4, 3, 2));
    dsc_moe_gate_config cfg = plain(2, 1.0, 0);
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res));

    cfg.k = 0;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "k must be >= 1, got 0");
    cfg.k = 4;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "k=4 exceeds the number of experts E=3");
    cfg = plain(2, 0.0, 0);
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "capacity_factor must be a finite number > 0, got 0");
    cfg = plain(2, 1.0, 0);
    cfg.eval_capacity_factor = -1;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "eval_capacity_factor");
    cfg = plain(2, 1.0, -1);
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "min_capacity must be >= 0");
    cfg = plain(2, 1.0, 0);
    cfg.noisy_gate_policy = DSC_MOE_NOISY_GATE_RSAMPLE;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "RSample applies to top-1 only, but k=2");
    cfg = plain(2, 1.0, 0);
    cfg.top2_2nd_expert_sampling = true;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "top2_2nd_expert_sampling is enabled for training but no RNG stream");
    cfg = plain(2, 1.0, 0);

    dsc_tensor flat = dsc_tensor_view(logits.data, DSC_DTYPE_F32, 1, (const int64_t[]){12}, DSC_CPU);
    assert_err(dsc_moe_gate_forward(&cfg, &flat, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "moe gate logits (S, E)");
    dsc_tensor ints = dsc_tensor_view(logits.data, DSC_DTYPE_I32, 2, (const int64_t[]){4, 3}, DSC_CPU);
    assert_err(dsc_moe_gate_forward(&cfg, &ints, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "moe gate logits (S, E)");
    dsc_tensor wide = dsc_tensor_view(logits.data, DSC_DTYPE_F32, 2, (const int64_t[]){3, 4}, DSC_CPU);
    assert_err(dsc_moe_gate_forward(&cfg, &wide, true, NULL, NULL, &res), DSC_ERR_INVALID,
               "result sized for up to 4 tokens, E=3, k=2 cannot hold S=3, E=4, k=2");

    ((float *)logits.data)[4] = NAN;
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_NUMERIC,
               "router logits of token 1 are not finite");
    ((float *)logits.data)[4] = 0.0f;

    dsc_tensor d_logits = logits_constant(4, 2, 0.0f);
    assert_err(dsc_moe_gate_backward(&cfg, &logits, &res, NULL, 1.0, &d_logits), DSC_ERR_INVALID,
               "moe gate d_logits (S, E)");
    dsc_tensor_free(&d_logits);
    dsc_moe_gate_result_free(&res);
    assert_err(dsc_moe_gate_result_alloc(&res, 4, 3, 5), DSC_ERR_INVALID, "1 <= k <= E");
    dsc_tensor_free(&logits);
}

/* An empty batch (a rank with no tokens still runs its MoE layer): configured
 * capacity, zero counts, l_aux and z-loss 0 (DeepSpeed's means would be NaN). */
static void test_empty_batch(void **state) {
    (void)state;
    dsc_tensor logits, d_logits;
    assert_ok(dsc_tensor_alloc(&logits, DSC_DTYPE_F32, 2, (const int64_t[]){0, 4}, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&d_logits, DSC_DTYPE_F32, 2, (const int64_t[]){0, 4}, DSC_CPU, DSC_MEM_OTHER));
    dsc_moe_gate_config cfg = plain(2, 1.0, 4);
    dsc_moe_gate_result res;
    run_gate(&cfg, &logits, true, &res);
    assert_int_equal(res.capacity, 4);
    for (int e = 0; e < 4; e++)
        assert_int_equal(res.exp_counts[e], 0);
    assert_true(res.l_aux == 0 && res.z_loss == 0 && res.loss == 0);
    assert_ok(dsc_moe_gate_backward(&cfg, &logits, &res, NULL, 1.0, &d_logits));
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
    dsc_tensor_free(&d_logits);
}

/* The result is counted as activations and a smaller batch reuses it. */
static void test_result_memory_and_reuse(void **state) {
    (void)state;
    dsc_mem_stats before, during, after;
    dsc_mem_get_stats(&before);
    dsc_moe_gate_result res;
    assert_ok(dsc_moe_gate_result_alloc(&res, 1000, 8, 2));
    dsc_mem_get_stats(&during);
    assert_true(during.current[DSC_MEM_ACTIVATIONS] - before.current[DSC_MEM_ACTIVATIONS] >= 1000 * 2 * 12);
    dsc_tensor logits = logits_from_probs(6, 3, top2_probs);
    dsc_moe_gate_config cfg = plain(2, 0.2, 2);
    assert_err(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res), DSC_ERR_INVALID, "E=8");
    dsc_moe_gate_result_free(&res);
    assert_ok(dsc_moe_gate_result_alloc(&res, 10, 3, 2));
    assert_ok(dsc_moe_gate_forward(&cfg, &logits, true, NULL, NULL, &res));
    assert_int_equal(res.num_tokens, 6);
    assert_int_equal(res.kept_counts[0] + res.kept_counts[1] + res.kept_counts[2], 6);
    dsc_moe_gate_result_free(&res);
    dsc_mem_get_stats(&after);
    assert_int_equal(after.current[DSC_MEM_ACTIVATIONS], before.current[DSC_MEM_ACTIVATIONS]);
    dsc_tensor_free(&logits);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top1_drops_tokens_at_full_expert),
        cmocka_unit_test(test_top1_ties_and_min_capacity),
        cmocka_unit_test(test_capacity_formula_in_float32),
        cmocka_unit_test(test_top2_second_choice_dropped_first_kept),
        cmocka_unit_test(test_top2_second_choice_ties),
        cmocka_unit_test(test_topk_drop_policies),
        cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_no_drop_capacity_hook),
        cmocka_unit_test(test_eval_mode_uses_eval_capacity_factor),
        cmocka_unit_test(test_z_loss_and_gate_loss),
        cmocka_unit_test(test_top2_clamped_denominator),
        cmocka_unit_test(test_random_token_selection),
        cmocka_unit_test(test_gumbel_sampling),
        cmocka_unit_test(test_jitter_noise),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_empty_batch),
        cmocka_unit_test(test_result_memory_and_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
