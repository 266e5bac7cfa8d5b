/* moe/dispatch.c over the row kernels (dsc_kernel_moe_*) against a naive
 * reference written here from the gate's routes alone: dispatch puts token
 * s's row at row0[e] + slot of expert e for each kept route, combine sums
 * weight * row over the kept routes, and the two backwards are the
 * transposes. Cases: ties in the top-k (equal logits: the lower expert index
 * first, routes in that order), capacity overflow (padded layout with a
 * small capacity: dropped routes leave no row and get d_weight 0, tokens
 * with every route dropped get a zero row), an expert no token picks (packed
 * layout: zero rows for it), and widths around the vector loops' tails.
 * Also: the gate's per-token passes give the same bits on one thread and on
 * two (above DSC_MOE_GATE_PARALLEL_MIN), forward and backward. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/moe_gate.h"
#include "moe/moe_internal.h"
#include "test_mpi.h"

static uint64_t lcg = 7;
static float urand(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(lcg >> 40) / (float)(1ull << 24) * 2.0f - 1.0f;
}

static float *randv(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = urand();
    return p;
}

static void assert_close(const float *got, const double *want, int64_t n, double tol, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i]))))
            fail_msg("%s[%lld] = %.9g, want %.9g", what, (long long)i, got[i], want[i]);
}

/* Runs the gate on logits (S, E) and checks dispatch, combine and both backwards in `packed` or padded layout. */
static void check_rows(const dsc_moe_gate_config *cfg, const float *logits, int64_t S, int64_t E, int64_t M,
                       bool packed, dsc_moe_gate_result *r) {
    const int K = cfg->k;
    assert_ok(dsc_moe_gate_result_alloc(r, S, E, K));
    dsc_tensor z = dsc_tensor_view((float *)logits, DSC_DTYPE_F32, 2, (int64_t[]){S, E}, DSC_CPU);
    assert_ok(dsc_moe_gate_forward(cfg, &z, false, NULL, NULL, r));
    int64_t *row0 = calloc((size_t)E + 1, sizeof *row0);
    assert_ok(packed ? moe_rows_packed(r, row0) : moe_rows_padded(r, row0));
    const int64_t R = row0[E];
    float *x = randv(S * M), *buf = randv(R * M), *y = randv(R * M), *out = randv(S * M);
    float *dout = randv(S * M), *dy = randv(R * M), *dw = randv(S * K), *dx = randv(S * M);
    double *want = calloc((size_t)((R > S ? R : S) * M + S * K + 1), sizeof *want);

    /* dispatch: rows of kept routes, zeros elsewhere */
    assert_ok(moe_dispatch(r, row0, x, M, buf));
    memset(want, 0, (size_t)(R * M) * sizeof *want);
    for (int64_t i = 0; i < S * K; i++)
        for (int64_t c = 0; r->slot[i] >= 0 && c < M; c++)
            want[(row0[r->expert[i]] + r->slot[i]) * M + c] = x[(i / K) * M + c];
    assert_close(buf, want, R * M, 0, "dispatched rows");

    /* combine */
    assert_ok(moe_combine(r, row0, y, M, out));
    for (int64_t s = 0; s < S; s++)
        for (int64_t c = 0; c < M; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int64_t i = s * K + j;
                if (r->slot[i] >= 0) acc += (double)r->weight[i] * y[(row0[r->expert[i]] + r->slot[i]) * M + c];
            }
            want[s * M + c] = acc;
        }
    assert_close(out, want, S * M, 1e-6, "combined rows");

    /* combine backward: dy at kept rows, zeros elsewhere; d_weight the dot products, 0 when dropped */
    assert_ok(moe_combine_backward(r, row0, dout, y, M, dy, dw));
    memset(want, 0, (size_t)(R * M + S * K) * sizeof *want);
    double *want_dw = want + R * M;
    for (int64_t i = 0; i < S * K; i++) {
        if (r->slot[i] < 0) continue;
        const int64_t at = (row0[r->expert[i]] + r->slot[i]) * M;
        for (int64_t c = 0; c < M; c++) {
            want[at + c] = (double)r->weight[i] * dout[(i / K) * M + c];
            want_dw[i] += (double)dout[(i / K) * M + c] * y[at + c];
        }
    }
    assert_close(dy, want, R * M, 1e-6, "combine backward dy");
    assert_close(dw, want_dw, S * K, 1e-5, "combine backward d_weight");

    /* dispatch backward, accumulating into dx */
    for (int64_t i = 0; i < S * M; i++)
        want[i] = dx[i];
    for (int64_t i = 0; i < S * K; i++)
        for (int64_t c = 0; r->slot[i] >= 0 && c < M; c++)
            want[(i / K) * M + c] += dy[(row0[r->expert[i]] + r->slot[i]) * M + c];
    assert_ok(moe_dispatch_backward(r, row0, dy, M, dx, true));
    assert_close(dx, want, S * M, 1e-6, "dispatch backward");

    free(x), free(buf), free(y), free(out), free(dout), free(dy), free(dw), free(dx), free(want), free(row0);
}

/* Equal logits: the top-k takes the lowest expert indices, in index order; routes land in order. */
static void test_topk_ties(void **state) {
    (void)state;
    enum { S = 6, E = 5, M = 37 };
    float logits[S * E];
    for (int i = 0; i < S * E; i++)
        logits[i] = i / E == 3 ? (float)(i % E) : 0.25f; /* token 3 distinct, the rest all tied */
    dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
    cfg.k = 3;
    cfg.drop_tokens = false;
    cfg.min_capacity = 0;
    dsc_moe_gate_result r;
    check_rows(&cfg, logits, S, E, M, true, &r);
    for (int s = 0; s < S; s++)
        for (int j = 0; j < 3; j++)
            assert_int_equal(r.expert[s * 3 + j], s == 3 ? 4 - j : j);
    assert_int_equal(r.kept_counts[3], 1);
    assert_int_equal(r.kept_counts[0], S - 1);
    dsc_moe_gate_result_free(&r);
}

/* Capacity 1 for top-2 over 8 tokens: most routes drop, some tokens lose both; padded layout. */
static void test_capacity_overflow(void **state) {
    (void)state;
    enum { S = 8, E = 4, M = 19 };
    float *logits = randv(S * E);
    for (int s = 0; s < S; s++)
        logits[s * E + 1] += 3.0f; /* expert 1 is everyone's first choice */
    dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
    cfg.k = 2;
    cfg.capacity_factor = cfg.eval_capacity_factor = 0.25;
    cfg.min_capacity = 1;
    dsc_moe_gate_result r;
    check_rows(&cfg, logits, S, E, M, false, &r);
    assert_int_equal(r.capacity, 1);
    assert_int_equal(r.kept_counts[1], 1);
    assert_true(r.dropped_counts[1] == S - 1 && r.dropped_tokens > 0);
    for (int64_t i = 0; i < S * 2; i++)
        assert_int_equal(r.dest[i], r.slot[i] < 0 ? -1 : (int32_t)(r.expert[i] * r.capacity + r.slot[i]));
    dsc_moe_gate_result_free(&r);
    free(logits);
}

/* An expert no token picks gets no rows (packed) or a zero block (padded); wide rows take the parallel loops. */
static void test_zero_token_expert(void **state) {
    (void)state;
    enum { S = 64, E = 6, M = 1000 };
    float *logits = randv(S * E);
    for (int s = 0; s < S; s++)
        logits[s * E + 2] = -30.0f;
    dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
    cfg.k = 2;
    cfg.drop_tokens = false;
    cfg.min_capacity = 0;
    for (int packed = 0; packed < 2; packed++) {
        dsc_moe_gate_result r;
        check_rows(&cfg, logits, S, E, M, packed, &r);
        assert_int_equal(r.kept_counts[2], 0);
        assert_int_equal(r.dropped_tokens, 0);
        dsc_moe_gate_result_free(&r);
    }
    free(logits);
}

/* No tokens: nothing to move, the buffers come back zero. */
static void test_no_tokens(void **state) {
    (void)state;
    dsc_moe_gate_result r;
    assert_ok(dsc_moe_gate_result_alloc(&r, 4, 3, 1));
    r.num_tokens = 0;
    r.capacity = 2;
    memset(r.kept_counts, 0, 3 * sizeof *r.kept_counts);
    int64_t row0[4];
    assert_ok(moe_rows_padded(&r, row0));
    float buf[6 * 5];
    for (int i = 0; i < 30; i++)
        buf[i] = 1.0f;
    float none[5] = {0};
    assert_ok(moe_dispatch(&r, row0, none, 5, buf));
    for (int i = 0; i < 30; i++)
        assert_true(buf[i] == 0.0f);
    dsc_moe_gate_result_free(&r);
}

/* One gate forward + backward on `threads` OpenMP threads; returns the result, d_logits in dz. */
static void gate_pass(int threads, const float *logits, int64_t S, int64_t E, dsc_moe_gate_result *r, float *dz) {
    omp_set_num_threads(threads);
    dsc_moe_gate_config cfg = dsc_moe_gate_config_default();
    cfg.k = 2;
    cfg.z_loss_coef = 0.5;
    assert_ok(dsc_moe_gate_result_alloc(r, S, E, 2));
    dsc_tensor z = dsc_tensor_view((float *)logits, DSC_DTYPE_F32, 2, (int64_t[]){S, E}, DSC_CPU);
    dsc_tensor d = dsc_tensor_view(dz, DSC_DTYPE_F32, 2, (int64_t[]){S, E}, DSC_CPU);
    assert_ok(dsc_moe_gate_forward(&cfg, &z, false, NULL, NULL, r));
    float *dw = randv(S * 2);
    dsc_tensor dwt = dsc_tensor_view(dw, DSC_DTYPE_F32, 2, (int64_t[]){S, 2}, DSC_CPU);
    assert_ok(dsc_moe_gate_backward(&cfg, &z, r, &dwt, 1.0, &d));
    free(dw);
}

static void test_gate_threads_same_bits(void **state) {
    (void)state;
    enum { S = 3000, E = 16 };
    float *logits = randv(S * E), *dz1 = randv(S * E), *dz2 = randv(S * E);
    const uint64_t seed = lcg;
    dsc_moe_gate_result a, b;
    gate_pass(1, logits, S, E, &a, dz1);
    lcg = seed; /* the same d_weight */
    gate_pass(2, logits, S, E, &b, dz2);
    omp_set_num_threads(1);
    assert_memory_equal(a.expert, b.expert, S * 2 * sizeof(int32_t));
    assert_memory_equal(a.slot, b.slot, S * 2 * sizeof(int32_t));
    assert_memory_equal(a.weight, b.weight, S * 2 * sizeof(float));
    assert_memory_equal(a.mean_prob, b.mean_prob, E * sizeof(double));
    assert_memory_equal(dz1, dz2, S * E * sizeof(float));
    assert_true(a.l_aux == b.l_aux && a.z_loss == b.z_loss && a.z_loss > 0);
    dsc_moe_gate_result_free(&a);
    dsc_moe_gate_result_free(&b);
    free(logits), free(dz1), free(dz2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_capacity_overflow),
        cmocka_unit_test(test_zero_token_expert),
        cmocka_unit_test(test_no_tokens),
        cmocka_unit_test(test_gate_threads_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
