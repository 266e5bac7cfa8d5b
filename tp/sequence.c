/* Megatron-LM's sequence parallelism for the tensor-parallel regions: with
 * tensor_parallel.sequence_parallel the (b, t, C) activations between the
 * regions are cut along t, rank r of the tensor group holding positions
 * [r tl, (r + 1) tl) of every sequence (tl = t / tp). A region (attention,
 * MLP, the LM head) gathers its input to (b, t, C), computes as without, and
 * reduce-scatters its partial output back to (b, tl, C); its backward
 * gathers the output gradient and reduce-scatters the input gradient. Each
 * all-reduce of the plain layout becomes one reduce-scatter plus one
 * all-gather of the same total bytes. Without sequence parallelism the same
 * calls are the plain layout's: the gather is the identity and the sum an
 * all-reduce in place, so the layers read alike in both.
 *
 * The collectives work on contiguous rank pieces, so the (b, tp, tl, C)
 * view of a full tensor is swapped to (tp, b, tl, C) around them.
 * Not here: which tensors a layer sums or gathers (layer_*.c). */
#include <string.h>

#include "tp/tp_internal.h"

dsc_status tp_seq_reserve(tp_seq *q, const dsc_tp_build_extra *x, int slots, int64_t B, int64_t T, int64_t C,
                          dsc_device device) {
    tp_seq_release(q);
    if (!x->sequence_parallel) return NULL;
    const int64_t shape[3] = {B, T, C};
    DSC_TRY(dsc_buffers_alloc(&q->full, 3, 3, shape, device));
    q->slots = slots;
    return dsc_buffers_alloc(&q->gathered, slots, 3, shape, device);
}

void tp_seq_release(tp_seq *q) {
    dsc_buffers_free(&q->full, 3);
    dsc_buffers_free(&q->gathered, q->slots);
    q->slots = 0;
}

/* dst (b, a, inner) = src (a, b, inner). */
static void swap_outer(const float *src, float *dst, int64_t a, int64_t b, int64_t inner) {
    for (int64_t i = 0; i < a; i++)
        for (int64_t j = 0; j < b; j++)
            memcpy(dst + (j * a + i) * inner, src + (i * b + j) * inner, (size_t)inner * sizeof *dst);
}

dsc_status tp_seq_gather(tp_seq *q, const dsc_tp_build_extra *x, const dsc_tensor *local, int slot,
                         dsc_tensor *full) {
    if (!x->sequence_parallel) {
        *full = *local;
        return NULL;
    }
    const int64_t b = local->shape[0], tl = local->shape[1], C = local->shape[2], n = b * tl * C * x->size;
    dsc_tensor pieces = dsc_tensor_view(q->full[2].data, DSC_DTYPE_F32, 1, &n, local->device);
    DSC_TRY(dsc_comm_allgather(x->group, local, &pieces, NULL)); /* (tp, b, tl, C) */
    *full = tp_view(slot >= 0 ? &q->gathered[slot] : &q->full[0], 3, (int64_t[]){b, tl * x->size, C});
    swap_outer(pieces.data, full->data, x->size, b, tl * C);
    return NULL;
}

dsc_tensor tp_seq_partial(const tp_seq *q, const dsc_tp_build_extra *x, const dsc_tensor *own,
                          const int64_t *shape) {
    return tp_view(x->sequence_parallel ? &q->full[1] : own, 3, shape);
}

dsc_status tp_seq_sum(tp_seq *q, const dsc_tp_build_extra *x, dsc_tensor *partial, const dsc_tensor *buf,
                      dsc_tensor *out) {
    if (!x->sequence_parallel) {
        DSC_TRY(tp_allreduce(x, partial));
        *out = *partial;
        return NULL;
    }
    const int64_t b = partial->shape[0], t = partial->shape[1], C = partial->shape[2], tl = t / x->size;
    DSC_CHECK(tl * x->size == t, DSC_ERR_INVALID,
              "sequence parallelism: %lld positions do not split over %d tensor ranks", (long long)t, x->size);
    dsc_tensor pieces = tp_view(&q->full[2], 1, (int64_t[]){b * t * C});
    swap_outer(partial->data, pieces.data, b, x->size, tl * C); /* (b, tp, tl C) -> (tp, b, tl C) */
    *out = tp_view(buf, 3, (int64_t[]){b, tl, C});
    return dsc_comm_reduce_scatter(x->group, &pieces, out, NULL, DSC_REDUCE_OP_SUM);
}

void tp_seq_take(const dsc_tp_build_extra *x, const dsc_tensor *full, const dsc_tensor *buf, dsc_tensor *local) {
    if (!x->sequence_parallel) {
        *local = *full;
        return;
    }
    const int64_t b = full->shape[0], t = full->shape[1], C = full->shape[2], tl = t / x->size;
    *local = tp_view(buf, 3, (int64_t[]){b, tl, C});
    const float *src = full->data;
    float *dst = local->data;
    for (int64_t i = 0; i < b; i++)
        memcpy(dst + i * tl * C, src + (i * t + x->rank * tl) * C, (size_t)(tl * C) * sizeof *dst);
}
