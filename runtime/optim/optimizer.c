/* The optimizer interface's wrappers and the pieces every implementation
 * shares: hyper-parameters from the config, the update rules (AdamW, Adam
 * with DeepSpeed's adam_w_mode, Lamb as DeepSpeed's FusedLamb, Lion, SGD;
 * Muon's in muon.c),
 * the clipping coefficient and the global-norm reduction.
 *
 * Not here: any state layout or gradient reduction (plain.c; zero/). */
#include "dsc/optimizer.h"

#include <math.h>
#include <stdint.h>

#include "dsc/kernels.h"

void dsc_optim_hparams_from_config(const dsc_config *cfg, dsc_optim_hparams *hp) {
    const dsc_config_optimizer *o = &cfg->optimizer;
    *hp = (dsc_optim_hparams){
        .type = o->type,
        .beta1 = (float)o->params.betas[0],
        .beta2 = (float)o->params.betas[1],
        .eps = (float)o->params.eps,
        .momentum = (float)o->params.momentum,
        .weight_decay = (float)o->params.weight_decay,
        .clip_norm = cfg->gradient_clipping,
        .l2_decay = o->type == DSC_OPTIMIZER_TYPE_ADAM && !o->params.adam_w_mode,
        .no_bias_correction = !o->params.bias_correction,
        .max_coeff = (float)o->params.max_coeff,
        .min_coeff = (float)o->params.min_coeff,
        .muon_lr_scale = 1.0f,
        .adam_lr_scale = 1.0f,
        .ns_method = o->params.ns_method,
    };
    dsc_lr_schedule sched = cfg->scheduler.type;
    bool per_group = sched == DSC_LR_SCHEDULE_CONSTANT || sched == DSC_LR_SCHEDULE_WARMUP_COSINE_LR;
    if (o->type == DSC_OPTIMIZER_TYPE_MUON && per_group && o->params.lr > 0) {
        hp->muon_lr_scale = (float)(o->params.muon_lr / o->params.lr);
        hp->adam_lr_scale = (float)(o->params.adam_lr / o->params.lr);
    }
}

int dsc_optim_state_kinds(dsc_optimizer_type type) {
    return type == DSC_OPTIMIZER_TYPE_SGD || type == DSC_OPTIMIZER_TYPE_LION ? 1 : 2;
}

int dsc_optim_param_state_kinds(dsc_optimizer_type type, const dsc_param *param) {
    if (type == DSC_OPTIMIZER_TYPE_MUON && dsc_optim_uses_muon(param)) return 1; /* the momentum alone */
    return dsc_optim_state_kinds(type);
}

const char *dsc_optim_state_name(dsc_optimizer_type type, int kind) {
    if (type == DSC_OPTIMIZER_TYPE_SGD) return "momentum_buffer";
    return kind == 0 ? "exp_avg" : "exp_avg_sq";
}

/* Without bias correction the Adam kernel must see 1 - beta^t = 1, which is
 * its value for t large enough that beta^t underflows to 0 in double. */
static int64_t adam_step(const dsc_optim_hparams *hp, int64_t step) {
    return hp->no_bias_correction ? INT64_MAX : step;
}

dsc_status dsc_optim_lamb_direction(const dsc_optim_hparams *hp, const dsc_tensor *value, dsc_tensor *grad,
                                    dsc_tensor *exp_avg, dsc_tensor *exp_avg_sq, bool decay, double *w_sq,
                                    double *u_sq) {
    DSC_TRY(dsc_kernel_lamb_direction(grad, value, grad, exp_avg, exp_avg_sq, hp->beta1, hp->beta2, hp->eps,
                                      decay ? hp->weight_decay : 0.0f));
    double w, u;
    DSC_TRY(dsc_kernel_sum_squares(&w, value));
    DSC_TRY(dsc_kernel_sum_squares(&u, grad));
    *w_sq += w;
    *u_sq += u;
    return NULL;
}

dsc_status dsc_optim_lamb_apply(const dsc_optim_hparams *hp, dsc_tensor *value, const dsc_tensor *direction,
                                float lr, int64_t step, double w_sq, double u_sq) {
    /* FusedLamb: the bias corrections scale the step, not the moments inside the direction */
    double step_size = lr;
    if (!hp->no_bias_correction)
        step_size = lr * sqrt(1.0 - pow(hp->beta2, (double)step)) / (1.0 - pow(hp->beta1, (double)step));
    double trust = 1.0;
    if (w_sq > 0 && u_sq > 0) {
        trust = sqrt(w_sq) / sqrt(u_sq);
        trust = trust > hp->max_coeff ? hp->max_coeff : trust < hp->min_coeff ? hp->min_coeff : trust;
    }
    return dsc_kernel_axpy(value, (float)(-step_size * trust), direction);
}

dsc_status dsc_optim_update(const dsc_optim_hparams *hp, dsc_tensor *value, dsc_tensor *grad, dsc_tensor *state0,
                            dsc_tensor *state1, float lr, bool decay, int64_t step) {
    float wd = decay ? hp->weight_decay : 0.0f;
    switch (hp->type) {
    case DSC_OPTIMIZER_TYPE_SGD:
        return dsc_kernel_sgd(value, grad, state0, lr, hp->momentum, wd, step);
    case DSC_OPTIMIZER_TYPE_LION:
        return dsc_kernel_lion(value, grad, state0, lr, hp->beta1, hp->beta2, wd);
    case DSC_OPTIMIZER_TYPE_LAMB: {
        double w_sq = 0, u_sq = 0;
        DSC_TRY(dsc_optim_lamb_direction(hp, value, grad, state0, state1, decay, &w_sq, &u_sq));
        return dsc_optim_lamb_apply(hp, value, grad, lr, step, w_sq, u_sq);
    }
    case DSC_OPTIMIZER_TYPE_MUON:
        return dsc_error(DSC_ERR_UNSUPPORTED, "Muon updates whole matrices: it needs the parameter "
                                              "(dsc_optim_update_param), not a piece of its flat buffer");
    case DSC_OPTIMIZER_TYPE_ADAM:
    case DSC_OPTIMIZER_TYPE_ADAMW:
        if (hp->l2_decay && wd != 0.0f) { /* torch.optim.Adam's weight_decay: g += wd * p */
            DSC_TRY(dsc_kernel_axpy(grad, wd, value));
            wd = 0.0f;
        }
        return dsc_kernel_adamw(value, grad, state0, state1, lr, hp->beta1, hp->beta2, hp->eps, wd,
                                adam_step(hp, step));
    }
    return dsc_error(DSC_ERR_INTERNAL, "optimizer type %d has no update rule", (int)hp->type);
}

void dsc_optimizer_set_betas(dsc_optimizer *opt, float beta1, float beta2) {
    if (opt->ops->set_betas) opt->ops->set_betas(opt, beta1, beta2);
}

double dsc_optim_clip_coef(double norm, double clip) {
    if (clip <= 0 || norm <= clip) return 1.0;
    return clip / (norm + 1e-6);
}

/* Sums one value over a group; float is what the comm layer reduces, and a
 * handful of partial sums of squares lose nothing that matters to clipping. */
static dsc_status sum_over(dsc_comm *c, double *value) {
    if (!c || dsc_comm_size(c) == 1) return NULL;
    float v = (float)*value;
    int64_t one = 1;
    dsc_tensor t = dsc_tensor_view(&v, DSC_DTYPE_F32, 1, &one, DSC_CPU);
    DSC_TRY(dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM));
    *value = v;
    return NULL;
}

dsc_status dsc_optim_global_norm(double dense_sq, double expert_sq, dsc_comm *ep, dsc_comm *pipe, double *norm) {
    DSC_TRY(sum_over(ep, &expert_sq));
    double total = dense_sq + expert_sq;
    DSC_TRY(sum_over(pipe, &total));
    *norm = sqrt(total);
    return NULL;
}

dsc_status dsc_optimizer_before_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward) {
    return opt->ops->before_layer ? opt->ops->before_layer(opt, layer, backward) : NULL;
}

dsc_status dsc_optimizer_after_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward) {
    return opt->ops->after_layer ? opt->ops->after_layer(opt, layer, backward) : NULL;
}

dsc_status dsc_optimizer_grads_ready(dsc_optimizer *opt, dsc_layer *layer) {
    return opt->ops->grads_ready ? opt->ops->grads_ready(opt, layer) : NULL;
}

dsc_status dsc_optimizer_progress(dsc_optimizer *opt) {
    return opt->ops->progress ? opt->ops->progress(opt) : NULL;
}

static void progress_kernel_hook(void *arg) {
    dsc_optimizer_progress_scope *scope = arg;
    if (!scope->error) scope->error = dsc_optimizer_progress(scope->opt);
}

void dsc_optimizer_progress_begin(dsc_optimizer_progress_scope *scope, dsc_optimizer *opt) {
    *scope = (dsc_optimizer_progress_scope){.opt = opt};
    dsc_kernels_set_progress(progress_kernel_hook, scope);
}

static dsc_status take(dsc_optimizer_progress_scope *scope) {
    dsc_status e = scope->error;
    scope->error = NULL;
    return e;
}

dsc_status dsc_optimizer_progress_take(dsc_optimizer_progress_scope *scope, const char *layer) {
    dsc_status e = scope ? take(scope) : NULL;
    return e ? dsc_error_wrap(e, "progressing gradient reductions in the backward of %s", layer) : NULL;
}

dsc_status dsc_optimizer_progress_end(dsc_optimizer_progress_scope *scope, dsc_status s) {
    dsc_kernels_set_progress(NULL, NULL);
    dsc_status kept = take(scope);
    if (!s) return kept ? dsc_error_wrap(kept, "progressing gradient reductions") : NULL;
    if (kept) dsc_status_free(kept); /* the first failure wins */
    return s;
}

dsc_status dsc_optimizer_reduce_grads(dsc_optimizer *opt) {
    return opt->ops->reduce_grads(opt);
}

dsc_status dsc_optimizer_step(dsc_optimizer *opt, double lr, dsc_optim_stats *stats) {
    dsc_optim_stats ignored;
    return opt->ops->step(opt, lr, stats ? stats : &ignored);
}

int dsc_optimizer_state_count(const dsc_optimizer *opt) {
    return opt->ops->state_count(opt);
}

void dsc_optimizer_state_at(dsc_optimizer *opt, int index, dsc_optim_state *out) {
    opt->ops->state_at(opt, index, out);
}

void dsc_optimizer_destroy(dsc_optimizer *opt) {
    if (opt) opt->ops->destroy(opt);
}
