/* A data-parallel trainer's tensor-parallel wiring: DeepSpeed's
 * pipe x data x model grid for the world, this rank's tensor and
 * data-parallel communicators, its shard of the model, and the hooks the
 * trainer hands to the build context and the optimizer (the gradient norm
 * sums over the tensor group, replicated parameters counted once).
 *
 * The pipeline trainer takes the same wiring through dsc_tp_prepare. Not
 * here: MoE models (dsc-train forms their groups with expert groups and calls
 * dsc_tp_prepare itself, since tp/ does not know moe/). */
#include <string.h>

#include "dsc/tp_layers.h"

dsc_status dsc_tp_wire(const dsc_config *cfg, dsc_comm *world, dsc_tp_wiring *w) {
    memset(w, 0, sizeof *w);
    const int size = dsc_comm_size(world), tp = cfg->tensor_parallel.autotp_size;
    DSC_CHECK(tp >= 1 && size % tp == 0, DSC_ERR_CONFIG,
              "%s: world = pp x tp x dp: %d ranks are not divisible by pipeline.stages 1 x "
              "tensor_parallel.autotp_size %d",
              cfg->source ? cfg->source : "config", size, tp);
    const dsc_parallel_dims dims = {.pp = 1, .tp = tp, .ep = 1};
    DSC_TRY(dsc_groups_plan(size, dsc_comm_rank(world), &dims, &w->plan));
    dsc_status s = dsc_groups_create(world, &w->plan, &w->groups);
    if (!s) s = dsc_tp_prepare(cfg, w->groups, &w->extra, &w->layers);
    if (s) dsc_tp_wiring_free(w);
    return s;
}

dsc_status dsc_tp_prepare(const dsc_config *cfg, dsc_groups *groups, void *ctx, dsc_trainer_layers *out) {
    dsc_tp_build_extra *x = ctx;
    dsc_model_config mc;
    DSC_TRY(dsc_trainer_model_config(cfg, &mc));
    dsc_comm *model = dsc_groups_get(groups, DSC_GROUP_KIND_TENSOR);
    DSC_TRY(dsc_tp_build_extra_init(x, &mc, model, cfg->tensor_parallel.tp_grain_size));
    DSC_TRY(dsc_tp_register_layers());
    out->tp = x;
    out->attention = dsc_tp_attention_create;
    out->model = model;
    out->counts_in_norm = dsc_tp_counts_in_norm;
    out->counts_in_norm_ctx = x;
    return NULL;
}

dsc_comm *dsc_tp_wiring_dp(const dsc_tp_wiring *w) {
    return dsc_groups_get(w->groups, DSC_GROUP_KIND_DATA);
}

void dsc_tp_wiring_free(dsc_tp_wiring *w) {
    dsc_groups_free(w->groups);
    dsc_group_plan_free(&w->plan);
    memset(w, 0, sizeof *w);
}
