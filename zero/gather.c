/* Stage 3's gathered parameters: a bounded pool holding the full values of
 * the layers that are live (the one being called, and the next one when it
 * was prefetched), all-gathered parameter by parameter from every rank's
 * piece (stage 3 splits each parameter over the ranks, so every gather is
 * balanced).
 *
 * Before a layer's call its parameters are gathered (unless prefetched) and
 * their value views pointed into the pool; the next layer in the direction of
 * travel (forward: the following one, backward: the preceding one) is
 * gathered too when its size is within stage3_prefetch_bucket_size and the
 * pool has room. After the call the layer is released. A prefetch that is
 * never used (another order than predicted) is evicted when space runs out,
 * so any call order works; every rank makes the same decisions, so the
 * collectives match. The pool holds at most max(stage3_max_live_parameters,
 * largest layer) elements, and never more than two layers.
 *
 * Persistent parameters (at most stage3_param_persistence_threshold
 * elements, as DeepSpeed's) take no room in the pool: their whole values live
 * in their own buffer on every rank, are never released, and are all-gathered
 * from the ranks' pieces once per step (after the update) instead of before
 * every call; a layer whose parameters are all persistent gathers nothing.
 * Their gradients and optimizer state stay partitioned like any other.
 *
 * A prefetch runs ahead: its all-gathers are posted (non-blocking) before the
 * current layer's call, tested at every layer hook while that call computes,
 * and waited for only when the prefetched layer is called (or evicted).
 * Gathers that are not prefetches block. Either way a gather copies the same
 * pieces, so the values are bitwise the same.
 *
 * Not here: gradients (zero_optimizer.c reduce-scatters the staging buffer
 * after backward). */
#include <stdlib.h>

#include "zero/zero_internal.h"

static int64_t aligned(int64_t n) {
    return (n + ZERO_ALIGN_ELEMS - 1) / ZERO_ALIGN_ELEMS * ZERO_ALIGN_ELEMS;
}

dsc_status zero_persist_init(zero_optimizer *z) {
    int64_t threshold = z->z.stage3_param_persistence_threshold;
    if (z->z.stage != 3 || threshold <= 0) return NULL;
    size_t n = (size_t)z->n_params;
    z->persistent = calloc(n, sizeof *z->persistent);
    z->persist_at = calloc(n, sizeof *z->persist_at);
    DSC_CHECK(z->persistent && z->persist_at, DSC_ERR_NOMEM, "ZeRO: persistence of %d parameters", z->n_params);
    int64_t total = 0;
    for (int i = 0; i < z->n_params; i++) {
        int64_t numel = dsc_param_numel(dsc_params_at(z->o.params, i));
        if (numel == 0 || numel > threshold) continue;
        z->persistent[i] = true;
        z->persist_at[i] = total;
        total += aligned(numel);
    }
    if (total == 0) return NULL;
    DSC_TRY(dsc_tensor_alloc(&z->persist, DSC_DTYPE_F32, 1, &total, z->device, DSC_MEM_PARAMS));
    for (int i = 0; i < z->n_params; i++) {
        if (!z->persistent[i]) continue;
        dsc_param *p = dsc_params_at(z->o.params, i);
        int64_t numel = dsc_param_numel(p);
        dsc_tensor dst =
            dsc_tensor_view((float *)z->persist.data + z->persist_at[i], DSC_DTYPE_F32, 1, &numel, z->device);
        DSC_TRY(dsc_tensor_copy(&dst, &p->value));
    }
    return NULL;
}

dsc_status zero_persist_refresh(zero_optimizer *z) {
    for (int i = 0; z->persistent && i < z->n_params; i++) {
        if (!z->persistent[i]) continue;
        zero_group *g = &z->groups[dsc_params_at(z->o.params, i)->group];
        float *dst = (float *)z->persist.data + z->persist_at[i];
        DSC_TRY(zero_all_gather_param(z, g, i, dst));
    }
    z->persist_stale = false;
    return NULL;
}

dsc_status zero_pool_init(zero_optimizer *z) {
    int64_t largest = 0, second = 0;
    for (int l = 0; l < z->n_layers; l++) {
        int64_t n = z->layers[l].pool_numel;
        if (n > largest) {
            second = largest;
            largest = n;
        } else if (n > second) {
            second = n;
        }
    }
    int64_t cap = largest;
    if (z->z.stage3_prefetch_bucket_size > 0 && z->z.stage3_max_live_parameters > largest) {
        int64_t room = z->z.stage3_max_live_parameters - largest;
        cap += room < second ? room : second;
    }
    return dsc_tensor_alloc(&z->pool, DSC_DTYPE_F32, 1, &cap, z->device, DSC_MEM_COMM);
}

/* First fit among the live layers' segments; -1 when nothing fits. */
static int64_t pool_find(const zero_optimizer *z, int64_t n) {
    int64_t cap = dsc_tensor_numel(&z->pool);
    for (int c = -1; c < z->n_layers; c++) {
        if (c >= 0 && !z->layers[c].live) continue;
        int64_t at = c < 0 ? 0 : z->layers[c].pool_at + z->layers[c].pool_numel;
        bool fits = at + n <= cap;
        for (int l = 0; l < z->n_layers && fits; l++) {
            const zero_layer *o = &z->layers[l];
            if (o->live && at < o->pool_at + o->pool_numel && o->pool_at < at + n) fits = false;
        }
        if (fits) return at;
    }
    return -1;
}

/* Waits for the layer's prefetch, if one is in flight, and widens what arrived in gather_dtype. */
static dsc_status settle(zero_optimizer *z, zero_layer *zl) {
    dsc_status s = dsc_comm_waitall(zl->gathers, zl->layer->n_params);
    if (s) return dsc_error_wrap(s, "prefetching the parameters of layer %s", zl->layer->name);
    for (int j = 0; zl->unwidened && j < zl->layer->n_params; j++)
        if (zl->pool_param_at[j] >= 0)
            zero_widen_gathered(z, &z->groups[zl->layer->params[j]->group], zl->param_index[j],
                                (float *)z->pool.data + zl->pool_at + zl->pool_param_at[j]);
    zl->unwidened = false;
    return NULL;
}

dsc_status zero_gather_progress(zero_optimizer *z) {
    for (int l = 0; l < z->n_layers; l++)
        for (int j = 0; z->layers[l].live && j < z->layers[l].layer->n_params; j++) {
            bool done;
            DSC_TRY(dsc_comm_test(&z->layers[l].gathers[j], &done));
        }
    return NULL;
}

dsc_status zero_gather_release(zero_optimizer *z, int layer) {
    zero_layer *zl = &z->layers[layer];
    if (!zl->live) return NULL;
    DSC_TRY(settle(z, zl)); /* its pool space must not be reused under a gather in flight */
    zl->live = false;
    for (int j = 0; j < zl->layer->n_params; j++)
        if (zl->pool_param_at[j] >= 0) zl->layer->params[j]->value.data = NULL;
    return NULL;
}

/* All-gathers the layer's partitioned parameters into the pool at `at`;
 * `ahead` (a prefetch) only posts them. */
static dsc_status gather(zero_optimizer *z, int layer, int64_t at, bool ahead) {
    zero_layer *zl = &z->layers[layer];
    for (int j = 0; j < zl->layer->n_params; j++) {
        if (zl->pool_param_at[j] < 0) continue; /* persistent */
        zero_group *g = &z->groups[zl->layer->params[j]->group];
        float *dst = (float *)z->pool.data + at + zl->pool_param_at[j];
        dsc_status s = ahead ? zero_iall_gather_param(z, g, zl->param_index[j], dst, &zl->gathers[j])
                             : zero_all_gather_param(z, g, zl->param_index[j], dst);
        if (s) return dsc_error_wrap(s, "gathering the parameters of layer %s", zl->layer->name);
    }
    zl->live = true;
    zl->pool_at = at;
    zl->unwidened = ahead;
    return NULL;
}

/* Gathers `layer` unless live, evicting other live layers (never `keep`) when the pool is full. */
static dsc_status make_live(zero_optimizer *z, int layer, int keep) {
    zero_layer *zl = &z->layers[layer];
    if (zl->live) return settle(z, zl); /* prefetched */
    int64_t at = pool_find(z, zl->pool_numel);
    for (int l = 0; l < z->n_layers && at < 0; l++)
        if (l != keep && l != layer && z->layers[l].live) {
            DSC_TRY(zero_gather_release(z, l));
            at = pool_find(z, zl->pool_numel);
        }
    DSC_ASSERT(at >= 0); /* the pool holds the largest layer */
    return gather(z, layer, at, false);
}

dsc_status zero_gather_before(zero_optimizer *z, int layer, bool backward) {
    zero_layer *zl = &z->layers[layer];
    DSC_TRY(zero_gather_progress(z));
    if (z->persist_stale) DSC_TRY(zero_persist_refresh(z));
    for (int j = 0; j < zl->layer->n_params; j++) {
        int i = zl->param_index[j];
        if (zl->pool_param_at[j] < 0)
            zl->layer->params[j]->value.data = (float *)z->persist.data + z->persist_at[i];
    }
    if (zl->pool_numel == 0) return NULL;
    DSC_TRY(make_live(z, layer, layer));
    for (int j = 0; j < zl->layer->n_params; j++)
        if (zl->pool_param_at[j] >= 0)
            zl->layer->params[j]->value.data = (float *)z->pool.data + zl->pool_at + zl->pool_param_at[j];
    int next = backward ? layer - 1 : layer + 1;
    if (next < 0 || next >= z->n_layers) return NULL;
    zero_layer *zn = &z->layers[next];
    if (zn->live || zn->pool_numel == 0 || zn->pool_numel > z->z.stage3_prefetch_bucket_size) return NULL;
    int64_t at = pool_find(z, zn->pool_numel);
    return at >= 0 ? gather(z, next, at, true) : NULL;
}
