/* dsc/optimizer.h — the optimizer plug-in point: reduce gradients, step,
 * expose state for checkpoints.
 *
 * An optimizer is an ops table plus its state. The runtime's plain
 * data-parallel optimizer (runtime/optim) keeps full replicas of parameters,
 * gradients and state and all-reduces gradients in buckets; zero/ provides
 * sharded ones behind the same table. Callers use the dsc_optimizer_* wrappers,
 * which skip the optional hooks an implementation leaves NULL.
 *
 * Who calls what (one rule for every runner): the batch runner calls the
 * layer hooks (before_layer / after_layer around every layer call,
 * grads_ready once per layer during the last micro-batch's backward); after
 * runner->train_batch returns, the ENGINE calls reduce_grads and then step,
 * exactly once per global batch. A pipeline executor therefore treats its
 * ReduceGrads / OptimizerStep instructions as the end of the batch and leaves
 * them to the engine; ReduceTiedGrads stays the pipeline's job.
 *
 * Not here: the learning-rate schedule (dsc/engine.h) and which ranks form
 * the groups (dsc/topology.h). */
#ifndef DSC_OPTIMIZER_H
#define DSC_OPTIMIZER_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/config.h"
#include "dsc/nn.h"
#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hyper-parameters of the update, independent of how state is laid out. */
typedef struct dsc_optim_hparams {
    dsc_optimizer_type type;    /* AdamW, SGD, Adam, Lamb, Lion, Muon */
    float beta1, beta2, eps;    /* Adam family, Lion (betas), Muon's Adam group */
    float momentum;             /* SGD, Muon */
    float weight_decay;         /* not applied to DSC_PARAM_NO_DECAY parameters */
    double clip_norm;           /* global gradient-norm clipping; 0 disables */
    bool l2_decay;              /* Adam with adam_w_mode false: weight_decay * p joins the gradient */
    bool no_bias_correction;    /* Adam family with bias_correction false */
    float max_coeff, min_coeff; /* Lamb's trust-ratio clamp */
    /* Muon: each group's lr is the step's lr times its scale — the group's own
     * lr over optimizer.params.lr where the schedule keeps per-group rates (no
     * scheduler, WarmupCosineLR), 1 where it sets one rate for all (the rest) */
    float muon_lr_scale, adam_lr_scale;
    dsc_muon_ns_method ns_method;
} dsc_optim_hparams;

/* State tensors per parameter element: 2 (exp_avg, exp_avg_sq) for the Adam
 * family and Lamb, 1 for SGD (momentum_buffer) and Lion (exp_avg). */
DSC_API int dsc_optim_state_kinds(dsc_optimizer_type type);
/* The state tensors one parameter needs: dsc_optim_state_kinds, except that
 * Muon keeps only the momentum (kind 0) of the matrices it orthogonalises
 * and both Adam moments of the rest. */
DSC_API int dsc_optim_param_state_kinds(dsc_optimizer_type type, const dsc_param *param);
/* The checkpoint name of state tensor `kind` ("exp_avg", "exp_avg_sq", "momentum_buffer"). */
DSC_API const char *dsc_optim_state_name(dsc_optimizer_type type, int kind);

/* The config's optimizer section and gradient_clipping as hparams. */
DSC_API void dsc_optim_hparams_from_config(const dsc_config *cfg, dsc_optim_hparams *hp);

/* What one step did. */
typedef struct dsc_optim_stats {
    double grad_norm; /* global L2 norm of the (reduced) gradients before clipping */
    double clip_coef; /* factor the gradients were scaled by (1 when not clipped) */
    int64_t step;     /* optimizer steps taken so far, this one included */
} dsc_optim_stats;

/* One state tensor, for checkpoints. `local` is a view of live state: a
 * checkpoint reads it to save and writes it to restore. For per-parameter
 * state, `param` is the parameter and `offset` the element offset of `local`
 * inside the parameter's flattened global value (0 and the full size for
 * replicated state; a shard for ZeRO). Scalars (name "step") have param NULL
 * and an i64 tensor of one element. An optimizer that keeps parameter values
 * only as shards (ZeRO-3) also lists those shards, with `is_value` set:
 * checkpoints store them as the parameter itself (model/<param>). */
typedef struct dsc_optim_state {
    char name[DSC_PARAM_NAME_MAX +
              32]; /* "exp_avg/<param>", "exp_avg_sq/<param>", "momentum_buffer/<param>", "step" */
    const dsc_param *param;
    int64_t offset;
    dsc_tensor local;
    bool is_value; /* a piece of the parameter's value, not optimizer state */
} dsc_optim_state;

typedef struct dsc_optimizer dsc_optimizer;

typedef struct dsc_optimizer_ops {
    const char *name; /* "plain", "zero1", ... */
    /* Optional (NULL when not needed): around each layer call of forward
     * (backward = false) and backward (backward = true). ZeRO-3 gathers the
     * layer's parameters before and releases them after. */
    dsc_status (*before_layer)(dsc_optimizer *opt, dsc_layer *layer, bool backward);
    dsc_status (*after_layer)(dsc_optimizer *opt, dsc_layer *layer, bool backward);
    /* Optional: the layer's gradients for the whole batch are final (called
     * during the last micro-batch's backward, in backward order). A parameter
     * shared by several layers is final after its last layer reports. */
    dsc_status (*grads_ready)(dsc_optimizer *opt, dsc_layer *layer);
    /* Averages gradients over the data-parallel group (dense parameters) and
     * the expert-data-parallel group (DSC_PARAM_EXPERT), finishing whatever
     * grads_ready started. */
    dsc_status (*reduce_grads)(dsc_optimizer *opt);
    /* Global gradient norm (over every parameter of the model, each tied
     * parameter once), clipping, the update at learning rate `lr`, zeroing the
     * gradients, and the step count. A NaN / Inf norm is DSC_ERR_NUMERIC
     * naming the step, and no parameter changes. */
    dsc_status (*step)(dsc_optimizer *opt, double lr, dsc_optim_stats *stats);
    int (*state_count)(const dsc_optimizer *opt);
    void (*state_at)(dsc_optimizer *opt, int index, dsc_optim_state *out);
    void (*destroy)(dsc_optimizer *opt);
    /* Optional: replaces beta1 / beta2 for the following steps (OneCycle's momentum cycling). */
    void (*set_betas)(dsc_optimizer *opt, float beta1, float beta2);
    /* Optional: moves the reductions grads_ready posted (overlap_comm) on
     * without waiting for them; cheap when none is in flight. The runner
     * calls it before every kernel of the last micro-batch's backward
     * (dsc_kernels_set_progress), since MPI progresses them only while
     * they are tested. */
    dsc_status (*progress)(dsc_optimizer *opt);
} dsc_optimizer_ops;

/* Implementations embed this as their first member. */
struct dsc_optimizer {
    const dsc_optimizer_ops *ops;
};

/* The groups and parameters an optimizer works over. */
typedef struct dsc_optimizer_options {
    dsc_param_store *params;
    dsc_layer *const *layers; /* this rank's layers, forward order (for grads_ready bookkeeping) */
    int n_layers;
    dsc_comm *dp;        /* data-parallel group of dense parameters; NULL: no reduction */
    dsc_comm *expert_dp; /* expert-data-parallel group of expert parameters; NULL: no reduction */
    dsc_comm *ep;        /* expert-parallel group (holds other experts); the norm sums over it; may be NULL */
    dsc_comm *pipe;      /* ranks holding other parts of the model (pipeline stages); the norm sums over it;
                            may be NULL */
    dsc_comm *tensor;    /* tensor-parallel group: Muon assembles the matrices it cuts over it; may be NULL */
    /* Whether a parameter contributes to this rank's part of the global norm;
     * NULL counts every parameter. The pipeline passes one that counts each
     * tied parameter on one stage only. */
    bool (*counts_in_norm)(const dsc_param *param, void *ctx);
    void *counts_in_norm_ctx;
    dsc_optim_hparams hparams;
    int64_t reduce_bucket_size; /* gradient elements per all-reduce; <= 0: one bucket per group */
    /* zero_optimization.overlap_comm: a bucket's reduction (ZeRO-2/3: a layer's staged reduce-scatters) is
     * posted non-blocking as soon as its gradients are final and waited in reduce_grads (or before its staging
     * buffer is reused), progressing at every hook of backward; false reduces with blocking calls there and
     * then. The results are bitwise the same. */
    bool overlap_comm;
    /* communication_data_type: gradients are rounded to this dtype and reduced in it (DSC_DTYPE_BF16 /
     * DSC_DTYPE_F16: half the bytes); 0 (DSC_DTYPE_F32) reduces in f32. */
    dsc_dtype reduce_dtype;
    /* The dtype the working parameter values are exact in (bf16 / fp16 training: the mixed-precision wrapper
     * rounds them for every forward). ZeRO all-gathers them in it, 2 bytes an element as DeepSpeed gathers its
     * bf16 / fp16 parameters, and the values arrive bitwise as that rounding gives them; 0 (DSC_DTYPE_F32)
     * gathers f32. */
    dsc_dtype gather_dtype;
} dsc_optimizer_options;

/* The plain data-parallel optimizer: replicated state, bucketed all-reduce
 * (a bucket is reduced, or with overlap_comm posted, as soon as grads_ready
 * has seen all of its parameters), averaging by the group size. */
DSC_API dsc_status dsc_optimizer_create_plain(const dsc_optimizer_options *opts, dsc_optimizer **out);

/* ---- wrappers (skip NULL hooks) ---------------------------------------------- */
DSC_API dsc_status dsc_optimizer_before_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward);
DSC_API dsc_status dsc_optimizer_after_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward);
DSC_API dsc_status dsc_optimizer_grads_ready(dsc_optimizer *opt, dsc_layer *layer);
DSC_API dsc_status dsc_optimizer_reduce_grads(dsc_optimizer *opt);
DSC_API dsc_status dsc_optimizer_progress(dsc_optimizer *opt);
/* The optimizer's progress between kernels: from begin to end every kernel call on this thread
 * first runs dsc_optimizer_progress(opt) (dsc_kernels_set_progress), so a backward's buckets move
 * on between the kernels of a layer, not only at grads_ready. The first failure is kept; take,
 * after each layer's backward, returns it (and clears it) named after `layer`, NULL when there
 * is none or `scope` is NULL (a backward that is not the batch's last); end uninstalls the hook
 * and returns `s`, or the kept failure when `s` is NULL. Used by every runner's last backward of
 * a batch. */
typedef struct dsc_optimizer_progress_scope {
    dsc_optimizer *opt;
    dsc_status error;
} dsc_optimizer_progress_scope;
DSC_API void dsc_optimizer_progress_begin(dsc_optimizer_progress_scope *scope, dsc_optimizer *opt);
DSC_API dsc_status dsc_optimizer_progress_take(dsc_optimizer_progress_scope *scope, const char *layer);
DSC_API dsc_status dsc_optimizer_progress_end(dsc_optimizer_progress_scope *scope, dsc_status s);
DSC_API dsc_status dsc_optimizer_step(dsc_optimizer *opt, double lr, dsc_optim_stats *stats);
/* Sets the betas of the following steps where the implementation has them. */
DSC_API void dsc_optimizer_set_betas(dsc_optimizer *opt, float beta1, float beta2);
DSC_API int dsc_optimizer_state_count(const dsc_optimizer *opt);
DSC_API void dsc_optimizer_state_at(dsc_optimizer *opt, int index, dsc_optim_state *out);
DSC_API void dsc_optimizer_destroy(dsc_optimizer *opt);

/* ---- pieces shared by optimizer implementations --------------------------------- */

/* The update of one whole parameter (or, for every type but Lamb, any
 * contiguous piece of one): value, grad and the state tensors (exp_avg and
 * exp_avg_sq for the Adam family and Lamb; momentum_buffer / exp_avg in state0
 * for SGD / Lion, state1 unused) have equal element counts. `decay` selects
 * weight decay; `step` is 1-based. The gradient is scratch afterwards. */
DSC_API dsc_status dsc_optim_update(const dsc_optim_hparams *hp, dsc_tensor *value, dsc_tensor *grad,
                                    dsc_tensor *state0, dsc_tensor *state1, float lr, bool decay, int64_t step);

/* The update of one whole parameter with the rule its type and the
 * parameter call for: Muon orthogonalises the hidden matrices
 * (dsc_optim_uses_muon) and gives the rest Adam; every other type is
 * dsc_optim_update with weight decay unless DSC_PARAM_NO_DECAY. state0 holds
 * Muon's momentum, state0 and state1 its Adam group's moments. */
DSC_API dsc_status dsc_optim_update_param(const dsc_optim_hparams *hp, dsc_param *param, dsc_tensor *state0,
                                          dsc_tensor *state1, float lr, int64_t step);
/* DeepSpeed's rule for Muon: two or more dimensions, not an embedding or the
 * LM head (names holding "embed" or "lm_head", and dsc's "head.weight"). */
DSC_API bool dsc_optim_uses_muon(const dsc_param *param);

/* Muon on a parameter whose elements are spread over ranks. `value`, `grad`
 * and `momentum` are this rank's elements [offset, offset + numel) of the
 * flattened local parameter (numel 0 when it holds none); `shard` (may be
 * NULL) is the group holding the rest of the local parameter (ZeRO), and
 * `tensor` (may be NULL) the tensor-parallel group holding its other slices
 * (param->shard). Every rank of both groups calls it for the same
 * parameters in the same order. `lr` is the step's rate (times
 * hp->muon_lr_scale here); the gradient is scratch afterwards. */
typedef struct dsc_muon_piece {
    dsc_tensor *value, *grad, *momentum;
    int64_t offset;
    dsc_comm *shard;
    dsc_comm *tensor;
    /* With `shard`: the rank of it that orthogonalises, broadcasting the
     * result over it (DeepSpeed's stage 3 assigns matrices round-robin);
     * -1: every rank holding a piece orthogonalises the whole matrix. */
    int owner;
    /* With `shard`: every rank's element count, the pieces lying back to back
     * in rank order (ZeRO's cuts), so the matrix is all-gathered; NULL: each
     * rank's piece is summed into zeros (any layout, twice the bytes). */
    const int64_t *counts;
} dsc_muon_piece;
DSC_API dsc_status dsc_optim_muon_piece(const dsc_optim_hparams *hp, dsc_param *param, const dsc_muon_piece *pc,
                                        float lr);
/* Whether `param` takes Muon and tensor parallelism over `tensor` cuts its
 * matrices (its rows or columns), so that Newton-Schulz needs the group. */
DSC_API bool dsc_optim_muon_needs_tensor_group(const dsc_param *param, const dsc_comm *tensor);
/* Muon's Adam group (MuonWithAuxAdam's adam_update at lr * hp->adam_lr_scale) on any piece of a parameter. */
DSC_API dsc_status dsc_optim_muon_adam(const dsc_optim_hparams *hp, dsc_tensor *value, dsc_tensor *grad,
                                       dsc_tensor *exp_avg, dsc_tensor *exp_avg_sq, float lr, bool decay,
                                       int64_t step);

/* Lamb in two halves, for optimizers whose pieces split a parameter over
 * ranks: the direction of a piece is written over its gradient and the
 * piece's sums of squares of value and direction are ADDED to *w_sq, *u_sq;
 * once those are summed over the parameter's pieces (all ranks), apply
 * updates each piece with the parameter's trust ratio. */
DSC_API dsc_status dsc_optim_lamb_direction(const dsc_optim_hparams *hp, const dsc_tensor *value, dsc_tensor *grad,
                                            dsc_tensor *exp_avg, dsc_tensor *exp_avg_sq, bool decay, double *w_sq,
                                            double *u_sq);
DSC_API dsc_status dsc_optim_lamb_apply(const dsc_optim_hparams *hp, dsc_tensor *value,
                                        const dsc_tensor *direction, float lr, int64_t step, double w_sq,
                                        double u_sq);

/* Clipping coefficient for a global norm: clip / (norm + 1e-6) when clipping is
 * on and norm exceeds clip, else 1 (PyTorch's clip_grad_norm_). */
DSC_API double dsc_optim_clip_coef(double norm, double clip);

/* Completes a global norm from this rank's sums of squares: sums `expert_sq`
 * over `ep`, adds `dense_sq`, sums over `pipe` (either comm may be NULL), and
 * returns the square root. Every rank of the groups gets the same value. */
DSC_API dsc_status dsc_optim_global_norm(double dense_sq, double expert_sq, dsc_comm *ep, dsc_comm *pipe,
                                         double *norm);

#ifdef __cplusplus
}
#endif
#endif
