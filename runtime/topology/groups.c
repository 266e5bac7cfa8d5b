/* groups.c — the calling rank's communicators for every group kind of a plan
 * (world, pipe, data-parallel, tensor-parallel, expert-parallel,
 * expert-data-parallel), each created collectively over the world and named
 * after its kind so that errors and timeouts say which group failed.
 * Not here: deciding the members (groups_plan.c). */
#include "dsc/topology.h"

struct dsc_groups {
    dsc_comm *comms[DSC_GROUP_KIND_COUNT];
};

dsc_status dsc_groups_create(dsc_comm *world, const dsc_group_plan *plan, dsc_groups **out) {
    *out = NULL;
    DSC_CHECK(dsc_comm_size(world) == plan->world_size && dsc_comm_rank(world) == plan->rank, DSC_ERR_INVALID,
              "groups: the plan is for rank %d of %d but communicator \"%s\" is rank %d of %d", plan->rank,
              plan->world_size, dsc_comm_name(world), dsc_comm_rank(world), dsc_comm_size(world));
    dsc_groups *g;
    DSC_TRY(dsc_mem_alloc((void **)&g, sizeof *g, DSC_MEM_OTHER, DSC_CPU));
    /* Every rank creates every kind in the same order: creation is collective. */
    for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++) {
        int count;
        const int *members = dsc_group_plan_members(plan, (dsc_group_kind)k, &count);
        dsc_status s =
            dsc_comm_create_sub(world, members, count, dsc_group_kind_name((dsc_group_kind)k), &g->comms[k]);
        if (s) {
            dsc_groups_free(g);
            return s;
        }
    }
    *out = g;
    return NULL;
}

dsc_comm *dsc_groups_get(const dsc_groups *g, dsc_group_kind k) {
    DSC_ASSERT((unsigned)k < DSC_GROUP_KIND_COUNT);
    return g->comms[k];
}

void dsc_groups_free(dsc_groups *g) {
    if (!g) return;
    for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++)
        dsc_comm_free(g->comms[k]);
    dsc_mem_free(g, sizeof *g, DSC_MEM_OTHER, DSC_CPU);
}
