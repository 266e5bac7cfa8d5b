/* The serving grid (dsc/infer_grid.h): DeepSpeed's groups for one replica
 * of tp x pp x ep ranks. Not here: what is loaded on them (load_*.c). */
#include <mpi.h>
#include <stdlib.h>

#include "dsc/infer_grid.h"

dsc_status dsc_infer_grid_create(const char *program, int tp, int pp, int ep, dsc_infer_grid *out) {
    *out = (dsc_infer_grid){0};
    int size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    DSC_CHECK(tp >= 1 && pp >= 1 && ep >= 1, DSC_ERR_CONFIG, "%s: --tp %d, --pp %d and --ep %d must be >= 1",
              program, tp, pp, ep);
    DSC_CHECK((int64_t)tp * pp * ep == size, DSC_ERR_CONFIG,
              "%s: --tp %d x --pp %d x --ep %d needs %lld ranks but %d were launched: one model replica, so "
              "launch it with dsc-launch -n %lld",
              program, tp, pp, ep, (long long)tp * pp * ep, size, (long long)tp * pp * ep);
    if (size == 1) return NULL;
    DSC_TRY(dsc_comm_world(NULL, &out->world));
    dsc_group_plan plan;
    dsc_parallel_dims dims = {.pp = pp, .dp = ep, .tp = tp, .ep = ep, .expert_tp = true};
    dsc_status s = dsc_groups_plan(size, rank, &dims, &plan);
    if (!s) {
        s = dsc_groups_create(out->world, &plan, &out->groups);
        dsc_group_plan_free(&plan);
    }
    if (s) {
        dsc_infer_grid_free(out);
        return s;
    }
    if (tp > 1) out->tp = dsc_groups_get(out->groups, DSC_GROUP_KIND_TENSOR);
    if (pp > 1) out->pipe = dsc_groups_get(out->groups, DSC_GROUP_KIND_PIPE);
    if (ep > 1) out->ep = dsc_groups_get(out->groups, DSC_GROUP_KIND_EXPERT);
    return NULL;
}

void dsc_infer_grid_free(dsc_infer_grid *g) {
    dsc_groups_free(g->groups);
    dsc_comm_free(g->world);
    *g = (dsc_infer_grid){0};
}

void dsc_infer_grid_print(const dsc_infer_grid *g, const dsc_infer_model *m, FILE *fp) {
    enum { LINE = 512 };
    if (!g->world) return;
    char mine[LINE];
    dsc_infer_model_describe(m, mine, sizeof mine);
    int size = dsc_comm_size(g->world), rank = dsc_comm_rank(g->world);
    char *all = rank == 0 ? malloc((size_t)size * LINE) : NULL;
    int ready = all != NULL; /* rank 0 says whether it can take the lines, so no rank gathers alone */
    MPI_Bcast(&ready, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (ready) MPI_Gather(mine, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int r = 0; all && r < size; r++)
        fprintf(fp, "[rank %d] %s\n", r, all + (size_t)r * LINE);
    free(all);
}
