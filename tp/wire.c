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

/* Sequence parallelism splits every micro-batch's positions evenly over
 * the tensor group; MoE layers would gate each rank's positions apart (their
 * capacity and balancing loss over other token sets than one process's). */
static dsc_status check_sequence_parallel(const dsc_config *cfg, const dsc_model_config *mc, int tp) {
    const char *src = cfg->source ? cfg->source : "config";
    DSC_CHECK(mc->seq_len % tp == 0, DSC_ERR_CONFIG,
              "%s: \"tensor_parallel.sequence_parallel\" splits each sequence over the %d tensor ranks, and "
              "model.seq_len %d is not a multiple of %d",
              src, tp, mc->seq_len, tp);
    DSC_CHECK(cfg->moe.num_experts == 0, DSC_ERR_UNSUPPORTED,
              "%s: \"tensor_parallel.sequence_parallel\" with MoE layers (moe.num_experts %d) is not implemented: "
              "each rank's gate would see only its positions",
              src, cfg->moe.num_experts);
    return NULL;
}

dsc_status dsc_tp_prepare(const dsc_config *cfg, dsc_groups *groups, void *ctx, dsc_trainer_layers *out) {
    dsc_tp_build_extra *x = ctx;
    dsc_model_config mc;
    DSC_TRY(dsc_trainer_model_config(cfg, &mc));
    dsc_comm *model = dsc_groups_get(groups, DSC_GROUP_KIND_TENSOR);
    DSC_TRY(dsc_tp_build_extra_init(x, &mc, model, cfg->tensor_parallel.tp_grain_size));
    x->sequence_parallel = cfg->tensor_parallel.sequence_parallel && x->size > 1;
    if (x->sequence_parallel) DSC_TRY(check_sequence_parallel(cfg, &mc, x->size));
    DSC_TRY(dsc_tp_register_layers());
    out->tp = x;
    out->attention = dsc_tp_attention_create;
    out->model = model;
    out->counts_in_norm = dsc_tp_counts_in_norm;
    out->counts_in_norm_ctx = x;
    return NULL;
}

dsc_status dsc_tp_sync_rng(dsc_comm *tensor_group, dsc_rng *rng) {
    if (!tensor_group || dsc_comm_size(tensor_group) == 1) return NULL;
    const int64_t words = 4;
    dsc_tensor t = dsc_tensor_view(rng->s, DSC_DTYPE_I64, 1, &words, DSC_CPU);
    dsc_status s = dsc_comm_broadcast(tensor_group, &t, 0);
    return s ? dsc_error_wrap(s, "tensor parallelism: sharing the layers' random stream over the tensor group")
             : NULL;
}

dsc_comm *dsc_tp_wiring_dp(const dsc_tp_wiring *w) {
    return dsc_groups_get(w->groups, DSC_GROUP_KIND_DATA);
}

void dsc_tp_wiring_free(dsc_tp_wiring *w) {
    dsc_groups_free(w->groups);
    dsc_group_plan_free(&w->plan);
    memset(w, 0, sizeof *w);
}
