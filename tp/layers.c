/* The tensor-parallel layer types: registration, the build wiring (this
 * rank's shard of the model from the plan's cut), which parameters count in
 * the gradient norm, and the helpers the layers share (tp_internal.h).
 *
 * Not here: the layers' arithmetic (layer_*.c). */
#include <stdio.h>
#include <stdlib.h>

#include "tp/tp_internal.h"

dsc_status dsc_tp_build_extra_init(dsc_tp_build_extra *x, const dsc_model_config *mc, dsc_comm *group,
                                   int64_t grain) {
    *x = (dsc_tp_build_extra){
        .group = group, .rank = dsc_comm_rank(group), .size = dsc_comm_size(group), .grain = grain};
    DSC_CHECK(
        mc->n_kv_head >= x->size, DSC_ERR_UNSUPPORTED,
        "tensor_parallel.autotp_size = %d with model.n_kv_head = %d: training needs at least one KV head per "
        "rank (a KV head shared by several ranks would need its gradient summed over them, which dsc does "
        "not do yet); inference takes this split",
        x->size, mc->n_kv_head);
    const dsc_tp_dims dims = {.n_head = mc->n_head,
                              .n_kv_head = mc->n_kv_head,
                              .head_size = mc->d_model / mc->n_head,
                              .d_ff = mc->d_ff,
                              .vocab_size = mc->vocab_size,
                              .n_experts = mc->moe_num_experts};
    dsc_status s = dsc_tp_shard_of(&dims, x->size, grain, x->rank, &x->shard);
    return s ? dsc_error_wrap(s, "tensor_parallel.autotp_size = %d", x->size) : NULL;
}

dsc_status dsc_tp_register_layers(void) {
    DSC_TRY(dsc_layer_register("tp_embedding", tp_embedding_create));
    DSC_TRY(dsc_layer_register("tp_block", tp_block_create));
    return dsc_layer_register("tp_lm_head", tp_head_create);
}

bool dsc_tp_counts_in_norm(const dsc_param *param, void *ctx) {
    const dsc_tp_build_extra *x = ctx;
    return param->shard.axis >= 0 || x->rank == 0;
}

dsc_status tp_extra_of(const dsc_build_ctx *ctx, const char *type, const dsc_tp_build_extra **out) {
    *out = ctx->tp;
    DSC_CHECK(*out, DSC_ERR_INVALID, "layer \"%s\": dsc_build_ctx.tp must point to a dsc_tp_build_extra", type);
    DSC_CHECK(ctx->device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
              "layer \"%s\": tensor-parallel training runs on CPU ranks only so far", type);
    return NULL;
}

dsc_status tp_allreduce(const dsc_tp_build_extra *x, dsc_tensor *t) {
    return x->size > 1 ? dsc_comm_allreduce(x->group, t, DSC_REDUCE_OP_SUM) : NULL;
}

dsc_status tp_declare(tp_param_list *list, dsc_param_store *store, const char *prefix, const char *leaf, int ndim,
                      const int64_t *shape, int axis, int64_t start, int64_t count, uint32_t flags,
                      dsc_param_init init, float init_std, dsc_param **out) {
    DSC_CHECK(list->n < TP_MAX_LAYER_PARAMS, DSC_ERR_INTERNAL, "%s: more than %d parameters", prefix,
              TP_MAX_LAYER_PARAMS);
    char name[DSC_PARAM_NAME_MAX];
    int n = snprintf(name, sizeof name, "%s.%s", prefix, leaf);
    DSC_CHECK(n > 0 && (size_t)n < sizeof name, DSC_ERR_INVALID, "parameter name %s.%s is too long", prefix, leaf);
    if (axis < 0)
        DSC_TRY(dsc_params_declare(store, name, ndim, shape, flags, init, init_std, out));
    else
        DSC_TRY(
            dsc_params_declare_shard(store, name, ndim, shape, axis, start, count, flags, init, init_std, out));
    list->items[list->n++] = *out;
    return NULL;
}

dsc_tensor tp_view(const dsc_tensor *buf, int ndim, const int64_t *shape) {
    return dsc_tensor_view(buf->data, buf->dtype, ndim, shape, buf->device);
}
