/* dsc-selfcheck — runs on N ranks, forms the process groups of a
 * (pipe, data, model) grid with expert groups, and verifies every collective
 * of runtime/comm on them with known data: results and byte counters. Rank 0
 * prints one line per verified item; the exit status is non-zero if any item
 * failed on any rank.
 *
 *   mpirun -np 4 build/bin/dsc-selfcheck [--pp P] [--tp T] [--ep E] [--expert-tp] [--timeout S]
 *
 * Defaults: pp = 2 when the world is even and >= 4, tp = 2 when it is also
 * >= 8, ep = 2 when the data-parallel size is even. Not here: anything about
 * models; this checks the communication layer only. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/cli.h"
#include "dsc/comm.h"
#include "dsc/topology.h"

typedef struct selfcheck {
    dsc_comm *world;
    int failures;
} selfcheck;

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "dsc-selfcheck: %s\n", dsc_status_message(s));
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2); /* peers may be inside a collective; stop them now */
}

/* Agrees over the world whether an item passed and prints its line on rank 0. */
static void report(selfcheck *sc, const char *item, dsc_comm *c, int64_t bytes, int ok, int counters_ok) {
    int32_t bad = !(ok && counters_ok);
    int64_t one = 1;
    dsc_tensor flag = dsc_tensor_view(&bad, DSC_DTYPE_I32, 1, &one, DSC_CPU);
    die(dsc_comm_allreduce(sc->world, &flag, DSC_REDUCE_OP_MAX));
    if (bad) sc->failures++;
    if (dsc_comm_rank(sc->world) == 0)
        printf("%s over %s (%d rank%s): %s, %lld bytes\n", item, dsc_comm_name(c), dsc_comm_size(c),
               dsc_comm_size(c) == 1 ? "" : "s", bad ? "FAILED" : "ok", (long long)bytes);
    fflush(stdout);
}

/* Counter deltas of `op` since `before` against the expected sent / received bytes. */
static int counted(dsc_comm *c, const dsc_comm_stats *before, dsc_comm_op op, int64_t sent, int64_t recv) {
    dsc_comm_stats now;
    dsc_comm_get_stats(c, &now);
    int64_t s = now.bytes_sent[op] - before->bytes_sent[op], r = now.bytes_recv[op] - before->bytes_recv[op];
    if (s == sent && r == recv && now.calls[op] - before->calls[op] == 1) return 1;
    fprintf(stderr, "rank %d: %s on %s counted %lld sent / %lld received, expected %lld / %lld\n",
            dsc_comm_world_rank(c, dsc_comm_rank(c)), dsc_comm_op_name(op), dsc_comm_name(c), (long long)s,
            (long long)r, (long long)sent, (long long)recv);
    return 0;
}

static float *f32(dsc_tensor *t) {
    return t->data;
}

static dsc_tensor vec(dsc_dtype dtype, int64_t n) {
    dsc_tensor t;
    die(dsc_tensor_alloc(&t, dtype, 1, &n, DSC_CPU, DSC_MEM_COMM));
    return t;
}

static void check_members(selfcheck *sc, dsc_comm *c, const int *members, int n) {
    int ok = dsc_comm_size(c) == n;
    for (int i = 0; ok && i < n; i++)
        ok = dsc_comm_world_rank(c, i) == members[i];
    report(sc, "membership matches the plan", c, 0, ok, 1);
}

static void check_allreduce(selfcheck *sc, dsc_comm *c, dsc_reduce_op op) {
    const int64_t n = 16;
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    dsc_tensor t = vec(DSC_DTYPE_F32, n);
    for (int64_t i = 0; i < n; i++)
        f32(&t)[i] = (float)(dsc_comm_world_rank(c, r) * 100 + i);
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    die(dsc_comm_allreduce(c, &t, op));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        double sum = 0, max = -1;
        for (int q = 0; q < p; q++) {
            double x = dsc_comm_world_rank(c, q) * 100.0 + (double)i;
            sum += x;
            max = x > max ? x : max;
        }
        double want = op == DSC_REDUCE_OP_SUM ? sum : op == DSC_REDUCE_OP_AVG ? sum / p : max;
        ok &= fabs(f32(&t)[i] - want) <= 1e-5 * fabs(want);
    }
    /* all-reduce counts as reduce-scatter + all-gather of the even split. */
    int64_t mine = n / p + (r < n % p), bytes = 4 * (n - mine + (p - 1) * mine);
    int counters_ok = counted(c, &before, DSC_COMM_OP_ALLREDUCE, bytes, bytes);
    char item[64];
    snprintf(item, sizeof item, "all-reduce %s", dsc_reduce_op_name(op));
    report(sc, item, c, n * 4, ok, counters_ok);
    dsc_tensor_free(&t);
}

static void check_reduce_scatter(selfcheck *sc, dsc_comm *c) {
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    int64_t *counts = calloc((size_t)p, sizeof *counts), total = 0, displ = 0;
    for (int j = 0; j < p; j++) {
        counts[j] = j + 1; /* uneven pieces */
        if (j < r) displ += counts[j];
        total += counts[j];
    }
    dsc_tensor send = vec(DSC_DTYPE_F32, total), recv = vec(DSC_DTYPE_F32, counts[r]);
    for (int64_t g = 0; g < total; g++)
        f32(&send)[g] = (float)(r + g);
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    die(dsc_comm_reduce_scatter(c, &send, &recv, counts, DSC_REDUCE_OP_SUM));
    int ok = 1;
    for (int64_t k = 0; k < counts[r]; k++)
        ok &= f32(&recv)[k] == (float)(p * (p - 1) / 2 + p * (displ + k));
    int counters_ok =
        counted(c, &before, DSC_COMM_OP_REDUCE_SCATTER, 4 * (total - counts[r]), 4 * (p - 1) * counts[r]);
    report(sc, "reduce-scatter sum, uneven pieces", c, total * 4, ok, counters_ok);
    dsc_tensor_free(&send);
    dsc_tensor_free(&recv);
    free(counts);
}

static void check_allgather(selfcheck *sc, dsc_comm *c) {
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    int64_t *counts = calloc((size_t)p, sizeof *counts), total = 0;
    for (int j = 0; j < p; j++)
        total += counts[j] = j + 1;
    dsc_tensor send = vec(DSC_DTYPE_F32, counts[r]), recv = vec(DSC_DTYPE_F32, total);
    for (int64_t k = 0; k < counts[r]; k++)
        f32(&send)[k] = (float)(r * 10 + k);
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    die(dsc_comm_allgather(c, &send, &recv, counts));
    int ok = 1;
    for (int j = 0, off = 0; j < p; off += (int)counts[j], j++)
        for (int64_t k = 0; k < counts[j]; k++)
            ok &= f32(&recv)[off + k] == (float)(j * 10 + k);
    int counters_ok = counted(c, &before, DSC_COMM_OP_ALLGATHER, 4 * (p - 1) * counts[r], 4 * (total - counts[r]));
    report(sc, "all-gather, uneven pieces", c, total * 4, ok, counters_ok);
    dsc_tensor_free(&send);
    dsc_tensor_free(&recv);
    free(counts);
}

/* all-to-all (variable = 0: 3 elements per peer) or all-to-all-v ((r + j) % 3 elements, some empty). */
static void check_alltoall(selfcheck *sc, dsc_comm *c, int variable) {
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    int64_t *counts = calloc((size_t)p, sizeof *counts), total = 0, others = 0;
    for (int j = 0; j < p; j++) {
        counts[j] = variable ? (r + j) % 3 : 3; /* symmetric: what r sends j equals what j sends r */
        total += counts[j];
        if (j != r) others += counts[j];
    }
    dsc_tensor send = vec(DSC_DTYPE_F32, total), recv = vec(DSC_DTYPE_F32, total);
    for (int j = 0, off = 0; j < p; off += (int)counts[j], j++)
        for (int64_t k = 0; k < counts[j]; k++)
            f32(&send)[off + k] = (float)(r * 100 + j * 10 + k);
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    die(variable ? dsc_comm_alltoallv(c, &send, counts, &recv, counts) : dsc_comm_alltoall(c, &send, &recv));
    int ok = 1;
    for (int j = 0, off = 0; j < p; off += (int)counts[j], j++)
        for (int64_t k = 0; k < counts[j]; k++)
            ok &= f32(&recv)[off + k] == (float)(j * 100 + r * 10 + k);
    dsc_comm_op op = variable ? DSC_COMM_OP_ALLTOALLV : DSC_COMM_OP_ALLTOALL;
    int counters_ok = counted(c, &before, op, 4 * others, 4 * others);
    report(sc, variable ? "all-to-all-v, uneven and empty pieces" : "all-to-all", c, total * 4, ok, counters_ok);
    dsc_tensor_free(&send);
    dsc_tensor_free(&recv);
    free(counts);
}

static void check_broadcast(selfcheck *sc, dsc_comm *c) {
    int p = dsc_comm_size(c), r = dsc_comm_rank(c), root = p - 1;
    const int64_t n = 10;
    dsc_tensor t = vec(DSC_DTYPE_BF16, n);
    for (int64_t i = 0; i < n; i++)
        ((uint16_t *)t.data)[i] = dsc_f32_to_bf16(r == root ? (float)(i + 1) : 0.0f);
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    die(dsc_comm_broadcast(c, &t, root));
    int ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= dsc_bf16_to_f32(((uint16_t *)t.data)[i]) == (float)(i + 1);
    int counters_ok =
        counted(c, &before, DSC_COMM_OP_BROADCAST, r == root ? 2 * n * (p - 1) : 0, r == root ? 0 : 2 * n);
    report(sc, "broadcast bf16 from the last rank", c, n * 2, ok, counters_ok);
    dsc_tensor_free(&t);
}

static void check_p2p(selfcheck *sc, dsc_comm *c) {
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    const int64_t n = 8;
    dsc_tensor out = vec(DSC_DTYPE_I64, n), in = vec(DSC_DTYPE_I64, n);
    for (int64_t i = 0; i < n; i++)
        ((int64_t *)out.data)[i] = r * 1000 + i;
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    dsc_comm_request *recv_req, *send_req;
    die(dsc_comm_irecv(c, &in, (r - 1 + p) % p, 0, &recv_req));
    die(dsc_comm_isend(c, &out, (r + 1) % p, 0, &send_req));
    die(dsc_comm_wait(&recv_req));
    die(dsc_comm_wait(&send_req));
    int ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= ((int64_t *)in.data)[i] == ((r - 1 + p) % p) * 1000 + i;
    int counters_ok =
        counted(c, &before, DSC_COMM_OP_SEND, 8 * n, 0) && counted(c, &before, DSC_COMM_OP_RECV, 0, 8 * n);
    report(sc, "send/recv around the ring", c, n * 8, ok, counters_ok);
    dsc_tensor_free(&out);
    dsc_tensor_free(&in);
}

static void check_barrier(selfcheck *sc, dsc_comm *c) {
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    die(dsc_comm_barrier(c));
    report(sc, "barrier", c, 0, 1, counted(c, &before, DSC_COMM_OP_BARRIER, 0, 0));
}

static int parse_int(const char *flag, const char *value) {
    char *end;
    long v = strtol(value, &end, 10);
    if (*end || v < 1) {
        fprintf(stderr, "dsc-selfcheck: %s expects a positive integer, got \"%s\"\n", flag, value);
        exit(2);
    }
    return (int)v;
}

static void usage(FILE *fp) {
    fputs("usage: dsc-selfcheck [--pp P] [--tp T] [--ep E] [--expert-tp] [--timeout S]\n"
          "  Run under mpirun / dsc-launch: forms the process groups for the layout (defaults from the world\n"
          "  size), runs every collective with known data and checks results and byte counters.\n",
          fp);
}

int main(int argc, char **argv) {
    if (dsc_cli_info(argc, argv, argc - 1, "dsc-selfcheck", usage)) return 0;
    dsc_comm_options opts = {.timeout_s = 60, .device = DSC_CPU};
    selfcheck sc = {0};
    die(dsc_comm_world(&opts, &sc.world));
    int world = dsc_comm_size(sc.world), rank = dsc_comm_rank(sc.world);
    dsc_parallel_dims dims = {.pp = world % 2 == 0 && world >= 4 ? 2 : 1};
    dims.tp = world % 4 == 0 && world >= 8 ? 2 : 1;
    int explicit_ep = 0;
    for (int i = 1; i < argc; i++) {
        const char *next = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(argv[i], "--pp") == 0)
            dims.pp = parse_int(argv[i], next), i++;
        else if (strcmp(argv[i], "--tp") == 0)
            dims.tp = parse_int(argv[i], next), i++;
        else if (strcmp(argv[i], "--ep") == 0)
            dims.ep = parse_int(argv[i], next), explicit_ep = 1, i++;
        else if (strcmp(argv[i], "--timeout") == 0)
            opts.timeout_s = parse_int(argv[i], next), i++;
        else if (strcmp(argv[i], "--expert-tp") == 0)
            dims.expert_tp = true;
        else {
            if (rank == 0) {
                fprintf(stderr, "dsc-selfcheck: unknown option %s\n", argv[i]);
                usage(stderr);
            }
            return 2;
        }
    }
    die(dsc_comm_set_timeout(sc.world, opts.timeout_s));
    int stage = world / (dims.pp > 0 ? dims.pp : 1), dp = dims.tp > 0 ? stage / dims.tp : 0;
    if (!explicit_ep) dims.ep = dp % 2 == 0 && dp > 0 ? 2 : 1;
    dsc_group_plan plan;
    dsc_status s = dsc_groups_plan(world, rank, &dims, &plan);
    if (s) {
        if (rank == 0) fprintf(stderr, "dsc-selfcheck: %s\n", dsc_status_message(s));
        dsc_status_free(s);
        dsc_comm_free(sc.world);
        dsc_comm_finalize();
        return 2;
    }
    if (rank == 0)
        printf("dsc-selfcheck: %d ranks = pipe %d x data %d x model %d, ep_size %d%s\n", world, plan.dims.pp,
               plan.dims.dp, plan.dims.tp, plan.dims.ep, plan.dims.expert_tp ? " (expert tensor parallel)" : "");
    dsc_groups *groups;
    die(dsc_groups_create(sc.world, &plan, &groups));
    for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++) {
        int n;
        const int *members = dsc_group_plan_members(&plan, (dsc_group_kind)k, &n);
        check_members(&sc, dsc_groups_get(groups, (dsc_group_kind)k), members, n);
    }
    dsc_comm *w = dsc_groups_get(groups, DSC_GROUP_KIND_WORLD);
    for (int op = 0; op < DSC_REDUCE_OP_COUNT; op++)
        check_allreduce(&sc, w, (dsc_reduce_op)op);
    check_reduce_scatter(&sc, w);
    check_allgather(&sc, w);
    check_alltoall(&sc, w, 0);
    check_alltoall(&sc, w, 1);
    check_broadcast(&sc, w);
    check_p2p(&sc, w);
    check_barrier(&sc, w);
    /* Each group with the operation it exists for. */
    check_p2p(&sc, dsc_groups_get(groups, DSC_GROUP_KIND_PIPE));
    check_allreduce(&sc, dsc_groups_get(groups, DSC_GROUP_KIND_DATA), DSC_REDUCE_OP_AVG);
    check_allgather(&sc, dsc_groups_get(groups, DSC_GROUP_KIND_TENSOR));
    check_alltoall(&sc, dsc_groups_get(groups, DSC_GROUP_KIND_EXPERT), 1);
    check_allreduce(&sc, dsc_groups_get(groups, DSC_GROUP_KIND_EXPERT_DATA), DSC_REDUCE_OP_SUM);
    if (rank == 0) printf("dsc-selfcheck: %s (%d failed)\n", sc.failures ? "FAILED" : "all ok", sc.failures);
    dsc_groups_free(groups);
    dsc_group_plan_free(&plan);
    dsc_comm_free(sc.world);
    die(dsc_comm_finalize());
    return sc.failures ? 1 : 0;
}
