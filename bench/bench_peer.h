/* Shared by the benchmarks that run a Python peer (bench_train, bench_moe): the peer prints
 * "tokens_per_s X" among its lines. Header-only (each bench is one program); needs popen
 * (_DEFAULT_SOURCE before the first include). */
#ifndef DSC_BENCH_PEER_H
#define DSC_BENCH_PEER_H

#include <stdio.h>
#include <unistd.h>

/* Runs `cmd` (stderr folded into stdout) when `script` is readable, echoes its other lines after
 * `indent`, and returns the tokens/s it printed, or 0 when it could not run. */
static inline double bench_peer_tokens_per_s(const char *script, const char *cmd, const char *indent) {
    if (access(script, R_OK) != 0) {
        printf("  PyTorch reference: %s not found (run from the repository root or pass --torch)\n", script);
        return 0;
    }
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[512];
    double tps = 0;
    while (fgets(line, sizeof line, p))
        if (sscanf(line, "tokens_per_s %lf", &tps) != 1) printf("%s%s", indent, line);
    if (pclose(p) != 0) printf("  PyTorch reference failed (see its output above)\n");
    return tps;
}

#endif
