/* ZeRO through the config-built trainer (dsc_trainer_create_with_optimizer
 * with dsc_zero_make_optimizer): zero_optimization.stage 1, 2 and 3 on 2 and
 * 3 ranks train the tiny GPT of the engine tests to the same losses, gradient
 * norms and (stages 1, 2) parameters as stage 0; stage 3's evaluation and
 * greedy generation (forward hooks only) match too; without a maker the
 * trainer refuses a zero stage naming the key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dsc/zero.h"
#include "test_mpi.h"
#include "train_fixture.h"

enum { STEPS = 5, NEW_TOKENS = 12 };

typedef struct outcome {
    double loss[STEPS], norm[STEPS], val_loss;
    int32_t text[4 + NEW_TOKENS];
    float *params; /* NULL for stage 3: the store holds no values */
    int64_t count;
} outcome;

static void run(dsc_comm *dp, const char *data, int stage, outcome *out) {
    char set_stage[64];
    snprintf(set_stage, sizeof set_stage, "zero_optimization.stage=%d", stage);
    const char *over[] = {set_stage, "model.qkv_bias=false", "zero_optimization.reduce_bucket_size=3000",
                          "zero_optimization.allgather_bucket_size=5000"};
    dsc_config cfg;
    train_fixture_config(&cfg, data, over, 4, dsc_comm_size(dp));
    dsc_trainer_options o = {&cfg, dp, false, NULL, false};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create_with_optimizer(&o, dsc_zero_make_optimizer, &t));
    for (int s = 0; s < STEPS; s++) {
        dsc_step_metrics m;
        assert_ok(dsc_engine_step(dsc_trainer_engine(t), &m));
        out->loss[s] = m.loss;
        out->norm[s] = m.grad_norm;
    }
    assert_ok(dsc_engine_evaluate(dsc_trainer_engine(t), &out->val_loss));
    const int32_t prompt[4] = {'T', 'h', 'e', ' '};
    assert_ok(dsc_trainer_generate(t, prompt, 4, NEW_TOKENS, 0.0f, 1, out->text));
    out->params = stage < 3 ? train_fixture_params(t, &out->count) : NULL;
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
}

static void test_trainer_stages_match(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    char data[128];
    snprintf(data, sizeof data, "/tmp/dsc_test_zero_trainer_%d.tok", (int)getpid());
    train_fixture_tokens(data, 20000); /* each rank its own file (the name has its pid) */
    outcome ref;
    run(dp, data, 0, &ref);
    for (int stage = 1; stage <= 3; stage++) {
        outcome z;
        run(dp, data, stage, &z);
        double worst = 0;
        for (int s = 0; s < STEPS; s++) {
            worst = fmax(worst, fabs(z.loss[s] - ref.loss[s]) / ref.loss[s]);
            worst = fmax(worst, fabs(z.norm[s] - ref.norm[s]) / ref.norm[s]);
        }
        if (dsc_comm_rank(dp) == 0)
            printf("  stage %d on %d ranks: losses %.5f -> %.5f, val %.5f (stage 0: %.5f), worst relative loss / "
                   "norm difference %.2e\n",
                   stage, dsc_comm_size(dp), z.loss[0], z.loss[STEPS - 1], z.val_loss, ref.val_loss, worst);
        assert_true(worst <= 1e-5);
        assert_true(fabs(z.val_loss - ref.val_loss) <= 1e-5 * ref.val_loss);
        assert_memory_equal(z.text, ref.text, sizeof z.text);
        if (z.params) {
            assert_int_equal(z.count, ref.count);
            assert_true(dsc_test_max_rel_err(z.params, ref.params, ref.count, 1e-3, "parameters") <= 1e-6);
            free(z.params);
        }
    }
    free(ref.params);
    unlink(data);
    dsc_comm_free(dp);
}

static void test_trainer_without_maker_refuses(void **state) {
    (void)state;
    const char *over[] = {"zero_optimization.stage=2"};
    dsc_config cfg;
    train_fixture_config(&cfg, "/nonexistent.tok", over, 1, 1);
    dsc_trainer_options o = {&cfg, NULL, false, NULL, false};
    dsc_trainer *t;
    assert_err(dsc_trainer_create(&o, &t), DSC_ERR_UNSUPPORTED, "\"zero_optimization.stage\" = 2");
    dsc_config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trainer_without_maker_refuses),
        cmocka_unit_test(test_trainer_stages_match),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
