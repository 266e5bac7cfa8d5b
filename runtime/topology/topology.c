/* topology.c — a grid of ranks with named axes, row-major with the last axis
 * fastest (DeepSpeed's ProcessTopology), and the lists of ranks along one
 * axis. Pure arithmetic: no MPI, no communicators.
 * Not here: which groups a training job needs (groups_plan.c). */
#include "dsc/topology.h"

#include <stdio.h>
#include <string.h>

dsc_status dsc_topology_init(dsc_topology *t, int naxes, const char *const *axes, const int *dims) {
    memset(t, 0, sizeof *t);
    DSC_CHECK(naxes >= 1 && naxes <= DSC_TOPOLOGY_MAX_AXES, DSC_ERR_INVALID, "topology: %d axes, expected 1..%d",
              naxes, DSC_TOPOLOGY_MAX_AXES);
    int64_t world = 1;
    for (int a = 0; a < naxes; a++) {
        size_t len = strlen(axes[a]);
        DSC_CHECK(len > 0 && len < DSC_TOPOLOGY_AXIS_NAME, DSC_ERR_INVALID,
                  "topology: axis %d name \"%s\" must have 1..%d characters", a, axes[a],
                  DSC_TOPOLOGY_AXIS_NAME - 1);
        DSC_CHECK(dims[a] >= 1, DSC_ERR_INVALID, "topology: axis \"%s\" has size %d, expected >= 1", axes[a],
                  dims[a]);
        for (int b = 0; b < a; b++)
            DSC_CHECK(strcmp(axes[a], axes[b]) != 0, DSC_ERR_INVALID, "topology: axis \"%s\" appears twice",
                      axes[a]);
        world *= dims[a];
        DSC_CHECK(world <= (1 << 30), DSC_ERR_INVALID, "topology: more than 2^30 ranks");
        snprintf(t->axes[a], sizeof t->axes[a], "%s", axes[a]);
        t->dims[a] = dims[a];
    }
    t->naxes = naxes;
    return NULL;
}

dsc_status dsc_topology_pipe_data_model(dsc_topology *t, int pp, int dp, int tp) {
    static const char *const axes[] = {"pipe", "data", "model"};
    return dsc_topology_init(t, 3, axes, (const int[]){pp, dp, tp});
}

int dsc_topology_world_size(const dsc_topology *t) {
    int world = 1;
    for (int a = 0; a < t->naxes; a++)
        world *= t->dims[a];
    return world;
}

int dsc_topology_axis(const dsc_topology *t, const char *axis) {
    for (int a = 0; a < t->naxes; a++)
        if (strcmp(t->axes[a], axis) == 0) return a;
    return -1;
}

int dsc_topology_dim(const dsc_topology *t, const char *axis) {
    int a = dsc_topology_axis(t, axis);
    return a < 0 ? 0 : t->dims[a];
}

/* Ranks between neighbours along axis a: the product of the faster axes' dims. */
static int stride(const dsc_topology *t, int a) {
    int s = 1;
    for (int b = a + 1; b < t->naxes; b++)
        s *= t->dims[b];
    return s;
}

dsc_status dsc_topology_coord(const dsc_topology *t, int rank, int *coord) {
    int world = dsc_topology_world_size(t);
    DSC_CHECK(rank >= 0 && rank < world, DSC_ERR_INVALID, "topology: rank %d not in [0, %d)", rank, world);
    for (int a = t->naxes - 1; a >= 0; a--) {
        coord[a] = rank % t->dims[a];
        rank /= t->dims[a];
    }
    return NULL;
}

dsc_status dsc_topology_rank(const dsc_topology *t, const int *coord, int *rank) {
    int r = 0;
    for (int a = 0; a < t->naxes; a++) {
        DSC_CHECK(coord[a] >= 0 && coord[a] < t->dims[a], DSC_ERR_INVALID,
                  "topology: coordinate %s=%d not in [0, %d)", t->axes[a], coord[a], t->dims[a]);
        r = r * t->dims[a] + coord[a];
    }
    *rank = r;
    return NULL;
}

dsc_status dsc_topology_axis_lists(const dsc_topology *t, const char *axis, dsc_group_list *out) {
    memset(out, 0, sizeof *out);
    int a = dsc_topology_axis(t, axis);
    if (a < 0) return NULL;
    int world = dsc_topology_world_size(t), dim = t->dims[a], step = stride(t, a);
    DSC_TRY(dsc_mem_alloc((void **)&out->ranks, (size_t)world * sizeof(int), DSC_MEM_OTHER, DSC_CPU));
    out->size = dim;
    out->count = world / dim;
    /* Ranks with coordinate 0 on the axis, in increasing order, enumerate the
     * other axes' combinations in row-major order; each starts one list. */
    int g = 0;
    for (int base = 0; base < world; base++) {
        if ((base / step) % dim != 0) continue;
        for (int k = 0; k < dim; k++)
            out->ranks[g * dim + k] = base + k * step;
        g++;
    }
    return NULL;
}

const int *dsc_group_list_at(const dsc_group_list *l, int group) {
    DSC_ASSERT(group >= 0 && group < l->count);
    return l->ranks + (size_t)group * l->size;
}

int dsc_group_list_find(const dsc_group_list *l, int rank) {
    for (int i = 0; i < l->count * l->size; i++)
        if (l->ranks[i] == rank) return i / l->size;
    return -1;
}

void dsc_group_list_free(dsc_group_list *l) {
    dsc_mem_free(l->ranks, (size_t)l->count * l->size * sizeof(int), DSC_MEM_OTHER, DSC_CPU);
    memset(l, 0, sizeof *l);
}
