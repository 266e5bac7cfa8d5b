/* dsc/topology.h — the process grid and the groups derived from it.
 *
 * A dsc_topology is a grid of ranks with named axes, row-major with the last
 * axis fastest, exactly as DeepSpeed's ProcessTopology. The standard grid is
 * DeepSpeed's PipeModelDataParallelTopology: axes (pipe, data, model), so
 *     rank = (pipe * dp + data) * tp + model
 * (docs/topology.md has a worked example). From it, dsc_groups_plan derives
 * the member lists of every group kind — pipeline, data-parallel, tensor
 * (model) parallel, expert-parallel, expert-data-parallel — as DeepSpeed forms
 * them. Planning is a pure function of (world size, degrees): it needs no MPI
 * and can be checked for thousands of ranks. dsc_groups_create then makes the
 * calling rank's communicators from a plan.
 *
 * Not here: moving data (dsc/comm.h). */
#ifndef DSC_TOPOLOGY_H
#define DSC_TOPOLOGY_H

#include "dsc/api.h"
#include <stdbool.h>

#include "dsc/comm.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_TOPOLOGY_MAX_AXES 8
#define DSC_TOPOLOGY_AXIS_NAME 16

typedef struct dsc_topology {
    int naxes;
    char axes[DSC_TOPOLOGY_MAX_AXES][DSC_TOPOLOGY_AXIS_NAME];
    int dims[DSC_TOPOLOGY_MAX_AXES];
} dsc_topology;

/* A list of equally sized groups of ranks. */
typedef struct dsc_group_list {
    int count;  /* number of groups */
    int size;   /* ranks per group */
    int *ranks; /* (count, size) */
} dsc_group_list;

/* ---- topology ----------------------------------------------------------------- */

/* Axis names must be distinct and non-empty; every dim >= 1. */
DSC_API dsc_status dsc_topology_init(dsc_topology *t, int naxes, const char *const *axes, const int *dims);
/* Axes (pipe, data, model) with dims (pp, dp, tp). Note the order: DeepSpeed's
 * constructor takes (num_pp, num_mp, num_dp) but its axes are pipe, data, model. */
DSC_API dsc_status dsc_topology_pipe_data_model(dsc_topology *t, int pp, int dp, int tp);

DSC_API int dsc_topology_world_size(const dsc_topology *t);
DSC_API int dsc_topology_axis(const dsc_topology *t, const char *axis); /* index, or -1 */
DSC_API int dsc_topology_dim(const dsc_topology *t, const char *axis);  /* 0 when the axis is absent */

/* coord has naxes entries, in axis order. */
DSC_API dsc_status dsc_topology_coord(const dsc_topology *t, int rank, int *coord);
DSC_API dsc_status dsc_topology_rank(const dsc_topology *t, const int *coord, int *rank);

/* DeepSpeed's get_axis_comm_lists: one group per combination of the other
 * axes (in row-major order), each holding the ranks along `axis` in
 * increasing coordinate. An unknown axis gives an empty list (count 0). */
DSC_API dsc_status dsc_topology_axis_lists(const dsc_topology *t, const char *axis, dsc_group_list *out);

DSC_API const int *dsc_group_list_at(const dsc_group_list *l, int group);
/* The index of the group holding `rank`, or -1. */
DSC_API int dsc_group_list_find(const dsc_group_list *l, int rank);
DSC_API void dsc_group_list_free(dsc_group_list *l);

/* ---- groups --------------------------------------------------------------------- */

typedef enum dsc_group_kind {
    DSC_GROUP_KIND_WORLD = 0,
    DSC_GROUP_KIND_PIPE,        /* along `pipe`: the stages of one pipeline */
    DSC_GROUP_KIND_DATA,        /* along `data`: replicas that all-reduce dense gradients */
    DSC_GROUP_KIND_TENSOR,      /* along `model`: tensor-parallel shards */
    DSC_GROUP_KIND_EXPERT,      /* expert-parallel: ranks that split the experts (all-to-all) */
    DSC_GROUP_KIND_EXPERT_DATA, /* expert-data-parallel: ranks holding the same experts */
    DSC_GROUP_KIND_COUNT
} dsc_group_kind;

typedef struct dsc_parallel_dims {
    int pp; /* pipeline stages (>= 1) */
    int dp; /* data-parallel degree; 0 = world / (pp * tp) */
    int tp; /* tensor-parallel degree (>= 1) */
    int ep; /* expert-parallel size; 0 = 1 */
    /* DeepSpeed's enable_expert_tensor_parallelism: expert groups are cut from
     * the data-parallel groups (_create_expert_data_and_model_parallel) instead
     * of from consecutive ranks of a stage (_create_expert_and_data_parallel).
     * Both rules agree when tp = 1. */
    bool expert_tp;
} dsc_parallel_dims;

typedef struct dsc_group_plan {
    int world_size, rank;
    dsc_parallel_dims dims; /* with dp and ep resolved */
    dsc_topology topo;      /* pipe, data, model */
    dsc_group_list all[DSC_GROUP_KIND_COUNT];
    int mine[DSC_GROUP_KIND_COUNT]; /* index into all[k] of the group holding `rank` */
} dsc_group_plan;

/* Pure: every group of every kind for (world_size, dims), and which of them
 * `rank` belongs to. Sizes that do not divide are errors naming the numbers. */
DSC_API dsc_status dsc_groups_plan(int world_size, int rank, const dsc_parallel_dims *dims, dsc_group_plan *out);
DSC_API void dsc_group_plan_free(dsc_group_plan *p);
/* The members (world ranks, in communicator order) of the rank's group of kind k. */
DSC_API const int *dsc_group_plan_members(const dsc_group_plan *p, dsc_group_kind k, int *count);
DSC_API const char *dsc_group_kind_name(dsc_group_kind k); /* "world", "pipe", "data-parallel", ... */

/* The calling rank's communicators, one per kind, named by dsc_group_kind_name.
 * Collective over `world`, whose size and rank must match the plan's. */
typedef struct dsc_groups dsc_groups;
DSC_API dsc_status dsc_groups_create(dsc_comm *world, const dsc_group_plan *plan, dsc_groups **out);
DSC_API dsc_comm *dsc_groups_get(const dsc_groups *g, dsc_group_kind k);
DSC_API void dsc_groups_free(dsc_groups *g);

#ifdef __cplusplus
}
#endif
#endif
