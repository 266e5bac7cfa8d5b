/* Private to inference/: parameter-table pieces every policy declares alike
 * (policy_hf*.c for Hugging Face checkpoints, policy_dsc.h for dsc training
 * checkpoints): a parameter with one dependency, the fused q|k|v
 * projection, the norms and attention of a Llama-style (pre-norm, no
 * biases but the optional q/k/v ones) block, and the LayerNorms, attention
 * output and MLP of a GPT-style block (biases everywhere). Not here: the
 * checkpoint-name mappings, which differ per checkpoint format. */
#ifndef DSC_INFERENCE_POLICY_PARAMS_H
#define DSC_INFERENCE_POLICY_PARAMS_H

#include "dsc/inference.h"

/* A parameter with one dependency. */
#define ONE(n, role, when, dep, r, c)                                                                             \
    {                                                                                                             \
        n, role, when, false, 1, {                                                                                \
            { dep, r, c }                                                                                         \
        }                                                                                                         \
    }

/* clang-format off */
/* The fused q|k|v projection (dependencies q, k, v) and its optional bias. */
#define DSC_POLICY_QKV_PARAMS                                                                                         \
    {"qkv",                                                                                                           \
     DSC_PARAM_ROLE_QKV_W,                                                                                            \
     DSC_SLOT_WHEN_ALWAYS,                                                                                            \
     false,                                                                                                           \
     3,                                                                                                               \
     {{"q", DSC_DIM_Q, DSC_DIM_C}, {"k", DSC_DIM_KV, DSC_DIM_C}, {"v", DSC_DIM_KV, DSC_DIM_C}}},                      \
    {"qkv_bias",                                                                                                      \
     DSC_PARAM_ROLE_QKV_B,                                                                                            \
     DSC_SLOT_WHEN_QKV_BIAS,                                                                                          \
     false,                                                                                                           \
     3,                                                                                                               \
     {{"q", DSC_DIM_Q, DSC_DIM_NONE}, {"k", DSC_DIM_KV, DSC_DIM_NONE}, {"v", DSC_DIM_KV, DSC_DIM_NONE}}}

/* Norms and attention of a Llama-style block (entries of a dsc_param_def table). */
#define DSC_POLICY_LLAMA_ATTN_PARAMS                                                                                  \
    ONE("attn_norm", DSC_PARAM_ROLE_ATTN_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),                 \
    DSC_POLICY_QKV_PARAMS,                                                                                            \
    ONE("attn_out", DSC_PARAM_ROLE_ATTN_OUT_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_Q),                      \
    ONE("mlp_norm", DSC_PARAM_ROLE_MLP_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE)
/* The checkpoint names of a Hugging Face Llama-style block's norms and
 * attention (entries of a dsc_param_mapping table). */
#define DSC_POLICY_HF_ATTN_MAPPINGS                                                                                   \
    {"input_layernorm.weight", "attn_norm.w"}, {"self_attn.q_proj.weight", "qkv.q"},                                  \
    {"self_attn.k_proj.weight", "qkv.k"}, {"self_attn.v_proj.weight", "qkv.v"},                                       \
    {"self_attn.q_proj.bias", "qkv_bias.q"}, {"self_attn.k_proj.bias", "qkv_bias.k"},                                 \
    {"self_attn.v_proj.bias", "qkv_bias.v"}, {"self_attn.o_proj.weight", "attn_out.w"},                               \
    {"post_attention_layernorm.weight", "mlp_norm.w"}

/* A GPT block's LayerNorms (weight and bias) and attention output with its
 * bias: everything of its attention but the q/k/v parameters. */
#define DSC_POLICY_GPT_NORM_OUT_PARAMS                                                                                \
    ONE("attn_norm", DSC_PARAM_ROLE_ATTN_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),                 \
    ONE("attn_norm_bias", DSC_PARAM_ROLE_ATTN_NORM_B, DSC_SLOT_WHEN_ALWAYS, "b", DSC_DIM_C, DSC_DIM_NONE),            \
    ONE("attn_out", DSC_PARAM_ROLE_ATTN_OUT_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_Q),                      \
    ONE("attn_out_bias", DSC_PARAM_ROLE_ATTN_OUT_B, DSC_SLOT_WHEN_ALWAYS, "b", DSC_DIM_C, DSC_DIM_NONE),              \
    ONE("mlp_norm", DSC_PARAM_ROLE_MLP_NORM_W, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_C, DSC_DIM_NONE),                   \
    ONE("mlp_norm_bias", DSC_PARAM_ROLE_MLP_NORM_B, DSC_SLOT_WHEN_ALWAYS, "b", DSC_DIM_C, DSC_DIM_NONE)

/* A GPT block's non-gated MLP with biases (dependencies fc and proj). */
#define DSC_POLICY_GPT_MLP_PARAMS                                                                                     \
    ONE("mlp_1", DSC_PARAM_ROLE_MLP1_W, DSC_SLOT_WHEN_ALWAYS, "fc", DSC_DIM_F, DSC_DIM_C),                            \
    ONE("mlp_1_bias", DSC_PARAM_ROLE_MLP1_B, DSC_SLOT_WHEN_ALWAYS, "fc", DSC_DIM_F, DSC_DIM_NONE),                    \
    ONE("mlp_2", DSC_PARAM_ROLE_MLP2_W, DSC_SLOT_WHEN_ALWAYS, "proj", DSC_DIM_C, DSC_DIM_F),                          \
    ONE("mlp_2_bias", DSC_PARAM_ROLE_MLP2_B, DSC_SLOT_WHEN_ALWAYS, "proj", DSC_DIM_C, DSC_DIM_NONE)

/* A GPT model's final LayerNorm (weight and bias), present `when`. */
#define DSC_POLICY_GPT_FINAL_NORM_PARAMS(when)                                                                        \
    ONE("final_norm", DSC_PARAM_ROLE_FINAL_NORM_W, when, "w", DSC_DIM_C, DSC_DIM_NONE),                               \
    ONE("final_norm_bias", DSC_PARAM_ROLE_FINAL_NORM_B, when, "b", DSC_DIM_C, DSC_DIM_NONE)
/* A GPT model's embedding, learned positions, final LayerNorm and untied LM head. */
#define DSC_POLICY_GPT_OUTER_PARAMS                                                                                   \
    ONE("embed", DSC_PARAM_ROLE_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_V, DSC_DIM_C),                              \
    ONE("pos_embed", DSC_PARAM_ROLE_POS_EMBED, DSC_SLOT_WHEN_ALWAYS, "w", DSC_DIM_POS, DSC_DIM_C),                    \
    DSC_POLICY_GPT_FINAL_NORM_PARAMS(DSC_SLOT_WHEN_ALWAYS),                                                           \
    ONE("lm_head", DSC_PARAM_ROLE_UNEMBED, DSC_SLOT_WHEN_UNTIED, "w", DSC_DIM_V, DSC_DIM_C)
/* clang-format on */

#endif
