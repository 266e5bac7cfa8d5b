/* What ZeRO saves and what it sends, from the allocator's and the
 * communicator's counters on 2, 3 and 4 ranks:
 *  - per-rank bytes of parameters + gradients + optimizer state are within 5%
 *    of the ZeRO paper's formula for stages 0-3 (4Ψ + 4Ψ + 8Ψ, 4Ψ + 4Ψ +
 *    8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N), and the communication buffers stay bounded by
 *    the largest layer;
 *  - one step moves exactly: stage 1 and 2 a reduce-scatter and an all-gather
 *    of Ψ, stage 3 a reduce-scatter and two all-gathers (forward and
 *    backward) of Ψ, per rank as docs/comm.md's counting rule gives them for
 *    this rank's partition (stage 3: its piece of every parameter); with 4 micro-batches stage 2 reduce-scatters
 * 4Ψ (every micro-batch) and stage 1 still Ψ;
 *  - stage 3's stage3_param_persistence_threshold: parameters at or below it
 *    are gathered once per step instead of before every call (all-gather
 *    calls counted), take their whole size in parameter memory and none in
 *    the pool (allocator accounting), and training gives bitwise the same
 *    parameters as without;
 *  - stage 3's prefetch runs ahead: the next layer's all-gathers are still in
 *    flight (not yet completed, by the counters) while the current layer is
 *    called, and complete when the next layer is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsc/memory.h"
#include "test_mpi.h"
#include "zero_test_util.h"

/* Parameters large enough that the 64-element alignment gaps are negligible
 * against 5%, over 4 layers that share nothing. */
static void big_spec(toy_spec *spec) {
    static const int64_t sizes[] = {40000, 777, 65536, 30001, 64, 50000, 12345, 40960};
    static const int layers[4][3] = {{0, 1, -1}, {2, 3, 4}, {5, 6, -1}, {7, -1, -1}};
    *spec = (toy_spec){.n_params = 8, .n_layers = 4, .prefix = "big"};
    for (int i = 0; i < spec->n_params; i++)
        spec->sizes[i] = sizes[i];
    for (int l = 0; l < spec->n_layers; l++) {
        for (int j = 0; j < TOY_MAX_PARAMS; j++)
            spec->layer_params[l][j] = -1;
        for (int j = 0; j < 3 && layers[l][j] >= 0; j++)
            spec->layer_params[l][j] = layers[l][j];
    }
}

static int64_t largest_layer(toy_model *m) {
    int64_t most = 0;
    for (int l = 0; l < m->n_layers; l++) {
        int64_t n = 0;
        for (int j = 0; j < m->layers[l].n_params; j++)
            n += (dsc_param_numel(m->layers[l].params[j]) + 63) / 64 * 64;
        if (n > most) most = n;
    }
    return most;
}

static void test_memory_matches_formula(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    int N = dsc_comm_size(dp);
    for (int stage = 0; stage <= 3; stage++) {
        dsc_mem_stats before, after;
        dsc_mem_get_stats(&before);
        toy_model m;
        toy_spec spec;
        big_spec(&spec);
        toy_model_init(&m, &spec, dsc_comm_rank(dp));
        dsc_optimizer_options o = toy_options(&m, dp);
        o.reduce_bucket_size = 20000;
        dsc_zero_options zo = {stage, 1, 20000, 0, 0, 0};
        dsc_optimizer *opt;
        assert_ok(dsc_zero_create(&o, &zo, &opt));
        toy_train(&m, opt, &(toy_run){.steps = 1, .micro_batches = 2, .lr = 1e-3}, NULL);
        dsc_mem_get_stats(&after);
        double psi = (double)toy_param_total(&m);
        dsc_zero_memory f;
        dsc_zero_memory_formula(stage, psi, N, 8, &f);
        double measured[3], formula[3] = {f.params, f.grads, f.optim};
        for (int c = 0; c < 3; c++)
            measured[c] = (double)(after.current[c] - before.current[c]);
        double states = measured[0] + measured[1] + measured[2], want = formula[0] + formula[1] + formula[2];
        double comm = (double)(after.current[DSC_MEM_COMM] - before.current[DSC_MEM_COMM]);
        double bound = 4.0 * (double)(4 * largest_layer(&m));
        if (dsc_comm_rank(dp) == 0)
            printf("  stage %d, N %d: params %.0f (formula %.0f), grads %.0f (%.0f), optim %.0f (%.0f), total "
                   "%.4f of "
                   "the formula; comm buffers %.0f bytes (bound %.0f)\n",
                   stage, N, measured[0], formula[0], measured[1], formula[1], measured[2], formula[2],
                   states / want, comm, bound);
        assert_true(fabs(states - want) <= 0.05 * want);
        for (int c = 0; c < 3; c++)
            assert_true(fabs(measured[c] - formula[c]) <= 0.05 * formula[c]);
        assert_true(comm <= bound);
        dsc_optimizer_destroy(opt);
        toy_model_free(&m);
    }
    dsc_comm_free(dp);
}

static void expect_bytes(const dsc_comm_stats *st, dsc_comm_op op, double sent, double recv, const char *what,
                         bool print) {
    if (print)
        printf("  %-28s %-15s sent %lld (expected %.0f), received %lld (expected %.0f)\n", what,
               dsc_comm_op_name(op), (long long)st->bytes_sent[op], sent, (long long)st->bytes_recv[op], recv);
    assert_true((double)st->bytes_sent[op] == sent);
    assert_true((double)st->bytes_recv[op] == recv);
}

static void test_comm_volume(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    int N = dsc_comm_size(dp), r = dsc_comm_rank(dp);
    for (int stage = 1; stage <= 3; stage++)
        for (int M = 1; M <= 4; M += 3) {
            toy_model m;
            toy_spec spec;
            big_spec(&spec);
            toy_model_init(&m, &spec, r);
            dsc_optimizer_options o = toy_options(&m, dp);
            o.reduce_bucket_size = 30000;
            dsc_optimizer *opt;
            assert_ok(dsc_zero_create(&o, &(dsc_zero_options){stage, 1, 25000, 1 << 30, 1 << 30, 0}, &opt));
            dsc_comm_reset_stats(dp);
            toy_train(&m, opt, &(toy_run){.steps = 1, .micro_batches = M, .lr = 1e-3}, NULL);
            dsc_comm_stats st;
            dsc_comm_get_stats(dp, &st);
            /* Ψ and this rank's share c: the flat buffer (gaps included) and its range in stages 1 and 2; the
             * parameters and this rank's piece of each in stage 3 */
            double psi = 0, c = 0, e = 4.0;
            if (stage < 3) {
                int64_t begin, end;
                psi = (double)dsc_params_numel(m.store, DSC_PARAM_GROUP_DENSE);
                dsc_zero_partition((int64_t)psi, N, r, &begin, &end);
                c = (double)(end - begin);
            }
            for (int i = 0; i < dsc_params_count(m.store) && stage == 3; i++) {
                int64_t n = dsc_param_numel(dsc_params_at(m.store, i)), lo, hi;
                dsc_zero_param_piece(n, N, r, &lo, &hi);
                psi += (double)n;
                c += (double)(hi - lo);
            }
            double rs = stage == 1 ? 1 : M; /* stages 2 and 3 reduce every micro-batch's gradients */
            double ag = stage == 3 ? 2.0 * M : 1;
            char what[64];
            snprintf(what, sizeof what, "stage %d, N %d, M %d:", stage, N, M);
            expect_bytes(&st, DSC_COMM_OP_REDUCE_SCATTER, rs * (psi - c) * e, rs * (N - 1) * c * e, what, r == 0);
            expect_bytes(&st, DSC_COMM_OP_ALLGATHER, ag * (N - 1) * c * e, ag * (psi - c) * e, what, r == 0);
            /* besides: the one-float sums of squares of the norm */
            assert_int_equal(st.calls[DSC_COMM_OP_ALLREDUCE], 1);
            dsc_optimizer_destroy(opt);
            toy_model_free(&m);
        }
    dsc_comm_free(dp);
}

/* One stage 3 run of 2 steps, M 2: parameters after it, all-gather calls and
 * parameter / communication-buffer bytes held while the optimizer lives. */
typedef struct persist_run {
    int64_t gathers;
    int64_t param_bytes, comm_bytes;
} persist_run;

static void train_stage3(dsc_comm *dp, int64_t threshold, float *out, persist_run *r) {
    dsc_mem_stats before, after;
    dsc_mem_get_stats(&before);
    toy_model m;
    toy_spec spec;
    big_spec(&spec);
    toy_model_init(&m, &spec, dsc_comm_rank(dp));
    dsc_optimizer_options o = toy_options(&m, dp);
    o.reduce_bucket_size = 30000;
    dsc_optimizer *opt;
    assert_ok(dsc_zero_create(&o, &(dsc_zero_options){3, 1, 25000, 1 << 30, 1 << 30, threshold}, &opt));
    dsc_comm_reset_stats(dp);
    toy_train(&m, opt, &(toy_run){.steps = 2, .micro_batches = 2, .lr = 1e-2}, NULL);
    dsc_comm_stats st;
    dsc_comm_get_stats(dp, &st);
    dsc_mem_get_stats(&after);
    r->gathers = st.calls[DSC_COMM_OP_ALLGATHER];
    r->param_bytes = after.current[DSC_MEM_PARAMS] - before.current[DSC_MEM_PARAMS];
    r->comm_bytes = after.current[DSC_MEM_COMM] - before.current[DSC_MEM_COMM];
    toy_read_params(&m, opt, out);
    dsc_optimizer_destroy(opt);
    toy_model_free(&m);
}

static void test_persistence_threshold(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    toy_model m;
    toy_spec spec;
    big_spec(&spec);
    toy_model_init(&m, &spec, 0);
    int64_t total = toy_param_total(&m);
    toy_model_free(&m);
    float *ref = malloc((size_t)total * sizeof *ref), *got = malloc((size_t)total * sizeof *got);
    assert_non_null(ref);
    assert_non_null(got);
    persist_run none, some;
    train_stage3(dp, 0, ref, &none);
    /* 777, 64 and 12345 elements persist (layers 0, 1, 2); the five others are partitioned as before */
    const int64_t threshold = 12345, persistent_aligned = 832 + 64 + 12352;
    train_stage3(dp, threshold, got, &some);
    const int steps = 2, M = 2, params = 8, persistent = 3;
    if (dsc_comm_rank(dp) == 0)
        printf("  persistence threshold %lld, N %d: all-gathers %lld (none persistent: %lld), parameter bytes "
               "%lld (%lld), pool bytes %lld (%lld)\n",
               (long long)threshold, dsc_comm_size(dp), (long long)some.gathers, (long long)none.gathers,
               (long long)some.param_bytes, (long long)none.param_bytes, (long long)some.comm_bytes,
               (long long)none.comm_bytes);
    assert_int_equal(none.gathers, steps * 2 * M * params);
    assert_int_equal(some.gathers, steps * (2 * M * (params - persistent) + persistent));
    assert_int_equal(some.param_bytes - none.param_bytes, 4 * persistent_aligned);
    assert_true(some.comm_bytes < none.comm_bytes);
    assert_memory_equal(got, ref, (size_t)total * sizeof *ref);
    free(ref);
    free(got);
    dsc_comm_free(dp);
}

static int64_t gathers_done(dsc_comm *c) {
    dsc_comm_stats st;
    dsc_comm_get_stats(c, &st);
    return st.calls[DSC_COMM_OP_ALLGATHER];
}

static void test_prefetch_runs_ahead(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    toy_model m;
    toy_spec spec;
    big_spec(&spec); /* layers of 2, 3, 2 and 1 parameters */
    toy_model_init(&m, &spec, dsc_comm_rank(dp));
    dsc_optimizer_options o = toy_options(&m, dp);
    dsc_optimizer *opt;
    assert_ok(dsc_zero_create(&o, &(dsc_zero_options){3, 1, 0, 1 << 30, 1 << 30, 0}, &opt));
    dsc_comm_reset_stats(dp);
    const int64_t params[4] = {2, 3, 2, 1};
    int64_t done = 0;
    for (int l = 0; l < 4; l++) {
        assert_ok(dsc_optimizer_before_layer(opt, &m.layers[l], false));
        done += params[l];
        /* this layer's gathers completed; the next layer's (posted ahead) have not */
        if (dsc_comm_size(dp) > 1) assert_int_equal(gathers_done(dp), done);
        assert_ok(dsc_optimizer_after_layer(opt, &m.layers[l], false));
    }
    if (dsc_comm_rank(dp) == 0)
        printf("  prefetch: %lld all-gathers, each completed only when its layer ran\n",
               (long long)gathers_done(dp));
    dsc_optimizer_destroy(opt);
    toy_model_free(&m);
    dsc_comm_free(dp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_matches_formula),
        cmocka_unit_test(test_comm_volume),
        cmocka_unit_test(test_persistence_threshold),
        cmocka_unit_test(test_prefetch_runs_ahead),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
