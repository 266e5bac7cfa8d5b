/* Building a model from a policy and a source of checkpoint tensors: lays
 * every enabled parameter of every container out in one flat, 256-byte
 * aligned f32 arena, routes each checkpoint tensor to its container
 * (transformer-layer prefix -> layer i, else the non-transformer container,
 * or ignored), and finalizes parameters by converting each dependency to f32
 * and stacking it at its rows (q | k | v, gate | up, per expert). Every
 * unmapped, misshapen, duplicated or missing tensor is an error naming it.
 * Not here: where tensors come from (load_*.c) or the forward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inference/model_internal.h"

enum { ALIGN_FLOATS = DSC_MEM_ALIGN / sizeof(float) };

/* Where the dependencies of one parameter live and which are set. */
typedef struct slot_state {
    const dsc_param_def *def;
    float *data;
    int64_t expert_stride; /* floats between experts */
    int64_t cols;          /* 1 for vectors */
    uint8_t *set;          /* (experts, n_deps) */
    int32_t experts;
} slot_state;

typedef struct build_state {
    const dsc_policy *policy;
    const dsc_infer_model_config *mc;
    dsc_infer_model *m;
    slot_state *slots; /* ((L + 1) * DSC_PARAM_MAX_ROLES), indexed by container and param index */
    int max_params;
    uint8_t *flags; /* every slot's set flags */
} build_state;

static const dsc_container_def *container_of(const build_state *b, int32_t c) {
    if (c >= b->mc->n_layer) return b->policy->non_layer;
    if (b->policy->dense_layer && !dsc_model_is_moe_layer(b->mc, c)) return b->policy->dense_layer;
    return b->policy->layer;
}

static slot_state *slot_at(build_state *b, int32_t c, int p) {
    return &b->slots[(size_t)c * b->max_params + p];
}

/* Sizes and places every enabled parameter; allocates the arena and the set flags. */
static dsc_status layout(build_state *b) {
    const dsc_infer_model_config *mc = b->mc;
    int32_t L = mc->n_layer;
    int64_t offset = 0, flags = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            b->m->arena_bytes = (size_t)offset * sizeof(float);
            DSC_TRY(dsc_mem_alloc(&b->m->arena, b->m->arena_bytes, DSC_MEM_PARAMS, DSC_CPU));
            b->flags = calloc((size_t)flags + 1, 1);
            DSC_CHECK(b->flags, DSC_ERR_NOMEM, "model set flags (%lld bytes)", (long long)flags);
            offset = flags = 0;
        }
        for (int32_t c = 0; c <= L; c++) {
            const dsc_container_def *def = container_of(b, c);
            for (int p = 0; p < def->n_params; p++) {
                const dsc_param_def *pd = &def->params[p];
                if (!dsc_slot_enabled(pd, mc)) continue;
                int64_t shape[3];
                int nd = dsc_param_def_shape(pd, mc, shape);
                int64_t numel = 1;
                for (int i = 0; i < nd; i++)
                    numel *= shape[i];
                int32_t experts = pd->per_expert ? mc->n_experts : 1;
                if (pass == 1) {
                    slot_state *s = slot_at(b, c, p);
                    float *base = (float *)b->m->arena + offset;
                    *s = (slot_state){
                        .def = pd,
                        .data = base,
                        .expert_stride = numel / experts,
                        .cols = pd->deps[0].cols == DSC_DIM_NONE ? 1 : dsc_dim_value(mc, pd->deps[0].cols),
                        .set = b->flags + flags,
                        .experts = experts};
                    b->m->params[(size_t)c * DSC_PARAM_ROLE_COUNT + pd->role] =
                        dsc_tensor_view(base, DSC_DTYPE_F32, nd, shape, DSC_CPU);
                }
                offset += (numel + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
                flags += (int64_t)experts * pd->n_deps;
            }
        }
    }
    return NULL;
}

static bool is_ignored(const dsc_policy *policy, const char *name) {
    if (!policy->ignored) return false;
    for (const char *const *g = policy->ignored; *g; g++) {
        const char *star = strchr(*g, '*');
        if (!star) {
            if (strcmp(*g, name) == 0) return true;
            continue;
        }
        size_t pre = (size_t)(star - *g), post = strlen(star + 1), len = strlen(name);
        if (len > pre + post && strncmp(*g, name, pre) == 0 && strcmp(name + len - post, star + 1) == 0)
            return true;
    }
    return false;
}

static void shape_text(char *buf, size_t len, int nd, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < nd && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

/* Routes tensor i of src to its dependency and reads it into place. */
static dsc_status place(build_state *b, const dsc_tensor_source *src, int64_t i) {
    const char *name;
    int nd;
    int64_t shape[DSC_MAX_DIMS];
    src->describe(src->impl, i, &name, &nd, shape);
    if (is_ignored(b->policy, name)) return NULL;
    const char *prefix = b->policy->layer_prefix, *rel = name;
    int32_t c = b->mc->n_layer;
    size_t plen = strlen(prefix);
    if (strncmp(name, prefix, plen) == 0) {
        char *end;
        long layer = strtol(name + plen, &end, 10);
        DSC_CHECK(end != name + plen && *end == '.', DSC_ERR_CORRUPT,
                  "checkpoint tensor '%s' has no layer index after '%s'", name, prefix);
        DSC_CHECK(layer >= 0 && layer < b->mc->n_layer, DSC_ERR_CORRUPT,
                  "checkpoint tensor '%s' names layer %ld but the model has %d layers", name, layer,
                  b->mc->n_layer);
        c = (int32_t)layer;
        rel = end + 1;
    }
    const dsc_container_def *def = container_of(b, c);
    int64_t expert;
    const dsc_param_mapping *map = dsc_container_match(def, rel, &expert);
    DSC_CHECK(map, DSC_ERR_CORRUPT, "checkpoint tensor '%s' maps to no parameter of container %s (policy %s)",
              name, def->name, b->policy->arch);
    int p, d;
    dsc_container_target(def, map->target, &p, &d);
    slot_state *s = slot_at(b, c, p);
    DSC_CHECK(s->def, DSC_ERR_CORRUPT,
              "checkpoint tensor '%s' maps to %s, which this model's config does not have", name, map->target);
    if (!s->def->per_expert) expert = 0;
    DSC_CHECK(expert < s->experts, DSC_ERR_CORRUPT, "checkpoint tensor '%s' names expert %lld of %d", name,
              (long long)expert, s->experts);
    const dsc_param_dep *dep = &s->def->deps[d];
    int64_t want[2] = {dsc_dim_value(b->mc, dep->rows), dsc_dim_value(b->mc, dep->cols)};
    int want_nd = dep->cols == DSC_DIM_NONE ? 1 : 2;
    bool same = nd == want_nd;
    for (int k = 0; same && k < nd; k++)
        same = shape[k] == want[k];
    if (!same) {
        char a[96], e[96];
        shape_text(a, sizeof a, nd, shape);
        shape_text(e, sizeof e, want_nd, want);
        return dsc_error(DSC_ERR_CORRUPT, "checkpoint tensor '%s' has shape %s, expected %s for %s", name, a, e,
                         map->target);
    }
    uint8_t *flag = &s->set[expert * s->def->n_deps + d];
    DSC_CHECK(!*flag, DSC_ERR_CORRUPT, "checkpoint tensor '%s' sets %s a second time", name, map->target);
    int64_t row0 = 0;
    for (int k = 0; k < d; k++)
        row0 += dsc_dim_value(b->mc, s->def->deps[k].rows);
    float *dst = s->data + expert * s->expert_stride + row0 * s->cols;
    DSC_TRY(src->read_f32(src->impl, i, dst, want[0] * s->cols));
    *flag = 1;
    return NULL;
}

/* The first dependency no tensor set, named as the checkpoint would name it. */
static dsc_status check_complete(build_state *b) {
    for (int32_t c = 0; c <= b->mc->n_layer; c++) {
        const dsc_container_def *def = container_of(b, c);
        for (int p = 0; p < def->n_params; p++) {
            slot_state *s = slot_at(b, c, p);
            if (!s->def) continue;
            for (int32_t e = 0; e < s->experts; e++)
                for (int d = 0; d < s->def->n_deps; d++) {
                    if (s->set[e * s->def->n_deps + d]) continue;
                    char target[128];
                    snprintf(target, sizeof target, "%s.%s", s->def->name, s->def->deps[d].name);
                    const char *source = "?";
                    for (int k = 0; k < def->n_mappings; k++)
                        if (strcmp(def->mappings[k].target, target) == 0) source = def->mappings[k].source;
                    char name[512], rel[400];
                    const char *star = strchr(source, '*');
                    if (star)
                        snprintf(rel, sizeof rel, "%.*s%d%s", (int)(star - source), source, e, star + 1);
                    else
                        snprintf(rel, sizeof rel, "%s", source);
                    if (c < b->mc->n_layer)
                        snprintf(name, sizeof name, "%s%d.%s", b->policy->layer_prefix, c, rel);
                    else
                        snprintf(name, sizeof name, "%s", rel);
                    return dsc_error(DSC_ERR_CORRUPT, "checkpoint lacks tensor '%s' (for %s of container %s)",
                                     name, target, def->name);
                }
        }
    }
    return NULL;
}

dsc_status dsc_infer_model_build(const dsc_policy *policy, const dsc_infer_model_config *mc,
                                 const dsc_tensor_source *src, dsc_infer_model **out) {
    *out = NULL;
    DSC_CHECK(mc->n_layer > 0 && mc->d_model > 0 && mc->vocab_size > 0 && mc->head_size > 0 && mc->n_kv_head > 0 &&
                  mc->n_head % mc->n_kv_head == 0,
              DSC_ERR_CONFIG, "policy %s: invalid model sizes", policy->arch);
    dsc_infer_model *m = calloc(1, sizeof *m);
    build_state b = {.policy = policy, .mc = mc, .m = m};
    b.max_params = policy->layer->n_params > policy->non_layer->n_params ? policy->layer->n_params
                                                                         : policy->non_layer->n_params;
    if (policy->dense_layer && policy->dense_layer->n_params > b.max_params)
        b.max_params = policy->dense_layer->n_params;
    size_t n_containers = (size_t)mc->n_layer + 1;
    if (m) {
        m->policy = policy;
        m->cfg = m->shard = *mc; /* the TP loader widens cfg to the whole model's */
        m->params = calloc(n_containers * DSC_PARAM_ROLE_COUNT, sizeof *m->params);
        b.slots = calloc(n_containers * (size_t)b.max_params, sizeof *b.slots);
    }
    dsc_status s = NULL;
    if (!m || !m->params || !b.slots) {
        s = dsc_error(DSC_ERR_NOMEM, "policy %s: model tables", policy->arch);
        goto done;
    }
    DSC_TRY_GOTO(s, layout(&b), done);
    for (int64_t i = 0; i < src->count; i++)
        DSC_TRY_GOTO(s, place(&b, src, i), done);
    DSC_TRY_GOTO(s, check_complete(&b), done);
    if (mc->family == DSC_INFER_FAMILY_LLAMA) DSC_TRY_GOTO(s, dsc_model_rope_init(m), done);
done:
    free(b.flags);
    free(b.slots);
    if (s) {
        dsc_infer_model_destroy(m);
        return s;
    }
    *out = m;
    return NULL;
}

void dsc_infer_model_destroy(dsc_infer_model *m) {
    if (!m) return;
    if (m->arena) dsc_mem_free(m->arena, m->arena_bytes, DSC_MEM_PARAMS, DSC_CPU);
    free(m->params);
    free(m->inv_freq);
    free(m);
}

const dsc_infer_model_config *dsc_infer_model_get_config(const dsc_infer_model *m) {
    return &m->cfg;
}
const char *dsc_infer_model_arch(const dsc_infer_model *m) {
    return m->policy->arch;
}
size_t dsc_infer_model_arena_bytes(const dsc_infer_model *m) {
    return m->arena_bytes;
}

dsc_status dsc_infer_model_param(const dsc_infer_model *m, int32_t layer, dsc_param_role role, dsc_tensor *out) {
    DSC_CHECK(layer >= -1 && layer < m->cfg.n_layer && (unsigned)role < DSC_PARAM_ROLE_COUNT, DSC_ERR_INVALID,
              "model parameter (layer %d, role %d) out of range", layer, (int)role);
    int32_t c = layer < 0 ? m->cfg.n_layer : layer;
    *out = m->params[(size_t)c * DSC_PARAM_ROLE_COUNT + role];
    DSC_CHECK(out->data, DSC_ERR_INVALID, "model %s has no parameter with role %d in layer %d", m->policy->arch,
              (int)role, layer);
    return NULL;
}
