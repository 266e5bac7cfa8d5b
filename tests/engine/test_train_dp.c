/* Data parallelism equals gradient accumulation: 5 steps on N ranks (M = 2
 * micro-batches each) give the same parameters and losses as 1 rank
 * accumulating M * N micro-batches over the same global batch, computed on
 * every rank with no communicator. Also with small reduction buckets, so
 * buckets are reduced during backward; and a repeated multi-rank run is
 * bitwise identical. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/comm.h"
#include "test_mpi.h"
#include "train_fixture.h"

static void run(dsc_comm *dp, const char *data, const char *const *overrides, int n, int dp_size, double *losses,
                float **params, int64_t *count) {
    dsc_config cfg;
    train_fixture_config(&cfg, data, overrides, n, dp_size);
    dsc_trainer_options o = {&cfg, dp, false, NULL, false};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create(&o, &t));
    for (int s = 0; s < 5; s++) {
        dsc_step_metrics m;
        assert_ok(dsc_engine_step(dsc_trainer_engine(t), &m));
        losses[s] = m.loss;
    }
    *params = train_fixture_params(t, count);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
}

static void test_dp_equals_accumulation(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int size = dsc_comm_size(world);
    char data[128];
    snprintf(data, sizeof data, "/tmp/dsc_test_train_dp_%d.tok", (int)getpid());
    train_fixture_tokens(data, 20000);

    char accum[64];
    snprintf(accum, sizeof accum, "gradient_accumulation_steps=%d", 2 * size);
    const char *ref_over[] = {accum};
    double ref_loss[5], dp_loss[5];
    float *ref, *got;
    int64_t n_ref, n_got;
    run(NULL, data, ref_over, 1, 1, ref_loss, &ref, &n_ref);

    const char *bucket_sizes[] = {"zero_optimization.reduce_bucket_size=500000000",
                                  "zero_optimization.reduce_bucket_size=1000"};
    double first_loss[5];
    float *first = NULL;
    for (int b = 0; b < 2; b++) {
        run(world, data, &bucket_sizes[b], 1, size, dp_loss, &got, &n_got);
        assert_int_equal(n_got, n_ref);
        double worst = 0;
        for (int64_t i = 0; i < n_ref; i++)
            worst = fmax(worst, fabs((double)got[i] - (double)ref[i]));
        double worst_loss = 0;
        for (int s = 0; s < 5; s++)
            worst_loss = fmax(worst_loss, fabs(dp_loss[s] - ref_loss[s]));
        printf(
            "  %d ranks (%s) vs 1 rank x %d micro-batches: max |param diff| %.3e over %lld, max |loss diff| %.3e"
            " (losses %.4f -> %.4f)\n",
            size, bucket_sizes[b], 2 * size, worst, (long long)n_ref, worst_loss, ref_loss[0], ref_loss[4]);
        assert_true(worst <= 1e-5);
        assert_true(worst_loss <= 1e-5);
        if (b == 0) {
            first = got;
            memcpy(first_loss, dp_loss, sizeof dp_loss);
        } else {
            free(got);
        }
    }
    /* The same multi-rank run again: bit for bit the same losses and parameters. */
    run(world, data, &bucket_sizes[0], 1, size, dp_loss, &got, &n_got);
    assert_memory_equal(dp_loss, first_loss, sizeof dp_loss);
    assert_memory_equal(got, first, (size_t)n_got * sizeof *got);
    free(got);
    free(first);
    assert_true(ref_loss[4] < ref_loss[0]); /* it learns */
    free(ref);
    unlink(data);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dp_equals_accumulation),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
