/* dsc/infer_grid.h — the ranks of one served model replica, as dsc-generate
 * and dsc-serve lay them out: tp x pp x ep ranks on DeepSpeed's grid (axes
 * pipe, data, model; rank = (stage * ep + replica) * tp + shard), the
 * expert-parallel groups along the data axis (each expert's width still
 * TP-split inside a model group, DeepSpeed's enable_expert_tensor_parallelism).
 * The communicators go to dsc_infer_model_load_parallel (tp, pipe, ep) and to
 * the server (world, tp, pipe). Not here: loading (dsc/inference.h). */
#ifndef DSC_INFER_GRID_H
#define DSC_INFER_GRID_H

#include <stdio.h>

#include "dsc/api.h"
#include "dsc/comm.h"
#include "dsc/inference.h"
#include "dsc/status.h"
#include "dsc/topology.h"

typedef struct dsc_infer_grid {
    dsc_comm *world;          /* NULL when the job is one rank */
    dsc_groups *groups;       /* NULL when the job is one rank */
    dsc_comm *tp, *pipe, *ep; /* NULL when of size 1 */
} dsc_infer_grid;

/* Collective over MPI_COMM_WORLD (initialised by the caller): the world
 * must have exactly tp * pp * ep ranks (DSC_ERR_CONFIG naming the degrees,
 * the world size and the dsc-launch -n to use otherwise; `program` names
 * who asks). */
DSC_API dsc_status dsc_infer_grid_create(const char *program, int tp, int pp, int ep, dsc_infer_grid *out);
DSC_API void dsc_infer_grid_free(dsc_infer_grid *g);

/* Collective over the grid's world: rank 0 writes to fp, in rank order, one
 * line per rank saying which layers, shards and experts it holds
 * (dsc_infer_model_describe). Nothing on one rank. */
DSC_API void dsc_infer_grid_print(const dsc_infer_grid *g, const dsc_infer_model *m, FILE *fp);

#endif
