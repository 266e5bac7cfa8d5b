/* Partitioning and the PipelineModule, single process:
 *  - uniform: DeepSpeed's rule (first n mod P parts one larger; n <= P);
 *  - balanced: pipe.md's worked examples, and the spread it reaches against
 *    brute force over every split of 300 small random weight lists (the
 *    dynamic program keeps one (heaviest, lightest) pair per cell, as
 *    DeepSpeed's, so exactness is checked rather than assumed);
 *  - the module on a tiny GPT: uniform / parameters / type:REGEX cuts, tied
 *    embedding flagged, parameter totals, the printed summary;
 *  - clear errors: more stages than layers, interleaving with a layer count
 *    not divisible by P * v, a regex matching nothing, an unknown method. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/pipe.h"
#include "test_mpi.h"

static void expect_bounds(const int *got, const int *want, int parts) {
    for (int p = 0; p <= parts; p++)
        assert_int_equal(got[p], want[p]);
}

static void test_uniform(void **state) {
    (void)state;
    int b[9];
    dsc_pipe_partition_uniform(10, 4, b);
    expect_bounds(b, (int[]){0, 3, 6, 8, 10}, 4);
    dsc_pipe_partition_uniform(8, 4, b);
    expect_bounds(b, (int[]){0, 2, 4, 6, 8}, 4);
    dsc_pipe_partition_uniform(3, 5, b);
    expect_bounds(b, (int[]){0, 1, 2, 3, 3, 3}, 5);
}

static void test_balanced_examples(void **state) {
    (void)state;
    int b[17];
    const double ones[5] = {1, 1, 1, 1, 1};
    assert_ok(dsc_pipe_partition_balanced(ones, 5, 4, b));
    expect_bounds(b, (int[]){0, 2, 3, 4, 5}, 4); /* pipe.md: [1]*5 into 4 */
    /* 42 transformer layers among 5 zero-weight ones into 16 stages: 3 per
     * stage on stages 0-9, 2 on stages 10-15 (pipe.md). */
    double w[47] = {0};
    for (int i = 2; i < 44; i++)
        w[i] = 1;
    assert_ok(dsc_pipe_partition_balanced(w, 47, 16, b));
    for (int p = 0; p < 16; p++) {
        int blocks = 0;
        for (int i = b[p]; i < b[p + 1]; i++)
            blocks += w[i] > 0;
        assert_int_equal(blocks, p < 10 ? 3 : 2);
    }
    assert_err(dsc_pipe_partition_balanced((double[]){1, -1, 1}, 3, 2, b), DSC_ERR_INVALID, "weight 1 is -1");
}

/* The smallest spread (heaviest - lightest part) over every split of n
 * items into k non-empty parts. */
static double brute(const double *w, int n, int k) {
    int cut[9];
    double best = 1e300;
    for (int i = 0; i < k; i++)
        cut[i] = i;
    cut[k] = n;
    for (;;) {
        double hi = -1e300, lo = 1e300;
        for (int p = 0; p < k; p++) {
            double sum = 0;
            for (int i = cut[p]; i < cut[p + 1]; i++)
                sum += w[i];
            hi = sum > hi ? sum : hi;
            lo = sum < lo ? sum : lo;
        }
        best = hi - lo < best ? hi - lo : best;
        int p = k - 1; /* the next combination of cut[1..k-1] */
        while (p >= 1 && cut[p] == n - (k - p))
            p--;
        if (p < 1) return best;
        cut[p]++;
        for (int q = p + 1; q < k; q++)
            cut[q] = cut[q - 1] + 1;
    }
}

static void test_balanced_brute_force(void **state) {
    (void)state;
    srand(7);
    for (int trial = 0; trial < 300; trial++) {
        int n = 2 + rand() % 9, k = 1 + rand() % (n < 6 ? n : 6);
        double w[12];
        for (int i = 0; i < n; i++)
            w[i] = (double)(rand() % 6);
        int got[9];
        assert_ok(dsc_pipe_partition_balanced(w, n, k, got));
        double cost = brute(w, n, k);
        double hi = -1e300, lo = 1e300;
        for (int p = 0; p < k; p++) {
            double sum = 0;
            assert_true(got[p + 1] > got[p]);
            for (int i = got[p]; i < got[p + 1]; i++)
                sum += w[i];
            hi = sum > hi ? sum : hi;
            lo = sum < lo ? sum : lo;
        }
        assert_true(hi - lo == cost);
    }
}

static dsc_status gpt_module(int n_layer, int P, int v, const char *method, dsc_pipe_module **m) {
    dsc_model_config mc;
    dsc_model_config_defaults(&mc, DSC_ARCH_GPT);
    mc.n_layer = n_layer, mc.d_model = 32, mc.n_head = 2, mc.n_kv_head = 2, mc.d_ff = 64, mc.vocab_size = 64,
    mc.seq_len = 16;
    dsc_pipe_layer_spec *layers;
    int n;
    DSC_TRY(dsc_nn_register_dense_layers());
    DSC_TRY(dsc_pipe_model_layers(&mc, &layers, &n));
    dsc_pipe_module_options o = {.layers = layers,
                                 .n_layers = n,
                                 .stages = P,
                                 .chunks = v,
                                 .partition_method = method,
                                 .model = &mc,
                                 .width = 0,
                                 .expert_parallel = 1};
    dsc_status s = dsc_pipe_module_create(&o, m);
    free(layers);
    return s;
}

static void test_module(void **state) {
    (void)state;
    dsc_pipe_module *m;
    int first, end;
    /* 8 layers (embedding, 6 blocks, head) */
    assert_ok(gpt_module(6, 4, 1, "uniform", &m));
    assert_string_equal(dsc_pipe_module_layer(m, 0)->tied, "embed.wte.weight");
    assert_string_equal(dsc_pipe_module_layer(m, 7)->tied, "embed.wte.weight");
    assert_string_equal(dsc_pipe_module_layer(m, 3)->tied, "");
    dsc_pipe_module_range(m, 3, 0, &first, &end);
    assert_int_equal(first, 6), assert_int_equal(end, 8);
    int64_t sum = 0;
    for (int i = 0; i < 8; i++)
        sum += dsc_pipe_module_layer_params(m, i);
    /* The tied matrix (V x C) is counted by both layers that read it. */
    assert_int_equal(sum, dsc_pipe_module_unique_params(m) + 64 * 32);
    dsc_pipe_module_print_summary(m, 2, 16, stdout);
    dsc_pipe_module_destroy(m);

    /* type:block balances the 6 blocks 2/2/2; embedding and head ride along. */
    assert_ok(gpt_module(6, 3, 1, "type:^block$", &m));
    for (int s = 0; s < 3; s++) {
        dsc_pipe_module_range(m, s, 0, &first, &end);
        int blocks = 0;
        for (int i = first; i < end; i++)
            blocks += strcmp(dsc_pipe_module_layer(m, i)->spec.type, "block") == 0;
        assert_int_equal(blocks, 2);
    }
    dsc_pipe_module_destroy(m);

    /* parameters: the big embedding (V*C + T*C) and head weigh as blocks do here. */
    assert_ok(gpt_module(6, 2, 1, "parameters", &m));
    dsc_pipe_module_print_summary(m, 2, 16, stdout);
    dsc_pipe_module_destroy(m);

    /* interleaved: virtual stage j = c * P + s */
    assert_ok(gpt_module(6, 2, 2, "uniform", &m));
    dsc_pipe_module_range(m, 0, 1, &first, &end);
    assert_int_equal(first, 4), assert_int_equal(end, 6);
    dsc_pipe_module_print_summary(m, 2, 16, stdout);
    dsc_pipe_module_destroy(m);
}

static void test_module_errors(void **state) {
    (void)state;
    dsc_pipe_module *m = NULL;
    assert_err(gpt_module(2, 5, 1, "uniform", &m), DSC_ERR_CONFIG, "model has only 4 layers");
    assert_err(gpt_module(5, 2, 2, "uniform", &m), DSC_ERR_CONFIG,
               "needs a layer count divisible by 4, the model has 7");
    assert_err(gpt_module(4, 2, 1, "type:attention", &m), DSC_ERR_CONFIG, "no layer type matches");
    assert_err(gpt_module(4, 2, 1, "profile", &m), DSC_ERR_CONFIG,
               "expected \"uniform\", \"parameters\" or \"type:REGEX\"");
    assert_null(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_balanced_examples),
        cmocka_unit_test(test_balanced_brute_force),
        cmocka_unit_test(test_module),
        cmocka_unit_test(test_module_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
