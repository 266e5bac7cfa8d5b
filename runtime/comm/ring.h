/* ring.h — ring reduce-scatter and all-gather over MPI point-to-point, the
 * MPI backend's algorithm for large messages (see docs/comm.md for why). */
#ifndef DSC_COMM_RING_H
#define DSC_COMM_RING_H

#include "runtime/comm/comm_internal.h"

/* A partition of a buffer into one piece per rank (elements). */
typedef struct dsc_ring_pieces {
    const int64_t *counts; /* (P) */
    const int64_t *displs; /* (P) offset of each piece */
    int64_t max_count;
} dsc_ring_pieces;

/* out = reduction over ranks of piece `rank` of `src`. out may alias
 * src's own piece. tmp_a and tmp_b hold max_count elements each. */
dsc_status dsc_ring_reduce_scatter(const dsc_comm *c, MPI_Comm mpi, const char *what, const void *src, void *out,
                                   const dsc_ring_pieces *pieces, dsc_dtype dtype, dsc_reduce_op op, void *tmp_a,
                                   void *tmp_b);

/* In place: buf holds this rank's piece at its offset; on return it holds all. */
dsc_status dsc_ring_allgather(const dsc_comm *c, MPI_Comm mpi, const char *what, void *buf,
                              const dsc_ring_pieces *pieces, dsc_dtype dtype);

#endif
