/* bench_comm — bandwidth of dsc's communicator against plain MPI (Open MPI's
 * default algorithms, blocking calls on MPI_COMM_WORLD) for all-reduce,
 * all-gather, reduce-scatter, all-to-all and point-to-point, 4 KB .. 64 MB.
 *
 * Run on 2 ranks: mpirun -np 2 build/bench/bench_comm [--max-mb 64] [--min-kb 4] [--op all-reduce]
 * GB/s is algorithm bandwidth: the operation's buffer size (all-reduce: the
 * buffer; all-gather: the gathered output; reduce-scatter: the input;
 * all-to-all: one rank's send buffer; p2p: one message, one way) divided by
 * the slowest rank's time per call, best of 3 alternating trials (the
 * machine is shared; the best trial is the least disturbed). The ratio is
 * dsc / MPI. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/comm.h"

typedef enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_ALLTOALL, OP_P2P, OP_COUNT } bench_op;
static const char *op_names[] = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p"};

typedef struct bench {
    dsc_comm *comm;
    int rank, size;
    dsc_tensor a, b; /* (n) f32 each, n = bytes / 4 */
    int64_t n;
} bench;

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_comm: %s\n", dsc_status_message(s));
    exit(1);
}

/* One call of `op` through dsc (use_dsc) or plain MPI, on n floats. */
static void run_once(bench *B, bench_op op, int use_dsc) {
    int64_t n = B->n, piece = n / B->size;
    dsc_tensor part = dsc_tensor_rows(&B->b, 0, piece);
    int peer = B->rank ^ 1;
    switch (op) {
    case OP_ALLREDUCE:
        if (use_dsc)
            die(dsc_comm_allreduce(B->comm, &B->a, DSC_REDUCE_OP_SUM));
        else
            MPI_Allreduce(MPI_IN_PLACE, B->a.data, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case OP_ALLGATHER:
        if (use_dsc)
            die(dsc_comm_allgather(B->comm, &part, &B->a, NULL));
        else
            MPI_Allgather(part.data, (int)piece, MPI_FLOAT, B->a.data, (int)piece, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case OP_REDUCE_SCATTER:
        if (use_dsc)
            die(dsc_comm_reduce_scatter(B->comm, &B->a, &part, NULL, DSC_REDUCE_OP_SUM));
        else
            MPI_Reduce_scatter_block(B->a.data, part.data, (int)piece, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case OP_ALLTOALL:
        if (use_dsc)
            die(dsc_comm_alltoall(B->comm, &B->a, &B->b));
        else
            MPI_Alltoall(B->a.data, (int)piece, MPI_FLOAT, B->b.data, (int)piece, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    default: /* ping-pong between ranks 0 and 1; others idle */
        if (peer >= B->size) break;
        for (int leg = 0; leg < 2; leg++) {
            int sending = (leg == 0) == (B->rank % 2 == 0);
            if (use_dsc)
                die(sending ? dsc_comm_send(B->comm, &B->a, peer, 1) : dsc_comm_recv(B->comm, &B->a, peer, 1));
            else if (sending)
                MPI_Send(B->a.data, (int)n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD);
            else
                MPI_Recv(B->a.data, (int)n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        break;
    }
}

/* Seconds per call on the slowest rank. */
static double time_op(bench *B, bench_op op, int use_dsc, int iters) {
    run_once(B, op, use_dsc); /* warm-up: buffers, scratch, connections */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        run_once(B, op, use_dsc);
    double t = (MPI_Wtime() - t0) / iters, worst;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return op == OP_P2P ? worst / 2 : worst; /* p2p: one way of the round trip */
}

int main(int argc, char **argv) {
    int64_t max_mb = 64, min_bytes = 4096;
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--max-mb") == 0) max_mb = atoll(argv[i + 1]);
        if (strcmp(argv[i], "--min-kb") == 0) min_bytes = atoll(argv[i + 1]) << 10;
        if (strcmp(argv[i], "--op") == 0) only = argv[i + 1];
    }
    if (min_bytes < 4) min_bytes = 4;
    bench B = {0};
    die(dsc_comm_world(NULL, &B.comm));
    B.rank = dsc_comm_rank(B.comm);
    B.size = dsc_comm_size(B.comm);
    int64_t max_bytes = max_mb << 20, max_n = max_bytes / 4;
    die(dsc_tensor_alloc(&B.a, DSC_DTYPE_F32, 1, &max_n, DSC_CPU, DSC_MEM_COMM));
    die(dsc_tensor_alloc(&B.b, DSC_DTYPE_F32, 1, &max_n, DSC_CPU, DSC_MEM_COMM));
    for (int64_t i = 0; i < max_n; i++)
        ((float *)B.a.data)[i] = (float)(i % 7);
    if (B.rank == 0) {
        printf("bench_comm: %d ranks, f32, GB/s = bytes / time of the slowest rank (dsc vs MPI default)\n",
               B.size);
        printf("%-15s %10s %12s %12s %8s\n", "op", "bytes", "dsc GB/s", "MPI GB/s", "ratio");
    }
    for (int op = 0; op < OP_COUNT; op++)
        for (int64_t bytes = min_bytes; bytes <= max_bytes && (!only || !strcmp(only, op_names[op])); bytes *= 4) {
            dsc_tensor full_a = B.a, full_b = B.b;
            B.n = bytes / 4 / B.size * B.size;
            B.a = dsc_tensor_rows(&full_a, 0, B.n);
            B.b = dsc_tensor_rows(&full_b, 0, B.n);
            int iters = (int)(128LL * 1024 * 1024 / bytes);
            iters = iters < 2 ? 2 : iters > 200 ? 200 : iters;
            double t_mpi = 1e30, t_dsc = 1e30;
            for (int trial = 0; trial < 3; trial++) {
                double m = time_op(&B, (bench_op)op, 0, iters), d = time_op(&B, (bench_op)op, 1, iters);
                t_mpi = m < t_mpi ? m : t_mpi;
                t_dsc = d < t_dsc ? d : t_dsc;
            }
            if (B.rank == 0)
                printf("%-15s %10lld %12.3f %12.3f %8.2f\n", op_names[op], (long long)(B.n * 4),
                       B.n * 4 / t_dsc / 1e9, B.n * 4 / t_mpi / 1e9, t_mpi / t_dsc);
            fflush(stdout);
            B.a = full_a;
            B.b = full_b;
        }
    dsc_tensor_free(&B.a);
    dsc_tensor_free(&B.b);
    dsc_comm_free(B.comm);
    die(dsc_comm_finalize());
    return 0;
}
