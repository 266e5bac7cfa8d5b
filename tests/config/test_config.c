/* Job config: defaults and "auto" values, a DeepSpeed-style file, overrides,
 * DeepSpeed's batch-size rule, the JSON round trip used by checkpoints, the
 * reference table in docs/config.md, and one test per bad configuration
 * checking its exact message.
 *
 * `test_config --print-reference` prints the reference table, to paste into
 * docs/config.md when the schema changes. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fdopen */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/config.h"
#include "test_mpi.h"

static void test_defaults_and_auto_values(void **state) {
    (void)state;
    dsc_config c;
    assert_ok(dsc_config_parse_string("{}", "config.json", NULL, 0, &c));
    assert_int_equal(c.model.arch, DSC_MODEL_ARCH_GPT);
    assert_int_equal(c.model.n_layer, 12);
    assert_int_equal(c.model.n_kv_head, 12); /* null: n_head */
    assert_int_equal(c.model.d_ff, 4 * 768); /* null: 4 * d_model */
    assert_true(c.model.qkv_bias && c.model.tie_embeddings);
    assert_int_equal(c.optimizer.type, DSC_OPTIMIZER_TYPE_ADAMW);
    assert_true(c.optimizer.params.betas[0] == 0.9 && c.optimizer.params.betas[1] == 0.999);
    assert_int_equal(c.scheduler.type, DSC_LR_SCHEDULE_CONSTANT);
    assert_int_equal(c.scheduler.params.total_num_steps, 1000); /* null: train.steps */
    assert_int_equal(c.zero_optimization.stage, 0);
    assert_false(c.zero_optimization.overlap_comm);
    assert_int_equal(c.zero_optimization.reduce_bucket_size, 500000000);
    assert_int_equal(c.moe.noisy_gate_policy, DSC_MOE_NOISY_GATE_NONE);
    assert_string_equal(c.pipeline.partition_method, "parameters");
    assert_string_equal(c.checkpoint.save_dir, "");
    assert_int_equal(c.train_batch_size, 0); /* unset until resolve_batch */
    assert_int_equal(c.steps_per_print, 10);
    assert_string_equal(c.source, "config.json");
    dsc_config_free(&c);
    dsc_config_free(&c); /* freeing twice is harmless: free zeroes the struct */
}

static const char *deepspeed_style =
    "{\n"
    "  \"train_batch_size\": 32,\n"
    "  \"train_micro_batch_size_per_gpu\": 4,\n"
    "  \"steps_per_print\": 5,\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": [0.9, 0.95], \"eps\": 1e-8,\n"
    "                                                \"weight_decay\": 0.1}},\n"
    "  \"scheduler\": {\"type\": \"WarmupCosineLR\",\n"
    "                \"params\": {\"warmup_num_steps\": 100, \"total_num_steps\": 5000, \"cos_min_ratio\": "
    "0.1}},\n"
    "  \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 5e8, \"stage3_prefetch_bucket_size\": 5e7},\n"
    "  \"model\": {\"arch\": \"mixtral\", \"n_layer\": 4, \"d_model\": 256, \"n_head\": 8, \"n_kv_head\": 2,\n"
    "            \"seq_len\": 128, \"vocab_size\": 1000},\n"
    "  \"moe\": {\"num_experts\": 8, \"ep_size\": 4, \"k\": 2, \"noisy_gate_policy\": \"jitter\"},\n"
    "  \"pipeline\": {\"stages\": 2, \"schedule\": \"interleaved\", \"virtual_stages\": 2,\n"
    "               \"partition_method\": \"type:^(block|moe)\"},\n"
    "  \"checkpoint\": {\"save_dir\": \"/tmp/ckpt\", \"save_interval\": 100, \"keep_last\": 3},\n"
    "  \"seed\": 42\n"
    "}\n";

static void test_deepspeed_style_file(void **state) {
    (void)state;
    dsc_config c;
    assert_ok(dsc_config_parse_string(deepspeed_style, "ds.json", NULL, 0, &c));
    assert_int_equal(c.optimizer.type, DSC_OPTIMIZER_TYPE_ADAMW); /* "AdamW": case-insensitive */
    assert_true(c.optimizer.params.lr == 3e-4 && c.optimizer.params.betas[1] == 0.95);
    assert_int_equal(c.scheduler.type, DSC_LR_SCHEDULE_WARMUP_COSINE_LR);
    assert_int_equal(c.scheduler.params.total_num_steps, 5000);
    assert_int_equal(c.zero_optimization.stage, 3);
    assert_true(c.zero_optimization.overlap_comm); /* null: true for stage 3 */
    assert_int_equal(c.zero_optimization.reduce_bucket_size, 500000000);
    assert_int_equal(c.model.arch, DSC_MODEL_ARCH_MIXTRAL);
    assert_false(c.model.qkv_bias);
    assert_false(c.model.tie_embeddings);
    assert_int_equal(c.model.d_ff, 1024);
    assert_int_equal(c.moe.noisy_gate_policy, DSC_MOE_NOISY_GATE_JITTER);
    assert_int_equal(c.pipeline.schedule, DSC_PIPE_SCHEDULE_KIND_INTERLEAVED);
    assert_string_equal(c.pipeline.partition_method, "type:^(block|moe)");
    assert_int_equal(c.checkpoint.keep_last, 3);
    assert_int_equal((int)c.seed, 42);
    assert_ok(dsc_config_resolve_batch(&c, 2));
    assert_int_equal(c.gradient_accumulation_steps, 4);
    assert_int_equal(c.data_parallel_size, 2);
    dsc_config_free(&c);
}

static void test_overrides(void **state) {
    (void)state;
    const char *sets[] = {"model.arch=llama",           "optimizer.params.betas=[0.8,0.9]",
                          "pipeline.stages=4",          "checkpoint.tag=\"007\"",
                          "moe.noisy_gate_policy=null", "data.path=/data/tokens.bin"};
    dsc_config c;
    assert_ok(dsc_config_parse_string("{\"model\": {\"n_layer\": 8}}", "config.json", sets, 6, &c));
    assert_int_equal(c.model.arch, DSC_MODEL_ARCH_LLAMA);
    assert_int_equal(c.model.n_layer, 8);
    assert_false(c.model.qkv_bias); /* auto values follow the overridden arch */
    assert_true(c.optimizer.params.betas[0] == 0.8 && c.optimizer.params.betas[1] == 0.9);
    assert_int_equal(c.pipeline.stages, 4);
    assert_string_equal(c.checkpoint.tag, "007"); /* quoted: stays a string */
    assert_string_equal(c.data.path, "/data/tokens.bin");

    assert_ok(dsc_config_apply_override(&c, "zero_optimization={\"stage\": 3}"));
    assert_int_equal(c.zero_optimization.stage, 3);
    assert_true(c.zero_optimization.overlap_comm);
    assert_ok(dsc_config_apply_override(&c, "model.n_layer=2"));
    assert_int_equal(c.model.n_layer, 2);
    assert_int_equal(c.pipeline.stages, 4); /* earlier overrides persist */

    /* A failing override leaves the config as it was. */
    assert_err(
        dsc_config_apply_override(&c, "model.n_head=7"), DSC_ERR_CONFIG,
        "config.json: --set \"model.n_head=7\": \"model.d_model\" 768 is not divisible by \"model.n_head\" 7");
    assert_int_equal(c.model.n_head, 12);
    assert_err(dsc_config_apply_override(&c, "zero_optimization={\"stag\": 3}"), DSC_ERR_CONFIG,
               "unknown key \"zero_optimization.stag\" (did you mean \"zero_optimization.stage\"?)");
    assert_int_equal(c.zero_optimization.stage, 3);
    dsc_config_free(&c);
}

typedef struct batch_case {
    int64_t tb, mb, gas;
    int dp;
    int64_t want_tb, want_mb, want_gas; /* 0: an error containing `message` */
    const char *message;
} batch_case;

static void test_batch_rule(void **state) {
    (void)state;
    static const batch_case cases[] = {
        {32, 4, 0, 2, 32, 4, 4, NULL}, /* batch and micro: accumulation derived */
        {32, 0, 2, 4, 32, 4, 2, NULL}, /* batch and accumulation: micro derived */
        {0, 4, 2, 2, 16, 4, 2, NULL},  /* micro and accumulation: batch derived */
        {12, 0, 0, 3, 12, 4, 1, NULL}, /* batch only: accumulation 1 */
        {0, 3, 0, 5, 15, 3, 1, NULL},  /* micro only */
        {16, 4, 2, 2, 16, 4, 2, NULL}, /* all three, consistent */
        {32, 4, 2, 2, 0, 0, 0,
         "config.json: train_batch_size 32 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 * "
         "data-parallel size 2 = 16"},
        {30, 4, 0, 2, 0, 0, 0,
         "config.json: train_batch_size 30 is not divisible by train_micro_batch_size_per_gpu 4 * data-parallel "
         "size 2 = 8"},
        {30, 0, 4, 2, 0, 0, 0,
         "config.json: train_batch_size 30 is not divisible by gradient_accumulation_steps 4 * data-parallel size "
         "2 = 8"},
        {6, 0, 0, 4, 0, 0, 0, "config.json: train_batch_size 6 is not divisible by data-parallel size 4"},
        {0, 0, 8, 2, 0, 0, 0,
         "config.json: either \"train_batch_size\" or \"train_micro_batch_size_per_gpu\" must be given"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const batch_case *k = &cases[i];
        char json[256];
        size_t used = (size_t)snprintf(json, sizeof json, "{\"seed\": 1");
        if (k->tb)
            used += (size_t)snprintf(json + used, sizeof json - used, ", \"train_batch_size\": %lld",
                                     (long long)k->tb);
        if (k->mb)
            used += (size_t)snprintf(json + used, sizeof json - used, ", \"train_micro_batch_size_per_gpu\": %lld",
                                     (long long)k->mb);
        if (k->gas)
            used += (size_t)snprintf(json + used, sizeof json - used, ", \"gradient_accumulation_steps\": %lld",
                                     (long long)k->gas);
        snprintf(json + used, sizeof json - used, "}");
        dsc_config c;
        assert_ok(dsc_config_parse_string(json, "config.json", NULL, 0, &c));
        if (k->message) {
            assert_err(dsc_config_resolve_batch(&c, k->dp), DSC_ERR_CONFIG, k->message);
            assert_int_equal(c.data_parallel_size, 0); /* unchanged on error */
        } else {
            assert_ok(dsc_config_resolve_batch(&c, k->dp));
            assert_int_equal(c.train_batch_size, k->want_tb);
            assert_int_equal(c.train_micro_batch_size_per_gpu, k->want_mb);
            assert_int_equal(c.gradient_accumulation_steps, k->want_gas);
        }
        dsc_config_free(&c);
    }
}

static void test_json_round_trip(void **state) {
    (void)state;
    dsc_config a, b;
    assert_ok(dsc_config_parse_string(deepspeed_style, "ds.json", NULL, 0, &a));
    assert_ok(dsc_config_resolve_batch(&a, 2));
    char *first, *second;
    assert_ok(dsc_config_to_json(&a, &first));
    assert_ok(dsc_config_parse_string(first, "checkpoint", NULL, 0, &b));
    assert_ok(dsc_config_resolve_batch(&b, 2));
    assert_ok(dsc_config_to_json(&b, &second));
    assert_string_equal(first, second);
    assert_non_null(strstr(first, "\"noisy_gate_policy\":\t\"Jitter\""));
    assert_non_null(strstr(first, "\"gradient_accumulation_steps\":\t4"));
    assert_true(b.optimizer.params.lr == a.optimizer.params.lr);
    assert_int_equal(b.moe.ep_size, 4);
    assert_string_equal(b.pipeline.partition_method, a.pipeline.partition_method);
    free(first);
    free(second);
    dsc_config_free(&a);
    dsc_config_free(&b);
}

static void test_load_file(void **state) {
    (void)state;
    char path[] = "/tmp/dsc_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"model\": {\"n_layer\": 3},\n \"train\": {\"steps\": 7}}\n", f);
    fclose(f);
    const char *sets[] = {"train.steps=9"};
    dsc_config c;
    assert_ok(dsc_config_load_file(path, sets, 1, &c));
    assert_int_equal(c.model.n_layer, 3);
    assert_int_equal(c.train.steps, 9);
    assert_string_equal(c.source, path);
    dsc_config_free(&c);
    remove(path);
    assert_err(dsc_config_load_file("/nonexistent/config.json", NULL, 0, &c), DSC_ERR_CONFIG,
               "/nonexistent/config.json: cannot open: No such file or directory");
}

/* The table in docs/config.md is the schema's, byte for byte. */
static void test_reference_table_in_docs(void **state) {
    (void)state;
    char *table;
    assert_ok(dsc_config_reference_markdown(&table));
    bool same = dsc_test_doc_block_is(DSC_SOURCE_DIR "/docs/config.md", "reference", table);
    free(table);
    if (!same)
        fail_msg(
            "docs/config.md's key table differs from the schema; regenerate it: test_config --print-reference");
}

/* ---- bad configurations, one test each ---------------------------------- */

typedef struct bad_case {
    const char *name;
    const char *json;
    const char *set; /* an override, or NULL */
    const char *message;
} bad_case;

static const bad_case bad_cases[] = {
    {"unknown top-level key", "{\"train_batch_sizes\": 8}", NULL,
     "config.json: unknown key \"train_batch_sizes\" (did you mean \"train_batch_size\"?)"},
    {"shortened key", "{\"train_micro_batch_size\": 8}", NULL,
     "config.json: unknown key \"train_micro_batch_size\" (did you mean \"train_micro_batch_size_per_gpu\"?)"},
    {"unknown nested key", "{\"optimizer\": {\"parms\": {\"lr\": 0.1}}}", NULL,
     "config.json: unknown key \"optimizer.parms\" (did you mean \"optimizer.params\"?)"},
    {"key in the wrong section", "{\"optimizer\": {\"lr\": 0.1}}", NULL,
     "config.json: unknown key \"optimizer.lr\" (did you mean \"optimizer.params.lr\"?)"},
    {"unknown key without a near match", "{\"model\": {\"flux_capacitor\": 1}}", NULL,
     "config.json: unknown key \"model.flux_capacitor\" (known keys in \"model\": arch, n_layer, d_model, n_head, "
     "n_kv_head, d_ff, vocab_size, seq_len, tie_embeddings, activation_checkpointing, rope_theta, norm_eps, "
     "qkv_bias)"},
    {"string for an integer", "{\"pipeline\": {\"stages\": \"two\"}}", NULL,
     "config.json: \"pipeline.stages\" must be an integer, got string \"two\""},
    {"fraction for an integer", "{\"model\": {\"n_layer\": 2.5}}", NULL,
     "config.json: \"model.n_layer\" must be an integer, got number 2.5"},
    {"string for a boolean", "{\"moe\": {\"drop_tokens\": \"yes\"}}", NULL,
     "config.json: \"moe.drop_tokens\" must be true or false, got string \"yes\""},
    {"string for a section", "{\"optimizer\": \"adam\"}", NULL,
     "config.json: \"optimizer\" must be an object, got string \"adam\""},
    {"unknown enum value", "{\"optimizer\": {\"type\": \"adamm\"}}", NULL,
     "config.json: \"optimizer.type\" must be one of \"adamw\", \"sgd\", \"adam\", \"lamb\", \"lion\", \"muon\", "
     "got "
     "string \"adamm\""},
    {"zero stage out of range", "{\"zero_optimization\": {\"stage\": 4}}", NULL,
     "config.json: \"zero_optimization.stage\" must be one of 0, 1, 2, 3, got 4"},
    {"top-k below 1", "{\"moe\": {\"k\": 0}}", NULL, "config.json: \"moe.k\" must be >= 1, got 0"},
    {"capacity factor zero", "{\"moe\": {\"capacity_factor\": 0}}", NULL,
     "config.json: \"moe.capacity_factor\" must be > 0, got 0"},
    {"beta of 1", "{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}", NULL,
     "config.json: \"optimizer.params.betas[1]\" must be < 1, got 1"},
    {"one beta", "{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", NULL,
     "config.json: \"optimizer.params.betas\" must be an array of 2 numbers, got an array"},
    {"null seed", "{\"seed\": null}", NULL, "config.json: \"seed\" must be an integer, got null"},
    {"trailing comma", "{\n  \"seed\": 1,\n  \"model\": {\"n_layer\": 2,}\n}\n", NULL,
     "config.json:3:27: malformed JSON near `\"model\": {\"n_layer\": 2,}`"},
    {"truncated file", "{\"seed\": 1", NULL, "config.json:1:11: malformed JSON: unexpected end of input"},
    {"array at the top", "[1, 2]", NULL, "config.json: the top level must be a JSON object, got an array"},
    {"duplicate key", "{\"seed\": 1, \"seed\": 2}", NULL, "config.json: duplicate key \"seed\""},
    {"d_model not divisible by n_head", "{\"model\": {\"d_model\": 100, \"n_head\": 12}}", NULL,
     "config.json: \"model.d_model\" 100 is not divisible by \"model.n_head\" 12"},
    {"n_head not divisible by n_kv_head", "{\"model\": {\"n_head\": 12, \"n_kv_head\": 5}}", NULL,
     "config.json: \"model.n_head\" 12 is not divisible by \"model.n_kv_head\" 5"},
    {"odd head size with RoPE", "{\"model\": {\"arch\": \"llama\", \"d_model\": 36, \"n_head\": 12}}", NULL,
     "config.json: head size \"model.d_model\" 36 / \"model.n_head\" 12 = 3 must be even for RoPE (model.arch "
     "\"llama\")"},
    {"top-k above the expert count",
     "{\"model\": {\"arch\": \"gpt-moe\"}, \"moe\": {\"num_experts\": 2, \"k\": 3}}", NULL,
     "config.json: \"moe.k\" 3 exceeds \"moe.num_experts\" 2"},
    {"experts not divisible by ep_size",
     "{\"model\": {\"arch\": \"gpt-moe\"}, \"moe\": {\"num_experts\": 6, \"ep_size\": 4}}", NULL,
     "config.json: \"moe.num_experts\" 6 is not divisible by \"moe.ep_size\" 4"},
    {"experts on a dense model", "{\"moe\": {\"num_experts\": 8}}", NULL,
     "config.json: \"moe.num_experts\" is 8 but model.arch \"gpt\" has no MoE layers (use \"gpt-moe\" or "
     "\"mixtral\")"},
    {"MoE model without experts", "{\"model\": {\"arch\": \"mixtral\"}}", NULL,
     "config.json: model.arch \"mixtral\" needs \"moe.num_experts\" >= 1"},
    {"RSample with top-2",
     "{\"model\": {\"arch\": \"gpt-moe\"}, \"moe\": {\"num_experts\": 4, \"k\": 2, \"noisy_gate_policy\": "
     "\"RSample\"}}",
     NULL, "config.json: \"moe.noisy_gate_policy\" \"RSample\" works only with \"moe.k\" 1, got 2"},
    {"MoE layer frequency beyond the depth",
     "{\"model\": {\"arch\": \"gpt-moe\", \"n_layer\": 2}, \"moe\": {\"num_experts\": 4, \"layer_freq\": 3}}",
     NULL, "config.json: \"moe.layer_freq\" 3 exceeds \"model.n_layer\" 2, so no layer would have experts"},
    {"interleaved without virtual stages", "{\"pipeline\": {\"stages\": 2, \"schedule\": \"interleaved\"}}", NULL,
     "config.json: \"pipeline.schedule\" \"interleaved\" needs \"pipeline.virtual_stages\" >= 2, got 1"},
    {"virtual stages without interleaving", "{\"pipeline\": {\"virtual_stages\": 2}}", NULL,
     "config.json: \"pipeline.virtual_stages\" 2 needs \"pipeline.schedule\" \"interleaved\", got \"1f1b\""},
    {"unknown partition method", "{\"pipeline\": {\"partition_method\": \"best\"}}", NULL,
     "config.json: \"pipeline.partition_method\" must be \"uniform\", \"parameters\" or \"type:REGEX\", got "
     "\"best\""},
    {"invalid partition regex", "{\"pipeline\": {\"partition_method\": \"type:(block\"}}", NULL,
     "config.json: \"pipeline.partition_method\" has an invalid regular expression \"(block\": "},
    {"warmup longer than the schedule",
     "{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 2000, "
     "\"total_num_steps\": "
     "1000}}}",
     NULL,
     "config.json: \"scheduler.params.warmup_num_steps\" 2000 exceeds \"scheduler.params.total_num_steps\" 1000 "
     "(WarmupCosineLR)"},
    {"warmup from above",
     "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.01, \"warmup_max_lr\": 0.001}}}",
     NULL,
     "config.json: \"scheduler.params.warmup_min_lr\" 0.01 exceeds \"scheduler.params.warmup_max_lr\" 0.001 "
     "(WarmupLR)"},
    {"save interval without a directory", "{\"checkpoint\": {\"save_interval\": 100}}", NULL,
     "config.json: \"checkpoint.save_interval\" 100 needs \"checkpoint.save_dir\""},
    {"evaluation without held-out data", "{\"train\": {\"eval_interval\": 50}}", NULL,
     "config.json: \"train.eval_interval\" 50 needs \"data.val_fraction\" > 0 (no held-out data to evaluate on)"},
    {"non-contiguous gradients", "{}", "zero_optimization.contiguous_gradients=false",
     "config.json: \"zero_optimization.contiguous_gradients\" false is not supported: dsc keeps every gradient"},
    {"NCCL for a CPU training job", "{\"comm\": {\"backend\": \"nccl\"}}", NULL,
     "config.json: \"comm.backend\" \"nccl\" is not possible for training: dsc trains on the CPU"},
    {"override of an unknown key", "{}", "optimizer.parms.lr=1",
     "config.json: --set \"optimizer.parms.lr=1\": unknown key \"optimizer.parms\" (did you mean "
     "\"optimizer.params\"?)"},
    {"override with the wrong type", "{}", "pipeline.stages=two",
     "config.json: --set \"pipeline.stages=two\": \"pipeline.stages\" must be an integer, got string \"two\""},
    {"override without a value", "{}", "pipeline.stages",
     "config.json: --set \"pipeline.stages\": expected KEY=VALUE"},
    {"override below a value", "{}", "seed.low=1",
     "config.json: --set \"seed.low=1\": \"seed\" is a value, not a section, so \"seed.low\" does not exist"},
};

static void test_bad_config(void **state) {
    const bad_case *k = *state;
    dsc_config c;
    const char *sets[] = {k->set};
    dsc_status st = dsc_config_parse_string(k->json, "config.json", sets, k->set ? 1 : 0, &c);
    if (!st) dsc_config_free(&c);
    assert_err(st, DSC_ERR_CONFIG, k->message);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--print-reference") == 0) {
        char *table;
        dsc_status st = dsc_config_reference_markdown(&table);
        if (st) return fprintf(stderr, "%s\n", dsc_status_message(st)), 1;
        fputs(table, stdout);
        free(table);
        return 0;
    }
    enum { N_FIXED = 7, N_BAD = sizeof bad_cases / sizeof bad_cases[0] };
    struct CMUnitTest tests[N_FIXED + N_BAD] = {
        cmocka_unit_test(test_defaults_and_auto_values),
        cmocka_unit_test(test_deepspeed_style_file),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_batch_rule),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_reference_table_in_docs),
    };
    for (size_t i = 0; i < N_BAD; i++)
        tests[N_FIXED + i] =
            (struct CMUnitTest){bad_cases[i].name, test_bad_config, NULL, NULL, (void *)&bad_cases[i]};
    return _cmocka_run_group_tests("test_config", tests, N_FIXED + N_BAD, NULL, NULL);
}
