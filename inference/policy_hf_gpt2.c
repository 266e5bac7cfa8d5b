/* The policy for Hugging Face GPT2LMHeadModel as save_pretrained writes it
 * (transformer.h.<i>.*): LayerNorm with biases, learned positions (wpe),
 * a fused c_attn [q | k | v] with bias, gelu_new MLP, and the LM head tied
 * to wte unless tie_word_embeddings says otherwise. Its Conv1D weights
 * (c_attn, c_proj, c_fc) are stored (in, out); the loader transposes them
 * on read (load_tp.c, which also splits them as stored under tensor
 * parallelism), so this table declares them (out, in) like every other
 * policy's. config.json: n_embd, n_head, n_layer, vocab_size, n_positions,
 * n_inner, layer_norm_epsilon, activation_function, tie_word_embeddings;
 * attention variants dsc does not compute (scale_attn_weights = false,
 * scale_attn_by_inverse_layer_idx, add_cross_attention) are refused.
 * Not here: the forward (model_forward.c, the GPT family). */
#include <cjson/cJSON.h>

#include "inference/hf_config.h"
#include "inference/model_internal.h"
#include "inference/policy_params.h"

static const dsc_param_def params[] = {
    DSC_POLICY_GPT_NORM_OUT_PARAMS,
    ONE("qkv", DSC_PARAM_ROLE_QKV_W, DSC_SLOT_WHEN_ALWAYS, "qkv", DSC_DIM_QKV, DSC_DIM_C),
    ONE("qkv_bias", DSC_PARAM_ROLE_QKV_B, DSC_SLOT_WHEN_ALWAYS, "qkv", DSC_DIM_QKV, DSC_DIM_NONE),
    DSC_POLICY_GPT_MLP_PARAMS,
};
static const dsc_param_mapping mappings[] = {
    {"ln_1.weight", "attn_norm.w"},       {"ln_1.bias", "attn_norm_bias.b"},
    {"attn.c_attn.weight", "qkv.qkv"},    {"attn.c_attn.bias", "qkv_bias.qkv"},
    {"attn.c_proj.weight", "attn_out.w"}, {"attn.c_proj.bias", "attn_out_bias.b"},
    {"ln_2.weight", "mlp_norm.w"},        {"ln_2.bias", "mlp_norm_bias.b"},
    {"mlp.c_fc.weight", "mlp_1.fc"},      {"mlp.c_fc.bias", "mlp_1_bias.fc"},
    {"mlp.c_proj.weight", "mlp_2.proj"},  {"mlp.c_proj.bias", "mlp_2_bias.proj"},
};
static const dsc_container_def layer = {"gpt2_layer", sizeof params / sizeof params[0], params,
                                        sizeof mappings / sizeof mappings[0], mappings};

static const dsc_param_def outer_params[] = {
    DSC_POLICY_GPT_OUTER_PARAMS,
};
static const dsc_param_mapping outer_mappings[] = {
    {"transformer.wte.weight", "embed.w"},
    {"transformer.wpe.weight", "pos_embed.w"},
    {"transformer.ln_f.weight", "final_norm.w"},
    {"transformer.ln_f.bias", "final_norm_bias.b"},
    {"lm_head.weight", "lm_head.w"},
};
static const dsc_container_def outer = {"gpt2_non_transformer", sizeof outer_params / sizeof outer_params[0],
                                        outer_params, sizeof outer_mappings / sizeof outer_mappings[0],
                                        outer_mappings};

static dsc_status parse(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    json_reader r = {root, source, ""};
    *mc = (dsc_infer_model_config){.family = DSC_INFER_FAMILY_GPT, .qkv_bias = true};
    DSC_TRY(get_i32(&r, "n_embd", true, 0, 1, MAX_DIM, &mc->d_model));
    DSC_TRY(get_i32(&r, "n_head", true, 0, 1, MAX_COUNT, &mc->n_head));
    DSC_TRY(get_i32(&r, "n_layer", true, 0, 1, MAX_COUNT, &mc->n_layer));
    DSC_TRY(get_i32(&r, "vocab_size", true, 0, 1, MAX_VOCAB, &mc->vocab_size));
    DSC_TRY(get_int(&r, "n_positions", false, 1024, 1, INT32_MAX, &mc->max_positions));
    DSC_CHECK(mc->d_model % mc->n_head == 0, DSC_ERR_CONFIG, "%s: n_embd (%d) is not a multiple of n_head (%d)",
              source, mc->d_model, mc->n_head);
    mc->n_kv_head = mc->n_head;
    mc->head_size = mc->d_model / mc->n_head;
    /* n_inner null means 4 x n_embd */
    DSC_TRY(get_i32(&r, "n_inner", false, mc->d_model <= MAX_DIM / 4 ? 4 * mc->d_model : MAX_DIM, 1, MAX_DIM,
                    &mc->d_ff));
    double eps;
    DSC_TRY(get_num(&r, "layer_norm_epsilon", 1e-5, 0, 1, &eps));
    mc->norm_eps = (float)eps;
    DSC_TRY(get_activation(&r, "activation_function", "gelu_new", &mc->activation));
    mc->tie_embeddings = get_bool(root, "tie_word_embeddings", true);
    DSC_CHECK(get_bool(root, "scale_attn_weights", true), DSC_ERR_UNSUPPORTED,
              "%s: scale_attn_weights = false is not supported", source);
    DSC_CHECK(!get_bool(root, "scale_attn_by_inverse_layer_idx", false), DSC_ERR_UNSUPPORTED,
              "%s: scale_attn_by_inverse_layer_idx = true is not supported", source);
    DSC_CHECK(!get_bool(root, "add_cross_attention", false), DSC_ERR_UNSUPPORTED,
              "%s: add_cross_attention = true is not supported (a decoder-only model is)", source);
    return NULL;
}

static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source) {
    return parse_config_json(mc, json, source, parse);
}

/* The causal-mask buffers older checkpoints carry. */
static const char *const ignored[] = {"transformer.h.*.attn.bias", "transformer.h.*.attn.masked_bias", NULL};
const dsc_policy dsc_policy_hf_gpt2 = {"GPT2LMHeadModel", configure, "transformer.h.", &layer, &outer,
                                       ignored,           NULL};
