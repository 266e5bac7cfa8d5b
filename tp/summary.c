/* The tensor-parallel partition summary dsc-train prints: for each rank of
 * the tensor group, its query/KV heads, feed-forward columns and vocabulary
 * rows, the local shapes of one block's pieces, and whether experts are
 * split too. A pure function of the
 * config (the same cut dsc_tp_build_extra_init makes). */
#include "dsc/tp_layers.h"

dsc_status dsc_tp_print_shards(FILE *f, const dsc_config *cfg) {
    dsc_model_config mc;
    DSC_TRY(dsc_trainer_model_config(cfg, &mc));
    const int tp = cfg->tensor_parallel.autotp_size;
    const int64_t C = mc.d_model, HS = mc.d_model / mc.n_head;
    const dsc_tp_dims dims = {mc.n_head,     mc.n_kv_head,       (int32_t)HS, mc.d_ff,
                              mc.vocab_size, mc.moe_num_experts, 0,           0};
    fprintf(f, "tensor parallelism over %d ranks (model axis; heads whole, widths in multiples of %lld):\n", tp,
            (long long)cfg->tensor_parallel.tp_grain_size);
    for (int r = 0; r < tp; r++) {
        dsc_tp_shard sh;
        DSC_TRY(dsc_tp_shard_of(&dims, tp, cfg->tensor_parallel.tp_grain_size, r, &sh));
        fprintf(f,
                "  tp rank %d: q heads [%d, %d) kv heads [%d, %d) ff [%lld, %lld) vocab [%lld, %lld): "
                "q (%lld, %lld) k/v (%lld, %lld) o (%lld, %lld) mlp in (%lld, %lld) out (%lld, %lld) "
                "embedding (%lld, %lld)\n",
                r, sh.q0, sh.q0 + sh.nq, sh.kv0, sh.kv0 + sh.nkv, (long long)sh.f0, (long long)(sh.f0 + sh.nf),
                (long long)sh.v0, (long long)(sh.v0 + sh.nv), (long long)(sh.nq * HS), (long long)C,
                (long long)(sh.nkv * HS), (long long)C, (long long)C, (long long)(sh.nq * HS), (long long)sh.nf,
                (long long)C, (long long)C, (long long)sh.nf, (long long)sh.nv, (long long)C);
    }
    if (mc.moe_num_experts > 0)
        fprintf(
            f,
            cfg->moe.enable_expert_tensor_parallelism
                ? "  experts split over %d tensor ranks with the MLP's ff cut "
                  "(moe.enable_expert_tensor_parallelism)\n"
                : "  experts whole on each of the %d tensor ranks (moe.enable_expert_tensor_parallelism false)\n",
            tp);
    return NULL;
}
