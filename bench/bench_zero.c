/* bench_zero — step time, memory and communication of ZeRO stages 0-3 side by
 * side, on a GPT-small-shaped model (12 layers, C 768, 12 heads; vocabulary
 * and sequence shortened so a CPU step takes seconds) trained through the
 * config-built trainer on the data-parallel ranks of the job.
 *
 * Run on 2 ranks from the repository root (the text is tokenized per run):
 *   mpirun -np 2 build/bench/bench_zero [--layers L] [--d-model C] [--vocab V]
 *                [--seq T] [--steps N] [--bucket ELEMS] [--text data/tinyshakespeare.txt]
 * --bucket sets reduce_bucket_size and allgather_bucket_size (DeepSpeed's 5e8 by default).
 * Per stage: median step time (after one warm-up step), this rank's allocator
 * accounting of parameters, gradients and optimizer state beside the ZeRO
 * formula (ratio measured / formula), the communication buffers, the peak of
 * all categories during the steps, and the bytes this rank sent per step by
 * operation. Prints, never asserts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/comm.h"
#include "dsc/data.h"
#include "dsc/engine.h"
#include "dsc/zero.h"

typedef struct bench_args {
    int layers, d_model, vocab, seq, steps;
    int64_t bucket; /* reduce_bucket_size and allgather_bucket_size (elements) */
    const char *text;
} bench_args;

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_zero: %s\n", dsc_status_message(s));
    exit(1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct stage_result {
    double step_ms;
    double params, grads, optim, comm_buf, activations, peak; /* bytes */
    double formula;                                           /* bytes of model states by the formula */
    double sent[DSC_COMM_OP_COUNT];                           /* bytes per step */
} stage_result;

static void run_stage(dsc_comm *dp, const bench_args *a, const char *data, int stage, stage_result *r) {
    char json[1024];
    snprintf(
        json, sizeof json,
        "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 1000,"
        " \"gradient_clipping\": 1.0, \"seed\": 5,"
        " \"model\": {\"arch\": \"gpt\", \"n_layer\": %d, \"d_model\": %d, \"n_head\": 12, \"vocab_size\": %d,"
        " \"seq_len\": %d},"
        " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.0003, \"weight_decay\": 0.1}},"
        " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %lld,"
        " \"allgather_bucket_size\": %lld, \"stage3_max_live_parameters\": 20000000,"
        " \"stage3_prefetch_bucket_size\": 10000000},"
        " \"data\": {\"path\": \"%s\", \"val_fraction\": 0.05}, \"train\": {\"steps\": %d}}",
        a->layers, a->d_model, a->vocab, a->seq, stage, (long long)a->bucket, (long long)a->bucket, data,
        a->steps + 1);
    dsc_config cfg;
    die(dsc_config_parse_string(json, "bench_zero", NULL, 0, &cfg));
    die(dsc_config_resolve_batch(&cfg, dsc_comm_size(dp)));
    dsc_mem_stats base, now;
    dsc_mem_get_stats(&base);
    dsc_trainer_options o = {&cfg, dp, false, NULL, false};
    dsc_trainer *t;
    die(dsc_trainer_create_with_optimizer(&o, dsc_zero_make_optimizer, &t));
    dsc_step_metrics m;
    die(dsc_engine_step(dsc_trainer_engine(t), &m)); /* warm-up: first-touch of activations */
    dsc_mem_reset_peaks();
    dsc_comm_reset_stats(dp);
    double *ms = calloc((size_t)a->steps, sizeof *ms);
    for (int s = 0; s < a->steps; s++) {
        die(dsc_comm_barrier(dp));
        double t0 = MPI_Wtime();
        die(dsc_engine_step(dsc_trainer_engine(t), &m));
        ms[s] = 1e3 * (MPI_Wtime() - t0);
    }
    qsort(ms, (size_t)a->steps, sizeof *ms, cmp_double);
    r->step_ms = ms[a->steps / 2];
    free(ms);
    dsc_mem_get_stats(&now);
    r->params = (double)(now.current[DSC_MEM_PARAMS] - base.current[DSC_MEM_PARAMS]);
    r->grads = (double)(now.current[DSC_MEM_GRADS] - base.current[DSC_MEM_GRADS]);
    r->optim = (double)(now.current[DSC_MEM_OPTIM] - base.current[DSC_MEM_OPTIM]);
    r->comm_buf = (double)(now.current[DSC_MEM_COMM] - base.current[DSC_MEM_COMM]);
    r->activations = (double)(now.current[DSC_MEM_ACTIVATIONS] - base.current[DSC_MEM_ACTIVATIONS]);
    r->peak = (double)now.total_peak;
    dsc_zero_memory f;
    dsc_zero_memory_formula(stage, (double)dsc_trainer_param_count(t), dsc_comm_size(dp), 8, &f);
    r->formula = f.params + f.grads + f.optim;
    dsc_comm_stats st;
    dsc_comm_get_stats(dp, &st);
    for (int op = 0; op < DSC_COMM_OP_COUNT; op++)
        r->sent[op] = (double)st.bytes_sent[op] / a->steps;
    if (stage == 0 && dsc_comm_rank(dp) == 0)
        printf("bench_zero: GPT %d layers, C %d, V %d, T %d: %.1fM parameters, %d data-parallel ranks, %d timed "
               "steps\n",
               a->layers, a->d_model, a->vocab, a->seq, dsc_trainer_param_count(t) / 1e6, dsc_comm_size(dp),
               a->steps);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
}

static void parse(int argc, char **argv, bench_args *a) {
    *a = (bench_args){12, 768, 8192, 64, 3, 500000000, "data/tinyshakespeare.txt"};
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--text") == 0)
            a->text = argv[i + 1];
        else if (strcmp(argv[i], "--layers") == 0)
            a->layers = v;
        else if (strcmp(argv[i], "--d-model") == 0)
            a->d_model = v;
        else if (strcmp(argv[i], "--vocab") == 0)
            a->vocab = v;
        else if (strcmp(argv[i], "--seq") == 0)
            a->seq = v;
        else if (strcmp(argv[i], "--steps") == 0)
            a->steps = v;
        else if (strcmp(argv[i], "--bucket") == 0)
            a->bucket = atoll(argv[i + 1]);
        else
            die(dsc_error(DSC_ERR_INVALID, "unknown option %s", argv[i]));
    }
    if (a->steps < 1) die(dsc_error(DSC_ERR_INVALID, "--steps must be >= 1"));
}

int main(int argc, char **argv) {
    bench_args a;
    parse(argc, argv, &a);
    dsc_comm *dp;
    die(dsc_comm_world(NULL, &dp));
    char data[128];
    snprintf(data, sizeof data, "/tmp/bench_zero_%d.tok", (int)getpid());
    int64_t count;
    die(dsc_data_prepare(a.text, data, &count));
    stage_result r[4];
    for (int stage = 0; stage <= 3; stage++)
        run_stage(dp, &a, data, stage, &r[stage]);
    unlink(data);
    if (dsc_comm_rank(dp) == 0) {
        const double MiB = 1024.0 * 1024.0;
        printf("%-6s %9s %9s %9s %9s %10s %11s %8s %9s %9s %9s %10s %10s\n", "stage", "step ms", "params", "grads",
               "optim", "states", "formula", "ratio", "comm buf", "activ", "peak", "RS MiB/st", "AG MiB/st");
        for (int s = 0; s <= 3; s++) {
            double states = r[s].params + r[s].grads + r[s].optim;
            printf("%-6d %9.1f %9.2f %9.2f %9.2f %10.2f %11.2f %8.4f %9.2f %9.2f %9.2f %10.2f %10.2f\n", s,
                   r[s].step_ms, r[s].params / MiB, r[s].grads / MiB, r[s].optim / MiB, states / MiB,
                   r[s].formula / MiB, states / r[s].formula, r[s].comm_buf / MiB, r[s].activations / MiB,
                   r[s].peak / MiB, r[s].sent[DSC_COMM_OP_REDUCE_SCATTER] / MiB,
                   r[s].sent[DSC_COMM_OP_ALLGATHER] / MiB);
        }
        printf("(memory in MiB on rank 0; states = params + grads + optim; stage 0 all-reduces: %.2f MiB/step "
               "sent)\n",
               r[0].sent[DSC_COMM_OP_ALLREDUCE] / MiB);
    }
    dsc_comm_free(dp);
    dsc_status_free(dsc_comm_finalize());
    return 0;
}
