/* Policies for dsc's own training checkpoints ("gpt" and "llama"): the
 * model section of the saved training config becomes the inference config,
 * and the containers map dsc's parameter names (docs/models.md) to fused
 * parameters. The MoE architectures' policies are in policy_dsc_moe.c.
 * Not here: reading HDF5 (load_dsc.c). */
#include <string.h>

#include "dsc/config.h"
#include "inference/policy_dsc.h"

static const dsc_param_def gpt_params[] = {
    DSC_POLICY_DSC_GPT_ATTN_PARAMS,
    DSC_POLICY_GPT_MLP_PARAMS,
};
static const dsc_param_mapping gpt_mappings[] = {
    DSC_POLICY_DSC_GPT_ATTN_MAPPINGS,  {"mlp.fc.weight", "mlp_1.fc"},        {"mlp.fc.bias", "mlp_1_bias.fc"},
    {"mlp.proj.weight", "mlp_2.proj"}, {"mlp.proj.bias", "mlp_2_bias.proj"},
};
const dsc_container_def dsc_policy_dsc_gpt_layer = {"dsc_gpt_layer", sizeof gpt_params / sizeof gpt_params[0],
                                                    gpt_params, sizeof gpt_mappings / sizeof gpt_mappings[0],
                                                    gpt_mappings};

static const dsc_param_def llama_params[] = {
    DSC_POLICY_LLAMA_ATTN_PARAMS,
    {"mlp_1",
     DSC_PARAM_ROLE_MLP1_W,
     DSC_SLOT_WHEN_ALWAYS,
     false,
     2,
     {{"gate", DSC_DIM_F, DSC_DIM_C}, {"up", DSC_DIM_F, DSC_DIM_C}}},
    ONE("mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_ALWAYS, "down", DSC_DIM_C, DSC_DIM_F),
};
static const dsc_param_mapping llama_mappings[] = {
    DSC_POLICY_DSC_LLAMA_ATTN_MAPPINGS,
    {"mlp.gate.weight", "mlp_1.gate"},
    {"mlp.up.weight", "mlp_1.up"},
    {"mlp.down.weight", "mlp_2.down"},
};
const dsc_container_def dsc_policy_dsc_llama_layer = {
    "dsc_llama_layer", sizeof llama_params / sizeof llama_params[0], llama_params,
    sizeof llama_mappings / sizeof llama_mappings[0], llama_mappings};

static const dsc_param_def gpt_outer_params[] = {
    DSC_POLICY_GPT_OUTER_PARAMS,
};
static const dsc_param_mapping gpt_outer_mappings[] = {
    {"embed.wte.weight", "embed.w"},      {"embed.wpe.weight", "pos_embed.w"},
    {"head.norm.weight", "final_norm.w"}, {"head.norm.bias", "final_norm_bias.b"},
    {"head.weight", "lm_head.w"},
};
const dsc_container_def dsc_policy_dsc_gpt_outer = {
    "dsc_gpt_non_transformer", sizeof gpt_outer_params / sizeof gpt_outer_params[0], gpt_outer_params,
    sizeof gpt_outer_mappings / sizeof gpt_outer_mappings[0], gpt_outer_mappings};

static const dsc_param_def llama_outer_params[] = {
    ONE("embed", DSC_PARAM_ROLE_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_V, DSC_DIM_C),
    ONE("final_norm", DSC_PARAM_ROLE_FINAL_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    ONE("lm_head", DSC_PARAM_ROLE_UNEMBED, DSC_SLOT_WHEN_UNTIED, "w", DSC_DIM_V, DSC_DIM_C),
};
static const dsc_param_mapping llama_outer_mappings[] = {
    {"embed.wte.weight", "embed.w"},
    {"head.norm.weight", "final_norm.w"},
    {"head.weight", "lm_head.w"},
};
const dsc_container_def dsc_policy_dsc_llama_outer = {
    "dsc_llama_non_transformer", sizeof llama_outer_params / sizeof llama_outer_params[0], llama_outer_params,
    sizeof llama_outer_mappings / sizeof llama_outer_mappings[0], llama_outer_mappings};

dsc_status dsc_policy_dsc_configure(dsc_infer_model_config *mc, const char *json, const char *source,
                                    dsc_model_arch want) {
    dsc_config cfg;
    DSC_TRY(dsc_error_wrap(dsc_config_parse_string(json, source, NULL, 0, &cfg), "reading the training config"));
    const dsc_config_model *t = &cfg.model;
    dsc_status s = NULL;
    if (t->arch != want)
        s = dsc_error(DSC_ERR_UNSUPPORTED, "%s: model.arch '%s' is not the policy's '%s'", source,
                      dsc_model_arch_name(t->arch), dsc_model_arch_name(want));
    const bool moe = want == DSC_ARCH_GPT_MOE || want == DSC_ARCH_MIXTRAL;
    *mc = (dsc_infer_model_config){
        .family = want == DSC_ARCH_GPT || want == DSC_ARCH_GPT_MOE ? DSC_INFER_FAMILY_GPT : DSC_INFER_FAMILY_LLAMA,
        .n_layer = t->n_layer,
        .d_model = t->d_model,
        .n_head = t->n_head,
        .n_kv_head = t->n_kv_head ? t->n_kv_head : t->n_head,
        .head_size = t->d_model / t->n_head,
        .d_ff = t->d_ff ? t->d_ff : 4 * t->d_model,
        .vocab_size = t->vocab_size,
        .max_positions = t->seq_len,
        .qkv_bias = t->qkv_bias,
        .tie_embeddings = t->tie_embeddings,
        .norm_eps = (float)t->norm_eps,
        .rope_theta = (float)t->rope_theta, /* training keeps theta as a float */
        .n_experts = moe ? cfg.moe.num_experts : 0,
        .top_k = moe ? cfg.moe.k : 0,
        .moe_layer_freq = moe ? cfg.moe.layer_freq : 0,
        .moe_weighting = DSC_MOE_WEIGHTING_DEEPSPEED,
        .moe_residual = moe && cfg.moe.use_residual,
    };
    if (!s && moe &&
        !(mc->n_experts >= 1 && mc->top_k >= 1 && mc->top_k <= mc->n_experts && mc->moe_layer_freq >= 1))
        s = dsc_error(DSC_ERR_CONFIG,
                      "%s: moe.k (%d) must be in [1, moe.num_experts (%d)] and moe.layer_freq (%d) >= 1", source,
                      mc->top_k, mc->n_experts, mc->moe_layer_freq);
    dsc_config_free(&cfg);
    return s;
}

static dsc_status configure_gpt(dsc_infer_model_config *mc, const char *json, const char *source) {
    return dsc_policy_dsc_configure(mc, json, source, DSC_ARCH_GPT);
}
static dsc_status configure_llama(dsc_infer_model_config *mc, const char *json, const char *source) {
    return dsc_policy_dsc_configure(mc, json, source, DSC_ARCH_LLAMA);
}

const dsc_policy dsc_policy_dsc_gpt = {
    "gpt", configure_gpt, "layers.", &dsc_policy_dsc_gpt_layer, &dsc_policy_dsc_gpt_outer, NULL, NULL};
const dsc_policy dsc_policy_dsc_llama = {
    "llama", configure_llama, "layers.", &dsc_policy_dsc_llama_layer, &dsc_policy_dsc_llama_outer, NULL, NULL};
