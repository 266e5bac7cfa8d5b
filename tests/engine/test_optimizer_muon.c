/* Muon against DeepSpeed's own functions after 3 steps, with both
 * Newton-Schulz methods: a tall, a wide and a square matrix, an expert bank,
 * an embedding and a norm vector (the last two take the Adam group). The
 * fixture (muon_fixtures.json) comes from tests/ref/make_muon_fixtures.py;
 * the hyper-parameters go through the config, so DeepSpeed's defaults for a
 * Muon block and the refusals are checked here too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/optimizer.h"
#include "json_floats.h"
#include "muon_fixture.h"
#include "test_mpi.h"

enum { MAX_PARAMS = 8, MAX_NUMEL = 64 };

static cJSON *fixture;

static void hparams_of(const char *json, dsc_optim_hparams *hp) {
    dsc_config cfg;
    assert_ok(dsc_config_parse_string(json, "muon.json", NULL, 0, &cfg));
    dsc_optim_hparams_from_config(&cfg, hp);
    dsc_config_free(&cfg);
}

static void run_method(const char *method) {
    char json[512];
    snprintf(
        json, sizeof json,
        "{\"optimizer\": {\"type\": \"Muon\", \"params\": {\"lr\": 0.01, \"muon_lr\": 0.02, \"adam_lr\": 0.003, "
        "\"weight_decay\": 0.1, \"momentum\": 0.95, \"betas\": [0.9, 0.95], \"eps\": 1e-10, "
        "\"ns_method\": \"%s\"}}}",
        method);
    dsc_optim_hparams hp;
    hparams_of(json, &hp);
    const cJSON *params = cJSON_GetObjectItem(fixture, "params");
    int n = cJSON_GetArraySize(params);
    assert_true(n <= MAX_PARAMS);
    dsc_param_store *store;
    assert_ok(dsc_params_create(&store, DSC_CPU, 1));
    dsc_param *p[MAX_PARAMS];
    for (int i = 0; i < n; i++) {
        const cJSON *desc = cJSON_GetArrayItem(params, i);
        const cJSON *shape = cJSON_GetObjectItem(desc, "shape");
        int64_t dims[DSC_MAX_DIMS];
        int ndim = cJSON_GetArraySize(shape);
        for (int d = 0; d < ndim; d++)
            dims[d] = (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble;
        uint32_t flags = cJSON_IsTrue(cJSON_GetObjectItem(desc, "decay")) ? 0 : DSC_PARAM_NO_DECAY;
        assert_ok(dsc_params_declare(store, cJSON_GetObjectItem(desc, "name")->valuestring, ndim, dims, flags,
                                     DSC_INIT_ZEROS, 0.0f, &p[i]));
    }
    assert_ok(dsc_params_finalize(store));
    static float state[MAX_PARAMS][2][MAX_NUMEL];
    memset(state, 0, sizeof state);
    for (int i = 0; i < n; i++) {
        assert_true(dsc_param_numel(p[i]) <= MAX_NUMEL);
        json_floats(cJSON_GetArrayItem(cJSON_GetObjectItem(fixture, "init"), i), p[i]->value.data,
                    dsc_param_numel(p[i]));
    }
    const cJSON *grads = cJSON_GetObjectItem(fixture, "grads");
    for (int step = 1; step <= 3; step++)
        for (int i = 0; i < n; i++) {
            int64_t numel = dsc_param_numel(p[i]);
            json_floats(cJSON_GetArrayItem(cJSON_GetArrayItem(grads, step - 1), i), p[i]->grad.data, numel);
            dsc_tensor s0 = dsc_tensor_view(state[i][0], DSC_DTYPE_F32, 1, &numel, DSC_CPU);
            dsc_tensor s1 = dsc_tensor_view(state[i][1], DSC_DTYPE_F32, 1, &numel, DSC_CPU);
            assert_ok(dsc_optim_update_param(&hp, p[i], &s0, &s1, 0.01f, step));
        }
    const cJSON *expected = cJSON_GetObjectItem(cJSON_GetObjectItem(fixture, "expected"), method);
    for (int i = 0; i < n; i++) {
        float want[MAX_NUMEL];
        int64_t numel = dsc_param_numel(p[i]);
        json_floats(cJSON_GetArrayItem(expected, i), want, numel);
        char what[160];
        snprintf(what, sizeof what, "muon (%s) %s after 3 steps", method, p[i]->name);
        assert_true(dsc_test_max_rel_err(p[i]->value.data, want, numel, 1e-3, what) <= 1e-5);
    }
    dsc_params_destroy(store);
}

static void test_gram_matches_deepspeed(void **state) {
    (void)state;
    run_method("gram");
}

static void test_standard_matches_deepspeed(void **state) {
    (void)state;
    run_method("standard");
}

/* A bare Muon block gets MuonWithAuxAdam's group defaults. */
static void test_deepspeed_defaults(void **state) {
    (void)state;
    dsc_config cfg;
    assert_ok(dsc_config_parse_string("{\"optimizer\": {\"type\": \"muon\"}}", "muon.json", NULL, 0, &cfg));
    const dsc_config_optimizer *o = &cfg.optimizer;
    assert_true(o->params.momentum == 0.95 && o->params.weight_decay == 0.0 && o->params.eps == 1e-10);
    assert_true(o->params.betas[0] == 0.9 && o->params.betas[1] == 0.95);
    assert_true(o->params.muon_lr == 0.02 && o->params.adam_lr == 3e-4);
    assert_int_equal(o->params.ns_method, DSC_MUON_NS_GRAM);
    dsc_optim_hparams hp;
    dsc_optim_hparams_from_config(&cfg, &hp);
    assert_float_equal(hp.muon_lr_scale * o->params.lr, 0.02, 1e-9);
    assert_float_equal(hp.adam_lr_scale * o->params.lr, 3e-4, 1e-9);
    dsc_config_free(&cfg);
    /* a scheduler that sets one rate for every group: both groups follow it */
    assert_ok(dsc_config_parse_string("{\"optimizer\": {\"type\": \"muon\", \"params\": {\"lr\": 0.01}}, "
                                      "\"scheduler\": {\"type\": \"WarmupLR\"}}",
                                      "muon.json", NULL, 0, &cfg));
    dsc_optim_hparams_from_config(&cfg, &hp);
    assert_true(hp.muon_lr_scale == 1.0f && hp.adam_lr_scale == 1.0f);
    dsc_config_free(&cfg);
}

/* Every key dsc cannot honour for Muon is named, all in one run; ZeRO and
 * tensor parallelism are not among them. */
static void test_refusals(void **state) {
    (void)state;
    dsc_config cfg;
    dsc_status s = dsc_config_parse_string(
        "{\"optimizer\": {\"type\": \"muon\", \"params\": {\"muon_lr\": 0.1, \"bias_correction\": false}}, "
        "\"scheduler\": {\"type\": \"WarmupLR\"}, \"zero_optimization\": {\"stage\": 1}, "
        "\"tensor_parallel\": {\"autotp_size\": 2}}",
        "muon.json", NULL, 0, &cfg);
    assert_non_null(s);
    const char *msg = dsc_status_message(s);
    assert_non_null(strstr(msg, "\"optimizer.params.muon_lr\" has no effect"));
    assert_non_null(strstr(msg, "\"optimizer.params.bias_correction\" false"));
    /* ZeRO and tensor parallelism take Muon (tests/zero/test_zero_muon, tests/tp/test_tp_muon) */
    assert_null(strstr(msg, "zero_optimization.stage"));
    assert_null(strstr(msg, "autotp_size"));
    dsc_status_free(s);
}

static void test_which_parameters(void **state) {
    (void)state;
    dsc_param p = {.value = {.ndim = 2}};
    const char *muon[] = {"layers.0.attn.q.weight", "layers.3.moe.gate.weight", "layers.1.mlp.down.weight"};
    const char *adam[] = {"embed.wte.weight", "embed.wpe.weight", "head.weight", "lm_head.weight"};
    for (size_t i = 0; i < sizeof muon / sizeof *muon; i++) {
        snprintf(p.name, sizeof p.name, "%s", muon[i]);
        assert_true(dsc_optim_uses_muon(&p));
    }
    for (size_t i = 0; i < sizeof adam / sizeof *adam; i++) {
        snprintf(p.name, sizeof p.name, "%s", adam[i]);
        assert_false(dsc_optim_uses_muon(&p));
    }
    p.value.ndim = 1;
    snprintf(p.name, sizeof p.name, "layers.0.ln1.weight");
    assert_false(dsc_optim_uses_muon(&p));
}

int main(void) {
    fixture = muon_fixture_load();
    if (!fixture) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gram_matches_deepspeed), cmocka_unit_test(test_standard_matches_deepspeed),
        cmocka_unit_test(test_deepspeed_defaults),     cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_which_parameters),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cJSON_Delete(fixture);
    return rc;
}
