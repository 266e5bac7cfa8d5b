/* dsc/model.h — a model is an ordered list of layer specs.
 *
 * A spec names a layer type and its block index; a registry maps type names
 * to factories. The runtime registers the dense types ("embedding", "block",
 * "lm_head"); moe/ registers "moe_block"; apps call the registration
 * functions they need. The pipeline cuts the spec list into stages and builds
 * only its stage's layers, so each rank allocates only what it runs.
 *
 * Thread-safety: the layer-type registry is process-global and unlocked:
 * register types from one thread before any thread builds models; lookups
 * afterwards only read it. */
#ifndef DSC_MODEL_H
#define DSC_MODEL_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/nn.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_model_arch {
    DSC_ARCH_GPT = 0, /* LayerNorm, learned positions, GELU MLP, MHA (GPT-2) */
    DSC_ARCH_LLAMA,   /* RMSNorm, RoPE, GQA, SwiGLU MLP */
    DSC_ARCH_GPT_MOE, /* GPT with every moe.layer_freq-th MLP replaced by MoE */
    DSC_ARCH_MIXTRAL  /* Llama with MoE SwiGLU experts */
} dsc_model_arch;

typedef struct dsc_model_config {
    dsc_model_arch arch;
    int n_layer;
    int d_model;    /* C */
    int n_head;     /* NH */
    int n_kv_head;  /* NKV; == n_head for multi-head attention */
    int d_ff;       /* hidden width of the MLP (per expert for MoE) */
    int vocab_size; /* V */
    int seq_len;    /* T (maximum context) */
    bool tie_embeddings;
    bool activation_checkpointing;
    bool qkv_bias;
    float rope_theta;
    float norm_eps;
    float init_std;
    /* MoE (used by arch GPT_MOE / MIXTRAL) */
    int moe_num_experts;
    int moe_layer_freq; /* every n-th block is MoE, counting from block n-1 as DeepSpeed's examples */
} dsc_model_config;

/* Defaults for an architecture (GPT-2 small-ish shapes scaled down). */
DSC_API void dsc_model_config_defaults(dsc_model_config *mc, dsc_model_arch arch);
/* Checks the shape relations (C % NH, NH % NKV, HS even for RoPE, ...). */
DSC_API dsc_status dsc_model_config_validate(const dsc_model_config *mc);
DSC_API const char *dsc_model_arch_name(dsc_model_arch arch);
DSC_API dsc_status dsc_model_arch_from_name(const char *name, dsc_model_arch *out);

#define DSC_LAYER_TYPE_MAX 32

typedef struct dsc_layer_spec {
    char type[DSC_LAYER_TYPE_MAX]; /* "embedding", "block", "moe_block", "lm_head" */
    int block;                     /* block index for blocks, -1 otherwise */
} dsc_layer_spec;

/* The ordered spec list of a model: embedding, n_layer blocks ("moe_block" for
 * every moe_layer_freq-th block of MoE archs), lm_head. Release with free(). */
DSC_API dsc_status dsc_model_specs(const dsc_model_config *mc, dsc_layer_spec **specs, int *count);

typedef struct dsc_build_ctx dsc_build_ctx;
typedef dsc_status (*dsc_layer_factory)(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);

/* Everything a factory needs to build one layer on this rank. */
struct dsc_build_ctx {
    const dsc_model_config *model;
    dsc_param_store *params;
    dsc_device device;
    const void *extra; /* subsystem-specific (e.g. moe/'s layer options and groups) */
    /* Tensor parallelism (tp/), NULL without it. With `tp` set,
     * dsc_layer_build builds "tp_<type>" where that type is registered
     * (tp/'s embedding, block and LM head) and "<type>" otherwise, and every
     * block (moe_block's too) builds its attention with `attention`: a layer
     * mapping norm1's (B, T, C) output to the attention output, split by heads. */
    const void *tp;
    dsc_layer_factory attention;
};

DSC_API dsc_status dsc_layer_register(const char *type, dsc_layer_factory factory);
/* Builds spec's layer type (its "tp_" variant when ctx->tp is set and the variant is registered). */
DSC_API dsc_status dsc_layer_build(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);
/* Registers "embedding", "block" and "lm_head". Idempotent. */
DSC_API dsc_status dsc_nn_register_dense_layers(void);

/* The pre-norm transformer block of spec->block, x + attn(norm1(x)) then
 * x + ffn(norm2(x)), with `ffn` as its feed-forward part: a layer mapping
 * (B, T, C) to (B, T, C) whose ownership passes to the block (destroyed with
 * it, also on error), or NULL for the config's dense MLP (GELU or SwiGLU).
 * moe/ builds "moe_block" this way. The block keeps ffn's input unchanged
 * until the slot's backward, so an ffn may keep a view of `in` instead of a
 * copy. With activation checkpointing the block runs ffn on slot 0 only
 * (reserved with one slot) and calls its forward a second time, for the same
 * micro-batch, inside backward. */
DSC_API dsc_status dsc_block_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer *ffn,
                                    dsc_layer **out);

/* The feed-forward layer of a block made by dsc_block_create (how moe/ finds
 * its MoE layer inside a "moe_block"), or NULL when `layer` is not a block. */
DSC_API dsc_layer *dsc_block_ffn(const dsc_layer *layer);

/* Logits (b, t, V) of the lm_head's last forward on `slot`, as a view. A
 * forward with ctx->targets == NULL computes logits only (no loss; *out is
 * the logits view), which is what generation needs. The view is gone once
 * the slot's backward ran (the gradient overwrites it) or another slot's
 * forward reused the buffer; asking then is an error. Under mixed precision
 * on the CPU (dsc_layer_set_saved_dtype bf16 / fp16) the logits are stored in
 * that type, as a bf16 / fp16 model's are: read them with dsc_logits_row. */
DSC_API dsc_status dsc_head_logits(dsc_layer *head, int slot, dsc_tensor *logits);
/* Row `row` (of b * t) of such logits, f32 or 2-byte, as V floats in host memory `out`. */
DSC_API dsc_status dsc_logits_row(const dsc_tensor *logits, int64_t row, float *out);

#ifdef __cplusplus
}
#endif
#endif
