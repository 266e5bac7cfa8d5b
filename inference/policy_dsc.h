/* Private to inference/: what the dsc training-checkpoint policies share
 * (policy_dsc.c for gpt and llama, policy_dsc_moe.c for gpt-moe and
 * mixtral): the attention and norm parameters of a GPT block (a Llama
 * block's are policy_params.h's), the checkpoint names of both, the
 * non-transformer containers, and the training config -> inference config
 * step. Not here: the feed-forward parameters, which differ between dense
 * and MoE blocks. */
#ifndef DSC_INFERENCE_POLICY_DSC_H
#define DSC_INFERENCE_POLICY_DSC_H

#include "dsc/model.h"
#include "inference/model_internal.h"
#include "inference/policy_params.h"

/* Norms and attention of a GPT block (entries of a dsc_param_def table). */
/* clang-format off */
#define DSC_POLICY_DSC_GPT_ATTN_PARAMS DSC_POLICY_GPT_NORM_OUT_PARAMS, DSC_POLICY_QKV_PARAMS
#define DSC_POLICY_DSC_GPT_ATTN_MAPPINGS                                                                              \
    {"norm1.weight", "attn_norm.w"}, {"norm1.bias", "attn_norm_bias.b"}, {"attn.q.weight", "qkv.q"},                  \
    {"attn.k.weight", "qkv.k"}, {"attn.v.weight", "qkv.v"}, {"attn.q.bias", "qkv_bias.q"},                            \
    {"attn.k.bias", "qkv_bias.k"}, {"attn.v.bias", "qkv_bias.v"}, {"attn.o.weight", "attn_out.w"},                    \
    {"attn.o.bias", "attn_out_bias.b"}, {"norm2.weight", "mlp_norm.w"},                                               \
    {"norm2.bias", "mlp_norm_bias.b"}

/* Checkpoint names of the norms and attention of a Llama block (slots: DSC_POLICY_LLAMA_ATTN_PARAMS). */
#define DSC_POLICY_DSC_LLAMA_ATTN_MAPPINGS                                                                            \
    {"norm1.weight", "attn_norm.w"}, {"attn.q.weight", "qkv.q"}, {"attn.k.weight", "qkv.k"},                          \
    {"attn.v.weight", "qkv.v"}, {"attn.q.bias", "qkv_bias.q"}, {"attn.k.bias", "qkv_bias.k"},                         \
    {"attn.v.bias", "qkv_bias.v"}, {"attn.o.weight", "attn_out.w"}, {"norm2.weight", "mlp_norm.w"}
/* clang-format on */

/* Dense GPT and Llama blocks (also the dense blocks of gpt-moe and mixtral). */
extern const dsc_container_def dsc_policy_dsc_gpt_layer, dsc_policy_dsc_llama_layer;
/* Embedding, final norm and LM head of GPT (learned positions) and Llama. */
extern const dsc_container_def dsc_policy_dsc_gpt_outer, dsc_policy_dsc_llama_outer;

/* The training config `json`'s model (and moe) section, resolved by the
 * training config parser itself; model.arch other than `want` is
 * DSC_ERR_UNSUPPORTED naming it. */
dsc_status dsc_policy_dsc_configure(dsc_infer_model_config *mc, const char *json, const char *source,
                                    dsc_model_arch want);

#endif
