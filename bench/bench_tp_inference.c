/* bench_tp_inference — tensor-parallel inference on the CPU: prefill and
 * decode tokens/s of a Llama-shaped model (hidden 768, 2 layers, 12 heads,
 * 4 KV heads, MLP 2048, vocab 8192, random f32 weights) with the world as
 * one tensor-parallel group, and the share of the step time spent in the
 * all-reduces. Run it once per layout and compare (bench/bench_tp_inference.sh
 * does TP 1 with 2 threads against TP 2 with 1 thread per rank and prints
 * the ratio):
 *   DSC_NUM_THREADS=2 build/bench/bench_tp_inference
 *   DSC_NUM_THREADS=1 mpirun -np 2 build/bench/bench_tp_inference
 * Prefill: 4 sequences x 128 tokens in one forward; decode: 4 sequences, 32
 * steps after that prefill; best of 3. Rank 0 writes the model into DIR
 * (default /tmp/dsc_bench_tp_model) when it is not there. Prints, never asserts. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_model.h"
#include "dsc/comm.h"
#include "dsc/inference.h"
#include "dsc/kernels.h"

enum { C = 768, L = 2, NH = 12, NKV = 4, HS = 64, F = 2048, V = 8192, SEQS = 4, PROMPT = 128, STEPS = 32 };

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_tp_inference: %s\n", dsc_status_message(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

typedef struct phase {
    double seconds, comm;
} phase;

/* One prefill of SEQS x PROMPT tokens and STEPS decode steps on fresh sequences. */
static void run_once(dsc_infer_engine *e, dsc_infer_model *m, float *logits, uint64_t base, phase *prefill,
                     phase *decode) {
    static int32_t prompt[SEQS][PROMPT];
    const int32_t *toks[SEQS];
    int32_t counts[SEQS], next[SEQS];
    uint64_t uids[SEQS];
    for (int i = 0; i < SEQS; i++) {
        for (int j = 0; j < PROMPT; j++)
            prompt[i][j] = (i * 131 + j * 17) % V;
        toks[i] = prompt[i];
        counts[i] = PROMPT;
        uids[i] = base + (uint64_t)i;
    }
    double c0 = dsc_infer_model_comm_seconds(m), t0 = bench_now();
    die(dsc_infer_engine_put(e, SEQS, uids, toks, counts, logits));
    double t1 = bench_now(), c1 = dsc_infer_model_comm_seconds(m);
    int32_t W = dsc_infer_engine_logits_width(e);
    dsc_sampling_params g = dsc_sampling_params_greedy();
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < SEQS; i++) {
            die(dsc_infer_engine_sample(e, logits + (size_t)i * (size_t)W, &g, NULL, 0, NULL, &next[i]));
            toks[i] = &next[i];
            counts[i] = 1;
        }
        die(dsc_infer_engine_put(e, SEQS, uids, toks, counts, logits));
    }
    double t2 = bench_now(), c2 = dsc_infer_model_comm_seconds(m);
    for (int i = 0; i < SEQS; i++)
        die(dsc_infer_engine_flush(e, uids[i]));
    *prefill = (phase){t1 - t0, c1 - c0};
    *decode = (phase){t2 - t1, c2 - c1};
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *dir = argc > 1 ? argv[1] : "/tmp/dsc_bench_tp_model";
    dsc_comm *world;
    die(dsc_comm_world(NULL, &world));
    int rank = dsc_comm_rank(world), tp = dsc_comm_size(world);
    die(bench_llama_prepare(world, dir, &(bench_llama){C, L, NH, NKV, HS, F, V}));
    dsc_infer_model *m;
    dsc_infer_tp opts = {.comm = world};
    die(dsc_infer_model_load_tp(dir, tp > 1 ? &opts : NULL, &m));
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.max_sequences = ec.max_batch_sequences = SEQS;
    ec.max_tokens_per_forward = SEQS * PROMPT;
    ec.kv_cache_bytes = 64ll << 20;
    dsc_infer_engine *e;
    die(dsc_infer_engine_create(m, &ec, &e));
    float *logits = malloc((size_t)SEQS * (size_t)dsc_infer_engine_logits_width(e) * sizeof *logits);
    phase best_p = {1e30, 0}, best_d = {1e30, 0};
    for (int rep = 0; rep < 3; rep++) {
        phase p, d;
        run_once(e, m, logits, 100 * (uint64_t)(rep + 1), &p, &d);
        if (p.seconds < best_p.seconds) best_p = p;
        if (d.seconds < best_d.seconds) best_d = d;
    }
    if (rank == 0)
        printf("tp %d x %d threads: prefill %.1f tokens/s (all-reduce %.1f%% of the step), decode %.1f tokens/s "
               "(all-reduce %.1f%%)\n",
               tp, dsc_kernels_get_num_threads(), SEQS * PROMPT / best_p.seconds,
               100.0 * best_p.comm / best_p.seconds, SEQS * STEPS / best_d.seconds,
               100.0 * best_d.comm / best_d.seconds);
    free(logits);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    dsc_comm_free(world);
    MPI_Finalize();
    return 0;
}
