/* Every update rule against PyTorch after 3 steps: AdamW, Adam with L2 decay
 * (adam_w_mode false), Adam without bias correction, SGD with momentum, Lamb
 * (DeepSpeed's FusedLamb, with and without the trust ratio clamped) and Lion.
 * The fixture (optimizer_fixtures.json) comes from
 * tests/ref/make_optimizer_fixtures.py; a matrix with weight decay and a
 * vector without, each updated as a whole parameter by dsc_optim_update. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/optimizer.h"
#include "json_floats.h"
#include "test_mpi.h"

enum { NW = 12, NB = 5 };

static cJSON *fixture;

static double number(const char *key) {
    return cJSON_GetObjectItem(fixture, key)->valuedouble;
}

typedef struct rule_case {
    const char *name;
    dsc_optim_hparams hp;
} rule_case;

static void run_case(const rule_case *rc) {
    const int sizes[2] = {NW, NB};
    float value[2][NW], state[2][2][NW] = {{{0}}}, grad[NW], want[NW];
    const cJSON *init = cJSON_GetObjectItem(fixture, "init");
    const cJSON *grads = cJSON_GetObjectItem(fixture, "grads");
    const cJSON *expected = cJSON_GetObjectItem(cJSON_GetObjectItem(fixture, "expected"), rc->name);
    assert_non_null(expected);
    for (int p = 0; p < 2; p++)
        json_floats(cJSON_GetArrayItem(init, p), value[p], sizes[p]);
    for (int step = 1; step <= 3; step++) {
        for (int p = 0; p < 2; p++) {
            int64_t n = sizes[p];
            json_floats(cJSON_GetArrayItem(cJSON_GetArrayItem(grads, step - 1), p), grad, sizes[p]);
            dsc_tensor v = dsc_tensor_view(value[p], DSC_DTYPE_F32, 1, &n, DSC_CPU);
            dsc_tensor g = dsc_tensor_view(grad, DSC_DTYPE_F32, 1, &n, DSC_CPU);
            dsc_tensor s0 = dsc_tensor_view(state[p][0], DSC_DTYPE_F32, 1, &n, DSC_CPU);
            dsc_tensor s1 = dsc_tensor_view(state[p][1], DSC_DTYPE_F32, 1, &n, DSC_CPU);
            assert_ok(dsc_optim_update(&rc->hp, &v, &g, &s0, &s1, (float)number("lr"), p == 0, step));
        }
    }
    for (int p = 0; p < 2; p++) {
        char what[96];
        snprintf(what, sizeof what, "%s %s after 3 steps", rc->name, p == 0 ? "matrix" : "vector");
        json_floats(cJSON_GetArrayItem(expected, p), want, sizes[p]);
        assert_true(dsc_test_max_rel_err(value[p], want, sizes[p], 1e-3, what) <= 1e-5);
    }
}

static void test_rules_match_pytorch(void **state) {
    (void)state;
    const cJSON *betas = cJSON_GetObjectItem(fixture, "betas");
    dsc_optim_hparams base = {
        .beta1 = (float)cJSON_GetArrayItem(betas, 0)->valuedouble,
        .beta2 = (float)cJSON_GetArrayItem(betas, 1)->valuedouble,
        .eps = (float)number("eps"),
        .weight_decay = (float)number("weight_decay"),
        .momentum = (float)number("momentum"),
        .max_coeff = 10.0f,
        .min_coeff = 0.01f,
    };
    rule_case cases[] = {
        {"adamw", base},        {"adam_l2", base}, {"adamw_no_bias_correction", base},
        {"sgd_momentum", base}, {"lamb", base},    {"lamb_clamped", base},
        {"lion", base},
    };
    cases[0].hp.type = DSC_OPTIMIZER_TYPE_ADAMW;
    cases[1].hp.type = DSC_OPTIMIZER_TYPE_ADAM, cases[1].hp.l2_decay = true;
    cases[2].hp.type = DSC_OPTIMIZER_TYPE_ADAM, cases[2].hp.no_bias_correction = true;
    cases[3].hp.type = DSC_OPTIMIZER_TYPE_SGD;
    cases[4].hp.type = DSC_OPTIMIZER_TYPE_LAMB;
    cases[5].hp.type = DSC_OPTIMIZER_TYPE_LAMB, cases[5].hp.max_coeff = 0.3f;
    cases[6].hp.type = DSC_OPTIMIZER_TYPE_LION;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

int main(void) {
    FILE *f = fopen(DSC_SOURCE_DIR "/tests/engine/optimizer_fixtures.json", "rb");
    if (!f) return fprintf(stderr, "optimizer_fixtures.json: cannot open\n"), 1;
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    fixture = cJSON_Parse(text);
    if (!fixture) return fprintf(stderr, "optimizer_fixtures.json: not JSON\n"), 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rules_match_pytorch)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cJSON_Delete(fixture);
    return rc;
}
