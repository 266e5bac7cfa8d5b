/* Policies for Hugging Face Llama-family checkpoints: LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases) and
 * MixtralForCausalLM (top-k MoE). Each parses config.json into the model
 * config (unsupported options are errors naming the key) and declares its
 * containers: the mapping from HF tensor names to fused parameters.
 * Not here: reading tensors (load_hf.c) or the forward (model_forward.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "inference/hf_config.h"
#include "inference/model_internal.h"
#include "inference/policy_params.h"

/* ---- containers ----------------------------------------------------------------------------- */

static const dsc_param_def dense_params[] = {
    DSC_POLICY_LLAMA_ATTN_PARAMS,
    {"mlp_1",
     DSC_PARAM_ROLE_MLP1_W,
     DSC_SLOT_WHEN_ALWAYS,
     false,
     2,
     {{"gate", DSC_DIM_F, DSC_DIM_C}, {"up", DSC_DIM_F, DSC_DIM_C}}},
    {"mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_ALWAYS, false, 1, {{"down", DSC_DIM_C, DSC_DIM_F}}},
};
static const dsc_param_mapping dense_mappings[] = {
    DSC_POLICY_HF_ATTN_MAPPINGS,
    {"mlp.gate_proj.weight", "mlp_1.gate"},
    {"mlp.up_proj.weight", "mlp_1.up"},
    {"mlp.down_proj.weight", "mlp_2.down"},
};
const dsc_container_def dsc_policy_hf_dense_layer = {
    "llama_layer", sizeof dense_params / sizeof dense_params[0], dense_params,
    sizeof dense_mappings / sizeof dense_mappings[0], dense_mappings};

static const dsc_param_def moe_params[] = {
    DSC_POLICY_LLAMA_ATTN_PARAMS,
    {"moe_gate", DSC_PARAM_ROLE_ROUTER_W, DSC_SLOT_WHEN_ALWAYS, false, 1, {{"w", DSC_DIM_E, DSC_DIM_C}}},
    {"moe_mlp_1",
     DSC_PARAM_ROLE_MOE1_W,
     DSC_SLOT_WHEN_ALWAYS,
     true,
     2,
     {{"gate", DSC_DIM_F, DSC_DIM_C}, {"up", DSC_DIM_F, DSC_DIM_C}}},
    {"moe_mlp_2", DSC_PARAM_ROLE_MOE2_W, DSC_SLOT_WHEN_ALWAYS, true, 1, {{"down", DSC_DIM_C, DSC_DIM_F}}},
};
static const dsc_param_mapping moe_mappings[] = {
    DSC_POLICY_HF_ATTN_MAPPINGS,
    {"block_sparse_moe.gate.weight", "moe_gate.w"},
    {"block_sparse_moe.experts.*.w1.weight", "moe_mlp_1.gate"},
    {"block_sparse_moe.experts.*.w3.weight", "moe_mlp_1.up"},
    {"block_sparse_moe.experts.*.w2.weight", "moe_mlp_2.down"},
};
static const dsc_container_def moe_layer = {"mixtral_layer", sizeof moe_params / sizeof moe_params[0], moe_params,
                                            sizeof moe_mappings / sizeof moe_mappings[0], moe_mappings};

static const dsc_param_def outer_params[] = {
    {"embed", DSC_PARAM_ROLE_EMBED, DSC_SLOT_WHEN_ALWAYS, false, 1, {{"w", DSC_DIM_V, DSC_DIM_C}}},
    {"final_norm", DSC_PARAM_ROLE_FINAL_NORM_W, DSC_SLOT_WHEN_ALWAYS, false, 1, {{"w", DSC_DIM_C, DSC_DIM_NONE}}},
    {"lm_head", DSC_PARAM_ROLE_UNEMBED, DSC_SLOT_WHEN_UNTIED, false, 1, {{"w", DSC_DIM_V, DSC_DIM_C}}},
};
static const dsc_param_mapping outer_mappings[] = {
    {"model.embed_tokens.weight", "embed.w"},
    {"model.norm.weight", "final_norm.w"},
    {"lm_head.weight", "lm_head.w"},
};
const dsc_container_def dsc_policy_hf_outer = {"llama_non_transformer",
                                               sizeof outer_params / sizeof outer_params[0], outer_params,
                                               sizeof outer_mappings / sizeof outer_mappings[0], outer_mappings};

static const char *const ignored[] = {"model.layers.*.self_attn.rotary_emb.inv_freq", NULL};

/* ---- config.json ------------------------------------------------------------------------------- */

typedef enum hf_variant { HF_LLAMA, HF_MISTRAL, HF_QWEN2, HF_MIXTRAL } hf_variant;

/* Refuses keys of a RoPE object that dsc would otherwise ignore. */
static dsc_status only_keys(const json_reader *r, const char *const *known) {
    for (const cJSON *kv = r->obj->child; kv; kv = kv->next) {
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++)
            ok = strcmp(kv->string, *k) == 0;
        DSC_CHECK(ok, DSC_ERR_UNSUPPORTED, "%s: %s%s is not supported for this rope_type", r->source, r->prefix,
                  kv->string);
    }
    return NULL;
}

/* RoPE in either spelling: transformers >= 5 writes rope_parameters
 * {rope_type, rope_theta, <scaling keys>}; older files write rope_theta at
 * the top level and rope_scaling {rope_type | type, <scaling keys>} (or
 * null). When both are present the newer spelling wins. rope_type "default"
 * is plain RoPE, "llama3" Llama-3's frequency scaling; any other type is
 * refused by name. */
static dsc_status parse_rope(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    bool newer = params && !cJSON_IsNull(params);
    json_reader top = {root, source, ""};
    json_reader r = {newer ? params : cJSON_GetObjectItemCaseSensitive(root, "rope_scaling"), source,
                     newer ? "rope_parameters." : "rope_scaling."};
    DSC_TRY(get_num(&top, "rope_theta", 10000.0, 0, 1e12, &mc->rope_theta));
    if (newer) DSC_TRY(get_num(&r, "rope_theta", mc->rope_theta, 0, 1e12, &mc->rope_theta));
    if (!newer && (!r.obj || cJSON_IsNull(r.obj))) return NULL;
    DSC_CHECK(cJSON_IsObject(r.obj), DSC_ERR_CONFIG, "%s: %.*s must be an object", source,
              (int)strlen(r.prefix) - 1, r.prefix);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(r.obj, "rope_type");
    if (!newer && !cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(r.obj, "type");
    DSC_CHECK(cJSON_IsString(type), DSC_ERR_CONFIG, "%s: %srope_type is missing or not a string", source,
              r.prefix);
    if (strcmp(type->valuestring, "default") == 0) {
        static const char *const known[] = {"rope_type", "type", "rope_theta", NULL};
        return only_keys(&r, known);
    }
    DSC_CHECK(strcmp(type->valuestring, "llama3") == 0, DSC_ERR_UNSUPPORTED,
              "%s: %srope_type '%s' is not supported (only 'default' and 'llama3')", source, r.prefix,
              type->valuestring);
    static const char *const known[] = {"rope_type",
                                        "type",
                                        "rope_theta",
                                        "factor",
                                        "low_freq_factor",
                                        "high_freq_factor",
                                        "original_max_position_embeddings",
                                        NULL};
    DSC_TRY(only_keys(&r, known));
    mc->rope_scaling = DSC_ROPE_SCALING_LLAMA3;
    DSC_TRY(get_num(&r, "factor", 8.0, 0, 1e6, &mc->rope_factor));
    DSC_TRY(get_num(&r, "low_freq_factor", 1.0, 0, 1e6, &mc->rope_low_freq_factor));
    DSC_TRY(get_num(&r, "high_freq_factor", 4.0, 0, 1e6, &mc->rope_high_freq_factor));
    DSC_TRY(get_int(&r, "original_max_position_embeddings", false, 8192, 1, INT32_MAX,
                    &mc->rope_original_max_positions));
    DSC_CHECK(mc->rope_high_freq_factor > mc->rope_low_freq_factor, DSC_ERR_CONFIG,
              "%s: %shigh_freq_factor (%g) must exceed low_freq_factor (%g)", source, r.prefix,
              mc->rope_high_freq_factor, mc->rope_low_freq_factor);
    return NULL;
}

static dsc_status parse_hf(dsc_infer_model_config *mc, const cJSON *root, const char *source, hf_variant variant) {
    json_reader r = {root, source, ""};
    int64_t v;
    *mc = (dsc_infer_model_config){.family = DSC_INFER_FAMILY_LLAMA};
    DSC_TRY(get_i32(&r, "hidden_size", true, 0, 1, MAX_DIM, &mc->d_model));
    DSC_TRY(get_i32(&r, "intermediate_size", true, 0, 1, MAX_DIM, &mc->d_ff));
    DSC_TRY(get_i32(&r, "num_hidden_layers", true, 0, 1, MAX_COUNT, &mc->n_layer));
    DSC_TRY(get_i32(&r, "num_attention_heads", true, 0, 1, MAX_COUNT, &mc->n_head));
    DSC_TRY(get_i32(&r, "num_key_value_heads", false, mc->n_head, 1, mc->n_head, &mc->n_kv_head));
    DSC_TRY(get_i32(&r, "vocab_size", true, 0, 1, MAX_VOCAB, &mc->vocab_size));
    DSC_TRY(get_int(&r, "max_position_embeddings", false, 4096, 1, INT32_MAX, &mc->max_positions));
    DSC_CHECK(mc->n_head % mc->n_kv_head == 0, DSC_ERR_CONFIG,
              "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", source, mc->n_head,
              mc->n_kv_head);
    /* Without head_dim the heads split hidden_size evenly; with it, heads x
     * head_dim is the attention width, which the q/k/v/o shapes must match. */
    bool has_head_dim = cJSON_GetObjectItemCaseSensitive(root, "head_dim") &&
                        !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "head_dim"));
    DSC_CHECK(has_head_dim || mc->d_model % mc->n_head == 0, DSC_ERR_CONFIG,
              "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d) and there is no head_dim",
              source, mc->d_model, mc->n_head);
    DSC_TRY(get_i32(&r, "head_dim", false, mc->d_model / mc->n_head, 1, MAX_COUNT, &mc->head_size));
    DSC_CHECK(mc->head_size % 2 == 0, DSC_ERR_CONFIG, "%s: head_dim (%d) must be even", source, mc->head_size);
    DSC_CHECK((int64_t)mc->n_head * mc->head_size <= MAX_DIM, DSC_ERR_CONFIG,
              "%s: num_attention_heads x head_dim = %d x %d exceeds %d", source, mc->n_head, mc->head_size,
              MAX_DIM);
    double eps;
    DSC_TRY(get_num(&r, "rms_norm_eps", 1e-6, 0, 1, &eps));
    mc->norm_eps = (float)eps;
    mc->tie_embeddings = get_bool(root, "tie_word_embeddings", false);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    DSC_CHECK(!act || (cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0), DSC_ERR_UNSUPPORTED,
              "%s: hidden_act '%s' is not supported (only 'silu')", source,
              cJSON_IsString(act) ? act->valuestring : "?");
    DSC_CHECK(!get_bool(root, "attention_bias", false), DSC_ERR_UNSUPPORTED,
              "%s: attention_bias = true is not supported", source);
    DSC_CHECK(!get_bool(root, "mlp_bias", false), DSC_ERR_UNSUPPORTED, "%s: mlp_bias = true is not supported",
              source);
    DSC_TRY(parse_rope(mc, root, source));
    mc->qkv_bias = variant == HF_QWEN2;
    if (variant == HF_QWEN2)
        DSC_CHECK(!get_bool(root, "use_sliding_window", false), DSC_ERR_UNSUPPORTED,
                  "%s: use_sliding_window = true is not supported", source);
    if (variant == HF_MISTRAL || variant == HF_MIXTRAL) {
        /* dsc attends over the whole context: sequences stay within the window. */
        DSC_TRY(get_int(&r, "sliding_window", false, mc->max_positions, 0, INT32_MAX, &v));
        if (v > 0 && v < mc->max_positions) mc->max_positions = v;
    }
    if (variant == HF_MIXTRAL) {
        DSC_TRY(get_i32(&r, "num_local_experts", true, 0, 1, MAX_COUNT, &mc->n_experts));
        DSC_TRY(get_i32(&r, "num_experts_per_tok", true, 0, 1, mc->n_experts, &mc->top_k));
    }
    return NULL;
}

static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source, hf_variant variant) {
    cJSON *root = cJSON_Parse(json);
    dsc_status s = cJSON_IsObject(root) ? parse_hf(mc, root, source, variant)
                                        : dsc_error(DSC_ERR_CORRUPT, "%s: not a JSON object", source);
    cJSON_Delete(root);
    return s;
}

static dsc_status configure_llama(dsc_infer_model_config *mc, const char *json, const char *source) {
    return configure(mc, json, source, HF_LLAMA);
}
static dsc_status configure_mistral(dsc_infer_model_config *mc, const char *json, const char *source) {
    return configure(mc, json, source, HF_MISTRAL);
}
static dsc_status configure_qwen2(dsc_infer_model_config *mc, const char *json, const char *source) {
    return configure(mc, json, source, HF_QWEN2);
}
static dsc_status configure_mixtral(dsc_infer_model_config *mc, const char *json, const char *source) {
    return configure(mc, json, source, HF_MIXTRAL);
}

const dsc_policy dsc_policy_hf_llama = {"LlamaForCausalLM",
                                        configure_llama,
                                        "model.layers.",
                                        &dsc_policy_hf_dense_layer,
                                        &dsc_policy_hf_outer,
                                        ignored,
                                        NULL};
const dsc_policy dsc_policy_hf_mistral = {"MistralForCausalLM",
                                          configure_mistral,
                                          "model.layers.",
                                          &dsc_policy_hf_dense_layer,
                                          &dsc_policy_hf_outer,
                                          ignored,
                                          NULL};
const dsc_policy dsc_policy_hf_qwen2 = {"Qwen2ForCausalLM",
                                        configure_qwen2,
                                        "model.layers.",
                                        &dsc_policy_hf_dense_layer,
                                        &dsc_policy_hf_outer,
                                        ignored,
                                        NULL};
const dsc_policy dsc_policy_hf_mixtral = {
    "MixtralForCausalLM", configure_mixtral, "model.layers.", &moe_layer, &dsc_policy_hf_outer, ignored, NULL};
