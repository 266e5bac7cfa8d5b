/* The tensor-parallel block ("tp_block"): runtime's pre-norm block
 * (dsc_block_create) around the attention split by heads and the MLP split
 * by width. Under sequence parallelism the block's norms see only this
 * rank's positions, so each backward leaves in their gradients a partial
 * sum over the tensor group; the wrapper here sums that contribution over
 * the group (one all-reduce of the norms' few C elements per backward),
 * which keeps the accumulated gradients whole on every rank whatever the
 * optimizer does with them afterwards (ZeRO-2/3 reduce each micro-batch's).
 * The row-parallel biases need no such sum: their gradients come from the
 * gathered output gradient (layer_attention.c, layer_mlp.c).
 *
 * The wrapper also reserves the inner block for this rank's T / tp
 * positions: everything the block keeps per micro-batch outside the regions
 * (its input copy, norm outputs and statistics, residual, output and input
 * gradient), and the regions' own input and output buffers, shrink by tp;
 * the regions reserve their hidden activations for the whole sequence.
 *
 * Not here: the block's arithmetic (runtime/nn/block.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp/tp_internal.h"

typedef struct seq_block {
    dsc_layer base;
    dsc_layer *inner;
    const dsc_tp_build_extra *tp;
    dsc_param *norms[TP_MAX_LAYER_PARAMS]; /* the block's replicated norm parameters */
    int n_norms;
    int64_t n;     /* their elements */
    float *before; /* (2 n): the gradients before a backward, then its contribution */
} seq_block;

static dsc_status sb_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    seq_block *k = (seq_block *)self;
    return dsc_layer_reserve(k->inner, slots, B, tp_seq_local(k->tp, T));
}

static dsc_status sb_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out,
                             dsc_micro_ctx *ctx) {
    return dsc_layer_forward(((seq_block *)self)->inner, slot, in, out, ctx);
}

static dsc_status sb_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                              dsc_micro_ctx *ctx) {
    seq_block *k = (seq_block *)self;
    float *before = k->before, *delta = k->before + k->n;
    for (int i = 0, at = 0; i < k->n_norms; at += (int)dsc_param_numel(k->norms[i]), i++)
        memcpy(before + at, k->norms[i]->grad.data, (size_t)dsc_param_numel(k->norms[i]) * sizeof *before);
    DSC_TRY(dsc_layer_backward(k->inner, slot, dout, din, ctx));
    for (int i = 0, at = 0; i < k->n_norms; at += (int)dsc_param_numel(k->norms[i]), i++) {
        const float *g = k->norms[i]->grad.data;
        for (int64_t j = 0; j < dsc_param_numel(k->norms[i]); j++)
            delta[at + j] = g[j] - before[at + j];
    }
    dsc_tensor d = dsc_tensor_view(delta, DSC_DTYPE_F32, 1, &k->n, DSC_CPU);
    DSC_TRY(tp_allreduce(k->tp, &d));
    for (int i = 0, at = 0; i < k->n_norms; at += (int)dsc_param_numel(k->norms[i]), i++) {
        float *g = k->norms[i]->grad.data;
        for (int64_t j = 0; j < dsc_param_numel(k->norms[i]); j++)
            g[j] = before[at + j] + delta[at + j];
    }
    return NULL;
}

static void sb_destroy(dsc_layer *self) {
    seq_block *k = (seq_block *)self;
    dsc_layer_destroy(k->inner);
    free(k->before);
    free(k);
}

static const dsc_layer_ops seq_block_ops = {.type = "tp_block",
                                            .reserve = sb_reserve,
                                            .forward = sb_forward,
                                            .backward = sb_backward,
                                            .destroy = sb_destroy};

/* The block's norm parameters: replicated, and named "<block>.norm<i>.*". */
static bool is_norm(const dsc_param *p) {
    return p->shard.axis < 0 && strstr(p->name, ".norm");
}

dsc_status tp_block_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    *out = NULL;
    const dsc_tp_build_extra *x;
    DSC_TRY(tp_extra_of(ctx, "tp_block", &x));
    dsc_layer *ffn, *inner;
    DSC_TRY(tp_mlp_create(ctx, spec->block, &ffn));
    DSC_TRY(dsc_block_create(spec, ctx, ffn, &inner));
    if (!x->sequence_parallel) {
        *out = inner;
        return NULL;
    }
    seq_block *k = calloc(1, sizeof *k);
    if (!k) dsc_layer_destroy(inner);
    DSC_CHECK(k, DSC_ERR_NOMEM, "block %d", spec->block);
    k->base.ops = &seq_block_ops;
    k->inner = inner;
    k->tp = x;
    snprintf(k->base.name, sizeof k->base.name, "%s", inner->name);
    /* the inner block's bytes per position it holds, of which a rank holds 1 in tp */
    k->base.activation_bytes_per_token = inner->activation_bytes_per_token / x->size;
    for (int i = 0; i < inner->n_params && k->n_norms < TP_MAX_LAYER_PARAMS; i++)
        if (is_norm(inner->params[i])) {
            k->norms[k->n_norms++] = inner->params[i];
            k->n += dsc_param_numel(inner->params[i]);
        }
    k->before = malloc((size_t)(2 * k->n + 1) * sizeof *k->before);
    dsc_status s = k->before ? dsc_layer_set_params(&k->base, inner->params, inner->param_uses, inner->n_params)
                             : dsc_error(DSC_ERR_NOMEM, "block %d: norm gradient scratch", spec->block);
    if (s) {
        sb_destroy(&k->base);
        return s;
    }
    *out = &k->base;
    return NULL;
}
