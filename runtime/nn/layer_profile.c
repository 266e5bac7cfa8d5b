/* The per-layer recorder behind the FLOPs profiler: while a profile is open,
 * every dsc_layer_forward / dsc_layer_backward adds its wall time and the
 * kernels' FLOP count over the call to the record of its layer. A layer that
 * calls other layers (a block) holds its children's time and FLOPs too; its
 * depth says how deep it sat. One profile at a time per process, on the
 * thread that runs the layers (dsc runs them on one thread per rank). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/engine.h" /* dsc_time_now */
#include "dsc/kernels.h"
#include "dsc/nn.h"
#include "runtime/nn/nn_internal.h"

static struct {
    bool open;
    int depth;
    dsc_layer_profile *rows;
    int n, cap;
    bool out_of_memory;
} prof;

void dsc_layer_profile_begin(void) {
    free(prof.rows);
    memset(&prof, 0, sizeof prof);
    prof.open = true;
}

dsc_status dsc_layer_profile_end(dsc_layer_profile **rows, int *n) {
    bool oom = prof.out_of_memory;
    *rows = prof.rows;
    *n = prof.n;
    memset(&prof, 0, sizeof prof);
    if (oom) {
        free(*rows);
        *rows = NULL;
        *n = 0;
        return dsc_error(DSC_ERR_NOMEM, "layer profile: out of memory recording layers");
    }
    return NULL;
}

static dsc_layer_profile *row_of(const dsc_layer *layer) {
    for (int i = 0; i < prof.n; i++)
        if (prof.rows[i].layer == layer) return &prof.rows[i];
    if (prof.n == prof.cap) {
        int cap = prof.cap ? 2 * prof.cap : 32;
        dsc_layer_profile *grown = realloc(prof.rows, (size_t)cap * sizeof *grown);
        if (!grown) {
            prof.out_of_memory = true;
            return NULL;
        }
        prof.rows = grown, prof.cap = cap;
    }
    dsc_layer_profile *r = &prof.rows[prof.n++];
    memset(r, 0, sizeof *r);
    r->layer = layer;
    snprintf(r->name, sizeof r->name, "%s", layer->name);
    r->type = layer->ops->type;
    r->depth = prof.depth;
    for (int j = 0; j < layer->n_params; j++)
        r->params += dsc_param_numel(layer->params[j]);
    return r;
}

nn_profile_mark nn_profile_enter(const dsc_layer *layer) {
    if (!prof.open) return (nn_profile_mark){-1, 0, 0};
    dsc_layer_profile *r = row_of(layer);
    prof.depth++;
    if (!r) return (nn_profile_mark){-1, 0, 0};
    return (nn_profile_mark){(int)(r - prof.rows), dsc_time_now(), dsc_kernel_flop_count()};
}

void nn_profile_leave(nn_profile_mark mark, bool backward) {
    if (mark.row < 0 || !prof.open) return;
    prof.depth--;
    dsc_layer_profile *r = &prof.rows[mark.row];
    double dt = dsc_time_now() - mark.t0;
    int64_t flops = dsc_kernel_flop_count() - mark.flops0;
    if (backward) {
        r->bwd_s += dt, r->bwd_flops += flops, r->bwd_calls++;
    } else {
        r->fwd_s += dt, r->fwd_flops += flops, r->fwd_calls++;
    }
}
