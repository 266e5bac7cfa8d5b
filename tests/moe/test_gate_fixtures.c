/* The gate against the PyTorch restatement of DeepSpeed's gating functions
 * (tests/ref/moe_gate_ref.py): for every fixture, capacity, each route's
 * expert and slot, exp_counts and kept_counts must match exactly, weights,
 * l_aux and the z-loss to 1e-6, and the backward pass must reproduce the
 * autograd gradient of the fixture's objective to 1e-6. */
#include <math.h>
#include <stdio.h>

#include "test_gate_fixture.h"
#include "test_mpi.h"

static void check_fixture(const char *path, double *worst_weight, double *worst_grad) {
    gate_fixture fx;
    assert_ok(gate_fixture_load(path, &fx));
    const int64_t S = fx.S, E = fx.E;
    const int K = fx.k;
    dsc_moe_gate_result res;
    assert_ok(dsc_moe_gate_result_alloc(&res, S, E, K));
    assert_ok(dsc_moe_gate_forward(&fx.cfg, &fx.logits, fx.training, NULL, NULL, &res));

    assert_int_equal(res.capacity, fx.capacity);
    double weight_err = 0;
    for (int64_t i = 0; i < S * K; i++) {
        if (res.expert[i] != fx.expert[i] || res.slot[i] != fx.slot[i])
            fail_msg("%s: route %lld/%lld is (%d, %d), expected (%d, %d)", fx.name, (long long)(i / K),
                     (long long)(i % K), res.expert[i], res.slot[i], fx.expert[i], fx.slot[i]);
        weight_err = fmax(weight_err, fabs(res.weight[i] - fx.weight[i]));
    }
    for (int64_t e = 0; e < E; e++) {
        assert_int_equal(res.exp_counts[e], fx.exp_counts[e]);
        assert_int_equal(res.kept_counts[e], fx.kept_counts[e]);
        assert_int_equal(res.dropped_counts[e], fx.exp_counts[e] - fx.kept_counts[e]);
    }
    assert_true(weight_err < 1e-6);
    assert_true(fabs(res.l_aux - fx.l_aux) < 1e-6);
    assert_true(fabs(res.z_loss - fx.z_loss) < 1e-6);

    dsc_tensor d_logits;
    assert_ok(dsc_tensor_alloc(&d_logits, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_GRADS));
    assert_ok(dsc_moe_gate_backward(&fx.cfg, &fx.logits, &res, &fx.d_weight, 1.0, &d_logits));
    double grad_err = 0;
    for (int64_t i = 0; i < S * E; i++)
        grad_err = fmax(grad_err, fabs(((float *)d_logits.data)[i] - fx.d_logits[i]));
    printf("  %-28s capacity %3lld  weight err %.1e  l_aux err %.1e  d_logits err %.1e\n", fx.name,
           (long long)res.capacity, weight_err, fabs(res.l_aux - fx.l_aux), grad_err);
    assert_true(grad_err < 1e-6);
    *worst_weight = fmax(*worst_weight, weight_err);
    *worst_grad = fmax(*worst_grad, grad_err);
    dsc_tensor_free(&d_logits);
    dsc_moe_gate_result_free(&res);
    gate_fixture_free(&fx);
}

static void test_gate_matches_fixtures(void **state) {
    (void)state;
    int n;
    char **paths = gate_fixture_paths(&n);
    assert_true(n >= 12); /* every variant of moe_gate_ref.py's CASES */
    double worst_weight = 0, worst_grad = 0;
    for (int i = 0; i < n; i++)
        check_fixture(paths[i], &worst_weight, &worst_grad);
    printf("  %d fixtures: worst weight err %.2e, worst d_logits err %.2e\n", n, worst_weight, worst_grad);
    gate_fixture_free_paths(paths, n);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gate_matches_fixtures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
