/* bench_pp_inference — pipeline-parallel serving on the CPU: generation
 * tokens/s and each stage's busy fraction (seconds in its forwards over the
 * wall time) with the world as one pipeline of P stages, at several
 * concurrencies (sequences generating at once), beside the bound: a stage
 * can be busy at most min(c, P) / P of the time with c sequences (a
 * sequence's next micro-batch needs its sampled token, so at most c
 * micro-batches are in flight), times 1 - bubble of pipe/'s schedule
 * simulator for the inference schedule of the M micro-batches that ran
 * (fill and drain). Model: Llama-shaped, hidden 256, 8 layers, 8 heads, 4
 * KV heads, MLP 768, vocab 4096, random f32 weights, written by rank 0
 * into DIR (default /tmp/dsc_bench_pp_model) when it is not there. Each
 * sequence: a 16-token prompt, 32 new tokens, greedy.
 *   DSC_NUM_THREADS=1 build/bench/bench_pp_inference
 *   DSC_NUM_THREADS=1 mpirun -np 2 build/bench/bench_pp_inference
 *   DSC_NUM_THREADS=1 mpirun -np 4 build/bench/bench_pp_inference
 * Prints measured, bound and their ratio; never asserts. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_model.h"
#include "dsc/comm.h"
#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/pipe_sim.h"

enum { C = 256, L = 8, NH = 8, NKV = 4, HS = 32, F = 768, V = 4096, PROMPT = 16, NEW = 32, MAX_C = 16 };

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_pp_inference: %s\n", dsc_status_message(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* c sequences through a fresh scheduler; *forwards the micro-batches that ran. */
static double generate(dsc_infer_engine *e, int c, uint64_t base, int64_t *forwards) {
    dsc_scheduler_config sc = dsc_scheduler_config_default(e);
    dsc_scheduler *s;
    die(dsc_scheduler_create(e, &sc, NULL, NULL, &s));
    int32_t prompt[PROMPT];
    for (int r = 0; r < c; r++) {
        for (int j = 0; j < PROMPT; j++)
            prompt[j] = (r * 131 + j * 17) % V;
        dsc_gen_request req = {.uid = base + (uint64_t)r,
                               .prompt = prompt,
                               .n_prompt = PROMPT,
                               .max_new_tokens = NEW,
                               .sampling = dsc_sampling_params_greedy()};
        die(dsc_scheduler_submit(s, &req));
    }
    double t0 = bench_now();
    die(dsc_scheduler_run(s));
    double t = bench_now() - t0;
    *forwards = dsc_scheduler_get_stats(s)->forwards;
    dsc_scheduler_destroy(s);
    return t;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *dir = argc > 1 ? argv[1] : "/tmp/dsc_bench_pp_model";
    dsc_comm *world;
    die(dsc_comm_world(NULL, &world));
    int rank = dsc_comm_rank(world), P = dsc_comm_size(world);
    die(bench_llama_prepare(world, dir, &(bench_llama){C, L, NH, NKV, HS, F, V}));
    dsc_infer_model *m;
    dsc_infer_pp pp = {.comm = P > 1 ? world : NULL};
    die(dsc_infer_model_load_parallel(dir, NULL, &pp, &m));
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.max_sequences = ec.max_batch_sequences = MAX_C;
    ec.max_tokens_per_forward = MAX_C * PROMPT;
    ec.kv_cache_bytes = 64ll << 20;
    dsc_infer_engine *e;
    die(dsc_infer_engine_create(m, &ec, &e));
    if (rank == 0)
        printf("pp %d x %d threads; per concurrency: tokens/s, then per stage busy fraction measured / bound "
               "(ratio)\n",
               P, dsc_kernels_get_num_threads());
    int64_t warm;
    generate(e, 1, 1, &warm);
    double *busy = malloc((size_t)P * sizeof *busy);
    for (int c = 1; c <= MAX_C; c *= 2) {
        double b0, t0, b1, t1;
        int64_t M;
        dsc_infer_engine_busy(e, &b0, &t0);
        double wall = generate(e, c, 1000 * (uint64_t)c, &M);
        dsc_infer_engine_busy(e, &b1, &t1);
        double mine = (b1 - b0) / wall;
        MPI_Gather(&mine, 1, MPI_DOUBLE, busy, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (rank != 0) continue;
        dsc_pipe_sim_costs costs = {.forward = 1};
        dsc_pipe_sim_bounds sim;
        die(dsc_pipe_sim_closed_form(DSC_SCHEDULE_INFERENCE, (int)M, P, 1, &costs, &sim));
        double bound = (1 - sim.bubble) * (c < P ? c : P) / P;
        printf("c %2d: %7.1f tokens/s, %4lld micro-batches;", c, (double)c * NEW / wall, (long long)M);
        for (int k = 0; k < P; k++)
            printf(" stage %d %.2f / %.2f (%.2f)", k, busy[k], bound, busy[k] / bound);
        printf("\n");
    }
    free(busy);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    dsc_comm_free(world);
    MPI_Finalize();
    return 0;
}
