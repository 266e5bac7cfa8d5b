/* The policy for Hugging Face Qwen2MoeForCausalLM: Qwen2's attention (q/k/v
 * biases) with, every decoder_sparse_step-th layer, a sparse block of
 * num_experts SwiGLU experts of width moe_intermediate_size (top
 * num_experts_per_tok, weights renormalised over them when norm_topk_prob,
 * else the raw softmax probabilities) plus a shared SwiGLU expert of width
 * shared_expert_intermediate_size scaled per token by
 * sigmoid(x . shared_expert_gate); the other layers have Qwen2's dense MLP
 * of width intermediate_size. config.json is read as Qwen2's, plus those
 * keys; mlp_only_layers must be empty (refused otherwise).
 * Not here: the forward (model_moe.c, model_forward.c). */
#include <cjson/cJSON.h>

#include "inference/hf_config.h"
#include "inference/model_internal.h"
#include "inference/policy_params.h"

/* SwiGLU rows gate | up of width `w` (a dsc_dim), `expert` for a per-expert list. */
#define GATE_UP(n, role, when, expert, w)                                                                         \
    {                                                                                                             \
        n, role, when, expert, 2, {                                                                               \
            {"gate", w, DSC_DIM_C}, {                                                                             \
                "up", w, DSC_DIM_C                                                                                \
            }                                                                                                     \
        }                                                                                                         \
    }

static const dsc_param_def sparse_params[] = {
    DSC_POLICY_LLAMA_ATTN_PARAMS,
    ONE("moe_gate", DSC_PARAM_ROLE_ROUTER_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_E, DSC_DIM_C),
    GATE_UP("moe_mlp_1", DSC_PARAM_ROLE_MOE1_W, DSC_SLOT_WHEN_ALWAYS, true, DSC_DIM_FE),
    {"moe_mlp_2", DSC_PARAM_ROLE_MOE2_W, DSC_SLOT_WHEN_ALWAYS, true, 1, {{"down", DSC_DIM_C, DSC_DIM_FE}}},
    GATE_UP("shared_1", DSC_PARAM_ROLE_SHARED1_W, DSC_SLOT_WHEN_SHARED_EXPERT, false, DSC_DIM_FS),
    ONE("shared_2", DSC_PARAM_ROLE_SHARED2_W, DSC_SLOT_WHEN_SHARED_EXPERT, "down", DSC_DIM_C, DSC_DIM_FS),
    ONE("shared_gate", DSC_PARAM_ROLE_SHARED_GATE_W, DSC_SLOT_WHEN_SHARED_EXPERT, "w", DSC_DIM_ONE, DSC_DIM_C),
};
static const dsc_param_mapping sparse_mappings[] = {
    DSC_POLICY_HF_ATTN_MAPPINGS,
    {"mlp.gate.weight", "moe_gate.w"},
    {"mlp.experts.*.gate_proj.weight", "moe_mlp_1.gate"},
    {"mlp.experts.*.up_proj.weight", "moe_mlp_1.up"},
    {"mlp.experts.*.down_proj.weight", "moe_mlp_2.down"},
    {"mlp.shared_expert.gate_proj.weight", "shared_1.gate"},
    {"mlp.shared_expert.up_proj.weight", "shared_1.up"},
    {"mlp.shared_expert.down_proj.weight", "shared_2.down"},
    {"mlp.shared_expert_gate.weight", "shared_gate.w"},
};
static const dsc_container_def sparse_layer = {"qwen2_moe_layer", sizeof sparse_params / sizeof sparse_params[0],
                                               sparse_params, sizeof sparse_mappings / sizeof sparse_mappings[0],
                                               sparse_mappings};

static dsc_status moe_keys(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    const json_reader r = {root, source, ""};
    DSC_TRY(get_i32(&r, "num_experts", true, 0, 1, MAX_COUNT, &mc->n_experts));
    DSC_TRY(get_i32(&r, "num_experts_per_tok", true, 0, 1, mc->n_experts, &mc->top_k));
    DSC_TRY(get_i32(&r, "moe_intermediate_size", true, 0, 1, MAX_DIM, &mc->d_ff_expert));
    DSC_TRY(get_i32(&r, "shared_expert_intermediate_size", true, 0, 1, MAX_DIM, &mc->d_ff_shared));
    DSC_TRY(get_i32(&r, "decoder_sparse_step", false, 1, 1, mc->n_layer, &mc->moe_layer_freq));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "norm_topk_prob");
    DSC_CHECK(!norm || cJSON_IsNull(norm) || cJSON_IsBool(norm), DSC_ERR_CONFIG,
              "%s: norm_topk_prob must be true or false", source);
    mc->moe_weighting = cJSON_IsTrue(norm) ? DSC_MOE_WEIGHTING_RENORMALISED : DSC_MOE_WEIGHTING_NONE;
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    DSC_CHECK(!only || cJSON_IsNull(only) || (cJSON_IsArray(only) && cJSON_GetArraySize(only) == 0),
              DSC_ERR_UNSUPPORTED,
              "%s: mlp_only_layers is not supported (dense layers are every layer but each "
              "decoder_sparse_step-th)",
              source);
    return NULL;
}

static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source) {
    DSC_TRY(dsc_policy_hf_qwen2.configure(mc, json, source));
    return parse_config_json(mc, json, source, moe_keys);
}

static const char *const ignored[] = {"model.layers.*.self_attn.rotary_emb.inv_freq", NULL};
/* Embedding, final norm, LM head and the dense layers are named as Qwen2's
 * (dsc_policy_hf_outer, dsc_policy_hf_dense_layer). */
const dsc_policy dsc_policy_hf_qwen2_moe = {
    "Qwen2MoeForCausalLM", configure, "model.layers.",           &sparse_layer,
    &dsc_policy_hf_outer,  ignored,   &dsc_policy_hf_dense_layer};
