/* The parameter store: global names and shapes, one flat value buffer and one
 * flat gradient buffer per group, and layout-independent initialisation.
 *
 * Each parameter's initial values come from an RNG stream seeded by (store
 * seed, parameter name) only, so a model cut into any number of stages or
 * shards starts from the same weights. The store does not know layers,
 * optimizers or communication; those read the flat views and offsets. */
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/nn.h"

/* Parameters start at multiples of this many elements (256 bytes). */
#define PARAM_ALIGN_ELEMS 64

struct dsc_param_store {
    dsc_device device;
    uint64_t seed;
    dsc_param **params; /* [count] individually allocated, so pointers stay valid as the table grows */
    int count, cap;
    bool finalized;
    int64_t numel[DSC_PARAM_GROUP_COUNT];
    dsc_tensor values[DSC_PARAM_GROUP_COUNT]; /* (numel) f32 */
    dsc_tensor grads[DSC_PARAM_GROUP_COUNT];  /* (numel) f32 */
};

dsc_status dsc_params_create(dsc_param_store **out, dsc_device device, uint64_t seed) {
    *out = calloc(1, sizeof **out);
    DSC_CHECK(*out, DSC_ERR_NOMEM, "parameter store");
    (*out)->device = device;
    (*out)->seed = seed;
    return NULL;
}

void dsc_params_destroy(dsc_param_store *store) {
    if (!store) return;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        dsc_tensor_free(&store->values[g]);
        dsc_tensor_free(&store->grads[g]);
    }
    for (int i = 0; i < store->count; i++)
        free(store->params[i]);
    free(store->params);
    free(store);
}

int64_t dsc_param_numel(const dsc_param *param) {
    int64_t n = 1;
    for (int i = 0; i < param->value.ndim; i++)
        n *= param->value.shape[i];
    return n;
}

static bool same_shape(const dsc_param *p, int ndim, const int64_t *shape) {
    if (p->value.ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (p->value.shape[i] != shape[i]) return false;
    return true;
}

dsc_status dsc_params_declare(dsc_param_store *store, const char *name, int ndim, const int64_t *shape,
                              uint32_t flags, dsc_param_init init, float init_std, dsc_param **out) {
    *out = NULL;
    DSC_CHECK(name && name[0] && strlen(name) < DSC_PARAM_NAME_MAX, DSC_ERR_INVALID,
              "parameter name \"%s\" is empty or longer than %d characters", name ? name : "",
              DSC_PARAM_NAME_MAX - 1);
    DSC_CHECK(ndim >= 1 && ndim <= DSC_MAX_DIMS, DSC_ERR_INVALID, "parameter %s: rank %d outside [1, %d]", name,
              ndim, DSC_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        DSC_CHECK(shape[i] >= 1, DSC_ERR_INVALID, "parameter %s: dimension %d is %lld", name, i,
                  (long long)shape[i]);
    dsc_param_group group = (flags & DSC_PARAM_EXPERT) ? DSC_PARAM_GROUP_EXPERT : DSC_PARAM_GROUP_DENSE;
    dsc_param *existing = dsc_params_find(store, name);
    if (existing) {
        if (!same_shape(existing, ndim, shape)) {
            char have[96], want[96];
            dsc_tensor requested = dsc_tensor_view(NULL, DSC_DTYPE_F32, ndim, shape, store->device);
            return dsc_error(DSC_ERR_INVALID, "parameter %s declared with shape %s, but it exists with shape %s",
                             name, dsc_tensor_describe(&requested, want, sizeof want),
                             dsc_tensor_describe(&existing->value, have, sizeof have));
        }
        DSC_CHECK(existing->group == group, DSC_ERR_INVALID,
                  "parameter %s declared both as an expert and as a dense parameter", name);
        existing->flags |= flags;
        *out = existing;
        return NULL;
    }
    DSC_CHECK(!store->finalized, DSC_ERR_INVALID, "parameter %s declared after dsc_params_finalize", name);
    if (store->count == store->cap) {
        int cap = store->cap ? 2 * store->cap : 64;
        dsc_param **grown = realloc(store->params, (size_t)cap * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "parameter table of %d entries", cap);
        store->params = grown;
        store->cap = cap;
    }
    dsc_param *p = calloc(1, sizeof *p);
    DSC_CHECK(p, DSC_ERR_NOMEM, "parameter %s", name);
    strcpy(p->name, name);
    p->value = dsc_tensor_view(NULL, DSC_DTYPE_F32, ndim, shape, store->device);
    p->grad = p->value;
    p->flags = flags;
    p->group = group;
    p->offset = -1;
    p->init = init;
    p->init_std = init_std;
    p->shard.axis = -1;
    memcpy(p->shard.global, shape, (size_t)ndim * sizeof *shape);
    store->params[store->count++] = p;
    *out = p;
    return NULL;
}

dsc_status dsc_params_declare_shard(dsc_param_store *store, const char *name, int ndim, const int64_t *global,
                                    int axis, int64_t start, int64_t count, uint32_t flags, dsc_param_init init,
                                    float init_std, dsc_param **out) {
    *out = NULL;
    DSC_CHECK(ndim >= 1 && ndim <= DSC_MAX_DIMS && axis >= 0 && axis < ndim, DSC_ERR_INVALID,
              "parameter %s: shard axis %d of a rank-%d tensor", name ? name : "", axis, ndim);
    DSC_CHECK(start >= 0 && count >= 1 && start + count <= global[axis], DSC_ERR_INVALID,
              "parameter %s: shard [%lld, %lld) outside its global extent %lld along axis %d", name ? name : "",
              (long long)start, (long long)(start + count), (long long)global[axis], axis);
    int64_t local[DSC_MAX_DIMS];
    memcpy(local, global, (size_t)ndim * sizeof *local);
    local[axis] = count;
    const bool existed = name && dsc_params_find(store, name) != NULL;
    dsc_param *p;
    DSC_TRY(dsc_params_declare(store, name, ndim, local, flags, init, init_std, &p));
    if (existed) {
        DSC_CHECK(p->shard.axis == axis && p->shard.start == start, DSC_ERR_INVALID,
                  "parameter %s declared as the shard at %lld along axis %d, but it exists as the shard at %lld "
                  "along axis %d",
                  name, (long long)start, axis, (long long)p->shard.start, p->shard.axis);
    } else {
        p->shard.axis = axis;
        p->shard.start = start;
        memcpy(p->shard.global, global, (size_t)ndim * sizeof *global);
    }
    *out = p;
    return NULL;
}

int64_t dsc_param_global_numel(const dsc_param *param) {
    int64_t n = 1;
    for (int i = 0; i < param->value.ndim; i++)
        n *= param->shard.global[i];
    return n;
}

/* FNV-1a: a stable hash of the name, mixed into the seed of its stream. */
static uint64_t name_hash(const char *name) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = (h ^ *c) * 0x100000001b3ULL;
    return h;
}

/* Compacts the global values in `host` to this shard's piece, in place: per
 * index of the leading axes, the shard's run of axis x trailing elements. */
static void keep_piece(const dsc_param *p, float *host) {
    const int a = p->shard.axis;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < a; i++)
        outer *= p->shard.global[i];
    for (int i = a + 1; i < p->value.ndim; i++)
        inner *= p->shard.global[i];
    const int64_t run = p->value.shape[a] * inner, stride = p->shard.global[a] * inner;
    for (int64_t o = 0; o < outer; o++)
        memmove(host + o * run, host + o * stride + p->shard.start * inner, (size_t)run * sizeof *host);
}

/* host[0 .. total) = std * the normals of `rng`'s stream, over the kernels' threads in chunks:
 * this thread steps the stream once (two draws a value, cheap) to note its state where each chunk
 * starts, then each chunk draws its normals from there (the logarithms and cosines, 90 % of the
 * time), so the values are the sequential ones bit for bit. */
enum { INIT_CHUNK = 1 << 16 };

static dsc_status fill_normal(float *host, int64_t total, double std, dsc_rng rng, const char *name) {
    const int64_t chunks = (total + INIT_CHUNK - 1) / INIT_CHUNK;
    dsc_rng *start = malloc((size_t)(chunks > 0 ? chunks : 1) * sizeof *start);
    DSC_CHECK(start, DSC_ERR_NOMEM, "parameter %s: %lld stream states for its initialisation", name,
              (long long)chunks);
    for (int64_t c = 0; c < chunks; c++) {
        start[c] = rng;
        int64_t len = total - c * INIT_CHUNK < INIT_CHUNK ? total - c * INIT_CHUNK : INIT_CHUNK;
        for (int64_t i = 0; i < 2 * len; i++) /* dsc_rng_normal draws two uniforms */
            (void)dsc_rng_u64(&rng);
    }
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (chunks > 1) schedule(dynamic)
    for (int64_t c = 0; c < chunks; c++) {
        dsc_rng r = start[c];
        int64_t b = c * INIT_CHUNK, e = total < b + INIT_CHUNK ? total : b + INIT_CHUNK;
        for (int64_t i = b; i < e; i++)
            host[i] = (float)(std * dsc_rng_normal(&r));
    }
    free(start);
    return NULL;
}

static dsc_status init_values(const dsc_param_store *store, dsc_param *p, float *host) {
    int64_t n = dsc_param_numel(p);
    switch (p->init) {
    case DSC_INIT_ZEROS:
        return NULL; /* the flat buffer is allocated zero-filled */
    case DSC_INIT_ONES:
        for (int64_t i = 0; i < n; i++)
            host[i] = 1.0f;
        break;
    case DSC_INIT_NORMAL: {
        dsc_rng rng;
        dsc_rng_init(&rng, store->seed ^ name_hash(p->name), 0, DSC_RNG_INIT);
        /* A shard draws the whole tensor's stream and keeps its piece: the
         * same weights at every tensor-parallel degree. */
        DSC_TRY(fill_normal(host, dsc_param_global_numel(p), p->init_std, rng, p->name));
        if (p->shard.axis >= 0) keep_piece(p, host);
        break;
    }
    default:
        return dsc_error(DSC_ERR_INVALID, "parameter %s: unknown init %d", p->name, (int)p->init);
    }
    dsc_tensor src = dsc_tensor_view(host, DSC_DTYPE_F32, p->value.ndim, p->value.shape, DSC_CPU);
    return dsc_tensor_copy(&p->value, &src);
}

dsc_status dsc_params_finalize(dsc_param_store *store) {
    DSC_CHECK(!store->finalized, DSC_ERR_INVALID, "parameter store finalized twice");
    int64_t largest = 0;
    for (int i = 0; i < store->count; i++) {
        dsc_param *p = store->params[i];
        int64_t n = dsc_param_numel(p), whole = dsc_param_global_numel(p);
        p->offset = store->numel[p->group];
        store->numel[p->group] += (n + PARAM_ALIGN_ELEMS - 1) / PARAM_ALIGN_ELEMS * PARAM_ALIGN_ELEMS;
        if (whole > largest) largest = whole;
    }
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        int64_t shape[1] = {store->numel[g]};
        DSC_TRY(dsc_tensor_alloc(&store->values[g], DSC_DTYPE_F32, 1, shape, store->device, DSC_MEM_PARAMS));
        DSC_TRY(dsc_tensor_alloc(&store->grads[g], DSC_DTYPE_F32, 1, shape, store->device, DSC_MEM_GRADS));
    }
    float *host = malloc((size_t)(largest ? largest : 1) * sizeof *host);
    DSC_CHECK(host, DSC_ERR_NOMEM, "initialisation scratch of %lld floats", (long long)largest);
    dsc_status s = NULL;
    for (int i = 0; i < store->count && !s; i++) {
        dsc_param *p = store->params[i];
        p->value.data = (float *)store->values[p->group].data + p->offset;
        p->grad.data = (float *)store->grads[p->group].data + p->offset;
        s = init_values(store, p, host);
        if (s) s = dsc_error_wrap(s, "initialising parameter %s", p->name);
    }
    free(host);
    if (!s) store->finalized = true;
    return s;
}

int64_t dsc_params_model_numel(const dsc_param_store *store, int ep_size) {
    int64_t n = 0;
    for (int i = 0; i < store->count; i++) {
        const dsc_param *p = store->params[i];
        n += dsc_param_global_numel(p) * (p->flags & DSC_PARAM_EXPERT ? ep_size : 1);
    }
    return n;
}

int64_t dsc_params_held_numel(const dsc_param_store *store) {
    int64_t n = 0;
    for (int i = 0; i < store->count; i++)
        n += dsc_param_numel(store->params[i]);
    return n;
}

int dsc_params_count(const dsc_param_store *store) {
    return store->count;
}

dsc_param *dsc_params_at(dsc_param_store *store, int index) {
    return index >= 0 && index < store->count ? store->params[index] : NULL;
}

dsc_param *dsc_params_find(dsc_param_store *store, const char *name) {
    for (int i = 0; i < store->count; i++)
        if (strcmp(store->params[i]->name, name) == 0) return store->params[i];
    return NULL;
}

void dsc_params_flat(dsc_param_store *store, dsc_param_group group, dsc_tensor *values, dsc_tensor *grads) {
    DSC_ASSERT((unsigned)group < DSC_PARAM_GROUP_COUNT);
    int64_t shape[1] = {store->numel[group]};
    if (values) *values = dsc_tensor_view(store->values[group].data, DSC_DTYPE_F32, 1, shape, store->device);
    if (grads) *grads = dsc_tensor_view(store->grads[group].data, DSC_DTYPE_F32, 1, shape, store->device);
}

int64_t dsc_params_numel(const dsc_param_store *store, dsc_param_group group) {
    DSC_ASSERT((unsigned)group < DSC_PARAM_GROUP_COUNT);
    return store->numel[group];
}

dsc_status dsc_params_zero_grads(dsc_param_store *store) {
    DSC_CHECK(store->finalized, DSC_ERR_INVALID, "zeroing gradients of a parameter store that is not finalized");
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
        if (store->numel[g] > 0 && store->grads[g].data) DSC_TRY(dsc_kernel_zero(&store->grads[g]));
    return NULL;
}

dsc_status dsc_params_release(dsc_param_store *store, dsc_param_group group, bool values, bool grads) {
    DSC_CHECK(store->finalized, DSC_ERR_INVALID, "releasing buffers of a parameter store that is not finalized");
    DSC_CHECK((unsigned)group < DSC_PARAM_GROUP_COUNT, DSC_ERR_INVALID, "releasing parameter group %d",
              (int)group);
    if (values) dsc_tensor_free(&store->values[group]);
    if (grads) dsc_tensor_free(&store->grads[group]);
    for (int i = 0; i < store->count; i++) {
        dsc_param *p = store->params[i];
        if (p->group != group) continue;
        if (values) p->value.data = NULL;
        if (grads) p->grad.data = NULL;
    }
    return NULL;
}
