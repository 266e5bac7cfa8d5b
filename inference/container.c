/* Layer containers: validation of a container's parameter slots and mapping
 * table (DeepSpeed's PARAM_MAPPING rules, checked when a policy is
 * registered, before any checkpoint is read), name matching with `*` for an
 * expert index, and the symbolic shapes of slots. Not here: reading
 * tensors or laying out the arena (model_build.c). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inference/model_internal.h"

int64_t dsc_dim_value(const dsc_infer_model_config *mc, dsc_dim d) {
    switch (d) {
    case DSC_DIM_C:
        return mc->d_model;
    case DSC_DIM_Q:
        return (int64_t)mc->n_head * mc->head_size;
    case DSC_DIM_KV:
        return (int64_t)mc->n_kv_head * mc->head_size;
    case DSC_DIM_F:
        return mc->d_ff;
    case DSC_DIM_V:
        return mc->vocab_size;
    case DSC_DIM_POS:
        return mc->max_positions + mc->pos_offset;
    case DSC_DIM_E:
        return mc->n_experts;
    case DSC_DIM_PAIR:
        return 2;
    case DSC_DIM_QKV:
        return ((int64_t)mc->n_head + 2 * (int64_t)mc->n_kv_head) * mc->head_size;
    case DSC_DIM_F2:
        return 2 * (int64_t)mc->d_ff;
    case DSC_DIM_FE:
        return mc->d_ff_expert > 0 ? mc->d_ff_expert : mc->d_ff;
    case DSC_DIM_FS:
        return mc->d_ff_shared;
    case DSC_DIM_ONE:
        return 1;
    case DSC_DIM_QKV_HEADS:
        return 3 * (int64_t)mc->n_head * mc->head_size;
    case DSC_DIM_P:
        return mc->d_embed ? mc->d_embed : mc->d_model;
    case DSC_DIM_NONE:
        break;
    }
    return 0;
}

bool dsc_slot_enabled(const dsc_param_def *p, const dsc_infer_model_config *mc) {
    switch (p->when) {
    case DSC_SLOT_WHEN_QKV_BIAS:
        return mc->qkv_bias;
    case DSC_SLOT_WHEN_UNTIED:
        return !mc->tie_embeddings;
    case DSC_SLOT_WHEN_MOE_RESIDUAL:
        return mc->moe_residual;
    case DSC_SLOT_WHEN_SHARED_EXPERT:
        return mc->d_ff_shared > 0;
    case DSC_SLOT_WHEN_PRE_NORM:
        return !mc->post_norm;
    case DSC_SLOT_WHEN_PROJECTED:
        return mc->d_embed && mc->d_embed != mc->d_model;
    case DSC_SLOT_WHEN_ALWAYS:
        break;
    }
    return true;
}

int dsc_param_def_shape(const dsc_param_def *p, const dsc_infer_model_config *mc, int64_t *shape) {
    int nd = 0;
    if (p->per_expert) shape[nd++] = dsc_model_local_experts(mc);
    int64_t rows = 0;
    for (int d = 0; d < p->n_deps; d++)
        rows += dsc_dim_value(mc, p->deps[d].rows);
    shape[nd++] = rows;
    if (p->deps[0].cols != DSC_DIM_NONE) shape[nd++] = dsc_dim_value(mc, p->deps[0].cols);
    return nd;
}

void dsc_container_target(const dsc_container_def *def, const char *target, int *param, int *dep) {
    *param = -1;
    *dep = -1;
    const char *dot = strchr(target, '.');
    if (!dot) return;
    size_t plen = (size_t)(dot - target);
    for (int i = 0; i < def->n_params; i++) {
        const dsc_param_def *p = &def->params[i];
        if (strlen(p->name) != plen || strncmp(p->name, target, plen) != 0) continue;
        *param = i;
        for (int d = 0; d < p->n_deps; d++)
            if (strcmp(p->deps[d].name, dot + 1) == 0) *dep = d;
        return;
    }
}

static int count_stars(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += *s == '*';
    return n;
}

/* `pattern` with at most one `*` against name; the `*` matches a non-empty decimal. */
static bool match_one(const char *pattern, const char *name, int64_t *index) {
    const char *star = strchr(pattern, '*');
    if (!star) return strcmp(pattern, name) == 0;
    size_t pre = (size_t)(star - pattern), post = strlen(star + 1), len = strlen(name);
    if (len < pre + post + 1 || strncmp(pattern, name, pre) != 0 || strcmp(name + len - post, star + 1) != 0)
        return false;
    int64_t v = 0;
    for (size_t i = pre; i < len - post; i++) {
        if (!isdigit((unsigned char)name[i]) || v > 100000000) return false;
        v = v * 10 + (name[i] - '0');
    }
    *index = v;
    return true;
}

const dsc_param_mapping *dsc_container_match(const dsc_container_def *def, const char *name, int64_t *index) {
    *index = -1;
    for (int i = 0; i < def->n_mappings; i++)
        if (match_one(def->mappings[i].source, name, index)) return &def->mappings[i];
    return NULL;
}

dsc_status dsc_container_def_validate(const dsc_container_def *def) {
    const char *cn = def->name ? def->name : "(unnamed)";
    DSC_CHECK(def->n_params > 0 && def->params, DSC_ERR_INVALID, "container %s declares no parameters", cn);
    for (int i = 0; i < def->n_params; i++) {
        const dsc_param_def *p = &def->params[i];
        DSC_CHECK(p->name && !strchr(p->name, '.'), DSC_ERR_INVALID,
                  "container %s: parameter %d needs a name without '.'", cn, i);
        DSC_CHECK(p->n_deps >= 1 && p->n_deps <= DSC_PARAM_MAX_DEPS, DSC_ERR_INVALID,
                  "container %s: parameter %s has %d dependencies (1..%d)", cn, p->name, p->n_deps,
                  DSC_PARAM_MAX_DEPS);
        DSC_CHECK((unsigned)p->role < DSC_PARAM_ROLE_COUNT, DSC_ERR_INVALID,
                  "container %s: parameter %s has no role", cn, p->name);
        for (int d = 0; d < p->n_deps; d++)
            DSC_CHECK(p->deps[d].cols == p->deps[0].cols && p->deps[d].rows != DSC_DIM_NONE, DSC_ERR_INVALID,
                      "container %s: dependency %s.%s must have rows and the columns of %s.%s", cn, p->name,
                      p->deps[d].name, p->name, p->deps[0].name);
        /* An interleaved q/k/v is reordered into the parameter's rows, so it must be all of them. */
        DSC_CHECK(p->n_deps == 1 || p->deps[0].rows != DSC_DIM_QKV_HEADS, DSC_ERR_INVALID,
                  "container %s: parameter %s: an interleaved q/k/v dependency must be the only one", cn, p->name);
        for (int j = 0; j < i; j++) {
            DSC_CHECK(strcmp(def->params[j].name, p->name) != 0, DSC_ERR_INVALID,
                      "container %s: parameter %s declared twice", cn, p->name);
            DSC_CHECK(def->params[j].role != p->role, DSC_ERR_INVALID,
                      "container %s: parameters %s and %s fill the same role", cn, def->params[j].name, p->name);
        }
    }
    int mapped[64][DSC_PARAM_MAX_DEPS];
    DSC_CHECK(def->n_params <= 64, DSC_ERR_INVALID, "container %s: more than 64 parameters", cn);
    memset(mapped, 0xff, sizeof mapped);
    for (int i = 0; i < def->n_mappings; i++) {
        const dsc_param_mapping *m = &def->mappings[i];
        DSC_CHECK(m->source && m->target, DSC_ERR_INVALID, "container %s: mapping %d lacks a source or target", cn,
                  i);
        int p, d;
        dsc_container_target(def, m->target, &p, &d);
        DSC_CHECK(p >= 0, DSC_ERR_INVALID, "container %s: mapping '%s' -> '%s': unknown target parameter", cn,
                  m->source, m->target);
        DSC_CHECK(d >= 0, DSC_ERR_INVALID, "container %s: mapping '%s' -> '%s': %s has no such dependency", cn,
                  m->source, m->target, def->params[p].name);
        int want = def->params[p].per_expert ? 1 : 0, stars = count_stars(m->source);
        DSC_CHECK(stars == want, DSC_ERR_INVALID,
                  "container %s: mapping '%s' -> '%s' has %d wildcards; a %s target needs %d", cn, m->source,
                  m->target, stars, want ? "per-expert" : "plain", want);
        DSC_CHECK(mapped[p][d] < 0, DSC_ERR_INVALID, "container %s: dependency %s is mapped twice ('%s' and '%s')",
                  cn, m->target, def->mappings[mapped[p][d]].source, m->source);
        mapped[p][d] = i;
    }
    for (int p = 0; p < def->n_params; p++)
        for (int d = 0; d < def->params[p].n_deps; d++)
            DSC_CHECK(mapped[p][d] >= 0, DSC_ERR_INVALID, "container %s: dependency %s.%s is not mapped", cn,
                      def->params[p].name, def->params[p].deps[d].name);
    return NULL;
}
