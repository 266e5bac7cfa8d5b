/* Megatron-LM's sequence parallelism for the tensor-parallel regions: with
 * tensor_parallel.sequence_parallel the (b, t, C) activations between the
 * regions are cut along t, rank r of the tensor group holding positions
 * [r tl, (r + 1) tl) of every sequence (tl = t / tp). A region (attention,
 * MLP, the LM head) gathers its input to (b, t, C), computes as without, and
 * reduce-scatters its partial output back to (b, tl, C); its backward
 * gathers the output gradient and the input again (Megatron's recompute of
 * the all-gather: a region keeps only its rank's positions of its input) and
 * reduce-scatters the input gradient. Each all-reduce of the plain layout
 * becomes one reduce-scatter plus one all-gather of the same total bytes,
 * and backward adds the input's second all-gather. Without sequence
 * parallelism the same calls are the plain layout's: the gather is the
 * identity and the sum an all-reduce in place, so the layers read alike in
 * both.
 *
 * The gathered tensors live only during one layer call, so every region of
 * the process shares one workspace (Megatron's global memory buffer): four
 * (B, T, C) buffers — gathered output gradient, partial sum, the
 * collectives' scratch, gathered input — sized for the largest region,
 * allocated while some region holds a reservation and freed with the last.
 * Layers run on one thread per rank, one call at a time.
 *
 * The collectives work on contiguous rank pieces, so the (b, tp, tl, C)
 * view of a full tensor is swapped to (tp, b, tl, C) around them.
 * Not here: which tensors a layer sums or gathers (layer_*.c). */
#include <string.h>

#include "tp/tp_internal.h"

enum { WS_GRAD, WS_PARTIAL, WS_SCRATCH, WS_INPUT, WS_COUNT };

static struct {
    dsc_tensor buf[WS_COUNT]; /* (numel) each */
    int64_t numel;
    int users; /* regions holding a reservation */
} ws;

/* Grows the shared workspace to `numel` floats per buffer; on failure the old one stays. */
static dsc_status ws_grow(int64_t numel, dsc_device device) {
    if (numel <= ws.numel) return NULL;
    dsc_tensor grown[WS_COUNT] = {{0}};
    for (int i = 0; i < WS_COUNT; i++) {
        dsc_status s = dsc_tensor_alloc(&grown[i], DSC_DTYPE_F32, 1, &numel, device, DSC_MEM_ACTIVATIONS);
        if (s) {
            for (int j = 0; j < i; j++)
                dsc_tensor_free(&grown[j]);
            return dsc_error_wrap(s, "sequence parallelism: the gathered activations' workspace");
        }
    }
    for (int i = 0; i < WS_COUNT; i++) {
        dsc_tensor_free(&ws.buf[i]);
        ws.buf[i] = grown[i];
    }
    ws.numel = numel;
    return NULL;
}

dsc_status tp_seq_reserve(tp_seq *q, const dsc_tp_build_extra *x, int64_t B, int64_t T, int64_t C,
                          dsc_device device) {
    tp_seq_release(q);
    if (!x->sequence_parallel) return NULL;
    int64_t numel;
    DSC_CHECK(!__builtin_mul_overflow(B, T, &numel) && !__builtin_mul_overflow(numel, C, &numel), DSC_ERR_INVALID,
              "sequence parallelism: (%lld, %lld, %lld) overflows", (long long)B, (long long)T, (long long)C);
    DSC_TRY(ws_grow(numel, device));
    ws.users++;
    q->held = true;
    return NULL;
}

void tp_seq_release(tp_seq *q) {
    if (!q->held) return;
    q->held = false;
    if (--ws.users > 0) return;
    for (int i = 0; i < WS_COUNT; i++)
        dsc_tensor_free(&ws.buf[i]);
    ws.numel = 0;
}

/* The workspace buffer `which` seen as `shape`, which must fit. */
static dsc_status ws_view(int which, int ndim, const int64_t *shape, dsc_tensor *out) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    DSC_CHECK(n <= ws.numel, DSC_ERR_INVALID,
              "sequence parallelism: %lld gathered elements exceed the reserved %lld", (long long)n,
              (long long)ws.numel);
    *out = tp_view(&ws.buf[which], ndim, shape);
    return NULL;
}

/* dst (b, a, inner) = src (a, b, inner). */
static void swap_outer(const float *src, float *dst, int64_t a, int64_t b, int64_t inner) {
    for (int64_t i = 0; i < a; i++)
        for (int64_t j = 0; j < b; j++)
            memcpy(dst + (j * a + i) * inner, src + (i * b + j) * inner, (size_t)inner * sizeof *dst);
}

static dsc_status gather(const dsc_tp_build_extra *x, const dsc_tensor *local, int which, dsc_tensor *full) {
    if (!x->sequence_parallel) {
        *full = *local;
        return NULL;
    }
    const int64_t b = local->shape[0], tl = local->shape[1], C = local->shape[2];
    dsc_tensor pieces;
    DSC_TRY(ws_view(WS_SCRATCH, 1, (int64_t[]){b * tl * C * x->size}, &pieces));
    DSC_TRY(ws_view(which, 3, (int64_t[]){b, tl * x->size, C}, full));
    DSC_TRY(dsc_comm_allgather(x->group, local, &pieces, NULL)); /* (tp, b, tl, C) */
    swap_outer(pieces.data, full->data, x->size, b, tl * C);
    return NULL;
}

dsc_status tp_seq_gather_input(const dsc_tp_build_extra *x, const dsc_tensor *local, dsc_tensor *full) {
    return gather(x, local, WS_INPUT, full);
}

dsc_status tp_seq_gather_grad(const dsc_tp_build_extra *x, const dsc_tensor *local, dsc_tensor *full) {
    return gather(x, local, WS_GRAD, full);
}

dsc_status tp_seq_partial(const dsc_tp_build_extra *x, const dsc_tensor *own, const int64_t *shape,
                          dsc_tensor *out) {
    if (x->sequence_parallel) return ws_view(WS_PARTIAL, 3, shape, out);
    *out = tp_view(own, 3, shape);
    return NULL;
}

dsc_status tp_seq_sum(const dsc_tp_build_extra *x, dsc_tensor *partial, const dsc_tensor *buf, dsc_tensor *out) {
    if (!x->sequence_parallel) {
        DSC_TRY(tp_allreduce(x, partial));
        *out = *partial;
        return NULL;
    }
    const int64_t b = partial->shape[0], t = partial->shape[1], C = partial->shape[2], tl = t / x->size;
    DSC_CHECK(tl * x->size == t, DSC_ERR_INVALID,
              "sequence parallelism: %lld positions do not split over %d tensor ranks", (long long)t, x->size);
    dsc_tensor pieces;
    DSC_TRY(ws_view(WS_SCRATCH, 1, (int64_t[]){b * t * C}, &pieces));
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

int64_t tp_seq_local(const dsc_tp_build_extra *x, int64_t T) {
    return x->sequence_parallel ? (T + x->size - 1) / x->size : T;
}

int64_t tp_seq_full(const dsc_tp_build_extra *x, int64_t T) {
    return x->sequence_parallel ? T * x->size : T;
}
