/* The FLOPs profiler: per-layer FLOPs of a training step equal the formula
 * for the tiny GPT (2 blocks, C 32, 2 heads, F 128, vocab 256, T 16, micro
 * batch 2, 2 micro-batches), each layer called once per micro-batch; and
 * the engine writes DeepSpeed's report for the configured step only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/nn.h"
#include "test_mpi.h"
#include "train_fixture.h"

enum { C = 32, NH = 2, HS = 16, F = 128, V = 256, T = 16, B = 2, M = 2, N = B * T };

/* Forward FLOPs of one micro-batch (2 per multiply-add). */
static int64_t linear(int64_t in, int64_t out) {
    return 2LL * N * in * out;
}
static int64_t causal_product(void) { /* one (T x T) x (T x HS) product over the keys j <= i, every head */
    return 2LL * B * NH * (T * (T + 1) / 2) * HS;
}
static int64_t block_forward(void) {
    return 4 * linear(C, C) + linear(C, F) + linear(F, C) + 2 * causal_product();
}
static int64_t block_backward(void) { /* dx and dw of each linear; attention recomputes q k^T, then 4 products */
    return 2 * (4 * linear(C, C) + linear(C, F) + linear(F, C)) + 5 * causal_product();
}

static const dsc_layer_profile *row_named(const dsc_layer_profile *rows, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].name, name) == 0) return &rows[i];
    fail_msg("no profile row for layer %s", name);
    return NULL;
}

static void test_layer_flops_match_formula(void **state) {
    (void)state;
    char data[128], out[128], set_out[192];
    snprintf(data, sizeof data, "/tmp/dsc_test_flops_%d.tok", (int)getpid());
    snprintf(out, sizeof out, "/tmp/dsc_test_flops_%d.txt", (int)getpid());
    snprintf(set_out, sizeof set_out, "flops_profiler.output_file=%s", out);
    train_fixture_tokens(data, 20000);
    const char *over[] = {"flops_profiler.enabled=true", "flops_profiler.profile_step=1", set_out};
    dsc_config cfg;
    train_fixture_config(&cfg, data, over, 3, 1);
    dsc_trainer_options o = {&cfg, NULL, true, NULL, false};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create(&o, &t));
    dsc_engine *e = dsc_trainer_engine(t);

    dsc_step_metrics m;
    assert_ok(dsc_engine_step(e, &m)); /* step 1: not profiled */
    assert_int_equal(access(out, F_OK), -1);
    assert_ok(dsc_engine_step(e, &m)); /* step 2: profile_step 1 steps done */
    char *report = dsc_test_read_file(out);
    assert_non_null(report);
    assert_non_null(strstr(report, "Profile summary at step 2"));
    assert_non_null(strstr(report, "Detailed profile"));
    assert_non_null(strstr(report, "layers.1"));
    free(report);
    unlink(out);
    assert_ok(dsc_engine_step(e, &m)); /* step 3: not profiled again */
    assert_int_equal(access(out, F_OK), -1);

    /* the rows themselves, around one more step */
    dsc_layer_profile_begin();
    assert_ok(dsc_engine_step(e, &m));
    dsc_layer_profile *rows;
    int n;
    assert_ok(dsc_layer_profile_end(&rows, &n));
    const char *blocks[] = {"layers.0", "layers.1"};
    for (int i = 0; i < 2; i++) {
        const dsc_layer_profile *r = row_named(rows, n, blocks[i]);
        printf("  %s: fwd %lld flops (formula %lld), bwd %lld (formula %lld), %d + %d calls\n", r->name,
               (long long)r->fwd_flops, (long long)(M * block_forward()), (long long)r->bwd_flops,
               (long long)(M * block_backward()), r->fwd_calls, r->bwd_calls);
        assert_int_equal(r->fwd_calls, M);
        assert_int_equal(r->bwd_calls, M);
        assert_int_equal(r->fwd_flops, M * block_forward());
        assert_int_equal(r->bwd_flops, M * block_backward());
        assert_int_equal(r->depth, 0);
        assert_true(r->fwd_s > 0 && r->bwd_s > 0);
        /* ln1, q/k/v/o (weight + bias), ln2, fc, proj (weight + bias) */
        assert_int_equal(r->params, 2 * C + 4 * (C * C + C) + 2 * C + (C * F + F) + (F * C + C));
    }
    const dsc_layer_profile *head = row_named(rows, n, "head");
    assert_int_equal(head->fwd_flops, M * linear(C, V));
    assert_int_equal(head->bwd_flops, M * 2 * linear(C, V));
    assert_int_equal(row_named(rows, n, "embed")->fwd_flops, 0);
    free(rows);

    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    unlink(data);
}

/* A profile_step the run never reaches is refused, not silently skipped. */
static void test_unreachable_step_refused(void **state) {
    (void)state;
    dsc_config cfg;
    const char *over[] = {"flops_profiler.enabled=true", "flops_profiler.profile_step=5", "train.steps=5"};
    dsc_status s = dsc_config_parse_string("{}", "p.json", over, 3, &cfg);
    assert_non_null(s);
    assert_non_null(strstr(dsc_status_message(s), "\"flops_profiler.profile_step\" 5 is never reached"));
    dsc_status_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_flops_match_formula),
        cmocka_unit_test(test_unreachable_step_refused),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
