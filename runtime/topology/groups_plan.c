/* groups_plan.c — the member lists of every process group of a training job,
 * as a pure function of (world size, pp, dp, tp, ep): pipeline, data-parallel
 * and tensor-parallel groups along the axes of the (pipe, data, model) grid,
 * and DeepSpeed's expert-parallel / expert-data-parallel groups.
 *
 * Expert groups, per pipeline stage (S = ranks per stage = dp * tp):
 *  - default (DeepSpeed _create_expert_and_data_parallel): expert-parallel
 *    groups are consecutive blocks of ep ranks; expert-data-parallel group i
 *    holds ranks i, i+ep, i+2ep, ... of the stage. Needs ep | S.
 *  - expert_tp (DeepSpeed _create_expert_data_and_model_parallel): each
 *    data-parallel group (ranks of one model coordinate) is cut into
 *    consecutive pieces of ep (expert-parallel groups); zipping the pieces
 *    position-wise gives the expert-data-parallel groups. Needs ep | dp.
 * Not here: communicators (groups.c). */
#include <string.h>

#include "dsc/topology.h"

static dsc_status list_alloc(dsc_group_list *l, int count, int size) {
    l->count = count;
    l->size = size;
    return dsc_mem_alloc((void **)&l->ranks, (size_t)count * size * sizeof(int), DSC_MEM_OTHER, DSC_CPU);
}

static dsc_status resolve(int world, const dsc_parallel_dims *in, dsc_parallel_dims *d) {
    *d = *in;
    if (d->ep == 0) d->ep = 1;
    DSC_CHECK(world >= 1, DSC_ERR_INVALID, "world size %d must be positive", world);
    DSC_CHECK(d->pp >= 1 && d->tp >= 1 && d->dp >= 0 && d->ep >= 1, DSC_ERR_INVALID,
              "parallel degrees must be positive (pp %d, tp %d, dp %d, ep %d)", d->pp, d->tp, d->dp, d->ep);
    DSC_CHECK(world % d->pp == 0, DSC_ERR_INVALID, "world size %d is not divisible by pipeline stages %d", world,
              d->pp);
    int stage = world / d->pp;
    DSC_CHECK(stage % d->tp == 0, DSC_ERR_INVALID,
              "the %d ranks of a pipeline stage (world %d / pp %d) are not divisible by tensor-parallel size %d",
              stage, world, d->pp, d->tp);
    if (d->dp == 0) d->dp = stage / d->tp;
    DSC_CHECK(d->pp * d->dp * d->tp == world, DSC_ERR_INVALID,
              "pp %d x dp %d x tp %d = %d does not equal world size %d", d->pp, d->dp, d->tp,
              d->pp * d->dp * d->tp, world);
    if (d->expert_tp || d->tp == 1)
        DSC_CHECK(d->dp % d->ep == 0, DSC_ERR_INVALID, "ep_size %d does not divide data-parallel size %d", d->ep,
                  d->dp);
    else
        DSC_CHECK(stage % d->ep == 0, DSC_ERR_INVALID,
                  "ep_size %d does not divide the %d ranks of a pipeline stage (data %d x model %d)", d->ep, stage,
                  d->dp, d->tp);
    return NULL;
}

/* Default rule: consecutive blocks of ep within each stage, and strided lanes. */
static dsc_status experts_by_blocks(const dsc_parallel_dims *d, int world, dsc_group_list *ep,
                                    dsc_group_list *edp) {
    int stage = world / d->pp, e = d->ep;
    DSC_TRY(list_alloc(ep, world / e, e));
    DSC_TRY(list_alloc(edp, d->pp * e, stage / e));
    for (int r = 0; r < world; r++)
        ep->ranks[r] = r; /* blocks of e consecutive ranks, in order */
    int *out = edp->ranks;
    for (int s0 = 0; s0 < world; s0 += stage)
        for (int i = 0; i < e; i++)
            for (int r = s0 + i; r < s0 + stage; r += e)
                *out++ = r;
    return NULL;
}

/* expert_tp rule: cut every data-parallel group into pieces of ep, then zip the pieces. */
static dsc_status experts_from_data_groups(const dsc_parallel_dims *d, const dsc_group_list *data,
                                           dsc_group_list *ep, dsc_group_list *edp) {
    int e = d->ep, pieces = d->dp / e;
    DSC_TRY(list_alloc(ep, data->count * pieces, e));
    DSC_TRY(list_alloc(edp, data->count * e, pieces));
    /* DeepSpeed walks the data groups stage by stage, model coordinate within
     * a stage; our data lists are ordered (pipe, model) row-major: the same. */
    for (int g = 0; g < data->count; g++) {
        const int *members = dsc_group_list_at(data, g);
        for (int k = 0; k < pieces; k++)
            for (int j = 0; j < e; j++) {
                ep->ranks[(g * pieces + k) * e + j] = members[k * e + j];
                edp->ranks[(g * e + j) * pieces + k] = members[k * e + j];
            }
    }
    return NULL;
}

static dsc_status fill(dsc_group_plan *p) {
    const dsc_parallel_dims *d = &p->dims;
    dsc_group_list *all = p->all;
    DSC_TRY(dsc_topology_pipe_data_model(&p->topo, d->pp, d->dp, d->tp));
    DSC_TRY(list_alloc(&all[DSC_GROUP_KIND_WORLD], 1, p->world_size));
    for (int r = 0; r < p->world_size; r++)
        all[DSC_GROUP_KIND_WORLD].ranks[r] = r;
    DSC_TRY(dsc_topology_axis_lists(&p->topo, "pipe", &all[DSC_GROUP_KIND_PIPE]));
    DSC_TRY(dsc_topology_axis_lists(&p->topo, "data", &all[DSC_GROUP_KIND_DATA]));
    DSC_TRY(dsc_topology_axis_lists(&p->topo, "model", &all[DSC_GROUP_KIND_TENSOR]));
    if (d->expert_tp)
        DSC_TRY(experts_from_data_groups(d, &all[DSC_GROUP_KIND_DATA], &all[DSC_GROUP_KIND_EXPERT],
                                         &all[DSC_GROUP_KIND_EXPERT_DATA]));
    else
        DSC_TRY(
            experts_by_blocks(d, p->world_size, &all[DSC_GROUP_KIND_EXPERT], &all[DSC_GROUP_KIND_EXPERT_DATA]));
    for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++) {
        p->mine[k] = dsc_group_list_find(&all[k], p->rank);
        DSC_ASSERT(p->mine[k] >= 0); /* every kind partitions the world */
    }
    return NULL;
}

dsc_status dsc_groups_plan(int world_size, int rank, const dsc_parallel_dims *dims, dsc_group_plan *out) {
    memset(out, 0, sizeof *out);
    DSC_TRY(resolve(world_size, dims, &out->dims));
    DSC_CHECK(rank >= 0 && rank < world_size, DSC_ERR_INVALID, "rank %d not in [0, %d)", rank, world_size);
    out->world_size = world_size;
    out->rank = rank;
    dsc_status s = fill(out);
    if (s) dsc_group_plan_free(out);
    return s;
}

void dsc_group_plan_free(dsc_group_plan *p) {
    for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++)
        dsc_group_list_free(&p->all[k]);
}

const int *dsc_group_plan_members(const dsc_group_plan *p, dsc_group_kind k, int *count) {
    DSC_ASSERT((unsigned)k < DSC_GROUP_KIND_COUNT);
    *count = p->all[k].size;
    return dsc_group_list_at(&p->all[k], p->mine[k]);
}

const char *dsc_group_kind_name(dsc_group_kind k) {
    static const char *names[] = {
        "world", "pipe", "data-parallel", "tensor-parallel", "expert-parallel", "expert-data-parallel"};
    return (unsigned)k < DSC_GROUP_KIND_COUNT ? names[k] : "unknown";
}
