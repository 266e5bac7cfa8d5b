/* dsc/comm.h — communicators and the collective operations on tensors.
 *
 * A dsc_comm is an opaque, named group of ranks ("world", "data-parallel",
 * "pipe", ...) with one backend chosen at creation: MPI for CPU tensors,
 * NCCL for CUDA tensors (when dsc is built with CUDA). Every operation is
 * bounded by the communicator's timeout: a peer that never arrives yields
 * DSC_ERR_TIMEOUT naming the operation, the communicator and (for
 * point-to-point) the peer, instead of a hang; the message also says which
 * peers had not answered and on which hosts they run (docs/multihost.md,
 * "The watchdog"). Every operation also counts the bytes this rank sent and
 * received, by operation type (see docs/comm.md for the exact counting rule).
 *
 * Thread-safety: MPI is initialised MPI_THREAD_FUNNELED, so every call on
 * communicators comes from the thread that created the world; the
 * watchdog's registry of live communicators is process-global and relies on
 * that. On a CUDA device, NCCL operations are ordered against the device's
 * compute stream by events (docs/comm.md, "Ordering with compute").
 *
 * Not here: which ranks form which group (dsc/topology.h), and anything about
 * what the tensors mean. */
#ifndef DSC_COMM_H
#define DSC_COMM_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_comm dsc_comm;
typedef struct dsc_comm_request dsc_comm_request;

typedef enum dsc_reduce_op {
    DSC_REDUCE_OP_SUM = 0,
    DSC_REDUCE_OP_AVG, /* sum / size; integers truncate toward zero */
    DSC_REDUCE_OP_MAX,
    DSC_REDUCE_OP_COUNT
} dsc_reduce_op;

/* Operation types, the index of the byte counters. */
typedef enum dsc_comm_op {
    DSC_COMM_OP_ALLREDUCE = 0,
    DSC_COMM_OP_REDUCE_SCATTER,
    DSC_COMM_OP_ALLGATHER,
    DSC_COMM_OP_ALLTOALL,
    DSC_COMM_OP_ALLTOALLV,
    DSC_COMM_OP_BROADCAST,
    DSC_COMM_OP_SEND,
    DSC_COMM_OP_RECV,
    DSC_COMM_OP_BARRIER,
    DSC_COMM_OP_COUNT
} dsc_comm_op;

typedef struct dsc_comm_stats {
    int64_t calls[DSC_COMM_OP_COUNT];
    int64_t bytes_sent[DSC_COMM_OP_COUNT];
    int64_t bytes_recv[DSC_COMM_OP_COUNT];
} dsc_comm_stats;

typedef struct dsc_comm_options {
    double timeout_s;  /* deadline of every operation; <= 0 means the default, 300 s */
    dsc_device device; /* where the tensors live: cpu -> MPI backend, cuda -> NCCL backend */
    /* Checked collectives: before each collective its ranks agree on the
     * operation, element type, size, reduce op, root and counts (one small
     * all-gather more per collective), so ranks that disagree all get an
     * error naming the rank and both values instead of corrupting memory.
     * Also turned on for every communicator by DSC_COMM_CHECK=1. */
    bool check_collectives;
} dsc_comm_options;

#define DSC_COMM_DEFAULT_TIMEOUT_S 300.0

/* ---- creation ---------------------------------------------------------------
 * The world communicator: initialises MPI (MPI_THREAD_FUNNELED) unless it is
 * already initialised, makes MPI return errors instead of aborting, and sets
 * the rank that prefixes dsc error messages. `opts` may be NULL (cpu, 300 s). */
DSC_API dsc_status dsc_comm_world(const dsc_comm_options *opts, dsc_comm **out);

/* A sub-communicator of `parent`, collective over every rank of the parent.
 * Each rank passes the parent ranks of the group it joins (including itself);
 * the group's communicator orders its ranks as listed. The members first agree
 * on their lists: a rank whose list is invalid or disagrees with its members'
 * lists makes every rank return an error. The child inherits the parent's
 * options. */
DSC_API dsc_status dsc_comm_create_sub(dsc_comm *parent, const int *members, int count, const char *name,
                                       dsc_comm **out);

DSC_API void dsc_comm_free(dsc_comm *c);

/* Finalises MPI if dsc_comm_world initialised it; call after freeing every communicator. */
DSC_API dsc_status dsc_comm_finalize(void);

DSC_API int dsc_comm_rank(const dsc_comm *c);
DSC_API int dsc_comm_size(const dsc_comm *c);
DSC_API const char *dsc_comm_name(const dsc_comm *c);
DSC_API const char *dsc_comm_backend_name(const dsc_comm *c); /* "mpi" or "nccl" */
/* The world rank of this communicator's rank `rank`. */
DSC_API int dsc_comm_world_rank(const dsc_comm *c, int rank);
/* The host this communicator's rank `rank` runs on (MPI_Get_processor_name,
 * gathered when the world communicator was created). */
DSC_API const char *dsc_comm_host(const dsc_comm *c, int rank);

DSC_API double dsc_comm_timeout(const dsc_comm *c);
DSC_API dsc_status dsc_comm_set_timeout(dsc_comm *c, double timeout_s);

DSC_API void dsc_comm_get_stats(const dsc_comm *c, dsc_comm_stats *out);
DSC_API void dsc_comm_reset_stats(dsc_comm *c);
DSC_API const char *dsc_comm_op_name(dsc_comm_op op);     /* "all-reduce", ... */
DSC_API const char *dsc_reduce_op_name(dsc_reduce_op op); /* "sum", "avg", "max" */

/* ---- collectives (blocking, bounded by the timeout) --------------------------
 * All ranks of the communicator call the same operation with tensors of the
 * same dtype; counts are in elements. Shapes only matter through their element
 * counts. */

/* In place: every rank ends with the elementwise reduction of all ranks' `t`. */
DSC_API dsc_status dsc_comm_allreduce(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op);

/* `send` holds size pieces back to back; piece i has counts[i] elements (NULL:
 * numel(send)/size each). Rank i receives the reduction of every rank's piece i
 * into `recv`, which has counts[i] elements. `recv` may be this rank's piece
 * of `send` (in place; the rest of `send` is then left unspecified); no other
 * overlap is allowed. */
DSC_API dsc_status dsc_comm_reduce_scatter(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv,
                                           const int64_t *counts, dsc_reduce_op op);

/* Rank i contributes `send` (counts[i] elements; NULL: all equal); every rank
 * receives all pieces back to back in rank order in `recv`. `send` may be this
 * rank's piece of `recv` (in place); no other overlap is allowed. */
DSC_API dsc_status dsc_comm_allgather(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv,
                                      const int64_t *counts);

/* `send` and `recv` hold size equal pieces; piece j of `send` goes to rank j
 * and arrives as piece i (this rank) of rank j's `recv`. */
DSC_API dsc_status dsc_comm_alltoall(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv);

/* As all-to-all with per-peer counts: send_counts[j] elements go to rank j,
 * recv_counts[j] elements arrive from rank j; pieces are back to back in rank
 * order and may be empty. A count that disagrees with the peer's is an error. */
DSC_API dsc_status dsc_comm_alltoallv(dsc_comm *c, const dsc_tensor *send, const int64_t *send_counts,
                                      dsc_tensor *recv, const int64_t *recv_counts);

/* Root's `t` is copied into every rank's `t`. */
DSC_API dsc_status dsc_comm_broadcast(dsc_comm *c, dsc_tensor *t, int root);

DSC_API dsc_status dsc_comm_barrier(dsc_comm *c);

/* ---- non-blocking collectives ------------------------------------------------------
 * The same operations, posted: *req completes through dsc_comm_wait /
 * dsc_comm_test as a point-to-point request does (NULL when there is nothing
 * to move). Every rank posts the collectives of a communicator in the same
 * order, blocking ones included; several may be in flight and they may be
 * finished in any order. The tensors must stay alive and untouched until the
 * request completes (counts need not: they are copied). A collective moves
 * forward only while this rank tests or waits on its request (Open MPI
 * progresses non-blocking collectives inside MPI_Test, and the ring
 * algorithms post their next step there): to overlap compute, test between
 * pieces of work. NCCL runs it on the communicator's stream, ordered after
 * the compute stream's work queued so far. Bytes are counted when it
 * completes; a failure or timeout breaks the communicator as for the blocking
 * forms. */
DSC_API dsc_status dsc_comm_iallreduce(dsc_comm *c, dsc_tensor *t, dsc_reduce_op op, dsc_comm_request **req);
DSC_API dsc_status dsc_comm_ireduce_scatter(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv,
                                            const int64_t *counts, dsc_reduce_op op, dsc_comm_request **req);
DSC_API dsc_status dsc_comm_iallgather(dsc_comm *c, const dsc_tensor *send, dsc_tensor *recv,
                                       const int64_t *counts, dsc_comm_request **req);

/* ---- point to point ------------------------------------------------------------
 * Non-blocking: the tensor must stay alive and untouched until the request
 * completes. wait/test free the request once it has completed and set *req to
 * NULL. The deadline of a request starts when it is posted. `peer` is a rank
 * of this communicator; `tag` is in [0, 32767] (NCCL: only 0). A received
 * message must have exactly numel(t) elements; any other size is an error.
 * A request that fails or times out is given up (a receive is cancelled) and
 * freed as well. */
DSC_API dsc_status dsc_comm_isend(dsc_comm *c, const dsc_tensor *t, int peer, int tag, dsc_comm_request **req);
DSC_API dsc_status dsc_comm_irecv(dsc_comm *c, dsc_tensor *t, int peer, int tag, dsc_comm_request **req);
DSC_API dsc_status dsc_comm_wait(dsc_comm_request **req);
DSC_API dsc_status dsc_comm_test(dsc_comm_request **req, bool *done);
/* Waits for n requests together (NULL entries are skipped), testing every one
 * in each round so that collectives in flight all move on at once; the
 * deadline is the latest of theirs. Each is freed and set to NULL; after an
 * error the ones still open are given up and freed too. */
DSC_API dsc_status dsc_comm_waitall(dsc_comm_request **reqs, int n);

/* Blocking forms: post and wait. */
DSC_API dsc_status dsc_comm_send(dsc_comm *c, const dsc_tensor *t, int peer, int tag);
DSC_API dsc_status dsc_comm_recv(dsc_comm *c, dsc_tensor *t, int peer, int tag);

/* ---- DeepSpeed's comms_logger (comms_log.c) -------------------------------------------
 * One logger per process: with `enabled` and `prof_all`, every operation's
 * latency is recorded by DeepSpeed's operation name and message size (and
 * communicator, with `debug`); `verbose` prints each as it completes.
 * Configuring clears what was recorded. */
typedef struct dsc_comm_logger_options {
    bool enabled, verbose, prof_all, debug;
} dsc_comm_logger_options;
DSC_API void dsc_comm_logger_configure(const dsc_comm_logger_options *o);
/* deepspeed.comm.log_summary's table: per operation and message size the
 * count, total and trimmed-mean latency (ms), algorithmic and bus bandwidth
 * (Gbps, trimmed means). */
DSC_API dsc_status dsc_comm_logger_summary(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
