/* Stages 2 and 3 without a pipeline: staged gradients. Before a layer's
 * backward its gradient views point into a zeroed staging buffer laid out as
 * the layer's runs; after it the staging buffer is reduce-scattered (stage 2:
 * its runs in reduce_bucket_size chunks of the flat cut; stage 3: each
 * parameter, split over the ranks), each rank receiving its share into a
 * receive buffer, and "settling" adds every received share to the rank's
 * gradients, in posting order.
 *
 * Without overlap_comm there is one staging slot and a layer's reductions are
 * settled as soon as they are posted. With it there are two slots used in
 * turn: a layer's reduce-scatters stay in flight (tested at every layer hook)
 * while the next layer's backward writes the other slot, and a slot is
 * settled only before it is reused or in reduce_grads. Settling goes oldest
 * slot first and, inside a slot, in posting order, so every gradient element
 * receives the same additions in the same order as without overlap: the
 * results are bitwise equal. The price is a second staging slot (the
 * largest layer's layout and receive buffer, DSC_MEM_COMM).
 *
 * Not here: the collectives over ranges and parameters (partition.c), full
 * gradients (zero_optimizer.c's buckets). */
#include <stdlib.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "zero/zero_internal.h"

/* A layer's staged reduce-scatters: how many, and this rank's share of them. */
static void layer_needs(const zero_optimizer *z, const zero_layer *zl, int *ops, int64_t *share) {
    *ops = 0;
    *share = 0;
    if (z->z.stage == 3) {
        for (int j = 0; j < zl->layer->n_params; j++) {
            int64_t lo, hi;
            const zero_group *g = &z->groups[zl->layer->params[j]->group];
            dsc_zero_param_piece(dsc_param_numel(zl->layer->params[j]), g->size, g->rank, &lo, &hi);
            *share += hi - lo;
            (*ops)++;
        }
        return;
    }
    for (int r = 0; r < zl->n_runs; r++) {
        const zero_run *run = &zl->runs[r];
        int64_t chunk = z->o.reduce_bucket_size > 0 ? z->o.reduce_bucket_size : run->end - run->begin;
        *share += zero_owned(&z->groups[run->group], z->groups[run->group].rank, run->begin, run->end);
        *ops += (int)((run->end - run->begin + chunk - 1) / chunk);
    }
}

dsc_status zero_staged_init(zero_optimizer *z) {
    int64_t layout = 0, share = 0;
    int ops = 0;
    for (int l = 0; l < z->n_layers; l++) {
        int n;
        int64_t s;
        layer_needs(z, &z->layers[l], &n, &s);
        if (z->layers[l].numel > layout) layout = z->layers[l].numel;
        if (s > share) share = s;
        if (n > ops) ops = n;
    }
    z->n_slots = z->o.overlap_comm ? 2 : 1;
    for (int k = 0; k < z->n_slots; k++) {
        zero_slot *slot = &z->slots[k];
        DSC_TRY(dsc_tensor_alloc(&slot->staging, DSC_DTYPE_F32, 1, &layout, z->device, DSC_MEM_COMM));
        DSC_TRY(dsc_tensor_alloc(&slot->recv, DSC_DTYPE_F32, 1, &share, z->device, DSC_MEM_COMM));
        slot->ops = calloc((size_t)(ops > 0 ? ops : 1), sizeof *slot->ops);
        slot->reqs = calloc((size_t)(ops > 0 ? ops : 1), sizeof *slot->reqs);
        DSC_CHECK(slot->ops && slot->reqs, DSC_ERR_NOMEM, "ZeRO: %d staged reductions", ops);
    }
    return NULL;
}

void zero_staged_free(zero_optimizer *z) {
    for (int k = 0; k < 2; k++) {
        dsc_tensor_free(&z->slots[k].staging);
        dsc_tensor_free(&z->slots[k].recv);
        free(z->slots[k].ops);
        free(z->slots[k].reqs);
    }
}

/* Waits for the slot's reductions and adds the shares to the gradients, in posting order. */
static dsc_status settle(zero_optimizer *z, zero_slot *slot) {
    DSC_TRY(dsc_comm_waitall(slot->reqs, slot->n_ops));
    bool narrow = dsc_precision_is_narrow(z->o.reduce_dtype);
    for (int i = 0; i < slot->n_ops; i++) {
        zero_staged_op *op = &slot->ops[i];
        if (op->n == 0) continue;
        if (narrow) { /* every recorded share arrived as 2-byte values */
            dsc_precision_unpack_add(op->dst, op->recv, op->n, z->o.reduce_dtype);
            continue;
        }
        dsc_tensor dst = dsc_tensor_view(op->dst, DSC_DTYPE_F32, 1, &op->n, z->device);
        dsc_tensor got = dsc_tensor_view(op->recv, DSC_DTYPE_F32, 1, &op->n, z->device);
        DSC_TRY(dsc_kernel_axpy(&dst, 1.0f, &got));
    }
    slot->n_ops = 0;
    return NULL;
}

dsc_status zero_staged_begin(zero_optimizer *z, int layer) {
    zero_layer *zl = &z->layers[layer];
    if (zl->numel == 0) return NULL;
    zero_slot *slot = &z->slots[z->next_slot];
    DSC_TRY(settle(z, slot)); /* its previous layer's reductions: the buffers are reused now */
    dsc_tensor staged = dsc_tensor_view(slot->staging.data, DSC_DTYPE_F32, 1, &zl->numel, z->device);
    DSC_TRY(dsc_kernel_zero(&staged));
    for (int j = 0; j < zl->layer->n_params; j++)
        zl->layer->params[j]->grad.data = (float *)slot->staging.data + zl->param_at[j];
    return NULL;
}

dsc_status zero_staged_post(zero_optimizer *z, int layer) {
    zero_layer *zl = &z->layers[layer];
    for (int j = 0; j < zl->layer->n_params; j++)
        zl->layer->params[j]->grad.data = NULL;
    if (zl->numel == 0) return NULL;
    zero_slot *slot = &z->slots[z->next_slot];
    float *staging = slot->staging.data, *recv = slot->recv.data;
    for (int j = 0; j < zl->layer->n_params && z->z.stage == 3; j++) {
        zero_group *g = &z->groups[zl->layer->params[j]->group];
        DSC_TRY(zero_post_staged_param(z, g, zl->param_index[j], staging + zl->param_at[j], &recv, slot));
    }
    for (int r = 0; r < zl->n_runs && z->z.stage == 2; r++) {
        const zero_run *run = &zl->runs[r];
        DSC_TRY(zero_post_staged_range(z, &z->groups[run->group], staging + run->at, run->begin, run->end,
                                       z->o.reduce_bucket_size, &recv, slot));
    }
    z->next_slot = (z->next_slot + 1) % z->n_slots;
    return z->o.overlap_comm ? NULL : settle(z, slot);
}

dsc_status zero_staged_progress(zero_optimizer *z) {
    for (int k = 0; k < z->n_slots; k++)
        for (int i = 0; i < z->slots[k].n_ops; i++) {
            bool done;
            DSC_TRY(dsc_comm_test(&z->slots[k].reqs[i], &done));
        }
    return NULL;
}

dsc_status zero_staged_finish(zero_optimizer *z) {
    for (int k = 0; k < z->n_slots; k++) /* oldest first: the next slot to be used is the older one */
        DSC_TRY(settle(z, &z->slots[(z->next_slot + k) % z->n_slots]));
    return NULL;
}
