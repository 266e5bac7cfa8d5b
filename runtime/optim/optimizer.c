/* The optimizer interface's wrappers and the pieces every implementation
 * shares: hyper-parameters from the config, the per-piece AdamW / SGD update,
 * the clipping coefficient and the global-norm reduction.
 *
 * Not here: any state layout or gradient reduction (plain.c; zero/). */
#include "dsc/optimizer.h"

#include <math.h>

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
    };
}

dsc_status dsc_optim_update(const dsc_optim_hparams *hp, dsc_tensor *value, const dsc_tensor *grad,
                            dsc_tensor *state0, dsc_tensor *state1, float lr, bool decay, int64_t step) {
    float wd = decay ? hp->weight_decay : 0.0f;
    if (hp->type == DSC_OPTIMIZER_TYPE_SGD) return dsc_kernel_sgd(value, grad, state0, lr, hp->momentum, wd, step);
    return dsc_kernel_adamw(value, grad, state0, state1, lr, hp->beta1, hp->beta2, hp->eps, wd, step);
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

dsc_status dsc_optimizer_reduce_grads(dsc_optimizer *opt) { return opt->ops->reduce_grads(opt); }

dsc_status dsc_optimizer_step(dsc_optimizer *opt, double lr, dsc_optim_stats *stats) {
    dsc_optim_stats ignored;
    return opt->ops->step(opt, lr, stats ? stats : &ignored);
}

int dsc_optimizer_state_count(const dsc_optimizer *opt) { return opt->ops->state_count(opt); }

void dsc_optimizer_state_at(dsc_optimizer *opt, int index, dsc_optim_state *out) {
    opt->ops->state_at(opt, index, out);
}

void dsc_optimizer_destroy(dsc_optimizer *opt) {
    if (opt) opt->ops->destroy(opt);
}
