/* Learning-rate schedules against DeepSpeed's formulas, evaluated by hand at
 * the interesting iterations (start, inside warmup, the boundary, the decay,
 * past the end). */
#include <math.h>
#include <stdbool.h>

#include "dsc/engine.h"
#include "test_mpi.h"

static void expect_lr(const dsc_config_scheduler *s, double base, int64_t it, double want) {
    double got = dsc_lr_schedule_at(s, base, it);
    bool close = fabs(got - want) <= 1e-12 * (1 + fabs(want));
    if (!close) print_error("iteration %lld: lr %.15g, expected %.15g\n", (long long)it, got, want);
    assert_true(close);
}

static void test_constant(void **state) {
    (void)state;
    dsc_config_scheduler s = {.type = DSC_LR_SCHEDULE_CONSTANT};
    expect_lr(&s, 3e-4, 0, 3e-4);
    expect_lr(&s, 3e-4, 12345, 3e-4);
}

static void test_warmup_lr(void **state) {
    (void)state;
    dsc_config_scheduler s = {.type = DSC_LR_SCHEDULE_WARMUP_LR};
    s.params.warmup_num_steps = 100;
    s.params.warmup_min_lr = 1e-5;
    s.params.warmup_max_lr = 1e-3;
    s.params.warmup_type = DSC_WARMUP_TYPE_LOG;
    expect_lr(&s, 0.5, 0, 1e-5);                                         /* log(1) = 0 */
    expect_lr(&s, 0.5, 9, 1e-5 + (1e-3 - 1e-5) * 0.5);                   /* log(10)/log(100) */
    expect_lr(&s, 0.5, 100, 1e-3);
    expect_lr(&s, 0.5, 5000, 1e-3);
    s.params.warmup_type = DSC_WARMUP_TYPE_LINEAR;
    expect_lr(&s, 0.5, 25, 1e-5 + (1e-3 - 1e-5) * 0.25);
    s.params.warmup_num_steps = 1; /* DeepSpeed raises it to 2 */
    expect_lr(&s, 0.5, 1, 1e-5 + (1e-3 - 1e-5) * 0.5);
}

static void test_warmup_decay_lr(void **state) {
    (void)state;
    dsc_config_scheduler s = {.type = DSC_LR_SCHEDULE_WARMUP_DECAY_LR};
    s.params.warmup_num_steps = 10;
    s.params.total_num_steps = 110;
    s.params.warmup_min_lr = 0;
    s.params.warmup_max_lr = 2e-3;
    s.params.warmup_type = DSC_WARMUP_TYPE_LINEAR;
    expect_lr(&s, 1.0, 5, 1e-3);
    expect_lr(&s, 1.0, 10, 2e-3);           /* (110 - 10) / 100 */
    expect_lr(&s, 1.0, 60, 1e-3);           /* (110 - 60) / 100 */
    expect_lr(&s, 1.0, 110, 0.0);
    expect_lr(&s, 1.0, 200, 0.0);           /* clamped at 0 */
}

static void test_warmup_cosine_lr(void **state) {
    (void)state;
    dsc_config_scheduler s = {.type = DSC_LR_SCHEDULE_WARMUP_COSINE_LR};
    s.params.warmup_num_steps = 10;
    s.params.total_num_steps = 110;
    s.params.warmup_min_ratio = 0.2;
    s.params.cos_min_ratio = 0.1;
    s.params.warmup_type = DSC_WARMUP_TYPE_LINEAR;
    const double base = 1e-3, pi = 3.14159265358979323846;
    expect_lr(&s, base, 0, base * 0.2);
    expect_lr(&s, base, 5, base * (0.2 + 0.8 * 0.5));
    /* first decay iteration: progress (10 - 10 + 1) / 100 */
    expect_lr(&s, base, 10, base * (0.1 + 0.9 * 0.5 * (1 + cos(pi * 0.01))));
    expect_lr(&s, base, 59, base * (0.1 + 0.9 * 0.5 * (1 + cos(pi * 0.5))));
    expect_lr(&s, base, 109, base * 0.1);
    expect_lr(&s, base, 1000, base * 0.1); /* stays at the floor */
    s.params.warmup_type = DSC_WARMUP_TYPE_LOG;
    expect_lr(&s, base, 4, base * (0.2 + 0.8 * log(5.0) / log(10.0)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant),
        cmocka_unit_test(test_warmup_lr),
        cmocka_unit_test(test_warmup_decay_lr),
        cmocka_unit_test(test_warmup_cosine_lr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
