/* ring.h — ring reduce-scatter and all-gather over MPI point-to-point, the
 * MPI backend's algorithm for large messages (see docs/comm.md for why), as
 * resumable state machines: start posts the first step, advance tests the
 * step in flight and, once it completed, reduces and posts the next, so one
 * algorithm serves the blocking calls (advance until done) and the
 * non-blocking ones (advance whenever the caller tests its request). */
#ifndef DSC_COMM_RING_H
#define DSC_COMM_RING_H

#include "runtime/comm/comm_internal.h"

/* A partition of a buffer into one piece per rank (elements). */
typedef struct dsc_ring_pieces {
    const int64_t *counts; /* (P) */
    const int64_t *displs; /* (P) offset of each piece */
    int64_t max_count;
} dsc_ring_pieces;

/* One ring operation in flight. The buffers, pieces and temporaries belong
 * to the caller and must outlive it. */
typedef struct dsc_ring {
    const dsc_comm *comm;
    MPI_Comm mpi;
    const char *what;
    int tag;
    bool reduce; /* reduce-scatter; otherwise all-gather */
    dsc_ring_pieces pieces;
    dsc_dtype dtype;
    dsc_reduce_op op;
    const void *src;          /* reduce-scatter: the input; all-gather: this rank's piece, or NULL */
    void *out;                /* reduce-scatter: this rank's reduced piece; all-gather: the buffer, in place */
    void *partial, *incoming; /* reduce-scatter: max_count elements each */
    int step;                 /* steps completed, of P - 1 */
    bool posted;              /* step `step` is in flight in reqs */
    MPI_Request reqs[2];
} dsc_ring;

/* out = reduction over ranks of piece `rank` of `src`; out may alias src's
 * own piece. tmp_a and tmp_b hold max_count elements each. */
dsc_status dsc_ring_start_reduce_scatter(dsc_ring *r, const dsc_comm *c, MPI_Comm mpi, const char *what, int tag,
                                         const void *src, void *out, const dsc_ring_pieces *pieces,
                                         dsc_dtype dtype, dsc_reduce_op op, void *tmp_a, void *tmp_b);

/* Once done buf holds every rank's piece. own: where this rank's piece is sent from in the first
 * step (the caller copies it to its offset in buf while that step is in flight), or NULL where it
 * is already there. */
dsc_status dsc_ring_start_allgather(dsc_ring *r, const dsc_comm *c, MPI_Comm mpi, const char *what, int tag,
                                    void *buf, const void *own, const dsc_ring_pieces *pieces, dsc_dtype dtype);

/* Tests the step in flight; sets *done once every step has completed. */
dsc_status dsc_ring_advance(dsc_ring *r, bool *done);

/* Gives up a ring that will not be finished (a timeout): cancels its receive. */
void dsc_ring_abandon(dsc_ring *r);

#endif
