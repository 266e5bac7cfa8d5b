/* Learning-rate schedules against DeepSpeed's formulas, evaluated by hand at
 * the interesting iterations (start, inside warmup, the boundary, the decay,
 * past the end); OneCycle (lr and momentum, with and without stairs and
 * decay) and LRRangeTest (continuous and staircase) for 30 steps against
 * lr_schedule_fixtures.json, DeepSpeed's schedulers restated in Python as a
 * training loop sees them (tests/ref/lr_schedule_ref.py). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

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
    expect_lr(&s, 0.5, 0, 1e-5);                       /* log(1) = 0 */
    expect_lr(&s, 0.5, 9, 1e-5 + (1e-3 - 1e-5) * 0.5); /* log(10)/log(100) */
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
    expect_lr(&s, 1.0, 10, 2e-3); /* (110 - 10) / 100 */
    expect_lr(&s, 1.0, 60, 1e-3); /* (110 - 60) / 100 */
    expect_lr(&s, 1.0, 110, 0.0);
    expect_lr(&s, 1.0, 200, 0.0); /* clamped at 0 */
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

static double param(const cJSON *params, const char *name, double def) {
    const cJSON *v = cJSON_GetObjectItem(params, name);
    return cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsBool(v) ? (double)cJSON_IsTrue(v) : def;
}

static void expect_series(const char *what, const cJSON *want, int64_t it, double got) {
    double w = cJSON_GetArrayItem(want, (int)it)->valuedouble;
    bool close = fabs(got - w) <= 1e-12 * (1 + fabs(w));
    if (!close)
        print_error("%s at optimizer step %lld: %.15g, DeepSpeed %.15g\n", what, (long long)it + 1, got, w);
    assert_true(close);
}

static void test_one_cycle_and_range_test(void **state) {
    (void)state;
    FILE *f = fopen(DSC_SOURCE_DIR "/tests/engine/lr_schedule_fixtures.json", "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *cases = cJSON_Parse(text);
    assert_non_null(cases);
    for (const cJSON *c = cases->child; c; c = c->next) {
        const cJSON *p = cJSON_GetObjectItem(c, "params");
        bool one_cycle = strcmp(cJSON_GetObjectItem(c, "type")->valuestring, "OneCycle") == 0;
        dsc_config_scheduler s = {.type = one_cycle ? DSC_LR_SCHEDULE_ONE_CYCLE : DSC_LR_SCHEDULE_LR_RANGE_TEST};
        s.params.cycle_min_lr = param(p, "cycle_min_lr", 0);
        s.params.cycle_max_lr = param(p, "cycle_max_lr", 0);
        s.params.decay_lr_rate = param(p, "decay_lr_rate", 0);
        s.params.cycle_first_step_size = (int64_t)param(p, "cycle_first_step_size", 2000);
        s.params.cycle_second_step_size =
            (int64_t)param(p, "cycle_second_step_size", (double)s.params.cycle_first_step_size);
        s.params.cycle_first_stair_count = (int64_t)param(p, "cycle_first_stair_count", 0);
        s.params.cycle_second_stair_count =
            (int64_t)param(p, "cycle_second_stair_count", (double)s.params.cycle_first_stair_count);
        s.params.decay_step_size = (int64_t)param(p, "decay_step_size", 0);
        s.params.cycle_momentum = true;
        s.params.cycle_min_mom = param(p, "cycle_min_mom", 0.8);
        s.params.cycle_max_mom = param(p, "cycle_max_mom", 0.9);
        s.params.decay_mom_rate = param(p, "decay_mom_rate", 0);
        s.params.lr_range_test_min_lr = param(p, "lr_range_test_min_lr", 1e-3);
        s.params.lr_range_test_step_size = (int64_t)param(p, "lr_range_test_step_size", 2000);
        s.params.lr_range_test_step_rate = param(p, "lr_range_test_step_rate", 1);
        s.params.lr_range_test_staircase = param(p, "lr_range_test_staircase", 0) != 0;
        const cJSON *lr = cJSON_GetObjectItem(c, "lr"), *beta1 = cJSON_GetObjectItem(c, "beta1");
        for (int64_t it = 0; it < cJSON_GetArraySize(lr); it++) {
            expect_series(one_cycle ? "OneCycle lr" : "LRRangeTest lr", lr, it, dsc_lr_schedule_at(&s, 0.5, it));
            double b1 = 0, b2 = 0;
            assert_int_equal(dsc_lr_schedule_betas(&s, it, &b1, &b2), one_cycle);
            if (!one_cycle) continue;
            expect_series("OneCycle beta1", beta1, it, b1);
            assert_true(b2 == 0.99);
        }
    }
    cJSON_Delete(cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant),
        cmocka_unit_test(test_warmup_lr),
        cmocka_unit_test(test_warmup_decay_lr),
        cmocka_unit_test(test_warmup_cosine_lr),
        cmocka_unit_test(test_one_cycle_and_range_test),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
