/* Policies for dsc's MoE training checkpoints: "gpt-moe" (GPT blocks with
 * GELU experts with biases) and "mixtral" (Llama blocks with SwiGLU
 * experts). Every moe.layer_freq-th block is a MoE block (the policy's
 * `layer` container: router, experts stacked on a leading E axis, and the
 * PR-MoE residual MLP and mixing coefficients when moe.use_residual); the
 * others are the dense gpt / llama blocks (`dense_layer`). Names are moe/'s
 * (docs/moe.md: layers.<i>.moe.gate.weight, .moe.experts.<e>.fc.weight, ...,
 * .moe.mlp.*, .moe.coefficient.*), with the global expert index.
 * Not here: routing and the expert forward (model_moe.c). */
#include "inference/policy_dsc.h"

/* A per-expert parameter with one dependency. */
#define EXPERT(n, role, dep, r, c)                                                                                \
    {                                                                                                             \
        n, role, DSC_SLOT_WHEN_ALWAYS, true, 1, {                                                                 \
            { dep, r, c }                                                                                         \
        }                                                                                                         \
    }

/* The router and the residual's mixing coefficients (both architectures). */
/* clang-format off */
#define ROUTER_AND_COEF                                                                                           \
    ONE("router", DSC_PARAM_ROLE_ROUTER_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_E, DSC_DIM_C),                      \
    ONE("coef", DSC_PARAM_ROLE_MOE_COEF_W, DSC_SLOT_WHEN_MOE_RESIDUAL, "w", DSC_DIM_PAIR, DSC_DIM_C),             \
    ONE("coef_bias", DSC_PARAM_ROLE_MOE_COEF_B, DSC_SLOT_WHEN_MOE_RESIDUAL, "b", DSC_DIM_PAIR, DSC_DIM_NONE)
#define ROUTER_AND_COEF_MAPPINGS                                                                                  \
    {"moe.gate.weight", "router.w"}, {"moe.coefficient.weight", "coef.w"}, {"moe.coefficient.bias", "coef_bias.b"}
/* clang-format on */

static const dsc_param_def gpt_moe_params[] = {
    DSC_POLICY_DSC_GPT_ATTN_PARAMS,
    ROUTER_AND_COEF,
    EXPERT("experts_1", DSC_PARAM_ROLE_MOE1_W, "fc", DSC_DIM_F, DSC_DIM_C),
    EXPERT("experts_1_bias", DSC_PARAM_ROLE_MOE1_B, "fc", DSC_DIM_F, DSC_DIM_NONE),
    EXPERT("experts_2", DSC_PARAM_ROLE_MOE2_W, "proj", DSC_DIM_C, DSC_DIM_F),
    EXPERT("experts_2_bias", DSC_PARAM_ROLE_MOE2_B, "proj", DSC_DIM_C, DSC_DIM_NONE),
    ONE("mlp_1", DSC_PARAM_ROLE_MLP1_W, DSC_SLOT_WHEN_MOE_RESIDUAL, "fc", DSC_DIM_F, DSC_DIM_C),
    ONE("mlp_1_bias", DSC_PARAM_ROLE_MLP1_B, DSC_SLOT_WHEN_MOE_RESIDUAL, "fc", DSC_DIM_F, DSC_DIM_NONE),
    ONE("mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_MOE_RESIDUAL, "proj", DSC_DIM_C, DSC_DIM_F),
    ONE("mlp_2_bias", DSC_PARAM_ROLE_MLP2_B, DSC_SLOT_WHEN_MOE_RESIDUAL, "proj", DSC_DIM_C, DSC_DIM_NONE),
};
static const dsc_param_mapping gpt_moe_mappings[] = {
    DSC_POLICY_DSC_GPT_ATTN_MAPPINGS,
    ROUTER_AND_COEF_MAPPINGS,
    {"moe.experts.*.fc.weight", "experts_1.fc"},
    {"moe.experts.*.fc.bias", "experts_1_bias.fc"},
    {"moe.experts.*.proj.weight", "experts_2.proj"},
    {"moe.experts.*.proj.bias", "experts_2_bias.proj"},
    {"moe.mlp.fc.weight", "mlp_1.fc"},
    {"moe.mlp.fc.bias", "mlp_1_bias.fc"},
    {"moe.mlp.proj.weight", "mlp_2.proj"},
    {"moe.mlp.proj.bias", "mlp_2_bias.proj"},
};
static const dsc_container_def gpt_moe_layer = {
    "dsc_gpt_moe_layer", sizeof gpt_moe_params / sizeof gpt_moe_params[0], gpt_moe_params,
    sizeof gpt_moe_mappings / sizeof gpt_moe_mappings[0], gpt_moe_mappings};

static const dsc_param_def mixtral_params[] = {
    DSC_POLICY_LLAMA_ATTN_PARAMS,
    ROUTER_AND_COEF,
    {"experts_1",
     DSC_PARAM_ROLE_MOE1_W,
     DSC_SLOT_WHEN_ALWAYS,
     true,
     2,
     {{"gate", DSC_DIM_F, DSC_DIM_C}, {"up", DSC_DIM_F, DSC_DIM_C}}},
    EXPERT("experts_2", DSC_PARAM_ROLE_MOE2_W, "down", DSC_DIM_C, DSC_DIM_F),
    {"mlp_1",
     DSC_PARAM_ROLE_MLP1_W,
     DSC_SLOT_WHEN_MOE_RESIDUAL,
     false,
     2,
     {{"gate", DSC_DIM_F, DSC_DIM_C}, {"up", DSC_DIM_F, DSC_DIM_C}}},
    ONE("mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_MOE_RESIDUAL, "down", DSC_DIM_C, DSC_DIM_F),
};
static const dsc_param_mapping mixtral_mappings[] = {
    DSC_POLICY_DSC_LLAMA_ATTN_MAPPINGS,
    ROUTER_AND_COEF_MAPPINGS,
    {"moe.experts.*.gate.weight", "experts_1.gate"},
    {"moe.experts.*.up.weight", "experts_1.up"},
    {"moe.experts.*.down.weight", "experts_2.down"},
    {"moe.mlp.gate.weight", "mlp_1.gate"},
    {"moe.mlp.up.weight", "mlp_1.up"},
    {"moe.mlp.down.weight", "mlp_2.down"},
};
static const dsc_container_def mixtral_layer = {
    "dsc_mixtral_layer", sizeof mixtral_params / sizeof mixtral_params[0], mixtral_params,
    sizeof mixtral_mappings / sizeof mixtral_mappings[0], mixtral_mappings};

static dsc_status configure_gpt_moe(dsc_infer_model_config *mc, const char *json, const char *source) {
    return dsc_policy_dsc_configure(mc, json, source, DSC_ARCH_GPT_MOE);
}
static dsc_status configure_mixtral(dsc_infer_model_config *mc, const char *json, const char *source) {
    return dsc_policy_dsc_configure(mc, json, source, DSC_ARCH_MIXTRAL);
}

const dsc_policy dsc_policy_dsc_gpt_moe = {
    "gpt-moe", configure_gpt_moe,        "layers.", &gpt_moe_layer, &dsc_policy_dsc_gpt_outer,
    NULL,      &dsc_policy_dsc_gpt_layer};
const dsc_policy dsc_policy_dsc_mixtral = {
    "mixtral", configure_mixtral,          "layers.", &mixtral_layer, &dsc_policy_dsc_llama_outer,
    NULL,      &dsc_policy_dsc_llama_layer};
