/* bench_moe — the MoE layer (forward + backward) against a dense FFN with the
 * same active FLOPs, at the expert-parallel size given by the number of
 * ranks (EP = world size): tokens per second per rank, the time split into
 * gate / dispatch / all-to-all / experts / combine from the layer's own
 * phase clocks, and all-to-all bytes per step from the communicator's
 * counters beside the formula 4 * (ep-1)/ep * E * Cap * M * 4 bytes (two
 * all-to-alls forward and two backward, each sending all but this rank's
 * share of the (E, Cap, M) f32 buffer).
 *
 * The dense reference is one FFN of width k*F on the same S tokens: the
 * FLOPs of the k experts a token visits (the MoE layer also computes the
 * padding slots, Cap*E >= k*S, and the router).
 *
 * With EP 1 the peer is PyTorch running the same layer (bench/torch_moe_ref.py, with
 * DeepSpeed's einsum dispatch and with index_select / index_add), interleaved with dsc
 * over --pairs pairs on the same threads; the ratio is against the faster peer.
 *
 * With EP > 1 the layer runs both ways of exchanging (moe.overlap_alltoall
 * off: blocking all-to-alls; on: messages in flight while the local share
 * runs through the experts), interleaved over --pairs pairs, and prints the
 * exposed exchange time of each (the all-to-all phase: time spent in
 * communication calls, not hidden behind expert GEMMs) with min and median,
 * and the ratio on / off.
 *
 *   mpirun -np 1 build/bench/bench_moe     (EP 1)
 *   mpirun -np 2 build/bench/bench_moe     (EP 2)
 *   options: --tokens S --d-model M --d-ff F --experts E --k K --capacity-factor C --iters N --pairs P
 *            --torch PATH|none (default bench/torch_moe_ref.py) --python PATH (default /opt/venv/bin/python)
 * Prints; never asserts. */
#define _DEFAULT_SOURCE /* popen, clock_gettime, getloadavg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_clock.h"
#include "bench/bench_peer.h"
#include "dsc/comm.h"
#include "dsc/kernels.h"
#include "dsc/moe.h"

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_moe: %s\n", dsc_status_message(s));
    exit(1);
}

typedef struct bench_opts {
    int64_t S, M, F;
    int E, k, iters, pairs;
    double capacity_factor;
    const char *torch, *python; /* the EP 1 peer; torch "none": no peer */
} bench_opts;

static void fill(float *p, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
}

/* Seconds per forward+backward of the MoE layer, its stats and all-to-all bytes per iteration. */
static double time_moe(const bench_opts *o, dsc_comm *ep, bool overlap, dsc_moe_stats *st, int64_t *a2a_bytes) {
    dsc_model_config mc;
    dsc_model_config_defaults(&mc, DSC_ARCH_GPT_MOE);
    mc.d_model = (int)o->M;
    mc.d_ff = (int)o->F;
    dsc_moe_options mo = {.num_experts = o->E, .expert_kind = DSC_MOE_EXPERT_KIND_GELU};
    mo.gate = dsc_moe_gate_config_default();
    mo.gate.k = o->k;
    mo.gate.capacity_factor = o->capacity_factor;
    mo.gate.use_rts = false;
    mo.gate.top2_2nd_expert_sampling = false;
    mo.overlap_alltoall = overlap;
    dsc_param_store *store;
    dsc_layer *layer;
    die(dsc_params_create(&store, DSC_CPU, 1));
    die(dsc_moe_layer_create(&mo, &mc, 0, store, DSC_CPU, dsc_comm_size(ep) > 1 ? ep : NULL, &layer));
    die(dsc_params_finalize(store));
    die(dsc_layer_reserve(layer, 1, 1, o->S));
    const int64_t shape[3] = {1, o->S, o->M}, n = o->S * o->M;
    float *x = malloc((size_t)n * sizeof *x), *g = malloc((size_t)n * sizeof *g);
    fill(x, n, 1u + (unsigned)dsc_comm_rank(ep));
    fill(g, n, 7u);
    dsc_tensor xt = dsc_tensor_view(x, DSC_DTYPE_F32, 3, shape, DSC_CPU);
    dsc_tensor gt = dsc_tensor_view(g, DSC_DTYPE_F32, 3, shape, DSC_CPU), y, dx;
    double t = 0;
    for (int it = -2; it < o->iters; it++) {
        if (it == 0) { /* after warm-up */
            die(dsc_moe_stats_reset(layer));
            dsc_comm_reset_stats(ep);
            die(dsc_comm_barrier(ep));
            t = now_s();
        }
        dsc_micro_ctx ctx = {.loss_scale = 1.0f, .training = true};
        die(dsc_layer_forward(layer, 0, &xt, &y, &ctx));
        die(dsc_layer_backward(layer, 0, &gt, &dx, &ctx));
    }
    t = (now_s() - t) / o->iters;
    die(dsc_moe_stats_get(layer, st));
    dsc_comm_stats cs;
    dsc_comm_get_stats(ep, &cs);
    *a2a_bytes = (cs.bytes_sent[DSC_COMM_OP_ALLTOALL] + cs.bytes_sent[DSC_COMM_OP_SEND]) / o->iters;
    for (int p = 0; p < DSC_MOE_PHASE_COUNT; p++)
        st->seconds[p] /= o->iters;
    free(x);
    free(g);
    dsc_layer_destroy(layer);
    dsc_params_destroy(store);
    return t;
}

/* Seconds per forward+backward of one GELU FFN of width k*F on S tokens. */
static double time_dense(const bench_opts *o) {
    dsc_moe_experts_options eo = {.kind = DSC_MOE_EXPERT_KIND_GELU,
                                  .d_model = o->M,
                                  .d_ff = o->k * o->F,
                                  .count = 1,
                                  .first = -1,
                                  .init_std = 0.02f,
                                  .init_std_out = 0.02f};
    dsc_param_store *store;
    dsc_moe_experts *ffn;
    die(dsc_params_create(&store, DSC_CPU, 1));
    die(dsc_moe_experts_create(&eo, "dense", store, DSC_CPU, &ffn));
    die(dsc_params_finalize(store));
    die(dsc_moe_experts_reserve(ffn, 1, o->S));
    const int64_t shape[3] = {1, o->S, o->M}, n = o->S * o->M;
    dsc_tensor x, y, g, dx;
    die(dsc_tensor_alloc(&x, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    die(dsc_tensor_alloc(&y, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    die(dsc_tensor_alloc(&g, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    die(dsc_tensor_alloc(&dx, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    fill(x.data, n, 3u);
    fill(g.data, n, 7u);
    double t = 0;
    for (int it = -2; it < o->iters; it++) {
        if (it == 0) t = now_s();
        die(dsc_moe_experts_forward(ffn, 0, &x, &y));
        die(dsc_moe_experts_backward(ffn, 0, &g, &dx, 1.0f));
    }
    t = (now_s() - t) / o->iters;
    dsc_tensor_free(&x);
    dsc_tensor_free(&y);
    dsc_tensor_free(&g);
    dsc_tensor_free(&dx);
    dsc_moe_experts_destroy(ffn);
    dsc_params_destroy(store);
    return t;
}

/* min and median of n values (sorted in place). */
static void min_median(double *v, int n, double *min, double *median) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *min = v[0];
    *median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void print_run(const bench_opts *o, int ep, const char *what, double t_moe, const dsc_moe_stats *st,
                      int64_t a2a) {
    const int64_t formula = 4 * (int64_t)(ep - 1) * o->E * st->capacity * o->M * 4 / ep;
    printf("  %-28s %12.0f %10.2f\n", what, (double)o->S / t_moe, 1e3 * t_moe);
    printf("    time split:");
    for (int p = 0; p < DSC_MOE_PHASE_COUNT; p++)
        printf(" %s %.2f ms (%.0f%%)", dsc_moe_phase_name((dsc_moe_phase)p), 1e3 * st->seconds[p],
               100.0 * st->seconds[p] / t_moe);
    printf("\n    bytes sent per step and rank: %lld measured, %lld formula 4*(ep-1)/ep*E*Cap*M*4\n",
           (long long)a2a, (long long)formula);
}

/* tokens/s of the PyTorch layer with `dispatch` (einsum | gather), or 0 when it could not run. */
static double run_torch(const bench_opts *o, const char *dispatch) {
    const int threads = dsc_kernels_get_num_threads();
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=%d %s %s --tokens %lld --d-model %lld --d-ff %lld --experts %d --k %d "
             "--capacity-factor %g --iters %d --threads %d --dispatch %s 2>&1",
             threads, o->python, o->torch, (long long)o->S, (long long)o->M, (long long)o->F, o->E, o->k,
             o->capacity_factor, o->iters, threads, dispatch);
    return bench_peer_tokens_per_s(o->torch, cmd, "    ");
}

/* EP 1: the layer against the dense FFN and, interleaved, the PyTorch layer. */
static void run_single(const bench_opts *o, dsc_comm *world, double t_dense) {
    static const char *const peers[2] = {"einsum", "gather"};
    double dsc_tps[64], peer_tps[2][64];
    dsc_moe_stats st;
    int64_t a2a;
    const bool torch = strcmp(o->torch, "none") != 0;
    printf("  %-28s %12s %10s\n", "", "tokens/s/rank", "ms/iter");
    for (int i = 0; i < o->pairs; i++) {
        const double t_moe = time_moe(o, world, false, &st, &a2a);
        dsc_tps[i] = (double)o->S / t_moe;
        print_run(o, 1, "MoE layer", t_moe, &st, a2a);
        for (int v = 0; v < 2 && torch; v++)
            peer_tps[v][i] = run_torch(o, peers[v]);
    }
    double dmin, dmed;
    min_median(dsc_tps, o->pairs, &dmin, &dmed);
    printf("  %-28s %12.0f %10.2f   (dense / MoE time, medians: %.2f)\n", "dense FFN, width k*F",
           (double)o->S / t_dense, 1e3 * t_dense, t_dense * dmed / (double)o->S);
    printf("  tokens/s (min, median over %d pairs): dsc %.0f, %.0f", o->pairs, dmin, dmed);
    if (!torch) {
        printf("\n");
        return;
    }
    double best = 0;
    for (int v = 0; v < 2; v++) {
        double pmin, pmed;
        min_median(peer_tps[v], o->pairs, &pmin, &pmed);
        printf("; PyTorch, %s dispatch, %.0f, %.0f", peers[v], pmin, pmed);
        best = pmed > best ? pmed : best;
    }
    double load = 0;
    printf("\n  dsc / the faster PyTorch (medians) %.2f; load %.2f\n", best > 0 ? dmed / best : 0,
           getloadavg(&load, 1) == 1 ? load : -1.0);
}

int main(int argc, char **argv) {
    bench_opts o = {.S = 1024,
                    .M = 256,
                    .F = 512,
                    .E = 8,
                    .k = 2,
                    .iters = 10,
                    .pairs = 3,
                    .capacity_factor = 1.0,
                    .torch = "bench/torch_moe_ref.py",
                    .python = "/opt/venv/bin/python"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--tokens"))
            o.S = atoll(v);
        else if (!strcmp(a, "--d-model"))
            o.M = atoll(v);
        else if (!strcmp(a, "--d-ff"))
            o.F = atoll(v);
        else if (!strcmp(a, "--experts"))
            o.E = atoi(v);
        else if (!strcmp(a, "--k"))
            o.k = atoi(v);
        else if (!strcmp(a, "--capacity-factor"))
            o.capacity_factor = atof(v);
        else if (!strcmp(a, "--iters"))
            o.iters = atoi(v);
        else if (!strcmp(a, "--pairs"))
            o.pairs = atoi(v);
        else if (!strcmp(a, "--torch"))
            o.torch = v;
        else if (!strcmp(a, "--python"))
            o.python = v;
        else {
            fprintf(stderr, "bench_moe: unknown option %s\n", a);
            return 2;
        }
    }
    if (o.pairs < 1 || o.pairs > 64 || o.iters < 1) {
        fprintf(stderr, "bench_moe: --pairs must be in [1, 64] and --iters >= 1\n");
        return 2;
    }
    dsc_comm *world;
    die(dsc_comm_world(NULL, &world));
    const int rank = dsc_comm_rank(world), ep = dsc_comm_size(world);
    die(dsc_moe_check_parallel(o.E, ep, ep));
    dsc_moe_stats st;
    int64_t a2a;
    const double t_dense = time_dense(&o);
    if (rank == 0)
        printf(
            "bench_moe: EP %d (%d ranks), S %lld tokens/rank, M %lld, F %lld, E %d, k %d, capacity factor %.2f, "
            "forward+backward, %d iterations, %d threads\n",
            ep, ep, (long long)o.S, (long long)o.M, (long long)o.F, o.E, o.k, o.capacity_factor, o.iters,
            dsc_kernels_get_num_threads());
    if (ep == 1) {
        run_single(&o, world, t_dense);
        dsc_comm_free(world);
        die(dsc_comm_finalize());
        return 0;
    }
    double exposed[2][64], step[2][64];
    if (rank == 0) printf("  %-28s %12s %10s\n", "", "tokens/s/rank", "ms/iter");
    for (int i = 0; i < o.pairs; i++)
        for (int v = 0; v < 2; v++) { /* off, on, off, on, ... */
            step[v][i] = time_moe(&o, world, v == 1, &st, &a2a);
            exposed[v][i] = st.seconds[DSC_MOE_PHASE_ALLTOALL];
            char what[64];
            snprintf(what, sizeof what, "MoE layer, overlap %s (%d)", v ? "on" : "off", i + 1);
            if (rank == 0) print_run(&o, ep, what, step[v][i], &st, a2a);
        }
    if (rank == 0) {
        double emin[2], emed[2], smin[2], smed[2];
        for (int v = 0; v < 2; v++) {
            min_median(exposed[v], o.pairs, &emin[v], &emed[v]);
            min_median(step[v], o.pairs, &smin[v], &smed[v]);
        }
        printf("  %-28s %12.0f %10.2f   (dense / MoE time %.2f)\n", "dense FFN, width k*F", (double)o.S / t_dense,
               1e3 * t_dense, t_dense / smed[1]);
        printf("  exposed exchange, ms/iter (min, median over %d pairs): overlap off %.3f, %.3f; on %.3f, %.3f; "
               "on / off (medians) %.2f\n",
               o.pairs, 1e3 * emin[0], 1e3 * emed[0], 1e3 * emin[1], 1e3 * emed[1], emed[1] / emed[0]);
        printf(
            "  MoE layer, ms/iter (min, median): overlap off %.2f, %.2f; on %.2f, %.2f; on / off (medians) %.3f\n",
            1e3 * smin[0], 1e3 * smed[0], 1e3 * smin[1], 1e3 * smed[1], smed[1] / smed[0]);
        double load = 0;
        printf("  load %.2f\n", getloadavg(&load, 1) == 1 ? load : -1.0);
    }
    dsc_comm_free(world);
    die(dsc_comm_finalize());
    return 0;
}
