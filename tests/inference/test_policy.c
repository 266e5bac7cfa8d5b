#define _POSIX_C_SOURCE 200809L /* mkdtemp */
/* Parameters, containers and policies: every malformed mapping table is
 * refused when its policy is registered (unknown target parameter, unknown
 * dependency, a dependency mapped twice or not at all, wrong wildcard
 * counts), naming the entry, and nothing is registered; the registry finds
 * the built-in architectures and names the registered ones otherwise;
 * loading a checkpoint with an extra, missing or misshapen tensor fails
 * naming it, ignored names are skipped; unsupported configs are refused by
 * key; finalized weights are fused as declared (q | k | v rows). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/inference.h"
#include "dsc/safetensors.h"
#include "test_mpi.h"

#define LLAMA DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama"

static const dsc_param_def params[] = {
    {"qkv",
     DSC_PARAM_ROLE_QKV_W,
     DSC_SLOT_WHEN_ALWAYS,
     false,
     3,
     {{"q", DSC_DIM_Q, DSC_DIM_C}, {"k", DSC_DIM_KV, DSC_DIM_C}, {"v", DSC_DIM_KV, DSC_DIM_C}}},
    {"experts", DSC_PARAM_ROLE_MOE2_W, DSC_SLOT_WHEN_ALWAYS, true, 1, {{"down", DSC_DIM_C, DSC_DIM_F}}},
};

static dsc_status configure_never(dsc_infer_model_config *mc, const char *json, const char *source) {
    (void)mc;
    (void)json;
    return dsc_error(DSC_ERR_INTERNAL, "%s: not used", source);
}

/* Registers a policy whose layer container has `mappings`; returns the status. */
static dsc_status try_register(const char *arch, const dsc_param_mapping *mappings, int n) {
    static dsc_container_def layers[16];
    static dsc_policy policies[16];
    static int used;
    static const dsc_param_mapping outer_map[] = {
        {"embed.weight", "qkv.q"}, {"k.weight", "qkv.k"}, {"v.weight", "qkv.v"}, {"down.*", "experts.down"}};
    static const dsc_container_def outer = {"outer", 2, params, 4, outer_map};
    assert_true(used < 16);
    layers[used] = (dsc_container_def){"test_layer", 2, params, n, mappings};
    policies[used] = (dsc_policy){arch, configure_never, "layers.", &layers[used], &outer, NULL, NULL};
    return dsc_policy_register(&policies[used++]);
}

static void test_mapping_validation(void **state) {
    (void)state;
    const dsc_param_mapping good[] = {
        {"q.weight", "qkv.q"}, {"k.weight", "qkv.k"}, {"v.weight", "qkv.v"}, {"experts.*.w2", "experts.down"}};
    const dsc_param_mapping unknown_param[] = {{"q.weight", "qkv.q"},
                                               {"k.weight", "qkv.k"},
                                               {"v.weight", "qkv.v"},
                                               {"experts.*.w2", "experts.down"},
                                               {"o.weight", "attn_out.w"}};
    const dsc_param_mapping unknown_dep[] = {
        {"q.weight", "qkv.q"}, {"k.weight", "qkv.k"}, {"v.weight", "qkv.z"}, {"experts.*.w2", "experts.down"}};
    const dsc_param_mapping twice[] = {{"q.weight", "qkv.q"},
                                       {"k.weight", "qkv.k"},
                                       {"v.weight", "qkv.v"},
                                       {"qq.weight", "qkv.q"},
                                       {"experts.*.w2", "experts.down"}};
    const dsc_param_mapping unmapped[] = {
        {"q.weight", "qkv.q"}, {"k.weight", "qkv.k"}, {"experts.*.w2", "experts.down"}};
    const dsc_param_mapping no_star[] = {
        {"q.weight", "qkv.q"}, {"k.weight", "qkv.k"}, {"v.weight", "qkv.v"}, {"experts.w2", "experts.down"}};
    const dsc_param_mapping two_stars[] = {
        {"q.weight", "qkv.q"}, {"k.weight", "qkv.k"}, {"v.weight", "qkv.v"}, {"experts.*.w2.*", "experts.down"}};
    const dsc_param_mapping plain_star[] = {
        {"q.*.weight", "qkv.q"}, {"k.weight", "qkv.k"}, {"v.weight", "qkv.v"}, {"experts.*.w2", "experts.down"}};
    const dsc_param_mapping no_dot[] = {
        {"q.weight", "qkv"}, {"k.weight", "qkv.k"}, {"v.weight", "qkv.v"}, {"experts.*.w2", "experts.down"}};
    struct {
        const char *arch;
        const dsc_param_mapping *map;
        int n;
        const char *needle;
    } bad[] = {
        {"bad_unknown_param", unknown_param, 5, "'o.weight' -> 'attn_out.w': unknown target parameter"},
        {"bad_unknown_dep", unknown_dep, 4, "'v.weight' -> 'qkv.z': qkv has no such dependency"},
        {"bad_twice", twice, 5, "dependency qkv.q is mapped twice ('q.weight' and 'qq.weight')"},
        {"bad_unmapped", unmapped, 3, "dependency qkv.v is not mapped"},
        {"bad_no_star", no_star, 4, "'experts.w2' -> 'experts.down' has 0 wildcards; a per-expert target needs 1"},
        {"bad_two_stars", two_stars, 4, "has 2 wildcards; a per-expert target needs 1"},
        {"bad_plain_star", plain_star, 4, "'q.*.weight' -> 'qkv.q' has 1 wildcards; a plain target needs 0"},
        {"bad_no_dot", no_dot, 4, "'q.weight' -> 'qkv': unknown target parameter"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsc_status s = try_register(bad[i].arch, bad[i].map, bad[i].n);
        printf("%-18s %s\n", bad[i].arch, dsc_status_message(s));
        assert_err(s, DSC_ERR_INVALID, bad[i].needle);
        const dsc_policy *p;
        assert_err(dsc_policy_find(bad[i].arch, &p), DSC_ERR_UNSUPPORTED, "has no inference policy");
    }
    assert_ok(try_register("test_good", good, 4));
    const dsc_policy *p;
    assert_ok(dsc_policy_find("test_good", &p));
    assert_string_equal(p->arch, "test_good");
    assert_err(try_register("test_good", good, 4), DSC_ERR_INVALID, "already registered");
}

static void test_registry(void **state) {
    (void)state;
    const char *names[] = {
        "gpt", "llama", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const dsc_policy *p;
        assert_ok(dsc_policy_find(names[i], &p));
        assert_string_equal(p->arch, names[i]);
    }
    const dsc_policy *p;
    assert_err(dsc_policy_find("BloomForCausalLM", &p), DSC_ERR_UNSUPPORTED, "registered: gpt, llama, Llama");
    assert_ok(dsc_policy_register_builtin());
}

/* The fixture's tensors with one dropped, one added, or one reshaped. */
typedef struct edit_source {
    dsc_safetensors *st;
    const char *drop;
    const char *add;   /* an extra name, with the shape of tensor 0 */
    const char *shape; /* this tensor reports one more row */
    int64_t n_kept;
    int64_t *index; /* kept tensor indices, then -1 for the added one */
} edit_source;

static void edit_describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    edit_source *e = impl;
    dsc_safetensors_tensor t;
    dsc_safetensors_at(e->st, e->index[i] < 0 ? 0 : e->index[i], &t);
    *name = e->index[i] < 0 ? e->add : t.name;
    *ndim = t.ndim;
    memcpy(shape, t.shape, (size_t)t.ndim * sizeof *shape);
    if (e->shape && strcmp(*name, e->shape) == 0) shape[0]++;
}

static dsc_status edit_read(void *impl, int64_t i, float *dst, int64_t numel) {
    edit_source *e = impl;
    dsc_safetensors_tensor t;
    dsc_safetensors_at(e->st, e->index[i] < 0 ? 0 : e->index[i], &t);
    return dsc_safetensors_read_f32(e->st, t.name, dst, numel);
}

static dsc_status build_edited(const char *drop, const char *add, const char *reshape, dsc_infer_model **out) {
    const dsc_policy *p;
    assert_ok(dsc_policy_find("LlamaForCausalLM", &p));
    char *json = NULL;
    FILE *f = fopen(LLAMA "/config.json", "rb");
    assert_non_null(f);
    json = calloc(1, 1 << 16);
    assert_true(fread(json, 1, (1 << 16) - 1, f) > 0);
    fclose(f);
    dsc_infer_model_config mc;
    assert_ok(p->configure(&mc, json, "config.json"));
    free(json);
    edit_source e = {.drop = drop, .add = add, .shape = reshape};
    assert_ok(dsc_safetensors_open(&e.st, LLAMA));
    int64_t n = dsc_safetensors_count(e.st);
    e.index = malloc((size_t)(n + 1) * sizeof *e.index);
    for (int64_t i = 0; i < n; i++) {
        dsc_safetensors_tensor t;
        dsc_safetensors_at(e.st, i, &t);
        if (!drop || strcmp(t.name, drop) != 0) e.index[e.n_kept++] = i;
    }
    if (add) e.index[e.n_kept++] = -1;
    dsc_tensor_source src = {&e, e.n_kept, edit_describe, edit_read, NULL};
    dsc_status s = dsc_infer_model_build(p, &mc, &src, out);
    free(e.index);
    dsc_safetensors_close(e.st);
    return s;
}

static void test_load_errors(void **state) {
    (void)state;
    dsc_infer_model *m = NULL;
    assert_err(
        build_edited(NULL, "model.layers.0.mlp.extra.weight", NULL, &m), DSC_ERR_CORRUPT,
        "checkpoint tensor 'model.layers.0.mlp.extra.weight' maps to no parameter of container llama_layer");
    assert_err(build_edited(NULL, "lm_head.bias", NULL, &m), DSC_ERR_CORRUPT,
               "checkpoint tensor 'lm_head.bias' maps to no parameter of container llama_non_transformer");
    assert_err(build_edited(NULL, "model.layers.7.input_layernorm.weight", NULL, &m), DSC_ERR_CORRUPT,
               "names layer 7 but the model has 2 layers");
    assert_err(build_edited(NULL, "model.layers.0.self_attn.q_proj.bias", NULL, &m), DSC_ERR_CORRUPT,
               "maps to qkv_bias.q, which this model's config does not have");
    assert_err(build_edited("model.layers.1.self_attn.k_proj.weight", NULL, NULL, &m), DSC_ERR_CORRUPT,
               "checkpoint lacks tensor 'model.layers.1.self_attn.k_proj.weight'");
    assert_err(build_edited("lm_head.weight", NULL, NULL, &m), DSC_ERR_CORRUPT,
               "checkpoint lacks tensor 'lm_head.weight'");
    assert_err(build_edited(NULL, NULL, "model.layers.0.mlp.up_proj.weight", &m), DSC_ERR_CORRUPT,
               "'model.layers.0.mlp.up_proj.weight' has shape (49, 32), expected (48, 32) for mlp_1.up");
    assert_null(m);
    assert_ok(build_edited(NULL, "model.layers.1.self_attn.rotary_emb.inv_freq", NULL, &m));
    dsc_infer_model_destroy(m);
}

static void test_fused_layout(void **state) {
    (void)state;
    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(LLAMA, &m));
    dsc_safetensors *st;
    assert_ok(dsc_safetensors_open(&st, LLAMA));
    dsc_tensor qkv, mlp1;
    assert_ok(dsc_infer_model_param(m, 1, DSC_PARAM_ROLE_QKV_W, &qkv));
    assert_ok(dsc_infer_model_param(m, 1, DSC_PARAM_ROLE_MLP1_W, &mlp1));
    assert_int_equal(qkv.shape[0], 32 + 2 * 16);
    assert_int_equal(mlp1.shape[0], 2 * 48);
    assert_int_equal((uintptr_t)qkv.data % DSC_MEM_ALIGN, 0);
    const char *parts[] = {"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                           "model.layers.1.self_attn.v_proj.weight"};
    int64_t rows[] = {0, 32, 48}, n[] = {32 * 32, 16 * 32, 16 * 32};
    for (int i = 0; i < 3; i++) {
        float *ref = malloc((size_t)n[i] * sizeof *ref);
        assert_ok(dsc_safetensors_read_f32(st, parts[i], ref, n[i]));
        assert_memory_equal((float *)qkv.data + rows[i] * 32, ref, (size_t)n[i] * sizeof *ref);
        free(ref);
    }
    dsc_tensor absent;
    assert_err(dsc_infer_model_param(m, 0, DSC_PARAM_ROLE_QKV_B, &absent), DSC_ERR_INVALID, "no parameter");
    dsc_safetensors_close(st);
    dsc_infer_model_destroy(m);
}

static void write_config(const char *dir, const char *json) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

static void test_unsupported_configs(void **state) {
    (void)state;
    char dir[] = "/tmp/dsc_policy_XXXXXX";
    assert_non_null(mkdtemp(dir));
    dsc_infer_model *m;
    write_config(dir, "{\"architectures\": [\"BloomForCausalLM\"]}");
    assert_err(dsc_infer_model_load(dir, &m), DSC_ERR_UNSUPPORTED, "'BloomForCausalLM' has no inference policy");
    const char *base =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32, \"intermediate_size\": 48,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 128, ";
    char json[1024];
    snprintf(json, sizeof json, "%s\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}}", base);
    write_config(dir, json);
    assert_err(dsc_infer_model_load(dir, &m), DSC_ERR_UNSUPPORTED,
               "rope_scaling.rope_type 'linear' is not supported");
    snprintf(json, sizeof json, "%s\"hidden_act\": \"gelu\"}", base);
    write_config(dir, json);
    assert_err(dsc_infer_model_load(dir, &m), DSC_ERR_UNSUPPORTED, "hidden_act 'gelu' is not supported");
    snprintf(json, sizeof json, "%s\"attention_bias\": true}", base);
    write_config(dir, json);
    assert_err(dsc_infer_model_load(dir, &m), DSC_ERR_UNSUPPORTED, "attention_bias");
    snprintf(json, sizeof json, "%s\"num_key_value_heads\": 3}", base);
    write_config(dir, json);
    assert_err(dsc_infer_model_load(dir, &m), DSC_ERR_CONFIG, "multiple of num_key_value_heads (3)");
    snprintf(json, sizeof json, "%s\"num_key_value_heads\": 2}", base);
    write_config(dir, json);
    assert_err(dsc_infer_model_load(dir, &m), DSC_ERR_IO, "");
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* GPT-NeoX, GPT-2 and OPT options dsc does not compute are refused by key,
 * before any weight is looked for (a missing model.safetensors is the IO
 * error of a config that was accepted). */
static void test_family_configs(void **state) {
    (void)state;
    char dir[] = "/tmp/dsc_policy_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *neox = "{\"architectures\": [\"GPTNeoXForCausalLM\"], \"hidden_size\": 32, \"intermediate_size\": "
                       "48, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 64";
    const char *gpt2 = "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", \"n_embd\": 32, "
                       "\"n_layer\": 1, \"n_head\": 4, \"vocab_size\": 64";
    const char *opt = "{\"architectures\": [\"OPTForCausalLM\"], \"hidden_size\": 32, \"ffn_dim\": 48, "
                      "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 64";
    const struct {
        const char *base, *extra;
        dsc_code code;
        const char *msg;
    } cases[] = {
        {neox, "", DSC_ERR_IO, ""},
        {neox, ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}", DSC_ERR_UNSUPPORTED,
         "rope_scaling is not supported for GPT-NeoX"},
        {neox, ", \"rope_parameters\": {\"rope_type\": \"dynamic\"}", DSC_ERR_UNSUPPORTED,
         "rope_parameters.rope_type 'dynamic' is not supported"},
        {neox, ", \"rope_parameters\": {\"rope_type\": \"default\", \"factor\": 2}", DSC_ERR_UNSUPPORTED,
         "rope_parameters.factor is not supported"},
        {neox, ", \"rotary_pct\": 0.1", DSC_ERR_UNSUPPORTED, "rotary_pct 0.1 of head size 8 rotates 0 dims"},
        {neox, ", \"attention_bias\": false", DSC_ERR_UNSUPPORTED, "attention_bias = false"},
        {neox, ", \"hidden_act\": \"silu\"", DSC_ERR_UNSUPPORTED, "hidden_act 'silu' is not supported"},
        {gpt2, "", DSC_ERR_IO, ""},
        {gpt2, ", \"scale_attn_by_inverse_layer_idx\": true", DSC_ERR_UNSUPPORTED,
         "scale_attn_by_inverse_layer_idx = true"},
        {gpt2, ", \"scale_attn_weights\": false", DSC_ERR_UNSUPPORTED, "scale_attn_weights = false"},
        {gpt2, ", \"add_cross_attention\": true", DSC_ERR_UNSUPPORTED, "add_cross_attention = true"},
        {gpt2, ", \"n_inner\": 0", DSC_ERR_CONFIG, "n_inner = 0 is outside"},
        {opt, "", DSC_ERR_IO, ""},
        {opt, ", \"enable_bias\": false", DSC_ERR_UNSUPPORTED, "enable_bias = false"},
        {opt, ", \"layer_norm_elementwise_affine\": false", DSC_ERR_UNSUPPORTED, "layer_norm_elementwise_affine"},
        {opt, ", \"_remove_final_layer_norm\": true", DSC_ERR_UNSUPPORTED, "_remove_final_layer_norm = true"},
        {opt, ", \"activation_function\": \"swish\"", DSC_ERR_UNSUPPORTED, "activation_function 'swish'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "%s%s}", cases[i].base, cases[i].extra);
        write_config(dir, json);
        dsc_infer_model *m = NULL;
        assert_err(dsc_infer_model_load(dir, &m), cases[i].code, cases[i].msg);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mapping_validation),  cmocka_unit_test(test_registry),
        cmocka_unit_test(test_load_errors),         cmocka_unit_test(test_fused_layout),
        cmocka_unit_test(test_unsupported_configs), cmocka_unit_test(test_family_configs)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
