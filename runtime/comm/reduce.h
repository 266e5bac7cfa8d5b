/* reduce.h — elementwise reductions of host buffers for the MPI backend's own
 * algorithms (ring reduce-scatter / all-reduce), for every dsc dtype. */
#ifndef DSC_COMM_REDUCE_H
#define DSC_COMM_REDUCE_H

#include <stdint.h>

#include "dsc/comm.h"

/* out[i] = a[i] op b[i] for n elements; AVG adds (the division comes once, at
 * the end, from dsc_comm_reduce_finish). out may alias a or b. Half types are
 * combined in f32 and rounded back. */
void dsc_comm_reduce_local(void *out, const void *a, const void *b, int64_t n, dsc_dtype dtype, dsc_reduce_op op);

/* Divides n elements by `size` when op is AVG (integers truncate toward zero). */
void dsc_comm_reduce_finish(void *data, int64_t n, dsc_dtype dtype, dsc_reduce_op op, int size);

#endif
