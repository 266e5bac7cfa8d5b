#define _POSIX_C_SOURCE 200809L /* mkdtemp, symlink */
/* Crafted model files (issue 12, items 1 and 3): every size read from
 * config.json is range-checked before it is converted or used (a hidden size
 * of 2^32 + 32 is not 32, 1e300 positions and a zero low_freq_factor are
 * refused, naming file and key), the builder checks every size it computes
 * for overflow and every checkpoint tensor against the config before the
 * arena is allocated (a config claiming a huge model beside a small file is
 * an error, not a wrapped allocation written past its end), and a
 * tokenizer.json with an id far outside any vocabulary is refused at once.
 * Also RoPE in both spellings (item 13): rope_parameters (transformers 5)
 * and rope_theta + rope_scaling (4.x), the newer winning, unknown types and
 * keys refused by name. The files are written by the test beside the llama
 * fixture's weights. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/inference.h"
#include "dsc/memory.h"
#include "dsc/safetensors.h"
#include "dsc/tokenizer.h"
#include "test_mpi.h"

#define LLAMA DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama"

static char dir[64];

/* The llama fixture's sizes, with `extra` keys (each starting with ", ")
 * placed first: cJSON reads the first of repeated keys, so they override. */
static void write_config(const char *extra) {
    char path[128], json[2048];
    snprintf(json, sizeof json,
             "{\"architectures\": [\"LlamaForCausalLM\"]%s, \"hidden_size\": 32, \"intermediate_size\": 48, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
             "\"vocab_size\": 128, \"max_position_embeddings\": 64}",
             extra);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

static void load_fails(const char *extra, dsc_code code, const char *needle) {
    write_config(extra);
    dsc_infer_model *m = NULL;
    printf("config.json {...%s}\n", extra);
    assert_err(dsc_infer_model_load(dir, &m), code, needle);
    assert_null(m);
}

static void test_config_numbers_are_range_checked(void **state) {
    (void)state;
    write_config("");
    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(dir, &m)); /* the base config matches the weights */
    dsc_infer_model_destroy(m);
    load_fails(", \"hidden_size\": 4294967328", DSC_ERR_CONFIG,
               "config.json: hidden_size = 4294967328 is outside");
    load_fails(", \"num_hidden_layers\": 1e300", DSC_ERR_CONFIG, "num_hidden_layers = 1.0000000000000001e+300");
    load_fails(", \"vocab_size\": -128", DSC_ERR_CONFIG, "vocab_size = -128 is outside");
    load_fails(", \"intermediate_size\": 48.5", DSC_ERR_CONFIG, "intermediate_size must be an integer");
    load_fails(", \"max_position_embeddings\": 1e300", DSC_ERR_CONFIG, "max_position_embeddings = ");
    load_fails(", \"head_dim\": 1073741824", DSC_ERR_CONFIG, "head_dim = 1073741824 is outside");
    load_fails(", \"num_attention_heads\": 65536, \"num_key_value_heads\": 1, \"head_dim\": 65536", DSC_ERR_CONFIG,
               "num_attention_heads x head_dim = 65536 x 65536 exceeds");
    load_fails(", \"num_attention_heads\": 5, \"num_key_value_heads\": 1", DSC_ERR_CONFIG,
               "hidden_size (32) is not a multiple of num_attention_heads (5)");
    load_fails(", \"num_key_value_heads\": 8", DSC_ERR_CONFIG, "num_key_value_heads = 8 is outside [1, 4]");
    load_fails(", \"rms_norm_eps\": 0", DSC_ERR_CONFIG, "rms_norm_eps = 0 is outside");
    load_fails(", \"rope_theta\": -1", DSC_ERR_CONFIG, "rope_theta = -1 is outside");
    /* JSON that is not an object (found by fuzz_hf_config: it leaked the parsed value). */
    const dsc_policy *p;
    assert_ok(dsc_policy_find("LlamaForCausalLM", &p));
    dsc_infer_model_config mc;
    assert_err(p->configure(&mc, "[1, 2]", "config.json"), DSC_ERR_CORRUPT, "config.json: not a JSON object");
    const char *llama3 = ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": %s, "
                         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": %s}";
    char extra[512];
    snprintf(extra, sizeof extra, llama3, "1", "1e300");
    load_fails(extra, DSC_ERR_CONFIG, "rope_scaling.original_max_position_embeddings = 1.0000000000000001e+300");
    snprintf(extra, sizeof extra, llama3, "0", "16");
    load_fails(extra, DSC_ERR_CONFIG, "rope_scaling.low_freq_factor = 0 is outside");
}

static const dsc_infer_model_config *load_config(const char *extra, dsc_infer_model **m) {
    write_config(extra);
    assert_ok(dsc_infer_model_load(dir, m));
    return dsc_infer_model_get_config(*m);
}

/* Issue 12, item 13: transformers 5 writes rope_parameters, 4.x rope_theta +
 * rope_scaling; either is read, the newer wins, unknown types and keys are refused. */
static void test_rope_spellings(void **state) {
    (void)state;
    dsc_infer_model *m;
    const dsc_infer_model_config *mc =
        load_config(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000.0}", &m);
    assert_true(mc->rope_theta == 1000.0 && mc->rope_scaling == DSC_ROPE_SCALING_NONE);
    dsc_infer_model_destroy(m);
    mc = load_config(", \"rope_theta\": 5.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 2, "
                     "\"original_max_position_embeddings\": 16}, \"rope_parameters\": {\"rope_type\": "
                     "\"default\", \"rope_theta\": 1000.0}",
                     &m);
    assert_true(mc->rope_theta == 1000.0 && mc->rope_scaling == DSC_ROPE_SCALING_NONE);
    dsc_infer_model_destroy(m);
    mc = load_config(", \"rope_theta\": 500.0, \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 2, "
                     "\"low_freq_factor\": 1, \"high_freq_factor\": 3, \"original_max_position_embeddings\": 16}",
                     &m);
    assert_true(mc->rope_theta == 500.0 && mc->rope_scaling == DSC_ROPE_SCALING_LLAMA3 && mc->rope_factor == 2 &&
                mc->rope_high_freq_factor == 3 && mc->rope_original_max_positions == 16);
    dsc_infer_model_destroy(m);
    mc = load_config(", \"rope_theta\": 500.0, \"rope_scaling\": null", &m);
    assert_true(mc->rope_theta == 500.0 && mc->rope_scaling == DSC_ROPE_SCALING_NONE);
    dsc_infer_model_destroy(m);
    load_fails(", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000, \"factor\": 4}",
               DSC_ERR_UNSUPPORTED,
               "rope_parameters.rope_type 'yarn' is not supported (only 'default' and 'llama3')");
    load_fails(", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}", DSC_ERR_UNSUPPORTED,
               "rope_scaling.rope_type 'dynamic' is not supported");
    load_fails(", \"rope_parameters\": {\"rope_theta\": 10000}", DSC_ERR_CONFIG,
               "rope_parameters.rope_type is missing");
    load_fails(", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}",
               DSC_ERR_UNSUPPORTED, "rope_parameters.partial_rotary_factor is not supported");
    load_fails(", \"rope_parameters\": [1]", DSC_ERR_CONFIG, "rope_parameters must be an object");
    load_fails(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 0}", DSC_ERR_CONFIG,
               "rope_parameters.rope_theta = 0 is outside");
}

/* ---- the builder, fed a config directly (as a dsc checkpoint's policy would) ---- */

static void st_describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    dsc_safetensors_tensor t;
    dsc_safetensors_at(impl, i, &t);
    *name = t.name;
    *ndim = t.ndim;
    memcpy(shape, t.shape, (size_t)t.ndim * sizeof *shape);
}

static dsc_status st_read(void *impl, int64_t i, float *dst, int64_t numel) {
    dsc_safetensors_tensor t;
    dsc_safetensors_at(impl, i, &t);
    return dsc_safetensors_read_f32(impl, t.name, dst, numel);
}

/* Builds the llama policy for `mc` over the fixture's tensors; asserts no
 * parameter memory is left behind (and, on failure, none was allocated). */
static dsc_status build(const dsc_infer_model_config *mc) {
    const dsc_policy *p;
    assert_ok(dsc_policy_find("LlamaForCausalLM", &p));
    dsc_safetensors *st;
    assert_ok(dsc_safetensors_open(&st, LLAMA));
    dsc_tensor_source src = {st, dsc_safetensors_count(st), st_describe, st_read, NULL};
    dsc_mem_stats before, after;
    dsc_mem_get_stats(&before);
    dsc_infer_model *m = NULL;
    dsc_status s = dsc_infer_model_build(p, mc, &src, &m);
    dsc_mem_get_stats(&after);
    if (s) {
        assert_null(m);
        assert_int_equal(after.peak[DSC_MEM_PARAMS], before.peak[DSC_MEM_PARAMS]);
    }
    dsc_infer_model_destroy(m);
    dsc_safetensors_close(st);
    return s;
}

static dsc_infer_model_config fixture_config(void) {
    return (dsc_infer_model_config){.family = DSC_INFER_FAMILY_LLAMA,
                                    .n_layer = 2,
                                    .d_model = 32,
                                    .n_head = 4,
                                    .n_kv_head = 2,
                                    .head_size = 8,
                                    .d_ff = 48,
                                    .vocab_size = 128,
                                    .max_positions = 64,
                                    .norm_eps = 1e-5f,
                                    .rope_theta = 10000.0};
}

static void test_builder_checks_sizes_before_allocating(void **state) {
    (void)state;
    dsc_infer_model_config mc = fixture_config();
    assert_ok(build(&mc));
    /* vocab x d_model = (2^31 - 1)^2 elements: the arena size overflows int64. */
    mc.vocab_size = mc.d_model = INT32_MAX;
    assert_err(build(&mc), DSC_ERR_CONFIG, "the model's size overflows");
    /* 2^44 floats, no overflow: refused by the first tensor's shape, before allocating 64 TiB. */
    mc = fixture_config();
    mc.d_model = 1 << 20;
    mc.vocab_size = 1 << 24;
    assert_err(build(&mc), DSC_ERR_CORRUPT, "expected (");
    /* Heads x head size far beyond hidden_size: the projections' shapes say otherwise. */
    mc = fixture_config();
    mc.head_size = 1 << 28;
    assert_err(build(&mc), DSC_ERR_CORRUPT, "has shape (16, 32), expected (536870912, 32) for qkv.k");
    /* More layers (and set flags) than any file could back. */
    mc = fixture_config();
    mc.n_layer = 1 << 30;
    assert_err(build(&mc), DSC_ERR_CORRUPT,
               "the config has 1073741824 layers but the checkpoint holds 21 tensors");
    mc = fixture_config();
    mc.rope_scaling = DSC_ROPE_SCALING_LLAMA3;
    mc.rope_factor = 8;
    mc.rope_high_freq_factor = 4;
    mc.rope_original_max_positions = 16;
    assert_err(build(&mc), DSC_ERR_CONFIG, "0 < low_freq_factor");
    mc.rope_low_freq_factor = 1;
    assert_ok(build(&mc));
}

static void test_tokenizer_ids_are_bounded(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2147483646}, \"merges\": []}}", f);
    fclose(f);
    dsc_tokenizer *tok = NULL;
    assert_err(dsc_tokenizer_load(&tok, path), DSC_ERR_CORRUPT, "model.vocab of b is 2147483646, not an id in");
    f = fopen(path, "wb");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
          "\"added_tokens\": [{\"id\": 1e300, \"content\": \"<x>\"}]}",
          f);
    fclose(f);
    assert_err(dsc_tokenizer_load(&tok, path), DSC_ERR_CORRUPT, "added_tokens[].id of an added token is 1");
    assert_null(tok);
    unlink(path);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/dsc_crafted_XXXXXX");
    assert_non_null(mkdtemp(dir));
    char link[128];
    snprintf(link, sizeof link, "%s/model.safetensors", dir);
    assert_int_equal(symlink(LLAMA "/model.safetensors", link), 0);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_numbers_are_range_checked),
        cmocka_unit_test(test_rope_spellings),
        cmocka_unit_test(test_builder_checks_sizes_before_allocating),
        cmocka_unit_test(test_tokenizer_ids_are_bounded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
