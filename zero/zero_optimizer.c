/* The ZeRO optimizer (stages 1-3) behind dsc/optimizer.h's ops table: setup
 * of the partitioned buffers, gradient reduction, the sharded step and the
 * checkpoint view of the shards.
 *
 * Gradients reach this rank's range in one of two ways:
 *  - full gradients (stage 1; stage 2 under a pipeline): layers accumulate
 *    into the store's flat gradient buffers over the micro-batches; buckets
 *    of reduce_bucket_size elements are reduce-scattered once every parameter
 *    in them is final (grads_ready), or all in reduce_grads under a pipeline,
 *    so the pipeline's tied-gradient reduction comes first;
 *  - staged gradients (stage 2, stage 3): before a layer's backward its
 *    gradient views point into a zeroed staging buffer laid out as the
 *    layer's runs; after it the runs (stage 3: each parameter, split over the
 *    ranks) are reduce-scattered and added to the rank's gradients, every
 *    micro-batch (staged.c). No full gradient exists.
 * With overlap_comm the reductions are posted and waited in reduce_grads
 * (staged ones: before their staging slot is reused), progressing at every
 * hook; the results are bitwise those of blocking reduction.
 * The step then computes the global norm from the ranges (summed over each
 * group, then over expert-parallel and pipeline ranks), clips, updates each
 * (parameter, piece) of the range and, in stages 1 and 2, all-gathers the
 * updated ranges into every replica in allgather_bucket_size pieces.
 *
 * Not here: the partition rule and range collectives (partition.c), stage
 * 3's gathering (gather.c), memory formulas (memory.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/log.h"
#include "dsc/precision.h"
#include "zero/zero_internal.h"

static zero_optimizer *self_of(dsc_optimizer *opt) {
    return (zero_optimizer *)opt;
}

static float *flat_grads(zero_optimizer *z, dsc_param_group g) {
    dsc_tensor grads;
    dsc_params_flat(z->o.params, g, NULL, &grads);
    return grads.data;
}

static float *flat_values(zero_optimizer *z, dsc_param_group g) {
    dsc_tensor values;
    dsc_params_flat(z->o.params, g, &values, NULL);
    return values.data;
}

/* ---- full gradients: buckets --------------------------------------------------- */

/* A packed bucket's share back in f32, once its reduction completed. */
static dsc_status unpack_bucket(zero_optimizer *z, int k) {
    zero_bucket *b = &z->buckets[k];
    if (!b->packed) return NULL;
    zero_unpack_full_share(z, &z->groups[b->group], flat_grads(z, b->group) + b->begin, b->begin, b->end);
    b->packed = false;
    return NULL;
}

/* Reduces the bucket, or with overlap_comm posts its reduction (waited in reduce_grads). */
static dsc_status reduce_bucket(zero_optimizer *z, int k) {
    zero_bucket *b = &z->buckets[k];
    b->pending = -1;
    zero_group *g = &z->groups[b->group];
    float *src = flat_grads(z, b->group) + b->begin;
    DSC_TRY(zero_ireduce_scatter_full(z, g, src, b->begin, b->end, &z->reqs[k]));
    b->packed = dsc_precision_is_narrow(z->o.reduce_dtype) && g->comm && g->size > 1;
    if (z->o.overlap_comm) return NULL;
    DSC_TRY(dsc_comm_wait(&z->reqs[k]));
    return unpack_bucket(z, k);
}

/* Moves the reductions in flight on (overlap_comm): MPI progresses them only while they are tested. */
static dsc_status progress(zero_optimizer *z) {
    for (int k = 0; k < z->n_buckets; k++) {
        bool done;
        DSC_TRY(dsc_comm_test(&z->reqs[k], &done));
    }
    return NULL;
}

static void reset_batch(zero_optimizer *z) {
    memcpy(z->uses_left, z->uses, (size_t)z->n_params * sizeof *z->uses);
    for (int i = 0; i < z->n_buckets; i++)
        z->buckets[i].pending = z->buckets[i].params;
}

static dsc_status zero_grads_ready(dsc_optimizer *opt, dsc_layer *layer) {
    zero_optimizer *z = self_of(opt);
    if (!z->full_grads || z->deferred) return NULL;
    DSC_TRY(progress(z));
    int l = zero_layer_find(z, layer);
    DSC_CHECK(l >= 0, DSC_ERR_INVALID, "ZeRO: grads_ready for layer %s, which the optimizer was not given",
              layer->name);
    for (int j = 0; j < layer->n_params; j++) {
        int i = z->layers[l].param_index[j];
        if (--z->uses_left[i] != 0) continue;
        for (int k = z->first_bucket[i]; k <= z->last_bucket[i]; k++)
            if (--z->buckets[k].pending == 0) DSC_TRY(reduce_bucket(z, k));
    }
    return NULL;
}

static dsc_status zero_reduce_grads(dsc_optimizer *opt) {
    zero_optimizer *z = self_of(opt);
    for (int k = 0; k < z->n_buckets; k++)
        if (z->buckets[k].pending >= 0) DSC_TRY(reduce_bucket(z, k));
    /* together: every bucket in flight moves on while any is waited for */
    dsc_status s = dsc_comm_waitall(z->reqs, z->n_buckets);
    if (s) return dsc_error_wrap(s, "ZeRO: reducing gradients over %d buckets", z->n_buckets);
    for (int k = 0; k < z->n_buckets; k++)
        DSC_TRY(unpack_bucket(z, k));
    if (!z->full_grads) DSC_TRY(zero_staged_finish(z));
    reset_batch(z);
    return NULL;
}

static dsc_status make_buckets(zero_optimizer *z) {
    int64_t size = z->o.reduce_bucket_size;
    int count = 0;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        int64_t n = z->groups[g].numel, per = size > 0 ? size : (n > 0 ? n : 1);
        count += (int)((n + per - 1) / per);
    }
    z->buckets = calloc((size_t)(count > 0 ? count : 1), sizeof *z->buckets);
    z->reqs = calloc((size_t)(count > 0 ? count : 1), sizeof *z->reqs);
    DSC_CHECK(z->buckets && z->reqs, DSC_ERR_NOMEM, "ZeRO: %d buckets", count);
    int first[DSC_PARAM_GROUP_COUNT];
    int64_t per[DSC_PARAM_GROUP_COUNT];
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        int64_t n = z->groups[g].numel;
        per[g] = size > 0 ? size : (n > 0 ? n : 1);
        first[g] = z->n_buckets;
        for (int64_t b = 0; b < n; b += per[g])
            z->buckets[z->n_buckets++] =
                (zero_bucket){(dsc_param_group)g, b, b + per[g] < n ? b + per[g] : n, 0, 0, false};
    }
    for (int i = 0; i < z->n_params; i++) {
        const dsc_param *p = dsc_params_at(z->o.params, i);
        int64_t n = dsc_param_numel(p);
        z->first_bucket[i] = first[p->group] + (int)(p->offset / per[p->group]);
        z->last_bucket[i] = first[p->group] + (int)((p->offset + n - 1) / per[p->group]);
        for (int k = z->first_bucket[i]; k <= z->last_bucket[i]; k++)
            z->buckets[k].params++;
    }
    return NULL;
}

/* ---- staged gradients and stage 3 gathering: the layer hooks ----------------------- */

static dsc_status zero_before_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward) {
    zero_optimizer *z = self_of(opt);
    int l = zero_layer_find(z, layer);
    DSC_CHECK(l >= 0, DSC_ERR_INVALID, "ZeRO: layer %s was not given to the optimizer", layer->name);
    if (!z->full_grads) DSC_TRY(zero_staged_progress(z));
    if (z->z.stage == 3) DSC_TRY(zero_gather_before(z, l, backward));
    if (!backward || z->full_grads) return NULL;
    return zero_staged_begin(z, l);
}

static dsc_status zero_after_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward) {
    zero_optimizer *z = self_of(opt);
    int l = zero_layer_find(z, layer);
    DSC_CHECK(l >= 0, DSC_ERR_INVALID, "ZeRO: layer %s was not given to the optimizer", layer->name);
    /* what is in flight moved on while this layer computed */
    if (z->z.stage == 3) DSC_TRY(zero_gather_progress(z));
    if (!z->full_grads) DSC_TRY(zero_staged_progress(z));
    if (backward && !z->full_grads) {
        dsc_status s = zero_staged_post(z, l);
        if (s) return dsc_error_wrap(s, "after the backward of layer %s", layer->name);
    }
    if (z->z.stage == 3) DSC_TRY(zero_gather_release(z, l));
    return NULL;
}

/* Between kernels of a backward: what is in flight moves on (the same tests as at the layer hooks). */
static dsc_status zero_progress(dsc_optimizer *opt) {
    zero_optimizer *z = self_of(opt);
    if (z->z.stage == 3) DSC_TRY(zero_gather_progress(z));
    if (!z->full_grads) return zero_staged_progress(z);
    return z->deferred ? NULL : progress(z);
}

/* ---- the step -------------------------------------------------------------------------- */

static dsc_tensor piece_view(const dsc_tensor *range, const zero_piece *pc) {
    return dsc_tensor_view((float *)range->data + pc->pos, DSC_DTYPE_F32, 1, &pc->numel, range->device);
}

/* The piece's second state (it has one: pos2 >= 0). */
static dsc_tensor second_view(const zero_group *g, const zero_piece *pc) {
    return dsc_tensor_view((float *)g->state[1].data + pc->pos2, DSC_DTYPE_F32, 1, &pc->numel, g->state[1].device);
}

/* Sum of squares of the group's range (parameters counted in the norm), summed over the group. */
static dsc_status group_sum_squares(zero_optimizer *z, zero_group *g, double *out) {
    double sum = 0;
    for (int i = 0; i < g->n_pieces; i++) {
        const zero_piece *pc = &g->pieces[i];
        if (z->o.counts_in_norm && !z->o.counts_in_norm(pc->param, z->o.counts_in_norm_ctx)) continue;
        dsc_tensor grad = piece_view(&g->grads, pc);
        double s;
        DSC_TRY(dsc_kernel_sum_squares(&s, &grad));
        sum += s;
    }
    if (g->comm && g->size > 1) {
        float v = (float)sum;
        int64_t one = 1;
        dsc_tensor t = dsc_tensor_view(&v, DSC_DTYPE_F32, 1, &one, DSC_CPU);
        DSC_TRY(dsc_comm_allreduce(g->comm, &t, DSC_REDUCE_OP_SUM));
        sum = v;
    }
    *out = sum;
    return NULL;
}

static int store_index(zero_optimizer *z, const dsc_param *param) {
    for (int i = 0; i < z->n_params; i++)
        if (dsc_params_at(z->o.params, i) == param) return i;
    return 0; /* every piece is of a stored parameter */
}

/* Lamb's trust ratio is per parameter, and a parameter's pieces may sit on
 * several ranks: the pieces' sums of squares are added up per parameter over
 * the group before any piece is updated. */
static dsc_status lamb_group(zero_optimizer *z, zero_group *g, double lr) {
    float *sums = calloc((size_t)2 * (size_t)z->n_params + 1, sizeof *sums); /* (n_params, 2): ||p||^2, ||u||^2 */
    DSC_CHECK(sums, DSC_ERR_NOMEM, "ZeRO Lamb: norms of %d parameters", z->n_params);
    dsc_status s = NULL;
    for (int i = 0; i < g->n_pieces && !s; i++) {
        const zero_piece *pc = &g->pieces[i];
        dsc_tensor value = piece_view(&g->values, pc), grad = piece_view(&g->grads, pc);
        dsc_tensor m = piece_view(&g->state[0], pc), v = second_view(g, pc);
        double w_sq = 0, u_sq = 0;
        s = dsc_optim_lamb_direction(&z->o.hparams, &value, &grad, &m, &v,
                                     !(pc->param->flags & DSC_PARAM_NO_DECAY), &w_sq, &u_sq);
        int k = store_index(z, pc->param);
        sums[2 * k] += (float)w_sq;
        sums[2 * k + 1] += (float)u_sq;
    }
    if (!s && g->comm && g->size > 1) {
        int64_t n = 2 * (int64_t)z->n_params;
        dsc_tensor t = dsc_tensor_view(sums, DSC_DTYPE_F32, 1, &n, DSC_CPU);
        s = dsc_comm_allreduce(g->comm, &t, DSC_REDUCE_OP_SUM);
    }
    for (int i = 0; i < g->n_pieces && !s; i++) {
        const zero_piece *pc = &g->pieces[i];
        dsc_tensor value = piece_view(&g->values, pc), grad = piece_view(&g->grads, pc);
        int k = store_index(z, pc->param);
        s = dsc_optim_lamb_apply(&z->o.hparams, &value, &grad, (float)lr, z->step, sums[2 * k], sums[2 * k + 1]);
    }
    free(sums);
    return s;
}

/* Whether parameter i of the group has elements on several of its ranks. */
static bool spread_over_group(const zero_group *g, const dsc_param *p) {
    if (g->size == 1) return false;
    if (g->split) return true;
    int64_t n = dsc_param_numel(p);
    for (int r = 0; r < g->size; r++)
        if (zero_owned(g, r, p->offset, p->offset + n) == n) return false;
    return true;
}

/* Muon (the matrices) over the group: every rank visits the group's Muon
 * parameters in store order, each with its piece (possibly none) and the
 * group when the parameter is spread over it (a tensor-parallel slice is,
 * whatever the cut: each rank of the tensor group needs its whole slice);
 * in stage 3, where every matrix is, one rank orthogonalises each in turn.
 * The rest of the group's pieces take Adam. */
static dsc_status muon_group(zero_optimizer *z, zero_group *g, double lr) {
    const dsc_optim_hparams *hp = &z->o.hparams;
    for (int i = 0; i < g->n_pieces; i++) {
        const zero_piece *pc = &g->pieces[i];
        if (dsc_optim_uses_muon(pc->param)) continue;
        dsc_tensor value = piece_view(&g->values, pc), grad = piece_view(&g->grads, pc);
        dsc_tensor m = piece_view(&g->state[0], pc), v = second_view(g, pc);
        DSC_TRY(dsc_optim_muon_adam(hp, &value, &grad, &m, &v, (float)lr, !(pc->param->flags & DSC_PARAM_NO_DECAY),
                                    z->step));
    }
    int matrices = 0; /* stage 3: Newton-Schulz of the k-th on rank k mod size, which broadcasts it */
    for (int i = 0; i < z->n_params; i++) {
        dsc_param *p = dsc_params_at(z->o.params, i);
        if (p->group != g->id || !dsc_optim_uses_muon(p)) continue;
        zero_piece none = {p, 0, 0, 0, -1}, *pc = g->piece_of[i] >= 0 ? &g->pieces[g->piece_of[i]] : &none;
        dsc_tensor value = piece_view(&g->values, pc), grad = piece_view(&g->grads, pc);
        dsc_tensor m = piece_view(&g->state[0], pc);
        bool spread =
            spread_over_group(g, p) || (g->size > 1 && dsc_optim_muon_needs_tensor_group(p, z->o.tensor));
        int owner = g->split && g->size > 1 ? matrices++ % g->size : -1;
        int64_t counts[g->size], n = dsc_param_numel(p); /* both cuts: pieces back to back in rank order */
        for (int r = 0; r < g->size; r++) {
            int64_t lo, hi;
            if (g->split) dsc_zero_param_piece(n, g->size, r, &lo, &hi);
            counts[r] = g->split ? hi - lo : zero_owned(g, r, p->offset, p->offset + n);
        }
        dsc_muon_piece mp = {&value,      &grad, &m,    pc->param_offset, spread ? g->comm : NULL,
                             z->o.tensor, owner, counts};
        dsc_status s = dsc_optim_muon_piece(hp, p, &mp, (float)lr);
        if (s) return dsc_error_wrap(s, "step %lld: Muon update of %s", (long long)z->step, p->name);
    }
    return NULL;
}

static dsc_status update_group(zero_optimizer *z, zero_group *g, double lr, double coef) {
    if (coef < 1.0 && g->len > 0) DSC_TRY(dsc_kernel_scale(&g->grads, (float)coef));
    dsc_optimizer_type type = z->o.hparams.type;
    if (type == DSC_OPTIMIZER_TYPE_LAMB) {
        dsc_status s = lamb_group(z, g, lr);
        if (s) return dsc_error_wrap(s, "step %lld: Lamb update", (long long)z->step);
    }
    if (type == DSC_OPTIMIZER_TYPE_MUON) DSC_TRY(muon_group(z, g, lr));
    for (int i = 0; i < g->n_pieces && type != DSC_OPTIMIZER_TYPE_LAMB && type != DSC_OPTIMIZER_TYPE_MUON; i++) {
        const zero_piece *pc = &g->pieces[i];
        dsc_tensor value = piece_view(&g->values, pc), grad = piece_view(&g->grads, pc);
        dsc_tensor s0 = piece_view(&g->state[0], pc);
        dsc_tensor s1 = pc->pos2 >= 0 && z->n_state_kinds > 1 ? second_view(g, pc) : s0;
        dsc_status s = dsc_optim_update(&z->o.hparams, &value, &grad, &s0, &s1, (float)lr,
                                        !(pc->param->flags & DSC_PARAM_NO_DECAY), z->step);
        if (s)
            return dsc_error_wrap(s, "step %lld: updating %s [%lld, %lld)", (long long)z->step, pc->param->name,
                                  (long long)pc->param_offset, (long long)(pc->param_offset + pc->numel));
    }
    if (z->z.stage == 3) return NULL; /* the range is the only copy */
    int64_t per = zero_gather_chunk(z, g);
    float *values = flat_values(z, g->id);
    for (int64_t a = 0; a < g->numel; a += per) {
        int64_t b = a + per < g->numel ? a + per : g->numel;
        DSC_TRY(zero_all_gather(z, g, values + a, a, b));
    }
    return NULL;
}

static dsc_status zero_step(dsc_optimizer *opt, double lr, dsc_optim_stats *stats) {
    zero_optimizer *z = self_of(opt);
    double sq[DSC_PARAM_GROUP_COUNT];
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
        DSC_TRY(group_sum_squares(z, &z->groups[g], &sq[g]));
    double norm;
    DSC_TRY(
        dsc_optim_global_norm(sq[DSC_PARAM_GROUP_DENSE], sq[DSC_PARAM_GROUP_EXPERT], z->o.ep, z->o.pipe, &norm));
    DSC_CHECK(isfinite(norm), DSC_ERR_NUMERIC,
              "step %lld: the global gradient norm is %g; stopping with the parameters of step %lld",
              (long long)(z->step + 1), norm, (long long)z->step);
    double coef = dsc_optim_clip_coef(norm, z->o.hparams.clip_norm);
    z->step++;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
        DSC_TRY(update_group(z, &z->groups[g], lr, coef));
    if (z->persistent) DSC_TRY(zero_persist_refresh(z)); /* stage 3: whole values of the updated pieces */
    if (z->full_grads) {
        DSC_TRY(dsc_params_zero_grads(z->o.params));
    } else {
        for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
            if (z->groups[g].len > 0) DSC_TRY(dsc_kernel_zero(&z->groups[g].grads));
    }
    *stats = (dsc_optim_stats){norm, coef, z->step};
    return NULL;
}

/* ---- checkpoint view: one entry per (state kind, parameter, piece), then "step" ----------- */

static int pieces_total(const zero_optimizer *z) {
    int n = 0;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
        n += z->groups[g].n_pieces;
    return n;
}

static int seconds_total(const zero_optimizer *z) {
    return z->n_state_kinds > 1 ? z->groups[0].n_second + z->groups[1].n_second : 0;
}

/* The i-th piece over both groups; with `second`, the i-th of those with a second state. */
static const zero_piece *nth_piece(zero_optimizer *z, int i, bool second, zero_group **g) {
    for (int gi = 0; gi < DSC_PARAM_GROUP_COUNT; gi++) {
        *g = &z->groups[gi];
        for (int k = 0; k < (*g)->n_pieces; k++)
            if ((!second || (*g)->pieces[k].pos2 >= 0) && i-- == 0) return &(*g)->pieces[k];
    }
    return NULL; /* index checked by the caller's count */
}

/* Entries: every piece's first state, the second state of the pieces that
 * have one, "step"; stage 3 then lists its value pieces too: they are the
 * only copy of the parameters, so checkpoints must read and restore them
 * here. */
static int zero_state_count(const dsc_optimizer *opt) {
    const zero_optimizer *z = (const zero_optimizer *)opt;
    return (1 + (z->z.stage == 3)) * pieces_total(z) + seconds_total(z) + 1;
}

static void zero_state_at(dsc_optimizer *opt, int index, dsc_optim_state *out) {
    zero_optimizer *z = self_of(opt);
    memset(out, 0, sizeof *out);
    int per_kind = pieces_total(z), states = per_kind + seconds_total(z);
    if (index == states) {
        int64_t one = 1;
        snprintf(out->name, sizeof out->name, "step");
        out->local = dsc_tensor_view(&z->step, DSC_DTYPE_I64, 1, &one, DSC_CPU);
        return;
    }
    bool value = index > states;
    int kind = !value && index >= per_kind;
    int i = value ? index - states - 1 : index - kind * per_kind;
    zero_group *g;
    const zero_piece *pc = nth_piece(z, i, kind == 1, &g);
    if (!pc) return;
    const char *kind_name = value ? "value" : dsc_optim_state_name(z->o.hparams.type, kind);
    snprintf(out->name, sizeof out->name, "%s/%s", kind_name, pc->param->name);
    out->param = pc->param;
    out->offset = pc->param_offset;
    out->local = value ? piece_view(&g->values, pc) : kind ? second_view(g, pc) : piece_view(&g->state[0], pc);
    out->is_value = value;
    /* A checkpoint restore writes the pieces: persistent whole values are gathered again before use. */
    if (value && z->persistent) z->persist_stale = true;
}

static void zero_destroy(dsc_optimizer *opt) {
    zero_optimizer *z = self_of(opt);
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
        zero_group_free(&z->groups[g]);
    zero_layers_free(z);
    zero_staged_free(z);
    dsc_tensor_free(&z->pool);
    dsc_tensor_free(&z->persist);
    dsc_tensor_free(&z->gather16);
    free(z->persistent);
    free(z->persist_at);
    free(z->buckets);
    free(z->reqs);
    free(z->uses);
    free(z->uses_left);
    free(z->first_bucket);
    free(z->last_bucket);
    free(z);
}

static void zero_set_betas(dsc_optimizer *opt, float beta1, float beta2) {
    self_of(opt)->o.hparams.beta1 = beta1;
    self_of(opt)->o.hparams.beta2 = beta2;
}

static const dsc_optimizer_ops zero_ops[4] = {
    [1] = {"zero1", NULL, NULL, zero_grads_ready, zero_reduce_grads, zero_step, zero_state_count, zero_state_at,
           zero_destroy, zero_set_betas, .progress = zero_progress},
    [2] = {"zero2", zero_before_layer, zero_after_layer, zero_grads_ready, zero_reduce_grads, zero_step,
           zero_state_count, zero_state_at, zero_destroy, zero_set_betas, .progress = zero_progress},
    [3] = {"zero3", zero_before_layer, zero_after_layer, zero_grads_ready, zero_reduce_grads, zero_step,
           zero_state_count, zero_state_at, zero_destroy, zero_set_betas, .progress = zero_progress},
};

/* ---- setup ------------------------------------------------------------------------------ */

static dsc_status alloc_range(dsc_tensor *t, const zero_group *g, dsc_device dev, dsc_mem_category cat) {
    int64_t n = g->len;
    return dsc_tensor_alloc(t, DSC_DTYPE_F32, 1, &n, dev, cat);
}

static dsc_tensor range_view(float *flat, const zero_group *g, dsc_device dev) {
    int64_t n = g->end - g->begin;
    return dsc_tensor_view(flat ? flat + g->begin : NULL, DSC_DTYPE_F32, 1, &n, dev);
}

/* The rank's ranges of values and gradients: views of the store's buffers,
 * or own buffers (stage 2 gradients, stage 3 values too) after which the
 * store's full buffers are released. */
/* Where each piece's second state sits: at its range position, or for Muon
 * packed over the pieces outside its matrices (which keep a momentum only). */
static void place_seconds(zero_optimizer *z, zero_group *g) {
    g->len2 = 0;
    g->n_second = 0;
    for (int i = 0; i < g->n_pieces; i++) {
        zero_piece *pc = &g->pieces[i];
        if (dsc_optim_param_state_kinds(z->o.hparams.type, pc->param) < 2) {
            pc->pos2 = -1;
            continue;
        }
        g->n_second++;
        if (z->o.hparams.type == DSC_OPTIMIZER_TYPE_MUON) {
            pc->pos2 = g->len2;
            g->len2 += pc->numel;
        } else {
            pc->pos2 = pc->pos;
        }
    }
    if (z->o.hparams.type != DSC_OPTIMIZER_TYPE_MUON) g->len2 = g->len;
}

static dsc_status setup_ranges(zero_optimizer *z, dsc_device dev) {
    for (int gi = 0; gi < DSC_PARAM_GROUP_COUNT; gi++) {
        zero_group *g = &z->groups[gi];
        place_seconds(z, g);
        for (int k = 0; k < z->n_state_kinds; k++) {
            int64_t n = k == 0 ? g->len : g->len2;
            DSC_TRY(dsc_tensor_alloc(&g->state[k], DSC_DTYPE_F32, 1, &n, dev, DSC_MEM_OPTIM));
        }
        if (z->z.stage == 3) {
            DSC_TRY(alloc_range(&g->values, g, dev, DSC_MEM_PARAMS));
            for (int i = 0; i < g->n_pieces; i++) {
                const zero_piece *pc = &g->pieces[i];
                dsc_tensor dst = piece_view(&g->values, pc);
                dsc_tensor src = dsc_tensor_view((float *)pc->param->value.data + pc->param_offset, DSC_DTYPE_F32,
                                                 1, &pc->numel, dev);
                DSC_TRY(dsc_tensor_copy(&dst, &src));
            }
        } else {
            g->values = range_view(flat_values(z, g->id), g, dev);
        }
        if (z->full_grads)
            g->grads = range_view(flat_grads(z, g->id), g, dev);
        else
            DSC_TRY(alloc_range(&g->grads, g, dev, DSC_MEM_GRADS));
        if (g->numel > 0 && (z->z.stage == 3 || !z->full_grads))
            DSC_TRY(dsc_params_release(z->o.params, g->id, z->z.stage == 3, !z->full_grads));
    }
    return NULL;
}

/* Stages 1 and 2 gathering in gather_dtype: the 2-byte buffer of their largest chunk. */
static dsc_status gather16_init(zero_optimizer *z) {
    int64_t most = 0;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        const zero_group *zg = &z->groups[g];
        int64_t chunk = zero_gather_chunk(z, zg), n = chunk < zg->numel ? chunk : zg->numel;
        if (z->z.stage < 3 && zero_gathers_narrow(z, zg) && n > most) most = n;
    }
    return most > 0 ? dsc_tensor_alloc(&z->gather16, z->o.gather_dtype, 1, &most, z->device, DSC_MEM_COMM) : NULL;
}

static dsc_status setup(zero_optimizer *z) {
    z->n_params = dsc_params_count(z->o.params);
    DSC_CHECK(z->n_params > 0, DSC_ERR_INVALID, "ZeRO: the parameter store is empty");
    dsc_device dev = z->device = dsc_params_at(z->o.params, 0)->value.device;
    DSC_CHECK(!dsc_precision_is_narrow(z->o.reduce_dtype) || dev.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
              "ZeRO: reducing gradients in %s is implemented for host memory only",
              dsc_dtype_name(z->o.reduce_dtype));
    DSC_CHECK(!dsc_precision_is_narrow(z->o.gather_dtype) || dev.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
              "ZeRO: all-gathering parameters in %s is implemented for host memory only",
              dsc_dtype_name(z->o.gather_dtype));
    size_t n = (size_t)z->n_params;
    z->uses = calloc(n, sizeof *z->uses);
    z->uses_left = calloc(n, sizeof *z->uses_left);
    z->first_bucket = calloc(n, sizeof *z->first_bucket);
    z->last_bucket = calloc(n, sizeof *z->last_bucket);
    DSC_CHECK(z->uses && z->uses_left && z->first_bucket && z->last_bucket, DSC_ERR_NOMEM,
              "ZeRO: bookkeeping for %d parameters", z->n_params);
    bool split = z->z.stage == 3;
    DSC_TRY(zero_group_init(z, &z->groups[DSC_PARAM_GROUP_DENSE], DSC_PARAM_GROUP_DENSE, z->o.dp, split));
    DSC_TRY(zero_group_init(z, &z->groups[DSC_PARAM_GROUP_EXPERT], DSC_PARAM_GROUP_EXPERT, z->o.expert_dp, split));
    DSC_TRY(zero_persist_init(z)); /* before the layers' pool layouts, which leave persistent parameters out */
    DSC_TRY(zero_layers_init(z));
    for (int l = 0; l < z->n_layers; l++)
        for (int j = 0; j < z->layers[l].layer->n_params; j++)
            z->uses[z->layers[l].param_index[j]]++;
    if (z->full_grads) DSC_TRY(make_buckets(z));
    reset_batch(z);
    z->n_state_kinds = dsc_optim_state_kinds(z->o.hparams.type);
    if (!z->full_grads) DSC_TRY(zero_staged_init(z));
    if (z->z.stage == 3) DSC_TRY(zero_pool_init(z));
    DSC_TRY(gather16_init(z));
    return setup_ranges(z, dev);
}

void dsc_zero_options_from_config(const dsc_config *cfg, dsc_zero_options *zo) {
    const dsc_config_zero *c = &cfg->zero_optimization;
    *zo = (dsc_zero_options){
        .stage = c->stage,
        .pipeline_stages = cfg->pipeline.stages,
        .allgather_bucket_size = c->allgather_bucket_size,
        .stage3_max_live_parameters = c->stage3_max_live_parameters,
        .stage3_prefetch_bucket_size = c->stage3_prefetch_bucket_size,
        .stage3_param_persistence_threshold = c->stage3_param_persistence_threshold,
    };
}

dsc_status dsc_zero_check_pipeline(int stage, int pipeline_stages) {
    DSC_CHECK(stage >= 0 && stage <= 3, DSC_ERR_INVALID, "ZeRO: zero_optimization.stage %d is not 0, 1, 2 or 3",
              stage);
    DSC_CHECK(stage < 3 || pipeline_stages <= 1, DSC_ERR_UNSUPPORTED,
              "zero_optimization.stage 3 with pipeline.stages = %d is not supported: stage 3 keeps only a shard "
              "of each gradient, so the pipeline's tied-weight reduction (ReduceTiedGrads sums the full gradient "
              "of weights shared by the first and last stage) has nothing to sum, and it would all-gather every "
              "layer's parameters for each of the step's micro-batches in forward and again in backward; use "
              "zero_optimization.stage 2 (gradients reduce-scattered once per step) or 1",
              pipeline_stages);
    return NULL;
}

dsc_status dsc_zero_create(const dsc_optimizer_options *opts, const dsc_zero_options *zo, dsc_optimizer **out) {
    *out = NULL;
    DSC_TRY(dsc_zero_check_pipeline(zo->stage, zo->pipeline_stages));
    if (zo->stage == 0) return dsc_optimizer_create_plain(opts, out);
    DSC_CHECK(opts->params, DSC_ERR_INVALID, "ZeRO: no parameter store");
    zero_optimizer *z = calloc(1, sizeof *z);
    DSC_CHECK(z, DSC_ERR_NOMEM, "ZeRO: out of memory");
    z->base.ops = &zero_ops[zo->stage];
    z->o = *opts;
    z->z = *zo;
    z->deferred = zo->pipeline_stages > 1;
    z->full_grads = zo->stage == 1 || (zo->stage == 2 && z->deferred);
    dsc_status s = setup(z);
    if (s) {
        zero_destroy(&z->base);
        return dsc_error_wrap(s, "creating the ZeRO stage %d optimizer", zo->stage);
    }
    const zero_group *d = &z->groups[DSC_PARAM_GROUP_DENSE];
    DSC_LOG_DEBUG(
        "ZeRO stage %d: dense range [%lld, %lld) of %lld over %d ranks, %d buckets, staging %lld, pool %lld",
        zo->stage, (long long)d->begin, (long long)d->end, (long long)d->numel, d->size, z->n_buckets,
        (long long)dsc_tensor_numel(&z->slots[0].staging), (long long)dsc_tensor_numel(&z->pool));
    *out = &z->base;
    return NULL;
}

/* Mixed precision (dsc/precision.h) wraps the sharded optimizer: its master
 * is this rank's range of each group (stage 3: the optimizer's own f32
 * shards), the gradients those the step reads. */
dsc_status dsc_zero_make_optimizer(const dsc_optimizer_options *opts, const dsc_config *cfg, dsc_optimizer **out) {
    dsc_zero_options zo;
    dsc_zero_options_from_config(cfg, &zo);
    dsc_optimizer_options o = *opts;
    o.reduce_dtype = dsc_precision_comm_dtype(cfg);
    o.gather_dtype = dsc_precision_param_dtype(cfg);
    DSC_TRY(dsc_zero_create(&o, &zo, out));
    if (zo.stage == 0) return dsc_precision_maybe_wrap(cfg, &o, NULL, out);
    const zero_optimizer *z = (const zero_optimizer *)*out;
    dsc_precision_range ranges[DSC_PARAM_GROUP_COUNT];
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) /* stage 3: its f32 value shards are the master */
        ranges[g] = (dsc_precision_range){zo.stage == 3 ? 0 : z->groups[g].begin,
                                          zo.stage == 3 ? 0 : z->groups[g].end, z->groups[g].grads};
    return dsc_precision_maybe_wrap(cfg, &o, ranges, out);
}
