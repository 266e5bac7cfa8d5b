/* Single-process pieces of ZeRO: the partitioning rule (contiguous, aligned
 * to 64 elements, covering, first ranks one chunk larger when uneven), the
 * memory formula against hand-computed numbers (the ZeRO paper's 7.5B model
 * on 64 ranks), the parameter count of the estimator against a built model,
 * the estimator's table for 70B parameters on 512 ranks, and a one-rank
 * optimizer (no communicator) against the plain one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/model.h"
#include "test_mpi.h"
#include "zero_test_util.h"

static void test_partition_rule(void **state) {
    (void)state;
    const int64_t sizes[] = {0, 64, 640, 6080, 64 * 1001};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (int ranks = 1; ranks <= 7; ranks++) {
            int64_t prev_end = 0, chunks = sizes[k] / 64;
            for (int r = 0; r < ranks; r++) {
                int64_t b, e;
                dsc_zero_partition(sizes[k], ranks, r, &b, &e);
                assert_int_equal(b, prev_end);
                assert_int_equal(b % 64, 0);
                assert_int_equal((e - b) / 64, chunks / ranks + (r < chunks % ranks));
                prev_end = e;
            }
            assert_int_equal(prev_end, sizes[k]);
        }
}

static void test_formula(void **state) {
    (void)state;
    /* The paper's Figure 1: Ψ = 7.5B, N = 64, K = 12 (mixed precision); here fp32 with K = 8:
     * 16Ψ = 120 GB, stage 1: 8Ψ + 8Ψ/64, stage 2: 4Ψ + 12Ψ/64, stage 3: 16Ψ/64. */
    const double psi = 7.5e9;
    const double want[4] = {16 * psi, 8 * psi + 8 * psi / 64, 4 * psi + 12 * psi / 64, 16 * psi / 64};
    for (int stage = 0; stage <= 3; stage++) {
        dsc_zero_memory m;
        dsc_zero_memory_formula(stage, psi, 64, 8, &m);
        assert_true(fabs(m.params + m.grads + m.optim - want[stage]) < 1.0);
    }
    dsc_zero_memory sgd;
    dsc_zero_memory_formula(1, 1000, 4, 4, &sgd);
    assert_true(sgd.optim == 1000.0);
}

static void test_model_size_matches_built_model(void **state) {
    (void)state;
    dsc_model_config mc;
    dsc_model_config_defaults(&mc, DSC_ARCH_LLAMA);
    mc.n_layer = 3;
    mc.d_model = 64;
    mc.n_head = 4;
    mc.n_kv_head = 2;
    mc.d_ff = 96;
    mc.vocab_size = 100;
    mc.seq_len = 8;
    dsc_zero_model_size size;
    assert_ok(dsc_zero_model_size_of(&mc, &size));
    /* the same model built and finalized */
    dsc_param_store *store;
    assert_ok(dsc_params_create(&store, DSC_CPU, 1));
    dsc_layer_spec *specs;
    int count;
    assert_ok(dsc_model_specs(&mc, &specs, &count));
    dsc_build_ctx ctx = {.model = &mc, .params = store, .device = DSC_CPU};
    double largest = 0;
    for (int i = 0; i < count; i++) {
        dsc_layer *layer;
        assert_ok(dsc_layer_build(&specs[i], &ctx, &layer));
        largest = fmax(largest, (double)dsc_layer_param_numel(layer));
        dsc_layer_destroy(layer);
    }
    free(specs);
    assert_ok(dsc_params_finalize(store));
    double total = 0;
    for (int i = 0; i < dsc_params_count(store); i++)
        total += (double)dsc_param_numel(dsc_params_at(store, i));
    dsc_params_destroy(store);
    /* hand count: embed 100*64, per block 2 norms (64 each), q 64*64, k and v 64*32 each, o 64*64,
     * SwiGLU 3*64*96; final norm 64, untied head 100*64 */
    double block = 2 * 64 + 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96;
    double hand = 100 * 64 + 3 * block + 64 + 100 * 64;
    printf("  llama 3x64: estimator %.0f, built %.0f, by hand %.0f parameters; largest layer %.0f\n", size.params,
           total, hand, size.largest_layer);
    assert_true(size.params == total);
    assert_true(size.params == hand);
    assert_true(size.largest_layer == largest);
    assert_true(size.expert_params == 0);
}

static void test_estimate_70b_on_512(void **state) {
    (void)state;
    dsc_zero_model_size size = {.params = 70e9, .expert_params = 0, .largest_layer = 855.6e6};
    char buf[4096];
    FILE *fp = tmpfile();
    assert_non_null(fp);
    dsc_zero_estimate_print(fp, &size, 512, 1, 1, 8);
    rewind(fp);
    buf[fread(buf, 1, sizeof buf - 1, fp)] = '\0';
    fclose(fp);
    printf("%s", buf);
    /* stage 3: 16 * 70e9 / 512 bytes = 2.037 GiB */
    assert_non_null(strstr(buf, "3              0.509        0.509        1.019        2.037"));
    /* stage 0: 16 * 70e9 bytes = 1043.081 GiB */
    assert_non_null(strstr(buf, "1043.081"));
}

static void test_one_rank_matches_plain(void **state) {
    (void)state;
    toy_spec spec;
    toy_spec_default(&spec);
    float ref[8192], got[8192];
    for (int stage = 0; stage <= 3; stage++) {
        toy_model m;
        toy_model_init(&m, &spec, 0);
        dsc_optimizer_options o = toy_options(&m, NULL);
        dsc_optimizer *opt;
        assert_ok(dsc_zero_create(&o, &(dsc_zero_options){stage, 1, 0, 1 << 30, 1 << 30, 0}, &opt));
        toy_train(&m, opt, &(toy_run){.steps = 4, .micro_batches = 2, .lr = 1e-2}, NULL);
        toy_read_params(&m, opt, stage == 0 ? ref : got);
        if (stage > 0) assert_true(dsc_test_max_rel_err(got, ref, toy_param_total(&m), 1e-3, "one rank") <= 1e-6);
        dsc_optimizer_destroy(opt);
        toy_model_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partition_rule),
        cmocka_unit_test(test_formula),
        cmocka_unit_test(test_model_size_matches_built_model),
        cmocka_unit_test(test_estimate_70b_on_512),
        cmocka_unit_test(test_one_rank_matches_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
