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
 * With blocking collectives a prefetch issues the next gather early rather
 * than overlapping it; the bookkeeping is what a non-blocking all-gather
 * would need.
 *
 * Not here: gradients (zero_optimizer.c reduce-scatters the staging buffer
 * after backward). */
#include <stdlib.h>

#include "zero/zero_internal.h"

dsc_status zero_pool_init(zero_optimizer *z) {
    int64_t largest = 0, second = 0;
    for (int l = 0; l < z->n_layers; l++) {
        int64_t n = z->layers[l].numel;
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
        int64_t at = c < 0 ? 0 : z->layers[c].pool_at + z->layers[c].numel;
        bool fits = at + n <= cap;
        for (int l = 0; l < z->n_layers && fits; l++) {
            const zero_layer *o = &z->layers[l];
            if (o->live && at < o->pool_at + o->numel && o->pool_at < at + n) fits = false;
        }
        if (fits) return at;
    }
    return -1;
}

void zero_gather_release(zero_optimizer *z, int layer) {
    zero_layer *zl = &z->layers[layer];
    if (!zl->live) return;
    zl->live = false;
    for (int j = 0; j < zl->layer->n_params; j++)
        zl->layer->params[j]->value.data = NULL;
}

static dsc_status gather(zero_optimizer *z, int layer, int64_t at) {
    zero_layer *zl = &z->layers[layer];
    for (int j = 0; j < zl->layer->n_params; j++) {
        zero_group *g = &z->groups[zl->layer->params[j]->group];
        float *dst = (float *)z->pool.data + at + zl->param_at[j];
        dsc_status s = zero_all_gather_param(z, g, zl->param_index[j], dst);
        if (s) return dsc_error_wrap(s, "gathering the parameters of layer %s", zl->layer->name);
    }
    zl->live = true;
    zl->pool_at = at;
    return NULL;
}

/* Gathers `layer` unless live, evicting other live layers (never `keep`) when the pool is full. */
static dsc_status make_live(zero_optimizer *z, int layer, int keep) {
    zero_layer *zl = &z->layers[layer];
    if (zl->live) return NULL;
    int64_t at = pool_find(z, zl->numel);
    for (int l = 0; l < z->n_layers && at < 0; l++)
        if (l != keep && l != layer && z->layers[l].live) {
            zero_gather_release(z, l);
            at = pool_find(z, zl->numel);
        }
    DSC_ASSERT(at >= 0); /* the pool holds the largest layer */
    return gather(z, layer, at);
}

dsc_status zero_gather_before(zero_optimizer *z, int layer, bool backward) {
    zero_layer *zl = &z->layers[layer];
    if (zl->numel == 0) return NULL;
    DSC_TRY(make_live(z, layer, layer));
    for (int j = 0; j < zl->layer->n_params; j++)
        zl->layer->params[j]->value.data = (float *)z->pool.data + zl->pool_at + zl->param_at[j];
    int next = backward ? layer - 1 : layer + 1;
    if (next < 0 || next >= z->n_layers) return NULL;
    zero_layer *zn = &z->layers[next];
    if (zn->live || zn->numel == 0 || zn->numel > z->z.stage3_prefetch_bucket_size) return NULL;
    int64_t at = pool_find(z, zn->numel);
    return at >= 0 ? gather(z, next, at) : NULL;
}
