/* The "moe_block" layer type and the MoE layer's configuration surface: the
 * job config's moe section as layer options, the factory that builds a
 * pre-norm block around a MoE layer, and the statistics accessors that find
 * the MoE layer inside such a block.
 *
 * Not here: the layer itself (moe/layer.c) and which ranks form the
 * expert-parallel group (the app plans groups with dsc/topology.h and hands
 * this rank's communicator in through dsc_moe_build_extra). */
#include <string.h>

#include "dsc/moe.h"
#include "moe/moe_internal.h"

dsc_status dsc_moe_options_from_config(const dsc_config_moe *cfg, dsc_model_arch arch, dsc_moe_options *out) {
    DSC_CHECK(arch == DSC_ARCH_GPT_MOE || arch == DSC_ARCH_MIXTRAL, DSC_ERR_CONFIG,
              "moe: model.arch \"%s\" has no MoE layers (use gpt-moe or mixtral)", dsc_model_arch_name(arch));
    dsc_moe_options o = {.num_experts = cfg->num_experts,
                         .use_residual = cfg->use_residual,
                         .overlap_alltoall = cfg->overlap_alltoall};
    o.expert_kind = arch == DSC_ARCH_MIXTRAL ? DSC_MOE_EXPERT_KIND_SWIGLU : DSC_MOE_EXPERT_KIND_GELU;
    o.gate = dsc_moe_gate_config_default();
    o.gate.k = cfg->k;
    o.gate.capacity_factor = cfg->capacity_factor;
    o.gate.eval_capacity_factor = cfg->eval_capacity_factor;
    o.gate.min_capacity = cfg->min_capacity;
    o.gate.drop_tokens = cfg->drop_tokens;
    o.gate.drop_policy = cfg->drop_policy;
    o.gate.noisy_gate_policy = cfg->noisy_gate_policy;
    o.gate.use_rts = cfg->use_rts;
    o.gate.top2_2nd_expert_sampling = cfg->top2_2nd_expert_sampling;
    o.gate.aux_loss_coef = cfg->aux_loss_coef;
    o.gate.z_loss_coef = cfg->z_loss_coef;
    DSC_CHECK(o.num_experts >= 1, DSC_ERR_CONFIG, "moe.num_experts must be >= 1 for arch %s (got %d)",
              dsc_model_arch_name(arch), o.num_experts);
    dsc_status s = dsc_moe_gate_config_validate(&o.gate, o.num_experts);
    if (s) return dsc_error_wrap(s, "config section \"moe\"");
    *out = o;
    return NULL;
}

static dsc_status moe_block_factory(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    *out = NULL;
    const dsc_moe_build_extra *x = ctx->extra;
    DSC_CHECK(x, DSC_ERR_INVALID,
              "layer \"moe_block\" %d: dsc_build_ctx.extra must point to a dsc_moe_build_extra (options and the "
              "expert-parallel group)",
              spec->block);
    dsc_layer *ffn;
    DSC_TRY(dsc_moe_layer_create(&x->options, ctx->model, spec->block, ctx->params, ctx->device, x->ep, &ffn));
    return dsc_block_create(spec, ctx, ffn, out);
}

dsc_status dsc_moe_register_layers(void) {
    return dsc_layer_register("moe_block", moe_block_factory);
}

/* The MoE layer itself, or the one inside a block. */
static const dsc_layer *find(const dsc_layer *layer) {
    if (moe_layer_is(layer)) return layer;
    const dsc_layer *ffn = dsc_block_ffn(layer);
    return moe_layer_is(ffn) ? ffn : NULL;
}

dsc_status dsc_moe_stats_get(const dsc_layer *layer, dsc_moe_stats *out) {
    const dsc_layer *m = find(layer);
    DSC_CHECK(m, DSC_ERR_INVALID, "layer %s is neither a MoE layer nor a block holding one",
              layer ? layer->name : "(null)");
    moe_layer_stats(m, out);
    return NULL;
}

dsc_status dsc_moe_stats_reset(dsc_layer *layer) {
    const dsc_layer *m = find(layer);
    DSC_CHECK(m, DSC_ERR_INVALID, "layer %s is neither a MoE layer nor a block holding one",
              layer ? layer->name : "(null)");
    moe_layer_stats_reset((dsc_layer *)m);
    return NULL;
}
