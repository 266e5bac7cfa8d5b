/* dsc/inference.h — the single-rank inference engine: parameters, layer
 * containers and policies (how checkpoint tensors become finalized weights),
 * models loaded from Hugging Face or dsc checkpoints, the engine (put /
 * query / can_schedule / flush over a ragged batch and a blocked KV cache)
 * and the Dynamic SplitFuse scheduler that generates text with it.
 *
 * The design is DeepSpeed inference v2's: a Parameter declares the
 * checkpoint tensors it depends on (q, k, v) and is finalized (fused,
 * converted to f32) into one flat, 256-byte aligned arena once they are all
 * set; a LayerContainer declares typed parameter slots and a mapping table
 * from checkpoint names to "slot.dependency", with `*` for an expert index;
 * a Policy parses the architecture's config, chooses the containers and
 * names the transformer-layer prefix and the ignored tensors; policies are
 * found by architecture name in a registry whose registration validates
 * every mapping table. The policy registry is process-global and unlocked:
 * register policies from one thread before engines are created from others.
 *
 * Models load whole or as one tensor-parallel shard per rank (the plan is
 * dsc/tp.h's); a sharded engine samples over the vocabulary-parallel logits
 * without gathering a whole row on any rank.
 *
 * Models also load as one pipeline stage per rank (dsc_infer_pp): the
 * stage holds only its layers' weights and KV; the engine then keeps up to
 * P micro-batches in flight behind the same put / query / flush and
 * scheduler API (docs/inference.md, "Pipeline-parallel serving").
 *
 * Not here: the KV cache, ragged batches and paged attention (dsc/kv_cache.h),
 * tokenizers (dsc/tokenizer.h), sampling rules (dsc/sampling.h).
 *
 * Dimension letters: C model width, NH query heads, NKV key/value heads, HS
 * head size, Q = NH*HS, KV = NKV*HS, F feed-forward width, V vocabulary,
 * E experts, L layers, N tokens of a forward. */
#ifndef DSC_INFERENCE_H
#define DSC_INFERENCE_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/kernels.h"
#include "dsc/kv_cache.h"
#include "dsc/moe_gate.h" /* dsc_moe_weighting */
#include "dsc/sampling.h"
#include "dsc/status.h"
#include "dsc/tensor.h"
#include "dsc/tokenizer.h"
#include "dsc/tp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model configuration -------------------------------------------------------------- */

typedef enum dsc_infer_family {
    DSC_INFER_FAMILY_GPT = 0, /* LayerNorm, learned positions (or partial RoPE), non-gated MLP, biases */
    DSC_INFER_FAMILY_LLAMA    /* RMSNorm, RoPE, SwiGLU MLP (dense or top-k MoE) */
} dsc_infer_family;

/* The activation of the GPT family's non-gated MLP. */
typedef enum dsc_infer_activation {
    DSC_INFER_ACT_GELU_TANH = 0, /* GPT-2's gelu_new, dsc's gpt */
    DSC_INFER_ACT_GELU_ERF,      /* exact GELU (GPT-NeoX's gelu) */
    DSC_INFER_ACT_RELU           /* OPT */
} dsc_infer_activation;

typedef enum dsc_rope_scaling {
    DSC_ROPE_SCALING_NONE = 0,
    DSC_ROPE_SCALING_LLAMA3 /* Llama-3.1's frequency-dependent rescaling */
} dsc_rope_scaling;

typedef struct dsc_infer_model_config {
    dsc_infer_family family;
    int32_t n_layer;
    int32_t d_model;   /* C */
    int32_t n_head;    /* NH */
    int32_t n_kv_head; /* NKV */
    int32_t head_size; /* HS */
    int32_t d_ff;      /* F (per expert for MoE) */
    int32_t vocab_size;
    int64_t max_positions; /* learned positions (GPT) or the model's context limit */
    bool qkv_bias;
    bool tie_embeddings;
    float norm_eps;
    double rope_theta;
    dsc_rope_scaling rope_scaling;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_positions;
    int32_t n_experts; /* 0: dense MLP */
    int32_t top_k;
    /* Which layers are MoE layers: 0 or 1 every layer; n > 1 layers n-1,
     * 2n-1, ... (dsc's moe.layer_freq); the others use the policy's
     * dense_layer container. */
    int32_t moe_layer_freq;
    dsc_moe_weighting moe_weighting;
    bool moe_residual; /* PR-MoE: a dense MLP mixed in by per-token coefficients */
    /* Expert parallelism: the model holds experts [expert0, expert0 +
     * n_local_experts) of the n_experts (the router always covers all);
     * n_local_experts = 0 means all of them. */
    int32_t expert0, n_local_experts;
    /* Qwen2-MoE: routed experts of width d_ff_expert (0: d_ff, the dense
     * width) beside a shared SwiGLU expert of width d_ff_shared (0: none)
     * whose output is scaled by sigmoid(x . shared_expert_gate). */
    int32_t d_ff_expert, d_ff_shared;
    /* How the GPT-family checkpoints of Hugging Face differ (all zero: dsc's gpt). */
    dsc_infer_activation activation;
    /* RoPE on the first rope_dims of each head (rotate-half pairs within
     * them): GPT family 0 = learned positions instead (GPT-NeoX: head_size x
     * rotary_pct); Llama family 0 = the whole head. */
    int32_t rope_dims;
    bool parallel_residual; /* GPT-NeoX: x + attn(norm1(x)) + mlp(norm2(x)), one all-reduce under TP */
    bool post_norm;         /* OPT-350m: x = norm(x + sublayer(x)) after each block, no final norm */
    int32_t pos_offset;     /* learned position p is row p + pos_offset (OPT: 2) */
    /* P: token-embedding width when project_in (C, P) and project_out (P, C)
     * map it to and from C (OPT's word_embed_proj_dim); 0 = C, no projections. */
    int32_t d_embed;
} dsc_infer_model_config;

/* ---- parameters and layer containers -------------------------------------------------------
 * Shapes are symbolic so the tables are static data, checked once. */
typedef enum dsc_dim {
    DSC_DIM_NONE = 0, /* as `cols`: the dependency is a vector */
    DSC_DIM_C,
    DSC_DIM_Q,
    DSC_DIM_KV,
    DSC_DIM_F,
    DSC_DIM_V,
    DSC_DIM_POS,
    DSC_DIM_E,
    DSC_DIM_PAIR, /* 2: the PR-MoE residual's mixing coefficients */
    DSC_DIM_QKV,  /* Q + 2 KV: a checkpoint's fused [q | k | v] (Phi-3 qkv_proj) */
    DSC_DIM_F2,   /* 2 F: a checkpoint's fused [gate | up] (Phi-3 gate_up_proj) */
    DSC_DIM_FE,   /* a routed expert's width (d_ff_expert, else F) */
    DSC_DIM_FS,   /* the shared expert's width (d_ff_shared) */
    DSC_DIM_ONE,  /* 1: the shared expert's gate */
    /* 3 NH HS stored [head, q/k/v, HS] (GPT-NeoX query_key_value, NKV = NH):
     * finalized as [q | k | v] rows, so the forward sees DSC_DIM_QKV's layout */
    DSC_DIM_QKV_HEADS,
    DSC_DIM_P /* the token-embedding width (d_embed, else C) */
} dsc_dim;

/* What the model forward uses a finalized parameter for. */
typedef enum dsc_param_role {
    DSC_PARAM_ROLE_ATTN_NORM_W = 0,
    DSC_PARAM_ROLE_ATTN_NORM_B,
    DSC_PARAM_ROLE_QKV_W, /* (Q + 2*KV, C): rows q | k | v */
    DSC_PARAM_ROLE_QKV_B,
    DSC_PARAM_ROLE_ATTN_OUT_W,
    DSC_PARAM_ROLE_ATTN_OUT_B,
    DSC_PARAM_ROLE_MLP_NORM_W,
    DSC_PARAM_ROLE_MLP_NORM_B,
    DSC_PARAM_ROLE_MLP1_W, /* GELU: fc (F, C); SwiGLU: (2F, C) rows gate | up */
    DSC_PARAM_ROLE_MLP1_B,
    DSC_PARAM_ROLE_MLP2_W, /* (C, F) */
    DSC_PARAM_ROLE_MLP2_B,
    DSC_PARAM_ROLE_ROUTER_W, /* (E, C) */
    DSC_PARAM_ROLE_MOE1_W,   /* (E, 2F, C): per expert rows gate | up (SwiGLU); (E, F, C) fc (GELU) */
    DSC_PARAM_ROLE_MOE2_W,   /* (E, C, F) */
    DSC_PARAM_ROLE_EMBED,    /* (V, C) */
    DSC_PARAM_ROLE_POS_EMBED,
    DSC_PARAM_ROLE_FINAL_NORM_W,
    DSC_PARAM_ROLE_FINAL_NORM_B,
    DSC_PARAM_ROLE_UNEMBED,       /* (V, C); absent when tied to the embedding */
    DSC_PARAM_ROLE_MOE1_B,        /* (E, F): GELU experts' fc bias */
    DSC_PARAM_ROLE_MOE2_B,        /* (E, C): GELU experts' proj bias */
    DSC_PARAM_ROLE_MOE_COEF_W,    /* (2, C): PR-MoE mixing logits; the residual MLP uses the MLP roles */
    DSC_PARAM_ROLE_MOE_COEF_B,    /* (2) */
    DSC_PARAM_ROLE_SHARED1_W,     /* (2 FS, C): the shared expert's rows gate | up */
    DSC_PARAM_ROLE_SHARED2_W,     /* (C, FS) */
    DSC_PARAM_ROLE_SHARED_GATE_W, /* (1, C): the shared expert's sigmoid gate */
    DSC_PARAM_ROLE_PROJ_IN,       /* (C, P): embedding -> model width (OPT project_in) */
    DSC_PARAM_ROLE_PROJ_OUT,      /* (P, C): model width -> LM head input (OPT project_out) */
    DSC_PARAM_ROLE_COUNT
} dsc_param_role;

/* When a slot exists for a given config. */
typedef enum dsc_slot_when {
    DSC_SLOT_WHEN_ALWAYS = 0,
    DSC_SLOT_WHEN_QKV_BIAS,      /* config.qkv_bias */
    DSC_SLOT_WHEN_UNTIED,        /* !config.tie_embeddings */
    DSC_SLOT_WHEN_MOE_RESIDUAL,  /* config.moe_residual */
    DSC_SLOT_WHEN_SHARED_EXPERT, /* config.d_ff_shared > 0 */
    DSC_SLOT_WHEN_PRE_NORM,      /* !config.post_norm (the final norm) */
    DSC_SLOT_WHEN_PROJECTED      /* config.d_embed is set and differs from C */
} dsc_slot_when;

#define DSC_PARAM_MAX_DEPS 4

typedef struct dsc_param_dep {
    const char *name; /* "q" */
    dsc_dim rows;
    dsc_dim cols; /* DSC_DIM_NONE for a vector */
} dsc_param_dep;

/* A parameter: its dependencies and its finalize step, which converts each
 * to f32 and stacks them by rows (q | k | v) into the arena; a per-expert
 * parameter is a list over E experts, stacked on a leading E axis. */
typedef struct dsc_param_def {
    const char *name; /* slot name, "qkv" */
    dsc_param_role role;
    dsc_slot_when when;
    bool per_expert;
    int n_deps;
    dsc_param_dep deps[DSC_PARAM_MAX_DEPS];
} dsc_param_def;

/* Checkpoint name (relative to the layer prefix for transformer
 * containers; `*` = expert index for per-expert targets) -> "slot.dep". */
typedef struct dsc_param_mapping {
    const char *source;
    const char *target;
} dsc_param_mapping;

typedef struct dsc_container_def {
    const char *name;
    int n_params;
    const dsc_param_def *params;
    int n_mappings;
    const dsc_param_mapping *mappings;
} dsc_container_def;

/* Every rule of a mapping table: targets "slot.dep" exist, each dependency
 * is mapped exactly once, per-expert targets have exactly one `*` in the
 * source and others none, slot names and roles are distinct. The error
 * names the container and the entry. */
DSC_API dsc_status dsc_container_def_validate(const dsc_container_def *def);

/* ---- policies and their registry ------------------------------------------------------------ */
typedef struct dsc_policy {
    const char *arch; /* registry key: "LlamaForCausalLM", "gpt" */
    /* Fills the model config from the architecture's config JSON (HF
     * config.json, or the dsc training config); unsupported options are
     * DSC_ERR_UNSUPPORTED naming the key. `source` names the file. */
    dsc_status (*configure)(dsc_infer_model_config *mc, const char *config_json, const char *source);
    const char *layer_prefix; /* "model.layers." : names "<prefix><i>.<rest>" go to layer i */
    const dsc_container_def *layer;
    const dsc_container_def *non_layer;
    const char *const *ignored; /* NULL-terminated names (may hold `*`) skipped at load */
    /* The container of the layers that are not MoE layers when
     * moe_layer_freq > 1 (dsc gpt-moe, mixtral); NULL: every layer uses `layer`. */
    const dsc_container_def *dense_layer;
} dsc_policy;

/* Validates both containers, then adds the policy (the struct must outlive
 * the registry). An invalid table or a taken name is DSC_ERR_INVALID naming
 * the policy and the entry; nothing is registered. */
DSC_API dsc_status dsc_policy_register(const dsc_policy *policy);
/* Registers gpt, llama, LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, MixtralForCausalLM, Phi3ForCausalLM, GPTNeoXForCausalLM,
 * GPT2LMHeadModel, OPTForCausalLM, gpt-moe and mixtral. Idempotent. */
DSC_API dsc_status dsc_policy_register_builtin(void);
/* DSC_ERR_UNSUPPORTED listing the registered names when none matches. */
DSC_API dsc_status dsc_policy_find(const char *arch, const dsc_policy **out);

/* ---- models ----------------------------------------------------------------------------------- */
typedef struct dsc_infer_model dsc_infer_model;

/* A source of named checkpoint tensors, read as f32. */
typedef struct dsc_tensor_source {
    void *impl;
    int64_t count;
    /* Name and shape of tensor i; name valid while the source lives. */
    void (*describe)(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape);
    dsc_status (*read_f32)(void *impl, int64_t i, float *dst, int64_t numel);
    /* Elements [offset, offset + count) of tensor i in row-major order; what
     * a tensor-parallel rank reads its shard with (NULL: the source cannot). */
    dsc_status (*read_f32_span)(void *impl, int64_t i, int64_t offset, int64_t count, float *dst);
} dsc_tensor_source;

/* Builds the containers of `policy` for `mc`, lays the arena out, maps every
 * tensor of `src` (a name mapped to no container, not ignored, is
 * DSC_ERR_CORRUPT naming it; a shape mismatch names tensor, expected and
 * found), finalizes, and checks nothing is missing (naming the first
 * checkpoint tensor that is). */
DSC_API dsc_status dsc_infer_model_build(const dsc_policy *policy, const dsc_infer_model_config *mc,
                                         const dsc_tensor_source *src, dsc_infer_model **out);
/* Loads a Hugging Face directory (config.json + model.safetensors or a
 * sharded index), or a dsc training checkpoint (save_dir, save_dir/<tag>,
 * or a state.h5; model parameters only). Single-process: uses MPI_COMM_SELF
 * for HDF5, so MPI must be initialised for dsc checkpoints. */
DSC_API dsc_status dsc_infer_model_load(const char *path, dsc_infer_model **out);

/* Tensor parallelism (AutoTP, dsc/tp.h): each rank of `comm` loads only
 * its shard (query/KV heads, feed-forward columns and vocabulary rows of
 * the plan) from the memory-mapped safetensors or the HDF5 checkpoint; the
 * forward all-reduces row-parallel outputs over `comm` and returns this
 * rank's vocabulary slice of the logits. The plan's rules are
 * partition_config (`rules`), the model's base_model_tp_plan when
 * config.json carries one, the policy's declaration and the name rules; a
 * rule that contradicts the policy's forward is DSC_ERR_CONFIG naming the
 * tensor. Every rank of `comm` must call it (the shards differ). */
typedef struct dsc_infer_tp {
    dsc_comm *comm; /* the tensor-parallel group (the topology's `model` axis); NULL: one rank */
    int tp_size;    /* without comm: the degree to plan for (dsc_infer_model_plan); else ignored */
    int64_t grain;  /* tp_grain_size; <= 0 means 64 */
    const dsc_tp_rule *rules;
    int n_rules;
    bool no_name_rules; /* partition_config.use_default_specs = false */
    /* Expert parallelism (dsc/moe_dropless.h): each rank of ep_comm holds a
     * contiguous range of every MoE layer's experts (each expert's width
     * still TP-split over `comm`) and MoE tokens travel by all-to-all-v.
     * Its ranks hold the same tokens (attention replicated over it);
     * NULL: every rank holds every expert. */
    dsc_comm *ep_comm;
} dsc_infer_tp;

DSC_API dsc_status dsc_infer_model_load_tp(const char *path, const dsc_infer_tp *tp, dsc_infer_model **out);
/* Pipeline parallelism: the transformer layers are cut into comm's size
 * stages (comm rank = stage) by `partition_method` ("uniform": by layer
 * count, DeepSpeed's partition_uniform; "parameters": DeepSpeed's balanced
 * partition of [embedding, layers..., final norm + LM head] weighted by
 * parameter count), every stage holding at least one layer. A stage loads
 * only its layers, the first also the embedding, the last the final norm
 * and LM head (and the embedding again when tied); its engine holds KV for
 * its layers only. max_weight_bytes (> 0) is this rank's weight budget,
 * also without PP: a shard needing more is DSC_ERR_CONFIG naming the bytes
 * it needs, before anything is read. Every rank of comm (and of tp->comm)
 * must call it. */
typedef struct dsc_infer_pp {
    dsc_comm *comm;               /* the pipeline group (the topology's `pipe` axis); NULL: one stage */
    const char *partition_method; /* NULL: "uniform" */
    int64_t max_weight_bytes;     /* <= 0: no budget */
} dsc_infer_pp;

/* tp and pp may each be NULL. Under both, the ranks of a stage form the TP
 * group (DeepSpeed's grid: axes pipe, data, model). */
DSC_API dsc_status dsc_infer_model_load_parallel(const char *path, const dsc_infer_tp *tp, const dsc_infer_pp *pp,
                                                 dsc_infer_model **out);
/* One line on what this rank holds: stage, layers, embedding / head, TP
 * shard (heads, KV heads, feed-forward columns, vocabulary rows), its MoE
 * experts under expert parallelism, and weight bytes. */
DSC_API void dsc_infer_model_describe(const dsc_infer_model *m, char *buf, size_t len);
/* The plan alone (no ranks, no weights read): what --print-plan prints. */
DSC_API dsc_status dsc_infer_model_plan(const char *path, const dsc_infer_tp *tp, dsc_tp_plan **out);
/* The keys of a DeepSpeed inference config (init_inference / the JSON file
 * of `dsc-generate --config`) that dsc implements:
 *   tensor_parallel.tp_size, tensor_parallel.tp_grain_size (64),
 *   tensor_parallel.partition_config: {use_default_specs (true), layer_specs:
 *     [{patterns: [regex, ...], partition_type: "column" | "row" | "skip"}]},
 *   max_out_tokens (1024): the most tokens (prompt + generated) a sequence holds,
 *   min_out_tokens (1): generation fails with an error naming the numbers
 *     when the context or the KV cache cannot hold this many new tokens.
 * Any other key is DSC_ERR_UNSUPPORTED naming it (layer_specs' shape and
 * partition_dim too: dsc derives fused layouts from the model's sizes). */
typedef struct dsc_infer_ds_config {
    dsc_infer_tp tp; /* comm left NULL; tp_size, grain, rules */
    int64_t max_out_tokens, min_out_tokens;
    dsc_tp_rule *owned_rules;
    char **owned_patterns;
} dsc_infer_ds_config;

DSC_API dsc_status dsc_infer_ds_config_parse(const char *json, const char *source, dsc_infer_ds_config *out);
/* Reads and parses the file `path` (NULL: the defaults). */
DSC_API dsc_status dsc_infer_ds_config_load(const char *path, dsc_infer_ds_config *out);
DSC_API void dsc_infer_ds_config_free(dsc_infer_ds_config *c);

/* This rank's vocabulary rows [*v0, *v0 + *nv) (the whole vocabulary without TP). */
DSC_API void dsc_infer_model_vocab_shard(const dsc_infer_model *m, int64_t *v0, int64_t *nv);
/* Seconds this rank spent in tensor-parallel all-reduces since the load. */
DSC_API double dsc_infer_model_comm_seconds(const dsc_infer_model *m);
DSC_API void dsc_infer_model_destroy(dsc_infer_model *m);
/* The tokenizer of a model loaded from `path`: `tokenizer` (a tokenizer.json)
 * when given; the byte tokenizer for dsc checkpoints; path/tokenizer.json
 * for Hugging Face directories; *out NULL (no error) when there is none.
 * A tokenizer.json with ids beyond the model's vocab_size is DSC_ERR_CORRUPT. */
DSC_API dsc_status dsc_infer_model_open_tokenizer(const char *path, const dsc_infer_model *m,
                                                  const char *tokenizer, dsc_tokenizer **out);
DSC_API const dsc_infer_model_config *dsc_infer_model_get_config(const dsc_infer_model *m);
/* "LlamaForCausalLM", "gpt", ... */
DSC_API const char *dsc_infer_model_arch(const dsc_infer_model *m);
/* Load-time weight type: re-stores the projection weights (fused QKV,
 * attention output, MLP, untied LM head) as bf16, f16 or Q8_0 (dsc/kernels.h;
 * norms, biases, embeddings and MoE experts stay f32), freeing the f32 copy.
 * Call once, before creating an engine; f32 is a no-op. Q8_0 needs widths
 * that are multiples of 32 (DSC_ERR_UNSUPPORTED naming the parameter). The
 * logits move from f32's by the documented tolerances (docs/performance.md). */
DSC_API dsc_status dsc_infer_model_set_weight_type(dsc_infer_model *m, dsc_weight_format type);
DSC_API dsc_weight_format dsc_infer_model_weight_type(const dsc_infer_model *m);
/* Bytes of the finalized weight arena. */
DSC_API size_t dsc_infer_model_arena_bytes(const dsc_infer_model *m);
/* A finalized parameter of layer `layer` (-1: the non-transformer
 * container), as a view into the arena; DSC_ERR_INVALID when absent. */
DSC_API dsc_status dsc_infer_model_param(const dsc_infer_model *m, int32_t layer, dsc_param_role role,
                                         dsc_tensor *out);

/* ---- engine ----------------------------------------------------------------------------------------- */
typedef struct dsc_infer_engine dsc_infer_engine;

typedef struct dsc_infer_engine_config {
    int32_t block_size;
    int64_t kv_cache_bytes;
    int32_t max_sequences;
    int64_t max_context; /* clipped to the model's context limit */
    int32_t max_tokens_per_forward;
    int32_t max_batch_sequences;
    dsc_dtype kv_dtype; /* DSC_DTYPE_F32 (default) or DSC_DTYPE_BF16 (half the KV memory) */
    /* Under pipeline parallelism over P stages: micro-batches in flight, in
     * [P, 4 P]; 0 (default) = P. More than P gives the first stage slack
     * for the round trip of the sampled tokens, in smaller micro-batches. */
    int32_t micro_batches;
} dsc_infer_engine_config;

/* Defaults: block 16, 64 MiB of f32 KV, 64 sequences, context = the
 * model's (at most 4096), 512 tokens and 64 sequences per forward. */
DSC_API dsc_infer_engine_config dsc_infer_engine_config_default(const dsc_infer_model *m);
/* The engine borrows the model (it must outlive the engine). */
DSC_API dsc_status dsc_infer_engine_create(dsc_infer_model *m, const dsc_infer_engine_config *cfg,
                                           dsc_infer_engine **out);
DSC_API void dsc_infer_engine_destroy(dsc_infer_engine *e);
DSC_API const dsc_kv_config *dsc_infer_engine_kv_config(const dsc_infer_engine *e);
DSC_API int32_t dsc_infer_engine_vocab_size(const dsc_infer_engine *e);
/* Columns of the logits put() writes: the vocabulary, or this rank's slice of it under TP. */
DSC_API int32_t dsc_infer_engine_logits_width(const dsc_infer_engine *e);
/* The next token from one row of put()'s logits (logits_width values):
 * dsc_sample's rules; under TP every rank of the group calls it with its
 * slice and the same params, history and rng state, and all get the same
 * token (candidates are merged across ranks, never a whole row). */
DSC_API dsc_status dsc_infer_engine_sample(dsc_infer_engine *e, const float *row,
                                           const dsc_sampling_params *params, const int32_t *history,
                                           int64_t n_history, dsc_rng *rng, int32_t *token);

/* One forward over a ragged batch: n distinct uids, tokens[i] (counts[i] ids)
 * appended to each sequence; logits (n, logits_width) of each sequence's last new
 * token. A batch that does not fit is an error naming the reason
 * (dsc_sched_result) and changes nothing. */
DSC_API dsc_status dsc_infer_engine_put(dsc_infer_engine *e, int32_t n, const uint64_t *uids,
                                        const int32_t *const *tokens, const int32_t *counts, float *logits);
/* Side-effect free: whether the batch (uids, lengths) could run now. */
DSC_API dsc_sched_result dsc_infer_engine_can_schedule(const dsc_infer_engine *e, const uint64_t *uids,
                                                       const int64_t *lengths, int32_t n);
/* Side-effect free: how many of max_tokens fit for uid with at most
 * max_blocks new blocks, and the blocks they need. */
DSC_API void dsc_infer_engine_query(const dsc_infer_engine *e, uint64_t uid, int64_t max_tokens,
                                    int32_t max_blocks, int64_t *tokens_out, int32_t *blocks_out);
/* Frees uid's KV blocks and slot; an unknown uid is DSC_ERR_INVALID. */
DSC_API dsc_status dsc_infer_engine_flush(dsc_infer_engine *e, uint64_t uid);
DSC_API int32_t dsc_infer_engine_free_blocks(const dsc_infer_engine *e);
DSC_API int32_t dsc_infer_engine_total_blocks(const dsc_infer_engine *e);
/* Tokens in the cache for uid (0 when untracked). */
DSC_API int64_t dsc_infer_engine_seen_tokens(const dsc_infer_engine *e, uint64_t uid);
/* Seconds this rank spent computing its stage's forwards (*busy_s) and in
 * forward calls altogether, the waits for the previous stage's activation
 * included (*tick_s; the wait for the last stage's sampled tokens falls
 * between them): busy over the wall time is the stage's busy fraction. */
DSC_API void dsc_infer_engine_busy(const dsc_infer_engine *e, double *busy_s, double *tick_s);

/* ---- scheduler (Dynamic SplitFuse continuous batching) -------------------------------------- */
typedef struct dsc_scheduler dsc_scheduler;

typedef enum dsc_prefill_priority {
    DSC_PREFILL_PRIORITY_DECODE_FIRST = 0, /* FastGen: decodes, then prompt chunks fill the budget */
    DSC_PREFILL_PRIORITY_PREFILL_FIRST     /* prompt chunks first (lower time to first token) */
} dsc_prefill_priority;

typedef struct dsc_scheduler_config {
    int32_t token_budget; /* tokens per forward; <= the engine's max_tokens_per_forward */
    dsc_prefill_priority prefill_priority;
    /* KV kept for each admitted request's future tokens: -1 reserves its
     * whole max_new_tokens (never preempts); k >= 0 reserves min(k,
     * max_new_tokens) and relies on preemption when decodes outgrow it. */
    int32_t kv_reserve_tokens;
    /* Static batching for comparison: admit only when nothing runs, and
     * run each admitted group to completion. */
    bool static_batching;
} dsc_scheduler_config;

DSC_API dsc_scheduler_config dsc_scheduler_config_default(const dsc_infer_engine *e);

typedef struct dsc_gen_request {
    uint64_t uid;
    const int32_t *prompt; /* copied at submit */
    int32_t n_prompt;
    int32_t max_new_tokens;
    dsc_sampling_params sampling;
    uint64_t seed;
    const int32_t *stop_tokens; /* copied at submit */
    int32_t n_stop;
} dsc_gen_request;

/* Called for every generated token, in order per request; `finished` on the
 * request's last one. An error stops dsc_scheduler_run. */
typedef dsc_status (*dsc_token_callback)(void *user, uint64_t uid, int32_t token, bool finished);

typedef struct dsc_scheduler_stats {
    int64_t forwards;
    int64_t tokens_forwarded; /* prompt + decode tokens through the model (recomputes included) */
    int64_t tokens_generated;
    int64_t preemptions;
    int32_t max_tokens_in_forward;
    double kv_utilisation_sum; /* sum over forwards of used / total blocks */
    double kv_utilisation_peak;
} dsc_scheduler_stats;

DSC_API dsc_status dsc_scheduler_create(dsc_infer_engine *e, const dsc_scheduler_config *cfg,
                                        dsc_token_callback cb, void *user, dsc_scheduler **out);
DSC_API void dsc_scheduler_destroy(dsc_scheduler *s);
/* Queues a request. A uid in use, an empty prompt, or a request that could
 * never fit (prompt + max_new_tokens beyond max_context or the whole KV
 * cache) is DSC_ERR_INVALID naming the uid and the reason. */
DSC_API dsc_status dsc_scheduler_submit(dsc_scheduler *s, const dsc_gen_request *req);
/* One forward; *idle is set when nothing was left to run. */
DSC_API dsc_status dsc_scheduler_step(dsc_scheduler *s, bool *idle);
/* Steps until every submitted request has finished. */
DSC_API dsc_status dsc_scheduler_run(dsc_scheduler *s);
DSC_API const dsc_scheduler_stats *dsc_scheduler_get_stats(const dsc_scheduler *s);
/* Seconds from submit to first token of uid (negative when none yet). */
DSC_API double dsc_scheduler_ttft(const dsc_scheduler *s, uint64_t uid);
/* Inside the token callback only: the logits row the reported token was
 * sampled from (before temperature and filters; the engine's logits width,
 * this rank's vocabulary slice under TP); NULL elsewhere. */
DSC_API const float *dsc_scheduler_token_logits(const dsc_scheduler *s);

typedef struct dsc_scheduler_counts {
    int32_t waiting;   /* queued, including preempted ones */
    int32_t preempted; /* waiting again after a recompute preemption */
    int32_t running;
    int32_t finished; /* done but not yet released */
} dsc_scheduler_counts;

DSC_API dsc_scheduler_counts dsc_scheduler_get_counts(const dsc_scheduler *s);
/* Forgets uid whatever its state (waiting, running, finished), freeing its
 * KV blocks: how a server cancels a request, and how it drops a finished
 * one (finished requests are otherwise kept, e.g. for dsc_scheduler_ttft).
 * Not from inside the token callback. An unknown uid is DSC_ERR_INVALID. */
DSC_API dsc_status dsc_scheduler_release(dsc_scheduler *s, uint64_t uid);

#ifdef __cplusplus
}
#endif
#endif
