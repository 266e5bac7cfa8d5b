/* ring.c — ring reduce-scatter and ring all-gather over MPI point-to-point.
 *
 * With P ranks each algorithm takes P-1 steps; in each step a rank sends one
 * piece to its right neighbour and receives one from its left, so every rank
 * sends and receives (P-1)/P of the data: bandwidth-optimal, and on this
 * machine several times faster than Open MPI's default all-reduce for large
 * messages (docs/comm.md). Pieces may be uneven or empty. Each operation
 * carries its own tag (the caller's, from the collective's sequence number),
 * so several rings in flight on one communicator never match each other's
 * messages, whatever order their steps are posted in.
 * Not here: choosing when to use the ring (mpi_backend.c), waiting (the
 * caller advances the ring between its own work or in dsc_comm_poll). */
#include "runtime/comm/ring.h"

#include <string.h>

#include "runtime/comm/reduce.h"

/* Callers never pass an empty buffer (collectives.c completes those without messages). */
static char *at(const void *base, const dsc_ring_pieces *pieces, int piece, size_t esize) {
    return (char *)base + (size_t)pieces->displs[piece] * esize;
}

/* At step s of a reduce-scatter rank r forwards the partial sum of piece
 * r-s-1 and receives the partial of piece r-s-2, adding its own contribution;
 * after P-1 steps the piece received is r itself, complete. At step s of an
 * all-gather rank r forwards piece r-s (its own first) and receives r-s-1. */
static void step_pieces(const dsc_ring *r, int *send_piece, int *recv_piece) {
    int p = r->comm->size, me = r->comm->rank, s = r->step;
    *send_piece = r->reduce ? (me - s - 1 + 2 * p) % p : (me - s + p) % p;
    *recv_piece = r->reduce ? (me - s - 2 + 2 * p) % p : (me - s - 1 + p) % p;
}

/* Posts step r->step: send one piece right, receive one from the left. */
static dsc_status post_step(dsc_ring *r) {
    const dsc_comm *c = r->comm;
    int right = (c->rank + 1) % c->size, left = (c->rank - 1 + c->size) % c->size;
    size_t esize = dsc_dtype_size(r->dtype);
    int send_piece, recv_piece;
    step_pieces(r, &send_piece, &recv_piece);
    const void *out = r->reduce ? (r->step == 0 ? at(r->src, &r->pieces, send_piece, esize) : r->partial)
                      : r->step == 0 && r->src ? r->src
                                               : at(r->out, &r->pieces, send_piece, esize);
    void *in = r->reduce ? r->incoming : at(r->out, &r->pieces, recv_piece, esize);
    MPI_Datatype type = dsc_comm_mpi_type(r->dtype);
    DSC_TRY(dsc_comm_mpi_check(
        MPI_Irecv(in, (int)r->pieces.counts[recv_piece], type, left, r->tag, r->mpi, &r->reqs[0]), "MPI_Irecv",
        c));
    int rc = MPI_Isend(out, (int)r->pieces.counts[send_piece], type, right, r->tag, r->mpi, &r->reqs[1]);
    if (rc != MPI_SUCCESS) {
        MPI_Cancel(&r->reqs[0]);
        MPI_Request_free(&r->reqs[0]);
        return dsc_comm_mpi_check(rc, "MPI_Isend", c);
    }
    r->posted = true;
    return NULL;
}

/* After step r->step completed: a reduce-scatter adds this rank's contribution. */
static void finish_step(dsc_ring *r) {
    if (!r->reduce) return;
    int send_piece, recv_piece, p = r->comm->size;
    step_pieces(r, &send_piece, &recv_piece);
    void *dst = r->step == p - 2 ? r->out : r->partial;
    dsc_comm_reduce_local(dst, at(r->src, &r->pieces, recv_piece, dsc_dtype_size(r->dtype)), r->incoming,
                          r->pieces.counts[recv_piece], r->dtype, r->op);
}

static dsc_status start(dsc_ring *r) {
    r->step = 0;
    r->posted = false;
    r->reqs[0] = r->reqs[1] = MPI_REQUEST_NULL;
    if (r->comm->size == 1) {
        if (r->reduce)
            memmove(r->out, at(r->src, &r->pieces, 0, dsc_dtype_size(r->dtype)),
                    (size_t)r->pieces.counts[0] * dsc_dtype_size(r->dtype));
        return NULL;
    }
    return post_step(r);
}

dsc_status dsc_ring_start_reduce_scatter(dsc_ring *r, const dsc_comm *c, MPI_Comm mpi, const char *what, int tag,
                                         const void *src, void *out, const dsc_ring_pieces *pieces,
                                         dsc_dtype dtype, dsc_reduce_op op, void *tmp_a, void *tmp_b) {
    *r = (dsc_ring){.comm = c,
                    .mpi = mpi,
                    .what = what,
                    .tag = tag,
                    .reduce = true,
                    .pieces = *pieces,
                    .dtype = dtype,
                    .op = op,
                    .src = src,
                    .out = out,
                    .partial = tmp_a,
                    .incoming = tmp_b};
    return start(r);
}

dsc_status dsc_ring_start_allgather(dsc_ring *r, const dsc_comm *c, MPI_Comm mpi, const char *what, int tag,
                                    void *buf, const void *own, const dsc_ring_pieces *pieces, dsc_dtype dtype) {
    *r = (dsc_ring){.comm = c,
                    .mpi = mpi,
                    .what = what,
                    .tag = tag,
                    .pieces = *pieces,
                    .dtype = dtype,
                    .src = own,
                    .out = buf};
    return start(r);
}

dsc_status dsc_ring_advance(dsc_ring *r, bool *done) {
    int p = r->comm->size;
    while (r->posted) {
        bool finished = false;
        DSC_TRY(dsc_comm_mpi_test(r->comm, r->what, r->reqs, 2, MPI_STATUSES_IGNORE, &finished));
        if (!finished) break;
        r->posted = false;
        finish_step(r);
        if (++r->step < p - 1) DSC_TRY(post_step(r));
    }
    *done = !r->posted;
    return NULL;
}

void dsc_ring_abandon(dsc_ring *r) {
    if (!r->posted) return;
    /* The receive can be cancelled and completed locally; the send only released. */
    if (r->reqs[0] != MPI_REQUEST_NULL) {
        MPI_Cancel(&r->reqs[0]);
        MPI_Wait(&r->reqs[0], MPI_STATUS_IGNORE);
    }
    if (r->reqs[1] != MPI_REQUEST_NULL) MPI_Request_free(&r->reqs[1]);
    r->posted = false;
}
