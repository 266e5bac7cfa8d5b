/* The policy for Hugging Face GPTNeoXForCausalLM (Pythia, GPT-NeoX-20B):
 * LayerNorm with biases, RoPE on the first rotary_pct of each head (the rest
 * passes through), an exact-GELU MLP with biases, the parallel residual
 * x + attn(ln1(x)) + mlp(ln2(x)) (or the sequential one when
 * use_parallel_residual is false) and an untied LM head (embed_out). Its
 * fused attention.query_key_value stores rows [head, q/k/v, head_size]; the
 * dependency is declared DSC_DIM_QKV_HEADS, so the builder reorders it into
 * [q | k | v] and tensor parallelism splits it by whole head triplets.
 * config.json: hidden_size, num_attention_heads, num_hidden_layers,
 * intermediate_size, vocab_size, max_position_embeddings, layer_norm_eps,
 * hidden_act, use_parallel_residual, tie_word_embeddings, attention_bias
 * (only true), and RoPE as transformers 5 writes it (rope_parameters:
 * rope_type "default", rope_theta, partial_rotary_factor) or 4.x does
 * (rotary_pct, rotary_emb_base; rope_scaling only null).
 * Not here: the forward (model_forward.c, the GPT family). */
#include <string.h>

#include <cjson/cJSON.h>

#include "inference/hf_config.h"
#include "inference/model_internal.h"
#include "inference/policy_params.h"

static const dsc_param_def params[] = {
    DSC_POLICY_GPT_NORM_OUT_PARAMS,
    ONE("qkv", DSC_PARAM_ROLE_QKV_W, DSC_SLOT_WHEN_ALWAYS, "qkv", DSC_DIM_QKV_HEADS, DSC_DIM_C),
    ONE("qkv_bias", DSC_PARAM_ROLE_QKV_B, DSC_SLOT_WHEN_ALWAYS, "qkv", DSC_DIM_QKV_HEADS, DSC_DIM_NONE),
    DSC_POLICY_GPT_MLP_PARAMS,
};
static const dsc_param_mapping mappings[] = {
    {"input_layernorm.weight", "attn_norm.w"},         {"input_layernorm.bias", "attn_norm_bias.b"},
    {"attention.query_key_value.weight", "qkv.qkv"},   {"attention.query_key_value.bias", "qkv_bias.qkv"},
    {"attention.dense.weight", "attn_out.w"},          {"attention.dense.bias", "attn_out_bias.b"},
    {"post_attention_layernorm.weight", "mlp_norm.w"}, {"post_attention_layernorm.bias", "mlp_norm_bias.b"},
    {"mlp.dense_h_to_4h.weight", "mlp_1.fc"},          {"mlp.dense_h_to_4h.bias", "mlp_1_bias.fc"},
    {"mlp.dense_4h_to_h.weight", "mlp_2.proj"},        {"mlp.dense_4h_to_h.bias", "mlp_2_bias.proj"},
};
static const dsc_container_def layer = {"gpt_neox_layer", sizeof params / sizeof params[0], params,
                                        sizeof mappings / sizeof mappings[0], mappings};

static const dsc_param_def outer_params[] = {
    ONE("embed", DSC_PARAM_ROLE_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_V, DSC_DIM_C),
    DSC_POLICY_GPT_FINAL_NORM_PARAMS(DSC_SLOT_WHEN_ALWAYS),
    ONE("lm_head", DSC_PARAM_ROLE_UNEMBED, DSC_SLOT_WHEN_UNTIED, "w", DSC_DIM_V, DSC_DIM_C),
};
static const dsc_param_mapping outer_mappings[] = {
    {"gpt_neox.embed_in.weight", "embed.w"},
    {"gpt_neox.final_layer_norm.weight", "final_norm.w"},
    {"gpt_neox.final_layer_norm.bias", "final_norm_bias.b"},
    {"embed_out.weight", "lm_head.w"},
};
static const dsc_container_def outer = {"gpt_neox_non_transformer", sizeof outer_params / sizeof outer_params[0],
                                        outer_params, sizeof outer_mappings / sizeof outer_mappings[0],
                                        outer_mappings};

/* RoPE's theta and rotated share of each head, in either spelling (5.x's rope_parameters wins). */
static dsc_status parse_rope(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    json_reader top = {root, source, ""};
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    DSC_CHECK(!scaling || cJSON_IsNull(scaling), DSC_ERR_UNSUPPORTED,
              "%s: rope_scaling is not supported for GPT-NeoX (only null)", source);
    double pct;
    DSC_TRY(get_num(&top, "rope_theta", 10000.0, 0, 1e12, &mc->rope_theta));
    DSC_TRY(get_num(&top, "rotary_emb_base", mc->rope_theta, 0, 1e12, &mc->rope_theta));
    DSC_TRY(get_num(&top, "partial_rotary_factor", 0.25, 0, 1, &pct));
    DSC_TRY(get_num(&top, "rotary_pct", pct, 0, 1, &pct));
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (params && !cJSON_IsNull(params)) {
        json_reader r = {params, source, "rope_parameters."};
        DSC_CHECK(cJSON_IsObject(params), DSC_ERR_CONFIG, "%s: rope_parameters must be an object", source);
        for (const cJSON *kv = params->child; kv; kv = kv->next) {
            bool known = strcmp(kv->string, "rope_type") == 0 || strcmp(kv->string, "rope_theta") == 0 ||
                         strcmp(kv->string, "partial_rotary_factor") == 0;
            DSC_CHECK(known, DSC_ERR_UNSUPPORTED, "%s: rope_parameters.%s is not supported for GPT-NeoX", source,
                      kv->string);
        }
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "rope_type");
        DSC_CHECK(!type || (cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0),
                  DSC_ERR_UNSUPPORTED, "%s: rope_parameters.rope_type '%s' is not supported (only 'default')",
                  source, cJSON_IsString(type) ? type->valuestring : "?");
        DSC_TRY(get_num(&r, "rope_theta", mc->rope_theta, 0, 1e12, &mc->rope_theta));
        DSC_TRY(get_num(&r, "partial_rotary_factor", pct, 0, 1, &pct));
    }
    /* transformers: rotary_ndims = int(head_size * rotary_pct) */
    mc->rope_dims = (int32_t)((double)mc->head_size * pct);
    DSC_CHECK(mc->rope_dims >= 2 && mc->rope_dims % 2 == 0, DSC_ERR_UNSUPPORTED,
              "%s: rotary_pct %g of head size %d rotates %d dims (dsc needs an even number >= 2)", source, pct,
              mc->head_size, mc->rope_dims);
    return NULL;
}

static dsc_status parse(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    json_reader r = {root, source, ""};
    *mc = (dsc_infer_model_config){.family = DSC_INFER_FAMILY_GPT, .qkv_bias = true};
    DSC_TRY(get_i32(&r, "hidden_size", true, 0, 1, MAX_DIM, &mc->d_model));
    DSC_TRY(get_i32(&r, "num_attention_heads", true, 0, 1, MAX_COUNT, &mc->n_head));
    DSC_TRY(get_i32(&r, "num_hidden_layers", true, 0, 1, MAX_COUNT, &mc->n_layer));
    DSC_TRY(get_i32(&r, "intermediate_size", true, 0, 1, MAX_DIM, &mc->d_ff));
    DSC_TRY(get_i32(&r, "vocab_size", true, 0, 1, MAX_VOCAB, &mc->vocab_size));
    DSC_TRY(get_int(&r, "max_position_embeddings", false, 2048, 1, INT32_MAX, &mc->max_positions));
    DSC_CHECK(mc->d_model % mc->n_head == 0, DSC_ERR_CONFIG,
              "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d)", source, mc->d_model,
              mc->n_head);
    mc->n_kv_head = mc->n_head; /* query_key_value holds a k and a v per query head */
    mc->head_size = mc->d_model / mc->n_head;
    double eps;
    DSC_TRY(get_num(&r, "layer_norm_eps", 1e-5, 0, 1, &eps));
    mc->norm_eps = (float)eps;
    DSC_TRY(get_activation(&r, "hidden_act", "gelu", &mc->activation));
    mc->parallel_residual = get_bool(root, "use_parallel_residual", true);
    mc->tie_embeddings = get_bool(root, "tie_word_embeddings", false);
    DSC_CHECK(get_bool(root, "attention_bias", true), DSC_ERR_UNSUPPORTED,
              "%s: attention_bias = false is not supported", source);
    return parse_rope(mc, root, source);
}

static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source) {
    return parse_config_json(mc, json, source, parse);
}

/* The causal-mask and RoPE buffers older checkpoints carry. */
static const char *const ignored[] = {"gpt_neox.layers.*.attention.bias",
                                      "gpt_neox.layers.*.attention.masked_bias",
                                      "gpt_neox.layers.*.attention.rotary_emb.inv_freq", NULL};
const dsc_policy dsc_policy_hf_neox = {
    "GPTNeoXForCausalLM", configure, "gpt_neox.layers.", &layer, &outer, ignored, NULL};
