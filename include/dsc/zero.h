/* dsc/zero.h — ZeRO: sharded optimizers behind the optimizer interface
 * (dsc/optimizer.h), their partitioning rule, and the memory formulas.
 *
 * Each parameter group's flat fp32 buffer (dsc/nn.h: dense over the
 * data-parallel group, experts over the expert-data-parallel group, as
 * DeepSpeed does) is cut into one contiguous range per rank of the group, at
 * multiples of 64 elements (the store's alignment), the first ranks taking one
 * extra chunk when the chunks do not divide evenly; stage 3 instead cuts every
 * parameter into one piece per rank. A rank keeps
 *   stage 1: optimizer state for its range (gradients reduce-scattered, the
 *            updated range all-gathered into every replica);
 *   stage 2: + gradients only for its range: each layer's backward writes into
 *            a bounded staging buffer that is reduce-scattered into the range
 *            when the layer finishes (after_layer), every micro-batch (with
 *            overlap_comm two buffers alternate and the reductions stay in
 *            flight during the next layer's backward);
 *   stage 3: + parameters only for its range: a layer's parameters are
 *            all-gathered into a bounded pool before each of its calls and
 *            released after, with the next layer prefetched when it fits;
 *            parameters of at most stage3_param_persistence_threshold
 *            elements stay whole on every rank instead (DeepSpeed's
 *            persistent parameters: their gradients and optimizer state are
 *            still partitioned, and the updated pieces are all-gathered once
 *            per step rather than before every call).
 * With pipeline parallelism (pipeline_stages > 1) stages 1 and 2 reduce once
 * per step in reduce_grads, after the pipeline's tied-gradient reduction,
 * from gradients accumulated over the step's micro-batches; stage 3 is
 * refused (dsc_zero_check_pipeline says why).
 *
 * Not here: the update rule (dsc_optim_update), checkpoint files (the
 * optimizer reports its shards through state_at), who forms the groups
 * (dsc/topology.h). */
#ifndef DSC_ZERO_H
#define DSC_ZERO_H

#include "dsc/api.h"
#include <stdint.h>
#include <stdio.h>

#include "dsc/config.h"
#include "dsc/optimizer.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ZeRO part of the configuration (DeepSpeed's zero_optimization keys; the
 * bucket sizes of dsc_optimizer_options.reduce_bucket_size apply too). */
typedef struct dsc_zero_options {
    int stage;                                  /* 1, 2 or 3 (0 is the plain optimizer) */
    int pipeline_stages;                        /* pipeline.stages; > 1 defers reduction to reduce_grads */
    int64_t allgather_bucket_size;              /* parameter elements per all-gather (stages 1, 2); <= 0: one */
    int64_t stage3_max_live_parameters;         /* gathered elements resident at once (at least one layer's) */
    int64_t stage3_prefetch_bucket_size;        /* largest next layer gathered ahead; 0 disables prefetch */
    int64_t stage3_param_persistence_threshold; /* stage 3: numel <= this stays whole on every rank; 0: none */
} dsc_zero_options;

/* The zero_optimization section and pipeline.stages as options. */
DSC_API void dsc_zero_options_from_config(const dsc_config *cfg, dsc_zero_options *zo);

/* Whether ZeRO `stage` may run with `pipeline_stages` stages: stages 0-2 may;
 * stage 3 with more than one stage is DSC_ERR_UNSUPPORTED naming both values
 * and the reason. The pipeline calls this before building its optimizer. */
DSC_API dsc_status dsc_zero_check_pipeline(int stage, int pipeline_stages);

/* A sharded optimizer. For stages 2 and 3 it releases the store's full
 * gradient buffers (and for stage 3 value buffers): parameters' grad (and
 * value) data are then valid only between before_layer and after_layer of a
 * layer that reads them. Stage 0 gives the plain optimizer. */
DSC_API dsc_status dsc_zero_create(const dsc_optimizer_options *opts, const dsc_zero_options *zo,
                                   dsc_optimizer **out);

/* The trainer's optimizer maker (dsc/engine.h, dsc_trainer_options): the
 * config's zero_optimization stage (0: plain) over the given groups. */
DSC_API dsc_status dsc_zero_make_optimizer(const dsc_optimizer_options *opts, const dsc_config *cfg,
                                           dsc_optimizer **out);

/* The partitioning rule of stages 1 and 2: element range [*begin, *end) of a
 * flat buffer of `numel` elements (a multiple of 64) owned by `rank` of
 * `ranks`. */
DSC_API void dsc_zero_partition(int64_t numel, int ranks, int rank, int64_t *begin, int64_t *end);
/* Stage 3's rule, as DeepSpeed's: every parameter of `numel` elements is cut
 * into ceil(numel / ranks)-element pieces, rank r holding [*begin, *end), so
 * a layer's gathers and reductions are balanced over the ranks. */
DSC_API void dsc_zero_param_piece(int64_t numel, int ranks, int rank, int64_t *begin, int64_t *end);

/* ---- memory ---------------------------------------------------------------------- */

/* Bytes of model states per rank (fp32 training with Adam: 4 bytes of
 * parameter, 4 of gradient, 8 of moments per element), the ZeRO paper's
 * formula for `stage` over `dp` ranks:
 *   0: 4Ψ + 4Ψ + 8Ψ   1: 4Ψ + 4Ψ + 8Ψ/N   2: 4Ψ + (4Ψ + 8Ψ)/N   3: (4Ψ + 4Ψ + 8Ψ)/N.
 * `state_bytes` is 8 for AdamW, 4 for SGD with momentum. */
typedef struct dsc_zero_memory {
    double params, grads, optim; /* bytes */
} dsc_zero_memory;

/* `state_bytes` (here and in the estimator below) is the optimizer state's
 * bytes per element; with DSC_ZERO_MIXED_PRECISION or'ed in, the model
 * states are DeepSpeed's mixed-precision ones: 2-byte parameters and
 * gradients, and a 4-byte fp32 master counted with the optimizer state
 * (2 + 2 + 12 bytes for Adam). */
#define DSC_ZERO_MIXED_PRECISION 0x10000
DSC_API void dsc_zero_memory_formula(int stage, double psi, int dp, int state_bytes, dsc_zero_memory *out);

/* A model's size for the estimator: parameters in total and in the largest
 * layer (stage 3's gathered working set), expert parameters among them. */
typedef struct dsc_zero_model_size {
    double params;        /* Ψ, every parameter once */
    double expert_params; /* of those, in expert layers (sharded over expert-data-parallel ranks) */
    double largest_layer; /* elements of the largest layer */
} dsc_zero_model_size;

/* The parameter count of a model configuration, without building it. */
DSC_API dsc_status dsc_zero_model_size_of(const dsc_model_config *mc, dsc_zero_model_size *out);
/* The same with `build_extra` as the layers' dsc_build_ctx.extra: moe/'s
 * dsc_moe_build_extra for MoE models (no expert-parallel group: every
 * expert counted once), whose layer types the caller registered. */
DSC_API dsc_status dsc_zero_model_size_of_extra(const dsc_model_config *mc, const void *build_extra,
                                                dsc_zero_model_size *out);

/* Prints, for stages 0-3, per-rank bytes of parameters, gradients, optimizer
 * state and their sum for a model of `size` on `dp` data-parallel ranks
 * (experts over dp / ep ranks), `pp` pipeline stages splitting the model
 * evenly, as DeepSpeed's estimate_zero{2,3}_model_states_mem_needs. */
DSC_API void dsc_zero_estimate_print(FILE *fp, const dsc_zero_model_size *size, int dp, int pp, int ep,
                                     int state_bytes);
/* One row of that table: a rank's bytes at `stage`. */
DSC_API void dsc_zero_estimate_rank(const dsc_zero_model_size *size, int stage, int dp, int pp, int ep,
                                    int state_bytes, dsc_zero_memory *out);

/* Collective over `comm`: gathers every rank's allocator accounting per
 * category (parameters, gradients, optimizer state, activations,
 * communication buffers, total and peak) and rank 0 of `comm` prints one row
 * per rank beside the formula for `stage` over `dp` ranks of that rank's
 * Ψ = psi elements (its share of the model: its pipeline stage's
 * parameters), with the ratio of measured model states to the formula. */
DSC_API dsc_status dsc_zero_memory_report(FILE *fp, dsc_comm *comm, int stage, double psi, int dp,
                                          int state_bytes);

#ifdef __cplusplus
}
#endif
#endif
