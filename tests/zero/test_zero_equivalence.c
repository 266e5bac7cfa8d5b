/* ZeRO stages 1-3 against the plain optimizer (stage 0) on 2, 3 (uneven
 * partitions) and 4 data-parallel ranks: 10 steps with gradients that depend
 * on the values, rank and micro-batch, gradient accumulation 1 and 4,
 * clipping active, several bucket sizes and stage 3 pool sizes, must give the
 * same parameters (<= 1e-6 relative) and optimizer state; the checkpoint view
 * of the shards covers every element exactly once across ranks. Also the
 * pipeline's hook order (1F1B interleaving, reduction deferred) for stages 1
 * and 2, and the refusal of stage 3 with a pipeline. The other update rules
 * (Adam with L2 decay, Lamb, whose trust ratio needs norms of parameters split
 * over ranks, and Lion) match the plain optimizer in every stage too.
 * zero_optimization.overlap_comm gives bitwise the same parameters and
 * state as blocking reduction in every stage (plain included), and does
 * overlap: at the end of backward reductions are still in flight. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_mpi.h"
#include "zero_test_util.h"

typedef struct variant {
    int stage;
    int micro_batches;
    int64_t reduce_bucket, allgather_bucket;
    int64_t max_live, prefetch;
    int pipeline_stages;
    bool interleave;
    dsc_optimizer_type type;
} variant;

static void train(dsc_comm *dp, const dsc_zero_options *zo, int64_t reduce_bucket, dsc_optimizer_type type,
                  bool overlap, const toy_run *run, float *out, dsc_optimizer **keep, toy_model *m) {
    toy_spec spec;
    toy_spec_default(&spec);
    toy_model_init(m, &spec, dsc_comm_rank(dp));
    dsc_optimizer_options o = toy_options(m, dp);
    o.reduce_bucket_size = reduce_bucket;
    o.overlap_comm = overlap;
    o.hparams.type = type;
    o.hparams.l2_decay = type == DSC_OPTIMIZER_TYPE_ADAM;
    o.hparams.max_coeff = 10.0f, o.hparams.min_coeff = 0.01f;
    dsc_optimizer *opt;
    assert_ok(dsc_zero_create(&o, zo, &opt));
    bool clipped;
    toy_train(m, opt, run, &clipped);
    assert_true(clipped);
    toy_read_params(m, opt, out);
    *keep = opt;
}

/* Every element of every parameter's exp_avg appears in exactly one rank's
 * state entries, with the plain optimizer's value. */
static void check_states(dsc_comm *dp, dsc_optimizer *zero, toy_model *zm, dsc_optimizer *plain) {
    int64_t total = toy_param_total(zm);
    float *cover = calloc((size_t)total, sizeof *cover);
    assert_non_null(cover);
    double worst = 0;
    for (int k = 0; k < dsc_optimizer_state_count(zero); k++) {
        dsc_optim_state st;
        dsc_optimizer_state_at(zero, k, &st);
        if (!st.param || strncmp(st.name, "exp_avg/", 8) != 0) continue;
        int64_t base = 0;
        int i = 0;
        while (dsc_params_at(zm->store, i) != st.param)
            base += dsc_param_numel(dsc_params_at(zm->store, i++));
        int64_t n = dsc_tensor_numel(&st.local);
        assert_true(st.offset >= 0 && st.offset + n <= dsc_param_numel(st.param));
        /* the plain optimizer's exp_avg of the same parameter */
        const float *ref = NULL;
        for (int q = 0; q < dsc_optimizer_state_count(plain); q++) {
            dsc_optim_state ps;
            dsc_optimizer_state_at(plain, q, &ps);
            if (strcmp(ps.name, st.name) == 0) ref = (const float *)ps.local.data + st.offset;
        }
        assert_non_null(ref);
        const float *mine = st.local.data;
        for (int64_t e = 0; e < n; e++) {
            cover[base + st.offset + e] += 1.0f;
            double d = fabs((double)mine[e] - (double)ref[e]) / (fabs((double)ref[e]) + 1e-3);
            if (d > worst) worst = d;
        }
    }
    dsc_tensor t = dsc_tensor_view(cover, DSC_DTYPE_F32, 1, &total, DSC_CPU);
    assert_ok(dsc_comm_allreduce(dp, &t, DSC_REDUCE_OP_SUM));
    for (int64_t e = 0; e < total; e++)
        assert_true(cover[e] == 1.0f);
    assert_true(worst < 1e-4);
    free(cover);
}

static void run_variant(dsc_comm *dp, const variant *v) {
    toy_run run = {.steps = 10, .micro_batches = v->micro_batches, .interleave = v->interleave, .lr = 1e-2};
    toy_model pm, zm;
    toy_spec spec;
    toy_spec_default(&spec);
    toy_model_init(&pm, &spec, dsc_comm_rank(dp));
    int64_t total = toy_param_total(&pm);
    toy_model_free(&pm);
    float *ref = malloc((size_t)total * sizeof *ref), *got = malloc((size_t)total * sizeof *got);
    assert_non_null(ref);
    assert_non_null(got);
    dsc_optimizer *plain, *zero;
    dsc_zero_options z0 = {.stage = 0, .pipeline_stages = 1};
    train(dp, &z0, 0, v->type, false, &run, ref, &plain, &pm);
    dsc_zero_options zo = {
        .stage = v->stage,
        .pipeline_stages = v->pipeline_stages,
        .allgather_bucket_size = v->allgather_bucket,
        .stage3_max_live_parameters = v->max_live,
        .stage3_prefetch_bucket_size = v->prefetch,
    };
    train(dp, &zo, v->reduce_bucket, v->type, false, &run, got, &zero, &zm);
    char what[128];
    snprintf(what, sizeof what, "type %d, stage %d, dp %d, M %d, buckets %lld/%lld%s", (int)v->type, v->stage,
             dsc_comm_size(dp), v->micro_batches, (long long)v->reduce_bucket, (long long)v->allgather_bucket,
             v->interleave ? ", 1F1B" : "");
    assert_true(dsc_test_max_rel_err(got, ref, total, 1e-3, what) <= 1e-6);
    check_states(dp, zero, &zm, plain);
    dsc_optimizer_destroy(zero);
    dsc_optimizer_destroy(plain);
    toy_model_free(&zm);
    toy_model_free(&pm);
    free(ref);
    free(got);
}

static void test_stages_match_plain(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    for (int stage = 1; stage <= 3; stage++)
        for (int M = 1; M <= 4; M += 3) {
            /* one bucket per group, then small buckets that split parameters */
            run_variant(dp, &(variant){stage, M, 0, 0, 1 << 30, 1 << 30, 1, false, DSC_OPTIMIZER_TYPE_ADAMW});
            run_variant(dp, &(variant){stage, M, 300, 500, 0, 0, 1, false, DSC_OPTIMIZER_TYPE_ADAMW});
        }
    dsc_comm_free(dp);
}

static void test_rules_match_plain(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    const dsc_optimizer_type types[] = {DSC_OPTIMIZER_TYPE_ADAM, DSC_OPTIMIZER_TYPE_LAMB, DSC_OPTIMIZER_TYPE_LION};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int stage = 1; stage <= 3; stage++) /* small buckets: parameters split over ranks */
            run_variant(dp, &(variant){stage, 1, 300, 500, 0, 0, 1, false, types[t]});
    dsc_comm_free(dp);
}

static void test_pipeline_order(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    for (int stage = 1; stage <= 2; stage++) {
        run_variant(dp, &(variant){stage, 4, 700, 0, 0, 0, 2, true, DSC_OPTIMIZER_TYPE_ADAMW});
        run_variant(dp, &(variant){stage, 4, 0, 0, 0, 0, 1, true,
                                   DSC_OPTIMIZER_TYPE_ADAMW}); /* per-micro-batch reduction, same order */
    }
    run_variant(dp, &(variant){3, 4, 0, 0, 1 << 30, 1 << 30, 1, true, DSC_OPTIMIZER_TYPE_ADAMW});
    dsc_comm_free(dp);
}

/* Reduce-scatter / all-reduce calls completed when backward ends (before_reduce). */
static void count_reductions(toy_model *m, void *ctx) {
    (void)m;
    int64_t *out = ctx;
    dsc_comm_stats st;
    dsc_comm_get_stats((dsc_comm *)(intptr_t)out[1], &st);
    out[0] = st.calls[DSC_COMM_OP_REDUCE_SCATTER] + st.calls[DSC_COMM_OP_ALLREDUCE];
}

/* The optimizer's state entries, back to back. */
static float *state_copy(dsc_optimizer *opt, int64_t *n) {
    *n = 0;
    for (int k = 0; k < dsc_optimizer_state_count(opt); k++) {
        dsc_optim_state st;
        dsc_optimizer_state_at(opt, k, &st);
        *n += (int64_t)dsc_tensor_nbytes(&st.local);
    }
    char *out = malloc((size_t)*n + 1), *at = out;
    assert_non_null(out);
    for (int k = 0; k < dsc_optimizer_state_count(opt); k++) {
        dsc_optim_state st;
        dsc_optimizer_state_at(opt, k, &st);
        memcpy(at, st.local.data, dsc_tensor_nbytes(&st.local));
        at += dsc_tensor_nbytes(&st.local);
    }
    return (float *)out;
}

static void test_overlap_matches_blocking(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    toy_model m;
    toy_spec spec;
    toy_spec_default(&spec);
    toy_model_init(&m, &spec, 0);
    int64_t total = toy_param_total(&m);
    toy_model_free(&m);
    float *ref = malloc((size_t)total * sizeof *ref), *got = malloc((size_t)total * sizeof *got);
    assert_non_null(ref);
    assert_non_null(got);
    for (int stage = 0; stage <= 3; stage++)
        for (int pp = 1; pp <= (stage < 3 ? 2 : 1); pp++)
            for (int M = 1; M <= 4; M += 3)
                for (int64_t bucket = 0; bucket <= 300; bucket += 300) {
                    dsc_zero_options zo = {stage, pp, 500, 1 << 30, 1 << 30, 0};
                    int64_t done_at_end[2][2] = {{0, (int64_t)(intptr_t)dp}, {0, (int64_t)(intptr_t)dp}};
                    dsc_optimizer *opt[2];
                    toy_model tm[2];
                    for (int overlap = 0; overlap < 2; overlap++) {
                        toy_run run = {.steps = 3,
                                       .micro_batches = M,
                                       .interleave = pp > 1,
                                       .lr = 1e-2,
                                       .before_reduce = count_reductions,
                                       .ctx = done_at_end[overlap]};
                        dsc_comm_reset_stats(dp);
                        train(dp, &zo, bucket, DSC_OPTIMIZER_TYPE_ADAMW, overlap, &run, overlap ? got : ref,
                              &opt[overlap], &tm[overlap]);
                    }
                    char what[96];
                    snprintf(what, sizeof what, "overlap_comm, stage %d, pp %d, M %d, bucket %lld: ", stage, pp, M,
                             (long long)bucket);
                    assert_memory_equal(got, ref, (size_t)total * sizeof *ref);
                    int64_t n_ref, n_got;
                    float *s_ref = state_copy(opt[0], &n_ref), *s_got = state_copy(opt[1], &n_got);
                    assert_int_equal(n_ref, n_got);
                    assert_memory_equal(s_got, s_ref, (size_t)n_ref);
                    /* reduced during backward (no pipeline): some reductions still in flight when it ends */
                    if (pp == 1 && dsc_comm_size(dp) > 1) {
                        if (dsc_comm_rank(dp) == 0)
                            printf("  %sreductions complete when backward ends: %lld blocking, %lld overlapped\n",
                                   what, (long long)done_at_end[0][0], (long long)done_at_end[1][0]);
                        assert_true(done_at_end[1][0] < done_at_end[0][0]);
                    }
                    free(s_ref);
                    free(s_got);
                    for (int k = 0; k < 2; k++) {
                        dsc_optimizer_destroy(opt[k]);
                        toy_model_free(&tm[k]);
                    }
                }
    free(ref);
    free(got);
    dsc_comm_free(dp);
}

static void test_pipeline_check(void **state) {
    (void)state;
    assert_ok(dsc_zero_check_pipeline(1, 4));
    assert_ok(dsc_zero_check_pipeline(2, 4));
    assert_ok(dsc_zero_check_pipeline(3, 1));
    assert_err(dsc_zero_check_pipeline(3, 2), DSC_ERR_UNSUPPORTED,
               "zero_optimization.stage 3 with pipeline.stages = 2 is not supported");
    assert_err(dsc_zero_check_pipeline(4, 1), DSC_ERR_INVALID, "zero_optimization.stage 4");
    toy_model m;
    toy_spec spec;
    toy_spec_default(&spec);
    toy_model_init(&m, &spec, 0);
    dsc_optimizer_options o = toy_options(&m, NULL);
    dsc_optimizer *opt;
    assert_err(dsc_zero_create(&o, &(dsc_zero_options){.stage = 3, .pipeline_stages = 4}, &opt),
               DSC_ERR_UNSUPPORTED, "tied-weight reduction");
    toy_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_check),           cmocka_unit_test(test_stages_match_plain),
        cmocka_unit_test(test_rules_match_plain),        cmocka_unit_test(test_pipeline_order),
        cmocka_unit_test(test_overlap_matches_blocking),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
