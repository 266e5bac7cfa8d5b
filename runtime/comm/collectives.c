/* collectives.c — the public operations: argument checks, the deadline, byte
 * counting and dispatch to the communicator's backend; non-blocking requests.
 *
 * Collectives whose total size is zero (the same on every rank) complete
 * without messages. All-reduce, reduce-scatter and all-gather are posted as
 * requests (the blocking forms post and wait), which count their bytes when
 * they complete.
 * Counting rule (docs/comm.md): bytes are the operation's logical volume for
 * this rank, independent of the algorithm the backend picks. all-reduce counts
 * as reduce-scatter + all-gather of the even split (piece i has n/P elements,
 * plus one for i < n%P); reduce-scatter sends every piece but its own and
 * receives P-1 contributions to its own; all-gather the reverse; all-to-all(v)
 * counts the pieces exchanged with other ranks; broadcast counts (P-1)*n sent
 * at the root and n received elsewhere; send/recv count the message.
 * Not here: how the bytes move (backends). */
#include <stdio.h>
#include <string.h>

#include "runtime/comm/comm_internal.h"

enum { TAG_MAX = 32767 }; /* the smallest MPI_TAG_UB the MPI standard allows */

static dsc_status check_tensor(const dsc_comm *c, dsc_comm_op op, const char *arg, const dsc_tensor *t) {
    const char *what = dsc_comm_op_name(op);
    DSC_CHECK(t != NULL, DSC_ERR_INVALID, "%s on communicator \"%s\": %s tensor is NULL", what, c->name, arg);
    DSC_CHECK((unsigned)t->dtype < DSC_DTYPE_COUNT, DSC_ERR_INVALID, "%s on communicator \"%s\": %s has dtype %d",
              what, c->name, arg, (int)t->dtype);
    DSC_CHECK(t->data != NULL || dsc_tensor_numel(t) == 0, DSC_ERR_INVALID,
              "%s on communicator \"%s\": %s has no data", what, c->name, arg);
    if (t->device.type != c->opts.device.type || t->device.index != c->opts.device.index) {
        char want[32], got[32];
        return dsc_error(DSC_ERR_INVALID, "%s on communicator \"%s\": %s is on %s but the communicator serves %s",
                         what, c->name, arg, dsc_device_name(t->device, got, sizeof got),
                         dsc_device_name(c->opts.device, want, sizeof want));
    }
    return NULL;
}

static dsc_status check_pair(const dsc_comm *c, dsc_comm_op op, const dsc_tensor *send, const dsc_tensor *recv) {
    DSC_TRY(check_tensor(c, op, "send", send));
    DSC_TRY(check_tensor(c, op, "recv", recv));
    DSC_CHECK(send->dtype == recv->dtype, DSC_ERR_INVALID, "%s on communicator \"%s\": send is %s but recv is %s",
              dsc_comm_op_name(op), c->name, dsc_dtype_name(send->dtype), dsc_dtype_name(recv->dtype));
    return NULL;
}

static dsc_status check_reduce_op(const dsc_comm *c, dsc_comm_op op, dsc_reduce_op rop) {
    DSC_CHECK((unsigned)rop < DSC_REDUCE_OP_COUNT, DSC_ERR_INVALID,
              "%s on communicator \"%s\": unknown reduce op %d", dsc_comm_op_name(op), c->name, (int)rop);
    return NULL;
}

/* counts (P, non-negative, summing to `total`) or NULL for an even split of total. */
static dsc_status check_counts(const dsc_comm *c, dsc_comm_op op, const char *arg, const int64_t *counts,
                               int64_t total) {
    const char *what = dsc_comm_op_name(op);
    if (!counts) {
        DSC_CHECK(total % c->size == 0, DSC_ERR_INVALID,
                  "%s on communicator \"%s\": %lld elements do not split evenly over %d ranks", what, c->name,
                  (long long)total, c->size);
        return NULL;
    }
    int64_t sum = 0;
    for (int i = 0; i < c->size; i++) {
        DSC_CHECK(counts[i] >= 0, DSC_ERR_INVALID, "%s on communicator \"%s\": %s[%d] = %lld is negative", what,
                  c->name, arg, i, (long long)counts[i]);
        sum += counts[i];
    }
    DSC_CHECK(sum == total, DSC_ERR_INVALID, "%s on communicator \"%s\": %s sum to %lld but the tensor has %lld",
              what, c->name, arg, (long long)sum, (long long)total);
    return NULL;
}

static int64_t piece(const dsc_comm *c, const int64_t *counts, int64_t total, int rank) {
    return counts ? counts[rank] : total / c->size + (rank < total % c->size);
}

/* Entering a collective described by sig: refused on a broken communicator;
 * starts the clock and the count the watchdog reports; with checked
 * collectives, the ranks agree on sig before anything moves. */
static dsc_status begin(dsc_comm *c, const dsc_comm_signature *sig) {
    DSC_CHECK(c->broken[0] == '\0', DSC_ERR_COMM, "%s on communicator \"%s\" refused: %s",
              dsc_comm_op_name(sig->op), c->name, c->broken);
    c->op_t0 = dsc_comm_now();
    c->op_msg_bytes = 0;
    c->deadline = c->op_t0 + c->opts.timeout_s;
    c->seq++;
    return dsc_comm_check_signature(c, sig);
}

/* A completed operation: the byte counters, and the comms_logger's record
 * of its message size and latency since t0. */
static void count(dsc_comm *c, dsc_comm_op op, int64_t sent_bytes, int64_t recv_bytes, int64_t msg_bytes,
                  double t0) {
    c->stats.calls[op]++;
    c->stats.bytes_sent[op] += sent_bytes;
    c->stats.bytes_recv[op] += recv_bytes;
    if (comm_log_enabled()) comm_log_record(c, op, msg_bytes, dsc_comm_now() - t0);
}

/* A collective that failed after posting messages leaves the ranks out of step: refuse later collectives. */
static dsc_status finish(dsc_comm *c, dsc_comm_op op, dsc_status s, int64_t sent_bytes, int64_t recv_bytes) {
    if (!s) {
        count(c, op, sent_bytes, recv_bytes, c->op_msg_bytes, c->op_t0);
        return NULL;
    }
    if (dsc_status_code(s) == DSC_ERR_TIMEOUT || dsc_status_code(s) == DSC_ERR_COMM)
        snprintf(c->broken, sizeof c->broken, "an earlier %s failed (%s)", dsc_comm_op_name(op),
                 dsc_code_name(dsc_status_code(s)));
    return s;
}

/* A request of this communicator, counted as sent / recv bytes when it completes. */
static dsc_status new_request(dsc_comm *c, dsc_comm_op kind, int peer, int64_t sent, int64_t recv,
                              int64_t msg_bytes, dsc_comm_request **out) {
    dsc_comm_request *req;
    DSC_TRY(dsc_mem_alloc((void **)&req, sizeof *req, DSC_MEM_COMM, DSC_CPU));
    *req = (dsc_comm_request){.comm = c,
                              .op = kind,
                              .peer = peer,
                              .sent_bytes = sent,
                              .recv_bytes = recv,
                              .msg_bytes = msg_bytes,
                              .t0 = dsc_comm_now(),
                              .mpi = MPI_REQUEST_NULL};
    req->deadline = req->t0 + c->opts.timeout_s;
    *out = req;
    return NULL;
}

/* After the backend posted (or failed to post) a collective. */
static dsc_status posted(dsc_comm *c, dsc_comm_op kind, dsc_status s, dsc_comm_request *req,
                         dsc_comm_request **out) {
    if (s) {
        dsc_mem_free(req, sizeof *req, DSC_MEM_COMM, DSC_CPU);
        return finish(c, kind, s, 0, 0);
    }
    *out = req;
    return NULL;
}

dsc_status dsc_comm_iallreduce(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op, dsc_comm_request **out) {
    const dsc_comm_op kind = DSC_COMM_OP_ALLREDUCE;
    *out = NULL;
    DSC_TRY(check_tensor(c, kind, "buffer", t));
    DSC_TRY(check_reduce_op(c, kind, op));
    int64_t n = dsc_tensor_numel(t), mine = piece(c, NULL, n, c->rank);
    DSC_TRY(begin(c, &(dsc_comm_signature){kind, t->dtype, n, op, -1, NULL, 0, NULL, NULL}));
    int64_t bytes = (n - mine + (int64_t)(c->size - 1) * mine) * (int64_t)dsc_dtype_size(t->dtype);
    if (n == 0) return finish(c, kind, NULL, 0, 0);
    dsc_comm_request *req;
    DSC_TRY(new_request(c, kind, -1, bytes, bytes, n * (int64_t)dsc_dtype_size(t->dtype), &req));
    return posted(c, kind, c->backend->iallreduce(c, t, op, req), req, out);
}

dsc_status dsc_comm_ireduce_scatter(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                                    dsc_reduce_op op, dsc_comm_request **out) {
    const dsc_comm_op kind = DSC_COMM_OP_REDUCE_SCATTER;
    *out = NULL;
    DSC_TRY(check_pair(c, kind, send, recv));
    DSC_TRY(check_reduce_op(c, kind, op));
    int64_t n = dsc_tensor_numel(send);
    DSC_TRY(check_counts(c, kind, "counts", counts, n));
    int64_t mine = piece(c, counts, n, c->rank);
    DSC_CHECK(dsc_tensor_numel(recv) == mine, DSC_ERR_INVALID,
              "reduce-scatter on communicator \"%s\": recv has %lld elements but this rank's piece has %lld",
              c->name, (long long)dsc_tensor_numel(recv), (long long)mine);
    DSC_TRY(
        begin(c, &(dsc_comm_signature){kind, send->dtype, n, op, -1, counts, counts ? c->size : 0, NULL, NULL}));
    if (n == 0) return finish(c, kind, NULL, 0, 0);
    int64_t esize = (int64_t)dsc_dtype_size(send->dtype);
    dsc_comm_request *req;
    DSC_TRY(new_request(c, kind, -1, (n - mine) * esize, (int64_t)(c->size - 1) * mine * esize, n * esize, &req));
    return posted(c, kind, c->backend->ireduce_scatter(c, send, recv, counts, op, req), req, out);
}

dsc_status dsc_comm_iallgather(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                               dsc_comm_request **out) {
    const dsc_comm_op kind = DSC_COMM_OP_ALLGATHER;
    *out = NULL;
    DSC_TRY(check_pair(c, kind, send, recv));
    int64_t n = dsc_tensor_numel(recv);
    DSC_TRY(check_counts(c, kind, "counts", counts, n));
    int64_t mine = piece(c, counts, n, c->rank);
    DSC_CHECK(dsc_tensor_numel(send) == mine, DSC_ERR_INVALID,
              "all-gather on communicator \"%s\": send has %lld elements but this rank's piece has %lld", c->name,
              (long long)dsc_tensor_numel(send), (long long)mine);
    DSC_TRY(
        begin(c, &(dsc_comm_signature){kind, send->dtype, n, -1, -1, counts, counts ? c->size : 0, NULL, NULL}));
    if (n == 0) return finish(c, kind, NULL, 0, 0);
    int64_t esize = (int64_t)dsc_dtype_size(send->dtype);
    dsc_comm_request *req;
    DSC_TRY(new_request(c, kind, -1, (int64_t)(c->size - 1) * mine * esize, (n - mine) * esize, n * esize, &req));
    return posted(c, kind, c->backend->iallgather(c, send, recv, counts, req), req, out);
}

dsc_status dsc_comm_allreduce(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op) {
    dsc_comm_request *req;
    DSC_TRY(dsc_comm_iallreduce(c, t, op, &req));
    return dsc_comm_wait(&req);
}

dsc_status dsc_comm_reduce_scatter(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                                   dsc_reduce_op op) {
    dsc_comm_request *req;
    DSC_TRY(dsc_comm_ireduce_scatter(c, send, recv, counts, op, &req));
    return dsc_comm_wait(&req);
}

dsc_status dsc_comm_allgather(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts) {
    dsc_comm_request *req;
    DSC_TRY(dsc_comm_iallgather(c, send, recv, counts, &req));
    return dsc_comm_wait(&req);
}

static dsc_status alltoallv(dsc_comm *c, dsc_comm_op kind, const dsc_tensor *send, const int64_t *send_counts,
                            dsc_tensor *recv, const int64_t *recv_counts) {
    DSC_TRY(check_counts(c, kind, "send counts", send_counts, dsc_tensor_numel(send)));
    DSC_TRY(check_counts(c, kind, "recv counts", recv_counts, dsc_tensor_numel(recv)));
    bool even = kind == DSC_COMM_OP_ALLTOALL; /* even pieces: the sizes agree, not just pairwise */
    DSC_TRY(begin(c, &(dsc_comm_signature){kind, send->dtype, even ? dsc_tensor_numel(send) : -1, -1, -1, NULL, 0,
                                           even ? NULL : send_counts, even ? NULL : recv_counts}));
    int64_t sent = 0, received = 0, esize = (int64_t)dsc_dtype_size(send->dtype);
    c->op_msg_bytes = dsc_tensor_numel(send) * esize;
    for (int j = 0; j < c->size; j++) {
        if (j == c->rank) continue;
        sent += send_counts[j] * esize;
        received += recv_counts[j] * esize;
    }
    return finish(c, kind, c->backend->alltoallv(c, send, send_counts, recv, recv_counts), sent, received);
}

dsc_status dsc_comm_alltoall(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv) {
    const dsc_comm_op kind = DSC_COMM_OP_ALLTOALL;
    DSC_TRY(check_pair(c, kind, send, recv));
    int64_t n = dsc_tensor_numel(send);
    DSC_CHECK(n % c->size == 0 && dsc_tensor_numel(recv) == n, DSC_ERR_INVALID,
              "all-to-all on communicator \"%s\": send (%lld elements) and recv (%lld) must be equal and split "
              "evenly over %d ranks",
              c->name, (long long)n, (long long)dsc_tensor_numel(recv), c->size);
    int64_t *even = c->even_counts;
    for (int j = 0; j < c->size; j++)
        even[j] = n / c->size;
    return alltoallv(c, kind, send, even, recv, even);
}

dsc_status dsc_comm_alltoallv(dsc_comm *c, const dsc_tensor *send, const int64_t *send_counts, dsc_tensor *recv,
                              const int64_t *recv_counts) {
    const dsc_comm_op kind = DSC_COMM_OP_ALLTOALLV;
    DSC_TRY(check_pair(c, kind, send, recv));
    DSC_CHECK(send_counts && recv_counts, DSC_ERR_INVALID, "all-to-all-v on communicator \"%s\": counts are NULL",
              c->name);
    return alltoallv(c, kind, send, send_counts, recv, recv_counts);
}

dsc_status dsc_comm_broadcast(dsc_comm *c, dsc_tensor *t, int root) {
    const dsc_comm_op kind = DSC_COMM_OP_BROADCAST;
    DSC_TRY(check_tensor(c, kind, "buffer", t));
    DSC_CHECK(root >= 0 && root < c->size, DSC_ERR_INVALID,
              "broadcast on communicator \"%s\": root %d not in [0, %d)", c->name, root, c->size);
    DSC_TRY(begin(c, &(dsc_comm_signature){kind, t->dtype, dsc_tensor_numel(t), -1, root, NULL, 0, NULL, NULL}));
    int64_t bytes = (int64_t)dsc_tensor_nbytes(t);
    c->op_msg_bytes = bytes;
    bool is_root = root == c->rank;
    return finish(c, kind, bytes ? c->backend->broadcast(c, t, root) : NULL,
                  is_root ? (int64_t)(c->size - 1) * bytes : 0, is_root ? 0 : bytes);
}

dsc_status dsc_comm_barrier(dsc_comm *c) {
    const dsc_comm_op kind = DSC_COMM_OP_BARRIER;
    DSC_TRY(begin(c, &(dsc_comm_signature){kind, DSC_DTYPE_U8, 0, -1, -1, NULL, 0, NULL, NULL}));
    MPI_Request req;
    dsc_status s = dsc_comm_mpi_check(MPI_Ibarrier(c->mpi, &req), "MPI_Ibarrier", c);
    if (!s) s = dsc_comm_mpi_wait(c, "barrier", -1, &req, 1, MPI_STATUSES_IGNORE);
    return finish(c, kind, s, 0, 0);
}

/* ---- point to point ------------------------------------------------------------ */

static dsc_status post(dsc_comm *c, dsc_comm_op kind, dsc_tensor *t, int peer, int tag, dsc_comm_request **out) {
    *out = NULL;
    const char *what = dsc_comm_op_name(kind);
    DSC_TRY(check_tensor(c, kind, "buffer", t));
    DSC_CHECK(peer >= 0 && peer < c->size, DSC_ERR_INVALID, "%s on communicator \"%s\": peer %d not in [0, %d)",
              what, c->name, peer, c->size);
    DSC_CHECK(tag >= 0 && tag <= TAG_MAX, DSC_ERR_INVALID, "%s on communicator \"%s\": tag %d not in [0, %d]",
              what, c->name, tag, TAG_MAX);
    DSC_CHECK(c->broken[0] == '\0', DSC_ERR_COMM, "%s on communicator \"%s\" refused: %s", what, c->name,
              c->broken);
    dsc_comm_request *req;
    int64_t bytes = (int64_t)dsc_tensor_nbytes(t);
    bool sending = kind == DSC_COMM_OP_SEND;
    DSC_TRY(new_request(c, kind, peer, sending ? bytes : 0, sending ? 0 : bytes, bytes, &req));
    req->dtype = t->dtype;
    req->bytes = (size_t)bytes;
    dsc_status s = kind == DSC_COMM_OP_SEND ? c->backend->isend(c, t, peer, tag, req)
                                            : c->backend->irecv(c, t, peer, tag, req);
    if (s) {
        dsc_mem_free(req, sizeof *req, DSC_MEM_COMM, DSC_CPU);
        return dsc_error_wrap(s, "%s with peer %d", what, peer);
    }
    *out = req;
    return NULL;
}

dsc_status dsc_comm_isend(dsc_comm *c, const dsc_tensor *t, int peer, int tag, dsc_comm_request **req) {
    /* The backend only reads a send buffer; the cast serves the shared post path. */
    return post(c, DSC_COMM_OP_SEND, (dsc_tensor *)t, peer, tag, req);
}

dsc_status dsc_comm_irecv(dsc_comm *c, dsc_tensor *t, int peer, int tag, dsc_comm_request **req) {
    return post(c, DSC_COMM_OP_RECV, t, peer, tag, req);
}

/* Ends a request: counts it when it completed, gives it up otherwise (a
 * failed collective also breaks its communicator), frees it. */
static dsc_status retire(dsc_comm_request **reqp, dsc_status s, bool done) {
    dsc_comm_request *req = *reqp;
    if (!s && !done) return NULL;
    if (s && !done) req->comm->backend->abandon(req);
    if (!s) count(req->comm, req->op, req->sent_bytes, req->recv_bytes, req->msg_bytes, req->t0);
    if (s && req->peer < 0) s = finish(req->comm, req->op, s, 0, 0);
    dsc_mem_free(req, sizeof *req, DSC_MEM_COMM, DSC_CPU);
    *reqp = NULL;
    return s;
}

static dsc_status test_request(void *arg, bool *done) {
    return ((dsc_comm_request *)arg)->comm->backend->test(arg, done);
}

dsc_status dsc_comm_wait(dsc_comm_request **reqp) {
    dsc_comm_request *req = *reqp;
    if (!req) return NULL;
    dsc_status s =
        dsc_comm_poll(req->comm, dsc_comm_op_name(req->op), req->peer, req->deadline, test_request, req);
    return retire(reqp, s, s == NULL);
}

typedef struct wait_all {
    dsc_comm_request **reqs;
    int n;
} wait_all;

/* Tests every request still open (each test moves its collective on), retiring those that completed. */
static dsc_status test_all(void *arg, bool *done) {
    wait_all *w = arg;
    *done = true;
    for (int i = 0; i < w->n; i++) {
        dsc_comm_request *req = w->reqs[i];
        if (!req) continue;
        bool finished = false;
        dsc_status s = req->comm->backend->test(req, &finished);
        DSC_TRY(retire(&w->reqs[i], s, finished));
        if (!finished) *done = false;
    }
    return NULL;
}

dsc_status dsc_comm_waitall(dsc_comm_request **reqs, int n) {
    wait_all w = {reqs, n};
    const dsc_comm_request *first = NULL;
    double deadline = 0;
    for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        if (!first) first = reqs[i];
        if (reqs[i]->deadline > deadline) deadline = reqs[i]->deadline;
    }
    if (!first) return NULL;
    dsc_status s = dsc_comm_poll(first->comm, "waiting for requests", -1, deadline, test_all, &w);
    for (int i = 0; s && i < n; i++) /* give up the rest */
        if (reqs[i]) dsc_status_free(retire(&reqs[i], dsc_error(DSC_ERR_COMM, "given up"), false));
    return s;
}

dsc_status dsc_comm_test(dsc_comm_request **reqp, bool *done) {
    *done = true;
    dsc_comm_request *req = *reqp;
    if (!req) return NULL;
    bool finished = false;
    dsc_comm_watch_serve(); /* a rank that polls through test() answers the watchdog too */
    dsc_status s = req->comm->backend->test(req, &finished);
    if (!s && !finished && dsc_comm_now() > req->deadline)
        s = dsc_comm_timeout_error(req->comm, dsc_comm_op_name(req->op), req->peer);
    *done = finished || s;
    return retire(reqp, s, finished);
}

dsc_status dsc_comm_send(dsc_comm *c, const dsc_tensor *t, int peer, int tag) {
    dsc_comm_request *req;
    DSC_TRY(dsc_comm_isend(c, t, peer, tag, &req));
    return dsc_comm_wait(&req);
}

dsc_status dsc_comm_recv(dsc_comm *c, dsc_tensor *t, int peer, int tag) {
    dsc_comm_request *req;
    DSC_TRY(dsc_comm_irecv(c, t, peer, tag, &req));
    return dsc_comm_wait(&req);
}
