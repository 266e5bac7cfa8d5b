/* Private to inference/: parameter-table pieces every policy declares alike
 * (policy_hf.c for Hugging Face checkpoints, policy_dsc.h for dsc training
 * checkpoints): a parameter with one dependency, and the fused q|k|v
 * projection and the norms and attention of a Llama-style (pre-norm, no
 * biases but the optional q/k/v ones) block. Not here: the checkpoint-name
 * mappings, which differ per checkpoint format. */
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
/* clang-format on */

#endif
