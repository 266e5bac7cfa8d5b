/* The rule order of the tensor-parallel plan on a model with a policy:
 * partition_config and config.json's base_model_tp_plan decide before the
 * policy, may only agree with what the policy's forward computes (else the
 * load is refused naming the tensor, the rule and the declaration), and
 * unsupported tp_plan styles are refused by name. Plans only: no ranks. */
#define _POSIX_C_SOURCE 200809L /* symlink */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dsc/inference.h"
#include "test_mpi.h"

#define LLAMA DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama"

static const dsc_tp_entry *entry(const dsc_tp_plan *p, const char *name) {
    int64_t i = dsc_tp_plan_find(p, name);
    assert_true(i >= 0);
    return dsc_tp_plan_entry(p, i);
}

static void test_partition_config(void **state) {
    (void)state;
    dsc_tp_rule agree[] = {{".*\\.o_proj\\.weight$", DSC_TP_KIND_ROW}};
    dsc_infer_tp tp = {.tp_size = 2, .rules = agree, .n_rules = 1};
    dsc_tp_plan *plan;
    assert_ok(dsc_infer_model_plan(LLAMA, &tp, &plan));
    assert_int_equal(entry(plan, "model.layers.1.self_attn.o_proj.weight")->source, DSC_TP_SOURCE_USER);
    assert_int_equal(entry(plan, "model.layers.1.self_attn.q_proj.weight")->source, DSC_TP_SOURCE_POLICY);
    dsc_tp_plan_destroy(plan);
    dsc_tp_rule contradict[] = {{"o_proj", DSC_TP_KIND_COLUMN}};
    tp.rules = contradict;
    assert_err(dsc_infer_model_plan(LLAMA, &tp, &plan), DSC_ERR_CONFIG,
               "partition_config makes model.layers.0.self_attn.o_proj.weight column (q-heads), but policy "
               "LlamaForCausalLM computes it as row (q-heads)");
    dsc_tp_rule skip[] = {{"gate_proj", DSC_TP_KIND_REPLICATE}};
    tp.rules = skip;
    assert_err(dsc_infer_model_plan(LLAMA, &tp, &plan), DSC_ERR_CONFIG, "mlp.gate_proj.weight replicate");
}

/* A copy of the Llama fixture whose config.json carries base_model_tp_plan `plan_json`. */
static void with_model_plan(char *dir, size_t len, const char *plan_json) {
    snprintf(dir, len, DSC_BINARY_DIR "/tests/inference/tp_rules_llama");
    mkdir(dir, 0755);
    char path[700], link[700];
    snprintf(link, sizeof link, "%s/model.safetensors", dir);
    unlink(link);
    assert_int_equal(symlink(LLAMA "/model.safetensors", link), 0);
    FILE *in = fopen(LLAMA "/config.json", "r");
    assert_non_null(in);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, in);
    fclose(in);
    buf[n] = '\0';
    char *close = strrchr(buf, '}');
    assert_non_null(close);
    *close = '\0';
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *out = fopen(path, "w");
    assert_non_null(out);
    fprintf(out, "%s, \"base_model_tp_plan\": %s}\n", buf, plan_json);
    fclose(out);
}

static void test_base_model_tp_plan(void **state) {
    (void)state;
    char dir[512];
    dsc_infer_tp tp = {.tp_size = 2};
    dsc_tp_plan *plan;
    with_model_plan(dir, sizeof dir,
                    "{\"layers.*.self_attn.q_proj\": \"colwise\", \"layers.*.mlp.down_proj\": \"rowwise\"}");
    assert_ok(dsc_infer_model_plan(dir, &tp, &plan));
    assert_int_equal(entry(plan, "model.layers.0.self_attn.q_proj.weight")->source, DSC_TP_SOURCE_MODEL_PLAN);
    assert_int_equal(entry(plan, "model.layers.1.mlp.down_proj.weight")->source, DSC_TP_SOURCE_MODEL_PLAN);
    assert_int_equal(entry(plan, "model.layers.1.mlp.up_proj.weight")->source, DSC_TP_SOURCE_POLICY);
    dsc_tp_plan_destroy(plan);
    /* partition_config is asked first */
    dsc_tp_rule user[] = {{"layers\\.0\\.self_attn\\.q_proj", DSC_TP_KIND_COLUMN}};
    tp.rules = user;
    tp.n_rules = 1;
    assert_ok(dsc_infer_model_plan(dir, &tp, &plan));
    assert_int_equal(entry(plan, "model.layers.0.self_attn.q_proj.weight")->source, DSC_TP_SOURCE_USER);
    assert_int_equal(entry(plan, "model.layers.1.self_attn.q_proj.weight")->source, DSC_TP_SOURCE_MODEL_PLAN);
    dsc_tp_plan_destroy(plan);
    tp.n_rules = 0;
    with_model_plan(dir, sizeof dir, "{\"layers.*.self_attn.o_proj\": \"colwise\"}");
    assert_err(dsc_infer_model_plan(dir, &tp, &plan), DSC_ERR_CONFIG,
               "base_model_tp_plan makes model.layers.0.self_attn.o_proj.weight column");
    with_model_plan(dir, sizeof dir, "{\"layers.*.self_attn.o_proj\": \"gather\"}");
    assert_err(dsc_infer_model_plan(dir, &tp, &plan), DSC_ERR_UNSUPPORTED,
               "base_model_tp_plan[\"layers.*.self_attn.o_proj\"] = \"gather\" is not supported");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_partition_config),
                                       cmocka_unit_test(test_base_model_tp_plan)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
