/* Building a model from a policy and a source of checkpoint tensors: lays
 * every enabled parameter of every container out in one flat, 256-byte
 * aligned f32 arena, routes each checkpoint tensor to its container
 * (transformer-layer prefix -> layer i, else the non-transformer container,
 * or ignored), and finalizes parameters by converting each dependency to f32
 * and stacking it at its rows (q | k | v, gate | up, per expert). Every
 * unmapped, misshapen, duplicated or missing tensor is an error naming it.
 * The sizes come from a file, so they are distrusted: every product and sum
 * is overflow-checked, and every tensor is checked against the config
 * before the arena is allocated (so it is never larger than the checkpoint).
 * For one pipeline stage only its parameters get slots: the other stages'
 * tensors are skipped unread, and an arena over the stage's weight budget
 * is refused before it is allocated.
 * Not here: where tensors come from (load_*.c) or the forward. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inference/model_internal.h"

enum { ALIGN_FLOATS = DSC_MEM_ALIGN / sizeof(float) };

/* Where the dependencies of one parameter live and which are set. */
typedef struct slot_state {
    const dsc_param_def *def;
    float *data;
    int64_t offset;        /* floats from the arena's start */
    int64_t expert_stride; /* floats between experts */
    int64_t cols;          /* 1 for vectors */
    int64_t flag0;         /* index of its first set flag */
    uint8_t *set;          /* (experts, n_deps) */
    int32_t experts;
} slot_state;

typedef struct build_state {
    const dsc_policy *policy;
    const dsc_infer_model_config *mc;
    const dsc_infer_stage *stage; /* NULL: the whole model */
    dsc_infer_model *m;
    slot_state *slots; /* ((L + 1) * DSC_PARAM_MAX_ROLES), indexed by container and param index */
    int max_params;
    int64_t floats;  /* arena size, every parameter padded to the alignment */
    int64_t n_flags; /* dependencies the checkpoint must supply, one tensor each */
    uint8_t *flags;  /* every slot's set flags */
} build_state;

static const dsc_container_def *container_of(const build_state *b, int32_t c) {
    if (c >= b->mc->n_layer) return b->policy->non_layer;
    if (b->policy->dense_layer && !dsc_model_is_moe_layer(b->mc, c)) return b->policy->dense_layer;
    return b->policy->layer;
}

static slot_state *slot_at(build_state *b, int32_t c, int p) {
    return &b->slots[(size_t)c * b->max_params + p];
}

static void shape_text(char *buf, size_t len, int nd, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < nd && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

/* Sizes and places every enabled parameter, with every product and sum
 * overflow-checked (the sizes come from a file); allocates nothing. */
static dsc_status layout(build_state *b) {
    const dsc_infer_model_config *mc = b->mc;
    for (int32_t c = 0; c <= mc->n_layer; c++) {
        const dsc_container_def *def = container_of(b, c);
        for (int p = 0; p < def->n_params; p++) {
            const dsc_param_def *pd = &def->params[p];
            if (!dsc_slot_enabled(pd, mc) || !dsc_infer_stage_holds(b->stage, mc, c, pd->role)) continue;
            int64_t shape[3], numel = 1, padded, deps;
            int nd = dsc_param_def_shape(pd, mc, shape);
            bool overflow = false;
            for (int i = 0; i < nd; i++)
                overflow |= __builtin_mul_overflow(numel, shape[i], &numel);
            int32_t experts = pd->per_expert ? dsc_model_local_experts(mc) : 1;
            overflow |= __builtin_add_overflow(numel, ALIGN_FLOATS - 1, &padded);
            padded = padded / ALIGN_FLOATS * ALIGN_FLOATS;
            overflow |= __builtin_mul_overflow((int64_t)experts, (int64_t)pd->n_deps, &deps);
            *slot_at(b, c, p) =
                (slot_state){.def = pd,
                             .offset = b->floats,
                             .expert_stride = experts > 0 ? numel / experts : 0,
                             .cols = pd->deps[0].cols == DSC_DIM_NONE ? 1 : dsc_dim_value(mc, pd->deps[0].cols),
                             .flag0 = b->n_flags,
                             .experts = experts};
            overflow |= __builtin_add_overflow(b->floats, padded, &b->floats);
            overflow |= __builtin_add_overflow(b->n_flags, deps, &b->n_flags);
            if (overflow) {
                char text[96];
                shape_text(text, sizeof text, nd, shape);
                return dsc_error(DSC_ERR_CONFIG,
                                 "policy %s: parameter %s of container %s has shape %s: the model's "
                                 "size overflows (the config's sizes are not a real model)",
                                 b->policy->arch, pd->name, def->name, text);
            }
        }
    }
    return NULL;
}

/* Points every slot and parameter view into a freshly allocated arena. */
static dsc_status allocate_arena(build_state *b) {
    const dsc_infer_model_config *mc = b->mc;
    size_t bytes;
    DSC_CHECK(!__builtin_mul_overflow((size_t)b->floats, sizeof(float), &bytes), DSC_ERR_CONFIG,
              "policy %s: %lld parameters do not fit in memory", b->policy->arch, (long long)b->floats);
    b->m->arena_bytes = bytes;
    DSC_TRY(dsc_mem_alloc(&b->m->arena, bytes, DSC_MEM_PARAMS, DSC_CPU));
    for (int32_t c = 0; c <= mc->n_layer; c++) {
        const dsc_container_def *def = container_of(b, c);
        for (int p = 0; p < def->n_params; p++) {
            slot_state *s = slot_at(b, c, p);
            if (!s->def) continue;
            int64_t shape[3];
            int nd = dsc_param_def_shape(s->def, mc, shape);
            s->data = (float *)b->m->arena + s->offset;
            b->m->params[(size_t)c * DSC_PARAM_ROLE_COUNT + s->def->role] =
                dsc_tensor_view(s->data, DSC_DTYPE_F32, nd, shape, DSC_CPU);
        }
    }
    return NULL;
}

bool dsc_policy_ignores(const dsc_policy *policy, const char *name) {
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

/* Where tensor i of src goes: its slot, expert and dependency (slot NULL
 * for an ignored name), after checking that its shape is the one the config
 * implies. Reads nothing, so every tensor is checked before the arena exists. */
typedef struct route {
    slot_state *slot;
    int64_t expert, numel;
    int dep;
    const char *name, *target;
} route;

static dsc_status route_tensor(build_state *b, const dsc_tensor_source *src, int64_t i, route *r) {
    const char *name;
    int nd;
    int64_t shape[DSC_MAX_DIMS];
    src->describe(src->impl, i, &name, &nd, shape);
    *r = (route){.name = name};
    if (dsc_policy_ignores(b->policy, name)) return NULL;
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
        if (b->stage && (c < b->stage->layer0 || c >= b->stage->layer1)) return NULL; /* another stage's */
    }
    const dsc_container_def *def = container_of(b, c);
    int64_t expert;
    const dsc_param_mapping *map = dsc_container_match(def, rel, &expert);
    DSC_CHECK(map, DSC_ERR_CORRUPT, "checkpoint tensor '%s' maps to no parameter of container %s (policy %s)",
              name, def->name, b->policy->arch);
    int p, d;
    dsc_container_target(def, map->target, &p, &d);
    slot_state *s = slot_at(b, c, p);
    if (p >= 0 && !dsc_infer_stage_holds(b->stage, b->mc, c, def->params[p].role)) return NULL;
    DSC_CHECK(s->def, DSC_ERR_CORRUPT,
              "checkpoint tensor '%s' maps to %s, which this model's config does not have", name, map->target);
    if (!s->def->per_expert) expert = 0;
    int32_t all = s->def->per_expert ? b->mc->n_experts : 1, first = s->def->per_expert ? b->mc->expert0 : 0;
    DSC_CHECK(expert >= 0 && expert < all, DSC_ERR_CORRUPT, "checkpoint tensor '%s' names expert %lld of %d", name,
              (long long)expert, all);
    expert -= first;
    if (expert < 0 || expert >= s->experts) return NULL; /* another expert-parallel rank's expert */
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
    *r = (route){s, expert, want[0] * s->cols, d, name, map->target};
    return NULL;
}

/* Every tensor of src routes to a slot with the shape the config implies
 * and sets its dependency once (check_complete then names any dependency
 * left unset). Runs before the arena exists: once every dependency is one
 * tensor of the exact shape, the arena is no larger than the checkpoint, so
 * a config that claims a huge model beside a small file is refused here,
 * never met by a wrapped or failed allocation. The set flags cost a byte per
 * dependency; no real model has more than MAX_TENSORS of them. */
enum { MAX_TENSORS = 1 << 24 };

static dsc_status check_sources(build_state *b, const dsc_tensor_source *src) {
    DSC_CHECK(b->n_flags <= MAX_TENSORS, DSC_ERR_CONFIG,
              "policy %s: the config describes %lld checkpoint tensors (more than %d): not a real model",
              b->policy->arch, (long long)b->n_flags, MAX_TENSORS);
    b->flags = calloc((size_t)b->n_flags + 1, 1);
    DSC_CHECK(b->flags, DSC_ERR_NOMEM, "model set flags (%lld bytes)", (long long)b->n_flags);
    const dsc_infer_model_config *mc = b->mc;
    for (int32_t c = 0; c <= mc->n_layer; c++) {
        const dsc_container_def *def = container_of(b, c);
        for (int p = 0; p < def->n_params; p++) {
            slot_state *s = slot_at(b, c, p);
            if (s->def) s->set = b->flags + s->flag0;
        }
    }
    for (int64_t i = 0; i < src->count; i++) {
        route r;
        DSC_TRY(route_tensor(b, src, i, &r));
        if (!r.slot) continue;
        uint8_t *flag = &r.slot->set[r.expert * r.slot->def->n_deps + r.dep];
        DSC_CHECK(!*flag, DSC_ERR_CORRUPT, "checkpoint tensor '%s' sets %s a second time", r.name, r.target);
        *flag = 1;
    }
    return NULL;
}

/* An interleaved q/k/v (rows [head, q/k/v, HS]) read and reordered into
 * [q | k | v] rows, the layout the forward reads, so no other file knows of it. */
static dsc_status place_interleaved(const dsc_infer_model_config *mc, const dsc_tensor_source *src, int64_t i,
                                    float *dst, int64_t numel, int64_t cols) {
    float *tmp = malloc((size_t)numel * sizeof *tmp);
    DSC_CHECK(tmp, DSC_ERR_NOMEM, "interleaved q/k/v (%lld floats)", (long long)numel);
    dsc_status s = src->read_f32(src->impl, i, tmp, numel);
    int64_t hs = mc->head_size, q = (int64_t)mc->n_head * hs;
    for (int64_t h = 0; !s && h < mc->n_head; h++)
        for (int64_t j = 0; j < 3; j++)
            memcpy(dst + (j * q + h * hs) * cols, tmp + (h * 3 + j) * hs * cols,
                   (size_t)(hs * cols) * sizeof *tmp);
    free(tmp);
    return s;
}

/* Reads tensor i of src into its place (routed again: routing is cheap). */
static dsc_status place(build_state *b, const dsc_tensor_source *src, int64_t i) {
    route r;
    DSC_TRY(route_tensor(b, src, i, &r));
    slot_state *s = r.slot;
    if (!s) return NULL;
    int64_t row0 = 0;
    for (int k = 0; k < r.dep; k++)
        row0 += dsc_dim_value(b->mc, s->def->deps[k].rows);
    float *dst = s->data + r.expert * s->expert_stride + row0 * s->cols;
    if (s->def->deps[r.dep].rows != DSC_DIM_QKV_HEADS) return src->read_f32(src->impl, i, dst, r.numel);
    return place_interleaved(b->mc, src, i, dst, r.numel, s->cols);
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
                        snprintf(rel, sizeof rel, "%.*s%d%s", (int)(star - source), source, e + b->mc->expert0,
                                 star + 1);
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

/* The sizes every policy's config must satisfy before anything is sized
 * from them; the policies range-check their own keys with the file's names,
 * this is the common floor (and what a dsc checkpoint's config meets too). */
static dsc_status check_config(const dsc_policy *policy, const dsc_infer_model_config *mc, int64_t tensors) {
    const char *arch = policy->arch;
    DSC_CHECK(mc->n_layer > 0 && mc->d_model > 0 && mc->vocab_size > 0 && mc->head_size > 0 && mc->n_head > 0 &&
                  mc->n_kv_head > 0 && mc->d_ff > 0 && mc->max_positions > 0,
              DSC_ERR_CONFIG, "policy %s: model sizes must be positive", arch);
    DSC_CHECK(mc->n_head % mc->n_kv_head == 0, DSC_ERR_CONFIG,
              "policy %s: %d query heads are not a multiple of %d key/value heads", arch, mc->n_head,
              mc->n_kv_head);
    DSC_CHECK(mc->max_positions <= INT32_MAX, DSC_ERR_CONFIG, "policy %s: %lld positions exceed the int32 range",
              arch, (long long)mc->max_positions);
    /* Each layer holds at least one tensor besides the embedding: a config
     * with more layers than the checkpoint has tensors cannot match it. */
    DSC_CHECK(mc->n_layer < tensors, DSC_ERR_CORRUPT,
              "policy %s: the config has %d layers but the checkpoint "
              "holds %lld tensors",
              arch, mc->n_layer, (long long)tensors);
    DSC_CHECK(mc->n_experts >= 0 && mc->n_experts <= tensors &&
                  (mc->n_experts == 0 || (mc->top_k >= 1 && mc->top_k <= mc->n_experts)),
              DSC_ERR_CONFIG, "policy %s: %d experts with top-k %d (checkpoint of %lld tensors)", arch,
              mc->n_experts, mc->top_k, (long long)tensors);
    DSC_CHECK(mc->expert0 >= 0 && mc->n_local_experts >= 0 &&
                  (int64_t)mc->expert0 + mc->n_local_experts <= mc->n_experts &&
                  (mc->n_local_experts > 0 || mc->expert0 == 0),
              DSC_ERR_CONFIG, "policy %s: experts [%d, %d + %d) are not a range of the %d experts", arch,
              mc->expert0, mc->expert0, mc->n_local_experts, mc->n_experts);
    DSC_CHECK(mc->pos_offset >= 0 && mc->pos_offset <= 1024 && mc->d_embed >= 0 && mc->rope_dims >= 0 &&
                  mc->rope_dims <= mc->head_size,
              DSC_ERR_CONFIG, "policy %s: position offset %d, embedding width %d or RoPE dims %d (head size %d)",
              arch, mc->pos_offset, mc->d_embed, mc->rope_dims, mc->head_size);
    DSC_CHECK(!mc->parallel_residual || !mc->post_norm, DSC_ERR_CONFIG,
              "policy %s: a parallel residual has no post-norm form", arch);
    if (dsc_model_rope_dims(mc) > 0) {
        DSC_CHECK(dsc_model_rope_dims(mc) % 2 == 0 && isfinite(mc->rope_theta) && mc->rope_theta > 0,
                  DSC_ERR_CONFIG,
                  "policy %s: RoPE needs an even number of rotated dims (%d) and a positive theta (%g)", arch,
                  dsc_model_rope_dims(mc), mc->rope_theta);
        DSC_CHECK(mc->rope_scaling != DSC_ROPE_SCALING_LLAMA3 ||
                      (isfinite(mc->rope_factor) && mc->rope_factor > 0 && mc->rope_low_freq_factor > 0 &&
                       isfinite(mc->rope_high_freq_factor) &&
                       mc->rope_high_freq_factor > mc->rope_low_freq_factor &&
                       mc->rope_original_max_positions > 0),
                  DSC_ERR_CONFIG,
                  "policy %s: Llama-3 RoPE scaling needs factor > 0, 0 < low_freq_factor < "
                  "high_freq_factor and original positions > 0",
                  arch);
    }
    return NULL;
}

/* The stage's arena against its weight budget, before anything is allocated. */
static dsc_status check_budget(const build_state *b) {
    const dsc_infer_stage *st = b->stage;
    int64_t need = b->floats * (int64_t)sizeof(float);
    if (!st || st->max_weight_bytes <= 0 || need <= st->max_weight_bytes) return NULL;
    return dsc_error(DSC_ERR_CONFIG,
                     "policy %s: layers %d-%d%s%s need %lld bytes of weights, over this rank's weight budget "
                     "(max_weight_bytes) of %lld bytes: serve the model over more pipeline stages (--pp)",
                     b->policy->arch, st->layer0, st->layer1 - 1, st->first ? " + embedding" : "",
                     st->last ? " + final norm and LM head" : "", (long long)need,
                     (long long)st->max_weight_bytes);
}

dsc_status dsc_infer_model_build(const dsc_policy *policy, const dsc_infer_model_config *mc,
                                 const dsc_tensor_source *src, dsc_infer_model **out) {
    return dsc_infer_model_build_stage(policy, mc, src, NULL, out);
}

dsc_status dsc_infer_model_build_stage(const dsc_policy *policy, const dsc_infer_model_config *mc,
                                       const dsc_tensor_source *src, const dsc_infer_stage *stage,
                                       dsc_infer_model **out) {
    *out = NULL;
    DSC_TRY(check_config(policy, mc, src->count));
    dsc_infer_model *m = calloc(1, sizeof *m);
    build_state b = {.policy = policy, .mc = mc, .stage = stage, .m = m};
    b.max_params = policy->layer->n_params > policy->non_layer->n_params ? policy->layer->n_params
                                                                         : policy->non_layer->n_params;
    if (policy->dense_layer && policy->dense_layer->n_params > b.max_params)
        b.max_params = policy->dense_layer->n_params;
    size_t n_containers = (size_t)mc->n_layer + 1;
    if (m) {
        m->policy = policy;
        m->cfg = m->shard = *mc; /* the TP loader widens cfg to the whole model's */
        m->layer0 = stage ? stage->layer0 : 0;
        m->layer1 = stage ? stage->layer1 : mc->n_layer;
        m->first = !stage || stage->first;
        m->last = !stage || stage->last;
        m->stages = 1;
        m->pp_max_layers = m->layer1 - m->layer0;
        m->params = calloc(n_containers * DSC_PARAM_ROLE_COUNT, sizeof *m->params);
        b.slots = calloc(n_containers * (size_t)b.max_params, sizeof *b.slots);
    }
    dsc_status s = NULL;
    if (!m || !m->params || !b.slots) {
        s = dsc_error(DSC_ERR_NOMEM, "policy %s: model tables", policy->arch);
        goto done;
    }
    DSC_TRY_GOTO(s, layout(&b), done);
    DSC_TRY_GOTO(s, check_budget(&b), done);
    DSC_TRY_GOTO(s, check_sources(&b, src), done);
    DSC_TRY_GOTO(s, check_complete(&b), done);
    DSC_TRY_GOTO(s, allocate_arena(&b), done);
    for (int64_t i = 0; i < src->count; i++)
        DSC_TRY_GOTO(s, place(&b, src, i), done);
    if (dsc_model_rope_dims(mc) > 0) DSC_TRY_GOTO(s, dsc_model_rope_init(m), done);
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
    if (m->widen) dsc_mem_free(m->widen, (size_t)m->widen_floats * sizeof(float), DSC_MEM_ACTIVATIONS, DSC_CPU);
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
