/* Per-expert load over a run, for every MoE layer of the model: the stats of
 * the layers each rank holds, summed over all ranks (each rank gates its own
 * tokens; layers held elsewhere add zeros), printed by rank 0. The ranks of
 * a tensor-parallel group gate the same tokens, so only the group's rank 0
 * adds its counts. Not here: the statistics themselves (layer.c) or when to
 * print (the apps). */
#include <stdio.h>
#include <string.h>

#include "dsc/moe.h"

dsc_status dsc_moe_report_load(dsc_comm *world, dsc_comm *tensor_group, int L, int E, dsc_layer *const *layers,
                               int n, FILE *out) {
    int64_t shape[3] = {L, E, 3};
    dsc_tensor counts;
    DSC_TRY(dsc_tensor_alloc(&counts, DSC_DTYPE_I64, 3, shape, DSC_CPU, DSC_MEM_OTHER));
    int64_t *c = counts.data; /* (L, E, 3) */
    memset(c, 0, (size_t)L * (size_t)E * 3 * sizeof *c);
    const bool counts_here = !tensor_group || dsc_comm_rank(tensor_group) == 0;
    for (int i = 0; counts_here && i < n; i++) {
        dsc_moe_stats st;
        dsc_status s = dsc_moe_stats_get(layers[i], &st);
        if (s) { /* not a MoE block */
            dsc_status_free(s);
            continue;
        }
        int block = -1;
        sscanf(layers[i]->name, "layers.%d", &block);
        for (int e = 0; block >= 0 && block < L && e < E; e++) {
            int64_t *row = c + ((int64_t)block * E + e) * 3;
            row[0] = st.routed[e], row[1] = st.kept[e], row[2] = st.dropped[e];
        }
    }
    dsc_status s = dsc_comm_allreduce(world, &counts, DSC_REDUCE_OP_SUM);
    if (!s && dsc_comm_rank(world) == 0) {
        fprintf(out, "per-expert load over the run (routes chosen / kept / dropped, all ranks):\n");
        for (int l = 0; l < L; l++) {
            int64_t total = 0;
            for (int e = 0; e < E; e++)
                total += c[((int64_t)l * E + e) * 3];
            if (total == 0) continue;
            fprintf(out, "  layers.%d:", l);
            for (int e = 0; e < E; e++) {
                const int64_t *row = c + ((int64_t)l * E + e) * 3;
                fprintf(out, "  e%d %lld/%lld/%lld (%.0f%%)", e, (long long)row[0], (long long)row[1],
                        (long long)row[2], 100.0 * (double)row[0] / (double)total);
            }
            fprintf(out, "\n");
        }
        fflush(out);
    }
    dsc_tensor_free(&counts);
    return s;
}
