/* dsc/tp_layers.h — tensor parallelism in training (Megatron-LM's layers on
 * AutoTP's cut).
 *
 * The layer types tp/ registers, built in place of the dense ones when the
 * build context carries a dsc_tp_build_extra (dsc/model.h):
 *   tp_embedding  vocabulary-parallel: each rank holds rows [v0, v0 + nv) of
 *                 the token embedding, looks up the tokens in its range (zero
 *                 for the rest) and the all-reduce over the tensor group sums
 *                 the rows; learned positions are replicated, added after.
 *   tp_block      the pre-norm block with attention split by heads and the
 *                 MLP split by width (moe_block gets the same attention;
 *                 its experts are whole, or split by moe/ itself under
 *                 moe.enable_expert_tensor_parallelism).
 *   tp_lm_head    vocabulary-parallel logits and cross-entropy: the row max
 *                 and the sums of exponentials and of target logits are
 *                 all-reduced, so the full (V) logits row of a training
 *                 token never exists on one rank.
 * Linears: column-parallel (q, k, v, fc, gate, up: the output features
 * split; forward local, backward all-reduces the input gradient) and
 * row-parallel (o, proj, down: the input features split; forward
 * all-reduces the output; the bias is added once). Per block and micro-batch
 * that is Megatron's count: forward one all-reduce of (b, t, C) after the
 * attention and one after the MLP, backward the same.
 *
 * Heads and widths come from the plan's cut (dsc_tp_shard_of: whole KV
 * groups, grain-aligned widths), so training and inference cut a model
 * alike; every parameter is declared as its piece of the global tensor
 * (dsc_params_declare_shard), which is what checkpoints store.
 *
 * With tensor_parallel.sequence_parallel (Megatron's) the activations
 * between the regions hold this rank's t / tp positions, and so does what a
 * block keeps for backward outside the regions; each all-reduce becomes a
 * reduce-scatter, each region's input an all-gather (again in backward:
 * a region keeps only its rank's positions of its input).
 *
 * Not here: which ranks form the group (dsc/topology.h), KV heads fewer
 * than ranks (refused: a KV head held by several ranks would need its
 * gradient summed over them). */
#ifndef DSC_TP_LAYERS_H
#define DSC_TP_LAYERS_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/comm.h"
#include "dsc/config.h"
#include "dsc/engine.h"
#include "dsc/model.h"
#include "dsc/rng.h"
#include "dsc/status.h"
#include "dsc/topology.h"
#include "dsc/tp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What tp/'s factories read from dsc_build_ctx.tp. */
typedef struct dsc_tp_build_extra {
    dsc_comm *group;    /* the tensor-parallel group; its rank is this rank's shard */
    int rank, size;     /* in the group */
    int64_t grain;      /* tp_grain_size of the widths */
    dsc_tp_shard shard; /* this rank's heads and widths */
    /* Megatron sequence parallelism: between the tensor-parallel regions a
     * rank holds positions [rank t/tp, (rank+1) t/tp) of each sequence. */
    bool sequence_parallel;
} dsc_tp_build_extra;

/* This rank's wiring for model `mc` over `group` (grain: tp_grain_size, <= 0
 * means 64). Splits the model cannot take are DSC_ERR_CONFIG naming the
 * numbers. */
DSC_API dsc_status dsc_tp_build_extra_init(dsc_tp_build_extra *x, const dsc_model_config *mc, dsc_comm *group,
                                           int64_t grain);
/* Registers tp_embedding, tp_block and tp_lm_head. Idempotent. */
DSC_API dsc_status dsc_tp_register_layers(void);
/* The attention split by heads, as dsc_build_ctx.attention. */
DSC_API dsc_status dsc_tp_attention_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);
/* For dsc_optimizer_options.counts_in_norm (ctx: the dsc_tp_build_extra):
 * a sharded parameter counts on every rank of the group, a replicated one on
 * the group's rank 0 only, so the norm summed over the group counts each
 * element once. */
DSC_API bool dsc_tp_counts_in_norm(const dsc_param *param, void *ctx);

/* Non-expert parameters every rank of the tensor group holds whole (norms,
 * row-parallel biases, learned positions; a MoE block's router and, with
 * moe.use_residual, its PR-MoE residual MLP), and one rank's share of psi
 * non-expert parameters: (psi - replicated) / tp + replicated. */
DSC_API double dsc_tp_replicated_params(const dsc_model_config *mc, bool moe_residual);
DSC_API double dsc_tp_params_per_rank(const dsc_model_config *mc, bool moe_residual, double psi, int tp);
/* Expert parameters kept whole when the experts are split by TP (GPT
 * experts' proj biases), and one tensor rank's share of psi_experts expert
 * parameters (before expert parallelism divides them): all of them
 * without `split` (moe.enable_expert_tensor_parallelism), else
 * (psi_experts - replicated) / tp + replicated. */
DSC_API double dsc_tp_expert_replicated_params(const dsc_model_config *mc);
DSC_API double dsc_tp_expert_params_per_rank(const dsc_model_config *mc, double psi_experts, int tp, bool split);

/* For groups with a model axis (dsc_groups_create of a plan with tp > 1):
 * fills `ctx` (a dsc_tp_build_extra that outlives the model) with this
 * rank's shard of cfg's model over the tensor group, registers the layer
 * types and sets out's tp, attention, model (the tensor group) and norm rule.
 * It is the pipeline trainer's hooks.prepare_tp. */
DSC_API dsc_status dsc_tp_prepare(const dsc_config *cfg, dsc_groups *groups, void *ctx, dsc_trainer_layers *out);

/* Collective over the tensor group: its rank 0's stream becomes every
 * rank's. The ranks of a tensor group see the same tokens, so stochastic
 * layers (a MoE gate's sampled second expert, jitter) must draw alike; a
 * resume from another layout restores per-rank streams that may not be. */
DSC_API dsc_status dsc_tp_sync_rng(dsc_comm *tensor_group, dsc_rng *rng);

/* A data-parallel trainer's tensor-parallel wiring (dsc-train, tests). */
typedef struct dsc_tp_wiring {
    dsc_group_plan plan; /* pipe 1 x data x model, DeepSpeed's axis order */
    dsc_groups *groups;
    dsc_tp_build_extra extra;
    dsc_trainer_layers layers; /* for dsc_trainer_create_with_layers */
} dsc_tp_wiring;

/* Collective over `world`: the groups of world = tp x dp for
 * tensor_parallel.autotp_size (a world it does not divide is DSC_ERR_CONFIG
 * naming the numbers), this rank's shard of cfg's model and the layer
 * types. Pass dsc_tp_wiring_dp as the trainer's data-parallel group. */
DSC_API dsc_status dsc_tp_wire(const dsc_config *cfg, dsc_comm *world, dsc_tp_wiring *w);
DSC_API dsc_comm *dsc_tp_wiring_dp(const dsc_tp_wiring *w);
/* The partition summary: every tensor rank's heads and widths and the
 * shapes of its pieces, for cfg's model at tensor_parallel.autotp_size. */
DSC_API dsc_status dsc_tp_print_shards(FILE *f, const dsc_config *cfg);
DSC_API void dsc_tp_wiring_free(dsc_tp_wiring *w);

#ifdef __cplusplus
}
#endif
#endif
