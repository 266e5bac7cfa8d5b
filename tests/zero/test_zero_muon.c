/* Muon under ZeRO: zero_optimization.stage 1, 2 and 3 on N ranks train the
 * tiny GPT of the engine tests with Muon (2 micro-batches a rank, clipping
 * on) to the parameters (<= 1e-5) and losses (<= 1e-5 relative) of stage 0
 * on the same ranks and of one rank accumulating the same global batch,
 * with buckets small enough that matrices straddle the ranks' partitions
 * (stages 1, 2) and every matrix split over all ranks (stage 3), so
 * Newton-Schulz runs on matrices assembled from pieces on several ranks.
 * Stage 3's parameters are read from its value pieces, summed over the
 * ranks. The model has no attention biases: the key bias's gradient is
 * rounding noise (softmax is shift invariant), which the Adam group's
 * division by its own RMS (eps 1e-10) turns into steps of +-lr that differ
 * with the summation order (test_moe_train says the same of AdamW); without
 * it every layout agrees to about 1e-7.
 *
 * And the state Muon keeps: one momentum per element of the matrices it
 * orthogonalises and the two Adam moments per element of the rest, so the
 * optimizer's state entries and the allocator's optimizer-state bytes are
 * 4 x matrices + 8 x the rest (gaps of the flat layout aside), against 8 x
 * everything for AdamW. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/memory.h"
#include "dsc/zero.h"
#include "test_mpi.h"
#include "train_fixture.h"

enum { STEPS = 4 };

static int64_t optim_bytes(void) {
    dsc_mem_stats st;
    dsc_mem_get_stats(&st);
    return st.current[DSC_MEM_OPTIM];
}

typedef struct outcome {
    double loss[STEPS];
    float *params;
    int64_t count;
} outcome;

/* Every parameter's value, in declaration order: from the store, or (stage 3) from the value pieces. */
static float *params_of(dsc_trainer *t, dsc_comm *dp, int stage, int64_t *count) {
    if (stage < 3) return train_fixture_params(t, count);
    dsc_param_store *store = dsc_trainer_params(t);
    int n = dsc_params_count(store);
    int64_t *base = calloc((size_t)n + 1, sizeof *base);
    assert_non_null(base);
    for (int i = 0; i < n; i++)
        base[i + 1] = base[i] + dsc_param_numel(dsc_params_at(store, i));
    float *out = calloc((size_t)base[n], sizeof *out);
    assert_non_null(out);
    dsc_optimizer *opt = dsc_trainer_optimizer(t);
    for (int k = 0; k < dsc_optimizer_state_count(opt); k++) {
        dsc_optim_state st;
        dsc_optimizer_state_at(opt, k, &st);
        if (!st.is_value) continue;
        int i = 0;
        while (dsc_params_at(store, i) != st.param)
            i++;
        memcpy(out + base[i] + st.offset, st.local.data, dsc_tensor_nbytes(&st.local));
    }
    dsc_tensor all = dsc_tensor_view(out, DSC_DTYPE_F32, 1, &base[n], DSC_CPU);
    assert_ok(dsc_comm_allreduce(dp, &all, DSC_REDUCE_OP_SUM));
    *count = base[n];
    free(base);
    return out;
}

static void run(dsc_comm *dp, const char *data, int stage, const char *accum, outcome *out) {
    char set_stage[64];
    snprintf(set_stage, sizeof set_stage, "zero_optimization.stage=%d", stage);
    const char *over[] = {set_stage,
                          accum,
                          "optimizer.type=muon",
                          "optimizer.params.muon_lr=0.02",
                          "optimizer.params.adam_lr=0.003",
                          "model.qkv_bias=false",
                          "optimizer.params.weight_decay=0.1",
                          "zero_optimization.reduce_bucket_size=3000",
                          "zero_optimization.allgather_bucket_size=5000"};
    dsc_config cfg;
    train_fixture_config(&cfg, data, over, 9, dp ? dsc_comm_size(dp) : 1);
    dsc_trainer_options o = {&cfg, dp, false, NULL, false};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create_with_optimizer(&o, dsc_zero_make_optimizer, &t));
    for (int s = 0; s < STEPS; s++) {
        dsc_step_metrics m;
        assert_ok(dsc_engine_step(dsc_trainer_engine(t), &m));
        out->loss[s] = m.loss;
    }
    out->params = params_of(t, dp, stage, &out->count);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
}

static double worst_diff(const outcome *a, const outcome *b) {
    assert_int_equal(a->count, b->count);
    double worst = 0;
    for (int64_t i = 0; i < a->count; i++)
        worst = fmax(worst, fabs((double)a->params[i] - (double)b->params[i]));
    return worst;
}

static void test_stages_match(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    const int size = dsc_comm_size(dp), rank = dsc_comm_rank(dp);
    char data[128], accum_one[64];
    snprintf(data, sizeof data, "/tmp/dsc_test_zero_muon_%d.tok", (int)getpid());
    train_fixture_tokens(data, 20000);
    snprintf(accum_one, sizeof accum_one, "gradient_accumulation_steps=%d", 2 * size);
    outcome ref, one;
    run(dp, data, 0, "gradient_accumulation_steps=2", &ref);
    run(NULL, data, 0, accum_one, &one);
    double to_one = worst_diff(&ref, &one);
    if (rank == 0) printf("  stage 0 on %d ranks vs 1 rank: max |param diff| %.3e\n", size, to_one);
    assert_true(to_one <= 1e-5);
    for (int stage = 1; stage <= 3; stage++) {
        outcome z;
        run(dp, data, stage, "gradient_accumulation_steps=2", &z);
        double worst = worst_diff(&z, &ref), worst_one = worst_diff(&z, &one), worst_loss = 0;
        for (int s = 0; s < STEPS; s++)
            worst_loss = fmax(worst_loss, fabs(z.loss[s] - one.loss[s]) / fabs(one.loss[s]));
        if (rank == 0)
            printf("  muon, stage %d on %d ranks: max |param diff| %.3e vs stage 0, %.3e vs 1 rank; "
                   "loss rel %.2e (%.4f -> %.4f)\n",
                   stage, size, worst, worst_one, worst_loss, z.loss[0], z.loss[STEPS - 1]);
        assert_true(worst <= 1e-5);
        assert_true(worst_one <= 1e-5);
        assert_true(worst_loss <= 1e-5);
        assert_true(z.loss[STEPS - 1] < z.loss[0]);
        free(z.params);
    }
    free(ref.params);
    free(one.params);
    unlink(data);
    dsc_comm_free(dp);
}

/* State elements by kind over this rank's entries, and the allocator's optimizer-state bytes. */
static void state_of(dsc_comm *dp, const char *data, const char *type, int stage, int64_t *muon_elems,
                     int64_t *adam_elems, int64_t *first, int64_t *second, int64_t *bytes) {
    char set_type[64], set_stage[64];
    snprintf(set_type, sizeof set_type, "optimizer.type=%s", type);
    snprintf(set_stage, sizeof set_stage, "zero_optimization.stage=%d", stage);
    const char *over[] = {set_type, set_stage, "zero_optimization.reduce_bucket_size=3000"};
    dsc_config cfg;
    train_fixture_config(&cfg, data, over, 3, dsc_comm_size(dp));
    int64_t before = optim_bytes();
    dsc_trainer_options o = {&cfg, dp, false, NULL, false};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create_with_optimizer(&o, dsc_zero_make_optimizer, &t));
    dsc_step_metrics m;
    assert_ok(dsc_engine_step(dsc_trainer_engine(t), &m)); /* scratch of the step is freed again */
    *bytes = optim_bytes() - before;
    *muon_elems = *adam_elems = *first = *second = 0;
    dsc_optimizer *opt = dsc_trainer_optimizer(t);
    for (int k = 0; k < dsc_optimizer_state_count(opt); k++) {
        dsc_optim_state st;
        dsc_optimizer_state_at(opt, k, &st);
        if (!st.param || st.is_value) continue;
        int64_t n = dsc_tensor_numel(&st.local);
        if (strncmp(st.name, "exp_avg_sq/", 11) == 0) {
            *second += n;
        } else {
            *first += n;
            if (dsc_optim_uses_muon(st.param))
                *muon_elems += n;
            else
                *adam_elems += n;
        }
    }
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
}

static void test_state_bytes(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    char data[128];
    snprintf(data, sizeof data, "/tmp/dsc_test_zero_muon_state_%d.tok", (int)getpid());
    train_fixture_tokens(data, 20000);
    for (int stage = 0; stage <= 3; stage++) {
        int64_t mu, ad, first, second, bytes, amu, aad, afirst, asecond, abytes;
        state_of(dp, data, "muon", stage, &mu, &ad, &first, &second, &bytes);
        state_of(dp, data, "adamw", stage, &amu, &aad, &afirst, &asecond, &abytes);
        if (dsc_comm_rank(dp) == 0)
            printf("  stage %d: muon state %lld bytes (%lld matrix elements x 4 + %lld others x 8), "
                   "adamw %lld bytes\n",
                   stage, (long long)bytes, (long long)mu, (long long)ad, (long long)abytes);
        assert_true(mu > 0 && ad > 0);
        assert_int_equal(first, mu + ad);
        assert_int_equal(second, ad); /* no exp_avg_sq for the matrices Muon orthogonalises */
        assert_int_equal(afirst, asecond);
        assert_int_equal(afirst, first); /* the same elements on this rank */
        int64_t want = 4 * mu + 8 * ad;
        /* the flat layout's alignment gaps (64 elements per parameter) at most */
        assert_true(bytes >= want && bytes <= want + 2 * 4 * 64 * 64);
        assert_true(abytes >= 8 * (mu + ad));
        assert_true(bytes < abytes);
    }
    unlink(data);
    dsc_comm_free(dp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_match),
        cmocka_unit_test(test_state_bytes),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
