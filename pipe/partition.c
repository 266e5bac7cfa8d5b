/* DeepSpeed's two partition algorithms, restated: uniform (by layer count)
 * and balanced (a dynamic program over contiguous splits minimising the
 * spread between the heaviest and the lightest part). The module turns its
 * partition methods ("uniform", "parameters", "type:REGEX") into weights and
 * calls these; stage boundaries therefore match DeepSpeed's for the same
 * inputs.
 *
 * Not here: what the weights mean (pipe/module.c). */
#include <math.h>
#include <stdlib.h>

#include "dsc/pipe.h"

void dsc_pipe_partition_uniform(int n, int parts, int *bounds) {
    if (n <= parts) {
        for (int p = 0; p <= parts; p++)
            bounds[p] = p < n ? p : n;
        return;
    }
    /* The first n mod parts parts take one extra item (DeepSpeed >= 0.10.1). */
    int chunk = n / parts, extra = n % parts;
    bounds[0] = 0;
    for (int p = 0; p < parts; p++)
        bounds[p + 1] = bounds[p] + chunk + (p < extra ? 1 : 0);
}

dsc_status dsc_pipe_partition_balanced(const double *weights, int n, int parts, int *bounds) {
    DSC_CHECK(n >= 0 && parts >= 1, DSC_ERR_INVALID, "partition: %d items into %d parts", n, parts);
    for (int i = 0; i < n; i++)
        DSC_CHECK(weights[i] >= 0 && isfinite(weights[i]), DSC_ERR_INVALID, "partition: weight %d is %g", i,
                  weights[i]);
    if (n <= parts) {
        dsc_pipe_partition_uniform(n, parts, bounds);
        return NULL;
    }
    /* best_* [i][j]: the best split of the first i items into j parts, as its
     * heaviest part, lightest part, spread, and the start of its last part. */
    size_t cells = (size_t)(n + 1) * (size_t)(parts + 1);
    double *prefix = malloc((size_t)(n + 1) * sizeof *prefix);
    double *hi = malloc(cells * sizeof *hi), *lo = malloc(cells * sizeof *lo),
           *cost = malloc(cells * sizeof *cost);
    int *from = calloc(cells, sizeof *from);
    if (!prefix || !hi || !lo || !cost || !from) {
        free(prefix), free(hi), free(lo), free(cost), free(from);
        return dsc_error(DSC_ERR_NOMEM, "partition: tables for %d items into %d parts", n, parts);
    }
#define AT(i, j) ((size_t)(i) * (size_t)(parts + 1) + (size_t)(j))
    for (size_t c = 0; c < cells; c++)
        hi[c] = lo[c] = cost[c] = INFINITY;
    prefix[0] = 0;
    for (int i = 0; i < n; i++)
        prefix[i + 1] = prefix[i] + weights[i];
    hi[AT(0, 0)] = 0;
    cost[AT(0, 0)] = 0;
    for (int i = 1; i <= n; i++) {
        for (int j = 1; j <= (i < parts ? i : parts); j++) {
            for (int k = 0; k < i; k++) {
                double last = prefix[i] - prefix[k];
                double h = fmax(hi[AT(k, j - 1)], last), l = fmin(lo[AT(k, j - 1)], last);
                double c = h - l;
                /* ">=": an equal spread moves the split later, as DeepSpeed's does. */
                if (cost[AT(i, j)] >= c) {
                    cost[AT(i, j)] = c;
                    hi[AT(i, j)] = h;
                    lo[AT(i, j)] = l;
                    from[AT(i, j)] = k;
                }
            }
        }
    }
    bounds[parts] = n;
    for (int j = parts; j >= 1; j--)
        bounds[j - 1] = from[AT(bounds[j], j)];
#undef AT
    free(prefix), free(hi), free(lo), free(cost), free(from);
    return NULL;
}
