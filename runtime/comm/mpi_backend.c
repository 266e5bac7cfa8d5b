/* mpi_backend.c — the MPI implementation of the communicator backend table,
 * for tensors in host memory.
 *
 * Algorithm choice (measured, docs/comm.md): on more than 2 ranks, messages
 * below 64 KB use MPI's own non-blocking collectives; larger all-reduce,
 * reduce-scatter and all-gather, and all of them on 2 ranks, use the ring
 * algorithms of ring.c over a private duplicate of the communicator (so their messages never match the user's
 * point-to-point); all-to-all(v) posts every send and receive at once and checks each received size against the
 * expected count. bf16/f16 reductions always take the ring, which reduces them in f32 (MPI has no such types). Not
 * here: argument checks, deadlines and byte counting (collectives.c). */
#include <limits.h>
#include <string.h>

#include "runtime/comm/comm_internal.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/ring.h"

/* Below this size (bytes of the whole buffer) MPI's algorithms win on more
 * than 2 ranks (log P rounds against the ring's P-1 steps per phase); on 2
 * ranks the ring is a single exchange per phase and wins at every size. */
static const size_t RING_MIN_BYTES = 64 * 1024;

enum { ALLTOALL_TAG = 7002 };

typedef struct mpi_state {
    MPI_Comm coll;        /* duplicate of c->mpi for the algorithms' point-to-point */
    int64_t *counts;      /* (P) pieces of the current operation */
    int64_t *displs;      /* (P) */
    int *icounts;         /* (2P) int counts and offsets for MPI's v-collectives */
    MPI_Request *reqs;    /* (2P) */
    MPI_Status *statuses; /* (2P) */
    void *scratch;        /* grows to the largest ring temporary seen */
    size_t scratch_bytes;
} mpi_state;

#define ARRAY_BYTES(n, type) ((size_t)(n) * sizeof(type))

/* base + elems elements, without arithmetic on the NULL data of empty tensors. */
static char *shift(const void *base, int64_t elems, size_t esize) {
    return elems ? (char *)base + (size_t)elems * esize : (char *)base;
}

static dsc_status mpi_init(dsc_comm *c) {
    mpi_state *st;
    DSC_TRY(dsc_mem_alloc((void **)&st, sizeof *st, DSC_MEM_COMM, DSC_CPU));
    c->impl = st;
    st->coll = MPI_COMM_NULL;
    int p = c->size;
    DSC_TRY(dsc_mem_alloc((void **)&st->counts, ARRAY_BYTES(p, int64_t), DSC_MEM_COMM, DSC_CPU));
    DSC_TRY(dsc_mem_alloc((void **)&st->displs, ARRAY_BYTES(p, int64_t), DSC_MEM_COMM, DSC_CPU));
    DSC_TRY(dsc_mem_alloc((void **)&st->icounts, ARRAY_BYTES(2 * p, int), DSC_MEM_COMM, DSC_CPU));
    DSC_TRY(dsc_mem_alloc((void **)&st->reqs, ARRAY_BYTES(2 * p, MPI_Request), DSC_MEM_COMM, DSC_CPU));
    DSC_TRY(dsc_mem_alloc((void **)&st->statuses, ARRAY_BYTES(2 * p, MPI_Status), DSC_MEM_COMM, DSC_CPU));
    MPI_Request req;
    DSC_TRY(dsc_comm_mpi_check(MPI_Comm_idup(c->mpi, &st->coll, &req), "MPI_Comm_idup", c));
    return dsc_comm_mpi_wait(c, "creating the communicator", -1, &req, 1, MPI_STATUSES_IGNORE);
}

static void mpi_fini(dsc_comm *c) {
    mpi_state *st = c->impl;
    if (!st) return;
    int p = c->size;
    if (st->coll != MPI_COMM_NULL) MPI_Comm_free(&st->coll);
    dsc_mem_free(st->counts, ARRAY_BYTES(p, int64_t), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st->displs, ARRAY_BYTES(p, int64_t), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st->icounts, ARRAY_BYTES(2 * p, int), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st->reqs, ARRAY_BYTES(2 * p, MPI_Request), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st->statuses, ARRAY_BYTES(2 * p, MPI_Status), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st->scratch, st->scratch_bytes, DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st, sizeof *st, DSC_MEM_COMM, DSC_CPU);
    c->impl = NULL;
}

/* Two temporaries of `bytes` each, kept between calls (allocation stays out of the hot loop). */
static dsc_status scratch_pair(dsc_comm *c, size_t bytes, void **a, void **b) {
    mpi_state *st = c->impl;
    if (2 * bytes > st->scratch_bytes) {
        dsc_mem_free(st->scratch, st->scratch_bytes, DSC_MEM_COMM, DSC_CPU);
        st->scratch = NULL;
        st->scratch_bytes = 0;
        DSC_TRY(dsc_mem_alloc(&st->scratch, 2 * bytes, DSC_MEM_COMM, DSC_CPU));
        st->scratch_bytes = 2 * bytes;
    }
    *a = st->scratch;
    *b = (char *)st->scratch + bytes;
    return NULL;
}

static dsc_status check_int(const dsc_comm *c, int64_t n, const char *what) {
    DSC_CHECK(n <= INT_MAX, DSC_ERR_UNSUPPORTED, "%s on communicator \"%s\": %lld elements exceed MPI's int count",
              what, c->name, (long long)n);
    return NULL;
}

/* Fills the state's pieces from `counts` (or an even split of n) and returns them. */
static dsc_ring_pieces make_pieces(dsc_comm *c, const int64_t *counts, int64_t n) {
    mpi_state *st = c->impl;
    int p = c->size;
    dsc_ring_pieces pieces = {st->counts, st->displs, 0};
    int64_t offset = 0;
    for (int i = 0; i < p; i++) {
        st->counts[i] = counts ? counts[i] : n / p + (i < n % p);
        st->displs[i] = offset;
        offset += st->counts[i];
        if (st->counts[i] > pieces.max_count) pieces.max_count = st->counts[i];
    }
    return pieces;
}

static bool mpi_native(dsc_dtype dtype) {
    return dtype != DSC_DTYPE_BF16 && dtype != DSC_DTYPE_F16;
}

static bool use_ring(const dsc_comm *c, size_t bytes) {
    return c->size == 2 || bytes >= RING_MIN_BYTES;
}

static MPI_Op mpi_op(dsc_reduce_op op) {
    return op == DSC_REDUCE_OP_MAX ? MPI_MAX : MPI_SUM;
}

static dsc_status ring_scratch(dsc_comm *c, const dsc_ring_pieces *pieces, dsc_dtype dtype, void **a, void **b) {
    DSC_TRY(check_int(c, pieces->max_count, "ring step"));
    return scratch_pair(c, (size_t)pieces->max_count * dsc_dtype_size(dtype), a, b);
}

static dsc_status mpi_allreduce(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op) {
    mpi_state *st = c->impl;
    int64_t n = dsc_tensor_numel(t);
    const char *what = "all-reduce";
    if (mpi_native(t->dtype) && !use_ring(c, dsc_tensor_nbytes(t))) {
        MPI_Request req;
        DSC_TRY(dsc_comm_mpi_check(
            MPI_Iallreduce(MPI_IN_PLACE, t->data, (int)n, dsc_comm_mpi_type(t->dtype), mpi_op(op), c->mpi, &req),
            "MPI_Iallreduce", c));
        DSC_TRY(dsc_comm_mpi_wait(c, what, -1, &req, 1, MPI_STATUSES_IGNORE));
    } else {
        dsc_ring_pieces pieces = make_pieces(c, NULL, n);
        void *a, *b;
        DSC_TRY(ring_scratch(c, &pieces, t->dtype, &a, &b));
        void *mine = shift(t->data, pieces.displs[c->rank], dsc_dtype_size(t->dtype));
        DSC_TRY(dsc_ring_reduce_scatter(c, st->coll, what, t->data, mine, &pieces, t->dtype, op, a, b));
        DSC_TRY(dsc_ring_allgather(c, st->coll, what, t->data, &pieces, t->dtype));
    }
    dsc_comm_reduce_finish(t->data, n, t->dtype, op, c->size);
    return NULL;
}

static dsc_status mpi_reduce_scatter(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                                     dsc_reduce_op op) {
    mpi_state *st = c->impl;
    const char *what = "reduce-scatter";
    dsc_ring_pieces pieces = make_pieces(c, counts, dsc_tensor_numel(send));
    bool in_place = recv->data == shift(send->data, pieces.displs[c->rank], dsc_dtype_size(send->dtype));
    /* The algorithm depends only on what every rank shares (dtype, total
     * size), never on one rank's buffers: ranks taking different paths hang. */
    if (mpi_native(send->dtype) && !use_ring(c, dsc_tensor_nbytes(send))) {
        for (int i = 0; i < c->size; i++)
            st->icounts[i] = (int)pieces.counts[i];
        /* MPI's in-place form reads the whole vector from the receive buffer
         * and leaves this rank's piece at its start; it is moved to its slot after. */
        MPI_Request req;
        DSC_TRY(dsc_comm_mpi_check(MPI_Ireduce_scatter(in_place ? MPI_IN_PLACE : send->data,
                                                       in_place ? send->data : recv->data, st->icounts,
                                                       dsc_comm_mpi_type(send->dtype), mpi_op(op), c->mpi, &req),
                                   "MPI_Ireduce_scatter", c));
        DSC_TRY(dsc_comm_mpi_wait(c, what, -1, &req, 1, MPI_STATUSES_IGNORE));
        if (in_place)
            memmove(recv->data, send->data, (size_t)pieces.counts[c->rank] * dsc_dtype_size(send->dtype));
    } else {
        void *a, *b;
        DSC_TRY(ring_scratch(c, &pieces, send->dtype, &a, &b));
        DSC_TRY(
            dsc_ring_reduce_scatter(c, st->coll, what, send->data, recv->data, &pieces, send->dtype, op, a, b));
    }
    dsc_comm_reduce_finish(recv->data, dsc_tensor_numel(recv), recv->dtype, op, c->size);
    return NULL;
}

static dsc_status mpi_allgather(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts) {
    mpi_state *st = c->impl;
    const char *what = "all-gather";
    dsc_ring_pieces pieces = make_pieces(c, counts, dsc_tensor_numel(recv));
    size_t esize = dsc_dtype_size(recv->dtype);
    char *own = shift(recv->data, pieces.displs[c->rank], esize); /* send may already be there */
    if (!use_ring(c, dsc_tensor_nbytes(recv))) {
        int *icounts = st->icounts, *idispls = st->icounts + c->size;
        for (int i = 0; i < c->size; i++) {
            icounts[i] = (int)pieces.counts[i];
            idispls[i] = (int)pieces.displs[i];
        }
        MPI_Datatype type = dsc_comm_mpi_type(recv->dtype);
        /* MPI wants MPI_IN_PLACE on every rank or on none, whatever each rank's buffers are. */
        if (send->data != own) memmove(own, send->data, dsc_tensor_nbytes(send));
        MPI_Request req;
        DSC_TRY(dsc_comm_mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, icounts[c->rank], type, recv->data, icounts,
                                                   idispls, type, c->mpi, &req),
                                   "MPI_Iallgatherv", c));
        return dsc_comm_mpi_wait(c, what, -1, &req, 1, MPI_STATUSES_IGNORE);
    }
    DSC_TRY(check_int(c, pieces.max_count, what));
    memmove(own, send->data, dsc_tensor_nbytes(send));
    return dsc_ring_allgather(c, st->coll, what, recv->data, &pieces, recv->dtype);
}

static dsc_status check_received(const dsc_comm *c, const MPI_Status *status, const char *what, int peer,
                                 int64_t expected, MPI_Datatype type) {
    int got = 0;
    DSC_TRY(dsc_comm_mpi_check(MPI_Get_count(status, type, &got), "MPI_Get_count", c));
    DSC_CHECK(got == expected, DSC_ERR_INVALID,
              "%s on communicator \"%s\": peer %d sent %d elements but %lld were expected", what, c->name, peer,
              got, (long long)expected);
    return NULL;
}

static dsc_status mpi_alltoallv(dsc_comm *c, const dsc_tensor *send, const int64_t *send_counts, dsc_tensor *recv,
                                const int64_t *recv_counts) {
    mpi_state *st = c->impl;
    int p = c->size;
    const char *what = "all-to-all";
    size_t esize = dsc_dtype_size(send->dtype);
    MPI_Datatype type = dsc_comm_mpi_type(send->dtype);
    for (int j = 0; j < p; j++) {
        DSC_TRY(check_int(c, send_counts[j] > recv_counts[j] ? send_counts[j] : recv_counts[j], what));
        DSC_CHECK(j != c->rank || send_counts[j] == recv_counts[j], DSC_ERR_INVALID,
                  "%s on communicator \"%s\": %lld elements sent to self but %lld expected", what, c->name,
                  (long long)send_counts[j], (long long)recv_counts[j]);
    }
    /* Every peer gets a message, empty ones included, so that a count
     * mismatch is reported rather than waited on. */
    int64_t send_off = 0, recv_off = 0;
    int posted = 0;
    for (int j = 0; j < p; j++) {
        char *in = shift(recv->data, recv_off, esize);
        const char *out = shift(send->data, send_off, esize);
        send_off += send_counts[j];
        recv_off += recv_counts[j];
        if (j == c->rank) {
            if (send_counts[j]) memcpy(in, out, (size_t)send_counts[j] * esize);
            continue;
        }
        DSC_TRY(dsc_comm_mpi_check(
            MPI_Irecv(in, (int)recv_counts[j], type, j, ALLTOALL_TAG, st->coll, &st->reqs[posted++]), "MPI_Irecv",
            c));
        DSC_TRY(dsc_comm_mpi_check(
            MPI_Isend(out, (int)send_counts[j], type, j, ALLTOALL_TAG, st->coll, &st->reqs[posted++]), "MPI_Isend",
            c));
    }
    DSC_TRY(dsc_comm_mpi_wait(c, what, -1, st->reqs, posted, st->statuses));
    for (int j = 0, k = 0; j < p; j++) {
        if (j == c->rank) continue;
        DSC_TRY(check_received(c, &st->statuses[k], what, j, recv_counts[j], type));
        k += 2;
    }
    return NULL;
}

static dsc_status mpi_broadcast(dsc_comm *c, dsc_tensor *t, int root) {
    int64_t n = dsc_tensor_numel(t);
    DSC_TRY(check_int(c, n, "broadcast"));
    MPI_Request req;
    DSC_TRY(dsc_comm_mpi_check(MPI_Ibcast(t->data, (int)n, dsc_comm_mpi_type(t->dtype), root, c->mpi, &req),
                               "MPI_Ibcast", c));
    return dsc_comm_mpi_wait(c, "broadcast", -1, &req, 1, MPI_STATUSES_IGNORE);
}

static dsc_status mpi_isend(dsc_comm *c, const dsc_tensor *t, int peer, int tag, dsc_comm_request *req) {
    int64_t n = dsc_tensor_numel(t);
    DSC_TRY(check_int(c, n, "send"));
    return dsc_comm_mpi_check(
        MPI_Isend(t->data, (int)n, dsc_comm_mpi_type(t->dtype), peer, tag, c->mpi, &req->mpi), "MPI_Isend", c);
}

static dsc_status mpi_irecv(dsc_comm *c, dsc_tensor *t, int peer, int tag, dsc_comm_request *req) {
    int64_t n = dsc_tensor_numel(t);
    DSC_TRY(check_int(c, n, "recv"));
    return dsc_comm_mpi_check(
        MPI_Irecv(t->data, (int)n, dsc_comm_mpi_type(t->dtype), peer, tag, c->mpi, &req->mpi), "MPI_Irecv", c);
}

static dsc_status mpi_test(dsc_comm_request *req, bool *done) {
    int flag = 0;
    MPI_Status status;
    DSC_TRY(dsc_comm_mpi_check(MPI_Test(&req->mpi, &flag, &status), "MPI_Test", req->comm));
    *done = flag != 0;
    if (!flag || req->op != DSC_COMM_OP_RECV) return NULL;
    size_t esize = dsc_dtype_size(req->dtype);
    return check_received(req->comm, &status, "recv", req->peer, (int64_t)(req->bytes / esize),
                          dsc_comm_mpi_type(req->dtype));
}

static void mpi_abandon(dsc_comm_request *req) {
    if (req->mpi == MPI_REQUEST_NULL) return;
    /* An unmatched receive can be cancelled and completed locally; a send can
     * only be released (MPI finishes it if the peer ever receives). */
    if (req->op == DSC_COMM_OP_RECV) {
        MPI_Cancel(&req->mpi);
        MPI_Wait(&req->mpi, MPI_STATUS_IGNORE);
    } else {
        MPI_Request_free(&req->mpi);
    }
}

const dsc_comm_backend dsc_comm_mpi_backend = {
    .name = "mpi",
    .init = mpi_init,
    .fini = mpi_fini,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .alltoallv = mpi_alltoallv,
    .broadcast = mpi_broadcast,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .abandon = mpi_abandon,
};
