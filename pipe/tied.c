/* Tied weights across pipeline stages (DeepSpeed's TiedLayerSpec groups):
 * for every tied parameter name, in sorted order, the stages holding a layer
 * tied on it form a communicator; its gradient is summed over that group at
 * ReduceTiedGrads and its value copied from the group's lowest stage after
 * initialisation or restore. Only the lowest stage counts the parameter in
 * the global gradient norm (DeepSpeed's ds_pipe_replicated).
 *
 * Not here: data-parallel reduction (the optimizer, after this), sharing a
 * tied parameter between layers of one stage (the parameter store returns
 * the same parameter for the same name). */
#include <stdlib.h>
#include <string.h>

#include "dsc/pipe.h"

typedef struct tie_group {
    char name[DSC_PARAM_NAME_MAX];
    dsc_comm *comm; /* the stages holding it; NULL when this stage does not */
    dsc_param *param;
    bool lowest; /* this stage is the group's lowest */
} tie_group;

struct dsc_pipe_tied {
    tie_group *groups;
    int n;
};

static int by_name(const void *a, const void *b) {
    return strcmp(((const tie_group *)a)->name, ((const tie_group *)b)->name);
}

/* The distinct tied names of the module, sorted. */
static dsc_status collect_names(const dsc_pipe_module *m, dsc_pipe_tied *t) {
    int n = dsc_pipe_module_layer_count(m);
    t->groups = calloc((size_t)n, sizeof *t->groups);
    DSC_CHECK(t->groups, DSC_ERR_NOMEM, "tied weights: %d entries", n);
    for (int i = 0; i < n; i++) {
        const char *name = dsc_pipe_module_layer(m, i)->tied;
        bool seen = !name[0];
        for (int g = 0; g < t->n && !seen; g++)
            seen = strcmp(t->groups[g].name, name) == 0;
        if (!seen) snprintf(t->groups[t->n++].name, DSC_PARAM_NAME_MAX, "%s", name);
    }
    qsort(t->groups, (size_t)t->n, sizeof *t->groups, by_name);
    return NULL;
}

/* Stages holding a layer tied on `name`, ascending. */
static int holders(const dsc_pipe_module *m, const char *name, int *stages) {
    int count = 0;
    for (int s = 0; s < dsc_pipe_module_stages(m); s++) {
        bool holds = false;
        for (int c = 0; c < dsc_pipe_module_chunks(m) && !holds; c++) {
            int first, end;
            dsc_pipe_module_range(m, s, c, &first, &end);
            for (int i = first; i < end && !holds; i++)
                holds = strcmp(dsc_pipe_module_layer(m, i)->tied, name) == 0;
        }
        if (holds) stages[count++] = s;
    }
    return count;
}

void dsc_pipe_tied_destroy(dsc_pipe_tied *t) {
    if (!t) return;
    for (int g = 0; g < t->n; g++)
        dsc_comm_free(t->groups[g].comm);
    free(t->groups);
    free(t);
}

static dsc_status setup(dsc_pipe_tied *t, const dsc_pipe_module *m, int stage, dsc_comm *pipe,
                        dsc_param_store *params) {
    DSC_TRY(collect_names(m, t));
    int P = dsc_pipe_module_stages(m);
    int *stages = malloc((size_t)P * sizeof *stages);
    DSC_CHECK(stages, DSC_ERR_NOMEM, "tied weights: %d stages", P);
    dsc_status s = NULL;
    for (int g = 0; g < t->n && !s; g++) {
        tie_group *tg = &t->groups[g];
        int count = holders(m, tg->name, stages);
        bool mine = false;
        for (int i = 0; i < count; i++)
            mine |= stages[i] == stage;
        if (mine) {
            tg->param = dsc_params_find(params, tg->name);
            if (!tg->param) {
                s = dsc_error(DSC_ERR_INVALID,
                              "tied weights: stage %d holds a layer tied on %s, but no such parameter", stage,
                              tg->name);
                break;
            }
            tg->lowest = stages[0] == stage;
        }
        if (!pipe) continue; /* one stage: nothing to share */
        char label[DSC_PARAM_NAME_MAX + 8];
        snprintf(label, sizeof label, "tied:%s", tg->name);
        /* Collective over the pipe: a stage outside the group joins a group of itself. */
        s = mine ? dsc_comm_create_sub(pipe, stages, count, label, &tg->comm)
                 : dsc_comm_create_sub(pipe, &stage, 1, label, &tg->comm);
        if (!s && !mine) {
            dsc_comm_free(tg->comm);
            tg->comm = NULL;
        }
    }
    free(stages);
    return s;
}

dsc_status dsc_pipe_tied_create(const dsc_pipe_module *m, const dsc_pipe_stage *stage, dsc_comm *pipe,
                                dsc_param_store *params, dsc_pipe_tied **out) {
    *out = NULL;
    dsc_pipe_tied *t = calloc(1, sizeof *t);
    DSC_CHECK(t, DSC_ERR_NOMEM, "tied weights: out of memory");
    dsc_status s = setup(t, m, dsc_pipe_stage_id(stage), pipe, params);
    if (s) {
        dsc_pipe_tied_destroy(t);
        return s;
    }
    *out = t;
    return NULL;
}

dsc_status dsc_pipe_tied_sync_values(dsc_pipe_tied *t) {
    for (int g = 0; g < t->n; g++) {
        tie_group *tg = &t->groups[g];
        if (!tg->comm || dsc_comm_size(tg->comm) == 1) continue;
        dsc_status s = dsc_comm_broadcast(tg->comm, &tg->param->value, 0);
        if (s) return dsc_error_wrap(s, "tied weights: copying %s from the lowest stage", tg->name);
    }
    return NULL;
}

dsc_status dsc_pipe_tied_reduce_grads(dsc_pipe_tied *t) {
    for (int g = 0; g < t->n; g++) {
        tie_group *tg = &t->groups[g];
        if (!tg->comm || dsc_comm_size(tg->comm) == 1) continue;
        dsc_status s = dsc_comm_allreduce(tg->comm, &tg->param->grad, DSC_REDUCE_OP_SUM);
        if (s) return dsc_error_wrap(s, "ReduceTiedGrads: summing the gradient of %s over its stages", tg->name);
    }
    return NULL;
}

bool dsc_pipe_tied_counts_in_norm(const dsc_param *param, void *ctx) {
    const dsc_pipe_tied *t = ctx;
    for (int g = 0; g < t->n; g++)
        if (t->groups[g].param == param) return t->groups[g].lowest;
    return true;
}
