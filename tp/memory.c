/* The per-rank parameter count of tensor parallelism, in closed form: what
 * every rank of the tensor group holds whole (norms, the row-parallel
 * biases, learned positions) plus 1/tp of everything else. `--estimate-memory`
 * and the memory test use it; it is not read off the shards. */
#include "dsc/tp_layers.h"

double dsc_tp_replicated_params(const dsc_model_config *mc) {
    const double C = mc->d_model;
    if (mc->arch == DSC_ARCH_LLAMA || mc->arch == DSC_ARCH_MIXTRAL)
        return mc->n_layer * 2.0 * C + C; /* RMSNorm weights: 2 per block, the head's */
    /* LayerNorm weight + bias twice, o and proj biases per block; positions; the head's norm */
    return mc->n_layer * 6.0 * C + (double)mc->seq_len * C + 2.0 * C;
}

double dsc_tp_params_per_rank(const dsc_model_config *mc, double psi, int tp) {
    const double rep = dsc_tp_replicated_params(mc);
    return (psi - rep) / (tp > 0 ? tp : 1) + rep;
}
