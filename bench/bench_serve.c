/* bench_serve — dsc-serve under load on 127.0.0.1: throughput, time to
 * first token and inter-token latency (p50/p90/p99, as the client sees
 * them) at several concurrencies, for continuous batching (the scheduler's
 * default) and static batching (--static-batching) on the same request mix,
 * and for a tensor-parallel server on 2 ranks (--tp 2 under dsc-launch) and
 * a pipeline-parallel one on 2 ranks (--pp 2). It starts and stops each
 * server itself (the multi-rank ones with SIGTERM to dsc-launch, which
 * drains every rank); every run is bounded by --requests and --time. The
 * references: static batching for continuous (ratio continuous / static
 * throughput), one rank for TP 2 and PP 2 (ratio layout / one rank).
 * Prints, never asserts.
 *
 *   bench_serve [MODEL] [--requests N] [--time S] [--concurrency 1,4,16] [--vocab V]
 *               [--max-tokens N] [--server PATH]
 * MODEL defaults to the tiny Llama fixture (vocabulary 128). */
#define _POSIX_C_SOURCE 200809L /* kill */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/loadgen.h"
#include "serve/spawn.h"

enum { MAX_LEVELS = 8 };

/* One server of the comparison: its name, ranks and extra options. */
typedef struct layout {
    const char *name;
    int ranks;
    const char *opt, *value;
} layout;

/* dsc-serve MODEL (under dsc-launch -n ranks when ranks > 1) with the bench's engine options. */
static dsc_status start(serve_proc *p, const char *server, const char *model, const layout *l) {
    char np[16];
    snprintf(np, sizeof np, "%d", l->ranks);
    const char *argv[16] = {"dsc-launch", "-n", np}, *app = DSC_BINARY_DIR "/bin/dsc-launch";
    int n = 3;
    if (l->ranks == 1) {
        app = server;
        n = 0;
    }
    const char *base[] = {server, model, "--port", "0", "--max-num-seqs", "16", l->opt, l->value};
    for (int i = 0; i < 8 && base[i]; i++)
        argv[n++] = base[i];
    argv[n] = NULL;
    return serve_proc_start(p, app, argv, 120, false);
}

/* SIGTERM to dsc-serve, or to dsc-launch, which passes it to every rank (as SIGUSR2): all drain. */
static void stop(serve_proc *p) {
    int code;
    char out[1024];
    kill(p->pid, SIGTERM);
    dsc_status s = serve_proc_wait(p, 60, &code, out, sizeof out);
    if (s || code != 0)
        fprintf(stderr, "bench_serve: the server exited with %d: %s\n", code, s ? dsc_status_message(s) : out);
    dsc_status_free(s);
}

int main(int argc, char **argv) {
    const char *model = DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama",
               *server = DSC_BINARY_DIR "/bin/dsc-serve";
    const char *levels_arg = "1,4,16";
    int requests = 256, vocab = 128, max_tokens = 32;
    double time_s = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            model = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_serve: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--requests") == 0)
            requests = atoi(v);
        else if (strcmp(a, "--time") == 0)
            time_s = atof(v);
        else if (strcmp(a, "--concurrency") == 0)
            levels_arg = v;
        else if (strcmp(a, "--vocab") == 0)
            vocab = atoi(v);
        else if (strcmp(a, "--max-tokens") == 0)
            max_tokens = atoi(v);
        else if (strcmp(a, "--server") == 0)
            server = v;
        else {
            fprintf(stderr, "bench_serve: unknown option %s\n", a);
            return 2;
        }
    }
    int levels[MAX_LEVELS], n_levels = 0;
    for (const char *s = levels_arg; *s && n_levels < MAX_LEVELS;) {
        levels[n_levels++] = atoi(s);
        const char *comma = strchr(s, ',');
        s = comma ? comma + 1 : s + strlen(s);
    }
    printf("dsc-serve %s: %d requests (or %.0f s) per run, token-id prompts 4..24, max_tokens 1..%d, greedy, "
           "streaming\n",
           model, requests, time_s, max_tokens);
    printf("%-10s %5s %6s %9s %8s | %21s | %21s\n", "run", "conc", "reqs", "tokens/s", "req/s",
           "TTFT ms p50/p90/p99", "ITL ms p50/p90/p99");
    /* One rank with continuous and static batching, then the layouts across ranks under dsc-launch. */
    const layout runs[] = {{"continuous", 1, NULL, NULL},
                           {"static", 1, "--static-batching", NULL},
                           {"tp2", 2, "--tp", "2"},
                           {"pp2", 2, "--pp", "2"}};
    enum { N_RUNS = sizeof runs / sizeof runs[0] };
    double tput[N_RUNS][MAX_LEVELS] = {{0}};
    for (int k = 0; k < N_RUNS; k++) {
        serve_proc p;
        dsc_status s = start(&p, server, model, &runs[k]);
        if (s) {
            fprintf(stderr, "bench_serve: %s: %s\n", runs[k].name, dsc_status_message(s));
            dsc_status_free(s);
            continue;
        }
        for (int l = -1; l < n_levels; l++) { /* l = -1: a warm-up, not printed */
            serve_load_config c = {.port = p.port,
                                   .concurrency = l < 0 ? 4 : levels[l],
                                   .requests = l < 0 ? 32 : requests,
                                   .time_limit_s = time_s,
                                   .vocab = vocab,
                                   .prompt_min = 4,
                                   .prompt_max = 24,
                                   .tokens_min = 1,
                                   .tokens_max = max_tokens,
                                   .seed = 7};
            serve_load_result r;
            s = serve_load_run(&c, &r);
            if (s) {
                fprintf(stderr, "bench_serve: %s\n", dsc_status_message(s));
                dsc_status_free(s);
                break;
            }
            if (l < 0) continue;
            tput[k][l] = (double)r.tokens / r.elapsed_s;
            printf("%-10s %5d %6lld %9.0f %8.1f | %6.1f %6.1f %7.1f | %6.2f %6.2f %7.2f%s%s\n", runs[k].name,
                   levels[l], (long long)r.completed, tput[k][l], (double)r.completed / r.elapsed_s,
                   1e3 * r.ttft[0], 1e3 * r.ttft[1], 1e3 * r.ttft[2], 1e3 * r.itl[0], 1e3 * r.itl[1],
                   1e3 * r.itl[2], r.failed ? "  failures: " : "", r.first_error);
        }
        stop(&p);
    }
    for (int l = 0; l < n_levels; l++) {
        printf("concurrency %2d: continuous %.0f tokens/s vs static (reference) %.0f tokens/s: ratio %.2f\n",
               levels[l], tput[0][l], tput[1][l], tput[1][l] > 0 ? tput[0][l] / tput[1][l] : 0.0);
        for (int k = 2; k < N_RUNS; k++)
            printf("concurrency %2d: %s %.0f tokens/s vs one rank (reference) %.0f tokens/s: ratio %.2f\n",
                   levels[l], runs[k].name, tput[k][l], tput[0][l],
                   tput[0][l] > 0 ? tput[k][l] / tput[0][l] : 0.0);
    }
    return 0;
}
