/* The sharding plan: for every parameter, its kind (first deciding rule of
 * partition_config, base_model_tp_plan, the policy's declaration, AutoTP's
 * name rules), the unit its split axis holds (from the declaration, else
 * from the name and the extent) and each rank's spans along that axis.
 * Embeddings and the LM head are always vocabulary-parallel; a row-parallel
 * bias is replicated (added once, after the all-reduce). Every tensor that
 * cannot be placed is listed in one error. Not here: the cut arithmetic
 * (split.c), the table (plan_print.c), reading or moving data. */
#define _POSIX_C_SOURCE 200809L /* regex.h, strdup */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/tp.h"

enum { MAX_SPANS = 3, NAME_LEN = 256 };

struct dsc_tp_plan {
    int tp;
    dsc_tp_dims dims;
    int64_t n;
    dsc_tp_entry *entries;
    char **names;
    dsc_tp_shard *shards; /* (tp) */
    int *n_spans;         /* (n, tp) */
    dsc_tp_span *spans;   /* (n, tp, MAX_SPANS) */
};

/* ---- names ----------------------------------------------------------------------------------- */

/* The module path: the name without a trailing .weight / .bias. */
static void module_of(const char *name, char *out, size_t len) {
    snprintf(out, len, "%s", name);
    size_t n = strlen(out);
    const char *tails[] = {".weight", ".bias"};
    for (int i = 0; i < 2; i++) {
        size_t t = strlen(tails[i]);
        if (n > t && strcmp(out + n - t, tails[i]) == 0) {
            out[n - t] = '\0';
            return;
        }
    }
}

static const char *last_component(const char *module) {
    const char *dot = strrchr(module, '.');
    return dot ? dot + 1 : module;
}

static bool in_list(const char *s, const char *const *list) {
    for (; *list; list++)
        if (strcmp(s, *list) == 0) return true;
    return false;
}

static bool has_component(const char *module, const char *const *list) {
    char buf[NAME_LEN];
    snprintf(buf, sizeof buf, "%s", module);
    for (char *save = NULL, *tok = strtok_r(buf, ".", &save); tok; tok = strtok_r(NULL, ".", &save))
        if (in_list(tok, list)) return true;
    return false;
}

static const char *const ROW_NAMES[] = {"o_proj", "down_proj", "out_proj", "dense", "dense_4h_to_h",
                                        "w2",     "fc2",       "c_proj",   NULL};
static const char *const COLUMN_NAMES[] = {
    "q_proj",   "k_proj",       "v_proj",        "gate_proj", "up_proj", "w1",    "w3",  "query_key_value", "fc1",
    "qkv_proj", "gate_up_proj", "dense_h_to_4h", "c_attn",    "c_fc",    "query", "key", "value",           "Wqkv",
    NULL};
static const char *const VOCAB_NAMES[] = {"embed_tokens", "wte", "word_embeddings", "embed_in", "embed_out",
                                          "lm_head",      NULL};
/* Matrices kept whole: MoE routers, learned positions. */
static const char *const REPLICATED_NAMES[] = {
    "gate", "router", "shared_expert_gate", "embed_positions", "wpe", "position_embeddings", NULL};
static const char *const KV_NAMES[] = {"k_proj", "v_proj", "key", "value", NULL};
static const char *const FUSED_QKV_NAMES[] = {"qkv_proj", "c_attn", "Wqkv", "W_pack", NULL};
static const char *const ATTN_PARTS[] = {"attn", "self_attn", "attention", "self_attention", NULL};
static const char *const MLP_PARTS[] = {"mlp", "experts", "shared_expert", "ffn", "feed_forward", NULL};

/* ---- rules ----------------------------------------------------------------------------------- */

/* base_model_tp_plan pattern against the module's tail; `*` is one decimal index. */
static bool glob_tail(const char *pattern, const char *module) {
    size_t n = strlen(module);
    for (size_t start = 0; start <= n; start++) {
        if (start > 0 && module[start - 1] != '.') continue;
        const char *p = pattern, *s = module + start;
        bool ok = true;
        while (ok && *p) {
            if (*p == '*') {
                if (*s < '0' || *s > '9') ok = false;
                while (*s >= '0' && *s <= '9')
                    s++;
                p++;
            } else if (*p++ != *s++) {
                ok = false;
            }
        }
        if (ok && *s == '\0') return true;
    }
    return false;
}

typedef struct rules {
    regex_t *user; /* compiled partition_config */
    int n_user;
} rules;

static dsc_status rules_compile(const dsc_tp_options *o, rules *r) {
    *r = (rules){0};
    if (o->n_user == 0) return NULL;
    r->user = calloc((size_t)o->n_user, sizeof *r->user);
    DSC_CHECK(r->user, DSC_ERR_NOMEM, "partition_config (%d rules)", o->n_user);
    for (int i = 0; i < o->n_user; i++) {
        const dsc_tp_rule *u = &o->user[i];
        if (u->kind != DSC_TP_KIND_COLUMN && u->kind != DSC_TP_KIND_ROW && u->kind != DSC_TP_KIND_REPLICATE) {
            r->n_user = i;
            return dsc_error(DSC_ERR_CONFIG, "partition_config: rule '%s' must be column, row or skip",
                             u->pattern);
        }
        int rc = regcomp(&r->user[i], u->pattern, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            char msg[128];
            regerror(rc, &r->user[i], msg, sizeof msg);
            r->n_user = i;
            return dsc_error(DSC_ERR_CONFIG, "partition_config: pattern '%s' is not a regex (%s)", u->pattern,
                             msg);
        }
        r->n_user = i + 1;
    }
    return NULL;
}

static void rules_free(rules *r) {
    for (int i = 0; i < r->n_user; i++)
        regfree(&r->user[i]);
    free(r->user);
}

/* The kind and the rule that decided it, before vocabulary and bias handling. */
static dsc_tp_kind decide(const dsc_tp_options *o, const rules *r, const dsc_tp_param *p, const char *module,
                          dsc_tp_rule_source *src) {
    for (int i = 0; i < r->n_user; i++)
        if (regexec(&r->user[i], p->name, 0, NULL, 0) == 0) {
            *src = DSC_TP_SOURCE_USER;
            return o->user[i].kind;
        }
    for (int i = 0; i < o->n_model_plan; i++)
        if (glob_tail(o->model_plan[i].pattern, module)) {
            *src = DSC_TP_SOURCE_MODEL_PLAN;
            return o->model_plan[i].kind;
        }
    if (p->declared != DSC_TP_KIND_UNDECLARED) {
        *src = DSC_TP_SOURCE_POLICY;
        return p->declared;
    }
    const char *last = last_component(module);
    *src = DSC_TP_SOURCE_NAME;
    if (in_list(last, VOCAB_NAMES)) return DSC_TP_KIND_VOCAB;
    if (!o->no_name_rules && in_list(last, ROW_NAMES)) return DSC_TP_KIND_ROW;
    if (!o->no_name_rules && in_list(last, COLUMN_NAMES)) return DSC_TP_KIND_COLUMN;
    *src = DSC_TP_SOURCE_DEFAULT;
    /* Vectors (norms) and known whole matrices replicate; an unknown matrix is not guessed at. */
    return p->ndim == 1 || in_list(last, REPLICATED_NAMES) ? DSC_TP_KIND_REPLICATE : DSC_TP_KIND_UNDECLARED;
}

/* ---- units ----------------------------------------------------------------------------------- */

static int64_t unit_extent(const dsc_tp_dims *d, dsc_tp_unit u) {
    int64_t hs = d->head_size;
    switch (u) {
    case DSC_TP_UNIT_Q_HEADS:
        return d->n_head * hs;
    case DSC_TP_UNIT_KV_HEADS:
        return d->n_kv_head * hs;
    case DSC_TP_UNIT_QKV:
        return ((int64_t)d->n_head + 2 * (int64_t)d->n_kv_head) * hs;
    case DSC_TP_UNIT_QKV_INTERLEAVED:
        return d->n_kv_head == d->n_head ? 3 * d->n_head * hs : -1;
    case DSC_TP_UNIT_FF:
        return d->d_ff;
    case DSC_TP_UNIT_GATE_UP:
        return 2 * d->d_ff;
    case DSC_TP_UNIT_VOCAB:
        return d->vocab_size;
    case DSC_TP_UNIT_FF_EXPERT:
        return d->d_ff_expert > 0 ? d->d_ff_expert : -1;
    case DSC_TP_UNIT_FF_SHARED:
        return d->d_ff_shared > 0 ? d->d_ff_shared : -1;
    default:
        return -1;
    }
}

/* The split axis of a weight or vector for kind k. */
static int split_axis(const dsc_tp_param *p, dsc_tp_kind k) {
    if (p->ndim == 1) return 0;
    int out = p->ndim - 2, in = p->ndim - 1;
    if (p->transposed) {
        int t = out;
        out = in;
        in = t;
    }
    return k == DSC_TP_KIND_ROW ? in : out;
}

/* The unit of an undeclared column/row tensor from its module name and extent. */
static dsc_tp_unit infer_unit(const dsc_tp_dims *d, const char *module, dsc_tp_kind k, int64_t extent,
                              const char **why) {
    const char *last = last_component(module);
    bool attn = has_component(module, ATTN_PARTS) || in_list(last, KV_NAMES) || in_list(last, FUSED_QKV_NAMES) ||
                strcmp(last, "query_key_value") == 0 || strcmp(last, "q_proj") == 0 || strcmp(last, "o_proj") == 0;
    bool mlp = has_component(module, MLP_PARTS);
    if (attn && !mlp) {
        if (k == DSC_TP_KIND_COLUMN) {
            if (strcmp(last, "query_key_value") == 0 && extent == unit_extent(d, DSC_TP_UNIT_QKV_INTERLEAVED))
                return DSC_TP_UNIT_QKV_INTERLEAVED;
            if (extent == unit_extent(d, DSC_TP_UNIT_QKV) &&
                (in_list(last, FUSED_QKV_NAMES) || strcmp(last, "query_key_value") == 0))
                return DSC_TP_UNIT_QKV;
            if (in_list(last, KV_NAMES)) {
                if (extent == unit_extent(d, DSC_TP_UNIT_KV_HEADS)) return DSC_TP_UNIT_KV_HEADS;
                *why = "a key/value projection whose width is not KV heads x head size";
                return DSC_TP_UNIT_NONE;
            }
        }
        if (extent == unit_extent(d, DSC_TP_UNIT_Q_HEADS)) return DSC_TP_UNIT_Q_HEADS;
        *why = "an attention projection whose width is not heads x head size (nor a known fused q|k|v)";
        return DSC_TP_UNIT_NONE;
    }
    if (mlp && !attn) {
        if (k == DSC_TP_KIND_COLUMN && strcmp(last, "gate_up_proj") == 0 &&
            extent == unit_extent(d, DSC_TP_UNIT_GATE_UP))
            return DSC_TP_UNIT_GATE_UP;
        if (extent == d->d_ff) return DSC_TP_UNIT_FF;
        *why = "a feed-forward projection whose width is not the intermediate size";
        return DSC_TP_UNIT_NONE;
    }
    bool q = extent == unit_extent(d, DSC_TP_UNIT_Q_HEADS), f = extent == d->d_ff;
    if (q != f) return q ? DSC_TP_UNIT_Q_HEADS : DSC_TP_UNIT_FF;
    *why = q ? "its width matches both heads x head size and the intermediate size, and its name says neither"
             : "its width is neither heads x head size nor the intermediate size";
    return DSC_TP_UNIT_NONE;
}

/* ---- spans ----------------------------------------------------------------------------------- */

static int unit_spans(const dsc_tp_dims *d, dsc_tp_unit u, const dsc_tp_shard *sh, dsc_tp_span *out) {
    int64_t hs = d->head_size, q = (int64_t)d->n_head * hs, kv = (int64_t)d->n_kv_head * hs;
    switch (u) {
    case DSC_TP_UNIT_Q_HEADS:
        out[0] = (dsc_tp_span){sh->q0 * hs, sh->nq * hs};
        return 1;
    case DSC_TP_UNIT_KV_HEADS:
        out[0] = (dsc_tp_span){sh->kv0 * hs, sh->nkv * hs};
        return 1;
    case DSC_TP_UNIT_QKV:
        out[0] = (dsc_tp_span){sh->q0 * hs, sh->nq * hs};
        out[1] = (dsc_tp_span){q + sh->kv0 * hs, sh->nkv * hs};
        out[2] = (dsc_tp_span){q + kv + sh->kv0 * hs, sh->nkv * hs};
        return 3;
    case DSC_TP_UNIT_QKV_INTERLEAVED:
        out[0] = (dsc_tp_span){sh->q0 * 3 * hs, sh->nq * 3 * hs};
        return 1;
    case DSC_TP_UNIT_FF:
        out[0] = (dsc_tp_span){sh->f0, sh->nf};
        return 1;
    case DSC_TP_UNIT_GATE_UP:
        out[0] = (dsc_tp_span){sh->f0, sh->nf};
        out[1] = (dsc_tp_span){d->d_ff + sh->f0, sh->nf};
        return 2;
    case DSC_TP_UNIT_VOCAB:
        out[0] = (dsc_tp_span){sh->v0, sh->nv};
        return 1;
    case DSC_TP_UNIT_FF_EXPERT:
        out[0] = (dsc_tp_span){sh->fe0, sh->nfe};
        return 1;
    case DSC_TP_UNIT_FF_SHARED:
        out[0] = (dsc_tp_span){sh->fs0, sh->nfs};
        return 1;
    default:
        return 0;
    }
}

static void shape_text(char *buf, size_t len, int nd, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < nd && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

/* Decides tensor i; on failure appends "name shape: why" to the list of unplaced tensors. */
static void place(dsc_tp_plan *pl, const dsc_tp_param *p, const dsc_tp_options *o, const rules *r, int64_t i,
                  char *unplaced, size_t len, int *n_unplaced) {
    dsc_tp_entry *e = &pl->entries[i];
    char module[NAME_LEN];
    module_of(p->name, module, sizeof module);
    *e = (dsc_tp_entry){.name = pl->names[i], .ndim = p->ndim, .axis = -1};
    memcpy(e->shape, p->shape, sizeof e->shape);
    dsc_tp_kind k = decide(o, r, p, module, &e->source);
    /* Embeddings and the LM head are vocabulary-parallel whatever a rule says of linears. */
    if (in_list(last_component(module), VOCAB_NAMES) && k != DSC_TP_KIND_REPLICATE && p->ndim == 2)
        k = DSC_TP_KIND_VOCAB;
    if (k == DSC_TP_KIND_ROW && p->ndim == 1) k = DSC_TP_KIND_REPLICATE; /* the bias once, after the all-reduce */
    e->kind = k;
    if (k == DSC_TP_KIND_REPLICATE) return;
    const char *why =
        k == DSC_TP_KIND_UNDECLARED ? "no rule places this matrix (add a partition_config rule)" : NULL;
    dsc_tp_unit u =
        p->declared != DSC_TP_KIND_UNDECLARED && e->source == DSC_TP_SOURCE_POLICY ? p->unit : DSC_TP_UNIT_NONE;
    int axis = k == DSC_TP_KIND_VOCAB ? 0 : split_axis(p, k);
    int64_t extent = p->shape[axis];
    if (k == DSC_TP_KIND_VOCAB) u = DSC_TP_UNIT_VOCAB;
    if (u == DSC_TP_UNIT_NONE && !why) u = infer_unit(&pl->dims, module, k, extent, &why);
    if (u != DSC_TP_UNIT_NONE && unit_extent(&pl->dims, u) != extent) {
        why = "its split axis does not have the extent its unit needs";
        u = DSC_TP_UNIT_NONE;
    }
    if (u == DSC_TP_UNIT_NONE) {
        char shape[96];
        shape_text(shape, sizeof shape, p->ndim, p->shape);
        size_t used = strlen(unplaced);
        if (used + 1 < len)
            snprintf(unplaced + used, len - used, "%s%s %s as %s: %s", *n_unplaced ? "; " : "", p->name, shape,
                     dsc_tp_kind_name(k), why ? why : "no unit fits");
        (*n_unplaced)++;
        return;
    }
    e->unit = u;
    e->axis = axis;
    for (int rank = 0; rank < pl->tp; rank++) {
        size_t at = (size_t)i * (size_t)pl->tp + (size_t)rank;
        pl->n_spans[at] = unit_spans(&pl->dims, u, &pl->shards[rank], &pl->spans[at * MAX_SPANS]);
    }
}

dsc_status dsc_tp_plan_create(const dsc_tp_param *params, int64_t n, const dsc_tp_dims *dims,
                              const dsc_tp_options *opts, dsc_tp_plan **out) {
    *out = NULL;
    int tp = opts->tp_size;
    DSC_CHECK(tp >= 1, DSC_ERR_CONFIG, "tensor_parallel.tp_size must be >= 1, got %d", tp);
    DSC_CHECK(n >= 0, DSC_ERR_INVALID, "tensor parallelism: %lld parameters", (long long)n);
    for (int64_t i = 0; i < n; i++)
        DSC_CHECK(params[i].name && params[i].ndim >= 1 && params[i].ndim <= DSC_MAX_DIMS, DSC_ERR_INVALID,
                  "tensor parallelism: parameter %lld has no name or %d dims", (long long)i, params[i].ndim);
    dsc_tp_plan *pl = calloc(1, sizeof *pl);
    DSC_CHECK(pl, DSC_ERR_NOMEM, "tensor-parallel plan");
    pl->tp = tp;
    pl->dims = *dims;
    pl->n = n;
    size_t cells = (size_t)(n > 0 ? n : 1) * (size_t)tp;
    pl->entries = calloc((size_t)(n > 0 ? n : 1), sizeof *pl->entries);
    pl->names = calloc((size_t)(n > 0 ? n : 1), sizeof *pl->names);
    pl->shards = calloc((size_t)tp, sizeof *pl->shards);
    pl->n_spans = calloc(cells, sizeof *pl->n_spans);
    pl->spans = calloc(cells * MAX_SPANS, sizeof *pl->spans);
    dsc_status s = NULL;
    rules r = {0};
    char unplaced[2048] = "";
    int n_unplaced = 0;
    if (!pl->entries || !pl->names || !pl->shards || !pl->n_spans || !pl->spans) {
        s = dsc_error(DSC_ERR_NOMEM, "tensor-parallel plan of %lld tensors over %d ranks", (long long)n, tp);
        goto done;
    }
    for (int rank = 0; rank < tp; rank++)
        DSC_TRY_GOTO(s, dsc_tp_shard_of(dims, tp, opts->grain, rank, &pl->shards[rank]), done);
    DSC_TRY_GOTO(s, rules_compile(opts, &r), done);
    for (int64_t i = 0; i < n; i++) {
        pl->names[i] = strdup(params[i].name);
        if (!pl->names[i]) {
            s = dsc_error(DSC_ERR_NOMEM, "tensor-parallel plan: name of %s", params[i].name);
            goto done;
        }
        place(pl, &params[i], opts, &r, i, unplaced, sizeof unplaced, &n_unplaced);
    }
    if (n_unplaced)
        s = dsc_error(DSC_ERR_CONFIG, "tensor parallelism over %d ranks: %d tensor(s) could not be placed: %s", tp,
                      n_unplaced, unplaced);
done:
    rules_free(&r);
    if (s) {
        dsc_tp_plan_destroy(pl);
        return s;
    }
    *out = pl;
    return NULL;
}

void dsc_tp_plan_destroy(dsc_tp_plan *p) {
    if (!p) return;
    for (int64_t i = 0; p->names && i < p->n; i++)
        free(p->names[i]);
    free(p->names);
    free(p->entries);
    free(p->shards);
    free(p->n_spans);
    free(p->spans);
    free(p);
}

int dsc_tp_plan_size(const dsc_tp_plan *p) {
    return p->tp;
}
int64_t dsc_tp_plan_count(const dsc_tp_plan *p) {
    return p->n;
}
const dsc_tp_entry *dsc_tp_plan_entry(const dsc_tp_plan *p, int64_t i) {
    return &p->entries[i];
}

int64_t dsc_tp_plan_find(const dsc_tp_plan *p, const char *name) {
    for (int64_t i = 0; i < p->n; i++)
        if (strcmp(p->names[i], name) == 0) return i;
    return -1;
}

int dsc_tp_plan_spans(const dsc_tp_plan *p, int64_t i, int rank, const dsc_tp_span **spans) {
    size_t at = (size_t)i * (size_t)p->tp + (size_t)rank;
    *spans = &p->spans[at * MAX_SPANS];
    return p->n_spans[at];
}

void dsc_tp_plan_local_shape(const dsc_tp_plan *p, int64_t i, int rank, int64_t *shape) {
    const dsc_tp_entry *e = &p->entries[i];
    memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
    if (e->axis < 0) return;
    const dsc_tp_span *sp;
    int n = dsc_tp_plan_spans(p, i, rank, &sp);
    shape[e->axis] = 0;
    for (int k = 0; k < n; k++)
        shape[e->axis] += sp[k].count;
}

const dsc_tp_shard *dsc_tp_plan_shard(const dsc_tp_plan *p, int rank) {
    return &p->shards[rank];
}
