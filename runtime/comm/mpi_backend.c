/* mpi_backend.c — the MPI implementation of the communicator backend table,
 * for tensors in host memory.
 *
 * Algorithm choice (measured, docs/comm.md): on more than 2 ranks, messages
 * below 64 KB use MPI's own non-blocking collectives; larger all-reduce,
 * reduce-scatter and all-gather, and all of them on 2 ranks, use the ring
 * algorithms of ring.c over a private duplicate of the communicator (so their
 * messages never match the user's point-to-point); all-to-all(v) posts every
 * send and receive at once and checks each received size against the
 * expected count. bf16/f16 reductions always take the ring, which reduces
 * them in f32 (MPI has no such types).
 * All-reduce, reduce-scatter and all-gather are posted as requests (a
 * `collective` in req->impl: MPI's request, or a ring that test advances
 * step by step, an all-reduce being a reduce-scatter ring then an all-gather
 * ring), so that several can be in flight; their ring temporaries come from a
 * small per-communicator cache that keeps allocation out of the steady state.
 * Not here: argument checks, deadlines and byte counting (collectives.c). */
#include <limits.h>
#include <string.h>

#include "runtime/comm/comm_internal.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/ring.h"

/* Below this size (bytes of the whole buffer) MPI's algorithms win on more
 * than 2 ranks (log P rounds against the ring's P-1 steps per phase); on 2
 * ranks the ring is a single exchange per phase and wins at every size. */
static const size_t RING_MIN_BYTES = 64 * 1024;

/* all-to-all's tag; rings take theirs from RING_TAG_BASE + the collective's sequence number modulo RING_TAGS */
enum { ALLTOALL_TAG = 7002, RING_TAG_BASE = 8192, RING_TAGS = 8192 };

/* Ring temporaries kept for reuse: enough for the buckets a training step keeps in flight. */
enum { SCRATCH_KEPT = 8 };

typedef struct scratch_block {
    void *data;
    size_t bytes;
    bool busy;
} scratch_block;

typedef struct mpi_state {
    MPI_Comm coll;        /* duplicate of c->mpi for the algorithms' point-to-point */
    MPI_Request *reqs;    /* (2P) all-to-all's */
    MPI_Status *statuses; /* (2P) */
    scratch_block kept[SCRATCH_KEPT];
} mpi_state;

/* One all-reduce, reduce-scatter or all-gather in flight (req->impl). */
typedef struct collective {
    dsc_comm *comm;
    dsc_comm_op kind;
    dsc_reduce_op op;
    dsc_dtype dtype;
    void *result; /* what AVG divides once the data is complete */
    int64_t n_result;
    void *move_to; /* native in-place reduce-scatter: this rank's piece, moved here from the buffer's start */
    bool native;   /* MPI's own non-blocking collective in `mpi` */
    MPI_Request mpi;
    int rings_left; /* ring algorithm: rings not yet finished (an all-reduce runs two) */
    int tag;        /* of its rings, fixed when posted (every rank posts collectives in the same order) */
    dsc_ring ring;
    void *allgather_buf;      /* all-reduce: the buffer its second ring gathers in place */
    int64_t *counts, *displs; /* (P) pieces */
    int *icounts;             /* (2P) int counts and offsets for MPI's v-collectives */
    int scratch_slot;         /* index in kept[], or -1 when allocated for this one */
    void *scratch;            /* (2 max piece) ring temporaries */
    size_t scratch_bytes;
} collective;

#define ARRAY_BYTES(n, type) ((size_t)(n) * sizeof(type))

/* base + elems elements, without arithmetic on the NULL data of empty tensors. */
static char *shift(const void *base, int64_t elems, size_t esize) {
    return elems ? (char *)base + (size_t)elems * esize : (char *)base;
}

/* Whether two byte ranges share no byte (compared as addresses: they may be unrelated buffers). */
static bool disjoint(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x + a_bytes <= y || y + b_bytes <= x;
}

static dsc_status mpi_init(dsc_comm *c) {
    mpi_state *st;
    DSC_TRY(dsc_mem_alloc((void **)&st, sizeof *st, DSC_MEM_COMM, DSC_CPU));
    c->impl = st;
    st->coll = MPI_COMM_NULL;
    int p = c->size;
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
    dsc_mem_free(st->reqs, ARRAY_BYTES(2 * p, MPI_Request), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st->statuses, ARRAY_BYTES(2 * p, MPI_Status), DSC_MEM_COMM, DSC_CPU);
    for (int i = 0; i < SCRATCH_KEPT; i++)
        dsc_mem_free(st->kept[i].data, st->kept[i].bytes, DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(st, sizeof *st, DSC_MEM_COMM, DSC_CPU);
    c->impl = NULL;
}

/* Ring temporaries of `bytes`: a free kept block large enough, else a free
 * kept slot regrown, else (every slot busy) a block of this collective's own. */
static dsc_status scratch_take(dsc_comm *c, collective *k, size_t bytes) {
    mpi_state *st = c->impl;
    int slot = -1;
    for (int i = 0; i < SCRATCH_KEPT && slot < 0; i++)
        if (!st->kept[i].busy && st->kept[i].bytes >= bytes) slot = i;
    for (int i = 0; i < SCRATCH_KEPT && slot < 0; i++)
        if (!st->kept[i].busy) slot = i;
    if (slot < 0) {
        DSC_TRY(dsc_mem_alloc(&k->scratch, bytes, DSC_MEM_COMM, DSC_CPU));
        k->scratch_bytes = bytes;
        return NULL;
    }
    scratch_block *blk = &st->kept[slot];
    if (blk->bytes < bytes) {
        dsc_mem_free(blk->data, blk->bytes, DSC_MEM_COMM, DSC_CPU);
        blk->data = NULL;
        blk->bytes = 0;
        DSC_TRY(dsc_mem_alloc(&blk->data, bytes, DSC_MEM_COMM, DSC_CPU));
        blk->bytes = bytes;
    }
    blk->busy = true;
    k->scratch_slot = slot;
    k->scratch = blk->data;
    return NULL;
}

/* A collective and its arrays in one block (one allocation per collective, not four): the
 * struct, then counts and displs (P each), then icounts (2P). */
_Static_assert(sizeof(collective) % _Alignof(int64_t) == 0, "the arrays after a collective must be aligned");

static size_t collective_bytes(int p) {
    return sizeof(collective) + 2 * ARRAY_BYTES(p, int64_t) + ARRAY_BYTES(2 * p, int);
}

static void collective_free(collective *k) {
    if (!k) return;
    dsc_comm *c = k->comm;
    mpi_state *st = c->impl;
    int p = c->size;
    if (k->scratch_slot >= 0)
        st->kept[k->scratch_slot].busy = false;
    else
        dsc_mem_free(k->scratch, k->scratch_bytes, DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(k, collective_bytes(p), DSC_MEM_COMM, DSC_CPU);
}

static dsc_status check_int(const dsc_comm *c, int64_t n, const char *what) {
    DSC_CHECK(n <= INT_MAX, DSC_ERR_UNSUPPORTED, "%s on communicator \"%s\": %lld elements exceed MPI's int count",
              what, c->name, (long long)n);
    return NULL;
}

/* A collective's state with its pieces from `counts` (or an even split of n). */
static dsc_status collective_new(dsc_comm *c, dsc_comm_op kind, dsc_dtype dtype, dsc_reduce_op op,
                                 const int64_t *counts, int64_t n, collective **out) {
    int p = c->size;
    collective *k;
    *out = NULL;
    DSC_TRY(dsc_mem_alloc((void **)&k, collective_bytes(p), DSC_MEM_COMM, DSC_CPU));
    int64_t *arrays = (int64_t *)(k + 1);
    *k = (collective){.comm = c,
                      .kind = kind,
                      .op = op,
                      .dtype = dtype,
                      .mpi = MPI_REQUEST_NULL,
                      .scratch_slot = -1,
                      .tag = RING_TAG_BASE + (int)(c->seq % RING_TAGS),
                      .counts = arrays,
                      .displs = arrays + p,
                      .icounts = (int *)(arrays + 2 * p)};
    *out = k;
    int64_t offset = 0;
    for (int i = 0; i < p; i++) {
        k->counts[i] = counts ? counts[i] : n / p + (i < n % p);
        k->displs[i] = offset;
        offset += k->counts[i];
    }
    return NULL;
}

static dsc_ring_pieces pieces_of(const collective *k) {
    dsc_ring_pieces pieces = {k->counts, k->displs, 0};
    for (int i = 0; i < k->comm->size; i++)
        if (k->counts[i] > pieces.max_count) pieces.max_count = k->counts[i];
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

/* The reduce-scatter ring of `send` into `recv`, with its temporaries. */
static dsc_status start_reduce_ring(collective *k, const void *send, void *recv) {
    dsc_comm *c = k->comm;
    mpi_state *st = c->impl;
    dsc_ring_pieces pieces = pieces_of(k);
    DSC_TRY(check_int(c, pieces.max_count, dsc_comm_op_name(k->kind)));
    size_t bytes = (size_t)pieces.max_count * dsc_dtype_size(k->dtype);
    DSC_TRY(scratch_take(c, k, 2 * bytes));
    k->rings_left = k->kind == DSC_COMM_OP_ALLREDUCE ? 2 : 1;
    return dsc_ring_start_reduce_scatter(&k->ring, c, st->coll, dsc_comm_op_name(k->kind), k->tag, send, recv,
                                         &pieces, k->dtype, k->op, k->scratch, (char *)k->scratch + bytes);
}

static dsc_status start_gather_ring(collective *k, void *buf, const void *own) {
    dsc_comm *c = k->comm;
    mpi_state *st = c->impl;
    dsc_ring_pieces pieces = pieces_of(k);
    DSC_TRY(check_int(c, pieces.max_count, dsc_comm_op_name(k->kind)));
    if (k->kind != DSC_COMM_OP_ALLREDUCE) k->rings_left = 1;
    return dsc_ring_start_allgather(&k->ring, c, st->coll, dsc_comm_op_name(k->kind), k->tag, buf, own, &pieces,
                                    k->dtype);
}

/* Hands the collective to the request, or frees it when posting failed. */
static dsc_status post(dsc_comm_request *req, collective *k, dsc_status s) {
    if (s) {
        collective_free(k);
        return s;
    }
    req->impl = k;
    return NULL;
}

static dsc_status mpi_iallreduce(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op, dsc_comm_request *req) {
    int64_t n = dsc_tensor_numel(t);
    collective *k;
    dsc_status s = collective_new(c, DSC_COMM_OP_ALLREDUCE, t->dtype, op, NULL, n, &k);
    if (s) return post(req, k, s);
    k->result = t->data;
    k->n_result = n;
    if (mpi_native(t->dtype) && !use_ring(c, dsc_tensor_nbytes(t))) {
        k->native = true;
        s = dsc_comm_mpi_check(MPI_Iallreduce(MPI_IN_PLACE, t->data, (int)n, dsc_comm_mpi_type(t->dtype),
                                              mpi_op(op), c->mpi, &k->mpi),
                               "MPI_Iallreduce", c);
    } else {
        /* this rank's piece is reduced in place, then the whole buffer gathered */
        k->allgather_buf = t->data;
        s = start_reduce_ring(k, t->data, shift(t->data, k->displs[c->rank], dsc_dtype_size(t->dtype)));
    }
    return post(req, k, s);
}

static dsc_status mpi_ireduce_scatter(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                                      dsc_reduce_op op, dsc_comm_request *req) {
    collective *k;
    dsc_status s =
        collective_new(c, DSC_COMM_OP_REDUCE_SCATTER, send->dtype, op, counts, dsc_tensor_numel(send), &k);
    if (s) return post(req, k, s);
    k->result = recv->data;
    k->n_result = dsc_tensor_numel(recv);
    bool in_place = recv->data == shift(send->data, k->displs[c->rank], dsc_dtype_size(send->dtype));
    /* The algorithm depends only on what every rank shares (dtype, total
     * size), never on one rank's buffers: ranks taking different paths hang. */
    if (mpi_native(send->dtype) && !use_ring(c, dsc_tensor_nbytes(send))) {
        for (int i = 0; i < c->size; i++)
            k->icounts[i] = (int)k->counts[i];
        /* MPI's in-place form reads the whole vector from the receive buffer
         * and leaves this rank's piece at its start; it is moved to its slot after. */
        if (in_place) {
            k->move_to = recv->data;
            k->result = send->data;
        }
        k->native = true;
        s = dsc_comm_mpi_check(MPI_Ireduce_scatter(in_place ? MPI_IN_PLACE : send->data,
                                                   in_place ? send->data : recv->data, k->icounts,
                                                   dsc_comm_mpi_type(send->dtype), mpi_op(op), c->mpi, &k->mpi),
                               "MPI_Ireduce_scatter", c);
    } else {
        s = start_reduce_ring(k, send->data, recv->data);
    }
    return post(req, k, s);
}

static dsc_status mpi_iallgather(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                                 dsc_comm_request *req) {
    collective *k;
    dsc_status s = collective_new(c, DSC_COMM_OP_ALLGATHER, recv->dtype, DSC_REDUCE_OP_SUM, counts,
                                  dsc_tensor_numel(recv), &k);
    if (s) return post(req, k, s);
    char *own = shift(recv->data, k->displs[c->rank], dsc_dtype_size(recv->dtype)); /* send may already be there */
    const size_t own_bytes = dsc_tensor_nbytes(send);
    const bool ring = use_ring(c, dsc_tensor_nbytes(recv));
    /* The ring's first step can send from `send` while its copy into place runs (on 2 ranks the
     * only step), unless the copy would overwrite what is being sent or received. */
    const bool send_first =
        ring && send->data != own && disjoint(send->data, own_bytes, recv->data, dsc_tensor_nbytes(recv));
    /* MPI wants MPI_IN_PLACE on every rank or on none, whatever each rank's buffers are. */
    if (send->data != own && !send_first) memmove(own, send->data, own_bytes);
    if (!ring) {
        int *icounts = k->icounts, *idispls = k->icounts + c->size;
        for (int i = 0; i < c->size; i++) {
            icounts[i] = (int)k->counts[i];
            idispls[i] = (int)k->displs[i];
        }
        MPI_Datatype type = dsc_comm_mpi_type(recv->dtype);
        k->native = true;
        s = dsc_comm_mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, icounts[c->rank], type, recv->data, icounts, idispls,
                                               type, c->mpi, &k->mpi),
                               "MPI_Iallgatherv", c);
    } else {
        s = start_gather_ring(k, recv->data, send_first ? send->data : NULL);
        if (!s && send_first) memcpy(own, send->data, own_bytes);
    }
    return post(req, k, s);
}

/* Advances a collective; once complete: the in-place move and AVG's division. */
static dsc_status collective_test(collective *k, bool *done) {
    dsc_comm *c = k->comm;
    *done = false;
    if (k->native) {
        DSC_TRY(dsc_comm_mpi_test(c, dsc_comm_op_name(k->kind), &k->mpi, 1, MPI_STATUSES_IGNORE, done));
        if (!*done) return NULL;
        if (k->move_to) {
            memmove(k->move_to, k->result, (size_t)k->counts[c->rank] * dsc_dtype_size(k->dtype));
            k->result = k->move_to;
        }
    } else {
        for (;;) {
            bool ring_done = false;
            DSC_TRY(dsc_ring_advance(&k->ring, &ring_done));
            if (!ring_done) return NULL;
            if (--k->rings_left == 0) break;
            DSC_TRY(
                start_gather_ring(k, k->allgather_buf, NULL)); /* all-reduce: the reduced pieces to every rank */
        }
        *done = true;
    }
    if (k->kind != DSC_COMM_OP_ALLGATHER) dsc_comm_reduce_finish(k->result, k->n_result, k->dtype, k->op, c->size);
    return NULL;
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
    if (req->impl) {
        DSC_TRY(collective_test(req->impl, done));
        if (*done) {
            collective_free(req->impl);
            req->impl = NULL;
        }
        return NULL;
    }
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
    collective *k = req->impl;
    if (k) {
        req->impl = NULL;
        /* MPI cannot cancel its own collectives: that state (and the counts it reads) stays with MPI. */
        if (k->native) return;
        dsc_ring_abandon(&k->ring);
        collective_free(k);
        return;
    }
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
    .iallreduce = mpi_iallreduce,
    .ireduce_scatter = mpi_ireduce_scatter,
    .iallgather = mpi_iallgather,
    .alltoallv = mpi_alltoallv,
    .broadcast = mpi_broadcast,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .abandon = mpi_abandon,
};
