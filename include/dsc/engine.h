/* dsc/engine.h — the training loop and the batch-runner plug-in point.
 *
 * The engine owns the loop over steps: it hands each global batch's data to
 * a batch runner, then finishes the batch with the optimizer, in this order
 * (docs/training.md, "One step"):
 *   1. runner->train_batch(data of step s, M micro-batches)  forward/backward,
 *      layer hooks, grads_ready; a pipeline runner also sends/receives and
 *      reduces tied gradients here
 *   2. the loss is averaged over the ranks that computed it (dp, and the
 *      pipeline's stages when a pipe group is given); a NaN / Inf loss stops
 *      every rank with DSC_ERR_NUMERIC naming the step
 *   3. optimizer reduce_grads, then optimizer step at the scheduled LR
 *   4. metrics (log every steps_per_print, JSONL line, progress bar),
 *      evaluation every train.eval_interval steps, then the on_step_end hook
 *      (where checkpointing plugs in).
 * The runner never calls reduce_grads or step; the engine calls each once per
 * batch. Steps are numbered from 1 in logs, metrics and errors; the data and
 * LR of step n are those of index n - 1.
 *
 * Not here: building models or optimizers (the app wires them), saving state
 * (the checkpoint subsystem, through on_step_end and dsc_engine_set_step). */
#ifndef DSC_ENGINE_H
#define DSC_ENGINE_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/config.h"
#include "dsc/data.h"
#include "dsc/model.h"
#include "dsc/nn.h"
#include "dsc/optimizer.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- learning-rate schedule ------------------------------------------------------
 * DeepSpeed's schedulers (constant, WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)
 * evaluated at 0-based `iteration` (DeepSpeed's last_batch_iteration); the
 * engine uses iteration n - 1 for step n. `base_lr` is optimizer.params.lr
 * (constant and WarmupCosineLR scale it; the Warmup{,Decay}LR schedules use
 * warmup_min_lr / warmup_max_lr, OneCycle and LRRangeTest their own bounds). */
DSC_API double dsc_lr_schedule_at(const dsc_config_scheduler *sched, double base_lr, int64_t iteration);
/* OneCycle with cycle_momentum sets the optimizer's betas at each step, as
 * DeepSpeed does: (momentum, 0.99). False (betas untouched) for the others. */
DSC_API bool dsc_lr_schedule_betas(const dsc_config_scheduler *sched, int64_t iteration, double *beta1,
                                   double *beta2);

/* ---- the data a runner consumes ----------------------------------------------------- */

/* An iterator over the micro-batches of one global batch on this rank. */
typedef struct dsc_batch_source dsc_batch_source;
struct dsc_batch_source {
    /* Fills the next micro-batch: tokens and targets (B, T) i32. Called once
     * per micro-batch, in micro-batch order, by whichever stage needs data. */
    dsc_status (*next)(dsc_batch_source *src, dsc_tensor *tokens, dsc_tensor *targets);
    int micro_batches; /* M: how many micro-batches the batch has */
    int consumed;      /* how many `next` has filled so far */
};

/* A source over the loader's split at (step index, M): micro-batch m is
 * dsc_data_loader_fill(loader, split, step, m). */
typedef struct dsc_loader_source {
    dsc_batch_source base;
    dsc_data_loader *loader;
    dsc_data_split split;
    int64_t step;
} dsc_loader_source;

DSC_API void dsc_loader_source_init(dsc_loader_source *src, dsc_data_loader *loader, dsc_data_split split,
                                    int64_t step, int micro_batches);

/* ---- where a step's time goes ----------------------------------------------------------
 * Every step measures this rank's wall time per phase (a few clock reads per
 * layer call, always on); `wall_clock_breakdown` prints them, and monitors
 * read them from dsc_step_metrics. Gradient reduction that an optimizer
 * starts inside backward (its layer hooks) counts as backward; the reduce
 * phase is the engine's reduce_grads call plus a pipeline's tied-gradient
 * reduction. */
typedef enum dsc_phase {
    DSC_PHASE_FORWARD = 0,
    DSC_PHASE_BACKWARD,
    DSC_PHASE_P2P, /* pipeline sends and receives of activations and gradients */
    DSC_PHASE_REDUCE,
    DSC_PHASE_OPTIMIZER,
    DSC_PHASE_COUNT
} dsc_phase;

DSC_API const char *dsc_phase_name(dsc_phase phase); /* "forward", "backward", "p2p", "reduce", "optimizer" */
/* Monotonic seconds, the clock every phase time is read from. */
DSC_API double dsc_time_now(void);

/* ---- batch runners ------------------------------------------------------------------- */

typedef struct dsc_batch_result {
    bool has_loss;   /* this rank computed the loss (it holds the loss layer) */
    double loss;     /* mean loss over this rank's micro-batches (when has_loss) */
    double aux_loss; /* mean auxiliary loss (MoE), already weighted */
    int64_t tokens;  /* tokens this rank fed to the model in this batch (first stage; 0 elsewhere) */
    double phase_s[DSC_PHASE_COUNT]; /* seconds per phase in train_batch (forward, backward, p2p, tied reduce) */
} dsc_batch_result;

typedef struct dsc_batch_runner dsc_batch_runner;

typedef struct dsc_batch_runner_ops {
    const char *name; /* "default", "pipeline" */
    /* Forward and backward over the source's micro-batches, accumulating
     * gradients with loss_scale 1/M; calls the optimizer's layer hooks and,
     * during the last micro-batch's backward, grads_ready for each layer. */
    dsc_status (*train_batch)(dsc_batch_runner *r, dsc_batch_source *data, dsc_batch_result *res);
    /* Forward only (ctx.training = false) over the source's micro-batches. */
    dsc_status (*eval_batch)(dsc_batch_runner *r, dsc_batch_source *data, dsc_batch_result *res);
    void (*destroy)(dsc_batch_runner *r);
} dsc_batch_runner_ops;

/* Implementations embed this as their first member. */
struct dsc_batch_runner {
    const dsc_batch_runner_ops *ops;
};

/* The default runner: every layer of the model on this rank, one activation
 * slot, micro-batches of (B, T) run one after the other (gradient
 * accumulation). Reserves the layers' activations for (B, T). `rng` (may be
 * NULL) is handed to stochastic layers. The layer array is copied; the
 * layers stay the caller's. */
DSC_API dsc_status dsc_runner_create_default(dsc_layer *const *layers, int n_layers, dsc_optimizer *opt, int64_t B,
                                             int64_t T, dsc_rng *rng, dsc_batch_runner **out);
DSC_API void dsc_batch_runner_destroy(dsc_batch_runner *r);

/* ---- the engine ------------------------------------------------------------------------ */

/* What one step reports (metrics line, log line, hooks). */
typedef struct dsc_step_metrics {
    int64_t step; /* 1-based */
    double loss;  /* mean over micro-batches and data-parallel ranks */
    double aux_loss;
    double lr;
    double grad_norm;
    double tokens_per_s;             /* global tokens of this step / its wall time */
    double elapsed_s;                /* since dsc_engine_train started */
    int64_t epoch;                   /* of the train split, at this step's data */
    double step_s;                   /* this step's wall time on this rank */
    double phase_s[DSC_PHASE_COUNT]; /* of which, per phase (the rest: data, loss averaging) */
    double loss_scale;               /* fp16 / bf16: the gradients' scale this step; 0 in f32 training */
    bool skipped;                    /* fp16 / bf16: overflow, the step updated nothing */
} dsc_step_metrics;

typedef struct dsc_engine dsc_engine;

/* Called after every step (after evaluation, when one ran); an error stops
 * training and is returned by dsc_engine_train. */
typedef dsc_status (*dsc_engine_hook)(dsc_engine *e, const dsc_step_metrics *m, void *ctx);

typedef struct dsc_engine_options {
    const dsc_config *cfg; /* train.steps, steps_per_print, scheduler, optimizer.params.lr, eval_* */
    dsc_batch_runner *runner;
    dsc_optimizer *optimizer;
    dsc_data_loader *data;          /* this rank's loader (layout M, B, T, dp rank/size) */
    int micro_batches;              /* M per rank */
    int64_t global_tokens_per_step; /* train_batch_size * seq_len, for tokens/s */
    dsc_comm *dp;                   /* loss averaging; NULL: one rank */
    dsc_comm *pipe;                 /* stages of one model replica; NULL: one stage */
    bool log;                       /* this rank prints (usually world rank 0) */
    const char *metrics_path;       /* JSON lines written when `log`; NULL: none */
    bool progress;                  /* draw a progress bar on stdout when it is a terminal and `log` */
    dsc_engine_hook on_step_end;
    void *hook_ctx;
} dsc_engine_options;

/* Zeroes `eo` and fills in what every trainer derives from its config the
 * same way: the pieces, micro_batches (gradient_accumulation_steps) and
 * global_tokens_per_step (train_batch_size * seq_len). The caller adds the
 * groups, the logging switches and the hook. */
DSC_API void dsc_engine_options_init(dsc_engine_options *eo, const dsc_config *cfg, dsc_batch_runner *runner,
                                     dsc_optimizer *optimizer, dsc_data_loader *data, int64_t seq_len);
DSC_API dsc_status dsc_engine_create(const dsc_engine_options *opts, dsc_engine **out);
DSC_API void dsc_engine_destroy(dsc_engine *e);

/* Runs steps until train.steps have been taken in total. */
DSC_API dsc_status dsc_engine_train(dsc_engine *e);
/* Mean loss over train.eval_iters batches of the val split (every rank gets it). */
DSC_API dsc_status dsc_engine_evaluate(dsc_engine *e, double *val_loss);
/* Runs one step; `m` (may be NULL) receives its metrics. */
DSC_API dsc_status dsc_engine_step(dsc_engine *e, dsc_step_metrics *m);

/* Steps taken so far; setting it (on restore) moves the data position and
 * the LR schedule, which depend on nothing else. */
DSC_API int64_t dsc_engine_steps_done(const dsc_engine *e);
DSC_API void dsc_engine_set_steps_done(dsc_engine *e, int64_t steps);
/* Replaces the step-end hook (for wiring done after creation, e.g. by a
 * checkpointer attached to a trainer's engine). */
DSC_API void dsc_engine_set_hook(dsc_engine *e, dsc_engine_hook hook, void *ctx);
/* From a step-end hook: dsc_engine_train returns (NULL) after this step
 * instead of running the remaining ones (a preempted job that saved). */
DSC_API void dsc_engine_request_stop(dsc_engine *e);

/* Reads a metrics JSONL file and writes an SVG of train loss (and val loss
 * when present) against step. */
DSC_API dsc_status dsc_metrics_plot_svg(const char *metrics_path, const char *svg_path);

/* ---- a data-parallel trainer built from a config ------------------------------------------
 * The wiring dsc-train, the benchmarks and the tests share: parameter store,
 * the model's layers (dsc_model_specs + dsc_layer_build), the plain optimizer,
 * the default runner, the data loader and the engine, for a job whose only
 * parallelism is data parallelism over `dp` (and expert parallelism when the
 * caller supplies MoE's layers through dsc_trainer_create_with_layers).
 * Pipelines wire their own pieces into dsc_engine_create; asking this builder
 * for them is DSC_ERR_UNSUPPORTED naming the key. A sharded optimizer
 * (zero_optimization.stage > 0) comes from the maker given to
 * dsc_trainer_create_with_optimizer (zero/'s dsc_zero_make_optimizer), so the
 * runtime need not know zero/. */
typedef struct dsc_trainer dsc_trainer;

/* Builds the optimizer for a config from the trainer's parameters, layers
 * and groups. */
typedef dsc_status (*dsc_optimizer_maker)(const dsc_optimizer_options *opts, const dsc_config *cfg,
                                          dsc_optimizer **out);

typedef struct dsc_trainer_options {
    const dsc_config *cfg;    /* batch sizes resolved for dp's size */
    dsc_comm *dp;             /* NULL: one rank */
    bool log;                 /* this rank prints the step lines */
    const char *metrics_path; /* see dsc_engine_options */
    bool progress;
} dsc_trainer_options;

/* The model section of a config as the model configuration the trainer
 * builds (estimators use it without building anything). */
DSC_API dsc_status dsc_trainer_model_config(const dsc_config *cfg, dsc_model_config *mc);
DSC_API dsc_status dsc_trainer_create(const dsc_trainer_options *opts, dsc_trainer **out);
/* As dsc_trainer_create, with the optimizer from `make_optimizer` (NULL: the
 * plain optimizer, and zero stages are refused). */
DSC_API dsc_status dsc_trainer_create_with_optimizer(const dsc_trainer_options *opts,
                                                     dsc_optimizer_maker make_optimizer, dsc_trainer **out);

/* What a folder above the runtime adds to the trainer's model, so that the
 * runtime need not know it: the dsc_build_ctx.extra every layer factory sees
 * (moe/'s dsc_moe_build_extra) and the groups of DSC_PARAM_EXPERT
 * parameters, handed to the optimizer. The caller registers its layer types
 * (dsc_moe_register_layers) before creating the trainer. */
typedef struct dsc_trainer_layers {
    const void *build_extra;
    dsc_comm *expert_dp; /* expert-data-parallel group; NULL: no reduction */
    dsc_comm *ep;        /* expert-parallel group; the gradient norm sums over it; may be NULL */
    /* Tensor parallelism (tp/), zero without it: the build context's `tp`
     * and `attention` (dsc/model.h), the group the gradient norm also sums
     * over (the tensor group), and which parameters count in this rank's part
     * of the norm (replicated ones on one rank of the group only). */
    const void *tp;
    dsc_layer_factory attention;
    dsc_comm *model;
    bool (*counts_in_norm)(const dsc_param *param, void *ctx);
    void *counts_in_norm_ctx;
} dsc_trainer_layers;

/* As dsc_trainer_create_with_optimizer for a model with layers from above
 * the runtime; `layers` NULL builds dense models only (a config with
 * moe.num_experts > 0 then is DSC_ERR_UNSUPPORTED). */
DSC_API dsc_status dsc_trainer_create_with_layers(const dsc_trainer_options *opts,
                                                  dsc_optimizer_maker make_optimizer,
                                                  const dsc_trainer_layers *layers, dsc_trainer **out);
DSC_API void dsc_trainer_destroy(dsc_trainer *t);
DSC_API dsc_engine *dsc_trainer_engine(dsc_trainer *t);
DSC_API dsc_param_store *dsc_trainer_params(dsc_trainer *t);
DSC_API dsc_optimizer *dsc_trainer_optimizer(dsc_trainer *t);
DSC_API int64_t dsc_trainer_param_count(const dsc_trainer *t); /* parameter elements this rank holds, each once */
/* Parameter elements of the whole model: with expert parallelism, every
 * expert of the group (this rank holds 1/ep of them); with tensor
 * parallelism, every piece's whole tensor. */
DSC_API int64_t dsc_trainer_model_param_count(const dsc_trainer *t);
/* The stream stochastic layers draw from (part of the state a resume restores). */
DSC_API dsc_rng *dsc_trainer_rng(dsc_trainer *t);
/* The model's layers on this rank, forward order. */
DSC_API dsc_layer *const *dsc_trainer_model_layers(dsc_trainer *t, int *count);

/* Continues `prompt` (n_prompt >= 1 ids) by n_new tokens, recomputing the
 * whole (cropped to seq_len) context for every token: greedy when
 * temperature <= 0, else sampling from softmax(logits / temperature) with a
 * stream seeded by `seed`. out receives n_prompt + n_new ids. */
DSC_API dsc_status dsc_trainer_generate(dsc_trainer *t, const int32_t *prompt, int n_prompt, int n_new,
                                        float temperature, uint64_t seed, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
