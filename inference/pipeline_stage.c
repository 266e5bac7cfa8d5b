/* Which part of the model a pipeline stage holds: the transformer layers
 * cut by pipe/'s partition algorithms ("uniform" by layer count,
 * "parameters" DeepSpeed's balanced split of [embedding, layers..., final
 * norm + LM head] weighted by the policy's parameter counts, "compute" the
 * same split weighted by multiply-adds per token: the embedding lookup
 * costs nothing, the LM head V x C, a MoE layer its top_k experts), the first
 * stage also holding the embedding (with OPT's project_in) and the last the
 * final norm, project_out and LM head (and the embedding again when they
 * are tied); and the one-line summary
 * of what a rank holds. Counting parameters reads no weights: the sizes
 * come from the policy's containers and the config.
 * Not here: building the stage's arena (model_build.c) or moving
 * activations between stages (pipeline.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/pipe.h"
#include "inference/model_internal.h"

bool dsc_infer_stage_holds(const dsc_infer_stage *st, const dsc_infer_model_config *mc, int32_t c,
                           dsc_param_role role) {
    if (!st) return true;
    if (c < mc->n_layer) return c >= st->layer0 && c < st->layer1;
    switch (role) {
    case DSC_PARAM_ROLE_EMBED:
        return st->first || (st->last && mc->tie_embeddings);
    case DSC_PARAM_ROLE_POS_EMBED:
    case DSC_PARAM_ROLE_PROJ_IN:
        return st->first;
    case DSC_PARAM_ROLE_FINAL_NORM_W:
    case DSC_PARAM_ROLE_FINAL_NORM_B:
    case DSC_PARAM_ROLE_PROJ_OUT:
    case DSC_PARAM_ROLE_UNEMBED:
        return st->last;
    default:
        return true;
    }
}

static const dsc_container_def *container(const dsc_policy *p, const dsc_infer_model_config *mc, int32_t c) {
    if (c >= mc->n_layer) return p->non_layer;
    return p->dense_layer && !dsc_model_is_moe_layer(mc, c) ? p->dense_layer : p->layer;
}

/* Parameters of container c whose role passes `want` (NULL: all); per
 * token, an expert's count top_k times rather than once per expert (a token
 * computes with top_k of them). */
static double count_params(const dsc_policy *p, const dsc_infer_model_config *mc, int32_t c,
                           bool (*want)(dsc_param_role), bool per_token) {
    const dsc_container_def *def = container(p, mc, c);
    double n = 0;
    for (int i = 0; i < def->n_params; i++) {
        const dsc_param_def *pd = &def->params[i];
        if (!dsc_slot_enabled(pd, mc) || (want && !want(pd->role))) continue;
        int64_t shape[3];
        int nd = dsc_param_def_shape(pd, mc, shape);
        double numel = 1;
        for (int d = 0; d < nd; d++)
            numel *= (double)shape[d];
        if (per_token && pd->per_expert && shape[0] > 0) numel = numel / (double)shape[0] * mc->top_k;
        n += numel;
    }
    return n;
}

/* What the first stage holds of the non-layer parameters (the rest is the last stage's). */
static bool is_embedding(dsc_param_role r) {
    return r == DSC_PARAM_ROLE_EMBED || r == DSC_PARAM_ROLE_POS_EMBED || r == DSC_PARAM_ROLE_PROJ_IN;
}

static bool is_proj_in(dsc_param_role r) {
    return r == DSC_PARAM_ROLE_PROJ_IN;
}

/* bounds (P + 1) over the L layers by DeepSpeed's balanced partition of
 * [embedding, layers..., head]; the LM head counts V x C even when tied
 * (the last stage holds it either way). By parameters (DeepSpeed's
 * "parameters"), or by compute: multiply-adds per token, where the
 * embedding is a lookup (only OPT's project_in computes) and a MoE layer's
 * experts count top_k times, so that the last stage's LM head weighs what
 * it costs; there the ends are folded into the first and last layer's
 * items, so that a heavy head cannot leave the last stage without layers. */
static dsc_status partition_balanced(const dsc_policy *p, const dsc_infer_model_config *mc, int P, bool compute,
                                     int *bounds) {
    int32_t L = mc->n_layer;
    double *w = malloc((size_t)(L + 2) * sizeof *w);
    int *items = malloc((size_t)(P + 1) * sizeof *items);
    if (!w || !items) {
        free(w), free(items);
        return dsc_error(DSC_ERR_NOMEM, "pipeline partition of %d layers", L);
    }
    double embed = count_params(p, mc, L, is_embedding, false);
    w[0] = compute ? count_params(p, mc, L, is_proj_in, false) : embed;
    for (int32_t l = 0; l < L; l++)
        w[l + 1] = count_params(p, mc, l, NULL, compute);
    w[L + 1] =
        count_params(p, mc, L, NULL, false) - embed + (double)mc->vocab_size * mc->d_model * mc->tie_embeddings;
    if (compute) { /* items: the L layers, the first and last with the ends */
        w[1] += w[0];
        w[L] += w[L + 1];
    }
    dsc_status s = dsc_pipe_partition_balanced(compute ? w + 1 : w, compute ? L : L + 2, P, items);
    /* without folding, item i + 1 is layer i */
    for (int k = 0; !s && k <= P; k++)
        bounds[k] = compute ? items[k] : items[k] < 1 ? 0 : items[k] - 1 > L ? L : items[k] - 1;
    bounds[P] = L;
    free(w), free(items);
    return s;
}

dsc_status dsc_infer_stage_plan(const dsc_policy *policy, const dsc_infer_model_config *mc, const dsc_infer_pp *pp,
                                dsc_infer_stage *out, int32_t *max_layers) {
    int64_t budget = pp ? pp->max_weight_bytes : 0;
    *out = (dsc_infer_stage){0, mc->n_layer, true, true, budget};
    *max_layers = mc->n_layer;
    if (!pp || !pp->comm) return NULL;
    int P = dsc_comm_size(pp->comm), stage = dsc_comm_rank(pp->comm);
    const char *method = pp->partition_method ? pp->partition_method : "uniform";
    DSC_CHECK(mc->n_layer >= P, DSC_ERR_CONFIG,
              "pipeline: %d layers cannot fill %d stages (one layer at least each)", mc->n_layer, P);
    int *bounds = malloc((size_t)(P + 1) * sizeof *bounds);
    DSC_CHECK(bounds, DSC_ERR_NOMEM, "pipeline partition into %d stages", P);
    dsc_status s = NULL;
    if (strcmp(method, "uniform") == 0)
        dsc_pipe_partition_uniform(mc->n_layer, P, bounds);
    else if (strcmp(method, "parameters") == 0 || strcmp(method, "compute") == 0)
        s = partition_balanced(policy, mc, P, strcmp(method, "compute") == 0, bounds);
    else
        s = dsc_error(DSC_ERR_UNSUPPORTED,
                      "pipeline partition_method \"%s\": serving supports uniform, parameters and compute",
                      method);
    *max_layers = 0;
    for (int k = 0; !s && k < P; k++) {
        if (bounds[k + 1] <= bounds[k])
            s = dsc_error(DSC_ERR_CONFIG, "pipeline partition_method %s leaves stage %d of %d without layers",
                          method, k, P);
        else if (bounds[k + 1] - bounds[k] > *max_layers)
            *max_layers = bounds[k + 1] - bounds[k];
    }
    if (!s) *out = (dsc_infer_stage){bounds[stage], bounds[stage + 1], stage == 0, stage == P - 1, budget};
    free(bounds);
    return s;
}

void dsc_infer_stage_attach(dsc_infer_model *m, const dsc_infer_pp *pp, int32_t max_layers) {
    m->pp_max_layers = max_layers;
    if (!pp || !pp->comm) return;
    m->pipe_comm = pp->comm;
    m->stage = dsc_comm_rank(pp->comm);
    m->stages = dsc_comm_size(pp->comm);
}

void dsc_infer_model_describe(const dsc_infer_model *m, char *buf, size_t len) {
    const dsc_infer_model_config *c = &m->cfg, *sh = &m->shard;
    int n = snprintf(buf, len, "stage %d of %d: layers %d-%d%s%s", m->stage, m->stages, m->layer0, m->layer1 - 1,
                     m->first ? ", embedding" : "", m->last ? ", final norm + LM head" : "");
    if (n >= 0 && (size_t)n < len && m->tp_comm)
        n += snprintf(buf + n, len - (size_t)n,
                      "; tp rank %d of %d: %d of %d heads, %d of %d KV heads, F %d of %d, vocabulary rows "
                      "[%lld, %lld)",
                      m->tp_rank, dsc_comm_size(m->tp_comm), sh->n_head, c->n_head, sh->n_kv_head, c->n_kv_head,
                      sh->d_ff, c->d_ff, (long long)m->vocab0, (long long)(m->vocab0 + sh->vocab_size));
    if (n >= 0 && (size_t)n < len && m->ep_comm)
        n += snprintf(buf + n, len - (size_t)n, "; ep rank %d of %d: experts [%d, %d) of %d",
                      dsc_comm_rank(m->ep_comm), dsc_comm_size(m->ep_comm), sh->expert0,
                      sh->expert0 + dsc_model_local_experts(sh), c->n_experts);
    if (n >= 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "; %zu bytes of weights", m->arena_bytes);
}
