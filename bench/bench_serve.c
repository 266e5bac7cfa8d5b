/* bench_serve — dsc-serve under load on 127.0.0.1: throughput, time to
 * first token and inter-token latency (p50/p90/p99, as the client sees
 * them) at several concurrencies, for continuous batching (the scheduler's
 * default) and static batching (--static-batching) on the same request mix.
 * It starts and stops each server itself; every run is bounded by
 * --requests and --time. The reference is static batching: the ratio is
 * continuous / static throughput. Prints, never asserts.
 *
 *   bench_serve [MODEL] [--requests N] [--time S] [--concurrency 1,4,16] [--vocab V]
 *               [--max-tokens N] [--server PATH]
 * MODEL defaults to the tiny Llama fixture (vocabulary 128). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/loadgen.h"
#include "serve/spawn.h"

enum { MAX_LEVELS = 8 };

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
    printf("%-10s %5s %6s %9s %8s | %21s | %21s\n", "batching", "conc", "reqs", "tokens/s", "req/s",
           "TTFT ms p50/p90/p99", "ITL ms p50/p90/p99");
    double tput[2][MAX_LEVELS] = {{0}};
    for (int mode = 0; mode < 2; mode++) {
        const char *argv_s[] = {
            "dsc-serve", model, "--port", "0", "--max-num-seqs", "16", mode ? "--static-batching" : NULL, NULL};
        serve_proc p;
        dsc_status s = serve_proc_start(&p, server, argv_s, 60, false);
        if (s) {
            fprintf(stderr, "bench_serve: %s\n", dsc_status_message(s));
            return 1;
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
                break;
            }
            if (l < 0) continue;
            tput[mode][l] = (double)r.tokens / r.elapsed_s;
            printf("%-10s %5d %6lld %9.0f %8.1f | %6.1f %6.1f %7.1f | %6.2f %6.2f %7.2f%s%s\n",
                   mode ? "static" : "continuous", levels[l], (long long)r.completed, tput[mode][l],
                   (double)r.completed / r.elapsed_s, 1e3 * r.ttft[0], 1e3 * r.ttft[1], 1e3 * r.ttft[2],
                   1e3 * r.itl[0], 1e3 * r.itl[1], 1e3 * r.itl[2], r.failed ? "  failures: " : "", r.first_error);
        }
        int code;
        dsc_status_free(serve_proc_stop(&p, 30, &code));
    }
    for (int l = 0; l < n_levels; l++)
        printf("concurrency %2d: continuous %.0f tokens/s vs static (reference) %.0f tokens/s: ratio %.2f\n",
               levels[l], tput[0][l], tput[1][l], tput[1][l] > 0 ? tput[0][l] / tput[1][l] : 0.0);
    return 0;
}
