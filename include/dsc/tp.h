/* dsc/tp.h — tensor parallelism: the sharding plan (DeepSpeed's AutoTP).
 *
 * A plan is a pure function of a model's parameter list (global names and
 * shapes, optionally each parameter's declared kind), its dimensions (heads,
 * KV heads, head size, feed-forward width, vocabulary, experts) and
 * (tp_size, grain). For every tensor it says how it is split and exactly
 * which ranges each rank holds:
 *   replicate  every rank holds the whole tensor (norms, routers, positions,
 *              the bias of a row-parallel linear: added once, after the all-reduce);
 *   column     output features split (q/k/v, gate/up, fc1; their biases);
 *   row        input features split (o_proj, down_proj; partial outputs summed);
 *   vocab      vocabulary rows split (embedding, LM head).
 * The kind of a tensor comes from the first rule that decides it: the user's
 * partition_config (regex -> column/row), the model's base_model_tp_plan
 * ("colwise"/"rowwise", `*` for a layer index), the policy's declaration,
 * then AutoTP's name rules. Splits follow the tensor's unit: attention by
 * whole heads (a fused [q | k | v] by the head ranges of each block, an
 * interleaved [heads, 3, head_size] by whole head triplets, KV heads
 * replicated over the ranks of their query heads when KV heads < tp_size),
 * feed-forward and vocabulary widths by grain-aligned pieces, a fused
 * [gate | up] per half. A split that cannot be made is DSC_ERR_CONFIG naming
 * the tensor and the numbers. Needs no MPI; the plan holds every rank's
 * ranges, so one process can check them all.
 *
 * Not here: reading shards (the inference loader) or communication. */
#ifndef DSC_TP_H
#define DSC_TP_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_tp_kind {
    DSC_TP_KIND_UNDECLARED = 0, /* as a declaration: let the later rules decide */
    DSC_TP_KIND_REPLICATE,
    DSC_TP_KIND_COLUMN,
    DSC_TP_KIND_ROW,
    DSC_TP_KIND_VOCAB
} dsc_tp_kind;

/* What the split axis holds, which fixes where the cuts may fall. */
typedef enum dsc_tp_unit {
    DSC_TP_UNIT_NONE = 0,        /* replicated */
    DSC_TP_UNIT_Q_HEADS,         /* NH * HS: query heads */
    DSC_TP_UNIT_KV_HEADS,        /* NKV * HS: key/value heads */
    DSC_TP_UNIT_QKV,             /* (NH + 2 NKV) * HS: [q | k | v] (Phi-3 qkv_proj, GPT-2 c_attn) */
    DSC_TP_UNIT_QKV_INTERLEAVED, /* NH * 3 * HS: [head, q/k/v, HS] (GPT-NeoX query_key_value) */
    DSC_TP_UNIT_FF,              /* F, grain-aligned */
    DSC_TP_UNIT_GATE_UP,         /* 2 F: [gate | up], each half split alike */
    DSC_TP_UNIT_VOCAB,           /* V, grain-aligned */
    DSC_TP_UNIT_FF_EXPERT,       /* FE: a routed expert's width (Qwen2-MoE), grain-aligned */
    DSC_TP_UNIT_FF_SHARED,       /* FS: the shared expert's width (Qwen2-MoE), grain-aligned */
    DSC_TP_UNIT_COUNT
} dsc_tp_unit;

/* Which rule decided a tensor's kind. */
typedef enum dsc_tp_rule_source {
    DSC_TP_SOURCE_USER = 0,   /* partition_config */
    DSC_TP_SOURCE_MODEL_PLAN, /* config.json base_model_tp_plan */
    DSC_TP_SOURCE_POLICY,     /* the policy's declaration */
    DSC_TP_SOURCE_NAME,       /* AutoTP's name rules */
    DSC_TP_SOURCE_DEFAULT     /* nothing matched: replicated (vectors, routers, positions) */
} dsc_tp_rule_source;

typedef struct dsc_tp_dims {
    int32_t n_head;    /* NH */
    int32_t n_kv_head; /* NKV */
    int32_t head_size; /* HS */
    int64_t d_ff;      /* F (per expert for MoE) */
    int64_t vocab_size;
    int32_t n_experts;                /* 0: dense */
    int64_t d_ff_expert, d_ff_shared; /* routed and shared expert widths when not F (0: none) */
} dsc_tp_dims;

/* One parameter of the model as the checkpoint names it. A weight is (out,
 * in), or (E, out, in) for stacked experts; `transposed` marks a weight
 * stored (in, out) (GPT-2's Conv1D). */
typedef struct dsc_tp_param {
    const char *name;
    int ndim;
    int64_t shape[DSC_MAX_DIMS];
    bool transposed;
    dsc_tp_kind declared; /* the policy's kind, or DSC_TP_KIND_UNDECLARED */
    dsc_tp_unit unit;     /* with a declared kind: its unit (DSC_TP_UNIT_NONE: inferred) */
} dsc_tp_param;

/* A user or model rule: matching parameters get `kind` (DSC_TP_KIND_COLUMN,
 * DSC_TP_KIND_ROW, or DSC_TP_KIND_REPLICATE for partition_config's "skip").
 * partition_config patterns are POSIX extended regexes searched in the full
 * parameter name (DeepSpeed's `.*\.o_proj\.weight$`); base_model_tp_plan
 * patterns are matched against the tail of the module name (the name
 * without .weight / .bias) with `*` standing for one decimal index. */
typedef struct dsc_tp_rule {
    const char *pattern;
    dsc_tp_kind kind;
} dsc_tp_rule;

typedef struct dsc_tp_options {
    int tp_size;
    int64_t grain; /* tp_grain_size; <= 0 means 64 */
    const dsc_tp_rule *user;
    int n_user;
    const dsc_tp_rule *model_plan;
    int n_model_plan;
    bool no_name_rules; /* partition_config.use_default_specs = false: AutoTP's row/column names are off */
} dsc_tp_options;

/* A range [start, start + count) along a tensor's split axis. */
typedef struct dsc_tp_span {
    int64_t start, count;
} dsc_tp_span;

/* What one rank holds of the attention, feed-forward and vocabulary. Query
 * heads [q0, q0 + nq), KV heads [kv0, kv0 + nkv) (shared with other ranks
 * when KV heads < tp_size), feed-forward columns [f0, f0 + nf), vocabulary
 * rows [v0, v0 + nv). */
typedef struct dsc_tp_shard {
    int32_t q0, nq, kv0, nkv;
    int64_t f0, nf, v0, nv;
    int64_t fe0, nfe, fs0, nfs; /* routed / shared expert columns (0 when the dims have none) */
} dsc_tp_shard;

/* Pure: rank's heads and widths for (dims, tp_size, grain). Impossible
 * splits are DSC_ERR_CONFIG naming the numbers. */
DSC_API dsc_status dsc_tp_shard_of(const dsc_tp_dims *dims, int tp_size, int64_t grain, int rank,
                                   dsc_tp_shard *out);
/* Pure: rank's piece [*start, *start + *count) of `total` split into
 * grain-aligned widths (DeepSpeed's tp_shard rule: whole grains spread
 * evenly, the last rank also takes total % grain; near-even elements when
 * total < grain * tp_size). total < tp_size is DSC_ERR_CONFIG naming `what`. */
DSC_API dsc_status dsc_tp_split_width(int64_t total, int tp_size, int64_t grain, int rank, const char *what,
                                      int64_t *start, int64_t *count);

typedef struct dsc_tp_plan dsc_tp_plan;

/* One tensor's decision. The rank's local tensor is the concatenation, along
 * `axis`, of its spans in order (several for fused layouts). */
typedef struct dsc_tp_entry {
    const char *name;
    int ndim;
    int64_t shape[DSC_MAX_DIMS];
    dsc_tp_kind kind;
    dsc_tp_unit unit;
    dsc_tp_rule_source source;
    int axis; /* split axis; -1 when replicated */
} dsc_tp_entry;

/* Builds the plan; every tensor gets a decision or the error lists the
 * tensors that could not be placed (name, shape, why). */
DSC_API dsc_status dsc_tp_plan_create(const dsc_tp_param *params, int64_t n, const dsc_tp_dims *dims,
                                      const dsc_tp_options *opts, dsc_tp_plan **out);
DSC_API void dsc_tp_plan_destroy(dsc_tp_plan *p);
DSC_API int dsc_tp_plan_size(const dsc_tp_plan *p); /* tp_size */
DSC_API int64_t dsc_tp_plan_count(const dsc_tp_plan *p);
DSC_API const dsc_tp_entry *dsc_tp_plan_entry(const dsc_tp_plan *p, int64_t i);
/* The index of tensor `name`, or -1. */
DSC_API int64_t dsc_tp_plan_find(const dsc_tp_plan *p, const char *name);
/* The spans rank holds of tensor i (*spans valid while the plan lives). */
DSC_API int dsc_tp_plan_spans(const dsc_tp_plan *p, int64_t i, int rank, const dsc_tp_span **spans);
/* Rank's shape of tensor i. */
DSC_API void dsc_tp_plan_local_shape(const dsc_tp_plan *p, int64_t i, int rank, int64_t *shape);
DSC_API const dsc_tp_shard *dsc_tp_plan_shard(const dsc_tp_plan *p, int rank);
/* The table: one line per tensor with kind, unit, rule and every rank's spans. */
DSC_API void dsc_tp_plan_print(const dsc_tp_plan *p, FILE *f);

DSC_API const char *dsc_tp_kind_name(dsc_tp_kind k);          /* "replicate", "column", "row", "vocab" */
DSC_API const char *dsc_tp_unit_name(dsc_tp_unit u);          /* "q-heads", ... */
DSC_API const char *dsc_tp_source_name(dsc_tp_rule_source s); /* "partition_config", ... */

#ifdef __cplusplus
}
#endif
#endif
