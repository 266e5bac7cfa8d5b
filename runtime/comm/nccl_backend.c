/* nccl_backend.c — the NCCL implementation of the communicator backend
 * table, for tensors in CUDA memory; compiled only when dsc is built with
 * CUDA (DSC_HAVE_CUDA).
 *
 * NCCL communicators are created non-blocking (ncclConfig_t.blocking = 0) so
 * that nothing here can wait without a deadline: every call is settled by
 * polling ncclCommGetAsyncError, and every operation ends by recording an
 * event on the communicator's stream and polling it through dsc_comm_poll
 * (all-reduce, reduce-scatter, all-gather and point to point record their
 * own event into the request, which test queries, so they can be in flight
 * while the compute stream runs on). On
 * a timeout the NCCL communicator is aborted (NCCL cannot cancel a single
 * operation) and the dsc communicator refuses further work. The unique id
 * travels over the communicator's MPI twin. Uneven reduce-scatter and
 * all-gather are grouped ncclReduce / ncclBroadcast calls, one per piece.
 * Ordering with compute (docs/comm.md): every operation first makes the
 * communicator's stream wait for an event recorded on the device's compute
 * stream (the backend object's), so it sees what the kernels before it
 * wrote; and the compute stream waits for the event recorded after the
 * operation, so kernels after it see what it delivered.
 * Not here: argument checks, deadlines and byte counting (collectives.c). */
#ifdef DSC_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

#include "core/backend.h"
#include "runtime/comm/comm_internal.h"

typedef struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;  /* this communicator's */
    cudaStream_t compute; /* the device's compute stream (its backend object's) */
    cudaEvent_t ready;    /* recorded on compute before each operation */
    cudaEvent_t done;     /* recorded after each collective */
} nccl_state;

static dsc_status nccl_check(ncclResult_t r, const char *call, const dsc_comm *c) {
    if (r == ncclSuccess || r == ncclInProgress) return NULL;
    return dsc_error(DSC_ERR_COMM, "%s failed on communicator \"%s\": %s", call, c->name, ncclGetErrorString(r));
}

static dsc_status cuda_check(cudaError_t e, const char *call, const dsc_comm *c) {
    if (e == cudaSuccess) return NULL;
    return dsc_error(DSC_ERR_BACKEND, "%s failed on communicator \"%s\": %s", call, c->name,
                     cudaGetErrorString(e));
}

static ncclDataType_t nccl_type(dsc_dtype dtype) {
    static const ncclDataType_t types[DSC_DTYPE_COUNT] = {ncclFloat32, ncclBfloat16, ncclFloat16,
                                                          ncclInt32,   ncclInt64,    ncclUint8};
    return types[dtype];
}

static ncclRedOp_t nccl_op(dsc_reduce_op op) {
    return op == DSC_REDUCE_OP_MAX ? ncclMax : op == DSC_REDUCE_OP_AVG ? ncclAvg : ncclSum;
}

/* ---- ordering with the compute stream ------------------------------------------- */

/* Called before an operation is issued: the communicator's stream waits for
 * everything queued so far on the compute stream (the producers of its data). */
static dsc_status after_compute(dsc_comm *c) {
    nccl_state *st = c->impl;
    DSC_TRY(cuda_check(cudaEventRecord(st->ready, st->compute), "cudaEventRecord", c));
    return cuda_check(cudaStreamWaitEvent(st->stream, st->ready, 0), "cudaStreamWaitEvent", c);
}

/* Called once `event` (recorded after an operation) is reached: later
 * kernels on the compute stream wait for it. */
static dsc_status compute_after(dsc_comm *c, cudaEvent_t event) {
    nccl_state *st = c->impl;
    return cuda_check(cudaStreamWaitEvent(st->compute, event, 0), "cudaStreamWaitEvent", c);
}

/* ---- waiting ---------------------------------------------------------------- */

static dsc_status test_settled(void *arg, bool *done) {
    dsc_comm *c = arg;
    nccl_state *st = c->impl;
    ncclResult_t state = ncclSuccess;
    DSC_TRY(nccl_check(ncclCommGetAsyncError(st->comm, &state), "ncclCommGetAsyncError", c));
    DSC_TRY(nccl_check(state, "NCCL operation", c));
    *done = state != ncclInProgress;
    return NULL;
}

typedef struct event_wait {
    dsc_comm *comm;
    cudaEvent_t event;
} event_wait;

static dsc_status test_event(void *arg, bool *done) {
    event_wait *w = arg;
    bool settled = false;
    DSC_TRY(test_settled(w->comm, &settled)); /* an asynchronous NCCL failure ends the wait */
    cudaError_t e = cudaEventQuery(w->event);
    *done = e == cudaSuccess;
    return e == cudaErrorNotReady ? NULL : cuda_check(e, "cudaEventQuery", w->comm);
}

/* A failed or timed-out operation leaves NCCL state we cannot cancel: abort. */
static dsc_status give_up(dsc_comm *c, dsc_status s) {
    nccl_state *st = c->impl;
    ncclCommAbort(st->comm);
    st->comm = NULL;
    snprintf(c->broken, sizeof c->broken, "its NCCL communicator was aborted after: %.100s",
             dsc_status_message(s));
    return s;
}

/* Waits until the calls just issued are enqueued, then until the stream passes them. */
static dsc_status finish_on_stream(dsc_comm *c, const char *what, int peer, ncclResult_t issued,
                                   const char *call) {
    nccl_state *st = c->impl;
    dsc_status s = nccl_check(issued, call, c);
    if (!s) s = dsc_comm_poll(c, what, peer, c->deadline, test_settled, c);
    if (!s) s = cuda_check(cudaEventRecord(st->done, st->stream), "cudaEventRecord", c);
    event_wait w = {c, st->done};
    if (!s) s = dsc_comm_poll(c, what, peer, c->deadline, test_event, &w);
    if (!s) s = compute_after(c, st->done);
    return s ? give_up(c, s) : NULL;
}

/* ---- lifecycle --------------------------------------------------------------- */

static dsc_status nccl_init(dsc_comm *c) {
    nccl_state *st;
    DSC_TRY(dsc_mem_alloc((void **)&st, sizeof *st, DSC_MEM_COMM, DSC_CPU));
    c->impl = st;
    const dsc_backend *device;
    DSC_TRY(dsc_backend_get(c->opts.device, &device));
    st->compute = (cudaStream_t)device->stream;
    DSC_TRY(cuda_check(cudaSetDevice(c->opts.device.index), "cudaSetDevice", c));
    DSC_TRY(cuda_check(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate", c));
    DSC_TRY(cuda_check(cudaEventCreateWithFlags(&st->ready, cudaEventDisableTiming), "cudaEventCreate", c));
    DSC_TRY(cuda_check(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), "cudaEventCreate", c));
    ncclUniqueId id;
    if (c->rank == 0) DSC_TRY(nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", c));
    MPI_Request req;
    DSC_TRY(dsc_comm_mpi_check(MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, c->mpi, &req), "MPI_Ibcast", c));
    DSC_TRY(dsc_comm_mpi_wait(c, "broadcasting the NCCL unique id", -1, &req, 1, MPI_STATUSES_IGNORE));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DSC_TRY(
        nccl_check(ncclCommInitRankConfig(&st->comm, c->size, id, c->rank, &config), "ncclCommInitRankConfig", c));
    dsc_status s = dsc_comm_poll(c, "creating the NCCL communicator", -1, c->deadline, test_settled, c);
    return s ? give_up(c, s) : NULL;
}

static void nccl_fini(dsc_comm *c) {
    nccl_state *st = c->impl;
    if (st->comm) ncclCommDestroy(st->comm);
    if (st->done) cudaEventDestroy(st->done);
    if (st->ready) cudaEventDestroy(st->ready);
    if (st->stream) cudaStreamDestroy(st->stream);
    dsc_mem_free(st, sizeof *st, DSC_MEM_COMM, DSC_CPU);
    c->impl = NULL;
}

/* ---- collectives ---------------------------------------------------------------- */

/* Waits until the calls just issued are enqueued, then records the request's
 * event after them on the communicator's stream (test queries it). */
static dsc_status post_event(dsc_comm *c, dsc_comm_request *req, ncclResult_t issued, const char *call) {
    nccl_state *st = c->impl;
    c->deadline = req->deadline;
    DSC_TRY(nccl_check(issued, call, c));
    dsc_status s = dsc_comm_poll(c, call, req->peer, c->deadline, test_settled, c);
    if (s) return give_up(c, s);
    cudaEvent_t event;
    DSC_TRY(cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", c));
    req->impl = event;
    return cuda_check(cudaEventRecord(event, st->stream), "cudaEventRecord", c);
}

static dsc_status nccl_iallreduce(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op, dsc_comm_request *req) {
    nccl_state *st = c->impl;
    DSC_TRY(after_compute(c));
    ncclResult_t r = ncclAllReduce(t->data, t->data, (size_t)dsc_tensor_numel(t), nccl_type(t->dtype), nccl_op(op),
                                   st->comm, st->stream);
    return post_event(c, req, r, "ncclAllReduce");
}

static bool even(const dsc_comm *c, const int64_t *counts) {
    for (int i = 1; counts && i < c->size; i++)
        if (counts[i] != counts[0]) return false;
    return true;
}

static dsc_status nccl_ireduce_scatter(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv,
                                       const int64_t *counts, dsc_reduce_op op, dsc_comm_request *req) {
    nccl_state *st = c->impl;
    ncclDataType_t type = nccl_type(send->dtype);
    DSC_TRY(after_compute(c));
    if (even(c, counts))
        return post_event(c, req,
                          ncclReduceScatter(send->data, recv->data, (size_t)dsc_tensor_numel(recv), type,
                                            nccl_op(op), st->comm, st->stream),
                          "ncclReduceScatter");
    size_t esize = dsc_dtype_size(send->dtype), offset = 0;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < c->size && (r == ncclSuccess || r == ncclInProgress); i++) {
        r = ncclReduce((const char *)send->data + offset * esize, recv->data, (size_t)counts[i], type, nccl_op(op),
                       i, st->comm, st->stream);
        offset += (size_t)counts[i];
    }
    ncclResult_t end = ncclGroupEnd();
    return post_event(c, req, r == ncclSuccess || r == ncclInProgress ? end : r, "ncclReduce (grouped)");
}

static dsc_status nccl_iallgather(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                                  dsc_comm_request *req) {
    nccl_state *st = c->impl;
    ncclDataType_t type = nccl_type(send->dtype);
    DSC_TRY(after_compute(c));
    if (even(c, counts))
        return post_event(
            c, req,
            ncclAllGather(send->data, recv->data, (size_t)dsc_tensor_numel(send), type, st->comm, st->stream),
            "ncclAllGather");
    size_t esize = dsc_dtype_size(send->dtype), offset = 0;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < c->size && (r == ncclSuccess || r == ncclInProgress); i++) {
        r = ncclBroadcast(send->data, (char *)recv->data + offset * esize, (size_t)counts[i], type, i, st->comm,
                          st->stream);
        offset += (size_t)counts[i];
    }
    ncclResult_t end = ncclGroupEnd();
    return post_event(c, req, r == ncclSuccess || r == ncclInProgress ? end : r, "ncclBroadcast (grouped)");
}

static dsc_status nccl_alltoallv(dsc_comm *c, const dsc_tensor *send, const int64_t *send_counts, dsc_tensor *recv,
                                 const int64_t *recv_counts) {
    nccl_state *st = c->impl;
    ncclDataType_t type = nccl_type(send->dtype);
    size_t esize = dsc_dtype_size(send->dtype), send_off = 0, recv_off = 0;
    const char *out = send->data;
    char *in = recv->data;
    DSC_CHECK(send_counts[c->rank] == recv_counts[c->rank], DSC_ERR_INVALID,
              "all-to-all on communicator \"%s\": %lld elements sent to self but %lld expected", c->name,
              (long long)send_counts[c->rank], (long long)recv_counts[c->rank]);
    DSC_TRY(after_compute(c));
    /* The own piece is a device copy, enqueued before the group so that no
     * CUDA call enters the stream while the non-blocking group is in flight. */
    for (int j = 0; j < c->rank; j++) {
        send_off += (size_t)send_counts[j];
        recv_off += (size_t)recv_counts[j];
    }
    if (send_counts[c->rank] > 0)
        DSC_TRY(
            cuda_check(cudaMemcpyAsync(in + recv_off * esize, out + send_off * esize,
                                       (size_t)send_counts[c->rank] * esize, cudaMemcpyDeviceToDevice, st->stream),
                       "cudaMemcpyAsync", c));
    send_off = recv_off = 0;
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < c->size && (r == ncclSuccess || r == ncclInProgress); j++) {
        if (j != c->rank && (send_counts[j] > 0 || recv_counts[j] > 0)) {
            r = ncclSend(out + send_off * esize, (size_t)send_counts[j], type, j, st->comm, st->stream);
            if (r == ncclSuccess || r == ncclInProgress)
                r = ncclRecv(in + recv_off * esize, (size_t)recv_counts[j], type, j, st->comm, st->stream);
        }
        send_off += (size_t)send_counts[j];
        recv_off += (size_t)recv_counts[j];
    }
    ncclResult_t end = ncclGroupEnd();
    return finish_on_stream(c, "all-to-all", -1, r == ncclSuccess || r == ncclInProgress ? end : r,
                            "ncclSend/ncclRecv (grouped)");
}

static dsc_status nccl_broadcast(dsc_comm *c, dsc_tensor *t, int root) {
    nccl_state *st = c->impl;
    DSC_TRY(after_compute(c));
    return finish_on_stream(c, "broadcast", -1,
                            ncclBroadcast(t->data, t->data, (size_t)dsc_tensor_numel(t), nccl_type(t->dtype), root,
                                          st->comm, st->stream),
                            "ncclBroadcast");
}

/* ---- point to point ------------------------------------------------------------ */

static dsc_status nccl_isend(dsc_comm *c, const dsc_tensor *t, int peer, int tag, dsc_comm_request *req) {
    nccl_state *st = c->impl;
    DSC_CHECK(tag == 0, DSC_ERR_UNSUPPORTED, "send on communicator \"%s\": NCCL has no tags (tag %d)", c->name,
              tag);
    DSC_TRY(after_compute(c));
    return post_event(
        c, req, ncclSend(t->data, (size_t)dsc_tensor_numel(t), nccl_type(t->dtype), peer, st->comm, st->stream),
        "ncclSend");
}

static dsc_status nccl_irecv(dsc_comm *c, dsc_tensor *t, int peer, int tag, dsc_comm_request *req) {
    nccl_state *st = c->impl;
    DSC_CHECK(tag == 0, DSC_ERR_UNSUPPORTED, "recv on communicator \"%s\": NCCL has no tags (tag %d)", c->name,
              tag);
    DSC_TRY(after_compute(c));
    return post_event(
        c, req, ncclRecv(t->data, (size_t)dsc_tensor_numel(t), nccl_type(t->dtype), peer, st->comm, st->stream),
        "ncclRecv");
}

static dsc_status nccl_test(dsc_comm_request *req, bool *done) {
    event_wait w = {req->comm, (cudaEvent_t)req->impl};
    DSC_TRY(test_event(&w, done));
    if (*done) {
        dsc_status s = compute_after(req->comm, w.event);
        cudaEventDestroy(w.event);
        req->impl = NULL;
        return s;
    }
    return NULL;
}

static void nccl_abandon(dsc_comm_request *req) {
    if (req->impl) cudaEventDestroy((cudaEvent_t)req->impl);
    req->impl = NULL;
    nccl_state *st = req->comm->impl;
    if (st->comm) dsc_status_free(give_up(req->comm, dsc_error(DSC_ERR_TIMEOUT, "a request")));
}

const dsc_comm_backend dsc_comm_nccl_backend = {
    .name = "nccl",
    .init = nccl_init,
    .fini = nccl_fini,
    .iallreduce = nccl_iallreduce,
    .ireduce_scatter = nccl_ireduce_scatter,
    .iallgather = nccl_iallgather,
    .alltoallv = nccl_alltoallv,
    .broadcast = nccl_broadcast,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .test = nccl_test,
    .abandon = nccl_abandon,
};

#endif
