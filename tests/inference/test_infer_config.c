/* DeepSpeed inference config keys (dsc_infer_ds_config): the implemented
 * ones are read (tensor_parallel.tp_size / tp_grain_size / partition_config
 * layer_specs, max_out_tokens, min_out_tokens), defaults hold without them,
 * and every other key, partition type or layer_specs field is refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dsc/inference.h"
#include "test_mpi.h"

static void test_keys(void **state) {
    (void)state;
    dsc_infer_ds_config c;
    assert_ok(dsc_infer_ds_config_parse("{}", "t", &c));
    assert_int_equal(c.tp.tp_size, 1);
    assert_int_equal(c.tp.grain, 64);
    assert_int_equal(c.max_out_tokens, 1024);
    assert_int_equal(c.min_out_tokens, 1);
    dsc_infer_ds_config_free(&c);
    const char *json =
        "{\"tensor_parallel\": {\"tp_size\": 4, \"tp_grain_size\": 32, \"partition_config\": "
        "{\"use_default_specs\": false, \"layer_specs\": [{\"patterns\": [\".*\\\\.o_proj\\\\.weight$\", "
        "\".*down_proj.*\"], \"partition_type\": \"row\"}, {\"patterns\": [\"q_proj\"], "
        "\"partition_type\": \"column\"}, {\"patterns\": [\"router\"], \"partition_type\": \"skip\"}]}}, "
        "\"max_out_tokens\": 512, \"min_out_tokens\": 16}";
    assert_ok(dsc_infer_ds_config_parse(json, "t", &c));
    assert_int_equal(c.tp.tp_size, 4);
    assert_int_equal(c.tp.grain, 32);
    assert_true(c.tp.no_name_rules);
    assert_int_equal(c.tp.n_rules, 4);
    assert_string_equal(c.tp.rules[0].pattern, ".*\\.o_proj\\.weight$");
    assert_int_equal(c.tp.rules[1].kind, DSC_TP_KIND_ROW);
    assert_int_equal(c.tp.rules[2].kind, DSC_TP_KIND_COLUMN);
    assert_int_equal(c.tp.rules[3].kind, DSC_TP_KIND_REPLICATE);
    assert_int_equal(c.max_out_tokens, 512);
    assert_int_equal(c.min_out_tokens, 16);
    dsc_infer_ds_config_free(&c);
    assert_err(dsc_infer_ds_config_parse("{\"dtype\": \"fp16\"}", "t", &c), DSC_ERR_UNSUPPORTED,
               "t: dtype is not supported");
    assert_err(dsc_infer_ds_config_parse("{\"tensor_parallel\": {\"mpu\": 1}}", "t", &c), DSC_ERR_UNSUPPORTED,
               "tensor_parallel.mpu");
    assert_err(
        dsc_infer_ds_config_parse("{\"tensor_parallel\": {\"partition_config\": {\"layer_specs\": "
                                  "[{\"patterns\": [\"x\"], \"partition_type\": \"row\", \"shape\": [2, -1]}]}}}",
                                  "t", &c),
        DSC_ERR_UNSUPPORTED, "layer_specs[].shape");
    assert_err(dsc_infer_ds_config_parse("{\"tensor_parallel\": {\"partition_config\": {\"layer_specs\": "
                                         "[{\"patterns\": [\"x\"], \"partition_type\": \"diagonal\"}]}}}",
                                         "t", &c),
               DSC_ERR_CONFIG, "layer_specs[0].partition_type");
    assert_err(dsc_infer_ds_config_parse("{\"tensor_parallel\": {\"tp_size\": 0}}", "t", &c), DSC_ERR_CONFIG,
               "tp_size must be an integer >= 1");
    assert_err(dsc_infer_ds_config_parse("{\"max_out_tokens\": 4, \"min_out_tokens\": 8}", "t", &c),
               DSC_ERR_CONFIG, "min_out_tokens (8) exceeds max_out_tokens (4)");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_keys)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
