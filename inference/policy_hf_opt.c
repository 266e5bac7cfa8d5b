/* The policy for Hugging Face OPTForCausalLM: LayerNorm with biases, q/k/v
 * projections with biases, a ReLU MLP (activation_function), learned
 * positions read at row position + 2 (OPT's offset), the LM head tied to
 * embed_tokens, and the two variants of the family: do_layer_norm_before
 * false (OPT-350m: each block normalises after its residual add and there
 * is no final norm) and word_embed_proj_dim != hidden_size (project_in maps
 * the narrower token embedding to the model width, project_out maps back
 * before the LM head). config.json: hidden_size, num_attention_heads,
 * num_hidden_layers, ffn_dim, vocab_size, max_position_embeddings,
 * do_layer_norm_before, word_embed_proj_dim, activation_function,
 * tie_word_embeddings; enable_bias, layer_norm_elementwise_affine and
 * _remove_final_layer_norm only at their defaults. LayerNorm's epsilon is
 * PyTorch's 1e-5 (OPT has no key for it).
 * Not here: the forward (model_forward.c, the GPT family). */
#include <cjson/cJSON.h>

#include "inference/hf_config.h"
#include "inference/model_internal.h"
#include "inference/policy_params.h"

static const dsc_param_def params[] = {
    DSC_POLICY_GPT_NORM_OUT_PARAMS,
    DSC_POLICY_QKV_PARAMS,
    DSC_POLICY_GPT_MLP_PARAMS,
};
static const dsc_param_mapping mappings[] = {
    {"self_attn_layer_norm.weight", "attn_norm.w"},
    {"self_attn_layer_norm.bias", "attn_norm_bias.b"},
    {"self_attn.q_proj.weight", "qkv.q"},
    {"self_attn.k_proj.weight", "qkv.k"},
    {"self_attn.v_proj.weight", "qkv.v"},
    {"self_attn.q_proj.bias", "qkv_bias.q"},
    {"self_attn.k_proj.bias", "qkv_bias.k"},
    {"self_attn.v_proj.bias", "qkv_bias.v"},
    {"self_attn.out_proj.weight", "attn_out.w"},
    {"self_attn.out_proj.bias", "attn_out_bias.b"},
    {"final_layer_norm.weight", "mlp_norm.w"},
    {"final_layer_norm.bias", "mlp_norm_bias.b"},
    {"fc1.weight", "mlp_1.fc"},
    {"fc1.bias", "mlp_1_bias.fc"},
    {"fc2.weight", "mlp_2.proj"},
    {"fc2.bias", "mlp_2_bias.proj"},
};
static const dsc_container_def layer = {"opt_layer", sizeof params / sizeof params[0], params,
                                        sizeof mappings / sizeof mappings[0], mappings};

static const dsc_param_def outer_params[] = {
    ONE("embed", DSC_PARAM_ROLE_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_V, DSC_DIM_P),
    ONE("pos_embed", DSC_PARAM_ROLE_POS_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_POS, DSC_DIM_C),
    DSC_POLICY_GPT_FINAL_NORM_PARAMS(DSC_SLOT_WHEN_PRE_NORM),
    ONE("project_in", DSC_PARAM_ROLE_PROJ_IN, DSC_SLOT_WHEN_PROJECTED, "w", DSC_DIM_C, DSC_DIM_P),
    ONE("project_out", DSC_PARAM_ROLE_PROJ_OUT, DSC_SLOT_WHEN_PROJECTED, "w", DSC_DIM_P, DSC_DIM_C),
    ONE("lm_head", DSC_PARAM_ROLE_UNEMBED, DSC_SLOT_WHEN_UNTIED, "w", DSC_DIM_V, DSC_DIM_P),
};
static const dsc_param_mapping outer_mappings[] = {
    {"model.decoder.embed_tokens.weight", "embed.w"},
    {"model.decoder.embed_positions.weight", "pos_embed.w"},
    {"model.decoder.final_layer_norm.weight", "final_norm.w"},
    {"model.decoder.final_layer_norm.bias", "final_norm_bias.b"},
    {"model.decoder.project_in.weight", "project_in.w"},
    {"model.decoder.project_out.weight", "project_out.w"},
    {"lm_head.weight", "lm_head.w"},
};
static const dsc_container_def outer = {"opt_non_transformer", sizeof outer_params / sizeof outer_params[0],
                                        outer_params, sizeof outer_mappings / sizeof outer_mappings[0],
                                        outer_mappings};

/* OPTLearnedPositionalEmbedding: position p is row p + 2. */
enum { OPT_POSITION_OFFSET = 2 };

static dsc_status parse(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    json_reader r = {root, source, ""};
    *mc = (dsc_infer_model_config){
        .family = DSC_INFER_FAMILY_GPT, .qkv_bias = true, .norm_eps = 1e-5f, .pos_offset = OPT_POSITION_OFFSET};
    DSC_TRY(get_i32(&r, "hidden_size", true, 0, 1, MAX_DIM, &mc->d_model));
    DSC_TRY(get_i32(&r, "num_attention_heads", true, 0, 1, MAX_COUNT, &mc->n_head));
    DSC_TRY(get_i32(&r, "num_hidden_layers", true, 0, 1, MAX_COUNT, &mc->n_layer));
    DSC_TRY(get_i32(&r, "ffn_dim", true, 0, 1, MAX_DIM, &mc->d_ff));
    DSC_TRY(get_i32(&r, "vocab_size", true, 0, 1, MAX_VOCAB, &mc->vocab_size));
    DSC_TRY(get_int(&r, "max_position_embeddings", false, 2048, 1, INT32_MAX - OPT_POSITION_OFFSET,
                    &mc->max_positions));
    DSC_CHECK(mc->d_model % mc->n_head == 0, DSC_ERR_CONFIG,
              "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d)", source, mc->d_model,
              mc->n_head);
    mc->n_kv_head = mc->n_head;
    mc->head_size = mc->d_model / mc->n_head;
    DSC_TRY(get_i32(&r, "word_embed_proj_dim", false, mc->d_model, 1, MAX_DIM, &mc->d_embed));
    DSC_TRY(get_activation(&r, "activation_function", "relu", &mc->activation));
    mc->post_norm = !get_bool(root, "do_layer_norm_before", true);
    mc->tie_embeddings = get_bool(root, "tie_word_embeddings", true);
    DSC_CHECK(get_bool(root, "enable_bias", true), DSC_ERR_UNSUPPORTED, "%s: enable_bias = false is not supported",
              source);
    DSC_CHECK(get_bool(root, "layer_norm_elementwise_affine", true), DSC_ERR_UNSUPPORTED,
              "%s: layer_norm_elementwise_affine = false is not supported", source);
    DSC_CHECK(mc->post_norm || !get_bool(root, "_remove_final_layer_norm", false), DSC_ERR_UNSUPPORTED,
              "%s: _remove_final_layer_norm = true is not supported", source);
    return NULL;
}

static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source) {
    return parse_config_json(mc, json, source, parse);
}

const dsc_policy dsc_policy_hf_opt = {
    "OPTForCausalLM", configure, "model.decoder.layers.", &layer, &outer, NULL, NULL};
