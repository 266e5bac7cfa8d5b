/* Loading one tensor-parallel shard per rank: the plan (dsc/tp.h) over the
 * checkpoint's tensors, each declared by the policy's container (a
 * dependency with rows Q / KV / F is column-parallel by those heads or
 * columns, fused rows QKV / 2F by each block's heads or columns, one with
 * cols Q / F row-parallel, rows V vocabulary-parallel, anything else
 * replicated), with partition_config and config.json's
 * base_model_tp_plan ahead of it; then the model is built for the rank's
 * widths from a source that reports local shapes and reads only the rank's
 * spans of each tensor (GPT-2's Conv1D weights, stored (in, out), are split
 * as stored and transposed after the read, whole or sharded). A rule that
 * would split a tensor otherwise than the policy's forward computes it is
 * refused, naming both.
 * Not here: the forward's collectives (model_tp.c) or the plan rules (tp/). */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "inference/load.h"
#include "inference/model_internal.h"

/* The dependency checkpoint tensor `name` sets under the policy, or NULL. */
static const dsc_param_dep *dependency_of(const dsc_policy *p, const dsc_infer_model_config *mc,
                                          const char *name) {
    const char *rel = name;
    int32_t layer = -1;
    size_t plen = strlen(p->layer_prefix);
    if (strncmp(name, p->layer_prefix, plen) == 0) {
        char *end;
        long l = strtol(name + plen, &end, 10);
        if (end == name + plen || *end != '.' || l < 0 || l >= mc->n_layer) return NULL;
        layer = (int32_t)l;
        rel = end + 1;
    }
    const dsc_container_def *def = p->non_layer;
    if (layer >= 0) def = p->dense_layer && !dsc_model_is_moe_layer(mc, layer) ? p->dense_layer : p->layer;
    int64_t index;
    const dsc_param_mapping *map = dsc_container_match(def, rel, &index);
    if (!map) return NULL;
    int param, dep;
    dsc_container_target(def, map->target, &param, &dep);
    return param >= 0 && dep >= 0 ? &def->params[param].deps[dep] : NULL;
}

static dsc_tp_kind declared_kind(const dsc_param_dep *dep, dsc_tp_unit *unit) {
    const struct {
        dsc_dim dim;
        dsc_tp_unit unit;
    } heads[] = {{DSC_DIM_Q, DSC_TP_UNIT_Q_HEADS},    {DSC_DIM_KV, DSC_TP_UNIT_KV_HEADS},
                 {DSC_DIM_F, DSC_TP_UNIT_FF},         {DSC_DIM_QKV, DSC_TP_UNIT_QKV},
                 {DSC_DIM_F2, DSC_TP_UNIT_GATE_UP},   {DSC_DIM_QKV_HEADS, DSC_TP_UNIT_QKV_INTERLEAVED},
                 {DSC_DIM_FE, DSC_TP_UNIT_FF_EXPERT}, {DSC_DIM_FS, DSC_TP_UNIT_FF_SHARED}};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
        if (dep->rows == heads[i].dim) {
            *unit = heads[i].unit;
            return DSC_TP_KIND_COLUMN;
        }
    if (dep->rows == DSC_DIM_V) {
        *unit = DSC_TP_UNIT_VOCAB;
        return DSC_TP_KIND_VOCAB;
    }
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) /* row-parallel: the split is the input's */
        if (dep->cols == heads[i].dim && dep->cols != DSC_DIM_KV && dep->cols != DSC_DIM_QKV &&
            dep->cols != DSC_DIM_F2 && dep->cols != DSC_DIM_QKV_HEADS) {
            *unit = heads[i].unit;
            return DSC_TP_KIND_ROW;
        }
    *unit = DSC_TP_UNIT_NONE;
    return DSC_TP_KIND_REPLICATE;
}

/* config.json's base_model_tp_plan as rules (patterns point into root). */
static dsc_status model_plan_rules(const cJSON *root, const char *source, dsc_tp_rule **out, int *n) {
    *out = NULL;
    *n = 0;
    const cJSON *plan = root ? cJSON_GetObjectItemCaseSensitive(root, "base_model_tp_plan") : NULL;
    if (!plan || cJSON_IsNull(plan)) return NULL;
    DSC_CHECK(cJSON_IsObject(plan), DSC_ERR_CONFIG, "%s: base_model_tp_plan must be an object", source);
    int count = cJSON_GetArraySize(plan);
    dsc_tp_rule *rules = calloc((size_t)(count > 0 ? count : 1), sizeof *rules);
    DSC_CHECK(rules, DSC_ERR_NOMEM, "%s: base_model_tp_plan", source);
    const cJSON *item;
    cJSON_ArrayForEach(item, plan) {
        const char *v = cJSON_IsString(item) ? item->valuestring : "";
        dsc_tp_kind k = DSC_TP_KIND_UNDECLARED;
        if (strcmp(v, "colwise") == 0 || strcmp(v, "colwise_rep") == 0 || strcmp(v, "local_colwise") == 0)
            k = DSC_TP_KIND_COLUMN;
        if (strcmp(v, "rowwise") == 0 || strcmp(v, "rowwise_rep") == 0 || strcmp(v, "local_rowwise") == 0 ||
            strcmp(v, "embedding_rowwise") == 0)
            k = DSC_TP_KIND_ROW;
        if (k == DSC_TP_KIND_UNDECLARED) {
            free(rules);
            return dsc_error(DSC_ERR_UNSUPPORTED,
                             "%s: base_model_tp_plan[\"%s\"] = \"%s\" is not supported (colwise or rowwise)",
                             source, item->string, v);
        }
        rules[(*n)++] = (dsc_tp_rule){item->string, k};
    }
    *out = rules;
    return NULL;
}

/* ---- the shard source: local shapes, only the rank's spans read ---------------------------- */

typedef struct shard_source {
    const dsc_tensor_source *inner;
    const dsc_tp_plan *plan; /* entry i is source tensor i */
    int rank;
} shard_source;

static void shard_describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    shard_source *s = impl;
    s->inner->describe(s->inner->impl, i, name, ndim, shape);
    dsc_tp_plan_local_shape(s->plan, i, s->rank, shape);
}

static dsc_status shard_read(void *impl, int64_t i, float *dst, int64_t numel) {
    shard_source *s = impl;
    const dsc_tp_entry *e = dsc_tp_plan_entry(s->plan, i);
    if (e->axis < 0) return s->inner->read_f32(s->inner->impl, i, dst, numel);
    const dsc_tp_span *sp;
    int n = dsc_tp_plan_spans(s->plan, i, s->rank, &sp);
    int64_t outer = 1, inner = 1, pos = 0;
    for (int d = 0; d < e->axis; d++)
        outer *= e->shape[d];
    for (int d = e->axis + 1; d < e->ndim; d++)
        inner *= e->shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int k = 0; k < n; k++) {
            int64_t count = sp[k].count * inner;
            DSC_CHECK(pos + count <= numel, DSC_ERR_INTERNAL, "shard of %s overflows its %lld elements", e->name,
                      (long long)numel);
            DSC_TRY(s->inner->read_f32_span(s->inner->impl, i, (o * e->shape[e->axis] + sp[k].start) * inner,
                                            count, dst + pos));
            pos += count;
        }
    DSC_CHECK(pos == numel, DSC_ERR_INTERNAL, "shard of %s has %lld elements, the model expects %lld", e->name,
              (long long)pos, (long long)numel);
    return NULL;
}

/* ---- GPT-2's Conv1D weights: stored (in, out), given to the builder as (out, in) ----------- */

/* Whether config.json is GPT-2's (model_type "gpt2"), whose Conv1D weights are stored (in, out). */
static bool is_gpt2(const cJSON *root) {
    const cJSON *type = root ? cJSON_GetObjectItemCaseSensitive(root, "model_type") : NULL;
    return cJSON_IsString(type) && strcmp(type->valuestring, "gpt2") == 0;
}

/* The weights of GPT-2's Conv1D modules (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj). */
static bool conv1d_weight(const char *name) {
    const char *suffixes[] = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"};
    size_t n = strlen(name);
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && strcmp(name + n - k, suffixes[i]) == 0) return true;
    }
    return false;
}

/* Wraps a source (whole, or a rank's shard: the plan splits the stored
 * layout, so a rank reads only its columns) so that every Conv1D weight is
 * described and read transposed; the builder and the forward only ever see
 * (out, in). */
static void transposed_describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    const dsc_tensor_source *inner = impl;
    inner->describe(inner->impl, i, name, ndim, shape);
    if (*ndim != 2 || !conv1d_weight(*name)) return;
    int64_t t = shape[0];
    shape[0] = shape[1];
    shape[1] = t;
}

static dsc_status transposed_read(void *impl, int64_t i, float *dst, int64_t numel) {
    const dsc_tensor_source *inner = impl;
    const char *name;
    int nd;
    int64_t shape[DSC_MAX_DIMS];
    inner->describe(inner->impl, i, &name, &nd, shape);
    if (nd != 2 || !conv1d_weight(name)) return inner->read_f32(inner->impl, i, dst, numel);
    float *tmp = malloc((size_t)numel * sizeof *tmp); /* (in, out) as stored */
    DSC_CHECK(tmp, DSC_ERR_NOMEM, "transposing %s (%lld floats)", name, (long long)numel);
    dsc_status s = inner->read_f32(inner->impl, i, tmp, numel);
    for (int64_t r = 0; !s && r < shape[0]; r++)
        for (int64_t c = 0; c < shape[1]; c++)
            dst[c * shape[0] + r] = tmp[r * shape[1] + c];
    free(tmp);
    return s;
}

/* Builds the stage from src, through the transposing wrapper for GPT-2. */
static dsc_status build(const dsc_policy *policy, const dsc_infer_model_config *mc, const dsc_tensor_source *src,
                        bool gpt2, const dsc_infer_stage *stage, dsc_infer_model **out) {
    dsc_tensor_source t = {(void *)src, src->count, transposed_describe, transposed_read, NULL};
    return dsc_infer_model_build_stage(policy, mc, gpt2 ? &t : src, stage, out);
}

/* ---- plan, check, build ----------------------------------------------------------------------- */

/* policy NULL: no declarations (a family planned by names); gpt2: Conv1D weights are stored transposed. */
static dsc_status make_plan(const dsc_policy *policy, const dsc_infer_model_config *mc,
                            const dsc_tensor_source *src, const cJSON *root, const char *source,
                            const dsc_infer_tp *tp, int size, bool gpt2, dsc_tp_plan **out) {
    dsc_tp_param *params = calloc((size_t)(src->count > 0 ? src->count : 1), sizeof *params);
    DSC_CHECK(params, DSC_ERR_NOMEM, "tensor-parallel plan of %lld tensors", (long long)src->count);
    for (int64_t i = 0; i < src->count; i++) {
        dsc_tp_param *p = &params[i];
        src->describe(src->impl, i, &p->name, &p->ndim, p->shape);
        p->transposed = gpt2 && conv1d_weight(p->name);
        const dsc_param_dep *dep = policy ? dependency_of(policy, mc, p->name) : NULL;
        if (dep) p->declared = declared_kind(dep, &p->unit);
        /* Never loaded (GPT-2's and GPT-NeoX's causal-mask buffers, RoPE tables): nothing to split. */
        if (policy && dsc_policy_ignores(policy, p->name)) p->declared = DSC_TP_KIND_REPLICATE;
    }
    dsc_tp_rule *model_rules = NULL;
    int n_model = 0;
    dsc_status s = model_plan_rules(root, source, &model_rules, &n_model);
    dsc_tp_dims dims = {.n_head = mc->n_head,
                        .n_kv_head = mc->n_kv_head,
                        .head_size = mc->head_size,
                        .d_ff = mc->d_ff,
                        .vocab_size = mc->vocab_size,
                        .n_experts = mc->n_experts,
                        .d_ff_expert = mc->d_ff_expert,
                        .d_ff_shared = mc->d_ff_shared};
    dsc_tp_options o = {.tp_size = size,
                        .grain = tp ? tp->grain : 0,
                        .user = tp ? tp->rules : NULL,
                        .n_user = tp ? tp->n_rules : 0,
                        .model_plan = model_rules,
                        .n_model_plan = n_model,
                        .no_name_rules = tp && tp->no_name_rules};
    if (!s) s = dsc_tp_plan_create(params, src->count, &dims, &o, out);
    /* The forward computes each tensor as the policy declares it; a rule may only agree. */
    for (int64_t i = 0; !s && i < src->count; i++) {
        const dsc_tp_entry *e = dsc_tp_plan_entry(*out, i);
        const dsc_tp_param *p = &params[i];
        if (p->declared == DSC_TP_KIND_UNDECLARED || e->source == DSC_TP_SOURCE_POLICY) continue;
        dsc_tp_kind want = p->declared;
        if (want == DSC_TP_KIND_ROW && p->ndim == 1) want = DSC_TP_KIND_REPLICATE;
        if (e->kind != want || (want != DSC_TP_KIND_REPLICATE && e->unit != p->unit))
            s = dsc_error(
                DSC_ERR_CONFIG, "tensor parallelism: %s makes %s %s (%s), but policy %s computes it as %s (%s)",
                dsc_tp_source_name(e->source), e->name, dsc_tp_kind_name(e->kind), dsc_tp_unit_name(e->unit),
                policy->arch, dsc_tp_kind_name(want), dsc_tp_unit_name(p->unit));
    }
    if (s && *out) {
        dsc_tp_plan_destroy(*out);
        *out = NULL;
    }
    free(model_rules);
    free(params);
    return s;
}

/* Expert parallelism: the rank's range of experts (dsc_moe_expert_range) in `local`. */
static dsc_status expert_shard(const dsc_infer_model_config *mc, dsc_comm *ep, dsc_infer_model_config *local) {
    int size = dsc_comm_size(ep), rank = dsc_comm_rank(ep);
    DSC_CHECK(mc->n_experts >= size, DSC_ERR_CONFIG,
              "expert parallelism over %d ranks needs a MoE model with at least %d experts; this one has %d", size,
              size, mc->n_experts);
    DSC_CHECK(!mc->moe_residual || size == 1, DSC_ERR_UNSUPPORTED,
              "expert parallelism: the PR-MoE residual MLP is not supported over %d ranks", size);
    dsc_moe_expert_range(mc->n_experts, size, rank, &local->expert0, &local->n_local_experts);
    return NULL;
}

/* The built model's whole-model config and expert-parallel group. */
static void attach(dsc_infer_model *m, const dsc_infer_model_config *mc, dsc_comm *ep) {
    m->cfg = *mc;
    m->cfg.expert0 = m->cfg.n_local_experts = 0;
    m->ep_comm = ep;
}

dsc_status dsc_load_finish(const dsc_policy *policy, const dsc_infer_model_config *mc,
                           const dsc_tensor_source *src, const char *config_json, const char *source,
                           const dsc_load_request *req) {
    const dsc_infer_tp *tp = req->tp;
    int size = !tp ? 1 : tp->comm ? dsc_comm_size(tp->comm) : tp->tp_size;
    DSC_CHECK(size >= 1, DSC_ERR_CONFIG, "tensor_parallel.tp_size must be >= 1, got %d", size);
    dsc_comm *ep = !req->plan && tp ? tp->ep_comm : NULL;
    dsc_infer_model_config local = *mc;
    if (ep) DSC_TRY(expert_shard(mc, ep, &local));
    dsc_infer_stage stage;
    int32_t max_layers = 0;
    if (!req->plan) DSC_TRY(dsc_infer_stage_plan(policy, mc, req->pp, &stage, &max_layers));
    cJSON *root = config_json ? cJSON_Parse(config_json) : NULL;
    bool gpt2 = is_gpt2(root);
    if (!req->plan && size == 1) {
        cJSON_Delete(root);
        DSC_TRY(build(policy, &local, src, gpt2, &stage, req->model));
        attach(*req->model, mc, ep);
        dsc_infer_stage_attach(*req->model, req->pp, max_layers);
        return NULL;
    }
    dsc_status s = NULL;
    if (!req->plan && !tp->comm)
        s = dsc_error(DSC_ERR_INVALID, "a tensor-parallel load needs the group's communicator");
    if (!s && !req->plan && !src->read_f32_span)
        s = dsc_error(DSC_ERR_UNSUPPORTED, "%s: this tensor source cannot read shards", source);
    dsc_tp_plan *plan = NULL;
    if (!s) s = make_plan(policy, mc, src, root, source, tp, size, gpt2, &plan);
    cJSON_Delete(root);
    if (s || req->plan) {
        if (req->plan) *req->plan = plan;
        return s;
    }
    int rank = dsc_comm_rank(tp->comm);
    const dsc_tp_shard *sh = dsc_tp_plan_shard(plan, rank);
    local.n_head = sh->nq;
    local.n_kv_head = sh->nkv;
    local.d_ff = (int32_t)sh->nf;
    local.d_ff_expert = (int32_t)sh->nfe;
    local.d_ff_shared = (int32_t)sh->nfs;
    local.vocab_size = (int32_t)sh->nv;
    shard_source ss = {src, plan, rank};
    dsc_tensor_source wrapped = {&ss, src->count, shard_describe, shard_read, NULL};
    s = build(policy, &local, &wrapped, gpt2, &stage, req->model);
    if (!s) {
        dsc_infer_model *m = *req->model;
        attach(m, mc, ep);
        dsc_infer_stage_attach(m, req->pp, max_layers);
        m->shard = local;
        m->tp_comm = tp->comm;
        m->tp_rank = rank;
        m->vocab0 = sh->v0;
        for (int r = 0; r < size; r++)
            if (dsc_tp_plan_shard(plan, r)->nkv > m->tp_max_kv_heads)
                m->tp_max_kv_heads = dsc_tp_plan_shard(plan, r)->nkv;
    }
    dsc_tp_plan_destroy(plan);
    return s ? dsc_error_wrap(s, "tensor-parallel rank %d of %d", rank, size) : NULL;
}

/* The first integer of `keys` present in root (a JSON null counts as absent); dflt when none. */
static dsc_status first_int(const cJSON *root, const char *source, const char *const *keys, int64_t dflt,
                            int64_t *out) {
    for (; *keys; keys++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, *keys);
        if (!v || cJSON_IsNull(v)) continue;
        DSC_CHECK(cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 2147483647.0, DSC_ERR_CONFIG,
                  "%s: %s must be a non-negative integer", source, *keys);
        *out = (int64_t)v->valuedouble;
        return NULL;
    }
    *out = dflt;
    return NULL;
}

dsc_status dsc_load_plan_by_names(const dsc_tensor_source *src, const char *config_json, const char *source,
                                  const dsc_load_request *req) {
    cJSON *root = cJSON_Parse(config_json);
    DSC_CHECK(root, DSC_ERR_CORRUPT, "%s: not JSON (cJSON_Parse failed)", source);
    static const char *const width[] = {"hidden_size", "n_embd", "d_model", NULL};
    static const char *const heads[] = {"num_attention_heads", "n_head", NULL};
    static const char *const kv[] = {"num_key_value_heads", "multi_query_group_num", NULL};
    static const char *const ff[] = {"intermediate_size", "ffn_dim", "n_inner", NULL};
    static const char *const vocab[] = {"vocab_size", NULL};
    static const char *const hd[] = {"head_dim", NULL};
    static const char *const experts[] = {"num_local_experts", "num_experts", NULL};
    int64_t c = 0, nh = 0, nkv = 0, f = 0, v = 0, hs = 0, e = 0;
    dsc_status s = first_int(root, source, width, 0, &c);
    if (!s) s = first_int(root, source, heads, 0, &nh);
    if (!s) s = first_int(root, source, kv, nh, &nkv);
    if (!s) s = first_int(root, source, ff, 4 * c, &f); /* GPT-2's n_inner null means 4 x n_embd */
    if (!s) s = first_int(root, source, vocab, 0, &v);
    if (!s) s = first_int(root, source, hd, nh > 0 ? c / nh : 0, &hs);
    if (!s) s = first_int(root, source, experts, 0, &e);
    if (!s && (c <= 0 || nh <= 0 || nkv <= 0 || v <= 0 || hs <= 0))
        s = dsc_error(DSC_ERR_CONFIG, "%s: cannot read the model's width, heads, KV heads and vocabulary", source);
    bool gpt2 = is_gpt2(root);
    dsc_infer_model_config mc = {.d_model = (int32_t)c,
                                 .n_head = (int32_t)nh,
                                 .n_kv_head = (int32_t)nkv,
                                 .head_size = (int32_t)hs,
                                 .d_ff = (int32_t)f,
                                 .vocab_size = (int32_t)v,
                                 .n_experts = (int32_t)e};
    const dsc_infer_tp *tp = req->tp;
    int size = tp ? tp->tp_size : 1;
    if (!s) s = make_plan(NULL, &mc, src, root, source, tp, size, gpt2, req->plan);
    cJSON_Delete(root);
    return s;
}
