/* bench_train: training throughput of the data-parallel trainer on one rank,
 * for a tiny GPT (configs/main.json's shape) and a GPT-2-small-shaped model
 * (12 layers, C 768, 12 heads, T 256, V 50257), beside PyTorch running the
 * same model, batch and optimizer on the same number of threads
 * (bench/torch_train_ref.py, run with --python, /opt/venv/bin/python unless told).
 *
 *   bench_train [--threads N] [--steps-tiny N] [--steps-gpt2 N] [--only tiny|gpt2] [--pairs N]
 *               [--torch PATH/torch_train_ref.py | --no-torch] [--python PATH] [--bf16 | --fp16]
 *               [--torch-flush-denormal]
 *
 * With --pairs N each model runs N times, dsc then PyTorch, interleaved, each
 * pair printed with the 1-minute load average before it; the summary line
 * gives the median and minimum of each side and the ratio of the medians.
 * --bf16 trains in bf16 mixed precision ("bf16": {"enabled": true}), PyTorch
 * under torch.autocast("cpu", bfloat16); --fp16 in fp16 ("fp16": {"enabled": true}, DeepSpeed's
 * dynamic loss scale), PyTorch under torch.autocast("cpu", float16) with GradScaler. --torch-flush-denormal runs
 * PyTorch with torch.set_flush_denormal(True): at its defaults it computes on subnormal floats, which Intel's
 * cores take microcode assists for (an Emerald Rapids: 61 tok/s for GPT-2 small against 163-172
 * flushed; dsc, which does not flush, is not slowed there).
 *
 * Achieved GFLOP/s counts 6 * params * tokens/s (forward + backward of every
 * weight) plus causal attention, 6 * L * C * T per token (llm.c's estimate).
 * Prints, never asserts. */
#define _DEFAULT_SOURCE /* popen, clock_gettime, getloadavg */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_clock.h"
#include "bench/bench_peer.h"
#include "dsc/config.h"
#include "dsc/data.h"
#include "dsc/engine.h"
#include "dsc/kernels.h"
#include "dsc/rng.h"

typedef struct shape {
    const char *name;
    int layers, d_model, heads, vocab, seq, batch;
} shape;

static const shape shapes[] = {
    {"tiny", 4, 128, 4, 256, 64, 8},
    {"gpt2", 12, 768, 12, 50257, 256, 2},
};

static void die(dsc_status s) {
    fprintf(stderr, "bench_train: %s\n", dsc_status_message(s));
    exit(1);
}

/* Random byte tokens: enough distinct sequences for any step count here. */
static void write_tokens(const char *path) {
    enum { N = 1 << 20 };
    uint32_t *ids = malloc(N * sizeof *ids);
    dsc_rng rng;
    dsc_rng_init(&rng, 1, 0, DSC_RNG_DATA);
    for (int i = 0; i < N; i++)
        ids[i] = (uint32_t)dsc_rng_below(&rng, 256);
    dsc_status s = dsc_token_file_write(path, ids, N, DSC_TOKEN_DTYPE_U16, 0);
    free(ids);
    if (s) die(s);
}

/* tokens/s of dsc on `sh` for `steps` timed steps after one warm-up step. */
static double run_dsc(const shape *sh, int steps, const char *data, const char *mixed, int64_t *params) {
    char section[64] = "";
    if (mixed) snprintf(section, sizeof section, ", \"%s\": {\"enabled\": true}", mixed);
    char json[1024];
    snprintf(
        json, sizeof json,
        "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1,"
        " \"model\": {\"arch\": \"gpt\", \"n_layer\": %d, \"d_model\": %d, \"n_head\": %d, \"vocab_size\": %d,"
        " \"seq_len\": %d}, \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.0003}},"
        " \"data\": {\"path\": \"%s\"}, \"train\": {\"steps\": %d}%s}",
        sh->batch, sh->layers, sh->d_model, sh->heads, sh->vocab, sh->seq, data, steps + 1, section);
    dsc_config cfg;
    dsc_status s = dsc_config_parse_string(json, "bench.json", NULL, 0, &cfg);
    if (!s) s = dsc_config_resolve_batch(&cfg, 1);
    dsc_trainer_options o = {&cfg, NULL, false, NULL, false};
    dsc_trainer *t = NULL;
    if (!s) s = dsc_trainer_create(&o, &t);
    if (s) die(s);
    dsc_engine *e = dsc_trainer_engine(t);
    if ((s = dsc_engine_step(e, NULL))) die(s); /* warm-up: first touches of every buffer */
    double t0 = now_s();
    for (int i = 0; i < steps; i++)
        if ((s = dsc_engine_step(e, NULL))) die(s);
    double dt = now_s() - t0;
    *params = dsc_trainer_param_count(t);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    return (double)sh->batch * sh->seq * steps / dt;
}

/* tokens/s of the PyTorch reference, or 0 when it could not run. */
static double run_torch(const char *python, const char *script, const shape *sh, int steps, int threads,
                        const char *mixed, bool flush_denormal) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=%d %s %s --layers %d --d-model %d --heads %d --vocab %d --seq %d "
             "--batch %d --steps %d --threads %d%s%s 2>&1",
             threads, python, script, sh->layers, sh->d_model, sh->heads, sh->vocab, sh->seq, sh->batch, steps,
             threads,
             !mixed                       ? ""
             : strcmp(mixed, "bf16") == 0 ? " --bf16"
                                          : " --fp16",
             flush_denormal ? " --flush-denormal" : "");
    return bench_peer_tokens_per_s(script, cmd, "  torch: ");
}

/* Median of v[0..n) (sorted in place); v[0] is then the minimum. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double load_now(void) {
    double load = 0;
    return getloadavg(&load, 1) == 1 ? load : -1;
}

int main(int argc, char **argv) {
    enum { MAX_PAIRS = 32 };
    int threads = dsc_kernels_get_num_threads(), steps[2] = {20, 2}, pairs = 1;
    const char *only = NULL, *torch = "bench/torch_train_ref.py", *python = "/opt/venv/bin/python";
    const char *mixed = NULL; /* "bf16", "fp16" or f32 training */
    bool flush_denormal = false;
    for (int i = 1; i < argc; i++) {
        bool v = i + 1 < argc;
        if (strcmp(argv[i], "--threads") == 0 && v)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps-tiny") == 0 && v)
            steps[0] = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps-gpt2") == 0 && v)
            steps[1] = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && v)
            only = argv[++i];
        else if (strcmp(argv[i], "--torch") == 0 && v)
            torch = argv[++i];
        else if (strcmp(argv[i], "--no-torch") == 0)
            torch = NULL;
        else if (strcmp(argv[i], "--python") == 0 && v)
            python = argv[++i];
        else if (strcmp(argv[i], "--pairs") == 0 && v)
            pairs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--bf16") == 0 || strcmp(argv[i], "--fp16") == 0)
            mixed = argv[i] + 2;
        else if (strcmp(argv[i], "--torch-flush-denormal") == 0)
            flush_denormal = true;
        else {
            fprintf(stderr,
                    "usage: bench_train [--threads N] [--steps-tiny N] [--steps-gpt2 N] [--only tiny|gpt2] "
                    "[--pairs N] [--torch PATH | --no-torch] [--python PATH] [--bf16 | --fp16] "
                    "[--torch-flush-denormal]\n");
            return 2;
        }
    }
    if (pairs < 1 || pairs > MAX_PAIRS) {
        fprintf(stderr, "bench_train: --pairs must be in [1, %d]\n", MAX_PAIRS);
        return 2;
    }
    dsc_kernels_set_num_threads(threads);
    char data[128];
    snprintf(data, sizeof data, "/tmp/dsc_bench_train_%d.tok", (int)getpid());
    write_tokens(data);
    printf("bench_train: 1 rank, %d threads, AdamW%s, one warm-up step then timed steps\n", threads,
           !mixed                       ? ""
           : strcmp(mixed, "bf16") == 0 ? ", bf16 mixed precision (PyTorch: bf16 autocast)"
                                        : ", fp16 mixed precision (PyTorch: fp16 autocast, GradScaler)");
    printf("%-5s %5s %10s %6s %6s %12s %12s %9s %13s %7s\n", "model", "load", "params", "B*T", "steps",
           "dsc tok/s", "dsc GFLOP/s", "ms/step", "torch tok/s", "dsc/pt");
    for (int k = 0; k < 2; k++) {
        const shape *sh = &shapes[k];
        if (only && strcmp(only, sh->name) != 0) continue;
        double dsc_tps[MAX_PAIRS], pt_tps[MAX_PAIRS];
        for (int p = 0; p < pairs; p++) {
            int64_t params;
            double load = load_now();
            double tps = dsc_tps[p] = run_dsc(sh, steps[k], data, mixed, &params);
            double flops_per_token = 6.0 * (double)params + 6.0 * sh->layers * sh->d_model * sh->seq;
            double pt = pt_tps[p] =
                torch ? run_torch(python, torch, sh, steps[k], threads, mixed, flush_denormal) : 0;
            printf("%-5s %5.1f %10lld %6d %6d %12.1f %12.2f %9.1f %13.1f %7.2f\n", sh->name, load,
                   (long long)params, sh->batch * sh->seq, steps[k], tps, tps * flops_per_token * 1e-9,
                   1e3 * sh->batch * sh->seq / tps, pt, pt > 0 ? tps / pt : 0.0);
            fflush(stdout);
        }
        if (pairs > 1) {
            double md = median(dsc_tps, pairs), mp = median(pt_tps, pairs);
            printf(
                "%-5s %d pairs: dsc median %.1f (min %.1f) tok/s, torch median %.1f (min %.1f), ratio of medians "
                "%.2f (target >= 1.50)\n",
                sh->name, pairs, md, dsc_tps[0], mp, pt_tps[0], mp > 0 ? md / mp : 0.0);
        }
    }
    unlink(data);
    return 0;
}
