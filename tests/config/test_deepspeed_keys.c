/* DeepSpeed users' config files: every problem of a file reported in one run,
 * DeepSpeed's keys known (implemented, by design, or refused with the reason),
 * typo hints that do not mistake a DeepSpeed key for a short dsc one, the
 * Hugging Face Trainer's "auto" values resolved as the Trainer resolves them,
 * and the real files under tests/config/deepspeed/ loading as dsc reads them.
 *
 * `test_deepspeed_keys --print-deepspeed` prints the DeepSpeed key table, to
 * paste into docs/config.md when deepspeed_keys.c changes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/config.h"
#include "runtime/config/config_impl.h"
#include "test_mpi.h"

static void expect_contains(const char *msg, const char *needle) {
    if (!strstr(msg, needle)) fail_msg("expected \"%s\" in:\n%s", needle, msg);
}

/* Five distinct problems: a typo, a wrong type, a value out of range, a
 * refused DeepSpeed feature and a rule across keys; all five in one message. */
static void test_every_problem_at_once(void **state) {
    (void)state;
    const char *json = "{\"train_micro_batch_size\": 4,"
                       " \"steps_per_print\": \"often\","
                       " \"zero_optimization\": {\"stage\": 5},"
                       " \"fp16\": {\"enabled\": true, \"auto_cast\": true},"
                       " \"model\": {\"d_model\": 100, \"n_head\": 3}}";
    dsc_config c;
    dsc_status st = dsc_config_parse_string(json, "five.json", NULL, 0, &c);
    assert_int_equal(dsc_status_code(st), DSC_ERR_CONFIG);
    const char *m = dsc_status_message(st);
    printf("%s\n", m);
    expect_contains(m, "five.json: 5 problems:");
    expect_contains(m,
                    "unknown key \"train_micro_batch_size\" (did you mean \"train_micro_batch_size_per_gpu\"?)");
    expect_contains(m, "\"steps_per_print\" must be an integer, got string \"often\"");
    expect_contains(m, "\"zero_optimization.stage\" must be one of 0, 1, 2, 3, got 5");
    expect_contains(m, "\"fp16.auto_cast\" (true) is supported by DeepSpeed, not by dsc: auto_cast casts");
    expect_contains(m, "\"model.d_model\" 100 is not divisible by \"model.n_head\" 3");
    dsc_status_free(st);
}

static void expect_error(const char *json, const char *needle) {
    dsc_config c;
    assert_err(dsc_config_parse_string(json, "config.json", NULL, 0, &c), DSC_ERR_CONFIG, needle);
}

static void expect_ok(const char *json) {
    dsc_config c;
    assert_ok(dsc_config_parse_string(json, "config.json", NULL, 0, &c));
    dsc_config_free(&c);
}

static void test_deepspeed_keys_are_known(void **state) {
    (void)state;
    /* keys dsc meets by design are accepted with DeepSpeed's usual values */
    expect_ok("{\"zero_optimization\": {\"stage\": 3, \"stage3_max_reuse_distance\": 1e9, \"sub_group_size\": 1e9,"
              " \"stage3_gather_16bit_weights_on_model_save\": true}}");
    /* a typo of a DeepSpeed key points at it, not at a short dsc key that shares its prefix */
    expect_error("{\"zero_optimization\": {\"stage3_max_reuse_distanse\": 1e9}}",
                 "config.json: unknown key \"zero_optimization.stage3_max_reuse_distanse\" (did you mean "
                 "\"zero_optimization.stage3_max_reuse_distance\"?)");
    expect_error("{\"zero_optimization\": {\"stage3_max_reuse\": 1}}", "unknown key "
                                                                       "\"zero_optimization.stage3_max_reuse\"");
    /* refused features: the reason and the alternative; their "off" values are accepted */
    expect_error(
        "{\"wandb\": {\"enabled\": true, \"project\": \"p\"}}",
        "config.json: \"wandb.enabled\" (true) is supported by DeepSpeed, not by dsc: Weights & Biases needs "
        "a network connection and a service account; use tensorboard or csv_monitor (files written "
        "locally)");
    expect_ok("{\"wandb\": {\"enabled\": false, \"project\": \"p\"}}");
    expect_error("{\"wandb\": {\"enabled\": false, \"projetc\": \"p\"}}",
                 "unknown key \"wandb.projetc\" (did you mean \"wandb.project\"?)");
    expect_ok("{\"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0}, \"bf16\": {\"enabled\": false},"
              " \"prescale_gradients\": false, \"gradient_predivide_factor\": 1.0}");
    expect_error("{\"prescale_gradients\": true}", "\"prescale_gradients\" (true) is supported by DeepSpeed");
    expect_error("{\"sparse_attention\": {\"mode\": \"fixed\"}}",
                 "\"sparse_attention\" (an object) is supported by DeepSpeed, not by dsc: block-sparse attention");
    expect_ok(
        "{\"compression_training\": {\"weight_quantization\": {\"shared_parameters\": {\"enabled\": false}}}}");
    expect_error("{\"compression_training\": {\"sparse_pruning\": {\"shared_parameters\": {\"enabled\": true}}}}",
                 "\"compression_training\" (an object) is supported by DeepSpeed, not by dsc");
    /* offload: none / cpu understood, nvme refused */
    expect_ok(
        "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": "
        "true}, \"cpu_offload\": true}}");
    expect_error(
        "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": "
        "\"/nvme\"}}}",
        "\"zero_optimization.offload_param.device\" \"nvme\" is supported by DeepSpeed, not by dsc: NVMe");
}

/* The table's "implemented" entries are the schema's keys, and no other entry is. */
static void test_table_agrees_with_schema(void **state) {
    (void)state;
    size_t count;
    const dsc_ds_key *keys = dsc_config_deepspeed_keys(&count);
    for (size_t i = 0; i < count; i++) {
        bool in_schema = dsc_config_schema_find(keys[i].path) != NULL;
        if (in_schema != (keys[i].status == DSC_DS_IMPLEMENTED))
            fail_msg("\"%s\": status %d but %s the schema", keys[i].path, (int)keys[i].status,
                     in_schema ? "in" : "not in");
        if (keys[i].status == DSC_DS_REFUSED && !keys[i].reason)
            fail_msg("\"%s\" is refused without a reason", keys[i].path);
    }
    char *md;
    assert_ok(dsc_config_deepspeed_markdown(&md));
    assert_non_null(strstr(md, "| `zero_optimization.stage3_max_reuse_distance` | implemented (by design) |"));
    assert_non_null(strstr(md, "| `wandb` | refused (accepted: `enabled=false`) |"));
    free(md);
}

/* The Trainer's "auto" values: derived where the Trainer derives them, its
 * defaults where it takes TrainingArguments (which dsc does not have). */
static void test_hf_auto_values(void **state) {
    (void)state;
    const char *json =
        "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\","
        " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\","
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": \"auto\","
        " \"eps\": \"auto\", \"weight_decay\": \"auto\"}},"
        " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\","
        " \"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}},"
        " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\","
        " \"stage3_prefetch_bucket_size\": \"auto\", \"stage3_param_persistence_threshold\": \"auto\"},"
        " \"model\": {\"d_model\": 64, \"n_head\": 4}, \"train\": {\"steps\": 50}}";
    dsc_config c;
    assert_ok(dsc_config_parse_string(json, "hf.json", NULL, 0, &c));
    assert_true(c.optimizer.params.lr == 3e-4 && c.scheduler.params.warmup_max_lr == 3e-4);
    assert_true(c.optimizer.params.betas[0] == 0.9 && c.optimizer.params.betas[1] == 0.999);
    assert_true(c.optimizer.params.eps == 1e-8 && c.optimizer.params.weight_decay == 0.0);
    assert_true(c.gradient_clipping == 1.0 && c.scheduler.params.warmup_min_lr == 0.0);
    assert_int_equal(c.scheduler.params.warmup_num_steps, 0);
    assert_int_equal(c.scheduler.params.total_num_steps, 50);
    assert_int_equal(c.zero_optimization.reduce_bucket_size, 64 * 64);
    assert_int_equal(c.zero_optimization.stage3_prefetch_bucket_size, (int64_t)floor(0.9 * 64 * 64));
    assert_int_equal(c.zero_optimization.stage3_param_persistence_threshold, 10 * 64);
    assert_ok(dsc_config_resolve_batch(&c, 2));
    assert_int_equal(c.train_micro_batch_size_per_gpu, 8);
    assert_int_equal(c.gradient_accumulation_steps, 1);
    assert_int_equal(c.train_batch_size, 16);
    dsc_config_free(&c);
    /* derived from the one that is given */
    assert_ok(dsc_config_parse_string("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": \"auto\","
                                      " \"gradient_accumulation_steps\": \"auto\"}",
                                      "hf.json", NULL, 0, &c));
    assert_ok(dsc_config_resolve_batch(&c, 2));
    assert_int_equal(c.train_micro_batch_size_per_gpu, 16);
    dsc_config_free(&c);
    /* a key the Trainer does not resolve */
    expect_error("{\"model\": {\"n_layer\": \"auto\"}}",
                 "config.json: \"model.n_layer\" is \"auto\", which dsc cannot derive for this key");
}

/* Each real file loads as dsc reads it, fp16 included, except: CIFAR asks
 * for fp16 master weights (refused: dsc's master is fp32); the BERT file
 * asks for block-sparse attention. */
static void test_real_files(void **state) {
    (void)state;
    const char *fp16_off[] = {"fp16.enabled=false"};
    const char *fp16_master_off[] = {"fp16.fp16_master_weights_and_grads=false"};
    struct {
        const char *file;
        int refused; /* 2: fp16 master weights */
        dsc_optimizer_type opt;
        dsc_lr_schedule sched;
        int stage;
    } files[] = {
        {"hf_ds_config_zero2.json", 0, DSC_OPTIMIZER_TYPE_ADAMW, DSC_LR_SCHEDULE_WARMUP_LR, 2},
        {"hf_ds_config_zero3.json", 0, DSC_OPTIMIZER_TYPE_ADAMW, DSC_LR_SCHEDULE_WARMUP_LR, 3},
        {"hf_zero_stage1_config.json", 0, DSC_OPTIMIZER_TYPE_ADAMW, DSC_LR_SCHEDULE_WARMUP_DECAY_LR, 1},
        {"dse_cifar_ds_config.json", 2, DSC_OPTIMIZER_TYPE_ADAM, DSC_LR_SCHEDULE_WARMUP_LR, 2},
        {"dse_qanet_ds_bsz512_1cycle.json", 0, DSC_OPTIMIZER_TYPE_ADAM, DSC_LR_SCHEDULE_ONE_CYCLE, 0},
        {"mds_ds_config_gbs256_mbs8_log1_zero1.json", 0, DSC_OPTIMIZER_TYPE_ADAMW, DSC_LR_SCHEDULE_CONSTANT, 1},
        {"mds_ds_config_gbs16_mbs1_log1_zero3.json", 0, DSC_OPTIMIZER_TYPE_ADAMW, DSC_LR_SCHEDULE_CONSTANT, 3},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/tests/config/deepspeed/%s", DSC_SOURCE_DIR, files[i].file);
        dsc_config c;
        const char *const *fix = fp16_master_off;
        if (files[i].refused == 2)
            assert_err(dsc_config_load_file(path, NULL, 0, &c), DSC_ERR_CONFIG,
                       "\"fp16.fp16_master_weights_and_grads\" (true) is supported by DeepSpeed, not by dsc");
        assert_ok(dsc_config_load_file(path, fix, files[i].refused != 0, &c));
        assert_int_equal(c.optimizer.type, files[i].opt);
        assert_int_equal(c.scheduler.type, files[i].sched);
        assert_int_equal(c.zero_optimization.stage, files[i].stage);
        dsc_config_free(&c);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/tests/config/deepspeed/dse_bing_bert_lamb_seq128.json", DSC_SOURCE_DIR);
    dsc_config c;
    dsc_status st = dsc_config_load_file(path, fp16_off, 1, &c);
    assert_int_equal(dsc_status_code(st), DSC_ERR_CONFIG);
    expect_contains(dsc_status_message(st),
                    "\"sparse_attention\" (an object) is supported by DeepSpeed, not by dsc");
    dsc_status_free(st);
}

/* The table in docs/config.md is deepspeed_keys.c's, byte for byte. */
static void test_table_in_docs(void **state) {
    (void)state;
    char *table;
    assert_ok(dsc_config_deepspeed_markdown(&table));
    bool same = dsc_test_doc_block_is(DSC_SOURCE_DIR "/docs/config.md", "deepspeed", table);
    free(table);
    if (!same)
        fail_msg("docs/config.md's DeepSpeed table differs; regenerate: test_deepspeed_keys --print-deepspeed");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--print-deepspeed") == 0) {
        char *table;
        dsc_status st = dsc_config_deepspeed_markdown(&table);
        if (st) return fprintf(stderr, "%s\n", dsc_status_message(st)), 1;
        fputs(table, stdout);
        free(table);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_problem_at_once),
        cmocka_unit_test(test_deepspeed_keys_are_known),
        cmocka_unit_test(test_table_agrees_with_schema),
        cmocka_unit_test(test_hf_auto_values),
        cmocka_unit_test(test_real_files),
        cmocka_unit_test(test_table_in_docs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
