/* Policies for dsc's own training checkpoints ("gpt" and "llama"): the
 * model section of the saved training config becomes the inference config,
 * and the containers map dsc's parameter names (docs/models.md) to fused
 * parameters. MoE training architectures are refused by name.
 * Not here: reading HDF5 (load_dsc.c). */
#include <string.h>

#include "dsc/config.h"
#include "inference/model_internal.h"

#define ONE(n, role, when, dep, r, c)                                                                             \
    {                                                                                                             \
        n, role, when, false, 1, {                                                                                \
            { dep, r, c }                                                                                         \
        }                                                                                                         \
    }

static const dsc_param_def gpt_params[] = {
    ONE("attn_norm", DSC_PARAM_ROLE_ATTN_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    ONE("attn_norm_bias", DSC_PARAM_ROLE_ATTN_NORM_B, DSC_SLOT_WHEN_ALWAYS, "b", DSC_DIM_C, DSC_DIM_NONE),
    {"qkv",
     DSC_PARAM_ROLE_QKV_W,
     DSC_SLOT_WHEN_ALWAYS,
     false,
     3,
     {{"q", DSC_DIM_Q, DSC_DIM_C}, {"k", DSC_DIM_KV, DSC_DIM_C}, {"v", DSC_DIM_KV, DSC_DIM_C}}},
    {"qkv_bias",
     DSC_PARAM_ROLE_QKV_B,
     DSC_SLOT_WHEN_QKV_BIAS,
     false,
     3,
     {{"q", DSC_DIM_Q, DSC_DIM_NONE}, {"k", DSC_DIM_KV, DSC_DIM_NONE}, {"v", DSC_DIM_KV, DSC_DIM_NONE}}},
    ONE("attn_out", DSC_PARAM_ROLE_ATTN_OUT_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_Q),
    ONE("attn_out_bias", DSC_PARAM_ROLE_ATTN_OUT_B, DSC_SLOT_WHEN_ALWAYS, "b", DSC_DIM_C, DSC_DIM_NONE),
    ONE("mlp_norm", DSC_PARAM_ROLE_MLP_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    ONE("mlp_norm_bias", DSC_PARAM_ROLE_MLP_NORM_B, DSC_SLOT_WHEN_ALWAYS, "b", DSC_DIM_C, DSC_DIM_NONE),
    ONE("mlp_1", DSC_PARAM_ROLE_MLP1_W, DSC_SLOT_WHEN_ALWAYS, "fc", DSC_DIM_F, DSC_DIM_C),
    ONE("mlp_1_bias", DSC_PARAM_ROLE_MLP1_B, DSC_SLOT_WHEN_ALWAYS, "fc", DSC_DIM_F, DSC_DIM_NONE),
    ONE("mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_ALWAYS, "proj", DSC_DIM_C, DSC_DIM_F),
    ONE("mlp_2_bias", DSC_PARAM_ROLE_MLP2_B, DSC_SLOT_WHEN_ALWAYS, "proj", DSC_DIM_C, DSC_DIM_NONE),
};
static const dsc_param_mapping gpt_mappings[] = {
    {"norm1.weight", "attn_norm.w"},      {"norm1.bias", "attn_norm_bias.b"}, {"attn.q.weight", "qkv.q"},
    {"attn.k.weight", "qkv.k"},           {"attn.v.weight", "qkv.v"},         {"attn.q.bias", "qkv_bias.q"},
    {"attn.k.bias", "qkv_bias.k"},        {"attn.v.bias", "qkv_bias.v"},      {"attn.o.weight", "attn_out.w"},
    {"attn.o.bias", "attn_out_bias.b"},   {"norm2.weight", "mlp_norm.w"},     {"norm2.bias", "mlp_norm_bias.b"},
    {"mlp.fc.weight", "mlp_1.fc"},        {"mlp.fc.bias", "mlp_1_bias.fc"},   {"mlp.proj.weight", "mlp_2.proj"},
    {"mlp.proj.bias", "mlp_2_bias.proj"},
};
static const dsc_container_def gpt_layer = {"dsc_gpt_layer", sizeof gpt_params / sizeof gpt_params[0], gpt_params,
                                            sizeof gpt_mappings / sizeof gpt_mappings[0], gpt_mappings};

static const dsc_param_def llama_params[] = {
    ONE("attn_norm", DSC_PARAM_ROLE_ATTN_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    {"qkv",
     DSC_PARAM_ROLE_QKV_W,
     DSC_SLOT_WHEN_ALWAYS,
     false,
     3,
     {{"q", DSC_DIM_Q, DSC_DIM_C}, {"k", DSC_DIM_KV, DSC_DIM_C}, {"v", DSC_DIM_KV, DSC_DIM_C}}},
    {"qkv_bias",
     DSC_PARAM_ROLE_QKV_B,
     DSC_SLOT_WHEN_QKV_BIAS,
     false,
     3,
     {{"q", DSC_DIM_Q, DSC_DIM_NONE}, {"k", DSC_DIM_KV, DSC_DIM_NONE}, {"v", DSC_DIM_KV, DSC_DIM_NONE}}},
    ONE("attn_out", DSC_PARAM_ROLE_ATTN_OUT_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_Q),
    ONE("mlp_norm", DSC_PARAM_ROLE_MLP_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    {"mlp_1",
     DSC_PARAM_ROLE_MLP1_W,
     DSC_SLOT_WHEN_ALWAYS,
     false,
     2,
     {{"gate", DSC_DIM_F, DSC_DIM_C}, {"up", DSC_DIM_F, DSC_DIM_C}}},
    ONE("mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_ALWAYS, "down", DSC_DIM_C, DSC_DIM_F),
};
static const dsc_param_mapping llama_mappings[] = {
    {"norm1.weight", "attn_norm.w"},   {"attn.q.weight", "qkv.q"},      {"attn.k.weight", "qkv.k"},
    {"attn.v.weight", "qkv.v"},        {"attn.q.bias", "qkv_bias.q"},   {"attn.k.bias", "qkv_bias.k"},
    {"attn.v.bias", "qkv_bias.v"},     {"attn.o.weight", "attn_out.w"}, {"norm2.weight", "mlp_norm.w"},
    {"mlp.gate.weight", "mlp_1.gate"}, {"mlp.up.weight", "mlp_1.up"},   {"mlp.down.weight", "mlp_2.down"},
};
static const dsc_container_def llama_layer = {"dsc_llama_layer", sizeof llama_params / sizeof llama_params[0],
                                              llama_params, sizeof llama_mappings / sizeof llama_mappings[0],
                                              llama_mappings};

static const dsc_param_def gpt_outer_params[] = {
    ONE("embed", DSC_PARAM_ROLE_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_V, DSC_DIM_C),
    ONE("pos_embed", DSC_PARAM_ROLE_POS_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_POS, DSC_DIM_C),
    ONE("final_norm", DSC_PARAM_ROLE_FINAL_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    ONE("final_norm_bias", DSC_PARAM_ROLE_FINAL_NORM_B, DSC_SLOT_WHEN_ALWAYS, "b", DSC_DIM_C, DSC_DIM_NONE),
    ONE("lm_head", DSC_PARAM_ROLE_UNEMBED, DSC_SLOT_WHEN_UNTIED, "w", DSC_DIM_V, DSC_DIM_C),
};
static const dsc_param_mapping gpt_outer_mappings[] = {
    {"embed.wte.weight", "embed.w"},      {"embed.wpe.weight", "pos_embed.w"},
    {"head.norm.weight", "final_norm.w"}, {"head.norm.bias", "final_norm_bias.b"},
    {"head.weight", "lm_head.w"},
};
static const dsc_container_def gpt_outer = {
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
static const dsc_container_def llama_outer = {
    "dsc_llama_non_transformer", sizeof llama_outer_params / sizeof llama_outer_params[0], llama_outer_params,
    sizeof llama_outer_mappings / sizeof llama_outer_mappings[0], llama_outer_mappings};

/* The training config's model section, resolved by the training config parser itself. */
static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source,
                            dsc_model_arch want) {
    dsc_config cfg;
    DSC_TRY(dsc_error_wrap(dsc_config_parse_string(json, source, NULL, 0, &cfg), "reading the training config"));
    const dsc_config_model *t = &cfg.model;
    dsc_status s = NULL;
    if (t->arch != want)
        s = dsc_error(DSC_ERR_UNSUPPORTED, "%s: model.arch '%s' is not supported for inference (gpt, llama)",
                      source, dsc_model_arch_name(t->arch));
    *mc = (dsc_infer_model_config){
        .family = want == DSC_ARCH_GPT ? DSC_INFER_FAMILY_GPT : DSC_INFER_FAMILY_LLAMA,
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
    };
    dsc_config_free(&cfg);
    return s;
}

static dsc_status configure_gpt(dsc_infer_model_config *mc, const char *json, const char *source) {
    return configure(mc, json, source, DSC_ARCH_GPT);
}
static dsc_status configure_llama(dsc_infer_model_config *mc, const char *json, const char *source) {
    return configure(mc, json, source, DSC_ARCH_LLAMA);
}

const dsc_policy dsc_policy_dsc_gpt = {"gpt", configure_gpt, "layers.", &gpt_layer, &gpt_outer, NULL};
const dsc_policy dsc_policy_dsc_llama = {"llama", configure_llama, "layers.", &llama_layer, &llama_outer, NULL};
