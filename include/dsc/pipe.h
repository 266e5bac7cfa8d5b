/* dsc/pipe.h — pipeline parallelism: the PipelineModule (an ordered list of
 * layer specs with tied layers, cut into stages by DeepSpeed's partition
 * methods), the stage-local layers a rank builds, tied-weight groups, the
 * schedule-driven batch runner (the executor: a table from instruction type
 * to handler) and a PP x DP trainer built from a config.
 *
 * The runner plugs into the engine as a dsc_batch_runner: train_batch runs
 * one schedule (1F1B, GPipe or interleaved) over the batch's micro-batches,
 * moving activations and gradients between stages with the p2p layer (a
 * meta header per edge and batch describes dtype and shape; a wrong shape is
 * an error naming both stages; a silent peer is a timeout naming it), and
 * reduces tied gradients at ReduceTiedGrads. The engine calls the optimizer's
 * reduce_grads and step afterwards, so ReduceGrads / OptimizerStep are
 * batch-end markers here. docs/pipeline.md has the whole picture.
 *
 * Not here: the schedules themselves (dsc/schedule.h), which ranks form the
 * groups (dsc/topology.h), how gradients are averaged over data-parallel
 * ranks (dsc/optimizer.h). */
#ifndef DSC_PIPE_H
#define DSC_PIPE_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/comm.h"
#include "dsc/config.h"
#include "dsc/engine.h"
#include "dsc/model.h"
#include "dsc/nn.h"
#include "dsc/optimizer.h"
#include "dsc/schedule.h"
#include "dsc/status.h"
#include "dsc/topology.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- partitioning ------------------------------------------------------------------
 * Both write bounds[0..parts] (parts + 1 entries): part p holds items
 * [bounds[p], bounds[p+1]). They are DeepSpeed's partition_uniform and
 * partition_balanced, so stage boundaries match DeepSpeed's for the same
 * inputs. */

/* Stages 0..r-1 get ceil(n/parts) items and the rest floor(n/parts), r = n mod
 * parts; with n <= parts, part p holds item p and the tail parts are empty. */
DSC_API void dsc_pipe_partition_uniform(int n, int parts, int *bounds);

/* Contiguous parts of >= 1 item each minimising (heaviest part - lightest
 * part), ties going to the later split point (an O(n^2 parts) dynamic
 * program); falls back to uniform when n <= parts. Weights must be >= 0. */
DSC_API dsc_status dsc_pipe_partition_balanced(const double *weights, int n, int parts, int *bounds);

/* ---- the module ------------------------------------------------------------------- */

/* One entry of the module's layer list: DeepSpeed's LayerSpec, or its
 * TiedLayerSpec when `tied` names a parameter (e.g. "embed.wte.weight") that
 * every layer naming it shares: one copy per stage holding such a layer,
 * gradients summed across those stages at ReduceTiedGrads. */
typedef struct dsc_pipe_layer_spec {
    dsc_layer_spec spec;
    char tied[DSC_PARAM_NAME_MAX]; /* "" for an untied layer */
} dsc_pipe_layer_spec;

/* A model's list: embedding, blocks (moe_block where the model has them),
 * lm_head; with tie_embeddings the embedding and the head are tied on
 * "embed.wte.weight". Release with free(). */
DSC_API dsc_status dsc_pipe_model_layers(const dsc_model_config *mc, dsc_pipe_layer_spec **layers, int *count);

typedef struct dsc_pipe_module_options {
    const dsc_pipe_layer_spec *layers;
    int n_layers;
    int stages;                   /* P */
    int chunks;                   /* v model chunks per stage (interleaved schedule); 1 otherwise */
    const char *partition_method; /* "uniform", "parameters" or "type:REGEX" (POSIX ERE, case-insensitive) */
    const dsc_model_config *model;
    const void *build_extra; /* dsc_build_ctx.extra for the layer factories (moe_block's groups) */
    const void *build_tp;    /* dsc_build_ctx.tp and .attention (tp/'s wiring); NULL without TP */
    dsc_layer_factory build_attention;
    int64_t width;       /* features per token crossing a stage boundary; 0: model->d_model */
    int expert_parallel; /* ranks splitting each MoE layer's experts (moe.ep_size); 0 or 1: none */
} dsc_pipe_module_options;

typedef struct dsc_pipe_module dsc_pipe_module;

/* Describes every layer (each spec is built once into a scratch store to
 * count its parameters and activation bytes, as DeepSpeed does for its
 * "parameters" method) and cuts the list into P * v virtual stages;
 * virtual stage j = c * P + s is chunk c of stage s. More stages than
 * layers, or (v > 1) a layer count not divisible by P * v, is
 * DSC_ERR_CONFIG naming the numbers. The same on every rank. */
DSC_API dsc_status dsc_pipe_module_create(const dsc_pipe_module_options *o, dsc_pipe_module **out);
DSC_API void dsc_pipe_module_destroy(dsc_pipe_module *m);

DSC_API int dsc_pipe_module_stages(const dsc_pipe_module *m);
DSC_API int dsc_pipe_module_chunks(const dsc_pipe_module *m);
DSC_API int dsc_pipe_module_layer_count(const dsc_pipe_module *m);
DSC_API int64_t dsc_pipe_module_width(const dsc_pipe_module *m);
DSC_API const dsc_pipe_layer_spec *dsc_pipe_module_layer(const dsc_pipe_module *m, int index);
/* Layers [*first, *end) of chunk `chunk` of stage `stage`. */
DSC_API void dsc_pipe_module_range(const dsc_pipe_module *m, int stage, int chunk, int *first, int *end);
/* Trainable parameter elements of every layer as one rank holds it (tied
 * copies each counted; a MoE layer's local experts), of the whole model with
 * each parameter once (every expert, a tensor-parallel piece's whole
 * tensor), and of the model as rank 0 of its stage holds it (the local
 * experts and pieces only; equal to the whole model without expert or
 * tensor parallelism). */
DSC_API int64_t dsc_pipe_module_layer_params(const dsc_pipe_module *m, int index);
DSC_API int64_t dsc_pipe_module_unique_params(const dsc_pipe_module *m);
DSC_API int64_t dsc_pipe_module_rank_params(const dsc_pipe_module *m);

/* The partition summary: per stage its layers (per chunk), parameters and
 * estimated activation bytes per micro-batch of (B, T) tokens. */
DSC_API void dsc_pipe_module_print_summary(const dsc_pipe_module *m, int64_t B, int64_t T, FILE *fp);

/* ---- the stage: the layers one rank builds ------------------------------------------ */

typedef struct dsc_pipe_stage dsc_pipe_stage;

/* Builds the layers of stage `stage_id` (every chunk) into `params`, which
 * the caller finalizes afterwards. */
DSC_API dsc_status dsc_pipe_stage_build(const dsc_pipe_module *m, int stage_id, dsc_param_store *params,
                                        dsc_device device, dsc_pipe_stage **out);
DSC_API void dsc_pipe_stage_destroy(dsc_pipe_stage *s);
DSC_API int dsc_pipe_stage_id(const dsc_pipe_stage *s);
/* Every local layer, chunk by chunk in forward order (for the optimizer). */
DSC_API dsc_layer *const *dsc_pipe_stage_layers(const dsc_pipe_stage *s, int *count);
/* The layers of one chunk, in forward order. */
DSC_API dsc_layer *const *dsc_pipe_stage_chunk(const dsc_pipe_stage *s, int chunk, int *count);

/* ---- tied weights --------------------------------------------------------------------- */

typedef struct dsc_pipe_tied dsc_pipe_tied;

/* Collective over `pipe` (the stages of one pipeline, comm rank = stage):
 * for each tied name, in sorted order, a communicator over the stages
 * holding it. Each tied parameter must be in `params` on those stages. */
DSC_API dsc_status dsc_pipe_tied_create(const dsc_pipe_module *m, const dsc_pipe_stage *stage, dsc_comm *pipe,
                                        dsc_param_store *params, dsc_pipe_tied **out);
DSC_API void dsc_pipe_tied_destroy(dsc_pipe_tied *t);
/* Copies each tied value from the group's lowest stage (after init or restore). */
DSC_API dsc_status dsc_pipe_tied_sync_values(dsc_pipe_tied *t);
/* Sums each tied gradient over its group (ReduceTiedGrads). */
DSC_API dsc_status dsc_pipe_tied_reduce_grads(dsc_pipe_tied *t);
/* dsc_optimizer_options.counts_in_norm: a tied parameter counts only on its
 * group's lowest stage, so the global norm sees it once. ctx is the tied set. */
DSC_API bool dsc_pipe_tied_counts_in_norm(const dsc_param *param, void *ctx);

/* ---- the runner (executor) ------------------------------------------------------------- */

typedef struct dsc_pipe_runner_options {
    const dsc_pipe_module *module;
    dsc_pipe_stage *stage;
    dsc_comm *pipe;             /* stages of this pipeline (comm rank = stage); its timeout bounds every
                                   p2p transfer (the trainer sets pipeline.p2p_timeout_s) */
    dsc_pipe_tied *tied;        /* NULL: no tied layers */
    dsc_optimizer *optimizer;   /* layer hooks and grads_ready */
    dsc_schedule_kind schedule; /* DSC_SCHEDULE_TRAIN_1F1B, _GPIPE or _INTERLEAVED (chunks from the module) */
    int micro_batches;          /* M the activation slots are sized for */
    int64_t B, T;               /* micro-batch shape */
    int activation_checkpoint_interval; /* k > 0: runs of k local layers keep only their input (DeepSpeed's) */
    dsc_rng *rng;                       /* for stochastic layers; may be NULL */
} dsc_pipe_runner_options;

/* Reserves the stage's layers for the schedule's buffers and returns the
 * runner. train_batch runs the train schedule; eval_batch runs DeepSpeed's
 * inference schedule (v = 1) or a forward-only pass over the chunk ring. */
DSC_API dsc_status dsc_pipe_runner_create(const dsc_pipe_runner_options *o, dsc_batch_runner **out);

/* Collective over the pipe: the logits (V floats, f32) of the last position
 * of one sequence `tokens` (1, t), t <= T, on every stage (for generation;
 * sampling is the caller's). */
DSC_API dsc_status dsc_pipe_runner_logits(dsc_batch_runner *r, const dsc_tensor *tokens, dsc_tensor *logits);

/* What the instrumentation measured on this rank since the last reset:
 * wall time inside train_batch / eval_batch, of which compute (forward and
 * backward handlers); idle = wall - compute is the bubble plus p2p waits. */
typedef struct dsc_pipe_runner_stats {
    int64_t batches;
    double wall_s, compute_s, idle_s;
} dsc_pipe_runner_stats;

/* `r` must be a pipeline runner. */
DSC_API void dsc_pipe_runner_get_stats(const dsc_batch_runner *r, dsc_pipe_runner_stats *out);
DSC_API void dsc_pipe_runner_reset_stats(dsc_batch_runner *r);

/* ---- the PP x DP trainer ----------------------------------------------------------------- */

typedef struct dsc_pipe_trainer dsc_pipe_trainer;

/* Hooks for the folders the pipeline does not know (moe/, zero/). */
typedef struct dsc_pipe_trainer_hooks {
    /* Before any layer is built: register layer types and return the
     * factories' dsc_build_ctx.extra (e.g. moe_block's options with
     * dsc_groups_get(groups, DSC_GROUP_KIND_EXPERT)). NULL: dense layers only. */
    dsc_status (*prepare_build)(const dsc_config *cfg, dsc_groups *groups, void *ctx, const void **build_extra);
    void *ctx;
    /* With tensor_parallel.autotp_size > 1 (groups then have a model axis):
     * fill the build context's tp and attention and the rule that counts
     * replicated parameters once in the norm (tp/'s dsc_tp_prepare); `model`
     * is left to the trainer, which sums the norm over the stages' tensor
     * groups. NULL: tensor parallelism refused. */
    dsc_status (*prepare_tp)(const dsc_config *cfg, dsc_groups *groups, void *ctx, dsc_trainer_layers *out);
    void *tp_ctx;
    /* The optimizer from filled options (groups, pipe, counts_in_norm), e.g.
     * zero/'s dsc_zero_make_optimizer. NULL: the plain one (ZeRO refused). */
    dsc_optimizer_maker make_optimizer;
} dsc_pipe_trainer_hooks;

typedef struct dsc_pipe_trainer_options {
    const dsc_config *cfg; /* batch sizes resolved for world / pipeline.stages data-parallel ranks */
    dsc_comm *world;
    bool log;                 /* this rank prints the step lines */
    const char *metrics_path; /* see dsc_engine_options */
    bool progress;
    dsc_pipe_trainer_hooks hooks;
} dsc_pipe_trainer_options;

/* Groups (pipe x data, expert groups when moe.ep_size > 1), module, this
 * rank's stage, tied groups, optimizer, runner, data loader and engine.
 * Collective over `world`. A world size not divisible by pipeline.stages is
 * DSC_ERR_CONFIG naming both. */
DSC_API dsc_status dsc_pipe_trainer_create(const dsc_pipe_trainer_options *opts, dsc_pipe_trainer **out);
DSC_API void dsc_pipe_trainer_destroy(dsc_pipe_trainer *t);
DSC_API dsc_engine *dsc_pipe_trainer_engine(dsc_pipe_trainer *t);
DSC_API dsc_batch_runner *dsc_pipe_trainer_runner(dsc_pipe_trainer *t);
DSC_API dsc_param_store *dsc_pipe_trainer_params(dsc_pipe_trainer *t);
DSC_API const dsc_pipe_module *dsc_pipe_trainer_module(const dsc_pipe_trainer *t);
DSC_API dsc_groups *dsc_pipe_trainer_groups(dsc_pipe_trainer *t);
DSC_API dsc_optimizer *dsc_pipe_trainer_optimizer(dsc_pipe_trainer *t);
DSC_API dsc_rng *dsc_pipe_trainer_rng(dsc_pipe_trainer *t); /* the stream stochastic layers draw from */
DSC_API int dsc_pipe_trainer_stage_id(const dsc_pipe_trainer *t);
/* This rank's layers (all chunks of its stage), forward order. */
DSC_API dsc_layer *const *dsc_pipe_trainer_layers(dsc_pipe_trainer *t, int *count);

#ifdef __cplusplus
}
#endif
#endif
