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

#include "inference/model_internal.h"
#include "inference/policy_params.h"

/* ---- containers ----------------------------------------------------------------------------- */

#define ATTN_MAPPINGS                                                                                             \
    {"input_layernorm.weight", "attn_norm.w"}, {"self_attn.q_proj.weight", "qkv.q"},                              \
        {"self_attn.k_proj.weight", "qkv.k"}, {"self_attn.v_proj.weight", "qkv.v"},                               \
        {"self_attn.q_proj.bias", "qkv_bias.q"}, {"self_attn.k_proj.bias", "qkv_bias.k"},                         \
        {"self_attn.v_proj.bias", "qkv_bias.v"}, {"self_attn.o_proj.weight", "attn_out.w"}, {                     \
        "post_attention_layernorm.weight", "mlp_norm.w"                                                           \
    }

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
    ATTN_MAPPINGS,
    {"mlp.gate_proj.weight", "mlp_1.gate"},
    {"mlp.up_proj.weight", "mlp_1.up"},
    {"mlp.down_proj.weight", "mlp_2.down"},
};
static const dsc_container_def dense_layer = {"llama_layer", sizeof dense_params / sizeof dense_params[0],
                                              dense_params, sizeof dense_mappings / sizeof dense_mappings[0],
                                              dense_mappings};

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
    ATTN_MAPPINGS,
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
const dsc_container_def dsc_policy_hf_outer = {"llama_non_transformer", sizeof outer_params / sizeof outer_params[0],
                                        outer_params, sizeof outer_mappings / sizeof outer_mappings[0],
                                        outer_mappings};

static const char *const ignored[] = {"model.layers.*.self_attn.rotary_emb.inv_freq", NULL};

/* ---- config.json ------------------------------------------------------------------------------- */

typedef enum hf_variant { HF_LLAMA, HF_MISTRAL, HF_QWEN2, HF_MIXTRAL } hf_variant;

typedef struct json_reader {
    const cJSON *root;
    const char *source;
} json_reader;

static dsc_status get_int(const json_reader *r, const char *key, bool required, int64_t dflt, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (!v || cJSON_IsNull(v)) {
        DSC_CHECK(!required, DSC_ERR_CONFIG, "%s: missing key %s", r->source, key);
        *out = dflt;
        return NULL;
    }
    DSC_CHECK(cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble), DSC_ERR_CONFIG,
              "%s: %s must be an integer", r->source, key);
    *out = (int64_t)v->valuedouble;
    return NULL;
}

static dsc_status get_num(const cJSON *obj, const char *source, const char *key, double dflt, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return NULL;
    }
    DSC_CHECK(cJSON_IsNumber(v), DSC_ERR_CONFIG, "%s: %s must be a number", source, key);
    *out = v->valuedouble;
    return NULL;
}

static bool get_bool(const cJSON *obj, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static dsc_status parse_rope_scaling(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return NULL;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    DSC_CHECK(cJSON_IsString(type), DSC_ERR_CONFIG, "%s: rope_scaling needs rope_type", source);
    DSC_CHECK(strcmp(type->valuestring, "llama3") == 0, DSC_ERR_UNSUPPORTED,
              "%s: rope_scaling.rope_type '%s' is not supported (only 'llama3')", source, type->valuestring);
    double orig;
    mc->rope_scaling = DSC_ROPE_SCALING_LLAMA3;
    DSC_TRY(get_num(rs, source, "factor", 8.0, &mc->rope_factor));
    DSC_TRY(get_num(rs, source, "low_freq_factor", 1.0, &mc->rope_low_freq_factor));
    DSC_TRY(get_num(rs, source, "high_freq_factor", 4.0, &mc->rope_high_freq_factor));
    DSC_TRY(get_num(rs, source, "original_max_position_embeddings", 8192, &orig));
    mc->rope_original_max_positions = (int64_t)orig;
    DSC_CHECK(mc->rope_factor > 0 && mc->rope_high_freq_factor > mc->rope_low_freq_factor && orig > 0,
              DSC_ERR_CONFIG, "%s: rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor", source);
    return NULL;
}

static dsc_status parse_hf(dsc_infer_model_config *mc, const cJSON *root, const char *source, hf_variant variant) {
    json_reader r = {root, source};
    int64_t v;
    *mc = (dsc_infer_model_config){.family = DSC_INFER_FAMILY_LLAMA};
    DSC_TRY(get_int(&r, "hidden_size", true, 0, &v));
    mc->d_model = (int32_t)v;
    DSC_TRY(get_int(&r, "intermediate_size", true, 0, &v));
    mc->d_ff = (int32_t)v;
    DSC_TRY(get_int(&r, "num_hidden_layers", true, 0, &v));
    mc->n_layer = (int32_t)v;
    DSC_TRY(get_int(&r, "num_attention_heads", true, 0, &v));
    mc->n_head = (int32_t)v;
    DSC_TRY(get_int(&r, "num_key_value_heads", false, mc->n_head, &v));
    mc->n_kv_head = (int32_t)v;
    DSC_TRY(get_int(&r, "vocab_size", true, 0, &v));
    mc->vocab_size = (int32_t)v;
    DSC_TRY(get_int(&r, "max_position_embeddings", false, 4096, &mc->max_positions));
    DSC_CHECK(mc->d_model > 0 && mc->n_head > 0 && mc->n_kv_head > 0 && mc->n_layer > 0 && mc->d_ff > 0 &&
                  mc->vocab_size > 0 && mc->max_positions > 0,
              DSC_ERR_CONFIG, "%s: sizes must be positive", source);
    DSC_CHECK(mc->n_head % mc->n_kv_head == 0, DSC_ERR_CONFIG,
              "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", source, mc->n_head,
              mc->n_kv_head);
    DSC_TRY(get_int(&r, "head_dim", false, mc->d_model / mc->n_head, &v));
    mc->head_size = (int32_t)v;
    DSC_CHECK(mc->head_size > 0 && mc->head_size % 2 == 0, DSC_ERR_CONFIG, "%s: head_dim (%d) must be even",
              source, mc->head_size);
    double eps;
    DSC_TRY(get_num(root, source, "rms_norm_eps", 1e-6, &eps));
    mc->norm_eps = (float)eps;
    DSC_TRY(get_num(root, source, "rope_theta", 10000.0, &mc->rope_theta));
    mc->tie_embeddings = get_bool(root, "tie_word_embeddings", false);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    DSC_CHECK(!act || (cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0), DSC_ERR_UNSUPPORTED,
              "%s: hidden_act '%s' is not supported (only 'silu')", source,
              cJSON_IsString(act) ? act->valuestring : "?");
    DSC_CHECK(!get_bool(root, "attention_bias", false), DSC_ERR_UNSUPPORTED,
              "%s: attention_bias = true is not supported", source);
    DSC_CHECK(!get_bool(root, "mlp_bias", false), DSC_ERR_UNSUPPORTED, "%s: mlp_bias = true is not supported",
              source);
    DSC_TRY(parse_rope_scaling(mc, root, source));
    mc->qkv_bias = variant == HF_QWEN2;
    if (variant == HF_QWEN2)
        DSC_CHECK(!get_bool(root, "use_sliding_window", false), DSC_ERR_UNSUPPORTED,
                  "%s: use_sliding_window = true is not supported", source);
    if (variant == HF_MISTRAL || variant == HF_MIXTRAL) {
        /* dsc attends over the whole context: sequences stay within the window. */
        DSC_TRY(get_int(&r, "sliding_window", false, mc->max_positions, &v));
        if (v > 0 && v < mc->max_positions) mc->max_positions = v;
    }
    if (variant == HF_MIXTRAL) {
        DSC_TRY(get_int(&r, "num_local_experts", true, 0, &v));
        mc->n_experts = (int32_t)v;
        DSC_TRY(get_int(&r, "num_experts_per_tok", true, 0, &v));
        mc->top_k = (int32_t)v;
        DSC_CHECK(mc->n_experts >= 1 && mc->top_k >= 1 && mc->top_k <= mc->n_experts, DSC_ERR_CONFIG,
                  "%s: num_experts_per_tok (%d) must be in [1, num_local_experts (%d)]", source, mc->top_k,
                  mc->n_experts);
    }
    return NULL;
}

static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source, hf_variant variant) {
    cJSON *root = cJSON_Parse(json);
    DSC_CHECK(root && cJSON_IsObject(root), DSC_ERR_CORRUPT, "%s: not a JSON object (cJSON_Parse failed)", source);
    dsc_status s = parse_hf(mc, root, source, variant);
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

const dsc_policy dsc_policy_hf_llama = {
    "LlamaForCausalLM", configure_llama, "model.layers.", &dense_layer, &dsc_policy_hf_outer, ignored, NULL};
const dsc_policy dsc_policy_hf_mistral = {
    "MistralForCausalLM", configure_mistral, "model.layers.", &dense_layer, &dsc_policy_hf_outer, ignored, NULL};
const dsc_policy dsc_policy_hf_qwen2 = {
    "Qwen2ForCausalLM", configure_qwen2, "model.layers.", &dense_layer, &dsc_policy_hf_outer, ignored, NULL};
const dsc_policy dsc_policy_hf_mixtral = {
    "MixtralForCausalLM", configure_mixtral, "model.layers.", &moe_layer, &dsc_policy_hf_outer, ignored, NULL};
