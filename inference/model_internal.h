/* Private to inference/: the loaded model (config, policy, weight arena and
 * the per-layer views the forward reads), the symbolic-shape helpers shared
 * by containers and the loader, and the model forward over a ragged batch.
 * Not here: KV bookkeeping (kv_cache.h) and scheduling (engine, scheduler). */
#ifndef DSC_INFERENCE_MODEL_INTERNAL_H
#define DSC_INFERENCE_MODEL_INTERNAL_H

#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/moe_dropless.h"

struct dsc_infer_model {
    const dsc_policy *policy;
    dsc_infer_model_config cfg;   /* the whole model's */
    dsc_infer_model_config shard; /* this rank's widths (heads, F, vocabulary rows); == cfg without TP */
    dsc_comm *tp_comm;            /* tensor-parallel group; NULL: one rank */
    int tp_rank;
    int64_t vocab0;          /* first vocabulary row of the shard */
    int32_t tp_max_kv_heads; /* the most KV heads any rank holds: sizes KV blocks alike on all ranks */
    double tp_comm_seconds;  /* time in the all-reduces */
    dsc_comm *ep_comm;       /* expert-parallel group (shard.expert0 / n_local_experts); NULL: one rank */
    /* Pipeline stage (pipeline_stage.c): this rank's layers [layer0, layer1),
     * whether it holds the embedding (first) and the final norm + LM head
     * (last); the whole model, first and last, without PP. */
    int32_t layer0, layer1;
    bool first, last;
    dsc_comm *pipe_comm; /* pipeline group (comm rank = stage); NULL: one stage */
    int stage, stages;
    int32_t pp_max_layers; /* the most layers any stage holds: sizes KV blocks alike on all stages */
    void *arena;           /* one DSC_MEM_PARAMS allocation, every parameter 256-byte aligned */
    size_t arena_bytes;
    dsc_tensor *params; /* ((L + 1) * DSC_PARAM_ROLE_COUNT): layer l at l, the non-layer container at L */
    float *inv_freq;    /* (HS/2) RoPE frequencies, scaling applied */
    dsc_weight_format weight_format; /* of the projection weights (model_weights.c) */
    float *widen;                    /* workspace of narrow-weight GEMMs; NULL for f32 */
    int64_t widen_floats;
};

/* What one pipeline stage builds: transformer layers [layer0, layer1), the
 * embedding (first; also on the last with tied embeddings), the final norm
 * and LM head (last). A weight arena over max_weight_bytes (> 0) is refused
 * before anything is read or allocated, naming the need. */
typedef struct dsc_infer_stage {
    int32_t layer0, layer1;
    bool first, last;
    int64_t max_weight_bytes;
} dsc_infer_stage;

/* dsc_infer_model_build for one stage (NULL: the whole model). */
dsc_status dsc_infer_model_build_stage(const dsc_policy *policy, const dsc_infer_model_config *mc,
                                       const dsc_tensor_source *src, const dsc_infer_stage *stage,
                                       dsc_infer_model **out);
/* Whether a parameter of container c (c == L: the non-layer one) with `role` belongs to the stage. */
bool dsc_infer_stage_holds(const dsc_infer_stage *stage, const dsc_infer_model_config *mc, int32_t c,
                           dsc_param_role role);
/* The stage of this rank under `pp` (NULL or comm NULL: the whole model),
 * with layers cut by pp->partition_method over the policy's parameter counts. */
dsc_status dsc_infer_stage_plan(const dsc_policy *policy, const dsc_infer_model_config *mc, const dsc_infer_pp *pp,
                                dsc_infer_stage *out, int32_t *max_layers);

/* Records the pipeline group on a model built for its stage. */
void dsc_infer_stage_attach(dsc_infer_model *m, const dsc_infer_pp *pp, int32_t max_layers);

/* Sums a row-parallel partial result (N, C) over the tensor-parallel group (a no-op without TP). */
dsc_status dsc_model_tp_allreduce(dsc_infer_model *m, float *x, int64_t n);
/* The same for (N, cols) (the token embeddings of width P). */
dsc_status dsc_model_tp_allreduce_rows(dsc_infer_model *m, float *x, int64_t n, int64_t cols);
/* A row-parallel bias: added by TP rank 0 only, so the all-reduce counts it once. */
const dsc_tensor *dsc_model_row_bias(const dsc_infer_model *m, const dsc_tensor *b);

/* Extent of a symbolic dimension for a config. */
int64_t dsc_dim_value(const dsc_infer_model_config *mc, dsc_dim d);
/* Whether a slot exists for a config. */
bool dsc_slot_enabled(const dsc_param_def *p, const dsc_infer_model_config *mc);
/* Finalized shape of a parameter: (rows) or (rows, cols), with a leading E per expert. */
int dsc_param_def_shape(const dsc_param_def *p, const dsc_infer_model_config *mc, int64_t *shape);
/* The mapping of container `def` matching `name` (exact, or with `*`
 * standing for a decimal index written to *index; -1 when none). */
const dsc_param_mapping *dsc_container_match(const dsc_container_def *def, const char *name, int64_t *index);
/* Splits target "slot.dep" into the parameter and dependency indices (-1 when unknown). */
void dsc_container_target(const dsc_container_def *def, const char *target, int *param, int *dep);

/* The built-in policies (policy_hf.c, policy_dsc.c). */
extern const dsc_policy dsc_policy_hf_llama, dsc_policy_hf_mistral, dsc_policy_hf_qwen2, dsc_policy_hf_mixtral,
    dsc_policy_dsc_gpt, dsc_policy_dsc_llama;
/* Phi-3 (policy_hf_phi3.c) and the embedding / final norm / LM head container it shares with Llama. */
extern const dsc_policy dsc_policy_hf_phi3;
/* The GPT-family Hugging Face checkpoints (policy_hf_neox.c, policy_hf_gpt2.c, policy_hf_opt.c). */
extern const dsc_policy dsc_policy_hf_neox, dsc_policy_hf_gpt2, dsc_policy_hf_opt;
extern const dsc_container_def dsc_policy_hf_outer;
/* The dense Llama / Qwen2 block (policy_hf.c), also Qwen2-MoE's dense layers. */
extern const dsc_container_def dsc_policy_hf_dense_layer;
/* Qwen2-MoE (policy_hf_qwen2_moe.c). */
extern const dsc_policy dsc_policy_hf_qwen2_moe;
/* dsc's MoE training architectures (policy_dsc_moe.c). */
extern const dsc_policy dsc_policy_dsc_gpt_moe, dsc_policy_dsc_mixtral;
/* Whether the policy skips checkpoint tensor `name` (its `ignored` list, `*` for any index). */
bool dsc_policy_ignores(const dsc_policy *policy, const char *name);
/* Whether layer `layer` is a MoE layer (n_experts > 0 and moe_layer_freq). */
bool dsc_model_is_moe_layer(const dsc_infer_model_config *mc, int32_t layer);
/* Experts this model holds: n_local_experts, or all n_experts when 0. */
int32_t dsc_model_local_experts(const dsc_infer_model_config *mc);

/* Per-forward scratch, sized once for the engine's limits (N tokens, S sequences). */
typedef struct dsc_forward_scratch {
    int64_t max_tokens, max_seqs;
    float *x;      /* (N, C) residual stream */
    float *h;      /* (N, C) normed input */
    float *y;      /* (N, C) output of attention or MLP before the residual add */
    float *qkv;    /* q (n, Q), then k (n, KV), then v (n, KV) of a forward's n tokens */
    float *att;    /* (N, Q) */
    float *ff1;    /* (N, F) GELU pre-activation / SwiGLU gate */
    float *ff2;    /* (N, F) SwiGLU up (the dense MLP puts it right after n rows of ff1) */
    float *y2;     /* (N, C) MLP output of a parallel-residual block (else unused) */
    float *emb;    /* (N, P) token embeddings and the LM head's input when d_embed != C (else unused) */
    float *moe;    /* (N, C) expert output before the weighted sum */
    float *router; /* (N, E) */
    int32_t *pos;  /* (N) positions as i32 */
    float *rope;   /* (N, D) cosines then sines of each token's RoPE angles (dsc_model_rope_angles) */
    float *last;   /* (S, C) final hidden state of each sequence's last token */
    size_t bytes;
    dsc_infer_model_config cfg;  /* the sizes the buffers were made for */
    dsc_moe_dropless *moe_route; /* routing, dispatch, exchange, combine of the MoE layers; NULL: dense */
} dsc_forward_scratch;

/* Scratch for model m's shard (and its MoE routing over m's expert-parallel group). */
dsc_status dsc_forward_scratch_init(dsc_forward_scratch *s, const dsc_infer_model *m, int64_t max_tokens,
                                    int64_t max_seqs);
void dsc_forward_scratch_free(dsc_forward_scratch *s);

/* Logits (n_seqs, shard V) of each sequence's last token of `batch`,
 * writing every token's K and V into the cache. On a pipeline stage: the
 * stage's layers over s->x (the embedding on the first stage), logits only
 * on the last (elsewhere the output stays in s->x, (N, C)). */
dsc_status dsc_model_forward(dsc_infer_model *m, const dsc_ragged_batch *batch, dsc_kv_cache *cache,
                             dsc_forward_scratch *s, float *logits);
/* y (n, rows) = x (n, cols) @ W[row0 : row0 + rows]^T (+ b[row0 : row0 + rows]):
 * a projection through a block of rows of a fused (R, cols) parameter. */
dsc_status dsc_model_project(float *y, const float *x, int64_t n, const dsc_tensor *w, const dsc_tensor *b,
                             int64_t row0, int64_t rows);
/* A (rows, cols) f32 CPU view. */
dsc_tensor dsc_model_view2(float *p, int64_t rows, int64_t cols);
/* The dense MLP of layer `layer` (GELU, ReLU or SwiGLU by family and
 * activation): h (N, C) -> out (N, C). */
dsc_status dsc_model_dense_mlp(const dsc_infer_model *m, int32_t layer, int64_t n, const float *h, float *out,
                               dsc_forward_scratch *s);
/* The MoE feed-forward of one layer (routing by mc->moe_weighting, GELU
 * experts with biases for the GPT family, SwiGLU for Llama, the PR-MoE
 * residual when configured): h (N, C) -> out (N, C) overwritten. */
dsc_status dsc_model_moe(const dsc_infer_model *m, int32_t layer, int64_t n, const float *h, float *out,
                         dsc_forward_scratch *s);
/* The dims of each head RoPE rotates (0: none, learned positions). */
int32_t dsc_model_rope_dims(const dsc_infer_model_config *mc);
/* cs (N, D): the cosines (first D/2) and sines (last D/2) of each token's RoPE angles,
 * pos[t] * m->inv_freq, over the D = dsc_model_rope_dims rotated dims. */
void dsc_model_rope_angles(const dsc_infer_model *m, float *cs, int64_t n, const int32_t *pos);
/* RoPE on the first D dims of each head of x (N, heads, HS) in place, by cs from
 * dsc_model_rope_angles. */
void dsc_model_rope(const dsc_infer_model *m, float *x, int64_t n, int32_t heads, const float *cs);
/* The GPT family's MLP activation (mc->activation) of x into out, same shape. */
dsc_status dsc_model_activation(const dsc_infer_model_config *mc, dsc_tensor *out, const dsc_tensor *x);
/* Fills m->inv_freq from the config (theta, Llama-3 scaling). */
dsc_status dsc_model_rope_init(dsc_infer_model *m);

#endif
