/* bench_pipe — pipeline-parallel training throughput on 2 ranks (P = 2, 1F1B)
 * against one rank running the whole model with gradient accumulation, for
 * M in {2, 4, 8, 16} micro-batches, and the bubble each rank measured (idle
 * time inside train_batch from the runner's instrumentation: the pipeline
 * fill and drain plus p2p waits) beside 1F1B's bound (P-1)/(M+P-1).
 *
 * Run: mpirun -np 2 build/bench/bench_pipe [--steps N] [--layers L] [--width C]
 * One thread per rank (DSC_NUM_THREADS=1), so the pipeline uses two cores
 * where the baseline uses one; the ideal speed-up is P (1 - bound) = 2M/(M+1).
 * A step is train_batch + reduce_grads + optimizer step (AdamW); the figure
 * is the best of 3 trials of N steps (the machine is shared). Prints, never
 * asserts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/pipe.h"

typedef struct bench_cfg {
    int steps, layers, width;
    int64_t B, T;
} bench_cfg;

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_pipe: %s\n", dsc_status_message(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static double now_s(void) {
    return MPI_Wtime();
}

/* Deterministic tokens, identical on both ends of the pipeline. */
typedef struct synth_source {
    dsc_batch_source base;
    int vocab;
    int step;
} synth_source;

static dsc_status synth_next(dsc_batch_source *base, dsc_tensor *tokens, dsc_tensor *targets) {
    synth_source *s = (synth_source *)base;
    int32_t *tok = tokens->data, *tgt = targets->data;
    for (int64_t i = 0; i < dsc_tensor_numel(tokens); i++) {
        tok[i] = (int32_t)((i * 7 + base->consumed * 13 + s->step * 31) % s->vocab);
        tgt[i] = (int32_t)((i * 11 + base->consumed * 5 + s->step) % s->vocab);
    }
    base->consumed++;
    return NULL;
}

static void model_config(const bench_cfg *b, dsc_model_config *mc) {
    dsc_model_config_defaults(mc, DSC_ARCH_GPT);
    mc->n_layer = b->layers;
    mc->d_model = b->width;
    mc->n_head = 4;
    mc->n_kv_head = 4;
    mc->d_ff = 4 * b->width;
    mc->vocab_size = 256;
    mc->seq_len = (int)b->T;
}

static void adamw(dsc_optimizer_options *oo) {
    oo->hparams =
        (dsc_optim_hparams){.type = DSC_OPTIMIZER_TYPE_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
}

/* Best seconds per step over 3 trials of `steps` steps. */
static double time_steps(dsc_batch_runner *r, dsc_optimizer *opt, int M, const bench_cfg *b, dsc_comm *sync) {
    double best = 1e30;
    for (int trial = 0; trial < 3; trial++) {
        if (sync) die(dsc_comm_barrier(sync));
        double t0 = now_s();
        for (int s = 0; s < b->steps; s++) {
            synth_source src = {{synth_next, M, 0}, 256, s};
            dsc_batch_result res;
            die(r->ops->train_batch(r, &src.base, &res));
            die(dsc_optimizer_reduce_grads(opt));
            dsc_optim_stats st;
            die(dsc_optimizer_step(opt, 1e-4, &st));
        }
        double dt = (now_s() - t0) / b->steps;
        best = dt < best ? dt : best;
    }
    return best;
}

/* The whole model on this rank, default runner. */
static double single_rank(const bench_cfg *b, int M) {
    dsc_model_config mc;
    model_config(b, &mc);
    dsc_param_store *store;
    die(dsc_params_create(&store, DSC_CPU, 1));
    dsc_layer_spec *specs;
    int n;
    die(dsc_model_specs(&mc, &specs, &n));
    dsc_layer **layers = calloc((size_t)n, sizeof *layers);
    dsc_build_ctx ctx = {.model = &mc, .params = store, .device = DSC_CPU};
    for (int i = 0; i < n; i++)
        die(dsc_layer_build(&specs[i], &ctx, &layers[i]));
    die(dsc_params_finalize(store));
    dsc_optimizer_options oo = {.params = store, .layers = layers, .n_layers = n};
    adamw(&oo);
    dsc_optimizer *opt;
    die(dsc_optimizer_create_plain(&oo, &opt));
    dsc_batch_runner *r;
    die(dsc_runner_create_default(layers, n, opt, b->B, b->T, NULL, &r));
    time_steps(r, opt, M, b, NULL); /* warm-up */
    double t = time_steps(r, opt, M, b, NULL);
    dsc_batch_runner_destroy(r);
    dsc_optimizer_destroy(opt);
    for (int i = 0; i < n; i++)
        dsc_layer_destroy(layers[i]);
    free(layers);
    free(specs);
    dsc_params_destroy(store);
    return t;
}

/* P = 2 stages over `pipe`; *bubble receives this rank's idle fraction. */
static double pipeline(const bench_cfg *b, int M, dsc_comm *pipe, double *bubble) {
    dsc_model_config mc;
    model_config(b, &mc);
    dsc_pipe_layer_spec *layers;
    int n;
    die(dsc_pipe_model_layers(&mc, &layers, &n));
    dsc_pipe_module_options mo = {.layers = layers,
                                  .n_layers = n,
                                  .stages = 2,
                                  .chunks = 1,
                                  .partition_method = "parameters",
                                  .model = &mc,
                                  .width = 0,
                                  .expert_parallel = 1};
    dsc_pipe_module *m;
    die(dsc_pipe_module_create(&mo, &m));
    if (M == 2 && dsc_comm_rank(pipe) == 0) dsc_pipe_module_print_summary(m, b->B, b->T, stdout);
    dsc_param_store *store;
    die(dsc_params_create(&store, DSC_CPU, 1));
    dsc_pipe_stage *stage;
    die(dsc_pipe_stage_build(m, dsc_comm_rank(pipe), store, DSC_CPU, &stage));
    die(dsc_params_finalize(store));
    dsc_pipe_tied *tied;
    die(dsc_pipe_tied_create(m, stage, pipe, store, &tied));
    int n_local;
    dsc_layer *const *local = dsc_pipe_stage_layers(stage, &n_local);
    dsc_optimizer_options oo = {.params = store,
                                .layers = local,
                                .n_layers = n_local,
                                .pipe = pipe,
                                .counts_in_norm = dsc_pipe_tied_counts_in_norm,
                                .counts_in_norm_ctx = tied};
    adamw(&oo);
    dsc_optimizer *opt;
    die(dsc_optimizer_create_plain(&oo, &opt));
    dsc_pipe_runner_options ro = {.module = m,
                                  .stage = stage,
                                  .pipe = pipe,
                                  .tied = tied,
                                  .optimizer = opt,
                                  .schedule = DSC_SCHEDULE_TRAIN_1F1B,
                                  .micro_batches = M,
                                  .B = b->B,
                                  .T = b->T};
    dsc_batch_runner *r;
    die(dsc_pipe_runner_create(&ro, &r));
    time_steps(r, opt, M, b, pipe); /* warm-up */
    dsc_pipe_runner_reset_stats(r);
    double t = time_steps(r, opt, M, b, pipe);
    dsc_pipe_runner_stats st;
    dsc_pipe_runner_get_stats(r, &st);
    *bubble = st.wall_s > 0 ? st.idle_s / st.wall_s : 0;
    dsc_batch_runner_destroy(r);
    dsc_optimizer_destroy(opt);
    dsc_pipe_tied_destroy(tied);
    dsc_pipe_stage_destroy(stage);
    dsc_params_destroy(store);
    dsc_pipe_module_destroy(m);
    free(layers);
    return t;
}

int main(int argc, char **argv) {
    bench_cfg b = {.steps = 3, .layers = 8, .width = 128, .B = 4, .T = 64};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--steps") == 0)
            b.steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--layers") == 0)
            b.layers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--width") == 0)
            b.width = atoi(argv[i + 1]);
    }
    dsc_comm *world;
    die(dsc_comm_world(NULL, &world));
    int rank = dsc_comm_rank(world);
    if (dsc_comm_size(world) != 2) {
        if (rank == 0) fprintf(stderr, "bench_pipe: run on 2 ranks (mpirun -np 2)\n");
        dsc_comm_free(world);
        dsc_status_free(dsc_comm_finalize());
        return 2;
    }
    die(dsc_nn_register_dense_layers());
    if (rank == 0)
        printf("bench_pipe: GPT %d blocks, C=%d, T=%lld, B=%lld, V=256; %d thread(s) per rank; best of 3 x %d "
               "steps\n",
               b.layers, b.width, (long long)b.T, (long long)b.B, dsc_kernels_get_num_threads(), b.steps);
    const int Ms[] = {2, 4, 8, 16};
    double single[4], piped[4], bubble[4][2];
    for (int i = 0; i < 4; i++) {
        if (rank == 0) single[i] = single_rank(&b, Ms[i]);
        die(dsc_comm_barrier(world));
        double mine;
        piped[i] = pipeline(&b, Ms[i], world, &mine);
        MPI_Gather(&mine, 1, MPI_DOUBLE, bubble[i], 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    if (rank == 0) {
        printf("\n   M  1 rank tok/s  P=2 tok/s  speed-up  ideal 2M/(M+1)  bubble rank0  rank1  bound "
               "(P-1)/(M+P-1)\n");
        for (int i = 0; i < 4; i++) {
            double tokens = (double)Ms[i] * (double)(b.B * b.T);
            printf("  %2d  %12.0f  %9.0f  %8.2f  %14.2f  %12.3f  %5.3f  %19.3f\n", Ms[i], tokens / single[i],
                   tokens / piped[i], single[i] / piped[i], 2.0 * Ms[i] / (Ms[i] + 1), bubble[i][0], bubble[i][1],
                   1.0 / (Ms[i] + 1));
        }
    }
    dsc_comm_free(world);
    dsc_status_free(dsc_comm_finalize());
    return 0;
}
