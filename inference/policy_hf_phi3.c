/* The policy for Hugging Face Phi3ForCausalLM: a Llama-style decoder whose
 * checkpoint fuses q|k|v into self_attn.qkv_proj ([q | k | v] rows, GQA
 * widths) and gate|up into mlp.gate_up_proj, which map straight onto the
 * engine's fused parameters (and, under tensor parallelism, onto the
 * plan's per-block head and per-half column spans). config.json is read as
 * Llama's, plus Phi-3's partial_rotary_factor (only 1 is supported) and
 * sliding_window (the context is kept within it, as for Mistral).
 * Not here: the forward (model_forward.c, shared with Llama). */
#include <math.h>

#include <cjson/cJSON.h>

#include "inference/hf_config.h"
#include "inference/model_internal.h"
#include "inference/policy_params.h"

static const dsc_param_def params[] = {
    ONE("attn_norm", DSC_PARAM_ROLE_ATTN_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    ONE("qkv", DSC_PARAM_ROLE_QKV_W, DSC_SLOT_WHEN_ALWAYS, "qkv", DSC_DIM_QKV, DSC_DIM_C),
    ONE("attn_out", DSC_PARAM_ROLE_ATTN_OUT_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_Q),
    ONE("mlp_norm", DSC_PARAM_ROLE_MLP_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),
    ONE("mlp_1", DSC_PARAM_ROLE_MLP1_W, DSC_SLOT_WHEN_ALWAYS, "gate_up", DSC_DIM_F2, DSC_DIM_C),
    ONE("mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_ALWAYS, "down", DSC_DIM_C, DSC_DIM_F),
};
static const dsc_param_mapping mappings[] = {
    {"input_layernorm.weight", "attn_norm.w"},    {"self_attn.qkv_proj.weight", "qkv.qkv"},
    {"self_attn.o_proj.weight", "attn_out.w"},    {"post_attention_layernorm.weight", "mlp_norm.w"},
    {"mlp.gate_up_proj.weight", "mlp_1.gate_up"}, {"mlp.down_proj.weight", "mlp_2.down"},
};
static const dsc_container_def layer = {"phi3_layer", sizeof params / sizeof params[0], params,
                                        sizeof mappings / sizeof mappings[0], mappings};

static dsc_status phi3_keys(dsc_infer_model_config *mc, const cJSON *root, const char *source) {
    const cJSON *prf = cJSON_GetObjectItemCaseSensitive(root, "partial_rotary_factor");
    DSC_CHECK(!prf || cJSON_IsNull(prf) || (cJSON_IsNumber(prf) && prf->valuedouble == 1.0), DSC_ERR_UNSUPPORTED,
              "%s: partial_rotary_factor %g is not supported (only 1)", source,
              cJSON_IsNumber(prf) ? prf->valuedouble : NAN);
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (!sw || cJSON_IsNull(sw)) return NULL;
    DSC_CHECK(cJSON_IsNumber(sw) && sw->valuedouble == floor(sw->valuedouble), DSC_ERR_CONFIG,
              "%s: sliding_window must be an integer", source);
    /* dsc attends over the whole context: sequences stay within the window. */
    if (sw->valuedouble > 0 && sw->valuedouble < (double)mc->max_positions)
        mc->max_positions = (int64_t)sw->valuedouble;
    return NULL;
}

static dsc_status configure(dsc_infer_model_config *mc, const char *json, const char *source) {
    DSC_TRY(dsc_policy_hf_llama.configure(mc, json, source));
    return parse_config_json(mc, json, source, phi3_keys);
}

static const char *const ignored[] = {"model.layers.*.self_attn.rotary_emb.inv_freq", NULL};
/* Embedding, final norm and LM head are named as Llama's (dsc_policy_hf_outer). */
const dsc_policy dsc_policy_hf_phi3 = {"Phi3ForCausalLM", configure, "model.layers.", &layer, &dsc_policy_hf_outer,
                                       ignored,           NULL};
