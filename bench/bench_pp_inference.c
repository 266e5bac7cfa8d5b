/* bench_pp_inference — pipeline-parallel serving on the CPU: generation
 * tokens/s and each stage's busy fraction (seconds in its forwards over the
 * wall time) with the world as one pipeline of P stages, at several
 * concurrencies (sequences generating at once), beside two bounds:
 *  - sim: a stage can be busy at most min(c, P) / P of the time with c
 *    sequences (a sequence's next micro-batch needs its sampled token, so
 *    at most c micro-batches are in flight), times 1 - bubble of pipe/'s
 *    schedule simulator for the inference schedule of the M micro-batches
 *    that ran (fill and drain), equal stages assumed;
 *  - bal: sim times this stage's forward CPU seconds per micro-batch over
 *    the slowest stage's (the slowest stage sets the pace: with the uniform
 *    partition the last stage also computes the LM head; CPU time, so that
 *    other work on the machine does not skew the ratio).
 * And where each stage waited, as fractions of the wall time: for the
 * previous stage's activation (recv), for the last stage's sampled tokens
 * (tok), for its own sends to complete (send).
 * Model: Llama-shaped, hidden 256, 8 layers, 8 heads, 4 KV heads, MLP 768,
 * vocab 4096, random f32 weights, written by rank 0 into DIR (default
 * /tmp/dsc_bench_pp_model) when it is not there. Each sequence: a 16-token
 * prompt, NEW new tokens (default 32), greedy. Each concurrency runs REPS
 * times (default 1); each line is one run. EXTRA (default 0): micro-batches
 * in flight beyond P (the engine's micro_batches = P + EXTRA; the bounds
 * stay P's: a stage can be busy at most min(c, P) / P of the time).
 * PARTITION (default uniform): the stages' partition_method (uniform,
 * parameters or compute).
 *   DSC_NUM_THREADS=1 build/bench/bench_pp_inference [DIR [NEW [REPS [EXTRA [PARTITION]]]]]
 *   DSC_NUM_THREADS=1 mpirun -np 2 build/bench/bench_pp_inference
 *   DSC_NUM_THREADS=1 mpirun -np 4 build/bench/bench_pp_inference
 * bench/bench_pp_inference.sh runs P = 1, 2, 4 and summarises the runs.
 * Prints measured, bounds and waits; never asserts. */
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
#include "inference/pipeline.h"

enum { C = 256, L = 8, NH = 8, NKV = 4, HS = 32, F = 768, V = 4096, PROMPT = 16, MAX_C = 32 };

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_pp_inference: %s\n", dsc_status_message(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* c sequences through a fresh scheduler; *forwards the micro-batches that ran. */
static double generate(dsc_infer_engine *e, int c, int new_tokens, uint64_t base, int64_t *forwards) {
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
                               .max_new_tokens = new_tokens,
                               .sampling = dsc_sampling_params_greedy()};
        die(dsc_scheduler_submit(s, &req));
    }
    MPI_Barrier(MPI_COMM_WORLD); /* every stage starts together */
    double t0 = bench_now();
    die(dsc_scheduler_run(s));
    double t = bench_now() - t0;
    *forwards = dsc_scheduler_get_stats(s)->forwards;
    dsc_scheduler_destroy(s);
    return t;
}

enum { BUSY, RECV, TOK, SEND, PER_FWD, FIELDS };

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *dir = argc > 1 ? argv[1] : "/tmp/dsc_bench_pp_model";
    int new_tokens = argc > 2 ? atoi(argv[2]) : 32, reps = argc > 3 ? atoi(argv[3]) : 1;
    if (new_tokens < 1) new_tokens = 32;
    if (reps < 1) reps = 1;
    int extra = argc > 4 ? atoi(argv[4]) : 0;
    const char *partition = argc > 5 ? argv[5] : "uniform";
    dsc_comm *world;
    die(dsc_comm_world(NULL, &world));
    int rank = dsc_comm_rank(world), P = dsc_comm_size(world);
    die(bench_llama_prepare(world, dir, &(bench_llama){C, L, NH, NKV, HS, F, V}));
    dsc_infer_model *m;
    dsc_infer_pp pp = {.comm = P > 1 ? world : NULL, .partition_method = partition};
    die(dsc_infer_model_load_parallel(dir, NULL, &pp, &m));
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.max_sequences = ec.max_batch_sequences = MAX_C;
    ec.max_tokens_per_forward = MAX_C * PROMPT;
    ec.kv_cache_bytes = 64ll << 20;
    ec.micro_batches = extra > 0 && P > 1 ? P + extra : 0;
    dsc_infer_engine *e;
    die(dsc_infer_engine_create(m, &ec, &e));
    if (rank == 0)
        printf("pp %d x %d threads, %d new tokens, %d micro-batches in flight, %s partition; per stage: busy "
               "fraction, bounds sim and bal, waits recv / tok / send (fractions of the wall time)\n",
               P, dsc_kernels_get_num_threads(), new_tokens, ec.micro_batches ? ec.micro_batches : P, partition);
    int64_t warm;
    generate(e, 1, 4, 1, &warm);
    double *all = malloc((size_t)P * FIELDS * sizeof *all);
    for (int c = 1; c <= MAX_C; c *= 2)
        for (int rep = 0; rep < reps; rep++) {
            infer_pipeline_profile a, b;
            int64_t M;
            dsc_infer_engine_pipeline_profile(e, &a);
            double wall = generate(e, c, new_tokens, 1000 * (uint64_t)(c * reps + rep), &M);
            dsc_infer_engine_pipeline_profile(e, &b);
            int64_t fw = b.forwards - a.forwards;
            double mine[FIELDS] = {(b.busy - a.busy) / wall, (b.recv_wait - a.recv_wait) / wall,
                                   (b.token_wait - a.token_wait) / wall, (b.send_wait - a.send_wait) / wall,
                                   fw > 0 ? (b.busy_cpu - a.busy_cpu) / (double)fw : 0};
            MPI_Gather(mine, FIELDS, MPI_DOUBLE, all, FIELDS, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            if (rank != 0) continue;
            dsc_pipe_sim_costs costs = {.forward = 1};
            dsc_pipe_sim_bounds sim;
            die(dsc_pipe_sim_closed_form(DSC_SCHEDULE_INFERENCE, (int)M, P, 1, &costs, &sim));
            double bound = (1 - sim.bubble) * (c < P ? c : P) / P, slowest = 0;
            for (int k = 0; k < P; k++)
                if (all[k * FIELDS + PER_FWD] > slowest) slowest = all[k * FIELDS + PER_FWD];
            printf("P %d c %2d: %7.1f tokens/s, %4lld micro-batches;", P, c, (double)c * new_tokens / wall,
                   (long long)M);
            for (int k = 0; k < P; k++) {
                const double *f = all + k * FIELDS;
                printf(" | stage %d busy %.2f sim %.2f bal %.2f waits %.2f %.2f %.2f cpu/fwd %.2f ms", k, f[BUSY],
                       bound, slowest > 0 ? bound * f[PER_FWD] / slowest : 0, f[RECV], f[TOK], f[SEND],
                       1e3 * f[PER_FWD]);
            }
            printf("\n");
            fflush(stdout);
        }
    free(all);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    dsc_comm_free(world);
    MPI_Finalize();
    return 0;
}
