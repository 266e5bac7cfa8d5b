/* comm_internal.h — what the communicator front end (comm.c) shares with its
 * backends (mpi_backend.c, nccl_backend.c): the communicator's fields, the
 * backend table, requests, and the deadline-bounded polling every blocking
 * wait goes through.
 *
 * Every communicator owns an MPI communicator even under NCCL: it carries
 * group creation, agreement and barriers, and is how NCCL's unique id travels. */
#ifndef DSC_COMM_INTERNAL_H
#define DSC_COMM_INTERNAL_H

#include <mpi.h>
#include <stdbool.h>

#include "dsc/comm.h"

typedef struct dsc_comm_backend dsc_comm_backend;

struct dsc_comm {
    char name[64];
    int rank, size;
    MPI_Comm mpi;
    int *world_ranks;     /* (size) world rank of each member */
    int64_t *even_counts; /* (size) scratch: all-to-all's equal pieces */
    dsc_comm_options opts;
    const dsc_comm_backend *backend;
    void *impl;       /* backend state */
    double deadline;  /* of the blocking operation in progress (dsc_comm_now clock) */
    char broken[160]; /* non-empty after a collective timed out: later calls refuse */
    dsc_comm_stats stats;
    double op_t0;         /* when the blocking operation in progress began (the comms_logger) */
    int64_t op_msg_bytes; /* and its message size */
    int64_t seq;          /* collectives entered so far (the watchdog compares it across ranks) */
    int64_t watch_id;     /* the same on every member: hash of name and world ranks */
    bool watched;         /* registered with the watchdog */
    dsc_comm *watch_next; /* the watchdog's registry of live communicators */
};

/* A point-to-point message or a non-blocking collective in flight. */
struct dsc_comm_request {
    dsc_comm *comm;
    dsc_comm_op op; /* send, recv, all-reduce, reduce-scatter or all-gather */
    int peer;       /* -1 for a collective */
    double deadline;
    dsc_dtype dtype;
    size_t bytes;                   /* size of the tensor (point to point) */
    int64_t sent_bytes, recv_bytes; /* counted when it completes (collectives.c's rule) */
    int64_t msg_bytes;              /* the comms_logger's message size (DeepSpeed's) */
    double t0;                      /* when it was posted (the comms_logger's latency) */
    MPI_Request mpi;                /* MPI backend, point to point */
    void *impl;                     /* the backend's state of a collective; NCCL: the event */
};

/* A backend implements the data-moving operations; the front end validates
 * arguments, sets the deadline, counts bytes and names errors. Counts are in
 * elements and already checked against the tensors (a backend copies what it
 * needs of them: they may go away when the posting call returns). all-to-all
 * is all-to-all-v with equal counts. All-reduce, reduce-scatter and
 * all-gather are only posted (the blocking forms post and wait): they fill
 * req->impl, and test / abandon finish them like point-to-point requests. */
struct dsc_comm_backend {
    const char *name;
    dsc_status (*init)(dsc_comm *c); /* after c->mpi, rank and size are set */
    void (*fini)(dsc_comm *c);
    dsc_status (*iallreduce)(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op, dsc_comm_request *req);
    dsc_status (*ireduce_scatter)(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                                  dsc_reduce_op op, dsc_comm_request *req);
    dsc_status (*iallgather)(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv, const int64_t *counts,
                             dsc_comm_request *req);
    dsc_status (*alltoallv)(dsc_comm *c, const dsc_tensor *send, const int64_t *send_counts, dsc_tensor *recv,
                            const int64_t *recv_counts);
    dsc_status (*broadcast)(dsc_comm *c, dsc_tensor *t, int root);
    dsc_status (*isend)(dsc_comm *c, const dsc_tensor *t, int peer, int tag, dsc_comm_request *req);
    dsc_status (*irecv)(dsc_comm *c, dsc_tensor *t, int peer, int tag, dsc_comm_request *req);
    /* Sets *done; a completed request is checked (e.g. message size) here. */
    dsc_status (*test)(dsc_comm_request *req, bool *done);
    /* Gives up on a request that timed out (cancel what can be cancelled). */
    void (*abandon)(dsc_comm_request *req);
};

extern const dsc_comm_backend dsc_comm_mpi_backend;
#ifdef DSC_HAVE_CUDA
extern const dsc_comm_backend dsc_comm_nccl_backend;
#endif

/* Seconds on a monotonic clock. */
double dsc_comm_now(void);

/* Calls test(arg, &done) until done, sleeping with a short backoff between
 * calls so that oversubscribed ranks leave the CPU to their peers. Past
 * `deadline` it returns DSC_ERR_TIMEOUT naming `what` (e.g. "all-reduce"),
 * the communicator and, when peer >= 0, the peer. */
typedef dsc_status (*dsc_comm_test_fn)(void *arg, bool *done);
dsc_status dsc_comm_timeout_error(const dsc_comm *c, const char *what, int peer);
dsc_status dsc_comm_poll(const dsc_comm *c, const char *what, int peer, double deadline, dsc_comm_test_fn test,
                         void *arg);

/* The watchdog (watchdog.c): host names and the diagnosis of timeouts.
 * attach registers a communicator (the first one, a world, also creates the
 * side communicator and gathers every rank's host name, bounded by its
 * deadline); detach unregisters it and frees everything with the last one. */
dsc_status dsc_comm_watch_attach(dsc_comm *c);
void dsc_comm_watch_detach(dsc_comm *c);
const char *dsc_comm_watch_host(int world_rank);
/* What this rank waits for now (c NULL: nothing), which is what it tells
 * peers that ask; `peer` is a rank of c or -1 for a collective. */
void dsc_comm_watch_waiting(const dsc_comm *c, const char *what, int peer);
/* Answers the peers' queries that have arrived; called between tests. */
void dsc_comm_watch_serve(void);
/* After a timeout on c: asks the peers concerned (peer, or every other
 * member for a collective) and writes into `text` which did not answer, which
 * have not reached the collective and what they wait for. */
void dsc_comm_watch_diagnose(const dsc_comm *c, int peer, char *text, size_t len);

/* What a checked collective's ranks must agree on (signature.c). counts: the
 * global piece counts every rank passes (n_counts of them) or NULL;
 * send_counts / recv_counts: all-to-all-v's, compared pairwise, or NULL. */
typedef struct dsc_comm_signature {
    dsc_comm_op op;
    dsc_dtype dtype;
    int64_t elements; /* -1 where ranks legitimately differ (all-to-all-v) */
    int reduce_op, root;
    const int64_t *counts;
    int n_counts;
    const int64_t *send_counts, *recv_counts;
} dsc_comm_signature;

/* With opts.check_collectives: every rank of c agrees on sig before any
 * payload moves, or every rank returns the same DSC_ERR_INVALID naming the
 * first rank that differs. A no-op otherwise. */
dsc_status dsc_comm_check_signature(dsc_comm *c, const dsc_comm_signature *sig);

/* Waits for MPI requests until c->deadline (see dsc_comm_poll). `statuses`
 * may be MPI_STATUSES_IGNORE; an error in one status names its source rank. */
dsc_status dsc_comm_mpi_wait(const dsc_comm *c, const char *what, int peer, MPI_Request *reqs, int n,
                             MPI_Status *statuses);

/* One MPI_Testall of n requests: sets *done; an error in one status names its source rank. */
dsc_status dsc_comm_mpi_test(const dsc_comm *c, const char *what, MPI_Request *reqs, int n, MPI_Status *statuses,
                             bool *done);

/* NULL when rc is MPI_SUCCESS, otherwise DSC_ERR_COMM naming the call, MPI's
 * message and the communicator. */
dsc_status dsc_comm_mpi_check(int rc, const char *call, const dsc_comm *c);

/* The MPI datatype of a dsc dtype (bf16 and f16 travel as 16-bit integers). */
MPI_Datatype dsc_comm_mpi_type(dsc_dtype dtype);

/* comms_logger (comms_log.c): whether operations are being logged, and one
 * completed operation of `bytes` (DeepSpeed's message size) taking `seconds`. */
bool comm_log_enabled(void);
void comm_log_record(const dsc_comm *c, dsc_comm_op op, int64_t bytes, double seconds);

#endif
