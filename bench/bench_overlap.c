/* bench_overlap — exposed gradient-reduction time of data-parallel training
 * with and without zero_optimization.overlap_comm.
 *
 * Run on 2 ranks: mpirun -np 2 build/bench/bench_overlap [--layers 8] [--dim 1024] [--tokens 256]
 *                 [--kernels 4] [--steps 4] [--rounds 3] [--stage 0] [--hook 1]
 * Each of L layers holds one (dim, dim) weight; its backward is the real
 * weight-gradient GEMM dW += dy^T @ x over `tokens` rows (dsc_kernel_gemm, one
 * thread per rank), run as `kernels` GEMMs over slices of the rows (a
 * transformer block's backward is about ten kernels), then grads_ready, as
 * the default runner calls it; one bucket per layer (reduce_bucket_size =
 * dim^2). As in the default runner, the optimizer's progress runs before
 * every kernel (dsc_kernels_set_progress) in every mode; --hook 0 leaves it
 * out (progress at grads_ready only, as before the hook existed). A step is backward of every
 * layer plus reduce_grads (the optimizer step after it is not timed). Three
 * modes run interleaved, `rounds` times, each timing `steps` steps on the
 * slowest rank:
 *   compute  the same optimizer without a data-parallel group (no reduction),
 *   synced   compute, each step ending with a barrier: a data-parallel step
 *            cannot end before the slowest rank's backward, whatever the
 *            reduction costs, so this is the floor any reduction can reach,
 *   blocking overlap_comm false (each bucket all-reduced when final),
 *   overlap  overlap_comm true (posted when final, progressed before every
 *            kernel and at every grads_ready, waited in reduce_grads).
 * Exposed reduction time = step time of the mode - step time of compute
 * (medians over the rounds). It prints the overlapped figure (measured)
 * beside the blocking one (reference) and their ratio (target <= 0.30), and
 * the same against synced (what the reduction adds beyond the ranks'
 * waiting for each other, which on a loaded machine is most of the rest).
 * What overlap can hide on a CPU: the waiting (latency, a peer's skew), not
 * the memory copies and additions of the reduction itself, which take the
 * same core as the GEMMs. --stage 1 runs ZeRO-1's bucketed reduce-scatter
 * instead of the plain all-reduce. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/comm.h"
#include "dsc/kernels.h"
#include "dsc/zero.h"

enum { MODE_COMPUTE, MODE_SYNCED, MODE_BLOCKING, MODE_OVERLAP, MODE_COUNT };
static const char *mode_names[] = {"compute", "synced", "blocking", "overlap"};

typedef struct bench {
    int layers, dim, tokens, kernels, steps, rounds, stage, hook;
    dsc_comm *world;
    dsc_param_store *store;
    dsc_layer *layer; /* (layers) */
    dsc_layer **ptrs; /* (layers) */
    dsc_tensor dy, x; /* (tokens, dim) each, shared by every layer */
    /* summed over rounds: seconds per step inside the kernel hook, grads_ready, reduce_grads */
    double in_hook[MODE_COUNT], in_ready[MODE_COUNT], in_wait[MODE_COUNT];
} bench;

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_overlap: %s\n", dsc_status_message(s));
    exit(1);
}

static void setup(bench *B) {
    die(dsc_params_create(&B->store, DSC_CPU, 7));
    B->layer = calloc((size_t)B->layers, sizeof *B->layer);
    B->ptrs = calloc((size_t)B->layers, sizeof *B->ptrs);
    dsc_param **params = calloc((size_t)B->layers, sizeof *params);
    if (!B->layer || !B->ptrs || !params) die(dsc_error(DSC_ERR_NOMEM, "%d layers", B->layers));
    int64_t shape[2] = {B->dim, B->dim};
    for (int l = 0; l < B->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d.weight", l);
        die(dsc_params_declare(B->store, name, 2, shape, 0, DSC_INIT_NORMAL, 0.02f, &params[l]));
    }
    die(dsc_params_finalize(B->store));
    for (int l = 0; l < B->layers; l++) {
        snprintf(B->layer[l].name, sizeof B->layer[l].name, "layers.%d", l);
        die(dsc_layer_set_params(&B->layer[l], &params[l], NULL, 1));
        B->ptrs[l] = &B->layer[l];
    }
    free(params);
    int64_t act[2] = {B->tokens, B->dim};
    die(dsc_tensor_alloc(&B->dy, DSC_DTYPE_F32, 2, act, DSC_CPU, DSC_MEM_ACTIVATIONS));
    die(dsc_tensor_alloc(&B->x, DSC_DTYPE_F32, 2, act, DSC_CPU, DSC_MEM_ACTIVATIONS));
    int rank = dsc_comm_rank(B->world);
    for (int64_t i = 0; i < dsc_tensor_numel(&B->x); i++) {
        ((float *)B->x.data)[i] = (float)((i * 7 + rank) % 13) * 0.01f;
        ((float *)B->dy.data)[i] = (float)((i * 5 + 3 * rank) % 11) * 0.01f;
    }
}

static dsc_optimizer *make_optimizer(bench *B, int mode) {
    dsc_optimizer_options o = {
        .params = B->store,
        .layers = B->ptrs,
        .n_layers = B->layers,
        .dp = mode <= MODE_SYNCED ? NULL : B->world,
        .hparams = {.type = DSC_OPTIMIZER_TYPE_SGD},
        .reduce_bucket_size = (int64_t)B->dim * B->dim,
        .overlap_comm = mode == MODE_OVERLAP,
    };
    dsc_zero_options zo = {.stage = B->stage, .pipeline_stages = 1};
    dsc_optimizer *opt;
    die(dsc_zero_create(&o, &zo, &opt));
    return opt;
}

static double in_hook; /* seconds inside the kernel progress hook */

static void progress_hook(void *arg) {
    double t0 = MPI_Wtime();
    die(dsc_optimizer_progress(arg));
    in_hook += MPI_Wtime() - t0;
}

/* One layer's weight gradient as B->kernels GEMMs over slices of the token rows. */
static void layer_backward(bench *B, dsc_param *w) {
    for (int c = 0; c < B->kernels; c++) {
        int64_t r0 = (int64_t)B->tokens * c / B->kernels, r1 = (int64_t)B->tokens * (c + 1) / B->kernels;
        int64_t shape[2] = {r1 - r0, B->dim};
        dsc_tensor dy = dsc_tensor_view((float *)B->dy.data + r0 * B->dim, DSC_DTYPE_F32, 2, shape, DSC_CPU);
        dsc_tensor x = dsc_tensor_view((float *)B->x.data + r0 * B->dim, DSC_DTYPE_F32, 2, shape, DSC_CPU);
        die(dsc_kernel_gemm(&w->grad, &dy, &x, NULL, true, false, 1.0f, 1.0f));
    }
}

/* Seconds per step (backward + reduce_grads) on the slowest rank. */
static double time_mode(bench *B, int mode) {
    dsc_optimizer *opt = make_optimizer(B, mode);
    if (B->hook) dsc_kernels_set_progress(progress_hook, opt);
    double total = 0;
    for (int s = 0; s <= B->steps; s++) { /* step 0 warms up buffers and connections */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        double poke = 0;
        in_hook = 0;
        for (int l = B->layers - 1; l >= 0; l--) {
            layer_backward(B, B->layer[l].params[0]);
            double p0 = MPI_Wtime();
            die(dsc_optimizer_grads_ready(opt, &B->layer[l]));
            poke += MPI_Wtime() - p0;
        }
        double w0 = MPI_Wtime();
        die(dsc_optimizer_reduce_grads(opt));
        if (mode == MODE_SYNCED) MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0;
        if (s > 0) {
            B->in_ready[mode] += poke / B->steps;
            B->in_hook[mode] += in_hook / B->steps;
            B->in_wait[mode] += (MPI_Wtime() - w0) / B->steps;
        }
        dsc_optim_stats st;
        die(dsc_optimizer_step(opt, 1e-6, &st));
        if (s > 0) total += t;
    }
    dsc_kernels_set_progress(NULL, NULL);
    dsc_optimizer_destroy(opt);
    double mine = total / B->steps, worst;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    bench B = {
        .layers = 8, .dim = 1024, .tokens = 256, .kernels = 4, .steps = 4, .rounds = 3, .stage = 0, .hook = 1};
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--layers") == 0)
            B.layers = v;
        else if (strcmp(argv[i], "--dim") == 0)
            B.dim = v;
        else if (strcmp(argv[i], "--tokens") == 0)
            B.tokens = v;
        else if (strcmp(argv[i], "--hook") == 0)
            B.hook = v;
        else if (strcmp(argv[i], "--kernels") == 0)
            B.kernels = v;
        else if (strcmp(argv[i], "--steps") == 0)
            B.steps = v;
        else if (strcmp(argv[i], "--rounds") == 0)
            B.rounds = v;
        else if (strcmp(argv[i], "--stage") == 0)
            B.stage = v;
    }
    if (B.layers < 1 || B.dim < 1 || B.tokens < 1 || B.kernels < 1 || B.kernels > B.tokens || B.steps < 1 ||
        B.rounds < 1 || B.rounds > 64 || B.stage < 0 || B.stage > 1) {
        fprintf(stderr, "bench_overlap: sizes must be positive, --kernels at most --tokens, --rounds at most 64, "
                        "--stage 0 or 1\n");
        return 2;
    }
    die(dsc_comm_world(NULL, &B.world));
    dsc_kernels_set_num_threads(1);
    setup(&B);
    int rank = dsc_comm_rank(B.world);
    double times[MODE_COUNT][64];
    for (int r = 0; r < B.rounds; r++)
        for (int m = 0; m < MODE_COUNT; m++)
            times[m][r] = time_mode(&B, m);
    double med[MODE_COUNT];
    for (int m = 0; m < MODE_COUNT; m++)
        med[m] = median(times[m], B.rounds);
    if (rank == 0) {
        double mb = 4.0 * B.dim * (double)B.dim / 1e6;
        printf(
            "bench_overlap: %d ranks, %s, %d layers x %.1f MB buckets, GEMM %d x %d x %d per layer in %d kernels, "
            "%d steps x %d rounds (median), kernel progress hook %s\n",
            dsc_comm_size(B.world), B.stage ? "ZeRO-1 reduce-scatter" : "plain all-reduce", B.layers, mb, B.dim,
            B.dim, B.tokens, B.kernels, B.steps, B.rounds, B.hook ? "on" : "off");
        for (int m = 0; m < MODE_COUNT; m++)
            printf(
                "  %-9s step %8.2f ms  (rank 0, mean: %6.2f ms in the kernel hook, %6.2f in grads_ready, %6.2f in "
                "reduce_grads)\n",
                mode_names[m], 1e3 * med[m], 1e3 * B.in_hook[m] / B.rounds, 1e3 * B.in_ready[m] / B.rounds,
                1e3 * B.in_wait[m] / B.rounds);
        for (int ref = MODE_COMPUTE; ref <= MODE_SYNCED; ref++) {
            double blocking = med[MODE_BLOCKING] - med[ref], overlap = med[MODE_OVERLAP] - med[ref];
            printf("exposed reduction per step over %s: overlap %.2f ms (measured), blocking %.2f ms (reference), "
                   "ratio %.2f (target <= 0.30)\n",
                   mode_names[ref], 1e3 * overlap, 1e3 * blocking, blocking > 0 ? overlap / blocking : 0.0);
        }
    }
    dsc_tensor_free(&B.dy);
    dsc_tensor_free(&B.x);
    for (int l = 0; l < B.layers; l++) {
        free(B.layer[l].params);
        free(B.layer[l].param_uses);
    }
    free(B.layer);
    free(B.ptrs);
    dsc_params_destroy(B.store);
    dsc_comm_free(B.world);
    die(dsc_comm_finalize());
    return 0;
}
