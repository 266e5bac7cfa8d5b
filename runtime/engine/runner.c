/* The default batch runner: every layer on this rank, micro-batches run one
 * after the other through one activation slot (gradient accumulation), each
 * micro-batch's loss scaled by 1/M so the accumulated gradient is that of the
 * batch's mean loss. During the last micro-batch's backward it reports each
 * layer's gradients final (grads_ready), which lets the optimizer start
 * reducing while earlier layers still run backward, and before every kernel
 * of that backward it lets the optimizer move the reductions in flight on
 * (dsc_optimizer_progress_begin).
 *
 * Also the loader-backed batch source every runner consumes.
 *
 * Not here: reducing gradients or stepping (the engine does, after
 * train_batch returns), pipelines (pipe/ brings its own runner). */
#include <stdlib.h>
#include <string.h>

#include "dsc/engine.h"
#include "dsc/precision.h"

static dsc_status loader_next(dsc_batch_source *base, dsc_tensor *tokens, dsc_tensor *targets) {
    dsc_loader_source *src = (dsc_loader_source *)base;
    DSC_CHECK(base->consumed < base->micro_batches, DSC_ERR_INVALID,
              "batch source: micro-batch %d requested but the batch has %d", base->consumed + 1,
              base->micro_batches);
    DSC_TRY(dsc_data_loader_fill(src->loader, src->split, src->step, base->consumed, tokens, targets));
    base->consumed++;
    return NULL;
}

void dsc_loader_source_init(dsc_loader_source *src, dsc_data_loader *loader, dsc_data_split split, int64_t step,
                            int micro_batches) {
    *src = (dsc_loader_source){{loader_next, micro_batches, 0}, loader, split, step};
}

typedef struct default_runner {
    dsc_batch_runner base;
    dsc_layer **layers; /* [n] forward order */
    int n;
    dsc_optimizer *opt;
    dsc_rng *rng;
    dsc_tensor tokens;  /* (B, T) i32 */
    dsc_tensor targets; /* (B, T) i32 */
} default_runner;

static dsc_status forward_all(default_runner *r, dsc_micro_ctx *ctx) {
    dsc_tensor x = {0}, y;
    for (int l = 0; l < r->n; l++) {
        DSC_TRY(dsc_optimizer_before_layer(r->opt, r->layers[l], false));
        DSC_TRY(dsc_layer_forward(r->layers[l], 0, &x, &y, ctx));
        DSC_TRY(dsc_optimizer_after_layer(r->opt, r->layers[l], false));
        /* mixed precision: stored in bf16 / fp16 between layers (not the loss layer's per-token losses) */
        if (l < r->n - 1) dsc_precision_store_between(r->opt, &y);
        x = y;
    }
    return NULL;
}

/* Every layer's backward; in the last micro-batch (`progress` set) grads_ready runs after each
 * layer, the reductions it posts move on between kernels, and a failure of theirs is reported
 * after its layer. */
static dsc_status backward_layers(default_runner *r, dsc_micro_ctx *ctx, dsc_optimizer_progress_scope *progress) {
    dsc_tensor dy = {0}, dx;
    for (int l = r->n - 1; l >= 0; l--) {
        DSC_TRY(dsc_optimizer_before_layer(r->opt, r->layers[l], true));
        DSC_TRY(dsc_layer_backward(r->layers[l], 0, &dy, &dx, ctx));
        DSC_TRY(dsc_optimizer_after_layer(r->opt, r->layers[l], true));
        DSC_TRY(dsc_optimizer_progress_take(progress, r->layers[l]->name));
        if (progress) DSC_TRY(dsc_optimizer_grads_ready(r->opt, r->layers[l]));
        if (l > 0) dsc_precision_store_between(r->opt, &dx);
        dy = dx;
    }
    return NULL;
}

static dsc_status backward_all(default_runner *r, dsc_micro_ctx *ctx, bool last_micro) {
    if (!last_micro) return backward_layers(r, ctx, NULL);
    dsc_optimizer_progress_scope progress;
    dsc_optimizer_progress_begin(&progress, r->opt);
    return dsc_optimizer_progress_end(&progress, backward_layers(r, ctx, &progress));
}

static dsc_status run(default_runner *r, dsc_batch_source *data, dsc_batch_result *res, bool training) {
    int M = data->micro_batches;
    DSC_CHECK(M >= 1, DSC_ERR_INVALID, "default runner: a batch needs at least one micro-batch, got %d", M);
    double loss = 0, aux = 0, fwd = 0, bwd = 0;
    for (int m = 0; m < M; m++) {
        DSC_TRY(data->next(data, &r->tokens, &r->targets));
        dsc_micro_ctx ctx = {
            .tokens = &r->tokens,
            .targets = &r->targets,
            .loss_scale = dsc_precision_micro_loss_scale(r->opt, M),
            .training = training,
            .rng = r->rng,
        };
        double t0 = dsc_time_now();
        dsc_status s = forward_all(r, &ctx);
        double t1 = dsc_time_now();
        if (!s && training) s = backward_all(r, &ctx, m == M - 1);
        fwd += t1 - t0;
        bwd += training ? dsc_time_now() - t1 : 0;
        if (s) return dsc_error_wrap(s, "micro-batch %d of %d", m + 1, M);
        loss += ctx.loss;
        aux += ctx.aux_loss;
    }
    *res = (dsc_batch_result){
        .has_loss = true,
        .loss = loss / M,
        .aux_loss = aux / M,
        .tokens = (int64_t)M * dsc_tensor_numel(&r->tokens),
        .phase_s = {[DSC_PHASE_FORWARD] = fwd, [DSC_PHASE_BACKWARD] = bwd},
    };
    return NULL;
}

static dsc_status default_train(dsc_batch_runner *base, dsc_batch_source *data, dsc_batch_result *res) {
    return run((default_runner *)base, data, res, true);
}

static dsc_status default_eval(dsc_batch_runner *base, dsc_batch_source *data, dsc_batch_result *res) {
    return run((default_runner *)base, data, res, false);
}

static void default_destroy(dsc_batch_runner *base) {
    default_runner *r = (default_runner *)base;
    dsc_tensor_free(&r->tokens);
    dsc_tensor_free(&r->targets);
    free(r->layers);
    free(r);
}

static const dsc_batch_runner_ops default_ops = {
    .name = "default",
    .train_batch = default_train,
    .eval_batch = default_eval,
    .destroy = default_destroy,
};

dsc_status dsc_runner_create_default(dsc_layer *const *layers, int n_layers, dsc_optimizer *opt, int64_t B,
                                     int64_t T, dsc_rng *rng, dsc_batch_runner **out) {
    *out = NULL;
    DSC_CHECK(n_layers >= 1 && B >= 1 && T >= 1, DSC_ERR_INVALID,
              "default runner: needs layers and B, T >= 1 (got %d layers, B=%lld, T=%lld)", n_layers, (long long)B,
              (long long)T);
    default_runner *r = calloc(1, sizeof *r);
    DSC_CHECK(r, DSC_ERR_NOMEM, "default runner: out of memory");
    r->base.ops = &default_ops;
    r->opt = opt;
    r->rng = rng;
    r->n = n_layers;
    r->layers = malloc((size_t)n_layers * sizeof *r->layers);
    dsc_status s = r->layers ? NULL : dsc_error(DSC_ERR_NOMEM, "default runner: %d layers", n_layers);
    if (!s) memcpy(r->layers, layers, (size_t)n_layers * sizeof *r->layers);
    const int64_t shape[2] = {B, T};
    if (!s) s = dsc_tensor_alloc(&r->tokens, DSC_DTYPE_I32, 2, shape, DSC_CPU, DSC_MEM_ACTIVATIONS);
    if (!s) s = dsc_tensor_alloc(&r->targets, DSC_DTYPE_I32, 2, shape, DSC_CPU, DSC_MEM_ACTIVATIONS);
    for (int l = 0; l < n_layers && !s; l++) {
        dsc_layer_set_saved_dtype(layers[l], dsc_precision_dtype(opt)); /* mixed precision: 2-byte operands */
        s = dsc_layer_reserve(layers[l], 1, B, T);
    }
    if (s) {
        default_destroy(&r->base);
        return s;
    }
    *out = &r->base;
    return NULL;
}

void dsc_batch_runner_destroy(dsc_batch_runner *r) {
    if (r) r->ops->destroy(r);
}
