/* The partitioning rules and the collectives over partitioned buffers: which
 * rank owns which elements (stages 1, 2: a contiguous range of a group's flat
 * buffer; stage 3: a piece of every parameter), which (parameter, piece)
 * pairs a rank holds, how a layer's parameters map onto contiguous runs of
 * the flat buffer, and reduce-scatter / all-gather of a flat range or of one
 * parameter with per-rank counts (ranks that own none of it send or receive
 * nothing).
 *
 * Both cuts are contiguous in rank order, so the concatenation of every
 * rank's share of a range or parameter is the range or parameter itself: an
 * all-gather lands it in place, with no reordering copy.
 *
 * Not here: when to reduce or gather (zero_optimizer.c, gather.c). */
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "zero/zero_internal.h"

void dsc_zero_partition(int64_t numel, int ranks, int rank, int64_t *begin, int64_t *end) {
    int64_t chunks = (numel + ZERO_ALIGN_ELEMS - 1) / ZERO_ALIGN_ELEMS;
    int64_t per = chunks / ranks, extra = chunks % ranks;
    int64_t first = rank * per + (rank < extra ? rank : extra);
    int64_t count = per + (rank < extra);
    *begin = first * ZERO_ALIGN_ELEMS < numel ? first * ZERO_ALIGN_ELEMS : numel;
    *end = (first + count) * ZERO_ALIGN_ELEMS < numel ? (first + count) * ZERO_ALIGN_ELEMS : numel;
}

int64_t zero_owned(const zero_group *g, int rank, int64_t a, int64_t b) {
    int64_t lo = a > g->bounds[rank] ? a : g->bounds[rank];
    int64_t hi = b < g->bounds[rank + 1] ? b : g->bounds[rank + 1];
    return hi > lo ? hi - lo : 0;
}

static dsc_tensor flat_view(float *data, int64_t n, dsc_device device) {
    return dsc_tensor_view(data, DSC_DTYPE_F32, 1, &n, device);
}

void dsc_zero_param_piece(int64_t numel, int ranks, int rank, int64_t *begin, int64_t *end) {
    int64_t per = (numel + ranks - 1) / ranks;
    *begin = rank * per < numel ? rank * per : numel;
    *end = *begin + per < numel ? *begin + per : numel;
}

/* The (parameter, piece) pairs this rank owns, in declaration order: the
 * intersections of its flat range with the parameters, or (split) its piece
 * of every parameter, packed back to back. */
static dsc_status find_pieces(zero_optimizer *z, zero_group *g) {
    size_t n = (size_t)(z->n_params > 0 ? z->n_params : 1);
    g->pieces = calloc(n, sizeof *g->pieces);
    g->piece_of = malloc(n * sizeof *g->piece_of);
    DSC_CHECK(g->pieces && g->piece_of, DSC_ERR_NOMEM, "ZeRO: pieces of %d parameters", z->n_params);
    for (int i = 0; i < z->n_params; i++) {
        dsc_param *p = dsc_params_at(z->o.params, i);
        g->piece_of[i] = -1;
        if (p->group != g->id) continue;
        int64_t lo, hi, pos;
        if (g->split) {
            dsc_zero_param_piece(dsc_param_numel(p), g->size, g->rank, &lo, &hi);
            pos = g->len;
        } else {
            int64_t n = dsc_param_numel(p);
            lo = g->begin > p->offset ? g->begin - p->offset : 0; /* offsets inside the parameter */
            hi = g->end < p->offset + n ? g->end - p->offset : n;
            pos = p->offset + lo - g->begin;
        }
        if (hi <= lo) continue;
        g->piece_of[i] = g->n_pieces;
        g->pieces[g->n_pieces++] = (zero_piece){p, lo, pos, hi - lo, pos};
        if (g->split) g->len += hi - lo;
    }
    return NULL;
}

dsc_status zero_group_init(zero_optimizer *z, zero_group *g, dsc_param_group id, dsc_comm *comm, bool split) {
    g->id = id;
    g->comm = comm;
    g->size = comm ? dsc_comm_size(comm) : 1;
    g->rank = comm ? dsc_comm_rank(comm) : 0;
    g->numel = dsc_params_numel(z->o.params, id);
    g->split = split;
    g->bounds = calloc((size_t)g->size + 1, sizeof *g->bounds);
    DSC_CHECK(g->bounds, DSC_ERR_NOMEM, "ZeRO: bounds of %d ranks", g->size);
    for (int r = 0; r < g->size; r++)
        dsc_zero_partition(g->numel, g->size, r, &g->bounds[r], &g->bounds[r + 1]);
    g->begin = g->bounds[g->rank];
    g->end = g->bounds[g->rank + 1];
    g->len = split ? 0 : g->end - g->begin;
    return find_pieces(z, g);
}

void zero_group_free(zero_group *g) {
    dsc_tensor_free(&g->values);
    dsc_tensor_free(&g->grads);
    for (int k = 0; k < 2; k++)
        dsc_tensor_free(&g->state[k]);
    free(g->bounds);
    free(g->pieces);
    free(g->piece_of);
    memset(g, 0, sizeof *g);
}

static int64_t aligned(int64_t n) {
    return (n + ZERO_ALIGN_ELEMS - 1) / ZERO_ALIGN_ELEMS * ZERO_ALIGN_ELEMS;
}

static int by_flat_position(const void *a, const void *b) {
    const dsc_param *p = *(dsc_param *const *)a, *q = *(dsc_param *const *)b;
    if (p->group != q->group) return p->group < q->group ? -1 : 1;
    return p->offset < q->offset ? -1 : p->offset > q->offset;
}

/* Stage 3's pool segment of a layer: its parameters that are not persistent,
 * each once, back to back at aligned positions. With nothing persistent it
 * is as long as the runs' layout. */
static void pool_layout(const zero_optimizer *z, zero_layer *zl) {
    const dsc_layer *layer = zl->layer;
    for (int j = 0; j < layer->n_params; j++) {
        zl->pool_param_at[j] = -1;
        if (z->persistent && z->persistent[zl->param_index[j]]) continue;
        for (int k = 0; k < j && zl->pool_param_at[j] < 0; k++)
            if (layer->params[k] == layer->params[j]) zl->pool_param_at[j] = zl->pool_param_at[k];
        if (zl->pool_param_at[j] >= 0) continue;
        zl->pool_param_at[j] = zl->pool_numel;
        zl->pool_numel += aligned(dsc_param_numel(layer->params[j]));
    }
}

/* Runs: the layer's parameters sorted by (group, offset), neighbours in the
 * flat buffer merged; the layout puts the runs back to back. */
static dsc_status layer_init(zero_optimizer *z, zero_layer *zl, dsc_layer *layer) {
    int n = layer->n_params;
    zl->layer = layer;
    zl->runs = calloc((size_t)(n > 0 ? n : 1), sizeof *zl->runs);
    zl->param_at = calloc((size_t)(n > 0 ? n : 1), sizeof *zl->param_at);
    zl->param_index = calloc((size_t)(n > 0 ? n : 1), sizeof *zl->param_index);
    zl->pool_param_at = calloc((size_t)(n > 0 ? n : 1), sizeof *zl->pool_param_at);
    zl->gathers = calloc((size_t)(n > 0 ? n : 1), sizeof *zl->gathers);
    dsc_param **sorted = malloc((size_t)(n > 0 ? n : 1) * sizeof *sorted);
    if (!zl->runs || !zl->param_at || !zl->param_index || !zl->pool_param_at || !zl->gathers || !sorted) {
        free(sorted);
        return dsc_error(DSC_ERR_NOMEM, "ZeRO: runs of layer %s", layer->name);
    }
    memcpy(sorted, layer->params, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_flat_position);
    for (int j = 0; j < n; j++) {
        const dsc_param *p = sorted[j];
        zero_run *last = zl->n_runs ? &zl->runs[zl->n_runs - 1] : NULL;
        int64_t end = p->offset + aligned(dsc_param_numel(p));
        if (last && last->group == p->group && p->offset < last->end) continue; /* listed twice */
        if (last && last->group == p->group && p->offset == last->end) {
            last->end = end;
        } else {
            zl->runs[zl->n_runs++] = (zero_run){p->group, p->offset, end, zl->numel};
            last = &zl->runs[zl->n_runs - 1];
        }
        zl->numel = last->at + (last->end - last->begin);
    }
    free(sorted);
    for (int j = 0; j < n; j++) {
        const dsc_param *p = layer->params[j];
        zl->param_index[j] = -1;
        for (int i = 0; i < z->n_params && zl->param_index[j] < 0; i++)
            if (dsc_params_at(z->o.params, i) == p) zl->param_index[j] = i;
        DSC_CHECK(zl->param_index[j] >= 0, DSC_ERR_INVALID,
                  "ZeRO: layer %s reads %s, which is not in the parameter store", layer->name, p->name);
        for (int r = 0; r < zl->n_runs; r++) {
            const zero_run *run = &zl->runs[r];
            if (run->group == p->group && p->offset >= run->begin && p->offset < run->end)
                zl->param_at[j] = run->at + (p->offset - run->begin);
        }
    }
    pool_layout(z, zl);
    return NULL;
}

dsc_status zero_layers_init(zero_optimizer *z) {
    z->n_layers = z->o.n_layers;
    z->layers = calloc((size_t)(z->n_layers > 0 ? z->n_layers : 1), sizeof *z->layers);
    DSC_CHECK(z->layers, DSC_ERR_NOMEM, "ZeRO: %d layers", z->n_layers);
    for (int l = 0; l < z->n_layers; l++)
        DSC_TRY(layer_init(z, &z->layers[l], z->o.layers[l]));
    return NULL;
}

void zero_layers_free(zero_optimizer *z) {
    for (int l = 0; l < z->n_layers; l++) {
        free(z->layers[l].runs);
        free(z->layers[l].param_at);
        free(z->layers[l].param_index);
        free(z->layers[l].pool_param_at);
        free(z->layers[l].gathers);
    }
    free(z->layers);
    z->layers = NULL;
}

int zero_layer_find(const zero_optimizer *z, const dsc_layer *layer) {
    for (int l = 0; l < z->n_layers; l++)
        if (z->layers[l].layer == layer) return l;
    return -1;
}

static void range_counts(const zero_group *g, int64_t a, int64_t b, int64_t *counts) {
    for (int r = 0; r < g->size; r++)
        counts[r] = zero_owned(g, r, a, b);
}

/* Where this rank's share of [a, b) starts, also when it is empty: then every
 * rank's buffers are in place or none are, which the backends' choice of
 * algorithm must see alike on all ranks. */
static int64_t share_start(const zero_group *g, int64_t a, int64_t b) {
    return g->begin < a ? a : g->begin > b ? b : g->begin;
}

static const char *group_name(const zero_group *g) {
    return g->id == DSC_PARAM_GROUP_EXPERT ? "expert" : "dense";
}

/* Posts the reduce-scatter (averaging) of chunk [lo, hi) of `src`, which
 * holds [a, ...), into `recv` (this rank's share). With reduce_dtype bf16 /
 * fp16 the chunk is packed in place first and `recv` receives 2-byte values
 * (its dtype is set here). */
static dsc_status post_reduce_scatter(zero_optimizer *z, zero_group *g, float *src, int64_t a, int64_t lo,
                                      int64_t hi, dsc_tensor *recv, dsc_comm_request **req) {
    int64_t counts[g->size];
    dsc_tensor send = flat_view(src + (lo - a), hi - lo, z->device);
    dsc_dtype dt = z->o.reduce_dtype;
    if (dsc_precision_is_narrow(dt)) {
        dsc_precision_pack(send.data, hi - lo, dt);
        send.dtype = recv->dtype = dt;
    }
    range_counts(g, lo, hi, counts);
    dsc_status s = dsc_comm_ireduce_scatter(g->comm, &send, recv, counts, DSC_REDUCE_OP_AVG, req);
    if (s)
        return dsc_error_wrap(s, "ZeRO: reduce-scatter of %s gradients [%lld, %lld)", group_name(g), (long long)lo,
                              (long long)hi);
    return NULL;
}

dsc_status zero_ireduce_scatter_full(zero_optimizer *z, zero_group *g, float *src, int64_t a, int64_t b,
                                     dsc_comm_request **req) {
    *req = NULL;
    if (!g->comm || g->size == 1) return NULL; /* one rank: the range is its share, in place */
    int64_t at = share_start(g, a, b) - a, mine = zero_owned(g, g->rank, a, b);
    /* packed, the share sits at the same element offset of the 2-byte values */
    void *share =
        dsc_precision_is_narrow(z->o.reduce_dtype) ? (void *)((uint16_t *)(void *)src + at) : (void *)(src + at);
    dsc_tensor in_place = dsc_tensor_view(share, DSC_DTYPE_F32, 1, &mine, z->device);
    return post_reduce_scatter(z, g, src, a, a, b, &in_place, req);
}

void zero_unpack_full_share(zero_optimizer *z, zero_group *g, float *src, int64_t a, int64_t b) {
    int64_t at = share_start(g, a, b) - a;
    dsc_precision_unpack(src + at, (uint16_t *)(void *)src + at, zero_owned(g, g->rank, a, b), z->o.reduce_dtype);
}

/* Adds `n` elements of `src` to `dst` (one rank: its share is the chunk itself). */
static dsc_status add_share(zero_optimizer *z, float *dst, const float *src, int64_t n) {
    if (n == 0) return NULL;
    dsc_tensor d = flat_view(dst, n, z->device), s = flat_view((float *)src, n, z->device);
    return dsc_kernel_axpy(&d, 1.0f, &s);
}

static void record(zero_slot *slot, dsc_comm_request *req, float *recv, float *dst, int64_t n) {
    slot->reqs[slot->n_ops] = req;
    slot->ops[slot->n_ops++] = (zero_staged_op){recv, dst, n};
}

dsc_status zero_post_staged_range(zero_optimizer *z, zero_group *g, float *src, int64_t a, int64_t b,
                                  int64_t chunk, float **recv, zero_slot *slot) {
    if (chunk <= 0) chunk = b - a;
    for (int64_t lo = a; lo < b; lo += chunk) {
        int64_t hi = lo + chunk < b ? lo + chunk : b;
        int64_t mine = zero_owned(g, g->rank, lo, hi);
        int64_t own_lo = share_start(g, lo, hi);
        float *dst = mine > 0 ? (float *)g->grads.data + (own_lo - g->begin) : NULL;
        if (!g->comm || g->size == 1) {
            DSC_TRY(add_share(z, dst, src + (own_lo - a), mine));
            continue;
        }
        dsc_tensor share = flat_view(*recv, mine, z->device);
        dsc_comm_request *req;
        DSC_TRY(post_reduce_scatter(z, g, src, a, lo, hi, &share, &req));
        record(slot, req, *recv, dst, mine);
        *recv += mine;
    }
    return NULL;
}

bool zero_gathers_narrow(const zero_optimizer *z, const zero_group *g) {
    return dsc_precision_is_narrow(z->o.gather_dtype) && g->comm && g->size > 1;
}

int64_t zero_gather_chunk(const zero_optimizer *z, const zero_group *g) {
    int64_t per = z->z.allgather_bucket_size > 0 ? z->z.allgather_bucket_size : (g->numel > 0 ? g->numel : 1);
    return zero_gathers_narrow(z, g) && per > ZERO_NARROW_GATHER_MAX ? ZERO_NARROW_GATHER_MAX : per;
}

/* Stages 1 and 2 in gather_dtype: this rank's share is packed into z->gather16 at its place and the other
 * shares are widened from there into dst. The own share stays f32 in dst: the mixed-precision wrapper reads
 * its master from it after the step, then rounds it like the rest. */
static dsc_status all_gather_narrow(zero_optimizer *z, zero_group *g, float *dst, int64_t a, int64_t b,
                                    const int64_t *counts) {
    dsc_dtype dt = z->o.gather_dtype;
    uint16_t *buf = z->gather16.data;
    int64_t n = b - a, own = share_start(g, a, b) - a, mine = counts[g->rank];
    DSC_ASSERT(n <= dsc_tensor_numel(&z->gather16));
    dsc_precision_pack_to(buf + own, dst + own, mine, dt);
    dsc_tensor send = dsc_tensor_view(buf + own, dt, 1, &mine, z->device);
    dsc_tensor recv = dsc_tensor_view(buf, dt, 1, &n, z->device);
    DSC_TRY(dsc_comm_allgather(g->comm, &send, &recv, counts));
    int64_t at = 0;
    for (int r = 0; r < g->size; at += counts[r++])
        if (r != g->rank) dsc_precision_unpack(dst + at, buf + at, counts[r], dt);
    return NULL;
}

dsc_status zero_all_gather(zero_optimizer *z, zero_group *g, float *dst, int64_t a, int64_t b) {
    int64_t counts[g->size];
    int64_t mine = zero_owned(g, g->rank, a, b);
    int64_t own_lo = share_start(g, a, b);
    /* Stages 1 and 2 hold their range in dst's buffer already (an in-place all-gather); stage 3 sends it from
     * its shard. */
    float *share =
        z->z.stage < 3 ? dst + (own_lo - a) : (float *)g->values.data + (mine > 0 ? own_lo - g->begin : 0);
    dsc_tensor send = flat_view(share, mine, z->device);
    if (!g->comm || g->size == 1) {
        dsc_tensor out = flat_view(dst + (own_lo - a), mine, z->device);
        return out.data == send.data || mine == 0 ? NULL : dsc_tensor_copy(&out, &send);
    }
    range_counts(g, a, b, counts);
    dsc_tensor recv = flat_view(dst, b - a, z->device);
    dsc_status s = z->z.stage < 3 && zero_gathers_narrow(z, g) ? all_gather_narrow(z, g, dst, a, b, counts)
                                                               : dsc_comm_allgather(g->comm, &send, &recv, counts);
    if (s)
        return dsc_error_wrap(s, "ZeRO: all-gather of %s parameters [%lld, %lld)", group_name(g), (long long)a,
                              (long long)b);
    return NULL;
}

static void piece_counts(const zero_group *g, int64_t numel, int64_t *counts) {
    for (int r = 0; r < g->size; r++) {
        int64_t lo, hi;
        dsc_zero_param_piece(numel, g->size, r, &lo, &hi);
        counts[r] = hi - lo;
    }
}

dsc_status zero_post_staged_param(zero_optimizer *z, zero_group *g, int index, float *src, float **recv,
                                  zero_slot *slot) {
    const dsc_param *p = dsc_params_at(z->o.params, index);
    int64_t n = dsc_param_numel(p), counts[g->size];
    piece_counts(g, n, counts);
    int64_t mine = counts[g->rank];
    float *dst = mine > 0 ? (float *)g->grads.data + g->pieces[g->piece_of[index]].pos : NULL;
    if (!g->comm || g->size == 1) return add_share(z, dst, src, mine);
    dsc_tensor send = flat_view(src, n, z->device), share = flat_view(*recv, mine, z->device);
    if (dsc_precision_is_narrow(z->o.reduce_dtype)) { /* communication_data_type: packed in place */
        dsc_precision_pack(src, n, z->o.reduce_dtype);
        send.dtype = share.dtype = z->o.reduce_dtype;
    }
    dsc_comm_request *req;
    dsc_status s = dsc_comm_ireduce_scatter(g->comm, &send, &share, counts, DSC_REDUCE_OP_AVG, &req);
    if (s) return dsc_error_wrap(s, "ZeRO: reduce-scatter of the gradient of %s", p->name);
    record(slot, req, *recv, dst, mine);
    *recv += mine;
    return NULL;
}

dsc_status zero_iall_gather_param(zero_optimizer *z, zero_group *g, int index, float *dst,
                                  dsc_comm_request **req) {
    *req = NULL;
    const dsc_param *p = dsc_params_at(z->o.params, index);
    int64_t n = dsc_param_numel(p), counts[g->size];
    piece_counts(g, n, counts);
    int64_t mine = counts[g->rank];
    float *share = (float *)g->values.data + (mine > 0 ? g->pieces[g->piece_of[index]].pos : 0);
    dsc_tensor send = flat_view(share, mine, z->device), recv = flat_view(dst, n, z->device);
    if (!g->comm || g->size == 1) return dsc_tensor_copy(&recv, &send);
    if (zero_gathers_narrow(z, g)) { /* gather_dtype: into dst's upper half, widened after the wait */
        dsc_dtype dt = z->o.gather_dtype;
        uint16_t *upper = (uint16_t *)(void *)dst + n;
        int64_t lo, hi;
        dsc_zero_param_piece(n, g->size, g->rank, &lo, &hi);
        dsc_precision_pack_to(upper + lo, share, mine, dt);
        send = dsc_tensor_view(upper + lo, dt, 1, &mine, z->device);
        recv = dsc_tensor_view(upper, dt, 1, &n, z->device);
    }
    dsc_status s = dsc_comm_iallgather(g->comm, &send, &recv, counts, req);
    if (s) return dsc_error_wrap(s, "ZeRO: all-gather of %s", p->name);
    return NULL;
}

void zero_widen_gathered(zero_optimizer *z, zero_group *g, int index, float *dst) {
    if (zero_gathers_narrow(z, g))
        dsc_precision_widen_upper(dst, dsc_param_numel(dsc_params_at(z->o.params, index)), z->o.gather_dtype);
}

dsc_status zero_all_gather_param(zero_optimizer *z, zero_group *g, int index, float *dst) {
    dsc_comm_request *req;
    DSC_TRY(zero_iall_gather_param(z, g, index, dst, &req));
    dsc_status s = dsc_comm_wait(&req);
    if (s) return dsc_error_wrap(s, "ZeRO: all-gather of %s", dsc_params_at(z->o.params, index)->name);
    zero_widen_gathered(z, g, index, dst);
    return NULL;
}
