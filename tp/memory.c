/* The per-rank parameter count of tensor parallelism, in closed form: what
 * every rank of the tensor group holds whole (norms, the row-parallel
 * biases, learned positions; in MoE blocks the router and PR-MoE's residual
 * MLP) plus 1/tp of everything else, and of the experts either all (whole
 * on every tensor rank) or, split by moe.enable_expert_tensor_parallelism,
 * 1/tp but their proj biases. `--estimate-memory` and the memory tests use
 * it; it is not read off the shards. */
#include "dsc/tp_layers.h"

static bool gated(const dsc_model_config *mc) {
    return mc->arch == DSC_ARCH_LLAMA || mc->arch == DSC_ARCH_MIXTRAL;
}

/* Blocks whose MLP is a MoE layer: every moe_layer_freq-th (dsc_model_specs). */
static double moe_blocks(const dsc_model_config *mc) {
    const bool moe = mc->arch == DSC_ARCH_GPT_MOE || mc->arch == DSC_ARCH_MIXTRAL;
    return moe && mc->moe_num_experts > 0 && mc->moe_layer_freq > 0 ? (double)(mc->n_layer / mc->moe_layer_freq)
                                                                    : 0.0;
}

double dsc_tp_replicated_params(const dsc_model_config *mc, bool moe_residual) {
    const double C = mc->d_model, F = mc->d_ff, E = mc->moe_num_experts, Lm = moe_blocks(mc);
    const double Ld = mc->n_layer - Lm;
    /* A MoE block: the router (E, C); with PR-MoE the whole residual MLP and its (2, C) + (2) coefficient. */
    const double residual = moe_residual ? (gated(mc) ? 3.0 * F * C : 2.0 * F * C + F + C) + 2.0 * C + 2.0 : 0.0;
    const double moe = E * C + residual;
    if (gated(mc)) /* RMSNorm weights: 2 per block, the head's */
        return Ld * 2.0 * C + Lm * (2.0 * C + moe) + C;
    /* LayerNorm weight + bias twice and the o bias per block, the proj bias in dense blocks; positions; the
     * head's norm */
    return Ld * 6.0 * C + Lm * (5.0 * C + moe) + (double)mc->seq_len * C + 2.0 * C;
}

double dsc_tp_expert_replicated_params(const dsc_model_config *mc) {
    return gated(mc) ? 0.0 : moe_blocks(mc) * mc->moe_num_experts * (double)mc->d_model;
}

double dsc_tp_params_per_rank(const dsc_model_config *mc, bool moe_residual, double psi, int tp) {
    const double rep = dsc_tp_replicated_params(mc, moe_residual);
    return (psi - rep) / (tp > 0 ? tp : 1) + rep;
}

double dsc_tp_expert_params_per_rank(const dsc_model_config *mc, double psi_experts, int tp, bool split) {
    if (!split || tp <= 1) return psi_experts;
    const double rep = dsc_tp_expert_replicated_params(mc);
    return (psi_experts - rep) / tp + rep;
}
